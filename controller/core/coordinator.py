"""Phase coordinator: the EnterPhase / ReleasePhase protocol. Pure: takes ``now``, returns
decisions (``lightrail.controller.core.decisions``); the async shell
(``lightrail.controller.runtime.phase_service``) carries them out.

Safety invariant (DESIGN.md): a cross-connect may change only after every rank whose traffic
uses it has released it, and a rank is admitted into a phase only when every cross-connect the
phase needs is confirmed by the switch. Here a rank admitted into a phase *holds every
cross-connect of the phase's plan* (conservative: a ring collective's traffic crosses every hop)
until it releases. A timeout is an explicit ``Reject`` with ``DEADLINE_EXCEEDED``.

Protocol, per phase instance (job, phase key):

1. ``enter`` / ``enter_many``: ranks arrive in batches. An instance takes circuits only once
   every rank of its group has entered it (``scheduling.held_back``: liveness, no rank is ever
   locked out by peers that went ahead into a later phase); then, when the plan's
   cross-connects are confirmed and none of its ports is being switched, its ranks are
   admitted at once (no-op). Otherwise they wait.
2. ``scheduling.schedule`` (after every event): waiting phases, oldest first, start a
   reconfiguration as soon as no cross-connect they must break is held and none of their ports
   is being switched or claimed by an older waiting phase. The reconfiguration is a
   ``Reconfigure`` decision carrying only what changes.
3. ``reconfigured``: on confirmation every waiting rank of the phase is admitted, once its
   whole plan is confirmed (the op changed only what was missing: if a kept cross-connect was
   lost meanwhile, the phase switches again); on failure each gets ``DEVICE_FAILURE`` and the
   switch's view is dropped until it is read back.
4. ``release``: the rank's holds are dropped; the last release lets waiting phases switch, and
   the predicted next phase is provisioned (``provisioning``).

The parts: ``state`` (what the coordinator knows), ``switch_views`` (the switches' confirmed,
held, in-flight and unknown cross-connects), ``scheduling``, ``provisioning`` (learned
schedule, switching ahead), ``rewiring`` (failover onto a spare), ``records`` (state records).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from lightrail.controller.core import rewiring
from lightrail.controller.core.decisions import (
    Admitted,
    AdmittedBatch,
    Advisor,
    Decided,
    Decision,
    Reject,
)
from lightrail.controller.core.planner import JobLayout, PlanError
from lightrail.controller.core.provisioning import Provisioner
from lightrail.controller.core.records import (
    EnterBatch,
    Hint,
    Instance,
    JobRecord,
    JobStats,
    Outage,
    ProvisioningScore,
    RankSlot,
    RankState,
    Recovery,
    waiting_ranks,
)
from lightrail.controller.core.scheduling import (
    blocking_reason,
    claimed_by_older,
    held_back,
    schedule,
)
from lightrail.controller.core.state import CoordinatorState
from lightrail.controller.domain.errors import ErrorCode, ReleaseError, UnknownJob
from lightrail.controller.domain.fabric import Fabric
from lightrail.controller.domain.model import PhaseKey, RankPlacement
from lightrail.drivers.base import CrossConnect


@dataclass(frozen=True, slots=True)
class RefusedRelease:
    """A rank of a ``release_many`` batch that did not hold the phase, and why."""

    rank: int
    error: ReleaseError


def _not_held(rank: int, state: RankState, inst: Instance | None, phase: PhaseKey,
              iteration: int | None) -> ReleaseError:
    """The error for releasing a phase ``rank`` does not hold."""
    return ReleaseError(
        ErrorCode.INVALID_PHASE,
        f"rank {rank} does not hold phase {phase}"
        + (f" of iteration {iteration}" if iteration is not None else "")
        + (f" (it {'waits for' if state is RankState.WAITING else 'holds'} "
           f"{inst.phase} of iteration {inst.iteration})" if inst is not None else ""),
    )


class PhaseCoordinator:
    """The phase protocol over all jobs of one fabric. Not thread-safe; one event loop owns it.

    ``default_timeout_s`` (s) applies when an EnterPhase gives none (``timeout_s`` None).
    ``provisioning``: switch to the predicted next phase on the last release;
    ``learn_iterations`` (>= 1): repeats that make a learned successor a prediction;
    ``advisor``: reconfigure-or-not advice (PCCL), None to always switch.
    Raises ``ValueError`` for ``learn_iterations`` < 1.
    """

    def __init__(
        self,
        fabric: Fabric,
        *,
        default_timeout_s: float = 30.0,
        provisioning: bool = True,
        learn_iterations: int = 2,
        advisor: Advisor | None = None,
        device_wait_s: float = 0.0,
    ) -> None:
        self.fabric = fabric
        self.default_timeout_s = default_timeout_s
        self.provisioning = provisioning
        self.advisor = advisor
        self._s = CoordinatorState(fabric)
        self._s.device_wait_s = device_wait_s
        self._prov = Provisioner(self._s, learn_iterations, advisor)

    # --- jobs -------------------------------------------------------------------------------

    def register_job(
        self,
        job_id: str,
        tenant: str,
        placements: Sequence[RankPlacement],
        declared_phases: Sequence[PhaseKey] = (),
        derive_schedule: Callable[[JobLayout], Sequence[PhaseKey]] | None = None,
    ) -> JobLayout:
        """Add a job. ``derive_schedule`` computes the declared schedule from the job's layout
        (e.g. from its parallelism spec, ``lightrail.controller.core.railplan``) instead of
        ``declared_phases``. Raises ``DuplicateJob``, ``PlacementError`` (naming rank and
        field), ``PlanError`` for a declared phase that cannot be planned, or whatever
        ``derive_schedule`` raises; nothing is stored then."""
        job = self._s.add_job(job_id, tenant, placements, declared_phases, derive_schedule)
        self._prov.declare(job)
        return job.layout

    def unregister_job(self, job_id: str) -> list[Decision]:
        """Remove a job: its waiting ranks get ``CANCELLED``, its holds are dropped.
        Raises ``UnknownJob``."""
        return self._s.remove_job(job_id)

    def _job(self, job_id: str) -> JobRecord:
        job = self._s.jobs.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        return job

    def job(self, job_id: str) -> JobLayout:
        """The layout of a registered job; raises ``UnknownJob``."""
        return self._job(job_id).layout

    def job_ids(self) -> list[str]:
        """Registered job ids, sorted."""
        return sorted(self._s.jobs)

    def tenant(self, job_id: str) -> str:
        """The tenant of a job; raises ``UnknownJob``."""
        return self._job(job_id).tenant

    def steps(self, job_id: str, phase: PhaseKey) -> int:
        """How many sub-phases ``phase`` takes (all-to-all permutations; 1 otherwise), as
        ``Admit.steps`` carries it. Raises ``UnknownJob``."""
        return self._s.steps(self._job(job_id), phase)

    def declared_phases(self, job_id: str) -> tuple[PhaseKey, ...]:
        """The declared schedule of a job (possibly empty); raises ``UnknownJob``."""
        return self._job(job_id).declared

    def stats(self, job_id: str) -> JobStats:
        """Counters of a job; raises ``UnknownJob``."""
        job = self._job(job_id)
        return JobStats(job.admitted, job.admitted_noop, job.reconfigurations,
                        str(job.last_phase) if job.last_phase is not None else "",
                        job.hits, job.late, job.misses, self._prov.learned(job))

    def provisioning_score(self, job_id: str) -> ProvisioningScore:
        """A job's provisioning hits, late and misses (cheaper than ``stats``); raises
        ``UnknownJob``."""
        job = self._job(job_id)
        return ProvisioningScore(job.hits, job.late, job.misses)

    def owner_of_port(self, switch_id: str, port: int) -> str | None:
        """The job whose ranks own ``port`` on ``switch_id``, or None."""
        for job_id, job in self._s.jobs.items():
            if port in job.layout.owned_ports.get(switch_id, frozenset()):
                return job_id
        return None

    # --- failover ---------------------------------------------------------------------------

    def gpus_in_use(self) -> Mapping[tuple[str, int], str]:
        """(host, gpu) -> the job using it."""
        return dict(self._s.gpus)

    def replace_rank(self, job_id: str, rank: int, host: str, gpu: int,
                     now: float) -> list[Decision]:
        """Fail ``rank`` of ``job_id`` over to ``gpu`` of ``host`` (LUMION / Morphlux: rewire a
        spare instead of migrating the job); see ``rewiring.replace_rank``. Waiting ranks get
        ``PLACEMENT_CHANGED``; the last decision is the ``Rewire``. Raises ``UnknownJob``,
        ``FailoverError`` and ``FailoverBusy`` (retry later); nothing changes then."""
        return rewiring.replace_rank(self._s, self._prov, job_id, rank, host, gpu)

    # --- recovery ---------------------------------------------------------------------------

    def mark_recovering(self, job_id: str) -> None:
        """A job recovered from etcd after a restart: until every rank is accounted for -
        resynced by its agent (``synced``) or on a host declared dead (``hosts_dead``) -
        none of its circuits is switched, because ranks whose agents have not reconnected yet
        may still hold them (DESIGN.md, the safety invariant: no timer is a go-ahead).
        Admissions onto circuits that are already there go on. Raises ``UnknownJob``."""
        job = self._job(job_id)
        self._s.recovering[job_id] = Recovery(set(range(len(job.ranks))))

    def unsynced_hosts(self) -> set[str]:
        """The hosts of every rank that keeps a recovered job's circuits frozen."""
        s = self._s
        out: set[str] = set()
        for job_id, rec in s.recovering.items():
            placements = s.jobs[job_id].layout.placements
            out.update(placements[r].host for r in rec.unsynced)
        return out

    def hosts_dead(self, hosts: Iterable[str], now: float) -> list[Decision]:
        """A host-dead verdict (its heartbeat deadline passed, or it never came back after a
        restart): the ranks placed on ``hosts`` will not resync, so they stop keeping any
        recovered job's circuits frozen. Returns what can switch now."""
        dead = set(hosts)
        s = self._s
        ended: list[str] = []
        for job_id, rec in s.recovering.items():
            placements = s.jobs[job_id].layout.placements
            rec.unsynced = {r for r in rec.unsynced if placements[r].host not in dead}
            if not rec.unsynced:
                ended.append(job_id)
        for job_id in ended:
            del s.recovering[job_id]
        return schedule(s, now) if ended else []

    def recovering(self, job_id: str) -> bool:
        """True while ``job_id`` waits for its ranks to resync."""
        return job_id in self._s.recovering

    def synced(self, job_id: str, ranks: Iterable[int], now: float) -> list[Decision]:
        """An agent finished its resync for ``ranks`` of ``job_id``."""
        rec = self._s.recovering.get(job_id)
        if rec is None:
            return []
        rec.unsynced.difference_update(ranks)
        if rec.unsynced:
            return []
        del self._s.recovering[job_id]
        return schedule(self._s, now)

    # --- switch state -----------------------------------------------------------------------

    def set_confirmed(self, switch_id: str, cross_connects: Iterable[CrossConnect]) -> None:
        """Replace the view of ``switch_id`` with what the device reported (read-back); its
        unknown ports are known again."""
        views = self._s.views
        views.replace(switch_id, cross_connects)
        for job in self._s.jobs.values():  # a read-back that lost a held circuit: nobody joins
            for inst in job.instances.values():
                if inst.holders and inst.verified and not views.present(inst.plan):
                    inst.verified = False

    def distrust(self, switch_id: str) -> None:
        """The switch may have changed behind our back (alarm, reboot): every port in its view
        is unknown (nothing admitted or switched there) until ``set_confirmed`` with a
        read-back, and instances held on it take no more joiners without a check (a held
        cross-connect stays in the view, for the hold checks, but its ports are unknown
        too)."""
        s = self._s
        s.views.distrust(switch_id)
        for job in s.jobs.values():
            for inst in [*job.instances.values(), *job.retired]:
                if inst.holders and any(t.switch_id == switch_id for t in inst.plan.targets):
                    inst.verified = False

    def set_maintenance(self, switch_id: str, reason: str | None, now: float) -> list[Decision]:
        """Put ``switch_id`` in maintenance (``reason``: the operator's words) or take it out
        (None). In maintenance no decision changes the switch: a phase that needs a
        cross-connect made or broken there is refused ``SWITCH_MAINTENANCE`` (waiting ones
        now; ``scheduling.maintenance_block``), provisioning skips it, a failover that would
        move circuits there raises ``FailoverError``; phases whose circuits are in place are
        still admitted. A reconfiguration already in flight there completes. Taking it out
        schedules the queue again. Raises ``ValueError`` naming an unknown switch."""
        self._known_switch(switch_id)
        if reason is None:
            if self._s.maintenance.pop(switch_id, None) is None:
                return []
        else:
            self._s.maintenance[switch_id] = reason
        return schedule(self._s, now)

    def _known_switch(self, switch_id: str) -> None:
        if switch_id not in self.fabric.switches:
            raise ValueError(f"switch_id: unknown switch {switch_id!r}")

    def set_unreachable(self, switch_id: str, error: str | None, now: float) -> list[Decision]:
        """Record that the driver of ``switch_id`` cannot reach it (``error``: its last error,
        one line) or reaches it again (None). ``device_wait_s`` after the first report, a
        phase that needs a change or a read-back there is refused ``DEVICE_FAILURE`` naming the
        switch (``scheduling.unreachable_block``; the caller calls ``schedule`` at that time),
        and provisioning leaves it alone; phases on its confirmed circuits still admit. A
        repeated report keeps the first one's time. Raises ``ValueError`` naming an unknown
        switch."""
        self._known_switch(switch_id)
        s = self._s
        if error is None:
            if s.unreachable.pop(switch_id, None) is None:
                return []
        else:
            before = s.unreachable.get(switch_id)
            s.unreachable[switch_id] = Outage(error, now if before is None else before.since_s)
        return schedule(s, now)

    def unknown_ports(self, switch_id: str) -> frozenset[int]:
        """Ports of ``switch_id`` whose state only a read-back can tell (a failed apply, an
        alarm); nothing is admitted or switched there until then."""
        return frozenset(self._s.views.unknown.get(switch_id, ()))

    def unreachable(self) -> Mapping[str, Outage]:
        """Switches their drivers cannot reach: switch id -> the outage."""
        return dict(self._s.unreachable)

    def device_wait_s(self) -> float:
        """How long a phase waits for an unreachable switch before it is refused, s."""
        return self._s.device_wait_s

    def maintenance(self) -> Mapping[str, str]:
        """Switches in maintenance: switch id -> the operator's reason."""
        return dict(self._s.maintenance)

    def switching(self, switch_id: str) -> bool:
        """True while a reconfiguration or rewire is in flight on ``switch_id``."""
        return bool(self._s.views.inflight.get(switch_id))

    def schedule(self, now: float) -> list[Decision]:
        """Re-examine waiting phases (after ``set_confirmed`` made ports known again)."""
        return schedule(self._s, now)

    def confirmed(self, switch_id: str) -> frozenset[CrossConnect]:
        """The cross-connects the coordinator believes are confirmed on ``switch_id``."""
        return self._s.views.cross_connects(switch_id)

    def waiting_request(self, job_id: str, rank: int) -> int | None:
        """The request id ``rank`` waits with, or None when it does not wait."""
        job = self._s.jobs.get(job_id)
        if job is None or not 0 <= rank < len(job.ranks):
            return None
        rs = job.ranks[rank]
        return rs.request_id if rs.state is RankState.WAITING else None

    def held_by_job(self, job_id: str) -> int:
        """How many ranks of ``job_id`` hold a phase now (0 for an unknown job)."""
        job = self._s.jobs.get(job_id)
        if job is None:
            return 0
        return sum(1 for r in job.ranks if r.state is RankState.HOLDING)

    # --- protocol ---------------------------------------------------------------------------

    def enter(
        self,
        job_id: str,
        rank: int,
        phase: PhaseKey,
        request_id: int,
        now: float,
        timeout_s: float | None = None,
        iteration: int = 0,
        nbytes: int = 0,
        compute_gap_s: float = 0.0,
        route: int = 0,
    ) -> list[Decision]:
        """One rank asks to enter ``phase``: ``enter_many`` with one rank."""
        return self.enter_many(job_id, (rank,), phase, request_id, now, timeout_s, iteration,
                               nbytes, compute_gap_s, route)

    def enter_many(
        self,
        job_id: str,
        ranks: Sequence[int],
        phase: PhaseKey,
        request_id: int,
        now: float,
        timeout_s: float | None = None,
        iteration: int = 0,
        nbytes: int = 0,
        compute_gap_s: float = 0.0,
        route: int = 0,
    ) -> list[Decision]:
        """``ranks`` ask together (one batch, one ``request_id``) to enter ``phase`` of training
        step ``iteration``. Returns the decisions this causes: an ``Admitted`` for the batch at
        once, a ``Reject`` per refused rank, or ``Reconfigure`` and later decisions.
        ``timeout_s``: how long the batch waits at most, s (None: the coordinator's
        ``default_timeout_s``). ``nbytes`` and ``compute_gap_s`` are the caller's hints for
        reconfigure-or-not (bytes of the collective, compute time before it, s; 0 = unknown).
        ``route``: the caller's opaque id of where the answers go; decisions carry it back.

        Cost: one plan and instance lookup per batch and a few attribute writes per rank; the
        first batch of an instance pays O(plan) to check the circuits. Fairness: a phase whose
        circuits are there still waits when an older waiting phase claims any of its ports, so
        a repeating phase cannot starve a reconfiguration its peers are blocked on; liveness:
        it takes circuits only once every rank of its group has entered it
        (``scheduling.held_back``), so it never holds circuits a missing rank's earlier phase
        needs."""
        job = self._s.jobs.get(job_id)
        if job is None:
            return [Reject(job_id, r, request_id, ErrorCode.UNKNOWN_JOB,
                           f"job_id: unknown job {job_id!r}", route)
                    for r in dict.fromkeys(ranks)]  # one answer per rank
        out: list[Decision] = []
        fresh = self._entering(job, ranks, phase, iteration, request_id, route, out)
        if not fresh:
            return out
        try:
            inst = self._instance_for(job, phase, iteration, nbytes, compute_gap_s, out)
        except PlanError as exc:
            out.extend(Reject(job_id, r, request_id, ErrorCode.INVALID_PHASE, str(exc), route)
                       for r in fresh)
            return out
        timeout = self.default_timeout_s if timeout_s is None else timeout_s
        batch = EnterBatch(tuple(fresh), request_id, now, now + timeout, route, len(fresh))
        out.extend(self._join_or_wait(job, inst, batch, now))
        return out

    def _entering(
        self, job: JobRecord, ranks: Sequence[int], phase: PhaseKey, iteration: int,
        request_id: int, route: int, out: list[Decision],
    ) -> list[int]:
        """The ranks of a batch that enter now (idle, or re-attaching); refusals go to
        ``out``."""
        slots = job.ranks
        world = len(slots)
        group = phase.group
        idle = RankState.IDLE
        # The usual batch (distinct ranks of the group, in range, all idle), checked with set
        # operations and one comprehension: no per-rank branches.
        if ranks and len(ranks) == len(set(ranks)) and group.includes(ranks) and (
                min(ranks) >= 0 and max(ranks) < world):
            fresh = [r for r in ranks if slots[r].state is idle]
            if len(fresh) == len(ranks):
                return fresh
        job_id = job.layout.job_id
        fresh = []
        ranks, repeated = _without_repeats(ranks)  # one answer per rank: a refusal
        out.extend(Reject(job_id, r, request_id, ErrorCode.INVALID_RANK,
                          f"ranks: rank {r} appears {times} times in the batch", route)
                   for r, times in repeated)
        for r in ranks:
            if not 0 <= r < world:
                out.append(Reject(job_id, r, request_id, ErrorCode.INVALID_RANK,
                                  f"rank: {r} out of range 0..{world - 1}", route))
            elif not group.contains(r):
                out.append(Reject(job_id, r, request_id, ErrorCode.INVALID_PHASE,
                                  f"phase.group_ranks: rank {r} is not in group {group}",
                                  route))
            elif slots[r].state is idle:
                fresh.append(r)
            else:
                self._enter_busy(job, r, phase, iteration, request_id, route, fresh, out)
        return fresh

    def _instance_for(
        self, job: JobRecord, phase: PhaseKey, iteration: int, nbytes: int,
        compute_gap_s: float, out: list[Decision],
    ) -> Instance:
        """The instance of ``phase`` in step ``iteration``, made (planned, learned from,
        advised) on its first batch; a ``Decided`` goes to ``out``. Raises ``PlanError`` when
        the phase cannot be planned."""
        s = self._s
        plan = s.plan(job, phase)
        ikey = (phase, iteration)
        inst = job.instances.get(ikey)
        if inst is not None:
            return inst
        job_id = job.layout.job_id
        inst = Instance(job_id, phase, iteration, plan)
        job.instances[ikey] = inst
        self._prov.observe(job, phase, plan)
        if nbytes > 0:
            job.hints[phase] = Hint(nbytes, compute_gap_s)
        if self.advisor is not None and not s.views.ready(plan):
            advice = self.advisor.advise(job.layout, phase, plan, s.views.confirmed, nbytes,
                                         compute_gap_s)
            if advice is not None:
                out.append(Decided(job_id, phase, advice.decision, False))
                if advice.stay_plan is not None:
                    inst.plan = advice.stay_plan  # run on the circuits there
        return inst

    def _join_or_wait(
        self, job: JobRecord, inst: Instance, batch: EnterBatch, now: float
    ) -> list[Decision]:
        """``batch`` joins ``inst``: admitted at once when nothing stands in the way (no
        reconfiguration, nobody waiting before it, held circuits, or the whole group in and
        ready circuits no older phase claims), else it waits (its deadline armed) and the
        queue is scheduled when that may change something (the batch completed the group)."""
        s = self._s
        slots = job.ranks
        complete_before = not held_back(inst)
        inst.batches.append(batch)
        inst.waiting += batch.waiting
        inst.arrived.update(batch.ranks)
        waiting = RankState.WAITING
        request_id = batch.request_id
        for r in batch.ranks:
            rs = slots[r]
            rs.state = waiting
            rs.instance = inst
            rs.request_id = request_id
            rs.batch = batch
        if inst.op_id is None and inst.waiting == batch.waiting and (
            (inst.holders and inst.verified)
            or (not held_back(inst) and s.views.ready(inst.plan)
                and not claimed_by_older(s, inst.plan))
        ):
            # Held instances cannot change under their holders: join them without a check.
            admitted = s.admit_waiting(job, inst, now, True, 0.0)
            return [] if admitted is None else [admitted]
        s.push_deadline(inst.job_id, batch)
        if inst.queued and (complete_before or held_back(inst)):
            return []  # the instance waits already; more ranks change nothing
        if not inst.queued:
            inst.queued = True
            s.queue.append(inst)
        return schedule(s, now)

    def _enter_busy(
        self, job: JobRecord, rank: int, phase: PhaseKey, iteration: int, request_id: int,
        route: int, fresh: list[int], out: list[Decision],
    ) -> None:
        """``rank`` is not idle: the same phase again (an agent whose stream broke, a client
        retry) re-attaches: a held phase on confirmed circuits is answered at once; one held
        on circuits not confirmed (a ``resume_held`` the switches did not back, or a hold whose
        switch raised an alarm since) is ``RANK_BUSY``: no admission without confirmed
        circuits, not even an answer again; a waiting rank moves to the new batch and route,
        appended to ``fresh``, and the request it waited in is answered ``CANCELLED``
        ("superseded"), on its own route, so that no caller waits for an answer that will
        not come (the same request id on the same route is the same request: no answer).
        Anything else is ``RANK_BUSY``."""
        s = self._s
        rs = job.ranks[rank]
        inst = rs.instance
        if inst is not None and inst.phase == phase and inst.iteration == iteration:
            if rs.state is RankState.HOLDING:
                if not (inst.verified and s.views.ready(inst.plan)):
                    out.append(Reject(job.layout.job_id, rank, request_id,
                                      ErrorCode.RANK_BUSY,
                                      f"rank {rank} holds phase {phase} on circuits not "
                                      "confirmed on the switches; release it first", route))
                    return
                rs.request_id = request_id  # a later cancel of this request may release it
                out.append(Admitted(job.layout.job_id, phase, iteration, True, 0.0, 0.0,
                                    s.steps(job, phase),
                                    (AdmittedBatch(route, request_id, (rank,), 0.0),)))
                return
            old = rs.batch
            s.withdraw(job, rank)
            fresh.append(rank)
            if old is not None and (old.request_id, old.route) != (request_id, route):
                out.append(Reject(job.layout.job_id, rank, old.request_id, ErrorCode.CANCELLED,
                                  f"superseded by request {request_id}: rank {rank} entered "
                                  f"phase {phase} again", old.route))
            return
        held = inst.phase if inst is not None else None
        what = "holds" if rs.state is RankState.HOLDING else "waits for"
        out.append(Reject(job.layout.job_id, rank, request_id, ErrorCode.RANK_BUSY,
                          f"rank {rank} {what} phase {held}; release it first", route))

    def cancel(self, job_id: str, rank: int, request_id: int, now: float) -> list[Decision]:
        """The caller of EnterPhase ``request_id`` went away (cancelled RPC, dead process):
        withdraw the rank's wait, or its hold if that request was already admitted, so no
        ghost holds circuits nobody uses. No-op when the rank has moved on."""
        s = self._s
        job = s.jobs.get(job_id)
        if job is None or not 0 <= rank < len(job.ranks):
            return []
        rs = job.ranks[rank]
        inst = rs.instance
        if inst is None or rs.request_id != request_id:
            return []
        if rs.state is RankState.WAITING:
            s.withdraw(job, rank)
            if not inst.waiting and inst.op_id is None:
                inst.batches.clear()
                s.dequeue(inst)
                s.maybe_drop(job, inst)
            return schedule(s, now)
        if rs.state is RankState.HOLDING:
            return self.release(job_id, rank, inst.phase, now)
        return []

    def waiting(self) -> list[Reject]:
        """Every waiting rank as a ``Reject`` template (job, rank, request id, route; code
        ``CANCELLED``) so the shell can answer them all, e.g. at shutdown."""
        out: list[Reject] = []
        for job_id, job in self._s.jobs.items():
            for inst in job.instances.values():
                for b, ranks in waiting_ranks(inst, job.ranks):
                    out.extend(Reject(job_id, r, b.request_id, ErrorCode.CANCELLED, "", b.route)
                               for r in ranks)
        return out

    def resume_held(
        self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0
    ) -> None:
        """After a controller restart, a rank reports it still holds ``phase``: record its holds
        again. Raises ``ReleaseError`` when the job, rank or phase is not valid."""
        s = self._s
        job = s.jobs.get(job_id)
        if job is None:
            raise ReleaseError(ErrorCode.UNKNOWN_JOB, f"job_id: unknown job {job_id!r}")
        if not 0 <= rank < len(job.ranks):
            raise ReleaseError(ErrorCode.INVALID_RANK, f"rank: {rank} out of range")
        rs = job.ranks[rank]
        if rs.state is RankState.HOLDING and rs.instance is not None \
                and rs.instance.phase == phase and rs.instance.iteration == iteration:
            return
        if rs.state is not RankState.IDLE:
            raise ReleaseError(ErrorCode.RANK_BUSY, f"rank {rank} is not idle")
        if not phase.group.contains(rank):
            raise ReleaseError(ErrorCode.INVALID_PHASE,
                               f"phase.group_ranks: rank {rank} is not in group "
                               f"{phase.group}")
        try:
            plan = s.plan(job, phase)
        except PlanError as exc:
            raise ReleaseError(ErrorCode.INVALID_PHASE, str(exc)) from exc
        ikey = (phase, iteration)
        inst = job.instances.get(ikey)
        if inst is None:
            inst = Instance(job_id, phase, iteration, plan)
            job.instances[ikey] = inst
        if not s.views.ready(plan):
            inst.verified = False  # held, but not on confirmed circuits: nobody joins it
        s.add_holder(inst, rank)
        inst.arrived.add(rank)
        rs.state = RankState.HOLDING
        rs.instance = inst

    def release(
        self, job_id: str, rank: int, phase: PhaseKey, now: float, iteration: int | None = None
    ) -> list[Decision]:
        """A rank leaves ``phase`` (of ``iteration``, when given). Raises ``ReleaseError`` when
        it does not hold it."""
        out, refused = self.release_many(job_id, (rank,), phase, now, iteration)
        if refused:
            raise refused[0].error
        return out

    def release_many(
        self, job_id: str, ranks: Sequence[int], phase: PhaseKey, now: float,
        iteration: int | None = None,
    ) -> tuple[list[Decision], list[RefusedRelease]]:
        """``ranks`` leave ``phase`` (of ``iteration``, when given) together. Returns the
        decisions this causes (the last holder's release lets waiting phases switch and the
        predicted next phase be provisioned: once per batch) and a ``RefusedRelease`` for each
        rank that does not hold the phase (the others are released)."""
        s = self._s
        job = s.jobs.get(job_id)
        if job is None:
            err = ReleaseError(ErrorCode.UNKNOWN_JOB, f"job_id: unknown job {job_id!r}")
            return [], [RefusedRelease(r, err) for r in dict.fromkeys(ranks)]
        slots = job.ranks
        world = len(slots)
        refused: list[RefusedRelease] = []
        freed: list[Instance] = []
        last: Instance | None = None
        idle = RankState.IDLE
        holding = RankState.HOLDING
        fast = _holders_of_one_instance(slots, ranks, phase, iteration)
        if fast is not None:
            # The usual batch: distinct ranks that all hold one instance of ``phase`` (a rank
            # is among an instance's holders only while it is HOLDING that instance), checked
            # with set operations: two attribute writes per rank, no per-rank branches.
            for r in ranks:
                rs = slots[r]
                rs.state = idle
                rs.instance = None
            fast.holders.difference_update(ranks)
            if not fast.holders:
                freed.append(fast)
            ranks = ()
        # repeated ranks are refused once each, and not released (the fast path had none)
        ranks, repeated = _without_repeats(ranks)
        refused.extend(RefusedRelease(r, ReleaseError(
            ErrorCode.INVALID_RANK, f"ranks: rank {r} appears {times} times in the batch"))
            for r, times in repeated)
        for r in ranks:
            if not 0 <= r < world:
                refused.append(RefusedRelease(r, ReleaseError(
                    ErrorCode.INVALID_RANK, f"rank: {r} out of range 0..{world - 1}")))
                continue
            rs = slots[r]
            inst = rs.instance
            if rs.state is not holding or inst is None or (inst is not last and (
                    inst.phase != phase
                    or (iteration is not None and inst.iteration != iteration))):
                refused.append(RefusedRelease(r, _not_held(r, rs.state, inst, phase,
                                                            iteration)))
                continue
            last = inst
            rs.state = idle
            rs.instance = None
            holders = inst.holders
            holders.discard(r)
            if not holders:
                freed.append(inst)
        out: list[Decision] = []
        if not freed:
            return out, refused  # others still hold the phase: nothing was freed
        for inst in freed:
            s.views.unhold(inst.plan)
            s.maybe_drop(job, inst)
        out.extend(schedule(s, now))
        if self.provisioning:
            for nxt in self._prov.predicted_after(job, phase):
                out.extend(self._prov.provision(job, nxt))
        return out, refused

    def reconfigured(
        self,
        op_id: int,
        now: float,
        error: str | None = None,
        device_s: float = 0.0,
        failed_switches: Iterable[str] = (),
        code: ErrorCode = ErrorCode.DEVICE_FAILURE,
    ) -> list[Decision]:
        """The shell reports that reconfiguration ``op_id`` was confirmed by every switch
        (``error`` None) or failed (``error`` says why; ``failed_switches`` which switches
        failed, default all of the op's). On failure the waiting ranks get ``code``
        (``DEVICE_FAILURE``, or ``NOT_LEADER`` when this replica lost its lease and sent
        nothing: the ranks retry at the new leader);
        switches that confirmed keep their new state; the ports of failed switches are unknown
        (nothing is admitted or switched there) until ``set_confirmed`` after a read-back."""
        s = self._s
        op = s.ops.pop(op_id, None)
        if op is None:
            return []
        s.views.end(op.ports)
        failed = set(failed_switches) if error is not None else set()
        if error is not None and not failed:
            failed = set(op.ports)
        for target in op.plan.targets:
            sid = target.switch_id
            if sid in failed:
                s.views.forget(sid, op.ports[sid])
            else:
                s.views.apply(target, op.ports[sid])
        inst = op.instance
        if inst is None:
            return self._prov.finished(op, now, error, device_s)
        inst.op_id = None
        job = s.jobs.get(inst.job_id)
        if job is not op.job:
            job = None  # unregistered (maybe registered again) while the op was in flight
        if job is None:
            inst.batches.clear()
            inst.waiting = 0
            s.dequeue(inst)
            return schedule(s, now, device_s if error is None else None)
        return self._instance_switched(job, inst, now, error, device_s, code)

    def _instance_switched(self, job: JobRecord, inst: Instance, now: float,
                           error: str | None, device_s: float,
                           code: ErrorCode = ErrorCode.DEVICE_FAILURE) -> list[Decision]:
        """``inst``'s reconfiguration ended: its waiting ranks are admitted (confirmed and the
        whole plan there), refused (``DEVICE_FAILURE``), or, when what the plan keeps was
        broken meanwhile (the op changed only what was missing; an alarm or a read-back took
        the rest), left waiting for the queue to switch again."""
        s = self._s
        out: list[Decision] = []
        if error is None:
            job.reconfigurations += 1
            if inst.waiting and not s.views.ready(inst.plan):
                return schedule(s, now)
            inst.verified = True
            admitted = s.admit_waiting(job, inst, now, False, device_s)
            if admitted is not None:
                out.append(admitted)
        else:
            out.extend(s.refuse_waiting(
                job, inst, code, f"reconfiguration for phase {inst.phase} failed: {error}"))
        inst.batches.clear()
        inst.waiting = 0
        s.dequeue(inst)
        s.maybe_drop(job, inst)
        out.extend(schedule(s, now, device_s if error is None else None))
        return out

    def next_deadline(self) -> float | None:
        """The earliest deadline of a waiting rank, or None."""
        s = self._s
        while s.deadlines:
            first = s.deadlines[0][2]
            if s.waiter_live(first):
                return first.at_s
            heapq.heappop(s.deadlines)
        return None

    def expire(self, now: float) -> list[Decision]:
        """Refuse every waiting rank whose deadline has passed with ``DEADLINE_EXCEEDED``;
        the message says what the phase was waiting for."""
        s = self._s
        out: list[Decision] = []
        while s.deadlines and s.deadlines[0][0] <= now:
            d = heapq.heappop(s.deadlines)[2]
            if not s.waiter_live(d):
                continue
            job = s.jobs[d.job_id]
            b = d.batch
            inst = next((job.ranks[r].instance for r in b.ranks
                         if job.ranks[r].batch is b), None)
            assert inst is not None
            reason = blocking_reason(s, inst)
            out.extend(s.refuse_waiting(
                job, inst, ErrorCode.DEADLINE_EXCEEDED,
                f"circuits for phase {inst.phase} not confirmed within "
                f"{b.deadline_s - b.arrived_s:.3f} s: {reason}", b))
            if not inst.waiting and inst.op_id is None:
                s.dequeue(inst)
                s.maybe_drop(job, inst)
        if out:
            out.extend(schedule(s, now))
        return out


def _without_repeats(
    ranks: Sequence[int],
) -> tuple[Sequence[int], list[tuple[int, int]]]:
    """``ranks`` less those that appear in it more than once, and those as (rank, times), in
    the order they first appear: a malformed batch whose repeated ranks are refused once each,
    whole, so that no rank gets two answers to one request."""
    if len(ranks) == len(set(ranks)):
        return ranks, []
    times = Counter(ranks)
    return [r for r in ranks if times[r] == 1], [(r, k) for r, k in times.items() if k > 1]


def _holders_of_one_instance(
    slots: Sequence[RankSlot], ranks: Sequence[int], phase: PhaseKey, iteration: int | None,
) -> Instance | None:
    """The instance every one of ``ranks`` holds, when they are distinct and all hold the same
    instance of ``phase`` (of ``iteration``, when given); None otherwise (the caller then
    checks rank by rank). Relies on the holders invariant: a rank is in ``Instance.holders``
    only while its slot is HOLDING that instance."""
    if not ranks:
        return None
    first = ranks[0]
    if not 0 <= first < len(slots):
        return None
    inst = slots[first].instance
    if inst is None or not (inst.phase is phase or inst.phase == phase) or (
            iteration is not None and inst.iteration != iteration):
        return None
    members = set(ranks)
    if len(members) != len(ranks) or not members <= inst.holders:
        return None
    return inst
