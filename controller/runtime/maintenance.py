"""Maintenance mode of switches (``lightrail maintenance on|off SWITCH``): the shell around the
core's rule (``PhaseCoordinator.set_maintenance``: a switch in maintenance is changed by no
decision; phases needing a change there are refused ``SWITCH_MAINTENANCE``, phases whose
circuits are in place are admitted).

``SwitchMaintenance.set`` stores the change in etcd first (``MaintenanceStore``; the call fails
and nothing changes when etcd does), then applies it to the coordinator and publishes a
``MAINTENANCE`` fabric event. ``restore`` applies what etcd holds when a replica starts
leading, before it serves, so maintenance survives a failover and a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import structlog

from lightrail.controller.domain.events import FabricEvent, FabricEventKind
from lightrail.controller.runtime.events import EventBus
from lightrail.controller.runtime.phase_service import PhaseService
from lightrail.controller.store.maintenance import MaintenanceRecord

log = structlog.get_logger(__name__)

DEFAULT_REASON = "operator"
"""The reason recorded when ``maintenance on`` gives none."""


class MaintenanceStore(Protocol):
    """Where maintenance records live (``lightrail.controller.store.maintenance``)."""

    async def load(self) -> dict[str, MaintenanceRecord]: ...

    async def put(self, record: MaintenanceRecord) -> None: ...

    async def delete(self, switch_id: str) -> None: ...


class SwitchMaintenance:
    """Maintenance state of the leader's switches. ``clock``: wall-clock seconds (the
    records' ``since_unix_s``); ``settle_timeout_s``: how long ``set`` waits at most for a
    reconfiguration already in flight on the switch."""

    def __init__(self, service: PhaseService, store: MaintenanceStore, events: EventBus,
                 *, clock: Callable[[], float] = time.time,
                 settle_timeout_s: float = 30.0) -> None:
        self._service = service
        self._store = store
        self._events = events
        self._clock = clock
        self._settle_timeout_s = settle_timeout_s
        self._records: dict[str, MaintenanceRecord] = {}

    def records(self) -> Mapping[str, MaintenanceRecord]:
        """Switches in maintenance now, by switch id."""
        return dict(self._records)

    async def restore(self) -> None:
        """Apply the records etcd holds (a new leader, a restart). A record of a switch the
        fabric no longer has is logged and skipped. Raises ``StoreError``."""
        for sid, rec in sorted((await self._store.load()).items()):
            if sid not in self._service.coordinator.fabric.switches:
                log.warning("maintenance_record_unknown_switch", switch=sid, reason=rec.reason)
                continue
            self._service.set_maintenance(sid, rec.reason)
            self._records[sid] = rec
            log.info("maintenance_restored", switch=sid, reason=rec.reason)

    async def set(self, switch_id: str, on: bool, reason: str = "") -> MaintenanceRecord | None:
        """Put ``switch_id`` in maintenance (``on``; ``reason`` empty: ``DEFAULT_REASON``) or
        take it out; returns its record, None when it is in service now. Idempotent. Going
        into maintenance returns once no reconfiguration decided before is in flight on the
        switch (at most ``settle_timeout_s``; logged when one still is), so the switch is left
        alone from then on. Raises ``ValueError`` naming an unknown switch and ``StoreError``
        (nothing changed then). Leaving maintenance distrusts the switch and reads it back
        (work on it may have changed its cross-connects): nothing is admitted onto its
        circuits before the read-back confirms them."""
        if switch_id not in self._service.coordinator.fabric.switches:
            raise ValueError(f"switch_id: unknown switch {switch_id!r}")
        if on:
            rec = MaintenanceRecord(switch_id, reason or DEFAULT_REASON, self._clock())
            await self._store.put(rec)
            self._records[switch_id] = rec
            self._service.set_maintenance(switch_id, rec.reason)
            await self._settled(switch_id)
            message = f"switch {switch_id} in maintenance: {rec.reason}"
        else:
            rec = None
            await self._store.delete(switch_id)
            self._records.pop(switch_id, None)
            if self._service.coordinator.maintenance().get(switch_id) is not None:
                # hands may have re-patched it: nothing joins its circuits before a read-back
                self._service.distrust_switch(switch_id)
            self._service.set_maintenance(switch_id, None)
            message = f"switch {switch_id} back in service"
        log.info("maintenance", switch=switch_id, on=on, reason=rec.reason if rec else "")
        self._events.publish_fabric(FabricEvent(
            FabricEventKind.MAINTENANCE, message, switch_id=switch_id,
            fields={"maintenance": "on" if on else "off",
                    "reason": rec.reason if rec else ""}))
        return rec

    async def _settled(self, switch_id: str) -> None:
        """Wait until no reconfiguration is in flight on ``switch_id`` (bounded)."""
        coord = self._service.coordinator
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settle_timeout_s
        while coord.switching(switch_id):
            settled = self._service.ports_settled()
            if not coord.switching(switch_id):
                return
            left = deadline - loop.time()
            if left <= 0:
                log.warning("maintenance_switch_still_switching", switch=switch_id,
                            waited_s=self._settle_timeout_s)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(settled.wait(), left)
