"""The emulator's fault-injection control API over real sockets: every fault is visible through
a driver (RESTCONF over sockets, or the in-process one) or on the device, and bad input is
refused with 400 naming the field and the value.

No sleeps wait for events: reboots are gated by the test and watched through device alarms."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
import pytest_asyncio

from lightrail.drivers.base import (
    AlarmSeverity,
    CrossConnect,
    DeviceAlarm,
    DeviceTimeout,
    DeviceUnreachable,
    HardwareFault,
    InvalidPort,
    PartialApply,
    PortOper,
    SwitchCapabilities,
    SwitchKind,
    SwitchSpec,
    VerificationMismatch,
)
from lightrail.drivers.options import DriverContext
from lightrail.drivers.restconf.driver import RestconfDriver, make_driver
from lightrail.emulator.control import ControlApiError, ControlClient, ControlServer
from lightrail.emulator.driver import EmulatedDriver
from lightrail.emulator.ocs import EmulatedFabricDevices, EmulatedOcs
from lightrail.emulator.servers.restconf import RestconfServer

USER = "operator"
PASSWORD = "pa55word"
DELAY_S = 0.002
REBOOT_DOWN_S = 987.0  # the gated sleep waits for the test instead of this long
NXN8 = SwitchCapabilities(kind=SwitchKind.NXN, port_count=8, atomic_bulk=True,
                          settle_time_s=DELAY_S)


def xc(ingress: int, egress: int) -> CrossConnect:
    return CrossConnect(ingress, egress)


class RebootGate:
    """Device ``sleep``: a reboot's down time waits for ``released``; settles really sleep."""

    def __init__(self) -> None:
        self.released = asyncio.Event()

    async def sleep(self, delay_s: float) -> None:
        if delay_s == REBOOT_DOWN_S:
            await self.released.wait()
        else:
            await asyncio.sleep(delay_s)


@dataclass
class World:
    devices: EmulatedFabricDevices
    rc_device: EmulatedOcs
    server: RestconfServer
    control: ControlClient
    rc: RestconfDriver
    local: EmulatedDriver
    gate: RebootGate


@pytest_asyncio.fixture
async def world() -> AsyncIterator[World]:
    gate = RebootGate()
    devices = EmulatedFabricDevices(sleep=gate.sleep)
    rc_device = devices.ensure("ocs-rc", NXN8)
    devices.ensure("ocs-local", NXN8)
    async with (
        RestconfServer(rc_device, username=USER, password=PASSWORD) as server,
        ControlServer(devices) as api,
        ControlClient(api.url) as control,
    ):
        options: dict[str, str | int | float | bool] = {
            "host": "127.0.0.1", "port": server.port, "username": USER, "password": PASSWORD,
            "timeout_s": 2.0, "alarm_poll_interval_s": 0.01,
        }
        rc = make_driver(SwitchSpec("ocs-rc", "restconf", NXN8, options), DriverContext())
        assert isinstance(rc, RestconfDriver)
        await rc.open()
        local = EmulatedDriver("ocs-local", devices)
        await local.open()
        try:
            yield World(devices, rc_device, server, control, rc, local, gate)
        finally:
            await rc.close()
            await local.close()


async def next_alarm(alarms: AsyncIterator[DeviceAlarm]) -> DeviceAlarm:
    return await asyncio.wait_for(anext(alarms), timeout=5.0)


# --- inspection ----------------------------------------------------------------------------------


async def test_list_and_show_devices(world: World) -> None:
    await world.rc.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    listed = await world.control.devices()
    assert [d.switch_id for d in listed] == ["ocs-local", "ocs-rc"]
    assert all(d.kind is SwitchKind.NXN and d.port_count == 8 for d in listed)
    assert listed[1].cross_connect_count == 1 and listed[1].cross_connects is None
    shown = await world.control.device("ocs-rc")
    assert shown.cross_connects == frozenset({xc(1, 9)})
    assert shown.change_count == 1 and shown.command_count > 0
    assert not shown.rebooting and shown.injected == ()


# --- each fault, seen through a driver or the device --------------------------------------------


async def test_unreachable_on_and_off(world: World) -> None:
    await world.control.set_unreachable("ocs-rc", True)
    with pytest.raises(DeviceUnreachable):
        await world.rc.get_cross_connects()
    await world.control.set_unreachable("ocs-rc", False)
    assert await world.rc.get_cross_connects() == frozenset()
    state = await world.control.device("ocs-rc")
    assert [i["on"] for i in state.injected] == [True, False]


async def test_drop_next_calls(world: World) -> None:
    await world.control.inject("ocs-local", {"fault": "drop_next_calls", "count": 1})
    with pytest.raises(DeviceUnreachable):
        await world.local.get_cross_connects()
    assert await world.local.get_cross_connects() == frozenset()


async def test_slow_device_makes_the_driver_time_out(world: World) -> None:
    options: dict[str, str | int | float | bool] = {
        "host": "127.0.0.1", "port": world.server.port, "username": USER,
        "password": PASSWORD, "timeout_s": 0.05,
    }
    impatient = make_driver(SwitchSpec("ocs-rc", "restconf", NXN8, options), DriverContext())
    await impatient.open()
    await world.control.set_slow("ocs-rc", 0.3)
    with pytest.raises(DeviceTimeout):
        await impatient.get_cross_connects()
    await world.control.set_slow("ocs-rc", 0.0)
    assert await impatient.get_cross_connects() == frozenset()
    await impatient.close()


async def test_deny_port_then_allow(world: World) -> None:
    await world.control.deny_port("ocs-rc", 10, reason="shutter jammed")
    with pytest.raises(HardwareFault, match="shutter jammed"):
        await world.rc.apply(frozenset({xc(1, 10)}), frozenset({1, 10}))
    await world.control.deny_port("ocs-local", 11, kind="invalid_port", reason="not fitted")
    with pytest.raises(InvalidPort) as info:
        await world.local.apply(frozenset({xc(2, 11)}), frozenset({2, 11}))
    assert info.value.port == 11
    await world.control.inject("ocs-rc", {"fault": "allow_port", "port": 10})
    await world.rc.apply(frozenset({xc(1, 10)}), frozenset({1, 10}))
    assert world.rc_device.cross_connects == {xc(1, 10)}


async def test_partial_apply_fails_the_kth_make(world: World) -> None:
    await world.control.fail_make("ocs-rc", 2, reason="mirror did not latch")
    target = frozenset({xc(1, 9), xc(2, 10), xc(3, 11)})
    with pytest.raises(PartialApply) as info:
        await world.rc.apply(target, frozenset({1, 2, 3, 9, 10, 11}))
    assert info.value.result.added == (xc(1, 9),)
    assert info.value.result.failed[xc(2, 10)] == "mirror did not latch"
    assert world.rc_device.cross_connects == {xc(1, 9)}


async def test_silent_makes_show_on_read_back(world: World) -> None:
    await world.control.inject("ocs-rc", {"fault": "silent_makes", "port": 9})
    with pytest.raises(VerificationMismatch) as info:
        await world.rc.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    assert info.value.missing == (xc(1, 9),)


async def test_port_failure_raises_an_alarm_and_repair_clears_it(world: World) -> None:
    alarms = world.rc.events()
    await world.control.fail_port("ocs-rc", 12, condition="LOS")
    alarm = await next_alarm(alarms)
    assert (alarm.port, alarm.condition, alarm.severity) == (12, "LOS", AlarmSeverity.MAJOR)
    [status] = await world.rc.get_port_status([12])
    assert status.oper is PortOper.FAILED
    await world.control.inject("ocs-rc", {"fault": "repair_port", "port": 12})
    cleared = await next_alarm(alarms)
    assert (cleared.port, cleared.severity) == (12, AlarmSeverity.CLEARED)


@pytest.mark.parametrize("keep", [True, False])
async def test_reboot_keeps_or_loses_cross_connects(world: World, keep: bool) -> None:
    await world.rc.apply(frozenset({xc(1, 9), xc(2, 10)}), frozenset({1, 2, 9, 10}))
    watch = world.rc_device.alarms()
    answer = await world.control.reboot("ocs-rc", keep_cross_connects=keep,
                                        down_s=REBOOT_DOWN_S)
    assert answer["applied"] == {"fault": "reboot", "keep_cross_connects": keep,
                                 "down_s": REBOOT_DOWN_S}
    assert (await world.control.device("ocs-rc")).rebooting  # down when the answer came
    with pytest.raises(DeviceUnreachable):
        await world.rc.get_cross_connects()
    with pytest.raises(ControlApiError) as busy:
        await world.control.reboot("ocs-rc", keep_cross_connects=True)
    assert busy.value.status == 409
    world.gate.released.set()
    while (await next_alarm(watch)).severity is not AlarmSeverity.CLEARED:
        pass
    await watch.aclose()
    expected = frozenset({xc(1, 9), xc(2, 10)}) if keep else frozenset()
    assert await world.rc.get_cross_connects() == expected
    assert (await world.control.device("ocs-rc")).cross_connects == expected


async def test_clear_removes_every_fault(world: World) -> None:
    await world.control.set_unreachable("ocs-rc", True)
    await world.control.deny_port("ocs-rc", 9)
    await world.control.fail_port("ocs-rc", 10)
    await world.control.set_slow("ocs-rc", 0.01)
    assert len((await world.control.device("ocs-rc")).injected) == 4
    await world.control.clear("ocs-rc")
    await world.rc.apply(frozenset({xc(1, 9), xc(2, 10)}), frozenset({1, 2, 9, 10}))
    state = await world.control.device("ocs-rc")
    assert state.cross_connects == frozenset({xc(1, 9), xc(2, 10)})
    assert state.injected == ()
    await world.control.inject("ocs-rc", {"fault": "unreachable", "on": True})
    await world.control.inject("ocs-rc", {"fault": "clear"})
    assert await world.rc.get_cross_connects() == {xc(1, 9), xc(2, 10)}


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "value"),
    [
        ({"fault": "explode"}, "fault", "explode"),
        ({}, "fault", None),
        ({"fault": "unreachable"}, "on", None),
        ({"fault": "unreachable", "on": "yes"}, "on", "yes"),
        ({"fault": "unreachable", "on": True, "colour": "red"}, "colour", "red"),
        ({"fault": "slow", "delay_s": -1}, "delay_s", -1),
        ({"fault": "slow", "delay_s": "fast"}, "delay_s", "fast"),
        ({"fault": "deny_port", "port": 99}, "port", 99),
        ({"fault": "deny_port", "port": 0}, "port", 0),
        ({"fault": "deny_port", "port": 3.5}, "port", 3.5),
        ({"fault": "deny_port", "port": True}, "port", True),
        ({"fault": "deny_port", "port": 3, "kind": "mystery"}, "kind", "mystery"),
        ({"fault": "partial_apply", "nth": 0}, "nth", 0),
        ({"fault": "fail_port", "port": 3, "condition": ""}, "condition", ""),
        ({"fault": "reboot", "keep_cross_connects": 1}, "keep_cross_connects", 1),
        ({"fault": "reboot", "keep_cross_connects": True, "down_s": -2}, "down_s", -2),
        ({"fault": "drop_next_calls", "count": -1}, "count", -1),
        (["unreachable"], "body", ["unreachable"]),
    ],
)
async def test_bad_fault_is_400_naming_field_and_value(
    world: World, body: object, field: str, value: object
) -> None:
    before = await world.control.device("ocs-rc")
    async with aiohttp.ClientSession() as session, session.post(
        f"{world.control.url}/devices/ocs-rc/faults", json=body
    ) as response:
        assert response.status == 400
        answer = await response.json()
    assert answer["field"] == field
    assert answer["value"] == value
    assert answer["error"].startswith(f"{field}: ")
    if value is not None:
        assert repr(value) in answer["error"] or str(value) in answer["error"]
    after = await world.control.device("ocs-rc")
    assert after.injected == before.injected  # nothing was applied


async def test_bad_json_unknown_device_and_client_errors(world: World) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{world.control.url}/devices/ocs-rc/faults", data=b"{not json"
        ) as response:
            assert response.status == 400
            assert (await response.json())["field"] == "body"
        async with session.get(f"{world.control.url}/devices/ocs-nope") as response:
            assert response.status == 404
            answer = await response.json()
            assert (answer["field"], answer["value"]) == ("id", "ocs-nope")
    with pytest.raises(ControlApiError) as info:
        await world.control.deny_port("ocs-rc", 17)
    assert (info.value.status, info.value.field, info.value.value) == (400, "port", 17)
    with pytest.raises(ControlApiError) as missing:
        await world.control.clear("ocs-nope")
    assert missing.value.status == 404
