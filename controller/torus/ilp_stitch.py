"""Stitched slices by Morphlux's integer program, with the heuristic as fast path and fallback.

Pure (no I/O). :class:`IlpStitcher` plugs into
:class:`~lightrail.controller.torus.allocator.TorusAllocator` (``improver=``). For every
stitched request (and every stitched probe of ``largest_allocatable``) the allocator's heuristic
runs first (the fast path, ``lightrail.controller.torus.allocator`` step 2); then this module
states the placement as the program of ``lightrail.controller.torus.ilp`` (Morphlux,
arXiv:2508.03674, MorphMgr's fragmented-slice ILP: slots onto servers, ``k`` candidate routes
per pair of neighbouring slots, minimise the maximum edge load) and solves it with HiGHS:

- **slots**: the ``2x2x1`` tiles of the logical shape (the heuristic's shape when it placed
  the slice, else its best-ranked rotation); a slot needs its tile's chips in one server.
- **slot pairs**: tiles adjacent along x, y or z, with the mesh links between them (a tile's
  rows, columns or all its chips).
- **candidate servers**: servers with free chips in the free region of the heuristic's servers
  (else of its best seed), nearest first, ``slots + margin`` of them, always including the
  heuristic's servers.
- **edges**: neighbouring candidate servers, with their usable fibres (no other slice's
  circuit on it, both ends homed on free chips).
- **routes**: for candidate servers at most ``pair_max_distance`` server hops apart, the ``k``
  shortest simple routes over candidate edges of at most ``max_route_hops`` fibres, plus every
  route the heuristic's circuits took; so the heuristic's placement is a feasible point and the
  program's optimum is never worse (on the objective) than the heuristic's.

Outcome per request (:class:`IlpStats` counts them): the program's placement when it is
strictly better than the heuristic's (lower maximum edge load) or the heuristic found none, and
it wires (``_wire`` with the mesh links pinned to the chosen routes); otherwise the heuristic's
plan. A solve that stops at ``time_limit_s`` falls back to the heuristic (``fallbacks``); a
program over ``max_variables`` is not solved (``too_large``, heuristic). Chips inside a server are
taken in id order, so a program whose slot shares a server with free chips of no slot can name
a fibre whose end chip the slice does not hold (R3 at chip level): such a placement does not
wire and the heuristic's is kept (``unroutable``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lightrail.controller.torus.allocator import (
    ChipState,
    SliceMode,
    TorusAllocator,
    _logical_links,
    _Plan,
    _Router,
    _wire,
)
from lightrail.controller.torus.ilp import (
    FragmentedInputError,
    FragmentedProblem,
    IlpStatus,
    Route,
    SlotPair,
    max_edge_load,
    solve_fragmented,
)
from lightrail.controller.torus.model import Axis, Shape

Tile = tuple[int, int, int]


@dataclass(slots=True)
class IlpStats:
    """Counts over the requests an :class:`IlpStitcher` saw (module docstring): ``solves``
    programs run, ``optimal`` proven optimal, ``fallbacks`` stopped at the time limit (the
    heuristic's plan used), ``too_large`` not solved, ``infeasible`` with no placement among the
    candidates (by :func:`_may_fit` before solving, or by the solver), ``improved`` better than
    the heuristic's plan and used, ``rescued`` placed where the heuristic found nothing,
    ``unroutable`` solved but not wired; ``heuristic_load`` and ``ilp_load`` the maximum edge
    load of both on the requests where both placed the slice and the program was optimal (same
    order); ``solve_s`` the solver's total time in s."""

    solves: int = 0
    optimal: int = 0
    fallbacks: int = 0
    too_large: int = 0
    infeasible: int = 0
    improved: int = 0
    rescued: int = 0
    unroutable: int = 0
    heuristic_load: list[float] = field(default_factory=list)
    ilp_load: list[float] = field(default_factory=list)
    solve_s: float = 0.0


@dataclass(frozen=True, slots=True)
class _Layout:
    """The slots of a shape: tile per slot, the logical chip indices of each tile."""

    tiles: tuple[Tile, ...]
    members: tuple[tuple[int, ...], ...]
    pairs: tuple[SlotPair, ...]


def _layout(shape: Shape) -> _Layout:
    tx, ty, tz = -(-shape.x // 2), -(-shape.y // 2), shape.z
    tiles = sorted(((i, j, k) for i in range(tx) for j in range(ty) for k in range(tz)),
                   key=lambda q: (q[0] + q[1] + q[2], q[2], q[1], q[0]))
    index = {q: n for n, q in enumerate(tiles)}
    members: list[tuple[int, ...]] = []
    pairs: list[SlotPair] = []
    for n, (i, j, k) in enumerate(tiles):
        cells = [(2 * i + u, 2 * j + v) for v in range(2) for u in range(2)
                 if 2 * i + u < shape.x and 2 * j + v < shape.y]
        members.append(tuple(li + shape.x * (lj + shape.y * k) for li, lj in cells))
        rows = len({c[1] for c in cells})
        cols = len({c[0] for c in cells})
        for prev, links in (((i - 1, j, k), rows), ((i, j - 1, k), cols),
                            ((i, j, k - 1), len(cells))):
            if prev in index:
                pairs.append(SlotPair(index[prev], n, links))
    return _Layout(tuple(tiles), tuple(members), tuple(pairs))


def _wire_servers(alloc: TorusAllocator, a: int, links: tuple[int, ...]) -> Route:
    """The server sequence of a circuit from chip ``a`` over fibres ``links``."""
    t = alloc.fabric.tables
    cur = t.chip_server[a]
    out = [cur]
    for lid in links:
        sa, sb = (t.chip_server[c] for c in t.link_ends[lid])
        cur = sb if sa == cur else sa
        out.append(cur)
    return tuple(out)


def _oriented(route: Route) -> tuple[tuple[int, int], Route]:
    """``route`` keyed and oriented from its lower end server to its higher one."""
    if route[0] < route[-1]:
        return (route[0], route[-1]), route
    return (route[-1], route[0]), route[::-1]


@dataclass(slots=True)
class IlpStitcher:
    """Morphlux's integer program for stitched slices (module docstring), solved within
    ``time_limit_s`` seconds (default 2 s) with ``k`` candidate routes per slot pair, pairs of
    slots at most ``pair_max_distance`` server hops apart (plus the heuristic's), ``margin``
    candidate servers beyond the slot count, and at most ``max_variables`` variables. Raises
    :class:`~lightrail.controller.torus.ilp.FragmentedInputError` naming a bad setting."""

    time_limit_s: float = 2.0
    k: int = 3
    pair_max_distance: int = 1
    margin: int = 4
    max_variables: int = 12_000
    stats: IlpStats = field(default_factory=IlpStats)

    def __post_init__(self) -> None:
        if not self.time_limit_s > 0:
            raise FragmentedInputError(f"time_limit_s: must be > 0, got {self.time_limit_s}")
        for name in ("k", "pair_max_distance", "max_variables"):
            if getattr(self, name) < 1:
                raise FragmentedInputError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.margin < 0:
            raise FragmentedInputError(f"margin: must be >= 0, got {self.margin}")

    def improve(self, alloc: TorusAllocator, shapes: list[Shape],
                heuristic: _Plan | None) -> _Plan | None:
        """The plan to use for one stitched request (module docstring)."""
        if heuristic is not None:
            shape = heuristic.placed
            anchor = {alloc.fabric.tables.chip_server[c] for c in heuristic.chips}
        else:
            ranked = alloc._stitch_ranking(shapes) if shapes else []
            if not ranked:
                return None
            seed, shape = ranked[0]
            anchor = {seed}
        layout = _layout(shape)
        problem, h_routes = self._problem(alloc, layout, anchor, heuristic)
        if problem is None:
            self.stats.too_large += 1
            return heuristic
        if not _may_fit(problem):
            self.stats.infeasible += 1
            return heuristic
        self.stats.solves += 1
        sol = solve_fragmented(problem, self.time_limit_s)
        self.stats.solve_s += sol.solve_s
        if sol.status is IlpStatus.TIME_LIMIT:
            self.stats.fallbacks += 1
            return heuristic
        if sol.status is IlpStatus.INFEASIBLE or sol.slot_server is None \
                or sol.pair_routes is None or sol.max_load is None:
            self.stats.infeasible += 1
            return heuristic
        self.stats.optimal += 1
        if heuristic is not None:
            h_load = max_edge_load(problem, h_routes)
            self.stats.heuristic_load.append(h_load)
            self.stats.ilp_load.append(sol.max_load)
            if sol.max_load >= h_load - 1e-9:
                return heuristic  # a tie keeps the heuristic's plan
        plan = self._realise(alloc, shape, layout, sol.slot_server, sol.pair_routes)
        if plan is None:
            self.stats.unroutable += 1
            return heuristic
        if heuristic is None:
            self.stats.rescued += 1
        else:
            self.stats.improved += 1
        return plan

    # --- the program -----------------------------------------------------------------------

    def _problem(self, alloc: TorusAllocator, layout: _Layout, anchor: set[int],
                 heuristic: _Plan | None
                 ) -> tuple[FragmentedProblem | None, tuple[tuple[tuple[Route, int], ...], ...]]:
        """The program and the heuristic's routing in its terms (empty without a heuristic
        plan); the program is ``None`` when it would have over ``max_variables``."""
        t = alloc.fabric.tables
        avail = alloc._avail()
        region, _ = alloc._regions()
        regions = {region[s] for s in anchor if region[s] >= 0}
        dist = t.server_dist
        pool = [s for s, r in enumerate(region) if r in regions and avail[s] > 0]
        pool.sort(key=lambda s: (min(dist[s][a] for a in anchor), -avail[s], s))
        cands = set(pool[:len(layout.tiles) + self.margin]) | anchor
        usable: dict[tuple[int, int], int] = {}
        state = alloc._state
        free = ChipState.FREE
        for u in cands:
            for v in t.server_nbrs[u]:
                if v in cands and u < v:
                    n = sum(1 for lid in t.fibres.get((u, v), ())
                            if lid not in alloc._fibre_user
                            and all(state[c] is free for c in t.link_ends[lid]))
                    if n:
                        usable[(u, v)] = n
        routes: dict[tuple[int, int], list[Route]] = {}
        hops = alloc.max_route_hops
        for u in sorted(cands):
            for v in sorted(cands):
                if u < v and dist[u][v] <= self.pair_max_distance:
                    found = _k_routes(u, v, usable, min(dist[u][v] + 2, hops), self.k)
                    if found:
                        routes[(u, v)] = found
        h_routes: list[tuple[tuple[Route, int], ...]] = []
        if heuristic is not None and heuristic.wires is not None:
            h_routes = self._heuristic_routes(alloc, layout, heuristic, routes)
        # x per slot and server, then per pair: z per (server, same server) and per ordered
        # routed server pair, y per route of it
        per_pair = len(cands) + 2 * sum(1 + len(rs) for rs in routes.values())
        n_vars = len(layout.tiles) * len(cands) + 1 + len(layout.pairs) * per_pair
        if n_vars > self.max_variables:
            return None, tuple(h_routes)
        problem = FragmentedProblem(
            slot_chips=tuple(len(m) for m in layout.members),
            pairs=layout.pairs,
            server_free={s: avail[s] for s in cands},
            edge_fibres=usable,
            routes={key: tuple(rs) for key, rs in routes.items()},
        )
        return problem, tuple(h_routes)

    def _heuristic_routes(self, alloc: TorusAllocator, layout: _Layout, heuristic: _Plan,
                          routes: dict[tuple[int, int], list[Route]]
                          ) -> list[tuple[tuple[Route, int], ...]]:
        """The heuristic's mesh circuits as routes per slot pair (each added to ``routes``):
        the first circuit of every logical mesh link is its mesh circuit (``_wire`` makes the
        mesh links first, then wrap-around and widening circuits)."""
        assert heuristic.wires is not None
        slot_of = {ci: n for n, m in enumerate(layout.members) for ci in m}
        pair_of = {(p.a, p.b): q for q, p in enumerate(layout.pairs)}
        chip_index = {c: i for i, c in enumerate(heuristic.chips)}
        per_pair: list[dict[Route, int]] = [{} for _ in layout.pairs]
        seen: set[tuple[int, int, int]] = set()
        for w in heuristic.wires:
            if w.wrap or not w.links:
                continue
            u, v = chip_index[w.a], chip_index[w.b]
            key = (min(u, v), max(u, v), w.axis)
            if key in seen:
                continue
            seen.add(key)
            q = pair_of.get((slot_of[u], slot_of[v]), pair_of.get((slot_of[v], slot_of[u])))
            if q is None:
                continue
            ekey, route = _oriented(_wire_servers(alloc, w.a, w.links))
            if route not in routes.setdefault(ekey, []):
                routes[ekey].append(route)
            per_pair[q][route] = per_pair[q].get(route, 0) + 1
        return [tuple(d.items()) for d in per_pair]

    # --- the placement ---------------------------------------------------------------------

    def _realise(self, alloc: TorusAllocator, shape: Shape, layout: _Layout,
                 slot_server: tuple[int, ...],
                 pair_routes: tuple[tuple[tuple[Route, int], ...], ...]) -> _Plan | None:
        """Chips per logical index (a server's free chips in id order) and the wiring with
        the mesh links pinned to the program's routes; ``None`` if it does not wire."""
        t = alloc.fabric.tables
        free = ChipState.FREE
        pools = {s: [c for c in t.server_chips[s] if alloc._state[c] is free]
                 for s in set(slot_server)}
        chips = [-1] * shape.volume
        for n, members in enumerate(layout.members):
            pool = pools[slot_server[n]]
            if len(pool) < len(members):
                return None
            for li, cid in zip(members, pool, strict=False):
                chips[li] = cid
            pools[slot_server[n]] = pool[len(members):]
        slot_of = {ci: n for n, m in enumerate(layout.members) for ci in m}
        pair_of = {(p.a, p.b): q for q, p in enumerate(layout.pairs)}
        left = [list(rs) for rs in pair_routes]
        pinned: dict[tuple[int, int, int], tuple[int, ...]] = {}
        for axis in Axis:
            for u, v, _ in _logical_links(shape, axis, wraps=False):
                su, sv = slot_server[slot_of[u]], slot_server[slot_of[v]]
                if su == sv:
                    continue
                q = pair_of.get((slot_of[u], slot_of[v]), pair_of.get((slot_of[v],
                                                                       slot_of[u])))
                if q is None:
                    return None
                at = next((i for i, (_, n) in enumerate(left[q]) if n > 0), None)
                if at is None:
                    return None
                route, n = left[q][at]
                left[q][at] = (route, n - 1)
                pinned[(u, v, int(axis))] = route if route[0] == su else route[::-1]
        wires = _wire(_Router(alloc, "(new)", set(chips), allow_borrow=False), shape, chips,
                      pinned)
        if wires is None:
            return None
        return _Plan(chips, shape, SliceMode.STITCHED, wires)


def _may_fit(problem: FragmentedProblem) -> bool:
    """Necessary conditions for a placement, checked before solving: the candidates' free chips
    cover the slots', and for every ``n`` > 2 there are as many candidate servers with ``n`` or
    more free chips as slots of ``n`` or more chips (a server of 4 chips holds at most one slot
    of 3 or 4)."""
    need = sorted(problem.slot_chips, reverse=True)
    have = sorted(problem.server_free.values(), reverse=True)
    if sum(need) > sum(have):
        return False
    for n in {c for c in need if c > 2}:
        if sum(1 for c in need if c >= n) > sum(1 for f in have if f >= n):
            return False
    return True


def _k_routes(u: int, v: int, edges: dict[tuple[int, int], int], max_len: int,
              k: int) -> list[Route]:
    """The ``k`` shortest simple routes (then lexicographic) from ``u`` to ``v`` over
    ``edges`` (``(a, b)``, ``a < b``, with usable fibres) of at most ``max_len`` edges."""
    nbrs: dict[int, list[int]] = {}
    for a, b in edges:
        nbrs.setdefault(a, []).append(b)
        nbrs.setdefault(b, []).append(a)
    found: list[Route] = []
    stack: list[tuple[int, ...]] = [(u,)]
    while stack:
        path = stack.pop()
        last = path[-1]
        if last == v:
            found.append(path)
            continue
        if len(path) - 1 >= max_len:
            continue
        for n in sorted(nbrs.get(last, ()), reverse=True):
            if n not in path:
                stack.append((*path, n))
    found.sort(key=lambda r: (len(r), r))
    return found[:k]
