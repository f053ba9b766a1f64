"""The one minimal-diff rule every driver and the reconciler use (``drivers.base.minimal_diff``)
and the read-back check after an apply (``drivers.base.check_read_back``)."""

from __future__ import annotations

import pytest

from lightrail.drivers.base import (
    ApplyMode,
    CrossConnect,
    CrossConnectDiff,
    InvalidPort,
    VerificationMismatch,
    check_read_back,
    minimal_diff,
)


def xc(ingress: int, egress: int) -> CrossConnect:
    return CrossConnect(ingress, egress)


# one job owns ports 1, 2, 3 and 9, 10, 11 of an 8 x 8 switch; 5->13 belongs to another job
PORTS = frozenset({1, 2, 3, 9, 10, 11})
OTHER = xc(5, 13)


def test_breaks_only_what_must_change_then_makes() -> None:
    current = frozenset({xc(1, 9), xc(2, 10), xc(3, 11), OTHER})
    target = frozenset({xc(1, 10), xc(2, 9), xc(3, 11)})
    diff = minimal_diff("s", current, target, PORTS)
    assert diff == CrossConnectDiff(
        breaks=(xc(1, 9), xc(2, 10)),
        makes=(xc(1, 10), xc(2, 9)),
        unchanged=frozenset({xc(3, 11)}),
    )
    assert not diff.empty
    assert diff.changed_ports() == {1, 2, 9, 10}  # 3->11 stays, so its ports are not read


def test_cross_connects_outside_the_ports_are_never_broken() -> None:
    current = frozenset({xc(1, 9), OTHER})
    diff = minimal_diff("s", current, frozenset(), PORTS)
    assert diff.breaks == (xc(1, 9),)
    assert OTHER not in diff.breaks and OTHER not in diff.unchanged


def test_target_in_place_is_empty() -> None:
    current = frozenset({xc(1, 9), OTHER})
    diff = minimal_diff("s", current, frozenset({xc(1, 9)}), PORTS)
    assert diff.empty
    assert diff.unchanged == {xc(1, 9)}
    assert diff.changed_ports() == frozenset()


def test_replace_breaks_everything_on_the_ports_and_makes_the_whole_target() -> None:
    current = frozenset({xc(1, 9), xc(2, 10), OTHER})
    target = frozenset({xc(1, 9), xc(3, 11)})
    diff = minimal_diff("s", current, target, PORTS, ApplyMode.REPLACE)
    assert diff.breaks == (xc(1, 9), xc(2, 10))
    assert diff.makes == (xc(1, 9), xc(3, 11))
    assert diff.unchanged == frozenset()


def test_a_cross_connect_straddling_the_ports_is_an_invalid_port() -> None:
    current = frozenset({xc(1, 12)})  # 12 is outside the job's ports
    with pytest.raises(InvalidPort) as info:
        minimal_diff("s", current, frozenset(), PORTS)
    assert info.value.port == 12


def test_read_back_checks_only_the_ports_given() -> None:
    target = frozenset({xc(1, 10), xc(3, 11)})
    changed = frozenset({1, 10})
    # 3->11 is missing, but its ports were not changed: not this check's business
    check_read_back("s", target, changed, {xc(1, 10), OTHER})
    with pytest.raises(VerificationMismatch) as info:
        check_read_back("s", target, changed, {xc(1, 9), OTHER})
    assert info.value.missing == (xc(1, 10),)
    assert info.value.unexpected == (xc(1, 9),)  # uses port 1 and port 9 outside the check
