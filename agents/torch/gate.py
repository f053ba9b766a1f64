"""One rank's gate: turns a training process's collective calls into phases of the phase
protocol (DESIGN.md "Phase protocol"), without torch (``lightrail.agents.torch.backend`` adapts
torch's process groups to it).

A phase is a *run*: consecutive calls of one kind (``Collective``) on one process group, keyed
by the group's global ranks (Opus's definition: its shim merged consecutive calls of one
backend). Before the first call of a run the calling thread blocks in EnterPhase until the
controller admits the rank onto confirmed circuits; calls inside the run cost a lock and a
dictionary lookup. The run is released (ReleasePhase) once its works have completed and either
a call on another group or kind comes (which first waits for them) or the rank stays idle on it
for ``linger_s`` — the release is what lets the controller's provisioning switch the next
phase's circuits during the compute that follows.

The phase key is (group, collective, seq 0, step 0) and the iteration 0: every run of one
(group, kind) is an instance of one phase, and the controller learns the order of phases from
it. Run boundaries must agree among a group's members (true of SPMD schedules: every member
issues the group's calls in the same order and switches groups at the same points); a member
that switches elsewhere while its peers still need it for the group's next call can deadlock
with them exactly as it would on a real switched fabric, and the admission timeout then fails
the call with ``PhaseTimeout``.

Groups whose ranks all run on one host are never gated (scale-up: NVLink, no circuit).
Threads: every method may be called from any thread; transitions are serialized by one lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from lightrail.agents.errors import Admission, PhaseError, PlacementChanged
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement

log = logging.getLogger(__name__)
T = TypeVar("T")
W = TypeVar("W")


class GateTransport(Protocol):
    """What the gate calls, blocking the calling thread:
    ``lightrail.agents.client.BlockingPhaseClient`` (a host agent's local socket) or
    ``LoopTransport`` (an async client such as ``ControllerClient``, run in the gate's loop)."""

    def enter(self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0,
              timeout_s: float | None = 30.0, nbytes: int = 0,
              compute_gap_s: float = 0.0) -> Admission: ...

    def release_phase(self, job_id: str, rank: int, phase: PhaseKey,
                      iteration: int = 0) -> None: ...


class AsyncPhaseClient(Protocol):
    """An async EnterPhase/ReleasePhase client (``lightrail.agents.client.ControllerClient``)."""

    async def enter(self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0,
                    timeout_s: float | None = 30.0, nbytes: int = 0,
                    compute_gap_s: float = 0.0) -> Admission: ...

    async def release_phase(self, job_id: str, rank: int, phase: PhaseKey,
                            iteration: int = 0) -> None: ...


class GateLoop:
    """An asyncio loop in a daemon thread, for what the gate does in the background (linger
    timers, the job's event watch, registration). ``name``: the thread's name."""

    def __init__(self, name: str = "lightrail-gate") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` in the loop and return its result, blocking the calling thread (at most
        ``timeout_s`` s; None: no bound). Never call it from the loop's own thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def spawn(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start ``coro`` in the loop without waiting for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def later(self, delay_s: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` in a worker thread (it may block) after ``delay_s`` seconds."""
        def fire() -> None:
            # RuntimeError: the interpreter is exiting; the gate's drain releases
            with contextlib.suppress(RuntimeError):
                self.loop.run_in_executor(None, fn)

        self.loop.call_soon_threadsafe(self.loop.call_later, delay_s, fire)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the loop and join its thread. Idempotent."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=timeout_s)


class LoopTransport:
    """``GateTransport`` over ``client`` (async), run in ``loop``."""

    def __init__(self, loop: GateLoop, client: AsyncPhaseClient) -> None:
        self._loop = loop
        self.client = client

    def enter(self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0,
              timeout_s: float | None = 30.0, nbytes: int = 0,
              compute_gap_s: float = 0.0) -> Admission:
        """``client.enter`` in the loop; blocks."""
        return self._loop.run(self.client.enter(job_id, rank, phase, iteration, timeout_s,
                                                nbytes, compute_gap_s))

    def release_phase(self, job_id: str, rank: int, phase: PhaseKey,
                      iteration: int = 0) -> None:
        """``client.release_phase`` in the loop; blocks."""
        self._loop.run(self.client.release_phase(job_id, rank, phase, iteration))


@dataclass(slots=True)
class PhaseStats:
    """What one rank saw of one phase: runs ``entered`` (``noop``: onto circuits already there;
    ``reconfigured``: after the switches changed), ``calls`` gated inside them, ``wait_s``
    seconds blocked in admission, ``device_s`` seconds the switches took for this rank's
    reconfigurations."""

    group: tuple[int, ...]
    collective: str
    entered: int = 0
    noop: int = 0
    reconfigured: int = 0
    calls: int = 0
    wait_s: float = 0.0
    device_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Hold:
    """One run as this rank saw it: admitted into ``phase`` at ``admitted_s`` (when EnterPhase
    returned), released at ``released_s`` (when ReleasePhase was sent), on the gate's clock
    (``time.monotonic`` by default: the emulator's clock, for the safety invariant's check)."""

    phase: PhaseKey
    admitted_s: float
    released_s: float


_MAX_UNTRACKED = 1024
"""Works without a completion future kept per run (a wait on the oldest drops it)."""

MAX_HOLDS = 100_000
"""Holds kept for the summary (the first ones; a long job does not grow without bound)."""


@dataclass(slots=True)
class _Run:
    phase: PhaseKey
    admitted_s: float = 0.0
    """When EnterPhase returned (the gate's clock)."""
    pending: dict[int, Callable[[], None]] = field(default_factory=dict)
    """Works issued in the run and not known complete, by call number: each entry blocks
    until its work completed."""
    calls: int = 0
    last_call_s: float = 0.0
    linger_armed: bool = False
    """A linger check is scheduled (at most one per run at a time: nothing per call)."""


class RankGate:
    """The gate of global rank ``rank`` of job ``job_id``: ``call`` wraps every collective.

    ``transport`` carries EnterPhase/ReleasePhase on the calling thread (the training thread
    waits for its admission anyway: no thread hop); ``loop`` runs the linger timers (a release
    after the linger runs in a worker thread). ``hosts``: rank -> host of the whole job
    (for the scale-up test; None: gate every group). ``timeout_s``: admission timeout, s;
    ``linger_s``: idle time after a run's works completed before it is released, s.
    ``clock``: monotonic seconds (injected by tests).
    """

    def __init__(
        self,
        job_id: str,
        rank: int,
        transport: GateTransport,
        loop: GateLoop,
        *,
        hosts: Sequence[str] | None = None,
        timeout_s: float = 60.0,
        linger_s: float = 0.002,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_id = job_id
        self.rank = rank
        self.transport = transport
        self.loop = loop
        self.timeout_s = timeout_s
        self.linger_s = linger_s
        self._clock = clock
        self._hosts = None if hosts is None else tuple(hosts)
        self._lock = threading.RLock()
        self._run: _Run | None = None
        self._done_lock = threading.Lock()
        """Guards ``_Run.pending``: completion callbacks never wait for ``_lock``."""
        self._last_done_at: float | None = None
        self._stats: dict[PhaseKey, PhaseStats] = {}
        self._holds: list[Hold] = []
        self._local: dict[ProcessGroup, bool] = {}
        self._placement_changed: str | None = None
        self._closed = False

    # --- phases -----------------------------------------------------------------------------

    def is_scale_up(self, group: ProcessGroup) -> bool:
        """True when every rank of ``group`` runs on one host (needs no circuit)."""
        local = self._local.get(group)
        if local is None:
            hosts = self._hosts
            local = hosts is not None and all(r < len(hosts) for r in group.ranks) and len(
                {hosts[r] for r in group.ranks}) == 1
            self._local[group] = local
        return local

    def placement_changed(self, message: str) -> None:
        """The controller moved a rank of the job (WatchJob ``PLACEMENT_CHANGED``): the next
        gated call raises ``PlacementChanged``."""
        self._placement_changed = message

    def call(self, phase: PhaseKey, nbytes: int, issue: Callable[[], W],
             on_done: Callable[[W, Callable[[], None]], None],
             wait: Callable[[W], None]) -> W:
        """Issue one collective of ``phase`` (its group's global ranks and kind): enter the
        phase first unless this rank's current run is the same phase, then ``issue()`` (which
        returns the backend's work) and register ``on_done(work, callback)`` so the run knows
        when its works completed (``on_done`` raises when the backend has no usable completion
        signal: the run is then released only at the next call elsewhere or at the end);
        ``wait(work)`` blocks until a work completed (used before a run is released for
        another). ``nbytes``: bytes of the call (the run's hint). Raises
        ``PhaseError`` subclasses (``PlacementChanged``, ``PhaseTimeout``, ...) before issuing
        anything."""
        if self._placement_changed is not None:
            raise PlacementChanged(ErrorCode.PLACEMENT_CHANGED, self._placement_changed)
        if self.is_scale_up(phase.group):
            return issue()
        with self._lock:
            if self._closed:
                raise PhaseError(ErrorCode.CANCELLED, "the gate is closed")
            run = self._run
            if run is None or run.phase != phase:
                if run is not None:
                    self._finish(run)
                run = self._enter(phase, nbytes)
            self._stats[phase].calls += 1
            work = issue()
            run.calls += 1
            token = run.calls
            run.last_call_s = self._clock()
            with self._done_lock:
                run.pending[token] = lambda: wait(work)
        try:
            on_done(work, lambda: self._work_done(run, token))
        except Exception:  # no usable completion future (gloo send/recv, NCCL):
            # the run is released at the next call elsewhere, after waiting for its works;
            # a long run of them keeps only the newest (the oldest completed long ago)
            if len(run.pending) > _MAX_UNTRACKED:
                with self._done_lock:
                    oldest = next(iter(run.pending))
                    wait_oldest = run.pending.pop(oldest)
                wait_oldest()
        return work

    def _enter(self, phase: PhaseKey, nbytes: int) -> _Run:
        """Block until admitted into ``phase``; the caller holds the lock."""
        now = self._clock()
        gap = 0.0 if self._last_done_at is None else max(0.0, now - self._last_done_at)
        adm = self.transport.enter(self.job_id, self.rank, phase, 0, self.timeout_s, nbytes, gap)
        waited = self._clock() - now
        stats = self._stats.get(phase)
        if stats is None:
            stats = self._stats[phase] = PhaseStats(phase.group.ranks, phase.collective.value)
        stats.entered += 1
        stats.wait_s += waited
        if adm.noop:
            stats.noop += 1
        else:
            stats.reconfigured += 1
            stats.device_s += adm.device_s
        run = _Run(phase, admitted_s=now + waited)
        self._run = run
        return run

    def _finish(self, run: _Run) -> None:
        """Release ``run`` once its works completed (waiting for them); the caller holds the
        lock."""
        with self._done_lock:
            waits, run.pending = list(run.pending.values()), {}
        for wait in waits:
            wait()
        self._release(run)

    def _release(self, run: _Run) -> None:
        if self._run is run:
            self._run = None
        self._last_done_at = self._clock()
        if len(self._holds) < MAX_HOLDS:
            self._holds.append(Hold(run.phase, run.admitted_s, self._last_done_at))
        try:
            self.transport.release_phase(self.job_id, self.rank, run.phase, 0)
        except PhaseError as exc:
            log.warning("lightrail gate: release of %s by rank %d failed: %s", run.phase,
                        self.rank, exc)

    def _work_done(self, run: _Run, token: int) -> None:
        """Work ``token`` of ``run`` completed (any thread): when none is left, arm the linger
        check unless it is armed already."""
        with self._done_lock:
            run.pending.pop(token, None)
            if run.pending or run.linger_armed or self._run is not run or self._closed:
                return
            run.linger_armed = True
        self.loop.later(self.linger_s, lambda: self._linger_over(run))

    def _linger_over(self, run: _Run) -> None:
        """In a worker thread: release ``run`` if its works completed and nothing was called
        on it for ``linger_s``; re-arm for the rest of the linger after a later call."""
        with self._lock:
            with self._done_lock:
                run.linger_armed = False
                if self._run is not run or run.pending:
                    return  # gone, or a new work: its completion arms the check again
                remaining = run.last_call_s + self.linger_s - self._clock()
                if remaining > 0:
                    run.linger_armed = True
                    self.loop.later(remaining, lambda: self._linger_over(run))
                    return
            self._release(run)

    # --- the end ----------------------------------------------------------------------------

    def stats(self) -> list[PhaseStats]:
        """The per-phase summary so far, in the order phases were first entered."""
        with self._lock:
            return [PhaseStats(s.group, s.collective, s.entered, s.noop, s.reconfigured,
                               s.calls, s.wait_s, s.device_s) for s in self._stats.values()]

    def holds(self) -> list[Hold]:
        """Every run released so far (at most ``MAX_HOLDS``), in order."""
        with self._lock:
            return list(self._holds)

    def write_summary(self, path: str | Path) -> None:
        """Write ``stats()`` and ``holds()`` as JSON to ``path`` (``{"rank", "job_id",
        "phases": [{"group", "collective", "entered", "noop", "reconfigured", "calls",
        "wait_s", "device_s"}], "holds": [{"group", "collective", "admitted_s",
        "released_s"}]}``; seconds)."""
        doc = {"rank": self.rank, "job_id": self.job_id,
               "phases": [{"group": list(s.group), "collective": s.collective,
                           "entered": s.entered, "noop": s.noop,
                           "reconfigured": s.reconfigured, "calls": s.calls,
                           "wait_s": round(s.wait_s, 6), "device_s": round(s.device_s, 6)}
                          for s in self.stats()],
               "holds": [{"group": list(h.phase.group.ranks),
                          "collective": h.phase.collective.value,
                          "admitted_s": h.admitted_s, "released_s": h.released_s}
                         for h in self.holds()]}
        Path(path).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")

    def drain(self, timeout_s: float = 10.0) -> None:
        """Refuse new calls (``CANCELLED``) and release the current run, after its works
        complete, waiting up to ``timeout_s`` s for the release to be sent. Idempotent."""
        with self._lock:
            self._closed = True
            run = self._run
            if run is not None:
                self._finish(run)

    def close(self, timeout_s: float = 10.0) -> None:
        """``drain``, then stop the gate's loop. Idempotent."""
        self.drain(timeout_s)
        self.loop.stop(timeout_s)


def phase_key(group: ProcessGroup, collective: Collective) -> PhaseKey:
    """The gate's phase of ``collective`` on ``group``: seq 0, step 0 (see the module doc)."""
    return PhaseKey(group, collective, 0, 0)


def placements_of(hosts: Sequence[str], gpus: Sequence[int]) -> list[RankPlacement]:
    """Rank placements from per-rank hosts and GPU indices (same length)."""
    return [RankPlacement(r, h, g) for r, (h, g) in enumerate(zip(hosts, gpus, strict=True))]
