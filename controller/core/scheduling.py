"""Which waiting phases may switch now, oldest first. Pure: acts on a ``CoordinatorState``.

A waiting phase instance starts a reconfiguration as soon as no cross-connect it must break is
held, none of its ports is being switched or unknown, and no older waiting phase claims one of
its ports (FIFO on ports, so a repeating phase cannot starve a reconfiguration its peers wait
on). A phase whose circuits are there is admitted without a switch (DESIGN.md "Phase
protocol"). A phase that would change a switch in maintenance is refused
``SWITCH_MAINTENANCE`` instead of switching (``maintenance_block``).
"""

from __future__ import annotations

from lightrail.controller.core.decisions import Decision, Reconfigure
from lightrail.controller.core.planner import Plan
from lightrail.controller.core.records import Instance, JobRecord
from lightrail.controller.core.state import CoordinatorState
from lightrail.controller.domain.errors import ErrorCode


def schedule(
    state: CoordinatorState, now: float, switched_s: float | None = None
) -> list[Decision]:
    """Start what can start, oldest waiting phase first. ``switched_s``: given when called as
    a reconfiguration completed, its device time (s); phases admitted now were waiting on it,
    so their admissions say so (not a no-op, with that device time). None: no switch just
    completed; admissions now are no-ops."""
    out: list[Decision] = []
    if not state.queue:
        return out
    claimed: dict[str, set[int]] = {}
    for inst in list(state.queue):
        job = state.jobs.get(inst.job_id)
        if job is None:
            state.dequeue(inst)
            continue
        if inst.op_id is not None:
            for t in inst.plan.targets:
                claimed.setdefault(t.switch_id, set()).update(t.ports)
            continue
        if not inst.waiting:
            state.dequeue(inst)
            state.maybe_drop(job, inst)
            continue
        if held_back(inst):
            continue  # it neither switches nor claims ports (liveness)
        if state.views.ready(inst.plan) and not any(
            not t.ports.isdisjoint(claimed.get(t.switch_id, ())) for t in inst.plan.targets
        ):
            out.extend(_admit_waiters(state, job, inst, now, switched_s))
            continue
        block = maintenance_block(state, inst.plan)
        if block is not None:
            out.extend(state.refuse_waiting(job, inst, ErrorCode.SWITCH_MAINTENANCE,
                                            f"phase {inst.phase}: {block}"))
            state.dequeue(inst)
            state.maybe_drop(job, inst)
            continue
        if not _claim_ports(state, inst, claimed):
            continue
        op_id, targets = state.start_switch(inst, job, inst.phase, inst.plan)
        inst.op_id = op_id
        out.append(Reconfigure(op_id, inst.job_id, inst.phase, targets, plan=inst.plan))
    return out


def _admit_waiters(
    state: CoordinatorState, job: JobRecord, inst: Instance, now: float,
    switched_s: float | None,
) -> list[Decision]:
    """Admit every waiting rank of ``inst`` (its circuits are there) and take it off the
    queue. ``now``, ``switched_s`` as for ``schedule``: with no switch just completed the
    admissions are no-ops (counted in ``job.admitted_noop``)."""
    admitted = state.admit_waiting(job, inst, now, switched_s is None,
                                   0.0 if switched_s is None else switched_s)
    state.dequeue(inst)
    return [] if admitted is None else [admitted]


def maintenance_block(state: CoordinatorState, plan: Plan) -> str | None:
    """Why switching to ``plan`` may not start: it would change a switch an operator put in
    maintenance (a cross-connect to make or break there, ``SwitchViews.changes``), as a
    message naming the switch and the reason; None when it changes no such switch. A switch
    in maintenance is sent no reconfiguration, so the phase is refused rather than left
    waiting (the safety invariant is untouched: nothing is admitted onto circuits that are
    not confirmed). While the ports concerned are being switched or unknown (an op started
    before maintenance, a read-back pending) the answer waits for them: None."""
    if not state.maintenance:
        return None
    views = state.views
    for t in plan.targets:
        reason = state.maintenance.get(t.switch_id)
        if reason is None:
            continue
        change = views.changes(t)
        if change.ports and not views.blocked(t.switch_id, change.ports):
            return (f"switch {t.switch_id!r} is in maintenance ({reason}): the phase needs "
                    f"{len(change.cross_connects)} cross-connect(s) made and ports "
                    f"{sorted(change.ports)[:8]} changed there; it is admitted when the "
                    f"switch leaves maintenance or its circuits are in place")
    return None


def held_back(inst: Instance) -> bool:
    """True while ``inst`` may not take circuits (switch, or be admitted onto them): not every
    rank of its group has entered it. Liveness: circuits are held only by instances whose
    whole group is inside the collective, so a holder never waits for a rank that waits for
    the circuits it holds (no hold-and-wait: ranks of a PP pair or an EP all-to-all are never
    locked out by peers that went ahead into the next phase or the next training step). The
    collective cannot complete before its last rank arrives anyway."""
    return len(inst.arrived) < inst.phase.group.size


def _claim_ports(
    state: CoordinatorState, inst: Instance, claimed: dict[str, set[int]]
) -> bool:
    """True when a reconfiguration to ``inst``'s plan may start now; False when its job
    recovers, a cross-connect to break is held, a port it touches (its own and those of the
    cross-connects it breaks) is being switched or unknown, or an older waiting phase claimed
    one of its own ports. Either way ``inst``'s own ports are added to ``claimed`` (switch id
    -> ports), so younger phases queue behind it."""
    views = state.views
    ok = inst.job_id not in state.recovering
    for t in inst.plan.targets:
        ports = set(t.ports)
        for xc in views.conflicts(t):
            ports.update(xc.ports())
            if views.held(t.switch_id, xc):
                ok = False
        if views.blocked(t.switch_id, frozenset(ports)):
            ok = False
        c = claimed.setdefault(t.switch_id, set())
        # FIFO on the ports a phase makes circuits on: a later phase may not take an
        # earlier waiting phase's own ports. Breaking a cross-connect both must break
        # is no conflict (adjacent PP pairs both break the DP ring link between them;
        # comparing the extended sets would serialize them one per round).
        if not t.ports.isdisjoint(c):
            ok = False
        c.update(t.ports)
    return ok


def claimed_by_older(state: CoordinatorState, plan: Plan) -> bool:
    """True when a queued phase claims one of ``plan``'s ports, as ``schedule`` counts claims:
    one that is switching, or one whose whole group waits for circuits. (A cross-connect it
    must break that ``plan`` would hold lies on its ports: a plan's ports cover its
    cross-connects.)"""
    for q in state.queue:
        if q.op_id is None and (not q.waiting or held_back(q)):
            continue
        for qt in q.plan.targets:
            for t in plan.targets:
                if t.switch_id == qt.switch_id and not t.ports.isdisjoint(qt.ports):
                    return True
    return False


def blocking_reason(state: CoordinatorState, inst: Instance) -> str:
    """Why ``inst`` still waits, for the ``DEADLINE_EXCEEDED`` message: a recovery, its
    reconfiguration in flight, the holders of what it must break, or older claims."""
    rec = state.recovering.get(inst.job_id)
    if rec is not None:
        return (f"job recovering after a controller restart: ranks "
                f"{sorted(rec.unsynced)[:8]} have not resynced")
    if inst.op_id is not None:
        return "the switches have not confirmed the reconfiguration yet"
    missing = [r for r in inst.phase.group.ranks if r not in inst.arrived]
    if missing:
        return (f"ranks {missing[:8]} of the group have not entered the phase "
                f"({len(missing)} missing)")
    held_by: set[str] = set()
    for t in inst.plan.targets:
        for xc in state.views.conflicts(t):
            if state.views.held(t.switch_id, xc):
                for job in state.jobs.values():
                    for other in [*job.instances.values(), *job.retired]:
                        if other.holders and any(
                            ot.switch_id == t.switch_id and xc in ot.cross_connects
                            for ot in other.plan.targets
                        ):
                            ranks = sorted(other.holders)[:8]
                            held_by.add(f"{other.job_id} ranks {ranks} in {other.phase}")
    if held_by:
        return "cross-connects still held by " + "; ".join(sorted(held_by))
    return "ports claimed by an earlier waiting phase or being switched"
