"""A bounded, in-order stream of device alarms, shared by drivers and emulated devices."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from lightrail.drivers.base import DeviceAlarm


class AlarmStream(AsyncIterator[DeviceAlarm]):
    """Alarms from the moment of subscription, in order.

    Backed by a bounded ``asyncio.Queue`` of ``maxsize``; when a slow reader lets it fill up
    the oldest alarm is dropped and counted in ``dropped``. ``aclose`` ends the iteration and
    calls ``on_close(self)`` once (the publisher forgets the stream).
    """

    def __init__(self, on_close: Callable[[AlarmStream], None], maxsize: int) -> None:
        self._on_close = on_close
        self._queue: asyncio.Queue[DeviceAlarm | None] = asyncio.Queue(maxsize)
        self._closed = False
        self.dropped = 0

    def __aiter__(self) -> AlarmStream:
        return self

    async def __anext__(self) -> DeviceAlarm:
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        alarm = await self._queue.get()
        if alarm is None:
            raise StopAsyncIteration
        return alarm

    def offer(self, alarm: DeviceAlarm | None) -> None:
        """Queue ``alarm`` (None ends the stream), dropping the oldest when full."""
        if self._queue.full():
            self._queue.get_nowait()
            self.dropped += 1
        self._queue.put_nowait(alarm)

    async def aclose(self) -> None:
        """Stop this stream; a pending ``__anext__`` ends with ``StopAsyncIteration``."""
        if not self._closed:
            self._closed = True
            self._on_close(self)
            self.offer(None)
