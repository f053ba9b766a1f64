"""The RESTCONF driver against the emulated RESTCONF switch over real sockets: minimal-diff
apply and read-back, conflicts, idempotence, a full permutation in bulk, partial failure, power,
alarms, credentials, entity tags, restarts and a device that answers garbage or hangs up.

Every wait is on an event with a timeout; the only sleeps are the device's (small)
reconfiguration delay and the driver's alarm poll interval."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import pytest
import pytest_asyncio
import structlog

from lightrail.controller.runtime.reconciler import Reconciler, RetryPolicy
from lightrail.drivers.base import (
    AlarmSeverity,
    ApplyMode,
    AuthenticationFailed,
    CrossConnect,
    CrossConnectConflict,
    DeviceAlarm,
    DeviceTimeout,
    DeviceUnreachable,
    Driver,
    DriverError,
    HardwareFault,
    InvalidPort,
    PartialApply,
    PortAdmin,
    PortOper,
    ProtocolError,
    SwitchCapabilities,
    SwitchKind,
    SwitchSpec,
    VerificationMismatch,
)
from lightrail.drivers.options import DriverConfigError, DriverContext
from lightrail.drivers.registry import DriverRegistry
from lightrail.drivers.restconf.driver import (
    ConcurrentModification,
    RestconfDriver,
    make_driver,
)
from lightrail.drivers.restconf.options import RestconfOptions, resolve_credentials
from lightrail.drivers.restconf.wire import error_for_answer
from lightrail.emulator.ocs import (
    CONNECTED_POWER_DBM,
    NO_LIGHT_DBM,
    ChangeAction,
    DenialKind,
    EmulatedOcs,
)
from lightrail.emulator.servers.restconf import MEDIA_TYPE, RestconfServer, WireFault

USER = "admin"
PASSWORD = "correct horse"
DELAY_S = 0.002
REBOOT_DOWN_S = 4321.0  # the gated sleep below waits for the test instead of this long
NXN8 = SwitchCapabilities(kind=SwitchKind.NXN, port_count=8, atomic_bulk=True,
                          settle_time_s=DELAY_S)
DATA = "/api/data/optical-switch:cross-connects"
AUTH = {"Authorization": aiohttp.encode_basic_auth(USER, PASSWORD)}


def xc(ingress: int, egress: int) -> CrossConnect:
    return CrossConnect(ingress, egress)


class RebootGate:
    """A device ``sleep`` that waits for ``release`` when asked to sleep ``REBOOT_DOWN_S``
    (a reboot's down time) and sleeps for real otherwise (settle times)."""

    def __init__(self) -> None:
        self.released = asyncio.Event()

    async def sleep(self, delay_s: float) -> None:
        if delay_s == REBOOT_DOWN_S:
            await self.released.wait()
        else:
            await asyncio.sleep(delay_s)


@dataclass
class Rig:
    device: EmulatedOcs
    server: RestconfServer
    gate: RebootGate
    opened: list[RestconfDriver]

    def switch(self, **options: str | int | float | bool) -> SwitchSpec:
        base: dict[str, str | int | float | bool] = {
            "host": "127.0.0.1", "port": self.server.port, "username": USER,
            "password": PASSWORD, "timeout_s": 2.0, "alarm_poll_interval_s": 0.01,
        }
        base.update(options)
        return SwitchSpec(self.device.switch_id, "restconf", self.device.capabilities, base)

    async def driver(self, **options: str | int | float | bool) -> RestconfDriver:
        driver = make_driver(self.switch(**options), DriverContext())
        assert isinstance(driver, RestconfDriver)
        self.opened.append(driver)  # closed by the fixture
        await driver.open()
        return driver

    def writes(self) -> list[tuple[str, str, int | None]]:
        return [(r.method, r.path, r.status) for r in self.server.requests
                if r.method in ("PATCH", "DELETE", "POST")]


RigFactory = Callable[..., Awaitable[Rig]]


@pytest_asyncio.fixture
async def make_rig() -> AsyncIterator[RigFactory]:
    rigs: list[Rig] = []

    async def build(
        caps: SwitchCapabilities = NXN8, initial: frozenset[CrossConnect] = frozenset()
    ) -> Rig:
        gate = RebootGate()
        device = EmulatedOcs("ocs-rc", caps, cross_connects=initial, sleep=gate.sleep)
        server = RestconfServer(device, username=USER, password=PASSWORD)
        await server.start()
        rigs.append(Rig(device, server, gate, []))
        return rigs[-1]

    yield build
    for rig in rigs:
        for driver in rig.opened:
            await driver.close()
        await rig.server.stop()


@pytest_asyncio.fixture
async def rig(make_rig: RigFactory) -> Rig:
    return await make_rig()


@pytest_asyncio.fixture
async def driver(rig: Rig) -> RestconfDriver:
    return await rig.driver()


async def next_alarm(alarms: AsyncIterator[DeviceAlarm]) -> DeviceAlarm:
    return await asyncio.wait_for(anext(alarms), timeout=5.0)


# --- basics --------------------------------------------------------------------------------------


async def test_driver_satisfies_protocol_and_reports_the_device(driver: RestconfDriver) -> None:
    assert isinstance(driver, Driver)
    info = await driver.info()
    assert (info.switch_id, info.vendor, info.model) == ("ocs-rc", "Lightrail", "emulated-ocs")
    assert info.capabilities == NXN8
    assert PASSWORD not in repr(driver)


async def test_apply_then_read_back(rig: Rig, driver: RestconfDriver) -> None:
    target = frozenset({xc(1, 9), xc(2, 10)})
    result = await driver.apply(target, frozenset({1, 2, 9, 10}))
    assert result.ok and result.removed == () and set(result.added) == target
    assert await driver.get_cross_connects() == target
    assert rig.device.cross_connects == target
    assert [r.action for r in rig.device.change_log] == [ChangeAction.MAKE] * 2
    assert rig.writes() == [("PATCH", DATA, 204)]  # one bulk PATCH, nothing else


async def test_issue_case_one_delete_one_add_then_nothing(make_rig: RigFactory) -> None:
    caps = SwitchCapabilities(kind=SwitchKind.NXN, port_count=48, atomic_bulk=True,
                              settle_time_s=DELAY_S)
    out = 48  # egress "out k" is canonical port 48 + k
    rig = await make_rig(caps, frozenset({xc(1, out + 41), xc(3, out + 3)}))
    driver = await rig.driver()
    ports = frozenset({1, 3, out + 41, out + 29, out + 3})
    target = frozenset({xc(1, out + 29), xc(3, out + 3)})
    result = await driver.apply(target, ports)
    assert result.removed == (xc(1, out + 41),) and result.added == (xc(1, out + 29),)
    assert rig.writes() == [("DELETE", f"{DATA}/pair=1", 204), ("PATCH", DATA, 204)]
    assert rig.device.cross_connects == target
    assert [(r.action, r.cross_connect) for r in rig.device.change_log] == [
        (ChangeAction.BREAK, xc(1, out + 41)), (ChangeAction.MAKE, xc(1, out + 29)),
    ]
    again = await driver.apply(target, ports)
    assert again.removed == () and again.added == ()
    assert len(rig.writes()) == 2  # the second run issued nothing
    # a read-back that differs from the target fails the run
    rig.device.drop_makes_silently(out + 41)
    with pytest.raises(VerificationMismatch) as info:
        await driver.apply(frozenset({xc(1, out + 41), xc(3, out + 3)}), ports)
    assert info.value.missing == (xc(1, out + 41),)


async def test_one_reconcile_is_the_writes_and_one_read(rig: Rig, driver: RestconfDriver) -> None:
    """Requests per reconcile (2 breaks, 2 makes): the reconciler diffs against its view, the
    driver writes with the entity tag of its last answer and reads back once; a device changed
    behind its back answers 412 and the driver reads, recomputes and retries."""
    await rig.device.apply_bulk((), [xc(1, 9), xc(2, 10), xc(3, 11)])
    reconciler = Reconciler({"ocs-rc": driver}, retry=RetryPolicy(max_attempts=1))
    ports = frozenset({1, 2, 3, 9, 10, 11})
    swapped = frozenset({xc(1, 10), xc(2, 9), xc(3, 11)})
    async with asyncio.TaskGroup() as tg:
        reconciler.start(tg)
        try:
            await reconciler.read_back("ocs-rc")  # startup
            seen = len(rig.server.requests)
            outcome = await reconciler.reconcile("ocs-rc", ports, swapped)
            assert outcome.removed == {xc(1, 9), xc(2, 10)}
            assert [(r.method, r.path) for r in rig.server.requests[seen:]] == [
                ("DELETE", f"{DATA}/pair=1"),
                ("DELETE", f"{DATA}/pair=2"),
                ("PATCH", DATA),
                ("GET", DATA),  # the one read-back
            ]
            assert reconciler.confirmed("ocs-rc") == rig.device.cross_connects == swapped
            await rig.device.apply_bulk((), [xc(5, 13)])  # another client, other ports
            seen = len(rig.server.requests)
            await reconciler.reconcile("ocs-rc", ports, frozenset({xc(1, 9), xc(2, 10)}))
            assert [(r.method, r.status) for r in rig.server.requests[seen:]] == [
                ("DELETE", 412), ("GET", 200), ("DELETE", 204), ("DELETE", 204),
                ("DELETE", 204), ("PATCH", 204), ("GET", 200),
            ]
            assert rig.device.cross_connects == {xc(1, 9), xc(2, 10), xc(5, 13)}
        finally:
            await reconciler.stop()


async def test_conflicting_target_rejected_without_a_write(rig: Rig, driver: RestconfDriver
                                                           ) -> None:
    await driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    with pytest.raises(CrossConnectConflict):
        await driver.apply(frozenset({xc(1, 10), xc(2, 10)}), frozenset({1, 2, 9, 10}))
    with pytest.raises(InvalidPort) as info:  # wrong side (egress used as ingress)
        await driver.apply(frozenset({xc(9, 10)}), frozenset({9, 10}))
    assert info.value.port == 9
    with pytest.raises(InvalidPort):  # 1->9 straddles the ports given
        await driver.apply(frozenset(), frozenset({9}))
    assert rig.device.cross_connects == {xc(1, 9)}
    assert len(rig.writes()) == 1


async def test_device_conflict_answer_maps_to_cross_connect_conflict(rig: Rig) -> None:
    rig.device.cross_connects  # noqa: B018 - the device starts empty
    await rig.device.apply_bulk((), [xc(1, 9)])
    async with aiohttp.ClientSession(headers=AUTH) as session:
        body = {"optical-switch:cross-connects": {"pair": [{"ingress": 2, "egress": 9}]}}
        async with session.patch(
            f"{rig.server.base_url}{DATA}", data=json.dumps(body),
            headers={"Content-Type": MEDIA_TYPE},
        ) as response:
            assert response.status == 409
            answer = await response.read()
    [entry] = json.loads(answer)["ietf-restconf:errors"]["error"]
    assert entry["error-tag"] == "in-use"
    error = error_for_answer("ocs-rc", 409, answer, "PATCH")
    assert isinstance(error, CrossConnectConflict)
    assert (error.wanted, error.existing) == (xc(2, 9), xc(1, 9))


@pytest.mark.parametrize(
    ("status", "tag", "message", "port", "expected"),
    [
        (401, "access-denied", "authentication failed", None, AuthenticationFailed),
        (403, "access-denied", "forbidden", None, AuthenticationFailed),
        (400, "invalid-value", "port 17: no such port", None, InvalidPort),
        (404, "invalid-value", "no such port", 12, InvalidPort),
        (400, "malformed-message", "body is not JSON", None, ProtocolError),
        (404, "invalid-value", "unknown resource", None, ProtocolError),
        (413, "too-big", "too many changes", None, DriverError),
        (500, "operation-failed", "port 3: mirror stuck", None, HardwareFault),
        (503, "resource-denied", "busy", None, DeviceUnreachable),
        (504, "operation-failed", "gateway timeout", None, DeviceTimeout),
        (418, "invalid-value", "teapot", None, ProtocolError),
    ],
)
def test_http_error_mapping(
    status: int, tag: str, message: str, port: int | None, expected: type[DriverError]
) -> None:
    body = json.dumps({"ietf-restconf:errors": {"error": [
        {"error-type": "application", "error-tag": tag, "error-message": message}
    ]}}).encode()
    error = error_for_answer("ocs-rc", status, body, "GET x", port=port)
    assert type(error) is expected
    if isinstance(error, InvalidPort):
        assert error.port == (port or 17)


async def test_idempotent_reapply_issues_no_write(rig: Rig, driver: RestconfDriver) -> None:
    target = frozenset({xc(1, 9), xc(2, 10), xc(3, 11)})
    ports = frozenset({1, 2, 3, 9, 10, 11})
    await driver.apply(target, ports)
    writes = len(rig.writes())
    commands = rig.device.command_count
    result = await driver.apply(target, ports)
    assert result.ok and result.removed == () and result.added == ()
    assert len(rig.writes()) == writes
    assert rig.device.command_count == commands + 1  # one read, no write


async def test_bulk_full_permutation(make_rig: RigFactory) -> None:
    n = 16
    caps = SwitchCapabilities(kind=SwitchKind.NXN, port_count=n, atomic_bulk=True,
                              settle_time_s=DELAY_S)
    rig = await make_rig(caps)
    driver = await rig.driver()
    rng = random.Random(4)
    ports = frozenset(caps.port_ids())
    first = list(range(n + 1, 2 * n + 1))
    rng.shuffle(first)
    target = frozenset(xc(i + 1, e) for i, e in enumerate(first))
    assert len((await driver.apply(target, ports)).added) == n
    assert rig.writes() == [("PATCH", DATA, 204)]
    second = list(first)
    rng.shuffle(second)
    target2 = frozenset(xc(i + 1, e) for i, e in enumerate(second))
    rig.device.clear_change_log()
    result = await driver.apply(target2, ports)
    changed = target - target2
    assert set(result.removed) == changed and set(result.added) == target2 - target
    assert rig.device.cross_connects == target2
    log = rig.device.change_log
    breaks = [r for r in log if r.action is ChangeAction.BREAK]
    assert len(breaks) == len(changed)
    assert log[: len(breaks)] == breaks  # every break before any make
    assert [w[0] for w in rig.writes()[1:]] == ["DELETE"] * len(changed) + ["PATCH"]


async def test_max_batch_splits_the_makes(make_rig: RigFactory) -> None:
    caps = SwitchCapabilities(kind=SwitchKind.NXN, port_count=8, atomic_bulk=True,
                              settle_time_s=DELAY_S, max_batch=3)
    rig = await make_rig(caps)
    driver = await rig.driver()
    target = frozenset(xc(i, 8 + i) for i in range(1, 8))
    await driver.apply(target, frozenset(caps.port_ids()))
    assert rig.writes() == [("PATCH", DATA, 204)] * 3
    assert rig.device.cross_connects == target



async def test_replace_breaks_and_remakes_everything_on_the_ports(make_rig: RigFactory) -> None:
    rig = await make_rig(initial=frozenset({xc(1, 9), xc(2, 10), xc(3, 11)}))
    driver = await rig.driver()
    ports = frozenset({1, 2, 9, 10})
    result = await driver.apply(frozenset({xc(1, 9), xc(2, 10)}), ports, ApplyMode.REPLACE)
    assert set(result.removed) == set(result.added) == {xc(1, 9), xc(2, 10)}
    assert [w[0] for w in rig.writes()] == ["DELETE", "DELETE", "PATCH"]
    assert rig.device.cross_connects == {xc(1, 9), xc(2, 10), xc(3, 11)}


async def test_duplex_switch(make_rig: RigFactory) -> None:
    caps = SwitchCapabilities(kind=SwitchKind.DUPLEX, port_count=8, atomic_bulk=True,
                              settle_time_s=DELAY_S)
    rig = await make_rig(caps, frozenset({xc(1, 2)}))
    driver = await rig.driver()
    result = await driver.apply(frozenset({xc(1, 3), xc(2, 4)}), frozenset({1, 2, 3, 4}))
    assert result.removed == (xc(1, 2),) and set(result.added) == {xc(1, 3), xc(2, 4)}
    assert await driver.get_cross_connects() == {xc(1, 3), xc(2, 4)}
    with pytest.raises(InvalidPort):
        await driver.apply(frozenset({xc(5, 4)}), frozenset({4, 5}))

# --- failures ------------------------------------------------------------------------------------


async def test_partial_failure_reports_what_did_and_did_not_apply(make_rig: RigFactory) -> None:
    rig = await make_rig(initial=frozenset({xc(1, 9), xc(5, 13)}))
    driver = await rig.driver()
    rig.device.fail_make(2, "mirror did not latch")
    target = frozenset({xc(1, 10), xc(2, 11), xc(3, 12)})
    ports = frozenset({1, 2, 3, 9, 10, 11, 12})
    with pytest.raises(PartialApply) as info:
        await driver.apply(target, ports)
    result = info.value.result
    assert info.value.retryable
    assert result.removed == (xc(1, 9),)
    assert result.added == (xc(1, 10),)
    assert set(result.failed) == {xc(2, 11), xc(3, 12)}
    assert result.failed[xc(2, 11)] == "mirror did not latch"
    assert result.failed[xc(3, 12)].startswith("not attempted")
    assert rig.device.cross_connects == {xc(1, 10), xc(5, 13)}
    retry = await driver.apply(target, ports)  # the fault was one-shot
    assert set(retry.added) == {xc(2, 11), xc(3, 12)}
    assert rig.device.cross_connects == target | {xc(5, 13)}


@pytest.mark.parametrize(
    ("kind", "error"),
    [(DenialKind.HARDWARE_FAULT, HardwareFault), (DenialKind.INVALID_PORT, InvalidPort)],
)
async def test_denied_port_rejects_the_make(
    rig: Rig, driver: RestconfDriver, kind: DenialKind, error: type[DriverError]
) -> None:
    rig.device.deny_port(10, kind, "shutter jammed")
    with pytest.raises(error, match="shutter jammed") as info:
        await driver.apply(frozenset({xc(1, 10)}), frozenset({1, 10}))
    if isinstance(info.value, InvalidPort):
        assert info.value.port == 10
    assert rig.device.cross_connects == frozenset()


async def test_denied_make_after_a_break_is_a_partial_apply(make_rig: RigFactory) -> None:
    rig = await make_rig(initial=frozenset({xc(1, 9)}))
    driver = await rig.driver()
    rig.device.deny_port(10, DenialKind.HARDWARE_FAULT, "shutter jammed")
    with pytest.raises(PartialApply) as info:
        await driver.apply(frozenset({xc(1, 10)}), frozenset({1, 9, 10}))
    assert info.value.result.removed == (xc(1, 9),)
    assert info.value.result.added == ()
    assert "shutter jammed" in info.value.result.failed[xc(1, 10)]
    assert isinstance(info.value.__cause__, HardwareFault)
    assert rig.device.cross_connects == frozenset()


async def test_slow_device_times_out_then_recovers(rig: Rig) -> None:
    driver = await rig.driver(timeout_s=0.05)
    rig.device.set_extra_delay(0.3)
    with pytest.raises(DeviceTimeout):
        await driver.get_cross_connects()
    rig.device.set_extra_delay(0.0)
    assert await driver.get_cross_connects() == frozenset()


async def test_unreachable_device_drops_the_connection(rig: Rig, driver: RestconfDriver) -> None:
    rig.device.set_unreachable(True)
    with pytest.raises(DeviceUnreachable):
        await driver.get_cross_connects()
    with pytest.raises(DeviceUnreachable):
        await driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    rig.device.set_unreachable(False)
    await driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    assert rig.device.cross_connects == {xc(1, 9)}


async def test_write_dropped_before_it_took_effect_raises(rig: Rig, driver: RestconfDriver
                                                          ) -> None:
    async def drop_the_write() -> None:
        rig.device.drop_next_calls(1)

    rig.server.before_next_write(drop_the_write)
    with pytest.raises(DeviceUnreachable):
        await driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    assert rig.device.cross_connects == frozenset()
    await driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    assert rig.device.cross_connects == {xc(1, 9)}


# --- power, ports, alarms ------------------------------------------------------------------------


async def test_power_readings_and_port_status(rig: Rig, driver: RestconfDriver) -> None:
    await driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    power = await driver.get_power([1, 9, 2])
    assert power == {1: CONNECTED_POWER_DBM, 9: CONNECTED_POWER_DBM, 2: NO_LIGHT_DBM}
    assert set(await driver.get_power()) == set(NXN8.port_ids())
    with pytest.raises(InvalidPort):
        await driver.get_power([17])
    [up, down] = await driver.get_port_status([1, 2])
    assert (up.admin, up.oper) == (PortAdmin.ENABLED, PortOper.UP)
    assert (down.admin, down.oper) == (PortAdmin.ENABLED, PortOper.DOWN)
    await driver.set_port_admin(1, PortAdmin.DISABLED)
    [disabled] = await driver.get_port_status([1])
    assert (disabled.admin, disabled.oper) == (PortAdmin.DISABLED, PortOper.DOWN)
    assert (await driver.get_power([9]))[9] == NO_LIGHT_DBM
    await driver.set_port_admin(1, PortAdmin.ENABLED)
    assert (await driver.get_power([9]))[9] == CONNECTED_POWER_DBM
    rig.device.fail_port(9)
    [failed] = await driver.get_port_status([9])
    assert failed.oper is PortOper.FAILED
    with pytest.raises(InvalidPort):
        await driver.set_port_admin(17, PortAdmin.DISABLED)


async def test_alarms_delivered_once_and_cleared(rig: Rig, driver: RestconfDriver) -> None:
    alarms = driver.events()
    rig.device.fail_port(9, "LOS")
    first = await next_alarm(alarms)
    assert (first.switch_id, first.port, first.condition, first.severity) == (
        "ocs-rc", 9, "LOS", AlarmSeverity.MAJOR
    )
    assert first.description == "port 9 failed"
    rig.device.fail_port(10, "LOS")
    second = await next_alarm(alarms)  # port 9's alarm is still active, not delivered again
    assert (second.port, second.severity) == (10, AlarmSeverity.MAJOR)
    polls = sum(1 for r in rig.server.requests if r.path.endswith("system-alarms"))
    await rig.server.wait_requests(lambda r: r.path.endswith("system-alarms"), polls + 3)
    rig.device.repair_port(9)  # three more polls saw both alarms and delivered neither again
    cleared = await next_alarm(alarms)
    assert (cleared.port, cleared.condition, cleared.severity) == (
        9, "LOS", AlarmSeverity.CLEARED
    )
    assert [a.port for a in rig.server.active_alarms] == [10]
    late = driver.events()  # a new iterator gets the alarms active now
    assert (await next_alarm(late)).port == 10
    await driver.close()
    with pytest.raises(StopAsyncIteration):
        await next_alarm(alarms)


# --- credentials, entity tags --------------------------------------------------------------------


async def test_wrong_or_missing_credentials(rig: Rig) -> None:
    bad = make_driver(rig.switch(password="wrong"), DriverContext())
    with pytest.raises(AuthenticationFailed) as info:
        await bad.open()
    assert "wrong" not in str(info.value)
    async with aiohttp.ClientSession() as session, session.get(
        f"{rig.server.base_url}{DATA}"
    ) as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"].startswith("Basic")
        [entry] = (await response.json(content_type=None))["ietf-restconf:errors"]["error"]
        assert entry["error-tag"] == "access-denied"


async def test_credentials_from_environment_never_shown(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OCS_USER", USER)
    monkeypatch.setenv("OCS_PASSWORD", PASSWORD)
    switch = rig.switch()
    options = {k: v for k, v in switch.options.items() if k not in ("username", "password")}
    options |= {"username_env": "OCS_USER", "password_env": "OCS_PASSWORD"}
    driver = make_driver(
        SwitchSpec(switch.switch_id, "restconf", switch.capabilities, options), DriverContext()
    )
    await driver.open()
    assert await driver.get_cross_connects() == frozenset()
    assert PASSWORD not in repr(driver)
    await driver.close()
    monkeypatch.delenv("OCS_PASSWORD")
    with pytest.raises(DriverConfigError, match=r"ocs-rc.*password_env.*'OCS_PASSWORD'"):
        make_driver(SwitchSpec(switch.switch_id, "restconf", switch.capabilities, options),
                    DriverContext())


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"port": 80}, "host"),
        ({"host": "h", "port": 0}, "port"),
        ({"host": "h", "scheme": "ftp"}, "scheme"),
        ({"host": "h", "colour": "red"}, "colour"),
        ({"host": "h", "timeout_s": 0}, "timeout_s"),
        ({"host": "h", "verify": "yes"}, "verify"),
        ({"host": "h", "password": None}, "password"),
        ({"host": "h", "password": None, "password_env": "NOPE"}, "password_env"),
        ({"host": "h", "username": "a:b"}, "username"),
        ({"host": "h", "root": "api"}, "root"),
        ({"host": "h", "alarm_poll_interval_s": -1}, "alarm_poll_interval_s"),
    ],
)
def test_options_are_validated(options: dict[str, str | int | float | bool | None],
                               option: str) -> None:
    full = {"username": "u", "password": "s3cr3t-value"} | options
    spec = SwitchSpec("ocs-rc", "restconf", NXN8,
                      {k: v for k, v in full.items() if v is not None})
    where = rf"^switches\[ocs-rc\]\.options\.{option} "
    with pytest.raises(DriverConfigError, match=where) as info:
        resolve_credentials(spec, RestconfOptions.from_spec(spec), environ={})
    assert info.value.option == option
    assert "s3cr3t-value" not in str(info.value)


def test_a_mistyped_option_is_rejected_naming_the_switch_and_the_key() -> None:
    spec = SwitchSpec("ocs-rc", "restconf", NXN8,
                      {"host": "h", "username": "u", "password": "p", "timout_s": 2})
    with pytest.raises(DriverConfigError) as info:
        DriverRegistry().create(spec)
    assert str(info.value).startswith(
        "switches[ocs-rc].options.timout_s (model 'restconf'): unknown option")
    assert "got 2" in str(info.value)


async def test_etag_on_get_and_412_on_stale_if_match(rig: Rig) -> None:
    async with aiohttp.ClientSession(headers=AUTH) as session:
        async with session.get(f"{rig.server.base_url}{DATA}") as response:
            etag = response.headers["ETag"]
        await rig.device.apply_bulk((), [xc(1, 9)])
        body = {"optical-switch:cross-connects": {"pair": [{"ingress": 2, "egress": 10}]}}
        async with session.patch(
            f"{rig.server.base_url}{DATA}", data=json.dumps(body),
            headers={"Content-Type": MEDIA_TYPE, "If-Match": etag},
        ) as response:
            assert response.status == 412
    assert rig.device.cross_connects == {xc(1, 9)}


async def test_etag_mismatch_rereads_and_retries_once(rig: Rig, driver: RestconfDriver) -> None:
    async def another_client() -> None:
        await rig.device.apply_bulk((), [xc(5, 13)])

    rig.server.before_next_write(another_client)
    target = frozenset({xc(1, 9), xc(2, 10)})
    result = await driver.apply(target, frozenset({1, 2, 9, 10}))
    assert set(result.added) == target
    assert rig.device.cross_connects == target | {xc(5, 13)}  # the other change is untouched
    assert [w[2] for w in rig.writes()] == [412, 204]


async def test_etag_mismatch_twice_is_concurrent_modification(
    rig: Rig, driver: RestconfDriver
) -> None:
    async def second_writer() -> None:
        await rig.device.apply_bulk((), [xc(6, 14)])

    async def first_writer() -> None:
        await rig.device.apply_bulk((), [xc(5, 13)])
        rig.server.before_next_write(second_writer)

    rig.server.before_next_write(first_writer)
    with pytest.raises(ConcurrentModification) as info:
        await driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    assert info.value.retryable
    assert rig.device.cross_connects == {xc(5, 13), xc(6, 14)}


# --- restarts ------------------------------------------------------------------------------------


async def test_reconnect_after_the_server_restarts(rig: Rig, driver: RestconfDriver) -> None:
    await driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    await rig.server.stop()
    with pytest.raises(DeviceUnreachable, match="cannot connect"):
        await driver.get_cross_connects()
    await rig.server.start()  # same port, same device
    assert await driver.get_cross_connects() == {xc(1, 9)}
    await driver.apply(frozenset({xc(2, 10)}), frozenset({2, 10}))
    assert rig.device.cross_connects == {xc(1, 9), xc(2, 10)}


@pytest.mark.parametrize("keep", [True, False])
async def test_reconnect_after_the_device_reboots(
    rig: Rig, driver: RestconfDriver, keep: bool
) -> None:
    await driver.apply(frozenset({xc(1, 9), xc(2, 10)}), frozenset({1, 2, 9, 10}))
    watch = rig.device.alarms()
    reboot = asyncio.create_task(
        rig.device.reboot(keep_cross_connects=keep, down_s=REBOOT_DOWN_S)
    )
    started = await next_alarm(watch)
    assert (started.condition, started.severity) == ("REBOOT", AlarmSeverity.WARNING)
    with pytest.raises(DeviceUnreachable):
        await driver.get_cross_connects()
    rig.gate.released.set()
    await asyncio.wait_for(reboot, timeout=5.0)
    await watch.aclose()
    state = await driver.get_cross_connects()
    assert state == ({xc(1, 9), xc(2, 10)} if keep else frozenset())
    result = await driver.apply(frozenset({xc(1, 9), xc(2, 10)}), frozenset({1, 2, 9, 10}))
    assert len(result.added) == (0 if keep else 2)


# --- garbage and hang-ups ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "count", "error", "match"),
    [
        (WireFault.GARBAGE_BODY, 1, ProtocolError, "not JSON"),
        (WireFault.GARBAGE_STATUS_LINE, 1, ProtocolError, "not an HTTP answer"),
        # aiohttp re-sends an idempotent request once when the connection drops before the
        # answer (RFC 9112 section 9.3.1), so the error shows when both attempts are dropped
        (WireFault.CLOSE_BEFORE_RESPONSE, 2, DeviceUnreachable, "closed before the answer"),
        (WireFault.CLOSE_MID_RESPONSE, 1, DeviceUnreachable, "middle of the answer"),
    ],
)
async def test_bad_answer_is_a_clear_error_and_the_next_call_works(
    rig: Rig,
    driver: RestconfDriver,
    fault: WireFault,
    count: int,
    error: type[DriverError],
    match: str,
) -> None:
    await rig.device.apply_bulk((), [xc(1, 9)])
    rig.server.inject_wire_fault(fault, count)
    with pytest.raises(error, match=match):
        await driver.get_cross_connects()
    assert await driver.get_cross_connects() == {xc(1, 9)}


async def test_one_dropped_read_is_resent_once(rig: Rig, driver: RestconfDriver) -> None:
    rig.server.inject_wire_fault(WireFault.CLOSE_BEFORE_RESPONSE)
    assert await driver.get_cross_connects() == frozenset()
    assert [r.status for r in rig.server.requests[-2:]] == [None, 200]


@pytest.mark.parametrize(
    "fault", [WireFault.CLOSE_BEFORE_RESPONSE, WireFault.CLOSE_MID_RESPONSE]
)
async def test_lost_answer_to_a_write_is_settled_by_read_back(
    rig: Rig, driver: RestconfDriver, fault: WireFault
) -> None:
    rig.server.inject_wire_fault(fault, method="PATCH")
    target = frozenset({xc(1, 9), xc(2, 10)})
    result = await driver.apply(target, frozenset({1, 2, 9, 10}))
    assert set(result.added) == target
    assert rig.device.cross_connects == target
    assert [w[2] for w in rig.writes()] == [None]


async def test_garbage_answer_to_a_read_during_apply_changes_nothing(
    rig: Rig, driver: RestconfDriver
) -> None:
    rig.server.inject_wire_fault(WireFault.GARBAGE_BODY, method="GET")
    with pytest.raises(ProtocolError):
        await driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    assert rig.device.cross_connects == frozenset()
    assert rig.writes() == []
    await driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}), ApplyMode.REPLACE)
    assert rig.device.cross_connects == {xc(1, 9)}


async def test_lost_answer_to_a_break_is_resent_and_accounted(make_rig: RigFactory) -> None:
    rig = await make_rig(initial=frozenset({xc(1, 9)}))
    driver = await rig.driver()
    rig.server.inject_wire_fault(WireFault.CLOSE_BEFORE_RESPONSE, method="DELETE")
    result = await driver.apply(frozenset({xc(1, 10)}), frozenset({1, 9, 10}))
    assert (result.removed, result.added) == ((xc(1, 9),), (xc(1, 10),))
    assert rig.writes() == [
        ("DELETE", f"{DATA}/pair=1", None),  # took effect, answer lost
        ("DELETE", f"{DATA}/pair=1", 412),  # aiohttp re-sent it: the tag is stale now
        ("PATCH", DATA, 204),
    ]
    assert rig.device.cross_connects == {xc(1, 10)}


async def test_a_reconfiguration_logs_nothing_at_info(rig: Rig, driver: RestconfDriver) -> None:
    """Per-reconfiguration detail is at debug (it is in metrics and events): a controller
    under load logs no info line per switch and reconfiguration (issue 12, "Logs")."""
    with structlog.testing.capture_logs() as logs:
        await driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
        await driver.apply(frozenset({xc(1, 10)}), frozenset({1, 9, 10}))
    assert any(e["event"] == "applied" and e["log_level"] == "debug" for e in logs), logs
    assert [e for e in logs if e["log_level"] not in ("debug",)] == []
