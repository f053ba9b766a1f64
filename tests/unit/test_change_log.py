"""The emulated switch's change log (``emulator.ocs.ChangeLog``): columns read back as the
records written, oldest first, the last ``capacity`` of them once it is full."""

from __future__ import annotations

import pytest

from lightrail.drivers.base import CrossConnect, SwitchCapabilities, SwitchKind
from lightrail.emulator.ocs import ChangeAction, ChangeLog, ChangeRecord, EmulatedOcs

MAKE, BREAK = ChangeAction.MAKE, ChangeAction.BREAK


def _xcs(*pairs: tuple[int, int]) -> list[CrossConnect]:
    return [CrossConnect(i, e) for i, e in pairs]


def test_records_come_back_in_order_with_their_fields() -> None:
    log = ChangeLog("ocs-1", 10)
    log.record(1.5, BREAK, _xcs((1, 9), (2, 10)))
    log.record(2.25, MAKE, _xcs((1, 10)))
    log.record(3.0, BREAK, _xcs((1, 10)), commanded=False)
    log.record(4.0, MAKE, [])  # nothing to record
    assert len(log) == 4
    assert log.records() == [
        ChangeRecord(1.5, "ocs-1", BREAK, CrossConnect(1, 9), True),
        ChangeRecord(1.5, "ocs-1", BREAK, CrossConnect(2, 10), True),
        ChangeRecord(2.25, "ocs-1", MAKE, CrossConnect(1, 10), True),
        ChangeRecord(3.0, "ocs-1", BREAK, CrossConnect(1, 10), False),
    ]


@pytest.mark.parametrize("batches", [
    [1, 1, 1, 1, 1, 1, 1],  # one at a time past the capacity
    [2, 4, 1],              # a batch that fills the room and wraps
    [9],                    # one batch larger than the capacity
    [3, 3, 3, 2],           # full at once, then whole rounds
])
def test_a_full_log_keeps_the_last_capacity_changes(batches: list[int]) -> None:
    log = ChangeLog("s", 3)
    written: list[ChangeRecord] = []
    port = 1
    for k, size in enumerate(batches):
        xcs = _xcs(*[(port + i, 100 + port + i) for i in range(size)])
        port += size
        action = MAKE if k % 2 else BREAK
        log.record(float(k), action, xcs, commanded=k != 1)
        written += [ChangeRecord(float(k), "s", action, xc, k != 1) for xc in xcs]
    assert log.records() == written[-3:]
    assert len(log) == min(3, len(written))


def test_clear_forgets_everything_and_the_log_fills_again() -> None:
    log = ChangeLog("s", 2)
    log.record(1.0, MAKE, _xcs((1, 5), (2, 6), (3, 7)))
    log.clear()
    assert (len(log), log.records()) == (0, [])
    log.record(2.0, BREAK, _xcs((4, 8)))
    assert log.records() == [ChangeRecord(2.0, "s", BREAK, CrossConnect(4, 8))]


def test_a_capacity_below_one_is_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match="max_changes: must be >= 1, got 0"):
        ChangeLog("s", 0)
    with pytest.raises(ValueError, match="max_changes: must be >= 1, got -5"):
        EmulatedOcs("s", SwitchCapabilities(SwitchKind.NXN, 8, True, 0.0), max_changes=-5)
