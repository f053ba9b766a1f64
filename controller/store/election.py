"""Leader election among controller replicas over the etcd store (DESIGN.md, "High availability").

etcd behaviour relied on (etcd API v3, https://etcd.io/docs/v3.4/learning/api/): a lease
expires ``TTL`` seconds after etcd last saw a keep-alive for it, never earlier, and etcd deletes
the keys attached to it; a transaction comparing a key's create_revision with 0 succeeds only
while the key is absent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from lightrail.controller.store.client import SHUTDOWN_TIMEOUT_S, bounded, cancel_task
from lightrail.controller.store.errors import CorruptValue, StoreError, StoreUnavailable
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.types import (
    EventKind,
    KeyValue,
    Lease,
    Snapshot,
    WatchEvents,
)

_log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class LeaderRecord:
    """The leader key's value: the leading replica's id and the address (``host:port``) it
    advertises to agents and operators, None when it published none."""

    replica_id: str
    address: str | None



class LeaderElection:
    """One leader among controller replicas (DESIGN.md, "High availability").

    ``campaign()`` creates the key ``key`` (relative, default ``"leader"``) holding
    ``{"replica_id": replica_id, "address": address}`` (``address`` only when given: where
    this replica serves agents and operators, ``host:port``), attached to a lease of ``ttl_s``
    seconds that the store keeps alive, through a transaction that succeeds only if the key is
    absent. While another replica holds it, ``campaign()`` watches the key and tries again once
    it is deleted (its lease revoked or expired).

    Same replica id: a replica that restarts under the same ``replica_id`` takes over its own
    stale key at once (compare-and-swap on the key's mod_revision) instead of waiting up to a
    TTL for its previous lease to expire. So two live processes must never share a replica id.

    Self-fencing: ``is_leader`` is cleared and then ``fenced`` is set (with ``fence_reason``) as
    soon as the lease has not been renewed for ``ttl_s / 2`` seconds (measured from the send time
    of the last acknowledged keep-alive), or the leader key is deleted or overwritten. etcd
    cannot expire the lease, and so no other replica can win, before ``ttl_s`` seconds after
    that send time: the leader stops at least ``ttl_s / 2`` seconds before anyone can take over.
    Code that commands devices must ask ``may_command`` right before each command (the drivers
    do, through their command gate): it also refuses once the lease's authority ran out while
    the guard could not run (the process was paused). After
    fencing the lease is revoked (best effort) so another replica can take over; an election
    object campaigns once: create a new one to campaign again.

    ``leader`` is this replica's view of who leads, kept without extra etcd reads: the holder
    the campaign found (and watches) while following, this replica once it leads, None while
    the key is vacant or after this replica stopped leading. Standbys use it to redirect
    clients to the leader's address. ``transitions`` counts the leader changes this replica has
    seen (``leader_since_s``: when it saw the current one begin).
    """

    def __init__(
        self,
        store: EtcdStore,
        replica_id: str,
        *,
        ttl_s: int = 10,
        key: str = "leader",
        address: str | None = None,
    ) -> None:
        if not replica_id:
            raise ValueError("replica_id must be non-empty")
        store.full_key(key)  # validates
        self.replica_id = replica_id
        self.address = address
        self.key = key
        self.ttl_s = ttl_s
        self._leader: LeaderRecord | None = None
        self.transitions = 0
        """Leader changes this replica has seen (``leader`` naming a replica other than the
        last one it named; the first leader seen counts, a vacancy does not)."""
        self.leader_since_s: float | None = None
        """Monotonic time (``time.monotonic``) this replica first saw the current leader."""
        self._last_leader_id: str | None = None
        self.on_transition: list[Callable[[LeaderRecord], None]] = []
        """Called with the new leader at each counted transition (e.g. a metric)."""
        self.is_leader = asyncio.Event()
        self.fenced = asyncio.Event()
        self.fence_reason: str | None = None
        self._store = store
        self._lease: Lease | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._campaigned = False
        self._log = _log.bind(replica_id=replica_id, election_key=store.full_key(key))

    @property
    def leader(self) -> LeaderRecord | None:
        """This replica's view of the leader (see the class doc); None while none is known."""
        return self._leader

    @leader.setter
    def leader(self, record: LeaderRecord | None) -> None:
        self._leader = record
        if record is None:
            return
        if record.replica_id != self._last_leader_id:
            self._last_leader_id = record.replica_id
            self.transitions += 1
            self.leader_since_s = time.monotonic()
            for callback in self.on_transition:
                callback(record)

    @property
    def lease(self) -> Lease | None:
        """The lease holding the leader key while this replica leads."""
        return self._lease

    def may_command(self) -> bool:
        """Whether this replica may command devices at this instant: it leads and the lease's
        authority (``Lease.authority``: last acknowledged keep-alive send time + TTL/2) has not
        run out. Unlike ``is_leader`` this needs no task to have run: after a pause of the
        whole process it is False at once, before the guard has noticed. Drivers ask it before
        every command (``lightrail.drivers.options.DriverContext.command_gate``)."""
        lease = self._lease
        return (self.is_leader.is_set() and lease is not None
                and self._store.now() < lease.authority.until_s)

    def _holder(self, kv: KeyValue) -> str:
        return self._record(kv.key, kv.value).replica_id

    @staticmethod
    def _record(key: str, data: object) -> LeaderRecord:
        """The leader record stored under ``key``. Raises CorruptValue (no string
        ``replica_id``, an ``address`` that is not a string)."""
        if not isinstance(data, dict) or not isinstance(data.get("replica_id"), str):
            raise CorruptValue(key, "leader record has no string 'replica_id'")
        address = data.get("address")
        if address is not None and not isinstance(address, str):
            raise CorruptValue(key, f"leader record 'address' is not a string: {address!r}")
        return LeaderRecord(data["replica_id"], address)

    async def current_leader(self) -> str | None:
        """Replica id of the current leader, or None. Raises StoreUnavailable, CorruptValue."""
        kv = await self._store.get(self.key)
        return None if kv is None else self._holder(kv)

    async def campaign(self) -> None:
        """Block until this replica leads (``is_leader`` set). Raises StoreError (unavailable,
        corrupt leader record), RuntimeError if called twice. Cancellation is safe: no lease is
        left behind."""
        if self._campaigned:
            raise RuntimeError("a LeaderElection campaigns once; create a new one")
        self._campaigned = True
        value: dict[str, str] = {"replica_id": self.replica_id}
        if self.address is not None:
            value["address"] = self.address
        while True:
            lease = await self._store.grant_lease(self.ttl_s)
            try:
                outcome = await self._store.conditional_put(
                    self.key, value, lease=lease, expected_mod_revision=None
                )
                current = outcome.current
                if (
                    not outcome.succeeded
                    and current is not None
                    and self._holder(current) == self.replica_id
                ):
                    self._log.warning(
                        "election.taking_over_own_stale_key",
                        stale_lease_id=f"{current.lease_id or 0:x}",
                    )
                    outcome = await self._store.conditional_put(
                        self.key, value, lease=lease, expected_mod_revision=current.mod_revision
                    )
            except BaseException:
                await self._drop_lease(lease)
                raise
            if outcome.succeeded and outcome.current is not None:
                if not lease.renewal_late.is_set():
                    break
                # Won with a lease already past half its TTL (slow etcd): never lead on it.
                self._log.warning("election.won_with_late_lease_retrying")
            await self._drop_lease(lease)
            if outcome.current is not None:
                self.leader = self._record(outcome.current.key, outcome.current.value)
                self._log.info("election.following", leader=self.leader.replica_id,
                               leader_address=self.leader.address)
                try:
                    await self._wait_for_vacancy(outcome.current.mod_revision)
                finally:
                    self.leader = None
        self._lease = lease
        self.leader = LeaderRecord(self.replica_id, self.address)
        self.is_leader.set()
        self._log.info("election.leading", lease_id=f"{lease.id:x}", ttl_s=lease.ttl_s)
        self._monitor = asyncio.create_task(
            self._guard(lease, outcome.current.mod_revision),
            name=f"election-guard:{self.replica_id}",
        )

    async def _drop_lease(self, lease: Lease) -> None:
        try:
            await asyncio.wait_for(self._store.revoke(lease), self._store.timeout_s)
        except (StoreError, TimeoutError) as e:
            self._log.warning("election.lease_revoke_failed", error=repr(e))

    async def _wait_for_vacancy(self, holder_mod_revision: int) -> None:
        """Return once the leader key is deleted after ``holder_mod_revision``; a put meanwhile
        (the holder restarted under its replica id) updates ``leader``."""
        watch = self._store.watch_key(self.key, holder_mod_revision + 1)
        try:
            async for batch in watch:
                if isinstance(batch, Snapshot):
                    if self.key not in batch.items:
                        return
                    self.leader = self._record(self.key, batch.items[self.key])
                elif any(e.kind is EventKind.DELETE for e in batch.events):
                    return
                else:
                    self.leader = self._record(self.key, batch.events[-1].value)
        finally:
            await bounded(watch.aclose(), SHUTDOWN_TIMEOUT_S, "watch.aclose")

    async def _key_changed(self, mod_revision: int) -> str:
        """Return a reason once the leader key no longer is the one written at
        ``mod_revision``."""
        watch = self._store.watch_key(self.key, mod_revision + 1)
        try:
            async for batch in watch:
                if isinstance(batch, WatchEvents):
                    return f"leader key {batch.events[0].kind.value} at {batch.revision}"
                kv = await self._store.get(self.key)
                if kv is None or kv.mod_revision != mod_revision:
                    return "leader key changed while the watch was compacted"
        finally:
            await bounded(watch.aclose(), SHUTDOWN_TIMEOUT_S, "watch.aclose")
        return "leader key watch ended"

    async def _guard(self, lease: Lease, mod_revision: int) -> None:
        late = asyncio.create_task(lease.renewal_late.wait(), name="election-lease-late")
        changed = asyncio.create_task(self._key_changed(mod_revision), name="election-key-watch")
        try:
            done, _ = await asyncio.wait({late, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (late, changed):
                if not task.done():
                    await cancel_task(task, SHUTDOWN_TIMEOUT_S)
        if late in done:
            reason = (
                "lease lost"
                if lease.lost.is_set()
                else f"lease not renewed within {lease.ttl_s / 2:g} s (half its TTL)"
            )
        elif changed.exception() is not None:
            reason = f"leader key watch failed: {changed.exception()!r}"
        else:
            reason = changed.result()
        self._fence(reason)
        self._lease = None
        await self._drop_lease(lease)

    def _fence(self, reason: str) -> None:
        self.is_leader.clear()
        self.leader = None
        self.fence_reason = reason
        self.fenced.set()
        self._log.error("election.fenced", reason=reason)

    async def resign(self) -> None:
        """Stop leading: clear ``is_leader``, stop the guard and revoke the lease (etcd deletes the
        leader key, so a follower can win at once). Each step is bounded by the store timeout.
        Raises StoreUnavailable if the lease could not be revoked (it then expires after its
        TTL)."""
        self.is_leader.clear()
        self.leader = None
        if self._monitor is not None:
            await cancel_task(self._monitor, SHUTDOWN_TIMEOUT_S)
            self._monitor = None
        lease, self._lease = self._lease, None
        if lease is not None:
            self._log.info("election.resigning", lease_id=f"{lease.id:x}")
            try:
                await asyncio.wait_for(self._store.revoke(lease), self._store.timeout_s)
            except TimeoutError as e:
                raise StoreUnavailable("resign: revoking the lease timed out") from e
