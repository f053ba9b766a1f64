"""Device metrics against emulated switches on a manual clock: reachability
(``lightrail_switch_up``) from applies, read-backs and the power poll, and the power poll
(``lightrail_port_power_dbm``) of the ports in use, whose failures leave the phase path alone."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from lightrail.controller.runtime.metrics import REGISTRY
from lightrail.controller.runtime.power import PowerPoller
from lightrail.controller.runtime.reconciler import NOOP, Reconciler, RetryPolicy
from lightrail.drivers.base import (
    CrossConnect,
    DeviceUnreachable,
    Driver,
    SwitchCapabilities,
    SwitchKind,
)
from lightrail.emulator.driver import EmulatedDriver
from lightrail.emulator.ocs import (
    CONNECTED_POWER_DBM,
    NO_LIGHT_DBM,
    EmulatedFabricDevices,
    EmulatedOcs,
)
from tests.manual_time import ManualTime

NXN8 = SwitchCapabilities(kind=SwitchKind.NXN, port_count=8, atomic_bulk=True,
                          settle_time_s=0.01)
ONE_TRY = RetryPolicy(max_attempts=1)
_ids = itertools.count()


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def power(sid: str, port: int) -> float | None:
    return sample("lightrail_port_power_dbm", switch=sid, port=str(port))


def errors(sid: str, error: str) -> float:
    return sample("lightrail_device_errors_total", switch=sid, error=error) or 0.0


@asynccontextmanager
async def world(count: int = 2) -> AsyncIterator[tuple[list[str], EmulatedFabricDevices,
                                                        dict[str, Driver], Reconciler]]:
    """``count`` emulated 8x8 switches (ids unique in the process: the registry is shared),
    open drivers and a running reconciler on one manual clock."""
    t = ManualTime()
    devices = EmulatedFabricDevices(clock=t.clock, sleep=t.sleep)
    sids = [f"pw{next(_ids)}" for _ in range(count)]
    drivers: dict[str, Driver] = {}
    for sid in sids:
        devices.add(EmulatedOcs(sid, NXN8, clock=t.clock, sleep=t.sleep))
        drivers[sid] = EmulatedDriver(sid, devices)
        await drivers[sid].open()
    rec = Reconciler(drivers, retry=ONE_TRY, clock=t.clock, sleep=t.backoff)
    async with asyncio.TaskGroup() as tg:
        rec.start(tg)
        try:
            yield sids, devices, drivers, rec
        finally:
            await rec.stop(timeout_s=2.0)


PORTS = frozenset({1, 2, 3, 9, 10, 11})
PAIR = frozenset({CrossConnect(1, 10), CrossConnect(2, 9)})


async def test_reachability_follows_applies_and_read_backs() -> None:
    async with world(1) as ([sid], devices, _, rec):
        assert sample("lightrail_switch_up", switch=sid) == 0.0  # no contact yet
        await rec.read_back(sid)
        assert sample("lightrail_switch_up", switch=sid) == 1.0
        devices[sid].set_unreachable(True)
        with pytest.raises(DeviceUnreachable):
            await rec.reconcile(sid, PORTS, PAIR)
        assert sample("lightrail_switch_up", switch=sid) == 0.0
        with pytest.raises(DeviceUnreachable):
            await rec.read_back(sid)
        assert sample("lightrail_switch_up", switch=sid) == 0.0
        devices[sid].set_unreachable(False)
        await rec.reconcile(sid, PORTS, PAIR)  # reads back first (stale), then applies
        assert sample("lightrail_switch_up", switch=sid) == 1.0


async def test_power_poll_exports_the_ports_in_use_only() -> None:
    async with world(2) as ([used, idle], devices, drivers, rec):
        await rec.read_back(idle)
        await rec.reconcile(used, PORTS, PAIR)
        poller = PowerPoller(drivers, rec, 1.0)
        await poller.poll_once()
        for port in (1, 2, 9, 10):
            assert power(used, port) == CONNECTED_POWER_DBM
        assert power(used, 3) is None and power(used, 11) is None  # dark, not in use
        assert poller.exported(idle) == frozenset()
        assert not [s for m in REGISTRY.collect() if m.name == "lightrail_port_power_dbm"
                    for s in m.samples if s.labels["switch"] == idle]
        # a port that fails goes dark: its reading is what an alert on power needs
        devices[used].fail_port(2)
        await poller.poll_once()
        assert power(used, 2) == NO_LIGHT_DBM
        # a cross-connect broken: its ports lose their series
        await rec.reconcile(used, PORTS, frozenset({CrossConnect(1, 10)}))
        await poller.poll_once()
        assert poller.exported(used) == frozenset({1, 10})
        assert power(used, 2) is None and power(used, 9) is None
        assert power(used, 1) == CONNECTED_POWER_DBM


async def test_a_failed_power_poll_leaves_the_phase_path_alone() -> None:
    async with world(1) as ([sid], devices, drivers, rec):
        await rec.reconcile(sid, PORTS, PAIR)
        poller = PowerPoller(drivers, rec, 1.0)
        await poller.poll_once()
        assert sample("lightrail_switch_up", switch=sid) == 1.0
        before = errors(sid, "DeviceUnreachable")
        devices[sid].set_unreachable(True)
        await poller.poll_once()
        assert sample("lightrail_switch_up", switch=sid) == 0.0
        assert errors(sid, "DeviceUnreachable") == before + 1
        assert poller.exported(sid) == frozenset() and power(sid, 1) is None  # no stale value
        # the view is still trusted: no read-back queued, a satisfied request is a no-op
        assert not rec.needs_read_back(sid)
        commands = devices[sid].command_count
        assert await rec.reconcile(sid, PORTS, PAIR) is NOOP
        assert devices[sid].command_count == commands
        devices[sid].set_unreachable(False)
        await poller.poll_once()
        assert sample("lightrail_switch_up", switch=sid) == 1.0
        assert power(sid, 10) == CONNECTED_POWER_DBM


async def test_a_fenced_poll_records_nothing() -> None:
    """A driver whose command gate refuses (the leader lease lost) raises NotLeader before
    sending: not a device error, not news of reachability."""
    t = ManualTime()
    devices = EmulatedFabricDevices(clock=t.clock, sleep=t.sleep)
    sid = f"pw{next(_ids)}"
    devices.add(EmulatedOcs(sid, NXN8, cross_connects=PAIR, clock=t.clock, sleep=t.sleep))
    leading = [True]
    driver = EmulatedDriver(sid, devices, command_gate=lambda: leading[0])
    await driver.open()
    rec = Reconciler({sid: driver}, retry=ONE_TRY, clock=t.clock, sleep=t.backoff)
    await rec.read_back(sid)
    poller = PowerPoller({sid: driver}, rec, 1.0)
    leading[0] = False
    await poller.poll_once()
    assert sample("lightrail_switch_up", switch=sid) == 1.0
    assert not [s for m in REGISTRY.collect() if m.name == "lightrail_device_errors"
                for s in m.samples if s.labels.get("switch") == sid]
    assert poller.exported(sid) == frozenset()


def test_the_poll_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval"):
        PowerPoller({}, Reconciler({}), 0.0)


async def test_a_failed_command_then_a_good_one_is_up_again() -> None:
    """A device error that is an answer (a denied port) degrades the switch; the next command it
    answers makes it up again and moves its last contact (issue 14's state rule)."""
    from lightrail.controller.runtime.switch_health import SwitchState, switch_state
    from lightrail.drivers.base import DriverError
    from lightrail.emulator.ocs import DenialKind

    def state(rec: Reconciler, sid: str) -> SwitchState:
        return switch_state(rec.contact_of(sid), maintenance=False, unreachable=False,
                            unknown_ports=False)

    async with world(1) as ([sid], devices, _, rec):
        await rec.read_back(sid)
        first = rec.contact_of(sid).last_ok_unix_s
        assert first is not None and state(rec, sid) is SwitchState.UP
        devices[sid].deny_port(1, DenialKind.HARDWARE_FAULT, "mirror stuck")
        with pytest.raises(DriverError):
            await rec.reconcile(sid, PORTS, PAIR)
        assert rec.contact_of(sid).reachable is True  # it answered: a refusal
        assert state(rec, sid) is SwitchState.DEGRADED
        devices[sid].allow_port(1)
        await rec.reconcile(sid, PORTS, PAIR)
        after = rec.contact_of(sid)
        assert after.last_ok_unix_s is not None and after.last_ok_unix_s >= first
        assert state(rec, sid) is SwitchState.UP
