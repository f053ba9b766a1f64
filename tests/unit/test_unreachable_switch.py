"""Fail fast on a switch its driver cannot reach (issue 14 section 1), in the pure core: after
``device_wait_s`` a phase that needs a change there is refused DEVICE_FAILURE naming the switch
and its last error; phases on its confirmed circuits and on other switches go on; once it
answers again the phase switches. Plus the operators' switch state rule."""

from __future__ import annotations

import pytest

from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.core.decisions import Admitted, Reconfigure, Reject
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.fabric import rail_fabric
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.runtime.reconciler import DeviceContact
from lightrail.controller.runtime.switch_health import SwitchState, switch_state

WORLD = tuple(range(8))
RING = PhaseKey(ProcessGroup.of(WORLD), Collective.ALL_REDUCE, 0)
PP0 = PhaseKey(ProcessGroup.of([0, 2]), Collective.SEND_RECV, 0)  # host0 <-> host1, rail 0
PP1 = PhaseKey(ProcessGroup.of([1, 3]), Collective.SEND_RECV, 0)  # host0 <-> host1, rail 1
WAIT_S = 2.0


@pytest.fixture
def coord() -> PhaseCoordinator:
    c = PhaseCoordinator(rail_fabric("t", 4, 2, delay_s=0.01), default_timeout_s=30.0,
                         device_wait_s=WAIT_S, provisioning=False)
    c.register_job("job", "tenant", [RankPlacement(r, f"host{r // 2}", r % 2)
                                     for r in range(8)])
    out = c.enter_many("job", WORLD, RING, 1, 0.0)
    (rec,) = [d for d in out if isinstance(d, Reconfigure)]
    assert any(isinstance(d, Admitted) for d in c.reconfigured(rec.op_id, 0.1))
    c.release_many("job", WORLD, RING, 0.2)
    return c


def test_a_phase_needing_an_unreachable_switch_waits_device_wait_s_then_is_refused(
    coord: PhaseCoordinator,
) -> None:
    assert coord.set_unreachable("ocs-rail0", "connection refused", 1.0) == []
    out = coord.enter_many("job", (0, 2), PP0, 2, 1.5)
    assert not [d for d in out if isinstance(d, Reconfigure | Admitted | Reject)]
    assert coord.schedule(1.0 + WAIT_S - 0.01) == []  # still within device_wait_s
    rejects = [d for d in coord.schedule(1.0 + WAIT_S) if isinstance(d, Reject)]
    assert sorted(d.rank for d in rejects) == [0, 2]
    assert {d.code for d in rejects} == {ErrorCode.DEVICE_FAILURE}
    msg = rejects[0].message
    assert "switch 'ocs-rail0' is unreachable (connection refused) for 2.0 s" in msg
    assert "needs 1 cross-connect(s) made there" in msg  # host1 -> host0; the ring has 0 -> 1
    # a later one is refused at once, and a repeated report keeps the outage's start
    coord.set_unreachable("ocs-rail0", "still refused", 5.0)
    assert coord.unreachable()["ocs-rail0"].since_s == 1.0
    later = PhaseKey(PP0.group, PP0.collective, seq=1)
    out = coord.enter_many("job", (0, 2), later, 3, 6.0)
    assert {d.code for d in out if isinstance(d, Reject)} == {ErrorCode.DEVICE_FAILURE}
    assert "still refused" in next(d for d in out if isinstance(d, Reject)).message


def test_confirmed_circuits_and_other_rails_go_on(coord: PhaseCoordinator) -> None:
    coord.set_unreachable("ocs-rail0", "no answer", 1.0)
    # the ring's circuits are confirmed on both rails: admitted, no switch needed
    again = PhaseKey(RING.group, RING.collective, seq=1)
    out = coord.enter_many("job", WORLD, again, 2, 10.0)
    assert len(out) == 1 and isinstance(out[0], Admitted) and out[0].noop
    coord.release_many("job", WORLD, again, 10.1)
    # a pair on rail 1 switches rail 1 only
    out = coord.enter_many("job", (1, 3), PP1, 3, 11.0)
    (rec,) = [d for d in out if isinstance(d, Reconfigure)]
    assert {t.switch_id for t in rec.targets} == {"ocs-rail1"}


def test_the_switch_back_lets_a_waiting_phase_switch(coord: PhaseCoordinator) -> None:
    coord.set_unreachable("ocs-rail0", "no answer", 1.0)
    coord.enter_many("job", (0, 2), PP0, 2, 1.5)
    out = coord.set_unreachable("ocs-rail0", None, 2.0)
    (rec,) = [d for d in out if isinstance(d, Reconfigure)]
    assert {t.switch_id for t in rec.targets} == {"ocs-rail0"}
    assert coord.unreachable() == {}
    with pytest.raises(ValueError, match="switch_id: unknown switch 'nope'"):
        coord.set_unreachable("nope", "x", 3.0)


def test_the_timeout_message_says_what_the_phase_waits_for(coord: PhaseCoordinator) -> None:
    coord.set_unreachable("ocs-rail0", "no answer", 1.0)
    coord.enter_many("job", (0, 2), PP0, 2, 1.5, timeout_s=0.5)  # times out before the wait
    rejects = [d for d in coord.expire(2.0) if isinstance(d, Reject)]
    assert {d.code for d in rejects} == {ErrorCode.DEADLINE_EXCEEDED}
    assert ("switch 'ocs-rail0' unreachable (no answer); a phase that needs it is refused "
            "after controller.device_wait_s = 2 s") in rejects[0].message


def test_switch_state_rule() -> None:
    never = DeviceContact(None, None, None, None)
    ok = DeviceContact(True, None, None, 10.0)
    failed_last = DeviceContact(True, "partial apply", 12.0, 10.0)
    lost = DeviceContact(False, "no answer", 12.0, 10.0)
    assert switch_state(never, maintenance=False, unreachable=False,
                        unknown_ports=False) is SwitchState.UP
    assert switch_state(ok, maintenance=False, unreachable=False,
                        unknown_ports=False) is SwitchState.UP
    assert switch_state(ok, maintenance=False, unreachable=False,
                        unknown_ports=True) is SwitchState.DEGRADED
    assert switch_state(failed_last, maintenance=False, unreachable=False,
                        unknown_ports=False) is SwitchState.DEGRADED
    assert switch_state(lost, maintenance=False, unreachable=False,
                        unknown_ports=False) is SwitchState.UNREACHABLE
    assert switch_state(ok, maintenance=False, unreachable=True,
                        unknown_ports=False) is SwitchState.UNREACHABLE
    assert switch_state(lost, maintenance=True, unreachable=True,
                        unknown_ports=True) is SwitchState.MAINTENANCE
