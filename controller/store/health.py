"""GPU failure records and host presence in etcd: ``EtcdHealthStore``, the ``HealthStore`` the
failover manager (``lightrail.controller.runtime.failover``) is given in the daemon.

Keys (relative to the store prefix): ``gpus/<host>/<gpu>`` holds ``{"state": "failed",
"reason": str, "at_unix_s": float}`` (written by the failover manager through ``put``,
deleted through ``delete`` when an operator returns the GPU to service);
``hosts/<host>/presence`` holds ``{"host": str, "since_unix_s": float}`` under a lease.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from lightrail.controller.store.errors import StoreError
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.types import Lease

log = structlog.get_logger(__name__)


class EtcdHealthStore:
    """``HealthStore`` over etcd: records through the coalescing writer, presence as a key under
    a lease the store keeps alive while the host's stream is open. etcd trouble is logged and
    never fails a health stream (failover itself does not depend on it)."""

    def __init__(self, store: EtcdStore, put: Callable[[str, object], None],
                 delete: Callable[[str], None]) -> None:
        self._store = store
        self._put = put
        self._delete = delete

    def put(self, key: str, obj: object) -> None:
        """Hand ``obj`` (JSON) for relative ``key`` to the writer; returns at once. Raises what
        the writer's ``put`` raises (FlushFailed once it has failed)."""
        self._put(key, obj)

    def delete(self, key: str) -> None:
        """Hand the deletion of relative ``key`` to the writer; returns at once. Raises what
        the writer's ``delete`` raises."""
        self._delete(key)

    async def host_online(self, host: str, ttl_s: int) -> object:
        """Record ``host`` present under a new lease of ``ttl_s`` seconds; returns the lease as
        the token for ``host_offline``, or None when etcd failed (logged, not raised)."""
        try:
            # presence only has to outlive its TTL (nothing acts on its authority): clientv3's
            # cadence, half the keep-alives of a leader lease, one per host stream
            lease = await self._store.grant_lease(ttl_s, renewals_per_ttl=3)
            await self._store.put_json(f"hosts/{host}/presence",
                                       {"host": host, "since_unix_s": time.time()}, lease=lease)
        except StoreError as exc:
            log.warning("presence_not_recorded", host=host, error=str(exc))
            return None
        return lease

    async def host_offline(self, token: object) -> None:
        """Revoke the lease ``host_online`` returned (its presence key goes with it); any other
        token is ignored, etcd trouble is logged, not raised."""
        if not isinstance(token, Lease):
            return
        try:
            await self._store.revoke(token)
        except StoreError as exc:
            log.warning("presence_not_revoked", error=str(exc))

    async def load_failed(self) -> dict[tuple[str, int], str]:
        """GPU failure records stored by earlier runs: (host, gpu) -> reason. Raises
        StoreError (CorruptValue for a value that is not our envelope)."""
        snap = await self._store.get_prefix_json("gpus/")
        out: dict[tuple[str, int], str] = {}
        for key, value in snap.items.items():
            _, host, gpu = key.split("/", 2)
            if gpu.isdecimal() and isinstance(value, dict) and value.get("state") == "failed":
                out[(host, int(gpu))] = str(value.get("reason", "failed"))
        return out
