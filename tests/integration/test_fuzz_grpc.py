"""Bad input, fuzzed (issue 10, section 5): every gRPC request message through the real
servicers of a real controller (real etcd, real sockets). Random field values, huge
repeated fields, unknown enum values and missing fields must give a gRPC status such as
INVALID_ARGUMENT (or, on a PhaseStream, a ``PhaseError`` reply with an error code) whose details
name the field; never UNKNOWN or INTERNAL (an exception in a servicer). The controller keeps
serving (checked after every example) and a refused request changes nothing: the operator's
views (jobs, GPUs, circuits) and the jobs and GPU records in etcd are compared before and after.

Property-based (hypothesis), derandomized and bounded for CI (``tests/fuzz.py``); each test runs
its examples on one controller and one event loop (pytest-asyncio runs an async ``@given``
test's examples in the test's loop)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf.message import Message
from hypothesis import example, given
from hypothesis import strategies as st

from lightrail.controller.api.agent_service import MAX_BATCH_RANKS
from lightrail.controller.api.codec import MAX_PHASE_ID
from lightrail.controller.app import RunningController
from lightrail.controller.cli.embedded import embedded_config, running_controller
from lightrail.controller.config import FabricSection
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.etcd_server import (
    EmbeddedEtcd,
    EtcdNotInstalledError,
    find_etcd_binary,
)
from lightrail.emulator.ocs import EmulatedFabricDevices
from lightrail.v1 import agent_pb2, agent_pb2_grpc, operator_pb2, operator_pb2_grpc
from tests.conftest import REQUIRE_ETCD_ENV
from tests.fuzz import fuzz_settings

pytestmark = pytest.mark.asyncio(loop_scope="module")
EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # exported, not in the stubs

FUZZ = fuzz_settings(50)
"""50 examples per test in CI (each is a few round trips to the controller and etcd)."""

JOB = "job"
PLACE = [agent_pb2.RankPlacement(rank=r, host=f"host{r // 2}", gpu=r % 2) for r in range(4)]
"""The fixture's job: ranks 0-3 on host0 and host1."""
FREE = [agent_pb2.RankPlacement(rank=r, host=f"host{2 + r // 2}", gpu=r % 2) for r in range(4)]
"""Placements on host2 and host3, which stay free for the fuzzed registrations."""
CALL_TIMEOUT_S = 0.3
"""gRPC deadline of each fuzzed call: a request that is valid and waits (an EnterPhase whose
peers never come) ends by it, as DEADLINE_EXCEEDED."""

ACCEPTABLE = {
    grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED,
}
"""Statuses a fuzzed call may end with: never UNKNOWN / INTERNAL (an exception escaped a
servicer), UNAVAILABLE (the controller is the leader and its store is up) or UNIMPLEMENTED."""
REFUSED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
           grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION}
"""Refusals: the request changed nothing."""
NAMED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
         grpc.StatusCode.ALREADY_EXISTS}
"""Refusals of the request's content: their details name the field. (FAILED_PRECONDITION is
about the state, e.g. "rank 0 does not hold phase all_reduce[0]#0.0": details name the rank and
the phase.)"""
FIELD = re.compile(r"^(job '[^']*': )?(release: |held: )?"
                   r"([a-z_]+(\[\d+\])?(\.[a-z_]+(\[\d+\])?)*: \S|rank \d+ \S)")
"""Details that start with the field (after the job they concern): ``ranks[3].host: ...``,
``job 'j': parallelism.tp: ...``, or with the rank they are about (``rank 0 does not hold
phase ...``)."""


# --- strategies ------------------------------------------------------------------------------

U32 = st.one_of(st.integers(0, 9), st.integers(0, 2**32 - 1), st.just(2**32 - 1))
U64 = st.one_of(st.integers(0, 9), st.integers(0, 2**64 - 1))
SMALL = st.integers(0, 9)
DOUBLE = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.floats(min_value=0.0, max_value=0.2))
ENUM = st.one_of(st.integers(1, 6), st.integers(0, 8), st.integers(-(2**31), 2**31 - 1))
"""Enum values, known and unknown (proto3 enums are open: any int32 travels)."""
NAME = st.one_of(st.just(JOB), st.sampled_from(["", "job2", "host0", "host2", "nohost",
                                                "ocs-rail0", "a" * 129, "bad name", "\x00"]),
                 st.text(max_size=20))
HUGE = st.sampled_from([MAX_BATCH_RANKS + 1, 100_000]).map(lambda n: list(range(n)))
"""Repeated fields far beyond any job (up to ~0.5 MB on the wire, under gRPC's 4 MB)."""
RANKS = st.one_of(st.lists(st.integers(0, 4), min_size=1, max_size=5, unique=True),
                  st.lists(SMALL, max_size=8), st.lists(U32, max_size=4), HUGE)


KEEP = st.sampled_from((True, True, True, True, False))
"""Whether a field is set: mostly (a field left out is one of the cases)."""


def _msg(cls: Callable[..., Message], **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A message of ``cls`` whose fields are drawn from ``fields``, each one maybe left out
    (missing: the proto3 default, or absent for optional and message fields)."""

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        given = {k: draw(s) for k, s in fields.items() if draw(KEEP)}
        return cls(**given)

    return build()


PHASE_KEY = _msg(agent_pb2.PhaseKey, group_ranks=RANKS, collective=ENUM, seq=U32, step=U32,
                 group_id=st.one_of(st.just(0), st.just(0), U64))
PLACEMENT = _msg(agent_pb2.RankPlacement, rank=SMALL, host=NAME, gpu=st.one_of(SMALL, U32))
PARALLELISM = _msg(agent_pb2.ParallelismSpec, tp=st.one_of(SMALL, U32), pp=SMALL,
                   dp_replicate=SMALL, dp_shard=SMALL, ep=SMALL, cp=SMALL, order=ENUM,
                   microbatches=st.one_of(SMALL, U32), layers_per_stage=st.one_of(SMALL, U32),
                   ep_strategy=ENUM)
REGISTER = _msg(agent_pb2.RegisterJobRequest,
                job_id=st.one_of(st.sampled_from(["j1", "j2", "j3"]), NAME),
                tenant=st.one_of(st.just("team-a"), NAME),
                ranks=st.one_of(st.lists(PLACEMENT, max_size=4),
                                st.integers(1, 4).map(lambda n: FREE[:n]),
                                st.just([agent_pb2.RankPlacement(rank=r, host="host2")
                                         for r in range(20_000)])),
                declared_phases=st.one_of(st.lists(PHASE_KEY, max_size=3), st.just([
                    agent_pb2.PhaseKey(group_ranks=[0], collective=agent_pb2.ALL_REDUCE, seq=i)
                    for i in range(20_000)])),
                parallelism=PARALLELISM)
ENTER = _msg(agent_pb2.EnterPhaseRequest, job_id=NAME, rank=st.one_of(SMALL, U32),
             phase=PHASE_KEY, iteration=U64, request_id=U64, timeout_s=DOUBLE, nbytes=U64,
             compute_gap_s=DOUBLE)
RELEASE = _msg(agent_pb2.ReleasePhaseRequest, job_id=NAME, rank=st.one_of(SMALL, U32),
               phase=PHASE_KEY, iteration=U64)
UNREGISTER = _msg(agent_pb2.UnregisterJobRequest, job_id=NAME.filter(lambda n: n != JOB))
WATCH = _msg(agent_pb2.WatchJobRequest, job_id=NAME.filter(lambda n: n != ""))


# --- the rig ---------------------------------------------------------------------------------


@dataclass
class Rig:
    """One controller's stubs and a store reading its etcd keys."""

    ctl: RunningController
    agent: agent_pb2_grpc.AgentServiceAsyncStub
    op: operator_pb2_grpc.OperatorServiceAsyncStub
    store: EtcdStore


@dataclass(frozen=True)
class Outcome:
    """How a call ended."""

    code: grpc.StatusCode
    details: str

    @property
    def refused(self) -> bool:
        return self.code in REFUSED


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_rig() -> AsyncIterator[Rig]:
    """One etcd and one controller for every test of this module (each example compares
    before and after, so the tests need no fresh controller; starting one costs ~1 s). Its
    heartbeat deadline (10 min) no test reaches: a host that sent a report and fell silent is
    not declared failed while the examples run."""
    try:
        binary = find_etcd_binary()
    except EtcdNotInstalledError as e:
        if os.environ.get(REQUIRE_ETCD_ENV) == "1":
            pytest.fail(f"{e} ({REQUIRE_ETCD_ENV}=1 requires it)", pytrace=False)
        pytest.skip(str(e))
    async with EmbeddedEtcd(binary=binary) as etcd:
        cfg = embedded_config(
            etcd.endpoint,
            FabricSection.model_validate({"builtin": "demo-4x2", "reconfiguration_delay_ms": 2}),
            admission_timeout_s=5.0)
        cfg = cfg.model_copy(update={"controller": cfg.controller.model_copy(
            update={"heartbeat_deadline_s": 600.0})})
        async with running_controller(cfg, devices=EmulatedFabricDevices()) as ctl, \
                grpc.aio.insecure_channel(ctl.grpc_target) as ch, \
                EtcdStore.connect(etcd.endpoint) as store:
            r = Rig(ctl, agent_pb2_grpc.AgentServiceStub(ch),
                    operator_pb2_grpc.OperatorServiceStub(ch), store)
            await r.agent.RegisterJob(agent_pb2.RegisterJobRequest(job_id=JOB, ranks=PLACE))
            yield r


@pytest_asyncio.fixture(loop_scope="module")
async def rig(shared_rig: Rig) -> AsyncIterator[Rig]:
    """The shared controller; after the test, valid requests still work on it
    (``still_works``)."""
    yield shared_rig
    await still_works(shared_rig)


async def outcome(call: Awaitable[object]) -> Outcome:
    try:
        await call
    except grpc.aio.AioRpcError as e:
        return Outcome(e.code(), e.details() or "")
    return Outcome(grpc.StatusCode.OK, "")


def check(out: Outcome, request: Message) -> None:
    """The call ended acceptably; a refusal names the field."""
    assert out.code in ACCEPTABLE, (out, request)
    if out.code in NAMED:
        assert FIELD.match(out.details), (out, request)
    if out.refused:
        assert out.details, (out, request)


async def view(r: Rig) -> dict[str, bytes | dict[str, object]]:
    """What a refused request must leave as it was: the operator's views (heartbeat ages
    aside) and the job and GPU records in etcd. Fails if the controller stopped serving."""
    jobs = await r.op.ListJobs(operator_pb2.ListJobsRequest(), timeout=5)
    for j in jobs.jobs:
        j.ClearField("idle_s")  # a clock reading (job expiry), not stored state
    gpus = await r.op.ListGpus(operator_pb2.ListGpusRequest(), timeout=5)
    for g in gpus.gpus:
        g.ClearField("heartbeat_age_s")
    circuits = await r.op.ListCircuits(operator_pb2.ListCircuitsRequest(), timeout=5)
    stored = await r.store.get_prefix_json("jobs/")
    failed = await r.store.get_prefix_json("gpus/")
    return {"jobs": jobs.SerializeToString(deterministic=True),
            "gpus": gpus.SerializeToString(deterministic=True),
            "circuits": circuits.SerializeToString(deterministic=True),
            "etcd_jobs": dict(stored.items), "etcd_gpus": dict(failed.items)}


async def still_works(r: Rig) -> None:
    """After the fuzzing: every job goes, the fixture's job registers again and runs a phase
    through the switches (valid requests still work)."""
    jobs = await r.op.ListJobs(operator_pb2.ListJobsRequest(), timeout=5)
    for j in jobs.jobs:
        await r.agent.UnregisterJob(agent_pb2.UnregisterJobRequest(job_id=j.job_id), timeout=5)
    await r.agent.RegisterJob(agent_pb2.RegisterJobRequest(job_id=JOB, ranks=PLACE), timeout=5)
    ring = agent_pb2.PhaseKey(group_ranks=[0, 1, 2, 3], collective=agent_pb2.ALL_REDUCE,
                              seq=424242)
    got = await asyncio.gather(*(r.agent.EnterPhase(agent_pb2.EnterPhaseRequest(
        job_id=JOB, rank=rank, phase=ring, request_id=10**9 + rank, timeout_s=5.0), timeout=10)
        for rank in range(4)))
    assert len(got) == 4
    for rank in range(4):
        await r.agent.ReleasePhase(agent_pb2.ReleasePhaseRequest(job_id=JOB, rank=rank,
                                                                 phase=ring), timeout=5)


# --- unary AgentService calls ----------------------------------------------------------------

UNARY = st.one_of(
    REGISTER.map(lambda m: ("RegisterJob", m)),
    UNREGISTER.map(lambda m: ("UnregisterJob", m)),
    ENTER.map(lambda m: ("EnterPhase", m)),
    RELEASE.map(lambda m: ("ReleasePhase", m)),
)


@FUZZ
@given(call=UNARY)
@example(call=("RegisterJob", agent_pb2.RegisterJobRequest(
    job_id="j", ranks=FREE[:1], parallelism=agent_pb2.ParallelismSpec(microbatches=2**32 - 1))))
async def test_unary_agent_calls_refuse_bad_input_and_change_nothing(
    rig: Rig, call: tuple[str, Message]
) -> None:
    method, request = call
    before = await view(rig)
    out = await outcome(getattr(rig.agent, method)(request, timeout=CALL_TIMEOUT_S))
    check(out, request)
    after = await view(rig)
    if out.refused:
        assert after == before, (out, request)


@FUZZ
@given(request=WATCH)
async def test_watch_job_refuses_an_unknown_job(
    rig: Rig, request: agent_pb2.WatchJobRequest
) -> None:
    before = await view(rig)
    call = rig.agent.WatchJob(request, timeout=0.02)
    out = await outcome(call.read())
    check(out, request)
    assert out.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert await view(rig) == before


# --- the PhaseStream -------------------------------------------------------------------------

PHASE_ID = st.one_of(st.integers(0, 3), st.just(MAX_PHASE_ID + 1), U32)
STREAM_REQUEST = st.one_of(
    ENTER.map(lambda m: agent_pb2.PhaseRequest(enter=m)),
    RELEASE.map(lambda m: agent_pb2.PhaseRequest(release=agent_pb2.ReleasePhaseRequest(
        job_id=m.job_id, rank=m.rank, phase=m.phase, iteration=m.iteration))),
    _msg(agent_pb2.HeldPhase, job_id=NAME, rank=st.one_of(SMALL, U32), phase=PHASE_KEY,
         iteration=U64).map(lambda m: agent_pb2.PhaseRequest(held=m)),
    _msg(agent_pb2.DefineGroup, group_id=U64, ranks=RANKS).map(
        lambda m: agent_pb2.PhaseRequest(define_group=m)),
    _msg(agent_pb2.SyncDone, job_id=NAME, ranks=RANKS).map(
        lambda m: agent_pb2.PhaseRequest(sync_done=m)),
    _msg(agent_pb2.DefinePhase, phase_id=PHASE_ID, phase=PHASE_KEY).map(
        lambda m: agent_pb2.PhaseRequest(define_phase=m)),
    _msg(agent_pb2.EnterMany, job_id=NAME, phase_id=PHASE_ID, iteration=U64, ranks=RANKS,
         request_id=U64, timeout_s=DOUBLE, nbytes=U64, compute_gap_s=DOUBLE).map(
        lambda m: agent_pb2.PhaseRequest(enter_many=m)),
    _msg(agent_pb2.ReleaseMany, job_id=NAME, phase_id=PHASE_ID, iteration=U64,
         ranks=RANKS).map(lambda m: agent_pb2.PhaseRequest(release_many=m)),
    st.just(agent_pb2.PhaseRequest()),  # no kind set at all
)
PROBE_ID = 2**64 - 1
PROBE = agent_pb2.PhaseRequest(enter=agent_pb2.EnterPhaseRequest(
    job_id="no-such-job", rank=0, request_id=PROBE_ID, phase=agent_pb2.PhaseKey(
        group_ranks=[0], collective=agent_pb2.ALL_REDUCE)))
"""Sent last: its refusal (UNKNOWN_JOB) comes after every reply the fuzzed requests caused at
once, so the test knows when to stop reading."""


async def replies_until_probe(call: Any) -> list[agent_pb2.PhaseReply]:
    """The replies a PhaseStream sends before the probe's refusal (the probe is the last
    request written)."""
    replies: list[agent_pb2.PhaseReply] = []
    while True:
        got = await call.read()
        assert got is not EOF, (await call.code(), await call.details())
        assert isinstance(got, agent_pb2.PhaseReplyBatch)
        for reply in got.replies:
            if reply.WhichOneof("kind") == "error" and reply.error.request_id == PROBE_ID:
                return replies
            replies.append(reply)


SILENT_WHEN_ACCEPTED = {"release", "release_many", "held", "sync_done"}
"""Kinds that get no reply when accepted (a refused one gets a ``PhaseError``)."""


@FUZZ
@given(batches=st.lists(st.lists(STREAM_REQUEST, min_size=1, max_size=4), min_size=1,
                        max_size=3))
async def test_phase_stream_refuses_bad_requests_with_a_phase_error_naming_the_field(
    rig: Rig, batches: list[list[agent_pb2.PhaseRequest]]
) -> None:
    before = await view(rig)
    call = rig.agent.PhaseStream(timeout=5)  # type: ignore[call-arg]
    for batch in batches:
        await call.write(agent_pb2.PhaseRequestBatch(requests=batch))
    await call.write(agent_pb2.PhaseRequestBatch(requests=[PROBE]))
    replies = await replies_until_probe(call)
    await call.done_writing()
    while await call.read() is not EOF:
        pass
    assert await call.code() is grpc.StatusCode.OK, (await call.details(), batches)
    errors = [p.error for p in replies if p.WhichOneof("kind") == "error"]
    for e in errors:
        assert e.code != agent_pb2.PHASE_ERROR_CODE_UNSPECIFIED, (e, batches)
        assert FIELD.match(e.message), (e, batches)
    kinds = {req.WhichOneof("kind") for batch in batches for req in batch}
    admitted = any(p.WhichOneof("kind") != "error" for p in replies)
    if not admitted and not kinds & SILENT_WHEN_ACCEPTED:
        # every enter was refused or still waits (its stream is gone: it holds nothing)
        after = await view(rig)
        assert after["jobs"] == before["jobs"] and after["etcd_jobs"] == before["etcd_jobs"]


# --- the HealthStream ------------------------------------------------------------------------

GPU_HEALTH = _msg(agent_pb2.GpuHealth, gpu=st.one_of(st.integers(0, 2), U32), state=ENUM,
                  reason=st.one_of(st.text(max_size=20), st.just("x" * 5000)), xid=U32,
                  has_xid=st.booleans())
HEALTH = _msg(agent_pb2.HealthReport,
              host=st.one_of(st.sampled_from(["host0", "host1", "host2", "host3"]), NAME),
              sent_unix_s=DOUBLE,
              gpus=st.one_of(st.lists(GPU_HEALTH, max_size=4),
                             st.just([agent_pb2.GpuHealth(gpu=0, state=agent_pb2.GPU_HEALTHY)]
                                     * 20_000)))


async def _failed_gpus_stored(r: Rig) -> None:
    """Wait until etcd holds a record for every GPU the controller has as failed (the
    failure records are written behind the reply)."""
    async with asyncio.timeout(5):
        while True:
            gpus = await r.op.ListGpus(operator_pb2.ListGpusRequest(), timeout=5)
            failed = {f"gpus/{g.host}/{g.gpu}" for g in gpus.gpus if g.state == "failed"}
            stored = await r.store.get_prefix_json("gpus/")
            if failed <= set(stored.items):
                return
            await asyncio.sleep(0.01)


@FUZZ
@given(reports=st.lists(HEALTH, min_size=1, max_size=3))
@example(reports=[agent_pb2.HealthReport(host="host2", gpus=[
    agent_pb2.GpuHealth(gpu=0, state=agent_pb2.GPU_DEGRADED),
    agent_pb2.GpuHealth(gpu=7, state=agent_pb2.GPU_HEALTHY)])])
async def test_health_stream_refuses_bad_reports_and_applies_nothing_of_them(
    rig: Rig, reports: list[agent_pb2.HealthReport]
) -> None:
    call = rig.agent.HealthStream(timeout=5)  # type: ignore[call-arg]
    for report in reports:
        before = await view(rig)
        try:
            await call.write(report)
            if await call.read() is not EOF:
                await _failed_gpus_stored(rig)  # accepted: its failure records are stored
                continue
        except grpc.aio.AioRpcError:
            pass
        break  # the stream ended: the report was refused
    else:
        await call.done_writing()
    with contextlib.suppress(grpc.aio.AioRpcError):
        while await call.read() is not EOF:
            pass
    out = Outcome(await call.code(), await call.details() or "")
    check(out, report)
    if out.refused:
        assert await view(rig) == before, (out, report)


# --- OperatorService -------------------------------------------------------------------------

OPERATOR = st.one_of(
    st.just(("GetStatus", operator_pb2.GetStatusRequest())),
    st.just(("ListSwitches", operator_pb2.ListSwitchesRequest())),
    st.just(("ListJobs", operator_pb2.ListJobsRequest())),
    st.just(("ListHosts", operator_pb2.ListHostsRequest())),
    st.just(("ListGpus", operator_pb2.ListGpusRequest())),
    _msg(operator_pb2.ListCircuitsRequest, switch_id=NAME, job_id=NAME).map(
        lambda m: ("ListCircuits", m)),
    _msg(operator_pb2.FailoverRequest, job_id=NAME, rank=st.one_of(SMALL, U32),
         spare_host=st.one_of(st.sampled_from(["host0", "host2", "host3"]), NAME),
         spare_gpu=st.one_of(SMALL, U32), reason=st.text(max_size=20)).map(
        lambda m: ("Failover", m)),
    _msg(operator_pb2.DrainRequest, host=NAME, reason=st.text(max_size=20)).map(
        lambda m: ("Drain", m)),
    _msg(operator_pb2.UndrainRequest, host=NAME).map(lambda m: ("Undrain", m)),
    _msg(operator_pb2.ClearGpuRequest, host=NAME, gpu=st.one_of(SMALL, U32)).map(
        lambda m: ("ClearGpu", m)),
    # maintenance off only: on would stop the rig's later phases from switching
    _msg(operator_pb2.SetMaintenanceRequest, switch_id=NAME, reason=st.text(max_size=20)).map(
        lambda m: ("SetMaintenance", m)),
    _msg(operator_pb2.ListPortsRequest, switch_id=NAME).map(lambda m: ("ListPorts", m)),
)


@FUZZ
@given(call=OPERATOR)
async def test_operator_calls_refuse_bad_input_and_change_nothing(
    rig: Rig, call: tuple[str, Message]
) -> None:
    method, request = call
    before = await view(rig)
    out = await outcome(getattr(rig.op, method)(request, timeout=5))
    check(out, request)
    if out.refused:
        assert await view(rig) == before, (out, request)
    await _failed_gpus_stored(rig)


# --- found by fuzzing ------------------------------------------------------------------------


async def test_found_by_fuzzing_a_schedule_of_four_billion_microbatches(rig: Rig) -> None:
    """RegisterJob with ``parallelism.microbatches`` 2^32-1 derived a schedule of 2^33 layer
    passes on the event loop: the controller stopped answering (and fenced itself when its
    lease went unrenewed). Now refused at once, naming the field and the value."""
    before = await view(rig)
    out = await outcome(rig.agent.RegisterJob(agent_pb2.RegisterJobRequest(
        job_id="j", ranks=FREE[:1],
        parallelism=agent_pb2.ParallelismSpec(microbatches=2**32 - 1)), timeout=5))
    assert out.code is grpc.StatusCode.INVALID_ARGUMENT
    assert out.details.startswith("parallelism.microbatches: 4294967295 microbatches x pp 1 x "
                                  "layers_per_stage 1 = 4294967295 layer passes exceed 16384")
    assert await view(rig) == before


async def test_found_by_fuzzing_a_release_of_a_hundred_thousand_ranks(rig: Rig) -> None:
    """A ReleaseMany of 100,000 ranks was refused rank by rank: 100,000 replies (over gRPC's
    4 MB message limit) built on the event loop, long enough for the leader to fence itself.
    Now refused whole with one error, as an EnterMany of that size is; the stream goes on."""
    call = rig.agent.PhaseStream(timeout=5)  # type: ignore[call-arg]
    await call.write(agent_pb2.PhaseRequestBatch(requests=[
        agent_pb2.PhaseRequest(release_many=agent_pb2.ReleaseMany(
            job_id=JOB, phase_id=0, ranks=range(100_000))), PROBE]))
    replies = await replies_until_probe(call)
    assert [(r.error.code, r.error.message) for r in replies] == [
        (agent_pb2.INVALID_RANK, "release_many.ranks: 100000 ranks in one message, at most 16384")]
    await call.done_writing()
    while await call.read() is not EOF:
        pass
    assert await call.code() is grpc.StatusCode.OK


async def test_found_by_fuzzing_a_health_report_applied_up_to_its_bad_entry(rig: Rig) -> None:
    """A report whose second GPU does not exist was refused only after its first entry was
    applied (host2/gpu0 recorded degraded by a refused request). Now every entry is checked
    first and the refusal names the entry, the field and the value."""
    before = await view(rig)
    call = rig.agent.HealthStream(timeout=5)  # type: ignore[call-arg]
    await call.write(agent_pb2.HealthReport(host="host2", gpus=[
        agent_pb2.GpuHealth(gpu=0, state=agent_pb2.GPU_DEGRADED),
        agent_pb2.GpuHealth(gpu=7, state=agent_pb2.GPU_HEALTHY)]))
    with contextlib.suppress(grpc.aio.AioRpcError):
        while await call.read() is not EOF:
            pass
    assert await call.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert await call.details() == "gpus[1].gpu: 7 is not a GPU of host 'host2' (0..1)"
    assert await view(rig) == before


async def test_found_by_fuzzing_a_refused_hold_was_not_answered(rig: Rig) -> None:
    """A ``HeldPhase`` the controller refused (here: a rank outside the job) was only logged;
    the agent never heard. Now it gets a ``PhaseError`` (request id 0) naming the field."""
    call = rig.agent.PhaseStream(timeout=5)  # type: ignore[call-arg]
    await call.write(agent_pb2.PhaseRequestBatch(requests=[
        agent_pb2.PhaseRequest(held=agent_pb2.HeldPhase(
            job_id=JOB, rank=99, phase=agent_pb2.PhaseKey(
                group_ranks=[0, 99], collective=agent_pb2.ALL_REDUCE))), PROBE]))
    replies = await replies_until_probe(call)
    assert [(r.error.rank, r.error.request_id, r.error.code, r.error.message)
            for r in replies] == [(99, 0, agent_pb2.INVALID_RANK, "held: rank: 99 out of range")]
    await call.done_writing()
    while await call.read() is not EOF:
        pass


async def test_found_by_fuzzing_a_schedule_too_large_to_store(rig: Rig) -> None:
    """RegisterJob with 30,000 declared phases was accepted by the coordinator, then etcd
    refused the 1.8 MB record and the caller got UNAVAILABLE ("state store: ..."): an outage to
    retry, for a request that can never succeed. Now refused as INVALID_ARGUMENT naming the
    field, before anything is stored."""
    before = await view(rig)
    out = await outcome(rig.agent.RegisterJob(agent_pb2.RegisterJobRequest(
        job_id="j", ranks=FREE[:1], declared_phases=[
            agent_pb2.PhaseKey(group_ranks=[0], collective=agent_pb2.ALL_REDUCE, seq=i)
            for i in range(30_000)]), timeout=10))
    assert out.code is grpc.StatusCode.INVALID_ARGUMENT
    assert out.details.startswith("declared_phases: the job's record (1 ranks, 30000 declared "
                                  "phases) takes ")
    assert out.details.endswith("bytes, more than the state store's 1000000")
    assert await view(rig) == before
