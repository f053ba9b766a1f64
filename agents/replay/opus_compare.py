"""``lightrail evaluate`` on an Opus experiment folder: Lightrail's prediction beside Opus's
measured iteration times (``../shared/data/traces/opus-perlmutter/README.md``).

For every δ of the latency CSVs (:mod:`lightrail.agents.replay.trace.opus_latency`): measured
seconds per iteration with no controller, on-demand (``baseline``) and provisioning
(``provision``); Lightrail's prediction of the same two policies
(:func:`lightrail.agents.replay.evaluate.evaluate` on the workload of
:mod:`lightrail.agents.replay.trace.opus`, on a rail fabric of the job's size: nodes x 4 GPUs,
one OCS per rail); the error of the predicted overhead against the measured one
(overhead = iteration - no-controller; error % = (predicted - measured) / |measured| * 100);
and Lightrail's best policy at that δ, the fastest of ``provisioning_ron`` (provisioning with
reconfigure-or-not, evaluate's policy) and the policies of
:mod:`lightrail.agents.replay.opus_policies` (``static_cycle``: one directed cycle per rail,
never reconfigured; ``split_rails``: some rails hold the PP pairs and the others the DP rings
for the whole job, reached over NVLink; ``hybrid``: provisioning with reconfigure-or-not over
those sets and the direct PP and DP circuits). The δ = 0 rows also give a second, diagnostic
error: the predicted overhead against the measured one over the same mode's δ = 0 run (which
holds the controller's own cost and the run-to-run spread, not modelled), printed beside the
first.

Calibration (from the no-controller row only): the compute gaps are scaled by one factor so that
the predicted no-controller iteration (evaluate's ``ideal_eps``: no δ) equals the measured
no-controller mean; the controlled rows are never fitted.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from lightrail.agents.replay.evaluate import (
    DEFAULT_SCALE_UP,
    Evaluation,
    EvaluationConfig,
    EvaluationError,
    Policy,
    evaluate,
)
from lightrail.agents.replay.opus_policies import hybrid_s, split_rails_s, stage_policies
from lightrail.agents.replay.trace.model import TraceError, Workload
from lightrail.agents.replay.trace.opus import GPUS_PER_NODE, OpusExperiment, read_opus
from lightrail.agents.replay.trace.opus_latency import LatencyTable, read_latency_folder
from lightrail.controller.core.costmodel import CostModelError, LinkModel

__all__ = ["PERLMUTTER_LINK", "OpusComparison", "OpusRow", "compare", "comparison_to_json",
           "opus_evaluate_main", "print_comparison"]

PERLMUTTER_LINK = LinkModel.from_gbps(200.0, 5e-6)
"""A Perlmutter GPU node's NIC: Slingshot-11, 200 Gb/s, one per GPU (NERSC, "Perlmutter
architecture"); α = 5 µs is an assumption."""
AIM_PCT = 15.0
"""Issue 13's aim: predicted overhead within 15 % of measured for δ >= 100 ms."""
_CAL_ROUNDS = 4


@dataclass(frozen=True, slots=True)
class OpusRow:
    """One δ (ms). Times in s per iteration (None where not measured); ``err_*_pct``: error
    of the predicted overhead vs the measured (None when the measured overhead is 0 or the
    row is missing); ``err0_*_pct``: the same against the measured overhead over that mode's
    δ = 0 run (diagnostic); ``hybrid_switches``: its reconfigurations per iteration;
    ``best``: the name of Lightrail's best policy and its time."""

    delay_ms: float
    measured_on_demand_s: float | None
    measured_provisioning_s: float | None
    predicted_on_demand_s: float
    predicted_provisioning_s: float
    predicted_ron_s: float
    static_cycle_s: float
    hybrid_s: float
    hybrid_switches: int
    split_rails_s: float
    err_on_demand_pct: float | None
    err_provisioning_pct: float | None
    err0_on_demand_pct: float | None
    err0_provisioning_pct: float | None
    best: str
    best_s: float
    reconfigurations_on_demand: int
    exposed_provisioning_s: float


@dataclass(frozen=True, slots=True)
class OpusComparison:
    """The comparison of one experiment folder."""

    name: str
    world_size: int
    hosts: int
    fabric: str
    gap_scale: float
    measured_no_controller_s: float
    predicted_no_controller_s: float
    rows: tuple[OpusRow, ...]
    notes: tuple[str, ...]


def _fabric_spec(hosts: int) -> str:
    """The rail fabric of ``hosts`` x 4 GPUs (``rail:<hosts>x4``, named ``rail-<hosts>x4``)."""
    return f"rail:{hosts}x{GPUS_PER_NODE}"


def _err(pred_over: float, meas_over: float | None) -> float | None:
    if meas_over is None or meas_over == 0:
        return None
    return (pred_over - meas_over) / abs(meas_over) * 100.0


def _evaluate(exp: OpusExperiment, scale: float, delays: Sequence[float],
              fabric: str) -> tuple[Workload, Evaluation]:
    w = exp.workload(scale)
    cfg = EvaluationConfig(delays_ms=tuple(delays), link=PERLMUTTER_LINK,
                           scale_up=DEFAULT_SCALE_UP, fabric=fabric)
    return w, evaluate(w, cfg)


def compare(folder: Path) -> OpusComparison:
    """Read ``folder`` (an Opus experiment folder with latency CSVs) and compare (module
    docstring). Raises ``TraceError`` for unreadable input, a folder without latency CSVs or
    with no run at a delay,
    ``EvaluationError`` when the evaluation cannot run or the calibration cannot reach the
    measured no-controller time."""
    exp = read_opus(folder)
    table = read_latency_folder(Path(folder))
    if table is None:
        raise TraceError(folder, "latency CSVs", None,
                         "no latency_results*.csv with the Opus header in this folder")
    if not table.delays_ms():
        raise TraceError(folder, "Experiment", table.no_controller.experiment,
                         "only the no-controller run in the latency CSVs: no l_<N> row "
                         "(baseline or provision) to compare")
    fabric = _fabric_spec(exp.nodes)
    target = table.no_controller.mean_s
    # ideal time is max over stages of (scale * gaps + comm): fixed-point on the slowest stage
    scale = 1.0
    for _ in range(_CAL_ROUNDS):
        w, ev = _evaluate(exp, scale, (0.0,), fabric)
        t = ev.result(Policy.IDEAL_EPS, 0.0).iteration_s
        assert t is not None
        gaps = max(sum(o.compute_gap_s for o in w.ranks[r.rank]) for r in ev.representatives)
        comm = t - gaps
        if gaps <= 0 or target <= comm:
            raise EvaluationError(f"{exp.name}: cannot calibrate: predicted communication "
                                  f"{comm:.3f} s >= measured no-controller {target:.3f} s, or "
                                  "no compute gaps (timed files missing)")
        scale = (target - comm) / (gaps / scale)
    delays = table.delays_ms()
    w, ev = _evaluate(exp, scale, delays, fabric)
    ideal = ev.result(Policy.IDEAL_EPS, delays[0]).iteration_s
    assert ideal is not None
    pol = stage_policies(exp, scale, PERLMUTTER_LINK)
    cycle = pol.static_cycle_s()
    split, pp_rails = split_rails_s(pol.stages, DEFAULT_SCALE_UP)
    zero_od, zero_pv = table.on_demand.get(0.0), table.provisioning.get(0.0)
    rows: list[OpusRow] = []
    for d in delays:
        od, pv, ron = (ev.result(p, d) for p in (Policy.ON_DEMAND, Policy.PROVISIONING,
                                                   Policy.PROVISIONING_RON))
        assert od.iteration_s is not None and pv.iteration_s is not None
        assert ron.iteration_s is not None
        hybrid, switches = hybrid_s(pol.stages, d / 1e3, DEFAULT_SCALE_UP)
        m_od = table.on_demand.get(d)
        m_pv = table.provisioning.get(d)
        # hybrid includes never switching (the static sets) and its choices: on a tie
        # (within float noise) the earlier candidate is named
        cands = [("provisioning_ron", ron.iteration_s), ("hybrid", hybrid),
                 ("static_cycle", cycle), ("split_rails", split)]
        best, best_s = min(cands, key=lambda c: round(c[1], 9))
        p_od, p_pv = od.iteration_s - ideal, pv.iteration_s - ideal
        rows.append(OpusRow(
            d, m_od.mean_s if m_od else None, m_pv.mean_s if m_pv else None,
            od.iteration_s, pv.iteration_s, ron.iteration_s, cycle, hybrid, switches, split,
            _err(p_od, m_od.mean_s - target if m_od else None),
            _err(p_pv, m_pv.mean_s - target if m_pv else None),
            _err(p_od, m_od.mean_s - zero_od.mean_s if m_od and zero_od and d > 0 else None),
            _err(p_pv, m_pv.mean_s - zero_pv.mean_s if m_pv and zero_pv and d > 0 else None),
            best, best_s, od.reconfigurations, pv.exposed_delay_s))
    notes = [*w.assumptions[:-1],
             f"calibration (no-controller row only): compute gaps x {scale:.4f} so that the "
             f"predicted no-controller iteration {ideal:.3f} s matches the measured mean "
             f"{target:.3f} s; controlled rows are not fitted",
             f"fabric {ev.fabric}: {exp.nodes} hosts x {GPUS_PER_NODE} rails, one N x N OCS per "
             f"rail; link {PERLMUTTER_LINK.bandwidth_gbps:g} Gb/s (Slingshot-11), NVLink "
             f"{DEFAULT_SCALE_UP.bandwidth_gbps / 8:g} GB/s",
             "model: one representative rank per stage, the job's iteration is the slower "
             "stage; waiting between stages is inside the recorded gaps and spans (a delay on "
             "one stage is not propagated to the other)",
             f"static cycle ({pol.order.name}, also a state of hybrid): hosts "
             f"{' -> '.join(map(str, (*pol.order.order, pol.order.order[0])))} on every rail; "
             "the far direction of a pair is forwarded through the hosts between (it needs a "
             "relay there, which NCCL on Perlmutter does not do by itself)",
             f"split rails: {pp_rails} of {GPUS_PER_NODE} rail(s) hold the PP pairs, the others "
             "the DP rings, never reconfigured; GPUs reach a rail of the right kind over NVLink "
             "(NCCL PXN)",
             *[n for n in ev.notes if n not in w.assumptions],
             *_zero_delay_notes(table),
             *_slope_notes(table, rows)]
    return OpusComparison(exp.name, exp.world_size, exp.nodes, ev.fabric, scale, target, ideal,
                          tuple(rows), tuple(notes))


def _zero_delay_notes(table: LatencyTable) -> list[str]:
    """What the δ = 0 rows say the model leaves out (control-plane cost, run-to-run spread)."""
    nc = table.no_controller
    parts = [f"{name} {row.mean_s - nc.mean_s:+.3f} s" for name, row in
             (("on-demand", table.on_demand.get(0.0)), ("provisioning",
                                                         table.provisioning.get(0.0))) if row]
    if not parts:
        return []
    return [f"measured at δ = 0 over no controller: {', '.join(parts)} (no-controller std "
            f"{nc.std_s:.3f} s over 6 steps): the controller's own cost and run-to-run spread, "
            "which the model does not include; at small δ they dominate the overhead, so the "
            "error % there says little"]


def _slope_notes(table: LatencyTable, rows: Sequence[OpusRow]) -> list[str]:
    """Measured exposed δ per iteration (the slope of iteration time over δ between the two
    largest δ of each mode) beside the model's switches per iteration: where they differ, the
    runs hid (or added) whole reconfigurations the per-stage model does not see."""
    out: list[str] = []
    for name, by in (("on-demand", table.on_demand), ("provisioning", table.provisioning)):
        ds = sorted(by)
        if len(ds) < 3 or ds[-1] <= ds[-2]:
            continue
        a, b = ds[-2], ds[-1]
        slope = (by[b].mean_s - by[a].mean_s) / ((b - a) / 1e3)
        out.append(f"measured {name}: +{slope:.2f} s per s of δ between {a:g} and {b:g} ms "
                   f"(the model: {rows[-1].reconfigurations_on_demand} switches per iteration, "
                   "each δ in full once it exceeds the idle gaps)")
    last = rows[-1]
    d = last.delay_ms
    zo, zp = table.on_demand.get(0.0), table.provisioning.get(0.0)
    mo, mp = table.on_demand.get(d), table.provisioning.get(d)
    if d > 0 and zo and zp and mo and mp:
        k = last.reconfigurations_on_demand * d / 1e3
        pred_hidden = last.predicted_on_demand_s - last.predicted_provisioning_s
        out.append(
            f"δ hidden per iteration at {d:g} ms (switches x δ minus the rise over the mode's "
            f"δ = 0 run): measured on-demand {k - (mo.mean_s - zo.mean_s):.2f} s, measured "
            f"provisioning {k - (mp.mean_s - zp.mean_s):.2f} s, predicted provisioning "
            f"{pred_hidden:.2f} s, predicted on-demand 0: Opus's on-demand runs hide about as "
            "much as its provisioning runs (plausibly: a switch that the group's first rank "
            "asked for is partly done when the late ranks arrive; the per-stage model, with "
            "the nodes' clocks not aligned, cannot see that), hence the on-demand "
            "over-prediction at large δ")
        for name, by, zero in (("on-demand", table.on_demand, zo),
                               ("provisioning", table.provisioning, zp)):
            hid = [f"{r.delay_ms:g}: {_k_of(r) - (by[r.delay_ms].mean_s - zero.mean_s):.2f}"
                   for r in rows if r.delay_ms > 0 and r.delay_ms in by]
            out.append(f"measured {name} δ hidden per iteration (s) by δ (ms): "
                       + ", ".join(hid))
        out.append("predicted provisioning δ hidden per iteration (s) by δ (ms): " + ", ".join(
            f"{r.delay_ms:g}: {r.predicted_on_demand_s - r.predicted_provisioning_s:.2f}"
            for r in rows if r.delay_ms > 0))
    return out


def _k_of(r: OpusRow) -> float:
    """Seconds of δ per iteration if every on-demand switch paid it in full."""
    return r.reconfigurations_on_demand * r.delay_ms / 1e3


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, nd)


def comparison_to_json(c: OpusComparison) -> dict[str, Any]:
    """The comparison as JSON-ready data (seconds per iteration, errors in %)."""
    return {
        "workload": c.name, "source_format": "opus", "world_size": c.world_size,
        "hosts": c.hosts, "fabric": c.fabric, "gap_scale": round(c.gap_scale, 6),
        "measured_no_controller_s": _r(c.measured_no_controller_s),
        "predicted_no_controller_s": _r(c.predicted_no_controller_s),
        "aim_pct": AIM_PCT,
        "rows": [{
            "delay_ms": r.delay_ms,
            "measured": {"on_demand_s": _r(r.measured_on_demand_s),
                         "provisioning_s": _r(r.measured_provisioning_s)},
            "predicted": {"on_demand_s": _r(r.predicted_on_demand_s),
                          "provisioning_s": _r(r.predicted_provisioning_s),
                          "provisioning_ron_s": _r(r.predicted_ron_s),
                          "static_cycle_s": _r(r.static_cycle_s),
                          "hybrid_s": _r(r.hybrid_s),
                          "hybrid_switches_per_iteration": r.hybrid_switches,
                          "split_rails_s": _r(r.split_rails_s)},
            "overhead_error_pct": {"on_demand": _r(r.err_on_demand_pct, 2),
                                   "provisioning": _r(r.err_provisioning_pct, 2)},
            "overhead_error_vs_zero_delay_run_pct": {
                "on_demand": _r(r.err0_on_demand_pct, 2),
                "provisioning": _r(r.err0_provisioning_pct, 2)},
            "best": {"policy": r.best, "iteration_s": _r(r.best_s),
                     "beats_opus_provisioning": (None if r.measured_provisioning_s is None
                                                 else r.best_s < r.measured_provisioning_s),
                     "beats_opus_provisioning_rise_over_its_zero_delay_run":
                         _beats_zero(c, r)},
            "reconfigurations_on_demand_per_iteration": r.reconfigurations_on_demand,
            "exposed_delay_provisioning_s": _r(r.exposed_provisioning_s),
        } for r in c.rows],
        "notes": list(c.notes),
    }


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1f}%"


def print_comparison(c: OpusComparison, console: Console) -> None:
    """Notes, then the side-by-side table (s per iteration) and the aim's verdict."""
    console.print(f"[bold]{c.name}[/] (opus): {c.world_size} ranks on {c.hosts} hosts x "
                  f"{GPUS_PER_NODE} rails of {c.fabric}")
    for n in c.notes:
        console.print(f"  note: {n}")
    table = Table(title=f"Opus measured vs Lightrail predicted, s per iteration (no controller: "
                        f"measured {c.measured_no_controller_s:.3f}, predicted "
                        f"{c.predicted_no_controller_s:.3f}); error = predicted vs measured "
                        "overhead over no controller (in brackets: over the same mode's δ = 0 run)")
    for col in ("δ ms", "meas on-demand", "pred on-demand", "err (δ0)", "meas provisioning",
                "pred provisioning", "err (δ0)", "best (Lightrail)", "best s",
                "beats Opus prov"):
        table.add_column(col, justify="right")
    for r in c.rows:
        beats = "-" if r.measured_provisioning_s is None else (
            "yes" if r.best_s < r.measured_provisioning_s else "no")
        table.add_row(f"{r.delay_ms:g}", _s(r.measured_on_demand_s), _s(r.predicted_on_demand_s),
                      f"{_pct(r.err_on_demand_pct)} ({_pct(r.err0_on_demand_pct)})",
                      _s(r.measured_provisioning_s), _s(r.predicted_provisioning_s),
                      f"{_pct(r.err_provisioning_pct)} ({_pct(r.err0_provisioning_pct)})",
                      r.best, _s(r.best_s), beats)
    console.print(table)
    big = [r for r in c.rows if r.delay_ms >= 100]
    miss = [(r.delay_ms, m) for r in big for m, e in (("on-demand", r.err_on_demand_pct),
                                                      ("provisioning", r.err_provisioning_pct))
            if e is not None and abs(e) > AIM_PCT]
    console.print(f"aim (|error| <= {AIM_PCT:g} % for δ >= 100 ms): "
                  + ("met" if not miss else "missed at " + ", ".join(
                      f"{d:g} ms {m}" for d, m in miss)))
    lose = [r.delay_ms for r in c.rows if r.delay_ms >= 50 and r.measured_provisioning_s
            is not None and r.best_s >= r.measured_provisioning_s]
    console.print("best policy beats Opus's measured provisioning at every δ >= 50 ms: "
                  + ("yes" if not lose else "no, not at " + ", ".join(f"{d:g}" for d in lose)
                     + " ms"))
    lose0 = [r.delay_ms for r in c.rows if r.delay_ms >= 50 and _beats_zero(c, r) is False]
    console.print("  ... its overhead over no controller below Opus's provisioning rise over "
                  "Opus's own δ = 0 provisioning run, at every δ >= 50 ms: "
                  + ("yes" if not lose0 else "no, not at " + ", ".join(f"{d:g}" for d in lose0)
                     + " ms"))


def _beats_zero(c: OpusComparison, r: OpusRow) -> bool | None:
    """Lightrail's best overhead (over the predicted no-controller time) against Opus's
    provisioning rise over its δ = 0 provisioning run; None when a row is missing."""
    zero = next((x for x in c.rows if x.delay_ms == 0), None)
    if zero is None or zero.measured_provisioning_s is None or r.measured_provisioning_s is None:
        return None
    return (r.best_s - c.predicted_no_controller_s
            < r.measured_provisioning_s - zero.measured_provisioning_s)


def opus_evaluate_main(folder: Path, *, as_json: bool = False, out_dir: Path | None = None,
                       unused: Sequence[str] = (), console: Console | None = None) -> int:
    """``lightrail evaluate FOLDER`` for an Opus experiment folder: print the comparison (or its
    JSON); with ``out_dir``, also write ``opus_comparison.json`` there. ``unused``: options
    given that this mode does not use (δ come from the CSVs, the fabric from the job), named on
    stderr. Returns 0, 2 on bad input, 1 when the file cannot be written (errors on stderr)."""
    import json

    out = console or Console(width=None if sys.stdout.isatty() else 200)
    if unused:
        print(f"lightrail evaluate: {', '.join(unused)} not used for an Opus experiment folder "
              "(δ from its latency CSVs, a rail fabric of the job's size, Perlmutter's "
              "200 Gb/s links)", file=sys.stderr)
    try:
        c = compare(folder)
    except (TraceError, EvaluationError, CostModelError, OSError) as exc:
        print(f"lightrail evaluate: {exc}", file=sys.stderr)
        return 2
    data = comparison_to_json(c)
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        print_comparison(c, out)
    if out_dir is not None:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "opus_comparison.json").write_text(json.dumps(data, indent=2) + "\n",
                                                          encoding="utf-8")
        except OSError as exc:
            print(f"lightrail evaluate: cannot write to {out_dir}: {exc}", file=sys.stderr)
            return 1
        if not as_json:
            out.print(f"wrote {out_dir / 'opus_comparison.json'}")
    return 0
