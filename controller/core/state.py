"""The phase coordinator's shared state and the bookkeeping every part of it uses: jobs, the
switch views, the queue of waiting phase instances, reconfigurations in flight, deadlines.

``PhaseCoordinator`` (the protocol), ``scheduling``, ``provisioning`` and ``rewiring`` all act
on one ``CoordinatorState``. Pure: no clock, no I/O.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from lightrail.controller.core.decisions import Admitted, AdmittedBatch, Decision, Reject
from lightrail.controller.core.planner import (
    JobLayout,
    Plan,
    PlanError,
    SwitchTarget,
    all_to_all_steps,
    layout_job,
    plan_phase,
)
from lightrail.controller.core.records import (
    Deadline,
    EnterBatch,
    Instance,
    JobRecord,
    Op,
    Outage,
    RankSlot,
    RankState,
    Recovery,
    waiting_ranks,
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
        self.deadlines: list[tuple[float, int, Deadline]] = []
        """A heap of ``(at_s, seq, deadline)``, ordered by the leading float and int in C
        (``seq`` is unique, so a ``Deadline`` is never compared); entries of ranks that stopped
        waiting are dropped lazily."""
        self.recovering: dict[str, Recovery] = {}
        self.maintenance: dict[str, str] = {}
        """Switch id -> the operator's reason, for switches in maintenance: no reconfiguration
        changes them (``scheduling.maintenance_block``); circuits already there still admit."""
        self.unreachable: dict[str, Outage] = {}
        """Switch id -> its outage, for switches whose driver cannot reach them: after
        ``device_wait_s`` a phase that needs a change or a read-back there is refused
        ``DEVICE_FAILURE`` (``scheduling.unreachable_block``); confirmed circuits still admit
        (an OCS keeps its cross-connects while its management port is down)."""
        self.device_wait_s = 0.0
        """How long a phase may wait for an unreachable switch before it is refused, s."""
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
        for inst in [*job.instances.values(), *job.retired]:
            out.extend(self.refuse_waiting(job, inst, ErrorCode.CANCELLED, "job unregistered"))
            if inst.holders:
                self.views.unhold(inst.plan)
            inst.holders.clear()
            inst.queued = False  # off the queue below; an op in flight must not dequeue it
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

    def start_switch(
        self, instance: Instance | None, job: JobRecord, phase: PhaseKey, plan: Plan
    ) -> tuple[int, tuple[SwitchTarget, ...]]:
        """Start switching to ``plan`` (for ``instance``, or ahead of ``phase`` when None):
        only what changes (``SwitchViews.changes``) becomes the op and is marked in flight;
        returns the op id and the targets for the ``Reconfigure``."""
        views = self.views
        targets = tuple(views.changes(t) for t in plan.targets)
        op = Op(instance, job, job.layout.job_id, phase, Plan(targets),
                {t.switch_id: t.ports for t in targets})
        return self.start_op(op), targets

    def start_op(self, op: Op) -> int:
        """Record ``op`` as in flight (its ports are being switched); returns its op id."""
        op_id = self._next_op
        self._next_op += 1
        self.ops[op_id] = op
        self.views.begin(op.ports)
        return op_id

    # --- waiting ranks ----------------------------------------------------------------------

    def push_deadline(self, job_id: str, batch: EnterBatch) -> None:
        """Arm the deadline of a waiting ``batch`` of ``job_id``."""
        self._deadline_seq += 1
        seq = self._deadline_seq
        heapq.heappush(self.deadlines, (batch.deadline_s, seq,
                                        Deadline(batch.deadline_s, seq, job_id, batch)))

    def waiter_live(self, d: Deadline) -> bool:
        """True while some rank of ``d``'s batch still waits in it."""
        return d.batch.waiting > 0 and d.job_id in self.jobs

    def withdraw(self, job: JobRecord, rank: int) -> Instance | None:
        """Take a waiting ``rank`` out of its batch and instance (it is IDLE afterwards);
        returns the instance it waited for (None when it did not wait)."""
        rs = job.ranks[rank]
        inst = rs.instance
        if rs.state is not RankState.WAITING or inst is None:
            return None
        if rs.batch is not None:
            rs.batch.waiting -= 1
        inst.waiting -= 1
        inst.arrived.discard(rank)
        rs.state = RankState.IDLE
        rs.instance = None
        rs.batch = None
        return inst

    def refuse_waiting(
        self, job: JobRecord, inst: Instance, code: ErrorCode, message: str,
        batch: EnterBatch | None = None,
    ) -> list[Decision]:
        """Refuse every rank waiting in ``inst`` (only those of ``batch``, when given) with
        ``code``; they are IDLE afterwards."""
        out: list[Decision] = []
        job_id = inst.job_id
        slots = job.ranks
        for b, ranks in waiting_ranks(inst, slots):
            if batch is not None and b is not batch:
                continue
            for r in ranks:
                rs = slots[r]
                rs.state = RankState.IDLE
                rs.instance = None
                rs.batch = None
                inst.arrived.discard(r)
                out.append(Reject(job_id, r, b.request_id, code, message, b.route))
            inst.waiting -= len(ranks)
            b.waiting = 0
        inst.batches = [b for b in inst.batches if b.waiting]
        return out

    def admit_waiting(
        self, job: JobRecord, inst: Instance, now: float, noop: bool, device_s: float
    ) -> Admitted | None:
        """Admit every rank waiting in ``inst`` (they hold it afterwards); one decision for the
        whole instance, None when nobody waited."""
        if not inst.waiting:
            inst.batches.clear()
            return None
        slots = job.ranks
        entries: list[AdmittedBatch] = []
        count = 0
        if not inst.holders:
            self.views.hold(inst.plan)
        holders = inst.holders
        holding = RankState.HOLDING
        for b, ranks in waiting_ranks(inst, slots):
            for r in ranks:
                rs = slots[r]
                rs.state = holding
                rs.batch = None
            holders.update(ranks)
            count += len(ranks)
            b.waiting = 0
            entries.append(AdmittedBatch(b.route, b.request_id, ranks, b.arrived_s))
        inst.batches.clear()
        inst.waiting = 0
        job.admitted += count
        if noop:
            job.admitted_noop += count
        job.last_phase = inst.phase
        return Admitted(inst.job_id, inst.phase, inst.iteration, noop, now, device_s,
                        self.steps(job, inst.phase), tuple(entries))

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

    def maybe_drop(self, job: JobRecord, inst: Instance) -> None:
        """Forget ``inst`` once nobody waits for, holds or switches it."""
        if not inst.holders and not inst.waiting and inst.op_id is None and not inst.queued:
            key = (inst.phase, inst.iteration)
            if job.instances.get(key) is inst:
                del job.instances[key]
            elif inst in job.retired:
                job.retired.remove(inst)
