"""Failover over real gRPC and etcd: manual failover, missed heartbeats, a fatal XID reported
twice, no spare, and the job library seeing the new placement."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from lightrail.agents.client import ControllerClient
from lightrail.agents.errors import PlacementChanged
from lightrail.controller.app import RunningController
from lightrail.controller.cli.embedded import embedded_config, running_controller
from lightrail.controller.config import FabricSection
from lightrail.controller.domain.events import JobEventKind
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.drivers.base import CrossConnect
from lightrail.emulator.ocs import EmulatedFabricDevices
from lightrail.v1 import agent_pb2, agent_pb2_grpc, operator_pb2, operator_pb2_grpc

PLACE = [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)]
RING = PhaseKey(ProcessGroup.of(range(8)), Collective.ALL_REDUCE)
N = 5  # 4 job hosts + 1 spare host per rail


def xc(a: int, b: int) -> CrossConnect:
    return CrossConnect(a + 1, N + b + 1)


@pytest_asyncio.fixture
async def ctl(etcd: EmbeddedEtcd, devices: EmulatedFabricDevices
              ) -> AsyncIterator[RunningController]:
    cfg = embedded_config(etcd.endpoint, FabricSection.model_validate(
        {"rail": {"hosts": 4, "gpus_per_host": 2, "spares": 1}, "reconfiguration_delay_ms": 2}))
    cfg = cfg.model_copy(update={"controller": cfg.controller.model_copy(update={
        "heartbeat_interval_s": 0.05, "heartbeat_deadline_s": 0.3})})
    async with running_controller(cfg, devices=devices) as rc:
        yield rc


async def start_ring(client: ControllerClient) -> None:
    await client.register_job("job", PLACE)
    await asyncio.gather(*(client.enter("job", r, RING, timeout_s=5) for r in range(8)))


async def next_event(events: AsyncIterator[object], kind: JobEventKind) -> object:
    async def find() -> object:
        async for ev in events:
            if getattr(ev, "kind", None) is kind:
                return ev
        raise AssertionError("event stream ended")
    return await asyncio.wait_for(find(), 10)


async def test_manual_failover_moves_circuits_and_tells_the_job(
    ctl: RunningController, devices: EmulatedFabricDevices, etcd: EmbeddedEtcd
) -> None:
    async with ControllerClient(ctl.grpc_target) as client:
        await start_ring(client)
        events = client.watch("job")
        placement = asyncio.ensure_future(next_event(events, JobEventKind.PLACEMENT_CHANGED))
        await asyncio.sleep(0)
        for r in range(8):
            await client.release_phase("job", r, RING)
        # rank 1 (host0 gpu1) moves to the spare host4, same rail (gpu1)
        async with grpc.aio.insecure_channel(ctl.grpc_target) as ch:
            op = operator_pb2_grpc.OperatorServiceStub(ch)
            resp = await op.Failover(operator_pb2.FailoverRequest(job_id="job", rank=1,
                                                                   reason="test"))
            assert (resp.from_host, resp.from_gpu, resp.to_host, resp.to_gpu) == (
                "host0", 1, "host4", 1)
            assert 0 <= resp.planned_s <= resp.device_confirmed_s <= resp.job_notified_s
            gpus = await op.ListGpus(operator_pb2.ListGpusRequest())
            by = {(g.host, g.gpu): g for g in gpus.gpus}
            assert by[("host4", 1)].job_id == "job" and by[("host4", 1)].rank == 1
            assert not by[("host0", 1)].has_rank
        ev = await placement
        assert "host4/gpu1" in getattr(ev, "message", "")
        # rail 1's ring now runs through host4 instead of host0
        assert devices["ocs-rail1"].cross_connects == {xc(4, 1), xc(1, 2), xc(2, 3), xc(3, 4)}
        assert devices["ocs-rail0"].cross_connects == {xc(i, (i + 1) % 4) for i in range(4)}
        async with EtcdStore.connect(etcd.endpoint) as store:
            rec = await store.get_json("jobs/job")
        assert isinstance(rec, dict) and [1, "host4", 1] in rec["ranks"]
        await events.aclose()  # type: ignore[attr-defined]


async def test_missed_heartbeats_fail_the_host_over(
    ctl: RunningController, devices: EmulatedFabricDevices
) -> None:
    async with ControllerClient(ctl.grpc_target) as client:
        await start_ring(client)
        for r in (4, 6):
            await client.release_phase("job", r, RING)
        # rank 4 waits for the next phase (its peers hold the ring) when host2 goes silent
        waiting = asyncio.ensure_future(client.enter(
            "job", 4, PhaseKey(ProcessGroup.of([4, 6]), Collective.SEND_RECV, 1), timeout_s=30))
        async with grpc.aio.insecure_channel(ctl.grpc_target) as ch:
            stub = agent_pb2_grpc.AgentServiceStub(ch)
            call = stub.HealthStream()  # type: ignore[call-arg]
            await call.write(agent_pb2.HealthReport(host="host2", gpus=[
                agent_pb2.GpuHealth(gpu=0, state=agent_pb2.GPU_HEALTHY),
                agent_pb2.GpuHealth(gpu=1, state=agent_pb2.GPU_HEALTHY)]))
            ack = await call.read()
            assert isinstance(ack, agent_pb2.HealthAck)
            assert ack.heartbeat_interval_s == pytest.approx(0.05)
            # ... and then nothing: the watchdog fails both GPUs of host2 over
            with pytest.raises(PlacementChanged):
                await asyncio.wait_for(waiting, 10)
            call.cancel()
        coord = ctl.service.coordinator
        for _ in range(200):
            if {coord.job("job").placements[r].host for r in (4, 5)} == {"host4"}:
                break
            await asyncio.sleep(0.01)
        assert coord.job("job").placements[4] == RankPlacement(4, "host4", 0)
        assert coord.job("job").placements[5] == RankPlacement(5, "host4", 1)


async def test_fatal_xid_reported_twice_fails_over_once_and_no_spare_is_clear(
    ctl: RunningController,
) -> None:
    async with ControllerClient(ctl.grpc_target) as client:
        await start_ring(client)
        async with grpc.aio.insecure_channel(ctl.grpc_target) as ch:
            stub = agent_pb2_grpc.AgentServiceStub(ch)
            call = stub.HealthStream()  # type: ignore[call-arg]
            lost = agent_pb2.GpuHealth(gpu=0, state=agent_pb2.GPU_FAILED, reason="lost",
                                       xid=79, has_xid=True)
            for _ in range(2):  # kernel message and XID 79: one failure
                await call.write(agent_pb2.HealthReport(host="host1", gpus=[lost]))
                ack = await call.read()
            assert isinstance(ack, agent_pb2.HealthAck)
            assert list(ack.failed_gpus) == [0]
            coord = ctl.service.coordinator
            for _ in range(300):
                if coord.job("job").placements[2].host == "host4":
                    break
                await asyncio.sleep(0.01)
            assert coord.job("job").placements[2] == RankPlacement(2, "host4", 0)
            # a second failure on rail 0 finds no spare: a clear state, the daemon goes on
            await call.write(agent_pb2.HealthReport(host="host2", gpus=[lost]))
            await call.read()
            op = operator_pb2_grpc.OperatorServiceStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await op.Failover(operator_pb2.FailoverRequest(job_id="job", rank=0))
            assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "in use or unhealthy" in (e.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as e2:  # wrong switch refused
                await op.Failover(operator_pb2.FailoverRequest(
                    job_id="job", rank=6, spare_host="host4", spare_gpu=1))
            assert e2.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            call.cancel()


async def test_host_agent_health_reporter_drives_failover(ctl: RunningController) -> None:
    """The agent side: an emulated health source behind a HealthReporter; an XID 79 on it
    fails the rank over, and a stopped heartbeat is noticed by the watchdog."""
    from lightrail.agents.host.health import GpuId, HealthState
    from lightrail.agents.host.reporter import HealthReporter
    from lightrail.emulator.gpus import EmulatedHealthSource

    async with ControllerClient(ctl.grpc_target) as client:
        await start_ring(client)
        src1 = EmulatedHealthSource("host1", 2)
        src2 = EmulatedHealthSource("host2", 2)
        reporters = [HealthReporter(s, ctl.grpc_target, interval_s=0.05) for s in (src1, src2)]
        tasks = [asyncio.create_task(r.run()) for r in reporters]
        try:
            for r in reporters:
                await asyncio.wait_for(r.acked.wait(), 10)
            src1.fail(0)  # XID 79
            coord = ctl.service.coordinator
            for _ in range(500):
                if coord.job("job").placements[2].host == "host4":
                    break
                await asyncio.sleep(0.01)
            assert coord.job("job").placements[2] == RankPlacement(2, "host4", 0)
            # the agent restarts and reports the GPU healthy: the controller's record wins
            tasks[0].cancel()
            restarted = EmulatedHealthSource("host1", 2)
            again = HealthReporter(restarted, ctl.grpc_target, interval_s=0.05)
            tasks.append(asyncio.create_task(again.run()))
            await asyncio.wait_for(again.acked.wait(), 10)
            assert restarted.snapshot()[GpuId("host1", 0)].state is HealthState.FAILED
            assert restarted.snapshot()[GpuId("host1", 1)].state is HealthState.HEALTHY
            src2.stop_heartbeat()  # host2 goes silent: ranks 4 and 5 move (rank 4 to host4)
            for _ in range(500):
                if coord.job("job").placements[5].host != "host2":
                    break
                await asyncio.sleep(0.01)
            assert coord.job("job").placements[5] == RankPlacement(5, "host4", 1)
        finally:
            for t in tasks:
                t.cancel()


async def test_presence_lease_and_failure_records_live_in_etcd(
    ctl: RunningController, etcd: EmbeddedEtcd
) -> None:
    async with grpc.aio.insecure_channel(ctl.grpc_target) as ch, \
            EtcdStore.connect(etcd.endpoint) as store:
        call = agent_pb2_grpc.AgentServiceStub(ch).HealthStream()  # type: ignore[call-arg]
        await call.write(agent_pb2.HealthReport(host="host3", gpus=[agent_pb2.GpuHealth(
            gpu=1, state=agent_pb2.GPU_FAILED, reason="uncontained ECC", xid=95,
            has_xid=True)]))
        await call.read()
        presence = await store.get("hosts/host3/presence")
        assert presence is not None and presence.lease_id is not None  # held by a lease
        record = None
        for _ in range(300):  # the coalescing writer stores it shortly after
            record = await store.get_json("gpus/host3/1")
            if record is not None:
                break
            await asyncio.sleep(0.01)
        assert isinstance(record, dict) and record["state"] == "failed"
        assert "XID 95" in record["reason"]
        call.cancel()
        for _ in range(300):  # the stream ended: its lease and the presence key go
            if await store.get("hosts/host3/presence") is None:
                break
            await asyncio.sleep(0.01)
        assert await store.get("hosts/host3/presence") is None


async def test_failure_during_a_reconfiguration_waits_for_it(
    ctl: RunningController, devices: EmulatedFabricDevices
) -> None:
    """The failed GPU's ports are being switched when it fails: the failover waits for that
    reconfiguration to settle (no rewire on ports in flight), then moves the rank."""
    async with ControllerClient(ctl.grpc_target) as client:
        await client.register_job("job", PLACE)
        devices["ocs-rail0"].set_extra_delay(0.2)  # the ring's switch takes a while
        before = devices["ocs-rail0"].command_count
        ring = asyncio.gather(*(client.enter("job", r, RING, timeout_s=10) for r in range(8)),
                              return_exceptions=True)
        async with asyncio.timeout(5):  # the switch has started (every rank is in the ring)
            # (the emulated device has no event for "a command arrived": poll its counter)
            while devices["ocs-rail0"].command_count == before:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        async with grpc.aio.insecure_channel(ctl.grpc_target) as ch:
            call = agent_pb2_grpc.AgentServiceStub(ch).HealthStream()  # type: ignore[call-arg]
            events = client.watch("job")
            moved = asyncio.ensure_future(next_event(events, JobEventKind.PLACEMENT_CHANGED))
            await call.write(agent_pb2.HealthReport(host="host1", gpus=[agent_pb2.GpuHealth(
                gpu=0, state=agent_pb2.GPU_FAILED, xid=79, has_xid=True)]))
            await call.read()
            ev = await moved
            assert "host4/gpu0" in getattr(ev, "message", "")
            call.cancel()
            await events.aclose()  # type: ignore[attr-defined]
        await ring
    assert ctl.service.coordinator.job("job").placements[2] == RankPlacement(2, "host4", 0)
    # the moved ring is what the switch holds: the spare host4 took host1's place on rail 0
    assert any(x.ingress == 5 for x in devices["ocs-rail0"].cross_connects)
