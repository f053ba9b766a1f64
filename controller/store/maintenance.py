"""Switches in maintenance, in etcd, so that a new leader keeps them after a failover or a
restart: ``EtcdMaintenanceStore``.

Keys (relative to the store prefix): ``maintenance/<switch_id>`` holds ``{"switch_id": str,
"reason": str, "since_unix_s": float}`` while the switch is in maintenance; no key: in service.
Written directly (not through the coalescing writer): an operator's call is answered only once
etcd holds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightrail.controller.store.errors import CorruptValue
from lightrail.controller.store.etcd import EtcdStore

PREFIX = "maintenance/"


@dataclass(frozen=True, slots=True)
class MaintenanceRecord:
    """One switch in maintenance: the operator's ``reason`` and when it began (wall clock,
    seconds since the epoch)."""

    switch_id: str
    reason: str
    since_unix_s: float


class EtcdMaintenanceStore:
    """Maintenance records over ``store``."""

    def __init__(self, store: EtcdStore) -> None:
        self._store = store

    async def load(self) -> dict[str, MaintenanceRecord]:
        """Every stored record, by switch id. Raises ``CorruptValue`` naming a key whose value
        is not a record, ``StoreUnavailable``."""
        snap = await self._store.get_prefix_json(PREFIX)
        out: dict[str, MaintenanceRecord] = {}
        for key, value in snap.items.items():
            sid = key.removeprefix(PREFIX)
            if not isinstance(value, dict) or not isinstance(value.get("reason"), str) \
                    or not isinstance(value.get("since_unix_s"), int | float):
                raise CorruptValue(key, "maintenance record needs a string 'reason' and a "
                                        "number 'since_unix_s'")
            out[sid] = MaintenanceRecord(sid, value["reason"], float(value["since_unix_s"]))
        return out

    async def put(self, record: MaintenanceRecord) -> None:
        """Store ``record`` (replacing an earlier one of its switch). Raises ``StoreError``."""
        await self._store.put_json(f"{PREFIX}{record.switch_id}", {
            "switch_id": record.switch_id, "reason": record.reason,
            "since_unix_s": record.since_unix_s})

    async def delete(self, switch_id: str) -> None:
        """Forget the record of ``switch_id`` (none: no-op). Raises ``StoreError``."""
        await self._store.delete(f"{PREFIX}{switch_id}")
