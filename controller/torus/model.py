"""A torus fabric of accelerator chips with per-server silicon-photonic switches (Morphlux).

Pure data, no I/O. The fabric is an ``X x Y x Z`` torus of chips (TPU-style 3D torus, six links
per chip). Chips sit in servers of ``2 x 2 x 1`` chips and servers in racks (default ``4 x 4 x 4``
chips, a TPU v4 "cube"). Each server has a silicon-photonic switch between its four chips and the
torus cabling, as in Morphlux (A. Vijaya Kumar, E. Ding, A. Devraj, D. Bunandar, R. Singh,
"Morphlux: Programmable chip-to-chip photonic fabrics in multi-accelerator servers for ML",
arXiv:2508.03674, 2025; later titled "Morphlux: Transforming Torus Fabrics for Efficient
Multi-tenant ML"). The paper reports up to 66% more bandwidth for tenant allocations, up to 70%
less compute fragmentation, 1.72x training throughput on its prototype and a failed chip replaced
in 1.2 s. Its allocator (MorphMgr) solves an ILP for fragmented slices and keeps spare chips
aware of shared-risk groups; we implement a documented heuristic (the fast path,
``lightrail.controller.torus.allocator``) and that ILP after it
(``lightrail.controller.torus.ilp``, ``lightrail.controller.torus.ilp_stitch``).

Physical model (assumptions marked A*, our reading of Morphlux, not numbers from the paper):

- A1 Every chip has six transceiver **lanes** (x+, x-, y+, y-, z+, z-) of ``link_gbps`` each.
- A2 The torus cabling is fixed: lane ``d+`` of chip ``c`` is wired to lane ``d-`` of chip
  ``c + e_d`` (mod the torus size). One such wire is a :class:`TorusLink`. A dimension of size 1
  has no links; a dimension of size 2 has two parallel links between the pair.
- A3 A link between chips of two different servers is a **fibre** that ends on one external
  :class:`Port` of each server's photonic switch. A port is *homed* on the chip whose lane it
  carried in the plain torus. Server faces hold 2 fibres (x and y faces) or 4 fibres (z faces).
- A4 (Lightrail/Morphlux) the per-server photonic switch is a strictly non-blocking crossbar over
  the 24 chip lanes and the server's external ports; see ``lightrail.controller.torus.allocator``
  for what it
  can and cannot connect.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import TypeVar

LANES_PER_CHIP = 6
"""Transceiver lanes per chip (A1): one per torus direction of a 3D torus."""

SERVER_SHAPE_X = 2
SERVER_SHAPE_Y = 2
"""Servers are ``2 x 2 x 1`` chips (TPU v4 hosts carry four chips)."""


class TorusError(ValueError):
    """A torus description or a coordinate is invalid; the message names the field and value."""


class Axis(IntEnum):
    """A torus dimension."""

    X = 0
    Y = 1
    Z = 2


class FailureDomainKind(Enum):
    """How spares are grouped: one server (``2x2x1`` chips) or one rack."""

    SERVER = "server"
    RACK = "rack"


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """Extents of a box of chips along x, y and z (each >= 1). Text form ``"4x4x1"``."""

    x: int
    y: int
    z: int

    @classmethod
    def parse(cls, text: str, field_name: str = "shape") -> Shape:
        """Parse ``"AxBxC"`` (or ``"AxB"``, ``"A"``: missing extents are 1).

        Raises :class:`TorusError` naming ``field_name`` on anything else."""
        parts = text.strip().lower().split("x")
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise TorusError(f"{field_name}: expected AxBxC, got {text!r}") from None
        if not 1 <= len(values) <= 3 or any(v < 1 for v in values):
            raise TorusError(f"{field_name}: expected 1 to 3 extents >= 1, got {text!r}")
        values += [1] * (3 - len(values))
        return cls(values[0], values[1], values[2])

    def __post_init__(self) -> None:
        if min(self.x, self.y, self.z) < 1:
            raise TorusError(f"shape: extents must be >= 1, got {self.x}x{self.y}x{self.z}")

    def __str__(self) -> str:
        return f"{self.x}x{self.y}x{self.z}"

    @property
    def extents(self) -> tuple[int, int, int]:
        """``(x, y, z)`` extents."""
        return (self.x, self.y, self.z)

    @property
    def volume(self) -> int:
        """Number of chips."""
        return self.x * self.y * self.z

    def extent(self, axis: Axis) -> int:
        """Extent along ``axis``."""
        return self.extents[axis]

    def rotations(self) -> list[Shape]:
        """The distinct axis permutations of this shape, this one first."""
        seen: list[Shape] = []
        for perm in itertools.permutations(self.extents):
            s = Shape(*perm)
            if s not in seen:
                seen.append(s)
        return seen

    def fits_in(self, outer: Shape) -> bool:
        """True when every extent is <= the matching extent of ``outer`` (no rotation)."""
        return self.x <= outer.x and self.y <= outer.y and self.z <= outer.z

    def surface(self) -> int:
        """Surface of the box in chip faces: lower is more compact."""
        return 2 * (self.x * self.y + self.y * self.z + self.x * self.z)


@dataclass(frozen=True, slots=True, order=True)
class Chip:
    """An accelerator chip at torus coordinates ``(x, y, z)``."""

    x: int
    y: int
    z: int

    def __str__(self) -> str:
        return f"({self.x},{self.y},{self.z})"

    def coord(self, axis: Axis) -> int:
        """Coordinate along ``axis``."""
        return (self.x, self.y, self.z)[axis]


@dataclass(frozen=True, slots=True, order=True)
class ServerId:
    """A ``2x2x1`` server at server-grid coordinates: chips ``x = 2*sx, 2*sx+1``, ``y = 2*sy,
    2*sy+1`` and ``z = sz``."""

    sx: int
    sy: int
    sz: int

    def __str__(self) -> str:
        return f"server[{self.sx},{self.sy},{self.sz}]"


@dataclass(frozen=True, slots=True, order=True)
class FailureDomain:
    """A failure domain (a server or a rack) by kind and grid index along x, y, z."""

    kind: FailureDomainKind
    ix: int
    iy: int
    iz: int

    def __str__(self) -> str:
        return f"{self.kind.value}[{self.ix},{self.iy},{self.iz}]"


@dataclass(frozen=True, slots=True, order=True)
class Port:
    """One end of a torus wire: lane ``axis`` (``positive`` for the + direction) of chip
    ``home``. On a Morphlux server the port is an external port of the photonic switch (A3)."""

    home: Chip
    axis: Axis
    positive: bool


@dataclass(frozen=True, slots=True, order=True)
class TorusLink:
    """The fixed wire from lane ``axis+`` of ``src`` to lane ``axis-`` of ``dst`` (A2)."""

    src: Chip
    dst: Chip
    axis: Axis

    @property
    def ports(self) -> tuple[Port, Port]:
        """The two ports the wire ends on."""
        return (Port(self.src, self.axis, True), Port(self.dst, self.axis, False))


@dataclass(frozen=True, slots=True)
class TorusTables:
    """Dense integer tables of a fabric for hot loops (allocator search and routing).

    Chip id ``x + X * (y + Y * z)``; server index ``sx + SX * (sy + SY * sz)``; link id = index
    in ``TorusFabric.links``. ``chip_server[c]`` is the server of chip ``c``;
    ``server_chips[s]`` its 4 chip ids; ``server_dist[a][b]`` the server-grid distance;
    ``server_nbrs[s]`` the distinct neighbour servers; ``fibres[(a, b)]`` the ids of the fibres
    joining servers ``a`` and ``b`` (both orders); ``link_ends[l]`` the chip ids of link
    ``l``'s src and dst."""

    chips: tuple[Chip, ...]
    chip_server: tuple[int, ...]
    server_chips: tuple[tuple[int, ...], ...]
    server_dist: tuple[tuple[int, ...], ...]
    server_nbrs: tuple[tuple[int, ...], ...]
    fibres: dict[tuple[int, int], tuple[int, ...]]
    link_ends: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class TorusFabric:
    """An ``dims`` torus of chips in ``2x2x1`` servers and ``rack`` racks.

    ``link_gbps`` is the rate of one lane (one direction). Raises :class:`TorusError` when the
    x or y extent is odd (servers are 2x2x1), when the rack does not tile the torus, or when a
    rack's x or y extent is odd.
    """

    dims: Shape
    rack: Shape = field(default_factory=lambda: Shape(4, 4, 4))
    link_gbps: float = 100.0
    _links: tuple[TorusLink, ...] = field(init=False, repr=False, compare=False)
    _between: dict[tuple[ServerId, ServerId], tuple[TorusLink, ...]] = field(
        init=False, repr=False, compare=False)
    _chip_links: dict[tuple[Chip, Chip], tuple[TorusLink, ...]] = field(
        init=False, repr=False, compare=False)
    _grid: Shape = field(init=False, repr=False, compare=False)
    _server_ids: tuple[ServerId, ...] = field(init=False, repr=False, compare=False)
    _server_index: dict[ServerId, int] = field(init=False, repr=False, compare=False)
    _server_dist: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    _server_nbrs: tuple[tuple[ServerId, ...], ...] = field(init=False, repr=False,
                                                           compare=False)
    tables: TorusTables = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        d = self.dims
        if d.x % SERVER_SHAPE_X or d.y % SERVER_SHAPE_Y:
            raise TorusError(f"dims: torus x and y extents must be even (servers are 2x2x1), "
                             f"got {d}")
        r = self.rack
        if r.x % SERVER_SHAPE_X or r.y % SERVER_SHAPE_Y:
            raise TorusError(f"rack: x and y must be even (servers are 2x2x1), got {r}")
        if d.x % r.x or d.y % r.y or d.z % r.z:
            raise TorusError(f"rack: {r} does not tile the torus {d}")
        if not self.link_gbps > 0:
            raise TorusError(f"link_gbps: must be > 0, got {self.link_gbps}")
        grid = Shape(d.x // SERVER_SHAPE_X, d.y // SERVER_SHAPE_Y, d.z)
        object.__setattr__(self, "_grid", grid)
        ids = tuple(ServerId(sx, sy, sz) for sz in range(grid.z) for sy in range(grid.y)
                    for sx in range(grid.x))
        object.__setattr__(self, "_server_ids", ids)
        object.__setattr__(self, "_server_index", {s: i for i, s in enumerate(ids)})
        object.__setattr__(self, "_server_dist", tuple(
            tuple(_ring_dist(a.sx, b.sx, grid.x) + _ring_dist(a.sy, b.sy, grid.y)
                  + _ring_dist(a.sz, b.sz, grid.z) for b in ids) for a in ids))
        nbrs: list[tuple[ServerId, ...]] = []
        for a in ids:
            out: list[ServerId] = []
            for dx, dy, dz in ((1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1),
                               (0, 0, -1)):
                n = ServerId((a.sx + dx) % grid.x, (a.sy + dy) % grid.y, (a.sz + dz) % grid.z)
                if n != a and n not in out:
                    out.append(n)
            nbrs.append(tuple(out))
        object.__setattr__(self, "_server_nbrs", tuple(nbrs))
        links: list[TorusLink] = []
        between: dict[tuple[ServerId, ServerId], list[TorusLink]] = {}
        chip_links: dict[tuple[Chip, Chip], list[TorusLink]] = {}
        for chip in self.chips():
            for axis in Axis:
                if d.extent(axis) < 2:
                    continue
                link = TorusLink(chip, self.shift(chip, axis, 1), axis)
                links.append(link)
                key = _pair(link.src, link.dst)
                chip_links.setdefault(key, []).append(link)
                sa, sb = self.server_of(link.src), self.server_of(link.dst)
                if sa != sb:
                    between.setdefault(_pair(sa, sb), []).append(link)
        object.__setattr__(self, "_links", tuple(links))
        object.__setattr__(self, "_between", {k: tuple(v) for k, v in between.items()})
        object.__setattr__(self, "_chip_links", {k: tuple(v) for k, v in chip_links.items()})
        object.__setattr__(self, "tables", self._build_tables())

    def _build_tables(self) -> TorusTables:
        chips = tuple(self.chips())
        cid = {c: i for i, c in enumerate(chips)}
        sidx = self._server_index
        fibres: dict[tuple[int, int], list[int]] = {}
        for lid, link in enumerate(self._links):
            a, b = sidx[self.server_of(link.src)], sidx[self.server_of(link.dst)]
            if a != b:
                fibres.setdefault((a, b), []).append(lid)
                fibres.setdefault((b, a), []).append(lid)
        return TorusTables(
            chips=chips,
            chip_server=tuple(sidx[self.server_of(c)] for c in chips),
            server_chips=tuple(tuple(cid[c] for c in self.chips_of_server(s))
                               for s in self._server_ids),
            server_dist=self._server_dist,
            server_nbrs=tuple(tuple(sidx[n] for n in ns) for ns in self._server_nbrs),
            fibres={k: tuple(v) for k, v in fibres.items()},
            link_ends=tuple((cid[link.src], cid[link.dst]) for link in self._links),
        )

    def chip_id(self, chip: Chip) -> int:
        """Dense id of ``chip`` (``x + X * (y + Y * z)``), the index in ``tables.chips``."""
        return chip.x + self.dims.x * (chip.y + self.dims.y * chip.z)

    @classmethod
    def parse(cls, dims: str, rack: str = "4x4x4", link_gbps: float = 100.0) -> TorusFabric:
        """A fabric from text extents, e.g. ``TorusFabric.parse("8x8x8")``. A rack larger than
        the torus along an axis is clipped to it."""
        d = Shape.parse(dims, "torus")
        r = Shape.parse(rack, "rack")
        r = Shape(min(r.x, d.x), min(r.y, d.y), min(r.z, d.z))
        return cls(d, r, link_gbps)

    # --- chips, servers, racks -------------------------------------------------------------

    @property
    def chip_count(self) -> int:
        """Number of chips."""
        return self.dims.volume

    @property
    def server_grid(self) -> Shape:
        """Extents of the grid of servers."""
        return self._grid

    @property
    def server_count(self) -> int:
        """Number of servers."""
        return len(self._server_ids)

    def server_index(self, server: ServerId) -> int:
        """Dense index of ``server`` (sx fastest), for tables."""
        return self._server_index[server]

    def chips(self) -> Iterator[Chip]:
        """Every chip, x fastest then y then z."""
        d = self.dims
        for z in range(d.z):
            for y in range(d.y):
                for x in range(d.x):
                    yield Chip(x, y, z)

    def check_chip(self, chip: Chip, field_name: str = "chip") -> None:
        """Raise :class:`TorusError` naming ``field_name`` if ``chip`` is outside the torus."""
        d = self.dims
        if not (0 <= chip.x < d.x and 0 <= chip.y < d.y and 0 <= chip.z < d.z):
            raise TorusError(f"{field_name}: {chip} is outside the torus {d}")

    def shift(self, chip: Chip, axis: Axis, delta: int) -> Chip:
        """``chip`` moved by ``delta`` along ``axis``, wrapping around the torus."""
        c = [chip.x, chip.y, chip.z]
        c[axis] = (c[axis] + delta) % self.dims.extent(axis)
        return Chip(c[0], c[1], c[2])

    def distance(self, a: Chip, b: Chip) -> int:
        """Torus (wrap-around Manhattan) distance between two chips in hops."""
        return sum(_ring_dist(a.coord(ax), b.coord(ax), self.dims.extent(ax)) for ax in Axis)

    def server_of(self, chip: Chip) -> ServerId:
        """The server holding ``chip``."""
        return ServerId(chip.x // SERVER_SHAPE_X, chip.y // SERVER_SHAPE_Y, chip.z)

    def servers(self) -> Iterator[ServerId]:
        """Every server, sx fastest."""
        yield from self._server_ids

    def chips_of_server(self, server: ServerId) -> tuple[Chip, ...]:
        """The four chips of ``server``: (0,0), (1,0), (0,1), (1,1) in local x, y."""
        bx, by = server.sx * SERVER_SHAPE_X, server.sy * SERVER_SHAPE_Y
        return tuple(Chip(bx + lx, by + ly, server.sz) for ly in range(2) for lx in range(2))

    def server_distance(self, a: ServerId, b: ServerId) -> int:
        """Wrap-around Manhattan distance on the server grid, in server hops."""
        return self._server_dist[self._server_index[a]][self._server_index[b]]

    def server_neighbours(self, server: ServerId) -> tuple[ServerId, ...]:
        """Distinct servers joined to ``server`` by at least one fibre."""
        return self._server_nbrs[self._server_index[server]]

    def rack_of(self, chip: Chip) -> FailureDomain:
        """The rack holding ``chip``."""
        r = self.rack
        return FailureDomain(FailureDomainKind.RACK, chip.x // r.x, chip.y // r.y, chip.z // r.z)

    def domain_of(self, chip: Chip, kind: FailureDomainKind) -> FailureDomain:
        """The failure domain of ``kind`` holding ``chip``."""
        if kind is FailureDomainKind.RACK:
            return self.rack_of(chip)
        s = self.server_of(chip)
        return FailureDomain(FailureDomainKind.SERVER, s.sx, s.sy, s.sz)

    def domains(self, kind: FailureDomainKind) -> list[FailureDomain]:
        """Every failure domain of ``kind``, in index order."""
        if kind is FailureDomainKind.SERVER:
            return [FailureDomain(kind, s.sx, s.sy, s.sz) for s in self.servers()]
        d, r = self.dims, self.rack
        return [FailureDomain(kind, ix, iy, iz) for iz in range(d.z // r.z)
                for iy in range(d.y // r.y) for ix in range(d.x // r.x)]

    def chips_of_domain(self, domain: FailureDomain) -> tuple[Chip, ...]:
        """The chips of ``domain``, x fastest."""
        if domain.kind is FailureDomainKind.SERVER:
            return self.chips_of_server(ServerId(domain.ix, domain.iy, domain.iz))
        r = self.rack
        return tuple(Chip(domain.ix * r.x + x, domain.iy * r.y + y, domain.iz * r.z + z)
                     for z in range(r.z) for y in range(r.y) for x in range(r.x))

    # --- wiring ------------------------------------------------------------------------------

    @property
    def links(self) -> tuple[TorusLink, ...]:
        """Every fixed torus wire (A2)."""
        return self._links

    def links_between_chips(self, a: Chip, b: Chip) -> tuple[TorusLink, ...]:
        """The fixed wires joining chips ``a`` and ``b`` (0, 1, or 2 when a torus dimension has
        size 2)."""
        return self._chip_links.get(_pair(a, b), ())

    def fibres_between(self, a: ServerId, b: ServerId) -> tuple[TorusLink, ...]:
        """The fibres (inter-server wires, A3) joining servers ``a`` and ``b``."""
        return self._between.get(_pair(a, b), ())

    def box_chips(self, origin: Chip, shape: Shape) -> list[Chip]:
        """The chips of the ``shape`` box at ``origin`` (wrapping), x fastest."""
        return [Chip((origin.x + i) % self.dims.x, (origin.y + j) % self.dims.y,
                     (origin.z + k) % self.dims.z)
                for k in range(shape.z) for j in range(shape.y) for i in range(shape.x)]


def _ring_dist(a: int, b: int, n: int) -> int:
    d = abs(a - b) % n
    return min(d, n - d)


_T = TypeVar("_T", Chip, ServerId)


def _pair(a: _T, b: _T) -> tuple[_T, _T]:
    return (a, b) if a <= b else (b, a)
