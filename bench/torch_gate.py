"""The torch gate's cost (issue 11 §1): host time the lightrail backend adds per gated phase
with a no-op admission (the circuits are there), and per call inside a phase.

Setup: a private etcd, a controller (child process) on the demo-4x2 fabric with no
reconfiguration delay, one host agent per host (``lightrail agent --socket``: the ranks talk to
their host's agent, as in production), and torchrun with 2 workers, rank r on host r (gloo on
loopback). Each worker (bench/torch_gate_worker.py) times small all-reduces (64 bytes) on a
plain gloo group and on a lightrail group of the same ranks, interleaved, ``--repeats`` times:

* ``same``: every call on one phase (one run): the per-call cost inside a phase;
* ``alternate``: all_reduce and all_gather alternate, two phases on the same circuits: every call
  begins a phase (release of the last one, EnterPhase through the agent and the controller, a
  no-op admission): the per-phase cost.

Prints medians and [min-max] over the repeats and both ranks: µs per call of each pattern,
and the gate's added cost = gated - plain of the same pattern. Aim (issue 11): < 100 µs per
phase, nothing per call inside a phase. This 2-core machine runs the 2 workers, 2 agents, the
controller and etcd at once: the figures include that contention.

Run: ``.venv/bin/python bench/torch_gate.py [--calls 300] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from support import description

from lightrail.controller.cli.embedded import embedded_config, spawn_controller
from lightrail.controller.config import FabricSection
from lightrail.controller.store.etcd_server import EmbeddedEtcd

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "bench" / "torch_gate_worker.py"
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def _agents(target: str, tmp: Path, hosts: int) -> AsyncIterator[list[Path]]:
    """``hosts`` host agents (host0..), each on its own socket; stopped on exit."""
    procs, sockets = [], []
    try:
        for h in range(hosts):
            sock = tmp / f"agent-{h}.sock"
            sockets.append(sock)
            procs.append(await asyncio.create_subprocess_exec(
                str(BIN / "lightrail"), "agent", "--controller", target, "--host", f"host{h}",
                "--socket", str(sock), "--nccl-socket", str(tmp / f"frames-{h}.sock"),
                "--health", "emulated", "--emulated-gpus", "2",
                "--log-level", "warning",
                stdin=asyncio.subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        while not all(s.exists() for s in sockets):
            if time.monotonic() > deadline or any(p.returncode is not None for p in procs):
                raise RuntimeError("host agents did not open their sockets within 30 s")
            await asyncio.sleep(0.05)
        yield sockets
    finally:
        for p in procs:
            if p.returncode is None:
                p.terminate()
        for p in procs:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(p.wait(), 10)


def _spread(values: list[float]) -> str:
    return (f"{statistics.median(values):8.1f} [{min(values):.1f}-{max(values):.1f}]")


async def _cell(ctl_target: str, tmp: Path, calls: int, repeats: int, linger_ms: float,
                transport: str) -> tuple[dict[str, list[float]], float, int] | None:
    """One torchrun of the worker with phase calls over ``transport`` (``grpc``: the agent's
    gRPC socket; ``frames``: its frame socket): us per call of each pattern (both ranks), the
    mean EnterPhase wait (us) and the phases entered; None when the workers failed."""
    out = tmp / transport
    await asyncio.to_thread(out.mkdir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTRAIL_")}
    env.update(OMP_NUM_THREADS="1", OUT=str(out), CALLS=str(calls), REPEATS=str(repeats),
               LIGHTRAIL_HOST="host{rank}", LIGHTRAIL_GPU="0",
               LIGHTRAIL_AGENT=f"unix://{tmp}/agent-{{rank}}.sock",
               LIGHTRAIL_JOB_ID=f"gate-bench-{transport}", LIGHTRAIL_LINGER_MS=str(linger_ms),
               LIGHTRAIL_SUMMARY=f"{out}/summary-{{rank}}.json")
    if transport == "frames":
        env["LIGHTRAIL_NCCL_SOCKET"] = f"{tmp}/frames-{{rank}}.sock"
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", str(WORKER), env=env)
    if await asyncio.wait_for(proc.wait(), 600) != 0:
        print(f"torch_gate: the workers failed over {transport}", file=sys.stderr)
        return None
    per_rank = [json.loads((out / f"gate-{r}.json").read_text()) for r in range(2)]
    summaries = [json.loads((out / f"summary-{r}.json").read_text()) for r in range(2)]
    entered = sum(p["entered"] for s in summaries for p in s["phases"])
    wait_s = sum(p["wait_s"] for s in summaries for p in s["phases"])
    us = {k: [v * 1e6 for fig in per_rank for v in fig[k]] for k in per_rank[0]}
    return us, wait_s / max(entered, 1) * 1e6, entered


async def run(calls: int, repeats: int, linger_ms: float) -> int:
    fabric = FabricSection.model_validate({"builtin": "demo-4x2", "reconfiguration_delay_ms": 0})
    results = {}
    with tempfile.TemporaryDirectory(prefix="lightrail-gate-bench-") as tmp_name:
        tmp = Path(tmp_name)
        async with EmbeddedEtcd() as etcd:
            cfg = embedded_config(etcd.endpoint, fabric, admission_timeout_s=30.0)
            async with spawn_controller(cfg) as ctl, _agents(ctl.grpc_target, tmp, 2):
                for transport in ("grpc", "frames"):
                    cell = await _cell(ctl.grpc_target, tmp, calls, repeats, linger_ms,
                                       transport)
                    if cell is None:
                        return 1
                    results[transport] = cell
    print(f"torch gate cost: 2 ranks on 2 hosts, {calls} calls x {repeats} interleaved repeats "
          "per cell, 64-byte gloo all-reduce / all-gather on loopback; medians [min-max] over "
          f"repeats and ranks, us; linger {linger_ms} ms")
    print(f"{'phase calls via':<16} {'pattern':<10} {'plain gloo':>22} {'lightrail':>22} "
          f"{'added by the gate':>24}")
    for transport, (us, enter_us, entered) in results.items():
        for pattern, what in (("same", "per call inside a phase"),
                              ("alternate", "per gated phase (no-op admission)")):
            plain, gated = us[f"plain_{pattern}"], us[f"gated_{pattern}"]
            added = [g - p for g, p in zip(gated, plain, strict=True)]
            print(f"{transport:<16} {pattern:<10} {_spread(plain):>22} {_spread(gated):>22} "
                  f"{_spread(added):>24}   {what}")
        print(f"{transport:<16} EnterPhase mean over {entered} phases of both ranks: "
              f"{enter_us:.0f} us (until admitted, including the wait for the peer's enter)")
    print("grpc = the agent's gRPC socket (LIGHTRAIL_AGENT; each ReleasePhase waits for its "
          "reply), frames = its frame socket (LIGHTRAIL_NCCL_SOCKET; a release is one write). "
          "aim: < 100 us per phase, ~0 per call inside a phase (issue 11). A phase costs a "
          "release and an EnterPhase through the host agent to the controller (PhaseStream) and "
          "back, on a 2-core machine shared by the 2 workers, 2 agents, the controller and etcd.")
    return 0


def main() -> None:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--calls", type=int, default=300, help="calls per timed cell (default 300)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repeats (default 5)")
    p.add_argument("--linger-ms", type=float, default=20.0,
                   help="LIGHTRAIL_LINGER_MS of the workers (default 20: longer than a call "
                        "here, so that `same` stays one run; the backend's default is 2)")
    args = p.parse_args()
    if args.calls < 2 or args.repeats < 1:
        p.error("--calls must be >= 2 and --repeats >= 1")
    sys.exit(asyncio.run(run(args.calls, args.repeats, args.linger_ms)))


if __name__ == "__main__":
    main()
