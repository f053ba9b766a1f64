"""Provisioning: learn a job's schedule of phases and switch to the predicted next phase's
circuits as soon as the last rank releases the current one, so the reconfiguration delay hides
in the compute gap (Opus, "provisioning"; DESIGN.md "Phase protocol"). Pure: acts on a
``CoordinatorState``.

The schedule is declared (``register_job``) or learned: the phase that last had circuits on any
of a new phase's ports gets it as its successor; a successor seen ``learn_iterations`` times in
a row is a prediction. Each phase that needs new circuits is scored: a *hit* (switched ahead
and ready), *late* (predicted, but still switching or its predecessor still held), or a *miss*
(switched on demand).
"""

from __future__ import annotations

from lightrail.controller.core.decisions import Advisor, Decided, Decision, Reconfigure
from lightrail.controller.core.planner import Plan, PlanError
from lightrail.controller.core.records import JobRecord, Op, Successor
from lightrail.controller.core.scheduling import schedule
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
            job.successors[ph] = Successor(job.declared[(i + 1) % k], self.learn_iterations,
                                           declared=True)

    def reset(self, job: JobRecord) -> None:
        """Forget what was learned from ``job``'s circuits (its placement changed); the
        declared schedule stays."""
        job.successors = {p: s for p, s in job.successors.items() if s.declared}
        job.last_on_port.clear()
        job.provisioned.clear()

    def learned(self, job: JobRecord) -> bool:
        """True when some successor of ``job`` is a prediction."""
        return any(s.streak >= self.learn_iterations for s in job.successors.values())

    def predicted_after(self, job: JobRecord, phase: PhaseKey) -> PhaseKey | None:
        """The phase predicted to follow ``phase`` (never ``phase`` itself), or None."""
        nxt = job.successors.get(phase)
        if nxt is None or nxt.streak < self.learn_iterations or nxt.phase == phase:
            return None
        return nxt.phase

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
    def _take_ports(job: JobRecord, phase: PhaseKey, plan: Plan) -> set[PhaseKey]:
        """Mark ``plan``'s ports as last used by ``phase``; returns the other phases that used
        them last (its predecessors). Ports ``phase`` itself kept tell nothing."""
        preds: set[PhaseKey] = set()
        for t in plan.targets:
            last = job.last_on_port.setdefault(t.switch_id, {})
            get = last.get
            for p in t.ports:
                prev = get(p)
                if prev is not None and prev is not phase and prev != phase:
                    preds.add(prev)
                last[p] = phase
        return preds

    def _was_predicted(self, job: JobRecord, phase: PhaseKey, preds: set[PhaseKey]) -> bool:
        """True when some predecessor in ``preds`` predicted ``phase`` (before this instance
        is learned from)."""
        learn = self.learn_iterations
        for prev in preds:
            s = job.successors.get(prev)
            if s is not None and s.phase == phase and s.streak >= learn:
                return True
        return False

    @staticmethod
    def _learn(job: JobRecord, phase: PhaseKey, preds: set[PhaseKey]) -> None:
        """Each predecessor gets ``phase`` as successor: a new one starts a streak of 1, the
        same one extends its streak, another one resets it (a declared successor stays)."""
        for prev in preds:
            s = job.successors.get(prev)
            if s is None:
                job.successors[prev] = Successor(phase, 1)
            elif s.phase == phase:
                s.streak += 1
            elif not s.declared:
                s.phase = phase
                s.streak = 1

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
        touches no port being switched and takes no port an older waiting phase needs, and
        (with an advisor) when last iteration's hints say switching pays. Returns the decisions
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
        if plan.empty or views.ready(plan):
            return []
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
        op_id, targets = s.start_switch(None, job, phase, plan)
        job.provisioned[phase] = op_id
        out.append(Reconfigure(op_id, job_id, phase, targets, provisioning=True, plan=plan))
        return out

    def _free_ports(self, plan: Plan) -> dict[str, frozenset[int]] | None:
        """Per switch, the ports switching to ``plan`` touches (its own and those of the
        conflicting cross-connects it breaks); None when it would break a held cross-connect
        or touch a port being switched."""
        views = self._s.views
        op_ports: dict[str, frozenset[int]] = {}
        for t in plan.targets:
            ports = set(t.ports)
            for xc in views.conflicts(t):
                if views.held(t.switch_id, xc):
                    return None
                ports.update(xc.ports())
            fports = frozenset(ports)
            if views.blocked(t.switch_id, fports):
                return None
            op_ports[t.switch_id] = fports
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
        switch views were updated already. Returns what can start now."""
        job = self._s.jobs.get(op.job_id)
        if job is op.job:
            if error is None:
                job.reconfigurations += 1
            elif op.phase is not None:
                job.provisioned.pop(op.phase, None)
        return schedule(self._s, now, device_s if error is None else None)

