"""Opus's Perlmutter latency table, live: the 16-GPU phase pattern through the real stack.

Run: ``.venv/bin/python bench/opus_replay.py [--quick] [--delay-ms 0 10 100 1000]
[--mode on-demand provisioning] [--time-scale 0.05] [--iterations 6] [--warmup 4]
[--link-gbps 200] [--phases runs|calls] [--no-calibrate] [--devices tl1|emulated] [--json]
[FOLDER]`` (``--help`` says what each does). A script, not a test (pytest does not collect
``bench/``; ``tests/e2e/test_opus_replay.py`` runs ``--quick``). The runs themselves (the
no-controller reference, one replay through the stack, the merging of runs of calls, the
calibration) are in ``bench/opus_live.py``; this module holds Opus's rows, the table and the
command line.

What runs (issue 13, section 1, "Live")
----------------------------------------
* The workload: the folder read by ``lightrail replay``'s loader
  (``lightrail.agents.replay.trace.loader.load_workload`` ->
  ``lightrail.agents.replay.trace.opus``): one training step of every rank, PP and DP phases,
  compute gaps from the timed files, message sizes derived from the model (its assumptions are
  printed). Each call "transfers" for ``nbytes / --link-gbps`` (times the time scale), as the
  replayer does; TP is inside a host (NVLink) and never reaches the controller. A run of calls
  of one collective on one group is one phase (``--phases runs``, the default: as Lightrail's
  PyTorch gate and Opus's shim gate them; the compute between its calls is time under its
  circuits); ``--phases calls`` makes every call a phase, as ``lightrail replay`` does.
* Calibration (default; ``--no-calibrate`` to skip): the compute gaps are multiplied by the
  factor that makes the live no-controller iteration Opus's measured no-controller mean (a few
  no-controller runs, each step multiplying by target / measured), as ``lightrail evaluate``
  calibrates its prediction on that row only; the controlled rows are not fitted. The
  folder's gaps come from the timed files of a ``b24`` run while the CSVs were measured on
  ``b16`` runs (README), so they do not give Opus's iteration as read.
* Fabric: a generated rail fabric of 4 hosts x 4 GPUs (Perlmutter: 4 nodes of 4 GPUs; rail g =
  NIC g of every host, one 4 x 4 N x N OCS per rail). Ranks are placed by the replayer's rule:
  rank r on host r // 4, GPU r % 4 (the notebook's ``global rank = N*4 + M``), so each rail
  carries the two PP pairs and the two DP pairs of its local rank.
* Per (δ, mode): the emulated rails as their own process (``lightrail emulate``: Polatis TL1
  over loopback sockets, ``--devices tl1``, the default; ``--devices emulated``: the
  controller's in-process emulated driver), a ``lightrail controller`` child process
  (``controller.provisioning`` true for ``provisioning``, false for ``on-demand``, Opus's
  "baseline"; one private etcd for the whole bench) and one host agent per host with one
  PhaseStream each, in this process, driven by ``lightrail.agents.replay.replayer.Replayer``:
  each rank sleeps its gap times ``--time-scale``, enters the phase, waits for its group (a
  collective), transfers, releases.
* Time scale: compute gaps, transfers and the rails' reconfiguration delay δ are multiplied by
  ``--time-scale`` (default 0.05, i.e. divided by 20), so δ's share of an iteration is kept and
  overheads compare as percentages. The control plane's own cost (gRPC, the coordinator, the
  TL1 round trips) does not shrink: at δ = 0 it is the whole overhead and a scale below 1
  magnifies its percentage by 1 / scale. The table gives it unmagnified as ``ctl-cost %``: the
  added ms per iteration over the reference's unscaled iteration, the figure to set beside
  Opus's +0.4 % / +2.6 % at l_0.
* The no-controller reference (Opus's ``MODE=no-ctl``: the shim asks nothing) is the same
  replayer, ranks, sleeps and transfers, with host agents that admit every phase at once and no
  controller (``NoControllerReplayer``).
* Iteration time: the replayer reports each iteration when its last rank finishes it; an
  iteration's time is the interval between two such completions (ranks run ahead into the next
  iteration, as a training job does). Like Opus's ``provision.ipynb`` (torchtitan step-log
  timestamps of steps 4..10: 6 intervals) the first ``--warmup`` iterations (default 4) are not
  measured; provisioning needs ``controller.learn_iterations`` (2) of them to learn the
  schedule. A row gives the median and range of the ``--iterations`` measured intervals
  (default 6) and the median's overhead over the no-controller median.
* ``δ/it``: the reconfiguration delays paid per iteration beyond the mode's δ = 0 cost, and
  Opus's equivalent from its CSVs: a comparison that does not depend on how long the
  replayed iteration is.
* Opus's columns: the folder's latency CSVs (``lightrail.agents.replay.trace.opus_latency``;
  README "Latency CSVs": "Average Latency" is the mean of 6 step intervals in s, ``baseline`` =
  on-demand, ``provision`` = provisioning, ``l_<N>`` = δ of N ms); Opus's +0.4 % and +2.6 % at
  δ = 0 are means over the no-controller mean, and so are its overheads here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from opus_live import (
    DEFAULT_TIME_SCALE,
    DELAYS_MS,
    GPUS_PER_HOST,
    HOSTS,
    LINK_GBPS,
    BenchConfig,
    BenchError,
    LiveRun,
    Mode,
    calibrate_gaps,
    compute_lower_bound_s,
    controller_run,
    emulated_rails,
    no_controller_run,
    replayed_workload,
    scale_gaps,
)

from lightrail.agents.replay.replayer import expand_workload
from lightrail.agents.replay.trace.loader import load_workload
from lightrail.agents.replay.trace.model import TraceError, Workload
from lightrail.agents.replay.trace.opus_latency import (
    LatencyRow,
    LatencyTable,
    read_latency_folder,
)
from lightrail.controller.cli.common import shared_data_dir
from lightrail.controller.logs import configure_logging
from lightrail.controller.store.etcd_server import EmbeddedEtcd

FOLDER = "traces/opus-perlmutter/llama-3-3d-16-latency"
"""The 16-GPU folder of the Opus artifact, under ``$LIGHTRAIL_DATA`` or ``../shared/data``."""

QUICK_TIME_SCALE = 0.02


# --- Opus's measured iteration times (read by lightrail.agents.replay.trace.opus_latency) --


def opus_row(table: LatencyTable, mode: Mode, delay_ms: float) -> LatencyRow | None:
    """Opus's run of ``mode`` at δ = ``delay_ms`` (``baseline`` = on-demand, ``provision`` =
    provisioning), None when its CSVs have none."""
    return (table.on_demand if mode is Mode.ON_DEMAND else table.provisioning).get(delay_ms)


def opus_overhead_pct(table: LatencyTable, mode: Mode, delay_ms: float) -> float | None:
    """Opus's mean iteration time of (mode, δ) over its no-controller mean, minus 1, in %
    (how the issue's +0.4 % and +2.6 % at l_0 are computed); None without that run."""
    row = opus_row(table, mode, delay_ms)
    if row is None:
        return None
    return (row.mean_s / table.no_controller.mean_s - 1.0) * 100.0


def read_opus_table(folder: Path) -> LatencyTable:
    """The latency CSVs of ``folder`` (or of its parent, for a bare ``comm_pattern*``
    folder). Raises ``TraceError`` as ``read_latency_folder`` does, and when neither folder
    has one."""
    for where in (folder, folder.parent):
        table = read_latency_folder(where)
        if table is not None:
            return table
    raise TraceError(folder, "latency_results*.csv", str(folder),
                     "no Opus latency CSV here or in the parent folder")


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
    opus: LatencyRow | None
    opus_overhead_pct: float | None


@dataclass(frozen=True, slots=True)
class BenchResult:
    """The reference, every row, Opus's table, the workload's compute lower bound per
    iteration (s, scaled: the largest sum of one rank's gaps), and the notes."""

    config: BenchConfig
    workload: str
    reference: LiveRun
    rows: tuple[Row, ...]
    opus: LatencyTable
    compute_s: float
    notes: tuple[str, ...]
    gap_scale: float = 1.0
    """The calibration factor applied to the workload's compute gaps (1: none)."""

    def row(self, delay_ms: float, mode: Mode) -> Row | None:
        """The measured row of (δ, mode), None when not run."""
        return next((r for r in self.rows if (r.delay_ms, r.mode) == (delay_ms, mode)), None)

    def exposed_delays(self, row: Row) -> Estimate | None:
        """How many δ the live run paid per iteration beyond its mode's own control cost:
        (added ms - the δ = 0 row's added ms) / (δ x time scale), give or take the two rows'
        half-ranges over the same scaled δ. None at δ = 0 or when δ = 0 was not run in that
        mode. Independent of the iteration's length, so it compares with
        ``opus_exposed_delays`` even where the replay's no-controller iteration differs from
        Opus's."""
        zero = self.row(0.0, row.mode)
        if row.delay_ms == 0 or zero is None:
            return None
        scaled_s = row.delay_ms / 1e3 * self.config.time_scale
        return Estimate((row.added_ms - zero.added_ms) / 1e3 / scaled_s,
                        (row.live.half_range_s + zero.live.half_range_s) / scaled_s)

    def opus_exposed_delays(self, row: Row) -> Estimate | None:
        """The same for Opus: (mean at δ - mean at l_0 of the mode) / δ, give or take the sum
        of the two runs' standard deviations over δ; None at δ = 0 or without both runs in
        its CSVs."""
        here = opus_row(self.opus, row.mode, row.delay_ms)
        zero = opus_row(self.opus, row.mode, 0.0)
        if row.delay_ms == 0 or here is None or zero is None:
            return None
        delay_s = row.delay_ms / 1e3
        return Estimate((here.mean_s - zero.mean_s) / delay_s,
                        (here.std_s + zero.std_s) / delay_s)


@dataclass(frozen=True, slots=True)
class Estimate:
    """A derived figure and how far it can be off (``value`` +- ``spread``, same unit)."""

    value: float
    spread: float

    def __str__(self) -> str:
        return f"{self.value:.1f}±{self.spread:.1f}"


async def _rows_at(etcd_endpoint: str, workload: Workload, opus: LatencyTable,
                   cfg: BenchConfig, reference: LiveRun, delay_ms: float,
                   on_row: Callable[[Row], None] | None) -> list[Row]:
    """Every mode of ``cfg`` at δ = ``delay_ms``, one after the other on one emulator."""
    rows: list[Row] = []
    try:
        async with emulated_rails(delay_ms, cfg) as rails:
            for mode in cfg.modes:
                try:
                    live = await controller_run(etcd_endpoint, rails, workload, cfg,
                                                delay_ms, mode)
                except Exception as exc:
                    raise BenchError(f"{mode.value} at δ = {delay_ms:g} ms: "
                                     f"{type(exc).__name__}: {exc}") from exc
                rows.append(Row(delay_ms, mode, live,
                                (live.median_s / reference.median_s - 1) * 100,
                                (live.median_s - reference.median_s) * 1e3,
                                opus_row(opus, mode, delay_ms),
                                opus_overhead_pct(opus, mode, delay_ms)))
                if on_row is not None:
                    on_row(rows[-1])
    except BenchError:
        raise
    except Exception as exc:  # the emulator did not start or stop
        raise BenchError(f"emulated rails at δ = {delay_ms:g} ms: {type(exc).__name__}: "
                         f"{exc}") from exc
    return rows


async def run_bench(workload: Workload, opus: LatencyTable, cfg: BenchConfig, *,
                    etcd_endpoint: str | None = None,
                    on_row: Callable[[Row], None] | None = None) -> BenchResult:
    """The reference, then every (δ, mode) of ``cfg`` through the stack, on ``etcd_endpoint``
    (a private etcd when None). ``on_row`` sees each row as it is measured. Raises
    ``BenchError`` naming the run that failed (the cause chained). With ``cfg.calibrate`` the
    compute gaps are first scaled so that the live no-controller iteration is Opus's
    (``calibrate_gaps``; the factor is ``BenchResult.gap_scale`` and a note)."""
    target_s = opus.no_controller.mean_s
    if cfg.calibrate:
        factor, reference = await calibrate_gaps(
            workload, target_s, cfg, lambda w: replayed_workload(w, cfg))
        workload = scale_gaps(workload, factor)
    else:
        factor = 1.0
        reference = await no_controller_run(replayed_workload(workload, cfg), cfg)
    compute_s = compute_lower_bound_s(workload) * cfg.time_scale
    workload = replayed_workload(workload, cfg)
    _ops, notes = expand_workload(workload)
    if cfg.calibrate:
        notes.append(
            f"calibration (no-controller row only, as lightrail evaluate): compute gaps x "
            f"{factor:.4f} so that the live no-controller iteration "
            f"({reference.median_s / cfg.time_scale:.3f} s unscaled) matches Opus's measured "
            f"mean {target_s:.3f} s; the controlled rows are not fitted")
    rows: list[Row] = []
    async with contextlib.AsyncExitStack() as stack:
        if etcd_endpoint is None:
            etcd_endpoint = (await stack.enter_async_context(EmbeddedEtcd(name="opus"))
                             ).endpoint
        for delay in cfg.delays_ms:
            rows += await _rows_at(etcd_endpoint, workload, opus, cfg, reference, delay,
                                   on_row)
    return BenchResult(cfg, workload.name, reference, tuple(rows), opus, compute_s,
                       tuple(notes), factor)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2f}"


def _est(v: Estimate | None) -> str:
    return "-" if v is None else str(v)


def _pct_est(v: Estimate | None) -> str:
    return "-" if v is None else f"{v.value:+.2f}±{v.spread:.2f}"


def control_cost_pct(row: Row, reference: LiveRun, time_scale: float) -> Estimate | None:
    """At δ = 0, the control plane's added time per iteration (which the time scale does not
    shrink) over the reference's unscaled iteration (live median / ``time_scale``), in %, give
    or take the two runs' half-ranges over the same: the figure to set beside Opus's +0.4 % /
    +2.6 %. None at δ > 0 (δ does scale)."""
    if row.delay_ms != 0:
        return None
    unscaled_s = reference.median_s / time_scale
    return Estimate(row.added_ms / 1e3 / unscaled_s * 100,
                    (row.live.half_range_s + reference.half_range_s) / unscaled_s * 100)


def format_table(result: BenchResult) -> str:
    """The live table as text: one line per (δ, mode)."""
    cfg = result.config
    ref = result.reference
    opus_ref = result.opus.no_controller
    lines = [
        f"time scale {cfg.time_scale:g}: compute gaps, transfers and δ multiplied by "
        f"{cfg.time_scale:g} (live times below are on that clock; δ is given unscaled); "
        f"{cfg.warmup} warm-up + {cfg.iterations} measured iterations per run; phases: "
        + ("one per run of calls (as the PyTorch gate and Opus's shim)" if cfg.phases == "runs"
           else "one per call") + "; devices: "
        + ("Polatis TL1 over loopback sockets (lightrail emulate process)"
           if cfg.devices == "tl1" else "the controller's in-process emulated driver"),
        f"no controller: live {ref.median_s:.3f} s [{min(ref.iteration_s):.3f}-"
        f"{max(ref.iteration_s):.3f}] = {ref.median_s / cfg.time_scale:.3f} s unscaled "
        f"(compute lower bound {result.compute_s:.3f} s); Opus {opus_ref.mean_s:.3f} s "
        f"(mean, {opus_ref.experiment}); "
        + (f"compute gaps x {result.gap_scale:.4f} (calibrated on that row only)"
           if cfg.calibrate else "gaps as read (not calibrated)"),
        "",
        f"{'δ ms':>6} {'mode':<13} {'live s/iter (median [range])':>30} {'÷ scale':>7} "
        f"{'live ovh %':>10} "
        f"{'added ms':>9} {'ctl-cost %':>11} {'Opus s':>8} {'Opus ovh %':>10} "
        f"{'δ/it':>11} {'Opus δ/it':>11} {'switched':>8} {'prov hit':>8}",
    ]
    for r in result.rows:
        it = r.live.iteration_s
        prov = r.live.provisioning
        hit = "-" if prov is None or r.mode is Mode.ON_DEMAND else f"{prov.hit_rate:.0%}"
        lines.append(
            f"{r.delay_ms:>6g} {r.mode.value:<13} "
            f"{f'{r.live.median_s:.3f} [{min(it):.3f}-{max(it):.3f}]':>30} "
            f"{r.live.median_s / cfg.time_scale:>7.2f} "
            f"{_pct(r.overhead_pct):>10} {r.added_ms:>9.1f} "
            f"{_pct_est(control_cost_pct(r, ref, cfg.time_scale)):>11} "
            f"{'-' if r.opus is None else f'{r.opus.mean_s:.3f}':>8} "
            f"{_pct(r.opus_overhead_pct):>10} {_est(result.exposed_delays(r)):>11} "
            f"{_est(result.opus_exposed_delays(r)):>11} "
            f"{r.live.reconfigurations_per_iter:>8.1f} {hit:>8}")
    lines += [
        "",
        "÷ scale: the live median in unscaled s (its control-plane part magnified by 1 / "
        "scale). live ovh %: live median over the live no-controller median (both on the "
        "scaled clock). added ms: live median minus that reference, per iteration. ctl-cost % "
        "(δ = 0 only): the added ms, which the time scale does not shrink, over the "
        "reference's unscaled iteration (± the two runs' half-ranges over the same); the "
        "like-for-like figure beside Opus's at l_0. Opus "
        "ovh %: its mean over its no-controller mean. δ/it: reconfiguration delays paid per "
        "iteration beyond the mode's δ = 0 cost, (added - added at δ = 0) / scaled δ, ± the "
        "two rows' half-ranges over the scaled δ; Opus δ/it: (its mean - its l_0 mean) / δ, "
        "± the sum of the two runs' std over δ (both independent of the iteration's length; "
        "unresolved where ± exceeds the value). switched: phase instances per iteration "
        "admitted after a reconfiguration (circuits provisioned in time count as ready). "
        "prov hit: of the phases that needed new circuits, those switched ahead and ready "
        "when the ranks came (the controller's counters over the whole run, warm-up "
        "included).",
    ]
    return "\n".join(lines)


def _rounded(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _estimate(v: Estimate | None) -> dict[str, float] | None:
    return None if v is None else {"value": round(v.value, 3), "spread": round(v.spread, 3)}


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
        "gap_scale": round(result.gap_scale, 6),
        "calibrated": cfg.calibrate,
        "phases": cfg.phases,
        "link_gbps": cfg.link_gbps,
        "compute_lower_bound_s": round(result.compute_s, 6),
        "notes": list(result.notes),
        "no_controller": {"live": run(result.reference),
                          "opus_mean_s": result.opus.no_controller.mean_s},
        "rows": [
            {"delay_ms": r.delay_ms, "mode": r.mode.value, "live": run(r.live),
             "overhead_pct": round(r.overhead_pct, 3), "added_ms": round(r.added_ms, 3),
             "opus_mean_s": None if r.opus is None else r.opus.mean_s,
             "opus_std_s": None if r.opus is None else r.opus.std_s,
             "opus_overhead_pct": None if r.opus_overhead_pct is None
             else round(r.opus_overhead_pct, 3),
             "control_cost_pct": _estimate(control_cost_pct(r, result.reference,
                                                            cfg.time_scale)),
             "exposed_delays_per_iteration": _estimate(result.exposed_delays(r)),
             "opus_exposed_delays_per_iteration": _estimate(result.opus_exposed_delays(r))}
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
                        "--quick 2: the controller learns the schedule in 2)")
    p.add_argument("--link-gbps", type=float, default=LINK_GBPS,
                   help=f"rail link speed for the replayed transfers (nbytes / link, times "
                        f"the time scale; default {LINK_GBPS:g}: Perlmutter's Slingshot)")
    p.add_argument("--phases", choices=["runs", "calls"], default="runs",
                   help="runs: a run of calls of one collective on one group is one phase, "
                        "as the PyTorch gate and Opus's shim gate them (default); calls: "
                        "every call is a phase (lightrail replay's granularity)")
    p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="replay the compute gaps as read; by default they are scaled so that "
                        "the live no-controller iteration matches Opus's no-controller mean "
                        "(as lightrail evaluate calibrates; the factor is printed)")
    p.add_argument("--devices", choices=["tl1", "emulated"], default="tl1",
                   help="the emulated rails: a lightrail emulate process over TL1 sockets, or "
                        "the controller's in-process driver (default tl1)")
    p.add_argument("--quick", action="store_true",
                   help=f"a short run for tests: time scale {QUICK_TIME_SCALE:g}, 2 warm-up + 2 "
                        "measured iterations")
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
        warmup=a.warmup if a.warmup is not None else (2 if a.quick else 4),
        devices=a.devices,
        link_gbps=a.link_gbps,
        phases=a.phases,
        calibrate=a.calibrate,
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
        opus = read_opus_table(folder)
    except (TraceError, OSError) as exc:
        print(f"opus_replay: {exc}", file=sys.stderr)
        return 2, None
    if not a.json:
        print(f"{workload.name}: {workload.world_size} ranks on {HOSTS} hosts x "
              f"{GPUS_PER_HOST} GPUs; Opus's CSVs in {folder}")
        for note in expand_workload(replayed_workload(workload, cfg))[1]:
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
