"""The batched coordinator (``enter_many`` / ``release_many``, one ``Admitted`` per phase
instance) against itself rank by rank, the liveness rule, and batch bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.core.decisions import (
    Admit,
    Admitted,
    Decision,
    Reconfigure,
    Reject,
    Rewire,
    per_rank,
)
from lightrail.controller.core.planner import SwitchTarget, plan_phase
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.fabric import rail_fabric
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement

WORLD = list(range(8))
RING = PhaseKey(ProcessGroup.of(WORLD), Collective.ALL_REDUCE)
PAIR = PhaseKey(ProcessGroup.of([0, 4]), Collective.SEND_RECV)  # host0 <-> host2, rail 0
PHASES = (
    RING,
    PAIR,
    PhaseKey(ProcessGroup.of([0, 2]), Collective.SEND_RECV),
    PhaseKey(ProcessGroup.of([2, 4]), Collective.SEND_RECV),
    PhaseKey(ProcessGroup.of([1, 3, 5, 7]), Collective.ALL_REDUCE),  # rail 1 ring
    PhaseKey(ProcessGroup.of([0, 1]), Collective.ALL_REDUCE),  # one host: no circuit
    PhaseKey(ProcessGroup.of([0, 2, 4, 6]), Collective.ALL_TO_ALL, step=1),
)


def coordinator() -> PhaseCoordinator:
    c = PhaseCoordinator(rail_fabric("t", 4, 2, delay_s=0.0), default_timeout_s=5.0)
    c.register_job("job", "t", [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)])
    return c


def only(decisions: list[Decision], kind: type) -> list[Decision]:
    return [d for d in decisions if isinstance(d, kind)]


def admitted_ranks(decisions: list[Decision]) -> list[int]:
    return sorted(r for d in decisions if isinstance(d, Admitted)
                  for e in d.entries for r in e.ranks)


def complete(c: PhaseCoordinator, decisions: list[Decision], now: float) -> list[Decision]:
    """Confirm every reconfiguration in ``decisions`` (and those they start), in order."""
    out = list(decisions)
    pending = [d for d in decisions if isinstance(d, Reconfigure)]
    while pending:
        more = c.reconfigured(pending.pop(0).op_id, now)
        out += more
        pending += [d for d in more if isinstance(d, Reconfigure)]
    return out


def test_a_batch_is_admitted_with_one_decision_per_instance() -> None:
    c = coordinator()
    out = c.enter_many("job", WORLD[:4], RING, 7, 0.0, route=3)
    out += c.enter_many("job", WORLD[4:], RING, 8, 0.1, route=4)
    (rec,) = only(out, Reconfigure)
    assert isinstance(rec, Reconfigure)
    (adm,) = only(c.reconfigured(rec.op_id, 0.5), Admitted)
    assert isinstance(adm, Admitted)
    assert [(e.route, e.request_id, e.ranks) for e in adm.entries] == [
        (3, 7, (0, 1, 2, 3)), (4, 8, (4, 5, 6, 7))]
    assert not adm.noop and adm.rank_count == 8 and adm.iteration == 0
    assert [a.waited_s for a in adm.per_rank()] == pytest.approx([0.5] * 4 + [0.4] * 4)
    assert c.held_by_job("job") == 8


def test_release_many_releases_the_holders_and_refuses_the_rest() -> None:
    c = coordinator()
    complete(c, c.enter_many("job", WORLD, RING, 1, 0.0), 0.1)
    out, refused = c.release_many("job", [0, 1, 99, 2], RING, 0.2, iteration=0)
    assert out == []  # others still hold the ring: nothing freed
    assert [(r.rank, r.error.code) for r in refused] == [(99, ErrorCode.INVALID_RANK)]
    _, refused = c.release_many("job", [0, 3], RING, 0.3)
    assert [(r.rank, r.error.code) for r in refused] == [(0, ErrorCode.INVALID_PHASE)]
    assert "does not hold" in str(refused[0].error)
    assert c.held_by_job("job") == 4


def test_release_many_checks_rank_by_rank_when_the_batch_is_not_all_holders() -> None:
    # A batch of distinct holders of one instance is released with set operations; a
    # repeated rank (refused once, not released), another step or a rank that left already
    # is refused exactly as rank by rank, and the rest of the batch is released.
    c = coordinator()
    complete(c, c.enter_many("job", WORLD, RING, 1, 0.0), 0.1)
    _, refused = c.release_many("job", [0, 1, 0], RING, 0.2, iteration=0)
    assert [(r.rank, r.error.code) for r in refused] == [(0, ErrorCode.INVALID_RANK)]
    assert c.held_by_job("job") == 7
    _, refused = c.release_many("job", [2, 3], RING, 0.3, iteration=1)
    assert [(r.rank, r.error.code) for r in refused] == [
        (2, ErrorCode.INVALID_PHASE), (3, ErrorCode.INVALID_PHASE)]
    assert c.held_by_job("job") == 7
    _, refused = c.release_many("job", [2, 0, 3, 1], RING, 0.4)
    assert [(r.rank, r.error.code) for r in refused] == [(1, ErrorCode.INVALID_PHASE)]
    assert c.held_by_job("job") == 4
    out, refused = c.release_many("job", [4, 5, 6, 7], RING, 0.5, iteration=0)
    assert (out, refused, c.held_by_job("job")) == ([], [], 0)
    _, refused = c.release_many("job", [4], RING, 0.6)  # the instance is gone: not held
    assert [(r.rank, r.error.code) for r in refused] == [(4, ErrorCode.INVALID_PHASE)]
    # The freed circuits are there for the next instance, admitted at once.
    assert admitted_ranks(c.enter_many("job", WORLD, RING, 2, 0.7, iteration=1)) == WORLD


def test_refusals_name_the_rank_and_carry_the_route() -> None:
    c = coordinator()
    out = c.enter_many("job", [0, 9, 1], PAIR, 5, 0.0, route=11)
    rejects = [d for d in out if isinstance(d, Reject)]
    assert [(d.rank, d.code, d.route) for d in rejects] == [
        (9, ErrorCode.INVALID_RANK, 11), (1, ErrorCode.INVALID_PHASE, 11)]
    assert "rank 1 is not in group" in rejects[1].message
    assert [d.rank for d in c.enter_many("nope", [0, 1], RING, 1, 0.0)
            if isinstance(d, Reject) and d.code is ErrorCode.UNKNOWN_JOB] == [0, 1]


def test_a_rank_twice_in_one_batch_gets_one_answer_a_refusal_and_does_not_enter() -> None:
    # Found by an attack on the wire: [0, 4, 0] refused rank 0 (request 5) and admitted it
    # (request 5) as well; a caller matching answers on (rank, request id) saw both
    c = coordinator()
    out = c.enter_many("job", [0, 4, 0], PAIR, 5, 0.0, route=2)
    assert [(d.rank, d.request_id, d.code) for d in out if isinstance(d, Reject)] == [
        (0, 5, ErrorCode.INVALID_RANK)]
    assert "rank 0 appears 2 times in the batch" in str(out[0])
    assert not only(complete(c, out, 0.1), Admitted)  # rank 4 waits for its peer
    assert c.waiting_request("job", 0) is None and c.waiting_request("job", 4) == 5
    (adm,) = only(complete(c, c.enter_many("job", [0], PAIR, 6, 0.2, route=2), 0.3), Admitted)
    assert isinstance(adm, Admitted) and admitted_ranks([adm]) == [0, 4]


def test_a_rank_twice_in_one_release_is_refused_once_and_stays_held() -> None:
    c = coordinator()
    complete(c, c.enter_many("job", [0, 4], PAIR, 5, 0.0, route=2), 0.1)
    _, refused = c.release_many("job", [0, 4, 0], PAIR, 0.2)
    assert [(f.rank, f.error.code) for f in refused] == [(0, ErrorCode.INVALID_RANK)]
    assert "rank 0 appears 2 times in the batch" in str(refused[0].error)
    assert c.held_by_job("job") == 1  # rank 4 left; rank 0 still holds the pair
    _, refused = c.release_many("job", [0], PAIR, 0.3)
    assert refused == [] and c.held_by_job("job") == 0


def test_a_batch_times_out_together_on_its_route() -> None:
    c = coordinator()
    complete(c, c.enter_many("job", WORLD, RING, 1, 0.0), 0.1)
    c.release_many("job", [0, 4], RING, 0.2)
    out = c.enter_many("job", [0, 4], PAIR, 2, 0.2, timeout_s=1.0, route=9)
    assert only(out, Reconfigure) == []  # the ring is still held by six ranks
    assert c.next_deadline() == pytest.approx(1.2)
    expired = c.expire(1.3)
    assert [(d.rank, d.code, d.route) for d in expired if isinstance(d, Reject)] == [
        (0, ErrorCode.DEADLINE_EXCEEDED, 9), (4, ErrorCode.DEADLINE_EXCEEDED, 9)]
    assert "still held by job ranks [1, 2, 3, 5, 6, 7]" in str(expired[0])


def test_a_waiting_rank_sent_again_moves_to_the_new_route() -> None:
    c = coordinator()
    assert c.enter_many("job", [0, 1, 2], RING, 1, 0.0, route=1) == []  # waits for the rest
    (rec,) = only(c.enter_many("job", [3, 4, 5, 6, 7], RING, 3, 0.0, route=3), Reconfigure)
    assert isinstance(rec, Reconfigure)
    # its stream broke: the rank moves to the new request; the old one is answered, on its
    # own route, instead of never
    (old,) = c.enter_many("job", [1], RING, 2, 0.1, route=2)
    assert isinstance(old, Reject)
    assert (old.rank, old.request_id, old.route, old.code) == (1, 1, 1, ErrorCode.CANCELLED)
    assert "superseded by request 2" in old.message
    (adm,) = only(c.reconfigured(rec.op_id, 0.2), Admitted)
    assert isinstance(adm, Admitted)
    assert sorted((e.route, e.ranks) for e in adm.entries) == [
        (1, (0, 2)), (2, (1,)), (3, (3, 4, 5, 6, 7))]
    assert [w.route for w in c.waiting()] == []


def test_next_step_ring_does_not_jump_the_coming_pair() -> None:
    """The liveness bug that once made bench/hot_path.py need an artificial pipeline
    dependency: ranks outside the pair finish ring b and enter ring b + 1 before ranks 0 and
    4 ask for the pair. Ring
    b + 1's circuits are there, but admitting those ranks would make them hold the circuits
    the pair must break while the ring's collective waits for ranks 0 and 4, which wait for
    the pair: a deadlock until the admission timeout. Ring b + 1 must wait (held back: ranks
    of its group have not entered it), the pair must switch, then the ring switches back."""
    c = coordinator()
    complete(c, c.enter_many("job", WORLD, RING, 1, 0.0), 0.1)
    others = [1, 2, 3, 5, 6, 7]
    out, _ = c.release_many("job", others, RING, 0.2, iteration=0)
    out += c.enter_many("job", others, RING, 2, 0.2, iteration=1)
    assert admitted_ranks(out) == [], "ring 1 jumped the pair of step 0"
    out, _ = c.release_many("job", [0, 4], RING, 0.3, iteration=0)
    out += c.enter_many("job", [0, 4], PAIR, 3, 0.3, iteration=0)
    recs = [d for d in out if isinstance(d, Reconfigure)]
    assert [d.phase for d in recs] == [PAIR]
    done = complete(c, out, 0.4)
    assert admitted_ranks(done) == [0, 4]
    out, _ = c.release_many("job", [0, 4], PAIR, 0.5, iteration=0)
    out += c.enter_many("job", [0, 4], RING, 4, 0.5, iteration=1)
    recs = [d for d in out if isinstance(d, Reconfigure)]
    assert [d.phase for d in recs] == [RING]  # the pair broke ring links: switch back
    assert admitted_ranks(complete(c, out, 0.6)) == WORLD


def test_an_all_to_all_step_does_not_lock_out_a_rank_still_in_its_pair() -> None:
    """The same hazard within one training step (found by bench/hot_path.py's mixed
    workload): two EP ranks finish the ring and enter all-to-all step 0 while rank 0 still
    has its PP pair to do. Switching the all-to-all for those two would make them hold
    rank 0's ports, which the pair must break: the all-to-all would wait for rank 0, rank 0
    for the pair. The all-to-all may take circuits only once rank 0 is in it too."""
    c = coordinator()
    complete(c, c.enter_many("job", WORLD, RING, 1, 0.0), 0.1)
    a2a = PhaseKey(ProcessGroup.of([0, 2, 4]), Collective.ALL_TO_ALL)  # hosts 0-2, rail 0
    pair = PhaseKey(ProcessGroup.of([0, 6]), Collective.SEND_RECV)  # host0 <-> host3
    out, _ = c.release_many("job", WORLD, RING, 0.2)
    out += c.enter_many("job", [2, 4], a2a, 2, 0.2)
    assert only(out, Reconfigure) == [] and admitted_ranks(out) == []
    out = complete(c, c.enter_many("job", [0, 6], pair, 3, 0.2), 0.3)
    assert admitted_ranks(out) == [0, 6]  # the pair was not locked out
    out, _ = c.release_many("job", [0, 6], pair, 0.4)
    done = complete(c, out + c.enter_many("job", [0], a2a, 4, 0.4), 0.5)
    assert admitted_ranks(done) == [0, 2, 4]


# --- batched against rank by rank --------------------------------------------------------------


Admission = tuple[int, str, int, bool]
"""(rank, phase, training step, noop) of one rank's admission."""


@dataclass
class Side:
    """One coordinator of a ``Twin`` and what its ranks hold and wait for."""

    c: PhaseCoordinator = field(default_factory=coordinator)
    holding: dict[int, tuple[PhaseKey, int]] = field(default_factory=dict)
    waiting: dict[int, int] = field(default_factory=dict)
    """Waiting rank -> its step."""
    admitted: list[Admission] = field(default_factory=list)

    def seen(self, decisions: list[Decision]) -> list[Admission]:
        """Record the admissions among ``decisions``; returns them, sorted."""
        out: list[Admission] = []
        for d in per_rank(decisions):
            assert not isinstance(d, Reject), d
            if isinstance(d, Admit):
                step = self.waiting.pop(d.rank)
                self.holding[d.rank] = (d.phase, step)
                out.append((d.rank, str(d.phase), step, d.noop))
        self.admitted += out
        return sorted(out)

    def finish(self, decisions: list[Decision], now: float) -> list[list[Admission]]:
        """Confirm the reconfigurations ``decisions`` started (and those they start), in
        order; the admissions of each step."""
        rounds = [self.seen(decisions)]
        queue = [d for d in decisions if isinstance(d, Reconfigure)]
        while queue:
            more = self.c.reconfigured(queue.pop(0).op_id, now)
            rounds.append(self.seen(more))
            queue += [d for d in more if isinstance(d, Reconfigure)]
        return rounds


Switch = tuple[str, list[tuple[str, list[tuple[int, int]]]]]
"""A ``Reconfigure``: its phase and, per switch, the cross-connects it makes."""


def switches(decisions: list[Decision]) -> list[Switch]:
    return [(str(d.phase), sorted((t.switch_id, sorted((x.ingress, x.egress)
                                                        for x in t.cross_connects))
                                  for t in d.targets))
            for d in decisions if isinstance(d, Reconfigure)]


@dataclass
class Twin:
    """The same program run batched (``a``) and rank by rank (``b``). ``exact``: compare the
    decisions of every action (same switches in the same order, same admissions); else only
    what each side admitted over the whole run (batches that move several ranks to a later
    step at once may let an older phase go first where single ranks, moving one by one,
    pass through states in which it is still held back)."""

    exact: bool
    a: Side = field(default_factory=Side)
    b: Side = field(default_factory=Side)
    request: int = 0

    def idle(self) -> list[int]:
        """Ranks idle on both sides."""
        return [r for r in WORLD if all(r not in s.holding and r not in s.waiting
                                        for s in (self.a, self.b))]

    def holding(self) -> list[int]:
        """Ranks holding the same phase instance on both sides."""
        return sorted(r for r, h in self.a.holding.items() if self.b.holding.get(r) == h)

    def enter(self, ranks: list[int], phase: PhaseKey, step: int, now: float) -> None:
        self.request += 1
        for side in (self.a, self.b):
            for r in ranks:
                side.waiting[r] = step
        da = self.a.c.enter_many("job", ranks, phase, self.request, now, iteration=step)
        db: list[Decision] = []
        for r in ranks:
            self.request += 1
            db += self.b.c.enter("job", r, phase, self.request, now, iteration=step)
        self._compare(da, db, now)

    def release(self, ranks: list[int], now: float) -> None:
        by_phase: dict[tuple[PhaseKey, int], list[int]] = {}
        for r in ranks:
            by_phase.setdefault(self.a.holding[r], []).append(r)
        for (phase, step), rs in by_phase.items():
            for side in (self.a, self.b):
                for r in rs:
                    del side.holding[r]
            da, refused = self.a.c.release_many("job", rs, phase, now, step)
            assert refused == []
            db: list[Decision] = []
            for r in rs:
                db += self.b.c.release("job", r, phase, now, step)
            self._compare(da, db, now)

    def _compare(self, da: list[Decision], db: list[Decision], now: float) -> None:
        if self.exact:
            assert switches(da) == switches(db)
        ra, rb = self.a.finish(da, now), self.b.finish(db, now)
        if self.exact:
            assert ra == rb

    def drain(self, now: float) -> None:
        """Each side releases its holders until nothing is held (everything admissible got
        in)."""
        for side in (self.a, self.b):
            for _ in range(64):
                if not side.holding:
                    break
                for r, (phase, step) in sorted(side.holding.items()):
                    del side.holding[r]
                    side.finish(side.c.release("job", r, phase, now, step), now)
            assert not side.holding, "holds never drained"


def run_program(data: st.DataObject, exact: bool) -> Twin:
    """Draw and run a program of enters (random phases, random batch splits, steps that only
    move forward; all step 0 when ``exact``) and releases, then drain."""
    twin = Twin(exact)
    now = 0.0
    step = 0
    for _ in range(data.draw(st.integers(4, 24), label="actions")):
        now += 0.01
        idle, holding = twin.idle(), twin.holding()
        if holding and (not idle or data.draw(st.booleans(), label="release?")):
            chosen = data.draw(st.lists(st.sampled_from(holding), min_size=1, unique=True),
                               label="release")
            twin.release(chosen, now)
            continue
        if not idle:
            break
        phase = data.draw(st.sampled_from(PHASES), label="phase")
        members = [r for r in phase.group.ranks if r in idle]
        if not members:
            continue
        if not exact:
            step += data.draw(st.integers(0, 1), label="next step?")
        batch = data.draw(st.lists(st.sampled_from(members), min_size=1, unique=True),
                          label="batch")
        twin.enter(batch, phase, step, now)
    twin.drain(now + 1.0)
    return twin


@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_batched_switches_and_admits_exactly_as_rank_by_rank(data: st.DataObject) -> None:
    """Within one training step: the batched coordinator makes the same switches in the same
    order and admits the same ranks into the same phases, action by action, as the same
    requests sent one rank at a time."""
    twin = run_program(data, exact=True)
    assert twin.a.admitted == twin.b.admitted
    for sid in twin.a.c.fabric.switches:
        assert twin.a.c.confirmed(sid) == twin.b.c.confirmed(sid)


@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_batched_admits_what_rank_by_rank_admits_across_steps(data: st.DataObject) -> None:
    """Across training steps: both admit the same ranks into the same phase instances over
    the run, both drain, and neither is left holding anything."""
    twin = run_program(data, exact=False)
    assert sorted(a[:3] for a in twin.a.admitted) == sorted(b[:3] for b in twin.b.admitted)
    assert twin.a.c.held_by_job("job") == twin.b.c.held_by_job("job") == 0


# --- found by review (adversarial scripts) ---------------------------------------------------


def test_provisioning_never_breaks_what_a_switching_phase_keeps() -> None:
    """An op carries only what its phase lacks; the cross-connects the phase keeps must not
    be broken meanwhile (here: by provisioning the declared next phase), or the phase would be
    admitted onto circuits the switch no longer has."""
    ring = PhaseKey(ProcessGroup.of([0, 2, 4, 6]), Collective.ALL_REDUCE)  # rail 0
    other = PhaseKey(ProcessGroup.of([1, 3, 5, 7]), Collective.ALL_REDUCE)  # rail 1
    pair = PhaseKey(ProcessGroup.of([2, 4]), Collective.SEND_RECV)  # host1 <-> host2, rail 0
    c = PhaseCoordinator(rail_fabric("t", 4, 2, delay_s=0.0), default_timeout_s=5.0)
    c.register_job("job", "t", [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)],
                   declared_phases=[other, pair])
    (target,) = plan_targets(c, ring)
    kept = sorted(target.cross_connects)
    c.set_confirmed("ocs-rail0", kept[:-1])  # the switch has the ring but one hop
    c.set_confirmed("ocs-rail1", [])
    (rx,) = only(c.enter_many("job", [0, 2, 4, 6], ring, 1, 0.0), Reconfigure)
    assert isinstance(rx, Reconfigure)
    assert [sorted(t.cross_connects) for t in rx.targets] == [[kept[-1]]]  # only what lacks
    complete(c, c.enter_many("job", [1, 3, 5, 7], other, 2, 0.0), 0.1)
    out, _ = c.release_many("job", [1, 3, 5, 7], other, 0.2)  # would provision the pair
    for d in only(out, Reconfigure):
        assert isinstance(d, Reconfigure)
        for t in d.targets:
            assert t.switch_id != "ocs-rail0" or not (t.ports & set(
                p for x in kept for p in x.ports())), "provisioning touches the kept ring"
    admitted = complete(c, c.reconfigured(rx.op_id, 0.3), 0.3)
    assert admitted_ranks(admitted) == [0, 2, 4, 6]
    assert set(kept) <= c.confirmed("ocs-rail0")


def plan_targets(c: PhaseCoordinator, phase: PhaseKey) -> tuple[SwitchTarget, ...]:
    return plan_phase(c.job("job"), phase).targets


def test_a_kept_cross_connect_lost_while_switching_blocks_the_admission() -> None:
    """A read-back during the op finds a kept cross-connect gone: the phase is not admitted;
    it switches again."""
    c = coordinator()
    complete(c, c.enter_many("job", WORLD, RING, 1, 0.0), 0.1)
    c.release_many("job", WORLD, RING, 0.2)
    out = complete(c, c.enter_many("job", [0, 4], PAIR, 2, 0.3), 0.3)
    c.release_many("job", [0, 4], PAIR, 0.4)
    (rec,) = only(c.enter_many("job", WORLD, RING, 3, 0.5, iteration=1), Reconfigure)
    assert isinstance(rec, Reconfigure)
    # the pair broke only rail-0 hops: the ring's rail-1 half is kept, not in the op
    assert not next(t for t in rec.targets if t.switch_id == "ocs-rail1").cross_connects
    lost = sorted(c.confirmed("ocs-rail1"))[0]
    c.set_confirmed("ocs-rail1", c.confirmed("ocs-rail1") - {lost})  # e.g. read back after an alarm
    out = c.reconfigured(rec.op_id, 0.6)
    assert admitted_ranks(out) == []
    (again,) = only(out, Reconfigure)
    assert isinstance(again, Reconfigure)
    assert lost in next(t for t in again.targets if t.switch_id == "ocs-rail1").cross_connects
    assert admitted_ranks(c.reconfigured(again.op_id, 0.7)) == WORLD


def test_unregistering_a_job_while_its_phase_switches() -> None:
    """Review finding: the switch's confirmation after UnregisterJob crashed the coordinator
    (the instance still marked queued); the job registers again and switches normally."""
    c = coordinator()
    (rec,) = only(c.enter_many("job", WORLD, RING, 1, 0.0), Reconfigure)
    assert isinstance(rec, Reconfigure)
    assert {d.code for d in c.unregister_job("job") if isinstance(d, Reject)} == {
        ErrorCode.CANCELLED}
    assert c.reconfigured(rec.op_id, 0.1) == []
    c.register_job("job", "t", [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)])
    out = c.enter_many("job", [0, 2], PhaseKey(ProcessGroup.of([0, 2]), Collective.SEND_RECV),
                       2, 0.2)
    (rec2,) = only(out, Reconfigure)
    assert isinstance(rec2, Reconfigure)
    c.unregister_job("job")
    assert c.reconfigured(rec2.op_id, 0.3, error="boom") == []


def test_a_failed_over_rank_does_not_join_the_instance_its_peers_still_hold() -> None:
    """Review finding: after a failover the replacement rank entered the step its live peer
    still held and was admitted at once, onto the old plan, while the rewire that moves its
    circuits was in flight. The old instance is closed: the rank waits for a new one."""
    ring = PhaseKey(ProcessGroup.of([0, 1]), Collective.ALL_REDUCE)
    c = PhaseCoordinator(rail_fabric("t", 2, 1, delay_s=0.0, spares=1))
    c.register_job("job", "t", [RankPlacement(0, "host0", 0), RankPlacement(1, "host1", 0)])
    complete(c, c.enter_many("job", [0, 1], ring, 1, 0.0), 0.1)
    (rw,) = [d for d in c.replace_rank("job", 0, "host2", 0, 0.2) if isinstance(d, Rewire)]
    assert c.enter_many("job", [0], ring, 2, 0.3) == []  # not admitted onto the old plan
    c.reconfigured(rw.op_id, 0.4)
    out, _ = c.release_many("job", [1], ring, 0.5)  # the live peer leaves the old instance
    out += c.enter_many("job", [1], ring, 3, 0.5)
    done = complete(c, out, 0.6)
    assert admitted_ranks(done) == [0, 1]
    assert c.held_by_job("job") == 2


def test_a_second_failover_of_a_rank_holding_a_retired_instance_leaves_no_hold() -> None:
    """Review finding: rank 1 kept holding the instance rank 0's failover retired, then failed
    over itself: its hold on the retired instance was never dropped (nobody could release
    it), blocking those ports for every later phase."""
    ring = PhaseKey(ProcessGroup.of([0, 1]), Collective.ALL_REDUCE)
    c = PhaseCoordinator(rail_fabric("t", 2, 1, delay_s=0.0, spares=2), provisioning=False)
    c.register_job("job", "t", [RankPlacement(0, "host0", 0), RankPlacement(1, "host1", 0)])
    complete(c, c.enter_many("job", [0, 1], ring, 1, 0.0), 0.1)
    for d in c.replace_rank("job", 0, "host2", 0, 0.2):  # rank 1 keeps the retired ring
        if isinstance(d, Rewire):
            c.reconfigured(d.op_id, 0.3)
    for d in c.replace_rank("job", 1, "host3", 0, 0.4):  # rank 1 fails while holding it
        if isinstance(d, Rewire):
            c.reconfigured(d.op_id, 0.5)
    assert c.held_by_job("job") == 0
    # the rewires moved the ring: it is admitted at once on the new placement; once its ranks
    # release it, no hold may remain on any switch (the coordinator's own hold counts)
    assert admitted_ranks(c.enter_many("job", [0, 1], ring, 2, 0.6)) == [0, 1]
    c.release_many("job", [0, 1], ring, 0.7)
    assert not any(c._s.views._held.values())  # nothing public counts holds


def test_after_an_alarm_nobody_joins_held_circuits_before_a_read_back() -> None:
    """Review finding: after ``distrust`` the held cross-connects stayed confirmed, so a rank
    re-entering the held instance was admitted onto circuits nobody had read back."""
    ring = PhaseKey(ProcessGroup.of([0, 1, 2]), Collective.ALL_REDUCE)
    c = PhaseCoordinator(rail_fabric("t", 3, 1, delay_s=0.0), provisioning=False)
    c.register_job("job", "t", [RankPlacement(r, f"host{r}", 0) for r in range(3)])
    assert admitted_ranks(complete(c, c.enter_many("job", [0, 1, 2], ring, 1, 0.0), 0.1)) == [
        0, 1, 2]
    on_switch = c.confirmed("ocs-rail0")
    c.release_many("job", [2], ring, 0.2)  # rank 2 leaves early; 0 and 1 still hold
    c.distrust("ocs-rail0")  # an alarm: the switch may have rebooted
    assert admitted_ranks(c.enter_many("job", [2], ring, 2, 0.3)) == []
    c.set_confirmed("ocs-rail0", on_switch)  # the read-back finds the circuits there
    assert admitted_ranks(c.schedule(0.4)) == [2]
