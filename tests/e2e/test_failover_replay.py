"""A GPU fails mid-replay: the controller rewires a spare host into the job's circuits and the
job goes on from its checkpoint, with the safety invariant intact before and after. The rails
are TL1 switches in their own process (``lightrail emulate``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from lightrail.agents.client import ControllerClient
from lightrail.agents.replay.replayer import HostSlot, Replayer
from lightrail.agents.replay.trace.loader import load_workload
from lightrail.controller.cli.embedded import embedded_config, running_controller, spawn_emulator
from lightrail.controller.config import FabricSection, build_fabric
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.emulator.control import ControlClient
from lightrail.v1 import agent_pb2, agent_pb2_grpc
from tests.invariants import check_holds

DLRM = (Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces"
        / "param-dlrm-8rank" / "dlrm_kineto.tar.gz")


async def test_gpu_failure_mid_replay_goes_on_with_the_spare(etcd: EmbeddedEtcd) -> None:
    if not DLRM.exists():
        pytest.skip(f"{DLRM} not present")
    import grpc

    section = FabricSection.model_validate(
        {"rail": {"hosts": 4, "gpus_per_host": 2, "spares": 1}, "reconfiguration_delay_ms": 2})
    fabric = build_fabric(section)
    async with spawn_emulator(section) as emulator:
        cfg = embedded_config(etcd.endpoint, emulator.section, admission_timeout_s=60.0)
        # the test's health stream reports once and then stays quiet: a long heartbeat deadline
        # keeps that silence from failing host1's other GPU while the replay runs on
        cfg = cfg.model_copy(update={"controller": cfg.controller.model_copy(
            update={"heartbeat_deadline_s": 600.0})})
        async with running_controller(cfg) as rc, ControlClient(emulator.control_url) as control:
            hosts = [HostSlot(h.name, tuple(range(h.gpu_count)))
                     for h in fabric.hosts.values() if not h.spare]
            replayer = Replayer(load_workload(DLRM), rc.grpc_target, hosts, job_id="dlrm",
                                iterations=4, time_scale=0.2, timeout_s=60.0)
            two = asyncio.Event()
            replayer.on_progress = lambda done, _n: two.set() if done >= 2 else None
            async with ControllerClient(rc.grpc_target) as client:
                run = asyncio.create_task(replayer.run(client))
                await asyncio.wait_for(two.wait(), 60)
                injected_at = time.monotonic()
                async with grpc.aio.insecure_channel(rc.grpc_target) as ch:
                    call = agent_pb2_grpc.AgentServiceStub(ch).HealthStream()  # type: ignore[call-arg]
                    await call.write(agent_pb2.HealthReport(host="host1", gpus=[agent_pb2.GpuHealth(
                        gpu=0, state=agent_pb2.GPU_FAILED, xid=79, has_xid=True)]))
                    await call.read()
                    report = await asyncio.wait_for(run, 120)
                    call.cancel()
            rail0 = (await control.device("ocs-rail0")).cross_connects or frozenset()
            logs = await control.change_logs()
    assert report.iterations == 4 and replayer.restarts == 1
    assert replayer.placements[2].host == "host4"  # rank 2 (host1/gpu0) now on the spare
    assert len(replayer.placement_history) == 2
    assert any(x.ingress == 5 or x.egress == 10 for x in rail0)
    # holds of the aborted attempt that outlived the failure were voided by it (documented)
    holds = [h for h in replayer.holds if h.attempt > 0 or h.released_s <= injected_at]
    assert any(h.attempt == 1 for h in holds)
    violations = check_holds(fabric, replayer.placement_history, holds, logs)
    assert violations == [], violations[:5]
