"""Morphlux's fragmented-slice allocation as an integer program (pure; solved by HiGHS).

Morphlux (A. Vijaya Kumar et al., arXiv:2508.03674, "MorphMgr": a fragmented-slice ILP
allocator) places a slice that no free box holds by assigning the slice's **slots** to free
servers and routing every pair of logically neighbouring slots over one of ``k`` candidate
routes, minimising the maximum load of a server-to-server edge. This module states that program
over plain integers (no torus types), so that it can be checked by hand:

- a **slot** ``t`` needs ``slot_chips[t]`` chips of one server (in Lightrail a slot is a
  ``2x2x1`` tile of the logical shape, ``lightrail.controller.torus.allocator``);
- a **slot pair** ``(a, b, links)`` says that ``links`` logical mesh links join slots ``a`` and
  ``b`` (each becomes one circuit that takes one fibre on every edge of its route);
- ``server_free[s]`` is the free chips of candidate server ``s``; ``edge_fibres[(u, v)]``
  (``u < v``) the usable fibres of the edge between servers ``u`` and ``v``;
- ``routes[(u, v)]`` (``u < v``) the candidate routes between ``u`` and ``v``, each a server
  sequence from ``u`` to ``v`` whose consecutive servers are edges.

Variables: ``x[t, s]`` (binary: slot ``t`` on server ``s``); ``z[q, s, s']`` (binary: pair ``q``'s
slots on ``s`` and ``s'``, the product ``x[a, s] * x[b, s']`` linearised by
``sum_s' z = x[a, s]`` and ``sum_s z = x[b, s']``); ``y[q, s, s', r]`` (integer in
``[0, links]``: the pair's links on route ``r``; ``sum_r y = links * z``); ``L`` (continuous in
``[0, 1]``).

Constraints: every slot on one server; per server, the chips of its slots <= its free chips;
per edge ``e``, ``load_e = sum of y over routes through e <= edge_fibres[e] * L`` (so ``L <= 1``
also means every circuit gets its own fibre), and ``load_e <= edge_fibres[e] * occupancy`` of
each end server (a route may cross only servers that hold a slot of the slice: Lightrail's
isolation rule R3, ports belong to the chips they are homed on).

Objective: ``minimise L``, the **maximum edge load**: the largest ``circuits / usable fibres``
over the edges the slice uses (0 when every pair shares a server). Ties are then broken
lexicographically: a second solve, in the time left, keeps ``L <= L*`` and minimises the fibres
all circuits use (shorter routes leave fibres for widening); when it does not finish, the first
solve's placement stands. (One weighted objective ``L + eps * fibres`` was measured slower with
HiGHS over 16 recorded 4x4x4 problems: 16 s, one solve stopped at a 10 s limit, against 9 s for
``L`` alone and 12 s with the second solve.)

Errors: :class:`FragmentedInputError` (a :class:`~lightrail.controller.torus.model.TorusError`)
names the field and value of a malformed problem. The solver's time limit is
``time_limit_s``; a solve that stops there reports :attr:`IlpStatus.TIME_LIMIT` (the caller
falls back to its heuristic).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from lightrail.controller.torus.model import TorusError

Route = tuple[int, ...]
"""A route: server indices from one end to the other (consecutive entries are edges)."""


class FragmentedInputError(TorusError):
    """A fragmented-slice problem is malformed; the message names the field and the value."""


class IlpStatus(Enum):
    """How a solve ended: proven optimal, stopped at the time limit, or no placement exists
    among the candidates."""

    OPTIMAL = "optimal"
    TIME_LIMIT = "time-limit"
    INFEASIBLE = "infeasible"


@dataclass(frozen=True, slots=True)
class SlotPair:
    """``links`` logical mesh links join slots ``a`` and ``b`` (``a != b``, ``links >= 1``)."""

    a: int
    b: int
    links: int


@dataclass(frozen=True, slots=True)
class FragmentedProblem:
    """One fragmented-slice placement (module docstring). Validated on construction; raises
    :class:`FragmentedInputError` naming the field and value."""

    slot_chips: tuple[int, ...]
    pairs: tuple[SlotPair, ...]
    server_free: dict[int, int]
    edge_fibres: dict[tuple[int, int], int]
    routes: dict[tuple[int, int], tuple[Route, ...]]

    def __post_init__(self) -> None:
        _check_slots(self.slot_chips, self.pairs)
        _check_edges(self.server_free, self.edge_fibres)
        _check_routes(self.routes, self.edge_fibres)

    @property
    def max_fibres(self) -> int:
        """The largest usable-fibre count of an edge (at least 1)."""
        return max(self.edge_fibres.values(), default=1) or 1


def _check_slots(slot_chips: tuple[int, ...], pairs: tuple[SlotPair, ...]) -> None:
    if not slot_chips:
        raise FragmentedInputError("slot_chips: needs at least one slot, got ()")
    for t, n in enumerate(slot_chips):
        if n < 1:
            raise FragmentedInputError(f"slot_chips[{t}]: must be >= 1, got {n}")
    for i, p in enumerate(pairs):
        n = len(slot_chips)
        if not (0 <= p.a < n and 0 <= p.b < n) or p.a == p.b:
            raise FragmentedInputError(
                f"pairs[{i}]: slots must be two different indices in [0, {n}), got "
                f"({p.a}, {p.b})")
        if p.links < 1:
            raise FragmentedInputError(f"pairs[{i}].links: must be >= 1, got {p.links}")


def _check_edges(server_free: dict[int, int], edge_fibres: dict[tuple[int, int], int]) -> None:
    for s, n in server_free.items():
        if n < 0:
            raise FragmentedInputError(f"server_free[{s}]: must be >= 0, got {n}")
    for e, n in edge_fibres.items():
        if e[0] >= e[1]:
            raise FragmentedInputError(f"edge_fibres: key must be (u, v) with u < v, got {e}")
        if n < 0:
            raise FragmentedInputError(f"edge_fibres[{e}]: must be >= 0, got {n}")


def _check_routes(routes: dict[tuple[int, int], tuple[Route, ...]],
                  edge_fibres: dict[tuple[int, int], int]) -> None:
    for key, rs in routes.items():
        if key[0] >= key[1]:
            raise FragmentedInputError(f"routes: key must be (u, v) with u < v, got {key}")
        for r in rs:
            if len(r) < 2 or r[0] != key[0] or r[-1] != key[1]:
                raise FragmentedInputError(
                    f"routes[{key}]: a route must run from {key[0]} to {key[1]}, got {r}")
            for u, v in itertools.pairwise(r):
                if _edge(u, v) not in edge_fibres:
                    raise FragmentedInputError(
                        f"routes[{key}]: {u}-{v} of route {r} is not in edge_fibres")


@dataclass(frozen=True, slots=True)
class FragmentedSolution:
    """The outcome of :func:`solve_fragmented`.

    ``slot_server[t]`` is the server of slot ``t``; ``pair_routes[q]`` lists ``(route, links)``
    for pair ``q`` (empty when both slots share a server); ``max_load`` the objective's ``L``
    (circuits / usable fibres, in [0, 1]); both ``None`` unless a placement was found
    (``OPTIMAL``; ``TIME_LIMIT`` with an incumbent). ``solve_s`` is the solver's wall-clock
    time in s; ``variables`` and ``constraints`` the program's size."""

    status: IlpStatus
    slot_server: tuple[int, ...] | None
    pair_routes: tuple[tuple[tuple[Route, int], ...], ...] | None
    max_load: float | None
    solve_s: float
    variables: int
    constraints: int


@dataclass(slots=True)
class _Builder:
    """Columns and rows of the program as it is built (sparse triplets)."""

    cost: list[float] = field(default_factory=list)
    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    integral: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)
    vals: list[float] = field(default_factory=list)
    row_lb: list[float] = field(default_factory=list)
    row_ub: list[float] = field(default_factory=list)

    def var(self, cost: float, lb: float, ub: float, integral: bool) -> int:
        self.cost.append(cost)
        self.lb.append(lb)
        self.ub.append(ub)
        self.integral.append(1 if integral else 0)
        return len(self.cost) - 1

    def row(self, terms: list[tuple[int, float]], lo: float, hi: float) -> None:
        r = len(self.row_lb)
        for c, v in terms:
            self.rows.append(r)
            self.cols.append(c)
            self.vals.append(v)
        self.row_lb.append(lo)
        self.row_ub.append(hi)


def _edge(u: int, v: int) -> tuple[int, int]:
    return (u, v) if u < v else (v, u)


def route_edges(route: Route) -> list[tuple[int, int]]:
    """The edges ``(u, v)``, ``u < v``, of ``route`` in order."""
    return [_edge(u, v) for u, v in itertools.pairwise(route)]


def max_edge_load(problem: FragmentedProblem,
                  pair_routes: tuple[tuple[tuple[Route, int], ...], ...]) -> float:
    """The objective ``L`` of any placement's routing: max over edges of circuits / usable
    fibres (``inf`` when an edge with no usable fibre carries a circuit; 0 with no circuit).
    ``pair_routes`` is as in :class:`FragmentedSolution`."""
    load: dict[tuple[int, int], int] = {}
    for per_pair in pair_routes:
        for route, links in per_pair:
            for e in route_edges(route):
                load[e] = load.get(e, 0) + links
    worst = 0.0
    for e, n in load.items():
        cap = problem.edge_fibres.get(e, 0)
        worst = max(worst, float("inf") if cap == 0 else n / cap)
    return worst


@dataclass(slots=True)
class _Program:
    """The program's columns by meaning: ``x[(slot, server)]``, ``y[(pair, s, s', route)]``,
    ``level`` (the column of ``L``), the z columns of each pair by its first slot's server
    (``z_from``) and its second's (``z_to``), and the y terms of each edge's load."""

    b: _Builder
    x: dict[tuple[int, int], int] = field(default_factory=dict)
    y: dict[tuple[int, int, int, int], int] = field(default_factory=dict)
    level: int = 0
    z_from: dict[tuple[int, int], list[tuple[int, float]]] = field(default_factory=dict)
    z_to: dict[tuple[int, int], list[tuple[int, float]]] = field(default_factory=dict)
    edge_terms: dict[tuple[int, int], list[tuple[int, float]]] = field(default_factory=dict)


def _pair_columns(prog: _Program, problem: FragmentedProblem, servers: list[int],
                  ) -> None:
    """The z and y columns of every slot pair, and its route-split rows."""
    b, x = prog.b, prog.x
    for q, p in enumerate(problem.pairs):
        for s in servers:
            if (p.a, s) not in x:
                continue
            for s2 in servers:
                if (p.b, s2) not in x:
                    continue
                rs = problem.routes.get(_edge(s, s2), ()) if s != s2 else ()
                if s != s2 and not rs:
                    continue
                zi = b.var(0.0, 0.0, 1.0, True)
                prog.z_from.setdefault((q, s), []).append((zi, 1.0))
                prog.z_to.setdefault((q, s2), []).append((zi, 1.0))
                if s == s2:
                    continue
                split: list[tuple[int, float]] = [(zi, -float(p.links))]
                for r_i, r in enumerate(rs):
                    yi = b.var(float(len(r) - 1), 0.0, float(p.links), True)
                    prog.y[(q, s, s2, r_i)] = yi
                    split.append((yi, 1.0))
                    for e in route_edges(r):
                        prog.edge_terms.setdefault(e, []).append((yi, 1.0))
                b.row(split, 0.0, 0.0)


def _build(problem: FragmentedProblem) -> _Program:
    """Columns and rows of the program (module docstring)."""
    prog = _Program(_Builder())
    b, x = prog.b, prog.x
    slots = range(len(problem.slot_chips))
    servers = sorted(problem.server_free)
    for t in slots:
        for s in servers:
            if problem.server_free[s] >= problem.slot_chips[t]:
                x[(t, s)] = b.var(0.0, 0.0, 1.0, True)
    prog.level = b.var(0.0, 0.0, 1.0, False)
    _pair_columns(prog, problem, servers)
    for t in slots:
        b.row([(x[(t, s)], 1.0) for s in servers if (t, s) in x], 1.0, 1.0)
    for s in servers:
        terms = [(x[(t, s)], float(problem.slot_chips[t])) for t in slots if (t, s) in x]
        if terms:
            b.row(terms, -np.inf, float(problem.server_free[s]))
    for q, p in enumerate(problem.pairs):
        for s in servers:
            if (p.a, s) in x:
                b.row([*prog.z_from.get((q, s), []), (x[(p.a, s)], -1.0)], 0.0, 0.0)
            if (p.b, s) in x:
                b.row([*prog.z_to.get((q, s), []), (x[(p.b, s)], -1.0)], 0.0, 0.0)
    for e, terms in prog.edge_terms.items():
        cap = float(problem.edge_fibres[e])
        b.row([*terms, (prog.level, -cap)], -np.inf, 0.0)
        for end in e:
            occupancy = [(x[(t, end)], -cap) for t in slots if (t, end) in x]
            b.row([*terms, *occupancy], -np.inf, 0.0)
    return prog


def solve_fragmented(problem: FragmentedProblem, time_limit_s: float) -> FragmentedSolution:
    """Solve the program of the module docstring with ``scipy.optimize.milp`` (HiGHS) within
    ``time_limit_s`` seconds. Raises :class:`FragmentedInputError` for ``time_limit_s <= 0``."""
    if not time_limit_s > 0:
        raise FragmentedInputError(f"time_limit_s: must be > 0, got {time_limit_s}")
    prog = _build(problem)
    b = prog.b
    n_var, n_row = len(b.cost), len(b.row_lb)
    matrix = coo_matrix((b.vals, (b.rows, b.cols)), shape=(n_row, n_var)).tocsr()
    constraints = [LinearConstraint(matrix, np.array(b.row_lb), np.array(b.row_ub))] \
        if n_row else []
    integrality = np.array(b.integral)
    lb, ub = np.array(b.lb), np.array(b.ub)
    level_only = np.zeros(n_var)
    level_only[prog.level] = 1.0
    started = time.perf_counter()
    res = milp(level_only, integrality=integrality, bounds=Bounds(lb, ub),
               constraints=constraints,
               options={"time_limit": float(time_limit_s), "mip_rel_gap": 1e-9, "disp": False})
    if res.status == 0:
        status = IlpStatus.OPTIMAL
    elif res.status == 1:
        status = IlpStatus.TIME_LIMIT
    else:
        return FragmentedSolution(IlpStatus.INFEASIBLE, None, None, None,
                                  time.perf_counter() - started, n_var, n_row)
    if res.x is None:
        return FragmentedSolution(status, None, None, None, time.perf_counter() - started,
                                  n_var, n_row)
    val = res.x
    left_s = time_limit_s - (time.perf_counter() - started)
    if status is IlpStatus.OPTIMAL and left_s > 0.01:
        ub[prog.level] = min(1.0, float(val[prog.level]) + 1e-7)
        tie = milp(np.array(b.cost), integrality=integrality, bounds=Bounds(lb, ub),
                   constraints=constraints,
                   options={"time_limit": left_s, "mip_rel_gap": 1e-9, "disp": False})
        if tie.x is not None:
            val = tie.x
    solve_s = time.perf_counter() - started
    servers = sorted(problem.server_free)
    slot_server = tuple(next(s for s in servers if (t, s) in prog.x and val[prog.x[(t, s)]] > 0.5)
                        for t in range(len(problem.slot_chips)))
    used: list[list[tuple[Route, int]]] = [[] for _ in problem.pairs]
    for (q, s, s2, r_i), yi in prog.y.items():
        n = round(float(val[yi]))
        if n > 0:
            used[q].append((problem.routes[_edge(s, s2)][r_i], n))
    routes = tuple(tuple(u) for u in used)
    return FragmentedSolution(status, slot_server, routes, max_edge_load(problem, routes),
                              solve_s, n_var, n_row)
