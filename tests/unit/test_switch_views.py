"""``SwitchViews`` holds: counted per phase instance on the plan's ingress ports, so a
cross-connect two instances hold stays held until both let go, and an unhold of cross-connects
nobody holds is refused and changes nothing."""

from __future__ import annotations

import pytest

from lightrail.controller.core.planner import Plan, SwitchTarget
from lightrail.controller.core.switch_views import SwitchViews
from lightrail.drivers.base import CrossConnect


def _plan(*pairs: tuple[int, int], sid: str = "ocs") -> Plan:
    xcs = frozenset(CrossConnect(i, e) for i, e in pairs)
    return Plan((SwitchTarget(sid, xcs, frozenset(p for xc in xcs for p in xc)),))


def _held(views: SwitchViews, *pairs: tuple[int, int]) -> list[bool]:
    return [views.held("ocs", CrossConnect(i, e)) for i, e in pairs]


def test_a_target_knows_its_ingress_ports() -> None:
    (t,) = _plan((1, 9), (2, 12), (3, 10)).targets
    assert t.ingress == frozenset({1, 2, 3})
    assert t == SwitchTarget("ocs", t.cross_connects, t.ports)  # not part of equality


def test_overlapping_holds_are_counted_per_instance() -> None:
    views = SwitchViews(["ocs"])
    ring, pair = _plan((1, 10), (2, 11), (3, 9)), _plan((1, 10), (4, 12))
    views.hold(ring)
    views.hold(pair)  # shares 1->10 with the ring
    views.hold(ring)  # a second instance of the ring
    assert _held(views, (1, 10), (2, 11), (3, 9), (4, 12)) == [True] * 4
    views.unhold(ring)
    assert _held(views, (1, 10), (2, 11), (3, 9), (4, 12)) == [True] * 4
    views.unhold(pair)
    assert _held(views, (1, 10), (2, 11), (3, 9), (4, 12)) == [True, True, True, False]
    views.unhold(ring)
    assert _held(views, (1, 10), (2, 11), (3, 9), (4, 12)) == [False] * 4
    views.hold(pair)  # counts start again from nothing
    views.unhold(pair)
    assert _held(views, (1, 10), (4, 12)) == [False, False]


def test_an_unhold_without_its_hold_is_refused_and_changes_nothing() -> None:
    views = SwitchViews(["ocs"])
    views.hold(_plan((1, 10)))
    with pytest.raises(ValueError, match=r"unhold: switch ocs ports \[2\] are not held"):
        views.unhold(_plan((1, 10), (2, 11)))
    assert _held(views, (1, 10)) == [True]


def test_a_held_cross_connect_survives_forget() -> None:
    views = SwitchViews(["ocs"])
    views.replace("ocs", [CrossConnect(1, 10), CrossConnect(2, 11)])
    views.hold(_plan((1, 10)))
    views.forget("ocs", [1, 10, 2, 11])
    assert views.cross_connects("ocs") == frozenset({CrossConnect(1, 10)})
    assert views.unknown["ocs"] == {2, 11}
