"""The controller killed mid-replay and restarted: jobs come back from etcd, cross-connects from
reading the switches back, host agents reconnect and resync their holds, and the replay
finishes with the safety invariant intact across the restart.

Everything runs as it would in production, each part in its own process: etcd, the emulated
switches (``lightrail emulate``, TL1 over sockets: their state and change log outlive the
controller, as a real switch's would) and the controller daemon, which is killed with SIGKILL:
no drain, no lease resign, no flush of pending work. The replacement waits for the dead
replica's leader lease to expire before it leads.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

import grpc
import pytest

from lightrail.agents.client import ControllerClient
from lightrail.agents.replay.replayer import HostSlot, Replayer
from lightrail.agents.replay.trace.loader import load_workload
from lightrail.controller.cli.embedded import embedded_config, spawn_controller, spawn_emulator
from lightrail.controller.config import ControllerSection, build_fabric
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.drivers.base import CrossConnect
from lightrail.emulator.control import ControlClient
from lightrail.emulator.servers.fabric import rail_section
from lightrail.v1 import operator_pb2, operator_pb2_grpc
from tests.invariants import check_holds

DLRM = (Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces"
        / "param-dlrm-8rank" / "dlrm_kineto.tar.gz")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def circuits(target: str) -> dict[str, frozenset[CrossConnect]]:
    """The controller's view of every switch's cross-connects (operator ListCircuits)."""
    # wait_for_ready: gRPC shares one subchannel per address in the process, and the agents'
    # attempts during the outage left it in reconnect backoff ("connection refused")
    async with grpc.aio.insecure_channel(target) as channel:
        reply = await operator_pb2_grpc.OperatorServiceStub(channel).ListCircuits(
            operator_pb2.ListCircuitsRequest(), timeout=10, wait_for_ready=True)
    out: dict[str, set[CrossConnect]] = {}
    for x in reply.cross_connects:
        out.setdefault(x.switch_id, set()).add(CrossConnect(x.ingress, x.egress))
    return {sid: frozenset(xs) for sid, xs in out.items()}


async def test_controller_process_killed_mid_replay(etcd: EmbeddedEtcd) -> None:
    if not DLRM.exists():
        pytest.skip(f"{DLRM} not present")
    section = rail_section("demo-4x2", delay_ms=2)
    fabric = build_fabric(section)
    async with spawn_emulator(section) as emulator, ControlClient(emulator.control_url) as ctl:
        base = embedded_config(etcd.endpoint, emulator.section, admission_timeout_s=60.0)
        cfg = base.model_copy(update={"controller": ControllerSection(
            replica_id="ctl-a", listen=f"127.0.0.1:{free_port()}",
            metrics_listen="127.0.0.1:0", admission_timeout_s=60.0, shutdown_timeout_s=5.0)})
        hosts = [HostSlot(h.name, tuple(range(h.gpu_count))) for h in fabric.hosts.values()]
        iterations = 6
        target = cfg.controller.listen
        replayer = Replayer(load_workload(DLRM), target, hosts, job_id="dlrm",
                            iterations=iterations, time_scale=0.2, timeout_s=60.0)
        two_done = asyncio.Event()
        replayer.on_progress = lambda done, _n: two_done.set() if done >= 2 else None

        async with spawn_controller(cfg) as child_a:
            client = ControllerClient(target, retry_budget_s=30.0)
            replay = asyncio.create_task(replayer.run(client))
            await asyncio.wait_for(two_done.wait(), 60)
            assert not replay.done()
            os.kill(child_a.pid, signal.SIGKILL)  # crash: no drain, no goodbye to the agents
        state_at_crash = {d.switch_id: (await ctl.device(d.switch_id)).cross_connects
                          for d in await ctl.devices()}
        assert any(state_at_crash.values())  # the devices kept their circuits

        changes_at_crash = sum(d.change_count for d in await ctl.devices())
        async with spawn_controller(cfg) as child_b:
            assert child_b.grpc_target.endswith(target.rsplit(":", 1)[1])
            # circuits recovered by reading the switches back: while the devices have not
            # changed since the crash (the resynced job may switch them soon after), the new
            # controller's view is what they hold
            recovered = await circuits(target)
            if sum(d.change_count for d in await ctl.devices()) == changes_at_crash:
                for sid in fabric.switches:
                    assert recovered.get(sid, frozenset()) == state_at_crash[sid]
            report = await asyncio.wait_for(replay, 120)
            await client.close()
        logs = await ctl.change_logs()

    assert report.iterations == iterations
    assert sum(r.reconfigurations for r in report.rows) > 0
    violations = check_holds(fabric, replayer.placements, replayer.holds, logs)
    assert violations == [], violations[:5]
    expected_holds = sum(len(ops) for ops in replayer.ops.values()) * iterations
    assert len(replayer.holds) >= expected_holds  # every collective of every rank admitted
