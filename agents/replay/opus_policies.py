"""Lightrail's own rail policies for the Opus job (TP4 x PP2 x DP on rails), beyond evaluate's.

With one NIC port per GPU and TP filling the node, a host's PP peer and its DP peers are always
different hosts, so on a rail every PP <-> DP transition must retune that host's port: no
placement of the pairs on ports avoids a switch while each phase gets direct circuits. What can
avoid switching is a circuit set that serves both kinds at once: on an N x N OCS a port's Tx and
Rx may go to different peers, so one directed cycle through all hosts of a rail connects every
pair (one way directly, the other forwarded along the cycle). Policies priced here (per rail;
the four rails carry the same pattern):

* ``static_cycle`` - the cycle for the whole job, never reconfigured. Two host orders are tried
  and the faster kept: ``blocks`` (stage 0 ascending, stage 1 descending: each stage's DP ring
  is direct but for its closing hop) and ``interleaved`` (0, dp, 1, dp+1, ...: every PP
  forward direct).
* ``hybrid_cycle`` - provisioning with reconfigure-or-not over three circuit sets: the cycle,
  the PP pairs (direct, both ways) and the DP rings (direct). Before each phase it may stay
  (when the present set connects the phase's groups) or switch to the phase's direct set or to
  the cycle (δ hidden in the phase's idle gap, the rest exposed); the cheapest sequence of
  choices is found exactly (dynamic programming over the three states, in steady state).

Cost of a call on a circuit set: the cost model's rounds (``costmodel.round_cost``: forwarding
adds hops, circuits shared by concurrent flows add load): a PP call is every PP pair's message
at once (the mean of the two directions); a DP call is ``DP - 1`` ring rounds of every DP
group at once, each member sending its shard to its ring successor (a ring all-gather).
Forwarding needs a relay on the intermediate hosts (PCCL-style); NCCL on Perlmutter does not
relay by itself, so both cycle policies assume that software.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lightrail.agents.replay.trace.opus import OpusExperiment
from lightrail.agents.replay.trace.opus_format import PhaseLabel
from lightrail.controller.core.costmodel import Circuit, Flow, LinkModel, Topology, round_cost

__all__ = ["CycleOrder", "PhaseCost", "StagePolicies", "hybrid_cycle_s", "stage_policies"]

_STEADY_COPIES = 4
"""Steps the dynamic programme walks; the last one's cost is the steady-state step."""


@dataclass(frozen=True, slots=True)
class CycleOrder:
    """A directed cycle over the hosts: ``name`` and the host ``order``."""

    name: str
    order: tuple[int, ...]

    def topology(self) -> Topology:
        o = self.order
        return Topology.of_circuits(Circuit(a, b) for a, b in zip(o, (*o[1:], o[0]),
                                                                  strict=True))


@dataclass(frozen=True, slots=True)
class PhaseCost:
    """One phase of a stage's step (s): ``idle_s`` before it (hides δ), ``compute_s`` inside it,
    communication ``direct_s`` on its own direct circuits and ``cycle_s`` on the cycle."""

    label: PhaseLabel
    idle_s: float
    compute_s: float
    direct_s: float
    cycle_s: float


@dataclass(frozen=True, slots=True)
class StagePolicies:
    """Per stage, the phases' costs on the chosen cycle ``order``."""

    order: CycleOrder
    stages: tuple[tuple[PhaseCost, ...], ...]

    def static_cycle_s(self) -> float:
        """Iteration (s) of the slower stage on the static cycle."""
        return max(sum(p.idle_s + p.compute_s + p.cycle_s for p in st) for st in self.stages)


def cycle_orders(exp: OpusExperiment) -> tuple[CycleOrder, ...]:
    """The candidate host orders (module docstring)."""
    dp, n = exp.dp, exp.nodes
    blocks = (*range(dp), *range(n - 1, dp - 1, -1))
    inter = tuple(h for i in range(dp) for h in (i, i + dp))
    return (CycleOrder("blocks", blocks), CycleOrder("interleaved", inter))


def _pp_flows(exp: OpusExperiment, nbytes: float) -> tuple[list[Flow], list[Flow]]:
    dp = exp.dp
    return ([Flow(h, h + dp, nbytes) for h in range(dp)],
            [Flow(h + dp, h, nbytes) for h in range(dp)])


def _rings(exp: OpusExperiment, order: CycleOrder) -> list[list[int]]:
    """Each stage's DP ring: its hosts in the cycle's order."""
    dp = exp.dp
    return [[h for h in order.order if (h < dp) == (stage == 0)] for stage in (0, 1)]


def _ring_flows(rings: Sequence[Sequence[int]], nbytes: float) -> list[Flow]:
    return [Flow(r[i], r[(i + 1) % len(r)], nbytes) for r in rings for i in range(len(r))]


def _call_costs(exp: OpusExperiment, order: CycleOrder, link: LinkModel) -> dict[str, float]:
    """Seconds per PP and per DP call on the cycle and on the direct sets."""
    cyc = order.topology()
    pp_bytes = float(exp.model.pp_call_bytes())
    shard = float(exp.model.dp_unit_bytes() // exp.dp)
    fwd, bwd = _pp_flows(exp, pp_bytes)
    pairs = Topology.of_circuits(Circuit(f.src, f.dst) for f in (*fwd, *bwd))
    rings = _rings(exp, order)
    ring_flows = _ring_flows(rings, shard)
    ring_topo = Topology.of_circuits(Circuit(f.src, f.dst) for f in ring_flows)
    steps = exp.dp - 1
    return {
        "pp_cycle": (round_cost(cyc, fwd, link).time_s + round_cost(cyc, bwd, link).time_s) / 2,
        "pp_direct": (round_cost(pairs, fwd, link).time_s
                      + round_cost(pairs, bwd, link).time_s) / 2,
        "dp_cycle": steps * round_cost(cyc, ring_flows, link).time_s,
        "dp_direct": steps * round_cost(ring_topo, ring_flows, link).time_s,
    }


def stage_policies(exp: OpusExperiment, gap_scale: float, link: LinkModel) -> StagePolicies:
    """The phases' costs on the faster of the candidate cycles (by the static-cycle iteration).
    ``gap_scale``: the calibration factor of the compute gaps. Raises
    ``costmodel.UnreachableError`` if a cycle cannot route a flow (it always can)."""
    best: StagePolicies | None = None
    for order in cycle_orders(exp):
        c = _call_costs(exp, order, link)
        stages = tuple(tuple(
            PhaseCost(ph.label, ph.idle_s * gap_scale, ph.span_s * gap_scale,
                      ph.calls * c["pp_direct" if ph.label is PhaseLabel.PP else "dp_direct"],
                      ph.calls * c["pp_cycle" if ph.label is PhaseLabel.PP else "dp_cycle"])
            for ph in st) for st in exp.stages)
        cand = StagePolicies(order, stages)
        if best is None or cand.static_cycle_s() < best.static_cycle_s():
            best = cand
    assert best is not None
    return best


_CYCLE = "cycle"


def _step(phases: Sequence[PhaseCost], delta_s: float,
          start: dict[str, float]) -> tuple[dict[str, float], dict[str, int]]:
    """One step of the dynamic programme: cost to end in each state, from ``start``."""
    cost = dict(start)
    switches = dict.fromkeys(cost, 0)
    for ph in phases:
        kind = ph.label.value
        exposed = max(0.0, delta_s - ph.idle_s)
        base = ph.idle_s + ph.compute_s
        nxt: dict[str, float] = {s: math.inf for s in cost}
        nsw: dict[str, int] = dict.fromkeys(cost, 0)
        for s, c in cost.items():
            if math.isinf(c):
                continue
            options = []
            if s == _CYCLE:
                options.append((_CYCLE, c + base + ph.cycle_s, 0))
            elif s == kind:
                options.append((kind, c + base + ph.direct_s, 0))
            if s != kind:
                options.append((kind, c + base + exposed + ph.direct_s, 1))
            if s != _CYCLE:
                options.append((_CYCLE, c + base + exposed + ph.cycle_s, 1))
            for target, t, sw in options:
                if t < nxt[target]:
                    nxt[target] = t
                    nsw[target] = switches[s] + sw
        cost, switches = nxt, nsw
    return cost, switches


def hybrid_cycle_s(stages: Sequence[Sequence[PhaseCost]], delta_s: float) -> tuple[float, int]:
    """Steady-state iteration (s) of ``hybrid_cycle`` at δ = ``delta_s``, for the slower stage,
    and that stage's switches per iteration."""
    worst = (0.0, 0)
    for phases in stages:
        cost = {_CYCLE: 0.0, PhaseLabel.PP.value: 0.0, PhaseLabel.DP.value: 0.0}
        prev = 0.0
        for _ in range(_STEADY_COPIES - 1):
            cost, _ = _step(phases, delta_s, cost)
            prev = min(cost.values())
        cost, sw = _step(phases, delta_s, cost)  # switch counts restart at each step
        end = min(cost, key=lambda s: cost[s])
        worst = max(worst, (cost[end] - prev, sw[end]))
    return worst
