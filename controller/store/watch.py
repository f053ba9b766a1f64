"""Watches of a key range that survive an etcd restart and a compaction (``EtcdStore`` runs them).

Each watch has a pump task that feeds a queue from etcd watches, re-created after every failure
(on the next member of the cluster: ``client.EtcdClient`` moves on when a stream breaks) and
resumed at the revision after the last event seen; when that revision was compacted, the pump
reads the whole range once and hands over a ``Snapshot`` instead.

etcd behaviour relied on (etcd API v3, https://etcd.io/docs/v3.4/learning/api/):
- a watch created with ``start_revision`` replays every event from that revision on unless that
  revision was compacted, in which case etcd cancels the watch with ``compact_revision`` set;
- a Range answers with the revision it read at (``header.revision``);
- the events of one revision arrive in one WatchResponse (no ``fragment``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

import structlog

from lightrail.controller.domain.timing import Backoff, Clock, Sleep
from lightrail.controller.store.client import SHUTDOWN_TIMEOUT_S, WatchStream, cancel_task
from lightrail.controller.store.errors import RevisionCompacted, StoreClosed, StoreUnavailable
from lightrail.controller.store.types import (
    EventKind,
    Snapshot,
    WatchBatch,
    WatchEvent,
    WatchEvents,
    decode_value,
)
from lightrail.etcdapi import kv_pb2, rpc_pb2


@dataclass(frozen=True, slots=True)
class WatchSource:
    """What the watches of one store read through (bound methods of that ``EtcdStore``).

    ``open_watch``: creates one etcd watch (raises RevisionCompacted, StoreUnavailable,
    StoreRequestFailed);
    ``check_open``: raises StoreClosed / StoreError unless the store is open;
    ``current_revision``: the store-wide revision now; ``read_range(start, end, label)``: every
    key in [start, end) as a ``Snapshot`` labelled ``label``; ``relative_key``: an etcd key ->
    the key relative to the store prefix (raises StoreError outside it)."""

    open_watch: Callable[[rpc_pb2.WatchCreateRequest], Awaitable[WatchStream]]
    check_open: Callable[[], object]
    current_revision: Callable[[], Awaitable[int]]
    read_range: Callable[[bytes, bytes, str], Awaitable[Snapshot]]
    relative_key: Callable[[bytes], str]


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


@dataclass(slots=True)
class _Cursor:
    """Where a watch resumes (mutable state of one watch pump)."""

    next_revision: int
    connected: bool = False


class Watches:
    """The running watches of one store.

    ``backoff`` paces reconnects; a watch that cannot reconnect for ``max_outage_s`` seconds
    raises StoreUnavailable (None: retry forever); ``clock``/``sleep`` time the outage and the
    backoff; ``log`` is the store's bound logger."""

    def __init__(
        self,
        source: WatchSource,
        *,
        clock: Clock,
        sleep: Sleep,
        backoff: Backoff,
        max_outage_s: float | None,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self._source = source
        self._clock = clock
        self._sleep = sleep
        self._backoff = backoff
        self._max_outage_s = max_outage_s
        self._log = log
        self._queues: set[_WatchQueue] = set()

    async def close(self) -> None:
        """End every watch: its consumer gets StoreClosed; each pump is stopped within
        ``SHUTDOWN_TIMEOUT_S``."""
        for queue in list(self._queues):
            queue.fail(StoreClosed("store closed"))
            if queue.pump is not None:
                await cancel_task(queue.pump, SHUTDOWN_TIMEOUT_S)

    async def watch(
        self, start: bytes, end: bytes, start_revision: int | None, label: str
    ) -> AsyncGenerator[WatchBatch, None]:
        """Watch every etcd key in [``start``, ``end``) from ``start_revision`` (inclusive) or,
        if None, from the revision current when iteration starts; ``label`` names the watch in
        logs and snapshots. See ``EtcdStore.watch_prefix`` for what it yields and raises."""
        self._source.check_open()
        queue = _WatchQueue()
        self._queues.add(queue)
        pump = asyncio.create_task(
            self._pump(start, end, start_revision, label, queue), name=f"etcd-watch:{label}"
        )
        queue.pump = pump
        try:
            while True:
                yield await queue.next_batch()
        finally:
            self._queues.discard(queue)
            await cancel_task(pump, SHUTDOWN_TIMEOUT_S)

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
                        snapshot = await self._source.read_range(start, end, label)
                        queue.push(snapshot)
                        cursor = _Cursor(next_revision=snapshot.revision + 1)
                        need_snapshot = False
                        log.warning("etcd.watch_rebuilt", revision=snapshot.revision)
                    if cursor is None:
                        first = start_revision
                        if first is None:
                            first = await self._source.current_revision() + 1
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
                        self._max_outage_s is not None
                        and now - outage_since > self._max_outage_s
                    ):
                        raise StoreUnavailable(
                            f"watch {label}: no connection for {now - outage_since:.1f} s"
                        ) from e
                    delay_s = self._backoff.delay_s(attempt)
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
        self,
        start: bytes,
        end: bytes,
        cursor: _Cursor,
        queue: _WatchQueue,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        """Run one etcd watch from ``cursor.next_revision`` until its stream ends, advancing the
        cursor past every event queued. Raises RevisionCompacted, StoreUnavailable,
        StoreRequestFailed, CorruptValue."""
        stream = await self._source.open_watch(
            rpc_pb2.WatchCreateRequest(
                key=start, range_end=end, start_revision=cursor.next_revision
            )
        )
        try:
            cursor.connected = True
            log.info(
                "etcd.watch_started",
                start_revision=cursor.next_revision,
                member=stream.endpoint,
            )
            async for events in stream:
                for raw in events:
                    kind = EventKind.PUT if raw.type == kv_pb2.Event.PUT else EventKind.DELETE
                    key = self._source.relative_key(bytes(raw.kv.key))
                    mod_revision = int(raw.kv.mod_revision)
                    value = (
                        decode_value(key, bytes(raw.kv.value)) if kind is EventKind.PUT else None
                    )
                    queue.push(WatchEvent(kind, key, value, mod_revision))
                # Safe to resume after this revision: etcd sends all events of a revision in one
                # response (no ``fragment`` requested), and a response is handed over whole.
                if events:
                    cursor.next_revision = int(events[-1].kv.mod_revision) + 1
        finally:
            stream.cancel()
