"""The invariant checker itself must catch violations, or the end-to-end tests prove nothing."""

from __future__ import annotations

from lightrail.agents.replay.replayer import HoldRecord
from lightrail.controller.domain.fabric import rail_fabric
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.drivers.base import CrossConnect
from lightrail.emulator.ocs import ChangeAction, ChangeRecord
from tests.invariants import Violation, check_holds

FABRIC = rail_fabric("t", 2, 1, delay_s=0.0)
PLACE = [RankPlacement(0, "host0", 0), RankPlacement(1, "host1", 0)]
PAIR = PhaseKey(ProcessGroup.of([0, 1]), Collective.SEND_RECV)
A, B = CrossConnect(1, 4), CrossConnect(2, 3)  # host0 -> host1, host1 -> host0 (N = 2)


def make(t: float, xc: CrossConnect) -> ChangeRecord:
    return ChangeRecord(t, "ocs-rail0", ChangeAction.MAKE, xc)


def brk(t: float, xc: CrossConnect) -> ChangeRecord:
    return ChangeRecord(t, "ocs-rail0", ChangeAction.BREAK, xc)


def test_clean_run_has_no_violation() -> None:
    log = [make(1.0, A), make(1.0, B), brk(5.0, A)]
    holds = [HoldRecord(0, PAIR, 2.0, 4.0), HoldRecord(1, PAIR, 2.0, 5.0)]
    assert check_holds(FABRIC, PLACE, holds, {"ocs-rail0": log}) == []


def test_admission_before_the_make_is_caught() -> None:
    log = [make(1.0, A), make(3.0, B)]
    (v,) = check_holds(FABRIC, PLACE, [HoldRecord(0, PAIR, 2.0, 4.0)], {"ocs-rail0": log})
    assert v.cross_connect == B and "not made at admission" in v.problem


def test_break_while_held_is_caught() -> None:
    log = [make(1.0, A), make(1.0, B), brk(3.0, B), make(3.5, B)]
    (v,) = check_holds(FABRIC, PLACE, [HoldRecord(1, PAIR, 2.0, 4.0)], {"ocs-rail0": log})
    assert v.rank == 1 and v.cross_connect == B and "broken at 3.000000" in v.problem


def lost(t: float, xc: CrossConnect) -> ChangeRecord:
    """A break the device made on its own (a reboot losing its cross-connects)."""
    return ChangeRecord(t, "ocs-rail0", ChangeAction.BREAK, xc, commanded=False)


def test_device_loss_is_the_devices_fault_only_within_the_grace() -> None:
    log = [make(1.0, A), make(1.0, B), lost(3.0, B)]
    during = HoldRecord(1, PAIR, 2.0, 4.0)  # held when the device dropped B
    just_after = HoldRecord(0, PAIR, 3.2, 3.5)  # admitted 0.2 s after: the reply was on its way
    much_later = HoldRecord(0, PAIR, 6.0, 7.0)  # the controller should have known by then
    holds = [during, just_after, much_later]
    strict = check_holds(FABRIC, PLACE, holds, {"ocs-rail0": log})
    assert len(strict) == 3  # without device_losses nothing is excused
    losses: list[Violation] = []
    out = check_holds(FABRIC, PLACE, holds, {"ocs-rail0": log}, device_losses=losses,
                      device_loss_grace_s=1.0)
    assert [(v.rank, v.problem.split(" ")[0]) for v in losses] == [(1, "broken"), (0, "not")]
    (v,) = out
    assert v.rank == 0 and "not made at admission 6.000000" in v.problem
    # a commanded break stays a violation whatever the grace
    commanded = [make(1.0, A), make(1.0, B), brk(3.0, B)]
    assert len(check_holds(FABRIC, PLACE, [during], {"ocs-rail0": commanded},
                           device_losses=[], device_loss_grace_s=10.0)) == 1
