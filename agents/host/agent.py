"""The host agent: relays the phase calls of every rank on one host over ONE long-lived
bidirectional PhaseStream to the controller (DESIGN.md "Phase protocol").

Batching: requests accumulate while a write is in flight and go out together as one
``PhaseRequestBatch``, the enters and releases of one phase instance as one
``EnterMany`` / ``ReleaseMany`` (phases named by per-stream ids, ``DefinePhase``); the
controller answers with one ``AdmitMany`` per phase instance. The controller's cost follows
the number of streams, so one stream per host (or per rack relay) is what lets it scale.

Reconnect: when the stream breaks the agent reconnects with bounded exponential backoff and
re-sends, in one batch, the last release of every idle rank (it may have been lost), a
``HeldPhase`` for every rank that holds a phase and the pending enter of every rank still
waiting (as ``EnterMany`` again), then a ``SyncDone`` for those ranks, so a restarted
controller learns who holds which circuits before it switches anything.

Replicas: the agent takes several controller addresses (``a:1,b:2,c:3``). A standby ends the
stream at once with a redirect naming the leader (``lightrail.agents.leader``), which the agent
follows without waiting, at most ``MAX_REDIRECTS`` times in a row; any other break moves it to
the next address of the list after a backoff. Pending enters fail with ``ControllerUnavailable``
listing every address and its last error once no leader was reached for the reconnect budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import structlog
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from lightrail.agents.channel import ClientTls
from lightrail.agents.errors import Admission, ControllerUnavailable, PhaseError, error_for
from lightrail.agents.leader import MAX_REDIRECTS, LeaderTargets, redirect_of
from lightrail.controller.api.codec import COLLECTIVE_TO_PB, ERROR_FROM_PB, phase_key_to_pb
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.model import PhaseKey
from lightrail.controller.domain.timing import Backoff, BackoffState
from lightrail.v1 import agent_pb2, agent_pb2_grpc

log = structlog.get_logger(__name__)


class _StreamClosed(Exception):
    """The controller ended the PhaseStream."""


class _Kind(enum.Enum):
    ENTER = 1
    RELEASE = 2
    HELD = 3
    CANCEL = 4


@dataclass(slots=True)
class _Out:
    """A request waiting for the next batch; encoded when the batch is written, so group
    definitions follow the stream the message actually goes out on."""

    kind: _Kind
    job_id: str
    rank: int
    phase: PhaseKey
    iteration: int
    request_id: int = 0
    timeout_s: float | None = None
    """An enter's admission timeout, s; None: the controller's default."""
    nbytes: int = 0
    compute_gap_s: float = 0.0


_Requests = RepeatedCompositeFieldContainer[agent_pb2.PhaseRequest]

MAX_PHASE_IDS = 65536
"""Phase ids one stream defines at most (``DefinePhase.phase_id`` < 65536); requests for
further phases go out per rank."""


class _Encoder:
    """Encodes requests for one stream session. Enters of one phase instance that go out
    together become one ``EnterMany`` (they share a request id, ``HostAgent._share_ids``),
    releases of one instance one ``ReleaseMany``, after a ``DefinePhase`` on the phase's first
    use on the stream; cancels of given-up enters go first, then releases, then holds, then
    enters (a rank's release and its next enter may travel together; its enter and release of
    one phase never do). Holds go per rank, their group after a ``DefineGroup``."""

    __slots__ = ("_defined", "_phase_ids")

    def __init__(self) -> None:
        self._defined: set[int] = set()
        self._phase_ids: dict[PhaseKey, int] = {}

    def _phase_id(self, reqs: _Requests, phase: PhaseKey) -> int | None:
        pid = self._phase_ids.get(phase)
        if pid is None:
            if len(self._phase_ids) >= MAX_PHASE_IDS:
                return None
            pid = len(self._phase_ids)
            self._phase_ids[phase] = pid
            d = reqs.add().define_phase
            d.phase_id = pid
            d.phase.CopyFrom(phase_key_to_pb(phase))
        return pid

    def encode(self, batch: list[_Out]) -> agent_pb2.PhaseRequestBatch:
        out = agent_pb2.PhaseRequestBatch()
        reqs = out.requests
        releases: dict[tuple[str, PhaseKey, int], list[int]] = {}
        enters: dict[tuple[str, PhaseKey, int, int], list[_Out]] = {}
        singles: list[_Out] = []
        for m in batch:
            if m.kind is _Kind.CANCEL:  # first: a later enter of the rank must not be busy
                reqs.add().cancel_enter.CopyFrom(agent_pb2.CancelEnter(
                    job_id=m.job_id, rank=m.rank, request_id=m.request_id))
            elif m.kind is _Kind.RELEASE:
                releases.setdefault((m.job_id, m.phase, m.iteration), []).append(m.rank)
            elif m.kind is _Kind.ENTER:
                enters.setdefault((m.job_id, m.phase, m.iteration, m.request_id), []).append(m)
            else:
                singles.append(m)
        for (job_id, phase, iteration), ranks in releases.items():
            pid = self._phase_id(reqs, phase)
            if pid is None:
                singles.extend(_Out(_Kind.RELEASE, job_id, r, phase, iteration) for r in ranks)
                continue
            r = reqs.add().release_many
            r.job_id = job_id
            r.phase_id = pid
            r.iteration = iteration
            r.ranks.extend(ranks)
        for m in singles:  # holds, and releases beyond the phase-id limit: before any enter
            self._single(reqs, m)
        self._enters(reqs, enters)
        return out

    def _enters(self, reqs: _Requests,
                enters: dict[tuple[str, PhaseKey, int, int], list[_Out]]) -> None:
        """Append one ``EnterMany`` per phase instance and request id (per rank beyond the
        phase-id limit)."""
        later: list[_Out] = []
        for (job_id, phase, iteration, request_id), group in enters.items():
            pid = self._phase_id(reqs, phase)
            if pid is None:
                later.extend(group)
                continue
            first = group[0]
            e = reqs.add().enter_many
            e.job_id = job_id
            e.phase_id = pid
            e.iteration = iteration
            e.request_id = request_id
            e.ranks.extend(m.rank for m in group)
            if first.timeout_s is not None:
                e.timeout_s = first.timeout_s
            if first.nbytes:
                e.nbytes = first.nbytes
                e.compute_gap_s = first.compute_gap_s
        for m in later:
            self._single(reqs, m)

    def _single(self, reqs: _Requests, m: _Out) -> None:
        group = m.phase.group
        gid = group.group_id
        if gid not in self._defined:
            reqs.add().define_group.CopyFrom(
                agent_pb2.DefineGroup(group_id=gid, ranks=group.ranks))
            self._defined.add(gid)
        req = reqs.add()
        if m.kind is _Kind.ENTER:
            e = req.enter
            e.job_id = m.job_id
            e.rank = m.rank
            e.iteration = m.iteration
            e.request_id = m.request_id
            if m.timeout_s is not None:
                e.timeout_s = m.timeout_s
            if m.nbytes:
                e.nbytes = m.nbytes
                e.compute_gap_s = m.compute_gap_s
            key = e.phase
        elif m.kind is _Kind.RELEASE:
            r = req.release
            r.job_id = m.job_id
            r.rank = m.rank
            r.iteration = m.iteration
            key = r.phase
        else:
            h = req.held
            h.job_id = m.job_id
            h.rank = m.rank
            h.iteration = m.iteration
            key = h.phase
        key.group_id = gid
        key.collective = COLLECTIVE_TO_PB[m.phase.collective]
        key.seq = m.phase.seq
        key.step = m.phase.step


def _expire(fut: asyncio.Future[Admission], timeout_s: float, budget_s: float) -> None:
    if not fut.done():
        fut.set_exception(error_for(
            ErrorCode.DEADLINE_EXCEEDED,
            f"no answer from the controller within {timeout_s:.3f} s (+{budget_s:.0f} s "
            "reconnect budget)"))


@dataclass(slots=True)
class _Pending:
    request_id: int
    phase: PhaseKey
    iteration: int
    timeout_s: float
    future: asyncio.Future[Admission]


@dataclass(frozen=True, slots=True)
class _Held:
    phase: PhaseKey
    iteration: int


class HostAgent:
    """Phase relay of one host. ``target`` is the controller's ``host:port``, or the addresses
    of its replicas (``a:1,b:2``, or a sequence; ``ValueError`` if empty): the agent keeps its
    stream to the leader.

    Use as an async context manager (or ``start()`` / ``close()``); ``enter`` and ``release``
    are called by the host's ranks (in-process, or through
    ``lightrail.agents.host.local_endpoint``).
    ``reconnect_budget_s`` bounds how long a pending EnterPhase waits for the controller to come
    back before it fails with ``ControllerUnavailable``. ``tls``: TLS to the controller
    (``lightrail.agents.channel.ClientTls``; None: plaintext).
    """

    def __init__(
        self,
        host: str,
        target: str | Sequence[str],
        *,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 2.0,
        reconnect_budget_s: float = 30.0,
        tls: ClientTls | None = None,
    ) -> None:
        self.host = host
        self._targets = LeaderTargets(target, tls=tls)
        self.target = str(self._targets)
        self._errors: dict[str, str] = {}
        """The last error of each address since the agent last heard from a leader."""
        self._heard = False
        """Whether the current stream session got a reply (it reached the leader)."""
        self._backoff = Backoff(initial_s=backoff_initial_s, max_s=backoff_max_s)
        self._reconnect_budget_s = reconnect_budget_s
        self._ids = itertools.count(1)
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._held: dict[tuple[str, int], _Held] = {}
        self._last_release: dict[tuple[str, int], _Held] = {}
        self._outbox: list[_Out] = []
        self._wake = asyncio.Event()
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.reconnects = 0
        self.redirects = 0
        """Redirects followed (a standby named the leader)."""

    @property
    def connected_to(self) -> str:
        """The address the agent's stream goes to (or will go to next)."""
        return self._targets.current

    async def __aenter__(self) -> HostAgent:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start(self) -> None:
        """Start the connection task on the running loop."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"host-agent-{self.host}")

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop: pending calls fail with ``CANCELLED``; the stream is closed."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._task, timeout_s)
        self._fail_pending(ErrorCode.CANCELLED, "host agent closed")

    async def wait_connected(self, timeout_s: float) -> None:
        """Wait until the stream is up; raises ``TimeoutError``."""
        await asyncio.wait_for(self._connected.wait(), timeout_s)

    # --- rank API ---------------------------------------------------------------------------

    async def enter(
        self,
        job_id: str,
        rank: int,
        phase: PhaseKey,
        iteration: int = 0,
        timeout_s: float = 30.0,
        nbytes: int = 0,
        compute_gap_s: float = 0.0,
    ) -> Admission:
        """Block until ``rank`` is admitted into ``phase``. Raises a ``PhaseError`` subclass:
        ``PhaseTimeout`` after ``timeout_s`` (enforced by the controller, and locally with a
        grace period if the controller is gone), ``PlacementChanged``, ``ControllerUnavailable``.
        Cancelling the caller withdraws the wait at the controller (``CancelEnter``; an
        admission already on its way is released), so the rank may enter another phase at once.
        """
        key = (job_id, rank)
        if key in self._pending:
            raise PhaseError(ErrorCode.RANK_BUSY, f"rank {rank} already waits for a phase")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Admission] = loop.create_future()
        p = _Pending(next(self._ids), phase, iteration, timeout_s, fut)
        self._pending[key] = p
        self._send(_Out(_Kind.ENTER, job_id, rank, phase, iteration, p.request_id, timeout_s,
                        nbytes, compute_gap_s))
        # The controller enforces timeout_s; this local guard only fires when it is gone.
        guard = loop.call_later(timeout_s + self._reconnect_budget_s, _expire, fut, timeout_s,
                                self._reconnect_budget_s)
        try:
            return await fut
        except asyncio.CancelledError:
            held = self._held.get(key)
            if held is not None and held.phase == phase and held.iteration == iteration:
                del self._held[key]  # admitted as the caller gave up: the cancel releases it
            self._send(_Out(_Kind.CANCEL, job_id, rank, phase, iteration, p.request_id))
            raise
        finally:
            guard.cancel()
            if self._pending.get(key) is p:
                del self._pending[key]

    def release(self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0) -> None:
        """Leave ``phase``; never blocks (the message goes out with the next batch)."""
        key = (job_id, rank)
        self._held.pop(key, None)
        self._last_release[key] = _Held(phase, iteration)
        self._send(_Out(_Kind.RELEASE, job_id, rank, phase, iteration))

    async def release_phase(
        self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0
    ) -> None:
        """``release`` as a coroutine, for ``lightrail.agents.client.PhaseTransport``."""
        self.release(job_id, rank, phase, iteration)

    # --- connection -------------------------------------------------------------------------

    def _send(self, msg: _Out) -> None:
        self._outbox.append(msg)
        self._wake.set()

    def _fail_pending(self, code: ErrorCode, message: str) -> None:
        for p in self._pending.values():
            if not p.future.done():
                p.future.set_exception(error_for(code, message))
        self._pending.clear()

    async def _run(self) -> None:
        backoff = BackoffState(self._backoff)
        down_since: float | None = None
        loop = asyncio.get_running_loop()
        redirects = 0
        while not self._closing:
            address = self._targets.current
            self._heard = False
            try:
                await self._session(address)
                backoff.reset()
                down_since = None
            except (grpc.aio.AioRpcError, _StreamClosed) as exc:
                self._connected.clear()
                if self._heard:  # the stream reached a leader: a new outage starts now
                    backoff.reset()
                    down_since = None
                    self._errors.clear()
                    redirects = 0
                now = loop.time()
                down_since = down_since if down_since is not None else now
                leader = redirect_of(exc) if isinstance(exc, grpc.aio.AioRpcError) else None
                detail = (self._targets.describe(exc) if isinstance(exc, grpc.aio.AioRpcError)
                          else str(exc))
                self._errors[address] = detail
                if leader and leader != address and redirects < MAX_REDIRECTS:
                    redirects += 1
                    self.redirects += 1
                    self._targets.current = leader
                    log.info("phase_stream_redirected", host=self.host, standby=address,
                             leader=leader)
                    self.reconnects += 1
                    continue
                redirects = 0
                log.warning("phase_stream_broken", host=self.host, controller=address,
                            detail=detail)
                if now - down_since > self._reconnect_budget_s:
                    tried = "; ".join(f"{a} ({e})" for a, e in self._errors.items())
                    self._fail_pending(ErrorCode.NOT_LEADER,
                                       f"no controller leader reached at {self.target} for "
                                       f"{now - down_since:.1f} s: {tried}")
                self._targets.current = self._next_address(address)
                await asyncio.sleep(backoff.next_s())
                self.reconnects += 1

    def _next_address(self, address: str) -> str:
        """The address after ``address`` in the list (wrapping); the first one for an address
        only a redirect named."""
        order = self._targets.addresses
        return order[(order.index(address) + 1) % len(order)] if address in order else order[0]

    async def _session(self, address: str) -> None:
        async with self._targets.channel(address) as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            call = stub.PhaseStream()  # type: ignore[call-arg]  # stubs predate aio
            # Resync after (re)connect: the last release of every idle rank (it may have been
            # lost with the old stream; a duplicate is refused harmlessly), then every hold,
            # then every pending enter (same request ids), then releases queued since.
            busy = self._held.keys() | self._pending.keys()
            resync = [
                _Out(_Kind.RELEASE, j, r, h.phase, h.iteration)
                for (j, r), h in self._last_release.items() if (j, r) not in busy
            ]
            resync += [_Out(_Kind.HELD, j, r, h.phase, h.iteration)
                       for (j, r), h in self._held.items()]
            resync += [_Out(_Kind.ENTER, j, r, p.phase, p.iteration, p.request_id, p.timeout_s)
                       for (j, r), p in self._pending.items()]
            # releases and cancels queued since go too (a cancel may withdraw a wait the
            # controller kept when the old stream broke; the encoder sends cancels first)
            self._outbox = resync + [m for m in self._outbox
                                     if m.kind is _Kind.RELEASE or m.kind is _Kind.CANCEL]
            encoder = _Encoder()
            served: dict[str, set[int]] = {}
            for j, r in (*self._last_release, *self._held, *self._pending):
                served.setdefault(j, set()).add(r)
            sync_done: agent_pb2.PhaseRequestBatch | None = agent_pb2.PhaseRequestBatch(requests=[
                agent_pb2.PhaseRequest(sync_done=agent_pb2.SyncDone(job_id=j, ranks=sorted(rs)))
                for j, rs in served.items()
            ]) if served else None
            self._wake.set()
            reader = asyncio.create_task(self._read(call), name=f"agent-reader-{self.host}")
            reader.add_done_callback(lambda _t: self._wake.set())
            self._connected.set()
            try:
                while True:
                    await self._wake.wait()
                    self._wake.clear()
                    if reader.done():
                        reader.result()
                        raise _StreamClosed("controller closed the stream")
                    batch, self._outbox = self._outbox, []
                    try:
                        if batch:
                            self._share_ids(batch)
                            await call.write(encoder.encode(batch))
                        if sync_done is not None:
                            await call.write(sync_done)
                            sync_done = None
                    except asyncio.InvalidStateError:
                        # the call ended (controller gone, or a standby's redirect) between the
                        # reader's last read and this write: a broken stream like any other,
                        # resynced on reconnect; the reader holds the call's status
                        await asyncio.wait({reader}, timeout=1.0)
                        if reader.done() and not reader.cancelled():
                            reader.result()
                        raise _StreamClosed("controller closed the stream") from None
            finally:
                self._connected.clear()
                reader.cancel()
                call.cancel()

    def _share_ids(self, batch: list[_Out]) -> None:
        """Enters of one phase instance (same job, phase, step, timeout and hints) going out
        together get one request id, so they travel as one ``EnterMany``."""
        groups: dict[tuple[str, PhaseKey, int, float | None, int, float], list[_Out]] = {}
        for m in batch:
            if m.kind is _Kind.ENTER:
                groups.setdefault((m.job_id, m.phase, m.iteration, m.timeout_s, m.nbytes,
                                   m.compute_gap_s), []).append(m)
        for group in groups.values():
            if len(group) < 2:
                continue
            shared = next(self._ids)
            for m in group:
                p = self._pending.get((m.job_id, m.rank))
                if p is not None and p.request_id == m.request_id:
                    p.request_id = shared
                m.request_id = shared

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:  # type: ignore[type-arg]
        while True:
            batch = await call.read()
            if batch is grpc.aio.EOF:  # type: ignore[attr-defined]
                return
            assert isinstance(batch, agent_pb2.PhaseReplyBatch)
            self._heard = True
            for reply in batch.replies:
                self._on_reply(reply)

    def _admitted(self, job_id: str, rank: int, request_id: int, noop: bool, steps: int,
                  device_s: float) -> None:
        key = (job_id, rank)
        p = self._pending.get(key)
        if p is None or p.request_id != request_id:
            return  # answer to a request given up on
        del self._pending[key]
        self._held[key] = _Held(p.phase, p.iteration)
        if not p.future.done():
            p.future.set_result(Admission(noop, max(1, steps), device_s))

    def _on_reply(self, reply: agent_pb2.PhaseReply) -> None:
        kind = reply.WhichOneof("kind")
        if kind == "admitted_many":
            m = reply.admitted_many
            for rank, request_id in zip(m.ranks, m.request_ids, strict=True):
                self._admitted(m.job_id, rank, request_id, m.noop, m.steps, m.device_s)
            return
        if kind == "admitted":
            a = reply.admitted
            self._admitted(a.job_id, a.rank, a.request_id, a.noop, a.steps, a.device_s)
            return
        e = reply.error
        code = ERROR_FROM_PB.get(e.code, ErrorCode.INVALID_PHASE)
        if e.request_id == 0:  # a refused release or hold: after a resync this is expected
            log.debug("controller_refused", host=self.host, job=e.job_id, rank=e.rank,
                        code=code.value, error=e.message)
            return
        key = (e.job_id, e.rank)
        p = self._pending.get(key)
        if p is None or p.request_id != e.request_id:
            return
        if code is ErrorCode.NOT_LEADER:
            # The replica fenced itself (its lease ran out) with this enter in hand: nothing
            # was admitted or switched. Keep the enter pending and end the stream: the next
            # session follows the new leader and resends it (same request id), within the
            # rank's own timeout.
            raise _StreamClosed(f"controller is no longer the leader: {e.message}")
        del self._pending[key]
        if not p.future.done():
            p.future.set_exception(error_for(code, e.message))


__all__ = ["ControllerUnavailable", "HostAgent"]
