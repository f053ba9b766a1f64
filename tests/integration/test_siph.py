"""The silicon-photonic MZI driver against the emulated MZI mesh over real TCP sockets: apply and
read back, partial and full permutations, idempotence, re-routes outside the ports given,
calibration, heater faults, partial writes, garbage and cut replies, timeouts, restarts,
reboots, power, port admin, alarms and the config factory."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from lightrail.drivers.base import (
    AlarmSeverity,
    ApplyMode,
    ApplyResult,
    CrossConnect,
    CrossConnectConflict,
    DeviceTimeout,
    DeviceUnreachable,
    Driver,
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
from lightrail.drivers.siph import driver as siph
from lightrail.drivers.siph.benes import BenesNetwork, Element
from lightrail.drivers.siph.calibration import CalibrationTable, ElementCalibration
from lightrail.drivers.siph.driver import (
    HeaterChannelFault,
    ReroutingRequired,
    SiphDriver,
)
from lightrail.drivers.siph.wire import QontrolError
from lightrail.emulator.ocs import (
    CONNECTED_POWER_DBM,
    NO_LIGHT_DBM,
    ChangeAction,
    EmulatedFabricDevices,
)
from lightrail.emulator.servers.mzi import MziMeshServer

N = 8
SETTLE_S = 10e-6
ALL = frozenset(range(1, 2 * N + 1))
CAPS = SwitchCapabilities(SwitchKind.NXN, N, atomic_bulk=True, settle_time_s=SETTLE_S)


def xc(ingress: int, egress: int) -> CrossConnect:
    return CrossConnect(ingress, egress)


def full_permutation(size: int, outputs: list[int]) -> frozenset[CrossConnect]:
    """Cross-connects ingress i+1 -> egress size+1+outputs[i]."""
    return frozenset(xc(i + 1, size + 1 + o) for i, o in enumerate(outputs))


FULL = full_permutation(N, [3, 6, 1, 0, 7, 2, 5, 4])


class Gate:
    """The emulated device's sleep: settle times pass at once; an injected slow-device delay
    (>= 1 s) blocks until ``release`` — no test waits on the wall clock for an event."""

    def __init__(self) -> None:
        self._open = asyncio.Event()

    async def sleep(self, delay_s: float) -> None:
        if delay_s >= 1.0:
            await self._open.wait()
        else:
            await asyncio.sleep(0)

    def release(self) -> None:
        self._open.set()


@pytest_asyncio.fixture
async def gate() -> AsyncIterator[Gate]:
    g = Gate()
    yield g
    g.release()


ServerFactory = Callable[..., Awaitable[MziMeshServer]]


@pytest_asyncio.fixture
async def make_server(gate: Gate) -> AsyncIterator[ServerFactory]:
    servers: list[MziMeshServer] = []

    async def make(size: int = N, **kwargs: object) -> MziMeshServer:
        server = MziMeshServer(f"mzi{len(servers)}", size, sleep=gate.sleep, **kwargs)  # type: ignore[arg-type]
        await server.start()
        servers.append(server)
        return server

    yield make
    gate.release()
    for server in servers:
        await server.stop()


@pytest_asyncio.fixture
async def server(make_server: ServerFactory) -> MziMeshServer:
    return await make_server()


DriverFactory = Callable[..., Awaitable[SiphDriver]]


@pytest_asyncio.fixture
async def make_driver(server: MziMeshServer) -> AsyncIterator[DriverFactory]:
    drivers: list[SiphDriver] = []

    async def make(
        target: MziMeshServer | None = None, *, open_: bool = True, **kwargs: object
    ) -> SiphDriver:
        srv = target if target is not None else server
        caps = SwitchCapabilities(
            SwitchKind.NXN, srv.network.size, atomic_bulk=True, settle_time_s=SETTLE_S
        )
        driver = SiphDriver(srv.ocs.switch_id, caps, host=srv.host, port=srv.port, **kwargs)  # type: ignore[arg-type]
        if open_:
            await driver.open()
        drivers.append(driver)
        return driver

    yield make
    for driver in drivers:
        await driver.close()


@pytest_asyncio.fixture
async def driver(make_driver: DriverFactory) -> SiphDriver:
    return await make_driver()


def vector_writes(server: MziMeshServer) -> int:
    return sum(1 for line in server.received if line.lower().startswith("vvec"))


# --- apply and read back -----------------------------------------------------------------------


async def test_is_a_driver_and_identifies_the_device(driver: SiphDriver) -> None:
    assert isinstance(driver, Driver)
    info = await driver.info()
    assert info.firmware == "Q8iv-0001"
    assert info.model == "mzi-benes-8x8"
    assert info.capabilities == SwitchCapabilities(
        SwitchKind.NXN, N, atomic_bulk=True, settle_time_s=SETTLE_S, max_batch=None,
        readback=True,
    )
    assert driver.mesh_properties.reroutes_outside_ports


async def test_apply_and_read_back(driver: SiphDriver, server: MziMeshServer) -> None:
    target = frozenset({xc(1, 10), xc(2, 9)})
    result = await driver.apply(target, ALL)
    assert result == ApplyResult(removed=(), added=(xc(1, 10), xc(2, 9)), verified=True)
    assert await driver.get_cross_connects() == target
    assert server.cross_connects == target  # the unused inputs are dark
    assert vector_writes(server) == 1
    makes = [r for r in server.ocs.change_log if r.action is ChangeAction.MAKE]
    assert {r.cross_connect for r in makes} == target
    power = await driver.get_power()
    assert {p for p, dbm in power.items() if dbm == CONNECTED_POWER_DBM} == {1, 2, 9, 10}
    assert all(power[p] == NO_LIGHT_DBM for p in ALL - {1, 2, 9, 10})


async def test_full_permutation_is_one_vector_write_and_one_settle(
    driver: SiphDriver, server: MziMeshServer
) -> None:
    result = await driver.apply(FULL, ALL)
    assert set(result.added) == FULL
    assert await driver.get_cross_connects() == FULL
    assert server.cross_connects == FULL
    assert vector_writes(server) == 1
    makes = server.ocs.change_log
    assert len(makes) == N and {r.action for r in makes} == {ChangeAction.MAKE}
    assert len({r.at_s for r in makes}) == 1  # every element switched in the one write
    states = server.element_states
    assert None not in states  # a full permutation sets every element bar or cross
    cal = CalibrationTable.uniform(N)
    assert server.setpoints_v[: len(states)] == cal.setpoints(states)
    assert set(server.setpoints_v[len(states):]) == {0.0}  # spare channels of the chain


async def test_idempotent_reapply_issues_no_write(
    driver: SiphDriver, server: MziMeshServer
) -> None:
    target = frozenset({xc(1, 12), xc(5, 9), xc(8, 16)})
    await driver.apply(target, ALL)
    assert await driver.apply(target, ALL) == ApplyResult()
    assert await driver.apply(target, frozenset({1, 12, 5, 9, 8, 16})) == ApplyResult()
    assert vector_writes(server) == 1 and server.writes == 1
    replaced = await driver.apply(target, ALL, ApplyMode.REPLACE)
    assert set(replaced.removed) == target and set(replaced.added) == target
    assert vector_writes(server) == 2
    assert await driver.get_cross_connects() == target


async def test_partial_permutations_keep_other_ports(driver: SiphDriver) -> None:
    job_a = frozenset({xc(1, 10), xc(2, 9)})
    ports_a = frozenset({1, 2, 9, 10})
    job_b = frozenset({xc(3, 12), xc(4, 11), xc(5, 13)})
    ports_b = frozenset({3, 4, 5, 11, 12, 13})
    await driver.apply(job_a, ports_a)
    result = await driver.apply(job_b, ports_b)
    assert set(result.added) == job_b and result.removed == ()
    assert await driver.get_cross_connects() == job_a | job_b
    changed = frozenset({xc(3, 11), xc(4, 13), xc(5, 12)})
    result = await driver.apply(changed, ports_b)
    assert set(result.removed) == job_b and set(result.added) == changed
    assert await driver.get_cross_connects() == job_a | changed
    assert await driver.apply(frozenset(), ports_b) == ApplyResult(
        removed=tuple(sorted(changed)), added=(), verified=True
    )
    assert await driver.get_cross_connects() == job_a


async def test_request_errors(driver: SiphDriver) -> None:
    await driver.apply(frozenset({xc(1, 10)}), frozenset({1, 10}))
    with pytest.raises(InvalidPort, match="port 17"):
        await driver.apply(frozenset(), frozenset({17}))
    with pytest.raises(InvalidPort, match="leaves the ports given"):
        await driver.apply(frozenset({xc(2, 11)}), frozenset({2}))
    with pytest.raises(InvalidPort, match="outside them"):
        await driver.apply(frozenset(), frozenset({1}))  # 1->10 also uses port 10
    with pytest.raises(CrossConnectConflict):
        await driver.apply(frozenset({xc(2, 11), xc(3, 11)}), frozenset({2, 3, 11}))
    with pytest.raises(InvalidPort, match="not an egress port"):
        await driver.apply(frozenset({xc(2, 3)}), frozenset({2, 3}))
    assert await driver.get_cross_connects() == frozenset({xc(1, 10)})


async def test_sixty_four_port_full_permutation(
    make_server: ServerFactory, make_driver: DriverFactory
) -> None:
    server = await make_server(64)
    driver = await make_driver(server)
    rng = random.Random(64)
    outputs = list(range(64))
    rng.shuffle(outputs)
    target = full_permutation(64, outputs)
    await driver.apply(target, frozenset(range(1, 129)))
    assert await driver.get_cross_connects() == target
    assert server.cross_connects == target
    assert server.channel_count == 352  # 11 stages x 32 elements, 44 eight-channel modules
    # a job swaps two destinations; the rest keep their mapping
    a, b = 1, 2
    ea, eb = 64 + 1 + outputs[0], 64 + 1 + outputs[1]
    swapped = frozenset({xc(a, eb), xc(b, ea)})
    await driver.apply(swapped, frozenset({a, b, ea, eb}))
    expected = (target - {xc(a, ea), xc(b, eb)}) | swapped
    assert await driver.get_cross_connects() == expected
    assert server.cross_connects == expected


# --- fillers and re-routes (the Beneš caveats) -------------------------------------------------


async def test_a_filler_path_that_cannot_be_darkened(
    driver: SiphDriver, server: MziMeshServer, make_driver: DriverFactory
) -> None:
    # seven connections: the last unused ingress (8) necessarily reaches the last unused
    # egress (16); the driver reports only what was asked for
    seven = frozenset(xc(i, N + i) for i in range(1, 8))
    await driver.apply(seven, ALL)
    assert await driver.get_cross_connects() == seven
    assert server.cross_connects == seven | {xc(8, 16)}
    # a new driver instance cannot know the filler was not asked for
    fresh = await make_driver()
    assert await fresh.get_cross_connects() == seven | {xc(8, 16)}


async def test_reroutes_outside_ports_are_reported_or_refused(
    make_driver: DriverFactory, server: MziMeshServer
) -> None:
    lenient = await make_driver()
    strict = await make_driver(reroute_outside_ports=False)
    await lenient.apply(FULL, ALL)
    by_ingress = {x.ingress: x.egress for x in FULL}
    found: ReroutingRequired | None = None
    for a in range(1, N + 1):
        for b in range(a + 1, N + 1):
            ports = frozenset({a, b, by_ingress[a], by_ingress[b]})
            target = frozenset({xc(a, by_ingress[b]), xc(b, by_ingress[a])})
            before = (server.writes, server.cross_connects, server.setpoints_v)
            try:
                await strict.apply(target, ports)
            except ReroutingRequired as e:
                assert (server.writes, server.cross_connects, server.setpoints_v) == before
                found = e
                break
            by_ingress[a], by_ingress[b] = by_ingress[b], by_ingress[a]
        if found is not None:
            break
    assert found is not None, "no swap on 8 ports needed a re-route"
    state = server.cross_connects
    server.ocs.clear_change_log()
    await lenient.apply(target, ports)
    assert lenient.last_rerouted == frozenset(found.rerouted) == server.last_rerouted
    outside = state - {xc(a, by_ingress[a]), xc(b, by_ingress[b])}
    assert outside <= server.cross_connects  # mapping kept...
    log = server.ocs.change_log
    for rerouted in found.rerouted:  # ...but each glitched for one settle time
        records = [r for r in log if r.cross_connect == rerouted]
        assert [r.action for r in records] == [ChangeAction.BREAK, ChangeAction.MAKE]
        assert records[1].at_s - records[0].at_s >= SETTLE_S - 1e-9


# --- calibration --------------------------------------------------------------------------------


def siph_switch(port: int, size: int = N, **options: str | int | float | bool) -> SwitchSpec:
    caps = SwitchCapabilities(SwitchKind.NXN, size, atomic_bulk=True, settle_time_s=SETTLE_S)
    return SwitchSpec("mzi0", "siph", caps, {"port": port, **options})


async def test_calibration_table_sets_the_heater_setpoints(
    make_server: ServerFactory,
) -> None:
    element = Element(2, 1)
    channel = BenesNetwork(N).channel(element)
    truth = CalibrationTable.uniform(N).with_element(element, ElementCalibration(0.8, 3.1))
    server = await make_server(calibration=truth)
    calibrated = siph.make_driver(
        siph_switch(server.port, calibration="2.1:0.8:3.1"), DriverContext()
    )
    default = siph.make_driver(siph_switch(server.port), DriverContext())
    assert isinstance(calibrated, SiphDriver) and isinstance(default, SiphDriver)
    assert calibrated.calibration == truth
    await calibrated.open()
    await default.open()
    try:
        await calibrated.apply(FULL, ALL)
        assert server.setpoints_v[channel] in (0.8, 3.1)
        assert server.cross_connects == FULL  # the optics agree with the driver
        reverse = full_permutation(N, list(reversed(range(N))))
        await default.apply(reverse, ALL)
        assert server.setpoints_v[channel] in (1.5, 2.5)  # the table changed what was written
        # with the wrong table that element sits between its states: its two paths go dark,
        # which only the optical power shows (heater read-back cannot)
        lost = reverse - server.cross_connects
        assert len(lost) == 2
        power = await default.get_power()
        assert all(power[x.ingress] == NO_LIGHT_DBM for x in lost)
    finally:
        await calibrated.close()
        await default.close()


def test_calibration_parsing_and_errors(tmp_path: Path) -> None:
    table = CalibrationTable.parse(4, "0.1:1.1:2.2; 2.0:0.5:3.0", v_bar=1.0, v_cross=2.0)
    assert table.elements[1] == ElementCalibration(1.1, 2.2)
    assert table.elements[4] == ElementCalibration(0.5, 3.0)
    assert table.elements[0] == ElementCalibration(1.0, 2.0)
    with pytest.raises(ValueError, match="calibration: entry 'x'"):
        CalibrationTable.parse(4, "x")
    with pytest.raises(ValueError, match="element"):
        CalibrationTable.parse(4, "3.0:1:2")
    with pytest.raises(ValueError, match="within 2 \\* tolerance_v"):
        CalibrationTable.parse(4, "0.0:1.0:1.05")
    with pytest.raises(ValueError, match="v_bar: must be a finite voltage"):
        ElementCalibration(-1.0, 2.0)
    path = tmp_path / "cal.json"
    path.write_text(
        '{"v_bar": 1.2, "v_cross": 2.4, "elements": [{"stage": 1, "row": 0, "v_bar": 0.9,'
        ' "v_cross": 2.9}]}'
    )
    driver = siph.make_driver(siph_switch(1234, 4, calibration_file=str(path)), DriverContext())
    assert isinstance(driver, SiphDriver)
    assert driver.calibration.elements[2] == ElementCalibration(0.9, 2.9)
    assert driver.calibration.elements[0] == ElementCalibration(1.2, 2.4)


@pytest.mark.parametrize(
    ("switch", "match"),
    [
        (siph_switch(0), r"\.options\.port \(model 'siph'\): .*greater than or equal to 1, got 0"),
        (SwitchSpec("mzi0", "siph", CAPS), r"\.options\.port \(model 'siph'\): required"),
        (siph_switch(1, 12), r"\.model 'siph': size: must be a power of two"),
        (siph_switch(1, 128), r"\.model 'siph': size: must be a power of two"),
        (siph_switch(1, calibration="9.9:1:2"), r"\.options\.calibration \(model 'siph'\)"),
        (siph_switch(1, v_bar="high"), r"\.options\.v_bar \(model 'siph'\): .*got 'high'"),
        (siph_switch(1, colour="blue"), r"\.options\.colour \(model 'siph'\): unknown option"),
        (siph_switch(1, calibration_file="/nonexistent/cal.json"),
         r"\.options\.calibration_file \(model 'siph'\): .*nonexistent"),
        (siph_switch(1, calibration_file="c.json", v_bar=1.0),
         r"\.options\.v_bar \(model 'siph'\): give it in calibration_file, not both"),
        (siph_switch(1, timeout_s=0), r"\.options\.timeout_s \(model 'siph'\)"),
        (siph_switch(1, darken_unused=1), r"\.options\.darken_unused \(model 'siph'\)"),
    ],
)
def test_make_driver_rejects_bad_config(switch: SwitchSpec, match: str) -> None:
    with pytest.raises(DriverConfigError, match="^switches\\[mzi0\\]" + match):
        siph.make_driver(switch, DriverContext())


def test_a_mistyped_option_is_rejected_naming_the_switch_and_the_key() -> None:
    with pytest.raises(DriverConfigError) as e:
        DriverRegistry().create(siph_switch(1, timout_s=2))
    assert str(e.value).startswith("switches[mzi0].options.timout_s (model 'siph'): unknown")
    assert "got 2" in str(e.value)


def test_make_driver_rejects_a_duplex_switch() -> None:
    caps = SwitchCapabilities(SwitchKind.DUPLEX, N, atomic_bulk=True, settle_time_s=SETTLE_S)
    switch = SwitchSpec("mzi0", "siph", caps, {"port": 1})
    with pytest.raises(DriverConfigError, match="nxn"):
        siph.make_driver(switch, DriverContext())


# --- heater faults and partial writes -----------------------------------------------------------


async def test_over_current_is_a_hardware_fault_naming_the_channel(
    driver: SiphDriver, server: MziMeshServer
) -> None:
    channel = 7
    server.set_imax(channel, 1.0)  # 1 mA: any bar or cross set-point over-currents
    with pytest.raises(HardwareFault, match="over-current on heater channel 7") as e:
        await driver.apply(FULL, ALL)
    assert isinstance(e.value, HeaterChannelFault)
    assert e.value.code is QontrolError.OVER_CURRENT
    assert e.value.channel == channel
    assert e.value.element == Element(1, 3)
    assert not e.value.retryable
    assert server.writes == 0 and server.cross_connects == frozenset()  # rejected as a whole
    server.set_imax(channel, 20.0)
    await driver.apply(FULL, ALL)
    assert await driver.get_cross_connects() == FULL


async def test_output_error_is_a_partial_apply(driver: SiphDriver, server: MziMeshServer) -> None:
    server.stick_channels({0})  # first-stage element of ingress 1 and 2 stays off
    with pytest.raises(PartialApply) as e:
        await driver.apply(FULL, ALL)
    failed = {x for x in FULL if x.ingress in (1, 2)}
    assert set(e.value.result.failed) == failed
    assert all("output error on heater channel 0" in r for r in e.value.result.failed.values())
    assert set(e.value.result.added) == FULL - failed
    assert server.cross_connects == FULL - failed
    assert await driver.get_cross_connects() == FULL - failed
    server.clear_faults()
    result = await driver.apply(FULL, ALL)
    assert set(result.added) == failed


async def test_a_silently_stuck_channel_fails_verification(
    driver: SiphDriver, server: MziMeshServer
) -> None:
    server.stick_channels({0}, silent=True)
    with pytest.raises(VerificationMismatch) as e:
        await driver.apply(FULL, ALL)
    assert set(e.value.missing) == {x for x in FULL if x.ingress in (1, 2)}
    assert e.value.unexpected == ()


async def test_failed_port_rejects_the_write(driver: SiphDriver, server: MziMeshServer) -> None:
    server.ocs.fail_port(3)
    with pytest.raises(PartialApply) as e:
        await driver.apply(FULL, ALL)
    assert e.value.result.added == () and set(e.value.result.failed) == FULL
    assert "output error on heater channel 1" in next(iter(e.value.result.failed.values()))
    assert server.cross_connects == frozenset() and server.writes == 0
    status = await driver.get_port_status([3, 4])
    assert [s.oper for s in status] == [PortOper.FAILED, PortOper.DOWN]


# --- wire faults --------------------------------------------------------------------------------


async def test_garbage_reply_then_recovery(driver: SiphDriver, server: MziMeshServer) -> None:
    server.garble_next_replies(1)
    with pytest.raises(ProtocolError, match="non-ASCII reply to 'vall\\?'"):
        await driver.get_cross_connects()
    assert await driver.get_cross_connects() == frozenset()
    server.garble_next_replies(1, after=1)  # the reply to the vector write
    with pytest.raises(ProtocolError, match="vvec0"):
        await driver.apply(FULL, ALL)
    assert server.writes == 1  # the device did take it
    assert await driver.apply(FULL, ALL) == ApplyResult()  # read back: already in place
    assert await driver.get_cross_connects() == FULL


async def test_connection_closed_mid_reply_then_recovery(
    driver: SiphDriver, server: MziMeshServer
) -> None:
    server.close_mid_next_reply()  # half of the 24 lines of vall?
    with pytest.raises(DeviceUnreachable, match="mid-reply to 'vall\\?'"):
        await driver.get_cross_connects()
    assert await driver.get_cross_connects() == frozenset()
    server.close_mid_next_reply(after=1)  # "OK" to the vector write cut to "O"
    with pytest.raises(DeviceUnreachable, match=r"mid-reply to 'vvec0=\.\.\.'"):
        await driver.apply(FULL, ALL)
    assert await driver.apply(FULL, ALL) == ApplyResult()
    assert await driver.get_cross_connects() == FULL


async def test_slow_device_times_out_then_recovers(
    make_driver: DriverFactory, server: MziMeshServer, gate: Gate
) -> None:
    driver = await make_driver(timeout_s=0.05)
    server.ocs.set_extra_delay(5.0)  # blocks on the gate, never on the wall clock
    with pytest.raises(DeviceTimeout, match="vall"):
        await driver.get_cross_connects()
    server.ocs.set_extra_delay(0.0)
    gate.release()
    assert await driver.get_cross_connects() == frozenset()


async def test_unreachable_device(driver: SiphDriver, server: MziMeshServer) -> None:
    server.ocs.set_unreachable(True)
    with pytest.raises(DeviceUnreachable, match="closed the connection"):
        await driver.apply(FULL, ALL)
    server.ocs.set_unreachable(False)
    await driver.apply(FULL, ALL)
    assert await driver.get_cross_connects() == FULL


async def test_connection_refused_and_not_open(
    make_server: ServerFactory, make_driver: DriverFactory
) -> None:
    gone = await make_server()
    await gone.stop()
    driver = await make_driver(gone, open_=False)
    with pytest.raises(DeviceUnreachable, match="driver is not open"):
        await driver.get_cross_connects()
    with pytest.raises(DeviceUnreachable, match=r"connect to 127\.0\.0\.1"):
        await driver.open()


# --- restarts and reboots -----------------------------------------------------------------------


async def test_reconnect_after_restart(driver: SiphDriver, server: MziMeshServer) -> None:
    await driver.apply(FULL, ALL)
    await server.stop()
    with pytest.raises(DeviceUnreachable):
        await driver.get_cross_connects()
    await server.start()  # same port, state kept
    assert await driver.get_cross_connects() == FULL
    await driver.apply(frozenset(), ALL)
    assert await driver.get_cross_connects() == frozenset()


async def test_reboot_keeps_or_loses_the_heaters(
    driver: SiphDriver, server: MziMeshServer
) -> None:
    await driver.apply(FULL, ALL)
    await server.reboot(keep_cross_connects=True)
    assert await driver.get_cross_connects() == FULL
    server.ocs.clear_change_log()
    await server.reboot(keep_cross_connects=False)
    assert await driver.get_cross_connects() == frozenset()  # 0 V: every element off
    assert {r.cross_connect for r in server.ocs.change_log} == FULL
    assert set(server.setpoints_v) == {0.0}
    await driver.apply(FULL, ALL)
    assert await driver.get_cross_connects() == FULL


# --- ports, power, alarms -----------------------------------------------------------------------


async def test_port_admin_and_status(driver: SiphDriver) -> None:
    await driver.apply(frozenset({xc(1, 10)}), frozenset({1, 10}))
    await driver.set_port_admin(1, PortAdmin.DISABLED)
    status = await driver.get_port_status([1, 10, 2])
    assert [(s.port, s.admin, s.oper) for s in status] == [
        (1, PortAdmin.DISABLED, PortOper.DOWN),
        (10, PortAdmin.ENABLED, PortOper.DOWN),
        (2, PortAdmin.ENABLED, PortOper.DOWN),
    ]
    assert await driver.get_power([1, 10]) == {1: NO_LIGHT_DBM, 10: NO_LIGHT_DBM}
    await driver.set_port_admin(1, PortAdmin.ENABLED)
    assert await driver.get_power([1, 10]) == {1: CONNECTED_POWER_DBM, 10: CONNECTED_POWER_DBM}
    with pytest.raises(InvalidPort):
        await driver.get_power([0])
    with pytest.raises(InvalidPort):
        await driver.set_port_admin(17, PortAdmin.DISABLED)


async def test_alarms_are_delivered_until_close(
    driver: SiphDriver, server: MziMeshServer
) -> None:
    stream = await driver.subscribe_alarms()
    assert server.alarm_streams == 1
    server.ocs.fail_port(5, "LOS")
    alarm = await asyncio.wait_for(anext(stream), 5.0)
    assert (alarm.switch_id, alarm.port, alarm.condition, alarm.severity) == (
        server.ocs.switch_id, 5, "LOS", AlarmSeverity.MAJOR,
    )
    server.ocs.repair_port(5)
    cleared = await asyncio.wait_for(anext(stream), 5.0)
    assert cleared.severity is AlarmSeverity.CLEARED
    lazy = driver.events()
    await driver.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(stream), 5.0)
    with pytest.raises(DeviceUnreachable):
        await anext(lazy)


# --- faults injected on the wrapped EmulatedOcs (as lightrail.emulator.control does)
# ----------------------


async def test_wraps_a_registered_device(
    make_server: ServerFactory, make_driver: DriverFactory, gate: Gate
) -> None:
    devices = EmulatedFabricDevices(sleep=gate.sleep)
    ocs = devices.ensure("mzi-reg", CAPS)
    server = await make_server(ocs=ocs)
    assert server.ocs is devices["mzi-reg"]
    driver = await make_driver(server)
    await driver.apply(FULL, ALL)
    assert devices["mzi-reg"].cross_connects == FULL
    with pytest.raises(ValueError, match="ocs"):
        MziMeshServer("x", 16, ocs=ocs)


async def test_reboot_behind_the_servers_back_zeroes_the_heaters(
    driver: SiphDriver, server: MziMeshServer
) -> None:
    await driver.apply(FULL, ALL)
    await server.ocs.reboot(keep_cross_connects=False)  # what lightrail.emulator.control does
    assert await driver.get_cross_connects() == frozenset()
    assert set(server.setpoints_v) == {0.0} and server.cross_connects == frozenset()
    await driver.apply(FULL, ALL)
    assert server.cross_connects == FULL


async def test_failed_make_becomes_stuck_heaters(
    driver: SiphDriver, server: MziMeshServer
) -> None:
    server.ocs.fail_make(3)  # control API "partial_apply"
    with pytest.raises(PartialApply) as e:
        await driver.apply(FULL, ALL)
    result = e.value.result
    assert result.failed and set(result.added) | set(result.failed) == FULL
    assert server.cross_connects == set(result.added)  # optics follow the heaters
    assert await driver.get_cross_connects() == set(result.added)
    await driver.apply(FULL, ALL)
    assert server.cross_connects == FULL


async def test_silently_dropped_make_shows_only_in_power(
    driver: SiphDriver, server: MziMeshServer
) -> None:
    server.ocs.drop_makes_silently(3)
    await driver.apply(FULL, ALL)
    (on_3,) = [x for x in FULL if x.ingress == 3]
    assert server.cross_connects == FULL - {on_3}
    assert (await driver.get_power([3]))[3] == NO_LIGHT_DBM


async def test_wire_protocol_replies_and_error_codes(server: MziMeshServer) -> None:
    # commands and error lines as in Qontrol's qontrol.py: [header][ch][=|?][value]\n,
    # "OK" to a set, errors matching [A-Za-z]{1,3}(\d+):(\d+)
    reader, writer = await asyncio.open_connection(server.host, server.port)

    async def ask(line: str, lines: int = 1) -> list[str]:
        writer.write(f"{line}\n".encode("ascii"))
        await writer.drain()
        return [(await reader.readline()).decode("ascii").rstrip("\n") for _ in range(lines)]

    try:
        assert await ask("id?") == ["Q8iv-0001"]
        assert await ask("nchan?") == ["24"]
        assert await ask("vfull?") == ["12.000 V"]
        assert await ask("ifull?") == ["24.000 mA"]
        assert await ask("v3=1.5") == ["OK"]
        assert await ask("v3?") == ["1.5000"]
        assert await ask("i3?") == ["6.0000"]  # 1.5 V on 250 ohm
        assert await ask("i3=10") == ["OK"]  # 10 mA -> 2.5 V
        assert await ask("V3?") == ["2.5000"]
        assert await ask("imax3?") == ["20.0000"]
        assert await ask("vvec20=0.5,0.25") == ["OK"]  # spare channels of the chain
        all_v = await ask("vall?", 24)
        assert all_v[3] == "2.5000" and all_v[20:22] == ["0.5000", "0.2500"]
        assert await ask("v99=1") == ["E12:99"]  # unrecognised channel
        assert await ask("v1=abc") == ["E11:01"]  # unrecognised input parameter
        assert await ask("v1=13") == ["E01:01"]  # over-voltage (above vfull)
        assert await ask("v1=6") == ["E02:01"]  # over-current: 24 mA > 20 mA
        assert await ask("vvec22=1,2,3") == ["E12:24"]  # runs past the last channel
        assert await ask("vvec0=1,9") == ["E02:01"]  # the whole vector is rejected...
        assert (await ask("v0?")) == ["0.0000"]  # ...nothing changed
        assert await ask("foo?") == ["E10:00"]  # unrecognised command
        assert len(await ask("lrpwr?", 2 * N)) == 2 * N
    finally:
        writer.close()
        await writer.wait_closed()
