"""Events: what WatchJob streams to the job, and what operators and MQTT receive (every job
event and every fabric event: ``subscribe_all``; DESIGN.md "Observability").

``EventBus.publish`` and ``publish_fabric`` never block (they are called on the hot path): each
subscriber has a bounded queue; a subscriber that falls ``max_backlog`` events behind is closed
with an overflow marker rather than slowing the controller.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

from lightrail.controller.domain.events import FabricEvent, JobEvent


class SubscriberOverflow(RuntimeError):
    """A subscriber did not keep up and was dropped."""


_CLOSE = object()


class EventBus:
    """Fan-out of job events to any number of subscribers (per job or all jobs)."""

    def __init__(self, max_backlog: int = 1024) -> None:
        self._max = max_backlog
        self._subs: dict[str | None, set[asyncio.Queue[object]]] = {}
        self._all: set[asyncio.Queue[object]] = set()
        self._demand = 0
        """``subscribe_all`` subscribers, and holders of ``hold_demand``, that want the
        per-phase events (a journal that only keeps recent history does not)."""

    def wants(self, job_id: str) -> bool:
        """True when someone is waiting for the per-phase events of ``job_id`` (reconfigured,
        reconfigure decisions): a watch of the job or of every job, or a live consumer of every
        event (the MQTT bridge, a ``lightrail events --follow``). Callers on the hot path build
        those events only then: a phase costs no event while nobody is listening."""
        subs = self._subs
        return bool(self._demand or subs.get(job_id) or subs.get(None))

    def listens(self, job_id: str) -> bool:
        """True when any subscriber at all would receive an event of ``job_id``, a journal
        of recent events included: for events that are rare (phase errors), not per phase."""
        subs = self._subs
        return bool(self._all or subs.get(job_id) or subs.get(None))

    def hold_demand(self) -> None:
        """Someone wants the per-phase events from now on (``wants`` is True); pair with
        ``release_demand``."""
        self._demand += 1

    def release_demand(self) -> None:
        """One ``hold_demand`` ended."""
        self._demand -= 1

    def subscribed_all(self) -> int:
        """How many ``subscribe_all`` subscribers are subscribed now."""
        return len(self._all)

    def publish(self, event: JobEvent) -> None:
        """Deliver ``event`` to the job's subscribers, the all-jobs subscribers and the
        ``subscribe_all`` subscribers."""
        for key in (event.job_id, None):
            subs = self._subs.get(key)
            if subs:
                self._offer(subs, event)
        if self._all:
            self._offer(self._all, event)

    def publish_fabric(self, event: FabricEvent) -> None:
        """Deliver ``event`` to the ``subscribe_all`` subscribers."""
        if self._all:
            self._offer(self._all, event)

    def _offer(self, subs: set[asyncio.Queue[object]], event: object) -> None:
        for q in tuple(subs):
            if q.qsize() >= self._max:
                subs.discard(q)
                q.put_nowait(SubscriberOverflow(f"subscriber fell {self._max} events behind"))
            else:
                q.put_nowait(event)

    def close_job(self, job_id: str) -> None:
        """End every subscription to ``job_id`` (after its UNREGISTERED event)."""
        for q in self._subs.pop(job_id, set()):
            q.put_nowait(_CLOSE)

    async def subscribe(self, job_id: str | None) -> AsyncIterator[JobEvent]:
        """Events of ``job_id`` (None: every job) from now on, until the job is closed.
        Raises ``SubscriberOverflow`` when the consumer falls too far behind."""
        q: asyncio.Queue[object] = asyncio.Queue()
        self._subs.setdefault(job_id, set()).add(q)
        try:
            while True:
                item = await q.get()
                if item is _CLOSE:
                    return
                if isinstance(item, SubscriberOverflow):
                    raise item
                assert isinstance(item, JobEvent)
                yield item
        finally:
            subs = self._subs.get(job_id)
            if subs is not None:
                subs.discard(q)

    async def subscribe_all(
        self, *, demand: bool = True
    ) -> AsyncGenerator[JobEvent | FabricEvent, None]:
        """Every job event and fabric event from now on, until the consumer stops. Raises
        ``SubscriberOverflow`` when the consumer falls too far behind. ``demand`` False: a
        consumer that keeps history only; per-phase events reach it only while someone else
        wants them (``wants``)."""
        q: asyncio.Queue[object] = asyncio.Queue()
        self._all.add(q)
        if demand:
            self._demand += 1
        try:
            while True:
                item = await q.get()
                if isinstance(item, SubscriberOverflow):
                    raise item
                assert isinstance(item, JobEvent | FabricEvent)
                yield item
        finally:
            self._all.discard(q)
            if demand:
                self._demand -= 1
