"""What every replica serves from start, leader or standby (DESIGN.md "High availability").

A replica starts its gRPC server before it campaigns for the leader lease. Its AgentService and
OperatorService are ``RoutedAgentService`` / ``RoutedOperatorService``: while the replica leads
(``LeaderRoute.lead``) each call goes to the leader's servicers; otherwise it is answered with a
redirect: status UNAVAILABLE, details ``not the leader; leader is HOST:PORT``, trailing
metadata ``lightrail-error: NOT_LEADER`` and ``lightrail-leader: HOST:PORT``
(``codec.LEADER_METADATA_KEY``; empty while no leader is known; ``lightrail.agents.leader``
follows it). A standby moves no state: a redirected call may be resent to the leader as it
is.

The gRPC health service says NOT_SERVING for the overall status (``""``) and for both services
on a standby, SERVING on the leader (``LeaderRoute.lead``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from lightrail.controller.api.agent_service import AgentServicer
from lightrail.controller.api.auth import OperatorAuth
from lightrail.controller.api.codec import ERROR_METADATA_KEY, LEADER_METADATA_KEY
from lightrail.controller.api.operator_service import OperatorServicer
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.reload import ReloadOutcome
from lightrail.v1 import agent_pb2, agent_pb2_grpc, operator_pb2, operator_pb2_grpc

AGENT_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name
"""``lightrail.v1.AgentService``: the phase (and health, jobs) service's name for gRPC health."""
OPERATOR_SERVICE = operator_pb2.DESCRIPTOR.services_by_name["OperatorService"].full_name
"""``lightrail.v1.OperatorService``: the operator service's name for gRPC health."""
HEALTH_SERVICES = ("", AGENT_SERVICE, OPERATOR_SERVICE)
"""The names whose gRPC health status follows leadership (``""``: the server overall)."""
REPLICA_HEALTH = "lightrail.replica"
"""A gRPC health name SERVING on every replica that serves, standby or leader, from
``standby`` on (Kubernetes readiness and liveness probes: a standby is ready, it redirects)."""
Reloader = Callable[[str], Awaitable[ReloadOutcome]]
"""Reloads the replica's config file (``lightrail.controller.reload.ConfigReloader.reload``),
given what asked (``rpc``)."""

if TYPE_CHECKING:
    _Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True, slots=True)
class LeaderView:
    """A replica's view of the election (``GetLeader``): the leading replica's id and
    advertised address (None while none is known), the leader changes this replica has seen,
    and how long the current leader has led as far as it knows (s; None when unknown)."""

    leader_id: str | None
    address: str | None
    transitions: int
    leading_for_s: float | None


class LeaderRoute:
    """Where a replica's calls go. ``leader_address`` returns the address the current leader
    advertises (None while none is known); ``own_address`` is this replica's own advertised
    address (a standby that sees itself named, while it starts leading or after it stopped,
    names no leader: the client tries again). ``health`` is the replica's gRPC health
    servicer, whose statuses ``lead``/``step_down`` set. ``replica_id`` and ``leader_view``
    (None: no election known) answer ``GetLeader`` on this replica itself."""

    def __init__(
        self,
        leader_address: Callable[[], str | None],
        own_address: str,
        health_servicer: health.aio.HealthServicer,  # type: ignore[name-defined]
        *,
        replica_id: str = "",
        leader_view: Callable[[], LeaderView] | None = None,
    ) -> None:
        self._leader_address = leader_address
        self.replica_id = replica_id
        self.leader_view = leader_view
        self.own_address = own_address
        self.health = health_servicer
        self.agent: AgentServicer | None = None
        self.operator: OperatorServicer | None = None

    async def standby(self) -> None:
        """Report NOT_SERVING for every name in ``HEALTH_SERVICES`` (the state at start)."""
        for name in HEALTH_SERVICES:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set(REPLICA_HEALTH, health_pb2.HealthCheckResponse.SERVING)

    async def lead(self, agent: AgentServicer, operator: OperatorServicer) -> None:
        """From now on, calls go to ``agent`` and ``operator``; health says SERVING."""
        self.agent = agent
        self.operator = operator
        for name in HEALTH_SERVICES:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def step_down(self) -> None:
        """Stop sending calls to the leader's servicers (fenced, or shutting down): new calls
        are redirected; health says NOT_SERVING."""
        self.agent = None
        self.operator = None
        await self.standby()

    def leader_address(self) -> str | None:
        """The address the current leader advertises, None while none is known."""
        return self._leader_address()

    def redirect_status(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """The details and trailing metadata of a redirect, now: ``lightrail-leader`` holds the
        leader's address, or is empty while none is known (or this replica is named while it
        starts or stops leading): try again, or another replica."""
        leader = self._leader_address()
        not_leader = (ERROR_METADATA_KEY, ErrorCode.NOT_LEADER.value)
        if leader is None:
            return ("not the leader; no leader elected yet (election in progress)",
                    (not_leader, (LEADER_METADATA_KEY, "")))
        if leader == self.own_address:
            return (f"{leader} leads but does not serve yet (starting or stopping); try again",
                    (not_leader, (LEADER_METADATA_KEY, "")))
        return f"not the leader; leader is {leader}", (not_leader, (LEADER_METADATA_KEY, leader))

    async def redirect(self, context: _Context) -> NoReturn:
        """Abort the call with the redirect (``redirect_status``)."""
        details, metadata = self.redirect_status()
        await context.abort(grpc.StatusCode.UNAVAILABLE, details, metadata)
        raise AssertionError("unreachable: ServicerContext.abort raises")

    async def agent_or_redirect(self, context: _Context) -> AgentServicer:
        """The leader's AgentService servicer; aborts the call with a redirect if none."""
        agent = self.agent
        if agent is None:
            await self.redirect(context)
        return agent

    async def operator_or_redirect(self, context: _Context) -> OperatorServicer:
        """The leader's OperatorService servicer; aborts the call with a redirect if none."""
        operator = self.operator
        if operator is None:
            await self.redirect(context)
        return operator


STREAM_REDIRECT_WAIT_S = 1.0
"""How long a standby waits for a PhaseStream's first message before it redirects the stream
anyway (s)."""


class RoutedAgentService(agent_pb2_grpc.AgentServiceServicer):
    """AgentService of a replica: the leader's ``AgentServicer`` while it leads, else a
    redirect (``LeaderRoute``). A stream opened while leading stays with the servicer it
    started on."""

    def __init__(self, route: LeaderRoute) -> None:
        self._route = route

    async def RegisterJob(  # noqa: N802
        self, request: agent_pb2.RegisterJobRequest, context: _Context
    ) -> agent_pb2.RegisterJobResponse:
        target = await self._route.agent_or_redirect(context)
        return await target.RegisterJob(request, context)

    async def UnregisterJob(  # noqa: N802
        self, request: agent_pb2.UnregisterJobRequest, context: _Context
    ) -> agent_pb2.UnregisterJobResponse:
        target = await self._route.agent_or_redirect(context)
        return await target.UnregisterJob(request, context)

    async def WatchJob(  # noqa: N802
        self, request: agent_pb2.WatchJobRequest, context: _Context
    ) -> AsyncIterator[agent_pb2.JobEvent]:
        target = await self._route.agent_or_redirect(context)
        async for event in target.WatchJob(request, context):
            yield event

    async def HealthStream(  # noqa: N802
        self, request_iterator: AsyncIterator[agent_pb2.HealthReport], context: _Context
    ) -> AsyncIterator[agent_pb2.HealthAck]:
        target = await self._route.agent_or_redirect(context)
        async for ack in target.HealthStream(request_iterator, context):
            yield ack

    async def PhaseStream(  # type: ignore[override]  # noqa: N802
        self, request_iterator: AsyncIterator[agent_pb2.PhaseRequestBatch], context: _Context
    ) -> None:
        """The leader's PhaseStream, or a redirect sent once the agent's opening message has
        come (at most ``STREAM_REDIRECT_WAIT_S``): an asyncio client whose write meets the
        abort reads ``INTERNAL: Internal error from Core`` instead of the redirect and its
        leader metadata (grpc/grpc#36066, open in grpcio 1.85), and then tries the next
        address instead of the leader it was told."""
        target = self._route.agent
        if target is None:
            with contextlib.suppress(Exception):  # a timeout, or the client went away
                await asyncio.wait_for(context.read(), STREAM_REDIRECT_WAIT_S)
            await self._route.redirect(context)
        await target.PhaseStream(request_iterator, context)

    async def EnterPhase(  # noqa: N802
        self, request: agent_pb2.EnterPhaseRequest, context: _Context
    ) -> agent_pb2.EnterPhaseResponse:
        target = await self._route.agent_or_redirect(context)
        return await target.EnterPhase(request, context)

    async def ReleasePhase(  # noqa: N802
        self, request: agent_pb2.ReleasePhaseRequest, context: _Context
    ) -> agent_pb2.ReleasePhaseResponse:
        target = await self._route.agent_or_redirect(context)
        return await target.ReleasePhase(request, context)


class RoutedOperatorService(operator_pb2_grpc.OperatorServiceServicer):
    """OperatorService of a replica: the leader's ``OperatorServicer`` while it leads, else a
    redirect (``LeaderRoute``), so an operator pointed at a standby gets the leader's answer
    through ``lightrail.agents.leader``. Mutating calls (Failover, Drain) first need an
    operator identity (``auth``, ``lightrail.controller.api.auth``), on every replica:
    a standby refuses an unknown caller instead of redirecting it."""

    def __init__(self, route: LeaderRoute, auth: OperatorAuth,
                 reload: Reloader | None = None) -> None:
        self._route = route
        self._auth = auth
        self._reload = reload

    async def GetStatus(  # noqa: N802
        self, request: operator_pb2.GetStatusRequest, context: _Context
    ) -> operator_pb2.GetStatusResponse:
        target = await self._route.operator_or_redirect(context)
        return await target.GetStatus(request, context)

    async def ListHosts(  # noqa: N802
        self, request: operator_pb2.ListHostsRequest, context: _Context
    ) -> operator_pb2.ListHostsResponse:
        target = await self._route.operator_or_redirect(context)
        return await target.ListHosts(request, context)

    async def ListGpus(  # noqa: N802
        self, request: operator_pb2.ListGpusRequest, context: _Context
    ) -> operator_pb2.ListGpusResponse:
        target = await self._route.operator_or_redirect(context)
        return await target.ListGpus(request, context)

    async def Failover(  # noqa: N802
        self, request: operator_pb2.FailoverRequest, context: _Context
    ) -> operator_pb2.FailoverResponse:
        await self._auth.require(context, "Failover")
        target = await self._route.operator_or_redirect(context)
        return await target.Failover(request, context)

    async def Drain(  # noqa: N802
        self, request: operator_pb2.DrainRequest, context: _Context
    ) -> operator_pb2.DrainResponse:
        await self._auth.require(context, "Drain")
        target = await self._route.operator_or_redirect(context)
        return await target.Drain(request, context)

    async def ListSwitches(  # noqa: N802
        self, request: operator_pb2.ListSwitchesRequest, context: _Context
    ) -> operator_pb2.ListSwitchesResponse:
        target = await self._route.operator_or_redirect(context)
        return await target.ListSwitches(request, context)

    async def ListCircuits(  # noqa: N802
        self, request: operator_pb2.ListCircuitsRequest, context: _Context
    ) -> operator_pb2.ListCircuitsResponse:
        target = await self._route.operator_or_redirect(context)
        return await target.ListCircuits(request, context)

    async def ListJobs(  # noqa: N802
        self, request: operator_pb2.ListJobsRequest, context: _Context
    ) -> operator_pb2.ListJobsResponse:
        target = await self._route.operator_or_redirect(context)
        return await target.ListJobs(request, context)

    async def StreamEvents(  # noqa: N802
        self, request: operator_pb2.StreamEventsRequest, context: _Context
    ) -> AsyncIterator[operator_pb2.FabricEvent]:
        # an async generator function: grpc.aio serves only those as async streams
        target = await self._route.operator_or_redirect(context)
        async for event in target.StreamEvents(request, context):
            yield event

    async def ListAlarms(  # noqa: N802
        self, request: operator_pb2.ListAlarmsRequest, context: _Context
    ) -> operator_pb2.ListAlarmsResponse:
        target = await self._route.operator_or_redirect(context)
        return await target.ListAlarms(request, context)

    async def ListPorts(  # noqa: N802
        self, request: operator_pb2.ListPortsRequest, context: _Context
    ) -> operator_pb2.ListPortsResponse:
        target = await self._route.operator_or_redirect(context)
        return await target.ListPorts(request, context)

    async def SetMaintenance(  # noqa: N802
        self, request: operator_pb2.SetMaintenanceRequest, context: _Context
    ) -> operator_pb2.SetMaintenanceResponse:
        await self._auth.require(context, "SetMaintenance")
        target = await self._route.operator_or_redirect(context)
        return await target.SetMaintenance(request, context)

    async def Undrain(  # noqa: N802
        self, request: operator_pb2.UndrainRequest, context: _Context
    ) -> operator_pb2.UndrainResponse:
        await self._auth.require(context, "Undrain")
        target = await self._route.operator_or_redirect(context)
        return await target.Undrain(request, context)

    async def ClearGpu(  # noqa: N802
        self, request: operator_pb2.ClearGpuRequest, context: _Context
    ) -> operator_pb2.ClearGpuResponse:
        await self._auth.require(context, "ClearGpu")
        target = await self._route.operator_or_redirect(context)
        return await target.ClearGpu(request, context)

    async def RemoveJob(  # noqa: N802
        self, request: operator_pb2.RemoveJobRequest, context: _Context
    ) -> operator_pb2.RemoveJobResponse:
        who = await self._auth.require(context, "RemoveJob")
        if not request.reason:
            request.reason = f"unregistered by operator {who}"
        target = await self._route.operator_or_redirect(context)
        return await target.RemoveJob(request, context)

    # Answered by the replica itself (its own config file, its own view of the election).
    async def Reload(  # noqa: N802
        self, request: operator_pb2.ReloadRequest, context: _Context
    ) -> operator_pb2.ReloadResponse:
        await self._auth.require(context, "Reload")
        if self._reload is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "Reload: this replica runs in-process (demo, tests), not from "
                                "a config file: lightrail controller --config FILE reloads")
        outcome = await self._reload("rpc")
        return operator_pb2.ReloadResponse(applied=outcome.applied, changed=outcome.changed,
                                           error=outcome.error or "", path=outcome.path)

    async def GetLeader(  # noqa: N802
        self, request: operator_pb2.GetLeaderRequest, context: _Context
    ) -> operator_pb2.GetLeaderResponse:
        """This replica's view of the election, leader or standby (never redirected)."""
        route = self._route
        if route.leader_view is None:
            return operator_pb2.GetLeaderResponse(address=route.leader_address() or "",
                                                  replica_id=route.replica_id)
        view = route.leader_view()
        return operator_pb2.GetLeaderResponse(
            leader_id=view.leader_id or "", address=view.address or "",
            replica_id=route.replica_id, transitions=view.transitions,
            leading_for_s=view.leading_for_s)


def add_routed_services(server: grpc.aio.Server, route: LeaderRoute,
                        auth: OperatorAuth | None = None, reload: Reloader | None = None) -> None:
    """Register the routed AgentService and OperatorService and the health service of
    ``route`` on ``server`` (before it starts); mutating operator calls are checked by
    ``auth`` (None: no operator configured, loopback callers only); ``reload`` answers the
    Reload call (None: FAILED_PRECONDITION, no config file to reload)."""
    agent_pb2_grpc.add_AgentServiceServicer_to_server(RoutedAgentService(route), server)
    operator_pb2_grpc.add_OperatorServiceServicer_to_server(
        RoutedOperatorService(route, auth if auth is not None else OperatorAuth(()), reload),
        server)
    health_pb2_grpc.add_HealthServicer_to_server(route.health, server)


__all__ = [
    "AGENT_SERVICE",
    "HEALTH_SERVICES",
    "OPERATOR_SERVICE",
    "REPLICA_HEALTH",
    "LeaderRoute",
    "Reloader",
    "RoutedAgentService",
    "RoutedOperatorService",
    "add_routed_services",
]
