"""The phase coordinator's shared state and the bookkeeping every part of it uses: jobs, the
switch views, the queue of waiting phase instances, reconfigurations in flight, deadlines.

``PhaseCoordinator`` (the protocol), ``scheduling``, ``provisioning`` and ``rewiring`` all act
on one ``CoordinatorState``. Pure: no clock, no I/O.
"""

from __future__ import annotations

import heapq

from lightrail.controller.core.planner import Plan, all_to_all_steps, plan_phase
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
from lightrail.controller.domain.fabric import Fabric
from lightrail.controller.domain.model import Collective, PhaseKey


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
