"""The batched hot path over real gRPC against a real etcd: DefinePhase / EnterMany /
ReleaseMany up, one AdmitMany per stream and phase instance down, and bad batched requests
answered per rank with the field and value named (nothing stored changes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest_asyncio

from lightrail.agents.client import ControllerClient
from lightrail.controller.api.codec import phase_key_to_pb
from lightrail.controller.app import RunningController
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.drivers.base import CrossConnect
from lightrail.emulator.ocs import EmulatedFabricDevices
from lightrail.v1 import agent_pb2, agent_pb2_grpc

EOF = grpc.aio.EOF  # type: ignore[attr-defined]  # exported, not in the stubs
PLACE = [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)]
RING = PhaseKey(ProcessGroup.of(range(8)), Collective.ALL_REDUCE)
PAIR = PhaseKey(ProcessGroup.of([0, 2]), Collective.SEND_RECV)  # host0 <-> host1 on rail 0
RING_ID, PAIR_ID = 3, 70
N = 4


@pytest_asyncio.fixture
async def ctl(ctl: RunningController) -> AsyncIterator[RunningController]:
    """The conftest's demo controller with the job of ``PLACE`` registered."""
    async with ControllerClient(ctl.grpc_target, retry_budget_s=2.0) as admin:
        assert await admin.register_job("job", PLACE) == 8
        yield ctl


class Stream:
    """One raw PhaseStream written with ``write`` and read reply by reply."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        self.call = agent_pb2_grpc.AgentServiceStub(self.channel).PhaseStream(  # type: ignore[call-arg]
        )

    async def send(self, *requests: agent_pb2.PhaseRequest) -> None:
        await self.call.write(agent_pb2.PhaseRequestBatch(requests=list(requests)))

    async def replies(self, n: int) -> list[agent_pb2.PhaseReply]:
        """The next ``n`` replies (from one or more batches), within 5 s."""
        out: list[agent_pb2.PhaseReply] = []
        while len(out) < n:
            batch = await asyncio.wait_for(self.call.read(), 5.0)
            assert isinstance(batch, agent_pb2.PhaseReplyBatch)
            out.extend(batch.replies)
        return out

    async def ends_ok(self, timeout_s: float = 5.0) -> None:
        """Asserts that nothing more comes and the call ends with OK (a half-closed stream
        whose waits are all answered)."""
        assert await asyncio.wait_for(self.call.read(), timeout_s) is EOF
        assert await asyncio.wait_for(self.call.code(), 5.0) is grpc.StatusCode.OK

    async def wait_then_half_close(self, rank: int, request_id: int) -> None:
        """Enter ``rank`` alone into the pair (it waits for its peer), then close the sending
        side (``done_writing``) and give the server 0.2 s to read that end."""
        await self.send(define(PAIR_ID, PAIR), enter(PAIR_ID, [rank], request_id))
        await self.call.done_writing()
        await asyncio.sleep(0.2)

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close(grace=None)


def define(phase_id: int, phase: PhaseKey) -> agent_pb2.PhaseRequest:
    return agent_pb2.PhaseRequest(define_phase=agent_pb2.DefinePhase(
        phase_id=phase_id, phase=phase_key_to_pb(phase)))


def enter(phase_id: int, ranks: list[int], request_id: int, iteration: int = 0,
          job_id: str = "job") -> agent_pb2.PhaseRequest:
    return agent_pb2.PhaseRequest(enter_many=agent_pb2.EnterMany(
        job_id=job_id, phase_id=phase_id, iteration=iteration, ranks=ranks,
        request_id=request_id, timeout_s=5.0))


def release(phase_id: int, ranks: list[int], iteration: int = 0) -> agent_pb2.PhaseRequest:
    return agent_pb2.PhaseRequest(release_many=agent_pb2.ReleaseMany(
        job_id="job", phase_id=phase_id, iteration=iteration, ranks=ranks))


async def test_batched_enter_is_answered_once_per_stream_and_instance(
    ctl: RunningController, devices: EmulatedFabricDevices
) -> None:
    a, b = Stream(ctl.grpc_target), Stream(ctl.grpc_target)
    try:
        await a.send(define(RING_ID, RING), define(PAIR_ID, PAIR))
        await b.send(define(RING_ID, RING))
        await a.send(enter(RING_ID, [0, 1, 2], 11), enter(RING_ID, [3], 12))
        await b.send(enter(RING_ID, [4, 5, 6, 7], 21))
        (ra,) = await a.replies(1)
        (rb,) = await b.replies(1)
        assert ra.WhichOneof("kind") == rb.WhichOneof("kind") == "admitted_many"
        m = ra.admitted_many
        assert (m.job_id, m.phase_id, m.iteration, m.noop, m.steps) == ("job", RING_ID, 0,
                                                                        False, 1)
        assert list(m.ranks) == [0, 1, 2, 3] and list(m.request_ids) == [11, 11, 11, 12]
        assert list(rb.admitted_many.ranks) == [4, 5, 6, 7]
        ring = {CrossConnect(i + 1, N + (i + 1) % 4 + 1) for i in range(4)}
        assert devices["ocs-rail0"].cross_connects == ring
        # release the ring and enter the pair in one message
        await b.send(release(RING_ID, [4, 5, 6, 7]))
        await a.send(release(RING_ID, [0, 1, 2, 3]), enter(PAIR_ID, [0, 2], 13))
        (rp,) = await a.replies(1)
        assert list(rp.admitted_many.ranks) == [0, 2] and rp.admitted_many.phase_id == PAIR_ID
        assert CrossConnect(2, N + 1) in devices["ocs-rail0"].cross_connects
    finally:
        await a.close()
        await b.close()


async def test_bad_batched_requests_are_refused_per_rank_naming_the_field(
    ctl: RunningController, devices: EmulatedFabricDevices
) -> None:
    s = Stream(ctl.grpc_target)
    try:
        await s.send(define(RING_ID, RING))
        before = devices["ocs-rail0"].cross_connects
        await s.send(enter(99, [0, 1], 1))  # never defined
        replies = await s.replies(2)
        assert [(r.error.rank, r.error.code) for r in replies] == [
            (0, agent_pb2.INVALID_PHASE), (1, agent_pb2.INVALID_PHASE)]
        assert "enter_many.phase_id: unknown phase id 99" in replies[0].error.message
        await s.send(agent_pb2.PhaseRequest(define_phase=agent_pb2.DefinePhase(
            phase_id=70000, phase=phase_key_to_pb(PAIR))))
        (r,) = await s.replies(1)
        assert "define_phase.phase_id: 70000 > 65535" in r.error.message
        await s.send(enter(RING_ID, [0, 42], 2, job_id="nope"))
        replies = await s.replies(2)
        assert [(r.error.rank, r.error.code) for r in replies] == [
            (0, agent_pb2.UNKNOWN_JOB), (42, agent_pb2.UNKNOWN_JOB)]
        await s.send(enter(RING_ID, [42], 3))
        (r,) = await s.replies(1)
        assert (r.error.rank, r.error.code) == (42, agent_pb2.INVALID_RANK)
        assert "rank: 42 out of range 0..7" in r.error.message
        await s.send(release(RING_ID, [5]))
        (r,) = await s.replies(1)
        assert (r.error.rank, r.error.code) == (5, agent_pb2.INVALID_PHASE)
        assert "release: rank 5 does not hold phase" in r.error.message
        await s.send(enter(RING_ID, list(range(20000)), 4))  # refused whole: one reply
        (r,) = await s.replies(1)
        assert r.error.code == agent_pb2.INVALID_RANK and r.error.request_id == 4
        assert "enter_many.ranks: 20000 ranks in one message, at most 16384" in r.error.message
        assert devices["ocs-rail0"].cross_connects == before  # nothing switched
    finally:
        await s.close()


async def test_an_admission_goes_out_before_the_rest_of_its_message_is_worked_through(
    ctl: RunningController,
) -> None:
    """A message whose first request is admitted at once and whose later requests are
    answered too: the admission leaves in a reply batch of its own (the reader lets the
    writer send it before going on), not together with the later answers."""
    s = Stream(ctl.grpc_target)
    try:
        await s.send(define(PAIR_ID, PAIR), define(RING_ID, RING))
        await s.send(enter(PAIR_ID, [0, 2], 1))
        (r,) = await s.replies(1)  # switched onto the pair's circuits
        assert list(r.admitted_many.ranks) == [0, 2] and not r.admitted_many.noop
        await s.send(release(PAIR_ID, [0, 2]))
        # the pair's circuits are still there: admitted at once; rank 42 is refused
        await s.send(enter(PAIR_ID, [0, 2], 2, iteration=1), enter(RING_ID, [42], 3))
        first = await asyncio.wait_for(s.call.read(), 5.0)
        assert isinstance(first, agent_pb2.PhaseReplyBatch)
        assert [x.WhichOneof("kind") for x in first.replies] == ["admitted_many"]
        assert first.replies[0].admitted_many.noop
        (refusal,) = await s.replies(1)
        assert (refusal.error.rank, refusal.error.code) == (42, agent_pb2.INVALID_RANK)
    finally:
        await s.close()


async def test_a_half_closed_stream_is_answered_before_it_ends(
    ctl: RunningController, devices: EmulatedFabricDevices
) -> None:
    """Found by an attack on the wire: an agent that enters, then closes its sending side
    (``done_writing``) and reads on, got the end of the call (status OK) at once; the
    admission that came later was dropped, and its ranks held the phase with nobody told."""
    a, b = Stream(ctl.grpc_target), Stream(ctl.grpc_target)
    try:
        await a.wait_then_half_close(0, 31)
        await b.send(define(PAIR_ID, PAIR), enter(PAIR_ID, [2], 32))
        (ra,) = await a.replies(1)
        assert list(ra.admitted_many.ranks) == [0] and list(ra.admitted_many.request_ids) == [31]
        (rb,) = await b.replies(1)
        assert list(rb.admitted_many.ranks) == [2]
        assert CrossConnect(2, N + 1) in devices["ocs-rail0"].cross_connects
        await a.ends_ok()  # nothing is left to answer on a
    finally:
        await a.close()
        await b.close()


async def test_a_half_closed_stream_with_nothing_waiting_ends_at_once(
    ctl: RunningController,
) -> None:
    a = Stream(ctl.grpc_target)
    try:
        await a.send(define(PAIR_ID, PAIR))
        await a.call.done_writing()
        await a.ends_ok()
    finally:
        await a.close()


async def test_a_bad_timeout_is_refused_naming_its_field(ctl: RunningController) -> None:
    s = Stream(ctl.grpc_target)
    try:
        bad = enter(PAIR_ID, [0, 2], 41)
        bad.enter_many.timeout_s = float("nan")
        await s.send(define(PAIR_ID, PAIR), bad)
        replies = await s.replies(2)
        assert [(r.error.rank, r.error.request_id, r.error.code) for r in replies] == [
            (0, 41, agent_pb2.INVALID_PHASE), (2, 41, agent_pb2.INVALID_PHASE)]
        assert replies[0].error.message.startswith("enter_many.timeout_s: nan is not")
    finally:
        await s.close()


async def test_a_half_closed_stream_ends_when_its_wait_is_cancelled_elsewhere(
    ctl: RunningController,
) -> None:
    # the wait ends without an answer on the half-closed stream: it must not stay open
    a, b = Stream(ctl.grpc_target), Stream(ctl.grpc_target)
    try:
        await a.wait_then_half_close(0, 51)
        await b.send(agent_pb2.PhaseRequest(cancel_enter=agent_pb2.CancelEnter(
            job_id="job", rank=0, request_id=51)))
        await a.ends_ok(10.0)
    finally:
        await a.close()
        await b.close()


async def test_a_half_closed_stream_sends_every_decided_reply_before_it_ends(
    ctl: RunningController,
) -> None:
    """Found by a second attack: replies already decided (refusals split over several messages
    at the size bound) were dropped when the call ended after the half-close."""
    a = Stream(ctl.grpc_target)
    try:
        await a.send(*[enter(99, list(range(16000)), 100 + k) for k in range(3)])  # undefined id
        await a.call.done_writing()
        answered: list[tuple[int, int]] = []
        while True:
            batch = await asyncio.wait_for(a.call.read(), 10.0)
            if batch is EOF:
                break
            assert isinstance(batch, agent_pb2.PhaseReplyBatch)
            answered += [(r.error.request_id, r.error.rank) for r in batch.replies]
        assert answered == [(100 + k, r) for k in range(3) for r in range(16000)]
        assert await asyncio.wait_for(a.call.code(), 5.0) is grpc.StatusCode.OK
    finally:
        await a.close()


async def test_a_repeated_rank_is_answered_once_on_every_refusal_path(
    ctl: RunningController,
) -> None:
    s = Stream(ctl.grpc_target)
    try:
        bad_timeout = enter(PAIR_ID, [0, 0, 2], 61)
        bad_timeout.enter_many.timeout_s = -1.0
        await s.send(define(PAIR_ID, PAIR), enter(99, [3, 3], 60), bad_timeout,
                     enter(PAIR_ID, [0, 0, 2], 62, job_id="nope"), release(99, [3, 3]))
        replies = await s.replies(6)
        assert [(r.error.request_id, r.error.rank, r.error.code) for r in replies] == [
            (60, 3, agent_pb2.INVALID_PHASE),
            (61, 0, agent_pb2.INVALID_PHASE), (61, 2, agent_pb2.INVALID_PHASE),
            (62, 0, agent_pb2.UNKNOWN_JOB), (62, 2, agent_pb2.UNKNOWN_JOB),
            (0, 3, agent_pb2.INVALID_PHASE)]
    finally:
        await s.close()
