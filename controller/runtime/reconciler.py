"""Per-switch reconciliation of cross-connects (DESIGN.md, "Reconfiguration" and "State").

One ordered worker per switch (an asyncio task reading a queue; a request that finds it idle
may run in its caller's task, ``inline``), switches in parallel. A request says: on these
``ports`` of this switch, the cross-connects must be exactly ``target``. The worker hands the
driver its last confirmed view of those ports (one bulk ``Driver.apply(..., current=view)``):
the driver diffs once (``lightrail.drivers.base.minimal_diff``: break only what must change,
then make), applies and reads back the ports it changed, so one reconciliation costs the writes
plus one read. A verified
result updates the view; a driver that did not verify is followed by a read-back of the whole
switch where the device allows it. Retryable driver errors are retried with bounded
exponential backoff, and the reconfiguration is recorded in
``lightrail.controller.runtime.metrics`` and through ``on_reconfigured``. A request whose ports
already hold the target is answered at once, without a device command (no-op).

The view of a switch comes from the switch (the switches hold the truth): it is read back on the
first request or ``read_back``/``read_back_all`` (startup, takeover), after any driver error
(a conflict or invalid port met while trusting the view is tried once more after that
read-back), and after ``invalidate`` (e.g. when an alarm says the device rebooted).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import structlog

from lightrail.controller.domain.timing import Backoff, Clock, Sleep, WallClock
from lightrail.controller.runtime import metrics
from lightrail.drivers.base import (
    ApplyMode,
    ApplyResult,
    CrossConnect,
    CrossConnectConflict,
    DeviceTimeout,
    DeviceUnreachable,
    Driver,
    DriverError,
    InvalidPort,
    NotLeader,
    PartialApply,
    SwitchCapabilities,
    VerificationMismatch,
)

_log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ReconcileOutcome:
    """What one ``Reconciler.reconcile`` did: the cross-connects broken (``removed``) and made
    (``added``) on the requested ports, ``device_s`` seconds from issuing the first apply to the
    device's confirmation (retries included; 0.0 for a no-op), and ``noop`` when nothing had to
    change."""

    removed: frozenset[CrossConnect]
    added: frozenset[CrossConnect]
    device_s: float
    noop: bool


NOOP = ReconcileOutcome(frozenset(), frozenset(), 0.0, True)
"""The outcome of every request that found its target already in place."""


@dataclass(frozen=True, slots=True)
class ReconfigurationRecord:
    """One confirmed reconfiguration of ``switch`` (its id): what was broken and made, and the
    reconciler-clock times (seconds) the first apply was issued and the device confirmed."""

    switch: str
    removed: frozenset[CrossConnect]
    added: frozenset[CrossConnect]
    started_s: float
    confirmed_s: float


@dataclass(frozen=True, slots=True)
class DeviceContact:
    """How a switch's device last answered: ``reachable`` (None: not asked yet; False: its last
    command met ``DeviceUnreachable`` or ``DeviceTimeout``), its last error (one line) and when,
    and when it last answered a command, wall-clock seconds since the epoch."""

    reachable: bool | None
    last_error: str | None
    last_error_unix_s: float | None
    last_ok_unix_s: float | None


ReachabilityListener = Callable[[str, "DriverError | None"], None]
"""Told (switch id, the error) when a switch stops answering, (switch id, None) when it answers
again after that."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded retries of retryable ``DriverError``s: at most ``max_attempts`` attempts, waiting
    ``backoff_s * 2**(k-1)`` seconds (at most ``backoff_max_s``) after the k-th failure
    (``backoff``, the shared rule of ``lightrail.controller.domain.timing``)."""

    max_attempts: int = 3
    backoff_s: float = 0.05
    backoff_max_s: float = 1.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if self.backoff_s < 0 or self.backoff_max_s < 0:
            raise ValueError("RetryPolicy backoff must be >= 0")

    @property
    def backoff(self) -> Backoff:
        """The waits between attempts: ``backoff_s`` doubling up to ``backoff_max_s``."""
        return Backoff(initial_s=self.backoff_s, max_s=self.backoff_max_s)

    def delay_s(self, failures: int) -> float:
        """The wait after the ``failures``-th consecutive failure (1-based), in seconds."""
        return self.backoff.delay_s(failures - 1)


class UnknownSwitch(LookupError):
    """The reconciler has no driver for this switch id."""


class ReconcilerStopped(RuntimeError):
    """The reconciler is not running (not started, stopping or stopped), or stopped while the
    request was queued or in flight."""


class _Lifecycle(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


class _ReconcileRequest:
    __slots__ = ("future", "ports", "target")

    def __init__(
        self,
        ports: frozenset[int],
        target: frozenset[CrossConnect],
        future: asyncio.Future[ReconcileOutcome],
    ) -> None:
        self.ports = ports
        self.target = target
        self.future = future


class _ReadBackRequest:
    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[frozenset[CrossConnect]]) -> None:
        self.future = future


_Request = _ReconcileRequest | _ReadBackRequest


class _Worker:
    """Everything the reconciler keeps per switch."""

    __slots__ = (
        "apply_seconds",
        "breaks",
        "busy",
        "caps",
        "circuits",
        "driver",
        "idle",
        "index",
        "last_error",
        "last_error_unix_s",
        "last_ok_unix_s",
        "listeners",
        "log",
        "makes",
        "pending",
        "queue",
        "reachable",
        "reached",
        "reconfigurations",
        "stale",
        "switch_id",
        "task",
        "view",
        "wall_clock",
    )

    def __init__(self, switch_id: str, driver: Driver, wall_clock: WallClock,
                 listeners: list[ReachabilityListener]) -> None:
        self.switch_id = switch_id
        self.driver = driver
        self.wall_clock = wall_clock
        self.listeners = listeners
        self.last_error: str | None = None
        self.last_error_unix_s: float | None = None
        self.last_ok_unix_s: float | None = None
        self.log = _log.bind(switch=switch_id)
        self.queue: asyncio.Queue[_Request | None] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.busy = False
        self.pending = 0
        """Requests put on ``queue`` and not served yet: while there are any, nothing runs
        inline (it would overtake them)."""
        self.idle = asyncio.Event()
        """Set when a request served inline (``Reconciler.reconcile``) ends."""
        self.caps: SwitchCapabilities | None = None
        self.view: set[CrossConnect] = set()
        """The confirmed cross-connects (``Reconciler.confirmed`` hands out copies)."""
        self.index: dict[int, CrossConnect] = {}
        self.stale = True
        self.reconfigurations = metrics.RECONFIGURATIONS.labels(switch_id)
        self.makes = metrics.CROSS_CONNECT_CHANGES.labels(switch_id, "make")
        self.breaks = metrics.CROSS_CONNECT_CHANGES.labels(switch_id, "break")
        self.apply_seconds = metrics.DEVICE_APPLY_SECONDS.labels(switch_id)
        self.circuits = metrics.CIRCUITS.labels(switch_id)
        self.reachable = metrics.SWITCH_UP.labels(switch_id)
        self.reached: bool | None = None
        """Whether the device answered the last command (None: not asked yet): the gauge is
        set only when this changes, so a successful apply costs one comparison."""

    def contact(self, error: DriverError | None) -> None:
        """Record the outcome of a device command (``error`` None: it answered) in
        ``lightrail_switch_up``: only ``DeviceUnreachable`` and ``DeviceTimeout`` say
        the device was not reached; any other error is an answer, except ``NotLeader``
        (refused before anything was sent: no news of the device)."""
        if isinstance(error, NotLeader):
            return
        if error is None:
            self.last_ok_unix_s = self.wall_clock()
            reached = True
        else:
            self.last_error = " ".join(str(error).split())
            self.last_error_unix_s = self.wall_clock()
            reached = not isinstance(error, DeviceUnreachable | DeviceTimeout)
        if reached is not self.reached:
            before = self.reached
            self.reached = reached
            self.reachable.set(1 if reached else 0)
            if not reached or before is False:  # lost, or back after a loss
                for listener in self.listeners:
                    listener(self.switch_id, None if reached else error)

    def health(self) -> DeviceContact:
        return DeviceContact(self.reached, self.last_error, self.last_error_unix_s,
                             self.last_ok_unix_s)

    def set_view(self, xcs: frozenset[CrossConnect]) -> None:
        self.view = set(xcs)
        index: dict[int, CrossConnect] = {}
        for xc in xcs:
            index[xc.ingress] = xc
            index[xc.egress] = xc
        self.index = index
        self.stale = False
        self.circuits.set(len(xcs))

    def update_view(self, removed: Iterable[CrossConnect], added: Iterable[CrossConnect]) -> None:
        """The device confirmed ``removed`` broken and ``added`` made: O(changes), not a
        rebuild of the whole view."""
        view = self.view
        index = self.index
        for xc in removed:
            view.discard(xc)
            if index.get(xc.ingress) == xc:
                del index[xc.ingress]
            if index.get(xc.egress) == xc:
                del index[xc.egress]
        for xc in added:
            view.add(xc)
            index[xc.ingress] = xc
            index[xc.egress] = xc
        self.circuits.set(len(view))

    def satisfied(self, ports: frozenset[int], target: frozenset[CrossConnect]) -> bool:
        """True when the view holds exactly ``target`` on ``ports``, for a ``target`` that lies
        within ``ports``. Every target cross-connect must be in the view; then nothing else is
        on ``ports`` exactly when the target's ``2 * len(target)`` ports are all the occupied
        ones. Integer lookups only: no hashing of cross-connects, no allocation."""
        index = self.index
        for xc in target:
            held = index.get(xc.ingress)
            if held is None or held.ingress != xc.ingress or held.egress != xc.egress:
                return False
        occupied = 0
        for port in ports:
            if port in index:
                occupied += 1
        return occupied == 2 * len(target)

    def on_ports(self, ports: frozenset[int]) -> frozenset[CrossConnect]:
        index = self.index
        return frozenset([index[p] for p in ports if p in index])


def _check_request(
    switch_id: str,
    caps: SwitchCapabilities | None,
    ports: frozenset[int],
    target: frozenset[CrossConnect],
) -> None:
    for xc in target:
        if xc.ingress not in ports:
            raise InvalidPort(switch_id, xc.ingress, f"target {xc} is outside the ports given")
        if xc.egress not in ports:
            raise InvalidPort(switch_id, xc.egress, f"target {xc} is outside the ports given")
    if caps is not None and ports:
        valid = caps.port_ids()
        low, high = min(ports), max(ports)
        if low < valid.start:
            raise InvalidPort(switch_id, low, "no such port")
        if high >= valid.stop:
            raise InvalidPort(switch_id, high, "no such port")


def _worth_retrying(error: DriverError, held: bool) -> bool:
    """Whether a failed attempt is tried again (within ``RetryPolicy.max_attempts``): a
    retryable error, or a conflict or invalid port met while diffing against the view held
    rather than a fresh read (the view may be wrong, e.g. a cross-connect made behind the
    controller's back; the next attempt reads the switch back first, so this happens once)."""
    if error.retryable:
        return True
    return held and isinstance(error, CrossConnectConflict | InvalidPort)


class Reconciler:
    """Keeps each switch's cross-connects on requested ports equal to their targets.

    ``drivers``: one open driver per switch id (the caller opens and closes them).
    ``retry``: bounds on retrying retryable driver errors. ``clock``/``sleep``: time source and
    wait used for records, ``device_s`` and backoff. ``on_reconfigured``: called in the
    switch's worker after each confirmed reconfiguration; it must not block and must not raise
    (an exception there stops the worker and so the caller's task group: fail loud).

    Lifecycle: ``start(tg)`` creates one task per switch in the caller's ``asyncio.TaskGroup``;
    ``stop(timeout_s)`` lets queued requests finish, then cancels.
    """

    def __init__(
        self,
        drivers: Mapping[str, Driver],
        *,
        retry: RetryPolicy | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        on_reconfigured: Callable[[ReconfigurationRecord], None] | None = None,
        may_command: Callable[[], bool] = lambda: True,
        wall_clock: WallClock = time.time,
    ) -> None:
        self._may_command = may_command
        self.reachability_listeners: list[ReachabilityListener] = []
        """Called with (switch id, the error) when a switch stops answering (DeviceUnreachable,
        DeviceTimeout) and with (switch id, None) when it answers again; they must not block
        or raise."""
        self._workers = {sid: _Worker(sid, driver, wall_clock, self.reachability_listeners)
                         for sid, driver in drivers.items()}
        self._retry = retry or RetryPolicy()
        self._clock = clock
        self._sleep = sleep
        self._on_reconfigured = on_reconfigured
        self._lifecycle = _Lifecycle.NEW

    @property
    def switch_ids(self) -> tuple[str, ...]:
        """The switches this reconciler drives."""
        return tuple(self._workers)

    def _worker(self, switch_id: str) -> _Worker:
        worker = self._workers.get(switch_id)
        if worker is None:
            raise UnknownSwitch(f"reconciler: no driver for switch {switch_id!r}")
        return worker

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self, tg: asyncio.TaskGroup) -> None:
        """Start one worker task per switch in ``tg`` (named ``reconciler/<switch id>``).
        Raises ``RuntimeError`` when already started."""
        if self._lifecycle is not _Lifecycle.NEW:
            raise RuntimeError(f"reconciler: start() while {self._lifecycle.value}")
        self._lifecycle = _Lifecycle.RUNNING
        for worker in self._workers.values():
            worker.task = tg.create_task(
                self._run_worker(worker), name=f"reconciler/{worker.switch_id}"
            )

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Refuse new requests, let every worker finish its queue for up to ``timeout_s``
        seconds, then cancel what is left and wait up to ``timeout_s`` more. Requests that never
        ran fail with ``ReconcilerStopped``. Raises ``TimeoutError`` naming the workers that
        did not end. Idempotent."""
        if self._lifecycle is not _Lifecycle.RUNNING:
            self._lifecycle = _Lifecycle.STOPPED
            return
        self._lifecycle = _Lifecycle.STOPPED
        tasks: list[asyncio.Task[None]] = []
        for worker in self._workers.values():
            worker.queue.put_nowait(None)
            if worker.task is not None:
                tasks.append(worker.task)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        if not pending:
            return
        _log.warning("reconciler workers still busy at stop; cancelling", count=len(pending))
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=timeout_s)
        if pending:
            names = ", ".join(sorted(t.get_name() for t in pending))
            raise TimeoutError(f"reconciler: workers did not stop within {timeout_s}s: {names}")

    # --- requests ------------------------------------------------------------------------------

    async def reconcile(
        self, switch_id: str, ports: frozenset[int], target: frozenset[CrossConnect],
        *, inline: bool = False,
    ) -> ReconcileOutcome:
        """Make the cross-connects of ``switch_id`` on ``ports`` exactly ``target``; cross-
        connects on other ports are never touched.

        Runs on the switch's worker after every earlier request for that switch (submission
        order) and returns once the device confirmed: applied and, where the device reads back,
        read back equal to ``target`` on ``ports``. Returns ``NOOP`` at once, without a device
        command, when the worker is idle and its confirmed view already holds ``target``.
        Cancelling the caller does not cancel a device command already issued. With
        ``inline``, a request that finds the worker idle runs in the caller's task instead
        (no queue, future or task switch: the hot path); cancelling the caller then interrupts
        the device command, and the switch is read back before its next request.

        Raises ``UnknownSwitch``; ``InvalidPort`` when a target cross-connect uses a port
        outside ``ports`` or a port does not exist; ``ReconcilerStopped`` when not running;
        the last ``DriverError`` when retries are exhausted (``VerificationMismatch``,
        ``PartialApply``, ``DeviceUnreachable``, ...) or at once when it is not retryable.
        """
        worker = self._worker(switch_id)
        if self._lifecycle is not _Lifecycle.RUNNING:
            raise ReconcilerStopped(f"reconciler is {self._lifecycle.value}")
        _check_request(switch_id, worker.caps, ports, target)
        if not worker.busy and not worker.pending:
            if not worker.stale and worker.satisfied(ports, target):
                return NOOP
            if inline:
                return await self._reconcile_inline(worker, ports, target)
        future: asyncio.Future[ReconcileOutcome] = asyncio.get_running_loop().create_future()
        worker.pending += 1
        worker.queue.put_nowait(_ReconcileRequest(ports, target, future))
        return await future

    async def _reconcile_inline(
        self, worker: _Worker, ports: frozenset[int], target: frozenset[CrossConnect]
    ) -> ReconcileOutcome:
        """Serve a request in the caller's task while the worker is idle (``reconcile``
        with ``inline``); the worker waits for it before its next request."""
        worker.busy = True
        try:  # ``reconcile`` just found the view not satisfied, in this same step
            return await self._reconcile_now(worker, ports, target, unsatisfied=True)
        except asyncio.CancelledError:
            worker.stale = True  # interrupted mid-command: read the device back first
            raise
        finally:
            worker.busy = False
            worker.idle.set()

    async def read_back(self, switch_id: str) -> frozenset[CrossConnect]:
        """Read every cross-connect of ``switch_id`` from the device and make it the confirmed
        view. While running it is queued behind earlier requests; before ``start`` it reads at
        once. Raises ``UnknownSwitch``, ``ReconcilerStopped`` after stop, or the
        ``DriverError`` (no retries)."""
        worker = self._worker(switch_id)
        if self._lifecycle is _Lifecycle.NEW:
            return await self._read_back_counted(worker)
        if self._lifecycle is not _Lifecycle.RUNNING:
            raise ReconcilerStopped(f"reconciler is {self._lifecycle.value}")
        future: asyncio.Future[frozenset[CrossConnect]] = (
            asyncio.get_running_loop().create_future()
        )
        worker.pending += 1
        worker.queue.put_nowait(_ReadBackRequest(future))
        return await future

    async def read_back_all(self) -> dict[str, frozenset[CrossConnect]]:
        """``read_back`` every switch in parallel (startup, takeover); returns the cross-
        connects by switch id. Raises an ``ExceptionGroup`` of the ``DriverError``s when any
        switch fails (the others are still read)."""
        ids = list(self._workers)
        results = await asyncio.gather(
            *(self.read_back(sid) for sid in ids), return_exceptions=True
        )
        state: dict[str, frozenset[CrossConnect]] = {}
        errors: list[Exception] = []
        for sid, result in zip(ids, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                errors.append(result)
            else:
                state[sid] = result
        if errors:
            raise ExceptionGroup(f"read-back failed on {len(errors)} switch(es)", errors)
        return state

    def confirmed(self, switch_id: str) -> frozenset[CrossConnect]:
        """The last confirmed cross-connects of ``switch_id`` (empty before the first read-back;
        possibly stale after an error until the next read-back). Raises ``UnknownSwitch``."""
        return frozenset(self._worker(switch_id).view)

    def needs_read_back(self, switch_id: str) -> bool:
        """True until the view of ``switch_id`` is confirmed, and again after an error or
        ``invalidate``. Raises ``UnknownSwitch``."""
        return self._worker(switch_id).stale

    def contact(self, switch_id: str, error: DriverError | None) -> None:
        """Record a device command made beside the reconciler (the power poll): ``error`` None
        when the device answered. Only ``lightrail_switch_up`` changes; the view is
        still trusted. Raises ``UnknownSwitch``."""
        self._worker(switch_id).contact(error)

    def contact_of(self, switch_id: str) -> DeviceContact:
        """Whether ``switch_id`` answered its last command, its last error and when it last
        answered. Raises ``UnknownSwitch``."""
        return self._worker(switch_id).health()

    def invalidate(self, switch_id: str) -> None:
        """Distrust the view of ``switch_id`` (e.g. on a reboot alarm): the next request reads
        the device back first. Raises ``UnknownSwitch``."""
        self._worker(switch_id).stale = True

    # --- worker --------------------------------------------------------------------------------

    async def _run_worker(self, worker: _Worker) -> None:
        queue = worker.queue
        try:
            while True:
                request = await queue.get()
                if request is None:
                    return
                try:
                    while worker.busy:  # a request served inline in its caller's task
                        worker.idle.clear()
                        await worker.idle.wait()
                    if request.future.done():  # the caller gave up while queued
                        continue
                    worker.busy = True
                    try:
                        await self._serve(worker, request)
                    finally:
                        worker.busy = False
                finally:
                    worker.pending -= 1
        finally:
            self._fail_pending(worker)

    async def _serve(self, worker: _Worker, request: _Request) -> None:
        try:
            if isinstance(request, _ReadBackRequest):
                view = await self._read_back_counted(worker)
                if not request.future.done():
                    request.future.set_result(view)
            else:
                outcome = await self._reconcile_now(worker, request.ports, request.target)
                if not request.future.done():
                    request.future.set_result(outcome)
        except DriverError as e:
            if not request.future.done():
                request.future.set_exception(e)
        except asyncio.CancelledError:
            if not request.future.done():
                request.future.set_exception(
                    ReconcilerStopped(f"switch {worker.switch_id!r}: stopped in flight")
                )
            raise
        except Exception as e:  # a bug: answer the caller, then fail loud
            if not request.future.done():
                request.future.set_exception(e)
            raise

    def _fail_pending(self, worker: _Worker) -> None:
        while not worker.queue.empty():
            request = worker.queue.get_nowait()
            if request is not None and not request.future.done():
                request.future.set_exception(
                    ReconcilerStopped(f"switch {worker.switch_id!r}: stopped before running")
                )

    async def _read_back(self, worker: _Worker) -> frozenset[CrossConnect]:
        if worker.caps is None:
            worker.caps = (await worker.driver.info()).capabilities
        xcs = await worker.driver.get_cross_connects()
        worker.set_view(xcs)
        worker.contact(None)  # every answer: the last contact time and state stay true
        return xcs

    async def _read_back_counted(self, worker: _Worker) -> frozenset[CrossConnect]:
        try:
            return await self._read_back(worker)
        except DriverError as e:
            worker.stale = True
            metrics.DEVICE_ERRORS.labels(worker.switch_id, type(e).__name__).inc()
            worker.contact(e)
            # the caller says what failed (the phase service once per outage, start-up in its
            # one-line exit): one line per failed read-back, not two
            worker.log.debug("read-back failed", error=str(e))
            raise

    async def _reconcile_now(
        self, worker: _Worker, ports: frozenset[int], target: frozenset[CrossConnect],
        *, unsatisfied: bool = False,
    ) -> ReconcileOutcome:
        """Apply until the view holds ``target`` on ``ports`` (retrying as ``RetryPolicy``
        allows). ``unsatisfied``: the caller checked the view against the target in the
        same step (nothing ran since): the first attempt does not check it again."""
        changed: list[ApplyResult] = []  # what each attempt did on the device
        started_s: float | None = None
        failures = 0
        while True:
            held = not worker.stale  # diffing against the view held, not a fresh read
            try:
                if worker.stale:
                    await self._read_back(worker)
                    _check_request(worker.switch_id, worker.caps, ports, target)
                    unsatisfied = False  # the view was read again
                if unsatisfied or not worker.satisfied(ports, target):
                    unsatisfied = False
                    current = worker.on_ports(ports)
                    if started_s is None:
                        started_s = self._clock()
                    # the driver diffs ``current`` against ``target`` (drivers.base.minimal_diff)
                    await self._apply(worker, ports, target, current, changed)
                break
            except DriverError as e:
                worker.stale = True
                failures += 1
                metrics.DEVICE_ERRORS.labels(worker.switch_id, type(e).__name__).inc()
                worker.contact(e)
                if not _worth_retrying(e, held) or failures >= self._retry.max_attempts:
                    worker.log.error(
                        "reconfiguration failed", error=str(e), attempts=failures
                    )
                    raise
                delay_s = self._retry.delay_s(failures)
                worker.log.warning(
                    "reconfiguration attempt failed; retrying",
                    error=str(e), attempt=failures, backoff_s=delay_s,
                )
                await self._sleep(delay_s)
        if started_s is None:
            return NOOP
        if len(changed) == 1:  # one attempt: the usual case
            removed, added = frozenset(changed[0].removed), frozenset(changed[0].added)
        else:
            removed = frozenset(xc for r in changed for xc in r.removed)
            added = frozenset(xc for r in changed for xc in r.added)
        confirmed_s = self._clock()
        device_s = confirmed_s - started_s
        worker.apply_seconds.observe(device_s)
        worker.log.debug(
            "reconfigured",
            removed=len(removed), added=len(added), device_s=device_s, attempts=failures + 1,
        )
        if self._on_reconfigured is not None:
            self._on_reconfigured(
                ReconfigurationRecord(worker.switch_id, removed, added, started_s, confirmed_s)
            )
        return ReconcileOutcome(removed, added, device_s, False)

    async def _apply(
        self,
        worker: _Worker,
        ports: frozenset[int],
        target: frozenset[CrossConnect],
        current: frozenset[CrossConnect],
        changed: list[ApplyResult],
    ) -> None:
        """One attempt: apply against ``current`` (the view on ``ports``), count what changed
        on the device (and append it to ``changed``), then confirm. A ``verified`` result is
        the device's confirmation of the ports changed and updates the view without another
        read; else the whole switch is
        read back where the device allows it, or the result is trusted where it does not.
        Raises ``VerificationMismatch``, and ``NotLeader`` without touching the device once
        ``may_command`` says no (fenced)."""
        if not self._may_command():
            raise NotLeader(worker.switch_id, "this controller lost its leader lease: no device "
                                              "commands")
        try:
            result = await worker.driver.apply(target, ports, ApplyMode.MINIMAL, current=current)
        except PartialApply as e:
            self._count(worker, e.result)
            changed.append(e.result)
            raise
        worker.contact(None)  # every answer: the last contact time and state stay true
        self._count(worker, result)
        changed.append(result)
        caps = worker.caps
        if result.verified or caps is None or not caps.readback:
            worker.update_view(result.removed, result.added)
            if worker.satisfied(ports, target) or not result.verified:
                return
            worker.log.warning("verified apply does not add up to the target; reading back")
        await self._read_back(worker)
        if not worker.satisfied(ports, target):
            actual = worker.on_ports(ports)
            raise VerificationMismatch(worker.switch_id, target - actual, actual - target)

    @staticmethod
    def _count(worker: _Worker, result: ApplyResult) -> None:
        if result.removed or result.added:
            worker.reconfigurations.inc()
            if result.removed:
                worker.breaks.inc(len(result.removed))
            if result.added:
                worker.makes.inc(len(result.added))

