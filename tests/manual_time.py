"""A manual clock for deterministic tests of code that takes injected ``clock``/``sleep``."""

from __future__ import annotations

import asyncio


class ManualTime:
    """A manual clock. With ``auto`` every sleep advances the clock at once; otherwise a sleep
    blocks until ``advance`` moves the clock past its deadline. ``backoff`` is a second sleep
    on the same clock for the reconciler, recorded apart."""

    def __init__(self, start_s: float = 100.0, *, auto: bool = True) -> None:
        self.now_s = start_s
        self.auto = auto
        self.sleeps: list[float] = []
        self.backoffs: list[float] = []
        self.waiting = 0
        self._cond = asyncio.Condition()

    def clock(self) -> float:
        return self.now_s

    async def sleep(self, delay_s: float) -> None:
        self.sleeps.append(delay_s)
        if self.auto:
            self.now_s += delay_s
            await asyncio.sleep(0)
            return
        deadline_s = self.now_s + delay_s
        async with self._cond:
            self.waiting += 1
            self._cond.notify_all()
            try:
                await self._cond.wait_for(lambda: self.now_s >= deadline_s)
            finally:
                self.waiting -= 1

    async def backoff(self, delay_s: float) -> None:
        self.backoffs.append(delay_s)
        self.now_s += delay_s
        await asyncio.sleep(0)

    async def advance(self, delta_s: float) -> None:
        async with self._cond:
            self.now_s += delta_s
            self._cond.notify_all()

    async def wait_sleepers(self, count: int, timeout_s: float = 2.0) -> None:
        async with asyncio.timeout(timeout_s), self._cond:
            await self._cond.wait_for(lambda: self.waiting >= count)
