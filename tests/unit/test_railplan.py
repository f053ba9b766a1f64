"""Rail plans checked circuit by circuit on the demo fabric: 4 hosts x 2 GPUs, 2 rails.

rail_fabric numbering (N = 4 ports per side): host i's Tx lands on ingress i+1, its Rx on
egress N+i+1, on every rail's switch. ``contiguous_placement``: rank r on host r // 2, GPU r % 2,
so rail = r % 2.
"""

from __future__ import annotations

import pytest

from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.core.planner import JobLayout, PlanError, layout_job, plan_phase
from lightrail.controller.core.railplan import (
    EpStrategy,
    RailPlanError,
    StepPart,
    contiguous_placement,
    plan_step,
)
from lightrail.controller.domain.fabric import (
    Endpoint,
    EndpointId,
    Fabric,
    Host,
    Switch,
    rail_fabric,
)
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.domain.parallelism import (
    Dim,
    ParallelismError,
    ParallelismSpec,
    RankOrder,
)
from lightrail.drivers.base import CrossConnect, SwitchCapabilities, SwitchKind
from tests.per_rank import PerRankCoordinator

FABRIC = rail_fabric("t", 4, 2, delay_s=0)
HOSTS = [f"host{i}" for i in range(4)]
N = 4
RAIL0, RAIL1 = "ocs-rail0", "ocs-rail1"


def xc(src_host: int, dst_host: int) -> CrossConnect:
    return CrossConnect(src_host + 1, N + dst_host + 1)


def pair(a: int, b: int) -> set[CrossConnect]:
    return {xc(a, b), xc(b, a)}


def ring(*hosts: int) -> set[CrossConnect]:
    return {xc(h, hosts[(i + 1) % len(hosts)]) for i, h in enumerate(hosts)}


def layout8() -> JobLayout:
    return layout_job(FABRIC, "j", contiguous_placement(HOSTS, 2, 8))


def pg(*ranks: int) -> ProcessGroup:
    return ProcessGroup.of(ranks)


# --- tp=2, pp=2, dp=2 ------------------------------------------------------------------------


@pytest.mark.parametrize("order", [RankOrder.MEGATRON, RankOrder.TORCHTITAN])
def test_tp2_pp2_dp2_circuits(order: RankOrder) -> None:
    # rank = tp + 2*dp + 4*pp -> host = dp + 2*pp, rail = tp
    spec = ParallelismSpec(tp=2, pp=2, dp_replicate=2, order=order)
    plan = plan_step(layout8(), spec)
    assert set(plan.dims) == {Dim.TP, Dim.PP, Dim.DP_CP}

    tp = plan.dims[Dim.TP]
    assert tp.scale_up_only
    assert tp.cross_connect_count == 0
    assert [g.ranks for g in tp.groups] == [(0, 1), (2, 3), (4, 5), (6, 7)]

    # DP ring per rail over the hosts with the same (pp, tp): pp=0 -> hosts {0,1}, pp=1 -> {2,3};
    # a ring of two hosts is a bidirectional pair.
    (dp,) = plan.dims[Dim.DP_CP].configurations
    assert dp.circuits(RAIL0) == pair(0, 1) | pair(2, 3)
    assert dp.circuits(RAIL1) == pair(0, 1) | pair(2, 3)
    assert [p.group.ranks for p in dp.phases] == [(0, 2), (1, 3), (4, 6), (5, 7)]

    # PP pairs: stage 0 host dp <-> stage 1 host dp+2 on the rail of their tp index.
    (pp,) = plan.dims[Dim.PP].configurations
    assert pp.label == "boundary 0-1"
    assert [p.group.ranks for p in pp.phases] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert all(p.collective is Collective.SEND_RECV for p in pp.phases)
    assert pp.circuits(RAIL0) == pair(0, 2) | pair(1, 3)
    assert pp.circuits(RAIL1) == pair(0, 2) | pair(1, 3)


def test_tp2_pp2_dp2_tp_pp_dp_order_circuits() -> None:
    # rank = tp + 2*pp + 4*dp -> host = pp + 2*dp: now PP pairs are neighbours, DP is across
    spec = ParallelismSpec(tp=2, pp=2, dp_replicate=2, order=RankOrder.MEGATRON_TP_PP_DP)
    plan = plan_step(layout8(), spec)
    (dp,) = plan.dims[Dim.DP_CP].configurations
    assert dp.circuits(RAIL0) == dp.circuits(RAIL1) == pair(0, 2) | pair(1, 3)
    (pp,) = plan.dims[Dim.PP].configurations
    assert pp.circuits(RAIL0) == pp.circuits(RAIL1) == pair(0, 1) | pair(2, 3)


def test_tp2_pp2_dp2_schedule() -> None:
    spec = ParallelismSpec(tp=2, pp=2, dp_replicate=2)
    plan = plan_step(layout8(), spec, microbatches=2)
    shape = [(s.part, s.dim, s.collective, s.microbatch, s.stage) for s in plan.slots]
    f, b, g = StepPart.FORWARD, StepPart.BACKWARD, StepPart.GRADIENT_SYNC
    ar, sr = Collective.ALL_REDUCE, Collective.SEND_RECV
    assert shape == [
        (f, Dim.TP, ar, 0, 0), (f, Dim.PP, sr, 0, 0), (f, Dim.TP, ar, 0, 1),
        (f, Dim.TP, ar, 1, 0), (f, Dim.PP, sr, 1, 0), (f, Dim.TP, ar, 1, 1),
        (b, Dim.TP, ar, 0, 1), (b, Dim.PP, sr, 0, 0), (b, Dim.TP, ar, 0, 0),
        (b, Dim.TP, ar, 1, 1), (b, Dim.PP, sr, 1, 0), (b, Dim.TP, ar, 1, 0),
        (g, Dim.DP_CP, ar, None, None),
    ]
    # rank 4 sits in stage 1 (tp 0, dp 0): its phases with per-group sequence numbers
    assert plan.phases_of(4) == (
        PhaseKey(pg(0, 4), sr, 0), PhaseKey(pg(4, 5), ar, 0),
        PhaseKey(pg(0, 4), sr, 1), PhaseKey(pg(4, 5), ar, 1),
        PhaseKey(pg(4, 5), ar, 2), PhaseKey(pg(0, 4), sr, 2),
        PhaseKey(pg(4, 5), ar, 3), PhaseKey(pg(0, 4), sr, 3),
        PhaseKey(pg(4, 6), ar, 0),
    )
    assert plan.distinct_plans == 4 + 4 + 4  # TP, PP pairs, DP groups


def test_three_stage_chain_is_one_configuration_per_boundary() -> None:
    # 12 ranks on 6 hosts x 2: tp=2, pp=3, dp=2 -> host = dp + 2*pp, rail = tp
    fabric = rail_fabric("t6", 6, 2, delay_s=0)
    layout = layout_job(fabric, "j", contiguous_placement([f"host{i}" for i in range(6)], 2, 12))
    plan = plan_step(layout, ParallelismSpec(tp=2, pp=3, dp_replicate=2))
    b01, b12 = plan.dims[Dim.PP].configurations
    n = 6

    def x(a: int, b: int) -> CrossConnect:
        return CrossConnect(a + 1, n + b + 1)

    assert b01.circuits(RAIL0) == {x(0, 2), x(2, 0), x(1, 3), x(3, 1)}
    assert b12.circuits(RAIL1) == {x(2, 4), x(4, 2), x(3, 5), x(5, 3)}
    pp_slots = [s for s in plan.slots if s.dim is Dim.PP]
    assert [(s.part, s.configuration) for s in pp_slots] == [
        (StepPart.FORWARD, 0), (StepPart.FORWARD, 1),
        (StepPart.BACKWARD, 1), (StepPart.BACKWARD, 0),
    ]


# --- CP ring -----------------------------------------------------------------------------------


def test_tp2_cp2_dp2_circuits() -> None:
    # rank = tp + 2*cp + 4*dp -> host = cp + 2*dp, rail = tp
    plan = plan_step(layout8(), ParallelismSpec(tp=2, cp=2, dp_replicate=2))
    (cp,) = plan.dims[Dim.CP].configurations
    assert plan.dims[Dim.CP].collectives == (Collective.ALL_GATHER,)
    assert cp.circuits(RAIL0) == cp.circuits(RAIL1) == pair(0, 1) | pair(2, 3)
    # gradients over DP x CP: one ring over the four hosts per rail
    (dpcp,) = plan.dims[Dim.DP_CP].configurations
    assert [p.group.ranks for p in dpcp.phases] == [(0, 2, 4, 6), (1, 3, 5, 7)]
    assert dpcp.circuits(RAIL0) == dpcp.circuits(RAIL1) == ring(0, 1, 2, 3)


# --- EP ----------------------------------------------------------------------------------------


def test_ep2_with_dp4_circuits() -> None:
    # tp=2, dp_shard=4, ep=2: host = dp, rail = tp; EP (0,2),(4,6) on rail 0, (1,3),(5,7) rail 1
    plan = plan_step(layout8(), ParallelismSpec(tp=2, dp_shard=4, ep=2))
    ep = plan.dims[Dim.EP]
    assert [g.ranks for g in ep.groups] == [(0, 2), (1, 3), (4, 6), (5, 7)]
    (shift1,) = ep.configurations  # two hosts per group: one sub-phase
    assert shift1.circuits(RAIL0) == shift1.circuits(RAIL1) == pair(0, 1) | pair(2, 3)
    (edp,) = plan.dims[Dim.EXPERT_DP].configurations
    assert edp.circuits(RAIL0) == pair(0, 2) | pair(1, 3)
    # sharded DP: reduce-scatter, expert all-reduce, all-gather
    grads = [(s.dim, s.collective) for s in plan.slots if s.part is StepPart.GRADIENT_SYNC]
    assert grads == [
        (Dim.DP_SHARD_CP, Collective.REDUCE_SCATTER),
        (Dim.EXPERT_DP, Collective.ALL_REDUCE),
        (Dim.DP_SHARD_CP, Collective.ALL_GATHER),
    ]
    (ring4,) = plan.dims[Dim.DP_SHARD_CP].configurations
    assert ring4.circuits(RAIL0) == ring(0, 1, 2, 3)


def test_ep4_matchings_are_shift_permutations() -> None:
    # ep=4 over hosts 0..3 on each rail: 3 sub-phases, shift s connects host i -> i+s
    plan = plan_step(layout8(), ParallelismSpec(tp=2, dp_shard=4, ep=4))
    cfgs = plan.dims[Dim.EP].configurations
    assert [c.label for c in cfgs] == ["shift 1", "shift 2", "shift 3"]
    for s, cfg in enumerate(cfgs, start=1):
        want = {xc(i, (i + s) % 4) for i in range(4)}
        assert cfg.circuits(RAIL0) == cfg.circuits(RAIL1) == want
    fwd_a2a = [s for s in plan.slots if s.dim is Dim.EP and s.part is StepPart.FORWARD]
    # dispatch then combine, each stepping through the 3 sub-phases with one seq
    assert [(s.phases[0].seq, s.phases[0].step, s.configuration) for s in fwd_a2a] == [
        (0, 0, 0), (0, 1, 1), (0, 2, 2), (1, 0, 0), (1, 1, 1), (1, 2, 2),
    ]


def test_ep4_forward_holds_only_the_shift1_ring() -> None:
    plan = plan_step(layout8(), ParallelismSpec(tp=2, dp_shard=4, ep=4),
                     ep_strategy=EpStrategy.FORWARD)
    (cfg,) = plan.dims[Dim.EP].configurations
    assert cfg.circuits(RAIL0) == ring(0, 1, 2, 3)
    # the same cross-connects as a ring collective on the EP groups (and the DP ring here)
    assert cfg.circuits(RAIL0) == plan.dims[Dim.DP_SHARD_CP].configurations[0].circuits(RAIL0)
    steps = {p.step for s in plan.slots if s.dim is Dim.EP for p in s.phases}
    assert steps == {0}


# --- consistency with the planner and the coordinator -------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        ParallelismSpec(tp=2, pp=2, dp_replicate=2),
        ParallelismSpec(tp=2, cp=2, dp_shard=2, ep=2, order=RankOrder.TORCHTITAN),
        ParallelismSpec(pp=2, dp_replicate=2, dp_shard=2, ep=2),
        ParallelismSpec(pp=4, dp_shard=2, order=RankOrder.MEGATRON_TP_PP_DP),
    ],
)
def test_every_phase_matches_plan_phase_and_configurations_are_partial_permutations(
    spec: ParallelismSpec,
) -> None:
    layout = layout8()
    plan = plan_step(layout, spec, microbatches=2)
    for slot in plan.slots:
        cfg = plan.dims[slot.dim].configurations[slot.configuration]
        for ph in slot.phases:
            for t in plan_phase(layout, ph).targets:
                assert t.cross_connects <= cfg.circuits(t.switch_id), (slot, ph)
    for dplan in plan.dims.values():
        for cfg in dplan.configurations:
            for t in cfg.targets:
                ports = [p for x in t.cross_connects for p in x.ports()]
                assert len(ports) == len(set(ports)), (dplan.dim, cfg.label)
                assert set(ports) <= layout.owned_ports[t.switch_id]


def test_declared_schedule_registers_with_the_coordinator() -> None:
    spec = ParallelismSpec(tp=2, pp=2, dp_replicate=2)
    placements = contiguous_placement(HOSTS, 2, 8)
    plan = plan_step(layout_job(FABRIC, "j", placements), spec)
    coord = PerRankCoordinator(PhaseCoordinator(FABRIC))
    coord.register_job("j", "t", placements, plan.phases())
    assert coord.declared_phases("j") == plan.phases()


# --- errors ------------------------------------------------------------------------------------


def test_world_size_mismatch_is_refused() -> None:
    with pytest.raises(ParallelismError, match=r"world_size: the job has 8 ranks .* = 4"):
        plan_step(layout8(), ParallelismSpec(tp=2, pp=2))


def test_bad_counts_are_refused() -> None:
    spec = ParallelismSpec(tp=2, dp_replicate=4)
    with pytest.raises(RailPlanError, match=r"microbatches: must be >= 1, got 0"):
        plan_step(layout8(), spec, microbatches=0)
    with pytest.raises(RailPlanError, match=r"layers_per_stage: must be >= 1, got -1"):
        plan_step(layout8(), spec, layers_per_stage=-1)


def test_contiguous_placement_needs_enough_hosts() -> None:
    with pytest.raises(RailPlanError, match=r"hosts: 9 ranks at 2 per host need 5 hosts, got 4"):
        contiguous_placement(HOSTS, 2, 9)


def test_duplex_switch_cannot_carry_a_dp_ring_over_three_hosts() -> None:
    caps = SwitchCapabilities(kind=SwitchKind.DUPLEX, port_count=3, atomic_bulk=True,
                              settle_time_s=0.0)
    fabric = Fabric.build(
        "d",
        [Host(f"h{i}", "d0", 1) for i in range(3)],
        [Switch("dx", "emulated", caps, 0)],
        [Endpoint(EndpointId(f"h{i}", 0), 0, 0, "dx", i + 1, i + 1) for i in range(3)],
    )
    layout = layout_job(fabric, "j", [RankPlacement(i, f"h{i}", 0) for i in range(3)])
    with pytest.raises(PlanError, match=r"duplex and cannot carry a ring over 3 hosts"):
        plan_step(layout, ParallelismSpec(dp_replicate=3))


def test_two_groups_needing_one_port_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defensive check: were the planner to give two groups of one dimension the same port, the
    configuration could not be applied at once. (Unreachable with one rank per NIC.)"""
    from lightrail.controller.core import railplan

    layout = layout8()
    shared = plan_phase(layout, PhaseKey(pg(0, 2), Collective.ALL_REDUCE))
    monkeypatch.setattr(railplan, "plan_phase", lambda _layout, _phase: shared)
    with pytest.raises(RailPlanError, match=r"dim CP \(all\): switch 'ocs-rail0' port 1 is "
                                            r"needed by groups \(0, 1\) and \(2, 3\) at once"):
        plan_step(layout, ParallelismSpec(cp=2, dp_replicate=4))
