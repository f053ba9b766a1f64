"""The operators' port readout (``lightrail ports``) against emulated switches: states and power
as the device reports them, joined with the confirmed cross-connects, endpoints and jobs; a
device that does not report power leaves it absent (never 0); one that does not answer fails
the readout naming the switch."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.domain.fabric import rail_fabric
from lightrail.controller.domain.model import RankPlacement
from lightrail.controller.runtime.ports import PortReader, PortReadError
from lightrail.drivers.base import CrossConnect, Driver, PortAdmin, PortOper, SwitchKind
from lightrail.drivers.tl1.errors import UnsupportedOperation
from lightrail.emulator.driver import EmulatedDriver
from lightrail.emulator.ocs import CONNECTED_POWER_DBM, EmulatedFabricDevices, EmulatedOcs

N = 4


class NoPowerDriver(EmulatedDriver):
    """A device without power monitors (a TL1 switch refusing RTRV-PORT-POWER)."""

    async def get_power(self, ports: Iterable[int] | None = None) -> dict[int, float]:
        raise UnsupportedOperation(self.switch_id, "RTRV-PORT-POWER: no power monitors")


async def _rig(no_power: bool = False) -> tuple[PortReader, EmulatedFabricDevices,
                                                PhaseCoordinator]:
    fabric = rail_fabric("t", N, 2, delay_s=0.0)
    coord = PhaseCoordinator(fabric)
    coord.register_job("job", "tenant", [RankPlacement(r, f"host{r // 2}", r % 2)
                                         for r in range(8)])
    devices = EmulatedFabricDevices()
    drivers: dict[str, Driver] = {}
    for sid, sw in fabric.switches.items():
        assert sw.capabilities.kind is SwitchKind.NXN
        xcs = {CrossConnect(1, N + 2)} if sid == "ocs-rail0" else set()
        devices.add(EmulatedOcs(sid, sw.capabilities, cross_connects=xcs))
        drv = (NoPowerDriver if no_power else EmulatedDriver)(sid, devices)
        await drv.open()
        drivers[sid] = drv
        coord.set_confirmed(sid, xcs)
    return PortReader(drivers, coord), devices, coord


async def test_ports_join_device_state_with_circuits_endpoints_and_jobs() -> None:
    reader, devices, _ = await _rig()
    await devices["ocs-rail0"].set_port_admin(3, PortAdmin.DISABLED)
    ports = {p.port: p for p in await reader.read("ocs-rail0")}
    assert sorted(ports) == list(range(1, 2 * N + 1))
    p1, p6 = ports[1], ports[N + 2]
    assert (p1.connected_to, p6.connected_to) == (N + 2, 1)
    assert (p1.endpoint, p6.endpoint) == ("host0/nic0", "host1/nic0")
    assert p1.job_id == "job" and p1.admin is PortAdmin.ENABLED and p1.oper is PortOper.UP
    assert p1.power_dbm == CONNECTED_POWER_DBM
    assert ports[3].admin is PortAdmin.DISABLED and ports[3].connected_to is None
    assert ports[2].power_dbm is not None and ports[2].power_dbm < CONNECTED_POWER_DBM


async def test_power_a_device_does_not_report_is_absent_not_zero() -> None:
    reader, _, _ = await _rig(no_power=True)
    ports = await reader.read("ocs-rail0")
    assert [p.power_dbm for p in ports] == [None] * (2 * N)
    assert ports[0].oper is PortOper.UP  # the states still come through


async def test_a_switch_that_does_not_answer_fails_naming_it() -> None:
    reader, devices, _ = await _rig()
    devices["ocs-rail1"].set_unreachable(True)
    with pytest.raises(PortReadError, match="switch_id 'ocs-rail1'"):
        await reader.read("ocs-rail1")
    assert len(await reader.read("ocs-rail0")) == 2 * N
