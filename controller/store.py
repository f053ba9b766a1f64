"""Durable controller state in etcd (DESIGN.md, "State" and "High availability").

A small store of our own over ``aetcd`` (the asyncio successor of ``etcd3``). Everything here is
typed; no ``aetcd`` object or ``Any`` leaves this module.

- ``EtcdStore``: JSON values in a versioned envelope ``{"schema": 1, "data": ...}`` under one key
  prefix (default ``/lightrail/v1``); callers use relative keys such as ``"jobs/job-1"``.
  Compare-and-swap through etcd transactions, leases with a keep-alive task the store owns, and
  prefix watches that survive an etcd restart and a compaction of the revision they resume from.
- ``LeaderElection``: one leader among controller replicas through a leased key, with
  self-fencing when the lease cannot be renewed within half its TTL.
- ``CoalescingWriter``: the hot path hands values over without awaiting etcd; a background task
  writes the latest value per key.

Errors: every operation raises a ``StoreError``. ``StoreUnavailable`` (etcd unreachable or too
slow; retryable) is told apart from ``CorruptValue`` (a stored value that is not our envelope;
retrying will not help) and ``StoreRequestFailed`` (etcd rejected the request).

etcd behaviour relied on (etcd API v3, https://etcd.io/docs/v3.4/learning/api/):
- every write increments the store-wide revision once, a transaction included;
- a watch created with ``start_revision`` replays every event from that revision on unless that
  revision was compacted, in which case etcd cancels the watch with ``compact_revision`` set;
- a Range answers with the revision it read at (``header.revision``);
- the events of one revision arrive in one WatchResponse (no ``fragment``);
- a lease expires ``TTL`` seconds after etcd last saw a keep-alive for it, and etcd deletes the
  keys attached to it; etcd never expires a lease earlier than that.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any, Final, Self

import aetcd
import aetcd.rpc
import structlog

Clock = Callable[[], float]
"""Returns the current time in seconds (monotonic)."""
Sleep = Callable[[float], Awaitable[None]]
"""Waits the given number of seconds."""

DEFAULT_PREFIX: Final = "/lightrail/v1"
SCHEMA_VERSION: Final = 1
"""Version written in the ``schema`` field of every JSON envelope."""

MAX_TXN_OPS: Final = 128
"""etcd's default ``--max-txn-ops``: operations allowed in one transaction."""

_MAX_TXN_BYTES: Final = 1_000_000
"""Bytes of keys and values per transaction we aim under (etcd's ``--max-request-bytes`` is
1.5 MiB by default)."""

_SHUTDOWN_TIMEOUT_S: Final = 5.0

# waitForReady for the unary services: a call made while the channel reconnects (etcd restart)
# waits for the connection up to its deadline instead of failing at once. The Watch service is
# left fail-fast: aetcd queues watch-create requests on a stream that never gives up while it
# waits, so a watch must fail quickly and be re-created on a fresh client instead.
_SERVICE_CONFIG: Final = json.dumps(
    {
        "methodConfig": [
            {
                "name": [
                    {"service": "etcdserverpb.KV"},
                    {"service": "etcdserverpb.Lease"},
                    {"service": "etcdserverpb.Maintenance"},
                    {"service": "etcdserverpb.Cluster"},
                ],
                "waitForReady": True,
            }
        ]
    }
)
_CHANNEL_OPTIONS: Final[Mapping[str, int | str]] = MappingProxyType(
    {
        "grpc.service_config": _SERVICE_CONFIG,
        # gRPC's default reconnect backoff grows to 120 s; an etcd restart must be seen in ~1 s.
        "grpc.initial_reconnect_backoff_ms": 100,
        "grpc.min_reconnect_backoff_ms": 100,
        "grpc.max_reconnect_backoff_ms": 1000,
        # A prefix read answers in one message; gRPC's default cap is 4 MiB.
        "grpc.max_receive_message_length": 64 * 1024 * 1024,
        # Detect a hung (not closed) etcd on long-lived watch streams. etcd refuses pings more
        # often than --grpc-keepalive-min-time (5 s by default).
        "grpc.keepalive_time_ms": 10_000,
        "grpc.keepalive_timeout_ms": 5_000,
        "grpc.http2.max_pings_without_data": 0,
    }
)

_log = structlog.get_logger(__name__)


# --------------------------------------------------------------------------- errors


class StoreError(Exception):
    """Base of every error raised by this module."""


class StoreUnavailable(StoreError):
    """etcd could not be reached or did not answer within the timeout. Retryable."""


class StoreRequestFailed(StoreError):
    """etcd answered with an error (invalid argument, compacted revision, ...). Not retryable
    as is."""


class RevisionCompacted(StoreRequestFailed):
    """The requested revision was compacted; etcd keeps history from ``compacted_revision`` on."""

    def __init__(self, message: str, compacted_revision: int) -> None:
        super().__init__(message)
        self.compacted_revision = compacted_revision


class StoreClosed(StoreError):
    """The store was closed while the operation was pending."""


class CorruptValue(StoreError):
    """A stored value is not a Lightrail JSON envelope. ``key`` is the relative key."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"corrupt value at key {key!r}: {reason}")
        self.key = key
        self.reason = reason


class UnsupportedSchema(CorruptValue):
    """A stored envelope has a schema version this code cannot read (written by a newer
    release)."""

    def __init__(self, key: str, schema: int) -> None:
        super().__init__(key, f"schema version {schema}, this release reads {SCHEMA_VERSION}")
        self.schema = schema


class FlushFailed(StoreError):
    """``CoalescingWriter`` gave up writing after its bounded retries."""


class FlushTimeout(StoreError):
    """``CoalescingWriter.flush`` did not finish within its timeout."""


# --------------------------------------------------------------------------- records


class EventKind(enum.Enum):
    """Kind of a watch event."""

    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as read from etcd. ``key`` is relative to the store prefix; ``value`` is the
    decoded ``data`` of the envelope; revisions are etcd store revisions; ``lease_id`` is the
    attached lease or None."""

    key: str
    value: object
    create_revision: int
    mod_revision: int
    version: int
    lease_id: int | None


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A put or delete seen by a watch. ``value`` is the decoded data for a put and None for a
    delete; ``mod_revision`` is the revision of the change (of the deletion for a delete)."""

    kind: EventKind
    key: str
    value: object | None
    mod_revision: int


@dataclass(frozen=True, slots=True)
class WatchEvents:
    """Events that arrived together, in revision order (never empty)."""

    events: tuple[WatchEvent, ...]

    @property
    def revision(self) -> int:
        """Revision of the last event."""
        return self.events[-1].mod_revision


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every key under ``prefix`` at store revision ``revision``: relative key -> decoded data.

    A watch yields one instead of events when the revision it had to resume from was compacted:
    the consumer must replace its view by this one ("rebuild"); events after it start at
    ``revision + 1``."""

    prefix: str
    items: Mapping[str, object]
    revision: int


WatchBatch = WatchEvents | Snapshot
"""What a watch yields."""


@dataclass(frozen=True, slots=True, eq=False)
class Lease:
    """An etcd lease kept alive by the store that granted it.

    ``ttl_s`` is the TTL etcd granted (etcd raises requests below its minimum, about 2 s with
    default timing). ``renewal_late`` is set while no keep-alive has succeeded for ``ttl_s / 2``
    seconds (cleared by the next success); ``lost`` is set, for good, when the lease is gone:
    etcd reported it expired, it was not renewed within ``ttl_s`` (measured from the send time of
    the last successful keep-alive, so never later than etcd's own expiry), or it was revoked.
    ``lost`` implies ``renewal_late``.
    """

    id: int
    ttl_s: int
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    renewal_late: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff: attempt ``n`` (from 0) waits ``min(max_s, initial_s * multiplier**n)``
    seconds."""

    initial_s: float = 0.05
    max_s: float = 1.0
    multiplier: float = 2.0

    def delay_s(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based)."""
        return float(min(self.max_s, self.initial_s * self.multiplier**attempt))


@dataclass(frozen=True, slots=True)
class _Write:
    """One pending write: ``value`` is an encoded envelope, or None for a delete."""

    value: bytes | None


@dataclass(frozen=True, slots=True)
class _TxnOutcome:
    succeeded: bool
    current: KeyValue | None


# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def _translated(op: str) -> Iterator[None]:
    """Map aetcd/gRPC errors raised in the block to the ``StoreError`` hierarchy."""
    try:
        yield
    except StoreError:
        raise
    except (
        aetcd.ConnectionFailedError,
        aetcd.ConnectionTimeoutError,
        aetcd.WatchTimeoutError,
        TimeoutError,
    ) as e:
        raise StoreUnavailable(f"{op}: etcd unavailable: {e!r}") from e
    except aetcd.RevisionCompactedError as e:
        raise RevisionCompacted(f"{op}: {e}", int(e.compacted_revision)) from e
    except aetcd.ClientError as e:
        raise StoreRequestFailed(f"{op}: etcd error: {e!r}") from e
    except aetcd.rpc.AioRpcError as e:
        code = e.code()
        if code in (aetcd.rpc.StatusCode.UNAVAILABLE, aetcd.rpc.StatusCode.DEADLINE_EXCEEDED):
            raise StoreUnavailable(f"{op}: etcd unavailable: {e.details()}") from e
        raise StoreRequestFailed(f"{op}: etcd error {code}: {e.details()}") from e


def _grpc_code(error: BaseException) -> aetcd.rpc.StatusCode | None:
    """The gRPC status code behind ``error`` (searched along its ``__cause__`` chain), if any."""
    current: BaseException | None = error
    while current is not None:
        if isinstance(current, aetcd.rpc.AioRpcError):
            code: aetcd.rpc.StatusCode = current.code()
            return code
        current = current.__cause__
    return None


def _encode(obj: object) -> bytes:
    """Encode ``obj`` in a schema-versioned envelope. Raises TypeError/ValueError if ``obj`` is not
    JSON-serialisable (NaN and infinities included)."""
    return json.dumps(
        {"schema": SCHEMA_VERSION, "data": obj}, separators=(",", ":"), allow_nan=False
    ).encode()


def _decode(key: str, raw: bytes) -> object:
    """Decode an envelope written by ``_encode``. Raises CorruptValue / UnsupportedSchema."""
    try:
        envelope = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptValue(key, f"not JSON ({e})") from e
    if not isinstance(envelope, dict) or set(envelope) != {"schema", "data"}:
        raise CorruptValue(key, "not a {schema, data} envelope")
    schema = envelope["schema"]
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise CorruptValue(key, f"schema is not an integer: {schema!r}")
    if schema != SCHEMA_VERSION:
        raise UnsupportedSchema(key, schema)
    data: object = envelope["data"]
    return data


def _prefix_range_end(prefix: bytes) -> bytes:
    """End of the range holding every key that starts with ``prefix`` (etcd convention)."""
    return bytes(aetcd.utils.prefix_range_end(prefix))


def _parse_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"etcd endpoint must be HOST:PORT, got {endpoint!r}")
    return host, int(port)


async def _bounded(aw: Awaitable[object], timeout_s: float, what: str) -> None:
    """Await ``aw`` for at most ``timeout_s``; log instead of raising on timeout or error (used in
    shutdown paths only)."""
    try:
        await asyncio.wait_for(aw, timeout_s)
    except TimeoutError:
        _log.warning("etcd.shutdown_step_timed_out", step=what, timeout_s=timeout_s)
    except (aetcd.ClientError, aetcd.rpc.AioRpcError, StoreError) as e:
        _log.warning("etcd.shutdown_step_failed", step=what, error=repr(e))


async def _cancel_task(task: asyncio.Task[Any], timeout_s: float) -> None:
    """Cancel ``task`` and wait for it at most ``timeout_s`` seconds."""
    task.cancel()
    _done, pending = await asyncio.wait({task}, timeout=timeout_s)
    if pending:
        _log.error("etcd.task_did_not_stop", task=task.get_name(), timeout_s=timeout_s)


class _WatchQueue:
    """Events and snapshots from a watch pump to its consumer, then at most one error."""

    def __init__(self) -> None:
        self._items: deque[WatchEvent | Snapshot] = deque()
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self.pump: asyncio.Task[None] | None = None

    def push(self, item: WatchEvent | Snapshot) -> None:
        self._items.append(item)
        self._ready.set()

    def fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._ready.set()

    async def next_batch(self) -> WatchBatch:
        while not self._items:
            if self._error is not None:
                raise self._error
            self._ready.clear()
            await self._ready.wait()
        head = self._items.popleft()
        if isinstance(head, Snapshot):
            return head
        events = [head]
        while self._items and isinstance(self._items[0], WatchEvent):
            nxt = self._items.popleft()
            assert isinstance(nxt, WatchEvent)
            events.append(nxt)
        return WatchEvents(tuple(events))


# --------------------------------------------------------------------------- the store


class EtcdStore:
    """JSON state under one etcd key prefix.

    Create with ``EtcdStore.connect(endpoint)`` and use as ``async with`` (or ``open()`` /
    ``close()``). Every call is bounded by ``timeout_s`` seconds and raises ``StoreUnavailable``
    when etcd does not answer in time; a call made while the connection is being re-established
    waits for it within that bound.

    Keys: callers pass keys relative to ``prefix`` (``"jobs/job-1"`` is stored at
    ``"/lightrail/v1/jobs/job-1"``); keys must not start with ``/``. Prefix arguments are plain
    string prefixes: ``"jobs/"`` matches ``"jobs/a"``, ``"jobs"`` also matches ``"jobsx"``.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout_s: float = 5.0,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        watch_backoff: Backoff = Backoff(initial_s=0.05, max_s=1.0),
        max_watch_outage_s: float | None = 60.0,
    ) -> None:
        if not prefix.startswith("/") or prefix.endswith("/"):
            raise ValueError(f"prefix must start with '/' and not end with '/': {prefix!r}")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self._host, self._port = _parse_endpoint(endpoint)
        self.endpoint = endpoint
        self.prefix = prefix
        self.timeout_s = timeout_s
        self._clock = clock
        self._sleep = sleep
        self._watch_backoff = watch_backoff
        self._max_watch_outage_s = max_watch_outage_s
        self._root = (prefix + "/").encode()
        self._client: Any = None
        self._closed = False
        self._keepers: dict[int, asyncio.Task[None]] = {}
        self._leases: dict[int, Lease] = {}
        self._watches: set[_WatchQueue] = set()
        self._log = _log.bind(endpoint=endpoint, prefix=prefix)

    @classmethod
    def connect(
        cls,
        endpoint: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout_s: float = 5.0,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        watch_backoff: Backoff = Backoff(initial_s=0.05, max_s=1.0),
        max_watch_outage_s: float | None = 60.0,
    ) -> EtcdStore:
        """A store for etcd at ``endpoint`` (``"HOST:PORT"``), opened by ``async with`` or
        ``open()``.

        ``timeout_s`` bounds every etcd call (seconds). ``watch_backoff`` paces watch reconnects;
        a watch that cannot reconnect for ``max_watch_outage_s`` seconds raises
        ``StoreUnavailable`` (None: retry forever). ``clock``/``sleep`` drive lease keep-alive and
        watch backoff timing. Raises ValueError for a malformed endpoint or prefix."""
        return cls(
            endpoint,
            prefix=prefix,
            timeout_s=timeout_s,
            clock=clock,
            sleep=sleep,
            watch_backoff=watch_backoff,
            max_watch_outage_s=max_watch_outage_s,
        )

    # ----------------------------------------------------------------- lifecycle

    def _new_client(self) -> Any:
        return aetcd.Client(
            host=self._host,
            port=self._port,
            timeout=self.timeout_s,
            options=dict(_CHANNEL_OPTIONS),
        )

    async def open(self) -> None:
        """Connect and check that etcd answers (one read). Raises StoreUnavailable."""
        if self._closed:
            raise StoreClosed("store was closed")
        if self._client is not None:
            return
        self._client = self._new_client()
        try:
            revision = await self.current_revision()
        except BaseException:
            await self._close_client(self._client)
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
        for queue in list(self._watches):
            queue.fail(StoreClosed("store closed"))
            if queue.pump is not None:
                await _cancel_task(queue.pump, _SHUTDOWN_TIMEOUT_S)
        for task in list(self._keepers.values()):
            await _cancel_task(task, _SHUTDOWN_TIMEOUT_S)
        self._keepers.clear()
        if self._client is not None:
            await self._close_client(self._client)
            self._client = None
        self._log.info("etcd.store_closed")

    async def _close_client(self, client: Any) -> None:
        try:
            await asyncio.wait_for(client.close(), _SHUTDOWN_TIMEOUT_S)
        except TimeoutError:
            # aetcd's close waits on its watcher's request queue; drop the channel directly.
            self._log.warning("etcd.client_close_timed_out", timeout_s=_SHUTDOWN_TIMEOUT_S)
            channel = client.channel
            if channel is not None:
                await _bounded(channel.close(), _SHUTDOWN_TIMEOUT_S, "channel.close")
        except (aetcd.ClientError, aetcd.rpc.AioRpcError) as e:
            self._log.warning("etcd.client_close_failed", error=repr(e))

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

    def _c(self) -> Any:
        if self._closed:
            raise StoreClosed("store was closed")
        if self._client is None:
            raise StoreError("store is not open: use 'async with' or await open()")
        return self._client

    # ----------------------------------------------------------------- keys

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

    def _kv(self, raw: Any) -> KeyValue:
        key = self._rel(bytes(raw.key))
        lease_id = int(raw.lease)
        return KeyValue(
            key=key,
            value=_decode(key, bytes(raw.value)),
            create_revision=int(raw.create_revision),
            mod_revision=int(raw.mod_revision),
            version=int(raw.version),
            lease_id=lease_id if lease_id != 0 else None,
        )

    # ----------------------------------------------------------------- reads

    async def current_revision(self) -> int:
        """The store-wide etcd revision now (a linearizable, count-only read). Raises
        StoreUnavailable."""
        client = self._c()
        with _translated("current_revision"):
            await client.connect()
            request = aetcd.rpc.RangeRequest(key=self._root, count_only=True)
            response = await client.kvstub.Range(
                request, timeout=self.timeout_s, metadata=client.metadata
            )
        return int(response.header.revision)

    async def get(self, key: str) -> KeyValue | None:
        """``key`` with its revisions, or None if absent. Raises CorruptValue, StoreUnavailable."""
        client = self._c()
        with _translated(f"get {key}"):
            result = await client.get(self._k(key))
        return None if result is None else self._kv(result)

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
        client = self._c()
        start = self._p(prefix)
        with _translated(f"get_prefix {prefix}"):
            result = await client.get_range(start, _prefix_range_end(start))
        items: dict[str, object] = {}
        for raw in result:
            kv = self._kv(raw)
            items[kv.key] = kv.value
        return Snapshot(
            prefix=prefix, items=MappingProxyType(items), revision=int(result.header.revision)
        )

    # ----------------------------------------------------------------- writes

    async def put_json(self, key: str, obj: object, *, lease: Lease | None = None) -> int:
        """Store ``obj`` (JSON-serialisable) at ``key``, attached to ``lease`` if given. Returns
        the revision of the write. Raises TypeError/ValueError for a value JSON cannot encode,
        StoreUnavailable, StoreRequestFailed (e.g. the lease no longer exists)."""
        client = self._c()
        value = _encode(obj)
        with _translated(f"put {key}"):
            result = await client.put(self._k(key), value, lease=_lease_id(lease))
        return int(result.header.revision)

    async def put_if_absent(self, key: str, obj: object, *, lease: Lease | None = None) -> bool:
        """Create ``key`` only if it does not exist (etcd transaction comparing its
        create_revision with 0). Returns whether it was created. Raises as ``put_json``."""
        outcome = await self._txn_put(key, _encode(obj), lease, expected_mod_revision=None)
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
        outcome = await self._txn_put(
            key, _encode(obj), lease, expected_mod_revision=expected_mod_revision
        )
        return outcome.succeeded

    async def compare_and_delete(self, key: str, *, expected_mod_revision: int) -> bool:
        """Delete ``key`` only if its mod_revision is still ``expected_mod_revision``. Returns
        whether it was deleted. Raises StoreUnavailable."""
        client = self._c()
        k = self._k(key)
        tx = client.transactions
        with _translated(f"compare_and_delete {key}"):
            succeeded, _ = await client.transaction(
                compare=[tx.mod(k) == expected_mod_revision],
                success=[tx.delete(k)],
                failure=[],  # aetcd iterates `failure`; None raises TypeError (client.py:952)
            )
        return bool(succeeded)

    async def _txn_put(
        self, key: str, value: bytes, lease: Lease | None, *, expected_mod_revision: int | None
    ) -> _TxnOutcome:
        """Put ``value`` if the key is absent (``expected_mod_revision`` None) or still at that
        mod_revision; either way return the key as it is after the transaction."""
        client = self._c()
        k = self._k(key)
        tx = client.transactions
        compare = (
            tx.create(k) == 0
            if expected_mod_revision is None
            else (tx.mod(k) == expected_mod_revision)
        )
        with _translated(f"txn put {key}"):
            succeeded, responses = await client.transaction(
                compare=[compare],
                success=[tx.put(k, value, lease=_lease_id(lease)), tx.get(k)],
                failure=[tx.get(k)],
            )
        # aetcd returns a range response as a list of (value, rtypes.Get) pairs (client.py:971).
        ranges = [r for r in responses if isinstance(r, list)]
        current = None
        if ranges and ranges[-1]:
            current = self._kv(ranges[-1][0][1])
        return _TxnOutcome(succeeded=bool(succeeded), current=current)

    async def _write_batch(self, writes: Mapping[str, _Write]) -> None:
        """Apply puts/deletes in one transaction (at most MAX_TXN_OPS operations)."""
        client = self._c()
        tx = client.transactions
        ops = [
            tx.put(self._k(key), w.value) if w.value is not None else tx.delete(self._k(key))
            for key, w in writes.items()
        ]
        with _translated(f"write batch of {len(ops)}"):
            await client.transaction(compare=[], success=ops, failure=[])

    async def delete(self, key: str) -> bool:
        """Delete ``key``. Returns whether it existed. Raises StoreUnavailable."""
        client = self._c()
        with _translated(f"delete {key}"):
            result = await client.delete(self._k(key))
        return result is not None

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with ``prefix`` (``""``: everything under the store prefix).
        Returns how many were deleted. Raises StoreUnavailable."""
        client = self._c()
        start = self._p(prefix)
        with _translated(f"delete_prefix {prefix}"):
            result = await client.delete_range(start, _prefix_range_end(start))
        return int(result.deleted)

    # ----------------------------------------------------------------- admin

    async def compact(self, revision: int, *, physical: bool = True) -> None:
        """Compact etcd's history (the whole keyspace, not only our prefix) below ``revision``:
        watches and reads at older revisions fail afterwards. ``physical`` waits until the
        compaction is applied to the backend. Raises StoreRequestFailed if ``revision`` is
        already compacted or in the future, StoreUnavailable."""
        client = self._c()
        with _translated(f"compact {revision}"):
            await client.compact(revision, physical=physical)
        self._log.info("etcd.compacted", revision=revision)

    # ----------------------------------------------------------------- leases

    async def grant_lease(self, ttl_s: int) -> Lease:
        """Grant a lease of ``ttl_s`` seconds (etcd may raise it to its minimum) and keep it alive
        from a task owned by this store: a keep-alive every ``ttl/3`` s, retried quickly on
        failure; see ``Lease`` for ``renewal_late`` and ``lost``. Raises StoreUnavailable."""
        if ttl_s < 1:
            raise ValueError("ttl_s must be >= 1")
        client = self._c()
        sent_at = self._clock()
        with _translated("grant lease"):
            raw = await client.lease(ttl_s)
        lease = Lease(id=int(raw.id), ttl_s=int(raw.ttl))
        self._leases[lease.id] = lease
        self._keepers[lease.id] = asyncio.create_task(
            self._keep_alive(lease, sent_at), name=f"etcd-lease-keepalive:{lease.id:x}"
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
            await _cancel_task(task, _SHUTDOWN_TIMEOUT_S)
        self._leases.pop(lease.id, None)
        _mark_lost(lease)
        client = self._c()
        try:
            with _translated(f"revoke lease {lease.id:x}"):
                await client.revoke_lease(lease.id)
        except StoreRequestFailed as e:
            if _grpc_code(e) != aetcd.rpc.StatusCode.NOT_FOUND:
                raise
            self._log.info("etcd.lease_already_gone", lease_id=f"{lease.id:x}")
            return
        self._log.info("etcd.lease_revoked", lease_id=f"{lease.id:x}")

    async def _refresh(self, lease_id: int, timeout_s: float) -> int:
        """One keep-alive; returns the TTL etcd reports (0 or less: the lease is gone)."""
        client = self._c()
        with _translated(f"keep-alive {lease_id:x}"):
            # aetcd's refresh_lease opens a LeaseKeepAlive stream, sends one request and returns
            # the first reply (client.py:1032); it has no keep-alive loop of its own.
            reply = await asyncio.wait_for(client.refresh_lease(lease_id), timeout_s)
        return int(reply.TTL) if reply is not None else 0

    async def _keep_alive(self, lease: Lease, granted_at: float) -> None:
        log = self._log.bind(lease_id=f"{lease.id:x}", ttl_s=lease.ttl_s)
        ttl = float(lease.ttl_s)
        interval = ttl / 3
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
                budget_s = max(min(interval, deadline - now), 0.05)
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
        return self._watch(start, _prefix_range_end(start), start_revision, prefix)

    def _watch_key(self, key: str, start_revision: int | None) -> AsyncGenerator[WatchBatch, None]:
        k = self._k(key)
        return self._watch(k, k + b"\0", start_revision, key)

    async def _watch(
        self, start: bytes, end: bytes, start_revision: int | None, label: str
    ) -> AsyncGenerator[WatchBatch, None]:
        self._c()
        queue = _WatchQueue()
        self._watches.add(queue)
        pump = asyncio.create_task(
            self._pump(start, end, start_revision, label, queue), name=f"etcd-watch:{label}"
        )
        queue.pump = pump
        try:
            while True:
                yield await queue.next_batch()
        finally:
            self._watches.discard(queue)
            await _cancel_task(pump, _SHUTDOWN_TIMEOUT_S)

    async def _snapshot(self, start: bytes, end: bytes, label: str) -> Snapshot:
        client = self._c()
        with _translated(f"snapshot {label}"):
            result = await client.get_range(start, end)
        items: dict[str, object] = {}
        for raw in result:
            kv = self._kv(raw)
            items[kv.key] = kv.value
        return Snapshot(
            prefix=label, items=MappingProxyType(items), revision=int(result.header.revision)
        )

    async def _pump(
        self,
        start: bytes,
        end: bytes,
        start_revision: int | None,
        label: str,
        queue: _WatchQueue,
    ) -> None:
        """Feed ``queue`` from etcd watches, re-created after every failure, each resuming at the
        revision after the last event seen."""
        log = self._log.bind(watch=label)
        attempt = 0
        outage_since: float | None = None
        need_snapshot = False
        cursor: _Cursor | None = None
        try:
            while True:
                try:
                    if need_snapshot:
                        snapshot = await self._snapshot(start, end, label)
                        queue.push(snapshot)
                        cursor = _Cursor(next_revision=snapshot.revision + 1)
                        need_snapshot = False
                        log.warning("etcd.watch_rebuilt", revision=snapshot.revision)
                    if cursor is None:
                        first = start_revision
                        if first is None:
                            first = await self.current_revision() + 1
                        cursor = _Cursor(next_revision=first)
                    await self._watch_once(start, end, cursor, queue, log)
                    raise StoreUnavailable("watch stream ended")
                except RevisionCompacted as e:
                    log.warning(
                        "etcd.watch_compacted",
                        requested_revision=cursor.next_revision if cursor else None,
                        compacted_revision=e.compacted_revision,
                    )
                    need_snapshot = True
                except StoreUnavailable as e:
                    now = self._clock()
                    if cursor is not None and cursor.connected:
                        # Connected since the last failure: a new outage starts now.
                        cursor.connected = False
                        attempt, outage_since = 0, None
                    if outage_since is None:
                        outage_since = now
                    elif (
                        self._max_watch_outage_s is not None
                        and now - outage_since > self._max_watch_outage_s
                    ):
                        raise StoreUnavailable(
                            f"watch {label}: no connection for {now - outage_since:.1f} s"
                        ) from e
                    delay_s = self._watch_backoff.delay_s(attempt)
                    attempt += 1
                    log.warning(
                        "etcd.watch_reconnecting",
                        error=str(e),
                        next_revision=cursor.next_revision if cursor else None,
                        delay_s=delay_s,
                    )
                    await self._sleep(delay_s)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.error("etcd.watch_failed", error=repr(e))
            queue.fail(e)

    async def _watch_once(
        self, start: bytes, end: bytes, cursor: _Cursor, queue: _WatchQueue, log: Any
    ) -> None:
        """Run one etcd watch from ``cursor.next_revision`` on a client of its own until its
        stream ends, advancing the cursor past every event queued. Raises RevisionCompacted,
        StoreUnavailable, StoreRequestFailed, CorruptValue."""
        # A fresh client per attempt: aetcd's watcher keeps a per-client request queue that a
        # failed or timed-out watch creation can leave wedged (watcher.py add_callback), and a
        # watch is not resumed by aetcd after its stream breaks (watcher.py _terminate_stream).
        client = self._new_client()
        watch: Any = None
        try:
            with _translated("watch"):
                watch = await client.watch(
                    start, range_end=end, start_revision=cursor.next_revision
                )
                cursor.connected = True
                log.info("etcd.watch_started", start_revision=cursor.next_revision)
                async for raw in watch:
                    kind = EventKind.PUT if raw.kind == "PUT" else EventKind.DELETE
                    key = self._rel(bytes(raw.kv.key))
                    mod_revision = int(raw.kv.mod_revision)
                    value = _decode(key, bytes(raw.kv.value)) if kind is EventKind.PUT else None
                    queue.push(WatchEvent(kind, key, value, mod_revision))
                    # Safe to resume after this revision: etcd sends all events of a revision in
                    # one response and aetcd hands over a whole response before a stream error
                    # (watcher.py _handle_response).
                    cursor.next_revision = mod_revision + 1
        finally:
            if watch is not None:
                await _bounded(watch.cancel(), _SHUTDOWN_TIMEOUT_S, "watch.cancel")
            await self._close_client(client)


@dataclass(slots=True)
class _Cursor:
    """Where a watch resumes (mutable state of one watch pump)."""

    next_revision: int
    connected: bool = False


def _lease_id(lease: Lease | None) -> int:
    return 0 if lease is None else lease.id


def _mark_lost(lease: Lease) -> None:
    lease.renewal_late.set()
    lease.lost.set()


# --------------------------------------------------------------------------- leader election


class LeaderElection:
    """One leader among controller replicas (DESIGN.md, "High availability").

    ``campaign()`` creates the key ``key`` (relative, default ``"leader"``) holding
    ``{"replica_id": replica_id}``, attached to a lease of ``ttl_s`` seconds that the store keeps
    alive, through a transaction that succeeds only if the key is absent. While another replica
    holds it, ``campaign()`` watches the key and tries again once it is deleted (its lease revoked
    or expired).

    Same replica id: a replica that restarts under the same ``replica_id`` takes over its own
    stale key at once (compare-and-swap on the key's mod_revision) instead of waiting up to a
    TTL for its previous lease to expire. So two live processes must never share a replica id.

    Self-fencing: ``is_leader`` is cleared and then ``fenced`` is set (with ``fence_reason``) as
    soon as the lease has not been renewed for ``ttl_s / 2`` seconds (measured from the send time
    of the last acknowledged keep-alive), or the leader key is deleted or overwritten. etcd
    cannot expire the lease, and so no other replica can win, before ``ttl_s`` seconds after
    that send time: the leader stops at least ``ttl_s / 2`` seconds before anyone can take over.
    Code that commands devices must check ``is_leader`` right before each command. After
    fencing the lease is revoked (best effort) so another replica can take over; an election
    object campaigns once: create a new one to campaign again.
    """

    def __init__(
        self, store: EtcdStore, replica_id: str, *, ttl_s: int = 10, key: str = "leader"
    ) -> None:
        if not replica_id:
            raise ValueError("replica_id must be non-empty")
        store.full_key(key)  # validates
        self.replica_id = replica_id
        self.key = key
        self.ttl_s = ttl_s
        self.is_leader = asyncio.Event()
        self.fenced = asyncio.Event()
        self.fence_reason: str | None = None
        self._store = store
        self._lease: Lease | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._campaigned = False
        self._log = _log.bind(replica_id=replica_id, election_key=store.full_key(key))

    @property
    def lease(self) -> Lease | None:
        """The lease holding the leader key while this replica leads."""
        return self._lease

    def _holder(self, kv: KeyValue) -> str:
        data = kv.value
        if not isinstance(data, dict) or not isinstance(data.get("replica_id"), str):
            raise CorruptValue(kv.key, "leader record has no string 'replica_id'")
        holder: str = data["replica_id"]
        return holder

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
        value = _encode({"replica_id": self.replica_id})
        while True:
            lease = await self._store.grant_lease(self.ttl_s)
            try:
                outcome = await self._store._txn_put(
                    self.key, value, lease, expected_mod_revision=None
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
                    outcome = await self._store._txn_put(
                        self.key, value, lease, expected_mod_revision=current.mod_revision
                    )
            except BaseException:
                await self._drop_lease(lease)
                raise
            if outcome.succeeded and outcome.current is not None:
                break
            await self._drop_lease(lease)
            if outcome.current is not None:
                self._log.info("election.following", leader=self._holder(outcome.current))
                await self._wait_for_vacancy(outcome.current.mod_revision)
        self._lease = lease
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
        """Return once the leader key is deleted after ``holder_mod_revision``."""
        watch = self._store._watch_key(self.key, holder_mod_revision + 1)
        try:
            async for batch in watch:
                if isinstance(batch, Snapshot):
                    if self.key not in batch.items:
                        return
                elif any(e.kind is EventKind.DELETE for e in batch.events):
                    return
        finally:
            await _bounded(watch.aclose(), _SHUTDOWN_TIMEOUT_S, "watch.aclose")

    async def _key_changed(self, mod_revision: int) -> str:
        """Return a reason once the leader key no longer is the one written at
        ``mod_revision``."""
        watch = self._store._watch_key(self.key, mod_revision + 1)
        try:
            async for batch in watch:
                if isinstance(batch, WatchEvents):
                    return f"leader key {batch.events[0].kind.value} at {batch.revision}"
                kv = await self._store.get(self.key)
                if kv is None or kv.mod_revision != mod_revision:
                    return "leader key changed while the watch was compacted"
        finally:
            await _bounded(watch.aclose(), _SHUTDOWN_TIMEOUT_S, "watch.aclose")
        return "leader key watch ended"

    async def _guard(self, lease: Lease, mod_revision: int) -> None:
        late = asyncio.create_task(lease.renewal_late.wait(), name="election-lease-late")
        changed = asyncio.create_task(self._key_changed(mod_revision), name="election-key-watch")
        try:
            done, _ = await asyncio.wait({late, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (late, changed):
                if not task.done():
                    await _cancel_task(task, _SHUTDOWN_TIMEOUT_S)
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
        self.fence_reason = reason
        self.fenced.set()
        self._log.error("election.fenced", reason=reason)

    async def resign(self) -> None:
        """Stop leading: clear ``is_leader``, stop the guard and revoke the lease (etcd deletes the
        leader key, so a follower can win at once). Each step is bounded by the store timeout.
        Raises StoreUnavailable if the lease could not be revoked (it then expires after its
        TTL)."""
        self.is_leader.clear()
        if self._monitor is not None:
            await _cancel_task(self._monitor, _SHUTDOWN_TIMEOUT_S)
            self._monitor = None
        lease, self._lease = self._lease, None
        if lease is not None:
            self._log.info("election.resigning", lease_id=f"{lease.id:x}")
            try:
                await asyncio.wait_for(self._store.revoke(lease), self._store.timeout_s)
            except TimeoutError as e:
                raise StoreUnavailable("resign: revoking the lease timed out") from e


# --------------------------------------------------------------------------- coalescing writer


class CoalescingWriter:
    """Asynchronous, coalescing writes for the hot path (DESIGN.md: "Nothing on the hot path
    waits for etcd").

    ``put``/``delete`` record the latest value per key and return at once (no await, no etcd
    round trip; not thread-safe: call from the event loop). A background task (``run()``, or
    started by ``async with``) writes everything pending in transactions of at most
    ``max_ops_per_txn`` keys, so repeated writes to one key between two flushes cost one etcd
    write. A write that fails with StoreUnavailable is retried with ``backoff`` up to
    ``max_attempts`` attempts; then ``run()`` raises FlushFailed, and so do later ``put``,
    ``delete`` and ``flush`` calls (fail loud). Other store errors fail at once.
    """

    def __init__(
        self,
        store: EtcdStore,
        *,
        backoff: Backoff = Backoff(initial_s=0.1, max_s=2.0),
        max_attempts: int = 8,
        max_ops_per_txn: int = 64,
        close_timeout_s: float = 10.0,
        sleep: Sleep = asyncio.sleep,
        name: str = "etcd-coalescing-writer",
    ) -> None:
        if not 1 <= max_ops_per_txn <= MAX_TXN_OPS:
            raise ValueError(f"max_ops_per_txn must be in 1..{MAX_TXN_OPS}")
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self._store = store
        self._backoff = backoff
        self._max_attempts = max_attempts
        self._max_ops = max_ops_per_txn
        self._close_timeout_s = close_timeout_s
        self._sleep = sleep
        self._name = name
        self._pending: dict[str, _Write] = {}
        self._seq = 0  # number of put/delete calls so far
        self._written = 0  # every call up to this number is in etcd
        self._wake = asyncio.Event()
        self._round_done = asyncio.Event()
        self._failure: FlushFailed | None = None
        self._running = False
        self._task: asyncio.Task[None] | None = None
        self._log = _log.bind(writer=name)

    @property
    def pending(self) -> int:
        """Keys waiting to be written."""
        return len(self._pending)

    def put(self, key: str, obj: object) -> None:
        """Schedule ``obj`` to be stored at ``key`` (a later put or delete of the key replaces it).
        Encodes at once: raises TypeError/ValueError for a value JSON cannot encode, ValueError
        for a bad key, FlushFailed if the writer has failed."""
        self._record(key, _Write(_encode(obj)))

    def delete(self, key: str) -> None:
        """Schedule ``key`` to be deleted. Raises as ``put``."""
        self._record(key, _Write(None))

    def _record(self, key: str, write: _Write) -> None:
        if self._failure is not None:
            raise self._failure
        self._store.full_key(key)  # validates now, not in the background
        self._pending.pop(key, None)  # keep insertion order = order of last write
        self._pending[key] = write
        self._seq += 1
        self._wake.set()

    async def run(self) -> None:
        """Write pending values until cancelled. Raises FlushFailed (see class doc)."""
        if self._running:
            raise RuntimeError("CoalescingWriter.run is already running")
        self._running = True
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if not self._pending:
                    continue
                batch, self._pending = self._pending, {}
                seq = self._seq
                try:
                    await self._write(batch)
                except asyncio.CancelledError:
                    # Not known to be written: pending again, unless superseded meanwhile.
                    self._pending = {**batch, **self._pending}
                    raise
                except FlushFailed as e:
                    self._failure = e
                    self._log.error("etcd.writer_failed", error=str(e), keys=len(batch))
                    raise
                self._written = seq
                self._end_round()
        finally:
            self._running = False
            self._end_round()

    def _end_round(self) -> None:
        done, self._round_done = self._round_done, asyncio.Event()
        done.set()

    async def _write(self, batch: Mapping[str, _Write]) -> None:
        keys = list(batch)
        while keys:
            chunk: dict[str, _Write] = {}
            nbytes = 0
            for key in keys:
                size = len(key) + len(batch[key].value or b"")
                if chunk and (len(chunk) >= self._max_ops or nbytes + size > _MAX_TXN_BYTES):
                    break
                chunk[key] = batch[key]
                nbytes += size
            attempt = 0
            while True:
                try:
                    await self._store._write_batch(chunk)
                    break
                except StoreUnavailable as e:
                    attempt += 1
                    if attempt >= self._max_attempts:
                        raise FlushFailed(
                            f"{self._name}: {len(chunk)} keys not written after {attempt} "
                            f"attempts: {e}"
                        ) from e
                    delay_s = self._backoff.delay_s(attempt - 1)
                    self._log.warning(
                        "etcd.writer_retrying", error=str(e), attempt=attempt, delay_s=delay_s
                    )
                    await self._sleep(delay_s)
                except StoreError as e:
                    raise FlushFailed(f"{self._name}: write rejected: {e}") from e
            del keys[: len(chunk)]

    async def flush(self, timeout_s: float) -> None:
        """Wait until every put/delete made before this call is in etcd. Raises FlushTimeout
        after ``timeout_s`` seconds, FlushFailed if the writer failed, RuntimeError if it is not
        running."""
        target = self._seq
        try:
            async with asyncio.timeout(timeout_s):
                while self._written < target:
                    if self._failure is not None:
                        raise self._failure
                    if not self._running and (self._task is None or self._task.done()):
                        raise RuntimeError(f"{self._name} is not running: nothing writes")
                    await self._round_done.wait()
        except TimeoutError as e:
            raise FlushTimeout(
                f"{self._name}: {target - self._written} writes not flushed in {timeout_s} s"
            ) from e

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self.run(), name=self._name)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Flush (bounded by ``close_timeout_s``) unless leaving on an exception, then stop the
        task. Raises FlushFailed / FlushTimeout when leaving normally."""
        task, self._task = self._task, None
        try:
            if exc is None and task is not None and not task.done():
                await self.flush(self._close_timeout_s)
        finally:
            if task is not None:
                await _cancel_task(task, _SHUTDOWN_TIMEOUT_S)
        if exc is None and self._failure is not None:
            raise self._failure
