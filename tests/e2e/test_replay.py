"""End to end: every recorded input in ../shared/data replayed through the controller (real
etcd, real gRPC, host agents with one PhaseStream each) on emulated rails served by their own
process (``lightrail emulate``, TL1 over sockets), then the safety invariant checked on the
switches' change logs (read through the emulator's control API): no cross-connect changed while
a rank held it, no admission before the switch had made it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lightrail.agents.client import ControllerClient
from lightrail.agents.replay.replayer import HostSlot, Replayer, ReplayReport
from lightrail.agents.replay.trace.loader import load_workload
from lightrail.controller.cli.embedded import embedded_config, running_controller, spawn_emulator
from lightrail.controller.config import FabricSection, build_fabric
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.emulator.control import ControlClient
from lightrail.emulator.servers.fabric import rail_section
from tests.invariants import check_holds

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"

CASES = [
    # (file, fabric, iterations, max ops per rank)
    ("traces/param-dlrm-8rank/dlrm_kineto.tar.gz", "demo-4x2", 2, None),
    ("traces/hta-nccl/nccl_data.json.gz", "demo-4x2", 2, None),
    ("workloads/aicb/L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1.csv", "rail-16x8", 1, None),
    ("workloads/aicb/L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1_A100.txt", "rail-16x8", 1, None),
    # 823 all-gathers over 128 ranks per iteration: a prefix keeps the suite fast
    ("workloads/aicb/L13B-D1-C04_Llama13B_zero3_mbs1.csv", "rail-16x8", 1, 40),
]


async def replay_checked(
    etcd: EmbeddedEtcd, path: Path, fabric_name: str, iterations: int, max_ops: int | None,
    delay_ms: float = 1.0,
) -> tuple[ReplayReport, Replayer]:
    section = rail_section(fabric_name, delay_ms=delay_ms)
    fabric = build_fabric(section)
    workload = load_workload(path)
    # the rails are emulated Polatis switches in their own process, driven over TL1 sockets
    async with spawn_emulator(section) as emulator, ControlClient(
            emulator.control_url) as control, running_controller(
            embedded_config(etcd.endpoint, emulator.section, admission_timeout_s=60.0)) as rc:
        hosts = [HostSlot(h.name, tuple(range(h.gpu_count))) for h in fabric.hosts.values()]
        replayer = Replayer(workload, rc.grpc_target, hosts, job_id="e2e",
                            iterations=iterations, time_scale=0.0, timeout_s=60.0,
                            max_ops=max_ops)
        async with ControllerClient(rc.grpc_target) as client:
            report = await replayer.run(client)
        logs = await control.change_logs()
    violations = check_holds(fabric, replayer.placements, replayer.holds, logs)
    assert violations == [], violations[:5]
    return report, replayer


@pytest.mark.parametrize(("name", "fabric", "iterations", "max_ops"), CASES,
                         ids=[c[0].rsplit("/", 1)[-1] for c in CASES])
async def test_replay_keeps_the_safety_invariant(
    etcd: EmbeddedEtcd, name: str, fabric: str, iterations: int, max_ops: int | None
) -> None:
    path = DATA / name
    if not path.exists():
        pytest.skip(f"{path} not present (shared data lives beside the repository)")
    report, replayer = await replay_checked(etcd, path, fabric, iterations, max_ops)
    assert report.iterations == iterations
    assert replayer.holds, "no phase went through the controller"
    switched = sum(r.reconfigurations for r in report.rows)
    assert switched >= 1, report.rows
    # every multi-host phase instance was admitted for every rank of its group
    counted = sum(r.count for r in report.rows)
    assert counted > 0
    if "dlrm" in name:
        assert {r.phase for r in report.rows} == {"all_reduce x8", "all_to_all x8"}
        assert any("world group of 8 ranks is assumed" in n for n in report.notes)
    if "hta" in name:
        assert any("same sequence as rank 0" in n for n in report.notes)
    if "tp2" in name:
        assert report.scale_up_ops > 0  # TP pairs stay on NVLink inside a host


async def test_two_jobs_on_disjoint_ports_never_touch_each_other(etcd: EmbeddedEtcd) -> None:
    path = DATA / "traces/param-dlrm-8rank/dlrm_kineto.tar.gz"
    if not path.exists():
        pytest.skip(f"{path} not present")
    section = FabricSection.model_validate(
        {"rail": {"hosts": 8, "gpus_per_host": 2}, "reconfiguration_delay_ms": 1})
    fabric = build_fabric(section)
    workload = load_workload(path)
    halves = [[f"host{i}" for i in range(4)], [f"host{i}" for i in range(4, 8)]]
    async with spawn_emulator(section) as emulator, ControlClient(
            emulator.control_url) as control, running_controller(
            embedded_config(etcd.endpoint, emulator.section, admission_timeout_s=60.0)) as rc:
        replayers = [
            Replayer(workload, rc.grpc_target, [HostSlot(h, (0, 1)) for h in hosts],
                     job_id=f"job{k}", iterations=2, time_scale=0.0, timeout_s=60.0)
            for k, hosts in enumerate(halves)
        ]
        async with ControllerClient(rc.grpc_target) as client:
            reports = await asyncio.gather(*(r.run(client) for r in replayers))
        logs = await control.change_logs()
    owned: list[set[tuple[str, int]]] = []
    for r in replayers:
        assert check_holds(fabric, r.placements, r.holds, logs) == []
        ports: set[tuple[str, int]] = set()
        for p in r.placements:
            ep = fabric.endpoint_of_gpu(p.host, p.gpu)
            ports |= {(ep.switch_id, ep.tx_port), (ep.switch_id, ep.rx_port)}
        owned.append(ports)
    assert not owned[0] & owned[1]
    changes = [(sid, rec.cross_connect) for sid, log in logs.items() for rec in log]
    assert changes
    for sid, xc in changes:  # every cross-connect ever made lies inside one job's ports
        ends = {(sid, xc.ingress), (sid, xc.egress)}
        assert ends <= owned[0] or ends <= owned[1], (sid, xc)
    assert all(sum(row.reconfigurations for row in rep.rows) > 0 for rep in reports)
