"""Injected time of the drivers: ``Clock`` (monotonic seconds) and ``Sleep``. Drivers import
nothing of the controller, so these are declared here, at the bottom of the layers;
``lightrail.controller.domain.timing`` re-exports them, so one clock serves the controller, the
agents, the emulator and the drivers alike.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

Clock = Callable[[], float]
"""Returns monotonic time in seconds (``time.monotonic``): deadlines, durations, backoff."""
Sleep = Callable[[float], Awaitable[None]]
"""Waits the given number of seconds (``asyncio.sleep``)."""
