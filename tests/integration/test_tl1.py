"""The TL1 driver against the emulated Polatis TL1 server over real sockets on 127.0.0.1.

Every device wraps an ``EmulatedOcs`` on a manual clock (reconfiguration delay DELAY_S): with
``auto`` every device sleep advances the clock at once; without it a sleep blocks until the test
advances the clock, so "while switching" is a state the test holds, not a race. Nothing sleeps
to wait for an event: tests wait on events with timeouts.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass

import pytest
import pytest_asyncio
import structlog

from lightrail.controller.runtime.reconciler import Reconciler, RetryPolicy
from lightrail.drivers.base import (
    AlarmSeverity,
    ApplyMode,
    ApplyResult,
    AuthenticationFailed,
    CrossConnect,
    CrossConnectConflict,
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
from lightrail.drivers.tl1.driver import Tl1Driver, make_driver
from lightrail.drivers.tl1.options import Tl1Options
from lightrail.drivers.tl1.wire import (
    FrameSplitter,
    Tl1Frame,
    Tl1Response,
    decode_frame,
)
from lightrail.emulator.ocs import (
    CONNECTED_POWER_DBM,
    NO_LIGHT_DBM,
    ChangeAction,
    ChangeRecord,
    DenialKind,
    EmulatedOcs,
)
from lightrail.emulator.servers.tl1 import (
    DEFAULT_USERS,
    ReceivedCommand,
    Tl1Server,
    UnreachableMode,
    WireFault,
)
from tests.manual_time import ManualTime

DELAY_S = 0.025
NXN8 = SwitchCapabilities(
    kind=SwitchKind.NXN, port_count=8, atomic_bulk=False, settle_time_s=DELAY_S
)
WAIT_S = 5.0


def xc(ingress: int, egress: int) -> CrossConnect:
    return CrossConnect(ingress, egress)


def nxn(n: int, max_batch: int | None = None) -> SwitchCapabilities:
    return SwitchCapabilities(
        kind=SwitchKind.NXN,
        port_count=n,
        atomic_bulk=False,
        settle_time_s=DELAY_S,
        max_batch=max_batch,
    )


@dataclass
class Rig:
    time: ManualTime
    ocs: EmulatedOcs
    server: Tl1Server
    driver: Tl1Driver
    switch: SwitchSpec

    def sent(self, *codes: str) -> list[ReceivedCommand]:
        return [c for c in self.server.commands if not codes or c.code in codes]

    def codes(self) -> list[str]:
        return [c.code for c in self.server.commands]


RigFactory = Callable[..., Awaitable[Rig]]


@pytest_asyncio.fixture
async def rig() -> AsyncIterator[RigFactory]:
    """Builds an emulated device, its TL1 server and an (opened) driver; all closed after."""
    async with AsyncExitStack() as stack:

        async def make(
            caps: SwitchCapabilities = NXN8,
            *,
            initial: Iterable[CrossConnect] = (),
            time: ManualTime | None = None,
            options: Mapping[str, str | int | float | bool] | None = None,
            users: Mapping[str, str] = DEFAULT_USERS,
            unreachable: UnreachableMode = UnreachableMode.CLOSE,
            open_driver: bool = True,
        ) -> Rig:
            t = time or ManualTime()
            ocs = EmulatedOcs(
                "ocs-a", caps, cross_connects=initial, clock=t.clock, sleep=t.sleep
            )
            server = Tl1Server(ocs, users=users, unreachable=unreachable)
            await server.start()
            stack.push_async_callback(server.close)
            opts: dict[str, str | int | float | bool] = {
                "host": "127.0.0.1",
                "port": server.port,
                "username": "admin",
                "password": "root",
                "timeout_s": 2.0,
                "reconnect_interval_s": 0.02,
            }
            opts.update(options or {})
            switch = SwitchSpec("ocs-a", "tl1", caps, opts)
            driver = Tl1Driver(switch, Tl1Options.from_spec(switch), clock=t.clock)
            stack.push_async_callback(driver.close)
            if open_driver:
                await driver.open()
            return Rig(t, ocs, server, driver, switch)

        yield make


class RawClient:
    """A bare TL1 client: sends text, returns the raw text and the decoded frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.splitter = FrameSplitter()
        self.queue: list[tuple[str, Tl1Frame]] = []

    @staticmethod
    async def connect(port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return RawClient(reader, writer)

    async def request(self, text: str) -> tuple[str, Tl1Response]:
        self.writer.write(text.encode())
        await self.writer.drain()
        raw, frame = await self.read_frame()
        assert isinstance(frame, Tl1Response)
        return raw, frame

    async def read_frame(self) -> tuple[str, Tl1Frame]:
        async with asyncio.timeout(WAIT_S):
            while not self.queue:
                data = await self.reader.read(4096)
                if not data:
                    raise EOFError("server closed the connection")
                for raw in self.splitter.feed(data):
                    frame = decode_frame(raw)
                    if frame is not None:
                        self.queue.append((raw.text, frame))
        return self.queue.pop(0)

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


# --- the wire ------------------------------------------------------------------------------------


async def test_wire_format_sessions_port_lists_and_deny_codes(rig: RigFactory) -> None:
    r = await rig(initial=[xc(1, 9), xc(2, 10), xc(4, 12), xc(6, 14)], open_driver=False)
    c = await RawClient.connect(r.server.port)
    try:
        raw, resp = await c.request("RTRV-PATCH:::1:;")
        assert re.match(
            r"^\r\n\n   ocs-a \d\d-\d\d-\d\d \d\d:\d\d:\d\d\r\nM  1 DENY\r\n   PLNA\r\n", raw
        )
        assert (resp.error_code, resp.ctag) == ("PLNA", "1")  # not logged in
        _, resp = await c.request("ACT-USER::admin:2::wrong;")
        assert resp.error_code == "PICC"
        _, resp = await c.request("ACT-USER::admin:3::root;")
        assert (resp.completion.value, resp.ctag) == ("COMPLD", "3")
        _, resp = await c.request("RTRV-PATCH::2&4&&6:4:;")  # ports 2, 4, 5, 6
        assert resp.lines == ("2,10", "4,12", "6,14")
        _, resp = await c.request("RTRV-PATCH::9&&10:5:;")
        assert resp.lines == ("1,9", "2,10")
        _, resp = await c.request("RTRV-PATCH::ALL:6:;")
        assert resp.lines == ("1,9", "2,10", "4,12", "6,14")
        _, resp = await c.request("ENT-PATCH::3,99:7:;")
        assert (resp.error_code, resp.comments[0]) == ("IDNV", "Invalid OXC port: 99")
        _, resp = await c.request("ENT-PATCH::3,2:8:;")  # 2 is an ingress port
        assert (resp.error_code, resp.comments[0]) == ("IDNV", "Invalid OXC port: 2")
        _, resp = await c.request("ENT-PATCH::,:9:;")
        assert resp.error_code == "IIAC"
        _, resp = await c.request("ENT-PATCH::3,9:10:;")  # 9 is in use by 1,9
        assert resp.error_code == "SAAS"
        _, resp = await c.request("FROB-PATCH:::11:;")
        assert resp.error_code == "ICNV"
        _, resp = await c.request("RTRV-PATCH:::1234567:;")
        assert (resp.error_code, resp.ctag) == ("IICT", "0")
        _, resp = await c.request("ENT-PATCH::3&5,11&13:12:;")  # bulk, paired in order
        assert not resp.denied
        _, resp = await c.request("RTRV-PATCH::3&5:13:;")
        assert resp.lines == ("3,11", "5,13")
        _, resp = await c.request("DLT-PATCH::11&5:14:;")  # by either side of the patch
        assert not resp.denied
        assert r.ocs.cross_connects == {xc(1, 9), xc(2, 10), xc(4, 12), xc(6, 14)}
        _, resp = await c.request("RTRV-PORT-POWER::1&3:15:;")
        assert resp.lines == ("1:-3.00", "3:-40.00")
        _, resp = await c.request("CANC-USER::admin:16:;")
        assert not resp.denied
        _, resp = await c.request("RTRV-PATCH:::17:;")
        assert resp.error_code == "PLNA"
    finally:
        await c.close()


async def test_bad_credentials_are_an_authentication_error(rig: RigFactory) -> None:
    r = await rig(options={"password": "wrong"}, open_driver=False)
    with pytest.raises(AuthenticationFailed) as info:
        await r.driver.open()
    assert not info.value.retryable
    assert "wrong" not in str(info.value)
    with pytest.raises(DeviceUnreachable, match="not open"):
        await r.driver.get_cross_connects()


# --- apply -------------------------------------------------------------------------------------


async def test_apply_and_read_back(rig: RigFactory) -> None:
    r = await rig()
    assert isinstance(r.driver, Driver)
    info = await r.driver.info()
    assert (info.switch_id, info.vendor, info.capabilities) == ("ocs-a", "Lightrail", NXN8)
    target = frozenset({xc(1, 10), xc(2, 9)})
    result = await r.driver.apply(target, frozenset({1, 2, 9, 10}))
    assert result == ApplyResult(removed=(), added=(xc(1, 10), xc(2, 9)), verified=True)
    assert await r.driver.get_cross_connects() == target
    assert r.ocs.cross_connects == target
    assert [c.aid for c in r.sent("ENT-PATCH")] == ["1&2,10&9"]
    swap = frozenset({xc(1, 9), xc(2, 10)})
    result = await r.driver.apply(swap, frozenset({1, 2, 9, 10}), ApplyMode.MINIMAL)
    assert set(result.removed) == target and set(result.added) == swap
    actions = [rec.action for rec in r.ocs.change_log]
    assert actions[-4:] == [ChangeAction.BREAK] * 2 + [ChangeAction.MAKE] * 2  # break, then make


async def test_conflicting_target_rejected_before_any_command(rig: RigFactory) -> None:
    r = await rig(initial=[xc(1, 9)])
    r.server.clear_commands()
    with pytest.raises(CrossConnectConflict):
        await r.driver.apply(frozenset({xc(1, 10), xc(2, 10)}), frozenset({1, 2, 10}))
    assert r.server.commands == []
    with pytest.raises(InvalidPort) as info:  # 1->9 also uses port 9, outside the ports
        await r.driver.apply(frozenset(), frozenset({1}))
    assert info.value.port == 9
    assert r.sent("DLT-PATCH", "ENT-PATCH") == []
    assert r.ocs.cross_connects == {xc(1, 9)}


async def test_device_refuses_a_make_on_a_port_taken_meanwhile(rig: RigFactory) -> None:
    r = await rig()

    async def someone_else(cmd: object) -> None:
        if getattr(cmd, "code", "") == "ENT-PATCH" and not r.ocs.cross_connects:
            await r.ocs.apply_bulk((), [xc(2, 9)])  # another client takes egress 9

    r.server.set_command_hook(someone_else)
    with pytest.raises(CrossConnectConflict) as info:
        await r.driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    assert (info.value.wanted, info.value.existing) == (xc(1, 9), xc(2, 9))
    assert r.ocs.cross_connects == {xc(2, 9)}


async def test_idempotent_reapply_issues_no_command(rig: RigFactory) -> None:
    r = await rig()
    target = frozenset({xc(1, 9), xc(3, 11)})
    ports = frozenset({1, 3, 9, 11})
    await r.driver.apply(target, ports)
    r.server.clear_commands()
    logged = len(r.ocs.change_log)
    assert await r.driver.apply(target, ports) == ApplyResult()
    assert r.codes() == ["RTRV-PATCH"]  # the read-back only
    assert len(r.ocs.change_log) == logged


async def test_bulk_full_permutation_is_one_dlt_and_one_ent(rig: RigFactory) -> None:
    n = 16
    caps = nxn(n)
    ports = frozenset(caps.port_ids())
    perm = random.Random(7).sample(range(1, n + 1), n)
    first = frozenset(xc(i, n + perm[i - 1]) for i in range(1, n + 1))
    second = frozenset(xc(i, n + perm[i % n]) for i in range(1, n + 1))  # every one changes
    r = await rig(caps)
    await r.driver.apply(first, ports)
    assert len(r.sent("ENT-PATCH")) == 1 and r.sent("DLT-PATCH") == []
    r.server.clear_commands()
    r.ocs.clear_change_log()
    result = await r.driver.apply(second, ports)
    assert set(result.removed) == first and set(result.added) == second
    assert r.codes() == ["RTRV-PATCH", "DLT-PATCH", "ENT-PATCH", "RTRV-PATCH"]
    assert [c.aid for c in r.sent("DLT-PATCH")] == ["1&&16"]
    actions = [rec.action for rec in r.ocs.change_log]
    assert actions == [ChangeAction.BREAK] * n + [ChangeAction.MAKE] * n
    assert await r.driver.get_cross_connects() == second


async def test_max_batch_splits_commands(rig: RigFactory) -> None:
    caps = nxn(8, max_batch=3)
    ports = frozenset(caps.port_ids())
    first = frozenset(xc(i, 8 + i) for i in range(1, 9))
    second = frozenset(xc(i, 8 + i % 8 + 1) for i in range(1, 9))
    r = await rig(caps)
    await r.driver.apply(first, ports)
    assert [c.aid for c in r.sent("ENT-PATCH")] == ["1&&3,9&&11", "4&&6,12&&14", "7&8,15&16"]
    r.server.clear_commands()
    await r.driver.apply(second, ports)
    assert r.codes().count("DLT-PATCH") == 3 and r.codes().count("ENT-PATCH") == 3
    assert r.ocs.cross_connects == second


async def test_partial_failure_reports_what_did_and_did_not_apply(rig: RigFactory) -> None:
    r = await rig(initial=[xc(1, 9)])
    r.ocs.fail_make(2, "mirror did not latch")
    target = frozenset({xc(1, 10), xc(2, 11), xc(3, 9)})
    with pytest.raises(PartialApply) as info:
        await r.driver.apply(target, frozenset({1, 2, 3, 9, 10, 11}))
    result = info.value.result
    assert result.removed == (xc(1, 9),)
    assert result.added == (xc(1, 10),)
    assert dict(result.failed) == {
        xc(2, 11): "mirror did not latch",
        xc(3, 9): "not attempted: make #2 failed",
    }
    assert info.value.retryable
    assert r.ocs.cross_connects == {xc(1, 10)}


async def test_denied_port_is_a_hardware_fault_or_partial_after_breaks(rig: RigFactory) -> None:
    r = await rig()
    r.ocs.deny_port(2, DenialKind.HARDWARE_FAULT, "shutter stuck")
    with pytest.raises(HardwareFault, match=r"SROF.*shutter stuck"):
        await r.driver.apply(frozenset({xc(1, 9), xc(2, 10)}), frozenset({1, 2, 9, 10}))
    assert r.ocs.cross_connects == frozenset()
    r.ocs.deny_port(11, DenialKind.INVALID_PORT, "port not fitted")
    with pytest.raises(InvalidPort) as invalid:
        await r.driver.apply(frozenset({xc(3, 11)}), frozenset({3, 11}))
    assert invalid.value.port == 11
    r.ocs.allow_port(2)
    await r.driver.apply(frozenset({xc(2, 9)}), frozenset({2, 9}))
    r.ocs.deny_port(2, DenialKind.HARDWARE_FAULT, "shutter stuck")
    with pytest.raises(PartialApply) as partial:  # TL1 has no DLT+ENT transaction
        await r.driver.apply(frozenset({xc(2, 10)}), frozenset({2, 9, 10}))
    assert partial.value.result.removed == (xc(2, 9),)
    assert partial.value.result.added == ()
    assert set(partial.value.result.failed) == {xc(2, 10)}


# --- power, status, alarms -----------------------------------------------------------------------


async def test_power_drops_while_switching_and_commands_pipeline(rig: RigFactory) -> None:
    t = ManualTime(auto=False)
    r = await rig(time=t, initial=[xc(2, 10)])
    apply = asyncio.create_task(r.driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9})))
    await t.wait_sleepers(1, WAIT_S)  # the device is switching: ENT-PATCH is unanswered
    power = await r.driver.get_power([1, 9, 2, 3])  # a second command in flight, answered first
    assert power == {1: NO_LIGHT_DBM, 9: NO_LIGHT_DBM, 2: CONNECTED_POWER_DBM, 3: NO_LIGHT_DBM}
    assert not apply.done()
    assert r.codes()[-2:] == ["ENT-PATCH", "RTRV-PORT-POWER"]
    await t.advance(DELAY_S)
    assert (await asyncio.wait_for(apply, WAIT_S)).added == (xc(1, 9),)
    power = await r.driver.get_power([1, 9])
    assert power == {1: CONNECTED_POWER_DBM, 9: CONNECTED_POWER_DBM}
    with pytest.raises(InvalidPort):
        await r.driver.get_power([17])


async def test_port_admin_and_status(rig: RigFactory) -> None:
    r = await rig(initial=[xc(1, 9)])
    await r.driver.set_port_admin(3, PortAdmin.DISABLED)
    assert r.sent("OPR-PORT-SHUTTER")[0].aid == "3"
    r.ocs.fail_port(10)
    statuses = {s.port: s for s in await r.driver.get_port_status([1, 9, 3, 10])}
    assert (statuses[1].admin, statuses[1].oper) == (PortAdmin.ENABLED, PortOper.UP)
    assert (statuses[3].admin, statuses[3].oper) == (PortAdmin.DISABLED, PortOper.DOWN)
    assert statuses[10].oper is PortOper.FAILED
    await r.driver.set_port_admin(3, PortAdmin.ENABLED)
    (status,) = await r.driver.get_port_status([3])
    assert status.admin is PortAdmin.ENABLED
    assert len(await r.driver.get_port_status()) == 16


async def test_alarms_delivered(rig: RigFactory) -> None:
    r = await rig()
    stream = r.driver.events()
    r.ocs.fail_port(5)
    alarm = await asyncio.wait_for(anext(stream), WAIT_S)
    assert (alarm.switch_id, alarm.port, alarm.condition, alarm.severity) == (
        "ocs-a", 5, "LOS", AlarmSeverity.MAJOR,
    )
    assert alarm.at_s == r.time.now_s
    r.ocs.repair_port(5)
    cleared = await asyncio.wait_for(anext(stream), WAIT_S)
    assert (cleared.port, cleared.severity) == (5, AlarmSeverity.CLEARED)
    await r.driver.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(stream), WAIT_S)


# --- restarts and a misbehaving wire -------------------------------------------------------------


@pytest.mark.parametrize("keep", [True, False], ids=["keep", "lose"])
async def test_reconnect_after_the_device_restarts(rig: RigFactory, keep: bool) -> None:
    r = await rig()
    stream = r.driver.events()
    target = frozenset({xc(1, 9), xc(2, 10)})
    ports = frozenset({1, 2, 9, 10})
    await r.driver.apply(target, ports)
    await r.ocs.reboot(keep_cross_connects=keep)
    await r.server.wait_restarts(1)
    assert await r.driver.get_cross_connects() == (target if keep else frozenset())
    logins = r.sent("ACT-USER")
    assert len(logins) == 2 and logins[0].connection != logins[1].connection  # a new login
    r.ocs.fail_port(6)  # alarms flow on the new session
    alarm = await asyncio.wait_for(anext(stream), WAIT_S)
    assert (alarm.port, alarm.severity) == (6, AlarmSeverity.MAJOR)
    result = await r.driver.apply(target, ports)
    assert result.added == (() if keep else (xc(1, 9), xc(2, 10)))
    assert r.ocs.cross_connects == target


async def test_device_down_refuses_then_comes_back(rig: RigFactory) -> None:
    t = ManualTime(auto=False)
    r = await rig(time=t, initial=[xc(1, 9)])
    reboot = asyncio.create_task(r.ocs.reboot(keep_cross_connects=True, down_s=1.0))
    await t.wait_sleepers(1, WAIT_S)  # the device is down
    with pytest.raises(DeviceUnreachable):
        await r.driver.get_cross_connects()
    await t.advance(1.0)
    await reboot
    await r.server.wait_restarts(1)
    assert await r.driver.get_cross_connects() == {xc(1, 9)}


async def test_garbage_reply_is_a_protocol_error_and_a_later_call_works(rig: RigFactory) -> None:
    r = await rig(initial=[xc(1, 9)])
    r.server.inject_wire_fault(WireFault.GARBAGE)
    with pytest.raises(ProtocolError, match="unparseable"):
        await r.driver.get_cross_connects()
    assert await r.driver.get_cross_connects() == {xc(1, 9)}
    assert len(r.sent("ACT-USER")) == 2  # the corrupt connection was replaced
    r.server.inject_wire_fault(WireFault.GARBAGE, code="ENT-PATCH")  # its reply is lost
    result = await r.driver.apply(frozenset({xc(2, 10)}), frozenset({2, 10}))
    assert result.added == (xc(2, 10),)  # the read-back shows the device did it


async def test_close_mid_reply_is_unreachable_and_a_later_call_works(rig: RigFactory) -> None:
    r = await rig(initial=[xc(1, 9)])
    r.server.inject_wire_fault(WireFault.CLOSE_MID_REPLY)
    with pytest.raises(DeviceUnreachable, match="mid-reply") as info:
        await r.driver.get_cross_connects()
    assert info.value.retryable
    assert await r.driver.get_cross_connects() == {xc(1, 9)}


async def test_replies_one_byte_per_write(rig: RigFactory) -> None:
    r = await rig()
    r.server.inject_wire_fault(WireFault.SPLIT_BYTES, count=3)
    await r.driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
    assert await r.driver.get_cross_connects() == {xc(1, 9)}


async def test_slow_device_times_out_and_the_late_reply_is_dropped(rig: RigFactory) -> None:
    t = ManualTime(auto=False)
    r = await rig(time=t, initial=[xc(1, 9)], options={"timeout_s": 0.2})
    r.ocs.set_extra_delay(5.0)
    with pytest.raises(DeviceTimeout, match="RTRV-PATCH"):
        await r.driver.get_cross_connects()
    r.ocs.set_extra_delay(0.0)
    await t.wait_sleepers(1, WAIT_S)  # the slow command is still inside the device
    await t.advance(5.0)  # its late reply goes out now; no caller waits for that ctag
    assert await r.driver.get_cross_connects() == {xc(1, 9)}


@pytest.mark.parametrize(
    ("mode", "error"),
    [(UnreachableMode.CLOSE, DeviceUnreachable), (UnreachableMode.SILENT, DeviceTimeout)],
)
async def test_unreachable_device(
    rig: RigFactory, mode: UnreachableMode, error: type[DriverError]
) -> None:
    r = await rig(initial=[xc(1, 9)], unreachable=mode, options={"timeout_s": 0.2})
    r.ocs.set_unreachable(True)
    with pytest.raises(error) as info:
        await r.driver.get_cross_connects()
    assert info.value.retryable
    r.ocs.set_unreachable(False)
    assert await r.driver.get_cross_connects() == {xc(1, 9)}


async def test_session_timeout_logs_in_again(rig: RigFactory) -> None:
    r = await rig(initial=[xc(1, 9)])
    r.server.logout_all()
    assert await r.driver.get_cross_connects() == {xc(1, 9)}
    assert r.codes()[-3:] == ["RTRV-PATCH", "ACT-USER", "RTRV-PATCH"]


# --- the reconcile case --------------------------------------------------------------------------

# "in 1 -> out 41, in 3 -> out 3" names egress ports by their position on the egress side
# (out k), as a Polatis user reads them. With canonical Polatis numbering (ingress 1..N,
# egress N+1..2N) out k is port N+k, so out 41 needs N >= 41; N = 48 (a stock 48x48 size) makes
# in 1, in 3, out 3, out 29 and out 41 all valid: 1->89 and 3->51 becomes 1->77 and 3->51.
N48 = 48
CAPS48 = nxn(N48)


def out(k: int) -> int:
    """The canonical port id of egress k on the 48 x 48 device."""
    return N48 + k


BEFORE = frozenset({xc(1, out(41)), xc(3, out(3))})
AFTER = frozenset({xc(1, out(29)), xc(3, out(3))})
JOB_PORTS = frozenset({1, 3, out(3), out(29), out(41)})


async def test_reconcile_one_delete_one_add_then_nothing_then_mismatch(rig: RigFactory) -> None:
    r = await rig(CAPS48, initial=BEFORE)
    r.server.clear_commands()
    result = await r.driver.apply(AFTER, JOB_PORTS)
    assert result == ApplyResult(
        removed=(xc(1, out(41)),), added=(xc(1, out(29)),), verified=True
    )
    assert [c.aid for c in r.sent("DLT-PATCH")] == ["1"]
    assert [c.aid for c in r.sent("ENT-PATCH")] == [f"1,{out(29)}"]  # ENT-PATCH::1,77
    assert r.ocs.change_log == [
        ChangeRecord(100.0, "ocs-a", ChangeAction.BREAK, xc(1, out(41))),
        ChangeRecord(100.0 + DELAY_S, "ocs-a", ChangeAction.MAKE, xc(1, out(29))),
    ]  # in 3 -> out 3 is never touched
    assert r.ocs.cross_connects == AFTER
    # a second run issues nothing
    r.server.clear_commands()
    assert await r.driver.apply(AFTER, JOB_PORTS) == ApplyResult()
    assert r.sent("DLT-PATCH", "ENT-PATCH") == []
    assert len(r.ocs.change_log) == 2
    # a read-back that differs from the target fails the run
    r.ocs.drop_makes_silently(out(41))  # acknowledged, never made
    with pytest.raises(VerificationMismatch) as info:
        await r.driver.apply(BEFORE, JOB_PORTS)
    assert info.value.missing == (xc(1, out(41)),)
    assert info.value.unexpected == ()


async def test_reconcile_through_the_controller_reconciler(rig: RigFactory) -> None:
    r = await rig(CAPS48, initial=BEFORE)
    reconciler = Reconciler(
        {"ocs-a": r.driver},
        retry=RetryPolicy(max_attempts=2, backoff_s=0.0),
        clock=r.time.clock,
        sleep=r.time.sleep,
    )
    async with asyncio.TaskGroup() as tg:
        reconciler.start(tg)
        try:
            assert await reconciler.read_back("ocs-a") == BEFORE
            r.server.clear_commands()
            outcome = await reconciler.reconcile("ocs-a", JOB_PORTS, AFTER)
            assert outcome.removed == {xc(1, out(41))} and outcome.added == {xc(1, out(29))}
            assert len(r.sent("DLT-PATCH")) == 1 and len(r.sent("ENT-PATCH")) == 1
            r.server.clear_commands()
            again = await reconciler.reconcile("ocs-a", JOB_PORTS, AFTER)
            assert again.noop and r.server.commands == []
            r.ocs.drop_makes_silently(out(41))
            with pytest.raises(VerificationMismatch):
                await reconciler.reconcile("ocs-a", JOB_PORTS, BEFORE)
            assert xc(3, out(3)) in r.ocs.cross_connects
        finally:
            await reconciler.stop()


async def test_one_reconcile_is_one_dlt_one_ent_and_one_read_of_the_changed_ports(
    rig: RigFactory,
) -> None:
    """Device commands per reconcile (2 breaks, 2 makes) over the TL1 socket: the reconciler
    diffs against its view, the driver writes and reads back only the ports it changed. After
    an alarm (the view distrusted) one read of the switch comes first."""
    r = await rig(initial=[xc(1, 9), xc(2, 10), xc(3, 11)])
    reconciler = Reconciler(
        {"ocs-a": r.driver}, retry=RetryPolicy(max_attempts=1), clock=r.time.clock,
        sleep=r.time.sleep,
    )
    ports = frozenset({1, 2, 3, 9, 10, 11})  # 3->11 is on the ports and stays
    swapped = frozenset({xc(1, 10), xc(2, 9), xc(3, 11)})
    async with asyncio.TaskGroup() as tg:
        reconciler.start(tg)
        try:
            await reconciler.read_back("ocs-a")  # startup
            r.server.clear_commands()
            outcome = await reconciler.reconcile("ocs-a", ports, swapped)
            assert outcome.removed == {xc(1, 9), xc(2, 10)}
            assert outcome.added == {xc(1, 10), xc(2, 9)}
            assert [(c.code, c.aid) for c in r.server.commands] == [
                ("DLT-PATCH", "1&2"),
                ("ENT-PATCH", "1&2,10&9"),
                ("RTRV-PATCH", "1&2&9&10"),  # the changed ports only, not the switch
            ]
            assert reconciler.confirmed("ocs-a") == r.ocs.cross_connects == swapped
            reconciler.invalidate("ocs-a")  # an alarm: distrust the view
            r.server.clear_commands()
            await reconciler.reconcile("ocs-a", ports, frozenset({xc(1, 9), xc(2, 10)}))
            assert [(c.code, c.aid) for c in r.server.commands] == [
                ("RTRV-PATCH", ""),  # the switch read back first
                ("DLT-PATCH", "1&&3"),
                ("ENT-PATCH", "1&2,9&10"),
                ("RTRV-PATCH", "1&&3&9&&11"),
            ]
        finally:
            await reconciler.stop()


# --- configuration -------------------------------------------------------------------------------


async def test_make_driver_with_env_credentials_never_logs_them(
    rig: RigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cr3t-Pw"
    r = await rig(users={"operator": secret}, open_driver=False)
    monkeypatch.setenv("LR_TEST_TL1_USER", "operator")
    monkeypatch.setenv("LR_TEST_TL1_PASS", secret)
    options: dict[str, str | int | float | bool] = {
        "host": "127.0.0.1",
        "port": r.server.port,
        "username_env": "LR_TEST_TL1_USER",
        "password_env": "LR_TEST_TL1_PASS",
    }
    switch = SwitchSpec("ocs-a", "tl1", NXN8, options)
    with structlog.testing.capture_logs() as logs:
        driver = make_driver(switch, DriverContext())
        assert isinstance(driver, Driver)
        await driver.open()
        await driver.apply(frozenset({xc(1, 9)}), frozenset({1, 9}))
        r.server.drop_connections()
        assert await driver.get_cross_connects() == {xc(1, 9)}  # re-login from the env
        await driver.close()
    assert logs
    assert secret not in repr(logs)
    both = SwitchSpec("ocs-a", "tl1", NXN8, {**options, "password": secret})
    with pytest.raises(
        DriverConfigError, match=r"switches\[ocs-a\]\.options\.password .*exactly one of password"
    ):
        Tl1Options.from_spec(both)
    inline = {k: v for k, v in options.items() if k != "password_env"} | {"password": secret}
    assert secret not in repr(Tl1Options.from_spec(SwitchSpec("ocs-a", "tl1", NXN8, inline)))
    monkeypatch.delenv("LR_TEST_TL1_PASS")
    driver = make_driver(switch, DriverContext())
    with pytest.raises(AuthenticationFailed, match="LR_TEST_TL1_PASS"):
        await driver.open()


@pytest.mark.parametrize(
    "options",
    [
        {"port": 3082, "username": "a", "password": "b"},
        {"host": "h", "username": "a", "password": "b"},
        {"host": "h", "port": 70000, "username": "a", "password": "b"},
        {"host": "h", "port": 3082, "password": "b"},
        {"host": "h", "port": 3082, "username": "a", "username_env": "U", "password": "b"},
        {"host": "h", "port": 3082, "username": "a", "password": "b", "timeout_s": 0},
        {"host": "h", "port": 3082, "username": "a", "password": "b", "verify": "yes"},
    ],
)
def test_bad_options_are_config_errors(options: dict[str, str | int | float | bool]) -> None:
    with pytest.raises(DriverConfigError, match=r"switches\[ocs-a\]\.options\.\w+ \(model 'tl1'\)"):
        make_driver(SwitchSpec("ocs-a", "tl1", NXN8, options), DriverContext())


def test_a_mistyped_option_is_rejected_naming_the_switch_and_the_key() -> None:
    """``timout_s: 2`` used to leave the timeout at its default of 5 s without a word."""
    options: dict[str, str | int | float | bool] = {
        "host": "h", "port": 3082, "username": "a", "password": "b", "timout_s": 2,
    }
    spec = SwitchSpec("ocs-a", "tl1", NXN8, options)
    with pytest.raises(DriverConfigError) as e:
        DriverRegistry().create(spec)
    assert str(e.value).startswith("switches[ocs-a].options.timout_s (model 'tl1'): unknown")
    assert "got 2" in str(e.value)
    assert e.value.option == "timout_s"
    secret = "s3cr3t-Pw"  # a mistyped credential key must not echo the credential
    typo: dict[str, str | int | float | bool] = {
        "host": "h", "port": 3082, "username": "a", "password_env": "P", "pasword": secret,
    }
    with pytest.raises(DriverConfigError, match=r"options\.pasword .*unknown") as e:
        DriverRegistry().create(SwitchSpec("ocs-a", "tl1", NXN8, typo))
    assert secret not in str(e.value)
    assert isinstance(make_driver(SwitchSpec("ocs-a", "tl1", NXN8, {
        k: v for k, v in options.items() if k != "timout_s"} | {"timeout_s": 2}),
        DriverContext()), Tl1Driver)


def test_a_port_may_be_a_string_of_digits_and_the_options_keep_their_defaults() -> None:
    opts = Tl1Options.from_spec(SwitchSpec("ocs-a", "tl1", NXN8, {
        "host": "h", "port": "3082", "username": "a", "password_env": "P"}))
    assert (opts.port, opts.timeout_s, opts.connect_timeout_s, opts.reconnect_interval_s) == (
        3082, 5.0, 3.0, 1.0)
    assert (opts.tid, opts.verify, opts.los_threshold_dbm) == ("", True, -30.0)
    assert opts.credential("password", {"P": "pw"}) == "pw"
    assert opts.credential("password", {}) is None


async def test_info_rejects_a_device_of_another_size(rig: RigFactory) -> None:
    r = await rig(open_driver=False)
    switch = SwitchSpec("ocs-a", "tl1", nxn(16), dict(r.switch.options))
    driver = Tl1Driver(switch, Tl1Options.from_spec(switch))
    await driver.open()
    try:
        with pytest.raises(DriverError, match="8x8"):
            await driver.info()
    finally:
        await driver.close()
