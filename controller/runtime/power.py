"""Optical power of the ports in use, polled off the phase path (DESIGN.md, "Observability").

Every ``interval_s`` seconds the leader asks each switch (``Driver.get_power``, all switches in
parallel) for the power of the ports that carry a confirmed cross-connect and exports it as
``lightrail_port_power_dbm{switch, port}``; a port that no longer carries one loses its series.
Ports without a cross-connect are not read: their power says nothing (dark) and would only
multiply series.

A failed poll never touches the phase path: no read-back, no distrust of the reconciler's view,
no retry; it is counted in ``lightrail_device_errors_total``, reported to the reconciler's
reachability record (``Reconciler.contact``: ``DeviceUnreachable`` and ``DeviceTimeout`` set
``lightrail_switch_up`` to 0, a successful poll back to 1), and the switch's power series
are removed until the next reading (a value not read again is no measurement). ``NotLeader``
(the controller fenced itself) ends nothing and records nothing: the shutdown follows. The poll
relies on each driver's own command deadline (``DeviceTimeout``) and never cancels a command in
flight, which could leave a serial session out of step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import structlog

from lightrail.controller.domain.timing import Sleep
from lightrail.controller.runtime import metrics
from lightrail.controller.runtime.reconciler import Reconciler
from lightrail.drivers.base import Driver, DriverError, NotLeader

_log = structlog.get_logger(__name__)


class PowerPoller:
    """Polls ``drivers`` (one open driver per switch id, the reconciler's) every ``interval_s``
    seconds (> 0) for the power of the ports ``reconciler`` holds a cross-connect on. Run
    ``run()`` as a task of the leader's task group and cancel it at shutdown."""

    def __init__(
        self,
        drivers: Mapping[str, Driver],
        reconciler: Reconciler,
        interval_s: float,
        *,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"power poll interval must be > 0 s, got {interval_s}")
        self._drivers = dict(drivers)
        self._reconciler = reconciler
        self._interval_s = interval_s
        self._sleep = sleep
        self._exported: dict[str, set[int]] = {sid: set() for sid in self._drivers}
        self._failing: set[str] = set()

    def exported(self, switch_id: str) -> frozenset[int]:
        """The ports of ``switch_id`` whose power is exported now."""
        return frozenset(self._exported.get(switch_id, ()))

    async def run(self) -> None:
        """Poll every ``interval_s`` seconds until cancelled (the first poll at once)."""
        while True:
            await self.poll_once()
            await self._sleep(self._interval_s)

    async def poll_once(self) -> None:
        """One poll of every switch, in parallel; returns when each answered or failed."""
        await asyncio.gather(*(self._poll(sid, drv) for sid, drv in self._drivers.items()))

    async def _poll(self, switch_id: str, driver: Driver) -> None:
        xcs = self._reconciler.confirmed(switch_id)
        ports = sorted({p for xc in xcs for p in (xc.ingress, xc.egress)})
        if not ports:
            self._export(switch_id, {})
            return
        try:
            power = await driver.get_power(ports)
        except NotLeader:
            return
        except DriverError as e:
            metrics.DEVICE_ERRORS.labels(switch_id, type(e).__name__).inc()
            self._reconciler.contact(switch_id, e)
            self._export(switch_id, {})
            if switch_id not in self._failing:
                self._failing.add(switch_id)
                _log.warning("power_poll_failed", switch=switch_id, error=str(e))
            return
        self._reconciler.contact(switch_id, None)
        if switch_id in self._failing:
            self._failing.discard(switch_id)
            _log.info("power_poll_recovered", switch=switch_id)
        wanted = frozenset(ports)  # a driver answering more ports: only these are exported
        self._export(switch_id, {p: v for p, v in power.items() if p in wanted})

    def _export(self, switch_id: str, power: Mapping[int, float]) -> None:
        """Make the exported series of ``switch_id`` exactly ``power`` (port -> dBm)."""
        exported = self._exported.setdefault(switch_id, set())
        for port in exported - power.keys():
            metrics.forget_port_power(switch_id, port)
        for port, dbm in power.items():
            metrics.PORT_POWER_DBM.labels(switch_id, str(port)).set(dbm)
        self._exported[switch_id] = set(power)

