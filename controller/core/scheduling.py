"""Which waiting phases may switch now, oldest first. Pure: acts on a ``CoordinatorState``.

A waiting phase instance starts a reconfiguration as soon as no cross-connect it must break is
held, none of its ports is being switched or unknown, and no older waiting phase claims one of
its ports (FIFO on ports, so a repeating phase cannot starve a reconfiguration its peers wait
on). A phase whose circuits are there is admitted without a switch (DESIGN.md "Phase
protocol"). A phase that would change a switch in maintenance is refused
``SWITCH_MAINTENANCE`` instead of switching (``maintenance_block``); one that needs an
unreachable switch is refused ``DEVICE_FAILURE`` once that switch has been unreachable for
``device_wait_s`` (``unreachable_block``, issue 14: fail fast and name the switch).
"""

from __future__ import annotations

from lightrail.controller.core.decisions import Decision, Reconfigure
from lightrail.controller.core.planner import Plan
from lightrail.controller.core.records import Instance, JobRecord, Outage
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
        if _switch_unavailable(state, job, inst, now, claimed, out):
            continue
        if not _claim_ports(state, inst, claimed):
            continue
        op_id, targets = state.start_switch(inst, job, inst.phase, inst.plan)
        inst.op_id = op_id
        out.append(Reconfigure(op_id, inst.job_id, inst.phase, targets, plan=inst.plan))
    return out


def _switch_unavailable(
    state: CoordinatorState, job: JobRecord, inst: Instance, now: float,
    claimed: dict[str, set[int]], out: list[Decision],
) -> bool:
    """True when ``inst`` may not switch because a switch it needs is unavailable: in
    maintenance (refused ``SWITCH_MAINTENANCE``), unreachable for ``device_wait_s`` (refused
    ``DEVICE_FAILURE``; refusals appended to ``out``, ``inst`` dequeued), or unreachable for
    less than that (it waits, sending nothing to a switch that does not answer, and holds its
    ports against younger phases in ``claimed``)."""
    block = maintenance_block(state, inst.plan)
    code = ErrorCode.SWITCH_MAINTENANCE
    if block is None and state.unreachable:
        block = unreachable_block(state, inst.plan, now)
        code = ErrorCode.DEVICE_FAILURE
    if block is not None:
        out.extend(state.refuse_waiting(job, inst, code, f"phase {inst.phase}: {block}"))
        state.dequeue(inst)
        state.maybe_drop(job, inst)
        return True
    if state.unreachable and unreachable_need(state, inst.plan) is not None:
        for t in inst.plan.targets:
            claimed.setdefault(t.switch_id, set()).update(t.ports)
        return True
    return False


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


def unreachable_need(state: CoordinatorState, plan: Plan) -> tuple[str, Outage, str] | None:
    """The first unreachable switch ``plan`` needs (a cross-connect to make or break there, or
    ports whose state only a read-back can tell): its id, its outage and what the plan needs
    there; None when ``plan`` needs no unreachable switch. Circuits confirmed before the
    outage need nothing (``SwitchViews.ready``): an optical switch keeps its cross-connects
    while its management port is down."""
    views = state.views
    for t in plan.targets:
        outage = state.unreachable.get(t.switch_id)
        if outage is None:
            continue
        change = views.changes(t)
        if change.cross_connects:
            return t.switch_id, outage, f"{len(change.cross_connects)} cross-connect(s) made there"
        if change.ports or views.blocked(t.switch_id, t.ports):
            return t.switch_id, outage, "its ports switched or read back there"
    return None


def unreachable_block(
    state: CoordinatorState, plan: Plan, now: float | None
) -> str | None:
    """Why a phase on ``plan`` is refused rather than left waiting: it needs an unreachable
    switch (``unreachable_need``) that has been unreachable for ``state.device_wait_s``
    (``now`` None: whatever the wait, as provisioning asks). A message naming the switch, its
    last error and how long it has been unreachable; None otherwise (within the wait the
    phase waits, and switches nothing there)."""
    need = unreachable_need(state, plan)
    if need is None:
        return None
    sid, outage, what = need
    down_s = 0.0 if now is None else now - outage.since_s
    if now is not None and down_s < state.device_wait_s:
        return None
    return (f"switch {sid!r} is unreachable ({outage.error}) for {down_s:.1f} s: the phase "
            f"needs {what}; phases on its confirmed circuits and on other switches go on")


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
                        # held per ingress port (``SwitchViews.held``): a holder whose plan
                        # uses the port holds whatever cross-connect is on it
                        if other.holders and any(
                            ot.switch_id == t.switch_id and xc.ingress in ot.ingress
                            for ot in other.plan.targets
                        ):
                            ranks = sorted(other.holders)[:8]
                            unsure = ("" if other.verified else
                                      " (on circuits not confirmed on the switches: they "
                                      "release it first)")
                            held_by.add(f"{other.job_id} ranks {ranks} in {other.phase}"
                                        f"{unsure}")
    if held_by:
        return "cross-connects still held by " + "; ".join(sorted(held_by))
    return _port_wait(state, inst)


def _port_wait(state: CoordinatorState, inst: Instance) -> str:
    """What the ports of ``inst`` wait for: an unreachable switch, a read-back of ports left
    unknown by a failed apply, another phase switching them, or an older waiting phase that
    claims them (named)."""
    views = state.views
    waits: list[str] = []
    for t in inst.plan.targets:
        sid = t.switch_id
        outage = state.unreachable.get(sid)
        if outage is not None:
            waits.append(f"switch {sid!r} unreachable ({outage.error}); a phase that needs it "
                         f"is refused after controller.device_wait_s = "
                         f"{state.device_wait_s:g} s")
            continue
        unknown = sorted(t.ports & views.unknown[sid])
        if unknown:
            waits.append(f"ports {unknown[:8]} of switch {sid!r} unknown after a failed "
                         "apply: waiting for the switch to be read back")
        inflight = sorted(t.ports & views.inflight[sid])
        if inflight:
            waits.append(f"ports {inflight[:8]} of switch {sid!r} being switched for "
                         "another phase")
    if waits:
        return "; ".join(waits)
    for q in state.queue:
        if q is inst:
            break
        if q.op_id is None and (not q.waiting or held_back(q)):
            continue
        for qt in q.plan.targets:
            for t in inst.plan.targets:
                if t.switch_id == qt.switch_id and not t.ports.isdisjoint(qt.ports):
                    shared = sorted(t.ports & qt.ports)[:8]
                    return (f"ports {shared} of switch {t.switch_id!r} claimed by an earlier "
                            f"waiting phase ({q.job_id} {q.phase})")
    return "ports claimed by an earlier waiting phase or being switched"
