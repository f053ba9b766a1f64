"""Planning at scale (issue 3 §5): rail plans for 2,048 and 9,216 GPUs, and one phase-boundary
cycle of the pure coordinator at 2,048 GPUs.

Run: ``.venv/bin/python bench/planning_scale.py [--quick] [--repeat N] [--json]``. A script, not
a test (pytest does not collect ``bench/``). Takes well under 3 minutes on a 2-core machine.

What is measured (single process, one CPU core, wall time via ``time.perf_counter``; best of
``--repeat`` runs):

* ``fabric``: ``lightrail.controller.domain.fabric.rail_fabric`` with H hosts x 8 GPUs (8 rails,
one H x H OCS per
  rail).
* ``layout``: ``lightrail.controller.core.planner.layout_job`` of a contiguous placement (rank r on
host r // 8,
  GPU r % 8).
* ``groups``: a fresh ``ParallelismSpec`` computes the process groups of every ``Dim``.
* ``plan step``: ``lightrail.controller.core.railplan.plan_step`` (one microbatch, one layer per
stage): the
  schedule of one step plus ``plan_phase`` for every distinct (group, collective, sub-phase) and
  the merge into per-dimension rail configurations. ``plan_phase only`` re-runs just the
  ``plan_phase`` calls over the same distinct keys (the planner's share).
* ``peak MiB``: ``tracemalloc`` peak over layout + groups + plan step (a separate run, since
  tracing slows Python down).
* Coordinator (2,048 GPUs, DP phase): ``lightrail.controller.core.coordinator.PhaseCoordinator`` in
process,
  no gRPC and no host agents (the agents' batching changes the transport cost only, which
  ``bench/hot_path.py`` measures; the coordinator's decisions are the same per rank). A
  *boundary* = every rank of the phase calls ``enter``, every resulting ``Reconfigure`` is
  confirmed with ``reconfigured``, every rank calls ``release``. Rows: a PP boundary on cold
  switches (separate coordinator, control row), the first DP all-reduce (cold switches), a PP
  boundary (stage 0 <-> 1 pairs: breaks part of the DP rings), the DP
  phase again (re-make the rings), and the DP phase once more with its circuits in place
  (no-op admissions). ``rounds``: each round confirms every reconfiguration issued so far
  (as if every switch took the same delta), so it counts the deltas on the critical path.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TypeVar

from support import description

from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.core.decisions import Admit, Decision, Reconfigure, Reject
from lightrail.controller.core.planner import JobLayout, layout_job, plan_phase
from lightrail.controller.core.railplan import RailPlan, contiguous_placement, plan_step
from lightrail.controller.domain.fabric import Fabric, rail_fabric
from lightrail.controller.domain.model import Collective, PhaseKey, RankPlacement
from lightrail.controller.domain.parallelism import Dim, ParallelismSpec

GPUS_PER_HOST = 8
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Case:
    """One benchmark configuration."""

    name: str
    hosts: int
    spec: ParallelismSpec


@dataclass(frozen=True, slots=True)
class PlanningRow:
    """Planning figures of one case; times in ms, memory in MiB."""

    case: str
    gpus: int
    spec: str
    fabric_ms: float
    layout_ms: float
    groups_ms: float
    plan_step_ms: float
    plan_phase_only_ms: float
    distinct_plans: int
    slots: int
    phases: int
    cross_connects: int
    peak_mib: float


@dataclass(frozen=True, slots=True)
class BoundaryRow:
    """One phase boundary through the coordinator; times in ms. ``rounds``: confirmation rounds
    until every rank was admitted, i.e. how many reconfiguration delays (delta) lie on the
    boundary's critical path when every switch takes delta per apply."""

    boundary: str
    ranks: int
    reconfigurations: int
    rounds: int
    enter_ms: float
    reconfigured_ms: float
    release_ms: float
    total_ms: float
    per_rank_us: float


def best_of(repeat: int, fn: Callable[[], T]) -> tuple[float, T]:
    """(best wall time in s, last result) of ``repeat`` calls, with the GC collected first."""
    best = float("inf")
    result: T | None = None
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    assert result is not None
    return best, result


def spec_text(spec: ParallelismSpec) -> str:
    parts = [f"{n}={getattr(spec, n)}" for n in ("tp", "pp", "dp_replicate", "dp_shard", "ep",
                                                   "cp") if getattr(spec, n) > 1]
    return " ".join(parts) + f" ({spec.order.name.lower()})"


def all_groups(spec: ParallelismSpec) -> int:
    fresh = ParallelismSpec(tp=spec.tp, pp=spec.pp, dp_replicate=spec.dp_replicate,
                            dp_shard=spec.dp_shard, ep=spec.ep, cp=spec.cp, order=spec.order)
    return sum(len(fresh.groups(d)) for d in Dim)


def placements_of(case: Case) -> tuple[RankPlacement, ...]:
    hosts = [f"host{i}" for i in range(case.hosts)]
    return contiguous_placement(hosts, GPUS_PER_HOST, case.spec.world_size)


def plan_only(layout: JobLayout, plan: RailPlan) -> int:
    keys = {(p.group, p.collective, p.step) for s in plan.slots for p in s.phases}
    for group, coll, step in keys:
        plan_phase(layout, PhaseKey(group, coll, 0, step))
    return len(keys)


def run_planning(case: Case, repeat: int) -> PlanningRow:
    spec = case.spec
    fabric_s, fabric = best_of(1, lambda: rail_fabric(case.name, case.hosts, GPUS_PER_HOST,
                                                      delay_s=0.0))
    placements = placements_of(case)
    layout_s, layout = best_of(repeat, lambda: layout_job(fabric, "job", placements))
    groups_s, _ = best_of(repeat, lambda: all_groups(spec))
    spec.groups(Dim.TP)  # warm the spec's own cache like a registered job would
    step_s, plan = best_of(repeat, lambda: plan_step(layout, spec))
    only_s, n_keys = best_of(repeat, lambda: plan_only(layout, plan))
    assert n_keys == plan.distinct_plans, (n_keys, plan.distinct_plans)

    gc.collect()
    tracemalloc.start()
    lay2 = layout_job(fabric, "job", placements)
    fresh = ParallelismSpec(tp=spec.tp, pp=spec.pp, dp_replicate=spec.dp_replicate,
                            dp_shard=spec.dp_shard, ep=spec.ep, cp=spec.cp, order=spec.order)
    for d in Dim:
        fresh.groups(d)
    kept = plan_step(lay2, fresh)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del kept

    return PlanningRow(
        case=case.name,
        gpus=spec.world_size,
        spec=spec_text(spec),
        fabric_ms=fabric_s * 1e3,
        layout_ms=layout_s * 1e3,
        groups_ms=groups_s * 1e3,
        plan_step_ms=step_s * 1e3,
        plan_phase_only_ms=only_s * 1e3,
        distinct_plans=plan.distinct_plans,
        slots=len(plan.slots),
        phases=len(plan.phases()),
        cross_connects=sum(d.cross_connect_count for d in plan.dims.values()),
        peak_mib=peak / 2**20,
    )


def _boundary(
    coord: PhaseCoordinator, name: str, phases: Sequence[PhaseKey], iteration: int,
    now: float,
) -> BoundaryRow:
    """Every rank of ``phases`` enters, reconfigurations are confirmed, every rank releases."""
    members = [(r, ph) for ph in phases for r in ph.group.ranks]
    ops: list[int] = []
    admitted = 0

    def take(decisions: list[Decision]) -> None:
        nonlocal admitted
        for d in decisions:
            if isinstance(d, Reconfigure):
                ops.append(d.op_id)
            elif isinstance(d, Admit):
                admitted += 1
            elif isinstance(d, Reject):
                raise RuntimeError(f"{name}: rank {d.rank} rejected: {d.message}")

    gc.collect()
    t0 = time.perf_counter()
    for i, (rank, ph) in enumerate(members):
        take(coord.enter("job", rank, ph, request_id=i + 1, now=now, timeout_s=60.0,
                         iteration=iteration))
    t1 = time.perf_counter()
    n_ops = rounds = 0
    while ops:  # a round confirms every reconfiguration issued so far; more may follow
        batch = list(ops)
        ops.clear()
        rounds += 1
        for op in batch:
            n_ops += 1
            take(coord.reconfigured(op, now=now))
    t2 = time.perf_counter()
    if admitted != len(members):
        raise RuntimeError(f"{name}: {admitted} of {len(members)} ranks admitted")
    for rank, ph in members:
        if coord.release("job", rank, ph, now=now):
            pass  # decisions from a release start reconfigurations of waiting phases: none here
    t3 = time.perf_counter()
    return BoundaryRow(
        boundary=name,
        ranks=len(members),
        reconfigurations=n_ops,
        rounds=rounds,
        enter_ms=(t1 - t0) * 1e3,
        reconfigured_ms=(t2 - t1) * 1e3,
        release_ms=(t3 - t2) * 1e3,
        total_ms=(t3 - t0) * 1e3,
        per_rank_us=(t3 - t0) * 1e6 / len(members),
    )


@dataclass(frozen=True, slots=True)
class CoordinatorResult:
    """Registration times (ms) and the boundary rows."""

    register_ms: float
    register_declared_ms: float
    declared_phases: int
    rows: tuple[BoundaryRow, ...]


def run_coordinator(case: Case) -> CoordinatorResult:
    spec = case.spec
    fabric: Fabric = rail_fabric(case.name, case.hosts, GPUS_PER_HOST, delay_s=0.0)
    placements = placements_of(case)
    plan = plan_step(layout_job(fabric, "job", placements), spec)

    probe = PhaseCoordinator(fabric)
    t0 = time.perf_counter()
    probe.register_job("job", "bench", placements, plan.phases())
    register_declared_s = time.perf_counter() - t0

    coord = PhaseCoordinator(fabric)
    t0 = time.perf_counter()
    coord.register_job("job", "bench", placements)
    register_s = time.perf_counter() - t0

    dp = [PhaseKey(g, Collective.ALL_REDUCE) for g in spec.groups(Dim.DP_CP)]
    pp = [PhaseKey(g, Collective.SEND_RECV) for g in spec.stage_pairs(0)]
    cold_pp = PhaseCoordinator(fabric)
    cold_pp.register_job("job", "bench", placements)
    rows = (
        _boundary(cold_pp, "PP send/recv 0<->1, cold", pp, 0, 0.5),
        _boundary(coord, "DP all-reduce, cold", dp, 0, 1.0),
        _boundary(coord, "PP send/recv 0<->1", pp, 0, 2.0),
        _boundary(coord, "DP all-reduce, re-make", dp, 1, 3.0),
        _boundary(coord, "DP all-reduce, no-op", dp, 2, 4.0),
    )
    return CoordinatorResult(register_s * 1e3, register_declared_s * 1e3, len(plan.phases()),
                             rows)


CASES = (
    Case("2k-dense", 256, ParallelismSpec(tp=8, pp=8, dp_replicate=32)),
    Case("2k-moe", 256, ParallelismSpec(tp=8, pp=4, dp_shard=64, ep=16)),
    Case("9k-dense", 1152, ParallelismSpec(tp=8, pp=16, dp_replicate=72)),
    Case("9k-moe", 1152, ParallelismSpec(tp=8, pp=16, dp_shard=72, ep=8)),
)


def main(argv: Sequence[str] | None = None) -> None:
    """Parse arguments, run every case, print tables (or JSON)."""
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--repeat", type=int, default=3, help="runs per timing, best kept")
    ap.add_argument("--quick", action="store_true", help="2,048-GPU cases only, 1 run")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = ap.parse_args(argv)
    repeat = 1 if args.quick else max(1, args.repeat)
    cases = [c for c in CASES if not args.quick or c.spec.world_size <= 2048]

    started = time.perf_counter()
    rows = [run_planning(c, repeat) for c in cases]
    coord = run_coordinator(CASES[0])
    elapsed = time.perf_counter() - started

    if args.json:
        print(json.dumps({"planning": [asdict(r) for r in rows],
                          "coordinator": asdict(coord), "elapsed_s": elapsed}, indent=2))
        return
    print(f"Planning (best of {repeat}; ms unless noted; one microbatch, one layer per stage)")
    head = (f"{'case':<9} {'GPUs':>5} {'spec':<40} {'fabric':>7} {'layout':>7} {'groups':>7} "
            f"{'plan step':>9} {'plan_phase':>10} {'plans':>6} {'slots':>5} {'phases':>6} "
            f"{'xconns':>7} {'peak MiB':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r.case:<9} {r.gpus:>5} {r.spec:<40} {r.fabric_ms:>7.1f} {r.layout_ms:>7.1f} "
              f"{r.groups_ms:>7.1f} {r.plan_step_ms:>9.1f} {r.plan_phase_only_ms:>10.1f} "
              f"{r.distinct_plans:>6} {r.slots:>5} {r.phases:>6} {r.cross_connects:>7} "
              f"{r.peak_mib:>8.1f}")
    print()
    print(f"Coordinator, {CASES[0].name} ({spec_text(CASES[0].spec)}), in process, no gRPC: "
          f"register_job {coord.register_ms:.1f} ms; with the declared step "
          f"({coord.declared_phases} phases planned at registration) "
          f"{coord.register_declared_ms:.1f} ms")
    head2 = (f"{'boundary':<26} {'ranks':>5} {'recfg':>5} {'rounds':>6} {'enter ms':>8} "
             f"{'confirm ms':>10} "
             f"{'release ms':>10} {'total ms':>8} {'us/rank':>7}")
    print(head2)
    print("-" * len(head2))
    for b in coord.rows:
        print(f"{b.boundary:<26} {b.ranks:>5} {b.reconfigurations:>5} {b.rounds:>6} "
              f"{b.enter_ms:>8.1f} "
              f"{b.reconfigured_ms:>10.1f} {b.release_ms:>10.1f} {b.total_ms:>8.1f} "
              f"{b.per_rank_us:>7.1f}")
    print(f"\nelapsed {elapsed:.1f} s")


if __name__ == "__main__":
    main()
