"""The emulated OCS and its in-process driver: partial-permutation rules, the reconfiguration
delay on an injected clock, the change log, power, alarms and fault injection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from lightrail.drivers.base import (
    AlarmSeverity,
    ApplyMode,
    CrossConnect,
    CrossConnectConflict,
    DeviceAlarm,
    DeviceUnreachable,
    Driver,
    HardwareFault,
    InvalidPort,
    PartialApply,
    PortAdmin,
    PortOper,
    SwitchCapabilities,
    SwitchKind,
    SwitchSpec,
    VerificationMismatch,
)
from lightrail.drivers.options import DriverConfigError
from lightrail.drivers.registry import DriverRegistry
from lightrail.emulator.driver import EmulatedDriver, emulated_factory, make_driver
from lightrail.emulator.ocs import (
    CONNECTED_POWER_DBM,
    NO_LIGHT_DBM,
    ChangeAction,
    ChangeRecord,
    DenialKind,
    EmulatedFabricDevices,
    EmulatedOcs,
)
from tests.manual_time import ManualTime

DELAY_S = 0.025
NXN8 = SwitchCapabilities(
    kind=SwitchKind.NXN, port_count=8, atomic_bulk=True, settle_time_s=DELAY_S
)
DUPLEX8 = SwitchCapabilities(
    kind=SwitchKind.DUPLEX, port_count=8, atomic_bulk=True, settle_time_s=DELAY_S
)
INSTANT8 = SwitchCapabilities(  # no settle time: apply_bulk runs without the device lock
    kind=SwitchKind.NXN, port_count=8, atomic_bulk=True, settle_time_s=0.0
)


def xc(ingress: int, egress: int) -> CrossConnect:
    return CrossConnect(ingress, egress)


def world(
    t: ManualTime,
    caps: SwitchCapabilities = NXN8,
    initial: frozenset[CrossConnect] = frozenset(),
    switch_id: str = "ocs-a",
) -> tuple[EmulatedFabricDevices, EmulatedOcs]:
    devices = EmulatedFabricDevices(clock=t.clock, sleep=t.sleep)
    ocs = devices.add(
        EmulatedOcs(switch_id, caps, cross_connects=initial, clock=t.clock, sleep=t.sleep)
    )
    return devices, ocs


async def opened(devices: EmulatedFabricDevices, switch_id: str = "ocs-a") -> EmulatedDriver:
    driver = EmulatedDriver(switch_id, devices)
    await driver.open()
    return driver


# --- rules ---------------------------------------------------------------------------------------


async def test_driver_satisfies_protocol() -> None:
    devices, _ = world(ManualTime())
    driver = await opened(devices)
    assert isinstance(driver, Driver)
    info = await driver.info()
    assert info.switch_id == "ocs-a"
    assert info.capabilities == NXN8


@pytest.mark.parametrize(
    ("caps", "bad", "port"),
    [
        (NXN8, xc(9, 10), 9),  # ingress on the egress side (Polatis: egress is N+1..2N)
        (NXN8, xc(1, 2), 2),  # egress on the ingress side
        (NXN8, xc(1, 17), 17),  # no such port
        (DUPLEX8, xc(3, 2), 3),  # duplex stored with ingress < egress
        (DUPLEX8, xc(1, 9), 9),
    ],
)
async def test_wrong_side_or_unknown_port_is_invalid(
    caps: SwitchCapabilities, bad: CrossConnect, port: int
) -> None:
    _, ocs = world(ManualTime(), caps)
    with pytest.raises(InvalidPort) as info:
        await ocs.apply_bulk((), [bad])
    assert info.value.port == port
    assert ocs.cross_connects == frozenset()
    assert ocs.change_log == []


async def test_conflict_rejected_and_nothing_changed() -> None:
    t = ManualTime()
    _, ocs = world(t, initial=frozenset({xc(1, 9), xc(2, 10)}))
    # a valid break in the same batch is not applied either: the batch is atomic on rejection
    with pytest.raises(CrossConnectConflict) as info:
        await ocs.apply_bulk([xc(2, 10)], [xc(3, 9)])
    assert info.value.wanted == xc(3, 9)
    assert info.value.existing == xc(1, 9)
    with pytest.raises(CrossConnectConflict):
        await ocs.apply_bulk((), [xc(3, 11), xc(4, 11)])  # two makes on one egress
    with pytest.raises(InvalidPort):
        await ocs.apply_bulk([xc(3, 11)], ())  # nothing to break
    assert ocs.cross_connects == {xc(1, 9), xc(2, 10)}
    assert ocs.change_log == []
    assert t.sleeps == []


async def test_driver_rejects_a_target_that_is_not_a_partial_permutation() -> None:
    devices, ocs = world(ManualTime(), initial=frozenset({xc(1, 9)}))
    driver = await opened(devices)
    with pytest.raises(CrossConnectConflict):
        await driver.apply(frozenset({xc(1, 9), xc(2, 9)}), frozenset({1, 2, 9}))
    assert ocs.cross_connects == {xc(1, 9)}
    assert ocs.change_log == []


async def test_swap_in_one_batch_breaks_before_making() -> None:
    t = ManualTime()
    devices, ocs = world(t, initial=frozenset({xc(1, 9), xc(2, 10)}))
    driver = await opened(devices)
    result = await driver.apply(frozenset({xc(1, 10), xc(2, 9)}), frozenset({1, 2, 9, 10}))
    assert result.ok
    assert set(result.removed) == {xc(1, 9), xc(2, 10)}
    assert set(result.added) == {xc(1, 10), xc(2, 9)}
    assert ocs.cross_connects == {xc(1, 10), xc(2, 9)}


# --- delay, change log, power --------------------------------------------------------------------


async def test_delay_honoured_and_change_log_stamped() -> None:
    t = ManualTime(start_s=100.0)
    devices, ocs = world(t, initial=frozenset({xc(1, 9)}))
    driver = await opened(devices)
    result = await driver.apply(frozenset({xc(1, 10), xc(2, 9)}), frozenset({1, 2, 9, 10}))
    assert result.removed == (xc(1, 9),)
    assert result.added == (xc(1, 10), xc(2, 9))
    assert t.sleeps == [DELAY_S]  # one settle per batch
    assert ocs.change_log == [
        ChangeRecord(100.0, "ocs-a", ChangeAction.BREAK, xc(1, 9)),
        ChangeRecord(100.0 + DELAY_S, "ocs-a", ChangeAction.MAKE, xc(1, 10)),
        ChangeRecord(100.0 + DELAY_S, "ocs-a", ChangeAction.MAKE, xc(2, 9)),
    ]


async def test_power_drops_while_switching() -> None:
    t = ManualTime(auto=False)
    devices, ocs = world(t, initial=frozenset({xc(1, 9), xc(3, 11)}))
    driver = await opened(devices)
    before = await driver.get_power([1, 9, 3, 11, 2])
    assert before == {
        1: CONNECTED_POWER_DBM, 9: CONNECTED_POWER_DBM,
        3: CONNECTED_POWER_DBM, 11: CONNECTED_POWER_DBM,
        2: NO_LIGHT_DBM,
    }
    task = asyncio.create_task(driver.apply(frozenset({xc(2, 9)}), frozenset({1, 2, 9})))
    await t.wait_sleepers(1)  # the batch is settling
    during = await driver.get_power([1, 2, 9, 3, 11])
    assert during == {
        1: NO_LIGHT_DBM, 2: NO_LIGHT_DBM, 9: NO_LIGHT_DBM,
        3: CONNECTED_POWER_DBM, 11: CONNECTED_POWER_DBM,
    }
    assert ocs.change_log[-1].action is ChangeAction.BREAK
    await t.advance(DELAY_S)
    await asyncio.wait_for(task, timeout=2.0)
    after = await driver.get_power([1, 2, 9])
    assert after == {1: NO_LIGHT_DBM, 2: CONNECTED_POWER_DBM, 9: CONNECTED_POWER_DBM}
    status = {s.port: s for s in await driver.get_port_status([1, 2, 9])}
    assert status[2].oper is PortOper.UP
    assert status[1].oper is PortOper.DOWN


async def test_disabled_port_is_dark() -> None:
    devices, _ = world(ManualTime(), initial=frozenset({xc(1, 9)}))
    driver = await opened(devices)
    await driver.set_port_admin(9, PortAdmin.DISABLED)
    assert await driver.get_power([1, 9]) == {1: NO_LIGHT_DBM, 9: NO_LIGHT_DBM}
    [status] = await driver.get_port_status([9])
    assert status.admin is PortAdmin.DISABLED
    with pytest.raises(InvalidPort):
        await driver.get_power([99])


# --- the driver's port scope ---------------------------------------------------------------------


async def test_ports_outside_the_given_ports_are_untouched() -> None:
    t = ManualTime()
    devices, ocs = world(t, initial=frozenset({xc(1, 9), xc(2, 10), xc(4, 12)}))
    driver = await opened(devices)
    result = await driver.apply(frozenset({xc(1, 10)}), frozenset({1, 2, 9, 10}))
    assert set(result.removed) == {xc(1, 9), xc(2, 10)}
    assert result.added == (xc(1, 10),)
    assert xc(4, 12) in ocs.cross_connects
    assert all(r.cross_connect != xc(4, 12) for r in ocs.change_log)


async def test_target_outside_ports_or_straddling_cross_connect_is_invalid() -> None:
    devices, ocs = world(ManualTime(), initial=frozenset({xc(3, 11)}))
    driver = await opened(devices)
    with pytest.raises(InvalidPort) as info:
        await driver.apply(frozenset({xc(1, 10)}), frozenset({1, 9}))
    assert info.value.port == 10
    # 3->11 uses port 3 (given) and 11 (not given): breaking it would touch port 11
    with pytest.raises(InvalidPort) as info:
        await driver.apply(frozenset(), frozenset({3}))
    assert info.value.port == 11
    with pytest.raises(InvalidPort):
        await driver.apply(frozenset(), frozenset({42}))
    assert ocs.cross_connects == {xc(3, 11)}


async def test_nothing_to_do_issues_no_device_command() -> None:
    devices, ocs = world(ManualTime(), initial=frozenset({xc(1, 9)}))
    driver = await opened(devices)
    count = ocs.command_count
    result = await driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    assert result.ok and not result.added and not result.removed
    assert ocs.command_count == count


async def test_replace_breaks_and_remakes_everything_on_the_ports() -> None:
    devices, ocs = world(ManualTime(), initial=frozenset({xc(1, 9), xc(2, 10)}))
    driver = await opened(devices)
    result = await driver.apply(
        frozenset({xc(1, 9)}), frozenset({1, 2, 9, 10}), ApplyMode.REPLACE
    )
    assert set(result.removed) == {xc(1, 9), xc(2, 10)}
    assert result.added == (xc(1, 9),)
    assert ocs.cross_connects == {xc(1, 9)}


async def test_duplex_minimal_diff() -> None:
    devices, ocs = world(ManualTime(), DUPLEX8, frozenset({xc(1, 2), xc(3, 4), xc(7, 8)}))
    driver = await opened(devices)
    result = await driver.apply(
        frozenset({xc(1, 2), xc(3, 5), xc(4, 6)}), frozenset({1, 2, 3, 4, 5, 6})
    )
    assert result.removed == (xc(3, 4),)
    assert result.added == (xc(3, 5), xc(4, 6))
    assert ocs.cross_connects == {xc(1, 2), xc(3, 5), xc(4, 6), xc(7, 8)}


async def test_max_batch_splits_breaks_then_makes() -> None:
    t = ManualTime()
    caps = SwitchCapabilities(
        kind=SwitchKind.NXN, port_count=8, atomic_bulk=False, settle_time_s=DELAY_S, max_batch=2
    )
    devices, ocs = world(t, caps, frozenset({xc(1, 9), xc(2, 10)}))
    driver = await opened(devices)
    result = await driver.apply(
        frozenset({xc(1, 10), xc(2, 9), xc(3, 11)}), frozenset({1, 2, 3, 9, 10, 11})
    )
    assert result.ok
    assert set(result.added) == {xc(1, 10), xc(2, 9), xc(3, 11)}
    actions = [r.action for r in ocs.change_log]
    assert actions == [ChangeAction.BREAK] * 2 + [ChangeAction.MAKE] * 3
    assert t.sleeps == [DELAY_S, DELAY_S]  # two make chunks, each settles


async def test_max_batch_partial_failure_reports_later_chunks_not_attempted() -> None:
    caps = SwitchCapabilities(
        kind=SwitchKind.NXN, port_count=8, atomic_bulk=False, settle_time_s=DELAY_S, max_batch=2
    )
    devices, ocs = world(ManualTime(), caps, frozenset({xc(1, 9)}))
    driver = await opened(devices)
    ocs.fail_make(2)  # the first chunk of makes is 1->10, 2->11: its second make fails
    target = frozenset({xc(1, 10), xc(2, 11), xc(3, 12), xc(4, 13)})
    with pytest.raises(PartialApply) as info:
        await driver.apply(target, frozenset({1, 2, 3, 4, 9, 10, 11, 12, 13}))
    result = info.value.result
    assert result.removed == (xc(1, 9),)
    assert result.added == (xc(1, 10),)
    assert set(result.failed) == {xc(2, 11), xc(3, 12), xc(4, 13)}
    assert ocs.cross_connects == {xc(1, 10)}


async def test_duplicate_break_is_rejected() -> None:
    _, ocs = world(ManualTime(), initial=frozenset({xc(1, 9)}))
    with pytest.raises(InvalidPort):
        await ocs.apply_bulk([xc(1, 9), xc(1, 9)], ())
    assert ocs.cross_connects == {xc(1, 9)}


# --- faults --------------------------------------------------------------------------------------


async def test_unreachable_device_fails_every_call() -> None:
    devices, ocs = world(ManualTime(), initial=frozenset({xc(1, 9)}))
    driver = await opened(devices)
    ocs.set_unreachable(True)
    with pytest.raises(DeviceUnreachable):
        await driver.info()
    with pytest.raises(DeviceUnreachable):
        await driver.get_cross_connects()
    with pytest.raises(DeviceUnreachable):
        await driver.apply(frozenset(), frozenset({1, 9}))
    with pytest.raises(DeviceUnreachable):
        await driver.get_power()
    with pytest.raises(DeviceUnreachable):
        await driver.get_port_status()
    with pytest.raises(DeviceUnreachable):
        await driver.set_port_admin(1, PortAdmin.DISABLED)
    with pytest.raises(DeviceUnreachable):
        await EmulatedDriver("ocs-a", devices).open()
    assert ocs.cross_connects == {xc(1, 9)}
    ocs.set_unreachable(False)
    assert await driver.get_cross_connects() == {xc(1, 9)}


async def test_transient_drop_and_unknown_device() -> None:
    devices, ocs = world(ManualTime())
    driver = await opened(devices)
    ocs.drop_next_calls(1)
    with pytest.raises(DeviceUnreachable) as info:
        await driver.get_cross_connects()
    assert info.value.retryable
    assert await driver.get_cross_connects() == frozenset()
    with pytest.raises(DeviceUnreachable):
        await EmulatedDriver("nope", devices).open()
    with pytest.raises(DeviceUnreachable):
        await EmulatedDriver("ocs-a", devices).get_cross_connects()  # not opened


async def test_slow_device_adds_delay() -> None:
    t = ManualTime(start_s=0.0)
    devices, ocs = world(t)
    driver = await opened(devices)
    ocs.set_extra_delay(0.5)
    await driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    # the apply (delay, settle), then the read-back of the changed ports (delay)
    assert t.sleeps == [0.5, DELAY_S, 0.5]
    assert ocs.change_log == [ChangeRecord(0.5 + DELAY_S, "ocs-a", ChangeAction.MAKE, xc(1, 9))]


@pytest.mark.parametrize(
    ("kind", "error"),
    [(DenialKind.HARDWARE_FAULT, HardwareFault), (DenialKind.INVALID_PORT, InvalidPort)],
)
async def test_denied_port_rejects_the_batch(
    kind: DenialKind, error: type[Exception]
) -> None:
    devices, ocs = world(ManualTime(), initial=frozenset({xc(1, 9)}))
    driver = await opened(devices)
    ocs.deny_port(10, kind, "laser safety lockout")
    with pytest.raises(error, match="laser safety lockout"):
        await driver.apply(frozenset({xc(1, 10)}), frozenset({1, 9, 10}))
    assert ocs.cross_connects == {xc(1, 9)}
    assert ocs.change_log == []
    ocs.allow_port(10)
    await driver.apply(frozenset({xc(1, 10)}), frozenset({1, 9, 10}))
    assert ocs.cross_connects == {xc(1, 10)}


@pytest.mark.parametrize(("caps", "make_at_s"), [(NXN8, DELAY_S), (INSTANT8, 0.0)],
                         ids=["settled", "instant"])
async def test_partial_apply_reports_what_did_and_did_not_apply(
    caps: SwitchCapabilities, make_at_s: float
) -> None:
    """Alike on a switch that settles (under the device lock) and on one without a settle time
    (``apply_bulk`` without the lock): the make is logged when light passes."""
    t = ManualTime(start_s=0.0)
    devices, ocs = world(t, caps=caps, initial=frozenset({xc(1, 9), xc(5, 13)}))
    driver = await opened(devices)
    ocs.fail_make(2, "mirror did not latch")
    target = frozenset({xc(1, 10), xc(2, 11), xc(3, 12)})
    with pytest.raises(PartialApply) as info:
        await driver.apply(target, frozenset({1, 2, 3, 9, 10, 11, 12}))
    result = info.value.result
    assert info.value.retryable
    assert result.removed == (xc(1, 9),)
    assert result.added == (xc(1, 10),)
    assert set(result.failed) == {xc(2, 11), xc(3, 12)}
    assert result.failed[xc(2, 11)] == "mirror did not latch"
    assert result.failed[xc(3, 12)].startswith("not attempted")
    assert ocs.cross_connects == {xc(1, 10), xc(5, 13)}
    assert ocs.change_log == [
        ChangeRecord(0.0, "ocs-a", ChangeAction.BREAK, xc(1, 9)),
        ChangeRecord(make_at_s, "ocs-a", ChangeAction.MAKE, xc(1, 10)),
    ]
    # one-shot: the retry finishes the job
    retry = await driver.apply(target, frozenset({1, 2, 3, 9, 10, 11, 12}))
    assert retry.added == (xc(2, 11), xc(3, 12))
    assert ocs.cross_connects == target | {xc(5, 13)}


@pytest.mark.parametrize("caps", [NXN8, INSTANT8], ids=["settled", "instant"])
async def test_silent_make_only_shows_on_read_back(caps: SwitchCapabilities) -> None:
    """The device acknowledges a make it did not do; the driver's read-back of the ports it
    changed catches it (as TL1's and RESTCONF's do), with or without a settle time."""
    devices, ocs = world(ManualTime(), caps=caps)
    driver = await opened(devices)
    ocs.drop_makes_silently(10)
    with pytest.raises(VerificationMismatch) as info:
        await driver.apply(frozenset({xc(1, 9), xc(2, 10)}), frozenset({1, 2, 9, 10}))
    assert info.value.missing == (xc(2, 10),) and info.value.unexpected == ()
    assert await driver.get_cross_connects() == {xc(1, 9)}  # acknowledged, but not made
    assert [r.cross_connect for r in ocs.change_log] == [xc(1, 9)]


async def test_apply_reads_back_only_the_ports_it_changed() -> None:
    devices, ocs = world(ManualTime(), initial=frozenset({xc(1, 9), xc(3, 11)}))
    driver = await opened(devices)
    before = ocs.command_count
    result = await driver.apply(frozenset({xc(1, 10)}), frozenset({1, 9, 10}),
                                current=frozenset({xc(1, 9)}))
    assert result.verified and result.removed == (xc(1, 9),) and result.added == (xc(1, 10),)
    assert ocs.command_count - before == 2  # one bulk apply, one read of ports 1, 9, 10
    assert ocs.write_count == 1


async def next_alarm(alarms: AsyncIterator[DeviceAlarm]) -> DeviceAlarm:
    return await asyncio.wait_for(anext(alarms), timeout=2.0)


async def test_port_failure_raises_alarm_and_blocks_makes() -> None:
    t = ManualTime(start_s=7.0)
    devices, ocs = world(t, initial=frozenset({xc(1, 9)}))
    driver = await opened(devices)
    alarms = driver.events()
    ocs.fail_port(9, "LOS")
    alarm = await next_alarm(alarms)
    assert alarm == DeviceAlarm("ocs-a", 9, "LOS", AlarmSeverity.MAJOR, 7.0, "port 9 failed")
    assert await driver.get_power([1, 9]) == {1: NO_LIGHT_DBM, 9: NO_LIGHT_DBM}
    [status] = await driver.get_port_status([9])
    assert status.oper is PortOper.FAILED
    with pytest.raises(HardwareFault):
        await driver.apply(frozenset({xc(2, 9)}), frozenset({1, 2, 9}))
    assert ocs.cross_connects == {xc(1, 9)}
    ocs.repair_port(9)
    cleared = await next_alarm(alarms)
    assert cleared.severity is AlarmSeverity.CLEARED
    assert cleared.port == 9
    await driver.close()
    with pytest.raises(StopAsyncIteration):
        await next_alarm(alarms)


@pytest.mark.parametrize("keep", [True, False])
async def test_reboot_keeps_or_loses_cross_connects(keep: bool) -> None:
    t = ManualTime(start_s=0.0, auto=False)
    devices, ocs = world(t, initial=frozenset({xc(1, 9), xc(2, 10)}))
    driver = await opened(devices)
    alarms = driver.events()
    reboot = asyncio.create_task(ocs.reboot(keep_cross_connects=keep, down_s=30.0))
    await t.wait_sleepers(1)
    with pytest.raises(DeviceUnreachable):
        await driver.get_cross_connects()
    await t.advance(30.0)
    await asyncio.wait_for(reboot, timeout=2.0)
    start = await next_alarm(alarms)
    assert (start.condition, start.severity) == ("REBOOT", AlarmSeverity.WARNING)
    up = await next_alarm(alarms)
    assert (up.condition, up.severity) == ("REBOOT", AlarmSeverity.CLEARED)
    state = await driver.get_cross_connects()
    if keep:
        assert state == {xc(1, 9), xc(2, 10)}
        assert ocs.change_log == []
    else:
        assert state == frozenset()
        assert ocs.change_log == [  # the device's own doing, not a commanded break
            ChangeRecord(0.0, "ocs-a", ChangeAction.BREAK, xc(1, 9), commanded=False),
            ChangeRecord(0.0, "ocs-a", ChangeAction.BREAK, xc(2, 10), commanded=False),
        ]


# --- registry and device lifetime ----------------------------------------------------------------


def emulated_switch(
    switch_id: str, model: str = "emulated", **options: str | int | float | bool
) -> SwitchSpec:
    return SwitchSpec(switch_id=switch_id, model=model, capabilities=NXN8, options=options)


def emulated_registry(devices: EmulatedFabricDevices) -> DriverRegistry:
    registry = DriverRegistry()
    registry.register("emulated", emulated_factory(devices))
    return registry


async def test_device_state_outlives_the_driver() -> None:
    t = ManualTime()
    devices = EmulatedFabricDevices(clock=t.clock, sleep=t.sleep)
    first = emulated_registry(devices).create(emulated_switch("ocs-r0"))
    await first.open()
    await first.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    await first.close()
    second = make_driver(emulated_switch("ocs-r0"), devices)
    await second.open()
    assert await second.get_cross_connects() == {xc(1, 9)}
    assert list(devices) == ["ocs-r0"]


def test_registry_errors_name_switch_and_model() -> None:
    with pytest.raises(DriverConfigError, match=r"ocs-x.*'tl1-polatis'.*unknown driver model"):
        DriverRegistry().create(emulated_switch("ocs-x", "tl1-polatis"))
    # the emulator is not a built-in family: only a composition root registers it
    assert DriverRegistry().models == {"tl1", "restconf", "siph"}
    with pytest.raises(DriverConfigError, match=r"'emulated'.*unknown driver model"):
        DriverRegistry().create(emulated_switch("ocs-y"))
    registry = emulated_registry(EmulatedFabricDevices())
    assert "emulated" in registry.models
    with pytest.raises(ValueError, match="already registered"):
        registry.register("emulated", emulated_factory(EmulatedFabricDevices()))
    with pytest.raises(ValueError, match="already registered"):
        registry.register("tl1", emulated_factory(EmulatedFabricDevices()))


def test_an_option_on_an_emulated_switch_is_rejected_naming_the_switch_and_the_key() -> None:
    devices = EmulatedFabricDevices()
    with pytest.raises(DriverConfigError) as e:
        emulated_registry(devices).create(emulated_switch("ocs-e", timout_s=2))
    assert str(e.value).startswith("switches[ocs-e].options.timout_s (model 'emulated'): unknown")
    assert "got 2" in str(e.value)
    assert list(devices) == []  # rejected before a device was created
    devices = EmulatedFabricDevices()
    devices.ensure("ocs-z", NXN8)
    with pytest.raises(ValueError, match="capabilities"):
        devices.ensure("ocs-z", DUPLEX8)


async def test_partitioned_device_holds_commands_then_loses_them() -> None:
    """``set_partitioned``: commands wait without an answer (the caller's own timeout fires);
    when the partition ends they fail as unreachable and nothing they asked for happened."""
    _, ocs = world(ManualTime())
    ocs.set_partitioned(True)
    assert ocs.partitioned
    held = asyncio.ensure_future(ocs.apply_bulk((), [xc(1, 9)]))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(held), 0.05)
    assert not held.done()
    ocs.set_partitioned(False)
    with pytest.raises(DeviceUnreachable, match="silent partition"):
        await held
    assert ocs.cross_connects == frozenset()
    await ocs.apply_bulk((), [xc(1, 9)])  # answered again
    assert ocs.cross_connects == {xc(1, 9)}
    ocs.set_partitioned(True)
    ocs.clear_faults()
    assert not ocs.partitioned


# --- an instant switch (no settle time: apply_bulk runs without the lock) -------------------------



async def test_an_instant_switch_makes_light_pass_at_once_and_logs_breaks_before_makes() -> None:
    t = ManualTime(start_s=5.0)
    devices, ocs = world(t, caps=INSTANT8, initial=frozenset({xc(1, 9), xc(2, 10)}))
    driver = await opened(devices)
    result = await driver.apply(frozenset({xc(1, 10), xc(2, 9)}), frozenset({1, 2, 9, 10}))
    assert result.verified
    assert result.removed == (xc(1, 9), xc(2, 10)) and result.added == (xc(1, 10), xc(2, 9))
    assert ocs.cross_connects == {xc(1, 10), xc(2, 9)}
    assert ocs.change_log == [
        ChangeRecord(5.0, "ocs-a", ChangeAction.BREAK, xc(1, 9)),
        ChangeRecord(5.0, "ocs-a", ChangeAction.BREAK, xc(2, 10)),
        ChangeRecord(5.0, "ocs-a", ChangeAction.MAKE, xc(1, 10)),
        ChangeRecord(5.0, "ocs-a", ChangeAction.MAKE, xc(2, 9)),
    ]
    # no port is left dark: light passes as soon as the command returns
    assert await driver.get_power([1, 2, 9, 10]) == dict.fromkeys([1, 2, 9, 10],
                                                                  CONNECTED_POWER_DBM)
    assert ocs.write_count == 1


async def test_an_instant_switch_rejects_a_bad_batch_whole() -> None:
    devices, ocs = world(ManualTime(), caps=INSTANT8, initial=frozenset({xc(1, 9)}))
    await opened(devices)
    with pytest.raises(CrossConnectConflict):
        await ocs.apply_bulk([], [xc(2, 9)])  # port 9 is taken by 1->9
    with pytest.raises(InvalidPort):
        await ocs.apply_bulk([xc(3, 11)], [])  # no such cross-connect to break
    assert ocs.cross_connects == {xc(1, 9)} and ocs.change_log == []


async def test_a_command_waits_for_a_reboot_in_progress_on_an_instant_switch() -> None:
    """The lock-free path is taken only while no command holds the lock: a reboot that holds
    it makes the device unreachable, and an apply after it sees the device back."""
    t = ManualTime(start_s=0.0)
    devices, ocs = world(t, caps=INSTANT8, initial=frozenset({xc(1, 9)}))
    driver = await opened(devices)
    reboot = asyncio.create_task(ocs.reboot(keep_cross_connects=False, down_s=1.0))
    await asyncio.sleep(0)
    with pytest.raises(DeviceUnreachable):
        await driver.apply(frozenset({xc(2, 10)}), frozenset({2, 10}))
    await t.advance(1.0)
    await reboot
    result = await driver.apply(frozenset({xc(2, 10)}), frozenset({2, 10}))
    assert result.added == (xc(2, 10),)
    assert ocs.cross_connects == {xc(2, 10)}
    assert [(r.action, r.cross_connect, r.commanded) for r in ocs.change_log] == [
        (ChangeAction.BREAK, xc(1, 9), False), (ChangeAction.MAKE, xc(2, 10), True)]
