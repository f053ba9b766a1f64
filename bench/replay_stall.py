"""Stall per iteration of real workloads replayed through a controller in its own process.

Run: ``.venv/bin/python bench/replay_stall.py [--repeat 3] [--lightrail PATH]``. For each
workload of ``WORKLOADS`` (the shared AICB Llama-13B ZeRO-3 CSV on 128 ranks, first 100
collectives per rank, and the Llama-7B CSV) it starts a private etcd and ``lightrail
controller`` (fabric rail-16x8, 10 ms reconfiguration delay; pinned to the first core) and runs
``lightrail replay --controller ... --json`` (pinned to the second core), then prints the mean
stall per rank and iteration, the admission latency (last arrival -> admission, device delay
excluded) and the device time, median and range over the runs. ``--lightrail`` runs another
checkout's entry point (e.g. an older commit, for a before/after table).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hot_path import LIGHTRAIL, ControllerProcess
from support import Child, description, proc_cpu_s

from lightrail.controller.logs import configure_logging
from lightrail.controller.store.etcd_server import EmbeddedEtcd

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "workloads" / "aicb"
WORKLOADS: tuple[tuple[str, Path, list[str]], ...] = (
    ("Llama-13B ZeRO-3, 128 ranks, 100 ops", DATA / "L13B-D1-C04_Llama13B_zero3_mbs1.csv",
     ["--max-ops", "100"]),
    ("Llama-7B Megatron tp2", DATA / "L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1.csv", []),
)


@dataclass(frozen=True, slots=True)
class Run:
    """One replay: mean stall per rank and iteration, admission p50 over phases, device."""

    stall_ms: float
    admission_p50_ms: float
    device_ms: float
    reconfigurations: int
    controller_cpu_pct: float = 0.0
    replay_cpu_pct: float = 0.0


def _summary(doc: dict[str, object]) -> Run:
    phases = doc.get("phases")
    stall = doc.get("stall_ms_per_iter")
    assert isinstance(phases, list) and isinstance(stall, float | int)
    weights = [int(p["count"]) for p in phases]
    p50 = sum(float(p["admission_p50_ms"]) * w for p, w in zip(phases, weights, strict=True))
    devs = [float(p["device_ms"]) for p in phases if int(p["reconfigurations"])]
    return Run(float(stall), p50 / max(1, sum(weights)),
               statistics.mean(devs) if devs else 0.0,
               sum(int(p["reconfigurations"]) for p in phases))


async def replay_once(lightrail: Path, trace: Path, extra: list[str]) -> Run:
    """Start etcd and a controller, replay ``trace`` against it, stop both."""
    cores = sorted(os.sched_getaffinity(0))
    ctrl_cpu = cores[0] if len(cores) > 1 else None
    gen_cpu = cores[1] if len(cores) > 1 else None
    async with EmbeddedEtcd(name="replay") as etcd:
        with tempfile.TemporaryDirectory(prefix="lightrail-replay-") as tmp:
            ctrl = ControllerProcess(Path(tmp), etcd.endpoint, 16, 10.0, ctrl_cpu,
                                     fabric="{builtin: rail-16x8, reconfiguration_delay_ms: 10}",
                                     lightrail=lightrail)
            await ctrl.start()
            try:
                c0, w0 = proc_cpu_s(ctrl.pid), time.perf_counter()
                proc = await Child.start(
                    [str(lightrail), "replay", str(trace), "--controller", ctrl.target,
                     "--json", "--no-progress", *extra], gen_cpu,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                assert proc.stdout is not None and proc.stderr is not None
                replay_cpu = 0.0
                watcher = asyncio.ensure_future(
                    asyncio.gather(proc.stdout.read(), proc.stderr.read(), proc.wait()))
                while not watcher.done():  # the replay's CPU, read while it runs
                    replay_cpu = max(replay_cpu, proc_cpu_s(proc.pid))
                    await asyncio.wait({watcher}, timeout=0.05)
                out, err, _ = watcher.result()
                wall = time.perf_counter() - w0
                ctrl_cpu_s = proc_cpu_s(ctrl.pid) - c0
                if proc.returncode != 0:
                    raise RuntimeError(f"replay exited {proc.returncode}: {err.decode()[-2000:]}")
                run = _summary(json.loads(out))
                return dataclasses.replace(run, controller_cpu_pct=ctrl_cpu_s / wall * 100,
                                           replay_cpu_pct=replay_cpu / wall * 100)
            finally:
                await ctrl.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--lightrail", type=Path, default=LIGHTRAIL,
                   help="the lightrail entry point to run (default: this checkout's)")
    a = p.parse_args(argv)
    configure_logging("warning", "console")
    print(f"lightrail: {a.lightrail}")
    for name, trace, extra in WORKLOADS:
        runs = [asyncio.run(replay_once(a.lightrail, trace, extra)) for _ in range(a.repeat)]

        def show(vals: list[float]) -> str:
            return f"{statistics.median(vals):.1f} [{min(vals):.1f}-{max(vals):.1f}]"

        stall = [r.stall_ms for r in runs]
        adm = [r.admission_p50_ms for r in runs]
        dev = [r.device_ms for r in runs]
        print(f"{name}: stall/iteration {show(stall)} ms; admission p50 {show(adm)} ms; "
              f"device {show(dev)} ms per reconfiguration; reconfigurations "
              f"{runs[0].reconfigurations}; CPU over the replay: controller "
              f"{show([r.controller_cpu_pct for r in runs])} %, replay (128 ranks and their "
              f"host agents) {show([r.replay_cpu_pct for r in runs])} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
