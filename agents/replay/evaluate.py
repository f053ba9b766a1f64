
"""``lightrail evaluate``: iteration time of a workload under five rail policies, analytically.

No controller, no etcd: every rank's sequence of collectives (``lightrail.agents.replay.trace``) is
walked with
the cost model (``lightrail.controller.core.costmodel``) on the circuits the planner
(``lightrail.controller.core.planner``)
would put on the rails, for each reconfiguration delay δ. Policies:

* ``ideal_eps`` - an ideal electrical packet-switched rail: no δ, full bandwidth any-to-any
  (each collective takes its best algorithm, e.g. halving/doubling).
* ``static`` - no reconfiguration: one fixed circuit set for the whole job, the plan of its most
  frequent multi-host collective; every other collective is forwarded over it (dilation,
  congestion). "n/a" when some collective cannot reach its peers over it.
* ``on_demand`` - every phase whose plan differs from what is on the rail switches when it
  starts and pays δ in full.
* ``provisioning`` - the switch to a phase's circuits starts at the previous phase's release, so
  δ hides in the compute gap: exposed = max(0, δ - gap) (Opus). The sub-phases of an
  all-to-all follow each other without a gap and pay δ in full.
* ``provisioning_ron`` - provisioning plus reconfigure-or-not (PCCL,
``lightrail.controller.core.decision``):
  per phase, switch only when exposed δ + time on the new circuits beats the time on the
  circuits already there.

Model (say it in the output, too):

* Ranks are placed as the replay places them (``lightrail.agents.replay.place_ranks``) on
  ``demo-4x2`` (<= 8 ranks), ``rail-16x8`` (<= 128), or a rail fabric the job's size
  (``lightrail.controller.domain.fabric.rail_shape_for``: 8 GPUs per host when 8 divides the
  world size; ``--fabric rail:HOSTSxGPUS`` names another). A collective over several hosts
  runs as scale-up stages (NVLink, ``scale_up`` link) plus one stage per rail in parallel
  (``lightrail.controller.core.costmodel.hierarchical_stages``); a group inside one host costs
  scale-up time
  only. Unknown process groups cost nothing (they are counted).
* The rails carry the union of the plans of every concurrent group at the same position of
  the ranks' sequences (when all ranks' sequences line up, as in generated schedules); a
  plan replaces the cross-connects on the ports it uses and leaves the others.
* One representative rank (the lowest) is evaluated per distinct sequence of (collective,
  group size, bytes, compute gap): all ranks of a generated schedule run the same sequence.
  A generated schedule (``Workload.schedule``: AICB, SimAI) is read by class of ranks, never
  rank by rank: its blocks of ranks that run alike are merged by that signature, and the
  groups sharing the rails at each position come from the schedule.
  The job's iteration time is the slowest representative's; waiting for peers is not modelled
  separately (Kineto gaps already contain it).
* Steady state: one warm-up iteration sets the circuits, the second is measured; the first
  phase's compute gap includes the previous iteration's tail.
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import json
import math
import resource
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from lightrail.agents.replay.rank_view import rank_view
from lightrail.agents.replay.replayer import (
    FabricTooSmall,
    HostSlot,
    ReplayError,
    ReplayOp,
    place_ranks,
)
from lightrail.agents.replay.trace.loader import load_workload
from lightrail.agents.replay.trace.model import TraceError, Workload
from lightrail.controller.core.costmodel import (
    POWER_COST_CONSTANTS,
    Circuit,
    CostModelError,
    Flow,
    LinkModel,
    PowerCostConfig,
    RailFabricEstimate,
    Stage,
    Tier,
    Topology,
    UnreachableError,
    changed_constants,
    describe_constants,
    estimate_collective,
    estimate_rail_fabric,
    hierarchical_stages,
    reconfiguration_delay_s,
    round_cost,
)
from lightrail.controller.core.decision import decide
from lightrail.controller.core.planner import (
    JobLayout,
    PlanError,
    all_to_all_steps,
    layout_job,
    plan_phase,
)
from lightrail.controller.domain.fabric import (
    BUILTIN_FABRICS,
    Fabric,
    FabricError,
    RailShape,
    rail_shape,
    rail_shape_for,
)
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup
from lightrail.drivers.base import CrossConnect, SwitchCapabilities, SwitchKind

DEFAULT_DELAYS_MS: tuple[float, ...] = (0.004, 0.1, 1.0, 10.0, 25.0, 100.0)
"""Reconfiguration delays δ evaluated by default, in ms (silicon photonics ... robotic OCS)."""
DEFAULT_SCALE_UP_GBPS = 300.0 * 8
"""Scale-up (NVLink) bandwidth per GPU in Gb/s: 300 GB/s (A100-class NVLink, one direction)."""
DEFAULT_SCALE_UP_ALPHA_S = 1e-6
"""Scale-up per-hop latency in s (1 µs; an assumption)."""

DEFAULT_LINK = LinkModel()
"""A rail link: α = 5 µs, 100 Gb/s."""
DEFAULT_SCALE_UP = LinkModel.from_gbps(DEFAULT_SCALE_UP_GBPS, DEFAULT_SCALE_UP_ALPHA_S)
"""NVLink: α = 1 µs, 300 GB/s."""
DEFAULT_POWER = PowerCostConfig()

_EMPTY: frozenset[CrossConnect] = frozenset()


class EvaluationError(ValueError):
    """The evaluation cannot run on this input; the message says which argument and why."""


class Policy(enum.Enum):
    """How the rails are run (see the module docstring)."""

    IDEAL_EPS = "ideal_eps"
    STATIC = "static"
    ON_DEMAND = "on_demand"
    PROVISIONING = "provisioning"
    PROVISIONING_RON = "provisioning_ron"

    @property
    def label(self) -> str:
        """A short human label for tables and plots."""
        return _LABELS[self]


_LABELS = {
    Policy.IDEAL_EPS: "ideal EPS (no δ)",
    Policy.STATIC: "static circuits",
    Policy.ON_DEMAND: "on-demand",
    Policy.PROVISIONING: "provisioning",
    Policy.PROVISIONING_RON: "provisioning + RON",
}


@dataclass(frozen=True, slots=True)
class EvaluationConfig:
    """What to evaluate. ``delays_ms``: δ values in ms (finite, >= 0, at least one);
    ``link``: α-β of a rail link; ``scale_up``: α-β of NVLink; ``fabric``: a built-in fabric
    name or ``rail:HOSTSxGPUS`` (``lightrail.controller.domain.fabric.rail_shape``), None to
    size one from the world size (``rail_shape_for``); ``max_ops``: evaluate only the first N
    collectives of each rank; ``power``: constants of the power and cost estimate."""

    delays_ms: tuple[float, ...] = DEFAULT_DELAYS_MS
    link: LinkModel = DEFAULT_LINK
    scale_up: LinkModel = DEFAULT_SCALE_UP
    fabric: str | None = None
    max_ops: int | None = None
    power: PowerCostConfig = DEFAULT_POWER

    def __post_init__(self) -> None:
        if not self.delays_ms:
            raise EvaluationError("delays_ms: give at least one delay")
        for d in self.delays_ms:
            if not math.isfinite(d) or d < 0:
                raise EvaluationError(f"delays_ms: {d} is not a finite delay >= 0 ms")
        if self.fabric is not None:
            fabric_shape(self.fabric)
        if self.max_ops is not None and self.max_ops < 1:
            raise EvaluationError(f"max_ops: must be >= 1, got {self.max_ops}")


def fabric_shape(fabric: str) -> RailShape:
    """The rail fabric ``fabric`` names (a built-in name or ``rail:HOSTSxGPUS``). Raises
    ``EvaluationError`` naming the field and the value."""
    try:
        return rail_shape(fabric)
    except FabricError as exc:
        if fabric.startswith(("rail:", "rail-")):
            raise EvaluationError(f"fabric: {exc}") from None
        raise EvaluationError(
            f"fabric: unknown built-in fabric {fabric!r} (known: "
            f"{', '.join(sorted(BUILTIN_FABRICS))}; or rail:HOSTSxGPUS, e.g. rail:1152x8)"
        ) from None


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """One policy at one δ. ``iteration_s``: the job's iteration time in s, None when the
    policy cannot run the workload (static circuits that do not connect some group);
    ``overhead_pct``: versus ``ideal_eps`` in percent; per measured iteration of the slowest
    representative: ``reconfigurations`` (switches that changed circuits), ``exposed_delay_s``
    (δ on the critical path), ``stays`` (reconfigure-or-not decisions to keep the circuits)."""

    policy: Policy
    delay_ms: float
    iteration_s: float | None
    overhead_pct: float | None
    reconfigurations: int
    exposed_delay_s: float
    stays: int


@dataclass(frozen=True, slots=True)
class Representative:
    """A rank evaluated for ``ranks`` ranks that run the same sequence; ``ops`` collectives,
    ``compute_s`` seconds of compute (gaps + tail) per iteration."""

    rank: int
    ranks: int
    ops: int
    compute_s: float


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The outcome of :func:`evaluate`. ``results`` holds one row per policy and δ (ideal and
    static repeated for every δ, for plotting)."""

    workload: str
    source_format: str
    world_size: int
    fabric: str
    hosts: int
    rails: int
    representatives: tuple[Representative, ...]
    results: tuple[PolicyResult, ...]
    notes: tuple[str, ...]
    power: RailFabricEstimate
    link: LinkModel
    scale_up: LinkModel
    delays_ms: tuple[float, ...]
    static_plan: str | None
    elapsed_s: float = 0.0
    load_s: float | None = None
    """Seconds to read the workload (``evaluate_main``; None when not measured)."""
    peak_rss_mib: float | None = None
    """Peak resident memory of the process when the evaluation ended, MiB (``getrusage``
    ``ru_maxrss``; ``evaluate_main``; None when not measured)."""

    def result(self, policy: Policy, delay_ms: float) -> PolicyResult:
        """The row for ``policy`` at ``delay_ms``; ``KeyError`` if it was not evaluated."""
        for r in self.results:
            if r.policy is policy and r.delay_ms == delay_ms:
                return r
        raise KeyError(f"{policy.value} at {delay_ms} ms")


# --- the simulator -------------------------------------------------------------------------


class _Kind(enum.Enum):
    UNKNOWN = "unknown"
    SCALE_UP = "scale_up"
    RAIL = "rail"
    CROSS_RAIL = "cross_rail"


@dataclass(frozen=True, slots=True)
class _RailPart:
    switch_id: str
    nodes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Phase:
    """One collective of a representative, precomputed."""

    index: int
    kind: _Kind
    collective: Collective
    gap_s: float
    scale_up_s: float
    rail_stage: Stage | None
    rails: tuple[_RailPart, ...]
    plans: tuple[Mapping[str, frozenset[CrossConnect]], ...]
    ideal_rail_s: float
    static_key: tuple[Collective, frozenset[ProcessGroup]] | None

    @property
    def switches(self) -> tuple[str, ...]:
        return tuple(r.switch_id for r in self.rails)


@dataclass(slots=True)
class _Tally:
    time_s: float = 0.0
    reconfigurations: int = 0
    exposed_s: float = 0.0
    stays: int = 0


State = dict[str, frozenset[CrossConnect]]
Caps = Mapping[str, SwitchCapabilities]


@dataclass(slots=True)
class _Simulator:
    """Walks representative sequences under each policy; caches topology and time lookups."""

    fabric: Fabric
    layout: JobLayout
    link: LinkModel
    scale_up: LinkModel
    host_index: Mapping[str, int]
    _tx: dict[str, dict[int, int]] = field(default_factory=dict)
    _rx: dict[str, dict[int, int]] = field(default_factory=dict)
    _topo: dict[tuple[str, frozenset[CrossConnect]], Topology] = field(default_factory=dict)
    _time: dict[tuple[object, ...], float] = field(default_factory=dict)
    _applied: dict[tuple[str, frozenset[CrossConnect], frozenset[CrossConnect]],
                   frozenset[CrossConnect]] = field(default_factory=dict)
    _plans: dict[tuple[ProcessGroup, Collective, int], Mapping[str, frozenset[CrossConnect]]] = (
        field(default_factory=dict))
    _merged: dict[tuple[Collective, frozenset[ProcessGroup]],
                  tuple[Mapping[str, frozenset[CrossConnect]], ...]] = field(default_factory=dict)
    """``_step_plans`` by (collective, concurrent groups): a generated schedule runs the same
    groups at most positions, and merging hundreds of group plans is the costly part."""

    def __post_init__(self) -> None:
        for ep in self.fabric.endpoints.values():
            h = self.host_index[ep.endpoint_id.host]
            self._tx.setdefault(ep.switch_id, {})[ep.tx_port] = h
            self._rx.setdefault(ep.switch_id, {})[ep.rx_port] = h

    # circuits ----------------------------------------------------------------------------

    def topology(self, switch_id: str, xcs: frozenset[CrossConnect]) -> Topology:
        key = (switch_id, xcs)
        topo = self._topo.get(key)
        if topo is None:
            duplex = self.fabric.switches[switch_id].capabilities.kind is SwitchKind.DUPLEX
            tx, rx = self._tx.get(switch_id, {}), self._rx.get(switch_id, {})
            circuits: set[Circuit] = set()
            for x in xcs:
                if duplex:
                    a, b = tx.get(x.ingress), tx.get(x.egress)
                    if a is not None and b is not None and a != b:
                        circuits.update((Circuit(a, b), Circuit(b, a)))
                else:
                    a, b = tx.get(x.ingress), rx.get(x.egress)
                    if a is not None and b is not None and a != b:
                        circuits.add(Circuit(a, b))
            topo = Topology.of_circuits(circuits)
            self._topo[key] = topo
        return topo

    def group_plan(
        self, group: ProcessGroup, coll: Collective, step: int
    ) -> Mapping[str, frozenset[CrossConnect]]:
        key = (group, coll, step)
        plan = self._plans.get(key)
        if plan is None:
            p = plan_phase(self.layout, PhaseKey(group, coll, 0, step))
            plan = {t.switch_id: t.cross_connects for t in p.targets}
            self._plans[key] = plan
        return plan

    @staticmethod
    def changing(state: State, plan: Mapping[str, frozenset[CrossConnect]]) -> list[str]:
        return [sid for sid, xcs in plan.items() if not xcs <= state.get(sid, _EMPTY)]

    def apply(self, state: State, plan: Mapping[str, frozenset[CrossConnect]],
              switches: Sequence[str]) -> None:
        for sid in switches:
            old, new = state.get(sid, _EMPTY), plan[sid]
            key = (sid, old, new)
            out = self._applied.get(key)
            if out is None:
                ports = {p for x in new for p in x.ports()}
                keep = {x for x in old if x.ingress not in ports and x.egress not in ports}
                out = frozenset(keep | new)
                self._applied[key] = out
            state[sid] = out

    # times --------------------------------------------------------------------------------

    def rail_time(self, phase: _Phase, state: State) -> float:
        """The rail stage of ``phase`` on the circuits in ``state`` (s; inf if unreachable)."""
        stage = phase.rail_stage
        if stage is None or phase.kind is not _Kind.RAIL:
            return phase.ideal_rail_s
        snap = tuple(state.get(s, _EMPTY) for s in phase.switches)
        key: tuple[object, ...] = ("rail", stage.collective, stage.nbytes, phase.rails, snap)
        t = self._time.get(key)
        if t is None:
            t = 0.0
            for part, xcs in zip(phase.rails, snap, strict=True):
                nodes = part.nodes[:2] if stage.collective is Collective.SEND_RECV else part.nodes
                try:
                    est = estimate_collective(self.topology(part.switch_id, xcs),
                                              stage.collective, nodes, stage.nbytes, self.link)
                except UnreachableError:
                    t = math.inf
                    break
                t = max(t, est.time_s)
            self._time[key] = t
        return t

    def a2a_step_time(self, phase: _Phase, step: int, state: State) -> float:
        """Sub-phase ``step`` of an all-to-all (shift step+1) on the circuits in ``state``."""
        stage = phase.rail_stage
        assert stage is not None
        snap = tuple(state.get(s, _EMPTY) for s in phase.switches)
        key: tuple[object, ...] = ("a2a", stage.nbytes, phase.rails, step, snap)
        t = self._time.get(key)
        if t is None:
            t = 0.0
            shift = step + 1
            for part, xcs in zip(phase.rails, snap, strict=True):
                k = len(part.nodes)
                if shift >= k:
                    continue
                flows = [Flow(part.nodes[i], part.nodes[(i + shift) % k], stage.nbytes / k)
                         for i in range(k)]
                try:
                    t = max(t, round_cost(self.topology(part.switch_id, xcs), flows,
                                          self.link).time_s)
                except UnreachableError:
                    t = math.inf
                    break
            self._time[key] = t
        return t

    # policies -----------------------------------------------------------------------------

    def run(self, phases: Sequence[_Phase], tail_s: float, policy: Policy, caps: Caps,
            static: State) -> _Tally:
        """Two iterations (warm-up, measured) of ``phases``; the measured one's tally.
        ``caps``: every switch's capabilities (``settle_time_s`` is its δ)."""
        state: State = dict(static) if policy is Policy.STATIC else {}
        tally = _Tally()
        for _ in range(2):
            tally = _Tally()
            for i, ph in enumerate(phases):
                hide_s = ph.gap_s + (tail_s if i == 0 else 0.0)
                tally.time_s += ph.gap_s + ph.scale_up_s
                tally.time_s += self._phase(ph, hide_s, policy, caps, state, tally)
            tally.time_s += tail_s
        return tally

    @staticmethod
    def _delta(caps: Caps, switches: Sequence[str]) -> float:
        return reconfiguration_delay_s(caps[s] for s in switches)

    def _phase(self, ph: _Phase, hide_s: float, policy: Policy, caps: Caps, state: State,
               tally: _Tally) -> float:
        """Network time of one phase after its compute gap (δ exposed included)."""
        if policy is Policy.IDEAL_EPS or ph.kind is not _Kind.RAIL:
            return ph.ideal_rail_s
        if policy is Policy.STATIC or not ph.plans:
            return self.rail_time(ph, state)
        is_a2a = ph.collective is Collective.ALL_TO_ALL
        if policy is Policy.PROVISIONING_RON:
            return self._ron(ph, hide_s, caps, state, tally, is_a2a)
        t = 0.0
        for step, plan in enumerate(ph.plans):
            sw = self.changing(state, plan)
            if sw:
                d = self._delta(caps, sw)
                exposed = d if policy is Policy.ON_DEMAND or step > 0 else max(0.0, d - hide_s)
                t += exposed
                tally.exposed_s += exposed
                tally.reconfigurations += 1
                self.apply(state, plan, sw)
            t += self.a2a_step_time(ph, step, state) if is_a2a else self.rail_time(ph, state)
        return t

    def _ron(self, ph: _Phase, hide_s: float, caps: Caps, state: State,
             tally: _Tally, is_a2a: bool) -> float:
        """Reconfigure-or-not for one phase. The new-circuit option is the phase's plan (all
        matchings, for an all-to-all); an all-to-all may also switch to its first matching
        only and forward the other shifts over it, whichever costs less (PCCL: matchings or
        forwarding). The decision itself is ``lightrail.controller.core.decision.decide``."""
        t_current = self.rail_time(ph, state)
        options: list[_Option] = [self._matchings_option(ph, state, caps, is_a2a)]
        if is_a2a and len(ph.plans) > 1:
            trial: State = dict(state)
            sw = self.changing(trial, ph.plans[0])
            if sw:
                self.apply(trial, ph.plans[0], sw)
                options.append(_Option(trial, self._delta(caps, sw), 0.0,
                                       self.rail_time(ph, trial), 1))
        best = min(options, key=lambda o: max(0.0, o.first_delta_s - hide_s) + o.rest_s)
        if best.switches == 0:
            return min(t_current, best.rest_s)
        dec = decide(t_current, best.rest_s, best.first_delta_s, hide_s)
        if dec.switch:
            state.clear()
            state.update(best.state)
            tally.reconfigurations += best.switches
            tally.exposed_s += dec.delta_exposed_s + best.later_delta_s
        else:
            tally.stays += 1
        return dec.phase_time_s

    def _matchings_option(self, ph: _Phase, state: State, caps: Caps, is_a2a: bool) -> _Option:
        trial: State = dict(state)
        first = later = transfer = 0.0
        switches = 0
        for step, plan in enumerate(ph.plans):
            sw = self.changing(trial, plan)
            if sw:
                d = self._delta(caps, sw)
                if step == 0:
                    first = d
                else:
                    later += d
                switches += 1
                self.apply(trial, plan, sw)
            transfer += self.a2a_step_time(ph, step, trial) if is_a2a else self.rail_time(ph, trial)
        return _Option(trial, first, later, transfer + later, switches)


@dataclass(frozen=True, slots=True)
class _Option:
    """A way to run a phase on new circuits: the circuits it leaves (``state``), the δ of its
    first switch (may hide in the gap), the δ of later switches (exposed), the time after the
    first switch (``rest_s``: transfers plus later δ) and how many switches it makes."""

    state: State
    first_delta_s: float
    later_delta_s: float
    rest_s: float
    switches: int


# --- building the phases -------------------------------------------------------------------


def _comm_bytes(op: ReplayOp) -> float:
    """S in the cost model's meaning: all-gather's full output, otherwise the CommOp bytes."""
    if op.collective is Collective.ALL_GATHER and op.group is not None:
        return float(op.nbytes) * op.group.size
    return float(op.nbytes)


def _host_slots(fabric: Fabric) -> list[HostSlot]:
    return [HostSlot(h.name, tuple(g for g in range(h.gpu_count) if fabric.has_gpu(h.name, g)))
            for h in fabric.hosts.values() if not h.spare]


def _ideal_rail_s(stage: Stage, rails: Sequence[_RailPart], link: LinkModel) -> float:
    t = 0.0
    eps = Topology.packet_switched()
    for part in rails:
        nodes = part.nodes[:2] if stage.collective is Collective.SEND_RECV else part.nodes
        t = max(t, estimate_collective(eps, stage.collective, nodes, stage.nbytes, link).time_s)
    if not rails:  # no rail connects the hosts: price one rail at EPS speed
        nodes = tuple(range(stage.participants))
        t = estimate_collective(eps, stage.collective, nodes, stage.nbytes, link).time_s
    return t


def _scale_up_s(sim: _Simulator, stages: Sequence[Stage]) -> float:
    """Seconds of the scale-up (NVLink) stages of one collective, priced at ``sim.scale_up``.
    Raises ``CostModelError``."""
    t = 0.0
    for st in stages:
        if st.tier is Tier.SCALE_UP:
            nodes = tuple(range(st.participants))
            t += estimate_collective(Topology.packet_switched(), st.collective, nodes,
                                     st.nbytes, sim.scale_up).time_s
    return t


def _rail_stage(stages: Sequence[Stage]) -> Stage | None:
    """The (last) stage of ``stages`` that crosses the rails; None when all stay in a host."""
    rail: Stage | None = None
    for st in stages:
        if st.tier is not Tier.SCALE_UP:
            rail = st
    return rail


def _rail_parts(sim: _Simulator, group: ProcessGroup) -> tuple[_RailPart, ...]:
    """The rails ``group`` spans, by switch id: each switch with the host indices (in rank
    order, each host once) of the group's ranks wired to it; switches that reach a single host
    carry no traffic of the group and are left out."""
    by_switch: dict[str, list[int]] = {}
    seen: set[tuple[str, str]] = set()
    for r in group.ranks:
        ep = sim.layout.endpoints[r]
        key = (ep.switch_id, ep.endpoint_id.host)
        if key not in seen:
            seen.add(key)
            by_switch.setdefault(ep.switch_id, []).append(sim.host_index[ep.endpoint_id.host])
    return tuple(_RailPart(s, tuple(n)) for s, n in sorted(by_switch.items()) if len(n) > 1)


def _step_plans(
    sim: _Simulator, collective: Collective, concurrent: frozenset[ProcessGroup]
) -> tuple[Mapping[str, frozenset[CrossConnect]], ...]:
    """The circuits of each step of ``collective`` run by the ``concurrent`` groups at once:
    per step, every group's plan merged by switch. An all-to-all has as many steps as its
    largest group needs (a group with fewer steps drops out); any other collective has one.
    Raises ``PlanError``."""
    cached = sim._merged.get((collective, concurrent))
    if cached is not None:
        return cached
    layout = sim.layout
    steps = max(all_to_all_steps(layout, g) for g in concurrent) \
        if collective is Collective.ALL_TO_ALL else 1
    plans: list[Mapping[str, frozenset[CrossConnect]]] = []
    for step in range(steps):
        merged: dict[str, frozenset[CrossConnect]] = {}
        for g in sorted(concurrent):
            if collective is Collective.ALL_TO_ALL and step >= all_to_all_steps(layout, g):
                continue
            for sid, xcs in sim.group_plan(g, collective, step).items():
                merged[sid] = merged.get(sid, _EMPTY) | xcs
        plans.append(merged)
    sim._merged[(collective, concurrent)] = tuple(plans)
    return tuple(plans)


def _phase_of(
    sim: _Simulator,
    index: int,
    op: ReplayOp,
    groups_at: Sequence[frozenset[ProcessGroup]] | None,
) -> _Phase:
    """The precomputed ``_Phase`` of ``op``, the ``index``-th collective of a representative:
    UNKNOWN without a group, SCALE_UP when it stays inside hosts, CROSS_RAIL when no rail
    connects its hosts, else RAIL with the circuits of each step (merged with the groups
    ``groups_at[index]`` runs at the same time, when known). Raises ``PlanError``,
    ``CostModelError``."""
    group = op.group
    if group is None:
        return _Phase(index, _Kind.UNKNOWN, op.collective, op.gap_s, 0.0, None, (), (), 0.0, None)
    host_of = [sim.layout.endpoints[r].endpoint_id.host for r in group.ranks]
    hosts = list(dict.fromkeys(host_of))
    per_host = max(host_of.count(h) for h in hosts)
    stages = hierarchical_stages(op.collective, _comm_bytes(op), len(hosts), per_host)
    scale_up_s = _scale_up_s(sim, stages)
    rail_stage = _rail_stage(stages)
    if rail_stage is None:
        return _Phase(index, _Kind.SCALE_UP, op.collective, op.gap_s, scale_up_s, None, (), (),
                      0.0, None)
    rails = _rail_parts(sim, group)
    ideal = _ideal_rail_s(rail_stage, rails, sim.link)
    if not rails:
        return _Phase(index, _Kind.CROSS_RAIL, op.collective, op.gap_s, scale_up_s, rail_stage,
                      (), (), ideal, None)
    concurrent = groups_at[index] if groups_at is not None else frozenset({group})
    plans = _step_plans(sim, op.collective, concurrent)
    return _Phase(index, _Kind.RAIL, op.collective, op.gap_s, scale_up_s, rail_stage, rails,
                  plans, ideal, (op.collective, concurrent))


def _build_phases(
    sim: _Simulator,
    ops: Sequence[ReplayOp],
    groups_at: Sequence[frozenset[ProcessGroup]] | None,
) -> list[_Phase]:
    """The phases of one representative's ``ops``, in order (``_phase_of``)."""
    return [_phase_of(sim, i, op, groups_at) for i, op in enumerate(ops)]


def _lay_out(workload: Workload, fabric: Fabric) -> JobLayout:
    """Place ``workload``'s ranks on ``fabric``'s non-spare hosts and lay the job out. Raises
    ``EvaluationError`` when the job does not fit (saying which fabric would, and how to ask
    for it)."""
    try:
        placements = place_ranks(workload.world_size, _host_slots(fabric))
        return layout_job(fabric, "evaluate", placements)
    except FabricTooSmall as exc:
        raise EvaluationError(f"{workload.name}: {exc} ({fabric.name}); "
                              f"{fitting_fabric_hint(workload.world_size)}") from exc
    except (ReplayError, ValueError) as exc:
        raise EvaluationError(f"{workload.name}: {exc}") from exc


def fitting_fabric_hint(world_size: int) -> str:
    """How to ask for a rail fabric that holds ``world_size`` ranks
    (``rail_shape_for``): ``a fabric that fits: --fabric rail:HOSTSxGPUS (...)``."""
    try:
        fit = rail_shape_for(world_size)
    except FabricError as exc:
        return f"no rail fabric fits: {exc}"
    return (f"a fabric that fits: --fabric {fit.option} ({fit.hosts} hosts x "
            f"{fit.gpus_per_host} GPUs = {fit.gpus})")


@dataclass(frozen=True, slots=True)
class _StaticCircuits:
    """The fixed circuit set of ``Policy.STATIC``: ``state``, cross-connects by switch id
    (empty when no collective crosses the rails); ``label``, what they were planned for (None
    when empty)."""

    state: State
    label: str | None


def _static_circuits(sim: _Simulator, phases: Sequence[_Phase]) -> _StaticCircuits:
    """Static circuits: the first-step plan of the most frequent multi-host collective (and
    groups) of ``phases``, one representative's view; ties go to the first met."""
    counts: dict[tuple[Collective, frozenset[ProcessGroup]], int] = {}
    first_plan: dict[tuple[Collective, frozenset[ProcessGroup]],
                     Mapping[str, frozenset[CrossConnect]]] = {}
    for ph in phases:
        if ph.static_key is not None and ph.plans:
            counts[ph.static_key] = counts.get(ph.static_key, 0) + 1
            first_plan.setdefault(ph.static_key, ph.plans[0])
    static: State = {}
    if not counts:
        return _StaticCircuits(static, None)
    best = max(counts, key=lambda k: counts[k])  # first inserted wins ties
    sim.apply(static, first_plan[best], list(first_plan[best]))
    sizes = sorted({g.size for g in best[1]})
    return _StaticCircuits(static, f"{best[0].value} over {len(best[1])} group(s) of "
                                   f"{'/'.join(map(str, sizes))} ranks ({counts[best]} of "
                                   f"{len(phases)} collectives per iteration)")


def _census_note(rank: int, phases: Sequence[_Phase]) -> str:
    """The note that counts ``rank``'s collectives by kind (rails, scale-up, unknown group,
    cross-rail)."""
    unknown = sum(1 for ph in phases if ph.kind is _Kind.UNKNOWN)
    scale_up = sum(1 for ph in phases if ph.kind is _Kind.SCALE_UP)
    cross = sum(1 for ph in phases if ph.kind is _Kind.CROSS_RAIL)
    on_rails = sum(1 for ph in phases if ph.kind is _Kind.RAIL)
    cross_note = f", {cross} over hosts no rail connects (priced at EPS speed)" if cross else ""
    return (f"rank {rank}: {on_rails} collectives on the rails, {scale_up} inside one "
            f"host (scale-up only), {unknown} without a known group (not costed)" + cross_note)


def _slowest(
    sim: _Simulator,
    phases: Mapping[int, Sequence[_Phase]],
    tail_gap_s: Mapping[int, float],
    policy: Policy,
    caps: Caps,
    static: State,
) -> _Tally:
    """The tally of the slowest representative of ``phases`` under ``policy`` (the job's
    iteration waits for it); the first met wins ties."""
    return max((sim.run(ph, tail_gap_s.get(r, 0.0), policy, caps, static)
                for r, ph in phases.items()), key=lambda x: x.time_s)


def _policy_results(
    sim: _Simulator,
    phases: Mapping[int, Sequence[_Phase]],
    tail_gap_s: Mapping[int, float],
    static: State,
    fixed: Mapping[Policy, _Tally | None],
    fabric: Fabric,
    delays_ms: Sequence[float],
    step: Callable[[], None],
) -> list[PolicyResult]:
    """One ``PolicyResult`` per δ of ``delays_ms`` and ``Policy`` (in that order): the
    policies of ``fixed`` (independent of δ; None: not applicable) take their tally from it, the
    others run on ``fabric``'s switches with that δ. Overheads in % of the ideal-EPS time.
    ``step()`` is called after each policy run at one δ."""
    ideal_tally = fixed[Policy.IDEAL_EPS]
    assert ideal_tally is not None
    ideal_s = ideal_tally.time_s
    results: list[PolicyResult] = []
    for d in delays_ms:
        caps = {sid: dataclasses.replace(sw.capabilities, settle_time_s=d / 1e3)
                for sid, sw in fabric.switches.items()}
        for pol in Policy:
            if pol in fixed:
                tl = fixed[pol]
            else:
                tl = _slowest(sim, phases, tail_gap_s, pol, caps, static)
                step()
            if tl is None:
                results.append(PolicyResult(pol, d, None, None, 0, 0.0, 0))
                continue
            over = (tl.time_s - ideal_s) / ideal_s * 100 if ideal_s > 0 else 0.0
            results.append(PolicyResult(pol, d, tl.time_s, over, tl.reconfigurations,
                                        tl.exposed_s, tl.stays))
    return results


ProgressCallback = Callable[[int, int], None]
"""``on_progress(done, total)``: policy runs done of the evaluation's total."""

FIXED_POLICIES = (Policy.IDEAL_EPS, Policy.STATIC)
"""The policies whose iteration does not depend on δ (run once)."""


def evaluation_steps(config: EvaluationConfig) -> int:
    """How many policy runs :func:`evaluate` makes for ``config``: the δ-independent policies
    once, every other policy once per δ."""
    return len(FIXED_POLICIES) + (len(Policy) - len(FIXED_POLICIES)) * len(config.delays_ms)


def evaluate(workload: Workload, config: EvaluationConfig | None = None, *,
             on_progress: ProgressCallback | None = None) -> Evaluation:
    """Evaluate ``workload`` under every :class:`Policy` and δ of ``config``;
    ``on_progress(done, total)`` after each policy run (``evaluation_steps``).

    Returns an :class:`Evaluation` (times in s, overheads in % of ``ideal_eps``). Raises
    ``EvaluationError`` when the job does not fit the fabric or a phase cannot be planned.
    """
    cfg = config or EvaluationConfig()
    total = evaluation_steps(cfg)
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        if on_progress is not None:
            on_progress(done, total)

    started = time.perf_counter()
    if cfg.fabric is not None:
        shape = fabric_shape(cfg.fabric)
    else:
        try:
            shape = rail_shape_for(workload.world_size)
        except FabricError as exc:
            raise EvaluationError(f"{workload.name}: {exc}") from exc
    fabric_name = shape.name
    fabric = shape.fabric(0.0)
    layout = _lay_out(workload, fabric)
    view = rank_view(workload, cfg.max_ops)
    if not view.reps:
        raise EvaluationError(f"{workload.name}: the workload has no rank with collectives")
    notes = view.notes
    if cfg.fabric is None and shape.name not in BUILTIN_FABRICS:
        notes.append(f"fabric {shape.name} sized from the job: {shape.hosts} hosts x "
                     f"{shape.gpus_per_host} GPUs, one rail OCS of {shape.hosts} ports per GPU "
                     "index (--fabric rail:HOSTSxGPUS names another)")
    host_index = {name: i for i, name in enumerate(fabric.hosts)}
    sim = _Simulator(fabric, layout, cfg.link, cfg.scale_up, host_index)
    groups_at = view.groups_at
    if groups_at is None:
        notes.append("ranks' sequences do not line up: each representative sees only its own "
                     "groups' circuits on the rails")

    reps = list(view.reps)
    try:
        phases = {r: _build_phases(sim, view.reps[r], groups_at) for r in reps}
    except (PlanError, CostModelError) as exc:
        raise EvaluationError(f"{workload.name}: {exc}") from exc
    static = _static_circuits(sim, phases[reps[0]])
    notes.append(_census_note(reps[0], phases[reps[0]]))
    notes.append(f"{len(reps)} representative rank(s) for {view.ranks} ranks (one per distinct "
                 "sequence of collective, group size, bytes and compute gap; generated schedules "
                 "run the same sequence on every rank); the job's iteration is the slowest")

    fixed: dict[Policy, _Tally | None] = {}
    for pol in FIXED_POLICIES:
        worst = _slowest(sim, phases, workload.tail_gap_s, pol, {}, static.state)
        fixed[pol] = None if math.isinf(worst.time_s) else worst
        step()
    assert fixed[Policy.IDEAL_EPS] is not None
    if fixed[Policy.STATIC] is None:
        notes.append("static circuits: some collective cannot reach its peers over the fixed "
                     "circuit set (n/a)")
    results = _policy_results(sim, phases, workload.tail_gap_s, static.state, fixed,
                              fabric, cfg.delays_ms, step)

    rails_used = len({ep.rail for ep in layout.endpoints})
    rep_info = tuple(
        Representative(r, view.members[r], len(view.reps[r]),
                       sum(o.gap_s for o in view.reps[r]) + workload.tail_gap_s.get(r, 0.0))
        for r in reps)
    return Evaluation(
        workload=workload.name,
        source_format=workload.source_format.value,
        world_size=workload.world_size,
        fabric=fabric_name,
        hosts=len(layout.hosts),
        rails=rails_used,
        representatives=rep_info,
        results=tuple(results),
        notes=tuple(notes),
        power=estimate_rail_fabric(len(layout.hosts), rails_used, cfg.power),
        link=cfg.link,
        scale_up=cfg.scale_up,
        delays_ms=cfg.delays_ms,
        static_plan=static.label,
        elapsed_s=time.perf_counter() - started,
    )


# --- output --------------------------------------------------------------------------------


def evaluation_to_json(ev: Evaluation) -> dict[str, Any]:
    """The evaluation as JSON-ready data (times in ms, power in W, cost in USD)."""
    p = ev.power

    def bill(b: Any) -> dict[str, Any]:
        return {"switch_ports": b.switch_ports, "switch_tiers": b.switch_tiers,
                "nic_transceivers": b.nic_transceivers,
                "switch_transceivers": b.switch_transceivers, "power_w": round(b.power_w, 1),
                "cost_usd": round(b.cost_usd, 0), "power_excl_nic_w": round(b.power_excl_nic_w, 1),
                "cost_excl_nic_usd": round(b.cost_excl_nic_usd, 0)}

    def num(x: float | None, nd: int) -> float | None:
        return None if x is None or not math.isfinite(x) else round(x, nd)

    return {
        "workload": ev.workload,
        "source_format": ev.source_format,
        "world_size": ev.world_size,
        "fabric": ev.fabric,
        "hosts": ev.hosts,
        "rails": ev.rails,
        "link": {"alpha_s": ev.link.alpha_s, "beta_s_per_byte": ev.link.beta_s_per_byte,
                 "gbps": round(ev.link.bandwidth_gbps, 3)},
        "scale_up": {"alpha_s": ev.scale_up.alpha_s,
                     "beta_s_per_byte": ev.scale_up.beta_s_per_byte,
                     "gbps": round(ev.scale_up.bandwidth_gbps, 3)},
        "delays_ms": list(ev.delays_ms),
        "static_plan": ev.static_plan,
        "representatives": [{"rank": r.rank, "ranks": r.ranks, "ops": r.ops,
                             "compute_ms": round(r.compute_s * 1e3, 6)}
                            for r in ev.representatives],
        "results": [{"policy": r.policy.value, "delay_ms": r.delay_ms,
                     "iteration_ms": num(None if r.iteration_s is None else r.iteration_s * 1e3,
                                         6),
                     "overhead_pct": num(r.overhead_pct, 4),
                     "reconfigurations_per_iteration": r.reconfigurations,
                     "exposed_delay_ms": round(r.exposed_delay_s * 1e3, 6),
                     "stays_per_iteration": r.stays}
                    for r in ev.results],
        "notes": list(ev.notes),
        "power": {"hosts": p.hosts, "rails": p.rails, "electrical": bill(p.electrical),
                  "photonic": bill(p.photonic), "power_ratio": num(p.power_ratio, 3),
                  "cost_ratio": num(p.cost_ratio, 3),
                  "power_ratio_excl_nic": num(p.power_ratio_excl_nic, 3),
                  "cost_ratio_excl_nic": num(p.cost_ratio_excl_nic, 3),
                  "constants": {n: getattr(p.config, n) for n in POWER_COST_CONSTANTS},
                  "changed_constants": list(changed_constants(p.config)),
                  "assumptions": list(p.assumptions),
                  "opus_reported": "over 23x network power reduction and 4x cost savings "
                                   "(arXiv:2602.12521)"},
        "elapsed_s": round(ev.elapsed_s, 3),
        "load_s": None if ev.load_s is None else round(ev.load_s, 3),
        "peak_rss_mib": None if ev.peak_rss_mib is None else round(ev.peak_rss_mib, 1),
    }


def write_csv(ev: Evaluation, path: Path) -> None:
    """One line per policy and δ: iteration ms, overhead %, reconfigurations, exposed δ ms."""
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["workload", "policy", "delay_ms", "iteration_ms", "overhead_pct",
                    "reconfigurations_per_iteration", "exposed_delay_ms", "stays_per_iteration"])
        for r in ev.results:
            w.writerow([ev.workload, r.policy.value, f"{r.delay_ms:g}",
                        "" if r.iteration_s is None else f"{r.iteration_s * 1e3:.6f}",
                        "" if r.overhead_pct is None else f"{r.overhead_pct:.4f}",
                        r.reconfigurations, f"{r.exposed_delay_s * 1e3:.6f}", r.stays])


def write_plot(ev: Evaluation, path: Path) -> None:
    """Overhead versus δ (log x axis; symmetric-log y axis, linear below 1 %), one line per
    policy, as a PNG (matplotlib's Agg canvas, no display needed). δ = 0 is left out of the
    log axis."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    markers = {Policy.IDEAL_EPS: "", Policy.STATIC: "s", Policy.ON_DEMAND: "o",
               Policy.PROVISIONING: "^", Policy.PROVISIONING_RON: "D"}
    styles = {Policy.IDEAL_EPS: ":", Policy.STATIC: "--"}
    xs = sorted(d for d in ev.delays_ms if d > 0)
    for pol in Policy:
        pts = [(d, ev.result(pol, d).overhead_pct) for d in xs]
        good = [(d, o) for d, o in pts if o is not None]
        if not good:
            continue
        ax.plot([d for d, _ in good], [o for _, o in good], label=pol.label,
                marker=markers[pol] or None, linestyle=styles.get(pol, "-"), clip_on=False)
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=1.0)  # 0-1 % linear, log above: 0.5 % and 500 % both show
    overheads = [r.overhead_pct for r in ev.results if r.overhead_pct is not None]
    top = max([10.0, *(1.5 * o for o in overheads)])
    ax.set_ylim(min([0.0, *overheads]), top)
    ax.set_xlabel("reconfiguration delay δ (ms, log scale)")
    ax.set_ylabel("iteration time overhead vs ideal EPS (%, symlog)")
    ax.set_title(f"{ev.workload}\n{ev.world_size} ranks on {ev.hosts} hosts x {ev.rails} rails "
                 f"({ev.fabric}), {ev.link.bandwidth_gbps:g} Gb/s links", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})


def _fmt_ms(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "n/a"
    return f"{s * 1e3:.3f}"


def print_evaluation(ev: Evaluation, console: Console) -> None:
    """Notes, the policy x δ table (iteration ms and overhead %) and the power estimate."""
    console.print(f"[bold]{ev.workload}[/] ({ev.source_format}): {ev.world_size} ranks on "
                  f"{ev.hosts} hosts x {ev.rails} rails of {ev.fabric}; link "
                  f"{ev.link.bandwidth_gbps:g} Gb/s, α {ev.link.alpha_s * 1e6:g} µs; scale-up "
                  f"{ev.scale_up.bandwidth_gbps / 8:g} GB/s")
    for note in ev.notes:
        console.print(f"  note: {note}")
    if ev.static_plan:
        console.print(f"  static circuits: the plan of {ev.static_plan}")
    table = Table(title="Iteration time in ms (overhead vs ideal EPS, %) per reconfiguration "
                        "delay δ (RON: reconfigure-or-not)")
    table.add_column("policy")
    for d in ev.delays_ms:
        table.add_column(f"δ={d:g} ms", justify="right")
    for pol in Policy:
        row = [pol.label]
        for d in ev.delays_ms:
            r = ev.result(pol, d)
            if r.iteration_s is None or r.overhead_pct is None:
                row.append("n/a")
            else:
                row.append(f"{_fmt_ms(r.iteration_s)} ({r.overhead_pct:+.2f}%)")
        table.add_row(*row)
    console.print(table)
    recon = Table(title="Reconfigurations per iteration (RON: decisions to stay) and exposed δ ms")
    recon.add_column("policy")
    for d in ev.delays_ms:
        recon.add_column(f"δ={d:g} ms", justify="right")
    for pol in (Policy.ON_DEMAND, Policy.PROVISIONING, Policy.PROVISIONING_RON):
        row = [pol.label]
        for d in ev.delays_ms:
            r = ev.result(pol, d)
            stays = f" ({r.stays} stay)" if pol is Policy.PROVISIONING_RON else ""
            row.append(f"{r.reconfigurations}{stays} / {r.exposed_delay_s * 1e3:.3f}")
        recon.add_row(*row)
    console.print(recon)
    p = ev.power
    console.print(
        f"network power/cost for {p.hosts} hosts x {p.rails} rails: electrical rails "
        f"{p.electrical.switch_ports} switch ports ({p.electrical.switch_tiers} tier(s)), "
        f"{p.electrical.nic_transceivers + p.electrical.switch_transceivers} transceivers, "
        f"{p.electrical.power_w / 1e3:.2f} kW, ${p.electrical.cost_usd:,.0f}; photonic rails "
        f"{p.photonic.switch_ports} OCS ports, {p.photonic.nic_transceivers} transceivers, "
        f"{p.photonic.power_w / 1e3:.2f} kW, ${p.photonic.cost_usd:,.0f} -> "
        f"{p.power_ratio:.1f}x power, {p.cost_ratio:.1f}x cost (without NIC optics: "
        f"{p.power_ratio_excl_nic:.1f}x, {p.cost_ratio_excl_nic:.1f}x); Opus reports >23x "
        "power, 4x cost")
    console.print(f"  constants: {describe_constants(p.config)}")
    for a in p.assumptions:
        console.print(f"  assumption: {a}")
    console.print(f"evaluated in {ev.elapsed_s:.2f} s")
    if ev.load_s is not None and ev.peak_rss_mib is not None:
        console.print(f"wall time {ev.load_s + ev.elapsed_s:.2f} s (reading the workload "
                      f"{ev.load_s:.2f} s, evaluation {ev.elapsed_s:.2f} s); peak memory "
                      f"{ev.peak_rss_mib:.0f} MiB (ru_maxrss of this process)")


def peak_rss_mib() -> float:
    """The peak resident set size of this process so far, MiB (``getrusage(RUSAGE_SELF)
    .ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def evaluate_main(
    path: Path,
    delays_ms: Sequence[float] | None,
    out_dir: Path | None,
    *,
    fabric: str | None = None,
    max_ops: int | None = None,
    link_gbps: float | None = None,
    alpha_us: float | None = None,
    scale_up_gbps: float | None = None,
    power: PowerCostConfig | None = None,
    as_json: bool = False,
    console: Console | None = None,
    on_progress: ProgressCallback | None = None,
) -> int:
    """Load ``path``, evaluate it, print the table (or JSON) with the wall time (reading and
    evaluating) and the peak memory (``peak_rss_mib``) and, when ``out_dir`` is given, write
    ``evaluation.csv``, ``evaluation.json`` and ``overhead_vs_delay.png`` there.
    ``power``: the power/cost constants (default ``PowerCostConfig()``); ``on_progress``: as
    :func:`evaluate`'s.

    Returns the exit code: 0 success, 2 bad input (unreadable trace, bad option, a job that
    does not fit), 1 the output files could not be written. Errors go to stderr.
    """
    out = console or Console(width=None if sys.stdout.isatty() else 160)
    try:
        link = LinkModel.from_gbps(link_gbps if link_gbps is not None else 100.0,
                                   (alpha_us if alpha_us is not None else 5.0) * 1e-6)
        su_gbps = scale_up_gbps if scale_up_gbps is not None else DEFAULT_SCALE_UP_GBPS
        cfg = EvaluationConfig(
            delays_ms=tuple(delays_ms) if delays_ms is not None else DEFAULT_DELAYS_MS,
            link=link, scale_up=LinkModel.from_gbps(su_gbps, DEFAULT_SCALE_UP_ALPHA_S),
            fabric=fabric, max_ops=max_ops, power=power or DEFAULT_POWER)
        load_started = time.perf_counter()
        workload = load_workload(Path(path))
        load_s = time.perf_counter() - load_started
        ev = evaluate(workload, cfg, on_progress=on_progress)
        ev = dataclasses.replace(ev, load_s=load_s, peak_rss_mib=peak_rss_mib())
    except (TraceError, EvaluationError, CostModelError, OSError) as exc:
        print(f"lightrail evaluate: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(evaluation_to_json(ev), indent=2))
    else:
        print_evaluation(ev, out)
    if out_dir is not None:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            write_csv(ev, out_dir / "evaluation.csv")
            (out_dir / "evaluation.json").write_text(
                json.dumps(evaluation_to_json(ev), indent=2) + "\n", encoding="utf-8")
            write_plot(ev, out_dir / "overhead_vs_delay.png")
        except OSError as exc:
            print(f"lightrail evaluate: cannot write to {out_dir}: {exc}", file=sys.stderr)
            return 1
        if not as_json:
            out.print(f"wrote {out_dir / 'evaluation.csv'}, {out_dir / 'evaluation.json'}, "
                      f"{out_dir / 'overhead_vs_delay.png'}")
    elif not as_json:
        out.print("no files written: --out DIR writes evaluation.csv, evaluation.json and "
                  "overhead_vs_delay.png there")
    return 0
