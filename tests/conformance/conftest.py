"""The conformance harness (issue 4, section 3): every driver paired with its emulated device.

``harness`` is parametrized over the four driver models. Each instance builds one N x N switch
(N = 8, a power of two so the silicon-photonic Beneš mesh can have it) wrapped around an
``EmulatedOcs`` in an ``EmulatedFabricDevices`` registry, the protocol server in front of it
(none for the in-process driver), and a driver made by a
``lightrail.drivers.registry.DriverRegistry`` (with ``emulated`` registered, as the CLI does)
from a ``lightrail.drivers.base.SwitchSpec`` of that model, opened. Port numbering is the same
everywhere:
ingress 1..N, egress N+1..2N (Polatis numbering; ``lightrail.drivers.siph`` maps ingress p to mesh
input
p-1 and egress N+p to mesh output p-1, so no translation is needed in the tests).

The device clock and sleep are real (``time.monotonic`` / ``asyncio.sleep``); the settle times
are tiny (0.5 ms MEMS-like, 10 us for the MZI mesh), so no test waits on the wall clock for an
event: waits are on events with timeouts.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

import pytest
import pytest_asyncio

from lightrail.drivers.base import (
    CrossConnect,
    DeviceAlarm,
    Driver,
    SwitchCapabilities,
    SwitchKind,
    SwitchSpec,
)
from lightrail.drivers.registry import DriverRegistry
from lightrail.drivers.siph.driver import SiphAlarmStream
from lightrail.emulator.driver import emulated_factory
from lightrail.emulator.ocs import EmulatedFabricDevices, EmulatedOcs
from lightrail.emulator.servers import restconf as restconf_server
from lightrail.emulator.servers import tl1 as tl1_server
from lightrail.emulator.servers.mzi import MziMeshServer
from lightrail.emulator.servers.restconf import RestconfServer
from lightrail.emulator.servers.tl1 import Tl1Server

N = 8
"""Ports per side: 8 x 8 (a power of two, as the Beneš mesh needs)."""
PORTS = frozenset(range(1, 2 * N + 1))
"""Every canonical port of the switch."""
MEMS_SETTLE_S = 0.0005
"""Reconfiguration delay of the emulated MEMS switches (TL1, RESTCONF, in-process)."""
SIPH_SETTLE_S = 10e-6
"""Reconfiguration delay of the emulated MZI mesh (thermo-optic: microseconds)."""
USER = "admin"
PASSWORD = "root"  # the emulated devices' built-in account, not a real secret
TIMEOUT_S = 2.0
"""Per-exchange driver deadline; only reached when a test is broken."""
DRIVERS = ("emulated", "tl1", "restconf", "siph")

REBOOT_DOWN_S = 4321.0
"""A reboot's down time as requested; ``RebootGate`` holds it until the test releases it."""

_TL1_WRITES = frozenset({"ENT-PATCH", "DLT-PATCH", "OPR-PORT-SHUTTER", "RLS-PORT-SHUTTER"})


class RebootGate:
    """The devices' ``sleep``: a settle time is slept for real (well under a millisecond), a
    reboot's down time (``REBOOT_DOWN_S``) sets ``down`` and lasts until ``release``, so "the
    device is down" is a state a test holds, not a race against the wall clock."""

    def __init__(self) -> None:
        self.down = asyncio.Event()
        self._released = asyncio.Event()

    async def sleep(self, delay_s: float) -> None:
        if delay_s != REBOOT_DOWN_S:
            await asyncio.sleep(delay_s)
            return
        self.down.set()
        try:
            await self._released.wait()
        finally:
            self.down.clear()
            self._released.clear()

    def release(self) -> None:
        """End the reboot being held (a no-op when none is)."""
        if self.down.is_set():
            self._released.set()


class Fault(enum.Enum):
    """A misbehaving wire."""

    GARBAGE = "garbage"
    """The reply is replaced by bytes the protocol cannot parse."""
    CLOSE_MID_REPLY = "close_mid_reply"
    """Part of the reply is sent, then the connection is closed."""


@dataclass(frozen=True, slots=True)
class WireFaults:
    """How to make a protocol server misbehave on its next reply.

    ``inject(fault, on_write)`` arms ``fault`` for the next reply to a cross-connect read
    (``on_write`` false) or to the next cross-connect write (true). ``lost_write_reply_raises``
    says what the driver documents when the reply to a write that took effect is lost: raise a
    ``DriverError`` (true) or settle the outcome by a read-back and succeed (false).
    """

    inject: Callable[[Fault, bool], None]
    lost_write_reply_raises: bool


@dataclass(frozen=True, slots=True)
class Harness:
    """One opened driver and the emulated device behind it.

    ``device``: the wrapped ``EmulatedOcs`` (state, change log, fault injection).
    ``restart(keep)``: restart the device (and its server) keeping or losing cross-connects;
    the device stays down (``gate.down`` set) until ``gate.release()``; returns once the
    device answers again.
    ``gate``: the devices' sleep, holding a reboot's down time.
    ``writes()``: device write commands seen so far (TL1 ENT/DLT/shutter commands, RESTCONF
    PATCH/DELETE/POST requests, MZI heater vector writes; in-process: every ``EmulatedOcs``
    command, as that driver's ``apply`` issues nothing but ``apply_bulk``).
    ``rerouted()``: cross-connects the last device write kept but re-routed inside the switch
    (only a rearrangeable MZI mesh does that; empty for the others).
    ``subscribe()``: ``driver.events()``, returned once the device delivers alarms to it.
    ``wire``: wire-fault injection, None for the in-process driver (``wire_skip_reason``).
    ``expected_writes(breaks, makes)``: the write commands the driver documents for an apply
    with that many breaks and makes.
    ``partial_stops_at_failed_make``: with ``EmulatedOcs.fail_make(k)`` the makes before the
    k-th are in place and the rest are not (a device that issues makes one after the other);
    false for the MZI mesh, whose heaters move together (``lightrail.emulator.servers.mzi``: the
    elements
    that had to change for the failed makes keep their old outputs).
    """

    name: str
    driver: Driver
    device: EmulatedOcs
    restart: Callable[[bool], Awaitable[None]]
    gate: RebootGate
    writes: Callable[[], int]
    expected_writes: Callable[[int, int], int]
    rerouted: Callable[[], frozenset[CrossConnect]]
    subscribe: Callable[[], Awaitable[AsyncIterator[DeviceAlarm]]]
    wire: WireFaults | None
    wire_skip_reason: str = ""
    partial_stops_at_failed_make: bool = True


def _caps(settle_s: float, *, atomic_bulk: bool) -> SwitchCapabilities:
    return SwitchCapabilities(
        kind=SwitchKind.NXN, port_count=N, atomic_bulk=atomic_bulk, settle_time_s=settle_s
    )


def _no_reroutes() -> frozenset[CrossConnect]:
    return frozenset()


async def _open(
    stack: AsyncExitStack, switch: SwitchSpec, devices: EmulatedFabricDevices
) -> Driver:
    registry = DriverRegistry()  # this fixture composes like the CLI: emulated is registered
    registry.register("emulated", emulated_factory(devices))
    driver = registry.create(switch)
    await driver.open()
    stack.push_async_callback(driver.close)
    return driver


def _plain_events(driver: Driver) -> Callable[[], Awaitable[AsyncIterator[DeviceAlarm]]]:
    async def subscribe() -> AsyncIterator[DeviceAlarm]:
        return driver.events()

    return subscribe


async def _emulated(
    stack: AsyncExitStack, devices: EmulatedFabricDevices, gate: RebootGate
) -> Harness:
    caps = _caps(MEMS_SETTLE_S, atomic_bulk=True)
    switch = SwitchSpec("ocs-emulated", "emulated", caps)
    driver = await _open(stack, switch, devices)
    device = devices["ocs-emulated"]

    async def restart(keep: bool) -> None:
        await device.reboot(keep_cross_connects=keep, down_s=REBOOT_DOWN_S)

    return Harness(
        name="emulated",
        driver=driver,
        device=device,
        restart=restart,
        gate=gate,
        writes=lambda: device.write_count,
        # emulator/driver.py: one bulk command (no max_batch), none when nothing differs
        expected_writes=lambda breaks, makes: int(breaks + makes > 0),
        rerouted=_no_reroutes,
        subscribe=_plain_events(driver),
        wire=None,
        wire_skip_reason=(
            "in-process driver (drivers/emulated.py) calls EmulatedOcs directly: there is no "
            "wire that could carry garbage or be cut mid-reply"
        ),
    )


async def _tl1(
    stack: AsyncExitStack, devices: EmulatedFabricDevices, gate: RebootGate
) -> Harness:
    # TL1 has no transaction spanning DLT-PATCH and ENT-PATCH (drivers/tl1.py): not atomic
    caps = _caps(MEMS_SETTLE_S, atomic_bulk=False)
    device = devices.ensure("ocs-tl1", caps)
    server = Tl1Server(device, users={USER: PASSWORD})
    await server.start()
    stack.push_async_callback(server.close)
    switch = SwitchSpec(
        "ocs-tl1", "tl1", caps,
        options={
            "host": "127.0.0.1", "port": server.port, "username": USER, "password": PASSWORD,
            "timeout_s": TIMEOUT_S, "reconnect_interval_s": 0.02,
        },
    )
    driver = await _open(stack, switch, devices)

    async def restart(keep: bool) -> None:
        # emulator/tl1_server.py: a reboot drops every connection and closes the listener;
        # the server listens again on the same port when the device is back
        restarts = server.restarts
        await device.reboot(keep_cross_connects=keep, down_s=REBOOT_DOWN_S)
        await server.wait_restarts(restarts + 1, timeout_s=5.0)

    def inject(fault: Fault, on_write: bool) -> None:
        kind = (
            tl1_server.WireFault.GARBAGE
            if fault is Fault.GARBAGE
            else tl1_server.WireFault.CLOSE_MID_REPLY
        )
        server.inject_wire_fault(kind, code="ENT-PATCH" if on_write else "RTRV-PATCH")

    return Harness(
        name="tl1",
        driver=driver,
        device=device,
        restart=restart,
        gate=gate,
        writes=lambda: sum(1 for c in server.commands if c.code in _TL1_WRITES),
        # drivers/tl1.py: the breaks as one DLT-PATCH, then the makes as one ENT-PATCH
        expected_writes=lambda breaks, makes: int(breaks > 0) + int(makes > 0),
        rerouted=_no_reroutes,
        subscribe=_plain_events(driver),
        # drivers/tl1.py: when an ENT-PATCH fails (its reply lost included) the driver reads
        # back; a read-back showing every make in place counts as success
        wire=WireFaults(inject, lost_write_reply_raises=False),
    )


async def _restconf(
    stack: AsyncExitStack, devices: EmulatedFabricDevices, gate: RebootGate
) -> Harness:
    caps = _caps(MEMS_SETTLE_S, atomic_bulk=True)
    device = devices.ensure("ocs-restconf", caps)
    server = RestconfServer(device, username=USER, password=PASSWORD)
    await server.start()
    stack.push_async_callback(server.stop)
    switch = SwitchSpec(
        "ocs-restconf", "restconf", caps,
        options={
            "host": "127.0.0.1", "port": server.port, "username": USER, "password": PASSWORD,
            "timeout_s": TIMEOUT_S, "alarm_poll_interval_s": 0.01,
        },
    )
    driver = await _open(stack, switch, devices)

    async def restart(keep: bool) -> None:
        # the management plane goes away with the device: connection refused meanwhile, then
        # the same port again (RestconfServer.start after stop)
        await server.stop()
        await device.reboot(keep_cross_connects=keep, down_s=REBOOT_DOWN_S)
        await server.start()

    def inject(fault: Fault, on_write: bool) -> None:
        wf = restconf_server.WireFault
        if fault is Fault.CLOSE_MID_REPLY:
            kind = wf.CLOSE_MID_RESPONSE
        elif on_write:
            # a write's 2xx answer carries no body the driver reads (RFC 8040 PATCH -> 204),
            # so garbage on a write is a garbage status line
            kind = wf.GARBAGE_STATUS_LINE
        else:
            kind = wf.GARBAGE_BODY
        server.inject_wire_fault(kind, method="PATCH" if on_write else "GET")

    return Harness(
        name="restconf",
        driver=driver,
        device=device,
        restart=restart,
        gate=gate,
        writes=lambda: server.write_count,
        # drivers/restconf.py: one DELETE per break, then the makes in one PATCH
        expected_writes=lambda breaks, makes: breaks + int(makes > 0),
        rerouted=_no_reroutes,
        subscribe=_plain_events(driver),
        # drivers/restconf.py: "After a write fails it reads back to learn what took effect:
        # all of it -> success (the answer was lost)"
        wire=WireFaults(inject, lost_write_reply_raises=False),
    )


async def _siph(
    stack: AsyncExitStack, devices: EmulatedFabricDevices, gate: RebootGate
) -> Harness:
    caps = _caps(SIPH_SETTLE_S, atomic_bulk=True)
    device = devices.ensure("mzi-siph", caps)
    server = MziMeshServer("mzi-siph", N, ocs=device)
    await server.start()
    stack.push_async_callback(server.stop)
    switch = SwitchSpec(
        "mzi-siph", "siph", caps,
        options={"host": "127.0.0.1", "port": server.port, "timeout_s": TIMEOUT_S},
    )
    driver = await _open(stack, switch, devices)

    async def restart(keep: bool) -> None:
        # the DAC goes away with the device (connections closed, refused meanwhile);
        # MziMeshServer.reboot without keeping zeroes the heaters (power loss)
        await server.stop()
        await server.reboot(keep_cross_connects=keep, down_s=REBOOT_DOWN_S)
        await server.start()

    def inject(fault: Fault, on_write: bool) -> None:
        # the apply's first exchange is its read-back (vall?), the second the vector write
        after = 1 if on_write else 0
        if fault is Fault.GARBAGE:
            server.garble_next_replies(1, after=after)
        else:
            server.close_mid_next_reply(after=after)

    async def subscribe() -> AsyncIterator[DeviceAlarm]:
        # drivers/siph.py, SiphDriver.events: the lrsub stream is opened by the first
        # __anext__ (alarms raised before that are not delivered); connect() opens it now
        stream = driver.events()
        assert isinstance(stream, SiphAlarmStream)
        await stream.connect()
        return stream

    return Harness(
        name="siph",
        driver=driver,
        device=device,
        restart=restart,
        gate=gate,
        # drivers/siph.py: ONE vector write sets every element at once
        expected_writes=lambda breaks, makes: int(breaks + makes > 0),
        writes=lambda: sum(1 for line in server.received if line.lower().startswith("vvec")),
        rerouted=lambda: server.last_rerouted,
        subscribe=subscribe,
        # drivers/siph.py: after any error (garbage, closed connection) the connection is
        # dropped and the error raised; the apply is not settled by a read-back
        wire=WireFaults(inject, lost_write_reply_raises=True),
        partial_stops_at_failed_make=False,
    )


_Builder = Callable[[AsyncExitStack, EmulatedFabricDevices, RebootGate], Awaitable[Harness]]
_BUILDERS: dict[str, _Builder] = {
    "emulated": _emulated,
    "tl1": _tl1,
    "restconf": _restconf,
    "siph": _siph,
}


@pytest_asyncio.fixture(params=DRIVERS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """An opened driver of each model with its emulated device; everything closed after."""
    name: str = request.param
    gate = RebootGate()
    async with AsyncExitStack() as stack:
        built = await _BUILDERS[name](stack, EmulatedFabricDevices(sleep=gate.sleep), gate)
        stack.callback(gate.release)  # first on exit: never leave a reboot hanging
        yield built
