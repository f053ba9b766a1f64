"""The PhaseStream's reply sink: replies go out in messages of at most about
``MAX_REPLY_BYTES``, in order, none lost (an attack on the wire made a 30 MB reply batch, past
gRPC's 4 MiB receive limit, that killed the client's stream)."""

from __future__ import annotations

import asyncio

from lightrail.controller.api.agent_service import MAX_REPLY_BYTES, _StreamSink
from lightrail.controller.api.codec import Interner, PhaseKeyDecoder, phase_key_to_pb
from lightrail.controller.core.decisions import Admitted, AdmittedBatch, Reject
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup
from lightrail.v1 import agent_pb2

GRPC_DEFAULT_RECEIVE_LIMIT = 4 * 1024 * 1024
RING = PhaseKey(ProcessGroup.of(range(200_000)), Collective.ALL_REDUCE)


async def drain(sink: _StreamSink) -> list[agent_pb2.PhaseReplyBatch]:
    out = []
    while sink.pending:
        batch = await sink.take()
        assert batch is not None
        out.append(batch)
    return out


async def test_many_refusals_go_out_in_several_messages_in_order() -> None:
    sink = _StreamSink(PhaseKeyDecoder(interner=Interner()))
    message = "x" * 300  # as a refusal that names a phase
    for rank in range(20_000):  # about 7 MB of replies
        sink.deliver(Reject("job", rank, 7, ErrorCode.INVALID_PHASE, message))
    batches = await drain(sink)
    assert len(batches) >= 6
    sizes = [b.ByteSize() for b in batches]
    assert max(sizes) <= MAX_REPLY_BYTES * 1.1 and max(sizes) < GRPC_DEFAULT_RECEIVE_LIMIT
    ranks = [r.error.rank for b in batches for r in b.replies]
    assert ranks == list(range(20_000))  # none lost, none twice, in order


async def test_a_huge_admit_many_is_split_across_messages() -> None:
    decoder = PhaseKeyDecoder(interner=Interner())
    decoder.define_phase(agent_pb2.DefinePhase(phase_id=3, phase=phase_key_to_pb(RING)))
    sink = _StreamSink(decoder)
    ring = decoder.phase(3)
    entries = tuple(AdmittedBatch(1, 1_000_000 + i, tuple(range(i * 16384, (i + 1) * 16384)),
                                  0.0) for i in range(12))  # 196,608 ranks
    admitted = Admitted("job", ring, 0, False, 1.0, 0.01, 1, entries)
    for entry in entries:
        sink.deliver_admitted(admitted, entry)
    batches = await drain(sink)
    assert len(batches) >= 2
    assert all(b.ByteSize() < GRPC_DEFAULT_RECEIVE_LIMIT for b in batches)
    manys = [r.admitted_many for b in batches for r in b.replies]
    assert {(m.job_id, m.phase_id, m.iteration) for m in manys} == {("job", 3, 0)}
    assert [r for m in manys for r in m.ranks] == list(range(12 * 16384))
    assert [q for m in manys for q in m.request_ids] == [
        1_000_000 + i for i in range(12) for _ in range(16384)]


async def test_small_replies_share_one_message() -> None:
    # the hot path: an admission and a refusal of one write go out together
    decoder = PhaseKeyDecoder(interner=Interner())
    pair = PhaseKey(ProcessGroup.of([0, 2]), Collective.SEND_RECV)
    decoder.define_phase(agent_pb2.DefinePhase(phase_id=1, phase=phase_key_to_pb(pair)))
    sink = _StreamSink(decoder)
    entry = AdmittedBatch(1, 5, (0, 2), 0.0)
    sink.deliver_admitted(Admitted("job", decoder.phase(1), 0, True, 0.0, 0.0, 1, (entry,)),
                          entry)
    sink.deliver(Reject("job", 3, 6, ErrorCode.RANK_BUSY, "busy"))
    (batch,) = await drain(sink)
    assert [r.WhichOneof("kind") for r in batch.replies] == ["admitted_many", "error"]


async def test_a_writer_already_waiting_gets_the_oldest_batch_first() -> None:
    # Found by a second attack: a take() waiting when the replies split returned the newest
    # batch, so the client saw ranks 8004.. before 0..8003
    sink = _StreamSink(PhaseKeyDecoder(interner=Interner()))
    waiting = asyncio.create_task(sink.take())
    await asyncio.sleep(0)  # the writer waits
    for rank in range(10_000):
        sink.deliver(Reject("job", rank, 7, ErrorCode.INVALID_PHASE, "x" * 300))
    first = await asyncio.wait_for(waiting, 5.0)
    assert first is not None and first.replies[0].error.rank == 0
    rest = await drain(sink)
    ranks = [r.error.rank for b in (first, *rest) for r in b.replies]
    assert ranks == list(range(10_000))

