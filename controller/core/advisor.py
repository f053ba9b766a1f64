"""Reconfigure-or-not advice for the live coordinator (PCCL, with Opus provisioning). Pure.

For a phase whose circuits are not on the rails, compare its completion time on the circuits
already there (forwarded over them: dilation and congestion,
``lightrail.controller.core.costmodel``) with the
reconfiguration delay δ not hidden in the compute gap plus its time on its own circuits
(``lightrail.controller.core.decision.decide``). Only circuits among the group's own endpoints
count as
"already there": forwarding through hosts outside the group is not assumed.

All-to-all sub-phases always switch (they are the time-multiplexed matchings themselves); a
phase with no byte count (``nbytes`` 0: the client gave no hint) always switches.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from lightrail.controller.core.costmodel import (
    Circuit,
    CostModelError,
    LinkModel,
    Topology,
    UnreachableError,
    estimate_collective,
)
from lightrail.controller.core.decision import ReconfigureDecision, decide
from lightrail.controller.core.planner import JobLayout, Plan, SwitchTarget, hosts_per_switch
from lightrail.controller.domain.fabric import Fabric
from lightrail.controller.domain.model import Collective, PhaseKey
from lightrail.drivers.base import CrossConnect, SwitchKind


@dataclass(frozen=True, slots=True)
class Advice:
    """The decision and, when it is to stay, the circuits the phase runs on instead (per
    switch, only circuits among the group's endpoints)."""

    decision: ReconfigureDecision
    stay_plan: Plan | None


@dataclass(slots=True)
class CostAdvisor:
    """Prices phases with the α-β cost model on ``link`` (one rail NIC; default α = 5 µs,
    100 Gb/s)."""

    fabric: Fabric
    link: LinkModel = field(default_factory=LinkModel)
    _tx: dict[str, dict[int, str]] = field(default_factory=dict, init=False)
    _rx: dict[str, dict[int, str]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for ep in self.fabric.endpoints.values():
            self._tx.setdefault(ep.switch_id, {})[ep.tx_port] = ep.endpoint_id.host
            self._rx.setdefault(ep.switch_id, {})[ep.rx_port] = ep.endpoint_id.host

    def advise(
        self,
        layout: JobLayout,
        phase: PhaseKey,
        plan: Plan,
        confirmed: Mapping[str, Mapping[int, CrossConnect]],
        nbytes: int,
        compute_gap_s: float,
    ) -> Advice | None:
        """Advice for ``phase`` (None: nothing to decide: no hint, an all-to-all sub-phase, or
        no circuits needed). ``confirmed`` maps switch id to its port -> cross-connect view."""
        if nbytes <= 0 or plan.empty or phase.collective is Collective.ALL_TO_ALL:
            return None
        t_new = 0.0
        t_cur = 0.0
        stay_targets: list[SwitchTarget] = []
        delta_s = 0.0
        order = hosts_per_switch(layout, phase.group)
        for target in plan.targets:
            sid = target.switch_id
            sw = self.fabric.switches[sid]
            delta_s = max(delta_s, sw.reconfiguration_delay_s)
            index = {ep.endpoint_id.host: i for i, ep in enumerate(order.get(sid, []))}
            ports = target.ports
            view = confirmed.get(sid, {})
            current = frozenset(view[p] for p in ports if p in view
                                and view[p].ingress in ports and view[p].egress in ports)
            try:
                t_new = max(t_new, self._time(sid, target.cross_connects, index, phase,
                                              nbytes))
            except UnreachableError:
                return None  # cannot price its own plan: let it switch
            try:
                t_cur = max(t_cur, self._time(sid, current, index, phase, nbytes))
            except UnreachableError:
                t_cur = math.inf
            stay_targets.append(SwitchTarget(sid, current,
                                             frozenset(p for x in current for p in x.ports())))
        decision = decide(t_cur, t_new, delta_s, max(0.0, compute_gap_s))
        stay = None if decision.switch else Plan(tuple(t for t in stay_targets
                                                       if t.cross_connects))
        return Advice(decision, stay)

    def _time(
        self,
        switch_id: str,
        xcs: frozenset[CrossConnect],
        index: Mapping[str, int],
        phase: PhaseKey,
        nbytes: int,
    ) -> float:
        duplex = self.fabric.switches[switch_id].capabilities.kind is SwitchKind.DUPLEX
        tx, rx = self._tx.get(switch_id, {}), self._rx.get(switch_id, {})
        circuits: set[Circuit] = set()
        for x in xcs:
            a = index.get(tx.get(x.ingress, ""))
            b = index.get((tx if duplex else rx).get(x.egress, ""))
            if a is None or b is None or a == b:
                continue
            circuits.add(Circuit(a, b))
            if duplex:
                circuits.add(Circuit(b, a))
        nodes = list(range(len(index)))
        if phase.collective is Collective.SEND_RECV:
            nodes = nodes[:2]
        try:
            return estimate_collective(Topology.of_circuits(circuits), phase.collective, nodes,
                                       float(nbytes), self.link).time_s
        except UnreachableError:
            raise
        except CostModelError:
            raise UnreachableError(0, 0) from None
