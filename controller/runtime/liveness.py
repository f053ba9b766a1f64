"""Which jobs still have a client, and the expiry of those that do not (issue 14, "Orphaned
jobs").

A job is *attached* while a PhaseStream that carried one of its requests is open, a unary
EnterPhase of it waits, or a WatchJob of it streams. A registered job that is attached to
nothing is *idle* from the moment the last attachment ended (or from registration, or from the
first sweep that saw it, e.g. after a controller restart recovered it from etcd). A job idle for
``controller.job_idle_expiry_s`` is expired: unregistered like an UnregisterJob, its holds
released and its circuits left as they are until another job needs the ports.

The tracker is cheap on the hot path: a stream attaches a job once (a set lookup per message),
and nothing is timed per message. Times come from the injected ``clock`` (seconds, monotonic).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import structlog

from lightrail.controller.domain.timing import Clock, Sleep

log = structlog.get_logger(__name__)


class JobLiveness:
    """Attachments per job and the idle clock of each unattached job."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._attached: dict[str, int] = {}
        self._idle_since: dict[str, float] = {}

    def attach(self, job_id: str) -> None:
        """A stream, call or watch of ``job_id`` began; pair with ``detach``."""
        self._attached[job_id] = self._attached.get(job_id, 0) + 1
        self._idle_since.pop(job_id, None)

    def detach(self, job_id: str) -> None:
        """One attachment of ``job_id`` ended; the last one starts its idle clock."""
        left = self._attached.get(job_id, 0) - 1
        if left > 0:
            self._attached[job_id] = left
        else:
            self._attached.pop(job_id, None)
            self._idle_since[job_id] = self._clock()

    def touch(self, job_id: str) -> None:
        """A call of ``job_id`` that needs no attachment (registration, a unary release):
        restarts its idle clock when it has no attachment."""
        if job_id not in self._attached:
            self._idle_since[job_id] = self._clock()

    def attached(self, job_id: str) -> bool:
        """True while something is attached to ``job_id``."""
        return job_id in self._attached

    def idle_s(self, job_id: str) -> float | None:
        """Seconds ``job_id`` has been idle; None while attached or never seen."""
        since = self._idle_since.get(job_id)
        return None if since is None else self._clock() - since

    def forget(self, job_id: str) -> None:
        """Drop the idle clock of an unregistered job (its attachments end on their own)."""
        self._idle_since.pop(job_id, None)

    def expired(self, registered: Iterable[str], expiry_s: float) -> list[tuple[str, float]]:
        """The registered jobs idle for at least ``expiry_s`` seconds, with their idle time,
        oldest first. A registered job seen for the first time starts idle now; the idle clocks
        of jobs no longer registered are dropped."""
        now = self._clock()
        jobs = set(registered)
        for job_id in list(self._idle_since):
            if job_id not in jobs:
                del self._idle_since[job_id]
        for job_id in jobs:
            if job_id not in self._attached and job_id not in self._idle_since:
                self._idle_since[job_id] = now
        out = [(j, now - t) for j, t in self._idle_since.items() if now - t >= expiry_s]
        out.sort(key=lambda item: -item[1])
        return out


Retire = Callable[[str, str], Awaitable[bool]]
"""Unregister a job with a reason (one line); False when it was already gone."""


async def expire_idle_jobs(
    liveness: JobLiveness,
    registered: Callable[[], Iterable[str]],
    retire: Retire,
    expiry_s: float,
    sleep: Sleep,
    *,
    interval_s: float | None = None,
) -> None:
    """Run until cancelled: every ``interval_s`` (default ``min(expiry_s / 4, 5)`` seconds)
    retire each job of ``registered()`` idle for ``expiry_s`` seconds or more. A failed retire
    is logged and tried again at the next sweep."""
    every = interval_s if interval_s is not None else min(expiry_s / 4, 5.0)
    while True:
        await sleep(every)
        for job_id, idle in liveness.expired(registered(), expiry_s):
            reason = (f"expired: no stream and no call for {idle:.0f} s "
                      f"(controller.job_idle_expiry_s = {expiry_s:g})")
            try:
                if await retire(job_id, reason):
                    log.warning("job_expired", job=job_id, idle_s=round(idle, 1))
                liveness.forget(job_id)
            except Exception as exc:  # the store may be down: keep the job, try again
                log.error("job_expiry_failed", job=job_id, error=str(exc))
