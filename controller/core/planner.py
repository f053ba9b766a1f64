"""Rail planner: the cross-connects a phase needs on each switch. Pure: no I/O, no clock.

Rules (DESIGN.md "Core semantics"; Opus, "Photonic rails", and PCCL for the circuit shapes):

* A collective on a process group becomes, on each rail, circuits among the *hosts* whose NICs
  on that rail carry ranks of the group. Ranks on one host reach each other over scale-up
  (NVLink) and need no circuit; a host with several group ranks appears once per rail. On each
  rail the hosts are ordered by their lowest group rank.
* ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER and BROADCAST use a unidirectional ring:
  host i's Tx (ingress) -> host i+1's Rx (egress), the last back to the first. Two hosts give a
  bidirectional pair. (Ring algorithms as in NCCL; Opus serves DP with a ring per rail.)
* SEND_RECV (PP) uses bidirectional pairs of consecutive hosts: (h0, h1), (h2, h3), ...;
  an odd host out gets no circuit. A PP group normally has two ranks.
* ALL_TO_ALL is served as a sequence of k-1 shift permutations over the k hosts of the rail:
  sub-phase ``step`` s (0-based) connects host i -> host (i + s + 1) mod k. The job-side library
  steps a rank through them (``all_to_all_steps``). This is the time-multiplexed matching
  schedule (PCCL; also SiP-ML's "sequence of permutations").
* On a duplex switch a cross-connect joins two ports both ways, so only pairs can be served: a
  ring or shift over more than two hosts raises ``PlanError``.

Every cross-connect a plan contains lies on ports the job owns (the endpoints of its ranks'
GPUs), which is how jobs on disjoint ports never touch each other's circuits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lightrail.controller.domain.fabric import Endpoint, Fabric
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.drivers.base import CrossConnect, SwitchKind

_RING = frozenset(
    {Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER, Collective.BROADCAST}
)


class PlanError(ValueError):
    """A phase cannot be planned on this fabric; the message names the field and value."""


class PlacementError(ValueError):
    """A job's rank placement is invalid; the message names the rank and the field."""


@dataclass(frozen=True, slots=True)
class SwitchTarget:
    """The cross-connects a plan needs on one switch, and the ports they occupy. ``ingress``:
    the ingress port of each cross-connect (one per cross-connect, as a switch's cross-connects
    form a partial permutation), computed once so that holding a plan is a set operation
    (``SwitchViews.hold``)."""

    switch_id: str
    cross_connects: frozenset[CrossConnect]
    ports: frozenset[int]
    ingress: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ingress",
                           frozenset([xc.ingress for xc in self.cross_connects]))


@dataclass(frozen=True, slots=True)
class Plan:
    """The circuits one phase needs: one ``SwitchTarget`` per switch it touches (possibly none,
    when every rank of the group sits on one host)."""

    targets: tuple[SwitchTarget, ...]

    @property
    def empty(self) -> bool:
        """True when the phase needs no circuit."""
        return not self.targets


@dataclass(frozen=True, slots=True)
class JobLayout:
    """A job's ranks mapped onto the fabric. ``endpoints[rank]`` is the NIC endpoint of the
    rank's GPU; ``owned_ports`` maps switch id to the ports the job may touch."""

    job_id: str
    placements: tuple[RankPlacement, ...]
    endpoints: tuple[Endpoint, ...]
    owned_ports: Mapping[str, frozenset[int]]
    _switch_kind: Mapping[str, SwitchKind] = field(repr=False, compare=False)

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self.placements)

    @property
    def hosts(self) -> tuple[str, ...]:
        """The hosts the job runs on, in rank order of first appearance."""
        return tuple(dict.fromkeys(p.host for p in self.placements))


def layout_job(
    fabric: Fabric,
    job_id: str,
    placements: Sequence[RankPlacement],
    gpus_in_use: Mapping[tuple[str, int], str] | None = None,
) -> JobLayout:
    """Validate a placement and map it onto the fabric.

    ``placements`` must list ranks 0..n-1, each once, in any order. ``gpus_in_use`` maps
    (host, gpu) to the job already using it. Raises ``PlacementError`` naming the rank and the
    offending field: a rank missing or repeated, an unknown host, a GPU without a NIC, a GPU
    used twice or already used by another job.
    """
    if not placements:
        raise PlacementError(f"job {job_id!r}: ranks: empty")
    by_rank: dict[int, RankPlacement] = {}
    for p in placements:
        if p.rank in by_rank:
            raise PlacementError(f"job {job_id!r}: ranks[{p.rank}]: rank listed twice")
        by_rank[p.rank] = p
    n = len(by_rank)
    for r in range(n):
        if r not in by_rank:
            raise PlacementError(
                f"job {job_id!r}: ranks: rank {r} missing (ranks must be 0..{n - 1})"
            )
    ordered = tuple(by_rank[r] for r in range(n))
    seen: dict[tuple[str, int], int] = {}
    endpoints: list[Endpoint] = []
    owned: dict[str, set[int]] = {}
    for p in ordered:
        if p.host not in fabric.hosts:
            raise PlacementError(f"job {job_id!r}: ranks[{p.rank}].host: unknown host {p.host!r}")
        if not fabric.has_gpu(p.host, p.gpu):
            raise PlacementError(
                f"job {job_id!r}: ranks[{p.rank}].gpu: {p.host} has no wired GPU {p.gpu}"
            )
        where = (p.host, p.gpu)
        if where in seen:
            raise PlacementError(
                f"job {job_id!r}: ranks[{p.rank}].gpu: {p.host}/gpu{p.gpu} already holds "
                f"rank {seen[where]}"
            )
        other = (gpus_in_use or {}).get(where)
        if other is not None and other != job_id:
            raise PlacementError(
                f"job {job_id!r}: ranks[{p.rank}].gpu: {p.host}/gpu{p.gpu} is used by job "
                f"{other!r}"
            )
        seen[where] = p.rank
        ep = fabric.endpoint_of_gpu(p.host, p.gpu)
        endpoints.append(ep)
        owned.setdefault(ep.switch_id, set()).update((ep.tx_port, ep.rx_port))
    kinds = {sid: fabric.switches[sid].capabilities.kind for sid in owned}
    return JobLayout(
        job_id=job_id,
        placements=ordered,
        endpoints=tuple(endpoints),
        owned_ports={sid: frozenset(ports) for sid, ports in owned.items()},
        _switch_kind=kinds,
    )


def _hosts_per_switch(layout: JobLayout, group: ProcessGroup) -> dict[str, list[Endpoint]]:
    """Endpoints of the group on each switch, one per host, ordered by lowest group rank."""
    out: dict[str, list[Endpoint]] = {}
    seen: set[tuple[str, str]] = set()
    world = layout.world_size
    for rank in group.ranks:
        if rank >= world:
            raise PlanError(
                f"job {layout.job_id!r}: phase.group_ranks: rank {rank} >= world size {world}"
            )
        ep = layout.endpoints[rank]
        key = (ep.switch_id, ep.endpoint_id.host)
        if key in seen:
            continue
        seen.add(key)
        out.setdefault(ep.switch_id, []).append(ep)
    return out


def hosts_per_switch(layout: JobLayout, group: ProcessGroup) -> dict[str, list[Endpoint]]:
    """The group's endpoints on each switch, one per host, in the order the planner connects
    them (lowest group rank first). Raises ``PlanError`` for a rank outside the job."""
    return _hosts_per_switch(layout, group)


def all_to_all_steps(layout: JobLayout, group: ProcessGroup) -> int:
    """Number of sub-phases (shift permutations) an all-to-all on ``group`` takes: k-1 for the
    largest number k of hosts the group spans on one rail; 1 when it needs no circuit."""
    per_switch = _hosts_per_switch(layout, group)
    k = max((len(eps) for eps in per_switch.values()), default=1)
    return max(1, k - 1)


def _pairs(
    layout: JobLayout, switch_id: str, pairs: Sequence[tuple[Endpoint, Endpoint]]
) -> frozenset[CrossConnect]:
    """Cross-connects that carry ``a -> b`` for every pair, honouring the switch kind."""
    duplex = layout._switch_kind[switch_id] is SwitchKind.DUPLEX
    out: set[CrossConnect] = set()
    for a, b in pairs:
        if duplex:
            lo, hi = sorted((a.tx_port, b.tx_port))
            out.add(CrossConnect(lo, hi))
        else:
            out.add(CrossConnect(a.tx_port, b.rx_port))
    return frozenset(out)


def plan_phase(layout: JobLayout, phase: PhaseKey) -> Plan:
    """The circuits ``phase`` needs, per switch. ``phase.seq`` does not change the plan.

    Raises ``PlanError`` (naming the field and value) when a rank is outside the job, the step
    of an all-to-all is out of range, or the switch kind cannot carry the pattern.
    """
    per_switch = _hosts_per_switch(layout, phase.group)
    targets: list[SwitchTarget] = []
    coll = phase.collective
    if coll is Collective.ALL_TO_ALL:
        steps = all_to_all_steps(layout, phase.group)
        if phase.step >= steps:
            raise PlanError(
                f"job {layout.job_id!r}: phase.step: {phase.step} out of range for all_to_all "
                f"over {phase.group.size} ranks ({steps} steps)"
            )
    elif phase.step != 0:
        raise PlanError(
            f"job {layout.job_id!r}: phase.step: {phase.step} given for {coll.value} "
            "(only all_to_all has sub-phases)"
        )
    for switch_id in sorted(per_switch):
        eps = per_switch[switch_id]
        k = len(eps)
        if k < 2:
            continue
        duplex = layout._switch_kind[switch_id] is SwitchKind.DUPLEX
        pairs: list[tuple[Endpoint, Endpoint]]
        if coll in _RING:
            if duplex and k > 2:
                raise PlanError(
                    f"job {layout.job_id!r}: switch {switch_id!r} is duplex and cannot carry a "
                    f"ring over {k} hosts for {coll.value}"
                )
            pairs = [(eps[i], eps[(i + 1) % k]) for i in range(k)]
        elif coll is Collective.SEND_RECV:
            pairs = []
            for i in range(0, k - 1, 2):
                pairs.append((eps[i], eps[i + 1]))
                pairs.append((eps[i + 1], eps[i]))
        else:  # ALL_TO_ALL
            shift = phase.step + 1
            if shift >= k:
                continue  # this rail spans fewer hosts than the largest: idle for this step
            if duplex and (2 * shift) % k != 0:
                raise PlanError(
                    f"job {layout.job_id!r}: switch {switch_id!r} is duplex and cannot carry "
                    f"all_to_all shift {shift} over {k} hosts"
                )
            pairs = [(eps[i], eps[(i + shift) % k]) for i in range(k)]
        xcs = _pairs(layout, switch_id, pairs)
        ports = frozenset(p for xc in xcs for p in xc.ports())
        targets.append(SwitchTarget(switch_id, xcs, ports))
    return Plan(tuple(targets))
