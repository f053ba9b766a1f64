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
* ``split_rails`` - no reconfiguration and no relay: ``r`` of the 4 rails hold the PP pairs,
  the other ``4 - r`` the DP rings, for the whole job (``r`` = 1, 2 or 3, the fastest kept). A
  GPU whose own rail carries the other kind sends through a GPU of its node on a rail of the
  right kind over NVLink (NCCL's PXN, "PCI x NVLink", since NCCL 2.12), so each kind has
  ``r / 4`` of the node's NIC bandwidth (its direct-circuit time x ``4 / r``) plus one NVLink
  copy of the bytes a GPU sends (contention with TP's NVLink traffic not modelled).
* ``hybrid`` - provisioning with reconfigure-or-not over four circuit sets: the cycle, the split
  rails, the PP pairs on every rail (direct, both ways) and the DP rings on every rail. Before
  each phase it stays (when the present set connects the phase's groups) or switches to any
  other set (δ hidden in the phase's idle gap, the rest exposed); the cheapest sequence of
  choices is found exactly (dynamic programming over the four states, in steady state; the
  best split ``r`` kept). It is never slower than the static policies, nor than switching to
  direct circuits before every phase (provisioning).

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

__all__ = ["CycleOrder", "PhaseCost", "StagePolicies", "hybrid_s", "split_rails_s",
           "stage_policies"]

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
    sent_bytes: float = 0.0
    """Bytes one GPU sends over the rails in this phase (for the NVLink copy of split_rails)."""


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
        "pp_sent": pp_bytes,
        "dp_sent": steps * shard,
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
                      ph.calls * c["pp_cycle" if ph.label is PhaseLabel.PP else "dp_cycle"],
                      ph.calls * c["pp_sent" if ph.label is PhaseLabel.PP else "dp_sent"])
            for ph in st) for st in exp.stages)
        cand = StagePolicies(order, stages)
        if best is None or cand.static_cycle_s() < best.static_cycle_s():
            best = cand
    assert best is not None
    return best


RAILS = 4
"""Rails of a Perlmutter node (one NIC per GPU)."""

_CYCLE = "cycle"
_SPLIT = "split"


def _split_s(ph: PhaseCost, pp_rails: int, nvlink: LinkModel) -> float:
    """Communication of ``ph`` on split rails (``pp_rails`` of ``RAILS`` hold the PP pairs)."""
    rails = pp_rails if ph.label is PhaseLabel.PP else RAILS - pp_rails
    return ph.direct_s * RAILS / rails + ph.sent_bytes * nvlink.beta_s_per_byte


def _on(state: str, ph: PhaseCost, pp_rails: int, nvlink: LinkModel) -> float:
    """Communication of ``ph`` on the circuit set ``state`` (inf when it does not connect)."""
    if state == _CYCLE:
        return ph.cycle_s
    if state == _SPLIT:
        return _split_s(ph, pp_rails, nvlink)
    return ph.direct_s if state == ph.label.value else math.inf


def _step(phases: Sequence[PhaseCost], delta_s: float, start: dict[str, float],
          pp_rails: int, nvlink: LinkModel) -> tuple[dict[str, float], dict[str, int]]:
    """One step of the dynamic programme: the cheapest cost to end in each circuit set, from
    ``start``; and each end's switches during this step."""
    cost = dict(start)
    switches = dict.fromkeys(cost, 0)
    for ph in phases:
        exposed = max(0.0, delta_s - ph.idle_s)
        base = ph.idle_s + ph.compute_s
        nxt: dict[str, float] = dict.fromkeys(cost, math.inf)
        nsw: dict[str, int] = dict.fromkeys(cost, 0)
        for s, c in cost.items():
            if math.isinf(c):
                continue
            for target in cost:
                moved = target != s
                t = c + base + (exposed if moved else 0.0) + _on(target, ph, pp_rails, nvlink)
                if t < nxt[target]:
                    nxt[target] = t
                    nsw[target] = switches[s] + moved
        cost, switches = nxt, nsw
    return cost, switches


def hybrid_s(stages: Sequence[Sequence[PhaseCost]], delta_s: float,
             nvlink: LinkModel) -> tuple[float, int]:
    """Steady-state iteration (s) of ``hybrid`` at δ = ``delta_s`` for the slower stage, at the
    best split of the rails, and that stage's switches per iteration."""
    best = (math.inf, 0)
    for pp_rails in range(1, RAILS):
        worst = (0.0, 0)
        for phases in stages:
            cost = dict.fromkeys((_CYCLE, _SPLIT, PhaseLabel.PP.value, PhaseLabel.DP.value), 0.0)
            prev = 0.0
            for _ in range(_STEADY_COPIES - 1):
                cost, _ = _step(phases, delta_s, cost, pp_rails, nvlink)
                prev = min(cost.values())
            cost, sw = _step(phases, delta_s, cost, pp_rails, nvlink)  # counts restart per step
            end = min(cost, key=lambda s: cost[s])
            worst = max(worst, (cost[end] - prev, sw[end]))
        best = min(best, worst)
    return best


def split_rails_s(stages: Sequence[Sequence[PhaseCost]],
                  nvlink: LinkModel) -> tuple[float, int]:
    """Iteration (s) of ``split_rails`` (module docstring) for the slower stage, at the best
    number of PP rails, and that number."""
    best = (math.inf, 0)
    for pp_rails in range(1, RAILS):
        t = max(sum(p.idle_s + p.compute_s + _split_s(p, pp_rails, nvlink) for p in st)
                for st in stages)
        best = min(best, (t, pp_rails))
    return best
