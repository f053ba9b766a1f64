"""The async shell around the pure ``PhaseCoordinator``: it routes admissions to the stream
that asked, runs reconfigurations through the reconciler, arms the deadline timer and records
metrics and events. Nothing here waits for etcd (DESIGN.md "Phase protocol": the hot path has
no etcd round trip); durable state goes through a non-blocking writer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog
from prometheus_client import Counter, Histogram

from lightrail.controller.core.coordinator import PhaseCoordinator, RefusedRelease
from lightrail.controller.core.decisions import (
    Admit,
    Admitted,
    AdmittedBatch,
    Decided,
    Decision,
    Reconfigure,
    Reject,
    Rewire,
)
from lightrail.controller.domain.errors import ErrorCode, UnknownJob
from lightrail.controller.domain.events import (
    FabricEvent,
    FabricEventKind,
    JobEvent,
    JobEventKind,
)
from lightrail.controller.domain.model import PhaseKey
from lightrail.controller.domain.timing import Backoff, BackoffState
from lightrail.controller.runtime import metrics
from lightrail.controller.runtime.eager import start_eager
from lightrail.controller.runtime.events import EventBus
from lightrail.controller.runtime.reconciler import ReconcilerStopped
from lightrail.drivers.base import (
    CrossConnect,
    DeviceUnreachable,
    DriverError,
    NotLeader,
)

log = structlog.get_logger(__name__)

READ_BACK_BACKOFF = Backoff(initial_s=0.05, max_s=2.0)
"""Waits between read-back attempts of a switch after a failed apply, seconds."""


class ReplySink(Protocol):
    """Where answers go (a PhaseStream, a unary call's future). Neither method may block.
    ``deliver_admitted``: the ranks of one batch (``entry``) admitted together into one phase
    instance; ``deliver``: a refusal (or, from ``PerRankSink``, one rank's admission)."""

    def deliver(self, decision: Admit | Reject) -> None: ...

    def deliver_admitted(self, decision: Admitted, entry: AdmittedBatch) -> None: ...


class PerRankSink:
    """A base for sinks that answer rank by rank: an admitted batch arrives as one ``Admit``
    per rank through ``deliver``."""

    __slots__ = ()

    def deliver(self, decision: Admit | Reject) -> None:
        raise NotImplementedError

    def deliver_admitted(self, decision: Admitted, entry: AdmittedBatch) -> None:
        for admit in decision.admits(entry):
            self.deliver(admit)


class ReconcileResult(Protocol):
    @property
    def device_s(self) -> float: ...


class ReconcilerLike(Protocol):
    """What the shell needs of ``lightrail.controller.runtime.reconciler.Reconciler``."""

    async def reconcile(
        self, switch_id: str, ports: frozenset[int], target: frozenset[CrossConnect],
        *, inline: bool = False,
    ) -> ReconcileResult: ...

    async def read_back(self, switch_id: str) -> frozenset[CrossConnect]: ...

    def invalidate(self, switch_id: str) -> None: ...


StateWriter = Callable[[str, object], None]
"""``put(key, value)``: store ``value`` under ``key`` eventually; never blocks."""


@dataclass(frozen=True, slots=True)
class ReconfigurationDone:
    """Passed to ``on_reconfigured`` listeners after every reconfiguration of a phase."""

    job_id: str
    phase: PhaseKey
    switches: tuple[str, ...]
    device_s: float
    error: str | None


class PhaseService:
    """Routes the phase protocol between gRPC handlers, the coordinator and the reconciler.

    Call ``start(tg)`` inside the process's TaskGroup before use; reconfigurations run as named
    tasks in that group. A bug (an exception that is not a ``DriverError``) propagates and takes
    the group down: fail loud, the supervisor restarts the daemon.
    """

    def __init__(
        self,
        coordinator: PhaseCoordinator,
        reconciler: ReconcilerLike,
        events: EventBus,
        *,
        state_writer: StateWriter | None = None,
        plan_write_interval_s: float = 1.0,
    ) -> None:
        self.coordinator = coordinator
        self._plan_interval_s = plan_write_interval_s
        self._dirty_plans: dict[str, Reconfigure] = {}
        self._plan_task: asyncio.Task[None] | None = None
        self._reconciler = reconciler
        self._events = events
        self._write = state_writer
        self._routes: dict[int, ReplySink] = {}
        """Route id (carried by the coordinator's decisions) -> where its answers go."""
        self._route_of: dict[ReplySink, int] = {}
        self._next_route = 1
        self._tg: asyncio.TaskGroup | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._admit_hist: dict[tuple[str, str], Histogram] = {}
        self._admit_count: dict[tuple[str, bool], Counter] = {}
        self._stall: dict[str, Counter] = {}
        self._prov_counters: dict[str, tuple[tuple[Counter, ...], tuple[int, ...]]] = {}
        """Per job: its provisioning counters (hit, late, miss) and the counts they hold (a
        job's counts only grow; a job registered anew starts from a fresh entry)."""
        self._inflight: set[asyncio.Task[None]] = set()
        self._reading_back: set[str] = set()
        self._settled = asyncio.Event()
        self._rewires: dict[int, asyncio.Future[float]] = {}
        self._read_back_tasks: set[asyncio.Task[None]] = set()
        self.listeners: list[Callable[[ReconfigurationDone], None]] = []

    def start(self, tg: asyncio.TaskGroup) -> None:
        """Attach to the running loop and the process's TaskGroup."""
        self._tg = tg
        self._loop = asyncio.get_running_loop()
        if self._write is not None:
            self._plan_task = tg.create_task(self._write_plans(), name="plan-writer")

    async def _write_plans(self) -> None:
        """Hand the latest plan of each job to the state writer at most once per interval:
        a job switching circuits hundreds of times a second costs etcd one write per second."""
        while True:
            await asyncio.sleep(self._plan_interval_s)
            self._flush_plans()

    def _flush_plans(self) -> None:
        if self._write is None:
            return
        dirty, self._dirty_plans = self._dirty_plans, {}
        for job_id, rec in dirty.items():
            self._write(f"plans/{job_id}", {
                    "phase": str(rec.phase),
                    "switches": {
                        t.switch_id: sorted([x.ingress, x.egress] for x in t.cross_connects)
                        for t in rec.plan.targets
                    },
                })

    @staticmethod
    def now() -> float:
        """``time.monotonic()`` in seconds (uvloop's ``loop.time()`` ticks in whole ms, too
        coarse for admission latencies)."""
        return time.monotonic()

    # --- requests ---------------------------------------------------------------------------

    def route(self, sink: ReplySink) -> int:
        """The route id of ``sink`` (allocated on first use; ``detach`` frees it)."""
        rid = self._route_of.get(sink)
        if rid is None:
            rid = self._next_route
            self._next_route += 1
            self._route_of[sink] = rid
            self._routes[rid] = sink
        return rid

    def enter(
        self,
        job_id: str,
        rank: int,
        phase: PhaseKey,
        request_id: int,
        timeout_s: float | None,
        sink: ReplySink,
        iteration: int = 0,
        nbytes: int = 0,
        compute_gap_s: float = 0.0,
    ) -> None:
        """Ask for admission of one rank; ``enter_many`` with one rank."""
        self.enter_many(job_id, (rank,), phase, request_id, timeout_s, sink, iteration, nbytes,
                        compute_gap_s)

    def enter_many(
        self,
        job_id: str,
        ranks: Sequence[int],
        phase: PhaseKey,
        request_id: int,
        timeout_s: float | None,
        sink: ReplySink,
        iteration: int = 0,
        nbytes: int = 0,
        compute_gap_s: float = 0.0,
    ) -> None:
        """Ask for admission of ``ranks`` together (one batch, one request id); the answers go
        to ``sink`` (maybe before this returns). ``timeout_s``: how long the ranks wait at
        most, s (None: the coordinator's default). Each answer goes to the route of the batch
        it answers, so a refused duplicate never steals the route of a pending request."""
        self._dispatch(self.coordinator.enter_many(
            job_id, ranks, phase, request_id, self.now(), timeout_s, iteration, nbytes,
            compute_gap_s, self.route(sink)))

    def cancel(self, job_id: str, rank: int, request_id: int) -> None:
        """The caller of ``request_id`` went away: withdraw its wait or ghost hold."""
        decisions = self.coordinator.cancel(job_id, rank, request_id, self.now())
        if decisions:
            self._dispatch(decisions)

    def release(
        self, job_id: str, rank: int, phase: PhaseKey, iteration: int | None = None
    ) -> None:
        """Leave a phase. Raises ``ReleaseError`` when the rank does not hold it."""
        decisions = self.coordinator.release(job_id, rank, phase, self.now(), iteration)
        if decisions:
            self._dispatch(decisions)

    def release_many(
        self, job_id: str, ranks: Sequence[int], phase: PhaseKey, iteration: int | None = None
    ) -> list[RefusedRelease]:
        """``ranks`` leave a phase together; returns the ranks that did not hold it (the
        others are released)."""
        decisions, refused = self.coordinator.release_many(job_id, ranks, phase, self.now(),
                                                           iteration)
        if decisions:
            self._dispatch(decisions)
        return refused

    def resume_held(self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0) -> None:
        """Record that a rank still holds ``phase`` (after a reconnect). Raises
        ``ReleaseError``."""
        self.coordinator.resume_held(job_id, rank, phase, iteration)

    def hosts_dead(self, hosts: Iterable[str]) -> None:
        """A host-dead verdict for ``hosts`` (``PhaseCoordinator.hosts_dead``)."""
        decisions = self.coordinator.hosts_dead(hosts, self.now())
        if decisions:
            self._dispatch(decisions)

    def synced(self, job_id: str, ranks: list[int]) -> None:
        """An agent finished resyncing ``ranks`` of ``job_id`` after a reconnect."""
        decisions = self.coordinator.synced(job_id, ranks, self.now())
        if decisions:
            self._dispatch(decisions)

    def waits_on(self, sink: ReplySink) -> bool:
        """Whether a rank still waits for an answer on ``sink``'s route (a half-closed stream
        stays open for it). O(waiting ranks): for the end of a stream, not the hot path."""
        rid = self._route_of.get(sink)
        return rid is not None and any(w.route == rid for w in self.coordinator.waiting())

    def detach(self, sink: ReplySink) -> None:
        """Forget ``sink`` (its stream or call ended): answers to its route are dropped; its
        ranks may re-attach from a new stream."""
        rid = self._route_of.pop(sink, None)
        if rid is not None:
            del self._routes[rid]

    def unregister_job(self, job_id: str) -> None:
        """Remove a job; waiting ranks get CANCELLED. Raises ``UnknownJob``."""
        self._dispatch(self.coordinator.unregister_job(job_id))
        # forget the job's cached metric children and remove its series (after the
        # dispatch above, which counts the CANCELLED answers of its waiting ranks)
        metrics.forget_job(job_id)
        self._prov_counters.pop(job_id, None)
        self._stall.pop(job_id, None)
        for hkey in [k for k in self._admit_hist if k[0] == job_id]:
            del self._admit_hist[hkey]
        for ckey in [k for k in self._admit_count if k[0] == job_id]:
            del self._admit_count[ckey]

    def set_maintenance(self, switch_id: str, reason: str | None) -> None:
        """Put a switch in maintenance (``reason``) or take it out (None):
        ``PhaseCoordinator.set_maintenance``; waiting phases that need it are refused, and
        after maintenance the queue switches again. Raises ``ValueError`` (unknown switch)."""
        self._dispatch(self.coordinator.set_maintenance(switch_id, reason, self.now()))

    def refresh_switch(self, switch_id: str, cross_connects: frozenset[CrossConnect]) -> None:
        """Replace the coordinator's view of a switch with a read-back."""
        self.coordinator.set_confirmed(switch_id, cross_connects)
        self._dispatch(self.coordinator.schedule(self.now()))
        self._settled.set()

    def cancel_all(self, code: ErrorCode, message: str) -> None:
        """Answer every pending EnterPhase with ``code`` (shutdown, loss of leadership)."""
        for w in self.coordinator.waiting():
            sink = self._routes.get(w.route)
            if sink is not None:  # the waiting request's own id: an agent matches answers by it
                sink.deliver(Reject(w.job_id, w.rank, w.request_id, code, message, w.route))
        self._routes.clear()
        self._route_of.clear()

    # --- decisions --------------------------------------------------------------------------

    def _dispatch(self, decisions: list[Decision]) -> None:
        for d in decisions:
            if isinstance(d, Admitted):
                self._on_admitted(d)
            elif isinstance(d, Reject):
                sink = self._routes.get(d.route)
                metrics.PHASE_ERRORS.labels(d.job_id, d.code.value).inc()
                if sink is not None:
                    sink.deliver(d)
                if (d.code is ErrorCode.DEADLINE_EXCEEDED or d.code is ErrorCode.DEVICE_FAILURE
                        or d.code is ErrorCode.SWITCH_MAINTENANCE
                        ) and self._events.listens(d.job_id):
                    self._events.publish(JobEvent(d.job_id, JobEventKind.PHASE_ERROR, d.message,
                                                  fields={"rank": str(d.rank),
                                                          "code": d.code.value}))
            elif isinstance(d, Decided):
                self._on_decided(d)
            elif isinstance(d, Rewire):
                self._start_rewire(d)
            else:
                self._start_reconfiguration(d)
        self._arm_timer()

    def _on_decided(self, d: Decided) -> None:
        dec = d.decision
        outcome = "switch" if dec.switch else "stay"
        metrics.RECONFIGURE_DECISIONS.labels(d.job_id, outcome).inc()
        if not self._events.wants(d.job_id):
            return
        self._events.publish(JobEvent(
            d.job_id, JobEventKind.DECISION, f"phase {d.phase}: {dec.reason}",
            fields={
                "phase": str(d.phase), "decision": outcome,
                "provisioning": str(d.provisioning).lower(),
                "current_circuits_time_s": f"{dec.current_circuits_time_s:.9f}",
                "new_circuits_time_s": f"{dec.new_circuits_time_s:.9f}",
                "delta_s": f"{dec.delta_s:.9f}",
                "compute_gap_s": f"{dec.compute_gap_s:.9f}",
                "delta_exposed_s": f"{dec.delta_exposed_s:.9f}",
            }))

    def _on_admitted(self, d: Admitted) -> None:
        """Record one phase instance's admission once (latency from the last of its ranks'
        enters, stall rank-seconds, admitted ranks) and answer each batch on its route."""
        job_id = d.job_id
        key = (job_id, d.phase.collective.value)
        hist = self._admit_hist.get(key)
        if hist is None:
            hist = self._admit_hist[key] = metrics.PHASE_ADMISSION_SECONDS.labels(*key)
        entries = d.entries
        at_s = d.at_s
        count = 0
        stall_s = 0.0
        last_s = 0.0
        routes = self._routes
        for e in entries:
            n = len(e.ranks)
            count += n
            stall_s += n * (at_s - e.arrived_s)
            last_s = max(last_s, e.arrived_s)
            sink = routes.get(e.route)
            if sink is not None:
                sink.deliver_admitted(d, e)
        hist.observe(max(0.0, at_s - last_s) if entries else 0.0)
        if stall_s > 0:
            stall = self._stall.get(job_id)
            if stall is None:
                stall = self._stall[job_id] = metrics.STALL_SECONDS.labels(job_id)
            stall.inc(stall_s)
        ckey = (job_id, d.noop)
        counter = self._admit_count.get(ckey)
        if counter is None:
            counter = self._admit_count[ckey] = metrics.PHASE_ADMISSIONS.labels(
                job_id, "noop" if d.noop else "switched")
        counter.inc(count)

    # --- failover -----------------------------------------------------------------------------

    def failover(self, job_id: str, rank: int, host: str, gpu: int) -> asyncio.Future[float]:
        """Move ``rank`` of ``job_id`` to ``gpu`` of ``host`` (``PhaseCoordinator.replace_rank``):
        waiting ranks get PLACEMENT_CHANGED at once; the returned future resolves with the
        device time (s) once the switch confirmed the rewire, or raises the ``DriverError``.
        Raises ``UnknownJob``, ``FailoverError`` (``FailoverBusy``: retry later)."""
        decisions = self.coordinator.replace_rank(job_id, rank, host, gpu, self.now())
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        for d in decisions:
            if isinstance(d, Rewire):
                self._rewires[d.op_id] = fut
        self._dispatch(decisions)
        return fut

    def switch_reachability(self, switch_id: str, error: DriverError | None) -> None:
        """A switch's driver stopped reaching it (``error``: ``DeviceUnreachable`` or
        ``DeviceTimeout``) or reaches it again (None): the reconciler's reachability listener.
        Fail fast (issue 14): ``device_wait_s`` later, a phase that needs a change or a
        read-back there is refused ``DEVICE_FAILURE`` naming the switch and the error
        (``scheduling.unreachable_block``), and so is every such phase that comes while it
        stays unreachable; phases on its confirmed circuits and on other switches go on. The
        loss and the recovery are logged once each and published as a ``switch_state``
        event. The reconciler calls this from inside a device command; the coordinator is
        told on the next turn of the loop (in order), so no decision starts a command while
        that one is still on the stack."""
        if self._loop is None:
            self._on_reachability(switch_id, error)
        else:
            self._loop.call_soon(self._on_reachability, switch_id, error)

    def _on_reachability(self, switch_id: str, error: DriverError | None) -> None:
        now = self.now()
        outage = self.coordinator.unreachable().get(switch_id)
        if error is not None:
            message = " ".join(str(error).split())
            prefix = f"switch {switch_id!r}: "  # DriverError's own; the outage names the switch
            message = message.removeprefix(prefix)
            self._dispatch(self.coordinator.set_unreachable(switch_id, message, now))
            if outage is not None:
                return
            wait_s = self.coordinator.device_wait_s()
            log.warning("switch_unreachable", switch=switch_id, error=message,
                        refusing_after_s=wait_s)
            self._events.publish_fabric(FabricEvent(
                FabricEventKind.SWITCH_STATE, f"switch {switch_id!r} unreachable: {message}",
                switch_id=switch_id, fields={"state": "unreachable", "error": message}))
            if self._loop is not None:  # refuse what waits for it once device_wait_s is over
                self._loop.call_later(wait_s, self._reschedule)
            return
        if outage is None:
            return
        self._dispatch(self.coordinator.set_unreachable(switch_id, None, now))
        down_s = now - outage.since_s
        log.info("switch_reachable", switch=switch_id, unreachable_for_s=round(down_s, 3))
        self._events.publish_fabric(FabricEvent(
            FabricEventKind.SWITCH_STATE,
            f"switch {switch_id!r} answers again after {down_s:.1f} s", switch_id=switch_id,
            fields={"state": "up", "unreachable_for_s": f"{down_s:.3f}"}))

    def _reschedule(self) -> None:
        self._dispatch(self.coordinator.schedule(self.now()))

    def distrust_switch(self, switch_id: str) -> None:
        """The rule for a device alarm (loss of signal, port failure, reboot; from the
        driver or MQTT: ``lightrail.controller.runtime.alarms.DeviceAlarms``): distrust the
        view of the switch and read it back, so no rank is admitted as a no-op onto
        cross-connects a rebooted device lost."""
        self.coordinator.distrust(switch_id)
        self._reconciler.invalidate(switch_id)
        self._start_read_back(switch_id)

    def ports_settled(self) -> asyncio.Event:
        """An event set the next time a reconfiguration, rewire or read-back completes (ports
        that were being switched or unknown may be free then)."""
        if self._settled.is_set():
            self._settled = asyncio.Event()
        return self._settled

    def _start_rewire(self, rw: Rewire) -> None:
        assert self._tg is not None, "PhaseService.start() not called"
        task = self._tg.create_task(self._rewire(rw), name=f"rewire-op{rw.op_id}")
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _rewire(self, rw: Rewire) -> None:
        fut = self._rewires.pop(rw.op_id, None)
        t0 = self.now()
        (target,) = rw.targets
        try:
            await self._reconciler.reconcile(target.switch_id, target.ports,
                                             target.cross_connects)
        except ReconcilerStopped as stopped:  # shutdown: the device was not told
            exc: DriverError = DeviceUnreachable(target.switch_id, str(stopped))
            self._dispatch(self.coordinator.reconfigured(
                rw.op_id, self.now(), str(exc), 0.0, [target.switch_id]))
            if fut is not None and not fut.done():
                fut.set_exception(exc)
            return
        except DriverError as exc:
            fenced = isinstance(exc, NotLeader)
            self._dispatch(self.coordinator.reconfigured(
                rw.op_id, self.now(), str(exc), 0.0, [target.switch_id],
                ErrorCode.NOT_LEADER if fenced else ErrorCode.DEVICE_FAILURE))
            self._settled.set()
            if not fenced:
                self._start_read_back(target.switch_id)
            if fut is not None and not fut.done():
                fut.set_exception(exc)
            return
        device_s = self.now() - t0
        self._dispatch(self.coordinator.reconfigured(rw.op_id, self.now(), None, device_s))
        self._settled.set()
        if fut is not None and not fut.done():
            fut.set_result(device_s)

    def _start_reconfiguration(self, rec: Reconfigure) -> None:
        """Run the reconfiguration eagerly (``eager.start_eager``): on an idle switch that
        answers without suspending, it is confirmed and its ranks admitted before this
        returns; else it goes on in a task (awaited by ``drain``)."""
        assert self._tg is not None, "PhaseService.start() not called"
        task = start_eager(self._tg, self._reconfigure(rec), f"reconfigure-op{rec.op_id}")
        if task is not None:
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _reconfigure(self, rec: Reconfigure) -> None:
        t0 = self.now()
        results = await self._run_targets(rec)
        device_s = self.now() - t0
        failed: dict[str, DriverError] = {}  # switch id -> why it failed
        stopping = False
        for target, result in zip(rec.targets, results, strict=True):
            if isinstance(result, ReconcilerStopped):  # shutdown: the device was not told
                failed[target.switch_id] = DeviceUnreachable(target.switch_id, str(result))
                stopping = True
            elif isinstance(result, DriverError):
                failed[target.switch_id] = result
            elif isinstance(result, BaseException):
                raise result
        if failed:
            error: str | None = "; ".join(str(e) for e in failed.values())
            fenced = any(isinstance(e, NotLeader) for e in failed.values())
        else:
            error, fenced = None, False
        code = ErrorCode.NOT_LEADER if fenced else ErrorCode.DEVICE_FAILURE
        self._dispatch(self.coordinator.reconfigured(
            rec.op_id, self.now(), error, device_s, list(failed), code))
        self._settled.set()
        if not stopping and not fenced:
            for switch_id in failed:
                self._start_read_back(switch_id)
        # After the admissions: their replies are written (the writer tasks were woken first)
        # before the metrics, listeners and event of the reconfiguration are recorded.
        assert self._loop is not None
        self._loop.call_soon(self._record_reconfiguration, rec, device_s, error)

    async def _run_targets(self, rec: Reconfigure) -> list[ReconcileResult | BaseException]:
        """Reconcile every target (inline when the switch is idle); per target its result or
        the exception it raised."""
        reconcile = self._reconciler.reconcile
        if len(rec.targets) == 1:  # no gather: it would wrap the one call in another task
            (t,) = rec.targets
            try:
                return [await reconcile(t.switch_id, t.ports, t.cross_connects, inline=True)]
            except (DriverError, ReconcilerStopped) as exc:
                return [exc]
        return list(await asyncio.gather(
            *(reconcile(t.switch_id, t.ports, t.cross_connects, inline=True)
              for t in rec.targets),
            return_exceptions=True,
        ))

    def _record_reconfiguration(self, rec: Reconfigure, device_s: float,
                                error: str | None) -> None:
        """Metrics, listeners, the event (when subscribed) and the job's last plan record."""
        switches = tuple(t.switch_id for t in rec.targets)
        try:
            score = self.coordinator.provisioning_score(rec.job_id)
        except UnknownJob:
            pass
        else:
            counts = (score.hits, score.late, score.misses)
            counters, last = self._prov_counters.get(rec.job_id) or (tuple(
                metrics.PROVISIONING.labels(rec.job_id, o) for o in ("hit", "late", "miss")),
                (0, 0, 0))
            for counter, value, before in zip(counters, counts, last, strict=True):
                if value > before:  # add only what moved: one lock per counter
                    counter.inc(value - before)
            self._prov_counters[rec.job_id] = (counters, counts)
        if self.listeners:
            done = ReconfigurationDone(rec.job_id, rec.phase, switches, device_s, error)
            for listener in self.listeners:
                listener(done)
        if self._events.wants(rec.job_id):
            self._publish_reconfigured(rec, switches, device_s, error)
        if self._write is not None and error is None:
            self._dirty_plans[rec.job_id] = rec

    def _publish_reconfigured(self, rec: Reconfigure, switches: tuple[str, ...],
                              device_s: float, error: str | None) -> None:
        self._events.publish(
            JobEvent(
                rec.job_id,
                JobEventKind.RECONFIGURED,
                f"phase {rec.phase}: {'failed: ' + error if error else 'confirmed'}"
                + (" (provisioned ahead)" if rec.provisioning else ""),
                fields={"phase": str(rec.phase), "switches": ",".join(switches),
                        "device_s": f"{device_s:.6f}",
                        "provisioning": str(rec.provisioning).lower()},
            )
        )

    def _start_read_back(self, switch_id: str) -> None:
        """Read a switch back after a failed apply, retrying with backoff until it answers:
        its ports stay blocked (unknown) until then."""
        if switch_id in self._reading_back:
            return
        assert self._tg is not None
        self._reading_back.add(switch_id)
        task = self._tg.create_task(self._read_back(switch_id), name=f"read-back/{switch_id}")
        self._read_back_tasks.add(task)
        task.add_done_callback(self._read_back_tasks.discard)

    async def _read_back(self, switch_id: str) -> None:
        """Read ``switch_id`` back until it answers. The first failure is a warning; later
        ones with the same error are logged at debug (the outage is on record once:
        ``switch_unreachable``), and the success after failures says how many there were."""
        backoff = BackoffState(READ_BACK_BACKOFF)
        failures = 0
        last = ""
        try:
            while True:
                try:
                    state = await self._reconciler.read_back(switch_id)
                except ReconcilerStopped:
                    return  # shutting down
                except DriverError as exc:
                    delay_s = backoff.next_s()
                    failures += 1
                    error = str(exc)
                    emit = log.warning if error != last else log.debug
                    emit("read_back_failed", switch=switch_id, error=error, attempt=failures,
                         retry_in_s=delay_s)
                    last = error
                    await asyncio.sleep(delay_s)
                    continue
                if failures:
                    log.info("read_back_done", switch=switch_id, failed_attempts=failures)
                self.refresh_switch(switch_id, state)
                return
        finally:
            self._reading_back.discard(switch_id)

    def _arm_timer(self) -> None:
        """Keep one loop timer at or before the next deadline; one armed earlier stays (it
        fires, expires nothing, re-arms): no cancel and ``call_later`` per phase instance."""
        deadline = self.coordinator.next_deadline()
        if deadline is None or (self._timer_at is not None and self._timer_at <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        assert self._loop is not None
        self._timer = self._loop.call_later(max(0.0, deadline - self.now()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._dispatch(self.coordinator.expire(self.now()))

    async def drain(self, timeout_s: float) -> None:
        """Wait (bounded) for in-flight reconfigurations to finish, hand the last plans to the
        state writer and stop the plan-writer task."""
        await asyncio.sleep(0)  # let recordings queued by finished reconfigurations run
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=timeout_s)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None
        for task in list(self._read_back_tasks):
            task.cancel()
        if self._read_back_tasks:
            await asyncio.wait(set(self._read_back_tasks), timeout=timeout_s)
        if self._plan_task is not None:
            self._plan_task.cancel()
            await asyncio.wait({self._plan_task}, timeout=timeout_s)
            self._plan_task = None
            self._flush_plans()
