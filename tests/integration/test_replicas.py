"""Three controller replicas against one real etcd, over real gRPC sockets (issue 10, section 2):
one leads; the standbys serve health (NOT_SERVING), /metrics (``lightrail_leader 0``) and
redirect every phase and operator call to the leader, which the CLI, ``ControllerClient`` and
the host agent follow; when the leader stops (in-process) or is SIGKILLed (child processes), a
standby takes over in its running process and the clients reconnect to it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import urllib.request
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from lightrail.agents.client import ControllerClient
from lightrail.agents.errors import ControllerUnavailable
from lightrail.agents.host.agent import HostAgent
from lightrail.agents.host.reporter import HealthReporter
from lightrail.agents.leader import LeaderTargets, redirect_of
from lightrail.controller.api.routing import AGENT_SERVICE, OPERATOR_SERVICE
from lightrail.controller.app import (
    LeadershipLost,
    RunningController,
    ServingReplica,
    run_controller,
)
from lightrail.controller.cli.drivers import driver_registry
from lightrail.controller.cli.embedded import ChildController, embedded_config, spawn_controller
from lightrail.controller.config import Config, FabricSection
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.emulator.gpus import EmulatedHealthSource
from lightrail.emulator.ocs import EmulatedFabricDevices
from lightrail.v1 import operator_pb2, operator_pb2_grpc
from tests.cli_thread import cli_in_thread

PLACE = [RankPlacement(0, "host0", 0), RankPlacement(1, "host1", 0)]
PAIR = PhaseKey(ProcessGroup.of([0, 1]), Collective.SEND_RECV)
WAIT_S = 15.0
"""Bound on each wait for an election outcome (a deadline, not a timing assertion)."""


def replica_config(etcd: EmbeddedEtcd, replica_id: str) -> Config:
    """A replica on OS-chosen loopback ports, demo-4x2 (2 ms delay), the shortest lease."""
    cfg = embedded_config(
        etcd.endpoint,
        FabricSection.model_validate({"builtin": "demo-4x2", "reconfiguration_delay_ms": 2}),
        admission_timeout_s=5.0, replica_id=replica_id)
    return cfg.model_copy(update={
        "etcd": cfg.etcd.model_copy(update={"lease_ttl_s": 2.0}),
        "controller": cfg.controller.model_copy(update={"recovery_grace_s": 1.0}),
    })


@dataclass(frozen=True, slots=True)
class Replica:
    """An in-process replica: where it serves, the future of its leadership, its task."""

    serving: ServingReplica
    leading: asyncio.Future[RunningController]
    stop: asyncio.Event
    task: asyncio.Task[None]


@asynccontextmanager
async def replica(cfg: Config, devices: EmulatedFabricDevices) -> AsyncIterator[Replica]:
    """``run_controller(cfg)`` as a task; yields once it serves (standby or leader)."""
    loop = asyncio.get_running_loop()
    serving: asyncio.Future[ServingReplica] = loop.create_future()
    leading: asyncio.Future[RunningController] = loop.create_future()
    stop = asyncio.Event()
    task = asyncio.create_task(run_controller(
        cfg, stop, drivers=driver_registry(devices), on_serving=serving.set_result,
        on_started=leading.set_result), name=f"replica-{cfg.controller.replica_id}")
    try:
        waitables: set[asyncio.Future[object]] = {serving, task}  # type: ignore[arg-type]
        done, _ = await asyncio.wait(waitables, timeout=WAIT_S,
                                     return_when=asyncio.FIRST_COMPLETED)
        assert serving in done, f"replica {cfg.controller.replica_id} did not serve"
        yield Replica(serving.result(), leading, stop, task)
    finally:
        stop.set()
        with contextlib.suppress(LeadershipLost):  # a test that fences it has checked that
            await asyncio.wait_for(task, 15.0)


async def first_leader(replicas: list[Replica]) -> Replica:
    """The replica whose leadership future resolves first (within ``WAIT_S``)."""
    done, _ = await asyncio.wait({r.leading for r in replicas}, timeout=WAIT_S,
                                 return_when=asyncio.FIRST_COMPLETED)
    assert done, "no replica became the leader"
    return next(r for r in replicas if r.leading in done)


async def health(target: str, service: str) -> int:
    async with grpc.aio.insecure_channel(target) as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5.0)
    return int(resp.status)


async def check_health_and_redirect(leader: str, standbys: list[str]) -> None:
    """Health says SERVING on the leader and NOT_SERVING on each standby (overall and per
    service); a raw operator call to a standby is UNAVAILABLE with the leader's address in
    its details and its trailing metadata."""
    serving, not_serving = (health_pb2.HealthCheckResponse.SERVING,
                            health_pb2.HealthCheckResponse.NOT_SERVING)
    for service in ("", AGENT_SERVICE, OPERATOR_SERVICE):
        assert await health(leader, service) == serving
        for s in standbys:
            assert await health(s, service) == not_serving
    async with grpc.aio.insecure_channel(standbys[0]) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as raw:
            await operator_pb2_grpc.OperatorServiceStub(ch).GetStatus(
                operator_pb2.GetStatusRequest(), timeout=5.0)
    assert raw.value.code() is grpc.StatusCode.UNAVAILABLE
    assert raw.value.details() == f"not the leader; leader is {leader}"
    assert redirect_of(raw.value) == leader  # trailing metadata LEADER_METADATA_KEY


async def until_redirected(standby: str, leader: str) -> None:
    """Return once ``standby`` redirects to ``leader`` (a standby that has not campaigned yet
    names no leader), within ``WAIT_S``."""
    async with grpc.aio.insecure_channel(standby) as ch, asyncio.timeout(WAIT_S):
        stub = operator_pb2_grpc.OperatorServiceStub(ch)
        while True:
            try:
                await stub.GetStatus(operator_pb2.GetStatusRequest(), timeout=5.0)
            except grpc.aio.AioRpcError as exc:
                if redirect_of(exc) == leader:
                    return
            await asyncio.sleep(0.02)


async def until_serving(target: str, service: str) -> None:
    """Return once ``target``'s health for ``service`` says SERVING (its Watch stream), within
    ``WAIT_S``."""
    async with grpc.aio.insecure_channel(target) as ch:
        call = health_pb2_grpc.HealthStub(ch).Watch(
            health_pb2.HealthCheckRequest(service=service), timeout=WAIT_S)
        async for resp in call:
            if resp.status == health_pb2.HealthCheckResponse.SERVING:
                call.cancel()
                return
    raise AssertionError(f"{target}: {service} never SERVING")


async def test_three_replicas_one_leads_standbys_redirect_and_a_standby_takes_over(
    etcd: EmbeddedEtcd, devices: EmulatedFabricDevices
) -> None:
    async with AsyncExitStack() as stack:
        replicas = [await stack.enter_async_context(
            replica(replica_config(etcd, f"r{i}"), devices)) for i in range(3)]
        leader = await first_leader(replicas)
        standbys = [r for r in replicas if r is not leader]
        lead_addr = leader.serving.advertise
        assert not any(s.leading.done() for s in standbys)  # exactly one leads

        # the leader's address is published in etcd, in the leader key
        async with EtcdStore.connect(etcd.endpoint) as store:
            kv = await store.get("leader")
        assert kv is not None
        assert kv.value == {"replica_id": leader.serving.replica_id, "address": lead_addr}

        for s in standbys:  # each standby learns the leader from its own campaign attempt
            await until_redirected(s.serving.grpc_target, lead_addr)
        await check_health_and_redirect(lead_addr, [s.serving.grpc_target for s in standbys])

        # the CLI pointed at a standby prints the leader's answer
        rc, out, _ = await cli_in_thread("status", "--controller", standbys[0].serving.grpc_target,
                               "--json")
        assert rc == 0
        status = json.loads(out)
        assert status["replica_id"] == leader.serving.replica_id
        assert status["leader"] is True

        # clients given every address, a standby first, reach the leader
        addresses = ",".join(r.serving.grpc_target
                             for r in (standbys[0], leader, standbys[1]))
        admin = await stack.enter_async_context(ControllerClient(addresses, retry_budget_s=10.0))
        assert await admin.register_job("job", PLACE) == 2
        assert admin.leader == lead_addr
        agents = [await stack.enter_async_context(HostAgent(f"host{h}", addresses,
                                                            reconnect_budget_s=20.0))
                  for h in range(2)]
        adms = await asyncio.gather(*(agents[r].enter("job", r, PAIR, 0, 5.0) for r in (0, 1)))
        assert any(not a.noop for a in adms)  # the leader switched the circuits
        assert all(a.connected_to == lead_addr for a in agents)
        assert agents[0].redirects >= 1  # it was sent to the standby first
        for r in (0, 1):
            agents[r].release("job", r, PAIR)

        # the leader stops: a standby takes over in its running process
        leader.stop.set()
        await asyncio.wait_for(leader.task, 15.0)
        successor = await first_leader(standbys)
        new_addr = successor.serving.advertise
        assert await health(new_addr, AGENT_SERVICE) == health_pb2.HealthCheckResponse.SERVING
        # the agents reconnect to it, resync, and it admits the next phase (the job was
        # recovered from etcd)
        again = PhaseKey(PAIR.group, PAIR.collective, seq=1)
        adms = await asyncio.gather(*(agents[r].enter("job", r, again, 0, 5.0) for r in (0, 1)))
        assert len(adms) == 2
        assert all(a.connected_to == new_addr for a in agents)
        rc, out, _ = await cli_in_thread("status", "--controller", addresses, "--json")
        assert rc == 0
        assert json.loads(out)["replica_id"] == successor.serving.replica_id
        jobs = [j.job_id for j in (await admin_list_jobs(admin_addresses=addresses)).jobs]
        assert jobs == ["job"]
        assert admin.leader != new_addr  # not called since the takeover
        await admin.unregister_job("job")  # follows the takeover too
        assert admin.leader == new_addr


async def admin_list_jobs(admin_addresses: str) -> operator_pb2.ListJobsResponse:
    """ListJobs on the leader among ``admin_addresses``."""

    async def attempt(address: str) -> operator_pb2.ListJobsResponse:
        async with grpc.aio.insecure_channel(address) as ch:
            resp: operator_pb2.ListJobsResponse = await operator_pb2_grpc.OperatorServiceStub(
                ch).ListJobs(operator_pb2.ListJobsRequest(), timeout=5.0)
            return resp

    return await LeaderTargets(admin_addresses).call(attempt)


def scrape(url: str) -> dict[str, float]:
    """Sample name -> value of a /metrics page (unlabelled samples)."""
    with urllib.request.urlopen(url, timeout=5.0) as resp:
        text = resp.read().decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if not s.labels}


async def leader_record(etcd: EmbeddedEtcd, other_than: str | None = None) -> dict[str, str]:
    """The leader key's value, once it names a replica other than ``other_than`` (polled
    until ``WAIT_S``: an election outcome, not a timing assertion)."""
    async with EtcdStore.connect(etcd.endpoint) as store:
        async with asyncio.timeout(WAIT_S):
            while True:
                kv = await store.get("leader")
                if kv is not None and isinstance(kv.value, dict) \
                        and kv.value["replica_id"] != other_than:
                    return {str(k): str(v) for k, v in kv.value.items()}
                await asyncio.sleep(0.05)


async def test_replica_processes_standby_metrics_and_takeover_after_sigkill(
    etcd: EmbeddedEtcd,
) -> None:
    async with AsyncExitStack() as stack:
        children: dict[str, ChildController] = {}
        for i in range(3):
            rid = f"p{i}"
            children[rid] = await stack.enter_async_context(spawn_controller(
                replica_config(etcd, rid), announce="serving"))
        first = await leader_record(etcd)
        leader = children[first["replica_id"]]
        assert first["address"] == leader.grpc_target
        standbys = {rid: c for rid, c in children.items() if c is not leader}

        # /metrics on every replica; a standby says it does not lead, with process metrics
        for c in standbys.values():
            samples = scrape(c.metrics_url)
            assert samples["lightrail_leader"] == 0
            assert samples["process_resident_memory_bytes"] > 0
        # the leader's gauge is set before it serves phase calls: wait for its health
        await until_serving(leader.grpc_target, AGENT_SERVICE)
        assert scrape(leader.metrics_url)["lightrail_leader"] == 1

        # a health reporter and a ControllerClient given every address (the leader last)
        addresses = ",".join([*(c.grpc_target for c in standbys.values()), leader.grpc_target])
        source = EmulatedHealthSource("host0", 2)
        reporter = HealthReporter(source, addresses, interval_s=0.2)
        link = asyncio.create_task(reporter.run(), name="reporter")
        stack.callback(link.cancel)
        await asyncio.wait_for(reporter.acked.wait(), WAIT_S)
        assert reporter.connected_to == leader.grpc_target
        admin = await stack.enter_async_context(ControllerClient(addresses, retry_budget_s=15.0))
        assert await admin.register_job("job", PLACE) == 2

        # SIGKILL the leader: its lease expires, a standby takes over
        os.kill(leader.pid, signal.SIGKILL)
        second = await leader_record(etcd, other_than=first["replica_id"])
        successor = children[second["replica_id"]]
        assert second["address"] == successor.grpc_target
        # the client reconnects to it: the job it registered was recovered from etcd
        await admin.unregister_job("job")
        assert admin.leader == successor.grpc_target
        reporter.acked.clear()
        await asyncio.wait_for(reporter.acked.wait(), WAIT_S)
        assert reporter.connected_to == successor.grpc_target
        assert scrape(successor.metrics_url)["lightrail_leader"] == 1
        rc, out, _ = await cli_in_thread("status", "--controller", addresses, "--json")
        assert rc == 0
        assert json.loads(out)["replica_id"] == second["replica_id"]
        rc, _, err = await cli_in_thread("status", "--controller", leader.grpc_target)
        assert rc == 1  # the killed one alone: no leader, one line naming it
        assert err.startswith(f"lightrail status: no controller replica leads: tried "
                              f"{leader.grpc_target} (UNAVAILABLE: ")
        assert err.count("\n") == 1


async def test_a_fenced_leader_exits_with_leadership_lost_and_a_standby_takes_over(
    etcd: EmbeddedEtcd, devices: EmulatedFabricDevices
) -> None:
    """The leader key deleted under the leader (as when etcd expires its lease): it fences
    itself, steps down and ``run_controller`` raises ``LeadershipLost`` (``lightrail
    controller`` exits 4); the standby, watching the key, leads in its running process."""
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(replica(replica_config(etcd, "f0"), devices))
        await asyncio.wait_for(asyncio.shield(first.leading), WAIT_S)
        second = await stack.enter_async_context(replica(replica_config(etcd, "f1"), devices))
        await until_redirected(second.serving.grpc_target, first.serving.advertise)
        addresses = f"{first.serving.grpc_target},{second.serving.grpc_target}"
        admin = await stack.enter_async_context(ControllerClient(addresses, retry_budget_s=10.0))
        assert await admin.register_job("job", PLACE) == 2
        assert admin.leader == first.serving.advertise

        async with EtcdStore.connect(etcd.endpoint) as store:
            assert await store.delete("leader")
        with pytest.raises(LeadershipLost, match="fenced"):
            await asyncio.wait_for(asyncio.shield(first.task), WAIT_S)
        await asyncio.wait_for(asyncio.shield(second.leading), WAIT_S)
        await admin.unregister_job("job")  # the job was recovered by the new leader
        assert admin.leader == second.serving.advertise


def dead_address() -> str:
    """A loopback address nothing listens on (a port the OS just handed out, closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def test_no_leader_reachable_names_every_address_tried() -> None:
    addresses = [dead_address(), dead_address()]
    async with ControllerClient(",".join(addresses), retry_budget_s=0.3) as client:
        with pytest.raises(ControllerUnavailable) as info:
            await client.register_job("job", PLACE)
    for a in addresses:
        assert f"{a} (UNAVAILABLE: " in str(info.value)
    async with HostAgent("host0", addresses, reconnect_budget_s=0.3,
                         backoff_max_s=0.1) as agent:
        with pytest.raises(ControllerUnavailable) as info:
            await agent.enter("job", 0, PAIR, 0, 5.0)  # the budget ends it, not this
    message = str(info.value)
    assert message.startswith(f"not_leader: no controller leader reached at {','.join(addresses)}")
    for a in addresses:
        assert f"{a} (UNAVAILABLE: " in message
