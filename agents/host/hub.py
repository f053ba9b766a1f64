"""State, transitions and fan-out shared by every GPU health source of one host: ``HealthHub``
holds each GPU's ``GpuHealth``, turns a changed state into one ``HealthEvent`` and delivers it,
in order, to every ``HealthSubscription`` (DESIGN.md "Failover").
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import AsyncIterator

from lightrail.agents.host.health import EventSource, GpuHealth, GpuId, HealthEvent, HealthState
from lightrail.controller.domain.timing import WallClock


class HealthSubscription(AsyncIterator[HealthEvent]):
    """Health events of one source from the moment of subscription, in order, none dropped.
    ``aclose`` ends the iteration; a subscription nobody references any more (its reader task
    was cancelled) is released by the source on its own."""

    def __init__(self, hub: HealthHub) -> None:
        self._hub = hub
        self._queue: asyncio.Queue[HealthEvent | None] = asyncio.Queue()
        self._closed = False

    def __aiter__(self) -> HealthSubscription:
        return self

    async def __anext__(self) -> HealthEvent:
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        event = await self._queue.get()
        if event is None:
            raise StopAsyncIteration
        return event

    def _offer(self, event: HealthEvent | None) -> None:
        self._queue.put_nowait(event)

    async def aclose(self) -> None:
        """Unsubscribe; a pending ``__anext__`` ends with ``StopAsyncIteration``."""
        if not self._closed:
            self._closed = True
            self._hub._unsubscribe(self)
            self._offer(None)


class HealthHub:
    """The health of every GPU of one host, its transitions and their delivery.

    Thread-safe: ``set`` may be called from any thread (NVML's event thread, the poll thread,
    the event loop); a transition is computed under a lock and handed to the event loop in that
    same order, so subscribers see transitions in the order they happened. Setting the state a
    GPU already has is not a transition and yields no event. While ``held`` (a hung emulated
    host) transitions are kept and delivered on release.
    """

    def __init__(self, host: str, *, wall_clock: WallClock = time.time) -> None:
        self._host = host
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._gpus: dict[GpuId, GpuHealth] = {}
        self._subscribers: weakref.WeakSet[HealthSubscription] = weakref.WeakSet()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._held = False
        self._pending: list[HealthEvent] = []

    @property
    def host(self) -> str:
        return self._host

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop subscribers live on (set by ``subscribe`` and by sources' ``run``)."""
        self._loop = loop

    def add_gpu(
        self,
        index: int,
        *,
        state: HealthState = HealthState.UNKNOWN,
        reason: str = "not yet observed",
        source: EventSource = EventSource.NVML_POLL,
        uuid: str | None = None,
    ) -> GpuId:
        """Register GPU ``index`` with an initial state (no event)."""
        gpu = GpuId(self._host, index)
        with self._lock:
            self._gpus[gpu] = GpuHealth(gpu, state, reason, None, self._wall_clock(), source, uuid)
        return gpu

    def set(
        self,
        gpu: GpuId,
        state: HealthState,
        reason: str,
        xid: int | None,
        source: EventSource,
    ) -> HealthEvent | None:
        """Record the state of ``gpu``; return (and deliver) the event when the state changed.
        The same state with another reason updates the snapshot only (no event). Raises
        ``KeyError`` for a GPU that was never added."""
        with self._lock:
            current = self._gpus[gpu]
            if current.state is state:
                if (current.reason, current.xid, current.source) != (reason, xid, source):
                    self._gpus[gpu] = GpuHealth(gpu, state, reason, xid, current.since_s,
                                                source, current.uuid)
                return None
            at_s = self._wall_clock()
            self._gpus[gpu] = GpuHealth(gpu, state, reason, xid, at_s, source, current.uuid)
            event = HealthEvent(gpu, state, reason, xid, at_s, source)
            if self._held:
                self._pending.append(event)
            else:
                self._deliver_locked(event)
            return event

    def set_uuid(self, gpu: GpuId, uuid: str) -> None:
        """Record the NVML UUID of ``gpu`` (learned at discovery)."""
        with self._lock:
            current = self._gpus[gpu]
            self._gpus[gpu] = GpuHealth(current.gpu, current.state, current.reason, current.xid,
                                        current.since_s, current.source, uuid)

    def get(self, gpu: GpuId) -> GpuHealth:
        """Current health of ``gpu``; ``KeyError`` when unknown."""
        with self._lock:
            return self._gpus[gpu]

    def snapshot(self) -> dict[GpuId, GpuHealth]:
        """Current health of every GPU, by GPU."""
        with self._lock:
            return dict(sorted(self._gpus.items()))

    def subscribe(self) -> HealthSubscription:
        """Events from now on. Call inside the running event loop."""
        loop = asyncio.get_running_loop()
        sub = HealthSubscription(self)
        with self._lock:
            self._loop = loop
            self._subscribers.add(sub)
        return sub

    @property
    def subscriber_count(self) -> int:
        """Live subscriptions."""
        with self._lock:
            return len(self._subscribers)

    def hold(self, held: bool) -> None:
        """Keep transitions back while ``held``; releasing delivers the kept ones in order."""
        with self._lock:
            self._held = held
            if not held:
                pending, self._pending = self._pending, []
                for event in pending:
                    self._deliver_locked(event)

    def _deliver_locked(self, event: HealthEvent) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        for sub in list(self._subscribers):
            loop.call_soon_threadsafe(sub._offer, event)

    def _unsubscribe(self, sub: HealthSubscription) -> None:
        with self._lock:
            self._subscribers.discard(sub)
