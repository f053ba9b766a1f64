"""The controller killed mid-replay and restarted: jobs come back from etcd, cross-connects from
reading the switches back, host agents reconnect and resync their holds, and the replay
finishes with the safety invariant intact across the restart.

The emulated switches live in the test process (``EmulatedFabricDevices``) so their state and
change log outlive the controller, as a real switch's would. The controller is killed by
cancelling its task: no graceful drain, no flush of pending work.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from lightrail.agents.client import ControllerClient
from lightrail.agents.replay.replayer import HostSlot, Replayer
from lightrail.agents.replay.trace.loader import load_workload
from lightrail.controller.app import RunningController, run_controller
from lightrail.controller.cli.drivers import driver_registry
from lightrail.controller.cli.embedded import embedded_config
from lightrail.controller.config import Config, ControllerSection, FabricSection, build_fabric
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.emulator.ocs import EmulatedFabricDevices
from lightrail.emulator.servers.fabric import emulated_rails, rail_section
from tests.invariants import check_holds

DLRM = (Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces"
        / "param-dlrm-8rank" / "dlrm_kineto.tar.gz")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start(cfg: Config, devices: EmulatedFabricDevices
          ) -> tuple[asyncio.Task[None], asyncio.Future[RunningController], asyncio.Event]:
    stop = asyncio.Event()
    started: asyncio.Future[RunningController] = asyncio.get_running_loop().create_future()

    def on_started(rc: RunningController) -> None:
        if not started.done():
            started.set_result(rc)

    task = asyncio.create_task(run_controller(cfg, stop, drivers=driver_registry(devices),
                                              on_started=on_started))
    return task, started, stop


async def test_controller_restart_mid_replay(etcd: EmbeddedEtcd) -> None:
    if not DLRM.exists():
        pytest.skip(f"{DLRM} not present")
    devices = EmulatedFabricDevices()
    # the switches speak TL1 over sockets and outlive the controller, as real ones would
    async with emulated_rails(rail_section("demo-4x2", delay_ms=2), devices, "tl1") as section:
        await restart_mid_replay(etcd, section, devices)


async def restart_mid_replay(
    etcd: EmbeddedEtcd, section: FabricSection, devices: EmulatedFabricDevices
) -> None:
    fabric = build_fabric(section)
    base = embedded_config(etcd.endpoint, section, admission_timeout_s=60.0)
    cfg = base.model_copy(update={"controller": ControllerSection(
        replica_id="ctl-a", listen=f"127.0.0.1:{free_port()}", metrics_listen="127.0.0.1:0",
        admission_timeout_s=60.0, shutdown_timeout_s=5.0)})

    task_a, started_a, _ = start(cfg, devices)
    rc_a = await asyncio.wait_for(started_a, 30)
    hosts = [HostSlot(h.name, tuple(range(h.gpu_count))) for h in fabric.hosts.values()]
    iterations = 6
    replayer = Replayer(load_workload(DLRM), rc_a.grpc_target, hosts, job_id="dlrm",
                        iterations=iterations, time_scale=0.2, timeout_s=60.0)
    two_done = asyncio.Event()
    replayer.on_progress = lambda done, _n: two_done.set() if done >= 2 else None

    async with ControllerClient(rc_a.grpc_target, retry_budget_s=30.0) as client:
        replay = asyncio.create_task(replayer.run(client))
        await asyncio.wait_for(two_done.wait(), 60)
        assert not replay.done()

        task_a.cancel()  # crash: no drain, no goodbye to the agents
        with pytest.raises(asyncio.CancelledError):
            await task_a
        state_at_crash = {sid: dev.cross_connects for sid, dev in devices.items()}

        task_b, started_b, stop_b = start(cfg, devices)
        rc_b = await asyncio.wait_for(started_b, 30)
        coord = rc_b.service.coordinator
        assert coord.job_ids() == ["dlrm"]  # recovered from etcd
        assert coord.job("dlrm").world_size == 8
        for sid in fabric.switches:  # circuits recovered by reading the switches back
            assert coord.confirmed(sid) == state_at_crash[sid]

        report = await asyncio.wait_for(replay, 120)
        stop_b.set()
        await asyncio.wait_for(task_b, 30)

    assert report.iterations == iterations
    assert sum(r.reconfigurations for r in report.rows) > 0
    violations = check_holds(fabric, replayer.placements, replayer.holds,
                             {sid: dev.change_log for sid, dev in devices.items()})
    assert violations == [], violations[:5]
    expected_holds = sum(len(ops) for ops in replayer.ops.values()) * iterations
    assert len(replayer.holds) >= expected_holds  # every collective of every rank admitted
