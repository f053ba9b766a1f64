"""Opus's Perlmutter latency table, live: the 16-GPU phase pattern replayed through the real stack.

Run: ``.venv/bin/python bench/opus_replay.py [--quick] [--delay-ms 0 10 100 1000]
[--mode on-demand provisioning] [--time-scale 0.1] [--iterations 6] [--warmup 4]
[--devices tl1|emulated] [--json] [FOLDER]`` (``--help`` says what each does). A script, not a
test (pytest does not collect ``bench/``; ``tests/e2e/test_opus_replay.py`` runs ``--quick``).

What runs (issue 13, section 1, "Live")
----------------------------------------
* The workload is the folder's phase pattern read by ``lightrail replay``'s own loader
  (``lightrail.agents.replay.trace.loader.load_workload``): per-rank PP/DP phases with the
  compute gaps the loader takes from the timed files (its ``assumptions`` are printed).
* Fabric: a generated rail fabric of 4 hosts x 4 GPUs (Perlmutter: 4 nodes of 4 GPUs; rail g =
  NIC g of every host, one 4 x 4 N x N OCS per rail). Ranks are placed by the replayer's rule:
  rank r on host r // 4, GPU r % 4, the notebook's ``global rank = N*4 + M``.
* Per (δ, mode): a private etcd (one for the whole bench), the emulated rails as their own
  process (``lightrail emulate``: Polatis TL1 over loopback sockets, ``--devices tl1``, the
  default; ``--devices emulated``: the controller's in-process emulated driver, no sockets), a
  ``lightrail controller`` child process (``controller.provisioning`` true for
  ``provisioning``, false for ``on-demand``, Opus's "baseline") and one host agent per host
  with one PhaseStream each, all in this process, driven by
  ``lightrail.agents.replay.replayer.Replayer``: each rank sleeps its recorded gap times
  ``--time-scale``, enters the phase, waits for its group (a collective), releases.
* The emulated rails' reconfiguration delay is δ times ``--time-scale``: compute and switching
  shrink by the same factor, so the overheads compare as percentages. What does NOT shrink is
  the control plane's own cost (gRPC, the coordinator, the TL1 round trips): at δ = 0 it is the
  whole overhead, and a time scale below 1 magnifies its percentage by 1 / scale. The table
  therefore also gives it in ms per iteration and as a percentage of Opus's unscaled
  no-controller iteration (``ctl-cost``), which is the like-for-like figure to set beside Opus's
  +0.4 % / +2.6 %.
* The no-controller reference (Opus's ``MODE=no-ctl``: the shim asks nothing) is the same
  replayer, the same ranks and sleeps, with a transport that admits every phase at once and no
  controller at all (``NoControllerReplayer``).
* Iteration time: the replayer reports each iteration when its last rank finishes it; an
  iteration's time is the interval between two such completions (ranks run ahead into the next
  iteration, as a training job does). Like Opus's ``provision.ipynb`` (torchtitan step log
  timestamps of steps 4..10, 6 intervals) the first ``--warmup`` iterations (default 4) are
  not measured; provisioning needs ``controller.learn_iterations`` (2) of them to learn the
  schedule. Each row gives the median and range of the ``--iterations`` measured intervals
  (default 6) and the overhead of the median over the no-controller median.
* Opus's columns come from the folder's ``latency_results*.csv`` (README: "Average Latency"
  is the mean of 6 step intervals in s; ``baseline`` = on-demand, ``provision`` =
  provisioning, ``l_<N>`` = δ of N ms; the ``no-controller`` row is the reference); Opus's
  +0.4 % and +2.6 % at δ = 0 are means over means, so are its overheads here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import enum
import json
import math
import re
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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
from lightrail.agents.replay.trace.loader import load_workload
from lightrail.agents.replay.trace.model import TraceError, Workload
from lightrail.controller.cli.common import shared_data_dir
from lightrail.controller.cli.embedded import embedded_config, spawn_controller, spawn_emulator
from lightrail.controller.config import FabricSection, build_fabric
from lightrail.controller.domain.events import JobEvent
from lightrail.controller.domain.model import PhaseKey
from lightrail.controller.logs import configure_logging
from lightrail.controller.store.etcd_server import EmbeddedEtcd

FOLDER = "traces/opus-perlmutter/llama-3-3d-16-latency"
"""The 16-GPU folder of the Opus artifact, under ``$LIGHTRAIL_DATA`` or ``../shared/data``."""

DELAYS_MS = (0.0, 10.0, 100.0, 1000.0)
"""δ of the issue's live table, ms (Opus measured these among l_0 .. l_3000)."""

HOSTS, GPUS_PER_HOST = 4, 4
"""Perlmutter nodes of the 16-GPU run (README "Experiment configuration": 4 x 4)."""

DEFAULT_TIME_SCALE = 0.1
QUICK_TIME_SCALE = 0.02


class Mode(enum.Enum):
    """When the controller switches a rail: at the phase boundary, when the ranks ask
    (``on-demand``, Opus's "baseline"), or as soon as the previous phase is released, to the
    learned next phase's circuits (``provisioning``, Opus's "provision")."""

    ON_DEMAND = "on-demand"
    PROVISIONING = "provisioning"


_OPUS_MODE = {"baseline": Mode.ON_DEMAND, "provision": Mode.PROVISIONING}
"""The mode words in Opus's run directory names (README "Latency CSVs")."""


class BenchError(RuntimeError):
    """The bench cannot run as asked (bad input, a run failed); the message says which."""


# --- Opus's measured iteration times -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpusLatency:
    """One row of an Opus latency CSV: seconds per training iteration over 6 step intervals
    (``min_s``, ``mean_s``, population ``std_s``), from run ``experiment`` (``file``:``line``).
    """

    experiment: str
    min_s: float
    mean_s: float
    std_s: float
    file: str
    line: int


@dataclass(frozen=True, slots=True)
class OpusTable:
    """What the folder's CSVs measured: the no-controller reference and (mode, δ ms) -> row."""

    no_controller: OpusLatency
    runs: Mapping[tuple[Mode, float], OpusLatency]

    def overhead_pct(self, mode: Mode, delay_ms: float) -> float | None:
        """Mean iteration time of (mode, δ) over the no-controller mean, minus 1, in %; None
        when the CSVs have no such run."""
        row = self.runs.get((mode, delay_ms))
        if row is None:
            return None
        return (row.mean_s / self.no_controller.mean_s - 1.0) * 100.0


_DELAY = re.compile(r"(?:^|-)l_(\d+)(?:-|$)")
_NO_CONTROLLER = re.compile(r"(?:^|-)no-(?:controller|ctl)(?:-|$)")
_HEADER = ("Experiment", "Min latency (s)", "Average Latency (s)", "Standard Deviation (s)")


def _seconds(path: Path, line: int, column: str, text: str, *, zero: bool = False) -> float:
    """``text`` as seconds: finite and > 0 (>= 0 with ``zero``). Raises ``TraceError``."""
    try:
        value = float(text)
    except ValueError:
        raise TraceError(path, column, text, "not a number", line=line) from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise TraceError(path, column, text, "must be a finite number of seconds "
                         + (">= 0" if zero else "> 0"), line=line)
    return value


def read_opus_latencies(folder: Path) -> OpusTable:
    """The iteration times of every ``latency_results*.csv`` in ``folder`` (README "Latency
    CSVs": header ``Experiment,Min latency (s),Average Latency (s),Standard Deviation (s)``,
    one row per run; the run name holds ``no-controller``/``no-ctl``, or ``l_<δ ms>`` and
    ``baseline``/``provision``).

    Raises ``TraceError`` naming the file, line, field and value for a missing file, a wrong
    header, a run name that says neither no-controller nor δ and mode, a value that is not a
    positive number, two runs of one (mode, δ), or no no-controller row; and when the
    no-controller rows of two files disagree.
    """
    files = sorted(folder.glob("latency_results*.csv"))
    if not files:
        raise TraceError(folder, "latency_results*.csv", str(folder),
                         "no Opus latency CSV in the folder")
    reference: OpusLatency | None = None
    runs: dict[tuple[Mode, float], OpusLatency] = {}
    for path in files:
        with path.open(encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f))
        if not rows or tuple(c.strip() for c in rows[0]) != _HEADER:
            raise TraceError(path, "header", ",".join(rows[0]) if rows else "",
                             f"expected {','.join(_HEADER)}", line=1)
        for n, row in enumerate(rows[1:], start=2):
            if not row:
                continue
            if len(row) != len(_HEADER):
                raise TraceError(path, "row", ",".join(row),
                                 f"expected {len(_HEADER)} columns, got {len(row)}", line=n)
            name = row[0].strip()
            lat = OpusLatency(name, _seconds(path, n, _HEADER[1], row[1]),
                              _seconds(path, n, _HEADER[2], row[2]),
                              _seconds(path, n, _HEADER[3], row[3], zero=True), path.name, n)
            if _NO_CONTROLLER.search(name):
                if reference is not None and (reference.mean_s, reference.min_s) != (
                        lat.mean_s, lat.min_s):
                    raise TraceError(path, _HEADER[0], name,
                                     f"no-controller row differs from {reference.file}:"
                                     f"{reference.line} ({reference.mean_s} s)", line=n)
                reference = reference or lat
                continue
            delay = _DELAY.search(name)
            modes = [m for word, m in _OPUS_MODE.items() if f"-{word}" in name]
            if delay is None or len(modes) != 1:
                raise TraceError(path, _HEADER[0], name,
                                 "expected no-controller/no-ctl, or l_<delay ms> and one of "
                                 "baseline/provision", line=n)
            key = (modes[0], float(delay.group(1)))
            if key in runs:
                raise TraceError(path, _HEADER[0], name,
                                 f"second {key[0].value} run at {key[1]:g} ms (first "
                                 f"{runs[key].file}:{runs[key].line})", line=n)
            runs[key] = lat
    if reference is None:
        raise TraceError(files[0], _HEADER[0], "", "no no-controller/no-ctl row")
    return OpusTable(reference, runs)


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

    def __post_init__(self) -> None:
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise BenchError(f"time_scale: must be a finite number > 0, got {self.time_scale}")
        if self.iterations < 1:
            raise BenchError(f"iterations: must be >= 1, got {self.iterations}")
        if self.warmup < 1:
            raise BenchError(f"warmup: must be >= 1 (an interval needs a start), got "
                             f"{self.warmup}")
        if self.devices not in ("tl1", "emulated"):
            raise BenchError(f"devices: expected tl1 or emulated, got {self.devices!r}")
        for d in self.delays_ms:
            if not (math.isfinite(d) and d >= 0):
                raise BenchError(f"delay_ms: must be finite and >= 0, got {d}")


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
            time_scale=cfg.time_scale, timeout_s=60.0, on_progress=stamp)
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


async def controller_run(etcd_endpoint: str, workload: Workload, cfg: BenchConfig,
                         delay_ms: float, mode: Mode) -> LiveRun:
    """One replay through the real stack at δ = ``delay_ms`` (unscaled) in ``mode``: the
    emulated rails (a ``lightrail emulate`` process for tl1), a controller process on
    ``etcd_endpoint``, one host agent per host here. Raises ``ReplayError`` and
    ``JobRegistrationError`` from the replay, ``RuntimeError``/``TimeoutError`` from a child
    that does not start."""
    section = fabric_section(delay_ms * cfg.time_scale)
    hosts = _hosts(section)
    async with contextlib.AsyncExitStack() as stack:
        if cfg.devices == "tl1":
            section = (await stack.enter_async_context(spawn_emulator(section))).section
        base = embedded_config(etcd_endpoint, section, admission_timeout_s=60.0,
                               replica_id=f"opus-{mode.value}-{delay_ms:g}")
        ctl = base.controller.model_copy(update={"provisioning": mode is Mode.PROVISIONING})
        child = await stack.enter_async_context(
            spawn_controller(base.model_copy(update={"controller": ctl})))
        r, stamps = _replayer(Replayer, workload, child.grpc_target, hosts, cfg,
                              f"opus-{mode.value}-{delay_ms:g}ms")
        async with ControllerClient(child.grpc_target) as client:
            report = await r.run(client)
    return _live_run(report, stamps, cfg)


# --- the table -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the table: δ (ms, unscaled), mode, the live run and its overhead over the
    live no-controller median (%), the control plane's cost per iteration (ms on the scaled
    clock, live median minus reference median) and Opus's measured row (None when its CSVs
    lack that run) and overhead (%)."""

    delay_ms: float
    mode: Mode
    live: LiveRun
    overhead_pct: float
    added_ms: float
    opus: OpusLatency | None
    opus_overhead_pct: float | None


@dataclass(frozen=True, slots=True)
class BenchResult:
    """The reference, every row, Opus's no-controller row, the workload's compute lower
    bound per iteration (s, scaled: the largest sum of one rank's gaps), and the notes."""

    config: BenchConfig
    workload: str
    reference: LiveRun
    rows: tuple[Row, ...]
    opus_no_controller: OpusLatency
    compute_s: float
    notes: tuple[str, ...]


def compute_lower_bound_s(workload: Workload) -> float:
    """The most compute one rank of ``workload`` does per iteration, s (unscaled): its gaps
    before each call plus its tail. No iteration can be shorter."""
    ops, _notes = expand_workload(workload)
    return max((sum(op.gap_s for op in v) + workload.tail_gap_s.get(r, 0.0)
                for r, v in ops.items()), default=0.0)


async def run_bench(workload: Workload, opus: OpusTable, cfg: BenchConfig, *,
                    etcd_endpoint: str | None = None,
                    on_row: Callable[[Row], None] | None = None) -> BenchResult:
    """The reference, then every (δ, mode) of ``cfg`` through the stack, on ``etcd_endpoint``
    (a private etcd when None). ``on_row`` sees each row as it is measured. Raises
    ``BenchError`` naming the run that failed (the cause chained)."""
    _ops, notes = expand_workload(workload)
    reference = await no_controller_run(workload, cfg)
    rows: list[Row] = []
    async with contextlib.AsyncExitStack() as stack:
        if etcd_endpoint is None:
            etcd_endpoint = (await stack.enter_async_context(EmbeddedEtcd(name="opus"))
                             ).endpoint
        for delay in cfg.delays_ms:
            for mode in cfg.modes:
                try:
                    live = await controller_run(etcd_endpoint, workload, cfg, delay, mode)
                except Exception as exc:
                    raise BenchError(f"{mode.value} at δ = {delay:g} ms: "
                                     f"{type(exc).__name__}: {exc}") from exc
                opus_row = opus.runs.get((mode, delay))
                row = Row(delay, mode, live, (live.median_s / reference.median_s - 1) * 100,
                          (live.median_s - reference.median_s) * 1e3, opus_row,
                          opus.overhead_pct(mode, delay))
                rows.append(row)
                if on_row is not None:
                    on_row(row)
    return BenchResult(cfg, workload.name, reference, tuple(rows), opus.no_controller,
                       compute_lower_bound_s(workload) * cfg.time_scale, tuple(notes))


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2f}"


def control_cost_pct(row: Row, reference: LiveRun, time_scale: float) -> float | None:
    """At δ = 0, the control plane's added time per iteration (which the time scale does not
    shrink) over the reference's unscaled iteration (live median / ``time_scale``), in %: the
    figure to set beside Opus's +0.4 % / +2.6 %. None at δ > 0 (δ does scale)."""
    if row.delay_ms != 0:
        return None
    return row.added_ms / 1e3 / (reference.median_s / time_scale) * 100


def format_table(result: BenchResult) -> str:
    """The live table as text: one line per (δ, mode)."""
    cfg = result.config
    ref = result.reference
    opus_ref = result.opus_no_controller
    lines = [
        f"time scale {cfg.time_scale:g}: compute gaps, transfers and δ multiplied by "
        f"{cfg.time_scale:g} (live times below are on that clock; δ is given unscaled); "
        f"{cfg.warmup} warm-up + {cfg.iterations} measured iterations per run; devices: "
        + ("Polatis TL1 over loopback sockets (lightrail emulate process)"
           if cfg.devices == "tl1" else "the controller's in-process emulated driver"),
        f"no controller: live {ref.median_s:.3f} s [{min(ref.iteration_s):.3f}-"
        f"{max(ref.iteration_s):.3f}] = {ref.median_s / cfg.time_scale:.2f} s unscaled "
        f"(compute lower bound {result.compute_s:.3f} s); Opus {opus_ref.mean_s:.3f} s "
        f"(mean, {opus_ref.experiment})",
        "",
        f"{'δ ms':>6} {'mode':<13} {'live s/iter (median [range])':>30} {'live ovh %':>10} "
        f"{'added ms':>9} {'ctl-cost %':>10} {'Opus s':>8} {'Opus ovh %':>10} "
        f"{'switched':>8} {'prov hit':>8}",
    ]
    for r in result.rows:
        it = r.live.iteration_s
        prov = r.live.provisioning
        hit = "-" if prov is None or r.mode is Mode.ON_DEMAND else f"{prov.hit_rate:.0%}"
        lines.append(
            f"{r.delay_ms:>6g} {r.mode.value:<13} "
            f"{f'{r.live.median_s:.3f} [{min(it):.3f}-{max(it):.3f}]':>30} "
            f"{_pct(r.overhead_pct):>10} {r.added_ms:>9.1f} "
            f"{_pct(control_cost_pct(r, ref, cfg.time_scale)):>10} "
            f"{'-' if r.opus is None else f'{r.opus.mean_s:.3f}':>8} "
            f"{_pct(r.opus_overhead_pct):>10} {r.live.reconfigurations_per_iter:>8.1f} "
            f"{hit:>8}")
    lines += [
        "",
        "live ovh %: live median over the live no-controller median (both on the scaled "
        "clock). added ms: live median minus that reference, per iteration. ctl-cost % "
        "(δ = 0 only): the added ms, which the time scale does not shrink, over the "
        "reference's unscaled iteration; the like-for-like figure beside Opus's at l_0. Opus "
        "ovh %: its mean over its no-controller mean. switched: phase instances per iteration "
        "that needed new circuits. prov hit: of those, switched ahead and ready when the "
        "ranks came (the controller's counters over the whole run, warm-up included).",
    ]
    return "\n".join(lines)


def result_to_json(result: BenchResult) -> dict[str, object]:
    """The result as JSON-ready data (``--json``)."""
    cfg = result.config

    def run(v: LiveRun) -> dict[str, object]:
        return {
            "iteration_s": [round(x, 6) for x in v.iteration_s],
            "median_s": round(v.median_s, 6),
            "min_s": round(min(v.iteration_s), 6), "max_s": round(max(v.iteration_s), 6),
            "reconfigurations_per_iteration": round(v.reconfigurations_per_iter, 3),
            "stall_ms_per_iteration": round(v.stall_ms_per_iter, 3),
            "provisioning": None if v.provisioning is None else {
                "hits": v.provisioning.hits, "late": v.provisioning.late,
                "misses": v.provisioning.misses, "learned": v.provisioning.learned},
        }

    return {
        "workload": result.workload,
        "time_scale": cfg.time_scale,
        "iterations": cfg.iterations,
        "warmup": cfg.warmup,
        "devices": cfg.devices,
        "compute_lower_bound_s": round(result.compute_s, 6),
        "notes": list(result.notes),
        "no_controller": {"live": run(result.reference),
                          "opus_mean_s": result.opus_no_controller.mean_s},
        "rows": [
            {"delay_ms": r.delay_ms, "mode": r.mode.value, "live": run(r.live),
             "overhead_pct": round(r.overhead_pct, 3), "added_ms": round(r.added_ms, 3),
             "opus_mean_s": None if r.opus is None else r.opus.mean_s,
             "opus_std_s": None if r.opus is None else r.opus.std_s,
             "opus_overhead_pct": None if r.opus_overhead_pct is None
             else round(r.opus_overhead_pct, 3)}
            for r in result.rows
        ],
    }


# --- command line --------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/opus_replay.py",
        description="Replay the Opus artifact's 16-GPU Llama 3 phase pattern through the real "
                    "controller process, host agents and emulated rails at several "
                    "reconfiguration delays, and print the measured iteration time beside "
                    "Opus's (issue 13).")
    p.add_argument("folder", nargs="?", type=Path, default=None,
                   help=f"the Opus folder (default $LIGHTRAIL_DATA or ../shared/data / {FOLDER})")
    p.add_argument("--delay-ms", type=float, nargs="+", default=None,
                   help="reconfiguration delays δ in ms, unscaled (default 0 10 100 1000)")
    p.add_argument("--mode", choices=[m.value for m in Mode], nargs="+", default=None,
                   help="controller policies (default both)")
    p.add_argument("--time-scale", type=float, default=None,
                   help=f"multiply compute gaps, transfers and δ by this (default "
                        f"{DEFAULT_TIME_SCALE:g}; --quick {QUICK_TIME_SCALE:g})")
    p.add_argument("--iterations", type=int, default=None,
                   help="measured iterations per run (default 6, as Opus's CSVs; --quick 2)")
    p.add_argument("--warmup", type=int, default=None,
                   help="unmeasured iterations first (default 4, as Opus's notebook; "
                        "--quick 3)")
    p.add_argument("--devices", choices=["tl1", "emulated"], default="tl1",
                   help="the emulated rails: a lightrail emulate process over TL1 sockets, or "
                        "the controller's in-process driver (default tl1)")
    p.add_argument("--quick", action="store_true",
                   help="a short run for tests: time scale 0.02, 3 warm-up + 2 measured "
                        "iterations")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def config_from_args(a: argparse.Namespace) -> BenchConfig:
    """The ``BenchConfig`` of parsed arguments (``--quick`` changes the defaults only)."""
    return BenchConfig(
        delays_ms=tuple(a.delay_ms) if a.delay_ms else DELAYS_MS,
        modes=tuple(Mode(m) for m in a.mode) if a.mode else (Mode.ON_DEMAND,
                                                              Mode.PROVISIONING),
        time_scale=a.time_scale if a.time_scale is not None else (
            QUICK_TIME_SCALE if a.quick else DEFAULT_TIME_SCALE),
        iterations=a.iterations if a.iterations is not None else (2 if a.quick else 6),
        warmup=a.warmup if a.warmup is not None else (3 if a.quick else 4),
        devices=a.devices,
    )


async def main_async(argv: Sequence[str] | None = None, *,
                     etcd_endpoint: str | None = None) -> tuple[int, BenchResult | None]:
    """Parse ``argv``, run, print; returns the exit code and the result (None on error).
    ``etcd_endpoint``: use that etcd instead of a private one (tests)."""
    a = _parser().parse_args(argv)
    try:
        cfg = config_from_args(a)
    except BenchError as exc:
        print(f"opus_replay: {exc}", file=sys.stderr)
        return 2, None
    folder = a.folder or shared_data_dir() / FOLDER
    try:
        workload = load_workload(folder)
        opus = read_opus_latencies(folder if folder.is_dir() else folder.parent)
    except (TraceError, OSError) as exc:
        print(f"opus_replay: {exc}", file=sys.stderr)
        return 2, None
    if not a.json:
        print(f"{workload.name}: {workload.world_size} ranks on {HOSTS} hosts x "
              f"{GPUS_PER_HOST} GPUs; Opus's CSVs in {folder}")
        for note in expand_workload(workload)[1]:
            print(f"  note: {note}")
        sys.stdout.flush()

    def on_row(row: Row) -> None:
        if not a.json:
            print(f"  measured {row.mode.value} at δ = {row.delay_ms:g} ms: "
                  f"{row.live.median_s:.3f} s/iteration", file=sys.stderr)

    try:
        result = await run_bench(workload, opus, cfg, etcd_endpoint=etcd_endpoint,
                                 on_row=on_row)
    except BenchError as exc:
        print(f"opus_replay: {exc}", file=sys.stderr)
        return 1, None
    if a.json:
        print(json.dumps(result_to_json(result), indent=2))
    else:
        print(format_table(result))
    return 0, result


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    configure_logging("warning", "console")
    return asyncio.run(main_async(argv))[0]


if __name__ == "__main__":
    sys.exit(main())
