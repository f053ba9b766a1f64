
"""Fabric cost model: how long a collective takes on given circuits, and what a rail fabric costs.
Pure: no I/O, no clock.

**Time.** The α-β model of Hockney (R. W. Hockney, "The communication challenge for MPP: Intel
Paragon and Meiko CS-2", Parallel Computing 20(3), 1994): sending ``b`` bytes over ``h`` hops
takes ``α·h + β·b`` (α: per-hop latency in s, β: s per byte, 1/bandwidth; forwarding is
pipelined, so the bytes pay β once). A collective algorithm is a sequence of *rounds*; in a round
every participant sends its flows at once. On circuits, a flow between two participants that
are not directly connected is forwarded over the circuits already there along a shortest
directed path (BFS): its hop count is the *dilation*; flows that share a circuit divide its
bandwidth (*congestion*), so a round takes ``α·max_hops + β·max_load`` where ``max_load`` is the
most bytes any one circuit carries in the round. This is the congestion/dilation view of PCCL
(A. Vijaya Kumar, A. Devraj, R. Singh, "PCCL: Photonic circuit-switched collective communication
for distributed ML", arXiv:2509.15450, 2025), which is also where the reconfigure-or-not trade
comes from (``lightrail.controller.core.decision``). On an ideal electrical packet switch every
pair is one hop
away and the only shared resources are each node's uplink and downlink (its NIC).

Algorithms (R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of collective communication
operations in MPICH", IJHPCA 19(1), 2005; NCCL's ring and pipelined ring as used by the NCCL
paper, Hu et al., "Demystifying NCCL", arXiv:2507.04786, 2025):

========================  ===================================================================
ring all-reduce           ``2(n-1)·α + 2(n-1)/n·S·β``
ring reduce-scatter       ``(n-1)·α + (n-1)/n·S·β`` (S: the full input)
ring all-gather           ``(n-1)·α + (n-1)/n·S·β`` (S: the full output)
halving/doubling AR       ``2·log2(n)·α + 2(n-1)/n·S·β`` (n a power of two; Rabenseifner)
direct all-to-all         ``(n-1)·α + (n-1)/n·S·β`` per rank (S: its whole send buffer)
all-to-all on matchings   the same plus ``k·δ`` for k reconfigurations between matchings
pipelined ring broadcast  ``min_c (n-2+c)·(α + S/c·β)`` over chunk counts c
========================  ===================================================================

These closed forms are what :func:`estimate_collective` yields on a matching ring of circuits
(or a packet switch) with no congestion; the tests check it.

**Money and watts.** :func:`estimate_rail_fabric` counts switch ports and transceivers of a
rail-optimised fabric built from electrical packet switches versus one optical circuit switch per
rail (Opus: X. Ding et al., "Photonic Rails in ML Datacenters with Opus", arXiv:2602.12521, 2026),
with the constants in :class:`PowerCostConfig`.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType

from lightrail.controller.domain.model import Collective
from lightrail.drivers.base import SwitchCapabilities

DEFAULT_ALPHA_S = 5e-6
"""Per-hop latency α in s (5 µs: NIC + switch traversal of a RoCE/IB message, NCCL-class)."""
DEFAULT_LINK_GBPS = 100.0
"""Default link bandwidth in Gb/s (one 100 Gb/s NIC per GPU): β = 8e-11 s/B."""
MAX_PIPELINE_CHUNKS = 4096
"""Upper bound on the chunk count of a pipelined broadcast (used when α = 0)."""


class CostModelError(ValueError):
    """An input the cost model cannot price; the message names the argument and the value."""


class UnreachableError(CostModelError):
    """A flow has no directed path over the circuits. ``src``/``dst`` are the node ids."""

    def __init__(self, src: int, dst: int) -> None:
        self.src = src
        self.dst = dst
        super().__init__(f"no directed path over the circuits from node {src} to node {dst}")


@dataclass(frozen=True, slots=True)
class LinkModel:
    """α-β parameters of one link (Hockney 1994).

    ``alpha_s``: per-hop latency in seconds (>= 0). ``beta_s_per_byte``: seconds per byte
    (> 0), i.e. 1/bandwidth. Defaults: α = 5 µs, 100 Gb/s -> β = 8e-11 s/B (NCCL- and
    PCCL-class scale-out NIC). Raises ``CostModelError`` on a negative, zero (β) or
    non-finite value.
    """

    alpha_s: float = DEFAULT_ALPHA_S
    beta_s_per_byte: float = 8.0 / (DEFAULT_LINK_GBPS * 1e9)

    def __post_init__(self) -> None:
        if not math.isfinite(self.alpha_s) or self.alpha_s < 0:
            raise CostModelError(f"LinkModel.alpha_s: must be finite and >= 0, got {self.alpha_s}")
        if not math.isfinite(self.beta_s_per_byte) or self.beta_s_per_byte <= 0:
            raise CostModelError(
                f"LinkModel.beta_s_per_byte: must be finite and > 0, got {self.beta_s_per_byte}")

    @staticmethod
    def from_gbps(gbps: float, alpha_s: float = DEFAULT_ALPHA_S) -> LinkModel:
        """A link of ``gbps`` Gb/s (> 0) and per-hop latency ``alpha_s`` seconds."""
        if not math.isfinite(gbps) or gbps <= 0:
            raise CostModelError(f"link bandwidth: must be finite and > 0 Gb/s, got {gbps}")
        return LinkModel(alpha_s=alpha_s, beta_s_per_byte=8.0 / (gbps * 1e9))

    @property
    def bandwidth_gbps(self) -> float:
        """The bandwidth in Gb/s."""
        return 8.0 / self.beta_s_per_byte / 1e9


class Algorithm(enum.Enum):
    """Collective algorithms the model prices (Thakur, Rabenseifner & Gropp 2005)."""

    RING = "ring"
    HALVING_DOUBLING = "halving_doubling"
    """Recursive halving (reduce-scatter) / doubling (all-gather); n a power of two."""
    DIRECT = "direct"
    """All-to-all as n-1 shift rounds: in round s, rank i sends its S/n to rank i+s."""
    PIPELINED_RING = "pipelined_ring"
    """Broadcast along the ring order as a chain, in chunks."""
    POINT_TO_POINT = "point_to_point"
    """Send/recv: one flow of S bytes from the first participant to the second."""


@dataclass(frozen=True, slots=True, order=True)
class Circuit:
    """A directed circuit from node ``src`` to node ``dst`` (node ids, e.g. host indices on one
    rail). A bidirectional link is two circuits. Raises ``CostModelError`` on a negative id or
    a loop."""

    src: int
    dst: int

    def __post_init__(self) -> None:
        if self.src < 0 or self.dst < 0:
            raise CostModelError(f"Circuit: negative node id in {self.src}->{self.dst}")
        if self.src == self.dst:
            raise CostModelError(f"Circuit: loop on node {self.src}")


class TopologyKind(enum.Enum):
    """What carries the traffic."""

    CIRCUITS = "circuits"
    """Only the listed directed circuits; other pairs are reached by forwarding."""
    PACKET_SWITCHED = "packet_switched"
    """An ideal electrical packet switch: any pair one hop apart at full bandwidth; each node's
    uplink and downlink are its only shared resources."""


@dataclass(frozen=True, slots=True)
class Topology:
    """The network a collective runs on: a packet switch, or a set of directed circuits."""

    kind: TopologyKind
    circuits: frozenset[Circuit] = frozenset()

    @staticmethod
    def of_circuits(circuits: Iterable[Circuit]) -> Topology:
        """The topology made of exactly ``circuits``."""
        return Topology(TopologyKind.CIRCUITS, frozenset(circuits))

    @staticmethod
    def packet_switched() -> Topology:
        """An ideal electrical packet switch (no δ, full bandwidth any-to-any)."""
        return Topology(TopologyKind.PACKET_SWITCHED)

    @staticmethod
    def ring(nodes: Sequence[int]) -> Topology:
        """A unidirectional ring ``nodes[0] -> nodes[1] -> ... -> nodes[0]`` (a bidirectional
        pair for two nodes, nothing for one)."""
        n = len(nodes)
        if n < 2:
            return Topology.of_circuits(())
        return Topology.of_circuits(Circuit(nodes[i], nodes[(i + 1) % n]) for i in range(n))

    @staticmethod
    def shift(nodes: Sequence[int], shift: int) -> Topology:
        """The matching ``nodes[i] -> nodes[(i + shift) % n]`` (0 < shift < n), as the planner
        serves an all-to-all sub-phase."""
        n = len(nodes)
        if not 0 < shift < n:
            raise CostModelError(f"shift: must be in 1..{n - 1}, got {shift}")
        return Topology.of_circuits(Circuit(nodes[i], nodes[(i + shift) % n]) for i in range(n))


@dataclass(frozen=True, slots=True)
class Flow:
    """``nbytes`` (>= 0) from node ``src`` to node ``dst`` within one round."""

    src: int
    dst: int
    nbytes: float


@dataclass(frozen=True, slots=True)
class RoundCost:
    """What one round costs. ``time_s = α·dilation + β·max_load_bytes``.

    ``dilation``: the most hops any flow takes (1 on a direct circuit or a packet switch, 0 when
    no flow crosses the network). ``congestion``: the most flows sharing one circuit (or one
    NIC direction on a packet switch). ``max_load_bytes``: the most bytes one of them carries.
    """

    time_s: float
    dilation: int
    congestion: int
    max_load_bytes: float


@dataclass(frozen=True, slots=True)
class CollectiveEstimate:
    """A collective's completion time on one topology.

    ``time_s`` = ``transfer_s`` + ``reconfiguration_s`` (seconds). ``rounds``: rounds of the
    algorithm; ``dilation`` / ``congestion``: the worst over its rounds (see :class:`RoundCost`);
    ``reconfigurations``: circuit changes inside the collective (matchings only).
    """

    collective: Collective
    algorithm: Algorithm
    participants: int
    nbytes: float
    time_s: float
    transfer_s: float
    rounds: int
    dilation: int
    congestion: int
    reconfigurations: int = 0
    reconfiguration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class _Round:
    flows: tuple[Flow, ...]
    repeat: int


# --- closed forms (Thakur, Rabenseifner & Gropp 2005) ---------------------------------------


def _check_n_bytes(n: int, nbytes: float) -> None:
    if n < 1:
        raise CostModelError(f"n: must be >= 1 participant, got {n}")
    if not math.isfinite(nbytes) or nbytes < 0:
        raise CostModelError(f"nbytes: must be finite and >= 0, got {nbytes}")


def ring_all_reduce_s(n: int, nbytes: float, link: LinkModel) -> float:
    """Ring all-reduce of ``nbytes`` (the buffer S) over ``n`` ranks, in s:
    ``2(n-1)·α + 2(n-1)/n·S·β`` (Thakur, Rabenseifner & Gropp 2005). 0 for n = 1."""
    _check_n_bytes(n, nbytes)
    return 2 * (n - 1) * link.alpha_s + 2 * (n - 1) / n * nbytes * link.beta_s_per_byte


def ring_reduce_scatter_s(n: int, nbytes: float, link: LinkModel) -> float:
    """Ring reduce-scatter of the full input ``nbytes`` (S) over ``n`` ranks, in s:
    ``(n-1)·α + (n-1)/n·S·β`` (Thakur, Rabenseifner & Gropp 2005)."""
    _check_n_bytes(n, nbytes)
    return (n - 1) * link.alpha_s + (n - 1) / n * nbytes * link.beta_s_per_byte


def ring_all_gather_s(n: int, nbytes: float, link: LinkModel) -> float:
    """Ring all-gather producing ``nbytes`` (S, the full output) on each of ``n`` ranks, in s:
    ``(n-1)·α + (n-1)/n·S·β`` (Thakur, Rabenseifner & Gropp 2005)."""
    return ring_reduce_scatter_s(n, nbytes, link)


def halving_doubling_all_reduce_s(n: int, nbytes: float, link: LinkModel) -> float:
    """Recursive halving reduce-scatter + recursive doubling all-gather (Rabenseifner), in s:
    ``2·log2(n)·α + 2(n-1)/n·S·β``. Raises ``CostModelError`` unless n is a power of two."""
    _check_n_bytes(n, nbytes)
    if n & (n - 1):
        raise CostModelError(f"n: halving/doubling needs a power of two, got {n}")
    return 2 * int(math.log2(n)) * link.alpha_s + 2 * (n - 1) / n * nbytes * link.beta_s_per_byte


def direct_all_to_all_s(
    n: int, nbytes: float, link: LinkModel, *, reconfigurations: int = 0, delta_s: float = 0.0
) -> float:
    """Direct all-to-all of a send buffer of ``nbytes`` per rank (S/n to each peer), in s:
    ``(n-1)·α + (n-1)/n·S·β`` on a full mesh (or a packet switch), plus ``k·δ`` when it runs on
    ``k = reconfigurations`` time-multiplexed matchings switched with delay ``delta_s`` each
    (PCCL; the planner's shift matchings)."""
    _check_n_bytes(n, nbytes)
    if reconfigurations < 0 or not math.isfinite(delta_s) or delta_s < 0:
        raise CostModelError(
            f"reconfigurations/delta_s: must be >= 0, got {reconfigurations}/{delta_s}")
    return ((n - 1) * link.alpha_s + (n - 1) / n * nbytes * link.beta_s_per_byte
            + reconfigurations * delta_s)


def _best_chunks(n: int, hop_alpha_s: float, load_beta_s: float) -> int:
    """The chunk count c minimising (n-2+c)·(hop_alpha + load_beta/c)."""
    if load_beta_s <= 0 or n <= 2:
        return 1
    if hop_alpha_s <= 0:
        return MAX_PIPELINE_CHUNKS
    star = math.sqrt((n - 2) * load_beta_s / hop_alpha_s)
    cands = {max(1, min(MAX_PIPELINE_CHUNKS, c)) for c in (math.floor(star), math.ceil(star))}
    return min(sorted(cands), key=lambda c: (n - 2 + c) * (hop_alpha_s + load_beta_s / c))


def pipelined_broadcast_s(n: int, nbytes: float, link: LinkModel) -> float:
    """Pipelined ring (chain) broadcast of ``nbytes`` from the first of ``n`` ranks, in s:
    ``min_c (n-2+c)·(α + S/c·β)`` over chunk counts c >= 1 (NCCL's pipelined ring broadcast;
    Thakur, Rabenseifner & Gropp 2005 for the chain). 0 for n = 1."""
    _check_n_bytes(n, nbytes)
    if n == 1:
        return 0.0
    load = nbytes * link.beta_s_per_byte
    c = _best_chunks(n, link.alpha_s, load)
    return (n - 2 + c) * (link.alpha_s + load / c)


# --- rounds of each algorithm ---------------------------------------------------------------


def candidate_algorithms(collective: Collective, n: int) -> tuple[Algorithm, ...]:
    """The algorithms the model tries for ``collective`` over ``n`` participants, in preference
    order on ties: ring (and halving/doubling when n is a power of two) for all-reduce,
    reduce-scatter and all-gather; pipelined ring for broadcast; direct for all-to-all;
    point-to-point for send/recv."""
    pow2 = n >= 2 and not n & (n - 1)
    if collective in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER):
        return (Algorithm.RING, Algorithm.HALVING_DOUBLING) if pow2 else (Algorithm.RING,)
    if collective is Collective.BROADCAST:
        return (Algorithm.PIPELINED_RING,)
    if collective is Collective.ALL_TO_ALL:
        return (Algorithm.DIRECT,)
    return (Algorithm.POINT_TO_POINT,)


def _rounds(
    collective: Collective, algorithm: Algorithm, nodes: Sequence[int], nbytes: float
) -> list[_Round]:
    n = len(nodes)
    if algorithm not in candidate_algorithms(collective, n):
        raise CostModelError(
            f"algorithm: {algorithm.value} does not implement {collective.value} over {n} nodes")
    if algorithm is Algorithm.RING:
        ring = tuple(Flow(nodes[i], nodes[(i + 1) % n], nbytes / n) for i in range(n))
        repeat = 2 * (n - 1) if collective is Collective.ALL_REDUCE else n - 1
        return [_Round(ring, repeat)]
    if algorithm is Algorithm.HALVING_DOUBLING:
        steps = int(math.log2(n))
        halving = []
        for j in range(steps):
            d = n >> (j + 1)
            size = nbytes / (2 ** (j + 1))
            halving.append(_Round(tuple(Flow(nodes[i], nodes[i ^ d], size) for i in range(n)), 1))
        if collective is Collective.REDUCE_SCATTER:
            return halving
        if collective is Collective.ALL_GATHER:
            return halving[::-1]
        return [*halving, *halving[::-1]]
    if algorithm is Algorithm.DIRECT:
        return [_Round(tuple(Flow(nodes[i], nodes[(i + s) % n], nbytes / n) for i in range(n)), 1)
                for s in range(1, n)]
    if algorithm is Algorithm.POINT_TO_POINT:
        if n != 2:
            raise CostModelError(f"participants: send/recv needs exactly 2 nodes, got {n}")
        return [_Round((Flow(nodes[0], nodes[1], nbytes),), 1)]
    # PIPELINED_RING: a chain from nodes[0]; the chunk count is chosen by the caller.
    return [_Round(tuple(Flow(nodes[i], nodes[i + 1], nbytes) for i in range(n - 1)), 1)]


# --- routing and rounds on a topology ------------------------------------------------------


@lru_cache(maxsize=4096)
def _adjacency(topology: Topology) -> Mapping[int, tuple[Circuit, ...]]:
    adj: dict[int, list[Circuit]] = {}
    for c in sorted(topology.circuits):
        adj.setdefault(c.src, []).append(c)
    return MappingProxyType({k: tuple(v) for k, v in adj.items()})


@lru_cache(maxsize=65536)
def _route(topology: Topology, src: int, dst: int) -> tuple[Circuit, ...]:
    """Shortest directed path src -> dst (BFS; ties broken by ascending node id)."""
    adj = _adjacency(topology)
    parent: dict[int, Circuit] = {}
    seen = {src}
    queue = deque([src])
    while queue:
        u = queue.popleft()
        if u == dst:
            break
        for c in adj.get(u, ()):
            if c.dst not in seen:
                seen.add(c.dst)
                parent[c.dst] = c
                queue.append(c.dst)
    if dst not in seen:
        raise UnreachableError(src, dst)
    path: list[Circuit] = []
    node = dst
    while node != src:
        c = parent[node]
        path.append(c)
        node = c.src
    return tuple(reversed(path))


def hop_count(topology: Topology, src: int, dst: int) -> int:
    """Hops from ``src`` to ``dst``: the length of the shortest directed path over the circuits
    (BFS), 1 on a packet switch, 0 when src == dst. Raises ``UnreachableError`` when there is
    no path."""
    if src == dst:
        return 0
    if topology.kind is TopologyKind.PACKET_SWITCHED:
        return 1
    return len(_route(topology, src, dst))


def round_cost(topology: Topology, flows: Iterable[Flow], link: LinkModel) -> RoundCost:
    """Cost of one round in which all ``flows`` run at once, in s:
    ``α·max_hops + β·max_load`` (Hockney per hop; congestion and dilation as in PCCL).

    On circuits each flow follows its shortest directed path and loads every circuit on it; on
    a packet switch it loads its source's uplink and its destination's downlink. Flows from a
    node to itself are free. Raises ``UnreachableError`` when a flow has no path and
    ``CostModelError`` on negative or non-finite bytes.
    """
    load: dict[object, float] = {}
    count: dict[object, int] = {}
    dilation = 0
    packet = topology.kind is TopologyKind.PACKET_SWITCHED
    for f in flows:
        if not math.isfinite(f.nbytes) or f.nbytes < 0:
            raise CostModelError(f"Flow.nbytes: must be finite and >= 0, got {f.nbytes}")
        if f.src == f.dst:
            continue
        resources: tuple[object, ...]
        if packet:
            resources = (("up", f.src), ("down", f.dst))
            hops = 1
        else:
            path = _route(topology, f.src, f.dst)
            resources = path
            hops = len(path)
        dilation = max(dilation, hops)
        for r in resources:
            load[r] = load.get(r, 0.0) + f.nbytes
            count[r] = count.get(r, 0) + 1
    max_load = max(load.values(), default=0.0)
    return RoundCost(
        time_s=link.alpha_s * dilation + link.beta_s_per_byte * max_load,
        dilation=dilation,
        congestion=max(count.values(), default=0),
        max_load_bytes=max_load,
    )


@dataclass(frozen=True, slots=True)
class _Profile:
    """One distinct round of an algorithm for S = 1 byte: ``repeat`` times, ``dilation`` hops,
    ``congestion`` flows on the busiest resource, ``unit_load`` bytes on it per byte of S."""

    repeat: int
    dilation: int
    congestion: int
    unit_load: float


@lru_cache(maxsize=16384)
def _profiles(
    topology: Topology, collective: Collective, algorithm: Algorithm, nodes: tuple[int, ...]
) -> tuple[_Profile, ...]:
    """Round profiles for S = 1 (loads are linear in S, so one profile serves every size)."""
    out = []
    for r in _rounds(collective, algorithm, nodes, 1.0):
        cost = round_cost(topology, r.flows, _UNIT_LINK)
        out.append(_Profile(r.repeat, cost.dilation, cost.congestion, cost.max_load_bytes))
    return tuple(out)


_UNIT_LINK = LinkModel(0.0, 1.0)


def _estimate(
    topology: Topology,
    collective: Collective,
    algorithm: Algorithm,
    nodes: tuple[int, ...],
    nbytes: float,
    link: LinkModel,
) -> CollectiveEstimate:
    n = len(nodes)
    profiles = _profiles(topology, collective, algorithm, nodes)
    a, b = link.alpha_s, link.beta_s_per_byte
    if algorithm is Algorithm.PIPELINED_RING:
        unit = profiles[0]
        load_s = b * unit.unit_load * nbytes
        c = _best_chunks(n, a * unit.dilation, load_s)
        total_rounds = n - 2 + c
        time_s = total_rounds * (a * unit.dilation + load_s / c)
        return CollectiveEstimate(collective, algorithm, n, nbytes, time_s, time_s, total_rounds,
                                  unit.dilation, unit.congestion)
    time_s = 0.0
    dilation = congestion = total_rounds = 0
    for pr in profiles:
        time_s += pr.repeat * (a * pr.dilation + b * pr.unit_load * nbytes)
        total_rounds += pr.repeat
        dilation = max(dilation, pr.dilation)
        congestion = max(congestion, pr.congestion)
    return CollectiveEstimate(collective, algorithm, n, nbytes, time_s, time_s, total_rounds,
                              dilation, congestion)


def estimate_collective(
    topology: Topology,
    collective: Collective,
    participants: Sequence[int],
    nbytes: float,
    link: LinkModel,
    algorithm: Algorithm | None = None,
) -> CollectiveEstimate:
    """Completion time of ``collective`` over ``participants`` on ``topology``.

    ``participants``: distinct node ids in ring order (rank order in the group; the first is
    the broadcast root / the send/recv sender). ``nbytes`` (S, bytes, >= 0): the all-reduce
    buffer, the reduce-scatter *input*, the all-gather *output*, the all-to-all send buffer of
    one rank, the broadcast buffer, the send/recv message. ``algorithm``: force one; ``None``
    takes the fastest of :func:`candidate_algorithms` that can run (all flows routable).

    On a ring of circuits matching the participants' order (or on a packet switch, for the ring
    algorithms) this equals the closed forms of the module docstring; on other circuits the
    flows are forwarded (dilation) and share circuits (congestion). Raises ``UnreachableError``
    when no candidate's flows can be routed and ``CostModelError`` on bad arguments (duplicate
    participants, negative bytes, an algorithm that does not implement the collective).
    """
    nodes = tuple(participants)
    if len(set(nodes)) != len(nodes):
        raise CostModelError(f"participants: duplicate node in {nodes}")
    _check_n_bytes(len(nodes), nbytes)
    if len(nodes) == 1:
        alg = algorithm or candidate_algorithms(collective, 1)[0]
        return CollectiveEstimate(collective, alg, 1, nbytes, 0.0, 0.0, 0, 0, 0)
    if algorithm is not None:
        return _estimate(topology, collective, algorithm, nodes, nbytes, link)
    best: CollectiveEstimate | None = None
    first_error: UnreachableError | None = None
    for alg in candidate_algorithms(collective, len(nodes)):
        try:
            est = _estimate(topology, collective, alg, nodes, nbytes, link)
        except UnreachableError as exc:
            first_error = first_error or exc
            continue
        if best is None or est.time_s < best.time_s:
            best = est
    if best is None:
        assert first_error is not None
        raise first_error
    return best


def estimate_all_to_all_on_matchings(
    participants: Sequence[int], nbytes: float, link: LinkModel, delta_s: float
) -> CollectiveEstimate:
    """All-to-all over ``participants`` served as n-1 time-multiplexed shift matchings (the
    planner's sub-phases: in step s node i is connected to node i+s), each switched with delay
    ``delta_s`` (s): ``(n-1)·(α + S/n·β) + (n-1)·δ``. The first switch may hide in a compute
    gap; that is the caller's (``lightrail.controller.core.decision``) business:
    ``reconfiguration_s`` counts
    all n-1. Sources: PCCL (matchings vs forwarding), SiP-ML (sequence of permutations)."""
    nodes = tuple(participants)
    n = len(nodes)
    _check_n_bytes(n, nbytes)
    if not math.isfinite(delta_s) or delta_s < 0:
        raise CostModelError(f"delta_s: must be finite and >= 0, got {delta_s}")
    if n == 1:
        return CollectiveEstimate(Collective.ALL_TO_ALL, Algorithm.DIRECT, 1, nbytes, 0.0, 0.0,
                                  0, 0, 0)
    transfer = 0.0
    for s in range(1, n):
        flows = [Flow(nodes[i], nodes[(i + s) % n], nbytes / n) for i in range(n)]
        transfer += round_cost(Topology.shift(nodes, s), flows, link).time_s
    recon = (n - 1) * delta_s
    return CollectiveEstimate(Collective.ALL_TO_ALL, Algorithm.DIRECT, n, nbytes,
                              transfer + recon, transfer, n - 1, 1, 1, n - 1, recon)


def reconfiguration_delay_s(capabilities: Iterable[SwitchCapabilities]) -> float:
    """The reconfiguration delay δ (s) of switching the given switches together: the largest of
    their ``settle_time_s`` (switches reconfigure in parallel, DESIGN.md "Reconfiguration");
    0 for none."""
    return max((c.settle_time_s for c in capabilities), default=0.0)


# --- hierarchical (scale-up + rails) decomposition -------------------------------------------


class Tier(enum.Enum):
    """Where a stage of a hierarchical collective runs."""

    SCALE_UP = "scale_up"
    """Inside the host, over NVLink / NVSwitch (an ideal packet switch)."""
    RAIL = "rail"
    """Across hosts, on each rail in parallel."""


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of a hierarchical collective: ``collective`` over ``participants`` peers on
    ``tier`` with S = ``nbytes`` (same meaning as in :func:`estimate_collective`)."""

    tier: Tier
    collective: Collective
    participants: int
    nbytes: float


def hierarchical_stages(
    collective: Collective, nbytes: float, hosts: int, ranks_per_host: int
) -> tuple[Stage, ...]:
    """Split a collective over ``hosts`` x ``ranks_per_host`` ranks (one rank per GPU, GPU g on
    rail g) into scale-up and per-rail stages, the usual two-level decomposition (NCCL's
    NVLink + NIC rings; Opus runs DP as one ring per rail). ``nbytes`` as the
    :class:`~lightrail.agents.replay.trace.model.CommOp` meaning *converted to S* by the caller
    (all-gather: the full output). With m = ranks_per_host and H = hosts:

    * all-reduce S: scale-up reduce-scatter (m, S); per rail all-reduce (H, S/m); scale-up
      all-gather (m, S).
    * reduce-scatter S: scale-up reduce-scatter (m, S); per rail reduce-scatter (H, S/m).
    * all-gather S: per rail all-gather (H, S/m); scale-up all-gather (m, S).
    * broadcast S: scale-up scatter from the root, priced as a reduce-scatter (m, S); per rail
      broadcast (H, S/m); scale-up all-gather (m, S).
    * all-to-all S: per rail all-to-all (H, S) - each rank's off-host bytes S·(H-1)/H leave on
      the rails, m·S/(mH) to each host per rail; then a scale-up all-to-all (m, S) standing in
      for the NVLink relay (PXN). An approximation: it overcounts the scale-up part.
    * send/recv S: point-to-point (2, S) between the first two hosts on the rail (a PP
      group has two ranks).

    On one host (hosts = 1) the whole collective is one scale-up stage over m ranks. Stages
    over one participant are left out. Raises ``CostModelError`` for hosts or ranks_per_host
    < 1 or bad bytes.
    """
    if hosts < 1 or ranks_per_host < 1:
        raise CostModelError(
            f"hosts/ranks_per_host: must be >= 1, got {hosts}/{ranks_per_host}")
    _check_n_bytes(hosts, nbytes)
    m, h = ranks_per_host, hosts
    su, rail = Tier.SCALE_UP, Tier.RAIL
    c = Collective
    stages: list[Stage]
    if h == 1:
        stages = [Stage(su, collective, m, nbytes)]
    elif collective is c.ALL_REDUCE:
        stages = [Stage(su, c.REDUCE_SCATTER, m, nbytes), Stage(rail, c.ALL_REDUCE, h, nbytes / m),
                  Stage(su, c.ALL_GATHER, m, nbytes)]
    elif collective is c.REDUCE_SCATTER:
        stages = [Stage(su, c.REDUCE_SCATTER, m, nbytes),
                  Stage(rail, c.REDUCE_SCATTER, h, nbytes / m)]
    elif collective is c.ALL_GATHER:
        stages = [Stage(rail, c.ALL_GATHER, h, nbytes / m), Stage(su, c.ALL_GATHER, m, nbytes)]
    elif collective is c.BROADCAST:
        stages = [Stage(su, c.REDUCE_SCATTER, m, nbytes), Stage(rail, c.BROADCAST, h, nbytes / m),
                  Stage(su, c.ALL_GATHER, m, nbytes)]
    elif collective is c.ALL_TO_ALL:
        stages = [Stage(rail, c.ALL_TO_ALL, h, nbytes), Stage(su, c.ALL_TO_ALL, m, nbytes)]
    else:
        stages = [Stage(rail, c.SEND_RECV, 2, nbytes)]
    return tuple(s for s in stages if s.participants > 1)


# --- network power and cost ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PowerCostConfig:
    """Constants of the power and cost estimate (all per port or per module of the rail's line
    rate, 800G class). Override any of them.

    Sources. Opus (X. Ding et al., "Photonic Rails in ML Datacenters with Opus",
    arXiv:2602.12521, 2026) reports only the outcome - "over 23x network power reduction and
    4x cost savings" for photonic rails versus electrical rails, up to 2,048 GPUs - in what we
    could find (its abstract and summaries); its per-component constants were NOT found, so the
    values below are our ASSUMPTIONS unless a source is named:

    * ``eps_radix`` = 64 ports of 800G: Broadcom Tomahawk 5, 51.2 Tb/s (vendor material).
    * ``eps_port_power_w`` = 913 W / 64 ≈ 14.3 W: a 64 x 800G Tomahawk 5 switch, "913 W typical
      (no transceivers)" (UfiSpace S9321-64E data sheet as quoted by IP Infusion).
    * ``transceiver_power_w`` = 16 W: ASSUMPTION (800G OSFP DR8-class module; the same data
      sheet budgets up to 30 W per cage).
    * ``ocs_port_power_w`` = 0.5 W: ASSUMPTION (MEMS mirrors hold their state with little power;
      order of 100 W for a few hundred ports).
    * ``eps_port_cost_usd`` = 1,000, ``transceiver_cost_usd`` = 800, ``ocs_port_cost_usd`` = 500:
      ASSUMPTIONS (no public list prices found).

    ``assumptions``: further notes to carry into the estimate; :func:`power_cost_notes` states
    which of the constants above are assumed and which differ from these defaults.
    """

    eps_radix: int = 64
    eps_port_power_w: float = 913.0 / 64
    transceiver_power_w: float = 16.0
    ocs_port_power_w: float = 0.5
    eps_port_cost_usd: float = 1000.0
    transceiver_cost_usd: float = 800.0
    ocs_port_cost_usd: float = 500.0
    assumptions: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.eps_radix < 2:
            raise CostModelError(f"PowerCostConfig.eps_radix: must be >= 2, got {self.eps_radix}")
        for name in ("eps_port_power_w", "transceiver_power_w", "ocs_port_power_w",
                     "eps_port_cost_usd", "transceiver_cost_usd", "ocs_port_cost_usd"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise CostModelError(f"PowerCostConfig.{name}: must be finite and >= 0, got {v}")


POWER_COST_CONSTANTS: Mapping[str, str] = MappingProxyType({
    "eps_radix": "EPS switch radix {:g} ports",
    "eps_port_power_w": "EPS port {:.4g} W",
    "transceiver_power_w": "transceiver {:g} W",
    "ocs_port_power_w": "OCS port {:g} W",
    "eps_port_cost_usd": "EPS port ${:,.0f}",
    "transceiver_cost_usd": "transceiver ${:,.0f}",
    "ocs_port_cost_usd": "OCS port ${:,.0f}",
})
"""The constants of :class:`PowerCostConfig` and how to print each (units: ports, W, USD)."""

_ASSUMED = ("transceiver_power_w", "ocs_port_power_w", "eps_port_cost_usd",
            "transceiver_cost_usd", "ocs_port_cost_usd")


def changed_constants(config: PowerCostConfig) -> tuple[str, ...]:
    """The names of the constants of ``config`` that differ from ``PowerCostConfig()``'s, in
    ``POWER_COST_CONSTANTS`` order."""
    defaults = PowerCostConfig()
    return tuple(n for n in POWER_COST_CONSTANTS if getattr(config, n) != getattr(defaults, n))


def describe_constants(config: PowerCostConfig) -> str:
    """Every constant of ``config`` in one line (``EPS switch radix 64 ports, EPS port 14.27 W,
    ...``), those that differ from the defaults marked ``(changed)``."""
    changed = changed_constants(config)
    return ", ".join(fmt.format(getattr(config, n)) + (" (changed)" if n in changed else "")
                     for n, fmt in POWER_COST_CONSTANTS.items())


def power_cost_notes(config: PowerCostConfig) -> tuple[str, ...]:
    """What the estimate with ``config`` assumes: the default constants still in use that are
    assumptions (Opus's were not found), the sourced EPS port power when in use, the
    constants changed from the defaults, then ``config.assumptions``."""
    changed = changed_constants(config)
    notes: list[str] = []
    assumed = [POWER_COST_CONSTANTS[n].format(getattr(config, n)) for n in _ASSUMED
               if n not in changed]
    if assumed:
        notes.append("Opus (arXiv:2602.12521) per-component power/cost constants not found: "
                     + ", ".join(assumed) + " are assumptions")
    if "eps_port_power_w" not in changed:
        notes.append("EPS port power 913 W / 64 ports (Tomahawk 5 64x800G switch without "
                     "optics, vendor data sheet)")
    if changed:
        notes.append("changed from the defaults: " + ", ".join(
            POWER_COST_CONSTANTS[n].format(getattr(config, n)) for n in changed))
    return (*notes, *config.assumptions)


@dataclass(frozen=True, slots=True)
class FabricBill:
    """Ports, transceivers, watts and dollars of one way of building the rails.
    ``nic_transceivers``: one per host NIC (the same in both fabrics);
    ``switch_transceivers``: those at switch ports (none at an OCS, which is transparent)."""

    switch_ports: int
    switch_tiers: int
    nic_transceivers: int
    switch_transceivers: int
    power_w: float
    cost_usd: float
    power_excl_nic_w: float
    cost_excl_nic_usd: float


@dataclass(frozen=True, slots=True)
class RailFabricEstimate:
    """Electrical packet-switched rails versus photonic rails (one OCS per rail) for ``hosts``
    x ``rails`` GPUs. Ratios are electrical / photonic (> 1: photonic is cheaper);
    ``config``: the constants used; ``assumptions``: ``power_cost_notes(config)``."""

    hosts: int
    rails: int
    electrical: FabricBill
    photonic: FabricBill
    power_ratio: float
    cost_ratio: float
    power_ratio_excl_nic: float
    cost_ratio_excl_nic: float
    assumptions: tuple[str, ...]
    config: PowerCostConfig


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf


def estimate_rail_fabric(
    hosts: int, rails: int, config: PowerCostConfig | None = None
) -> RailFabricEstimate:
    """Power (W) and cost (USD) of a rail-optimised fabric of ``hosts`` hosts x ``rails`` rails
    (one NIC per GPU, NIC r of every host on rail r; Opus's photonic rails).

    Electrical rails: per rail, one packet switch when hosts <= radix; otherwise a non-blocking
    two-tier leaf/spine (each leaf radix/2 down, radix/2 up): 3·hosts ports per rail. Every
    link carries a transceiver at both ends (NIC-switch and leaf-spine).
    Photonic rails: one OCS per rail with one duplex port (an ingress/egress pair of an N x N
    switch) per host; transceivers only at the NICs. Raises ``CostModelError`` for hosts or
    rails < 1.
    """
    if hosts < 1 or rails < 1:
        raise CostModelError(f"hosts/rails: must be >= 1, got {hosts}/{rails}")
    cfg = config or PowerCostConfig()
    two_tier = hosts > cfg.eps_radix
    eps_ports_per_rail = 3 * hosts if two_tier else hosts
    eps_switch_xcvr_per_rail = (3 if two_tier else 1) * hosts
    nic = hosts * rails

    def bill(
        ports: int, tiers: int, switch_xcvr: int, port_w: float, port_usd: float
    ) -> FabricBill:
        p_ex = ports * port_w + switch_xcvr * cfg.transceiver_power_w
        c_ex = ports * port_usd + switch_xcvr * cfg.transceiver_cost_usd
        return FabricBill(
            switch_ports=ports, switch_tiers=tiers, nic_transceivers=nic,
            switch_transceivers=switch_xcvr,
            power_w=p_ex + nic * cfg.transceiver_power_w,
            cost_usd=c_ex + nic * cfg.transceiver_cost_usd,
            power_excl_nic_w=p_ex, cost_excl_nic_usd=c_ex,
        )

    eps = bill(eps_ports_per_rail * rails, 2 if two_tier else 1, eps_switch_xcvr_per_rail * rails,
               cfg.eps_port_power_w, cfg.eps_port_cost_usd)
    ocs = bill(hosts * rails, 1, 0, cfg.ocs_port_power_w, cfg.ocs_port_cost_usd)
    return RailFabricEstimate(
        hosts=hosts, rails=rails, electrical=eps, photonic=ocs,
        power_ratio=_ratio(eps.power_w, ocs.power_w),
        cost_ratio=_ratio(eps.cost_usd, ocs.cost_usd),
        power_ratio_excl_nic=_ratio(eps.power_excl_nic_w, ocs.power_excl_nic_w),
        cost_ratio_excl_nic=_ratio(eps.cost_excl_nic_usd, ocs.cost_excl_nic_usd),
        assumptions=power_cost_notes(cfg),
        config=cfg,
    )
