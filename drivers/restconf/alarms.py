"""The RESTCONF driver's alarm stream: ``system-alarms`` polled into one bounded iterator per
``events()`` call (``lightrail.drivers.restconf.driver``, module docstring "Alarms")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import structlog

from lightrail.drivers.base import AlarmSeverity, DeviceAlarm, DriverError

_ALARM_QUEUE_SIZE = 1024
_log = structlog.get_logger("lightrail.drivers.restconf.driver")


class AlarmFeed(AsyncIterator[DeviceAlarm]):
    """One ``events()`` iterator of switch ``switch_id``: a task calls ``read`` (one read of the
    device's active alarms, raising ``DriverError`` when it fails) every ``interval_s`` seconds
    and queues what is new; an alarm that leaves the list is delivered again as CLEARED.

    Bounded queue: when a slow reader lets it fill up the oldest alarm is dropped (counted in
    ``dropped``). An unexpected exception in the poller is raised to the reader (fail loud).
    """

    def __init__(
        self,
        switch_id: str,
        read: Callable[[], Awaitable[list[DeviceAlarm]]],
        interval_s: float,
    ) -> None:
        self._read = read
        self._interval_s = interval_s
        self._queue: asyncio.Queue[DeviceAlarm | BaseException | None] = asyncio.Queue(
            _ALARM_QUEUE_SIZE
        )
        self._closed = False
        self.dropped = 0
        self._log = _log.bind(switch=switch_id)
        self._task = asyncio.get_running_loop().create_task(
            self._poll(), name=f"restconf-alarms-{switch_id}"
        )

    def __aiter__(self) -> AlarmFeed:
        return self

    async def __anext__(self) -> DeviceAlarm:
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def _offer(self, item: DeviceAlarm | BaseException | None) -> None:
        if self._queue.full():
            self._queue.get_nowait()
            self.dropped += 1
        self._queue.put_nowait(item)

    async def _poll(self) -> None:
        active: dict[tuple[float, str, int | None, str], DeviceAlarm] = {}
        failing = False
        try:
            while True:
                try:
                    alarms = await self._read()
                except DriverError as e:
                    if not failing:
                        self._log.warning("alarm poll failed; still polling", error=str(e))
                    failing = True
                else:
                    if failing:
                        self._log.info("alarm poll recovered")
                    failing = False
                    now = {(a.at_s, a.condition, a.port, a.description): a for a in alarms}
                    for key, alarm in now.items():
                        if key not in active:
                            self._offer(alarm)
                    for key, alarm in active.items():
                        if key not in now:
                            self._offer(DeviceAlarm(
                                alarm.switch_id, alarm.port, alarm.condition,
                                AlarmSeverity.CLEARED, time.time(), alarm.description,
                            ))
                    active = now
                await asyncio.sleep(self._interval_s)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug: hand it to the reader
            self._offer(e)

    async def aclose(self) -> None:
        """Stop polling; a pending ``__anext__`` ends with ``StopAsyncIteration``."""
        if self._closed:
            return
        self._closed = True
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._offer(None)
