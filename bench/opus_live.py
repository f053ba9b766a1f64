"""The live half of ``bench/opus_replay.py``: one replay of a workload through the real stack
(a ``lightrail controller`` process, the emulated rails, host agents here), or through the
same replayer with no controller at all, measured per iteration. See ``opus_replay.py``'s
docstring for the method; this module holds the runs, ``opus_replay`` the table and the
command line."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import math
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from lightrail.agents.client import ControllerClient
from lightrail.agents.errors import Admission
from lightrail.agents.host.agent import HostAgent
from lightrail.agents.replay.replayer import (
    HostSlot,
    ProvisioningStats,
    Replayer,
    ReplayReport,
    expand_workload,
)
from lightrail.agents.replay.trace.model import CommOp, Workload
from lightrail.controller.cli.embedded import embedded_config, spawn_controller, spawn_emulator
from lightrail.controller.config import FabricSection, build_fabric
from lightrail.controller.domain.events import JobEvent
from lightrail.controller.domain.fabric import MAX_RECONFIGURATION_DELAY_MS
from lightrail.controller.domain.model import Collective, PhaseKey

DELAYS_MS = (0.0, 10.0, 100.0, 1000.0)
"""δ of the issue's live table, ms (Opus measured these among l_0 .. l_3000)."""

HOSTS, GPUS_PER_HOST = 4, 4
"""Perlmutter nodes of the 16-GPU run (README "Experiment configuration": 4 x 4)."""

DEFAULT_TIME_SCALE = 0.05
"""Compute gaps, transfers and δ divided by 20: the full table (9 runs of 10 iterations)
takes about 2-3 minutes."""
LINK_GBPS = 200.0
"""A rail link, Gb/s: Perlmutter's GPU nodes have one 200 Gb/s Slingshot-11 NIC per GPU."""


class Mode(enum.Enum):
    """When the controller switches a rail: at the phase boundary, when the ranks ask
    (``on-demand``, Opus's "baseline"), or as soon as the previous phase is released, to the
    learned next phase's circuits (``provisioning``, Opus's "provision")."""

    ON_DEMAND = "on-demand"
    PROVISIONING = "provisioning"


class BenchError(RuntimeError):
    """The bench cannot run as asked (bad input, a run failed); the message says which."""


# --- the no-controller reference -----------------------------------------------------------


_AT_ONCE = Admission(noop=True, steps=1, device_s=0.0)


class _AdmitAtOnce(HostAgent):
    """A host agent with no controller behind it: every enter is admitted at once, releases
    go nowhere (Opus's shim in ``MODE=no-ctl`` loads no pattern and asks nothing)."""

    def __init__(self, host: str) -> None:
        super().__init__(host, "127.0.0.1:9")  # never dialled: start() is not run

    def start(self) -> None:
        return None

    async def wait_connected(self, timeout_s: float) -> None:
        return None

    async def close(self, timeout_s: float = 5.0) -> None:
        return None

    async def enter(self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0,
                    timeout_s: float = 30.0, nbytes: int = 0,
                    compute_gap_s: float = 0.0) -> Admission:
        return _AT_ONCE

    def release(self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0) -> None:
        return None


class _NoJobEvents(ControllerClient):
    """A controller client with no controller: the job's event stream ends at once."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1:9")

    async def watch(self, job_id: str) -> AsyncIterator[JobEvent]:
        none: tuple[JobEvent, ...] = ()
        for ev in none:
            yield ev


class NoControllerReplayer(Replayer):
    """The replayer with the controller taken out: the same rank loop (sleeps, barriers,
    transfers, scale-up groups skipped) over host agents that admit every phase at once.
    Relies on ``Replayer._agent`` (the one place a rank gets its transport) and
    ``Replayer._run_ranks`` (the run without job registration)."""

    async def _agent(self, host: str) -> HostAgent:
        return _AdmitAtOnce(host)

    async def run_alone(self) -> ReplayReport:
        """Run every rank with no controller; the report has no provisioning counters."""
        return await self._run_ranks(_NoJobEvents())


# --- one measured run ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LiveRun:
    """One replay: the measured iteration times (s, on the scaled clock), the reconfigurations
    per iteration (phase instances that switched), the mean stall per rank and iteration (ms)
    and the controller's provisioning counters (None for the no-controller reference)."""

    iteration_s: tuple[float, ...]
    reconfigurations_per_iter: float
    stall_ms_per_iter: float
    provisioning: ProvisioningStats | None

    @property
    def median_s(self) -> float:
        """Median measured iteration time, s."""
        return statistics.median(self.iteration_s)

    @property
    def half_range_s(self) -> float:
        """Half the range of the measured iteration times, s: how far the median can be off."""
        return (max(self.iteration_s) - min(self.iteration_s)) / 2


def _measured(stamps: Sequence[float], warmup: int) -> tuple[float, ...]:
    """Intervals between iteration completions after the first ``warmup`` iterations."""
    return tuple(b - a for a, b in zip(stamps[warmup - 1:], stamps[warmup:], strict=False))


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """What to run. ``delays_ms``: δ of the emulated rails before scaling, ms; ``time_scale``
    (> 0) multiplies compute gaps, transfers and δ; ``iterations`` measured after ``warmup``
    (>= 1) unmeasured ones; ``devices``: ``tl1`` (``lightrail emulate`` over sockets) or
    ``emulated`` (the controller's in-process driver)."""

    delays_ms: tuple[float, ...] = DELAYS_MS
    modes: tuple[Mode, ...] = (Mode.ON_DEMAND, Mode.PROVISIONING)
    time_scale: float = DEFAULT_TIME_SCALE
    iterations: int = 6
    warmup: int = 4
    devices: str = "tl1"
    link_gbps: float = LINK_GBPS
    phases: str = "runs"
    """``runs``: a run of calls of one kind on one group is one phase (``merge_runs``);
    ``calls``: every call is a phase (the replayer's own granularity)."""
    calibrate: bool = True
    """Scale the compute gaps so that the live no-controller iteration matches Opus's
    measured no-controller mean (``calibrate_gaps``), as ``lightrail evaluate`` calibrates
    its prediction on that row only."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise BenchError(f"time_scale: must be a finite number > 0, got {self.time_scale}")
        if self.iterations < 1:
            raise BenchError(f"iterations: must be >= 1, got {self.iterations}")
        if self.warmup < 1:
            raise BenchError(f"warmup: must be >= 1 (an interval needs a start), got "
                             f"{self.warmup}")
        if not (math.isfinite(self.link_gbps) and self.link_gbps > 0):
            raise BenchError(f"link_gbps: must be a finite number > 0, got {self.link_gbps}")
        if self.phases not in ("runs", "calls"):
            raise BenchError(f"phases: expected runs or calls, got {self.phases!r}")
        if self.devices not in ("tl1", "emulated"):
            raise BenchError(f"devices: expected tl1 or emulated, got {self.devices!r}")
        for d in self.delays_ms:
            if not (math.isfinite(d) and d >= 0):
                raise BenchError(f"delay_ms: must be finite and >= 0, got {d}")
            if d * self.time_scale > MAX_RECONFIGURATION_DELAY_MS:
                raise BenchError(f"delay_ms: {d:g} x time scale {self.time_scale:g} is above "
                                 f"the emulated switch's {MAX_RECONFIGURATION_DELAY_MS:g} ms "
                                 "(MAX_RECONFIGURATION_DELAY_MS)")


def fabric_section(delay_ms: float) -> FabricSection:
    """The 4 x 4 rail fabric (``model: emulated`` switches: served over TL1 by ``lightrail
    emulate``, or the controller's in-process driver) with reconfiguration delay
    ``delay_ms`` (already scaled)."""
    return FabricSection.model_validate({
        "name": f"opus-{HOSTS}x{GPUS_PER_HOST}",
        "rail": {"hosts": HOSTS, "gpus_per_host": GPUS_PER_HOST},
        "reconfiguration_delay_ms": delay_ms,
    })


def _hosts(section: FabricSection) -> list[HostSlot]:
    fabric = build_fabric(section)
    return [HostSlot(h.name, tuple(range(h.gpu_count))) for h in fabric.hosts.values()
            if not h.spare]


def _replayer(cls: type[Replayer], workload: Workload, target: str, hosts: list[HostSlot],
              cfg: BenchConfig, job_id: str) -> tuple[Replayer, list[float]]:
    stamps: list[float] = []

    def stamp(_done: int, _total: int) -> None:
        stamps.append(time.monotonic())

    r = cls(workload, target, hosts, job_id=job_id, iterations=cfg.warmup + cfg.iterations,
            time_scale=cfg.time_scale, link_gbps=cfg.link_gbps, timeout_s=60.0,
            on_progress=stamp)
    return r, stamps


def _live_run(report: ReplayReport, stamps: Sequence[float], cfg: BenchConfig) -> LiveRun:
    measured = _measured(stamps, cfg.warmup)
    if len(measured) != cfg.iterations:
        raise BenchError(f"{len(stamps)} iterations completed, expected "
                         f"{cfg.warmup + cfg.iterations}")
    switched = sum(r.reconfigurations for r in report.rows)
    return LiveRun(measured, switched / report.iterations, report.stall_ms_per_iter,
                   report.provisioning)


async def no_controller_run(workload: Workload, cfg: BenchConfig) -> LiveRun:
    """The reference: the workload's ranks with no controller (``NoControllerReplayer``)."""
    r, stamps = _replayer(NoControllerReplayer, workload, "127.0.0.1:9",
                          _hosts(fabric_section(0.0)), cfg, "opus-no-controller")
    assert isinstance(r, NoControllerReplayer)
    return _live_run(await r.run_alone(), stamps, cfg)


def scale_gaps(workload: Workload, factor: float) -> Workload:
    """``workload`` with every compute gap (before each call, and each rank's tail) times
    ``factor`` (> 0); sizes and groups unchanged. Raises ``ValueError`` for a factor that is
    not finite and > 0."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor: must be finite and > 0, got {factor}")
    return dataclasses.replace(
        workload,
        ranks={r: tuple(dataclasses.replace(op, compute_gap_s=op.compute_gap_s * factor)
                        for op in ops) for r, ops in workload.ranks.items()},
        tail_gap_s={r: g * factor for r, g in workload.tail_gap_s.items()})


CALIBRATION_TOLERANCE = 0.01
"""Calibration stops once the live no-controller iteration is within 1 % of the target."""
CALIBRATION_RUNS = 4
"""At most this many no-controller runs to calibrate (the time is close to affine in the gap
factor: gaps plus the transfers and waits that do not scale, so a few steps suffice)."""


async def calibrate_gaps(workload: Workload, target_s: float, cfg: BenchConfig,
                         prepare: Callable[[Workload], Workload]) -> tuple[float, LiveRun]:
    """The factor on ``workload``'s compute gaps that makes its live no-controller iteration
    (unscaled: median / time scale) ``target_s``, and the reference run at that factor.
    ``prepare`` turns the scaled workload into what is replayed (e.g. ``merge_runs``). Each
    step multiplies the factor by target / measured (``CALIBRATION_RUNS``,
    ``CALIBRATION_TOLERANCE``); the last run is the one returned, so the factor and the run
    always agree. Raises ``BenchError`` for a target that is not > 0."""
    if not (math.isfinite(target_s) and target_s > 0):
        raise BenchError(f"calibration target: must be > 0 s, got {target_s}")
    factor = 1.0
    run = await no_controller_run(prepare(workload), cfg)
    for _ in range(CALIBRATION_RUNS - 1):
        measured_s = run.median_s / cfg.time_scale
        if abs(measured_s / target_s - 1) <= CALIBRATION_TOLERANCE:
            break
        factor *= target_s / measured_s
        run = await no_controller_run(prepare(scale_gaps(workload, factor)), cfg)
    return factor, run


@contextlib.asynccontextmanager
async def emulated_rails(delay_ms: float, cfg: BenchConfig) -> AsyncIterator[FabricSection]:
    """The rails at δ = ``delay_ms`` (unscaled; the devices get δ x time scale) for as long as
    the block runs: a ``lightrail emulate`` process serving them over TL1 (``devices`` tl1;
    yields the section that points at it), or the section of in-process emulated switches
    (``emulated``; each controller makes its own). Raises ``RuntimeError``/``TimeoutError``
    when the emulator does not start."""
    section = fabric_section(delay_ms * cfg.time_scale)
    if cfg.devices != "tl1":
        yield section
        return
    async with spawn_emulator(section) as emulator:
        yield emulator.section


async def controller_run(etcd_endpoint: str, rails: FabricSection, workload: Workload,
                         cfg: BenchConfig, delay_ms: float, mode: Mode) -> LiveRun:
    """One replay through the real stack in ``mode`` on ``rails`` (``emulated_rails``, δ =
    ``delay_ms`` unscaled): a controller process on ``etcd_endpoint``, one host agent per
    host here. The controller reads back whatever cross-connects an earlier run left on the
    rails (the warm-up iterations absorb the first switch). Raises ``ReplayError`` and
    ``JobRegistrationError`` from the replay, ``RuntimeError``/``TimeoutError`` when the
    controller does not start."""
    base = embedded_config(etcd_endpoint, rails, admission_timeout_s=60.0,
                           replica_id=f"opus-{mode.value}-{delay_ms:g}")
    ctl = base.controller.model_copy(update={"provisioning": mode is Mode.PROVISIONING})
    async with spawn_controller(base.model_copy(update={"controller": ctl})) as child:
        r, stamps = _replayer(Replayer, workload, child.grpc_target, _hosts(rails), cfg,
                              f"opus-{mode.value}-{delay_ms:g}ms")
        async with ControllerClient(child.grpc_target) as client:
            report = await r.run(client)
    return _live_run(report, stamps, cfg)


def merge_runs(workload: Workload, link_gbps: float) -> Workload:
    """``workload`` with every run of consecutive calls of one collective on one process group
    as ONE phase, as Lightrail's PyTorch gate (``agents/torch/gate.py``: "runs of one kind on
    one group") and Opus's shim (one topology per pattern line) gate them, instead of one
    phase per call. The run keeps its timing: the first call's gap stays the phase's compute
    gap, and the time between its calls (their gaps) is time under the phase's circuits, which
    the replayer spends only as the phase's transfer, so it is carried as bytes at
    ``link_gbps`` (``nbytes`` = the calls' bytes + gaps x link bytes/s). All-to-alls and calls
    with no group are kept as they are. The merged ops are marked approximate with a note."""
    bytes_per_s = link_gbps * 1e9 / 8
    ranks: dict[int, tuple[CommOp, ...]] = {}
    for rank, ops in workload.ranks.items():
        merged: list[CommOp] = []
        calls: list[int] = []
        for op in ops:
            prev = merged[-1] if merged else None
            if (prev is not None and op.group is not None and prev.group == op.group
                    and prev.collective is op.collective
                    and op.collective is not Collective.ALL_TO_ALL):
                held = op.nbytes + round(op.compute_gap_s * bytes_per_s)
                merged[-1] = dataclasses.replace(prev, nbytes=prev.nbytes + held)
                calls[-1] += 1
            else:
                merged.append(op)
                calls.append(1)
        ranks[rank] = tuple(
            op if n == 1 else dataclasses.replace(
                op, approximate=True, notes=(*op.notes, (
                    f"{n} calls as one phase; the compute between them carried as bytes at "
                    f"{link_gbps:g} Gb/s")))
            for op, n in zip(merged, calls, strict=True))
    note = ("one phase per run of calls of one collective on one group (as the PyTorch gate "
            "and Opus's shim gate them); the compute between a run's calls is time under its "
            f"circuits, replayed as transfer time at {link_gbps:g} Gb/s")
    return dataclasses.replace(workload, ranks=ranks,
                               assumptions=(*workload.assumptions, note))


def replayed_workload(workload: Workload, cfg: BenchConfig) -> Workload:
    """What the bench replays of ``workload``: its runs merged (``merge_runs``) unless
    ``cfg.phases`` is ``calls``."""
    return merge_runs(workload, cfg.link_gbps) if cfg.phases == "runs" else workload


def compute_lower_bound_s(workload: Workload) -> float:
    """The most compute one rank of ``workload`` does per iteration, s (unscaled): its gaps
    before each call plus its tail. No iteration can be shorter."""
    ops, _notes = expand_workload(workload)
    return max((sum(op.gap_s for op in v) + workload.tail_gap_s.get(r, 0.0)
                for r, v in ops.items()), default=0.0)
