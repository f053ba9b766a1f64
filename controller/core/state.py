"""The phase coordinator's shared state and the bookkeeping every part of it uses: jobs, the
switch views, the queue of waiting phase instances, reconfigurations in flight, deadlines.

``PhaseCoordinator`` (the protocol), ``scheduling``, ``provisioning`` and ``rewiring`` all act
on one ``CoordinatorState``. Pure: no clock, no I/O.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from lightrail.controller.core.decisions import Decision, Reject
from lightrail.controller.core.planner import (
    JobLayout,
    Plan,
    PlanError,
    all_to_all_steps,
    layout_job,
    plan_phase,
)
from lightrail.controller.core.records import (
    Deadline,
    Instance,
    JobRecord,
    Op,
    RankSlot,
    RankState,
    Recovery,
)
from lightrail.controller.core.switch_views import SwitchViews
from lightrail.controller.domain.errors import DuplicateJob, ErrorCode, UnknownJob
from lightrail.controller.domain.fabric import Fabric
from lightrail.controller.domain.model import Collective, PhaseKey, RankPlacement


class CoordinatorState:
    """Everything the coordinator knows about one fabric. Not thread-safe."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.jobs: dict[str, JobRecord] = {}
        self.gpus: dict[tuple[str, int], str] = {}
        """(host, gpu) -> the job using it."""
        self.views = SwitchViews(fabric.switches)
        self.queue: list[Instance] = []
        """Waiting phase instances, oldest first."""
        self.ops: dict[int, Op] = {}
        self.deadlines: list[Deadline] = []
        """A heap; entries of ranks that stopped waiting are dropped lazily."""
        self.recovering: dict[str, Recovery] = {}
        self._next_op = 1
        self._deadline_seq = 0

    # --- jobs -------------------------------------------------------------------------------

    def add_job(
        self,
        job_id: str,
        tenant: str,
        placements: Sequence[RankPlacement],
        declared_phases: Sequence[PhaseKey],
        derive_schedule: Callable[[JobLayout], Sequence[PhaseKey]] | None,
    ) -> JobRecord:
        """Lay a job out, plan its declared (or derived) phases and store it; see
        ``PhaseCoordinator.register_job``. Raises ``ValueError`` (empty id), ``DuplicateJob``,
        ``PlacementError``, ``PlanError`` or whatever ``derive_schedule`` raises; nothing is
        stored then."""
        if not job_id:
            raise ValueError("job_id: empty")
        if job_id in self.jobs:
            raise DuplicateJob(f"job_id: {job_id!r} is registered already")
        layout = layout_job(self.fabric, job_id, placements, self.gpus)
        if derive_schedule is not None:
            declared_phases = tuple(derive_schedule(layout))
        job = JobRecord(
            layout=layout,
            tenant=tenant,
            declared=tuple(declared_phases),
            ranks=[RankSlot() for _ in range(layout.world_size)],
        )
        for i, ph in enumerate(job.declared):
            try:
                self.plan(job, ph)
            except PlanError as exc:
                raise PlanError(f"declared_phases[{i}]: {exc}") from exc
        self.jobs[job_id] = job
        for p in layout.placements:
            self.gpus[(p.host, p.gpu)] = job_id
        return job

    def remove_job(self, job_id: str) -> list[Decision]:
        """Drop a job: its waiting ranks are refused with ``CANCELLED``, its holds and queued
        phases go. Raises ``UnknownJob``."""
        job = self.jobs.pop(job_id, None)
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
                self.views.unhold(inst.plan)
            inst.holders.clear()
        self.queue = [i for i in self.queue if i.job_id != job_id]
        self.recovering.pop(job_id, None)
        for p in job.layout.placements:
            self.gpus.pop((p.host, p.gpu), None)
        return out

    # --- plans ------------------------------------------------------------------------------

    def plan(self, job: JobRecord, phase: PhaseKey) -> Plan:
        """The (cached) plan of ``phase`` for ``job``; raises ``PlanError``."""
        key = (phase.group, phase.collective, phase.step)
        plan = job.plans.get(key)
        if plan is None:
            plan = plan_phase(job.layout, phase)
            job.plans[key] = plan
        return plan

    def steps(self, job: JobRecord, phase: PhaseKey) -> int:
        """How many sub-phases ``phase`` takes: the all-to-all shift permutations of its group
        (cached per group), 1 for every other collective."""
        if phase.collective is not Collective.ALL_TO_ALL:
            return 1
        steps = job.steps.get(phase.group)
        if steps is None:
            steps = all_to_all_steps(job.layout, phase.group)
            job.steps[phase.group] = steps
        return steps

    # --- reconfigurations -------------------------------------------------------------------

    def start_op(self, op: Op) -> int:
        """Record ``op`` as in flight (its ports are being switched); returns its op id."""
        op_id = self._next_op
        self._next_op += 1
        self.ops[op_id] = op
        self.views.begin(op.ports)
        return op_id

    # --- waiting ranks ----------------------------------------------------------------------

    def push_deadline(self, at_s: float, job_id: str, rank: int, request_id: int) -> None:
        """Arm the deadline of ``rank`` waiting with ``request_id``."""
        self._deadline_seq += 1
        heapq.heappush(self.deadlines, Deadline(at_s, self._deadline_seq, job_id, rank,
                                                request_id))

    def waiter_live(self, d: Deadline) -> bool:
        """True while the rank of ``d`` still waits with ``d``'s request."""
        job = self.jobs.get(d.job_id)
        if job is None:
            return False
        rs = job.ranks[d.rank]
        return rs.state is RankState.WAITING and rs.request_id == d.request_id

    def dequeue(self, inst: Instance) -> None:
        """Take ``inst`` off the waiting queue, if it is on it."""
        if inst.queued:
            inst.queued = False
            self.queue.remove(inst)

    # --- holders ----------------------------------------------------------------------------

    def add_holder(self, inst: Instance, rank: int) -> None:
        """Holds are counted per instance: the plan's cross-connects are held once, by the
        first holder, and freed by the last (O(plan) per phase, not per rank)."""
        if not inst.holders:
            self.views.hold(inst.plan)
        inst.holders.add(rank)

    def remove_holder(self, inst: Instance, rank: int) -> bool:
        """Returns True while the instance still has holders."""
        inst.holders.discard(rank)
        if inst.holders:
            return True
        self.views.unhold(inst.plan)
        return False

    def admit_rank(self, job: JobRecord, rs: RankSlot, rank: int, inst: Instance) -> None:
        """``rank`` (slot ``rs``) now holds ``inst``."""
        self.add_holder(inst, rank)
        rs.state = RankState.HOLDING
        rs.instance = inst
        job.admitted += 1
        job.last_phase = inst.phase

    def maybe_drop(self, job: JobRecord, inst: Instance) -> None:
        """Forget ``inst`` once nobody waits for, holds or switches it."""
        if not inst.holders and not inst.waiters and inst.op_id is None and not inst.queued:
            job.instances.pop((inst.phase, inst.iteration), None)
