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
        self._held: dict[tuple[str, CrossConnect], int] = {}

    # --- queries ----------------------------------------------------------------------------

    def cross_connects(self, switch_id: str) -> frozenset[CrossConnect]:
        """The confirmed cross-connects of ``switch_id`` (empty for an unknown switch)."""
        return frozenset(self.confirmed.get(switch_id, {}).values())

    def ready(self, plan: Plan) -> bool:
        """Every cross-connect of ``plan`` is confirmed and none of its ports is being switched
        or unknown: ranks may be admitted onto it."""
        for t in plan.targets:
            view = self.confirmed[t.switch_id]
            inflight = self.inflight[t.switch_id]
            unknown = self.unknown[t.switch_id]
            for xc in t.cross_connects:
                if view.get(xc.ingress) != xc or view.get(xc.egress) != xc:
                    return False
                if xc.ingress in inflight or xc.egress in inflight:
                    return False
                if unknown and (xc.ingress in unknown or xc.egress in unknown):
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
        """True while some phase instance holds ``xc`` on ``switch_id``."""
        return (switch_id, xc) in self._held

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
            if xc is not None and (switch_id, xc) in self._held:
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
        held = self._held
        for t in plan.targets:
            sid = t.switch_id
            for xc in t.cross_connects:
                key = (sid, xc)
                held[key] = held.get(key, 0) + 1

    def unhold(self, plan: Plan) -> None:
        """One phase instance fewer holds the cross-connects of ``plan``."""
        held = self._held
        for t in plan.targets:
            sid = t.switch_id
            for xc in t.cross_connects:
                key = (sid, xc)
                n = held[key] - 1
                if n:
                    held[key] = n
                else:
                    del held[key]
