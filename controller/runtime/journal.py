"""The event journal: every job and fabric event of the ``EventBus`` (``subscribe_all``) given
its one event id and record (``lightrail.controller.domain.events.record_of``), kept in a
bounded ring of recent events (``lightrail events`` without ``--follow``) and handed to the
journal's subscribers: the MQTT bridge and each operator ``StreamEvents`` call, so both see the
same ids.

The per-phase events (reconfigured, reconfigure decisions) are built on the hot path only
while someone wants them (``EventBus.wants``): a subscription of the journal holds that demand,
the ring alone does not, so with no MQTT bridge and no ``--follow`` stream a phase costs no
event and the ring keeps the rest (registrations, phase errors, failovers, alarms, ...).

Nothing here blocks the publisher: each subscription is a bounded buffer that drops its oldest
event when full and counts the drop (``Subscription.dropped``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import Callable, Iterable

import structlog

from lightrail.controller.domain.events import EventRecord, FabricEvent, JobEvent, record_of
from lightrail.controller.runtime.events import EventBus, SubscriberOverflow

log = structlog.get_logger(__name__)


class Subscription:
    """A bounded buffer of ``EventRecord``s, oldest first, filled by the journal. When full,
    a new event pushes out the oldest, ``dropped`` counts it and ``on_drop`` is called."""

    def __init__(self, maxlen: int, on_drop: Callable[[], object] | None = None) -> None:
        self._buf: deque[EventRecord] = deque(maxlen=maxlen)
        self._ready = asyncio.Event()
        self._on_drop = on_drop
        self.dropped = 0

    def offer(self, record: EventRecord) -> None:
        """Append ``record`` (never blocks)."""
        if len(self._buf) == self._buf.maxlen:
            self.dropped += 1
            if self._on_drop is not None:
                self._on_drop()
        self._buf.append(record)
        self._ready.set()

    def __len__(self) -> int:
        return len(self._buf)

    async def wait(self) -> None:
        """Return once the buffer holds an event."""
        while not self._buf:
            self._ready.clear()
            await self._ready.wait()

    def peek(self) -> EventRecord:
        """The oldest event (the buffer must not be empty)."""
        return self._buf[0]

    def pop(self, record: EventRecord) -> None:
        """Remove ``record`` when it is still the oldest event (it may have been pushed out
        meanwhile)."""
        if self._buf and self._buf[0] is record:
            self._buf.popleft()

    async def get(self) -> EventRecord:
        """Wait for, remove and return the oldest event."""
        await self.wait()
        return self._buf.popleft()


class EventJournal:
    """Numbers every event of ``bus`` (``<replica_id>-<boot>-<n>``: ``boot`` is random per
    journal, so ids stay unique across restarts and replicas), keeps the last ``capacity``
    records and fans them out to its subscriptions. ``start`` it inside the TaskGroup."""

    def __init__(self, bus: EventBus, replica_id: str, *, capacity: int = 1000) -> None:
        self._bus = bus
        self._prefix = f"{replica_id}-{uuid.uuid4().hex[:8]}-"
        self._seq = 0
        self._recent: deque[EventRecord] = deque(maxlen=capacity)
        self._subs: set[Subscription] = set()
        self.overflows = 0
        """Times the journal itself fell behind the bus (events lost before numbering)."""

    async def start(self, tg: asyncio.TaskGroup) -> asyncio.Task[None]:
        """Start consuming the bus in ``tg``; returns once the journal is subscribed, so no
        event published after this returns is missed. An event published reaches the
        journal's subscriptions after one turn of the loop (``await asyncio.sleep(0)``)."""
        before = self._bus.subscribed_all()
        task = tg.create_task(self._run(), name="event-journal")
        await asyncio.sleep(0)  # one turn: the task runs its first step, which subscribes
        assert self._bus.subscribed_all() > before or task.done(), "journal not subscribed"
        return task

    async def _run(self) -> None:
        while True:
            try:
                # history only: the per-phase events are built while a subscription of the
                # journal (MQTT, a follow stream) wants them, not for the ring alone
                async for event in self._bus.subscribe_all(demand=False):
                    self._add(event)
            except SubscriberOverflow as exc:  # a burst the loop could not keep up with
                self.overflows += 1
                log.error("event_journal_overflow", error=str(exc))

    def _add(self, event: JobEvent | FabricEvent) -> None:
        self._seq += 1
        record = record_of(event, f"{self._prefix}{self._seq}")
        self._recent.append(record)
        for sub in self._subs:
            sub.offer(record)

    def recent(self, job_id: str | None = None, kinds: Iterable[str] = ()) -> list[EventRecord]:
        """The recent events kept (oldest first), only ``job_id``'s when given and only of
        ``kinds`` when any are given."""
        wanted = frozenset(kinds)
        return [r for r in self._recent if (job_id is None or r.job_id == job_id)
                and (not wanted or r.kind in wanted)]

    def subscribe(self, maxlen: int, *, on_drop: Callable[[], object] | None = None
                  ) -> Subscription:
        """A new subscription to every event from now on, holding at most ``maxlen`` events
        (``on_drop`` called for each one pushed out; ``unsubscribe`` it when done)."""
        sub = Subscription(maxlen, on_drop)
        self._subs.add(sub)
        self._bus.hold_demand()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Stop filling ``sub``."""
        if sub in self._subs:
            self._subs.discard(sub)
            self._bus.release_demand()
