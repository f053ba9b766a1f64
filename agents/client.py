"""The job-side library: what a training loop calls at phase boundaries.

Two transports implement ``PhaseTransport``:

* ``lightrail.agents.host.agent.HostAgent`` — the host's agent, in-process (one PhaseStream per
host);
* ``ControllerClient`` — unary EnterPhase/ReleasePhase straight to the controller (or to a host
  agent's local socket, ``unix:///run/lightrail/agent.sock``), for simple clients.

``RankSession`` numbers phases within an iteration (the ``seq`` of the phase key), steps a rank
through the sub-phases of an all-to-all, and always releases. ``BlockingRankSession`` wraps it
for synchronous training loops.

Errors: every refusal is a ``lightrail.agents.errors.PhaseError`` subclass; transient transport
failures (UNAVAILABLE) are retried with backoff within ``retry_budget_s`` and then raise
``ControllerUnavailable``.

Replicas: ``ControllerClient`` takes several controller addresses (``a:1,b:2``) and follows a
standby's redirect to the leader (``lightrail.agents.leader``).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from concurrent.futures import Future
from contextlib import asynccontextmanager, contextmanager
from typing import Protocol, TypeVar

import grpc

from lightrail.agents.channel import ClientTls
from lightrail.agents.errors import Admission, ControllerUnavailable, PhaseError, error_for
from lightrail.agents.leader import LeaderTargets, NoLeader
from lightrail.controller.api.codec import (
    ERROR_METADATA_KEY,
    EVENT_TO_PB,
    parallelism_to_pb,
    phase_key_to_pb,
)
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.events import JobEvent, JobEventKind
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.domain.parallelism import ParallelismSpec
from lightrail.controller.domain.timing import Backoff, BackoffState
from lightrail.v1 import agent_pb2, agent_pb2_grpc

T = TypeVar("T")

_STATUS_TO_CODE = {
    grpc.StatusCode.DEADLINE_EXCEEDED: ErrorCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.NOT_FOUND: ErrorCode.UNKNOWN_JOB,
    grpc.StatusCode.INVALID_ARGUMENT: ErrorCode.INVALID_PHASE,
    grpc.StatusCode.FAILED_PRECONDITION: ErrorCode.RANK_BUSY,
    grpc.StatusCode.ABORTED: ErrorCode.PLACEMENT_CHANGED,
    grpc.StatusCode.CANCELLED: ErrorCode.CANCELLED,
    grpc.StatusCode.UNAVAILABLE: ErrorCode.NOT_LEADER,
}
_EVENT_FROM_PB = {v: k for k, v in EVENT_TO_PB.items()}


def _refusal(exc: grpc.aio.AioRpcError | grpc.Call) -> ErrorCode | None:
    """The controller's ``ErrorCode`` when the call was refused (not a transport failure)."""
    metadata: Sequence[tuple[str, str | bytes]] = exc.trailing_metadata() or ()  # type: ignore[assignment]
    for key, value in metadata:
        if key == ERROR_METADATA_KEY and isinstance(value, str):
            try:
                return ErrorCode(value)
            except ValueError:
                return None
    return None


def _phase_error(exc: grpc.aio.AioRpcError | grpc.Call) -> PhaseError:
    code = _refusal(exc) or _STATUS_TO_CODE.get(exc.code(), ErrorCode.INVALID_PHASE)
    return error_for(code, exc.details() or exc.code().name)


class PhaseTransport(Protocol):
    """Carries EnterPhase / ReleasePhase for ranks."""

    async def enter(
        self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0,
        timeout_s: float = 30.0, nbytes: int = 0, compute_gap_s: float = 0.0,
    ) -> Admission: ...

    async def release_phase(
        self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0
    ) -> None: ...


def _enter_pb(job_id: str, rank: int, phase: PhaseKey, iteration: int, request_id: int,
              timeout_s: float | None, nbytes: int, compute_gap_s: float
              ) -> agent_pb2.EnterPhaseRequest:
    return agent_pb2.EnterPhaseRequest(
        job_id=job_id, rank=rank, phase=phase_key_to_pb(phase), iteration=iteration,
        request_id=request_id, timeout_s=timeout_s, nbytes=nbytes, compute_gap_s=compute_gap_s)


def _admission(resp: agent_pb2.EnterPhaseResponse) -> Admission:
    return Admission(resp.noop, max(1, resp.steps), resp.device_s)


def _release_pb(job_id: str, rank: int, phase: PhaseKey, iteration: int
                ) -> agent_pb2.ReleasePhaseRequest:
    return agent_pb2.ReleasePhaseRequest(
        job_id=job_id, rank=rank, phase=phase_key_to_pb(phase), iteration=iteration)


def _grpc_deadline_s(timeout_s: float | None) -> float | None:
    """The gRPC deadline of an EnterPhase: its admission timeout plus 5 s for the answer."""
    return None if timeout_s is None else timeout_s + 5.0


class JobRegistrationError(Exception):
    """RegisterJob / UnregisterJob was refused; the message is the controller's."""

    def __init__(self, status: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{status.name}: {message}")
        self.status = status


class ControllerClient:
    """A gRPC client of AgentService. ``target`` is ``host:port`` or ``unix:///path``, or
    several controller replicas' addresses (``a:1,b:2,c:3``, or a sequence): each call goes to
    the leader, following a standby's redirect (``lightrail.agents.leader.LeaderTargets``).

    Use inside a running event loop (gRPC objects are created there), as an async context
    manager. A call that finds no leader (every replica unreachable or redirecting nowhere) is
    retried for up to ``retry_budget_s`` seconds, waiting ``backoff_initial_s`` doubling up to
    ``backoff_max_s`` seconds between passes (``lightrail.controller.domain.timing.Backoff``),
    then raises ``ControllerUnavailable`` listing the addresses tried. ``tls``: TLS to the
    controller (``lightrail.agents.channel.ClientTls``; None: plaintext, e.g. a host agent's
    local socket). Raises ``ValueError`` for an empty address list.
    """

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        retry_budget_s: float = 10.0,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 1.0,
        tls: ClientTls | None = None,
    ) -> None:
        self._targets = LeaderTargets(target, tls=tls)
        self.target = str(self._targets)
        self._retry_budget_s = retry_budget_s
        self._backoff = Backoff(initial_s=backoff_initial_s, max_s=backoff_max_s)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, agent_pb2_grpc.AgentServiceAsyncStub] = {}
        self._ids = itertools.count(1)

    @property
    def leader(self) -> str:
        """The address that answered last as the leader (the first one before any call)."""
        return self._targets.current

    def _stub(self, address: str) -> agent_pb2_grpc.AgentServiceAsyncStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = self._channels[address] = self._targets.channel(address)
            stub = self._stubs[address] = agent_pb2_grpc.AgentServiceStub(channel)
        return stub

    async def __aenter__(self) -> ControllerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channels."""
        channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        for channel in channels:
            await channel.close(None)

    async def _retry(self, call: Callable[[agent_pb2_grpc.AgentServiceAsyncStub],
                                          Awaitable[T]]) -> T:
        """``call`` on the leader's stub (``LeaderTargets.call``), passes repeated with backoff
        while no replica leads, for up to ``retry_budget_s``. Raises ``ControllerUnavailable``
        then, and the leader's ``grpc.aio.AioRpcError`` answers."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        backoff = BackoffState(self._backoff)
        while True:
            try:
                return await self._targets.call(lambda address: call(self._stub(address)))
            except NoLeader as exc:
                delay = backoff.next_s()
                if loop.time() - start + delay > self._retry_budget_s:
                    raise ControllerUnavailable(
                        ErrorCode.NOT_LEADER,
                        f"controller {self.target} unavailable for "
                        f"{loop.time() - start:.1f} s: {exc}",
                    ) from None
                await asyncio.sleep(delay)

    async def register_job(
        self,
        job_id: str,
        placements: Sequence[RankPlacement],
        *,
        tenant: str = "default",
        declared_phases: Sequence[PhaseKey] = (),
        parallelism: ParallelismSpec | None = None,
        microbatches: int = 1,
    ) -> int:
        """Register a job; returns its world size. Raises ``JobRegistrationError`` (invalid
        placement, duplicate id) or ``ControllerUnavailable``."""
        req = agent_pb2.RegisterJobRequest(
            job_id=job_id,
            tenant=tenant,
            ranks=[agent_pb2.RankPlacement(rank=p.rank, host=p.host, gpu=p.gpu)
                   for p in placements],
            declared_phases=[phase_key_to_pb(p) for p in declared_phases],
        )
        if parallelism is not None:
            req.parallelism.CopyFrom(parallelism_to_pb(parallelism, microbatches))
        try:
            resp = await self._retry(lambda stub: stub.RegisterJob(req))
        except grpc.aio.AioRpcError as exc:
            raise JobRegistrationError(exc.code(), exc.details() or "") from None
        return int(resp.world_size)

    async def unregister_job(self, job_id: str) -> None:
        """Remove a job. Raises ``JobRegistrationError`` for an unknown job."""
        try:
            await self._retry(
                lambda stub: stub.UnregisterJob(agent_pb2.UnregisterJobRequest(job_id=job_id))
            )
        except grpc.aio.AioRpcError as exc:
            raise JobRegistrationError(exc.code(), exc.details() or "") from None

    async def enter(
        self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0,
        timeout_s: float | None = 30.0, nbytes: int = 0, compute_gap_s: float = 0.0,
    ) -> Admission:
        """Unary EnterPhase; blocks until admitted. ``timeout_s``: how long to wait at most,
        s (> 0; None: the controller's default, and no gRPC deadline). ``nbytes``/
        ``compute_gap_s`` are optional reconfigure-or-not hints. Raises a ``PhaseError``
        subclass."""
        req = _enter_pb(job_id, rank, phase, iteration, next(self._ids), timeout_s, nbytes,
                        compute_gap_s)
        deadline_s = _grpc_deadline_s(timeout_s)
        try:
            resp = await self._retry(lambda stub: stub.EnterPhase(req, timeout=deadline_s))
        except grpc.aio.AioRpcError as exc:
            raise _phase_error(exc) from None
        return _admission(resp)

    async def release_phase(
        self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0
    ) -> None:
        """Unary ReleasePhase. Raises ``PhaseError`` when the rank does not hold ``phase``."""
        req = _release_pb(job_id, rank, phase, iteration)
        try:
            await self._retry(lambda stub: stub.ReleasePhase(req))
        except grpc.aio.AioRpcError as exc:
            raise _phase_error(exc) from None

    async def watch(self, job_id: str) -> AsyncIterator[JobEvent]:
        """Events of ``job_id`` until it is unregistered, from the leader (one pass over the
        addresses to open the stream, following redirects). Raises ``PhaseError`` with
        ``UNKNOWN_JOB`` for an unknown job, ``ControllerUnavailable`` when no replica leads."""
        req = agent_pb2.WatchJobRequest(job_id=job_id)
        calls: list[grpc.aio.UnaryStreamCall[agent_pb2.WatchJobRequest, agent_pb2.JobEvent]] = []

        async def first(address: str) -> agent_pb2.JobEvent | None:
            # a standby's redirect arrives with the first read
            call = self._stub(address).WatchJob(req)
            calls.append(call)
            return _event_or_none(await call.read())

        try:
            try:
                ev = await self._targets.call(first)
            except NoLeader as exc:
                raise ControllerUnavailable(ErrorCode.NOT_LEADER, str(exc)) from None
            call = calls[-1]
            while ev is not None:
                yield JobEvent(
                    job_id=ev.job_id,
                    kind=_EVENT_FROM_PB.get(ev.kind, JobEventKind.PHASE_ERROR),
                    message=ev.message,
                    at_unix_s=ev.at_unix_s,
                    fields=dict(ev.fields),
                )
                ev = _event_or_none(await call.read())
        except grpc.aio.AioRpcError as exc:
            code = _STATUS_TO_CODE.get(exc.code(), ErrorCode.CANCELLED)
            raise error_for(code, exc.details() or exc.code().name) from None
        finally:
            for c in calls:
                c.cancel()


class BlockingPhaseClient:
    """Blocking unary EnterPhase / ReleasePhase on the calling thread, with no event loop: for
    a host agent's local socket (``unix:///run/lightrail/agent.sock``; one address, no leader
    to follow), where a training thread waits anyway. Thread-safe (one gRPC channel).

    While the agent is unreachable (starting, restarting) a call is retried with backoff
    (``backoff_initial_s`` doubling to ``backoff_max_s``) for up to ``retry_budget_s`` seconds,
    then raises ``ControllerUnavailable`` naming ``target``; refusals raise ``PhaseError``
    subclasses as ``ControllerClient`` does."""

    def __init__(self, target: str, *, retry_budget_s: float = 10.0,
                 backoff_initial_s: float = 0.05, backoff_max_s: float = 1.0) -> None:
        self.target = target
        self._channel = grpc.insecure_channel(target)
        self._stub = agent_pb2_grpc.AgentServiceStub(self._channel)
        self._ids = itertools.count(1)
        self._retry_budget_s = retry_budget_s
        self._backoff = Backoff(initial_s=backoff_initial_s, max_s=backoff_max_s)

    def _call(self, call: Callable[[], T]) -> T:
        start = time.monotonic()
        backoff = BackoffState(self._backoff)
        while True:
            try:
                return call()
            except grpc.RpcError as exc:
                assert isinstance(exc, grpc.Call)
                if exc.code() is not grpc.StatusCode.UNAVAILABLE or _refusal(exc) is not None:
                    raise _phase_error(exc) from None
                delay = backoff.next_s()
                if time.monotonic() - start + delay > self._retry_budget_s:
                    raise ControllerUnavailable(
                        ErrorCode.NOT_LEADER,
                        f"host agent {self.target} unreachable for "
                        f"{time.monotonic() - start:.1f} s: {exc.details()}") from None
                time.sleep(delay)

    def enter(
        self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0,
        timeout_s: float | None = 30.0, nbytes: int = 0, compute_gap_s: float = 0.0,
    ) -> Admission:
        """Unary EnterPhase, blocking until admitted (arguments as ``ControllerClient.enter``).
        Raises a ``PhaseError`` subclass."""
        req = _enter_pb(job_id, rank, phase, iteration, next(self._ids), timeout_s, nbytes,
                        compute_gap_s)
        deadline_s = _grpc_deadline_s(timeout_s)
        return _admission(self._call(lambda: self._stub.EnterPhase(req, timeout=deadline_s)))

    def release_phase(self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0
                      ) -> None:
        """Unary ReleasePhase. Raises ``PhaseError`` when the rank does not hold ``phase``."""
        req = _release_pb(job_id, rank, phase, iteration)
        self._call(lambda: self._stub.ReleasePhase(req, timeout=30.0))

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()


def _event_or_none(read: object) -> agent_pb2.JobEvent | None:
    """A WatchJob read: the event, or None at the end of the stream (``grpc.aio.EOF``)."""
    if read is grpc.aio.EOF:  # type: ignore[attr-defined]
        return None
    assert isinstance(read, agent_pb2.JobEvent)
    return read


_SCALE_UP = Admission(noop=True, steps=1, device_s=0.0)


def placement_of(event: JobEvent) -> list[RankPlacement] | None:
    """The job's new placement carried by a PLACEMENT_CHANGED event (None for other events).
    Raises ``ValueError`` on a malformed placement field."""
    if event.kind is not JobEventKind.PLACEMENT_CHANGED:
        return None
    out = []
    for item in event.fields.get("placement", "").split(";"):
        if not item:
            continue
        rank, _, where = item.partition("=")
        host, _, gpu = where.rpartition("/gpu")
        if not host or not gpu.isdecimal() or not rank.isdecimal():
            raise ValueError(f"placement: malformed entry {item!r}")
        out.append(RankPlacement(int(rank), host, int(gpu)))
    return sorted(out, key=lambda p: p.rank)


class RankSession:
    """One rank's view of the phase protocol.

    Call ``start_iteration(i)`` at the top of every training step; then wrap each collective
    in ``async with session.phase(group, collective):``. Phases of one (group, collective) get
    sequence numbers 0, 1, ... within the iteration.

    ``hosts`` (rank -> host name, the job's placement) lets the session admit phases whose
    ranks all sit on one host at once, without a controller call: they run over scale-up
    (NVLink) and need no circuit (Opus: TP stays inside the host).
    """

    def __init__(
        self,
        transport: PhaseTransport,
        job_id: str,
        rank: int,
        *,
        timeout_s: float = 30.0,
        hosts: Sequence[str] | None = None,
    ) -> None:
        self.transport = transport
        self.job_id = job_id
        self.rank = rank
        self.timeout_s = timeout_s
        self.iteration = 0
        self.current_phase: PhaseKey | None = None
        """The phase this rank is admitted into, while inside ``phase``/``all_to_all``."""
        self._seq: dict[tuple[ProcessGroup, Collective], int] = {}
        self._groups: dict[tuple[int, ...], ProcessGroup] = {}
        self._hosts = hosts
        self._local: dict[ProcessGroup, bool] = {}

    def is_scale_up_only(self, group: ProcessGroup) -> bool:
        """True when every rank of ``group`` is on one host (needs no circuit)."""
        if self._hosts is None:
            return False
        local = self._local.get(group)
        if local is None:
            hosts = self._hosts
            local = all(r < len(hosts) for r in group.ranks) and len(
                {hosts[r] for r in group.ranks}) == 1
            self._local[group] = local
        return local

    def start_iteration(self, iteration: int) -> None:
        """Begin training step ``iteration``: phase sequence numbers restart at 0."""
        self.iteration = iteration
        self._seq.clear()

    def _key(self, group: Iterable[int], collective: Collective, step: int) -> PhaseKey:
        raw = tuple(group)
        pg = self._groups.get(raw)
        if pg is None:
            pg = ProcessGroup.of(raw)
            self._groups[raw] = pg
        k = (pg, collective)
        seq = self._seq.get(k, 0)
        if step == 0:
            self._seq[k] = seq + 1
        else:
            seq -= 1
        return PhaseKey(pg, collective, seq, step)

    @asynccontextmanager
    async def phase(
        self, group: Iterable[int], collective: Collective, *, nbytes: int = 0,
        compute_gap_s: float = 0.0,
    ) -> AsyncIterator[Admission]:
        """Enter the phase, yield the admission, release on exit (also on error). For an
        all-to-all this covers sub-phase 0 only; use ``all_to_all``. ``nbytes`` (bytes of the
        collective) and ``compute_gap_s`` (compute before it, s) let the controller decide
        whether new circuits pay for their reconfiguration delay."""
        key = self._key(group, collective, 0)
        if self.is_scale_up_only(key.group):
            self.current_phase = key
            try:
                yield _SCALE_UP
            finally:
                self.current_phase = None
            return
        adm = await self.transport.enter(self.job_id, self.rank, key, self.iteration,
                                         self.timeout_s, nbytes, compute_gap_s)
        self.current_phase = key
        try:
            yield adm
        finally:
            self.current_phase = None
            await self.transport.release_phase(self.job_id, self.rank, key, self.iteration)

    async def all_to_all(self, group: Iterable[int]) -> AsyncGenerator[Admission, None]:
        """Step through the sub-phases of an all-to-all: yields once per permutation, while
        admitted into it; the caller exchanges with that step's peers in the loop body."""
        ranks = tuple(group)
        key = self._key(ranks, Collective.ALL_TO_ALL, 0)
        if self.is_scale_up_only(key.group):
            self.current_phase = key
            try:
                yield _SCALE_UP
            finally:
                self.current_phase = None
            return
        step = 0
        steps = 1
        while step < steps:
            k = PhaseKey(key.group, key.collective, key.seq, step)
            adm = await self.transport.enter(self.job_id, self.rank, k, self.iteration,
                                             self.timeout_s)
            steps = adm.steps
            self.current_phase = k
            try:
                yield adm
            finally:
                self.current_phase = None
                await self.transport.release_phase(self.job_id, self.rank, k, self.iteration)
            step += 1


class BlockingRankSession:
    """``RankSession`` for synchronous training loops: runs its own event loop in a daemon
    thread. ``factory`` builds the transport inside that loop (gRPC objects must be created in
    the loop that uses them)."""

    def __init__(
        self,
        factory: Callable[[], PhaseTransport],
        job_id: str,
        rank: int,
        *,
        timeout_s: float = 30.0,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name=f"lightrail-rank{rank}", daemon=True)
        self._thread.start()
        self._timeout_s = timeout_s

        async def make() -> RankSession:
            return RankSession(factory(), job_id, rank, timeout_s=timeout_s)

        self._session = self._call(make())

    def _call(self, coro: Awaitable[T]) -> T:
        async def run() -> T:
            return await coro

        fut: Future[T] = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return fut.result()

    def start_iteration(self, iteration: int) -> None:
        """See ``RankSession.start_iteration``."""
        self._session.start_iteration(iteration)

    @contextmanager
    def phase(self, group: Iterable[int], collective: Collective) -> Iterator[Admission]:
        """Blocking ``RankSession.phase``: raises ``PhaseError`` subclasses."""
        s = self._session
        key = s._key(group, collective, 0)
        adm = self._call(s.transport.enter(s.job_id, s.rank, key, s.iteration, self._timeout_s))
        try:
            yield adm
        finally:
            self._call(s.transport.release_phase(s.job_id, s.rank, key, s.iteration))

    def close(self) -> None:
        """Stop the loop thread."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)


__all__ = [
    "Admission",
    "BlockingPhaseClient",
    "BlockingRankSession",
    "ControllerClient",
    "ControllerUnavailable",
    "JobRegistrationError",
    "PhaseError",
    "PhaseTransport",
    "RankSession",
]
