"""A real PyTorch job on the rails (issue 11, section 2): ``examples/torch/train_pp_dp.py``
(PP=2 x DP=2 on 4 CPU processes, gloo) run by torchrun against a controller process, the
standalone emulated fabric (``lightrail emulate``, TL1 over sockets) and one ``lightrail agent``
process per emulated host; then the same script with plain gloo, for the loss comparison.

Used by ``lightrail demo --torch`` and tests/e2e/test_torch_job.py. torch is never imported
here: torchrun is a child process (``python -m torch.distributed.run``), so this module loads
without the ``lightrail[torch]`` extra; ``torch_available`` says whether the extra is there.

The fabric: 4 hosts of one GPU each on one rail (one 8-port OCS). The PP groups {0,1}, {2,3}
and the DP groups {0,2}, {1,3} need different cross-connects on the same ports, so every change
between the pipeline's send/recv and the gradients' all-reduce reconfigures the rail.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from lightrail.controller.config import FabricSection

if TYPE_CHECKING:
    from lightrail.emulator.ocs import ChangeRecord

WORLD = 4
"""Ranks of the example (PP=2 x DP=2), one per emulated host."""
JOB_ID = "torch-pp-dp"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch" / "train_pp_dp.py"
"""The example script, beside the package in a source checkout (not installed by pip)."""
GATED_BACKEND = "cpu:lightrail"
TIMED_OUT = -1000
"""``TorchRun.returncode`` of a run stopped after its time limit."""


def torch_available() -> bool:
    """True when torch (the ``lightrail[torch]`` extra) is importable; does not import it."""
    return importlib.util.find_spec("torch") is not None


def torch_section(delay_ms: float) -> FabricSection:
    """The fabric of the example: ``WORLD`` hosts of one GPU (``host0`` ...) on one rail
    (``ocs-rail0``), reconfiguration delay ``delay_ms`` ms."""
    return FabricSection.model_validate({
        "name": f"torch-{WORLD}x1",
        "rail": {"hosts": WORLD, "gpus_per_host": 1},
        "reconfiguration_delay_ms": delay_ms,
    })


def host_of(rank: int) -> str:
    """The emulated host of ``rank`` (rank r runs on ``host<r>``, GPU 0)."""
    return f"host{rank}"


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One rank's line for one step: the last stage's mean loss over its microbatches (None on
    stage 0) and the sum of the stage's parameters after the step, both ``float.hex``."""

    step: int
    rank: int
    loss: str | None
    param_sum: str


@dataclass(frozen=True, slots=True)
class PhaseSummary:
    """One rank's view of one phase, from its ``LIGHTRAIL_SUMMARY`` file: the group's global
    ``ranks``, the ``collective``, runs ``entered`` (``noop`` onto circuits already there,
    ``reconfigured`` after a switch), ``calls`` gated, ``wait_s`` seconds blocked in admission,
    and ``holds``: (admitted, released) ``time.monotonic`` seconds of each run (None when the
    summary has none)."""

    rank: int
    ranks: tuple[int, ...]
    collective: str
    entered: int
    noop: int
    reconfigured: int
    calls: int
    wait_s: float
    holds: tuple[tuple[float, float], ...] | None


@dataclass(frozen=True, slots=True)
class TorchRun:
    """One torchrun of the example: its exit code, wall time (s), every rank's step records,
    the gate's per-phase summaries (empty without the gate) and the end of its output."""

    backend: str
    returncode: int
    wall_s: float
    steps: Mapping[int, Sequence[StepRecord]]
    phases: Sequence[PhaseSummary]
    output_tail: str


@dataclass(frozen=True, slots=True)
class JobView:
    """The controller's counters of the job (operator ListJobs) after the run."""

    phases_admitted: int
    reconfigurations: int
    provisioning_hits: int
    provisioning_late: int
    provisioning_misses: int
    schedule_learned: bool


@dataclass(frozen=True, slots=True)
class GatedRun:
    """The gated run with what the fabric saw: the switches' change logs (``ChangeRecord``s by
    switch id, from the emulator's control API), the job's counters at the controller and
    ``lightrail_reconfigurations_total`` summed over the switches."""

    run: TorchRun
    section: FabricSection
    change_logs: Mapping[str, Sequence[ChangeRecord]]
    job: JobView
    reconfigurations_total: float


class TorchJobError(RuntimeError):
    """The job's stack could not be started (an agent exited, a socket never appeared, torch
    or the example is missing); the message says which."""


def _read_steps(path: Path) -> list[StepRecord]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        doc = json.loads(line)
        out.append(StepRecord(int(doc["step"]), int(doc["rank"]), doc["loss"],
                              str(doc["param_sum"])))
    return out


def read_summary(path: Path) -> list[PhaseSummary]:
    """The phases of one rank's ``LIGHTRAIL_SUMMARY`` JSON file (``{"rank", "job_id",
    "phases": [...], "holds": [{"group", "collective", "admitted_s", "released_s"}]}``,
    ``lightrail.agents.torch.gate.RankGate.write_summary``), each with its holds (None when the
    file has no ``holds``); [] when the file is missing. Raises
    ``KeyError``/``ValueError`` for a malformed file."""
    if not path.exists():
        return []
    doc = json.loads(path.read_text(encoding="utf-8"))
    rank = int(doc["rank"])
    held: dict[tuple[tuple[int, ...], str], list[tuple[float, float]]] | None = None
    if "holds" in doc:
        held = {}
        for h in doc["holds"]:
            key = (tuple(int(r) for r in h["group"]), str(h["collective"]))
            held.setdefault(key, []).append((float(h["admitted_s"]), float(h["released_s"])))
    out = []
    for p in doc["phases"]:
        ranks, collective = tuple(int(r) for r in p["group"]), str(p["collective"])
        holds = None if held is None else tuple(held.get((ranks, collective), ()))
        out.append(PhaseSummary(rank, ranks, collective, int(p["entered"]), int(p["noop"]),
                                int(p["reconfigured"]), int(p["calls"]), float(p["wait_s"]),
                                holds))
    return out


def _prepare(out_dir: Path, script: Path) -> None:
    if not script.exists():
        raise TorchJobError(f"the example {script} is not there (a source checkout has it)")
    out_dir.mkdir(parents=True, exist_ok=True)


def _missing(paths: Sequence[Path]) -> list[Path]:
    return [p for p in paths if not p.exists()]


async def run_torchrun(
    out_dir: Path,
    *,
    backend: str,
    steps: int,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 180.0,
    script: Path = EXAMPLE,
) -> TorchRun:
    """Run ``torchrun --standalone --nproc-per-node WORLD script --backend BACKEND`` with the
    environment ``env`` added to this process's (``LIGHTRAIL_*`` variables of this process
    are dropped first, and a backend without ``lightrail`` runs with torch's backend autoload
    off, so a plain run is plain), step records and summaries written to
    ``out_dir`` (torchrun's output in ``torchrun.log``). Stops the run after ``timeout_s`` s
    (returncode then ``TIMED_OUT``). Raises ``TorchJobError`` when the script is missing."""
    _prepare(out_dir, script)
    full = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTRAIL_")}
    full.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    if "lightrail" not in backend:
        # no Lightrail at all in a plain run: not even the backend's autoload at import torch
        full["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    full.update(env or {})
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={WORLD}", "--max-restarts=0", str(script),
            f"--backend={backend}", f"--steps={steps}",
            f"--losses={out_dir / 'steps-{rank}.jsonl'}"]
    start = time.monotonic()
    log_path = out_dir / "torchrun.log"
    with _open_log(log_path) as log:  # a file, not a pipe: workers outlive a killed torchrun
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, env=full)
    try:
        rc = await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        # torchrun forwards SIGTERM to its workers (each in its own session) and waits for them
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 30.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        rc = TIMED_OUT
    wall = time.monotonic() - start
    return _collect(out_dir, backend, rc, wall, log_path)


def _open_log(path: Path) -> IO[bytes]:
    return path.open("wb")


def _collect(out_dir: Path, backend: str, rc: int, wall_s: float, log_path: Path) -> TorchRun:
    steps_by_rank = {r: _read_steps(out_dir / f"steps-{r}.jsonl") for r in range(WORLD)}
    phases = [p for r in range(WORLD) for p in read_summary(out_dir / f"summary-{r}.json")]
    tail = log_path.read_bytes()[-6000:].decode(errors="replace")
    return TorchRun(backend, rc, wall_s, steps_by_rank, phases, tail)


@asynccontextmanager
async def host_agents(
    controller: str, hosts: Sequence[str], sock_dir: Path, *, start_timeout_s: float = 30.0
) -> AsyncIterator[dict[str, Path]]:
    """One ``lightrail agent --health emulated`` process per host of ``hosts``, relaying to
    ``controller``, each serving ``sock_dir/agent-<host>.sock``; yields host -> socket once
    every socket is there; SIGTERMs them on exit (SIGKILL after 10 s). Raises
    ``TorchJobError`` when an agent exits or its socket does not appear in time."""
    procs: list[asyncio.subprocess.Process] = []
    sockets = {h: sock_dir / f"agent-{h}.sock" for h in hosts}
    try:
        for h, sock in sockets.items():
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "lightrail.controller.cli.main", "agent",
                f"--controller={controller}", f"--host={h}", f"--socket={sock}",
                "--health=emulated", "--emulated-gpus=1", "--log-level=warning",
                stdin=asyncio.subprocess.DEVNULL))
        deadline = time.monotonic() + start_timeout_s
        while missing := _missing(list(sockets.values())):
            for h, p in zip(sockets, procs, strict=True):
                if p.returncode is not None:
                    raise TorchJobError(f"the agent of {h} exited with code {p.returncode}")
            if time.monotonic() > deadline:
                raise TorchJobError(f"agent sockets not there after {start_timeout_s} s: "
                                    f"{', '.join(map(str, missing))}")
            await asyncio.sleep(0.05)
        yield sockets
    finally:
        for p in procs:
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.terminate()
        for p in procs:
            try:
                await asyncio.wait_for(p.wait(), 10.0)
            except TimeoutError:
                p.kill()
                await p.wait()


def _job_view(resp: object, job_id: str) -> JobView:
    from lightrail.v1 import operator_pb2

    assert isinstance(resp, operator_pb2.ListJobsResponse)
    for j in resp.jobs:
        if j.job_id == job_id:
            return JobView(j.phases_admitted, j.reconfigurations, j.provisioning_hits,
                           j.provisioning_late, j.provisioning_misses, j.schedule_learned)
    raise TorchJobError(f"job {job_id!r} not registered at the controller after the run")


def _reconfigurations_total(metrics_url: str) -> float:
    """``lightrail_reconfigurations_total`` summed over switches (blocking: urllib)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics_url, timeout=5) as resp:
        text = resp.read().decode()
    return sum(s.value for fam in text_string_to_metric_families(text)
               for s in fam.samples if s.name == "lightrail_reconfigurations_total")


async def run_gated(
    out_dir: Path,
    *,
    steps: int,
    backend: str = GATED_BACKEND,
    delay_ms: float = 1.0,
    etcd_endpoint: str | None = None,
    timeout_s: float = 180.0,
) -> GatedRun:
    """The example with ``GATED_BACKEND`` on the whole stack: an etcd (a private one unless
    ``etcd_endpoint``), ``lightrail emulate`` serving ``torch_section(delay_ms)`` over TL1, a
    controller process, the job registered by the operator (ranks r -> ``host<r>`` GPU 0; the
    gate attaches: ``LIGHTRAIL_REGISTER=0``), one agent process per host; torchrun's ranks
    reach their host's agent through ``LIGHTRAIL_AGENT``. Raises ``TorchJobError`` and what
    the stack's parts raise when they do not start."""
    from lightrail.agents.channel import open_channel
    from lightrail.agents.client import ControllerClient
    from lightrail.controller.cli.embedded import (
        embedded_config,
        spawn_controller,
        spawn_emulator,
    )
    from lightrail.controller.domain.model import RankPlacement
    from lightrail.controller.store.etcd_server import EmbeddedEtcd
    from lightrail.emulator.control import ControlClient
    from lightrail.v1 import operator_pb2, operator_pb2_grpc

    hosts = [host_of(r) for r in range(WORLD)]
    placements = [RankPlacement(r, h, 0) for r, h in enumerate(hosts)]
    async with contextlib.AsyncExitStack() as stack:
        if etcd_endpoint is None:
            etcd_endpoint = (await stack.enter_async_context(EmbeddedEtcd())).endpoint
        emulator = await stack.enter_async_context(spawn_emulator(torch_section(delay_ms)))
        control = await stack.enter_async_context(ControlClient(emulator.control_url))
        cfg = embedded_config(etcd_endpoint, emulator.section, admission_timeout_s=60.0)
        # 4 trainers, 4 agents, a controller and an emulator may share 2 cores: a host agent
        # starved for a few seconds must not count as a failed host (no spare: the job fails)
        cfg = cfg.model_copy(update={"controller": cfg.controller.model_copy(
            update={"heartbeat_deadline_s": 30.0})})
        ctl = await stack.enter_async_context(spawn_controller(cfg))
        # the gRPC channels stay closed while children are started (gRPC warns at every fork
        # that finds its threads busy)
        async with ControllerClient(ctl.grpc_target) as client:
            await client.register_job(JOB_ID, placements)
        sock_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lr-agents-")))
        await stack.enter_async_context(host_agents(ctl.grpc_target, hosts, sock_dir))
        env = {
            "LIGHTRAIL_AGENT": f"unix://{sock_dir}/agent-host{{rank}}.sock",
            "LIGHTRAIL_HOST": "host{rank}",
            "LIGHTRAIL_GPU": "0",
            "LIGHTRAIL_JOB_ID": JOB_ID,
            "LIGHTRAIL_REGISTER": "0",
            "LIGHTRAIL_SUMMARY": str(out_dir / "summary-{rank}.json"),
        }
        run = await run_torchrun(out_dir, backend=backend, steps=steps, env=env,
                                 timeout_s=timeout_s)
        logs = await control.change_logs()
        async with open_channel(ctl.grpc_target, None) as ch:
            jobs = await operator_pb2_grpc.OperatorServiceStub(ch).ListJobs(
                operator_pb2.ListJobsRequest(), timeout=10.0)
        job = _job_view(jobs, JOB_ID)
        total = await asyncio.to_thread(_reconfigurations_total, ctl.metrics_url)
        async with ControllerClient(ctl.grpc_target) as client:
            await client.unregister_job(JOB_ID)
        return GatedRun(run, emulator.section, logs, job, total)
    raise AssertionError("unreachable")  # pragma: no cover (mypy: the stack may swallow)


@dataclass(frozen=True, slots=True)
class PhaseRow:
    """One phase over all its ranks: the group's global ``ranks``, the ``collective``, how many
    ranks reported it (``reporting``) and the sums over them of runs ``entered``, ``noop`` and
    ``reconfigured`` admissions, ``calls`` and ``wait_s`` (seconds blocked in admission)."""

    ranks: tuple[int, ...]
    collective: str
    reporting: int
    entered: int
    noop: int
    reconfigured: int
    calls: int
    wait_s: float


def phase_rows(phases: Sequence[PhaseSummary]) -> list[PhaseRow]:
    """``phases`` (every rank's) summed per (group, collective), sorted by collective then
    group."""
    acc: dict[tuple[str, tuple[int, ...]], list[PhaseSummary]] = {}
    for p in phases:
        acc.setdefault((p.collective, p.ranks), []).append(p)
    return [PhaseRow(ranks, coll, len(ps), sum(p.entered for p in ps), sum(p.noop for p in ps),
                     sum(p.reconfigured for p in ps), sum(p.calls for p in ps),
                     sum(p.wait_s for p in ps))
            for (coll, ranks), ps in sorted(acc.items())]


@dataclass(frozen=True, slots=True)
class StepComparison:
    """One (rank, step) of two runs: each run's record (None when missing) and whether they
    are equal (loss and parameter sum bit for bit)."""

    rank: int
    step: int
    gated: StepRecord | None
    plain: StepRecord | None

    @property
    def identical(self) -> bool:
        """Both records there and equal."""
        return self.gated is not None and self.gated == self.plain


def compare_steps(gated: TorchRun, plain: TorchRun, steps: int) -> list[StepComparison]:
    """Every rank's ``steps`` step records of ``gated`` next to ``plain``'s, by rank then
    step."""
    def at(run: TorchRun, rank: int, step: int) -> StepRecord | None:
        recs = [s for s in run.steps.get(rank, ()) if s.step == step]
        return recs[0] if recs else None

    return [StepComparison(r, s, at(gated, r, s), at(plain, r, s))
            for r in range(WORLD) for s in range(steps)]
