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
    its ports); holds are counted per (switch, cross-connect) by phase instance, not by rank,
    as set operations on the plan's ingress ports (``hold``); ``inflight`` ports are being
    switched; ``unknown`` ports lost their state in a failed apply and block everything until
    the switch is read back."""

    def __init__(self, switch_ids: Iterable[str]) -> None:
        ids = list(switch_ids)
        self.confirmed: dict[str, dict[int, CrossConnect]] = {s: {} for s in ids}
        self._sets: dict[str, set[CrossConnect]] = {s: set() for s in ids}
        """Per switch: the confirmed cross-connects as a set, kept equal to the values of
        ``confirmed`` (plans are checked against it with set operations, in C)."""
        self.inflight: dict[str, set[int]] = {s: set() for s in ids}
        self.unknown: dict[str, set[int]] = {s: set() for s in ids}
        self._held: dict[str, set[int]] = {s: set() for s in ids}
        """Per switch: the ingress ports of the held cross-connects (a switch's cross-connects
        form a partial permutation: the ingress names one)."""
        self._extra: dict[str, dict[int, int]] = {s: {} for s in ids}
        """Per switch: ingress port -> how many phase instances hold its cross-connect beyond
        the first (rare: two instances of one plan, or plans sharing circuits)."""

    # --- queries ----------------------------------------------------------------------------

    def cross_connects(self, switch_id: str) -> frozenset[CrossConnect]:
        """The confirmed cross-connects of ``switch_id`` (empty for an unknown switch)."""
        return frozenset(self._sets.get(switch_id, ()))

    def ready(self, plan: Plan) -> bool:
        """Every cross-connect of ``plan`` is confirmed and none of its ports is being switched
        or unknown: ranks may be admitted onto it. Set operations: O(plan) in C."""
        for t in plan.targets:
            sid = t.switch_id
            inflight = self.inflight[sid]
            if inflight and not t.ports.isdisjoint(inflight):
                return False
            unknown = self.unknown[sid]
            if unknown and not t.ports.isdisjoint(unknown):
                return False
            if not t.cross_connects <= self._sets[sid]:
                return False
        return True

    def present(self, plan: Plan) -> bool:
        """Every cross-connect of ``plan`` is in the confirmed view."""
        return all(t.cross_connects <= self._sets[t.switch_id] for t in plan.targets)

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
        what switching to it must break. O(min(ports, switch)): a small target looks its
        ports up, a large one takes the set difference with the switch's cross-connects."""
        sid = target.switch_id
        wanted = target.cross_connects
        ports = target.ports
        confirmed = self._sets[sid]
        if len(ports) < len(confirmed):
            get = self.confirmed[sid].get
            out: set[CrossConnect] = set()
            for p in ports:
                xc = get(p)
                if xc is not None and xc not in wanted:
                    out.add(xc)
            return out
        return {xc for xc in confirmed - wanted if xc.ingress in ports or xc.egress in ports}

    def changes(self, target: SwitchTarget) -> SwitchTarget:
        """The part of switching to ``target`` that changes the switch: its cross-connects
        that are not confirmed, on their ports and the ports of the confirmed cross-connects
        on ``target``'s ports that it breaks. Cross-connects ``target`` keeps are left out (a
        device command never touches them), so everything downstream (reconciler, driver,
        device) costs O(changes), not O(plan)."""
        needed = target.cross_connects - self._sets[target.switch_id]
        ports: set[int] = set()
        for xc in needed:
            ports.add(xc.ingress)
            ports.add(xc.egress)
        for xc in self.conflicts(target):
            ports.add(xc.ingress)
            ports.add(xc.egress)
        return SwitchTarget(target.switch_id, frozenset(needed), frozenset(ports))

    # --- changes ----------------------------------------------------------------------------

    def _drop(self, view: dict[int, CrossConnect], confirmed: set[CrossConnect],
              port: int) -> CrossConnect | None:
        """Remove the cross-connect on ``port`` (both of its ports) from the view."""
        xc = view.pop(port, None)
        if xc is not None:
            confirmed.discard(xc)
            other = xc.egress if port == xc.ingress else xc.ingress
            if view.get(other) == xc:
                del view[other]
        return xc

    def replace(self, switch_id: str, cross_connects: Iterable[CrossConnect]) -> None:
        """The device reported ``cross_connects`` (read-back): they are the view of
        ``switch_id`` now, and its unknown ports are known again."""
        view: dict[int, CrossConnect] = {}
        for xc in cross_connects:
            view[xc.ingress] = xc
            view[xc.egress] = xc
        self.confirmed[switch_id] = view
        self._sets[switch_id] = set(view.values())
        self.unknown[switch_id] = set()

    def apply(self, target: SwitchTarget, ports: Iterable[int]) -> None:
        """The switch confirmed ``target`` on ``ports``: exactly its cross-connects there."""
        sid = target.switch_id
        view = self.confirmed[sid]
        confirmed = self._sets[sid]
        pop = view.pop
        for p in ports:  # ``_drop``, inlined: the hot path
            xc = pop(p, None)
            if xc is not None:
                confirmed.discard(xc)
                other = xc.egress if p == xc.ingress else xc.ingress
                if view.get(other) == xc:
                    del view[other]
        for xc in target.cross_connects:
            view[xc.ingress] = xc
            view[xc.egress] = xc
            confirmed.add(xc)

    def forget(self, switch_id: str, ports: Iterable[int]) -> None:
        """A failed apply left ``ports`` in an unknown state: drop them from the view and block
        them until the switch is read back, except held cross-connects: the apply never breaks
        those, and dropping them would hide them from the hold checks."""
        view = self.confirmed[switch_id]
        confirmed = self._sets[switch_id]
        unknown = self.unknown[switch_id]
        held = self._held[switch_id]
        for p in ports:
            xc = view.get(p)
            if xc is not None and xc.ingress in held:
                continue
            self._drop(view, confirmed, p)
            unknown.add(p)

    def distrust(self, switch_id: str) -> None:
        """The switch may have changed behind our back: ``forget`` every port of its view, and
        mark the ports of the held cross-connects ``forget`` keeps unknown as well (they stay
        in the view for the hold checks, but nobody is admitted onto them before a
        read-back)."""
        view = self.confirmed[switch_id]
        self.forget(switch_id, list(view))
        self.unknown[switch_id].update(view)

    def begin(self, ports: Mapping[str, frozenset[int]]) -> None:
        """A reconfiguration starts switching ``ports`` (switch id -> ports)."""
        for sid, p in ports.items():
            self.inflight[sid].update(p)

    def end(self, ports: Mapping[str, frozenset[int]]) -> None:
        """The reconfiguration on ``ports`` (switch id -> ports) ended, done or failed."""
        for sid, p in ports.items():
            self.inflight[sid].difference_update(p)

    def hold(self, plan: Plan) -> None:
        """One more phase instance holds every cross-connect of ``plan``. O(plan) in C: a
        set union, plus a count per cross-connect some other instance holds already."""
        for t in plan.targets:
            held = self._held[t.switch_id]
            ports = t.ingress
            if not held.isdisjoint(ports):
                extra = self._extra[t.switch_id]
                for i in held & ports:
                    extra[i] = extra.get(i, 0) + 1
            held |= ports

    def unhold(self, plan: Plan) -> None:
        """One phase instance fewer holds the cross-connects of ``plan`` (held by ``hold``).
        Raises ``ValueError`` naming the switch and ports when some are not held (an unhold
        without its hold: a bug in the caller)."""
        for t in plan.targets:
            sid = t.switch_id
            held = self._held[sid]
            ports = t.ingress
            if not ports <= held:
                raise ValueError(f"unhold: switch {sid} ports {sorted(ports - held)[:8]} "
                                 "are not held")
            extra = self._extra[sid]
            if extra:
                shared = extra.keys() & ports
                if shared:  # still held by another instance: count one hold fewer
                    for i in shared:
                        n = extra[i] - 1
                        if n:
                            extra[i] = n
                        else:
                            del extra[i]
                    held -= ports - shared
                    continue
            held -= ports
