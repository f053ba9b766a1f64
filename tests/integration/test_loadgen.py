"""``bench/loadgen`` (the C++ load side of ``bench/hot_path.py``, run through
``bench/cxx_load.CxxLoad``): it sends exactly what ``bench/lean_load.LeanLoad`` sends, stops
with the controller's refusal, and drives tiny cells against a real controller process the way
``hot_path`` does. Skipped when the binary is not built (``make loadgen``)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from cxx_load import BUILD_HINT, LOADGEN, CxxLoad, loadgen_built
from hot_path import ControllerProcess, Options, run_lean_cell
from lean_load import LeanLoad, LoadError, Workload, pair_peer

from lightrail.agents.client import ControllerClient
from lightrail.controller.domain.model import RankPlacement
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.v1 import agent_pb2

pytestmark = pytest.mark.skipif(
    not loadgen_built(), reason=f"{LOADGEN} is not built: {BUILD_HINT}")

LIGHTRAIL = Path(sys.executable).with_name("lightrail")


# --- against a recording stand-in for the controller ---------------------------------------


@dataclass
class Recorder:
    """A PhaseStream server that records every request batch per stream and admits each
    EnterMany at once (one AdmitMany for its ranks), or refuses it (``refuse``)."""

    refuse: bool = False
    streams: list[list[bytes]] = field(default_factory=list)

    async def phase_stream(self, requests: AsyncIterator[agent_pb2.PhaseRequestBatch],
                           context: grpc.aio.ServicerContext[
                               agent_pb2.PhaseRequestBatch, agent_pb2.PhaseReplyBatch],
                           ) -> AsyncIterator[agent_pb2.PhaseReplyBatch]:
        log: list[bytes] = []
        self.streams.append(log)
        async for batch in requests:
            log.append(batch.SerializeToString(deterministic=True))
            out = agent_pb2.PhaseReplyBatch()
            for req in batch.requests:
                if req.WhichOneof("kind") != "enter_many":
                    continue
                e = req.enter_many
                if self.refuse:
                    err = out.replies.add().error
                    err.job_id, err.rank, err.request_id = e.job_id, e.ranks[0], e.request_id
                    err.code = agent_pb2.RANK_BUSY
                    err.message = "the recorder refuses"
                    continue
                a = out.replies.add().admitted_many
                a.job_id, a.phase_id, a.iteration = e.job_id, e.phase_id, e.iteration
                a.ranks.extend(e.ranks)
                a.request_ids.extend([e.request_id] * len(e.ranks))
                a.device_s = 0.001
            if out.replies:
                yield out

    def by_first_rank(self) -> list[list[bytes]]:
        """The streams' logs in the order of their lowest rank (the client's stream index)."""
        def lowest(log: list[bytes]) -> int:
            for raw in log:
                for req in agent_pb2.PhaseRequestBatch.FromString(raw).requests:
                    if req.WhichOneof("kind") == "enter_many":
                        return min(req.enter_many.ranks)
            return -1
        return sorted(self.streams, key=lowest)


def _settled(log: list[bytes]) -> list[bytes]:
    """A stream's log without its trailing release-only batches."""
    out = list(log)
    while out and all(r.WhichOneof("kind") == "release_many"
                      for r in agent_pb2.PhaseRequestBatch.FromString(out[-1]).requests):
        out.pop()
    return out


async def _recorded(load: LeanLoad, recorder: Recorder) -> list[list[bytes]]:
    server = grpc.aio.server()
    handler = grpc.stream_stream_rpc_method_handler(
        recorder.phase_stream,
        request_deserializer=agent_pb2.PhaseRequestBatch.FromString,
        response_serializer=agent_pb2.PhaseReplyBatch.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "lightrail.v1.AgentService", {"PhaseStream": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        load.target = f"127.0.0.1:{port}"
        await load.run(20.0)
    finally:
        await server.stop(grace=None)
    return recorder.by_first_rank()


@pytest.mark.parametrize(("n", "measured", "max_measured_s", "stop_at"), [
    (8, 4, 60.0, 6), (64, 4, 60.0, 6),
    (8, 50, 0.0, 7),  # capped at once: warm-up + 5 boundaries
])
async def test_it_sends_what_lean_load_sends(n: int, measured: int, max_measured_s: float,
                                             stop_at: int) -> None:
    # ring-pair completes one phase instance at a time, so every request id is determined
    work = Workload.build("ring-pair", n)
    args = ("unset", "job-a", work, 32, 2, measured, max_measured_s)
    python, cxx = LeanLoad(*args), CxxLoad(*args)
    called: list[str] = []
    python.on_measured = lambda: called.append("python")
    cxx.on_measured = lambda: called.append("cxx")
    want = await _recorded(python, Recorder())
    got = await _recorded(cxx, Recorder())
    assert len(want) == len(got) == -(-n // 32)
    for w, g in zip(want, got, strict=True):
        # both cancel their calls right after the last write: its releases may not arrive
        assert _settled(g) == _settled(w)
        assert g[:len(w)] == w[:len(g)]
    assert called == ["python", "cxx"]
    assert (cxx.stop_at, cxx.max_entered) == (python.stop_at, python.max_entered) \
        == (stop_at, stop_at - 1)
    for inst in cxx.measured_instances():
        assert inst.admitted == inst.expected
        assert inst.first_send_s <= inst.last_send_s < inst.released_s
        assert max(inst.admit_s) <= inst.released_s
        assert inst.switched and inst.device_s == 0.001


async def test_a_refusal_stops_it_with_the_rank_and_code() -> None:
    load = CxxLoad("unset", "job-a", Workload.build("ring-pair", 8), 32, 1, 2, 60.0)
    with pytest.raises(LoadError, match=r"rank 0 refused \(RANK_BUSY\): the recorder refuses"):
        await _recorded(load, Recorder(refuse=True))


async def test_a_lost_controller_fails_the_cell() -> None:
    load = CxxLoad("127.0.0.1:1", "job-a", Workload.build("ring-pair", 8), 32, 1, 2, 60.0)
    with pytest.raises(LoadError, match="loadgen exited with 1: loadgen: stream 0"):
        await load.run(5.0)


# --- against the controller, as bench/hot_path.py runs it ----------------------------------


@pytest.mark.parametrize(("n", "workload"), [(8, "ring-pair"), (16, "mixed")])
async def test_a_tiny_cell_against_the_controller(
        etcd: EmbeddedEtcd, tmp_path: Path, n: int, workload: str) -> None:
    ctrl = ControllerProcess(tmp_path, etcd.endpoint, n, 0.0, lightrail=LIGHTRAIL)
    await ctrl.start()
    try:
        job = f"loadgen-{workload}-{n}"
        async with ControllerClient(ctrl.target, retry_budget_s=5.0) as admin:
            await admin.register_job(job, [RankPlacement(r, f"host{r}", 0) for r in range(n)],
                                     tenant="bench")
            load = CxxLoad(ctrl.target, job, Workload.build(workload, n), 32, 2, 5, 30.0)
            marks: list[int] = []
            load.on_measured = lambda: marks.append(1)
            await load.run(30.0)
            await admin.unregister_job(job)
        assert marks == [1]
        insts = load.measured_instances()
        assert list(load.measured()) == [2, 3, 4, 5, 6]
        assert len(insts) == 5 * len(load.workload.phases)
        for inst in insts:
            assert inst.admitted == inst.expected == sum(inst.admit_n)
            assert inst.last_send_s <= min(inst.admit_s)
        assert load.window_s() > 0
        assert load.cpu is not None and load.cpu.at_measured_s is not None
        assert 0 < load.cpu.at_measured_s <= load.cpu.end_s
        if workload == "ring-pair":
            assert [i.expected for i in insts[:2]] == [n, len({0, pair_peer(n)})]

        # and hot_path's cell: its figures come from the binary's results
        opts = Options((n,), (0.0,), ("batch32",), True, False, False, 30.0, 30.0, 1, None,
                       measured=4, workloads=(workload,), generator="cxx",
                       instances=tmp_path / "instances.jsonl")
        res = await run_lean_cell(ctrl, etcd, "batch32", n, 0.0, opts, 0, workload)
        assert res.error is None
        assert (res.generator, res.boundaries) == ("cxx", 4)
        assert 0 < res.p50_ms <= res.p99_ms <= res.max_ms
        # --instances: the cell's measured instances, with the times its latencies come from
        (line,) = (tmp_path / "instances.jsonl").read_text(encoding="utf-8").splitlines()
        record = json.loads(line)
        assert (record["transport"], record["workload"], record["n"], record["run"]) == (
            "batch32", workload, n, 0)
        recorded = record["instances"]
        assert len(recorded) == 4 * len(load.workload.phases)
        lat = [max(0.0, at_s - i["last_send_s"]) * 1e3
               for i in recorded for at_s, ranks in i["admits"] for _ in range(ranks)]
        assert max(lat) == pytest.approx(res.max_ms)
        admitted = [sum(r for _, r in i["admits"]) for i in recorded]
        assert admitted == [i.expected for i in insts][:len(recorded)]  # the same phases
        for i in recorded:
            assert i["first_send_s"] <= i["last_send_s"] <= min(a for a, _ in i["admits"])
    finally:
        await ctrl.stop()
