"""Planner rules, checked circuit by circuit on the demo fabric (4 hosts x 2 GPUs, 2 rails)."""

from __future__ import annotations

import pytest

from lightrail.controller.core.planner import (
    PlacementError,
    PlanError,
    all_to_all_steps,
    layout_job,
    plan_phase,
)
from lightrail.controller.domain.fabric import rail_fabric
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.drivers.base import CrossConnect

FABRIC = rail_fabric("t", 4, 2, delay_s=0.0)
# rank r -> host r // 2, gpu r % 2: ranks 0,2,4,6 on rail 0; 1,3,5,7 on rail 1.
PLACE = [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)]
N = 4  # ports per side


def xc(src_host: int, dst_host: int) -> CrossConnect:
    """Host i's Tx lands on ingress i+1, Rx on egress N+i+1."""
    return CrossConnect(src_host + 1, N + dst_host + 1)


def phase(ranks: list[int], coll: Collective, step: int = 0) -> PhaseKey:
    return PhaseKey(ProcessGroup.of(ranks), coll, 0, step)


def test_ring_all_reduce_on_every_rail() -> None:
    layout = layout_job(FABRIC, "j", PLACE)
    plan = plan_phase(layout, phase(list(range(8)), Collective.ALL_REDUCE))
    by_switch = {t.switch_id: t for t in plan.targets}
    ring = {xc(0, 1), xc(1, 2), xc(2, 3), xc(3, 0)}
    assert set(by_switch) == {"ocs-rail0", "ocs-rail1"}
    assert by_switch["ocs-rail0"].cross_connects == ring
    assert by_switch["ocs-rail1"].cross_connects == ring
    assert by_switch["ocs-rail0"].ports == frozenset({1, 2, 3, 4, 5, 6, 7, 8})


def test_send_recv_pair_only_on_shared_rail() -> None:
    layout = layout_job(FABRIC, "j", PLACE)
    plan = plan_phase(layout, phase([0, 2], Collective.SEND_RECV))
    assert len(plan.targets) == 1
    t = plan.targets[0]
    assert t.switch_id == "ocs-rail0"
    assert t.cross_connects == {xc(0, 1), xc(1, 0)}


def test_group_on_one_host_needs_no_circuit() -> None:
    layout = layout_job(FABRIC, "j", PLACE)
    assert plan_phase(layout, phase([0, 1], Collective.ALL_REDUCE)).empty


def test_all_to_all_is_a_sequence_of_shift_permutations() -> None:
    layout = layout_job(FABRIC, "j", PLACE)
    group = ProcessGroup.of(range(8))
    assert all_to_all_steps(layout, group) == 3
    seen: set[CrossConnect] = set()
    for step in range(3):
        t = plan_phase(layout, phase(list(range(8)), Collective.ALL_TO_ALL, step)).targets[0]
        shift = step + 1
        assert t.cross_connects == {xc(i, (i + shift) % 4) for i in range(4)}
        seen |= t.cross_connects
    # every ordered host pair is served exactly once across the steps
    assert seen == {xc(i, j) for i in range(4) for j in range(4) if i != j}
    with pytest.raises(PlanError, match=r"phase\.step: 3 out of range"):
        plan_phase(layout, phase(list(range(8)), Collective.ALL_TO_ALL, 3))


def test_step_on_non_all_to_all_is_refused() -> None:
    layout = layout_job(FABRIC, "j", PLACE)
    with pytest.raises(PlanError, match=r"phase.step: 1 given for all_reduce"):
        plan_phase(layout, phase([0, 2], Collective.ALL_REDUCE, 1))


def test_rank_outside_job_is_refused() -> None:
    layout = layout_job(FABRIC, "j", PLACE[:4])
    with pytest.raises(PlanError, match="rank 6 >= world size 4"):
        plan_phase(layout, phase([0, 6], Collective.ALL_REDUCE))


@pytest.mark.parametrize(
    ("placements", "message"),
    [
        ([RankPlacement(0, "host0", 0), RankPlacement(0, "host1", 0)], r"ranks\[0\]: rank listed"),
        ([RankPlacement(1, "host0", 0)], "rank 0 missing"),
        ([RankPlacement(0, "nohost", 0)], r"ranks\[0\].host: unknown host 'nohost'"),
        ([RankPlacement(0, "host0", 7)], r"ranks\[0\].gpu: host0 has no wired GPU 7"),
        (
            [RankPlacement(0, "host0", 0), RankPlacement(1, "host0", 0)],
            r"ranks\[1\].gpu: host0/gpu0 already holds rank 0",
        ),
        ([], "ranks: empty"),
    ],
)
def test_bad_placement_names_the_field(placements: list[RankPlacement], message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        layout_job(FABRIC, "j", placements)


def test_gpu_of_another_job_is_refused() -> None:
    with pytest.raises(PlacementError, match="used by job 'other'"):
        layout_job(FABRIC, "j", PLACE[:2], {("host0", 1): "other"})


def test_owned_ports_are_the_ranks_endpoints_only() -> None:
    layout = layout_job(FABRIC, "j", [RankPlacement(0, "host0", 0), RankPlacement(1, "host2", 0)])
    assert layout.owned_ports == {"ocs-rail0": frozenset({1, N + 1, 3, N + 3})}
    plan = plan_phase(layout, phase([0, 1], Collective.ALL_REDUCE))
    assert plan.targets[0].cross_connects == {xc(0, 2), xc(2, 0)}
