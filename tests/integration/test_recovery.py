"""After a restart, a recovered job's circuits stay frozen until its ranks resync or a
host-dead verdict releases them; no timer is a go-ahead (issue 10, section 3). Real etcd, real
gRPC: the job is registered by one controller and recovered by the next."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import grpc

from lightrail.agents.client import ControllerClient
from lightrail.controller.cli.embedded import embedded_config, running_controller
from lightrail.controller.config import Config, FabricSection
from lightrail.controller.domain.model import RankPlacement
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.emulator.ocs import EmulatedFabricDevices
from lightrail.v1 import agent_pb2, agent_pb2_grpc

PLACE = [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)]


def config(etcd: EmbeddedEtcd) -> Config:
    cfg = embedded_config(etcd.endpoint, FabricSection.model_validate(
        {"builtin": "demo-4x2", "reconfiguration_delay_ms": 2}))
    return cfg.model_copy(update={"controller": cfg.controller.model_copy(update={
        "recovery_grace_s": 0.5, "heartbeat_interval_s": 0.05, "heartbeat_deadline_s": 0.4})})


async def until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait (polling every 20 ms) until ``predicate()`` is true; fail after ``timeout_s``."""
    for _ in range(int(timeout_s / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not true within {timeout_s} s")


@contextlib.asynccontextmanager
async def heartbeats(target: str, host: str) -> AsyncIterator[None]:
    """``host``'s agent heartbeating (a health report every 50 ms) while the block runs."""
    async with grpc.aio.insecure_channel(target) as ch:
        call = agent_pb2_grpc.AgentServiceStub(ch).HealthStream()  # type: ignore[call-arg]

        async def beat() -> None:
            while True:
                await call.write(agent_pb2.HealthReport(host=host, gpus=[
                    agent_pb2.GpuHealth(gpu=g, state=agent_pb2.GPU_HEALTHY) for g in (0, 1)]))
                await call.read()
                await asyncio.sleep(0.05)

        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            task.cancel()
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await task


async def test_a_recovered_job_thaws_only_by_resync_or_host_dead_verdicts(
    etcd: EmbeddedEtcd, devices: EmulatedFabricDevices
) -> None:
    cfg = config(etcd)
    async with running_controller(cfg, devices=devices) as first, \
            ControllerClient(first.grpc_target, retry_budget_s=2.0) as admin:
        assert await admin.register_job("job", PLACE) == 8
    async with running_controller(cfg, devices=devices) as second:
        coord = second.service.coordinator
        assert coord.recovering("job")
        async with heartbeats(second.grpc_target, "host0"):
            # the restart window passes: host1..3 never came back and are declared dead;
            # host0 is heard from, so its ranks keep the job frozen until they resync
            await until(lambda: coord.unsynced_hosts() == {"host0"})
            await asyncio.sleep(0.6)  # well past the window: the timer unfreezes nothing
            assert coord.recovering("job") and coord.unsynced_hosts() == {"host0"}
        # host0 falls silent: past its heartbeat deadline it is declared dead too
        await until(lambda: not coord.recovering("job"))
