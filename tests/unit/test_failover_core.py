"""Failover in the pure core: spare selection and moving a failed rank's circuits."""

from __future__ import annotations

import pytest

from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.core.decisions import Admit, Reconfigure, Reject, Rewire
from lightrail.controller.core.spares import NoSpare, pick_spare
from lightrail.controller.domain.errors import ErrorCode, FailoverError
from lightrail.controller.domain.fabric import rail_fabric
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.drivers.base import CrossConnect
from tests.per_rank import PerRankCoordinator, PerRankDecision

# 4 job hosts + 1 spare host (host4), 2 GPUs each; N = 5 ports per side
FABRIC = rail_fabric("t", 4, 2, delay_s=0.0, spares=1)
N = 5
PLACE = [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)]
RING = PhaseKey(ProcessGroup.of(range(8)), Collective.ALL_REDUCE)


def xc(src: int, dst: int) -> CrossConnect:
    return CrossConnect(src + 1, N + dst + 1)


def running() -> PerRankCoordinator:
    c = PerRankCoordinator(PhaseCoordinator(FABRIC))
    c.register_job("job", "t", PLACE)
    out: list[PerRankDecision] = []
    for r in range(8):
        out += c.enter("job", r, RING, r, 0.0)
    for d in out:
        if isinstance(d, Reconfigure):
            c.reconfigured(d.op_id, 0.1)
    return c


def test_spare_prefers_spare_hosts_in_the_same_domain_and_switch() -> None:
    c = running()
    choice = pick_spare(FABRIC, "host1", 0, c.gpus_in_use(), unhealthy=())
    assert (choice.host, choice.gpu) == ("host4", 0)  # same rail 0 switch as host1/gpu0
    with pytest.raises(NoSpare, match="in use or unhealthy"):
        pick_spare(FABRIC, "host1", 0, c.gpus_in_use(), unhealthy=[("host4", 0)])


def test_no_spare_in_another_failure_domain() -> None:
    fabric = rail_fabric("t", 4, 2, delay_s=0.0, spares=1, hosts_per_domain=2)
    # host4 (the spare) is alone in domain2: nothing can replace a GPU of domain0
    with pytest.raises(NoSpare, match="every GPU in failure domain 'domain0'"):
        pick_spare(fabric, "host1", 0, {(f"host{h}", g): "j" for h in range(4) for g in (0, 1)},
                   unhealthy=())


def test_failover_moves_the_failed_endpoint_circuits_to_the_spare() -> None:
    c = running()
    # rank 0 waits for the next phase (its peers still hold the ring) when host1/gpu0 fails
    c.release("job", 0, RING, 0.2)
    pair = PhaseKey(ProcessGroup.of([0, 2]), Collective.SEND_RECV)
    assert c.enter("job", 0, pair, 100, 0.3) == []
    out = c.replace_rank("job", 2, "host4", 0, 0.4)
    rejects = [d for d in out if isinstance(d, Reject)]
    assert [(d.rank, d.code) for d in rejects] == [(0, ErrorCode.PLACEMENT_CHANGED)]
    # the failed rank's hold is gone; live ranks keep theirs until they release
    assert c.held_by_job("job") == 6
    (rw,) = [d for d in out if isinstance(d, Rewire)]
    (t,) = rw.targets
    assert t.switch_id == "ocs-rail0"
    # ring on rail 0 was host0 -> host1 -> host2 -> host3 -> host0; host1 is replaced by host4
    assert t.cross_connects == {xc(0, 4), xc(4, 2)}
    assert {1 + 1, N + 1 + 1} <= t.ports  # the failed endpoint's ports are freed
    c.reconfigured(rw.op_id, 0.5)
    assert c.confirmed("ocs-rail0") == {xc(0, 4), xc(4, 2), xc(2, 3), xc(3, 0)}
    assert c.confirmed("ocs-rail1") == {xc(i, (i + 1) % 4) for i in range(4)}  # untouched
    layout = c.job("job")
    assert layout.placements[2] == RankPlacement(2, "host4", 0)
    assert ("host1", 0) not in c.gpus_in_use() and c.gpus_in_use()[("host4", 0)] == "job"
    # the job restarts: live ranks leave the old ring, and the ring over the new placement
    # is already there
    for r in (1, 3, 4, 5, 6, 7):
        c.release("job", r, RING, 0.55)
    admitted = [d for r in range(8) for d in c.enter("job", r, RING, 200 + r, 0.6, iteration=1)]
    assert all(isinstance(d, Admit) and d.noop for d in admitted) and len(admitted) == 8


def test_failover_refuses_a_spare_on_the_wrong_switch_or_in_use() -> None:
    c = running()
    with pytest.raises(FailoverError, match="wired to 'ocs-rail1'"):
        c.replace_rank("job", 2, "host4", 1, 0.4)  # gpu1 is on rail 1, the failed one rail 0
    with pytest.raises(FailoverError, match="used by job 'job'"):
        c.replace_rank("job", 2, "host3", 0, 0.4)
    assert c.job("job").placements[2] == RankPlacement(2, "host1", 0)  # nothing changed


def test_two_failures_at_once_in_one_job() -> None:
    fabric = rail_fabric("t", 4, 2, delay_s=0.0, spares=2)
    c = PerRankCoordinator(PhaseCoordinator(fabric))
    c.register_job("job", "t", PLACE)
    out: list[PerRankDecision] = [d for r in range(8) for d in c.enter("job", r, RING, r, 0.0)]
    for d in out:
        if isinstance(d, Reconfigure):
            c.reconfigured(d.op_id, 0.1)
    first = c.replace_rank("job", 2, "host4", 0, 0.2)
    second = c.replace_rank("job", 3, "host5", 1, 0.2)  # other rail: independent
    for d in first + second:
        if isinstance(d, Rewire):
            c.reconfigured(d.op_id, 0.3)
    n = 6
    ring1 = {CrossConnect(a + 1, n + b + 1) for a, b in ((0, 5), (5, 2), (2, 3), (3, 0))}
    assert c.confirmed("ocs-rail1") == ring1
    assert c.job("job").placements[3] == RankPlacement(3, "host5", 1)


def test_failure_during_a_reconfiguration_waits_for_it() -> None:
    from lightrail.controller.domain.errors import FailoverBusy

    c = PerRankCoordinator(PhaseCoordinator(FABRIC))
    c.register_job("job", "t", PLACE)
    out = [d for r in range(8) for d in c.enter("job", r, RING, r, 0.0)]
    rec = [d for d in out if isinstance(d, Reconfigure)]
    assert rec  # the ring is being switched when host1/gpu0 fails
    with pytest.raises(FailoverBusy):
        c.replace_rank("job", 2, "host4", 0, 0.05)
    for d in rec:
        assert isinstance(d, Reconfigure)
        c.reconfigured(d.op_id, 0.1)
    assert any(isinstance(d, Rewire) for d in c.replace_rank("job", 2, "host4", 0, 0.2))


def test_failover_keeps_live_ranks_holds() -> None:
    """Review finding: a failover used to drop every hold of the job, so a new phase could
    break circuits live ranks were still using."""
    c = PerRankCoordinator(PhaseCoordinator(FABRIC))
    c.register_job("job", "t", PLACE)
    x = PhaseKey(ProcessGroup.of([2, 4]), Collective.SEND_RECV)  # host1 <-> host2, rail 0
    for d in c.enter("job", 2, x, 1, 0.0) + c.enter("job", 4, x, 2, 0.0):
        if isinstance(d, Reconfigure):
            c.reconfigured(d.op_id, 0.1)
    for d in c.replace_rank("job", 0, "host4", 0, 0.2):  # rank 0 (host0) fails
        if isinstance(d, Rewire):
            c.reconfigured(d.op_id, 0.3)
    y = PhaseKey(ProcessGroup.of([2, 6]), Collective.SEND_RECV)  # host1 <-> host3: breaks X
    c.release("job", 2, x, 0.4)
    out = c.enter("job", 2, y, 3, 0.4) + c.enter("job", 6, y, 4, 0.4)
    assert not [d for d in out if isinstance(d, Reconfigure)]
    out = c.release("job", 4, x, 0.5)  # X's last holder leaves: now Y may switch
    assert [d.phase for d in out if isinstance(d, Reconfigure)] == [y]


def test_read_back_that_lost_a_held_circuit_stops_blind_joins() -> None:
    c = running()  # ranks 0..7 hold the ring
    c.release("job", 7, RING, 0.2)
    c.set_confirmed("ocs-rail0", [])  # the read-back finds rail 0 empty (hardware fault)
    out = c.enter("job", 7, RING, 99, 0.3)
    assert not [d for d in out if isinstance(d, Admit)]  # not joined onto missing circuits
