"""What the phase coordinator believes each switch carries: the confirmed cross-connects, the
ones ranks hold, the ports being switched and the ports whose state is unknown. Pure.

The safety invariant (DESIGN.md) is checked against these views: a rank joins a plan only when
every cross-connect of it is confirmed here and none of its ports is being switched or unknown
(``ready``); a reconfiguration may break a cross-connect only when nobody holds it (``held``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from lightrail.controller.core.planner import Plan, SwitchTarget
from lightrail.drivers.base import CrossConnect


class SwitchViews:
    """Per switch id: ``confirmed`` maps each port of a confirmed cross-connect to it (both of
    its ports); holds are counted per (switch, cross-connect) by phase instance, not by rank;
    ``inflight`` ports are being switched; ``unknown`` ports lost their state in a failed apply
    and block everything until the switch is read back."""

    def __init__(self, switch_ids: Iterable[str]) -> None:
        ids = list(switch_ids)
        self.confirmed: dict[str, dict[int, CrossConnect]] = {s: {} for s in ids}
        self.inflight: dict[str, set[int]] = {s: set() for s in ids}
        self.unknown: dict[str, set[int]] = {s: set() for s in ids}
        self._held: dict[str, dict[int, int]] = {s: {} for s in ids}
        """Per switch: ingress port of a held cross-connect -> how many phase instances hold
        it (a switch's cross-connects form a partial permutation: the ingress names one)."""

    # --- queries ----------------------------------------------------------------------------

    def cross_connects(self, switch_id: str) -> frozenset[CrossConnect]:
        """The confirmed cross-connects of ``switch_id`` (empty for an unknown switch)."""
        return frozenset(self.confirmed.get(switch_id, {}).values())

    def ready(self, plan: Plan) -> bool:
        """Every cross-connect of ``plan`` is confirmed and none of its ports is being switched
        or unknown: ranks may be admitted onto it. O(plan), one dictionary lookup per port."""
        for t in plan.targets:
            sid = t.switch_id
            inflight = self.inflight[sid]
            if inflight and not t.ports.isdisjoint(inflight):
                return False
            unknown = self.unknown[sid]
            if unknown and not t.ports.isdisjoint(unknown):
                return False
            get = self.confirmed[sid].get
            for xc in t.cross_connects:
                there = get(xc.ingress)
                if there is not xc and there != xc:
                    return False
                there = get(xc.egress)
                if there is not xc and there != xc:
                    return False
        return True

    def present(self, plan: Plan) -> bool:
        """Every cross-connect of ``plan`` is in the confirmed view."""
        for t in plan.targets:
            view = self.confirmed[t.switch_id]
            for xc in t.cross_connects:
                if view.get(xc.ingress) != xc:
                    return False
        return True

    def blocked(self, switch_id: str, ports: frozenset[int]) -> bool:
        """True when any of ``ports`` is being switched or in an unknown state."""
        return not (ports.isdisjoint(self.inflight[switch_id])
                    and ports.isdisjoint(self.unknown[switch_id]))

    def held(self, switch_id: str, xc: CrossConnect) -> bool:
        """True while some phase instance holds ``xc`` on ``switch_id`` (conservatively: a
        cross-connect on the ingress port of a held one counts as held)."""
        return xc.ingress in self._held[switch_id]

    def conflicts(self, target: SwitchTarget) -> set[CrossConnect]:
        """The confirmed cross-connects on ``target``'s ports that ``target`` does not keep:
        what switching to it must break."""
        view = self.confirmed[target.switch_id]
        out: set[CrossConnect] = set()
        for p in target.ports:
            xc = view.get(p)
            if xc is not None and xc not in target.cross_connects:
                out.add(xc)
        return out

    def changes(self, target: SwitchTarget) -> SwitchTarget:
        """The part of switching to ``target`` that changes the switch: its cross-connects
        that are not confirmed, on their ports and the ports of the confirmed cross-connects
        on ``target``'s ports that it breaks. Cross-connects ``target`` keeps are left out (a
        device command never touches them), so everything downstream (reconciler, driver,
        device) costs O(changes), not O(plan)."""
        sid = target.switch_id
        view = self.confirmed[sid]
        wanted = target.cross_connects
        needed: list[CrossConnect] = []
        ports: set[int] = set()
        for xc in wanted:
            i, e = xc.ingress, xc.egress
            if view.get(i) != xc or view.get(e) != xc:
                needed.append(xc)
                ports.add(i)
                ports.add(e)
        for p in target.ports:
            there = view.get(p)
            if there is not None and there not in wanted:
                ports.add(there.ingress)
                ports.add(there.egress)
        return SwitchTarget(sid, frozenset(needed), frozenset(ports))

    # --- changes ----------------------------------------------------------------------------

    def replace(self, switch_id: str, cross_connects: Iterable[CrossConnect]) -> None:
        """The device reported ``cross_connects`` (read-back): they are the view of
        ``switch_id`` now, and its unknown ports are known again."""
        view: dict[int, CrossConnect] = {}
        for xc in cross_connects:
            view[xc.ingress] = xc
            view[xc.egress] = xc
        self.confirmed[switch_id] = view
        self.unknown[switch_id] = set()

    def apply(self, target: SwitchTarget, ports: Iterable[int]) -> None:
        """The switch confirmed ``target`` on ``ports``: exactly its cross-connects there."""
        view = self.confirmed[target.switch_id]
        for p in ports:
            view.pop(p, None)
        for xc in target.cross_connects:
            view[xc.ingress] = xc
            view[xc.egress] = xc

    def forget(self, switch_id: str, ports: Iterable[int]) -> None:
        """A failed apply left ``ports`` in an unknown state: drop them from the view and block
        them until the switch is read back, except held cross-connects: the apply never breaks
        those, and dropping them would hide them from the hold checks."""
        view = self.confirmed[switch_id]
        unknown = self.unknown[switch_id]
        for p in ports:
            xc = view.get(p)
            if xc is not None and xc.ingress in self._held[switch_id]:
                continue
            view.pop(p, None)
            unknown.add(p)

    def begin(self, ports: Mapping[str, frozenset[int]]) -> None:
        """A reconfiguration starts switching ``ports`` (switch id -> ports)."""
        for sid, p in ports.items():
            self.inflight[sid].update(p)

    def end(self, ports: Mapping[str, frozenset[int]]) -> None:
        """The reconfiguration on ``ports`` (switch id -> ports) ended, done or failed."""
        for sid, p in ports.items():
            self.inflight[sid].difference_update(p)

    def hold(self, plan: Plan) -> None:
        """One more phase instance holds every cross-connect of ``plan``."""
        for t in plan.targets:
            held = self._held[t.switch_id]
            get = held.get
            for xc in t.cross_connects:
                i = xc.ingress
                held[i] = get(i, 0) + 1

    def unhold(self, plan: Plan) -> None:
        """One phase instance fewer holds the cross-connects of ``plan``."""
        for t in plan.targets:
            held = self._held[t.switch_id]
            for xc in t.cross_connects:
                i = xc.ingress
                n = held[i] - 1
                if n:
                    held[i] = n
                else:
                    del held[i]
