"""Phase coordinator: the protocol and the safety invariant, with an injected clock."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.core.decisions import Admit, Reconfigure, Reject
from lightrail.controller.core.planner import PlacementError
from lightrail.controller.domain.errors import DuplicateJob, ErrorCode, ReleaseError
from lightrail.controller.domain.fabric import rail_fabric
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.drivers.base import CrossConnect
from tests.per_rank import PerRankCoordinator, PerRankDecision

N = 4
WORLD = list(range(8))
RING = PhaseKey(ProcessGroup.of(WORLD), Collective.ALL_REDUCE, 0)
PP01 = PhaseKey(ProcessGroup.of([0, 2]), Collective.SEND_RECV, 0)  # host0 <-> host1, rail 0


def place(n: int = 8, first_host: int = 0) -> list[RankPlacement]:
    return [RankPlacement(r, f"host{first_host + r // 2}", r % 2) for r in range(n)]


@pytest.fixture
def coord() -> PerRankCoordinator:
    c = PerRankCoordinator(
        PhaseCoordinator(rail_fabric("t", 4, 2, delay_s=0.01), default_timeout_s=5.0)
    )
    c.register_job("job", "tenant", place())
    return c


def only(decisions: list[PerRankDecision], kind: type) -> list[PerRankDecision]:
    return [d for d in decisions if isinstance(d, kind)]


def enter_all(
    c: PerRankCoordinator, ph: PhaseKey, ranks: list[int], now: float
) -> list[PerRankDecision]:
    out: list[PerRankDecision] = []
    for r in ranks:
        out += c.enter("job", r, ph, request_id=100 + r, now=now)
    return out


def test_first_phase_reconfigures_then_admits_everyone(coord: PerRankCoordinator) -> None:
    out = enter_all(coord, RING, WORLD, now=1.0)
    recs = only(out, Reconfigure)
    assert len(recs) == 1 and not only(out, Admit)
    rec = recs[0]
    assert isinstance(rec, Reconfigure)
    assert {t.switch_id for t in rec.targets} == {"ocs-rail0", "ocs-rail1"}
    admitted = coord.reconfigured(rec.op_id, now=1.5)
    assert sorted(d.rank for d in admitted if isinstance(d, Admit)) == WORLD
    a = admitted[0]
    assert isinstance(a, Admit) and not a.noop and a.waited_s == pytest.approx(0.5)


def test_noop_admission_when_circuits_match(coord: PerRankCoordinator) -> None:
    rec = only(enter_all(coord, RING, WORLD, 0.0), Reconfigure)[0]
    assert isinstance(rec, Reconfigure)
    coord.reconfigured(rec.op_id, 0.1)
    for r in WORLD:
        coord.release("job", r, RING, 0.2)
    again = PhaseKey(RING.group, RING.collective, seq=1)
    out = enter_all(coord, again, WORLD, 0.3)  # admitted once the whole group is in
    assert out == [Admit("job", r, 100 + r, again, True, 0.0, steps=1) for r in WORLD]


def test_admit_carries_the_all_to_all_step_count(coord: PerRankCoordinator) -> None:
    """The shell answers the rank from the Admit alone: it says how many shift permutations
    the all-to-all takes (4 hosts per rail: 3), on a switched and on a no-op admission."""
    a2a = PhaseKey(ProcessGroup.of(WORLD), Collective.ALL_TO_ALL)
    rec = only(enter_all(coord, a2a, WORLD, 0.0), Reconfigure)[0]
    assert isinstance(rec, Reconfigure)
    switched = only(coord.reconfigured(rec.op_id, 0.1), Admit)
    assert [(d.noop, d.steps) for d in switched if isinstance(d, Admit)] == [(False, 3)] * 8
    for r in WORLD:
        coord.release("job", r, a2a, 0.2)
    again = PhaseKey(a2a.group, a2a.collective, seq=1)
    out = enter_all(coord, again, WORLD, 0.3)
    assert out == [Admit("job", r, 100 + r, again, True, 0.0, steps=3) for r in WORLD]


def test_no_switch_while_a_rank_holds_a_conflicting_cross_connect(
    coord: PerRankCoordinator,
) -> None:
    rec = only(enter_all(coord, RING, WORLD, 0.0), Reconfigure)[0]
    assert isinstance(rec, Reconfigure)
    coord.reconfigured(rec.op_id, 0.1)
    # ranks 0 and 2 finish the ring and enter the PP pair; the others still hold the ring
    coord.release("job", 0, RING, 0.2)
    coord.release("job", 2, RING, 0.2)
    out = coord.enter("job", 0, PP01, 10, 0.3) + coord.enter("job", 2, PP01, 12, 0.3)
    assert out == []  # waiting: ring cross-connect host1->host2 conflicts and is held
    for r in [1, 3, 4, 5, 6]:
        assert only(coord.release("job", r, RING, 0.4), Reconfigure) == []
    out = coord.release("job", 7, RING, 0.5)  # last user released: switch now
    recs = only(out, Reconfigure)
    assert len(recs) == 1
    rec2 = recs[0]
    assert isinstance(rec2, Reconfigure)
    (t,) = rec2.targets
    assert t.switch_id == "ocs-rail0"
    # only what changes: the pair needs host0->host1 (1, 6: a ring link, confirmed, kept and
    # left out) and host1->host0 (2, 5: made); breaks host1->host2 (ports 2, 7) and
    # host3->host0 (ports 4, 5); host2->host3 untouched
    assert t.cross_connects == {CrossConnect(2, N + 1)}
    assert t.ports == frozenset({2, 4, 5, 7})
    adm = coord.reconfigured(rec2.op_id, 0.6)
    assert sorted(d.rank for d in adm if isinstance(d, Admit)) == [0, 2]


def test_timeout_is_an_explicit_error_naming_the_holders(coord: PerRankCoordinator) -> None:
    rec = only(enter_all(coord, RING, WORLD, 0.0), Reconfigure)[0]
    assert isinstance(rec, Reconfigure)
    coord.reconfigured(rec.op_id, 0.1)
    coord.release("job", 0, RING, 0.2)
    coord.release("job", 2, RING, 0.2)
    assert coord.enter("job", 0, PP01, 10, 1.0, timeout_s=2.0) == []
    assert coord.enter("job", 2, PP01, 12, 1.0, timeout_s=2.0) == []
    assert coord.next_deadline() == pytest.approx(3.0)
    assert coord.expire(2.9) == []
    out = coord.expire(3.0)
    assert [d.rank for d in out if isinstance(d, Reject)] == [0, 2]
    rej = out[0]
    assert isinstance(rej, Reject) and rej.code is ErrorCode.DEADLINE_EXCEEDED
    assert "held by job ranks [1, 3, 4, 5, 6, 7]" in rej.message
    assert coord.next_deadline() is None
    # the rank may try again; alone it waits for its peer
    out = coord.expire(3.0) + coord.enter("job", 0, PP01, 11, 3.1, timeout_s=2.0)
    assert out == []
    later = coord.expire(5.1)
    assert "ranks [2] of the group have not entered the phase" in str(later[0])


def test_an_enter_without_a_timeout_waits_the_default(coord: PerRankCoordinator) -> None:
    """``timeout_s`` None is the coordinator's default (5 s here); any value given is used
    as it is, however small (no 0 standing in for "default")."""
    rec = only(enter_all(coord, RING, WORLD, 0.0), Reconfigure)[0]
    assert isinstance(rec, Reconfigure)
    coord.reconfigured(rec.op_id, 0.1)
    coord.release("job", 0, RING, 0.2)
    coord.release("job", 2, RING, 0.2)
    assert coord.enter("job", 0, PP01, 10, 1.0) == []
    assert coord.next_deadline() == pytest.approx(6.0)
    assert coord.enter("job", 2, PP01, 11, 1.0, timeout_s=0.001) == []
    assert coord.next_deadline() == pytest.approx(1.001)


def test_device_failure_rejects_waiters_and_drops_the_view(coord: PerRankCoordinator) -> None:
    rec = only(enter_all(coord, RING, WORLD, 0.0), Reconfigure)[0]
    assert isinstance(rec, Reconfigure)
    out = coord.reconfigured(rec.op_id, 0.1, error="port 3 failed")
    assert {(d.rank, d.code) for d in out if isinstance(d, Reject)} == {
        (r, ErrorCode.DEVICE_FAILURE) for r in WORLD}
    assert coord.confirmed("ocs-rail0") == frozenset()


def test_fenced_reconfiguration_refuses_waiters_with_not_leader(
        coord: PerRankCoordinator) -> None:
    # the drivers' command gate refused (lease authority ran out): nothing reached the device,
    # and the ranks are told to go to the new leader, not that the device failed
    rec = only(enter_all(coord, RING, WORLD, 0.0), Reconfigure)[0]
    assert isinstance(rec, Reconfigure)
    out = coord.reconfigured(rec.op_id, 0.1, error="command refused", code=ErrorCode.NOT_LEADER)
    assert {(d.rank, d.code) for d in out if isinstance(d, Reject)} == {
        (r, ErrorCode.NOT_LEADER) for r in WORLD}


def test_validation_errors(coord: PerRankCoordinator) -> None:
    (r,) = coord.enter("nope", 0, RING, 1, 0.0)
    assert isinstance(r, Reject) and r.code is ErrorCode.UNKNOWN_JOB
    (r,) = coord.enter("job", 9, RING, 1, 0.0)
    assert isinstance(r, Reject) and r.code is ErrorCode.INVALID_RANK
    (r,) = coord.enter("job", 1, PP01, 1, 0.0)
    assert isinstance(r, Reject) and r.code is ErrorCode.INVALID_PHASE
    assert "rank 1 is not in group [0,2]" in r.message
    coord.enter("job", 0, RING, 1, 0.0)
    (r,) = coord.enter("job", 0, PP01, 2, 0.0)
    assert isinstance(r, Reject) and r.code is ErrorCode.RANK_BUSY
    with pytest.raises(ReleaseError, match="does not hold"):
        coord.release("job", 0, RING, 0.0)


def test_duplicate_and_overlapping_registration_leave_state_unchanged(
    coord: PerRankCoordinator,
) -> None:
    with pytest.raises(DuplicateJob):
        coord.register_job("job", "t", place(2, first_host=2))
    with pytest.raises(PlacementError, match="used by job 'job'"):
        coord.register_job("other", "t", place(2))
    assert coord.job_ids() == ["job"]
    assert coord.job("job").world_size == 8


def test_jobs_on_disjoint_ports_never_touch_each_other() -> None:
    c = PerRankCoordinator(PhaseCoordinator(rail_fabric("t", 4, 2, delay_s=0.0)))
    c.register_job("a", "t1", place(4, first_host=0))  # host0, host1
    c.register_job("b", "t2", place(4, first_host=2))  # host2, host3
    ring_a = PhaseKey(ProcessGroup.of([0, 1, 2, 3]), Collective.ALL_REDUCE)
    out_a = [d for r in range(4) for d in c.enter("a", r, ring_a, r, 0.0)]
    out_b = [d for r in range(4) for d in c.enter("b", r, ring_a, r, 0.0)]
    ra, rb = only(out_a, Reconfigure)[0], only(out_b, Reconfigure)[0]
    assert isinstance(ra, Reconfigure) and isinstance(rb, Reconfigure)
    ports_a = {(t.switch_id, p) for t in ra.targets for p in t.ports}
    ports_b = {(t.switch_id, p) for t in rb.targets for p in t.ports}
    assert ports_a and ports_b and not ports_a & ports_b
    assert c.owner_of_port("ocs-rail0", 1) == "a" and c.owner_of_port("ocs-rail0", 3) == "b"


def test_unregister_cancels_waiters_and_frees_gpus(coord: PerRankCoordinator) -> None:
    coord.enter("job", 0, RING, 5, 0.0)
    out = coord.unregister_job("job")
    assert out == [Reject("job", 0, 5, ErrorCode.CANCELLED, "job unregistered")]
    coord.register_job("again", "t", place())


def test_older_waiting_phase_keeps_its_ports(coord: PerRankCoordinator) -> None:
    """FIFO: a later phase on overlapping ports does not jump the queue."""
    rec = only(enter_all(coord, RING, WORLD, 0.0), Reconfigure)[0]
    assert isinstance(rec, Reconfigure)
    coord.reconfigured(rec.op_id, 0.1)
    for r in [0, 2]:
        coord.release("job", r, RING, 0.2)
        coord.enter("job", r, PP01, r, 0.2)
    pp23 = PhaseKey(ProcessGroup.of([2, 4]), Collective.SEND_RECV)  # host1 <-> host2
    coord.release("job", 4, RING, 0.3)
    assert coord.enter("job", 4, pp23, 4, 0.3) == []
    out: list[PerRankDecision] = []
    for r in [1, 3, 5, 6, 7]:
        out += coord.release("job", r, RING, 0.4)
    recs = [d for d in out if isinstance(d, Reconfigure)]
    assert [d.phase for d in recs] == [PP01]


def test_repeated_enter_reattaches_instead_of_failing(coord: PerRankCoordinator) -> None:
    """An agent whose stream broke sends its pending EnterPhase again with a new request id."""
    enter_all(coord, RING, WORLD[1:], 0.0)
    rec = only(coord.enter("job", 0, RING, 1, 0.0), Reconfigure)[0]
    assert isinstance(rec, Reconfigure)
    # the first request is answered (superseded), not left without an answer
    (superseded,) = coord.enter("job", 0, RING, 2, 0.1)
    assert isinstance(superseded, Reject)
    assert (superseded.rank, superseded.request_id, superseded.code) == (0, 1,
                                                                         ErrorCode.CANCELLED)
    out = coord.reconfigured(rec.op_id, 0.2)
    assert [(d.rank, d.request_id) for d in out if isinstance(d, Admit) and d.rank == 0] == [
        (0, 2)]
    # admitted already: the same enter again is answered at once, with no second hold
    assert coord.enter("job", 0, RING, 3, 0.3) == [Admit("job", 0, 3, RING, True, 0.0, steps=1)]
    assert coord.held_by_job("job") == 8
    for r in WORLD:
        coord.release("job", r, RING, 0.4)
    assert coord.held_by_job("job") == 0


def test_repeating_phase_does_not_starve_a_waiting_reconfiguration(
    coord: PerRankCoordinator,
) -> None:
    """Ranks outside a PP pair loop back into the next iteration's ring while the pair waits
    for the ring's circuits: they must queue behind the pair, or the pair never switches and
    the ring's collective (which needs ranks 0 and 2) never completes."""
    rec = only(enter_all(coord, RING, WORLD, 0.0), Reconfigure)[0]
    assert isinstance(rec, Reconfigure)
    coord.reconfigured(rec.op_id, 0.1)
    for r in (0, 2):
        coord.release("job", r, RING, 0.2)
        assert coord.enter("job", r, PP01, r, 0.2) == []
    out: list[PerRankDecision] = []
    for r in (1, 3, 4, 5, 6):
        out += coord.release("job", r, RING, 0.3)
        out += coord.enter("job", r, RING, 50 + r, 0.3, iteration=1)
    assert not only(out, Admit), "next iteration's ring jumped the waiting pair"
    out = coord.release("job", 7, RING, 0.4)
    recs = only(out, Reconfigure)
    assert [d.phase for d in recs if isinstance(d, Reconfigure)] == [PP01]


def test_holds_are_counted_per_instance(coord: PerRankCoordinator) -> None:
    rec = only(enter_all(coord, RING, WORLD, 0.0), Reconfigure)[0]
    assert isinstance(rec, Reconfigure)
    coord.reconfigured(rec.op_id, 0.1)
    assert coord.held_by_job("job") == 8
    for r in range(7):
        assert coord.release("job", r, RING, 0.2) == []  # nothing freed yet
    assert coord.held_by_job("job") == 1
    coord.release("job", 7, RING, 0.3)
    assert coord.held_by_job("job") == 0
    # the circuits are free again: another phase may break them at once
    out = coord.enter("job", 0, PP01, 1, 0.4) + coord.enter("job", 2, PP01, 2, 0.4)
    assert len(only(out, Reconfigure)) == 1


def test_recovered_job_switches_nothing_until_its_ranks_resync(coord: PerRankCoordinator) -> None:
    """After a restart, a rank whose agent has not reconnected may still hold circuits the
    new controller cannot see: switching waits for every rank's SyncDone (or a host-dead
    verdict)."""
    coord.mark_recovering("job")
    assert coord.enter("job", 0, PP01, 1, 0.0) == []
    assert coord.enter("job", 2, PP01, 2, 0.0) == []
    assert coord.synced("job", [0, 1, 2, 3], 0.1) == []
    assert coord.next_deadline() == pytest.approx(5.0)  # the waiters' own deadline
    out = coord.synced("job", [4, 5, 6, 7], 0.2)
    assert len(only(out, Reconfigure)) == 1 and not coord.recovering("job")


def test_no_timer_unfreezes_a_recovered_job_only_a_host_dead_verdict_does(
    coord: PerRankCoordinator,
) -> None:
    """Regression (issue 10): the end of a grace period used to let a recovered job's circuits
    change although some of its ranks never resynced. Now time alone changes nothing; ranks
    on hosts declared dead stop counting, the others must resync."""
    coord.mark_recovering("job")
    assert coord.enter("job", 0, PP01, 1, 0.0, timeout_s=300.0) == []
    assert coord.enter("job", 2, PP01, 2, 0.0, timeout_s=300.0) == []
    assert coord.next_deadline() == pytest.approx(300.0)  # no recovery deadline
    assert only(coord.expire(200.0), Reconfigure) == [] and coord.recovering("job")
    assert coord.synced("job", [0, 1, 2, 3], 1.0) == []  # host0 and host1 resynced
    assert coord.unsynced_hosts() == {"host2", "host3"}
    assert coord.hosts_dead(["host2"], 2.0) == []  # host3's ranks 6, 7 still unaccounted
    assert coord.recovering("job") and coord.unsynced_hosts() == {"host3"}
    out = coord.hosts_dead(["host3"], 3.0)
    assert len(only(out, Reconfigure)) == 1 and not coord.recovering("job")


def run_boundary(c: PerRankCoordinator, it: int, now: float) -> tuple[float, list[PerRankDecision]]:
    """One DP ring then one PP pair (host0 <-> host1 on rail 0), every rank releasing at once;
    reconfigurations are confirmed right away. Returns the clock and every decision."""
    seen: list[PerRankDecision] = []

    def settle(ds: list[PerRankDecision]) -> None:
        for d in ds:
            seen.append(d)
            if isinstance(d, Reconfigure):
                settle(c.reconfigured(d.op_id, now))

    for phase, ranks in ((RING, WORLD), (PP01, [0, 2])):
        for r in ranks:
            settle(c.enter("job", r, phase, 1000 * it + r, now, iteration=it))
        now += 0.01
        for r in ranks:
            settle(c.release("job", r, phase, now))
        now += 0.01
    return now, seen


def test_provisioning_learns_the_schedule_and_switches_ahead() -> None:
    c = PerRankCoordinator(
        PhaseCoordinator(rail_fabric("t", 4, 2, delay_s=0.01), learn_iterations=2)
    )
    c.register_job("job", "t", place())
    now, _ = run_boundary(c, 0, 0.0)  # first sighting of each transition: on demand
    learning = c.stats("job")
    assert learning.provisioning_hits == 0 and learning.provisioning_misses == 2
    assert not learning.schedule_learned
    now, _ = run_boundary(c, 1, now)  # second sighting: learned, provisioning starts
    now, _ = run_boundary(c, 2, now)
    learning = c.stats("job")
    assert learning.provisioning_hits >= 1
    now, seen = run_boundary(c, 3, now)
    provisioned = [d for d in seen if isinstance(d, Reconfigure) and d.provisioning]
    assert [d.phase for d in provisioned] == [PP01, RING]  # each released phase -> the next
    stats = c.stats("job")
    assert stats.schedule_learned
    assert stats.provisioning_hits == learning.provisioning_hits + 2
    assert stats.provisioning_misses == learning.provisioning_misses
    # ranks arriving at a provisioned phase are admitted at once
    assert all(d.noop for d in seen if isinstance(d, Admit))


def enter_switching(
    c: PerRankCoordinator, phase: PhaseKey, ranks: Iterable[int], request_base: int, now: float,
    iteration: int,
) -> None:
    """Each of ``ranks`` enters ``phase`` (request id ``request_base + rank``); every
    reconfiguration an enter starts is confirmed at once (not those that confirmation starts)."""
    for r in ranks:
        for d in c.enter("job", r, phase, request_base + r, now, iteration=iteration):
            if isinstance(d, Reconfigure):
                c.reconfigured(d.op_id, now)


def release_each(
    c: PerRankCoordinator, phase: PhaseKey, ranks: Iterable[int], now: float
) -> list[PerRankDecision]:
    """Each of ``ranks`` releases ``phase``; returns the decisions, in order."""
    out: list[PerRankDecision] = []
    for r in ranks:
        out += c.release("job", r, phase, now)
    return out


def test_deviation_resets_the_prediction() -> None:
    c = PerRankCoordinator(
        PhaseCoordinator(rail_fabric("t", 4, 2, delay_s=0.01), learn_iterations=2)
    )
    c.register_job("job", "t", place())
    now = 0.0
    for it in range(3):
        now, _ = run_boundary(c, it, now)
    # iteration 3: after the ring comes a different pair (host1 <-> host2) instead of PP01
    pp12 = PhaseKey(ProcessGroup.of([2, 4]), Collective.SEND_RECV)
    before = c.stats("job")
    enter_switching(c, RING, WORLD, 9000, now, iteration=3)
    out = release_each(c, RING, WORLD, now)
    provisioned = [d for d in out if isinstance(d, Reconfigure) and d.provisioning]
    assert [d.phase for d in provisioned] == [PP01]  # the prediction, about to be wrong
    for d in provisioned:
        assert isinstance(d, Reconfigure)
        c.reconfigured(d.op_id, now)
    enter_switching(c, pp12, (2, 4), 9100, now, iteration=3)
    assert c.stats("job").provisioning_misses == before.provisioning_misses + 1
    release_each(c, pp12, (2, 4), now)
    # the ring's successor is now pp12 with a streak of 1: no provisioning until re-learned
    enter_switching(c, RING, WORLD, 9200, now, iteration=4)
    out = release_each(c, RING, WORLD, now)
    assert not [d for d in out if isinstance(d, Reconfigure) and d.provisioning]


def test_declared_schedule_skips_learning() -> None:
    c = PerRankCoordinator(PhaseCoordinator(rail_fabric("t", 4, 2, delay_s=0.01)))
    c.register_job("job", "t", place(), declared_phases=[RING, PP01])
    _, seen = run_boundary(c, 0, 0.0)
    assert [d.phase for d in seen if isinstance(d, Reconfigure) and d.provisioning] == [
        PP01, RING]


def phase_of(ranks: list[int], coll: Collective = Collective.ALL_REDUCE) -> PhaseKey:
    return PhaseKey(ProcessGroup.of(ranks), coll)


def test_failed_apply_never_exposes_a_held_cross_connect(coord: PerRankCoordinator) -> None:
    """Review finding: a failure on one switch used to drop the whole op's ports from the
    view, hiding a cross-connect another rank still held from the hold checks. A failed
    apply forgets what it touched (unknown until read back) except held cross-connects."""
    p = phase_of([0, 2, 4])  # ring host0 -> host1 -> host2 on rail 0 only
    r = phase_of([0, 2], Collective.SEND_RECV)  # rail 0: host0 <-> host1
    q = phase_of([1, 3, 5, 7])  # rail 1: ring over hosts 0-3
    out = [d for k in (0, 2, 4) for d in coord.enter("job", k, p, k, 0.0)]
    (rp,) = only(out, Reconfigure)
    assert isinstance(rp, Reconfigure)
    coord.reconfigured(rp.op_id, 0.1)
    ring = next(t.cross_connects for t in rp.targets if t.switch_id == "ocs-rail0")
    coord.release("job", 0, p, 0.2)
    coord.release("job", 2, p, 0.2)  # rank 4 still holds the ring
    assert coord.enter("job", 0, r, 20, 0.3) == [] and coord.enter("job", 2, r, 22, 0.3) == []
    (rq,) = only([d for k in (1, 3, 5, 7) for d in coord.enter("job", k, q, 30 + k, 0.3)],
                 Reconfigure)
    assert isinstance(rq, Reconfigure)
    coord.distrust("ocs-rail0")  # e.g. a reboot alarm: every port of rail 0 unknown ...
    assert ring <= coord.confirmed("ocs-rail0")  # ... but the held ring stays visible
    out = coord.reconfigured(rq.op_id, 0.4, error="device timeout", failed_switches=["ocs-rail1"])
    for rec in only(out, Reconfigure):
        assert isinstance(rec, Reconfigure)
        for t in rec.targets:
            touched = {x for x in ring if (x.ingress in t.ports or x.egress in t.ports)
                       and x not in t.cross_connects}
            assert t.switch_id != "ocs-rail0" or not touched, (rec, touched)
    assert ring <= coord.confirmed("ocs-rail0")
    # rail 1 is unknown until read back: nothing is switched or admitted there
    assert not coord.confirmed("ocs-rail1")
    coord.set_confirmed("ocs-rail0", ring)
    coord.set_confirmed("ocs-rail1", [])
    out = coord.release("job", 4, p, 0.5)  # the last holder left: now the pair may switch
    assert [d.phase for d in out if isinstance(d, Reconfigure)] == [r]


def test_resumed_hold_on_missing_circuits_admits_nobody_blindly(
    coord: PerRankCoordinator,
) -> None:
    """Review finding: after a restart a reported hold on circuits the switches do not have
    must not let peers join without a switch."""
    coord.mark_recovering("job")
    coord.resume_held("job", 0, RING)
    # the others wait: recovering, and the circuits are missing
    assert enter_all(coord, RING, WORLD[1:], 0.01) == []
    out = coord.synced("job", WORLD, 0.05)  # every agent resynced: the recovery ends
    assert not only(out, Admit)
    (rec,) = only(out, Reconfigure)
    assert isinstance(rec, Reconfigure)
    adm = coord.reconfigured(rec.op_id, 0.2)
    assert [(d.rank, d.noop) for d in adm if isinstance(d, Admit)] == [
        (r, False) for r in WORLD[1:]]
    for r in WORLD:
        coord.release("job", r, RING, 0.3)
    with pytest.raises(ReleaseError, match="rank 3 is not in group"):
        coord.resume_held("job", 3, PP01)


def test_a_reported_hold_without_its_circuits_is_not_admitted_again(
    coord: PerRankCoordinator,
) -> None:
    """Found by an attack on the wire: a HeldPhase for a phase whose circuits the switches lack,
    then the same rank's enter of that phase, was answered "admitted, noop" at once, with no
    cross-connect made: an admission without confirmed circuits (the safety invariant)."""
    coord.resume_held("job", 0, PP01)  # the pair's cross-connects do not exist
    out = coord.enter("job", 0, PP01, 9, 0.1)
    assert not only(out, Admit), out
    (rej,) = only(out, Reject)
    assert isinstance(rej, Reject)
    assert (rej.rank, rej.request_id, rej.code) == (0, 9, ErrorCode.RANK_BUSY)
    assert "not confirmed" in rej.message and "release it first" in rej.message
    assert str(PP01) in rej.message
    # released, the rank enters again as any other: switched, then admitted on the circuits
    coord.release("job", 0, PP01, 0.2)
    assert coord.enter("job", 2, PP01, 10, 0.3) == []
    rec = only(coord.enter("job", 0, PP01, 11, 0.3), Reconfigure)[0]
    assert isinstance(rec, Reconfigure)
    adm = coord.reconfigured(rec.op_id, 0.4)
    assert sorted((d.rank, d.noop) for d in adm if isinstance(d, Admit)) == [
        (0, False), (2, False)]


def test_a_peer_of_a_hold_without_its_circuits_is_told_who_holds_the_ports(
    coord: PerRankCoordinator,
) -> None:
    """Found by a second attack: rank 0 reported it holds the pair (HeldPhase) whose ports the
    ring's cross-connects still occupy; its peer waited to its deadline and was told "ports
    claimed by an earlier waiting phase or being switched", though nothing else waited. The
    hold covers the ports, so the ring's cross-connects stay until rank 0 releases."""
    ring = only(enter_all(coord, RING, WORLD, 0.0), Reconfigure)[0]
    assert isinstance(ring, Reconfigure)
    coord.reconfigured(ring.op_id, 0.1)
    for r in WORLD:
        coord.release("job", r, RING, 0.2)
    coord.resume_held("job", 0, PP01, 1)
    assert coord.enter("job", 2, PP01, 12, 0.3, timeout_s=1.0, iteration=1) == []
    (rej,) = only(coord.expire(1.3), Reject)
    assert isinstance(rej, Reject) and (rej.rank, rej.code) == (2, ErrorCode.DEADLINE_EXCEEDED)
    assert ("cross-connects still held by job ranks [0] in send_recv[0,2]#0.0 (on circuits "
            "not confirmed on the switches: they release it first)") in rej.message
    coord.release("job", 0, PP01, 1.4, iteration=1)  # then the pair switches
    assert coord.enter("job", 2, PP01, 13, 1.5, iteration=2) == []
    assert only(coord.enter("job", 0, PP01, 14, 1.5, iteration=2), Reconfigure)


def test_a_hold_on_confirmed_circuits_is_answered_again_at_once(
    coord: PerRankCoordinator,
) -> None:
    # the retry of an admitted rank (its stream broke) keeps its quick answer
    coord.enter("job", 2, PP01, 1, 0.0)
    rec = only(coord.enter("job", 0, PP01, 2, 0.0), Reconfigure)[0]
    assert isinstance(rec, Reconfigure)
    coord.reconfigured(rec.op_id, 0.1)
    out = coord.enter("job", 0, PP01, 2, 0.2)
    assert [(d.rank, d.noop) for d in out if isinstance(d, Admit)] == [(0, True)]


def test_cancel_withdraws_a_waiter_or_a_ghost_hold(coord: PerRankCoordinator) -> None:
    rec = only(enter_all(coord, RING, WORLD, 0.0), Reconfigure)[0]
    assert isinstance(rec, Reconfigure)
    coord.reconfigured(rec.op_id, 0.1)
    for r in WORLD:
        coord.release("job", r, RING, 0.2)
    assert coord.enter("job", 2, PP01, 76, 0.3) == []  # waits for its peer
    assert coord.enter("job", 0, PP01, 77, 0.3) != []  # the pair switches
    assert coord.held_by_job("job") == 0
    coord.cancel("job", 0, 76, 0.4)  # another request id: nothing happens
    # rank 0 waits (the pair is switching); its caller goes away
    coord.cancel("job", 0, 77, 0.4)
    out = coord.enter("job", 0, RING, 78, 0.5)
    assert out is not None
    assert not only(out, Reject)  # not RANK_BUSY any more: the cancelled wait is gone
    assert coord.waiting_request("job", 0) == 78


def test_release_checks_the_iteration(coord: PerRankCoordinator) -> None:
    coord.enter("job", 2, PP01, 2, 0.0, iteration=5)
    rec = only(coord.enter("job", 0, PP01, 1, 0.0, iteration=5), Reconfigure)[0]
    assert isinstance(rec, Reconfigure)
    coord.reconfigured(rec.op_id, 0.1)
    with pytest.raises(ReleaseError, match="of iteration 4"):
        coord.release("job", 0, PP01, 0.2, iteration=4)
    coord.release("job", 0, PP01, 0.2, iteration=5)


def ron_coordinator(delay_s: float) -> PerRankCoordinator:
    """Rail 0 carries the ring host0 -> host2 -> host1 -> host0 (the reverse of what an
    all-reduce over ranks 0, 2, 4 plans: host0 -> host1 -> host2 -> host0)."""
    from lightrail.controller.core.advisor import CostAdvisor

    fabric = rail_fabric("t", 4, 2, delay_s=delay_s)
    c = PerRankCoordinator(
        PhaseCoordinator(fabric, advisor=CostAdvisor(fabric), provisioning=False)
    )
    c.register_job("job", "t", place())
    c.set_confirmed("ocs-rail0", [CrossConnect(1, N + 3), CrossConnect(3, N + 2),
                                  CrossConnect(2, N + 1)])
    return c


THREE = PhaseKey(ProcessGroup.of([0, 2, 4]), Collective.ALL_REDUCE)


def test_reconfigure_or_not_stays_when_delta_is_large() -> None:
    """100 ms MEMS delay, 1 MB all-reduce: forwarding over the reversed ring (2 hops per
    flow) costs far less than switching."""
    from lightrail.controller.core.decisions import Decided

    c = ron_coordinator(0.1)
    out = c.enter("job", 0, THREE, 1, 0.3, nbytes=1_000_000, compute_gap_s=0.001)
    (dec,) = [d for d in out if isinstance(d, Decided)]
    assert not dec.decision.switch and dec.decision.delta_s == pytest.approx(0.1)
    assert dec.decision.current_circuits_time_s > dec.decision.new_circuits_time_s
    assert "stay" in dec.decision.reason
    assert not only(out, Admit) and not only(out, Reconfigure)  # waits for ranks 2 and 4
    out = c.enter("job", 4, THREE, 2, 0.3, nbytes=1_000_000)
    out += c.enter("job", 2, THREE, 3, 0.3, nbytes=1_000_000)
    assert [(d.rank, d.noop) for d in out if isinstance(d, Admit)] == [
        (0, True), (4, True), (2, True)]
    assert not [d for d in out if isinstance(d, Decided)]  # one decision per phase instance
    assert not only(out, Reconfigure)
    # the ranks hold the circuits they run on (the reversed ring): nothing else may break them
    # meanwhile. The pair host0 <-> host2 needs 3 -> N+1, whose port the held 3 -> N+2 uses.
    assert c.held_by_job("job") == 3
    c.release("job", 0, THREE, 0.4)
    c.release("job", 4, THREE, 0.4)
    pair = PhaseKey(ProcessGroup.of([0, 4]), Collective.SEND_RECV)
    out = c.enter("job", 0, pair, 4, 0.5) + c.enter("job", 4, pair, 5, 0.5)
    assert not only(out, Reconfigure)  # rank 2 still holds the ring
    out = c.release("job", 2, THREE, 0.6)
    assert [d.phase for d in out if isinstance(d, Reconfigure)] == [pair]


def test_reconfigure_or_not_switches_when_delta_is_microseconds() -> None:
    from lightrail.controller.core.decisions import Decided

    c = ron_coordinator(4e-6)  # silicon photonics
    out = c.enter("job", 0, THREE, 1, 0.3, nbytes=100_000_000, compute_gap_s=0.0)
    (dec,) = [d for d in out if isinstance(d, Decided)]
    assert dec.decision.switch
    out += c.enter("job", 2, THREE, 2, 0.3) + c.enter("job", 4, THREE, 3, 0.3)
    assert len(only(out, Reconfigure)) == 1 and not only(out, Admit)


def test_no_hint_means_no_decision_and_a_switch() -> None:
    from lightrail.controller.core.decisions import Decided

    c = ron_coordinator(0.1)
    out = c.enter("job", 0, THREE, 1, 0.3)
    out += c.enter("job", 2, THREE, 2, 0.3) + c.enter("job", 4, THREE, 3, 0.3)
    assert not [d for d in out if isinstance(d, Decided)]
    assert len(only(out, Reconfigure)) == 1


def test_deadlines_order_by_time_then_arrival_never_by_job() -> None:
    from lightrail.controller.core.records import Deadline, EnterBatch

    def batch(rank: int, request_id: int) -> EnterBatch:
        return EnterBatch((rank,), request_id, 0.0, 1.0, 0, 1)

    heap = [Deadline(2.0, 1, "a", batch(0, 1)), Deadline(1.0, 3, "z", batch(5, 9)),
            Deadline(1.0, 2, "zz", batch(1, 2))]
    assert [(d.at_s, d.seq) for d in sorted(heap)] == [(1.0, 2), (1.0, 3), (2.0, 1)]
    # job and batch are not compared
    assert Deadline(1.0, 1, "a", batch(0, 1)) == Deadline(1.0, 1, "b", batch(7, 8))


def test_a_phase_admitted_behind_an_instant_switch_is_no_noop(coord: PerRankCoordinator) -> None:
    """A switch confirmed in 0.0 s (a clock's resolution) still switched: the ranks that waited
    for it are admitted as switched, not as no-ops (no 0 standing in for "no switch")."""
    rec = only(enter_all(coord, RING, WORLD, 0.0), Reconfigure)[0]
    assert isinstance(rec, Reconfigure)
    out = only(coord.reconfigured(rec.op_id, 0.2, device_s=0.0), Admit)
    assert [(d.rank, d.noop) for d in out if isinstance(d, Admit)] == [(r, False) for r in WORLD]
    assert coord.stats("job").admitted_noop == 0
