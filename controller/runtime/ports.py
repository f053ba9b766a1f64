"""Port readout for operators (``lightrail ports``): admin and oper state and optical power from
the devices, with what the controller knows of each port (the cross-connect on it, the endpoint
wired to it, the job owning it).

Read beside the reconciler like the power poll (``lightrail.controller.runtime.power``): the
drivers serialize their own sessions; nothing here touches the reconciler's view or the phase
path. A device that does not report power (or port state) for a port leaves it absent (None),
never 0: 0 dBm is a real, strong reading.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.drivers.base import (
    AuthenticationFailed,
    DeviceTimeout,
    DeviceUnreachable,
    Driver,
    DriverError,
    NotLeader,
    PortAdmin,
    PortOper,
)

UNREACHED = (DeviceUnreachable, DeviceTimeout, AuthenticationFailed, NotLeader)
"""Errors that mean the device gave no answer: the readout of that switch fails. Any other
``DriverError`` of ``get_power``/``get_port_status`` (an unsupported command, a port without a
reading) means the device does not report it: absent."""


class PortReadError(Exception):
    """A switch could not be read; the message names it and the driver's error."""


@dataclass(frozen=True, slots=True)
class PortReading:
    """One port: its states (None: the device did not say), optical power in dBm (None: not
    reported), the port it is cross-connected to, the endpoint wired to it and the job owning
    it (None: none)."""

    switch_id: str
    port: int
    admin: PortAdmin | None
    oper: PortOper | None
    power_dbm: float | None
    connected_to: int | None
    endpoint: str | None
    job_id: str | None


class PortReader:
    """Reads the ports of the leader's open ``drivers`` (switch id -> driver) and joins them
    with ``coordinator``'s confirmed cross-connects and the fabric's wiring."""

    def __init__(self, drivers: Mapping[str, Driver], coordinator: PhaseCoordinator) -> None:
        self._drivers = drivers
        self._coord = coordinator
        self._endpoint_at: dict[tuple[str, int], str] = {}
        for ep in coordinator.fabric.endpoints.values():
            self._endpoint_at[(ep.switch_id, ep.tx_port)] = str(ep.endpoint_id)
            self._endpoint_at[(ep.switch_id, ep.rx_port)] = str(ep.endpoint_id)

    async def read(self, switch_id: str) -> list[PortReading]:
        """Every port of ``switch_id``, in port order. Raises ``KeyError`` for a switch
        without a driver, ``PortReadError`` when the device does not answer."""
        driver = self._drivers[switch_id]
        sw = self._coord.fabric.switches[switch_id]
        ports = list(sw.capabilities.port_ids())
        try:
            status = {s.port: s for s in await driver.get_port_status(ports)}
        except UNREACHED as exc:
            raise PortReadError(f"switch_id {switch_id!r}: {exc}") from exc
        except DriverError:
            status = {}
        try:
            power = await driver.get_power(ports)
        except UNREACHED as exc:
            raise PortReadError(f"switch_id {switch_id!r}: {exc}") from exc
        except DriverError:
            power = {}
        peer: dict[int, int] = {}
        for xc in self._coord.confirmed(switch_id):
            peer[xc.ingress] = xc.egress
            peer[xc.egress] = xc.ingress
        out = []
        for p in ports:
            st = status.get(p)
            out.append(PortReading(
                switch_id, p, st.admin if st else None, st.oper if st else None,
                power.get(p), peer.get(p), self._endpoint_at.get((switch_id, p)),
                self._coord.owner_of_port(switch_id, p)))
        return out
