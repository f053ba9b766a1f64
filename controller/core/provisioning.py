"""Provisioning: learn a job's schedule of phases and switch to the predicted next phase's
circuits as soon as the last rank releases the current one, so the reconfiguration delay hides
in the compute gap (Opus, "provisioning"; DESIGN.md "Phase protocol"). Pure: acts on a
``CoordinatorState``.

The schedule is declared (``register_job``) or learned: the phase that last had circuits on any
of a new phase's ports gets it as a successor on the ports it took; a successor seen
``learn_iterations`` times in a row is a prediction. A phase may have several successors on
disjoint ports (DP x PP: a DP group's ports go to two PP pairs, the pairs' ports to two DP
groups); a new phase on some of those ports replaces the successors it overlaps. Each phase
that needs new circuits is scored: a *hit* (switched ahead and ready), *late* (predicted, but
still switching or its predecessor still held), or a *miss* (switched on demand).
"""

from __future__ import annotations

from lightrail.controller.core.decisions import Advisor, Decided, Decision, Reconfigure
from lightrail.controller.core.planner import Plan, PlanError
from lightrail.controller.core.records import JobRecord, Op, Successor, SwitchPort
from lightrail.controller.core.scheduling import (
    maintenance_block,
    schedule,
    unreachable_block,
)
from lightrail.controller.core.state import CoordinatorState
from lightrail.controller.domain.model import PhaseKey


class Provisioner:
    """Schedule learning and provisioning over one ``CoordinatorState``. ``learn_iterations``
    (>= 1): how many repeats make a learned successor a prediction; ``advisor``: when given,
    provisioning switches only when last iteration's hints say switching pays (PCCL)."""

    def __init__(self, state: CoordinatorState, learn_iterations: int,
                 advisor: Advisor | None) -> None:
        if learn_iterations < 1:
            raise ValueError(f"learn_iterations: must be >= 1, got {learn_iterations}")
        self._s = state
        self.learn_iterations = learn_iterations
        self.advisor = advisor

    def declare(self, job: JobRecord) -> None:
        """Predict ``job``'s declared schedule at once: each declared phase is followed by the
        next, the last by the first (one iteration repeats)."""
        k = len(job.declared)
        for i, ph in enumerate(job.declared):
            job.successors[ph] = [Successor(job.declared[(i + 1) % k], self.learn_iterations,
                                            declared=True)]

    def reset(self, job: JobRecord) -> None:
        """Forget what was learned from ``job``'s circuits (its placement changed); the
        declared schedule stays."""
        kept = {p: [s for s in ss if s.declared] for p, ss in job.successors.items()}
        job.successors = {p: ss for p, ss in kept.items() if ss}
        job.last_on_port.clear()
        job.ports_last_of.clear()
        job.provisioned.clear()
        job.deferred.clear()

    def learned(self, job: JobRecord) -> bool:
        """True when some successor of ``job`` is a prediction."""
        return any(s.streak >= self.learn_iterations
                   for ss in job.successors.values() for s in ss)

    def predicted_after(self, job: JobRecord, phase: PhaseKey) -> list[PhaseKey]:
        """The phases predicted to follow ``phase`` (never ``phase`` itself), oldest
        successor first; [] when none."""
        return [s.phase for s in job.successors.get(phase, ())
                if s.streak >= self.learn_iterations and s.phase != phase]

    def observe(self, job: JobRecord, phase: PhaseKey, plan: Plan) -> None:
        """A new instance of ``phase`` (planned as ``plan``) began: the phase that last
        used any of ``phase``'s ports gets ``phase`` as its successor (a streak when it
        repeats, a reset when it deviates), and the prediction for ``phase`` is scored (hit,
        late, miss). O(plan) once per instance."""
        if plan.empty:
            return
        preds = self._take_ports(job, phase, plan)
        predicted = self._was_predicted(job, phase, preds)
        self._learn(job, phase, preds)
        self._score(job, phase, plan, predicted)

    @staticmethod
    def _take_ports(job: JobRecord, phase: PhaseKey, plan: Plan
                    ) -> dict[PhaseKey, set[SwitchPort]]:
        """Mark ``plan``'s ports as last used by ``phase``; returns the other phases that used
        them last (its predecessors), each with the ports ``phase`` took from it. Ports
        ``phase`` itself kept tell nothing."""
        preds: dict[PhaseKey, set[SwitchPort]] = {}
        for t in plan.targets:
            sid = t.switch_id
            last = job.last_on_port.setdefault(sid, {})
            of = job.ports_last_of.setdefault(sid, {})
            mine = of.get(phase)
            if mine is None:
                mine = of[phase] = set()
            moved = t.ports - mine  # O(plan) in C; the loop below is O(ports that move)
            if not moved:
                continue
            get = last.get
            # Neighbouring ports mostly share their last phase: look it up once per run.
            seen: PhaseKey | None = None
            taken: set[SwitchPort] = set()
            theirs: set[int] = set()
            for p in moved:
                prev = get(p)
                if prev is not None:  # not ``phase``: its ports are ``mine``
                    if prev is not seen:
                        seen = prev
                        taken = preds.setdefault(prev, set())
                        theirs = of[prev]
                    taken.add((sid, p))
                    theirs.discard(p)
                    if not theirs:
                        del of[prev]
                        theirs = set()
                        seen = None
                last[p] = phase
            mine |= moved
        return preds

    def _was_predicted(self, job: JobRecord, phase: PhaseKey,
                       preds: dict[PhaseKey, set[SwitchPort]]) -> bool:
        """True when some predecessor in ``preds`` predicted ``phase`` (before this instance
        is learned from)."""
        learn = self.learn_iterations
        for prev in preds:
            for s in job.successors.get(prev, ()):
                if s.phase == phase and s.streak >= learn:
                    return True
        return False

    @staticmethod
    def _learn(job: JobRecord, phase: PhaseKey, preds: dict[PhaseKey, set[SwitchPort]]
               ) -> None:
        """Each predecessor gets ``phase`` as a successor on the ports it took: the same
        successor there extends its streak, a new one starts a streak of 1 and replaces the
        successors whose ports it overlaps (a declared successor stays, and keeps the new one
        out)."""
        for prev, taken in preds.items():
            ports = frozenset(taken)
            ss = job.successors.get(prev)
            if ss is None:
                job.successors[prev] = [Successor(phase, 1, ports=ports)]
                continue
            overlapping = [s for s in ss if s.ports is None or not s.ports.isdisjoint(ports)]
            same = next((s for s in overlapping if s.phase == phase), None)
            if same is None and any(s.declared for s in overlapping):
                continue
            ss[:] = [s for s in ss if s.declared or s is same or s not in overlapping]
            if same is None:
                ss.append(Successor(phase, 1, ports=ports))
            else:
                same.streak += 1
                if not same.declared:
                    same.ports = ports

    def _score(self, job: JobRecord, phase: PhaseKey, plan: Plan, predicted: bool) -> None:
        """Count this instance of ``phase`` as a hit, late or miss (module docstring); a
        phase whose circuits are ready without provisioning is not counted."""
        op_id = job.provisioned.pop(phase, None)
        ready = self._s.views.ready(plan)
        if op_id is not None and op_id in self._s.ops:
            job.late += 1
        elif op_id is not None and ready:
            job.hits += 1
        elif not ready and predicted:
            job.late += 1  # predicted, but its predecessor was still held: no time to switch
        elif not ready:
            job.misses += 1  # no prediction, a wrong one, or its circuits broken since

    def provision(self, job: JobRecord, phase: PhaseKey) -> list[Decision]:
        """Switch to ``phase``'s circuits ahead of its ranks, when that breaks nothing held,
        takes no port an older waiting phase needs, and (with an advisor) when last iteration's
        hints say switching pays; when it would touch a port being switched, it is deferred
        until the op switching it ends (``finished``). Returns the decisions
        (a ``Reconfigure``, a ``Decided``, or nothing)."""
        s = self._s
        job_id = job.layout.job_id
        if job.provisioned.get(phase) in s.ops or job_id in s.recovering:
            return []
        try:
            plan = s.plan(job, phase)
        except PlanError:
            return []
        views = s.views
        if plan.empty or views.ready(plan) or maintenance_block(s, plan) is not None or (
                s.unreachable and unreachable_block(s, plan, None) is not None):
            return []  # nothing to switch, or a switch it changes is in maintenance or down
        for inst in job.instances.values():
            if inst.phase == phase and (inst.waiting or inst.op_id is not None):
                return []  # its ranks are already asking: the normal path serves them
        out: list[Decision] = []
        hint = job.hints.get(phase)
        if self.advisor is not None and hint is not None:
            advice = self.advisor.advise(job.layout, phase, plan, views.confirmed, hint.nbytes,
                                         hint.compute_gap_s)
            if advice is not None:
                out.append(Decided(job_id, phase, advice.decision, True))
                if not advice.decision.switch:
                    return out
        op_ports = self._free_ports(plan)
        if op_ports is None or self._needed_by_waiting(op_ports):
            return out
        if any(views.blocked(sid, ports) for sid, ports in op_ports.items()):
            if phase not in job.deferred:  # another op switches a port of it: after that one
                job.deferred.append(phase)
            return out
        op_id, targets = s.start_switch(None, job, phase, plan)
        job.provisioned[phase] = op_id
        out.append(Reconfigure(op_id, job_id, phase, targets, provisioning=True, plan=plan))
        return out

    def _free_ports(self, plan: Plan) -> dict[str, frozenset[int]] | None:
        """Per switch, the ports switching to ``plan`` touches (its own and those of the
        conflicting cross-connects it breaks); None when it would break a held
        cross-connect."""
        views = self._s.views
        op_ports: dict[str, frozenset[int]] = {}
        for t in plan.targets:
            ports = set(t.ports)
            for xc in views.conflicts(t):
                if views.held(t.switch_id, xc):
                    return None
                ports.update(xc.ports())
            op_ports[t.switch_id] = frozenset(ports)
        return op_ports

    def _needed_by_waiting(self, op_ports: dict[str, frozenset[int]]) -> bool:
        """True when a queued phase with waiting ranks or an op in flight (which changes only
        what its plan lacks: the cross-connects it keeps must stay) needs one of
        ``op_ports`` (switch id -> ports): provisioning must not overtake it."""
        for q in self._s.queue:  # waiting, or switching: its kept cross-connects count too
            if q.waiting or q.op_id is not None:
                for qt in q.plan.targets:
                    mine = op_ports.get(qt.switch_id)
                    if mine is not None and not mine.isdisjoint(qt.ports):
                        return True
        return False

    def finished(self, op: Op, now: float, error: str | None, device_s: float) -> list[Decision]:
        """An op without a phase instance (provisioning, or a failover rewire) ended; the
        switch views were updated already. Returns what can start now: queued phases, then the
        job's provisioning that waited for a port this op switched (``JobRecord.deferred``;
        with an advisor, its advice is taken again)."""
        job = self._s.jobs.get(op.job_id)
        if job is op.job:
            if error is None:
                job.reconfigurations += 1
            elif op.phase is not None:
                job.provisioned.pop(op.phase, None)
        out = schedule(self._s, now, device_s if error is None else None)
        if job is op.job and job.deferred:
            deferred, job.deferred = job.deferred, []
            for phase in deferred:
                out.extend(self.provision(job, phase))
        return out

