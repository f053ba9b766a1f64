"""The host agent's Unix-socket endpoint and the blocking job library, over real gRPC."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from lightrail.agents.client import BlockingRankSession, ControllerClient, RankSession
from lightrail.agents.errors import ControllerUnavailable, PhaseError
from lightrail.agents.host.agent import HostAgent
from lightrail.agents.host.local_endpoint import serve_local
from lightrail.controller.app import RunningController
from lightrail.controller.cli.embedded import embedded_config, running_controller
from lightrail.controller.config import FabricSection
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.drivers.base import CrossConnect
from lightrail.emulator.ocs import EmulatedFabricDevices

PLACE = [RankPlacement(0, "host0", 0), RankPlacement(1, "host1", 0)]


@pytest_asyncio.fixture
async def ctl(etcd: EmbeddedEtcd, devices: EmulatedFabricDevices
              ) -> AsyncIterator[RunningController]:
    cfg = embedded_config(etcd.endpoint, FabricSection.model_validate(
        {"builtin": "demo-4x2", "reconfiguration_delay_ms": 1}))
    async with running_controller(cfg, devices=devices) as rc:
        async with ControllerClient(rc.grpc_target) as c:
            await c.register_job("job", PLACE)
        yield rc


async def test_ranks_reach_the_controller_through_the_agent_socket(
    ctl: RunningController, devices: EmulatedFabricDevices, tmp_path: Path
) -> None:
    sockets = [tmp_path / f"agent{h}.sock" for h in (0, 1)]
    stop = asyncio.Event()
    async with HostAgent("host0", ctl.grpc_target) as a0, \
            HostAgent("host1", ctl.grpc_target) as a1:
        servers = [asyncio.create_task(serve_local(a, ctl.grpc_target, str(s), stop))
                   for a, s in ((a0, sockets[0]), (a1, sockets[1]))]
        try:
            clients = [ControllerClient(f"unix://{s}", retry_budget_s=5.0) for s in sockets]
            sessions = [RankSession(c, "job", r) for r, c in enumerate(clients)]

            async def ring(s: RankSession) -> bool:
                s.start_iteration(0)
                async with s.phase([0, 1], Collective.ALL_REDUCE) as adm:
                    return adm.noop

            noops = await asyncio.gather(*(ring(s) for s in sessions))
            assert False in noops
            assert devices["ocs-rail0"].cross_connects == {CrossConnect(1, 6), CrossConnect(2, 5)}
            for c in clients:
                await c.close()
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*servers), 10)
    assert not any(s.exists() for s in sockets)  # sockets removed on shutdown


async def test_a_device_failure_reaches_the_rank_as_a_refusal_through_the_agent_socket(
    ctl: RunningController, devices: EmulatedFabricDevices, tmp_path: Path
) -> None:
    """The local endpoint answers a refusal as the controller does (status and error code in
    trailing metadata): a device failure is DEVICE_FAILURE, not a transport failure to retry."""
    sock = tmp_path / "agent0.sock"
    stop = asyncio.Event()
    devices["ocs-rail0"].set_unreachable(True)
    async with HostAgent("host0", ctl.grpc_target) as a0:
        server = asyncio.create_task(serve_local(a0, ctl.grpc_target, str(sock), stop))
        try:
            async with ControllerClient(f"unix://{sock}", retry_budget_s=5.0) as c:
                phase = PhaseKey(ProcessGroup.of([0, 1]), Collective.ALL_REDUCE)
                peer = asyncio.ensure_future(c.enter("job", 1, phase, timeout_s=5.0))
                with pytest.raises(PhaseError) as info:
                    await c.enter("job", 0, phase, timeout_s=5.0)
                with pytest.raises(PhaseError):
                    await peer
        finally:
            stop.set()
            await asyncio.wait_for(server, 10)
    assert not isinstance(info.value, ControllerUnavailable)
    assert info.value.code is ErrorCode.DEVICE_FAILURE
    assert "ocs-rail0" in str(info.value)


async def test_blocking_session_for_training_loops(
    ctl: RunningController, devices: EmulatedFabricDevices
) -> None:
    target = ctl.grpc_target
    results: dict[int, list[bool]] = {}
    errors: list[BaseException] = []

    def train(rank: int) -> None:
        try:
            s = BlockingRankSession(lambda: ControllerClient(target), "job", rank, timeout_s=10)
            try:
                out = []
                for step in range(3):
                    s.start_iteration(step)
                    with s.phase([0, 1], Collective.ALL_REDUCE) as adm:
                        out.append(adm.noop)
                results[rank] = out
            finally:
                s.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=train, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        await asyncio.to_thread(t.join, 30)
    assert not errors, errors
    assert sorted(results) == [0, 1]
    # the ring is made once; later steps find it there
    assert results[0][1:] == [True, True] and results[1][1:] == [True, True]
    assert devices["ocs-rail0"].cross_connects == {CrossConnect(1, 6), CrossConnect(2, 5)}


async def test_a_cancelled_enter_is_withdrawn_at_the_controller(ctl: RunningController) -> None:
    """A rank whose caller gives up waiting (the job restarts after a failover) may enter
    another phase at once: the agent's CancelEnter withdrew its wait; without it the
    controller still counts the rank as waiting and refuses the next enter RANK_BUSY."""
    pair = PhaseKey(ProcessGroup.of([0, 1]), Collective.SEND_RECV)
    solo = PhaseKey(ProcessGroup.of([0, 1]), Collective.ALL_REDUCE)
    async with HostAgent("host0", ctl.grpc_target) as agent:
        agent.start()
        await agent.wait_connected(10)
        waiting = asyncio.create_task(agent.enter("job", 0, pair, 0, timeout_s=30))
        coord = ctl.service.coordinator
        for _ in range(200):  # until the controller has the wait (a deadline, not timing)
            if coord.waiting_request("job", 0) is not None:
                break
            await asyncio.sleep(0.01)
        assert coord.waiting_request("job", 0) is not None
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        for _ in range(200):
            if coord.waiting_request("job", 0) is None:
                break
            await asyncio.sleep(0.01)
        assert coord.waiting_request("job", 0) is None  # withdrawn, not left to time out
        async with ControllerClient(ctl.grpc_target) as peer:
            other = asyncio.create_task(peer.enter("job", 1, solo, timeout_s=10))
            adm = await asyncio.wait_for(agent.enter("job", 0, solo, 0, timeout_s=10), 15)
            await other
        assert adm.steps >= 1
