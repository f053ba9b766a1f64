"""One conformance suite for every driver and its emulated device (issue 4, section 3).

Each test runs against ``emulated`` (in-process), ``tl1``, ``restconf`` and ``siph`` through the
``harness`` fixture (``tests/conformance/conftest.py``) and asserts the
``lightrail.drivers.base.Driver``
contract. Where a driver documents a different behaviour the test asserts that behaviour and
cites the module doc; only the wire-fault cases are skipped for the in-process driver, which has
no wire.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from lightrail.drivers.base import (
    AlarmSeverity,
    ApplyMode,
    ApplyResult,
    CrossConnect,
    CrossConnectConflict,
    DeviceAlarm,
    DeviceUnreachable,
    Driver,
    DriverError,
    HardwareFault,
    InvalidPort,
    PartialApply,
    PortOper,
    ProtocolError,
    VerificationMismatch,
)
from lightrail.emulator.ocs import CONNECTED_POWER_DBM, NO_LIGHT_DBM, ChangeAction, ChangeRecord
from tests.conformance.conftest import PORTS, Fault, Harness, N

WAIT_S = 5.0
"""Deadline for an awaited event (an alarm); only reached when a test fails."""
LOS_THRESHOLD_DBM = -30.0
"""At or below this a port has no light (the drivers' default loss-of-signal threshold)."""


def xc(ingress: int, egress: int) -> CrossConnect:
    return CrossConnect(ingress, egress)


def permutation(outputs: list[int]) -> frozenset[CrossConnect]:
    """Ingress i+1 -> egress N+1+outputs[i]."""
    return frozenset(xc(i + 1, N + 1 + o) for i, o in enumerate(outputs))


FULL = permutation([3, 6, 1, 0, 7, 2, 5, 4])
"""A full permutation: every ingress to a distinct egress."""
FULL_SHIFTED = permutation([(o + 1) % N for o in [3, 6, 1, 0, 7, 2, 5, 4]])
"""Another full permutation sharing no cross-connect with ``FULL``."""


def ports_of(xcs: frozenset[CrossConnect]) -> frozenset[int]:
    return frozenset(p for x in xcs for p in x.ports())


async def read_back(h: Harness) -> frozenset[CrossConnect]:
    """The driver's read-back, checked against the device's own state (a consistent view)."""
    state = await h.driver.get_cross_connects()
    assert state == h.device.cross_connects, "driver read-back differs from the device"
    return state


def snapshot(h: Harness) -> tuple[frozenset[CrossConnect], int, int]:
    """Device state, change-log length and write count: what "nothing changed" compares."""
    return h.device.cross_connects, len(h.device.change_log), h.writes()


def records_since(h: Harness, start: int) -> list[ChangeRecord]:
    return h.device.change_log[start:]


def alarm_for(alarm: DeviceAlarm, port: int, severity: AlarmSeverity) -> bool:
    return alarm.port == port and alarm.severity is severity and alarm.condition == "LOS"


async def next_matching(
    stream: AsyncIterator[DeviceAlarm], port: int, severity: AlarmSeverity
) -> DeviceAlarm:
    """The next alarm on ``stream`` for ``port`` with ``severity`` (others, e.g. a reboot
    notice, are passed over); fails after ``WAIT_S``."""
    async with asyncio.timeout(WAIT_S):
        while True:
            alarm = await anext(stream)
            if alarm_for(alarm, port, severity):
                return alarm


# --- 1. apply and read back ----------------------------------------------------------------------


async def test_apply_and_read_back(harness: Harness) -> None:
    h = harness
    assert isinstance(h.driver, Driver)
    assert await read_back(h) == frozenset()
    target = frozenset({xc(1, 10), xc(2, 9), xc(5, 13)})
    result = await h.driver.apply(target, PORTS)
    assert result.ok and result.removed == ()
    assert set(result.added) == target
    assert await read_back(h) == target

    # move one cross-connect: a minimal diff of one break and one make
    start, writes = len(h.device.change_log), h.writes()
    moved = frozenset({xc(1, 10), xc(2, 11), xc(5, 13)})
    result = await h.driver.apply(moved, PORTS)
    # every driver reads back the ports it changed
    assert result == ApplyResult(removed=(xc(2, 9),), added=(xc(2, 11),), verified=True)
    assert h.writes() - writes == h.expected_writes(1, 1)
    assert await read_back(h) == moved
    records = records_since(h, start)
    by_xc: dict[CrossConnect, list[ChangeAction]] = {}
    for r in records:
        by_xc.setdefault(r.cross_connect, []).append(r.action)
    assert by_xc.pop(xc(2, 9)) == [ChangeAction.BREAK]
    assert by_xc.pop(xc(2, 11)) == [ChangeAction.MAKE]
    # the other cross-connects were not changed; a rearrangeable MZI mesh may re-route one
    # internally (drivers/siph.py, "Honest caveats"), which the device logs as break + make
    assert set(by_xc) <= h.rerouted()
    for actions in by_xc.values():
        assert actions == [ChangeAction.BREAK, ChangeAction.MAKE]


# --- 2. conflicts rejected -----------------------------------------------------------------------


async def test_conflicts_rejected_and_nothing_changed(harness: Harness) -> None:
    h = harness
    await h.driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    before = snapshot(h)

    # not a partial permutation: one egress twice, one ingress twice
    with pytest.raises(CrossConnectConflict):
        await h.driver.apply(frozenset({xc(2, 10), xc(3, 10)}), frozenset({2, 3, 10}))
    with pytest.raises(CrossConnectConflict):
        await h.driver.apply(frozenset({xc(2, 10), xc(2, 11)}), frozenset({2, 10, 11}))
    # a target cross-connect using a port outside ``ports``
    with pytest.raises(InvalidPort) as outside:
        await h.driver.apply(frozenset({xc(2, 10)}), frozenset({2}))
    assert outside.value.port == 10
    # ingress to ingress, and a port the switch lacks
    with pytest.raises(InvalidPort):
        await h.driver.apply(frozenset({xc(2, 3)}), frozenset({2, 3}))
    with pytest.raises(InvalidPort) as missing:
        await h.driver.apply(frozenset(), frozenset({2 * N + 1}))
    assert missing.value.port == 2 * N + 1
    # an existing cross-connect (1 -> 9) on the ports given that also uses a port outside them:
    # it cannot be broken without touching port 9
    with pytest.raises(InvalidPort) as straddling:
        await h.driver.apply(frozenset(), frozenset({1}))
    assert straddling.value.port == 9
    with pytest.raises(InvalidPort):
        await h.driver.apply(frozenset({xc(3, 9)}), frozenset({3, 9}))

    assert snapshot(h) == before
    assert await read_back(h) == frozenset({xc(1, 9)})


# --- 3. idempotent re-apply ----------------------------------------------------------------------


async def test_idempotent_reapply_changes_nothing(harness: Harness) -> None:
    h = harness
    target = frozenset({xc(1, 12), xc(5, 9), xc(8, 16)})
    await h.driver.apply(target, PORTS)
    before = snapshot(h)
    assert await h.driver.apply(target, PORTS) == ApplyResult()
    assert await h.driver.apply(target, ports_of(target)) == ApplyResult()
    assert await h.driver.apply(target, PORTS, ApplyMode.MINIMAL) == ApplyResult()
    assert snapshot(h) == before  # no change logged, no write command
    assert await read_back(h) == target


# --- 4. bulk of a full permutation ---------------------------------------------------------------


async def test_bulk_full_permutation_in_one_apply(harness: Harness) -> None:
    h = harness
    writes = h.writes()
    result = await h.driver.apply(FULL, PORTS)
    assert result.removed == () and set(result.added) == FULL and len(result.added) == N
    assert h.writes() - writes == h.expected_writes(0, N) == 1  # one bulk command
    makes = [r for r in h.device.change_log if r.action is ChangeAction.MAKE]
    assert sorted(r.cross_connect for r in makes) == sorted(FULL)
    assert len({r.at_s for r in makes}) == 1  # one settle for the whole batch
    assert await read_back(h) == FULL

    # a full permutation to another one that shares nothing with it: breaks, then makes
    start, writes = len(h.device.change_log), h.writes()
    result = await h.driver.apply(FULL_SHIFTED, PORTS)
    assert set(result.removed) == FULL and set(result.added) == FULL_SHIFTED
    assert h.writes() - writes == h.expected_writes(N, N)
    actions = [r.action for r in records_since(h, start)]
    assert actions == [ChangeAction.BREAK] * N + [ChangeAction.MAKE] * N
    assert await read_back(h) == FULL_SHIFTED


# --- 5. partial failure --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("initial", "nth"),
    [(frozenset({xc(1, 9)}), 3), (frozenset(), 1)],
    ids=["after_a_break", "first_make"],
)
async def test_partial_failure_reports_what_did_and_did_not_apply(
    harness: Harness, initial: frozenset[CrossConnect], nth: int
) -> None:
    h = harness
    if initial:
        await h.driver.apply(initial, ports_of(initial))
    h.device.fail_make(nth, "mirror did not latch")
    with pytest.raises(DriverError) as info:
        await h.driver.apply(FULL, PORTS)
    error = info.value
    # the common contract: PartialApply saying what was and was not done, or HardwareFault
    # when the device refused without changing anything (drivers/tl1.py maps the SROF of an
    # ENT-PATCH that made nothing, with no break before it, to HardwareFault)
    assert isinstance(error, PartialApply | HardwareFault), repr(error)
    state = await read_back(h)  # the device is left consistent with a read-back
    assert state != FULL
    if isinstance(error, HardwareFault):
        assert state == initial
    else:
        result = error.result
        assert error.retryable and result.failed
        assert set(result.added) <= state
        assert not set(result.removed) & state
        assert not {x for x in result.failed if x in FULL} & state
        assert set(result.added) | set(result.failed) >= FULL - initial
        assert set(result.removed) <= initial
        if h.partial_stops_at_failed_make:
            # the device stopped at the failed make: the makes issued before it are in place
            made_first = sorted(FULL - initial)[: nth - 1]
            assert sorted(result.added) == made_first
            assert state == frozenset(made_first)
            assert set(result.removed) == initial - FULL
        # siph: one vector write moves every heater; the heaters of the elements the failed
        # makes needed keep their old outputs (emulator/mzi_server.py, fail_make), so which
        # cross-connects are in place depends on the mesh routing: the contract above holds
    # the fault was one-shot: the same apply now completes
    await h.driver.apply(FULL, PORTS)
    assert await read_back(h) == FULL


# --- 6. power readings ---------------------------------------------------------------------------


async def test_power_readings_in_dbm(harness: Harness) -> None:
    h = harness
    target = frozenset({xc(1, 10), xc(2, 9)})
    await h.driver.apply(target, PORTS)
    assert await read_back(h) == target
    lit = ports_of(target)
    power = await h.driver.get_power()
    assert set(power) == set(PORTS)
    for port, dbm in power.items():
        if port in lit:
            assert dbm == pytest.approx(CONNECTED_POWER_DBM, abs=0.01), port
        else:
            assert dbm == pytest.approx(NO_LIGHT_DBM, abs=0.01), port
            assert dbm <= LOS_THRESHOLD_DBM
    some = await h.driver.get_power([10, 3])
    assert list(some) == [10, 3]
    assert some[10] == pytest.approx(CONNECTED_POWER_DBM, abs=0.01)
    assert some[3] == pytest.approx(NO_LIGHT_DBM, abs=0.01)
    with pytest.raises(InvalidPort):
        await h.driver.get_power([2 * N + 1])


# --- 7. alarms -----------------------------------------------------------------------------------


async def test_alarms_delivered_through_events(harness: Harness) -> None:
    h = harness
    stream = await h.subscribe()
    h.device.fail_port(5, "LOS")
    raised = await next_matching(stream, 5, AlarmSeverity.MAJOR)
    assert raised.switch_id == h.driver.switch_id
    [status] = await h.driver.get_port_status([5])
    assert status.oper is PortOper.FAILED
    h.device.repair_port(5)
    cleared = await next_matching(stream, 5, AlarmSeverity.CLEARED)
    assert cleared.switch_id == h.driver.switch_id
    [status] = await h.driver.get_port_status([5])
    assert status.oper is not PortOper.FAILED


# --- 8. reconnect after the device restarts ------------------------------------------------------


async def restart_checking_down(h: Harness, keep: bool) -> None:
    """Restart the device; while it is down a call fails with ``DeviceUnreachable``."""
    restart = asyncio.ensure_future(h.restart(keep))
    try:
        await asyncio.wait_for(h.gate.down.wait(), WAIT_S)
        with pytest.raises(DeviceUnreachable):
            await h.driver.get_cross_connects()
    finally:
        h.gate.release()
        await asyncio.wait_for(restart, WAIT_S)


@pytest.mark.parametrize("keep", [True, False], ids=["keep", "lose"])
async def test_reconnect_after_the_device_restarts(harness: Harness, keep: bool) -> None:
    h = harness
    target = frozenset({xc(1, 9), xc(2, 10), xc(4, 15)})
    await h.driver.apply(target, PORTS)
    await restart_checking_down(h, keep)
    assert await read_back(h) == (target if keep else frozenset())
    result = await h.driver.apply(target, PORTS)
    assert set(result.added) == (set() if keep else target)
    assert await read_back(h) == target


async def test_alarms_after_the_device_restarts(harness: Harness) -> None:
    h = harness
    stream = await h.subscribe()
    await restart_checking_down(h, True)
    await read_back(h)  # the driver is connected (and logged in) again
    if h.name == "siph":
        # drivers/siph.py, SiphDriver.events: the iterator "ends when the device closes the
        # stream", which a restart does; a new events() stream delivers again
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(stream), WAIT_S)
        stream = await h.subscribe()
    # tl1 reconnects its alarm session by itself, restconf polls again, the in-process
    # subscription never left the device
    h.device.fail_port(6, "LOS")
    alarm = await next_matching(stream, 6, AlarmSeverity.MAJOR)
    assert alarm.switch_id == h.driver.switch_id


# --- 9. garbage and replies cut short ------------------------------------------------------------


_EXPECTED = {Fault.GARBAGE: ProtocolError, Fault.CLOSE_MID_REPLY: DeviceUnreachable}


@pytest.mark.parametrize("fault", list(Fault), ids=[f.value for f in Fault])
async def test_bad_reply_to_a_read_is_a_clear_error(harness: Harness, fault: Fault) -> None:
    h = harness
    if h.wire is None:
        pytest.skip(h.wire_skip_reason)
    target = frozenset({xc(1, 9), xc(3, 11)})
    await h.driver.apply(target, PORTS)
    h.wire.inject(fault, False)
    with pytest.raises(_EXPECTED[fault]):
        await h.driver.get_cross_connects()
    assert await read_back(h) == target  # a later call works


@pytest.mark.parametrize("fault", list(Fault), ids=[f.value for f in Fault])
async def test_bad_reply_during_apply_changes_nothing(harness: Harness, fault: Fault) -> None:
    h = harness
    if h.wire is None:
        pytest.skip(h.wire_skip_reason)
    initial = frozenset({xc(1, 9)})
    await h.driver.apply(initial, PORTS)
    before = snapshot(h)
    h.wire.inject(fault, False)  # the apply's read of the current cross-connects
    with pytest.raises(_EXPECTED[fault]):
        await h.driver.apply(FULL, PORTS)
    assert snapshot(h) == before
    assert await read_back(h) == initial
    await h.driver.apply(FULL, PORTS)
    assert await read_back(h) == FULL


@pytest.mark.parametrize("fault", list(Fault), ids=[f.value for f in Fault])
async def test_lost_reply_to_a_write_leaves_a_consistent_state(
    harness: Harness, fault: Fault
) -> None:
    h = harness
    if h.wire is None:
        pytest.skip(h.wire_skip_reason)
    assert await read_back(h) == frozenset()  # the connection is up and idle
    target = frozenset({xc(1, 10), xc(2, 9)})
    h.wire.inject(fault, True)  # the write takes effect, its reply is garbled or cut
    if h.wire.lost_write_reply_raises:
        # drivers/siph.py: the error is raised, the connection dropped
        with pytest.raises(_EXPECTED[fault]):
            await h.driver.apply(target, PORTS)
    else:
        # drivers/tl1.py, drivers/restconf.py: the outcome is settled by a read-back
        result = await h.driver.apply(target, PORTS)
        assert result.ok and set(result.added) == target
    assert await read_back(h) == target  # the device did take the write
    writes = h.writes()
    assert await h.driver.apply(target, PORTS) == ApplyResult()  # and the driver sees it
    assert h.writes() == writes


# --- 10. ports outside the apply are untouched ---------------------------------------------------


JOB_A = frozenset({xc(1, 9), xc(2, 10)})
JOB_B = frozenset({xc(3, 11), xc(4, 12), xc(5, 13)})
PORTS_B = ports_of(JOB_B) | {6, 14}  # job B also owns a pair of idle ports
CROWDED_B = frozenset({xc(3, 10), xc(5, 16)})
CROWDED_A = FULL - CROWDED_B  # every other port of the switch is job A's

SCENARIOS: dict[str, tuple[frozenset[CrossConnect], frozenset[int], list[frozenset[CrossConnect]]]]
SCENARIOS = {
    # job A on two pairs of ports; job B starts, reconfigures, shrinks onto its idle ports
    "sparse": (
        JOB_A,
        PORTS_B,
        [JOB_B, frozenset({xc(3, 12), xc(4, 13), xc(5, 11)}), frozenset({xc(6, 14)})],
    ),
    # a full switch: job B swaps its two destinations and back. On the MZI mesh the current
    # router has to re-route one of job A's paths internally for this (7 -> 14)
    "crowded": (
        CROWDED_A,
        ports_of(CROWDED_B),
        [CROWDED_B, frozenset({xc(3, 16), xc(5, 10)}), CROWDED_B],
    ),
}


async def check_untouched(
    h: Harness, job_a: frozenset[CrossConnect], start: int, rerouted: frozenset[CrossConnect]
) -> None:
    """Job A's cross-connects are all there and the change log shows nothing on its ports,
    except (siph) internal re-routes."""
    ports_a = ports_of(job_a)
    state = await read_back(h)
    assert state & job_a == job_a, "another job's cross-connect was lost"
    assert not {x for x in state - job_a if set(x.ports()) & ports_a}
    touched = [r for r in records_since(h, start) if set(r.cross_connect.ports()) & ports_a]
    # drivers/siph.py ("Honest caveats"): a Beneš mesh keeps every mapping outside the ports
    # but may re-route one internally (a glitch of one settle time, logged break + make and
    # reported in last_rerouted); every other driver never touches those ports at all
    assert {r.cross_connect for r in touched} <= rerouted
    for x in rerouted:
        actions = [r.action for r in touched if r.cross_connect == x]
        assert actions == [ChangeAction.BREAK, ChangeAction.MAKE] * (len(actions) // 2)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("mode", list(ApplyMode), ids=[m.value for m in ApplyMode])
async def test_ports_outside_the_apply_are_untouched(
    harness: Harness, mode: ApplyMode, scenario: str
) -> None:
    h = harness
    job_a, ports_b, steps = SCENARIOS[scenario]
    await h.driver.apply(job_a, ports_of(job_a), mode)
    start = len(h.device.change_log)
    rerouted: frozenset[CrossConnect] = frozenset()
    for step in steps:
        await h.driver.apply(step, ports_b, mode)
        rerouted |= h.rerouted() & job_a
        state = await read_back(h)
        assert {x for x in state if set(x.ports()) & ports_b} == step
        await check_untouched(h, job_a, start, rerouted)


async def test_releasing_a_job_breaks_only_its_cross_connects(
    harness: Harness, request: pytest.FixtureRequest
) -> None:
    h = harness
    await h.driver.apply(JOB_A, ports_of(JOB_A))
    await h.driver.apply(JOB_B, PORTS_B)
    start = len(h.device.change_log)
    result = await h.driver.apply(frozenset(), PORTS_B)  # job B ends: breaks only
    assert set(result.removed) == JOB_B and result.added == ()
    assert await read_back(h) == JOB_A
    await check_untouched(h, JOB_A, start, h.rerouted() & JOB_A)


# --- 11. a device that acknowledges a make it did not do (issue 4: "a read-back that differs
# from the target fails the run") -----------------------------------------------------------------


async def test_a_make_the_device_did_not_do_shows_in_read_back_or_power(harness: Harness) -> None:
    h = harness
    h.device.drop_makes_silently(3)  # acknowledged, never takes effect
    target = frozenset({xc(1, 10), xc(3, 11)})
    if h.name in ("tl1", "restconf", "emulated"):
        # drivers/tl1, drivers/restconf and emulator/driver.py verify every apply by a
        # read-back of the ports it changed; EmulatedOcs.drop_makes_silently: "only a
        # read-back shows it"
        with pytest.raises(VerificationMismatch) as info:
            await h.driver.apply(target, PORTS)
        assert info.value.missing == (xc(3, 11),) and info.value.unexpected == ()
        assert await read_back(h) == {xc(1, 10)}
    else:
        # emulator/mzi_server.py, drop_makes_silently: "the heaters are right but the path
        # stays dark (a broken waveguide): only optical power shows it"; drivers/siph.py reads
        # the heaters back, so its read-back matches what it wrote
        result = await h.driver.apply(target, PORTS)
        assert set(result.added) == target
        assert await h.driver.get_cross_connects() == target
        assert h.device.cross_connects == {xc(1, 10)}
    power = await h.driver.get_power([1, 10, 3, 11])
    assert power[1] == pytest.approx(CONNECTED_POWER_DBM, abs=0.01)
    assert power[10] == pytest.approx(CONNECTED_POWER_DBM, abs=0.01)
    assert power[3] <= LOS_THRESHOLD_DBM and power[11] <= LOS_THRESHOLD_DBM
