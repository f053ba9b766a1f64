"""Operator verbs against a real controller on a real etcd (gRPC over sockets, the CLI in
process): maintenance mode (refusal naming the switch, phases on other switches and circuits in
place admitted, kept across a controller restart and a failover), ports, leader, undrain,
gpus --clear and switch show."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc
import pytest
import pytest_asyncio

from lightrail.agents.client import ControllerClient
from lightrail.agents.errors import Admission, PhaseError, SwitchInMaintenance
from lightrail.agents.host.health import HealthState
from lightrail.agents.host.reporter import HealthReporter
from lightrail.controller.app import RunningController, ServingReplica, run_controller
from lightrail.controller.cli.drivers import driver_registry
from lightrail.controller.cli.embedded import embedded_config, running_controller
from lightrail.controller.cli.main import main as cli_main
from lightrail.controller.config import Config, FabricSection
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.drivers.base import CrossConnect
from lightrail.emulator.gpus import EmulatedHealthSource
from lightrail.emulator.ocs import EmulatedFabricDevices
from lightrail.v1 import agent_pb2, agent_pb2_grpc, operator_pb2, operator_pb2_grpc
from tests.cli_thread import cli_in_thread

PLACE = [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)]
RING = PhaseKey(ProcessGroup.of(range(8)), Collective.ALL_REDUCE)
PAIR1 = PhaseKey(ProcessGroup.of([1, 3]), Collective.SEND_RECV)  # host0 <-> host1 on rail 1
N = 4
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")


async def cli(*argv: str) -> tuple[int, str, str]:
    """``lightrail ARGV`` in a thread: rc, stdout, stderr without the controller's logs."""
    rc, out, err = await cli_in_thread(*argv)
    return rc, _without_logs(out), _without_logs(err)


def _without_logs(text: str) -> str:
    """``text`` without the in-process controller's log lines (redirect_stdout is process
    wide: they land in the same buffer)."""
    return "".join(ln for ln in text.splitlines(keepends=True) if not LOG_LINE.match(ln))


@pytest_asyncio.fixture
async def client(ctl: RunningController) -> AsyncIterator[ControllerClient]:
    async with ControllerClient(ctl.grpc_target, retry_budget_s=2.0) as c:
        yield c


async def enter_all(client: ControllerClient, phase: PhaseKey, ranks: Sequence[int],
                    timeout_s: float = 5.0) -> list[object]:
    return list(await asyncio.gather(
        *(client.enter("job", r, phase, timeout_s=timeout_s) for r in ranks),
        return_exceptions=True))


async def maintenance_events(target: str) -> list[operator_pb2.FabricEvent]:
    async with grpc.aio.insecure_channel(target) as ch:
        stub = operator_pb2_grpc.OperatorServiceStub(ch)
        return [e async for e in stub.StreamEvents(
            operator_pb2.StreamEventsRequest(kinds=["maintenance"]), timeout=5)]


async def test_maintenance_refuses_what_needs_the_switch_and_admits_the_rest(
    ctl: RunningController, client: ControllerClient, devices: EmulatedFabricDevices
) -> None:
    await client.register_job("job", PLACE)
    rc, out, err = await cli("maintenance", "on", "ocs-rail0", "--reason", "fibre cleaning",
                             "--controller", ctl.grpc_target)
    assert rc == 0, err
    assert "ocs-rail0: in maintenance (fibre cleaning)" in out
    rc, out, _ = await cli("switches", "--json", "--controller", ctl.grpc_target)
    by_id = {s["switch_id"]: s for s in json.loads(out)["switches"]}
    assert by_id["ocs-rail0"]["maintenance"] is True
    assert by_id["ocs-rail0"]["maintenance_reason"] == "fibre cleaning"
    assert by_id["ocs-rail1"]["maintenance"] is False
    rc, out, _ = await cli("switches", "--controller", ctl.grpc_target)
    assert "yes:" in out and "fibre" in out  # the maintenance column (rich may wrap it)

    # the ring needs both rails: refused, explicitly, naming the switch and the reason
    results = await enter_all(client, RING, range(8))
    assert all(isinstance(r, SwitchInMaintenance) for r in results), results
    first = results[0]
    assert isinstance(first, PhaseError) and first.code is ErrorCode.SWITCH_MAINTENANCE
    assert "'ocs-rail0' is in maintenance (fibre cleaning)" in str(first)
    assert devices["ocs-rail0"].cross_connects == set()
    # a pair on rail 1 does not need ocs-rail0: admitted (rail 1 switches)
    adms = await enter_all(client, PAIR1, [1, 3])
    assert not any(isinstance(a, BaseException) for a in adms), adms
    assert devices["ocs-rail1"].cross_connects
    assert devices["ocs-rail0"].cross_connects == set()
    for r in (1, 3):
        await client.release_phase("job", r, PAIR1)

    rc, out, err = await cli("maintenance", "off", "ocs-rail0", "--controller", ctl.grpc_target)
    assert rc == 0 and "ocs-rail0: in service" in out, err
    adms = await enter_all(client, RING, range(8))
    assert not any(isinstance(a, BaseException) for a in adms), adms
    ring = {CrossConnect(i + 1, N + (i + 1) % 4 + 1) for i in range(4)}
    assert devices["ocs-rail0"].cross_connects == ring
    for r in range(8):
        await client.release_phase("job", r, RING)

    # circuits in place are admitted on a switch in maintenance (they need no change)
    await cli("maintenance", "on", "ocs-rail0", "--controller", ctl.grpc_target)
    again = PhaseKey(RING.group, RING.collective, seq=1)
    adms = await enter_all(client, again, range(8))
    assert not any(isinstance(a, BaseException) for a in adms), adms
    assert devices["ocs-rail0"].cross_connects == ring

    events = await maintenance_events(ctl.grpc_target)
    assert [(e.switch_id, e.fields["maintenance"]) for e in events] == [
        ("ocs-rail0", "on"), ("ocs-rail0", "off"), ("ocs-rail0", "on")]
    assert events[0].fields["reason"] == "fibre cleaning"


async def test_maintenance_on_returns_once_the_switch_is_left_alone(
    etcd: EmbeddedEtcd, devices: EmulatedFabricDevices
) -> None:
    """A reconfiguration decided before maintenance (here a slow 0.5 s switch) completes, and
    ``maintenance on`` answers only after it: from then on nothing changes the switch."""
    cfg = embedded_config(etcd.endpoint, FabricSection.model_validate(
        {"builtin": "demo-4x2", "reconfiguration_delay_ms": 500}), admission_timeout_s=5.0)
    async with running_controller(cfg, devices=devices) as ctl, \
            ControllerClient(ctl.grpc_target, retry_budget_s=2.0) as c:
        await c.register_job("job", PLACE)
        ring = asyncio.ensure_future(enter_all(c, RING, range(8)))
        coord = ctl.service.coordinator

        async def switching() -> bool:
            return coord.switching("ocs-rail0")
        await until(switching)
        rc, _, err = await cli("maintenance", "on", "ocs-rail0", "--controller", ctl.grpc_target)
        assert rc == 0, err
        assert not coord.switching("ocs-rail0")
        ring_xcs = {CrossConnect(i + 1, N + (i + 1) % 4 + 1) for i in range(4)}
        assert devices["ocs-rail0"].cross_connects == ring_xcs
        adms = await ring  # decided before maintenance: admitted on confirmed circuits
        assert not any(isinstance(a, BaseException) for a in adms), adms


async def test_maintenance_off_reads_the_switch_back_before_admitting_onto_it(
    ctl: RunningController, client: ControllerClient, devices: EmulatedFabricDevices
) -> None:
    """A technician removes a ring cross-connect by hand during maintenance; after
    maintenance off the ring is not admitted as a no-op onto the circuit that is gone: the
    switch is read back and the ring switched again."""
    await client.register_job("job", PLACE)
    await enter_all(client, RING, range(8))
    for r in range(8):
        await client.release_phase("job", r, RING)
    assert (await cli("maintenance", "on", "ocs-rail0", "--controller", ctl.grpc_target))[0] == 0
    removed = CrossConnect(1, N + 2)
    await devices["ocs-rail0"].apply_bulk([removed], [])  # by hand, behind the controller
    assert (await cli("maintenance", "off", "ocs-rail0", "--controller", ctl.grpc_target))[0] == 0
    again = PhaseKey(RING.group, RING.collective, seq=1)
    adms = await enter_all(client, again, range(8))
    assert not any(isinstance(a, BaseException) for a in adms), adms
    assert removed in devices["ocs-rail0"].cross_connects
    assert False in [a.noop for a in adms if isinstance(a, Admission)]  # it switched


async def test_maintenance_bad_input_names_the_switch_and_stores_nothing(
    ctl: RunningController, etcd: EmbeddedEtcd
) -> None:
    rc, _, err = await cli("maintenance", "on", "nope", "--controller", ctl.grpc_target)
    assert rc == 1 and "NOT_FOUND: switch_id: unknown switch 'nope'" in err
    async with EtcdStore.connect(etcd.endpoint) as store:
        assert dict((await store.get_prefix_json("maintenance/")).items) == {}
    assert ctl.service.coordinator.maintenance() == {}


def _config(etcd: EmbeddedEtcd, replica_id: str = "embedded") -> Config:
    return embedded_config(
        etcd.endpoint,
        FabricSection.model_validate({"builtin": "demo-4x2", "reconfiguration_delay_ms": 2}),
        admission_timeout_s=5.0, replica_id=replica_id)


async def test_maintenance_survives_a_restart_and_a_failover(
    etcd: EmbeddedEtcd, devices: EmulatedFabricDevices
) -> None:
    async with running_controller(_config(etcd), devices=devices) as first:
        rc, _, err = await cli("maintenance", "on", "ocs-rail1", "--reason", "swap",
                               "--controller", first.grpc_target)
        assert rc == 0, err
    # a restart: the new leader reads maintenance back from etcd before it serves
    async with running_controller(_config(etcd), devices=devices) as second:
        assert second.service.coordinator.maintenance() == {"ocs-rail1": "swap"}
        async with ControllerClient(second.grpc_target, retry_budget_s=2.0) as c:
            await c.register_job("job", PLACE)
            results = await enter_all(c, RING, range(8))
            await c.unregister_job("job")  # no recovered job keeps the next leader waiting
        assert {r.code for r in results if isinstance(r, PhaseError)} == {
            ErrorCode.SWITCH_MAINTENANCE}
        assert devices["ocs-rail1"].cross_connects == set()
        # a standby replica follows this leader; when the leader goes, it takes over
        standby = Standby(_config(etcd, "standby"), devices)
        await standby.following("embedded")
    try:
        leader = await standby.leading()
        assert leader.service.coordinator.maintenance() == {"ocs-rail1": "swap"}
        _, out, _ = await cli("switches", "--json", "--controller", leader.grpc_target)
        assert {s["switch_id"]: s["maintenance_reason"] for s in json.loads(out)["switches"]
                if s["maintenance"]} == {"ocs-rail1": "swap"}
        _, out, _ = await cli("leader", "--json", "--controller", leader.grpc_target)
        view = json.loads(out)  # it saw "embedded" lead, then itself
        assert (view["leader_id"], view["transitions"]) == ("standby", 2)
    finally:
        await standby.stop()


class Standby:
    """A replica run with ``run_controller`` from a standby on: ``following`` returns once its
    own view (GetLeader on its socket) names ``leader_id``, ``leading`` once it leads."""

    def __init__(self, cfg: Config, devices: EmulatedFabricDevices) -> None:
        loop = asyncio.get_running_loop()
        self._serving: asyncio.Future[ServingReplica] = loop.create_future()
        self._started: asyncio.Future[RunningController] = loop.create_future()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(run_controller(
            cfg, self._stop, drivers=driver_registry(devices),
            on_serving=self._serving.set_result, on_started=self._started.set_result))

    async def following(self, leader_id: str) -> None:
        target = (await asyncio.wait_for(self._serving, 30)).grpc_target
        async with grpc.aio.insecure_channel(target) as ch:
            stub = operator_pb2_grpc.OperatorServiceStub(ch)

            async def seen() -> bool:
                view = await stub.GetLeader(operator_pb2.GetLeaderRequest(), timeout=5)
                return bool(view.leader_id == leader_id)
            await until(seen, 30)

    async def leading(self) -> RunningController:
        return await asyncio.wait_for(self._started, 30)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.wait_for(self._task, 30)


async def test_ports_show_states_power_and_what_is_connected(
    ctl: RunningController, client: ControllerClient, devices: EmulatedFabricDevices
) -> None:
    await client.register_job("job", PLACE)
    await enter_all(client, RING, range(8))
    rc, out, err = await cli("ports", "--switch", "ocs-rail0", "--json",
                             "--controller", ctl.grpc_target)
    assert rc == 0, err
    ports = {p["port"]: p for p in json.loads(out)["ports"]}
    assert sorted(ports) == list(range(1, 2 * N + 1))
    assert {p["switch_id"] for p in ports.values()} == {"ocs-rail0"}
    assert ports[1]["connected_to"] == N + 2 and ports[N + 2]["connected_to"] == 1
    assert ports[1]["endpoint"] == "host0/nic0" and ports[1]["job_id"] == "job"
    assert ports[1]["admin_state"] == "enabled"
    assert isinstance(ports[1]["power_dbm"], float)
    rc, out, _ = await cli("ports", "--controller", ctl.grpc_target)
    assert rc == 0 and "ocs-rail1" in out and "power dBm" in out
    rc, _, err = await cli("ports", "--switch", "nope", "--controller", ctl.grpc_target)
    assert rc == 1 and "switch_id: unknown switch 'nope'" in err


async def test_leader_is_answered_by_the_replica(ctl: RunningController) -> None:
    rc, out, err = await cli("leader", "--json", "--controller", ctl.grpc_target)
    assert rc == 0, err
    view = json.loads(out)
    assert view["leader_id"] == view["replica_id"] == ctl.replica_id
    assert view["address"] and view["transitions"] == 1
    assert view["leading_for_s"] >= 0
    rc, out, _ = await cli("leader", "--controller", ctl.grpc_target)
    assert rc == 0 and ctl.replica_id in out


async def gpu_states(target: str, host: str) -> dict[int, str]:
    async with grpc.aio.insecure_channel(target) as ch:
        resp = await operator_pb2_grpc.OperatorServiceStub(ch).ListGpus(
            operator_pb2.ListGpusRequest(), timeout=5)
    return {g.gpu: g.state for g in resp.gpus if g.host == host}


async def stored_gpu_records(etcd: EmbeddedEtcd) -> set[str]:
    async with EtcdStore.connect(etcd.endpoint) as store:
        return set((await store.get_prefix_json("gpus/")).items)


async def until(predicate: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> None:
    """Wait (polling every 50 ms) until ``await predicate()`` is true; fail after
    ``timeout_s``."""
    for _ in range(int(timeout_s / 0.05)):
        if await predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not true within {timeout_s} s")


async def test_undrain_and_clear_return_gpus_to_service(
    ctl: RunningController, etcd: EmbeddedEtcd
) -> None:
    target = ctl.grpc_target
    rc, _, err = await cli("drain", "host3", "--controller", target)
    assert rc == 0, err
    assert await gpu_states(target, "host3") == {0: "failed", 1: "failed"}

    async def stored() -> bool:
        return await stored_gpu_records(etcd) == {"gpus/host3/0", "gpus/host3/1"}
    await until(stored)

    rc, out, err = await cli("uncordon", "host3", "--controller", target)
    assert rc == 0 and "host3: GPUs 0, 1 back in service" in out, err
    assert await gpu_states(target, "host3") == {0: "unknown", 1: "unknown"}

    async def deleted() -> bool:
        return not await stored_gpu_records(etcd)
    await until(deleted)
    rc, _, err = await cli("drain", "--undo", "host3", "--controller", target)
    assert rc == 1 and "FAILED_PRECONDITION: host: 'host3' is not drained" in err
    rc, _, err = await cli("uncordon", "nohost", "--controller", target)
    assert rc == 1 and "NOT_FOUND: host: unknown host 'nohost'" in err

    # an agent reports a failure; the operator clears it after the repair
    async with grpc.aio.insecure_channel(target) as ch:
        call = agent_pb2_grpc.AgentServiceStub(ch).HealthStream()  # type: ignore[call-arg]
        await call.write(agent_pb2.HealthReport(host="host2", gpus=[
            agent_pb2.GpuHealth(gpu=0, state=agent_pb2.GPU_FAILED, reason="XID 79"),
            agent_pb2.GpuHealth(gpu=1, state=agent_pb2.GPU_HEALTHY)]))
        ack = await call.read()
        assert isinstance(ack, agent_pb2.HealthAck) and list(ack.failed_gpus) == [0]
        rc, out, err = await cli("gpus", "--clear", "host2:0", "--json", "--controller", target)
        assert rc == 0, err
        assert [(g["host"], g["gpu"], g["state"]) for g in json.loads(out)["gpus"]] == [
            ("host2", 0, "unknown")]
        # the agent echoes the controller's old record once: that brings nothing back
        await call.write(agent_pb2.HealthReport(host="host2", gpus=[
            agent_pb2.GpuHealth(gpu=0, state=agent_pb2.GPU_FAILED,
                                reason="failed (controller's record)", controller_record=True),
            agent_pb2.GpuHealth(gpu=1, state=agent_pb2.GPU_HEALTHY)]))
        ack = await call.read()
        assert isinstance(ack, agent_pb2.HealthAck) and list(ack.failed_gpus) == []
        call.cancel()
    assert (await gpu_states(target, "host2"))[0] == "unknown"
    rc, _, err = await cli("gpus", "--clear", "host2:7", "--controller", target)
    assert rc == 1 and "gpu: host2/gpu7 does not exist" in err
    rc, _, err = await cli("gpus", "--clear", "ghost", "--controller", target)
    assert rc == 1 and "host: unknown host 'ghost'" in err
    rc, _, err = await cli("gpus", "--clear", "host2:x", "--controller", target)
    assert rc == 2 and "--clear: expected HOST or HOST:GPU, got 'host2:x'" in err


async def test_an_agent_follows_an_undrain(ctl: RunningController) -> None:
    """A real host agent's reporter: it adopts the controller's drain record as its own
    (RESTORED), and after uncordon drops it, so the GPUs come back healthy rather than the
    echo failing them again."""
    src = EmulatedHealthSource("host3", 2)
    reporter = HealthReporter(src, ctl.grpc_target, interval_s=0.05)
    task = asyncio.create_task(reporter.run())
    try:
        await asyncio.wait_for(reporter.acked.wait(), 10)
        assert (await cli("drain", "host3", "--controller", ctl.grpc_target))[0] == 0

        async def adopted() -> bool:
            return all(h.state is HealthState.FAILED for h in src.snapshot().values())
        await until(adopted)
        assert (await cli("uncordon", "host3", "--controller", ctl.grpc_target))[0] == 0

        async def healthy() -> bool:
            return await gpu_states(ctl.grpc_target, "host3") == {0: "healthy", 1: "healthy"}
        await until(healthy)
        assert {h.state for h in src.snapshot().values()} == {HealthState.HEALTHY}
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_switch_show_draws_the_cross_connects(
    ctl: RunningController, client: ControllerClient
) -> None:
    await client.register_job("job", PLACE)
    await enter_all(client, RING, range(8))
    rc, out, err = await cli("switch", "show", "ocs-rail0", "--controller", ctl.grpc_target)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "ocs-rail0 (4x4 N x N): 4 cross-connect(s)"
    rows = [ln for ln in lines if ln[:1].isdigit()]
    # ingress i (host i-1) -> egress of host i: the ring, every cell of job "job" marked A
    assert [r.split("|")[1].split() for r in rows] == [
        [".", "A", ".", "."], [".", ".", "A", "."], [".", ".", ".", "A"], ["A", ".", ".", "."]]
    assert rows[0].startswith("1 host0/nic0")
    assert "cross-connects: A = job" in out
    rc, out, _ = await cli("switch", "show", "ocs-rail0", "--dot",
                           "--controller", ctl.grpc_target)
    assert rc == 0 and out.startswith('digraph "ocs-rail0" {')
    assert out.count(" -> ") == 4 and 'p1 -> p6 [label="job"];' in out
    rc, out, _ = await cli("switch", "show", "ocs-rail0", "--json",
                           "--controller", ctl.grpc_target)
    doc = json.loads(out)
    assert doc["switch"]["switch_id"] == "ocs-rail0" and len(doc["cross_connects"]) == 4
    rc, _, err = await cli("switch", "show", "nope", "--controller", ctl.grpc_target)
    assert rc == 1 and "switch_id: unknown switch 'nope'" in err


@pytest.mark.parametrize("argv", [["maintenance", "on"], ["switch"], ["gpus", "--clear"]])
def test_usage_errors_exit_2(argv: list[str]) -> None:
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit) as exc:
        cli_main(argv)
    assert exc.value.code == 2
