"""Failover rewiring: move a failed rank's endpoint onto a spare GPU's ports instead of
migrating the job (LUMION, Morphlux; DESIGN.md "Failover"). Pure: acts on a
``CoordinatorState`` and returns decisions.
"""

from __future__ import annotations

from lightrail.controller.core.decisions import Decision, Rewire
from lightrail.controller.core.planner import Plan, SwitchTarget, layout_job
from lightrail.controller.core.provisioning import Provisioner
from lightrail.controller.core.records import JobRecord, Op, RankState
from lightrail.controller.core.state import CoordinatorState
from lightrail.controller.domain.errors import (
    ErrorCode,
    FailoverBusy,
    FailoverError,
    UnknownJob,
)
from lightrail.controller.domain.fabric import Endpoint
from lightrail.controller.domain.model import RankPlacement
from lightrail.drivers.base import CrossConnect, SwitchKind


def replace_rank(state: CoordinatorState, provisioner: Provisioner, job_id: str, rank: int,
                 host: str, gpu: int) -> list[Decision]:
    """Fail ``rank`` of ``job_id`` over to ``gpu`` of ``host``.

    The job restarts from its checkpoint, so its collectives in flight are void: every waiting
    rank gets ``PLACEMENT_CHANGED`` and the failed rank's holds are dropped (it cannot
    release; live ranks keep theirs until they release). Then the failed endpoint's
    cross-connects are moved to the spare's ports in one ``Rewire`` (breaking only
    cross-connects on ports of this job and the spare, never another job's), and the placement
    is updated. Raises ``UnknownJob``, ``FailoverError`` (rank out of range, the GPU unknown,
    in use, or not wired to the same switch as the failed one; a spare port carrying a held
    cross-connect; a change on a switch in maintenance) and ``FailoverBusy`` (the ports are
    being switched: retry later); nothing changes then.
    """
    job = state.jobs.get(job_id)
    if job is None:
        raise UnknownJob(job_id)
    layout = job.layout
    fabric = state.fabric
    if not 0 <= rank < layout.world_size:
        raise FailoverError(f"rank: {rank} out of range 0..{layout.world_size - 1}")
    if not fabric.has_gpu(host, gpu):
        raise FailoverError(f"spare: {host}/gpu{gpu} is not a wired GPU")
    user = state.gpus.get((host, gpu))
    if user is not None:
        raise FailoverError(f"spare: {host}/gpu{gpu} is used by job {user!r}")
    old_ep = layout.endpoints[rank]
    new_ep = fabric.endpoint_of_gpu(host, gpu)
    if new_ep.switch_id != old_ep.switch_id:
        raise FailoverError(
            f"spare: {host}/gpu{gpu} is wired to {new_ep.switch_id!r}, the failed "
            f"{old_ep.endpoint_id} to {old_ep.switch_id!r}: its circuits cannot move there")
    target = _moved_target(state, old_ep, new_ep)
    out = _restart(state, job, rank,
                   f"rank {rank} failed over from {old_ep.endpoint_id} to "
                   f"{new_ep.endpoint_id}; restart from the last checkpoint")
    # the new placement
    old_p = layout.placements[rank]
    new_p = RankPlacement(rank, host, gpu)
    placements = list(layout.placements)
    placements[rank] = new_p
    del state.gpus[(old_p.host, old_p.gpu)]
    job.layout = layout_job(fabric, job_id, placements, state.gpus)
    state.gpus[(host, gpu)] = job_id
    job.plans.clear()
    job.steps.clear()
    provisioner.reset(job)
    op_id = state.start_op(Op(None, job, job_id, None, Plan((target,)),
                              {target.switch_id: target.ports}))
    out.append(Rewire(op_id, job_id, rank, old_p, new_p, (target,)))
    return out


def _moved_target(state: CoordinatorState, old_ep: Endpoint, new_ep: Endpoint) -> SwitchTarget:
    """The failed endpoint's cross-connects, moved to the spare's ports, on the ports they and
    the spare's stale cross-connects touch. Computed before anything changes: raises
    ``FailoverError`` / ``FailoverBusy`` when those ports are held or being switched."""
    sid = old_ep.switch_id
    views = state.views
    view = views.confirmed[sid]
    old_ports = {old_ep.tx_port, old_ep.rx_port}
    new_of = {old_ep.tx_port: new_ep.tx_port, old_ep.rx_port: new_ep.rx_port}
    duplex = state.fabric.switches[sid].capabilities.kind is SwitchKind.DUPLEX
    moved: set[CrossConnect] = set()
    touched: set[int] = set(old_ports) | {new_ep.tx_port, new_ep.rx_port}
    for p in old_ports:
        xc = view.get(p)
        if xc is None:
            continue
        a, b = new_of.get(xc.ingress, xc.ingress), new_of.get(xc.egress, xc.egress)
        if a > b and duplex:
            a, b = b, a
        moved.add(CrossConnect(a, b))
        touched.update(xc.ports())
    changes = bool(moved)
    for p in (new_ep.tx_port, new_ep.rx_port):
        stale = view.get(p)
        if stale is not None:
            changes = True
            if views.held(sid, stale):
                raise FailoverError(f"spare: port {sid}:{p} carries a held cross-connect")
            touched.update(stale.ports())
    ports = frozenset(touched)
    reason = state.maintenance.get(sid)
    if reason is not None and changes:
        raise FailoverError(f"switch {sid!r} is in maintenance ({reason}): the circuits of "
                            f"{old_ep.endpoint_id} cannot be moved to {new_ep.endpoint_id}")
    if views.blocked(sid, ports):
        raise FailoverBusy(f"switch {sid!r}: ports {sorted(touched)} of the failed or the "
                           "spare endpoint are being switched; retry when that completes")
    return SwitchTarget(sid, frozenset(moved), ports)


def _restart(state: CoordinatorState, job: JobRecord, rank: int, message: str) -> list[Decision]:
    """The job restarts: every waiting rank is refused with ``PLACEMENT_CHANGED`` at once and
    the failed ``rank``'s holds go (it cannot release). Live ranks keep their holds until they
    release: their traffic may still be in flight, so nothing they hold changes except the
    cross-connects to or from the failed endpoint, which carry no live traffic any more."""
    job_id = job.layout.job_id
    out: list[Decision] = []
    for inst in [*job.instances.values(), *job.retired]:
        out.extend(state.refuse_waiting(job, inst, ErrorCode.PLACEMENT_CHANGED, message))
        if rank in inst.holders:
            state.remove_holder(inst, rank)
    for inst in list(job.retired):  # a retired instance the failed rank held last is done
        state.maybe_drop(job, inst)
    state.queue = [i for i in state.queue if i.job_id != job_id]
    for inst in job.instances.values():
        inst.queued = False
    # Instances live ranks still hold (or that are switching) are closed: planned on the old
    # placement, nobody may join them; a rank entering the same phase and step gets a new
    # instance on the new layout, which waits until the old holders release.
    job.retired.extend(i for i in job.instances.values() if i.op_id is not None or i.holders)
    job.instances = {}
    job.ranks[rank].state = RankState.IDLE
    job.ranks[rank].instance = None
    return out
