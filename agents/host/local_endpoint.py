"""The host agent's local endpoint: AgentService on a Unix socket for the job-side library.

Ranks on the host call unary EnterPhase / ReleasePhase here (``ControllerClient`` with target
``unix:///run/lightrail/agent.sock``); the agent relays them over its single PhaseStream, so the
controller's cost follows hosts, not ranks. RegisterJob, UnregisterJob and WatchJob are proxied
to the controller unchanged (to its leader, following a standby's redirect:
``lightrail.agents.leader``). PhaseStream is not offered locally (UNIMPLEMENTED).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, TypeVar

import grpc
import structlog

from lightrail.agents.channel import ClientTls
from lightrail.agents.errors import PhaseError
from lightrail.agents.host.agent import HostAgent
from lightrail.agents.leader import LeaderTargets, NoLeader
from lightrail.controller.api.codec import (
    InvalidRequest,
    PhaseKeyDecoder,
    abort_refused,
    compute_gap_hint,
    timeout_from_pb,
)
from lightrail.v1 import agent_pb2, agent_pb2_grpc

log = structlog.get_logger(__name__)
T = TypeVar("T")
if TYPE_CHECKING:
    _Stub: TypeAlias = agent_pb2_grpc.AgentServiceAsyncStub  # the stubs' name; not at runtime

_DEFAULT_TIMEOUT_S = 30.0
"""Admission timeout of an EnterPhase that gives none: the agent's local guard needs a
finite one (the controller's own default, ``admission_timeout_s``, is not known here)."""

class ControllerStubs:
    """AgentService stubs of the controller replicas at ``targets`` (one channel each, opened
    on first use); ``call`` goes to the leader (``LeaderTargets.call``)."""

    def __init__(self, targets: LeaderTargets) -> None:
        self.targets = targets
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, _Stub] = {}

    def stub(self, address: str) -> _Stub:
        """The stub of ``address``."""
        stub = self._stubs.get(address)
        if stub is None:
            channel = self._channels[address] = self.targets.channel(address)
            stub = self._stubs[address] = agent_pb2_grpc.AgentServiceStub(channel)
        return stub

    async def call(self, fn: Callable[[_Stub], Awaitable[T]]) -> T:
        """``fn`` on the leader's stub. Raises ``NoLeader`` and the leader's
        ``grpc.aio.AioRpcError``."""
        return await self.targets.call(lambda address: fn(self.stub(address)))

    async def close(self) -> None:
        """Close the channels."""
        channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        for channel in channels:
            await channel.close(None)


class LocalAgentServicer(agent_pb2_grpc.AgentServiceServicer):
    """Relays the host's ranks to ``agent`` and proxies job calls to the leader of
    ``controller``. No leader reachable: the job call fails UNAVAILABLE (the caller retries)."""

    def __init__(self, agent: HostAgent, controller: ControllerStubs) -> None:
        self._agent = agent
        self._controller = controller
        self._decoder = PhaseKeyDecoder()

    async def EnterPhase(  # noqa: N802
        self,
        request: agent_pb2.EnterPhaseRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> agent_pb2.EnterPhaseResponse:
        try:
            phase = self._decoder.decode(request.phase)
            requested_s = timeout_from_pb(request)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        timeout_s = _DEFAULT_TIMEOUT_S if requested_s is None else requested_s
        try:
            adm = await self._agent.enter(request.job_id, request.rank, phase, request.iteration,
                                          timeout_s, request.nbytes,
                                          compute_gap_hint(request.compute_gap_s))
        except PhaseError as exc:
            await abort_refused(context, exc.code, exc.detail)
        return agent_pb2.EnterPhaseResponse(noop=adm.noop, steps=adm.steps,
                                            device_s=adm.device_s)

    async def ReleasePhase(  # noqa: N802
        self,
        request: agent_pb2.ReleasePhaseRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> agent_pb2.ReleasePhaseResponse:
        try:
            phase = self._decoder.decode(request.phase)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self._agent.release(request.job_id, request.rank, phase, request.iteration)
        return agent_pb2.ReleasePhaseResponse()

    async def RegisterJob(  # noqa: N802
        self,
        request: agent_pb2.RegisterJobRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> agent_pb2.RegisterJobResponse:
        try:
            resp: agent_pb2.RegisterJobResponse = await self._controller.call(
                lambda stub: stub.RegisterJob(request))
        except NoLeader as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "")
        return resp

    async def UnregisterJob(  # noqa: N802
        self,
        request: agent_pb2.UnregisterJobRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> agent_pb2.UnregisterJobResponse:
        try:
            resp: agent_pb2.UnregisterJobResponse = await self._controller.call(
                lambda stub: stub.UnregisterJob(request))
        except NoLeader as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "")
        return resp

    async def WatchJob(  # noqa: N802
        self,
        request: agent_pb2.WatchJobRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> AsyncIterator[agent_pb2.JobEvent]:
        calls: list[grpc.aio.UnaryStreamCall[agent_pb2.WatchJobRequest, agent_pb2.JobEvent]] = []

        async def first(stub: _Stub) -> object:
            call = stub.WatchJob(request)  # a standby's redirect comes with the first read
            calls.append(call)
            return await call.read()

        try:
            ev = await self._controller.call(first)
            while ev is not grpc.aio.EOF:  # type: ignore[attr-defined]
                assert isinstance(ev, agent_pb2.JobEvent)
                yield ev
                ev = await calls[-1].read()
        except NoLeader as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "")
        finally:
            for call in calls:
                call.cancel()

    async def HealthStream(  # noqa: N802
        self,
        request_iterator: AsyncIterator[agent_pb2.HealthReport],
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> AsyncIterator[agent_pb2.HealthAck]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            "HealthStream is the agent's own link to the controller")
        yield agent_pb2.HealthAck()  # unreachable: makes this an async generator

    async def PhaseStream(  # noqa: N802
        self,
        request_iterator: AsyncIterator[agent_pb2.PhaseRequestBatch],
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> AsyncIterator[agent_pb2.PhaseReplyBatch]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            "PhaseStream is the agent's own link to the controller; ranks use "
                            "unary EnterPhase/ReleasePhase on this socket")
        yield agent_pb2.PhaseReplyBatch()  # unreachable: makes this an async generator


def _prepare_socket_dir(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_socket(path)


def _remove_socket(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


async def serve_local(
    agent: HostAgent, controller_target: str | Sequence[str], socket_path: str,
    stop: asyncio.Event, *, tls: ClientTls | None = None,
) -> None:
    """Serve ``LocalAgentServicer`` on ``unix://socket_path`` until ``stop`` is set; job calls
    go to the leader among ``controller_target`` (``host:port``, or replicas ``a:1,b:2``),
    over TLS with ``tls`` when given. The socket itself is plaintext: its file mode (0660)
    is its access control. Raises ``OSError`` when the socket's directory cannot be created,
    ``ValueError`` for an empty address list."""
    controller = ControllerStubs(LeaderTargets(controller_target, tls=tls))
    path = Path(socket_path)
    _prepare_socket_dir(path)
    try:
        server = grpc.aio.server()
        agent_pb2_grpc.add_AgentServiceServicer_to_server(
            LocalAgentServicer(agent, controller), server)
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        os.chmod(path, 0o660)
        log.info("agent_serving", host=agent.host, socket=str(path),
                 controller=str(controller.targets))
        try:
            await stop.wait()
        finally:
            await server.stop(grace=1.0)
            _remove_socket(path)
    finally:
        await controller.close()
