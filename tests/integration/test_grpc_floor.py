"""``bench/grpc_floor.py``: the barrier-only PhaseStream server behind the gRPC floor figures,
over real gRPC on a socket; and one tiny floor run with the C++ generator when it is built."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from cxx_load import loadgen_built
from grpc_floor import BarrierService, run_once

from lightrail.v1 import agent_pb2, agent_pb2_grpc

PHASE = agent_pb2.PhaseKey(group_ranks=[0, 1, 2, 3], collective=agent_pb2.ALL_REDUCE)


def _batch(*reqs: agent_pb2.PhaseRequest) -> agent_pb2.PhaseRequestBatch:
    return agent_pb2.PhaseRequestBatch(requests=list(reqs))


def _define(phase_id: int) -> agent_pb2.PhaseRequest:
    return agent_pb2.PhaseRequest(define_phase=agent_pb2.DefinePhase(phase_id=phase_id,
                                                                     phase=PHASE))


def _enter(phase_id: int, ranks: list[int], request_id: int,
           iteration: int = 0) -> agent_pb2.PhaseRequest:
    return agent_pb2.PhaseRequest(enter_many=agent_pb2.EnterMany(
        job_id="j", phase_id=phase_id, iteration=iteration, ranks=ranks, request_id=request_id))


async def test_it_admits_a_phase_once_every_rank_entered_one_message_per_stream() -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((BarrierService().handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            a = stub.PhaseStream()  # type: ignore[call-arg]  # the stubs predate grpc.aio
            b = stub.PhaseStream()  # type: ignore[call-arg]
            # phase ids are per stream: A calls the phase 5, B calls it 9
            await a.write(_batch(_define(5), _enter(5, [0, 1], 11)))
            await b.write(_batch(_define(9), _enter(9, [2], 21)))
            pending = asyncio.ensure_future(a.read())
            await asyncio.sleep(0.2)
            assert not pending.done()  # rank 3 has not entered
            await b.write(_batch(_enter(9, [3], 22)))
            got_a = await asyncio.wait_for(pending, 10)
            got_b = await asyncio.wait_for(b.read(), 10)
            assert isinstance(got_a, agent_pb2.PhaseReplyBatch)
            assert isinstance(got_b, agent_pb2.PhaseReplyBatch)
            (ra,), (rb,) = got_a.replies, got_b.replies
            assert (ra.admitted_many.phase_id, list(ra.admitted_many.ranks),
                    list(ra.admitted_many.request_ids)) == (5, [0, 1], [11, 11])
            assert (rb.admitted_many.phase_id, list(rb.admitted_many.ranks),
                    list(rb.admitted_many.request_ids)) == (9, [2, 3], [21, 22])
            # the next iteration is a new instance
            await a.write(_batch(_enter(5, [0, 1, 2, 3], 12, iteration=1)))
            again = await asyncio.wait_for(a.read(), 10)
            assert isinstance(again, agent_pb2.PhaseReplyBatch)
            assert list(again.replies[0].admitted_many.ranks) == [0, 1, 2, 3]
            assert again.replies[0].admitted_many.iteration == 1
            a.cancel()
            b.cancel()
    finally:
        await server.stop(None)


@pytest.mark.skipif(not loadgen_built(), reason="bench/loadgen is not built (make loadgen)")
async def test_a_floor_run_measures_boundaries_with_the_cxx_generator() -> None:
    run = await run_once(8, "ring-pair", 0, None, max_measured_s=1.0, cell_timeout_s=60.0)
    r = run.result
    assert r.boundaries > 0
    assert 0 < r.p50_ms <= r.p99_ms
    assert r.boundaries_per_s > 0
    assert run.server_us_per_boundary > 0
