"""Phase coordinator: the EnterPhase / ReleasePhase protocol. Pure: takes ``now``, returns
decisions; the async shell (``lightrail.controller.runtime.phase_service``) carries them out.

Safety invariant (DESIGN.md): a cross-connect may change only after every rank whose traffic
uses it has released it, and a rank is admitted into a phase only when every cross-connect the
phase needs is confirmed by the switch. Here a rank admitted into a phase *holds every
cross-connect of the phase's plan* (conservative: a ring collective's traffic crosses every hop)
until it releases. A timeout is an explicit ``Reject`` with ``DEADLINE_EXCEEDED``.

Protocol, per phase instance (job, phase key):

1. ``enter``: when the plan's cross-connects are confirmed and none of its ports is being
   switched, the rank is admitted at once (no-op). Otherwise it waits.
2. ``_schedule`` (after every event): waiting phases, oldest first, start a reconfiguration as
   soon as no cross-connect they must break is held and none of their ports is being switched
   or claimed by an older waiting phase. The reconfiguration is a ``Reconfigure`` decision.
3. ``reconfigured``: on confirmation every waiting rank of the phase is admitted; on failure
   each gets ``DEVICE_FAILURE`` and the switch's view is dropped until it is read back.
4. ``release``: the rank's holds are dropped; the last release lets waiting phases switch.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from lightrail.controller.core.advisor import Advice
from lightrail.controller.core.decision import ReconfigureDecision
from lightrail.controller.core.planner import (
    JobLayout,
    Plan,
    PlanError,
    SwitchTarget,
    all_to_all_steps,
    layout_job,
    plan_phase,
)
from lightrail.controller.domain.errors import (
    DuplicateJob,
    ErrorCode,
    FailoverBusy,
    FailoverError,
    ReleaseError,
    UnknownJob,
)
from lightrail.controller.domain.fabric import Fabric
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.drivers.base import CrossConnect


class Advisor(Protocol):
    """Reconfigure-or-not advice (``lightrail.controller.core.advisor.CostAdvisor``)."""

    def advise(
        self,
        layout: JobLayout,
        phase: PhaseKey,
        plan: Plan,
        confirmed: Mapping[str, Mapping[int, CrossConnect]],
        nbytes: int,
        compute_gap_s: float,
    ) -> Advice | None: ...


@dataclass(frozen=True, slots=True)
class Admit:
    """Admit ``rank`` into ``phase``. ``noop``: the circuits were already there.
    ``waited_s``: from the rank's enter to this decision, in seconds; ``device_s``: how long the
    switches took to confirm the reconfiguration that admitted it (0 for a no-op)."""

    job_id: str
    rank: int
    request_id: int
    phase: PhaseKey
    noop: bool
    waited_s: float
    device_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Reject:
    """Refuse an EnterPhase with an explicit reason."""

    job_id: str
    rank: int
    request_id: int
    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class Reconfigure:
    """Make the switches match ``targets``: on each ``SwitchTarget.ports`` exactly
    ``SwitchTarget.cross_connects``. Report back with ``PhaseCoordinator.reconfigured(op_id)``."""

    op_id: int
    job_id: str
    phase: PhaseKey
    targets: tuple[SwitchTarget, ...]
    provisioning: bool = False
    """True when no rank asked yet: the schedule predicts ``phase`` comes next (Opus)."""


@dataclass(frozen=True, slots=True)
class Decided:
    """A reconfigure-or-not decision for ``phase`` and the numbers behind it (PCCL). When
    ``provisioning``, it was taken ahead of the phase, on last iteration's hints."""

    job_id: str
    phase: PhaseKey
    decision: ReconfigureDecision
    provisioning: bool


@dataclass(frozen=True, slots=True)
class Rewire:
    """Failover: move a failed endpoint's cross-connects to a spare's ports (``targets`` as in
    ``Reconfigure``). Report back with ``PhaseCoordinator.reconfigured(op_id)``."""

    op_id: int
    job_id: str
    rank: int
    old: RankPlacement
    new: RankPlacement
    targets: tuple[SwitchTarget, ...]


Decision = Admit | Reject | Reconfigure | Decided | Rewire


class _RankState(enum.Enum):
    IDLE = 0
    WAITING = 1
    HOLDING = 2


@dataclass(slots=True)
class _Waiter:
    rank: int
    request_id: int
    arrived_s: float
    deadline_s: float


@dataclass(slots=True, eq=False)
class _Instance:
    job_id: str
    phase: PhaseKey
    iteration: int
    plan: Plan
    waiters: dict[int, _Waiter] = field(default_factory=dict)
    holders: set[int] = field(default_factory=set)
    op_id: int | None = None
    queued: bool = False
    verified: bool = True
    """False for an instance re-created from holds reported after a restart whose circuits
    were not found on the switches: nobody joins it without a switch first."""


@dataclass(slots=True, eq=False)
class _Rank:
    state: _RankState = _RankState.IDLE
    instance: _Instance | None = None
    request_id: int = 0


@dataclass(frozen=True, slots=True)
class JobStats:
    """Counters of one job, for OperatorService and the replay summary."""

    admitted: int
    admitted_noop: int
    reconfigurations: int
    current_phase: str
    provisioning_hits: int = 0
    """Phases whose circuits were switched ahead of time and ready when the first rank came."""
    provisioning_late: int = 0
    """Phases predicted but not ready when the first rank came: still switching, or their
    predecessor was still held (no compute gap to hide the switch in)."""
    provisioning_misses: int = 0
    """Phases that needed a switch on demand (no or a wrong prediction)."""
    schedule_learned: bool = False

    @property
    def hit_rate(self) -> float:
        """Hits over phases that needed new circuits (0 when none did)."""
        n = self.provisioning_hits + self.provisioning_late + self.provisioning_misses
        return self.provisioning_hits / n if n else 0.0


@dataclass(frozen=True, slots=True)
class _Hint:
    nbytes: int
    compute_gap_s: float


@dataclass(slots=True)
class _Successor:
    """What came next on a phase's ports: ``phase`` seen ``streak`` times in a row."""

    phase: PhaseKey
    streak: int
    declared: bool = False


@dataclass(slots=True, eq=False)
class _Job:
    layout: JobLayout  # replaced on failover
    tenant: str
    declared: tuple[PhaseKey, ...]
    ranks: list[_Rank]
    plans: dict[tuple[ProcessGroup, Collective, int], Plan] = field(default_factory=dict)
    instances: dict[tuple[PhaseKey, int], _Instance] = field(default_factory=dict)
    admitted: int = 0
    admitted_noop: int = 0
    reconfigurations: int = 0
    last_phase: PhaseKey | None = None
    successors: dict[PhaseKey, _Successor] = field(default_factory=dict)
    steps: dict[ProcessGroup, int] = field(default_factory=dict)
    hints: dict[PhaseKey, _Hint] = field(default_factory=dict)
    last_on_port: dict[tuple[str, int], PhaseKey] = field(default_factory=dict)
    provisioned: dict[PhaseKey, int] = field(default_factory=dict)
    hits: int = 0
    late: int = 0
    misses: int = 0


@dataclass(slots=True)
class _Recovery:
    until_s: float
    unsynced: set[int]


@dataclass(slots=True)
class _Op:
    instance: _Instance | None  # None: provisioning ahead of the phase, or a failover rewire
    job: _Job
    job_id: str
    phase: PhaseKey | None  # None: a failover rewire
    plan: Plan
    ports: dict[str, frozenset[int]]


class PhaseCoordinator:
    """The phase protocol over all jobs of one fabric. Not thread-safe; one event loop owns it.

    ``default_timeout_s`` applies when an EnterPhase gives none (``timeout_s <= 0``).
    """

    def __init__(
        self,
        fabric: Fabric,
        *,
        default_timeout_s: float = 30.0,
        provisioning: bool = True,
        learn_iterations: int = 2,
        advisor: Advisor | None = None,
    ) -> None:
        if learn_iterations < 1:
            raise ValueError(f"learn_iterations: must be >= 1, got {learn_iterations}")
        self.fabric = fabric
        self.default_timeout_s = default_timeout_s
        self.provisioning = provisioning
        self.learn_iterations = learn_iterations
        self.advisor = advisor
        self._jobs: dict[str, _Job] = {}
        self._gpus: dict[tuple[str, int], str] = {}
        self._confirmed: dict[str, dict[int, CrossConnect]] = {s: {} for s in fabric.switches}
        self._held: dict[tuple[str, CrossConnect], int] = {}
        self._inflight: dict[str, set[int]] = {s: set() for s in fabric.switches}
        # Ports whose state is unknown after a failed apply, until the switch is read back:
        # nothing is admitted onto them and nothing is switched on them.
        self._unknown: dict[str, set[int]] = {s: set() for s in fabric.switches}
        self._queue: list[_Instance] = []
        self._ops: dict[int, _Op] = {}
        self._next_op = 1
        self._deadlines: list[tuple[float, int, str, int, int]] = []
        self._deadline_seq = 0
        self._recovering: dict[str, _Recovery] = {}

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
        if not job_id:
            raise ValueError("job_id: empty")
        if job_id in self._jobs:
            raise DuplicateJob(f"job_id: {job_id!r} is registered already")
        layout = layout_job(self.fabric, job_id, placements, self._gpus)
        if derive_schedule is not None:
            declared_phases = tuple(derive_schedule(layout))
        job = _Job(
            layout=layout,
            tenant=tenant,
            declared=tuple(declared_phases),
            ranks=[_Rank() for _ in range(layout.world_size)],
        )
        for i, ph in enumerate(job.declared):
            try:
                self._plan(job, ph)
            except PlanError as exc:
                raise PlanError(f"declared_phases[{i}]: {exc}") from exc
        k = len(job.declared)
        for i, ph in enumerate(job.declared):
            job.successors[ph] = _Successor(job.declared[(i + 1) % k], self.learn_iterations,
                                            declared=True)
        self._jobs[job_id] = job
        for p in layout.placements:
            self._gpus[(p.host, p.gpu)] = job_id
        return layout

    def unregister_job(self, job_id: str) -> list[Decision]:
        """Remove a job: its waiting ranks get ``CANCELLED``, its holds are dropped.
        Raises ``UnknownJob``."""
        job = self._jobs.pop(job_id, None)
        if job is None:
            raise UnknownJob(job_id)
        out: list[Decision] = []
        for inst in job.instances.values():
            for w in inst.waiters.values():
                out.append(
                    Reject(job_id, w.rank, w.request_id, ErrorCode.CANCELLED, "job unregistered")
                )
            inst.waiters.clear()
            if inst.holders:
                self._unhold(inst.plan)
            inst.holders.clear()
        self._queue = [i for i in self._queue if i.job_id != job_id]
        self._recovering.pop(job_id, None)
        for p in job.layout.placements:
            self._gpus.pop((p.host, p.gpu), None)
        return out

    def job(self, job_id: str) -> JobLayout:
        """The layout of a registered job; raises ``UnknownJob``."""
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        return job.layout

    def job_ids(self) -> list[str]:
        """Registered job ids, sorted."""
        return sorted(self._jobs)

    def tenant(self, job_id: str) -> str:
        """The tenant of a job; raises ``UnknownJob``."""
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        return job.tenant

    def steps(self, job_id: str, phase: PhaseKey) -> int:
        """How many sub-phases ``phase`` takes (all-to-all permutations; 1 otherwise).
        Raises ``UnknownJob``."""
        if phase.collective is not Collective.ALL_TO_ALL:
            return 1
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        steps = job.steps.get(phase.group)
        if steps is None:
            steps = all_to_all_steps(job.layout, phase.group)
            job.steps[phase.group] = steps
        return steps

    def declared_phases(self, job_id: str) -> tuple[PhaseKey, ...]:
        """The declared schedule of a job (possibly empty); raises ``UnknownJob``."""
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        return job.declared

    def stats(self, job_id: str) -> JobStats:
        """Counters of a job; raises ``UnknownJob``."""
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        learned = any(s.streak >= self.learn_iterations for s in job.successors.values())
        return JobStats(job.admitted, job.admitted_noop, job.reconfigurations,
                        str(job.last_phase) if job.last_phase is not None else "",
                        job.hits, job.late, job.misses, learned)

    def owner_of_port(self, switch_id: str, port: int) -> str | None:
        """The job whose ranks own ``port`` on ``switch_id``, or None."""
        for job_id, job in self._jobs.items():
            if port in job.layout.owned_ports.get(switch_id, frozenset()):
                return job_id
        return None

    # --- failover ---------------------------------------------------------------------------

    def gpus_in_use(self) -> Mapping[tuple[str, int], str]:
        """(host, gpu) -> the job using it."""
        return dict(self._gpus)

    def replace_rank(self, job_id: str, rank: int, host: str, gpu: int,
                     now: float) -> list[Decision]:
        """Fail ``rank`` of ``job_id`` over to ``gpu`` of ``host`` (LUMION / Morphlux: rewire a
        spare instead of migrating the job).

        The job restarts from its checkpoint, so its collectives in flight are void: every
        waiting rank gets ``PLACEMENT_CHANGED`` and every hold of the job is dropped (the
        failed rank cannot release, and its peers abandon the collective). Then the failed
        endpoint's cross-connects are moved to the spare's ports in one ``Rewire`` (breaking
        only cross-connects on ports of this job and the spare, never another job's), and the
        placement is updated. Raises ``UnknownJob`` and ``FailoverError`` (rank out of range,
        the GPU unknown, in use, or not wired to the same switch as the failed one).
        """
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        layout = job.layout
        if not 0 <= rank < layout.world_size:
            raise FailoverError(f"rank: {rank} out of range 0..{layout.world_size - 1}")
        if not self.fabric.has_gpu(host, gpu):
            raise FailoverError(f"spare: {host}/gpu{gpu} is not a wired GPU")
        user = self._gpus.get((host, gpu))
        if user is not None:
            raise FailoverError(f"spare: {host}/gpu{gpu} is used by job {user!r}")
        old_ep = layout.endpoints[rank]
        new_ep = self.fabric.endpoint_of_gpu(host, gpu)
        if new_ep.switch_id != old_ep.switch_id:
            raise FailoverError(
                f"spare: {host}/gpu{gpu} is wired to {new_ep.switch_id!r}, the failed "
                f"{old_ep.endpoint_id} to {old_ep.switch_id!r}: its circuits cannot move there")
        # The failed endpoint's cross-connects, moved to the spare's ports (computed first:
        # nothing changes if the ports are busy).
        sid = old_ep.switch_id
        view = self._confirmed[sid]
        old_ports = {old_ep.tx_port, old_ep.rx_port}
        new_of = {old_ep.tx_port: new_ep.tx_port, old_ep.rx_port: new_ep.rx_port}
        moved: set[CrossConnect] = set()
        touched: set[int] = set(old_ports) | {new_ep.tx_port, new_ep.rx_port}
        for p in old_ports:
            xc = view.get(p)
            if xc is None:
                continue
            a, b = new_of.get(xc.ingress, xc.ingress), new_of.get(xc.egress, xc.egress)
            if a > b and self.fabric.switches[sid].capabilities.kind.value == "duplex":
                a, b = b, a
            moved.add(CrossConnect(a, b))
            touched.update(xc.ports())
        for p in (new_ep.tx_port, new_ep.rx_port):
            stale = view.get(p)
            if stale is not None:
                if self._held.get((sid, stale)):
                    raise FailoverError(f"spare: port {sid}:{p} carries a held cross-connect")
                touched.update(stale.ports())
        if self._blocked(sid, frozenset(touched)):
            raise FailoverBusy(f"switch {sid!r}: ports {sorted(touched)} of the failed or the "
                               "spare endpoint are being switched; retry when that completes")
        out: list[Decision] = []
        # 1. the job restarts: every waiting rank is told at once; the failed rank's holds go
        # (it cannot release). Live ranks keep their holds until they release: their traffic may
        # still be in flight, so nothing they hold changes except the cross-connects to or from
        # the failed endpoint, which carry no live traffic any more.
        for inst in job.instances.values():
            for w in inst.waiters.values():
                out.append(Reject(job_id, w.rank, w.request_id, ErrorCode.PLACEMENT_CHANGED,
                                  f"rank {rank} failed over from {old_ep.endpoint_id} to "
                                  f"{new_ep.endpoint_id}; restart from the last checkpoint"))
                job.ranks[w.rank].state = _RankState.IDLE
                job.ranks[w.rank].instance = None
            inst.waiters.clear()
            if rank in inst.holders:
                self._remove_holder(inst, rank)
        self._queue = [i for i in self._queue if i.job_id != job_id]
        for inst in job.instances.values():
            inst.queued = False
        job.instances = {k: i for k, i in job.instances.items()
                         if i.op_id is not None or i.holders}
        job.ranks[rank].state = _RankState.IDLE
        job.ranks[rank].instance = None
        # 2. the new placement
        old_p = layout.placements[rank]
        new_p = RankPlacement(rank, host, gpu)
        placements = list(layout.placements)
        placements[rank] = new_p
        del self._gpus[(old_p.host, old_p.gpu)]
        job.layout = layout_job(self.fabric, job_id, placements, self._gpus)
        self._gpus[(host, gpu)] = job_id
        job.plans.clear()
        job.steps.clear()
        job.successors = {p: s for p, s in job.successors.items() if s.declared}
        job.last_on_port.clear()
        job.provisioned.clear()
        op_id = self._next_op
        self._next_op += 1
        target = SwitchTarget(sid, frozenset(moved), frozenset(touched))
        plan = Plan((target,))
        self._ops[op_id] = _Op(None, job, job_id, None, plan, {sid: target.ports})
        self._inflight[sid].update(target.ports)
        out.append(Rewire(op_id, job_id, rank, old_p, new_p, (target,)))
        return out

    # --- recovery ---------------------------------------------------------------------------

    def mark_recovering(self, job_id: str, until_s: float) -> None:
        """A job recovered from etcd after a restart: until every rank is accounted for
        (``synced``) or ``until_s`` passes, none of its circuits is switched, because ranks
        whose agents have not reconnected yet may still hold them. Admissions onto circuits
        that are already there go on. Raises ``UnknownJob``."""
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        self._recovering[job_id] = _Recovery(until_s, set(range(len(job.ranks))))

    def recovering(self, job_id: str) -> bool:
        """True while ``job_id`` waits for its ranks to resync."""
        return job_id in self._recovering

    def synced(self, job_id: str, ranks: Iterable[int], now: float) -> list[Decision]:
        """An agent finished its resync for ``ranks`` of ``job_id``."""
        rec = self._recovering.get(job_id)
        if rec is None:
            return []
        rec.unsynced.difference_update(ranks)
        if rec.unsynced:
            return []
        del self._recovering[job_id]
        return self._schedule(now)

    # --- switch state -----------------------------------------------------------------------

    def set_confirmed(self, switch_id: str, cross_connects: Iterable[CrossConnect]) -> None:
        """Replace the view of ``switch_id`` with what the device reported (read-back); its
        unknown ports are known again."""
        view: dict[int, CrossConnect] = {}
        for xc in cross_connects:
            view[xc.ingress] = xc
            view[xc.egress] = xc
        self._confirmed[switch_id] = view
        self._unknown[switch_id] = set()
        for job in self._jobs.values():  # a read-back that lost a held circuit: nobody joins
            for inst in job.instances.values():
                if inst.holders and inst.verified and not self._present(inst.plan):
                    inst.verified = False

    def distrust(self, switch_id: str) -> None:
        """The switch may have changed behind our back (alarm, reboot): its ports are unknown
        (nothing admitted or switched there) until ``set_confirmed`` with a read-back. Held
        cross-connects stay visible to the hold checks."""
        self._forget(switch_id, list(self._confirmed[switch_id]))

    def schedule(self, now: float) -> list[Decision]:
        """Re-examine waiting phases (after ``set_confirmed`` made ports known again)."""
        return self._schedule(now)

    def confirmed(self, switch_id: str) -> frozenset[CrossConnect]:
        """The cross-connects the coordinator believes are confirmed on ``switch_id``."""
        return frozenset(self._confirmed.get(switch_id, {}).values())

    def waiting_request(self, job_id: str, rank: int) -> int | None:
        """The request id ``rank`` waits with, or None when it does not wait."""
        job = self._jobs.get(job_id)
        if job is None or not 0 <= rank < len(job.ranks):
            return None
        rs = job.ranks[rank]
        return rs.request_id if rs.state is _RankState.WAITING else None

    def held_by_job(self, job_id: str) -> int:
        """How many ranks of ``job_id`` hold a phase now (0 for an unknown job)."""
        job = self._jobs.get(job_id)
        if job is None:
            return 0
        return sum(1 for r in job.ranks if r.state is _RankState.HOLDING)

    # --- protocol ---------------------------------------------------------------------------

    def enter(
        self,
        job_id: str,
        rank: int,
        phase: PhaseKey,
        request_id: int,
        now: float,
        timeout_s: float = 0.0,
        iteration: int = 0,
        nbytes: int = 0,
        compute_gap_s: float = 0.0,
    ) -> list[Decision]:
        """A rank asks to enter ``phase`` of training step ``iteration``. Returns the decisions
        this causes (an ``Admit`` or ``Reject`` for this rank at once, or ``Reconfigure`` and
        later decisions). ``nbytes`` and ``compute_gap_s`` are the caller's hints for
        reconfigure-or-not (bytes of the collective, compute time before it, s; 0 = unknown).

        Cost: O(1) for every rank after the first of a phase instance; the first pays O(plan)
        to check the circuits. Fairness: a phase whose circuits are there still waits when an
        older waiting phase claims any of its ports, so a repeating phase cannot starve a
        reconfiguration its peers are blocked on."""
        job = self._jobs.get(job_id)
        if job is None:
            return [Reject(job_id, rank, request_id, ErrorCode.UNKNOWN_JOB,
                           f"job_id: unknown job {job_id!r}")]
        if not 0 <= rank < len(job.ranks):
            return [Reject(job_id, rank, request_id, ErrorCode.INVALID_RANK,
                           f"rank: {rank} out of range 0..{len(job.ranks) - 1}")]
        if not phase.group.contains(rank):
            return [Reject(job_id, rank, request_id, ErrorCode.INVALID_PHASE,
                           f"phase.group_ranks: rank {rank} is not in group {phase.group.ranks}")]
        rs = job.ranks[rank]
        if rs.state is not _RankState.IDLE and rs.instance is not None \
                and rs.instance.phase == phase and rs.instance.iteration == iteration:
            # The same request again, after the agent's stream broke: re-attach, never twice.
            if rs.state is _RankState.HOLDING:
                rs.request_id = request_id  # a later cancel of this request may release it
                return [Admit(job_id, rank, request_id, phase, True, 0.0)]
            w0 = rs.instance.waiters[rank]
            w0.request_id = request_id
            rs.request_id = request_id
            self._deadline_seq += 1
            heapq.heappush(self._deadlines, (w0.deadline_s, self._deadline_seq, job_id, rank,
                                             request_id))
            return []
        if rs.state is not _RankState.IDLE:
            held = rs.instance.phase if rs.instance is not None else None
            what = "holds" if rs.state is _RankState.HOLDING else "waits for"
            return [Reject(job_id, rank, request_id, ErrorCode.RANK_BUSY,
                           f"rank {rank} {what} phase {held}; release it first")]
        try:
            plan = self._plan(job, phase)
        except PlanError as exc:
            return [Reject(job_id, rank, request_id, ErrorCode.INVALID_PHASE, str(exc))]
        ikey = (phase, iteration)
        inst = job.instances.get(ikey)
        out: list[Decision] = []
        if inst is None:
            inst = _Instance(job_id, phase, iteration, plan)
            job.instances[ikey] = inst
            self._observe(job, phase, plan)
            if nbytes > 0:
                job.hints[phase] = _Hint(nbytes, compute_gap_s)
            if self.advisor is not None and not self._ready(plan):
                advice = self.advisor.advise(job.layout, phase, plan, self._confirmed, nbytes,
                                             compute_gap_s)
                if advice is not None:
                    out.append(Decided(job_id, phase, advice.decision, False))
                    if advice.stay_plan is not None:
                        inst.plan = plan = advice.stay_plan  # run on the circuits there
        if inst.op_id is None and not inst.waiters and (
            (inst.holders and inst.verified)
            or (self._ready(plan) and not self._claimed_by_older(plan))
        ):
            # Held instances cannot change under their holders: join them without a check.
            self._admit_rank(job, rs, rank, inst)
            rs.request_id = request_id
            job.admitted_noop += 1
            out.append(Admit(job_id, rank, request_id, phase, True, 0.0))
            return out
        timeout = timeout_s if timeout_s > 0 else self.default_timeout_s
        w = _Waiter(rank, request_id, now, now + timeout)
        inst.waiters[rank] = w
        rs.state = _RankState.WAITING
        rs.instance = inst
        rs.request_id = request_id
        self._deadline_seq += 1
        heapq.heappush(self._deadlines, (w.deadline_s, self._deadline_seq, job_id, rank,
                                         request_id))
        if inst.queued:
            return out  # the instance waits already; one more rank changes nothing
        inst.queued = True
        self._queue.append(inst)
        out.extend(self._schedule(now))
        return out

    def cancel(self, job_id: str, rank: int, request_id: int, now: float) -> list[Decision]:
        """The caller of EnterPhase ``request_id`` went away (cancelled RPC, dead process):
        withdraw the rank's wait, or its hold if that request was already admitted, so no
        ghost holds circuits nobody uses. No-op when the rank has moved on."""
        job = self._jobs.get(job_id)
        if job is None or not 0 <= rank < len(job.ranks):
            return []
        rs = job.ranks[rank]
        inst = rs.instance
        if inst is None or rs.request_id != request_id:
            return []
        if rs.state is _RankState.WAITING:
            inst.waiters.pop(rank, None)
            rs.state = _RankState.IDLE
            rs.instance = None
            if not inst.waiters and inst.op_id is None:
                self._dequeue(inst)
                self._maybe_drop(job, inst)
            return self._schedule(now)
        if rs.state is _RankState.HOLDING:
            return self.release(job_id, rank, inst.phase, now)
        return []

    def resume_held(
        self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0
    ) -> None:
        """After a controller restart, a rank reports it still holds ``phase``: record its holds
        again. Raises ``ReleaseError`` when the job, rank or phase is not valid."""
        job = self._jobs.get(job_id)
        if job is None:
            raise ReleaseError(ErrorCode.UNKNOWN_JOB, f"job_id: unknown job {job_id!r}")
        if not 0 <= rank < len(job.ranks):
            raise ReleaseError(ErrorCode.INVALID_RANK, f"rank: {rank} out of range")
        rs = job.ranks[rank]
        if rs.state is _RankState.HOLDING and rs.instance is not None \
                and rs.instance.phase == phase and rs.instance.iteration == iteration:
            return
        if rs.state is not _RankState.IDLE:
            raise ReleaseError(ErrorCode.RANK_BUSY, f"rank {rank} is not idle")
        if not phase.group.contains(rank):
            raise ReleaseError(ErrorCode.INVALID_PHASE,
                               f"phase.group_ranks: rank {rank} is not in group "
                               f"{phase.group.ranks}")
        try:
            plan = self._plan(job, phase)
        except PlanError as exc:
            raise ReleaseError(ErrorCode.INVALID_PHASE, str(exc)) from exc
        ikey = (phase, iteration)
        inst = job.instances.get(ikey)
        if inst is None:
            inst = _Instance(job_id, phase, iteration, plan)
            job.instances[ikey] = inst
        if not self._ready(plan):
            inst.verified = False  # held, but not on confirmed circuits: nobody joins it
        self._add_holder(inst, rank)
        rs.state = _RankState.HOLDING
        rs.instance = inst

    def release(
        self, job_id: str, rank: int, phase: PhaseKey, now: float, iteration: int | None = None
    ) -> list[Decision]:
        """A rank leaves ``phase`` (of ``iteration``, when given). Raises ``ReleaseError`` when
        it does not hold it."""
        job = self._jobs.get(job_id)
        if job is None:
            raise ReleaseError(ErrorCode.UNKNOWN_JOB, f"job_id: unknown job {job_id!r}")
        if not 0 <= rank < len(job.ranks):
            raise ReleaseError(ErrorCode.INVALID_RANK,
                               f"rank: {rank} out of range 0..{len(job.ranks) - 1}")
        rs = job.ranks[rank]
        inst = rs.instance
        if rs.state is not _RankState.HOLDING or inst is None or inst.phase != phase or (
                iteration is not None and inst.iteration != iteration):
            raise ReleaseError(
                ErrorCode.INVALID_PHASE,
                f"rank {rank} does not hold phase {phase}"
                + (f" of iteration {iteration}" if iteration is not None else "")
                + (f" (it {'waits for' if rs.state is _RankState.WAITING else 'holds'} "
                   f"{inst.phase} of iteration {inst.iteration})" if inst is not None else ""),
            )
        rs.state = _RankState.IDLE
        rs.instance = None
        if self._remove_holder(inst, rank):
            return []  # others still hold the phase: nothing was freed
        self._maybe_drop(job, inst)
        out = self._schedule(now)
        if self.provisioning:
            nxt = job.successors.get(phase)
            if nxt is not None and nxt.streak >= self.learn_iterations and nxt.phase != phase:
                out.extend(self._provision(job, nxt.phase))
        return out

    def reconfigured(
        self,
        op_id: int,
        now: float,
        error: str | None = None,
        device_s: float = 0.0,
        failed_switches: Iterable[str] = (),
    ) -> list[Decision]:
        """The shell reports that reconfiguration ``op_id`` was confirmed by every switch
        (``error`` None) or failed (``error`` says why; ``failed_switches`` which switches
        failed, default all of the op's). On failure the waiting ranks get ``DEVICE_FAILURE``;
        switches that confirmed keep their new state; the ports of failed switches are unknown
        (nothing is admitted or switched there) until ``set_confirmed`` after a read-back."""
        op = self._ops.pop(op_id, None)
        if op is None:
            return []
        for sid, ports in op.ports.items():
            self._inflight[sid].difference_update(ports)
        failed = set(failed_switches) if error is not None else set()
        if error is not None and not failed:
            failed = set(op.ports)
        for target in op.plan.targets:
            sid = target.switch_id
            if sid in failed:
                self._forget(sid, op.ports[sid])
                continue
            view = self._confirmed[sid]
            for p in op.ports[sid]:
                view.pop(p, None)
            for xc in target.cross_connects:
                view[xc.ingress] = xc
                view[xc.egress] = xc
        inst = op.instance
        if inst is None:
            return self._provisioned(op, now, error, device_s)
        inst.op_id = None
        job = self._jobs.get(inst.job_id)
        if job is not op.job:
            job = None  # unregistered (maybe registered again) while the op was in flight
        out: list[Decision] = []
        if error is None:
            inst.verified = True
            if job is not None:
                job.reconfigurations += 1
                for w in inst.waiters.values():
                    rs = job.ranks[w.rank]
                    self._admit_rank(job, rs, w.rank, inst)
                    out.append(Admit(inst.job_id, w.rank, w.request_id, inst.phase, False,
                                     now - w.arrived_s, device_s))
        elif job is not None:
            for w in inst.waiters.values():
                job.ranks[w.rank].state = _RankState.IDLE
                job.ranks[w.rank].instance = None
                out.append(Reject(inst.job_id, w.rank, w.request_id,
                                  ErrorCode.DEVICE_FAILURE,
                                  f"reconfiguration for phase {inst.phase} failed: {error}"))
        inst.waiters.clear()
        self._dequeue(inst)
        if job is not None:
            self._maybe_drop(job, inst)
        out.extend(self._schedule(now, device_s if error is None else 0.0))
        return out

    def next_deadline(self) -> float | None:
        """The earliest deadline of a waiting rank or of a job's recovery, or None."""
        best: float | None = None
        while self._deadlines:
            deadline, _, job_id, rank, request_id = self._deadlines[0]
            if self._waiter_live(job_id, rank, request_id):
                best = deadline
                break
            heapq.heappop(self._deadlines)
        for rec in self._recovering.values():
            if best is None or rec.until_s < best:
                best = rec.until_s
        return best

    def expire(self, now: float) -> list[Decision]:
        """Refuse every waiting rank whose deadline has passed with ``DEADLINE_EXCEEDED``;
        the message says what the phase was waiting for."""
        out: list[Decision] = []
        ended = [j for j, rec in self._recovering.items() if rec.until_s <= now]
        for job_id in ended:
            del self._recovering[job_id]
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, job_id, rank, request_id = heapq.heappop(self._deadlines)
            if not self._waiter_live(job_id, rank, request_id):
                continue
            job = self._jobs[job_id]
            rs = job.ranks[rank]
            inst = rs.instance
            assert inst is not None
            reason = self._blocking_reason(inst)
            w = inst.waiters.pop(rank)
            rs.state = _RankState.IDLE
            rs.instance = None
            out.append(Reject(job_id, rank, request_id, ErrorCode.DEADLINE_EXCEEDED,
                              f"circuits for phase {inst.phase} not confirmed within "
                              f"{w.deadline_s - w.arrived_s:.3f} s: {reason}"))
            if not inst.waiters and inst.op_id is None:
                self._dequeue(inst)
                self._maybe_drop(job, inst)
        if out or ended:
            out.extend(self._schedule(now))
        return out

    # --- internals --------------------------------------------------------------------------

    def _plan(self, job: _Job, phase: PhaseKey) -> Plan:
        key = (phase.group, phase.collective, phase.step)
        plan = job.plans.get(key)
        if plan is None:
            plan = plan_phase(job.layout, phase)
            job.plans[key] = plan
        return plan

    def _waiter_live(self, job_id: str, rank: int, request_id: int) -> bool:
        job = self._jobs.get(job_id)
        if job is None:
            return False
        rs = job.ranks[rank]
        return rs.state is _RankState.WAITING and rs.request_id == request_id

    def _ready(self, plan: Plan) -> bool:
        for t in plan.targets:
            view = self._confirmed[t.switch_id]
            inflight = self._inflight[t.switch_id]
            unknown = self._unknown[t.switch_id]
            for xc in t.cross_connects:
                if view.get(xc.ingress) != xc or view.get(xc.egress) != xc:
                    return False
                if xc.ingress in inflight or xc.egress in inflight:
                    return False
                if unknown and (xc.ingress in unknown or xc.egress in unknown):
                    return False
        return True

    def _present(self, plan: Plan) -> bool:
        """Every cross-connect of ``plan`` is in the confirmed view."""
        for t in plan.targets:
            view = self._confirmed[t.switch_id]
            for xc in t.cross_connects:
                if view.get(xc.ingress) != xc:
                    return False
        return True

    def _blocked(self, switch_id: str, ports: frozenset[int]) -> bool:
        """True when any of ``ports`` is being switched or in an unknown state."""
        return not (ports.isdisjoint(self._inflight[switch_id])
                    and ports.isdisjoint(self._unknown[switch_id]))

    def _forget(self, switch_id: str, ports: Iterable[int]) -> None:
        """A failed apply left ``ports`` in an unknown state: drop them from the view and block
        them until the switch is read back, except held cross-connects: the apply never breaks
        those, and dropping them would hide them from the hold checks."""
        view = self._confirmed[switch_id]
        unknown = self._unknown[switch_id]
        for p in ports:
            xc = view.get(p)
            if xc is not None and self._held.get((switch_id, xc)):
                continue
            view.pop(p, None)
            unknown.add(p)

    def _hold(self, plan: Plan) -> None:
        held = self._held
        for t in plan.targets:
            sid = t.switch_id
            for xc in t.cross_connects:
                key = (sid, xc)
                held[key] = held.get(key, 0) + 1

    def _unhold(self, plan: Plan) -> None:
        held = self._held
        for t in plan.targets:
            sid = t.switch_id
            for xc in t.cross_connects:
                key = (sid, xc)
                n = held[key] - 1
                if n:
                    held[key] = n
                else:
                    del held[key]

    def _add_holder(self, inst: _Instance, rank: int) -> None:
        """Holds are counted per instance: the plan's cross-connects are held once, by the
        first holder, and freed by the last (O(plan) per phase, not per rank)."""
        if not inst.holders:
            self._hold(inst.plan)
        inst.holders.add(rank)

    def _remove_holder(self, inst: _Instance, rank: int) -> bool:
        """Returns True while the instance still has holders."""
        inst.holders.discard(rank)
        if inst.holders:
            return True
        self._unhold(inst.plan)
        return False

    def _observe(self, job: _Job, phase: PhaseKey, plan: Plan) -> None:
        """Learn the schedule: the phase that last used any of ``phase``'s ports gets
        ``phase`` as its successor (a streak when it repeats, a reset when it deviates), and
        score the prediction for ``phase`` (hit, late, miss). O(plan) once per instance."""
        if plan.empty:
            return
        preds: set[PhaseKey] = set()
        last = job.last_on_port
        for t in plan.targets:
            sid = t.switch_id
            for p in t.ports:
                prev = last.get((sid, p))
                if prev is not None and prev != phase:  # ports it kept tell nothing
                    preds.add(prev)
                last[(sid, p)] = phase
        learn = self.learn_iterations
        predicted = False
        for prev in preds:
            s = job.successors.get(prev)
            if s is not None and s.phase == phase and s.streak >= learn:
                predicted = True
        for prev in preds:
            s = job.successors.get(prev)
            if s is None:
                job.successors[prev] = _Successor(phase, 1)
            elif s.phase == phase:
                s.streak += 1
            elif not s.declared:
                s.phase = phase
                s.streak = 1
        op_id = job.provisioned.pop(phase, None)
        ready = self._ready(plan)
        if op_id is not None and op_id in self._ops:
            job.late += 1
        elif op_id is not None and ready:
            job.hits += 1
        elif not ready and predicted:
            job.late += 1  # predicted, but its predecessor was still held: no time to switch
        elif not ready:
            job.misses += 1  # no prediction, a wrong one, or its circuits broken since

    def _provision(self, job: _Job, phase: PhaseKey) -> list[Decision]:
        """Switch to ``phase``'s circuits ahead of its ranks (Opus provisioning), when that
        breaks nothing held, touches no port being switched and takes no port an older
        waiting phase needs, and (with an advisor) when last iteration's hints say switching
        pays. Returns the decisions (a ``Reconfigure``, a ``Decided``, or nothing)."""
        if job.provisioned.get(phase) in self._ops or job.layout.job_id in self._recovering:
            return []
        try:
            plan = self._plan(job, phase)
        except PlanError:
            return []
        if plan.empty or self._ready(plan):
            return []
        for inst in job.instances.values():
            if inst.phase == phase and (inst.waiters or inst.op_id is not None):
                return []  # its ranks are already asking: the normal path serves them
        out: list[Decision] = []
        hint = job.hints.get(phase)
        if self.advisor is not None and hint is not None:
            advice = self.advisor.advise(job.layout, phase, plan, self._confirmed, hint.nbytes,
                                         hint.compute_gap_s)
            if advice is not None:
                out.append(Decided(job.layout.job_id, phase, advice.decision, True))
                if not advice.decision.switch:
                    return out
        op_ports: dict[str, frozenset[int]] = {}
        for t in plan.targets:
            ports = set(t.ports)
            for xc in self._conflicts(t):
                if self._held.get((t.switch_id, xc)):
                    return out
                ports.update(xc.ports())
            fports = frozenset(ports)
            if self._blocked(t.switch_id, fports):
                return out
            op_ports[t.switch_id] = fports
        for q in self._queue:
            if q.op_id is None and q.waiters:
                for qt in q.plan.targets:
                    mine = op_ports.get(qt.switch_id)
                    if mine is not None and not mine.isdisjoint(qt.ports):
                        return out
        op_id = self._next_op
        self._next_op += 1
        self._ops[op_id] = _Op(None, job, job.layout.job_id, phase, plan, op_ports)
        for sid, fports in op_ports.items():
            self._inflight[sid].update(fports)
        job.provisioned[phase] = op_id
        targets = tuple(SwitchTarget(t.switch_id, t.cross_connects, op_ports[t.switch_id])
                        for t in plan.targets)
        out.append(Reconfigure(op_id, job.layout.job_id, phase, targets, provisioning=True))
        return out

    def _provisioned(
        self, op: _Op, now: float, error: str | None, device_s: float
    ) -> list[Decision]:
        """A provisioning op ended (the view was already updated by ``reconfigured``)."""
        job = self._jobs.get(op.job_id)
        if job is op.job:
            if error is None:
                job.reconfigurations += 1
            elif op.phase is not None:
                job.provisioned.pop(op.phase, None)
        return self._schedule(now, device_s if error is None else 0.0)

    def _claimed_by_older(self, plan: Plan) -> bool:
        """True when a waiting (not yet switching) phase needs one of ``plan``'s ports or must
        break a cross-connect ``plan`` would hold."""
        for q in self._queue:
            if q.op_id is not None or not q.waiters:
                continue
            for qt in q.plan.targets:
                for t in plan.targets:
                    if t.switch_id != qt.switch_id:
                        continue
                    if not t.ports.isdisjoint(qt.ports):
                        return True
                    for xc in self._conflicts(qt):
                        if xc in t.cross_connects:
                            return True
        return False

    def _admit_rank(self, job: _Job, rs: _Rank, rank: int, inst: _Instance) -> None:
        self._add_holder(inst, rank)
        rs.state = _RankState.HOLDING
        rs.instance = inst
        job.admitted += 1
        job.last_phase = inst.phase

    def _maybe_drop(self, job: _Job, inst: _Instance) -> None:
        if not inst.holders and not inst.waiters and inst.op_id is None and not inst.queued:
            job.instances.pop((inst.phase, inst.iteration), None)

    def _dequeue(self, inst: _Instance) -> None:
        if inst.queued:
            inst.queued = False
            self._queue.remove(inst)

    def _conflicts(self, target: SwitchTarget) -> set[CrossConnect]:
        view = self._confirmed[target.switch_id]
        out: set[CrossConnect] = set()
        for p in target.ports:
            xc = view.get(p)
            if xc is not None and xc not in target.cross_connects:
                out.add(xc)
        return out

    def _blocking_reason(self, inst: _Instance) -> str:
        rec = self._recovering.get(inst.job_id)
        if rec is not None:
            return (f"job recovering after a controller restart: ranks "
                    f"{sorted(rec.unsynced)[:8]} have not resynced")
        if inst.op_id is not None:
            return "the switches have not confirmed the reconfiguration yet"
        held_by: set[str] = set()
        for t in inst.plan.targets:
            for xc in self._conflicts(t):
                if self._held.get((t.switch_id, xc)):
                    for job in self._jobs.values():
                        for other in job.instances.values():
                            if other.holders and any(
                                ot.switch_id == t.switch_id and xc in ot.cross_connects
                                for ot in other.plan.targets
                            ):
                                ranks = sorted(other.holders)[:8]
                                held_by.add(f"{other.job_id} ranks {ranks} in {other.phase}")
        if held_by:
            return "cross-connects still held by " + "; ".join(sorted(held_by))
        return "ports claimed by an earlier waiting phase or being switched"

    def _schedule(self, now: float, device_s: float = 0.0) -> list[Decision]:
        """Start what can start, oldest waiting phase first. ``device_s`` > 0: called as a
        reconfiguration of that duration completed; phases admitted now were waiting on it, so
        their admissions say so (not a no-op, with that device time)."""
        out: list[Decision] = []
        if not self._queue:
            return out
        claimed: dict[str, set[int]] = {}
        for inst in list(self._queue):
            job = self._jobs.get(inst.job_id)
            if job is None:
                self._dequeue(inst)
                continue
            if inst.op_id is not None:
                for t in inst.plan.targets:
                    claimed.setdefault(t.switch_id, set()).update(t.ports)
                continue
            if not inst.waiters:
                self._dequeue(inst)
                self._maybe_drop(job, inst)
                continue
            if self._ready(inst.plan) and not any(
                not t.ports.isdisjoint(claimed.get(t.switch_id, ())) for t in inst.plan.targets
            ):
                switched = device_s > 0
                for w in inst.waiters.values():
                    self._admit_rank(job, job.ranks[w.rank], w.rank, inst)
                    if not switched:
                        job.admitted_noop += 1
                    out.append(Admit(inst.job_id, w.rank, w.request_id, inst.phase,
                                     not switched, now - w.arrived_s, device_s))
                inst.waiters.clear()
                self._dequeue(inst)
                continue
            ok = inst.job_id not in self._recovering
            op_ports: dict[str, frozenset[int]] = {}
            for t in inst.plan.targets:
                conflicts = self._conflicts(t)
                ports = set(t.ports)
                for xc in conflicts:
                    ports.update(xc.ports())
                    if self._held.get((t.switch_id, xc)):
                        ok = False
                fports = frozenset(ports)
                op_ports[t.switch_id] = fports
                if self._blocked(t.switch_id, fports):
                    ok = False
                c = claimed.setdefault(t.switch_id, set())
                # FIFO on the ports a phase makes circuits on: a later phase may not take an
                # earlier waiting phase's own ports. Breaking a cross-connect both must break
                # is no conflict (adjacent PP pairs both break the DP ring link between them;
                # comparing the extended sets would serialize them one per round).
                if not t.ports.isdisjoint(c):
                    ok = False
                c.update(t.ports)
            if not ok:
                continue
            op_id = self._next_op
            self._next_op += 1
            inst.op_id = op_id
            self._ops[op_id] = _Op(inst, job, inst.job_id, inst.phase, inst.plan, op_ports)
            for sid, ports_ in op_ports.items():
                self._inflight[sid].update(ports_)
            targets = tuple(
                SwitchTarget(t.switch_id, t.cross_connects, op_ports[t.switch_id])
                for t in inst.plan.targets
            )
            out.append(Reconfigure(op_id, inst.job_id, inst.phase, targets))
        return out


def confirmed_snapshot(coordinator: PhaseCoordinator) -> Mapping[str, frozenset[CrossConnect]]:
    """Every switch's confirmed cross-connects, for status displays."""
    return {sid: coordinator.confirmed(sid) for sid in coordinator.fabric.switches}
