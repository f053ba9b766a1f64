"""Self-fencing down to the wire: a controller that may no longer command devices (its leader
lease's authority ran out, e.g. the process was paused past it) sends nothing, not even a read
or a logout, through any driver family; and ``LeaderElection.may_command`` turns False at the
lease's authority deadline by the clock alone, before any task has run."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lightrail.controller.store.election import LeaderElection
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.drivers.base import CrossConnect, NotLeader, SwitchCapabilities, SwitchKind
from lightrail.drivers.base import SwitchSpec as Spec
from lightrail.drivers.options import DriverContext
from lightrail.drivers.registry import DriverRegistry
from lightrail.emulator.driver import make_driver as make_emulated
from lightrail.emulator.ocs import EmulatedFabricDevices, EmulatedOcs
from lightrail.emulator.servers.fabric import EMULATOR_PASSWORD, EMULATOR_USER
from lightrail.emulator.servers.mzi import MziMeshServer
from lightrail.emulator.servers.restconf import RestconfServer
from lightrail.emulator.servers.tl1 import Tl1Server

CAPS = SwitchCapabilities(kind=SwitchKind.NXN, port_count=8, atomic_bulk=True,
                          settle_time_s=0.0)
XC = CrossConnect(1, 9)


class Gate:
    """A command gate the test opens and closes."""

    def __init__(self) -> None:
        self.open = True

    def __call__(self) -> bool:
        return self.open


async def exercise(driver_spec: Spec, device: EmulatedOcs, commands: Callable[[], int]) -> None:
    """Open a driver with an open gate, switch once, close the gate: every later call raises
    ``NotLeader`` and neither the device nor its front end receives anything, close included."""
    gate = Gate()
    driver = DriverRegistry().create(driver_spec, DriverContext(command_gate=gate))
    await driver.open()
    await driver.apply(frozenset({XC}), frozenset({XC.ingress, XC.egress}))
    assert device.cross_connects == frozenset({XC})
    gate.open = False
    before_device, before_wire = device.command_count, commands()
    with pytest.raises(NotLeader, match="may no longer command"):
        await driver.get_cross_connects()
    with pytest.raises(NotLeader):
        await driver.apply(frozenset(), frozenset({XC.ingress, XC.egress}))
    await driver.close()
    assert device.command_count == before_device
    assert commands() == before_wire
    assert device.cross_connects == frozenset({XC})


async def test_tl1_driver_sends_nothing_once_the_gate_closes() -> None:
    device = EmulatedOcs("tl1-sw", CAPS)
    async with Tl1Server(device, users={EMULATOR_USER: EMULATOR_PASSWORD}) as server:
        spec = Spec("tl1-sw", "tl1", CAPS, {"host": "127.0.0.1", "port": server.port,
                                            "username": EMULATOR_USER,
                                            "password": EMULATOR_PASSWORD})
        await exercise(spec, device, lambda: len(server.commands))
        assert server.commands[-1].code != "CANC-USER"  # not even a logout


async def test_restconf_driver_sends_nothing_once_the_gate_closes() -> None:
    device = EmulatedOcs("rc-sw", CAPS)
    async with RestconfServer(device, username=EMULATOR_USER,
                              password=EMULATOR_PASSWORD) as server:
        spec = Spec("rc-sw", "restconf", CAPS, {"host": "127.0.0.1", "port": server.port,
                                                "username": EMULATOR_USER,
                                                "password": EMULATOR_PASSWORD})
        await exercise(spec, device, lambda: device.command_count)


async def test_siph_driver_sends_nothing_once_the_gate_closes() -> None:
    async with MziMeshServer("mzi", 8) as server:
        spec = Spec("mzi", "siph", SwitchCapabilities(
            kind=SwitchKind.NXN, port_count=8, atomic_bulk=True, settle_time_s=0.0),
            {"host": "127.0.0.1", "port": server.port})
        await exercise(spec, server.ocs, lambda: len(server.received))


async def test_emulated_driver_honours_the_gate() -> None:
    devices = EmulatedFabricDevices()
    gate = Gate()
    driver = make_emulated(Spec("e", "emulated", CAPS), devices, gate)
    await driver.open()
    gate.open = False
    with pytest.raises(NotLeader):
        await driver.get_cross_connects()
    assert devices["e"].command_count == 1  # the open's info only


async def test_may_command_ends_at_the_lease_authority_by_the_clock_alone(
        etcd: EmbeddedEtcd) -> None:
    now = [1000.0]
    store = EtcdStore.connect(etcd.endpoint, clock=lambda: now[0])
    async with store:
        election = LeaderElection(store, "replica-a", ttl_s=4)
        await election.campaign()
        lease = election.lease
        assert lease is not None and election.may_command()
        # granted at t=1000: authority for half the TTL from the grant's send time
        assert lease.authority.until_s == pytest.approx(1000.0 + lease.ttl_s / 2)
        now[0] = lease.authority.until_s - 1e-3
        assert election.may_command()
        now[0] = lease.authority.until_s  # the process "wakes up" here: no task has run yet
        assert election.is_leader.is_set() and not election.may_command()
        await election.resign()
        assert not election.may_command()
