"""Time injected into the store (``Clock``, ``Sleep``) and the retry pacing it uses (``Backoff``).

Kept apart so the store, its watches and the coalescing writer share one definition; a shared
module of the whole controller may replace it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

Clock = Callable[[], float]
"""Returns the current time in seconds (monotonic)."""
Sleep = Callable[[float], Awaitable[None]]
"""Waits the given number of seconds."""


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
