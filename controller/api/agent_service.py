"""AgentService servicer: the gRPC edge of the phase protocol (proto/lightrail/v1/agent.proto).

PhaseStream carries batches both ways: the reader hands every request of a batch to the
``PhaseService`` and the writer sends whatever replies accumulated since its last write as one
batch. Nothing here touches etcd except RegisterJob/UnregisterJob, which write through.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable

import grpc
import structlog

from lightrail.controller.api.codec import (
    ERROR_METADATA_KEY,
    ERROR_TO_PB,
    Interner,
    InvalidRequest,
    PhaseKeyDecoder,
    abort_refused,
    check_id,
    compute_gap_hint,
    event_to_pb,
    parallelism_from_pb,
    placements_from_pb,
    timeout_from_pb,
)
from lightrail.controller.api.replies import fill_reply
from lightrail.controller.core.decisions import Admit, Admitted, AdmittedBatch, Reject
from lightrail.controller.core.planner import JobLayout, PlacementError, PlanError
from lightrail.controller.core.railplan import RailPlanError, plan_step
from lightrail.controller.domain.errors import DuplicateJob, ErrorCode, ReleaseError, UnknownJob
from lightrail.controller.domain.events import JobEvent, JobEventKind
from lightrail.controller.domain.model import PhaseKey
from lightrail.controller.domain.parallelism import ParallelismError
from lightrail.controller.runtime import metrics
from lightrail.controller.runtime.events import EventBus, SubscriberOverflow
from lightrail.controller.runtime.failover import FailoverManager, GpuState
from lightrail.controller.runtime.liveness import JobLiveness
from lightrail.controller.runtime.phase_service import PerRankSink, PhaseService
from lightrail.controller.store.jobs import MAX_RECORD_BYTES, JobRecord, JobRepository
from lightrail.v1 import agent_pb2, agent_pb2_grpc

log = structlog.get_logger(__name__)

_GPU_STATE = {
    agent_pb2.GPU_HEALTHY: GpuState.HEALTHY,
    agent_pb2.GPU_DEGRADED: GpuState.DEGRADED,
    agent_pb2.GPU_FAILED: GpuState.FAILED,
    agent_pb2.GPU_UNKNOWN: GpuState.UNKNOWN,
}


def _gpu_states(report: agent_pb2.HealthReport, gpu_count: int) -> list[GpuState]:
    """The state of each GPU of ``report``, checked before any of it is applied (a refused
    report changes nothing). Raises ``InvalidRequest`` naming the entry, the field and the
    value for a GPU index outside 0..``gpu_count``-1 or an unspecified or unknown state."""
    out: list[GpuState] = []
    for i, g in enumerate(report.gpus):
        if g.gpu >= gpu_count:
            raise InvalidRequest(f"gpus[{i}].gpu: {g.gpu} is not a GPU of host "
                                 f"{report.host!r} (0..{gpu_count - 1})")
        state = _GPU_STATE.get(g.state)
        if state is None:
            raise InvalidRequest(f"gpus[{i}].state: unspecified or unknown ({g.state})")
        out.append(state)
    return out


MAX_BATCH_RANKS = 16384
"""Ranks one EnterMany or ReleaseMany may carry (a host or rack relay batches far fewer); larger
messages are refused whole, with one error."""


MAX_REPLY_BYTES = 1 << 20
"""About the most bytes one PhaseReplyBatch carries (1 MiB, a quarter of gRPC's default 4 MiB
receive limit, ``grpc.max_receive_message_length``, so an estimate off by up to 4x still
fits): past it the replies go on in the next message (an attack on the wire made one batch
of 30 MB from 650 KB of requests, and the client's stream died of ``RESOURCE_EXHAUSTED``)."""

HALF_CLOSED_RECHECK_S = 1.0
"""How often a half-closed PhaseStream looks whether a rank still waits on it, besides at each
answer (s)."""

_ADMITTED_RANK_BYTES = 13  # a rank (varint, < 2^21: 3 bytes) and its request id (<= 10)
_REPLY_BYTES = 48  # a reply's fields and framing besides its strings and rank lists


class _StreamSink:
    """Replies of one PhaseStream, written straight into the batch the writer sends next
    (no per-reply message copies). Ranks admitted into a phase the stream defined an id for
    (``DefinePhase``) are answered with one ``AdmitMany`` per phase instance and write; other
    admissions with one ``Admission`` per rank. A batch whose estimated size reaches
    ``MAX_REPLY_BYTES`` is closed and the replies go on in the next one (an ``AdmitMany`` too:
    its ranks then come in two messages).

    The writer waits in ``take`` on a bare future of the stream's loop, resolved by the first
    reply (or ``wake``) after it began to wait: no ``asyncio.Event`` (whose every wait looks
    the running loop up, a ``getpid`` system call, and keeps a list of waiters)."""

    __slots__ = ("_batch", "_bytes", "_decoder", "_full", "_last", "_last_key", "_loop",
                 "_waiter", "_woken")

    def __init__(self, decoder: PhaseKeyDecoder) -> None:
        self._batch = agent_pb2.PhaseReplyBatch()
        self._bytes = 0  # the estimated size of ``_batch``
        self._full: deque[agent_pb2.PhaseReplyBatch] = deque()  # closed batches, in order
        self._decoder = decoder
        self._last: agent_pb2.AdmitMany | None = None
        self._last_key: tuple[str, int, int, bool, int] | None = None
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._woken = False

    def _room(self, nbytes: int) -> None:
        """Make room for a reply of about ``nbytes``: close the batch if it would then pass
        ``MAX_REPLY_BYTES`` (an empty batch takes any reply)."""
        if self._bytes + nbytes > MAX_REPLY_BYTES and self._batch.replies:
            self._full.append(self._batch)
            self._batch = agent_pb2.PhaseReplyBatch()
            self._bytes = 0
            self._last = None
        self._bytes += nbytes

    def _signal(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def deliver(self, decision: Admit | Reject) -> None:
        self._room(_REPLY_BYTES + len(decision.job_id)
                   + (len(decision.message) if isinstance(decision, Reject) else 0))
        fill_reply(self._batch.replies.add(), decision)
        self._last = None
        self._signal()

    def deliver_admitted(self, decision: Admitted, entry: AdmittedBatch) -> None:
        phase_id = self._decoder.phase_id_of(decision.phase)
        if phase_id is None:
            for admit in decision.admits(entry):
                self._room(_REPLY_BYTES + len(admit.job_id))
                fill_reply(self._batch.replies.add(), admit)
            self._last = None
            self._signal()
            return
        key = (decision.job_id, phase_id, decision.iteration, decision.noop, decision.steps)
        fresh = self._last is None or self._last_key != key
        self._room(_ADMITTED_RANK_BYTES * len(entry.ranks)
                   + (_REPLY_BYTES + len(decision.job_id) if fresh else 0))
        many = self._last  # None again if ``_room`` closed the batch
        if fresh or many is None:
            many = self._batch.replies.add().admitted_many
            many.job_id = decision.job_id
            many.phase_id = phase_id
            many.iteration = decision.iteration
            many.noop = decision.noop
            many.steps = decision.steps
            many.device_s = decision.device_s
            self._last = many
            self._last_key = key
        many.ranks.extend(entry.ranks)
        many.request_ids.extend([entry.request_id] * len(entry.ranks))
        self._signal()

    def push(self, reply: agent_pb2.PhaseReply) -> None:
        self._room(reply.ByteSize() + 8)
        self._batch.replies.add().CopyFrom(reply)
        self._last = None
        self._signal()

    def wake(self) -> None:
        """End the writer's wait even without replies (the reader finished)."""
        self._woken = True
        self._signal()

    def rest(self) -> None:
        """Undo ``wake``: ``take`` waits for a reply again (a half-closed stream whose
        client still waits for answers)."""
        self._woken = False

    @property
    def pending(self) -> bool:
        """True while replies wait for the writer."""
        return len(self._batch.replies) > 0 or bool(self._full)

    async def take(self) -> agent_pb2.PhaseReplyBatch | None:
        """The replies accumulated since the last call (None if none), after waiting for
        at least one or a ``wake``."""
        while not self._full and not self._batch.replies and not self._woken:
            waiter = self._loop.create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                if self._waiter is waiter:  # cancelled while waiting
                    self._waiter = None
        self._woken = False
        if self._full:  # closed batches first: the replies stay in order
            return self._full.popleft()
        if not self._batch.replies:
            return None
        out, self._batch = self._batch, agent_pb2.PhaseReplyBatch()
        self._bytes = 0
        self._last = None
        return out


class _FutureSink(PerRankSink):
    """The reply to one unary EnterPhase."""

    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future: asyncio.Future[Admit | Reject] = (
            asyncio.get_running_loop().create_future()
        )

    def deliver(self, decision: Admit | Reject) -> None:
        if not self.future.done():
            self.future.set_result(decision)


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    """Implements AgentService over a ``PhaseService``.

    ``is_leader`` is consulted per request; a follower (or a fenced leader) answers NOT_LEADER /
    UNAVAILABLE so that clients reconnect to the leader.
    """

    def __init__(
        self,
        service: PhaseService,
        jobs: JobRepository,
        events: EventBus,
        is_leader: Callable[[], bool],
        failover: FailoverManager | None = None,
        liveness: JobLiveness | None = None,
    ) -> None:
        self._failover = failover
        self._liveness = liveness
        self._service = service
        self._jobs = jobs
        self._events = events
        self._is_leader = is_leader
        self._interner = Interner()
        self._decoder = PhaseKeyDecoder(interner=self._interner)
        self._register_lock = asyncio.Lock()

    async def _require_leader(self, context: grpc.aio.ServicerContext) -> None:  # type: ignore[type-arg]
        if not self._is_leader():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader")

    # --- jobs -------------------------------------------------------------------------------

    async def RegisterJob(  # noqa: N802 (gRPC method name)
        self,
        request: agent_pb2.RegisterJobRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> agent_pb2.RegisterJobResponse:
        await self._require_leader(context)
        coord = self._service.coordinator
        try:
            check_id("job_id", request.job_id)
            check_id("tenant", request.tenant, allow_empty=True)
            placements = placements_from_pb(request.ranks)
            declared = [
                self._decoder.decode(p, f"declared_phases[{i}]")
                for i, p in enumerate(request.declared_phases)
            ]
            par = None
            if request.HasField("parallelism"):
                if declared:
                    raise InvalidRequest("parallelism: give either parallelism or "
                                         "declared_phases, not both")
                par = parallelism_from_pb(request.parallelism)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

        derive = None
        if par is not None:
            p_ = par

            def derive(layout: JobLayout) -> tuple[PhaseKey, ...]:
                return plan_step(layout, p_.spec, microbatches=p_.microbatches,
                                 layers_per_stage=p_.layers_per_stage).phases()
        async with self._register_lock:
            try:
                layout = coord.register_job(request.job_id, request.tenant, placements, declared,
                                            derive_schedule=derive)
            except DuplicateJob as exc:
                await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
            except (PlacementError, PlanError, ParallelismError, RailPlanError,
                    ValueError) as exc:
                prefix = "parallelism." if isinstance(exc, ParallelismError) else ""
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{prefix}{exc}")
            schedule = coord.declared_phases(request.job_id)
            record = JobRecord(request.job_id, request.tenant, layout.placements, schedule)
            size = record.encoded_bytes()
            if size > MAX_RECORD_BYTES:  # etcd would refuse it: a bad request, not an outage
                self._service.unregister_job(request.job_id)
                field = ("declared_phases" if request.declared_phases
                         else "parallelism" if par is not None else "ranks")
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{field}: the job's record ({layout.world_size} ranks, {len(schedule)} "
                    f"declared phases) takes {size} bytes, more than the state store's "
                    f"{MAX_RECORD_BYTES}")
            try:
                await self._jobs.save(record)
            except Exception as exc:
                self._service.unregister_job(request.job_id)
                log.error("job_save_failed", job=request.job_id, error=str(exc))
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"state store: {exc}")
        metrics.JOBS.set(len(coord.job_ids()))
        if self._liveness is not None:
            self._liveness.touch(request.job_id)
        self._events.publish(
            JobEvent(request.job_id, JobEventKind.REGISTERED,
                     f"{layout.world_size} ranks on {len(layout.hosts)} hosts",
                     fields={"tenant": request.tenant})
        )
        log.info("job_registered", job=request.job_id, ranks=layout.world_size)
        return agent_pb2.RegisterJobResponse(job_id=request.job_id, world_size=layout.world_size,
                                             declared_phases=len(schedule))

    async def UnregisterJob(  # noqa: N802
        self,
        request: agent_pb2.UnregisterJobRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> agent_pb2.UnregisterJobResponse:
        await self._require_leader(context)
        if not await self.retire_job(request.job_id, "unregistered"):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job_id: unknown job "
                                                          f"{request.job_id!r}")
        return agent_pb2.UnregisterJobResponse()

    async def retire_job(self, job_id: str, reason: str) -> bool:
        """Unregister ``job_id``: its waiting ranks get CANCELLED, its holds are released (its
        circuits stay as they are until another job needs the ports), its record leaves etcd,
        and an UNREGISTERED event carrying ``reason`` ends its watches. The one routine of
        UnregisterJob, the operator's RemoveJob and idle expiry
        (``lightrail.controller.runtime.liveness``). Returns False for an unknown job. Raises
        the store's error when etcd refuses the delete (the job is gone from the coordinator
        already; a restart recovers it from etcd)."""
        try:
            self._service.unregister_job(job_id)
        except UnknownJob:
            return False
        if self._liveness is not None:
            self._liveness.forget(job_id)
        try:
            await self._jobs.delete(job_id)
        finally:
            metrics.JOBS.set(len(self._service.coordinator.job_ids()))
            self._events.publish(JobEvent(job_id, JobEventKind.UNREGISTERED, reason))
            self._events.close_job(job_id)
        return True

    async def WatchJob(  # noqa: N802
        self,
        request: agent_pb2.WatchJobRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> AsyncIterator[agent_pb2.JobEvent]:
        if request.job_id and request.job_id not in self._service.coordinator.job_ids():
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"job_id: unknown job {request.job_id!r}")
        watched = request.job_id if self._liveness is not None else ""
        if watched:
            self._liveness_of().attach(watched)
        try:
            async for event in self._events.subscribe(request.job_id or None):
                yield event_to_pb(event)
        except SubscriberOverflow as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        finally:
            if watched:
                self._liveness_of().detach(watched)

    def _liveness_of(self) -> JobLiveness:
        assert self._liveness is not None
        return self._liveness

    def _attach(self, job_id: str, attached: set[str]) -> None:
        """Attach a registered ``job_id`` to the stream whose jobs are ``attached``, once."""
        liveness = self._liveness
        if liveness is None or job_id in attached:
            return
        try:
            self._service.coordinator.job(job_id)
        except UnknownJob:
            return
        attached.add(job_id)
        liveness.attach(job_id)

    # --- health -----------------------------------------------------------------------------

    async def HealthStream(  # noqa: N802
        self,
        request_iterator: AsyncIterator[agent_pb2.HealthReport],
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> AsyncIterator[agent_pb2.HealthAck]:
        manager = self._failover
        if manager is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "failover is not enabled")
        assert manager is not None
        hosts = self._service.coordinator.fabric.hosts
        presence: object | None = None
        try:
            async for report in request_iterator:
                host = hosts.get(report.host)
                if host is None:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                        f"host: unknown host {report.host!r}")
                assert host is not None
                try:
                    states = _gpu_states(report, host.gpu_count)
                except InvalidRequest as exc:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                if presence is None:
                    manager.heartbeat(report.host)  # before the etcd round trips below
                    presence = await manager.stream_opened(report.host)
                yield self._health_report(manager, report, states)
        finally:
            await manager.stream_closed(presence)

    @staticmethod
    def _health_report(
        manager: FailoverManager, report: agent_pb2.HealthReport, states: list[GpuState]
    ) -> agent_pb2.HealthAck:
        """Apply one checked report (``states[i]`` is ``report.gpus[i]``'s); its
        acknowledgement."""
        manager.heartbeat(report.host)
        for g, state in zip(report.gpus, states, strict=True):
            reason = g.reason or state.value
            if g.has_xid:
                reason = f"XID {g.xid}: {reason}"
            manager.report(report.host, g.gpu, state, reason, echoed=g.controller_record)
        return agent_pb2.HealthAck(heartbeat_interval_s=manager.heartbeat_interval_s,
                                   failed_gpus=manager.failed_gpus(report.host))

    # --- phases -----------------------------------------------------------------------------

    async def PhaseStream(  # type: ignore[override]  # noqa: N802
        self,
        request_iterator: AsyncIterator[agent_pb2.PhaseRequestBatch],
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> None:
        """Reads with ``context.read`` in a reader task and writes with ``context.write`` here
        (cheaper per message than the async-iterator and generator forms); the request
        iterator is not used. When the client closes its side (half-close) the call goes on
        until every rank still waiting on this stream is answered, then ends with OK; a
        stream that breaks leaves its waits for a reconnect to re-attach."""
        metrics.PHASE_STREAMS.inc()
        # Group and phase ids are defined per stream: one client cannot crowd out another's.
        decoder = PhaseKeyDecoder(max_groups=4096, interner=self._interner)
        sink = _StreamSink(decoder)
        attached: set[str] = set()  # the jobs this stream carried (JobLiveness)
        reader = asyncio.create_task(self._read_stream(context, sink, decoder, attached),
                                     name="phase-stream-reader")
        reader.add_done_callback(lambda _t: sink.wake())
        try:
            half_closed = False
            while True:
                if half_closed:
                    # a wait can also end without an answer here (a CancelEnter sent on
                    # another stream): look again now and then, not only at each answer
                    # (asyncio.timeout: 3.11's wait_for can drop the call's cancel, gh-86296)
                    try:
                        async with asyncio.timeout(HALF_CLOSED_RECHECK_S):
                            batch = await sink.take()
                    except TimeoutError:
                        batch = None
                else:
                    batch = await sink.take()
                if batch is not None:
                    await context.write(batch)
                if reader.done():
                    reader.result()
                    if sink.pending:
                        continue  # what was decided goes out before the call ends
                    if not self._service.waits_on(sink):
                        return
                    half_closed = True
                    sink.rest()  # sleep until the next answer
        finally:
            reader.cancel()
            decoder.close()  # its groups stop counting against the server's bound
            self._service.detach(sink)
            metrics.PHASE_STREAMS.dec()
            if self._liveness is not None:
                for job_id in attached:
                    self._liveness.detach(job_id)

    async def _read_stream(
        self,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
        sink: _StreamSink,
        decoder: PhaseKeyDecoder,
        attached: set[str],
    ) -> None:
        eof = grpc.aio.EOF  # type: ignore[attr-defined]  # exported, not in the stubs
        while True:
            batch = await context.read()
            if batch is eof:
                return
            assert isinstance(batch, agent_pb2.PhaseRequestBatch)
            leader = self._is_leader()
            flushed = False
            for i, req in enumerate(batch.requests):
                if i and not flushed and sink.pending:
                    # Let the writer send what the earlier requests decided (an admission)
                    # before the rest of the message is worked through: the admitted ranks
                    # do not wait for the later requests (one loop turn, once per message).
                    flushed = True
                    await asyncio.sleep(0)
                    leader = self._is_leader()  # the lease may have changed meanwhile
                self._on_request(req, leader, sink, decoder, attached)
            if sink.pending:
                # The writer sends what this message decided before the next read is
                # started (and before callbacks queued behind it, such as metrics).
                await asyncio.sleep(0)

    def _on_request(self, req: agent_pb2.PhaseRequest, leader: bool, sink: _StreamSink,
                    decoder: PhaseKeyDecoder, attached: set[str]) -> None:
        """Work through one request of a PhaseStream message (``leader``: whether this replica
        may move state)."""
        kind = req.WhichOneof("kind")
        if kind == "enter_many":  # the hot path first
            self._on_enter_many(req.enter_many, leader, sink, decoder, attached)
        elif kind == "release_many":
            r = req.release_many
            if len(r.ranks) > MAX_BATCH_RANKS:
                self._too_many("release_many", r.job_id, 0, len(r.ranks), sink)
            elif leader:
                self._release_many(r, sink, decoder)
        elif kind in ("define_phase", "define_group"):
            # definitions bind ids on this stream only: a follower takes them too
            self._define(req, kind, sink, decoder)
        elif not leader:
            # a follower or fenced replica moves no state: the agent resends everything
            # to the leader on reconnect
            if kind == "enter":
                e = req.enter
                self._not_leader(e.job_id, (e.rank,), e.request_id, sink)
        else:
            self._per_rank(req, kind, sink, decoder, attached)

    @staticmethod
    def _not_leader(job_id: str, ranks: Iterable[int], request_id: int,
                    sink: _StreamSink) -> None:
        for rank in dict.fromkeys(ranks):  # one answer per rank
            sink.deliver(Reject(job_id, rank, request_id, ErrorCode.NOT_LEADER, "not the leader"))

    def _on_enter_many(self, e: agent_pb2.EnterMany, leader: bool, sink: _StreamSink,
                       decoder: PhaseKeyDecoder, attached: set[str]) -> None:
        if e.job_id not in attached:
            self._attach(e.job_id, attached)
        if len(e.ranks) > MAX_BATCH_RANKS:
            self._too_many("enter_many", e.job_id, e.request_id, len(e.ranks), sink)
        elif leader:
            self._enter_many(e, sink, decoder)
        else:
            self._not_leader(e.job_id, e.ranks, e.request_id, sink)

    @staticmethod
    def _too_many(kind: str, job_id: str, request_id: int, ranks: int,
                  sink: _StreamSink) -> None:
        """Refuse an EnterMany or ReleaseMany (``kind``) of more than ``MAX_BATCH_RANKS`` ranks
        whole, with one error (its refusals rank by rank would not fit in a reply, and working
        through them would stall the event loop)."""
        sink.push(agent_pb2.PhaseReply(error=agent_pb2.PhaseError(
            job_id=job_id, request_id=request_id, code=agent_pb2.INVALID_RANK,
            message=f"{kind}.ranks: {ranks} ranks in one message, at most {MAX_BATCH_RANKS}")))

    def _enter_many(self, e: agent_pb2.EnterMany, sink: _StreamSink,
                    decoder: PhaseKeyDecoder) -> None:
        try:
            phase = decoder.phase(e.phase_id, "enter_many.phase_id")
            timeout_s = timeout_from_pb(e, "enter_many.timeout_s")
        except InvalidRequest as exc:
            for rank in dict.fromkeys(e.ranks):  # one answer per rank
                sink.deliver(Reject(e.job_id, rank, e.request_id, ErrorCode.INVALID_PHASE,
                                    str(exc)))
            return
        self._service.enter_many(e.job_id, list(e.ranks), phase, e.request_id, timeout_s, sink,
                                 e.iteration, e.nbytes, compute_gap_hint(e.compute_gap_s))

    def _release_many(self, r: agent_pb2.ReleaseMany, sink: _StreamSink,
                      decoder: PhaseKeyDecoder) -> None:
        try:
            phase = decoder.phase(r.phase_id, "release_many.phase_id")
        except InvalidRequest as exc:
            for rank in dict.fromkeys(r.ranks):  # one answer per rank
                self._release_refused(sink, r.job_id, rank, ErrorCode.INVALID_PHASE, exc)
            return
        for refused in self._service.release_many(r.job_id, list(r.ranks), phase, r.iteration):
            self._release_refused(sink, r.job_id, refused.rank, refused.error.code,
                                  refused.error)

    @staticmethod
    def _release_refused(sink: _StreamSink, job_id: str, rank: int, code: ErrorCode,
                         exc: Exception) -> None:
        sink.push(agent_pb2.PhaseReply(error=agent_pb2.PhaseError(
            job_id=job_id, rank=rank, request_id=0, code=ERROR_TO_PB[code],
            message=f"release: {exc}")))

    @staticmethod
    def _define(req: agent_pb2.PhaseRequest, kind: str, sink: _StreamSink,
                decoder: PhaseKeyDecoder) -> None:
        try:
            if kind == "define_phase":
                decoder.define_phase(req.define_phase)
            else:
                decoder.define(req.define_group)
        except InvalidRequest as exc:
            sink.push(agent_pb2.PhaseReply(error=agent_pb2.PhaseError(
                request_id=0, code=agent_pb2.INVALID_PHASE, message=str(exc))))

    def _per_rank(self, req: agent_pb2.PhaseRequest, kind: str | None, sink: _StreamSink,
                  decoder: PhaseKeyDecoder, attached: set[str]) -> None:
        """The per-rank requests (older agents; resync after a reconnect). A refused release
        or ``HeldPhase`` is answered with a ``PhaseError`` of request id 0 whose message
        ("release: ..." / "held: ...") names the field. Each attaches its job to the stream
        (``attached``)."""
        service = self._service
        if kind is not None:
            self._attach(getattr(req, kind).job_id, attached)
        if kind == "enter":
            e = req.enter
            try:
                phase = decoder.decode(e.phase)
                timeout_s = timeout_from_pb(e, "enter.timeout_s")
            except InvalidRequest as exc:
                sink.deliver(Reject(e.job_id, e.rank, e.request_id,
                                    ErrorCode.INVALID_PHASE, str(exc)))
                return
            service.enter(e.job_id, e.rank, phase, e.request_id, timeout_s, sink,
                          e.iteration, e.nbytes, compute_gap_hint(e.compute_gap_s))
        elif kind == "release":
            r = req.release
            try:
                service.release(r.job_id, r.rank, decoder.decode(r.phase), r.iteration)
            except (ReleaseError, InvalidRequest) as exc:
                code = exc.code if isinstance(exc, ReleaseError) else ErrorCode.INVALID_PHASE
                self._release_refused(sink, r.job_id, r.rank, code, exc)
        elif kind == "cancel_enter":
            c = req.cancel_enter  # the rank's caller gave up: as a cancelled unary EnterPhase
            service.cancel(c.job_id, c.rank, c.request_id)
        elif kind == "sync_done":
            service.synced(req.sync_done.job_id, list(req.sync_done.ranks))
        elif kind == "held":
            h = req.held
            try:
                service.resume_held(h.job_id, h.rank, decoder.decode(h.phase), h.iteration)
            except (ReleaseError, InvalidRequest) as exc:
                log.warning("held_phase_refused", job=h.job_id, rank=h.rank, error=str(exc))
                code = exc.code if isinstance(exc, ReleaseError) else ErrorCode.INVALID_PHASE
                sink.push(agent_pb2.PhaseReply(error=agent_pb2.PhaseError(
                    job_id=h.job_id, rank=h.rank, request_id=0, code=ERROR_TO_PB[code],
                    message=f"held: {exc}")))

    async def EnterPhase(  # noqa: N802
        self,
        request: agent_pb2.EnterPhaseRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> agent_pb2.EnterPhaseResponse:
        await self._require_leader(context)
        try:
            phase = self._decoder.decode(request.phase)
            timeout_s = timeout_from_pb(request)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        remaining = context.time_remaining()
        if remaining is not None and (timeout_s is None or remaining < timeout_s):
            timeout_s = max(remaining, 1e-6)
        sink = _FutureSink()
        liveness = self._liveness
        if liveness is not None:
            liveness.attach(request.job_id)  # while it waits; unknown jobs are refused below
        self._service.enter(request.job_id, request.rank, phase, request.request_id, timeout_s,
                            sink, request.iteration, request.nbytes,
                            compute_gap_hint(request.compute_gap_s))
        try:
            decision = await sink.future
        except asyncio.CancelledError:
            # The caller went away: withdraw its wait (or its hold, if admitted meanwhile) so
            # no ghost holds circuits that nobody will release.
            self._service.cancel(request.job_id, request.rank, request.request_id)
            raise
        finally:
            self._service.detach(sink)
            if liveness is not None:
                liveness.detach(request.job_id)
        if isinstance(decision, Reject):
            await abort_refused(context, decision.code, decision.message)
        assert isinstance(decision, Admit)
        return agent_pb2.EnterPhaseResponse(noop=decision.noop, steps=decision.steps,
                                            device_s=decision.device_s)

    async def ReleasePhase(  # noqa: N802
        self,
        request: agent_pb2.ReleasePhaseRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> agent_pb2.ReleasePhaseResponse:
        await self._require_leader(context)
        if self._liveness is not None:
            self._liveness.touch(request.job_id)
        try:
            self._service.release(request.job_id, request.rank,
                                  self._decoder.decode(request.phase), request.iteration)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except ReleaseError as exc:
            status = grpc.StatusCode.NOT_FOUND if exc.code is ErrorCode.UNKNOWN_JOB \
                else grpc.StatusCode.FAILED_PRECONDITION
            await context.abort(status, str(exc), ((ERROR_METADATA_KEY, exc.code.value),))
        return agent_pb2.ReleasePhaseResponse()
