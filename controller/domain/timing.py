"""Injected time and retry pacing, shared by the controller and the agents.

Code that waits or reads the time takes a ``Clock``/``WallClock`` and a ``Sleep`` (defaults
``time.monotonic``, ``time.time``, ``asyncio.sleep``), so tests drive it on a manual clock
(``tests/manual_time.py``). Retries after a failure wait by one rule, ``Backoff``: bounded
exponential backoff, optionally with jitter drawn from an injected ``Random``.

``Clock`` and ``Sleep`` are declared in ``lightrail.drivers.timing`` (the drivers import nothing
of the controller, and every layer may import the drivers' base) and re-exported here.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from lightrail.drivers.timing import Clock, Sleep

__all__ = ["Backoff", "BackoffState", "Clock", "Random", "Sleep", "WallClock"]

WallClock = Callable[[], float]
"""Returns wall-clock time in seconds since the epoch (``time.time``): stamps for people and
records."""
Random = Callable[[], float]
"""Returns a number uniformly drawn from [0, 1) (``random.random``)."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Bounded exponential backoff: retry number ``n`` (0-based: the wait after the first
    failure is ``n = 0``) waits ``min(max_s, initial_s * multiplier**n)`` seconds.

    ``jitter`` (in [0, 1]) spreads retries of many clients apart: the wait is scaled by
    ``1 - jitter * u`` with ``u`` drawn from the caller's ``Random`` ("equal jitter" for
    ``jitter`` 0.5, "full jitter" for 1; AWS Architecture Blog, "Exponential Backoff And
    Jitter", 2015). With ``jitter`` 0 (the default) the waits are exact and nothing is drawn.
    Raises ``ValueError`` for a negative time, a ``multiplier`` below 1 or a ``jitter``
    outside [0, 1].
    """

    initial_s: float = 0.05
    """The first wait, seconds (>= 0)."""
    max_s: float = 1.0
    """The longest wait, seconds (>= 0); every wait is capped here."""
    multiplier: float = 2.0
    """Growth of the wait per retry (>= 1)."""
    jitter: float = 0.0
    """Fraction of each wait that is random, in [0, 1]."""

    def __post_init__(self) -> None:
        if not (self.initial_s >= 0 and self.max_s >= 0):
            raise ValueError(f"Backoff times must be >= 0 seconds, got initial_s="
                             f"{self.initial_s!r}, max_s={self.max_s!r}")
        if not self.multiplier >= 1:
            raise ValueError(f"Backoff.multiplier must be >= 1, got {self.multiplier!r}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"Backoff.jitter must be in [0, 1], got {self.jitter!r}")

    def delay_s(self, attempt: int, draw: Random = random.random) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based). ``draw`` is called once
        when ``jitter`` > 0. Raises ``ValueError`` for a negative ``attempt``."""
        if attempt < 0:
            raise ValueError(f"Backoff attempt must be >= 0, got {attempt}")
        try:
            grown = self.initial_s * self.multiplier**attempt
        except OverflowError:  # far past the cap
            grown = math.inf if self.initial_s > 0 else 0.0
        delay = float(min(self.max_s, grown))
        if self.jitter > 0:
            delay *= 1.0 - self.jitter * draw()
        return delay


class BackoffState:
    """The retries of one loop under a ``Backoff``: ``next_s`` gives the wait before the next
    retry and counts it; ``reset`` after a success starts again from ``initial_s``.
    Not thread-safe (one loop owns it)."""

    __slots__ = ("_attempt", "_draw", "policy")

    def __init__(self, policy: Backoff, *, draw: Random = random.random) -> None:
        self.policy = policy
        self._draw = draw
        self._attempt = 0

    @property
    def attempt(self) -> int:
        """Retries counted since the start or the last ``reset``."""
        return self._attempt

    def next_s(self) -> float:
        """The wait before the next retry, seconds; counts the retry."""
        delay = self.policy.delay_s(self._attempt, self._draw)
        self._attempt += 1
        return delay

    def reset(self) -> None:
        """A success: the next wait is ``initial_s`` again."""
        self._attempt = 0
