"""Tenant slices of a torus fabric: contiguous first, else stitched by photonic rewiring.

Pure planning core (no I/O). A tenant asks for a slice by ``size`` (chips) or by ``shape``
(e.g. ``4x4x1``). Two policies share this allocator so that they can be compared on one trace:

- ``CONTIGUOUS_ONLY``: a plain electrical torus (TPU-style). A slice is a free box of the torus
  (any offset, wrapping, any axis permutation). Its links are the fixed torus wires inside the
  box; a dimension is a ring only when the box spans the whole torus along it.
- ``LIGHTRAIL``: the same torus with a silicon-photonic switch in every ``2x2x1`` server
  (Morphlux, arXiv:2508.03674). Contiguous boxes first; otherwise a *stitched* slice made of free
  chips of several servers that the photonic switches connect into the requested shape.

Rewiring model (what the photonic switches can and cannot connect; assumptions, our reading of
Morphlux, which does not spell out a switch-level model in its abstract):

- R1 Inside a server the switch is a strictly non-blocking crossbar: any lane of any of its 4
  chips can be joined to any lane of another of its chips (an intra-server circuit), or to any
  external port of the server, in any permutation. So which physical chip of a server plays which
  logical position of a slice is free, and a chip's idle lanes can be redirected to its slice's
  other links (Morphlux: "redirects egress bandwidth").
- R2 Across servers nothing moves: only the fixed torus fibres join a server to its six
  neighbour servers (2 fibres per x or y face, 4 per z face). A circuit between chips of two
  servers is a path of such fibres; at an intermediate server the switch joins the arriving port
  to the departing port (optical pass-through), so longer circuits are possible but each fibre
  carries one circuit.
- R3 Isolation: a slice may use only ports homed on its own chips (a port is homed on the chip
  whose lane it carried in the plain torus, ``lightrail.controller.torus.model``), never another
  tenant's; so one
  tenant's rewiring never touches another's circuits. Ports homed on a failed chip stay with the
  slice that owned the chip. Only failover may borrow ports homed on unallocated chips (free or
  spare), and it holds them until the slice is released.
- R4 A chip has 6 lanes; a circuit takes one lane at each end. No lane is shared.

Consequence: stitching works at server granularity. The chips of a stitched slice lie in a
connected set of servers; logically adjacent chips are in the same server (free) or joined by a
fibre path through the slice's own ports (possibly several hops: "longer links"). Two regions
that no own-port path joins cannot be stitched, and nothing crosses a server whose ports belong
to another tenant.

Allocation heuristic (the fast path; Morphlux's integer program, solved with HiGHS, can rework
every stitched placement after it: pass ``improver=IlpStitcher(...)`` from
``lightrail.controller.torus.ilp_stitch``, which falls back to this heuristic's plan at its time
limit):

1. Contiguous: every axis permutation of the shape (for a size request, every factorisation
   ``a*b*c`` that fits, most compact first) at every offset, found with wrap-around box sums.
   ``FIRST_FIT`` takes the first; ``BEST_FIT`` the one with the fewest free chips in the one-chip
   shell around the box (it packs against busy chips and keeps large free regions whole); under
   ``LIGHTRAIL`` best fit first minimises the servers the box touches (server-aligned boxes have
   more intra-server links to widen and split fewer servers). Under ``LIGHTRAIL`` the box is then
   wired like a stitched slice (below), so it also gets widened links.
2. Stitched (``LIGHTRAIL`` only): the logical shape is cut into ``2x2x1`` tiles (one server
   each; edge tiles may be smaller). Candidate (seed server, rotation) pairs are ranked by the
   wholly free servers in the ideal server-level box of the tiles at the seed, then by the size
   of the seed's free region (a connected set of servers with free chips; smallest that can hold
   the slice first), and at most ``max_stitch_attempts`` are tried. From a seed, tiles are
   placed in breadth-first order, each on the server (already used or next to a used one, with
   enough free chips) whose links to the servers of its placed logical neighbours are cheapest
   (same server 0; a neighbour server whose face still has enough fibres with free ends 1; else
   a detour, distance + 2), then nearest its ideal position. Then the logical mesh links are
   routed: first each on a direct fibre where one is free, then the rest over the shortest
   detour through the slice's own ports (at most ``max_route_hops`` fibres); a link that does
   not route fails the attempt. Wrap-around links are added per axis where all of them route,
   and idle lanes widen the links, thinnest axis first, all links of an axis or none, over
   intra-server circuits and direct fibres. The first attempt that routes wins.
3. Otherwise the request is refused (:class:`NoCapacityError`); nothing is queued or moved.

What this cannot do (by R2/R3): bend a logical dimension that needs 4 links per tile pair
(``z``) through an x or y face (2 fibres) without a detour, cross a server whose ports belong to
another tenant, or join free regions that no own-port path connects. So in this model, large
slices are stitched far less often than small ones.

Spares: ``SparePolicy.per_domain`` chips of every failure domain (server or rack) are held back
(the domain's far corner first) and never given to tenants. A failed chip of a slice is replaced
by a spare of the same failure domain first, else the nearest one, if the rewiring routes (R1-R3;
a spare in the same server always does); the result lists the circuits torn down and made.
Morphlux replaces a failed chip in 1.2 s on its prototype.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

import numpy as np
import numpy.typing as npt

from lightrail.controller.torus.model import (
    LANES_PER_CHIP,
    Axis,
    Chip,
    FailureDomain,
    FailureDomainKind,
    Port,
    Shape,
    TorusError,
    TorusFabric,
    TorusLink,
)

BoolGrid = npt.NDArray[np.bool_]
IntGrid = npt.NDArray[np.int64]


class SliceRequestError(TorusError):
    """A request is invalid; the message names the request field and its value."""


class NoCapacityError(RuntimeError):
    """No placement exists for a valid request now; the message names the request."""


class UnknownSliceError(LookupError):
    """No live slice has this id."""


class NoSpareError(RuntimeError):
    """A failed chip of a slice could not be replaced (no spare, or none that routes)."""


class StitchImprover(Protocol):
    """Improves a stitched placement after the heuristic (e.g. Morphlux's integer program,
    ``lightrail.controller.torus.ilp_stitch``): given the allocator, the candidate shapes and
    the heuristic's plan (``None`` when it found none), return the plan to use (``None``: no
    placement)."""

    def improve(self, alloc: TorusAllocator, shapes: list[Shape],
                heuristic: _Plan | None) -> _Plan | None: ...


class AllocationPolicy(Enum):
    """How slices are placed (see the module docstring)."""

    CONTIGUOUS_ONLY = "contiguous-only"
    LIGHTRAIL = "lightrail"


class Fit(Enum):
    """Which contiguous placement to take when several fit."""

    FIRST_FIT = "first-fit"
    BEST_FIT = "best-fit"


class SliceMode(Enum):
    """A slice is a free box of the torus, or stitched from several servers by rewiring."""

    CONTIGUOUS = "contiguous"
    STITCHED = "stitched"


class ChipState(Enum):
    """State of one chip in the allocator."""

    FREE = "free"
    SPARE = "spare"
    ALLOCATED = "allocated"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class SparePolicy:
    """Hold ``per_domain`` spare chips in every failure domain of kind ``domain``."""

    domain: FailureDomainKind = FailureDomainKind.RACK
    per_domain: int = 1


@dataclass(frozen=True, slots=True)
class SliceRequest:
    """A tenant's request: exactly one of ``size`` (chips) or ``shape``. ``slice_id`` defaults
    to a generated ``slice-N``."""

    tenant: str
    size: int | None = None
    shape: Shape | None = None
    slice_id: str | None = None

    def describe(self) -> str:
        """``tenant=... shape=4x4x1`` or ``tenant=... size=12``, for messages."""
        what = f"shape={self.shape}" if self.shape is not None else f"size={self.size}"
        return f"tenant={self.tenant!r} {what}"


@dataclass(frozen=True, slots=True)
class Circuit:
    """A chip-to-chip circuit of a slice along logical ``axis`` (``wrap`` for a wrap-around
    link). ``links`` are the torus wires it rides: for a fixed torus the one electrical wire; for
    a photonic circuit the fibres in order from ``a``'s server to ``b``'s (empty inside one
    server)."""

    a: Chip
    b: Chip
    axis: Axis
    wrap: bool
    links: tuple[TorusLink, ...]
    photonic: bool

    @property
    def hops(self) -> int:
        """Server-to-server fibres crossed (0 inside a server; 1 for a fixed wire)."""
        return len(self.links)


@dataclass(frozen=True, slots=True)
class Slice:
    """A tenant's slice.

    ``chips`` lists the chip at each logical coordinate of ``placed`` (``placed`` is an axis
    permutation of ``requested``), index ``i + placed.x * (j + placed.y * k)``. ``lanes[d]`` is
    the number of parallel circuits on the thinnest link of logical axis ``d`` (0 if the extent
    is 1) and ``rings[d]`` whether axis ``d`` closes into a ring (extent >= 3 with every
    wrap-around link present).
    """

    slice_id: str
    tenant: str
    requested: Shape
    placed: Shape
    mode: SliceMode
    chips: tuple[Chip, ...]
    circuits: tuple[Circuit, ...]
    lanes: tuple[int, int, int]
    rings: tuple[bool, bool, bool]
    link_gbps: float
    failed: tuple[Chip, ...] = ()

    @property
    def size(self) -> int:
        """Chips in the slice."""
        return len(self.chips)

    def chip_at(self, i: int, j: int, k: int) -> Chip:
        """The chip at logical coordinate ``(i, j, k)`` of ``placed``."""
        return self.chips[i + self.placed.x * (j + self.placed.y * k)]

    @property
    def bandwidth_gbps_per_chip(self) -> float:
        """Gb/s each chip can drive at once into the slice's per-dimension rings: for every
        logical axis with extent > 1, ``lanes * link_gbps``, doubled when the axis is a ring (a
        bidirectional ring carries two unidirectional rings; a line carries one)."""
        total = 0
        for d in Axis:
            if self.placed.extent(d) > 1:
                total += self.lanes[d] * (2 if self.rings[d] else 1)
        return total * self.link_gbps

    @property
    def bandwidth_gbps(self) -> float:
        """Aggregate injection bandwidth: ``bandwidth_gbps_per_chip * size``."""
        return self.bandwidth_gbps_per_chip * self.size

    @property
    def mean_hops(self) -> float:
        """Mean fibres crossed per inter-server circuit (1.0 when there is none)."""
        hops = [c.hops for c in self.circuits if c.hops > 0]
        return sum(hops) / len(hops) if hops else 1.0


@dataclass(frozen=True, slots=True)
class Replacement:
    """The outcome of replacing ``failed`` with ``spare`` in slice ``slice.slice_id``:
    the circuits torn down (``removed``) and made (``added``), ``borrowed`` ports of unallocated
    chips held for the slice, whether the spare is in the same failure domain, and its torus
    distance from the failed chip in hops."""

    slice: Slice
    failed: Chip
    spare: Chip
    same_domain: bool
    distance_hops: int
    removed: tuple[Circuit, ...]
    added: tuple[Circuit, ...]
    borrowed: tuple[Port, ...]


class _Wire:
    """A circuit inside the allocator: chip ids, logical axis, wrap flag, fibre (link) ids."""

    __slots__ = ("a", "axis", "b", "links", "wrap")

    def __init__(self, a: int, b: int, axis: int, wrap: bool, links: tuple[int, ...]) -> None:
        self.a = a
        self.b = b
        self.axis = axis
        self.wrap = wrap
        self.links = links


@dataclass(slots=True)
class _Plan:
    """A placement before commit: chip ids per logical index and photonic circuits (``None``
    for the fixed torus), plus ports borrowed (failover only)."""

    chips: list[int]
    placed: Shape
    mode: SliceMode
    wires: list[_Wire] | None
    borrowed: set[Port] = field(default_factory=set)


class TorusAllocator:
    """Allocates tenant slices on ``fabric`` under ``policy`` (see the module docstring).

    Not thread-safe; the caller serialises calls. ``max_stitch_attempts`` bounds the
    (seed, rotation) pairs tried per stitched request; ``max_route_hops`` the fibres of one
    circuit; ``improver`` (optional) reworks every stitched placement after the heuristic
    (:class:`StitchImprover`). Raises :class:`SliceRequestError` if ``spares.per_domain`` is
    negative or leaves no chip of a domain for tenants.
    """

    def __init__(
        self,
        fabric: TorusFabric,
        policy: AllocationPolicy = AllocationPolicy.LIGHTRAIL,
        fit: Fit = Fit.BEST_FIT,
        spares: SparePolicy | None = None,
        *,
        max_stitch_attempts: int = 24,
        max_route_hops: int = 4,
        improver: StitchImprover | None = None,
    ) -> None:
        self.fabric = fabric
        self.policy = policy
        self.fit = fit
        self.spares = spares if spares is not None else SparePolicy()
        self.max_stitch_attempts = max_stitch_attempts
        self.max_route_hops = max_route_hops
        self.improver = improver
        self._t = fabric.tables
        d = fabric.dims
        n = fabric.chip_count
        self._free: BoolGrid = np.zeros((d.x, d.y, d.z), dtype=np.bool_)
        self._state: list[ChipState] = [ChipState.FREE] * n
        self._owner: list[str | None] = [None] * n
        self._slices: dict[str, Slice] = {}
        self._wires: dict[str, list[_Wire] | None] = {}
        self._fibre_user: dict[int, str] = {}
        self._borrowed: dict[Port, str] = {}
        self._next_id = 1
        for cid in range(n):
            self._set(cid, ChipState.FREE)
        per = self.spares.per_domain
        domains = fabric.domains(self.spares.domain)
        if per < 0 or (domains and per >= len(fabric.chips_of_domain(domains[0]))):
            raise SliceRequestError(
                f"spares.per_domain: must be >= 0 and leave chips for tenants in every "
                f"{self.spares.domain.value}, got {per}")
        for dom in domains:
            self._replenish(dom)

    # --- queries -----------------------------------------------------------------------------

    @property
    def slices(self) -> dict[str, Slice]:
        """Live slices by id (a copy)."""
        return dict(self._slices)

    def state_of(self, chip: Chip) -> ChipState:
        """State of ``chip``; :class:`TorusError` if it is outside the torus."""
        self.fabric.check_chip(chip)
        return self._state[self.fabric.chip_id(chip)]

    def owner_of(self, chip: Chip) -> str | None:
        """Id of the slice holding ``chip`` (also a failed chip it held), else ``None``."""
        self.fabric.check_chip(chip)
        return self._owner[self.fabric.chip_id(chip)]

    def chips_in(self, state: ChipState) -> list[Chip]:
        """Chips in ``state``, sorted by id (x fastest)."""
        return [self._t.chips[i] for i, s in enumerate(self._state) if s is state]

    def free_count(self) -> int:
        """Chips a tenant could get now (free, not spare, not failed)."""
        return int(self._free.sum())

    def largest_free_box(self) -> int:
        """Volume of the largest free box (any offset, wrapping) in chips: what
        ``CONTIGUOUS_ONLY`` could hand out as one slice now."""
        return _largest_box(self._free)

    def largest_allocatable(self, max_stitch_attempts: int | None = None) -> int:
        """The largest ``size`` request this policy would grant now, in chips.

        ``CONTIGUOUS_ONLY``: :meth:`largest_free_box`. ``LIGHTRAIL``: the larger of that and
        the largest whole-server size (a multiple of 4 chips) that a dry-run plan places, found
        by a galloping then binary search up to the free chips of the largest free region, each
        size tried with its 3 most compact shapes of even x and y extent (assumes that if size n
        can be placed, smaller sizes can too). ``max_stitch_attempts`` overrides the allocator's
        bound for the probes."""
        box = self.largest_free_box()
        if self.policy is AllocationPolicy.CONTIGUOUS_ONLY:
            return box
        top = max(self._regions()[1], default=0)
        sizes = [n for n in range(box + 1, top + 1) if n % 4 == 0 and self._probe_shapes(n)]
        saved = self.max_stitch_attempts
        if max_stitch_attempts is not None:
            self.max_stitch_attempts = max_stitch_attempts
        try:
            # gallop up from the box (one probe when stitching cannot beat it), then bisect
            best, lo, hi, step = box, 0, len(sizes) - 1, 1
            while lo <= hi:
                probe = min(lo + step - 1, hi)
                if self._plan(self._probe_shapes(sizes[probe])) is not None:
                    best, lo, step = sizes[probe], probe + 1, step * 2
                else:
                    hi, step = probe - 1, 1
        finally:
            self.max_stitch_attempts = saved
        return best

    # --- allocate / release --------------------------------------------------------------------

    def plan(self, request: SliceRequest) -> Slice | None:
        """The slice :meth:`allocate` would create now, without creating it; ``None`` if no
        placement exists. Raises :class:`SliceRequestError` for an invalid request."""
        self._validate(request)
        p = self._plan(self._candidate_shapes(request))
        return None if p is None else self._to_slice(request, request.slice_id or "planned", p)

    def allocate(self, request: SliceRequest) -> Slice:
        """Place ``request`` and return its slice.

        Raises :class:`SliceRequestError` for an invalid request (empty tenant, both or neither
        of size/shape, size < 1 or above the tenant chips of the torus, a size or shape that fits
        the torus in no rotation, a duplicate slice id) and :class:`NoCapacityError` when no
        placement exists now."""
        self._validate(request)
        p = self._plan(self._candidate_shapes(request))
        if p is None:
            raise NoCapacityError(
                f"request {request.describe()}: no capacity: {self.free_count()} free chips, "
                f"largest free box {self.largest_free_box()} chips, policy {self.policy.value}")
        slice_id = request.slice_id
        if slice_id is None:
            while f"slice-{self._next_id}" in self._slices:
                self._next_id += 1
            slice_id = f"slice-{self._next_id}"
            self._next_id += 1
        s = self._to_slice(request, slice_id, p)
        for cid in p.chips:
            self._set(cid, ChipState.ALLOCATED)
            self._owner[cid] = slice_id
        for w in p.wires or ():
            for lid in w.links:
                self._fibre_user[lid] = slice_id
        for port in p.borrowed:
            self._borrowed[port] = slice_id
        self._slices[slice_id] = s
        self._wires[slice_id] = p.wires
        return s

    def release(self, slice_id: str) -> Slice:
        """Free the chips, fibres and borrowed ports of a slice (its failed chips stay failed)
        and top up the spare reserve of the affected failure domains. Raises
        :class:`UnknownSliceError`."""
        s = self._slices.pop(slice_id, None)
        if s is None:
            raise UnknownSliceError(f"slice_id: no live slice {slice_id!r}")
        wires = self._wires.pop(slice_id)
        domains: set[FailureDomain] = set()
        for cid, owner in enumerate(self._owner):
            if owner != slice_id:
                continue
            self._owner[cid] = None
            if self._state[cid] is ChipState.ALLOCATED:
                self._set(cid, ChipState.FREE)
            domains.add(self.fabric.domain_of(self._t.chips[cid], self.spares.domain))
        for w in wires or ():
            for lid in w.links:
                self._fibre_user.pop(lid, None)
        self._borrowed = {k: v for k, v in self._borrowed.items() if v != slice_id}
        for dom in sorted(domains):
            self._replenish(dom)
        return s

    # --- failures ------------------------------------------------------------------------------

    def fail_chip(self, chip: Chip) -> Replacement | None:
        """Mark ``chip`` failed. A free or spare chip just leaves the pool (a spare is topped up
        from the free chips of its domain); a failed chip again is a no-op. A chip of a slice is
        replaced by a spare (same failure domain first, else nearest by torus distance) whose
        rewiring routes (every circuit within ``max_route_hops`` fibres, over the slice's ports
        and ports borrowed from unallocated chips); the :class:`Replacement` lists it and the
        slice becomes ``STITCHED``.

        Raises :class:`TorusError` for a chip outside the torus and :class:`NoSpareError` when
        no spare can be wired in (the slice then keeps the failed chip in ``Slice.failed``), or
        under ``CONTIGUOUS_ONLY``, whose fixed torus cannot rewire."""
        state = self.state_of(chip)
        cid = self.fabric.chip_id(chip)
        if state is ChipState.FAILED:
            return None
        self._set(cid, ChipState.FAILED)
        dom = self.fabric.domain_of(chip, self.spares.domain)
        if state is not ChipState.ALLOCATED:
            self._replenish(dom)
            return None
        slice_id = self._owner[cid]
        assert slice_id is not None
        s = self._slices[slice_id]
        if self.policy is AllocationPolicy.CONTIGUOUS_ONLY:
            self._slices[slice_id] = replace(s, failed=(*s.failed, chip))
            raise NoSpareError(f"chip {chip} of slice {slice_id!r}: policy contiguous-only has "
                               "no photonic switch to rewire a spare in")
        spares = sorted(self.chips_in(ChipState.SPARE),
                        key=lambda c: (self.fabric.domain_of(c, self.spares.domain) != dom,
                                       self.fabric.distance(chip, c), c))
        for spare in spares:
            rep = self._try_replace(s, chip, spare)
            if rep is not None:
                return rep
        self._slices[slice_id] = replace(s, failed=(*s.failed, chip))
        raise NoSpareError(f"chip {chip} of slice {slice_id!r}: no spare can be wired in "
                           f"({len(spares)} spares; none routes)")

    def repair_chip(self, chip: Chip) -> None:
        """Return a failed chip no live slice holds to the pool (as a spare if its domain is
        short of spares). Raises :class:`TorusError` if it is not failed or a slice holds it."""
        if self.state_of(chip) is not ChipState.FAILED or self.owner_of(chip) is not None:
            raise TorusError(f"chip: {chip} is not a failed chip free of slices")
        self._set(self.fabric.chip_id(chip), ChipState.FREE)
        self._replenish(self.fabric.domain_of(chip, self.spares.domain))

    def check_invariants(self) -> list[str]:
        """Problems with the allocator's state (empty when sound): a chip in two slices, a
        spare or failed chip handed out, a fibre or borrowed port used twice or by a slice
        that may not use it, a slice that breaks :func:`verify_slice`."""
        problems: list[str] = []
        seen: dict[Chip, str] = {}
        fibres: dict[TorusLink, str] = {}
        for sid, s in self._slices.items():
            problems += [f"{sid}: {p}" for p in verify_slice(self.fabric, s)]
            problems += self._chip_problems(sid, s, seen)
            problems += self._fibre_problems(sid, s, fibres)
        for cid, state in enumerate(self._state):
            chip = self._t.chips[cid]
            if (state is ChipState.FREE) != bool(self._free[chip.x, chip.y, chip.z]):
                problems.append(f"{state.value} chip {chip} wrong in the free grid")
        return problems

    def _chip_problems(self, sid: str, s: Slice, seen: dict[Chip, str]) -> list[str]:
        """``check_invariants`` for the working chips of slice ``sid``: each in no other slice
        (``seen``: chip -> the slice met first, updated here) and allocated to ``sid``."""
        problems: list[str] = []
        fid = self.fabric.chip_id
        for chip in s.chips:
            if chip in s.failed:
                continue
            if chip in seen:
                problems.append(f"chip {chip} in {seen[chip]} and {sid}")
            seen[chip] = sid
            state = self._state[fid(chip)]
            if state is not ChipState.ALLOCATED or self._owner[fid(chip)] != sid:
                problems.append(f"{sid}: chip {chip} is {state.value}")
        return problems

    def _fibre_problems(self, sid: str, s: Slice, fibres: dict[TorusLink, str]) -> list[str]:
        """``check_invariants`` for the photonic circuits of slice ``sid``: each fibre in no
        other slice (``fibres``: fibre -> the slice met first, updated here) and each of its
        ports owned by, or lent to, ``sid``."""
        problems: list[str] = []
        fid = self.fabric.chip_id
        for c in s.circuits:
            if not c.photonic:
                continue
            for link in c.links:
                if link in fibres:
                    problems.append(f"fibre {link} in {fibres[link]} and {sid}")
                fibres[link] = sid
                for port in link.ports:
                    owner = self._borrowed.get(port, self._owner[fid(port.home)])
                    if owner != sid:
                        problems.append(f"{sid}: port {port} belongs to {owner}")
        return problems

    # --- internals: state ----------------------------------------------------------------------

    def _set(self, cid: int, state: ChipState) -> None:
        self._state[cid] = state
        c = self._t.chips[cid]
        self._free[c.x, c.y, c.z] = state is ChipState.FREE

    def _replenish(self, domain: FailureDomain) -> None:
        ids = [self.fabric.chip_id(c) for c in self.fabric.chips_of_domain(domain)]
        have = sum(1 for c in ids if self._state[c] is ChipState.SPARE)
        for cid in reversed(ids):  # far corner of the domain first
            if have >= self.spares.per_domain:
                return
            if self._state[cid] is ChipState.FREE:
                self._set(cid, ChipState.SPARE)
                have += 1

    def _regions(self) -> tuple[list[int], list[int]]:
        """Free regions: region index per server (-1 without free chips) and free chips per
        region. A region is a connected set of servers (by fibre adjacency) with free chips."""
        t = self._t
        avail = self._avail()
        region = [-1] * len(avail)
        sizes: list[int] = []
        for start, n in enumerate(avail):
            if n == 0 or region[start] >= 0:
                continue
            rid, total, queue = len(sizes), 0, deque([start])
            region[start] = rid
            while queue:
                s = queue.popleft()
                total += avail[s]
                for nb in t.server_nbrs[s]:
                    if avail[nb] and region[nb] < 0:
                        region[nb] = rid
                        queue.append(nb)
            sizes.append(total)
        return region, sizes

    def _avail(self) -> list[int]:
        free = ChipState.FREE
        return [sum(1 for c in chips if self._state[c] is free) for chips in self._t.server_chips]

    # --- internals: requests -------------------------------------------------------------------

    def _validate(self, request: SliceRequest) -> None:
        d = self.fabric.dims
        if not request.tenant:
            raise SliceRequestError("tenant: must be a non-empty name, got ''")
        if (request.size is None) == (request.shape is None):
            raise SliceRequestError(
                f"size/shape: give exactly one, got size={request.size} shape={request.shape}")
        if request.slice_id is not None and request.slice_id in self._slices:
            raise SliceRequestError(f"slice_id: {request.slice_id!r} is already live")
        if request.shape is not None:
            if not self._shape_rotations(request.shape):
                raise SliceRequestError(
                    f"shape: {request.shape} is larger than the torus {d} in every rotation")
            return
        assert request.size is not None
        tenant_chips = d.volume - len(self.fabric.domains(self.spares.domain)) * \
            self.spares.per_domain
        if request.size < 1:
            raise SliceRequestError(f"size: must be >= 1, got {request.size}")
        if request.size > tenant_chips:
            raise SliceRequestError(
                f"size: {request.size} is more than the {tenant_chips} tenant chips of the "
                f"torus {d} ({self.spares.per_domain} spares per {self.spares.domain.value})")
        if not self._factorisations(request.size):
            raise SliceRequestError(
                f"size: {request.size} chips form no box that fits the torus {d}")

    def _shape_rotations(self, shape: Shape) -> list[Shape]:
        return [r for r in shape.rotations() if r.fits_in(self.fabric.dims)]

    def _factorisations(self, n: int) -> list[Shape]:
        d = self.fabric.dims
        out = [Shape(a, b, n // (a * b)) for a in range(1, d.x + 1) for b in range(1, d.y + 1)
               if n % (a * b) == 0 and n // (a * b) <= d.z]
        return sorted(out, key=lambda s: (s.surface(), s.extents))

    def _probe_shapes(self, n: int) -> list[Shape]:
        return [s for s in self._factorisations(n) if s.x % 2 == 0 and s.y % 2 == 0][:3]

    def _candidate_shapes(self, request: SliceRequest) -> list[Shape]:
        if request.shape is not None:
            return self._shape_rotations(request.shape)
        assert request.size is not None
        return self._factorisations(request.size)

    def _to_slice(self, request: SliceRequest, slice_id: str, p: _Plan) -> Slice:
        requested = request.shape if request.shape is not None else p.placed
        return self._build_slice(slice_id, request.tenant, requested, p.placed, p.mode,
                                 p.chips, p.wires, ())

    def _build_slice(self, slice_id: str, tenant: str, requested: Shape, placed: Shape,
                     mode: SliceMode, chips: list[int], wires: list[_Wire] | None,
                     failed: tuple[Chip, ...]) -> Slice:
        t = self._t
        links = self.fabric.links
        cs = [t.chips[c] for c in chips]
        if wires is None:
            circuits = self._fixed_circuits(placed, cs)
        else:
            circuits = [Circuit(t.chips[w.a], t.chips[w.b], Axis(w.axis), w.wrap,
                                tuple(links[lid] for lid in w.links), photonic=True)
                        for w in wires]
        lanes, rings = _measure(placed, cs, circuits)
        return Slice(slice_id, tenant, requested, placed, mode, tuple(cs), tuple(circuits),
                     lanes, rings, self.fabric.link_gbps, failed)

    def _plan(self, shapes: list[Shape]) -> _Plan | None:
        if not shapes or shapes[0].volume > self.free_count():
            return None
        photonic = self.policy is AllocationPolicy.LIGHTRAIL
        fid = self.fabric.chip_id
        for shape, origin in itertools.islice(self._contiguous_candidates(shapes), 32):
            chips = [fid(c) for c in self.fabric.box_chips(origin, shape)]
            if not photonic:
                return _Plan(chips, shape, SliceMode.CONTIGUOUS, None)
            wires = _wire(_Router(self, "(new)", set(chips), allow_borrow=False), shape, chips)
            if wires is not None:
                return _Plan(chips, shape, SliceMode.CONTIGUOUS, wires)
        if not photonic:
            return None
        plan = self._stitch(shapes)
        return plan if self.improver is None else self.improver.improve(self, shapes, plan)

    # --- internals: contiguous -------------------------------------------------------------------

    def _contiguous_candidates(self, shapes: list[Shape]) -> Iterator[tuple[Shape, Chip]]:
        """Free boxes in preference order: ``FIRST_FIT`` by shape then origin (x, y, z
        row-major); ``BEST_FIT`` by fewest free chips in the one-chip shell around the box,
        and under ``LIGHTRAIL`` first by fewest servers touched (more intra-server links to
        widen, fewer servers split between tenants)."""
        d = self.fabric.dims
        keys: list[IntGrid] = []
        found: list[tuple[Shape, IntGrid]] = []
        for order, shape in enumerate(shapes):
            fits = np.argwhere(_box_sums(self._free, shape) == shape.volume)
            if not len(fits):
                continue
            if self.fit is Fit.FIRST_FIT:
                x, y, z = (int(v) for v in fits[0])
                yield shape, Chip(x, y, z)
                continue
            outer = Shape(min(shape.x + 2, d.x), min(shape.y + 2, d.y), min(shape.z + 2, d.z))
            shell = np.roll(_box_sums(self._free, outer),
                            (int(outer.x > shape.x), int(outer.y > shape.y),
                             int(outer.z > shape.z)), axis=(0, 1, 2))
            xs, ys, zs = fits[:, 0], fits[:, 1], fits[:, 2]
            servers = np.zeros(len(fits), dtype=np.int64)
            if self.policy is AllocationPolicy.LIGHTRAIL:
                servers = (_spans(xs, shape.x, d.x) * _spans(ys, shape.y, d.y) * shape.z)
            keys.append(np.stack([servers, shell[xs, ys, zs] - shape.volume,
                                  np.full(len(fits), order), (xs * d.y + ys) * d.z + zs]))
            found.append((shape, fits))
        if self.fit is Fit.FIRST_FIT or not keys:
            return
        allkeys = np.concatenate(keys, axis=1)
        which = np.concatenate([np.full(len(f), i) for i, (_, f) in enumerate(found)])
        rowof = np.concatenate([np.arange(len(f)) for _, f in found])
        for idx in np.lexsort(allkeys[::-1]):
            shape, fits = found[int(which[idx])]
            x, y, z = (int(v) for v in fits[int(rowof[idx])])
            yield shape, Chip(x, y, z)

    def _fixed_circuits(self, shape: Shape, chips: list[Chip]) -> list[Circuit]:
        """Links of a box on the plain electrical torus: every wire between neighbouring chips
        of the box (two when the torus axis has size 2), plus the wrap-around wires when the box
        spans the whole torus axis (extent >= 3)."""
        circuits: list[Circuit] = []
        for axis in Axis:
            ext = shape.extent(axis)
            for u, v, wrap in _logical_links(shape, axis, wraps=ext >= 3):
                a, b = chips[u], chips[v]
                circuits += [Circuit(a, b, axis, wrap, (w,), photonic=False)
                             for w in self.fabric.links_between_chips(a, b) if w.axis is axis]
        return circuits

    # --- internals: stitching --------------------------------------------------------------------

    def _stitch(self, shapes: list[Shape]) -> _Plan | None:
        """Try (seed server, rotation) pairs, best first (:meth:`_stitch_ranking`)."""
        avail = self._avail()
        for seed, shape in self._stitch_ranking(shapes)[:self.max_stitch_attempts]:
            chips = self._place_tiles(shape, seed, avail)
            if chips is None:
                continue
            wires = _wire(_Router(self, "(new)", set(chips), allow_borrow=False), shape, chips)
            if wires is not None:
                return _Plan(chips, shape, SliceMode.STITCHED, wires)
        return None

    def _stitch_ranking(self, shapes: list[Shape]) -> list[tuple[int, Shape]]:
        """(seed server, rotation) pairs, best first: most wholly free servers in the ideal
        server-level box of the tile grid at the seed, then smallest free region that holds
        the slice."""
        region, sizes = self._regions()
        avail = self._avail()
        n_chips = shapes[0].volume
        grid = self.fabric.server_grid
        whole = np.array(avail, dtype=np.int64).reshape(grid.z, grid.y, grid.x)
        whole = (whole.transpose(2, 1, 0) == 4)
        ranked: list[tuple[int, int, int, int, Shape]] = []
        whole_count = int(whole.sum())
        for order, shape in enumerate(shapes):
            if (shape.x // 2) * (shape.y // 2) * shape.z > whole_count:
                continue  # more full 2x2x1 tiles than wholly free servers
            tiles = Shape(min(-(-shape.x // 2), grid.x), min(-(-shape.y // 2), grid.y),
                          min(shape.z, grid.z))
            counts = _box_sums(whole, tiles)
            for seed, r in enumerate(region):
                if r < 0 or sizes[r] < n_chips:
                    continue
                sx, sy, sz = seed % grid.x, (seed // grid.x) % grid.y, seed // (grid.x * grid.y)
                ranked.append((-int(counts[sx, sy, sz]), sizes[r], order, seed, shape))
        ranked.sort(key=lambda q: (q[0], q[1], q[2], q[3]))
        return [(seed, shape) for _, _, _, seed, shape in ranked]

    def _place_tiles(self, shape: Shape, seed: int, avail: list[int]) -> list[int] | None:
        """Greedy tile placement from server ``seed`` (see the module docstring); the chip id
        at each logical index, or ``None``."""
        t = self._t
        grid = self.fabric.server_grid
        dist = t.server_dist
        sx0, sy0, sz0 = seed % grid.x, (seed // grid.x) % grid.y, seed // (grid.x * grid.y)
        tx, ty, tz = -(-shape.x // 2), -(-shape.y // 2), shape.z
        tiles = sorted(((i, j, k) for i in range(tx) for j in range(ty) for k in range(tz)),
                       key=lambda q: (q[0] + q[1] + q[2], q[2], q[1], q[0]))
        left = list(avail)
        placed: dict[tuple[int, int, int], int] = {}
        reach: set[int] = set()
        pools: dict[int, list[int]] = {}
        chips = [-1] * shape.volume
        free = ChipState.FREE
        state = self._state
        planned: dict[tuple[int, int], int] = {}  # links planned across a server pair
        fibres: dict[tuple[int, int], int] = {}  # fibres with both ends on free chips

        def capacity(a: int, b: int) -> int:
            n = fibres.get((a, b))
            if n is None:
                n = sum(1 for lid in t.fibres.get((a, b), ())
                        if all(state[c] is free for c in t.link_ends[lid]))
                fibres[(a, b)] = n
            return n - planned.get((a, b), 0)

        def cost(c: int, nbrs: list[tuple[int, int]]) -> int:
            total = 0
            for p, need in nbrs:
                d = dist[c][p]
                total += d if d == 0 or (d == 1 and capacity(c, p) >= need) else d + 2
            return total

        for q in tiles:
            i, j, k = q
            members = [(2 * i + u, 2 * j + v) for v in range(2) for u in range(2)
                       if 2 * i + u < shape.x and 2 * j + v < shape.y]
            need = len(members)
            cols = len({m[0] for m in members})
            rows = len({m[1] for m in members})
            ideal = ((sx0 + i) % grid.x + grid.x * (((sy0 + j) % grid.y)
                                                    + grid.y * ((sz0 + k) % grid.z)))
            nbrs = [(placed[n], links) for n, links in (((i - 1, j, k), rows),
                                                        ((i, j - 1, k), cols),
                                                        ((i, j, k - 1), need)) if n in placed]
            cands = [c for c in (reach if placed else (seed,)) if left[c] >= need]
            if not cands:
                return None
            best = min(cands, key=lambda c: (cost(c, nbrs), dist[c][ideal], c))
            for p, links in nbrs:
                if p != best:
                    planned[(best, p)] = planned.get((best, p), 0) + links
                    planned[(p, best)] = planned.get((p, best), 0) + links
            if best not in pools:
                pools[best] = [c for c in t.server_chips[best] if state[c] is free]
                reach.add(best)
                reach.update(t.server_nbrs[best])
            pool = pools[best]
            for (li, lj), cid in zip(members, pool[:need], strict=True):
                chips[li + shape.x * (lj + shape.y * k)] = cid
            pools[best] = pool[need:]
            left[best] -= need
            placed[q] = best
        return chips

    # --- internals: failover ---------------------------------------------------------------------

    def _try_replace(self, s: Slice, failed: Chip, spare: Chip) -> Replacement | None:
        fid = self.fabric.chip_id
        f, sp = fid(failed), fid(spare)
        old = self._wires[s.slice_id]
        assert old is not None
        removed = [w for w in old if f in (w.a, w.b)]
        kept = [w for w in old if f not in (w.a, w.b)]
        chips = [sp if fid(c) == f else fid(c) for c in s.chips]
        router = _Router(self, s.slice_id, set(chips), allow_borrow=True,
                         released={lid for w in removed for lid in w.links})
        for w in kept:
            router.lanes[w.a] = router.lanes.get(w.a, 0) + 1
            router.lanes[w.b] = router.lanes.get(w.b, 0) + 1
        added: list[_Wire] = []
        needed = {(min(w.a, w.b), max(w.a, w.b), w.axis) for w in removed if not w.wrap}
        done: set[tuple[int, int, int]] = set()
        for w in sorted(removed, key=lambda w: (w.wrap, w.axis)):
            a = sp if w.a == f else w.a
            b = sp if w.b == f else w.b
            new = router.connect(a, b, w.axis, w.wrap)
            if new is not None:
                added.append(new)
                done.add((min(w.a, w.b), max(w.a, w.b), w.axis))
        if needed - done:
            return None
        wires = kept + added
        # a rewired slice is no longer a box of the torus
        new_slice = self._build_slice(s.slice_id, s.tenant, s.requested, s.placed,
                                      SliceMode.STITCHED, chips, wires, s.failed)
        self._set(sp, ChipState.ALLOCATED)
        self._owner[sp] = s.slice_id
        for w in removed:
            for lid in w.links:
                self._fibre_user.pop(lid, None)
        for w in added:
            for lid in w.links:
                self._fibre_user[lid] = s.slice_id
        for port in router.borrowed:
            self._borrowed[port] = s.slice_id
        self._slices[s.slice_id] = new_slice
        self._wires[s.slice_id] = wires
        dom = self.fabric.domain_of(failed, self.spares.domain)
        self._replenish(self.fabric.domain_of(spare, self.spares.domain))
        t = self._t
        links = self.fabric.links

        def pub(w: _Wire) -> Circuit:
            return Circuit(t.chips[w.a], t.chips[w.b], Axis(w.axis), w.wrap,
                           tuple(links[lid] for lid in w.links), photonic=True)

        return Replacement(new_slice, failed, spare,
                           self.fabric.domain_of(spare, self.spares.domain) == dom,
                           self.fabric.distance(failed, spare),
                           tuple(pub(w) for w in removed), tuple(pub(w) for w in added),
                           tuple(sorted(router.borrowed)))


class _Router:
    """Routes photonic circuits for one slice under R1-R4 against the allocator's state."""

    def __init__(self, alloc: TorusAllocator, slice_id: str, owned: set[int], *,
                 allow_borrow: bool, released: set[int] | None = None) -> None:
        self.alloc = alloc
        self.t = alloc.fabric.tables
        self.links = alloc.fabric.links
        self.slice_id = slice_id
        self.owned = owned
        self.allow_borrow = allow_borrow
        self.released = released or set()
        self.used: set[int] = set()
        self.lanes: dict[int, int] = {}
        self.borrowed: set[Port] = set()
        self._static_ok: dict[int, bool] = {}

    def _end_ok(self, lid: int, end: int) -> bool:
        """May this slice use end ``end`` (0 src, 1 dst) of link ``lid`` (R3)?"""
        borrowed = self.alloc._borrowed
        if borrowed:
            holder = borrowed.get(self.links[lid].ports[end])
            if holder is not None:
                return holder == self.slice_id
        home = self.t.link_ends[lid][end]
        if home in self.owned:
            return True
        owner = self.alloc._owner[home]
        if owner is not None:
            return owner == self.slice_id
        return self.allow_borrow

    def _fibre_ok(self, lid: int) -> bool:
        if lid in self.used:
            return False
        ok = self._static_ok.get(lid)
        if ok is None:
            ok = ((lid not in self.alloc._fibre_user or lid in self.released)
                  and self._end_ok(lid, 0) and self._end_ok(lid, 1))
            self._static_ok[lid] = ok
        return ok

    def route(self, src: int, dst: int, max_hops: int) -> list[int] | None:
        """Shortest fibre path (link ids) of at most ``max_hops`` fibres from server ``src``
        to server ``dst`` (BFS)."""
        prev: dict[int, tuple[int, int]] = {}
        seen = {src}
        frontier = [src]
        nbrs, fibres = self.t.server_nbrs, self.t.fibres
        for _ in range(max_hops):
            nxt: list[int] = []
            for s in frontier:
                for n in nbrs[s]:
                    if n in seen:
                        continue
                    lid = next((f for f in fibres[(s, n)] if self._fibre_ok(f)), -1)
                    if lid < 0:
                        continue
                    seen.add(n)
                    prev[n] = (s, lid)
                    if n == dst:
                        path: list[int] = []
                        cur = n
                        while cur != src:
                            cur, f = prev[cur]
                            path.append(f)
                        return path[::-1]
                    nxt.append(n)
            frontier = nxt
            if not frontier:
                break
        return None

    def route_via(self, servers: tuple[int, ...]) -> list[int] | None:
        """A fibre path (link ids) along the server sequence ``servers``: on every hop the
        first fibre this slice may use, or ``None`` when a hop has none."""
        path: list[int] = []
        for a, b in itertools.pairwise(servers):
            lid = next((f for f in self.t.fibres.get((a, b), ())
                        if f not in path and self._fibre_ok(f)), -1)
            if lid < 0:
                return None
            path.append(lid)
        return path

    def connect(self, a: int, b: int, axis: int, wrap: bool,
                max_hops: int | None = None, via: tuple[int, ...] | None = None
                ) -> _Wire | None:
        """A circuit from chip ``a`` to chip ``b`` of at most ``max_hops`` fibres (default the
        allocator's ``max_route_hops``), or along the server sequence ``via`` (from ``a``'s
        server to ``b``'s) when given, if lanes and fibres allow (kept in the router's
        state)."""
        lanes = self.lanes
        if lanes.get(a, 0) >= LANES_PER_CHIP or lanes.get(b, 0) >= LANES_PER_CHIP:
            return None
        sa, sb = self.t.chip_server[a], self.t.chip_server[b]
        path: list[int] = []
        if via is not None and sa != sb:
            if via[0] != sa or via[-1] != sb:
                return None
            pinned = self.route_via(via)
            if pinned is None:
                return None
            path = pinned
        elif sa != sb:
            hops = self.alloc.max_route_hops if max_hops is None else max_hops
            found = self.route(sa, sb, hops)
            if found is None:
                return None
            path = found
        for lid in path:
            self.used.add(lid)
            if self.allow_borrow:
                for end, home in enumerate(self.t.link_ends[lid]):
                    if home not in self.owned and self.alloc._owner[home] is None:
                        self.borrowed.add(self.links[lid].ports[end])
        lanes[a] = lanes.get(a, 0) + 1
        lanes[b] = lanes.get(b, 0) + 1
        return _Wire(a, b, axis, wrap, tuple(path))

    def undo(self, wires: Iterable[_Wire]) -> None:
        """Give back what ``wires`` took (borrowing happens only in failover, which never
        undoes)."""
        for w in wires:
            self.lanes[w.a] -= 1
            self.lanes[w.b] -= 1
            for lid in w.links:
                self.used.discard(lid)


def _wire(router: _Router, shape: Shape, chips: list[int],
          pinned: dict[tuple[int, int, int], tuple[int, ...]] | None = None
          ) -> list[_Wire] | None:
    """Photonic circuits for ``chips`` in ``shape``: the mesh links (``None`` if one does not
    route), first those ``pinned`` to a server route (logical ``(u, v, axis)`` -> servers from
    ``u``'s to ``v``'s: the integer program's choice), then each on a direct fibre where one is
    free, then the rest over detours, shortest first; then the wrap-around links of each axis
    (all or none); then widening with idle lanes,
    thinnest axis first (all links of an axis or none), over intra-server circuits and direct
    fibres only."""
    t = router.t
    wires: list[_Wire] = []
    mesh = [(u, v, int(axis)) for axis in Axis
            for u, v, _ in _logical_links(shape, axis, wraps=False)]
    mesh.sort(key=lambda m: t.server_dist[t.chip_server[chips[m[0]]]][
        t.chip_server[chips[m[1]]]])
    detours: list[tuple[int, int, int]] = []
    pins = pinned or {}
    fixed = _wire_pinned(router, chips, [m for m in mesh if m in pins], pins)
    if fixed is None:
        return None
    wires += fixed
    mesh = [m for m in mesh if m not in pins]
    for u, v, axis in mesh:
        w = router.connect(chips[u], chips[v], axis, wrap=False, max_hops=1)
        if w is None:
            detours.append((u, v, axis))
        else:
            wires.append(w)
    for u, v, axis in detours:
        w = router.connect(chips[u], chips[v], axis, wrap=False)
        if w is None:
            return None
        wires.append(w)
    rings = [False, False, False]
    for axis in Axis:
        if shape.extent(axis) < 3:
            continue
        batch = _connect_all(router, [(chips[u], chips[v]) for u, v, wrap in
                                      _logical_links(shape, axis, wraps=True) if wrap],
                             int(axis), wrap=True)
        if batch is not None:
            wires += batch
            rings[axis] = True
    open_axes = [int(a) for a in Axis if shape.extent(a) >= 2]
    widths = dict.fromkeys(open_axes, 1)
    while open_axes:
        axis = min(open_axes, key=lambda a: (widths[a], a))
        batch = _connect_all(router, [(chips[u], chips[v], w) for u, v, w in
                                      _logical_links(shape, Axis(axis), wraps=rings[axis])],
                             axis, wrap=None, max_hops=1)
        if batch is None:
            open_axes.remove(axis)
        else:
            wires += batch
            widths[axis] += 1
    return wires


def _wire_pinned(router: _Router, chips: list[int], links: list[tuple[int, int, int]],
                 pinned: dict[tuple[int, int, int], tuple[int, ...]]) -> list[_Wire] | None:
    """The mesh ``links`` along their ``pinned`` server routes, or ``None`` if one fails."""
    wires: list[_Wire] = []
    for u, v, axis in links:
        w = router.connect(chips[u], chips[v], axis, wrap=False, via=pinned[(u, v, axis)])
        if w is None:
            return None
        wires.append(w)
    return wires


def _connect_all(router: _Router, pairs: Iterable[tuple[int, int] | tuple[int, int, bool]],
                 axis: int, wrap: bool | None, max_hops: int | None = None
                 ) -> list[_Wire] | None:
    """Connect every pair (``wrap`` from the pair when ``None``) or none of them."""
    made: list[_Wire] = []
    for pair in pairs:
        w = router.connect(pair[0], pair[1], axis,
                           wrap if wrap is not None else bool(pair[2]) if len(pair) > 2 else False,
                           max_hops)
        if w is None:
            router.undo(made)
            return None
        made.append(w)
    return made


def _spans(origin: IntGrid, extent: int, size: int) -> IntGrid:
    """Servers (of 2 chips along this axis) a box of ``extent`` chips at ``origin`` touches."""
    if extent >= size:
        return np.full_like(origin, size // 2)
    return (origin % 2 + extent + 1) // 2


def _measure(shape: Shape, chips: list[Chip], circuits: list[Circuit]
             ) -> tuple[tuple[int, int, int], tuple[bool, bool, bool]]:
    """Thinnest link per logical axis and ring closure, counted from the circuits."""
    count: dict[tuple[Chip, Chip, Axis, bool], int] = {}
    for c in circuits:
        key = (min(c.a, c.b), max(c.a, c.b), c.axis, c.wrap)
        count[key] = count.get(key, 0) + 1
    lanes = [0, 0, 0]
    rings = [False, False, False]
    for axis in Axis:
        ext = shape.extent(axis)
        if ext < 2:
            continue
        widths: list[int] = []
        wraps: list[int] = []
        for u, v, wrap in _logical_links(shape, axis, wraps=ext >= 3):
            a, b = chips[u], chips[v]
            n = count.get((min(a, b), max(a, b), axis, wrap), 0)
            (wraps if wrap else widths).append(n)
        rings[axis] = bool(wraps) and min(wraps) > 0
        lanes[axis] = min(widths + wraps) if rings[axis] else min(widths)
    return (lanes[0], lanes[1], lanes[2]), (rings[0], rings[1], rings[2])


def _logical_links(shape: Shape, axis: Axis, *, wraps: bool) -> Iterator[tuple[int, int, bool]]:
    """``(u, v, wrap)`` logical index pairs of the links of ``axis`` (mesh links, then the
    wrap-around links when ``wraps`` and the extent is >= 2)."""
    ext = shape.extent(axis)
    sx, sy = shape.x, shape.y
    for k in range(shape.z):
        for j in range(shape.y):
            for i in range(shape.x):
                u = [i, j, k]
                if u[axis] + 1 < ext:
                    v = list(u)
                    v[axis] += 1
                    yield (i + sx * (j + sy * k), v[0] + sx * (v[1] + sy * v[2]), False)
                elif wraps and ext >= 2 and u[axis] == ext - 1:
                    v = list(u)
                    v[axis] = 0
                    yield (i + sx * (j + sy * k), v[0] + sx * (v[1] + sy * v[2]), True)


def verify_slice(fabric: TorusFabric, s: Slice) -> list[str]:
    """Problems with one slice (empty when it honours its shape): chip count and duplicates,
    ``placed`` a rotation of ``requested``, a contiguous slice not a box, a logical mesh link
    without a circuit, a circuit whose wires do not join its chips (fixed: one wire between
    them; photonic: a fibre path from one server to the other), more than 6 lanes on a chip."""
    problems: list[str] = []
    if len(s.chips) != s.placed.volume or len(set(s.chips)) != len(s.chips):
        problems.append(f"{len(s.chips)} chips ({len(set(s.chips))} distinct) for {s.placed}")
        return problems
    if sorted(s.placed.extents) != sorted(s.requested.extents):
        problems.append(f"placed {s.placed} is not a rotation of {s.requested}")
    if s.mode is SliceMode.CONTIGUOUS and list(s.chips) != fabric.box_chips(s.chips[0],
                                                                            s.placed):
        problems.append("contiguous slice is not a box of the torus")
    have: dict[tuple[Chip, Chip, Axis], int] = {}
    lanes: dict[Chip, int] = {}
    for c in s.circuits:
        key = (min(c.a, c.b), max(c.a, c.b), c.axis)
        have[key] = have.get(key, 0) + 1
        lanes[c.a] = lanes.get(c.a, 0) + 1
        lanes[c.b] = lanes.get(c.b, 0) + 1
        problems += _circuit_problems(fabric, s, c)
    for chip, n in lanes.items():
        if n > LANES_PER_CHIP:
            problems.append(f"chip {chip} has {n} lanes > {LANES_PER_CHIP}")
    for axis in Axis:
        for u, v, _ in _logical_links(s.placed, axis, wraps=False):
            a, b = s.chips[u], s.chips[v]
            live = a not in s.failed and b not in s.failed
            if live and have.get((min(a, b), max(a, b), axis), 0) == 0:
                problems.append(f"logical link {a}-{b} (axis {axis.name}) has no circuit")
    return problems


def _circuit_problems(fabric: TorusFabric, s: Slice, c: Circuit) -> list[str]:
    """``verify_slice`` for one circuit ``c`` of ``s``: both chips in the slice; a fixed
    circuit is one torus wire between them, a photonic one a fibre path from the first chip's
    server to the second's (each fibre leaving the server the path has reached)."""
    problems: list[str] = []
    if c.a not in s.chips or c.b not in s.chips:
        problems.append(f"circuit {c.a}-{c.b} leaves the slice")
    if not c.photonic:
        if len(c.links) != 1 or {c.links[0].src, c.links[0].dst} != {c.a, c.b}:
            problems.append(f"fixed circuit {c.a}-{c.b} is not one torus wire")
        return problems
    cur = fabric.server_of(c.a)
    for link in c.links:
        ends = (fabric.server_of(link.src), fabric.server_of(link.dst))
        if cur not in ends or ends[0] == ends[1]:
            problems.append(f"circuit {c.a}-{c.b}: fibre {link} does not leave {cur}")
            break
        cur = ends[1] if ends[0] == cur else ends[0]
    if cur != fabric.server_of(c.b):
        problems.append(f"circuit {c.a}-{c.b} ends at {cur}, not {fabric.server_of(c.b)}")
    return problems


def _box_sums(grid: BoolGrid, shape: Shape) -> IntGrid:
    """For every origin, the number of True cells of ``grid`` in the ``shape`` box at that
    origin, wrapping around (one windowed cumulative sum per axis)."""
    out: IntGrid = grid.astype(np.int64)
    for axis, ext in enumerate(shape.extents):
        n = out.shape[axis]
        if ext == 1:
            continue
        if ext >= n:
            out = np.repeat(out.sum(axis=axis, keepdims=True), n, axis=axis)
            continue
        o = np.moveaxis(out, axis, 0)
        c = np.cumsum(np.concatenate([o, o[:ext - 1]]), axis=0)
        c = np.concatenate([np.zeros_like(c[:1]), c])
        out = np.moveaxis(c[ext:ext + n] - c[:n], 0, axis)
    return out


def _largest_box(free: BoolGrid) -> int:
    """Volume of the largest all-True box of ``free`` (any origin, wrapping): boxes grow one
    extent at a time by AND-ing shifted copies, and a branch stops as soon as no origin fits."""
    nx, ny, nz = free.shape
    best = 0
    fx = np.concatenate([free, free], axis=0)
    a_fit = np.ones_like(free)
    for a in range(1, nx + 1):
        a_fit = a_fit & fx[a - 1:a - 1 + nx]
        if not a_fit.any():
            break
        if a * ny * nz <= best:
            continue
        ay = np.concatenate([a_fit, a_fit], axis=1)
        b_fit = np.ones_like(free)
        for b in range(1, ny + 1):
            b_fit = b_fit & ay[:, b - 1:b - 1 + ny]
            if not b_fit.any():
                break
            if a * b * nz <= best:
                continue
            bz = np.concatenate([b_fit, b_fit], axis=2)
            c_fit = np.ones_like(free)
            for c in range(1, nz + 1):
                c_fit = c_fit & bz[:, :, c - 1:c - 1 + nz]
                if not c_fit.any():
                    break
                best = max(best, a * b * c)
    return best
