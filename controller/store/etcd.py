"""Durable controller state in etcd (DESIGN.md, "State" and "High availability"): ``EtcdStore``.

A small store of our own over ``client.EtcdClient`` (our gRPC client of etcd's v3 API: every
member of the cluster, TLS, failover between members). Everything here is typed; no gRPC or
generated object leaves the store package.

``EtcdStore`` keeps JSON values in a versioned envelope ``{"schema": 1, "data": ...}``
(``types.encode_value``) under one key prefix (default ``/lightrail/v1``); callers use relative
keys such as ``"jobs/job-1"``. Compare-and-swap through etcd transactions, leases with a
keep-alive task the store owns, and prefix watches that survive an etcd restart and a compaction
of the revision they resume from (``watch.py``). Beside it: ``election.LeaderElection`` (one
leader among replicas), ``writer.CoalescingWriter`` (hot-path writes without awaiting etcd).

Errors: every operation raises a ``StoreError`` (``errors.py``).

etcd behaviour relied on (etcd API v3, https://etcd.io/docs/v3.4/learning/api/):
- every write increments the store-wide revision once, a transaction included;
- a Range answers with the revision it read at (``header.revision``);
- a lease expires ``TTL`` seconds after etcd last saw a keep-alive for it, and etcd deletes the
  keys attached to it; etcd never expires a lease earlier than that.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import Final, Self

import grpc
import structlog

from lightrail.controller.domain.timing import Backoff, Clock, Sleep
from lightrail.controller.store.client import (
    SHUTDOWN_TIMEOUT_S,
    EtcdClient,
    TlsFiles,
    WatchStream,
    cancel_task,
    grpc_code,
    parse_endpoint,
    prefix_range_end,
    translated,
)
from lightrail.controller.store.errors import (
    StoreClosed,
    StoreError,
    StoreRequestFailed,
    StoreUnavailable,
)
from lightrail.controller.store.types import (
    KeyValue,
    Lease,
    PendingWrite,
    RequestObserver,
    Snapshot,
    TxnOutcome,
    WatchBatch,
    decode_value,
    encode_value,
)
from lightrail.controller.store.watch import Watches, WatchSource
from lightrail.etcdapi import kv_pb2, rpc_pb2

DEFAULT_PREFIX: Final = "/lightrail/v1"

DEFAULT_WATCH_BACKOFF: Final = Backoff(initial_s=0.05, max_s=1.0)
"""Pacing of watch reconnects unless the caller passes its own."""

MAX_TXN_OPS: Final = 128
"""etcd's default ``--max-txn-ops``: operations allowed in one transaction."""

_log = structlog.get_logger(__name__)


class EtcdStore:
    """JSON state under one etcd key prefix.

    Create with ``EtcdStore.connect(endpoints)`` and use as ``async with`` (or ``open()`` /
    ``close()``). Every call is bounded by ``timeout_s`` seconds and raises ``StoreUnavailable``
    when no member of the cluster answers in time; a call made while the connection is being
    re-established, or while the member it went to is down, is sent again (to the next member)
    within that bound where that is safe (``client.py``: a transaction with compares is resent
    only when it was never sent).

    Keys: callers pass keys relative to ``prefix`` (``"jobs/job-1"`` is stored at
    ``"/lightrail/v1/jobs/job-1"``); keys must not start with ``/``. Prefix arguments are plain
    string prefixes: ``"jobs/"`` matches ``"jobs/a"``, ``"jobs"`` also matches ``"jobsx"``.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        tls: TlsFiles | None = None,
        prefix: str = DEFAULT_PREFIX,
        timeout_s: float = 5.0,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        watch_backoff: Backoff = DEFAULT_WATCH_BACKOFF,
        max_watch_outage_s: float | None = 60.0,
        observe: RequestObserver | None = None,
    ) -> None:
        if not prefix.startswith("/") or prefix.endswith("/"):
            raise ValueError(f"prefix must start with '/' and not end with '/': {prefix!r}")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self.endpoints = (endpoints,) if isinstance(endpoints, str) else tuple(endpoints)
        if not self.endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        for endpoint in self.endpoints:
            parse_endpoint(endpoint)
        self.endpoint = ",".join(self.endpoints)
        self.tls = tls
        self.prefix = prefix
        self.timeout_s = timeout_s
        self._clock = clock
        self._sleep = sleep
        self._root = (prefix + "/").encode()
        self._client: EtcdClient | None = None
        self._closed = False
        self._observe = observe
        self._keepers: dict[int, asyncio.Task[None]] = {}
        self._log: structlog.typing.FilteringBoundLogger = _log.bind(
            endpoint=self.endpoint, prefix=prefix
        )
        self._watches = Watches(
            WatchSource(
                open_watch=self._open_watch,
                check_open=self._c,
                current_revision=self.current_revision,
                read_range=self._read_range,
                relative_key=self._rel,
            ),
            clock=clock,
            sleep=sleep,
            backoff=watch_backoff,
            max_outage_s=max_watch_outage_s,
            log=self._log,
        )

    @classmethod
    def connect(
        cls,
        endpoints: str | Sequence[str],
        *,
        tls: TlsFiles | None = None,
        prefix: str = DEFAULT_PREFIX,
        timeout_s: float = 5.0,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        watch_backoff: Backoff = DEFAULT_WATCH_BACKOFF,
        max_watch_outage_s: float | None = 60.0,
        observe: RequestObserver | None = None,
    ) -> EtcdStore:
        """A store for the etcd cluster at ``endpoints`` (``"HOST:PORT"``, one per member, or
        one such string), over TLS when ``tls`` is given, opened by ``async with`` or ``open()``.

        ``timeout_s`` bounds every etcd call (seconds). ``watch_backoff`` paces watch reconnects;
        a watch that cannot reconnect for ``max_watch_outage_s`` seconds raises
        ``StoreUnavailable`` (None: retry forever). ``clock``/``sleep`` drive lease keep-alive and
        watch backoff timing. ``observe`` is told every etcd request's method and duration
        (``types.RequestObserver``; the daemon passes the metrics' histogram). Raises
        ValueError for a malformed endpoint or prefix."""
        return cls(
            endpoints,
            tls=tls,
            prefix=prefix,
            timeout_s=timeout_s,
            clock=clock,
            sleep=sleep,
            watch_backoff=watch_backoff,
            max_watch_outage_s=max_watch_outage_s,
            observe=observe,
        )

    # ----------------------------------------------------------------- lifecycle

    async def _open_watch(self, request: rpc_pb2.WatchCreateRequest) -> WatchStream:
        return await self._c().open_watch("watch", request)

    async def open(self) -> None:
        """Connect to every member and check that the cluster answers (one read). Raises
        StoreUnavailable naming the endpoints, StoreError for unreadable TLS files."""
        if self._closed:
            raise StoreClosed("store was closed")
        if self._client is not None:
            return
        client = EtcdClient(self.endpoints, timeout_s=self.timeout_s, tls=self.tls,
                            observe=self._observe)
        client.connect()
        self._client = client
        try:
            revision = await self.current_revision()
        except BaseException:
            await client.close()
            self._client = None
            raise
        self._log.info("etcd.store_opened", revision=revision)

    async def close(self) -> None:
        """Stop lease keep-alives and watches (watch consumers get ``StoreClosed``) and close the
        connection. Leases are not revoked: they expire after their TTL. Every step is bounded
        by a timeout."""
        if self._closed:
            return
        self._closed = True
        await self._watches.close()
        for task in list(self._keepers.values()):
            await cancel_task(task, SHUTDOWN_TIMEOUT_S)
        self._keepers.clear()
        if self._client is not None:
            await self._client.close()
            self._client = None
        self._log.info("etcd.store_closed")

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def current_endpoint(self) -> str | None:
        """The member calls go to now (it changes on failover); None while not open."""
        return None if self._client is None else self._client.current_endpoint

    def _c(self) -> EtcdClient:
        if self._closed:
            raise StoreClosed("store was closed")
        if self._client is None:
            raise StoreError("store is not open: use 'async with' or await open()")
        return self._client

    # ----------------------------------------------------------------- keys

    def now(self) -> float:
        """The store's clock (seconds; ``time.monotonic`` unless injected): the clock of
        ``Lease.authority``."""
        return self._clock()

    def full_key(self, key: str) -> str:
        """The etcd key of relative ``key`` (for logs and etcdctl). Raises ValueError for an
        empty key or one starting with '/'."""
        if not key or key.startswith("/"):
            raise ValueError(f"key must be non-empty and relative: {key!r}")
        return self.prefix + "/" + key

    def _k(self, key: str) -> bytes:
        return self.full_key(key).encode()

    def _p(self, prefix: str) -> bytes:
        if prefix.startswith("/"):
            raise ValueError(f"prefix must be relative: {prefix!r}")
        return self._root + prefix.encode()

    def _rel(self, full: bytes) -> str:
        if not full.startswith(self._root):
            raise StoreError(f"etcd returned key {full!r} outside prefix {self.prefix!r}")
        return full[len(self._root) :].decode()

    def _kv(self, raw: kv_pb2.KeyValue) -> KeyValue:
        key = self._rel(bytes(raw.key))
        lease_id = int(raw.lease)
        return KeyValue(
            key=key,
            value=decode_value(key, bytes(raw.value)),
            create_revision=int(raw.create_revision),
            mod_revision=int(raw.mod_revision),
            version=int(raw.version),
            lease_id=lease_id if lease_id != 0 else None,
        )

    # ----------------------------------------------------------------- reads

    async def current_revision(self) -> int:
        """The store-wide etcd revision now (a linearizable, count-only read). Raises
        StoreUnavailable."""
        request = rpc_pb2.RangeRequest(key=self._root, count_only=True)
        response = await self._c().range("current_revision", request)
        return int(response.header.revision)

    async def get(self, key: str) -> KeyValue | None:
        """``key`` with its revisions, or None if absent. Raises CorruptValue, StoreUnavailable."""
        k = self._k(key)
        response = await self._c().range(f"get {key}", rpc_pb2.RangeRequest(key=k))
        return self._kv(response.kvs[0]) if response.kvs else None

    async def get_json(self, key: str) -> object | None:
        """The data stored at ``key``, or None if absent (a stored JSON ``null`` also reads as
        None: use ``get`` to tell them apart). Raises CorruptValue naming the key, StoreUnavailable.
        """
        kv = await self.get(key)
        return None if kv is None else kv.value

    async def get_prefix_json(self, prefix: str) -> Snapshot:
        """Every key starting with ``prefix``, read at one revision (``Snapshot.revision``).

        Raises CorruptValue naming the first undecodable key (nothing is changed in etcd; the
        other keys stay readable one by one), StoreUnavailable."""
        start = self._p(prefix)
        return await self._read_range(
            start, prefix_range_end(start), prefix, op=f"get_prefix {prefix}"
        )

    async def _read_range(
        self, start: bytes, end: bytes, label: str, *, op: str | None = None
    ) -> Snapshot:
        """Every key in [``start``, ``end``) read at one revision, as a Snapshot whose
        ``prefix`` is ``label``; ``op`` names the read in errors (default ``snapshot <label>``).
        Raises CorruptValue, StoreUnavailable."""
        response = await self._c().range(
            op if op is not None else f"snapshot {label}",
            rpc_pb2.RangeRequest(key=start, range_end=end),
        )
        items: dict[str, object] = {}
        for raw in response.kvs:
            kv = self._kv(raw)
            items[kv.key] = kv.value
        return Snapshot(
            prefix=label, items=MappingProxyType(items), revision=int(response.header.revision)
        )

    # ----------------------------------------------------------------- writes

    async def put_json(self, key: str, obj: object, *, lease: Lease | None = None) -> int:
        """Store ``obj`` (JSON-serialisable) at ``key``, attached to ``lease`` if given. Returns
        the revision of the write. Raises TypeError/ValueError for a value JSON cannot encode,
        StoreUnavailable, StoreRequestFailed (e.g. the lease no longer exists)."""
        value = encode_value(obj)
        request = rpc_pb2.PutRequest(key=self._k(key), value=value, lease=_lease_id(lease))
        response = await self._c().put(f"put {key}", request)
        return int(response.header.revision)

    async def put_if_absent(self, key: str, obj: object, *, lease: Lease | None = None) -> bool:
        """Create ``key`` only if it does not exist (etcd transaction comparing its
        create_revision with 0). Returns whether it was created. Raises as ``put_json``."""
        outcome = await self.conditional_put(key, obj, lease=lease, expected_mod_revision=None)
        return outcome.succeeded

    async def compare_and_swap(
        self,
        key: str,
        obj: object,
        *,
        expected_mod_revision: int,
        lease: Lease | None = None,
    ) -> bool:
        """Overwrite ``key`` only if its mod_revision is still ``expected_mod_revision`` (read it
        with ``get``). Returns whether it was written; False also if the key is absent. Raises as
        ``put_json``."""
        outcome = await self.conditional_put(
            key, obj, lease=lease, expected_mod_revision=expected_mod_revision
        )
        return outcome.succeeded

    async def compare_and_delete(self, key: str, *, expected_mod_revision: int) -> bool:
        """Delete ``key`` only if its mod_revision is still ``expected_mod_revision``. Returns
        whether it was deleted. Raises StoreUnavailable."""
        k = self._k(key)
        request = rpc_pb2.TxnRequest(
            compare=[_mod_revision_is(k, expected_mod_revision)],
            success=[rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(key=k))],
        )
        response = await self._c().txn(f"compare_and_delete {key}", request)
        return bool(response.succeeded)

    async def conditional_put(
        self,
        key: str,
        obj: object,
        *,
        lease: Lease | None = None,
        expected_mod_revision: int | None,
    ) -> TxnOutcome:
        """Put ``obj`` at ``key`` (attached to ``lease`` if given) in one transaction if the key
        is absent (``expected_mod_revision`` None) or still at that mod_revision; either way
        return whether it was written and the key as it is after the transaction. Raises as
        ``put_json``."""
        value = encode_value(obj)
        k = self._k(key)
        compare = (
            rpc_pb2.Compare(
                result=rpc_pb2.Compare.EQUAL, target=rpc_pb2.Compare.CREATE, key=k,
                create_revision=0,
            )
            if expected_mod_revision is None
            else _mod_revision_is(k, expected_mod_revision)
        )
        read = rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=k))
        put = rpc_pb2.RequestOp(
            request_put=rpc_pb2.PutRequest(key=k, value=value, lease=_lease_id(lease))
        )
        request = rpc_pb2.TxnRequest(compare=[compare], success=[put, read], failure=[read])
        response = await self._c().txn(f"txn put {key}", request)
        # The last operation of either branch reads the key back.
        kvs = response.responses[-1].response_range.kvs if response.responses else []
        current = self._kv(kvs[0]) if kvs else None
        return TxnOutcome(succeeded=bool(response.succeeded), current=current)

    async def write_batch(self, writes: Mapping[str, PendingWrite]) -> None:
        """Apply the puts/deletes of ``writes`` (relative key -> write) in one transaction of at
        most ``MAX_TXN_OPS`` operations (etcd's limit). Raises ValueError for a bad key,
        StoreUnavailable, StoreRequestFailed."""
        ops = [
            rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=self._k(key), value=w.value))
            if w.value is not None
            else rpc_pb2.RequestOp(
                request_delete_range=rpc_pb2.DeleteRangeRequest(key=self._k(key))
            )
            for key, w in writes.items()
        ]
        await self._c().txn(f"write batch of {len(ops)}", rpc_pb2.TxnRequest(success=ops))

    async def delete(self, key: str) -> bool:
        """Delete ``key``. Returns whether it existed. Raises StoreUnavailable."""
        request = rpc_pb2.DeleteRangeRequest(key=self._k(key))
        response = await self._c().delete_range(f"delete {key}", request)
        return response.deleted > 0

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with ``prefix`` (``""``: everything under the store prefix).
        Returns how many were deleted. Raises StoreUnavailable."""
        start = self._p(prefix)
        request = rpc_pb2.DeleteRangeRequest(key=start, range_end=prefix_range_end(start))
        response = await self._c().delete_range(f"delete_prefix {prefix}", request)
        return int(response.deleted)

    # ----------------------------------------------------------------- admin

    async def compact(self, revision: int, *, physical: bool = True) -> None:
        """Compact etcd's history (the whole keyspace, not only our prefix) below ``revision``:
        watches and reads at older revisions fail afterwards. ``physical`` waits until the
        compaction is applied to the backend. Raises StoreRequestFailed if ``revision`` is
        already compacted or in the future, StoreUnavailable."""
        request = rpc_pb2.CompactionRequest(revision=revision, physical=physical)
        await self._c().compact(f"compact {revision}", request)
        self._log.info("etcd.compacted", revision=revision)

    # ----------------------------------------------------------------- leases

    async def grant_lease(self, ttl_s: int, *, renewals_per_ttl: int = 6) -> Lease:
        """Grant a lease of ``ttl_s`` seconds (etcd may raise it to its minimum) and keep it alive
        from a task of this store: a keep-alive every ``ttl/renewals_per_ttl`` s, each allowed
        to wait until the lease would be late (``ttl/2`` after the last acknowledged send; once
        late, until it would expire), retried quickly on failure. With the default 6, an etcd
        stall (a slow fsync, a paused member) of up to ``ttl/3`` s never makes the lease late:
        for a lease whose authority is acted on (``LeaderElection``). A lease that only has to
        outlive its TTL (host presence) may take 3 (clientv3's cadence). See ``Lease`` for
        ``renewal_late`` and ``lost``. Raises ValueError (``ttl_s`` < 1, ``renewals_per_ttl``
        < 3), StoreUnavailable."""
        if ttl_s < 1:
            raise ValueError(f"ttl_s must be >= 1, not {ttl_s!r}")
        if renewals_per_ttl < 3:
            raise ValueError(f"renewals_per_ttl must be >= 3, not {renewals_per_ttl!r}")
        client = self._c()
        sent_at = self._clock()
        raw = await client.lease_grant("grant lease", rpc_pb2.LeaseGrantRequest(TTL=ttl_s))
        if raw.error:
            raise StoreRequestFailed(f"grant lease: etcd error: {raw.error}")
        lease = Lease(id=int(raw.ID), ttl_s=int(raw.TTL))
        lease.authority.until_s = sent_at + lease.ttl_s / 2
        self._keepers[lease.id] = asyncio.create_task(
            self._keep_alive(lease, sent_at, renewals_per_ttl),
            name=f"etcd-lease-keepalive:{lease.id:x}",
        )
        self._log.info("etcd.lease_granted", lease_id=f"{lease.id:x}", ttl_s=lease.ttl_s)
        return lease

    async def revoke(self, lease: Lease) -> None:
        """Stop keeping ``lease`` alive and revoke it: etcd deletes its keys before answering.
        Sets ``lease.lost``. Idempotent: a lease etcd no longer knows (expired, or revoked
        concurrently) counts as revoked. Raises StoreUnavailable if etcd could not be told (the
        lease then expires after its TTL)."""
        task = self._keepers.pop(lease.id, None)
        if task is not None:
            await cancel_task(task, SHUTDOWN_TIMEOUT_S)
        _mark_lost(lease)
        client = self._c()
        try:
            await client.lease_revoke(
                f"revoke lease {lease.id:x}", rpc_pb2.LeaseRevokeRequest(ID=lease.id)
            )
        except StoreRequestFailed as e:
            if grpc_code(e) != grpc.StatusCode.NOT_FOUND:
                raise
            self._log.info("etcd.lease_already_gone", lease_id=f"{lease.id:x}")
            return
        self._log.info("etcd.lease_revoked", lease_id=f"{lease.id:x}")

    async def _refresh(self, lease_id: int, timeout_s: float) -> int:
        """One keep-alive; returns the TTL etcd reports (0 or less: the lease is gone)."""
        client = self._c()
        op = f"keep-alive {lease_id:x}"
        # not wait_for: 3.11's drops a cancel that meets the reply (CPython gh-86296)
        with translated(op):
            async with asyncio.timeout(timeout_s + 0.5):
                reply = await client.lease_keep_alive_once(op, lease_id, timeout_s)
        return int(reply.TTL)

    async def _keep_alive(self, lease: Lease, granted_at: float, renewals_per_ttl: int) -> None:
        log = self._log.bind(lease_id=f"{lease.id:x}", ttl_s=lease.ttl_s)
        ttl = float(lease.ttl_s)
        # Authority lasts ttl/2 from the last acknowledged send. Sending every ttl/6 (the
        # default) and letting each request wait up to that bound leaves ttl/3 for one answer
        # to come back late; at ttl/3 (clientv3's cadence) a stall over ttl/6 makes it late.
        interval = ttl / renewals_per_ttl
        retry_s = min(interval / 2, 0.25)
        last_ok = granted_at  # send time of the last request etcd acknowledged
        next_refresh = last_ok + interval
        try:
            while True:
                now = self._clock()
                expire_at = last_ok + ttl
                late_at = last_ok + ttl / 2
                if now >= expire_at:
                    log.error("etcd.lease_lost", reason="not renewed within TTL")
                    _mark_lost(lease)
                    return
                if now >= late_at and not lease.renewal_late.is_set():
                    log.warning("etcd.lease_renewal_late", since_ok_s=now - last_ok)
                    lease.renewal_late.set()
                deadline = expire_at if lease.renewal_late.is_set() else late_at
                if now < next_refresh:
                    await self._sleep(min(next_refresh, deadline) - now)
                    continue
                budget_s = max(deadline - now, 0.05)
                try:
                    remaining = await self._refresh(lease.id, budget_s)
                except StoreUnavailable as e:
                    log.warning("etcd.lease_keepalive_failed", error=str(e))
                    next_refresh = self._clock() + retry_s
                    continue
                if remaining <= 0:
                    log.error("etcd.lease_lost", reason="etcd reports the lease expired")
                    _mark_lost(lease)
                    return
                last_ok = now
                lease.authority.until_s = now + ttl / 2
                next_refresh = now + interval
                if lease.renewal_late.is_set():
                    log.info("etcd.lease_renewed_again")
                    lease.renewal_late.clear()
        except asyncio.CancelledError:
            raise
        except Exception:
            # Fail loud: whoever depends on the lease sees it lost.
            log.exception("etcd.lease_keepalive_crashed")
            _mark_lost(lease)
        finally:
            self._keepers.pop(lease.id, None)

    # ----------------------------------------------------------------- watches

    def watch_prefix(
        self, prefix: str, start_revision: int | None = None
    ) -> AsyncGenerator[WatchBatch, None]:
        """Watch every key starting with ``prefix``, from ``start_revision`` (inclusive) or, if
        None, from the revision current when iteration starts.

        Yields ``WatchEvents`` (puts and deletes, revision order) and, when the revision to
        resume from has been compacted, one ``Snapshot`` of the whole prefix after which events
        resume at ``snapshot.revision + 1``: nothing is skipped silently. A lost connection
        (etcd restart) is re-established with ``watch_backoff`` and the watch resumes at the
        last seen revision + 1. Raises (from iteration) StoreUnavailable after
        ``max_watch_outage_s`` without a connection, CorruptValue for an undecodable value,
        StoreClosed when the store closes. Close with ``aclose()`` or by leaving ``async for``.
        """
        start = self._p(prefix)
        return self._watches.watch(start, prefix_range_end(start), start_revision, prefix)

    def watch_key(self, key: str, start_revision: int | None) -> AsyncGenerator[WatchBatch, None]:
        """Watch the one key ``key``, as ``watch_prefix`` does (a ``Snapshot`` holds the key if
        it exists). Raises ValueError for a bad key; from iteration as ``watch_prefix``."""
        k = self._k(key)
        return self._watches.watch(k, k + b"\0", start_revision, key)


def _lease_id(lease: Lease | None) -> int:
    return 0 if lease is None else lease.id


def _mod_revision_is(key: bytes, mod_revision: int) -> rpc_pb2.Compare:
    return rpc_pb2.Compare(
        result=rpc_pb2.Compare.EQUAL, target=rpc_pb2.Compare.MOD, key=key,
        mod_revision=mod_revision,
    )


def _mark_lost(lease: Lease) -> None:
    lease.authority.until_s = float("-inf")
    lease.renewal_late.set()
    lease.lost.set()
