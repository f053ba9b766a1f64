"""OperatorService servicer: read-only views for the operator CLI
(proto/lightrail/v1/operator.proto)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Callable

import grpc

from lightrail.controller.core.spares import NoSpare, SpareChoice
from lightrail.controller.domain.errors import FailoverError, UnknownJob
from lightrail.controller.domain.events import EventRecord, FabricEventKind, JobEventKind
from lightrail.controller.domain.fabric import Fabric
from lightrail.controller.runtime.alarms import AlarmLog
from lightrail.controller.runtime.failover import FailoverManager, FailoverTimeline
from lightrail.controller.runtime.journal import EventJournal
from lightrail.controller.runtime.liveness import JobLiveness, Retire
from lightrail.controller.runtime.maintenance import SwitchMaintenance
from lightrail.controller.runtime.phase_service import PhaseService, ReconfigurationDone
from lightrail.controller.runtime.ports import PortReader, PortReadError
from lightrail.controller.runtime.reconciler import DeviceContact
from lightrail.controller.runtime.switch_health import SwitchState, switch_state
from lightrail.controller.store.errors import StoreError
from lightrail.drivers.base import DriverError
from lightrail.v1 import operator_pb2, operator_pb2_grpc

VERSION = "0.1.0"


EVENT_KINDS = frozenset(k.value for k in JobEventKind) | frozenset(k.value
                                                                  for k in FabricEventKind)
"""Every event kind a StreamEvents filter may name."""


def fabric_event_pb(record: EventRecord) -> operator_pb2.FabricEvent:
    """``record`` on the operator stream: the fields MQTT's JSON carries
    (``EventRecord.to_json``), an absent job or switch as the empty string."""
    return operator_pb2.FabricEvent(
        event_id=record.event_id, schema_version=record.schema_version, kind=record.kind,
        at_unix_s=record.at_unix_s, job_id=record.job_id or "",
        switch_id=record.switch_id or "", message=record.message, fields=dict(record.fields))


class OperatorServicer(operator_pb2_grpc.OperatorServiceServicer):
    """Answers from the coordinator's view (confirmed cross-connects) and the fabric."""

    def __init__(
        self,
        fabric: Fabric,
        service: PhaseService,
        replica_id: str,
        is_leader: Callable[[], bool],
        failover: FailoverManager | None = None,
        *,
        journal: EventJournal | None = None,
        alarm_log: AlarmLog | None = None,
        retire: Retire | None = None,
        liveness: JobLiveness | None = None,
        maintenance: SwitchMaintenance | None = None,
        ports: PortReader | None = None,
        contacts: Callable[[str], DeviceContact] | None = None,
    ) -> None:
        self._contacts = contacts
        self._journal = journal
        self._alarm_log = alarm_log
        self._failover = failover
        self._retire = retire
        self._liveness = liveness
        self._maintenance = maintenance
        self._ports = ports
        self._fabric = fabric
        self._service = service
        self._replica_id = replica_id
        self._is_leader = is_leader
        self._started = time.monotonic()
        self._reconf_by_switch: Counter[str] = Counter()
        self._reconf_by_job: Counter[str] = Counter()
        self._endpoint_at: dict[tuple[str, int], str] = {}
        for ep in fabric.endpoints.values():
            self._endpoint_at[(ep.switch_id, ep.tx_port)] = str(ep.endpoint_id)
            self._endpoint_at[(ep.switch_id, ep.rx_port)] = str(ep.endpoint_id)
        service.listeners.append(self._count)

    def _count(self, done: ReconfigurationDone) -> None:
        if done.error is None:
            for sid in done.switches:
                self._reconf_by_switch[sid] += 1
            self._reconf_by_job[done.job_id] += 1

    async def GetStatus(  # noqa: N802
        self,
        request: operator_pb2.GetStatusRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.GetStatusResponse:
        coord = self._service.coordinator
        not_up = [f"{sid}: {state.value}" for sid, state in
                  ((sid, self._switch_health(sid)[0]) for sid in sorted(self._fabric.switches))
                  if state is not SwitchState.UP]
        return operator_pb2.GetStatusResponse(
            switches_not_up=not_up,
            replica_id=self._replica_id,
            leader=self._is_leader(),
            fabric=self._fabric.name,
            jobs=len(coord.job_ids()),
            switches=len(self._fabric.switches),
            cross_connects=sum(len(coord.confirmed(s)) for s in self._fabric.switches),
            reconfigurations=sum(self._reconf_by_job.values()),
            uptime_s=time.monotonic() - self._started,
            version=VERSION,
        )

    async def ListHosts(  # noqa: N802
        self,
        request: operator_pb2.ListHostsRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.ListHostsResponse:
        out = []
        for h in self._fabric.hosts.values():
            wired = [g for g in range(h.gpu_count) if self._fabric.has_gpu(h.name, g)]
            out.append(operator_pb2.HostInfo(name=h.name, failure_domain=h.failure_domain,
                                             gpus=h.gpu_count, spare=h.spare, wired_gpus=wired))
        return operator_pb2.ListHostsResponse(hosts=out)

    async def ListGpus(  # noqa: N802
        self,
        request: operator_pb2.ListGpusRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.ListGpusResponse:
        coord = self._service.coordinator
        job_of = coord.gpus_in_use()  # (host, gpu) -> job id
        rank_of: dict[tuple[str, int], int] = {}  # (host, gpu) -> rank in that job
        for job_id in coord.job_ids():
            for p in coord.job(job_id).placements:
                rank_of[(p.host, p.gpu)] = p.rank
        out = []
        for h in self._fabric.hosts.values():
            age = self._failover.heartbeat_age_s(h.name) if self._failover else None
            for g in range(h.gpu_count):
                rec = self._failover.record(h.name, g) if self._failover else None
                rank = rank_of.get((h.name, g))
                out.append(operator_pb2.GpuInfo(
                    host=h.name, gpu=g, failure_domain=h.failure_domain, spare_host=h.spare,
                    state=rec.state.value if rec else "unreported",
                    reason=rec.reason if rec else "",
                    job_id=job_of.get((h.name, g), ""),
                    rank=rank if rank is not None else 0, has_rank=rank is not None,
                    heartbeat_age_s=age))  # absent (None) when no heartbeat was seen
        return operator_pb2.ListGpusResponse(gpus=out)

    @staticmethod
    def _timeline_pb(tl: FailoverTimeline) -> operator_pb2.FailoverResponse:
        return operator_pb2.FailoverResponse(
            job_id=tl.job_id, rank=tl.rank, from_host=tl.from_host, from_gpu=tl.from_gpu,
            to_host=tl.to_host, to_gpu=tl.to_gpu, planned_s=tl.planned_s,
            device_confirmed_s=tl.device_confirmed_s, job_notified_s=tl.job_notified_s)

    async def Failover(  # noqa: N802
        self,
        request: operator_pb2.FailoverRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.FailoverResponse:
        if self._failover is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "failover is not enabled")
        assert self._failover is not None
        spare = SpareChoice(request.spare_host, request.spare_gpu) if request.spare_host else None
        try:
            tl = await self._failover.failover(request.job_id, request.rank,
                                               request.reason or "manual failover",
                                               spare=spare)
        except UnknownJob:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"job_id: unknown job {request.job_id!r}")
        except NoSpare as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, exc.reason)
        except FailoverError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except DriverError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return self._timeline_pb(tl)

    async def Drain(  # noqa: N802
        self,
        request: operator_pb2.DrainRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.DrainResponse:
        if self._failover is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "failover is not enabled")
        assert self._failover is not None
        if request.host not in self._fabric.hosts:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"host: unknown host {request.host!r}")
        try:
            tls = await self._failover.drain(request.host, request.reason or "operator")
        except NoSpare as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, exc.reason)
        except (FailoverError, DriverError) as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return operator_pb2.DrainResponse(failovers=[self._timeline_pb(t) for t in tls])

    async def ListSwitches(  # noqa: N802
        self,
        request: operator_pb2.ListSwitchesRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.ListSwitchesResponse:
        coord = self._service.coordinator
        in_maintenance = coord.maintenance()
        out = []
        for sid in sorted(self._fabric.switches):
            sw = self._fabric.switches[sid]
            state, contact, down_s = self._switch_health(sid)
            known = state is not SwitchState.UNREACHABLE and not coord.unknown_ports(sid)
            out.append(
                operator_pb2.SwitchInfo(
                    state=state.value,
                    last_error=contact.last_error or "",
                    last_error_unix_s=contact.last_error_unix_s,
                    last_contact_unix_s=contact.last_ok_unix_s,
                    unreachable_for_s=down_s,
                    switch_id=sid,
                    model=sw.model,
                    kind=sw.capabilities.kind.value,
                    port_count=sw.capabilities.port_count,
                    rail=sw.rail if sw.rail is not None else 0,
                    has_rail=sw.rail is not None,
                    reconfiguration_delay_s=sw.reconfiguration_delay_s,
                    cross_connects=len(coord.confirmed(sid)) if known else None,
                    reconfigurations=self._reconf_by_switch[sid],
                    maintenance=sid in in_maintenance,
                    maintenance_reason=in_maintenance.get(sid, ""),
                )
            )
        return operator_pb2.ListSwitchesResponse(switches=out)

    def _switch_health(self, switch_id: str) -> tuple[SwitchState, DeviceContact, float | None]:
        """The switch's state (``switch_health.switch_state``), how its device last answered,
        and for how long it has been unreachable (None unless it is)."""
        coord = self._service.coordinator
        contact = (self._contacts(switch_id) if self._contacts is not None
                   else DeviceContact(None, None, None, None))
        outage = coord.unreachable().get(switch_id)
        state = switch_state(contact, maintenance=switch_id in coord.maintenance(),
                             unreachable=outage is not None,
                             unknown_ports=bool(coord.unknown_ports(switch_id)))
        down_s = (self._service.now() - outage.since_s if outage is not None
                  and state is SwitchState.UNREACHABLE else None)
        return state, contact, down_s

    async def ListCircuits(  # noqa: N802
        self,
        request: operator_pb2.ListCircuitsRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.ListCircuitsResponse:
        coord = self._service.coordinator
        if request.switch_id and request.switch_id not in self._fabric.switches:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"switch_id: unknown switch {request.switch_id!r}")
        if request.job_id and request.job_id not in coord.job_ids():
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"job_id: unknown job {request.job_id!r}")
        out = []
        for sid in sorted(self._fabric.switches):
            if request.switch_id and sid != request.switch_id:
                continue
            for xc in sorted(coord.confirmed(sid)):
                owner = coord.owner_of_port(sid, xc.ingress) or ""
                if request.job_id and owner != request.job_id:
                    continue
                out.append(
                    operator_pb2.CrossConnectInfo(
                        switch_id=sid,
                        ingress=xc.ingress,
                        egress=xc.egress,
                        from_endpoint=self._endpoint_at.get((sid, xc.ingress), ""),
                        to_endpoint=self._endpoint_at.get((sid, xc.egress), ""),
                        job_id=owner,
                    )
                )
        return operator_pb2.ListCircuitsResponse(cross_connects=out)

    async def ListJobs(  # noqa: N802
        self,
        request: operator_pb2.ListJobsRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.ListJobsResponse:
        coord = self._service.coordinator
        out = []
        for job_id in coord.job_ids():
            layout = coord.job(job_id)
            stats = coord.stats(job_id)
            out.append(
                operator_pb2.JobInfo(
                    job_id=job_id,
                    tenant=coord.tenant(job_id),
                    world_size=layout.world_size,
                    hosts=list(layout.hosts),
                    phases_admitted=stats.admitted,
                    reconfigurations=stats.reconfigurations,
                    current_phase=stats.current_phase,
                    provisioning_hits=stats.provisioning_hits,
                    provisioning_late=stats.provisioning_late,
                    provisioning_misses=stats.provisioning_misses,
                    schedule_learned=stats.schedule_learned,
                    idle_s=None if self._liveness is None else self._liveness.idle_s(job_id),
                )
            )
        return operator_pb2.ListJobsResponse(jobs=out)

    async def RemoveJob(  # noqa: N802
        self,
        request: operator_pb2.RemoveJobRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.RemoveJobResponse:
        """Unregister a job now (``AgentServicer.retire_job``): NOT_FOUND naming ``job_id``
        for an unknown job, UNAVAILABLE when etcd refuses the delete."""
        if self._retire is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "RemoveJob: not served here")
        assert self._retire is not None
        try:
            removed = await self._retire(request.job_id, request.reason or "unregistered")
        except StoreError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"job {request.job_id!r} left the coordinator, but the state "
                                f"store did not delete its record: {exc}")
        if not removed:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"job_id: unknown job {request.job_id!r}")
        return operator_pb2.RemoveJobResponse(job_id=request.job_id)


    # --- events and alarms (issue 12 section 1) ----------------------------------------------

    STREAM_BUFFER = 1000
    """Events a StreamEvents caller may fall behind before its stream ends
    (RESOURCE_EXHAUSTED)."""

    async def StreamEvents(  # noqa: N802
        self,
        request: operator_pb2.StreamEventsRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> AsyncIterator[operator_pb2.FabricEvent]:
        """The recent events the controller keeps (``EventJournal.recent``), then with
        ``follow`` every new one until the caller cancels; only ``job_id``'s and ``kinds``
        when given (an unknown kind is INVALID_ARGUMENT naming it). A caller that falls
        ``STREAM_BUFFER`` events behind gets RESOURCE_EXHAUSTED."""
        if self._journal is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "StreamEvents: no event journal")
        assert self._journal is not None
        unknown = sorted(set(request.kinds) - EVENT_KINDS)
        if unknown:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"kinds: unknown event kind {unknown[0]!r} (expected one of "
                                f"{', '.join(sorted(EVENT_KINDS))})")
        job_id = request.job_id or None
        kinds = frozenset(request.kinds)
        # subscribe before reading the ring: no event falls between the two
        sub = self._journal.subscribe(self.STREAM_BUFFER) if request.follow else None
        try:
            seen: set[str] = set()
            for record in self._journal.recent(job_id, kinds):
                seen.add(record.event_id)
                yield fabric_event_pb(record)
            if sub is None:
                return
            while True:
                record = await sub.get()
                if sub.dropped:
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                        f"the stream fell {self.STREAM_BUFFER} events behind")
                if record.event_id in seen:
                    seen.discard(record.event_id)
                    continue
                if (job_id is None or record.job_id == job_id) and (
                        not kinds or record.kind in kinds):
                    yield fabric_event_pb(record)
        finally:
            if sub is not None:
                self._journal.unsubscribe(sub)

    async def ListAlarms(  # noqa: N802
        self,
        request: operator_pb2.ListAlarmsRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.ListAlarmsResponse:
        """The active alarms (``AlarmLog.entries``: oldest first), with ``include_cleared``
        also the recently cleared ones; only ``switch_id``'s when given (NOT_FOUND naming an
        unknown switch)."""
        if request.switch_id and request.switch_id not in self._fabric.switches:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"switch_id: unknown switch {request.switch_id!r}")
        entries = [] if self._alarm_log is None else self._alarm_log.entries(
            request.switch_id or None, include_cleared=request.include_cleared)
        return operator_pb2.ListAlarmsResponse(alarms=[
            operator_pb2.AlarmInfo(
                switch_id=e.alarm.switch_id, port=e.alarm.port, condition=e.alarm.condition,
                severity=e.alarm.severity.value, raised_unix_s=e.raised_unix_s,
                description=e.alarm.description, source=e.source,
                cleared=e.cleared_unix_s is not None)
            for e in entries])

    # --- issue 12, being built: each placeholder is replaced by its implementation ----------

    async def ListPorts(  # noqa: N802
        self,
        request: operator_pb2.ListPortsRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.ListPortsResponse:
        """Every port of ``switch_id`` (empty: of every switch), read from the devices
        (``lightrail.controller.runtime.ports``): NOT_FOUND naming an unknown switch,
        UNAVAILABLE naming a switch that does not answer."""
        if self._ports is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "ListPorts: no drivers here")
        assert self._ports is not None
        sid = request.switch_id
        if sid and sid not in self._fabric.switches:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"switch_id: unknown switch {sid!r}")
        out: list[operator_pb2.PortInfo] = []
        for switch_id in [sid] if sid else sorted(self._fabric.switches):
            try:
                readings = await self._ports.read(switch_id)
            except PortReadError as exc:
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            out.extend(operator_pb2.PortInfo(
                switch_id=r.switch_id, port=r.port,
                admin_state=r.admin.value if r.admin else "",
                oper_state=r.oper.value if r.oper else "",
                power_dbm=r.power_dbm, connected_to=r.connected_to,
                endpoint=r.endpoint or "", job_id=r.job_id or "") for r in readings)
        return operator_pb2.ListPortsResponse(ports=out)

    async def SetMaintenance(  # noqa: N802
        self,
        request: operator_pb2.SetMaintenanceRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.SetMaintenanceResponse:
        """Maintenance on/off (``lightrail.controller.runtime.maintenance``), stored in etcd
        before it takes effect: NOT_FOUND naming an unknown switch, UNAVAILABLE when etcd
        refuses (nothing changed then)."""
        if self._maintenance is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                "SetMaintenance: not served here")
        assert self._maintenance is not None
        try:
            rec = await self._maintenance.set(request.switch_id, request.on, request.reason)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except StoreError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"switch {request.switch_id!r}: maintenance not stored in "
                                f"etcd, nothing changed: {exc}")
        return operator_pb2.SetMaintenanceResponse(switch_id=request.switch_id,
                                                   maintenance=rec is not None)

    async def _known_host(self, host: str,
                          context: grpc.aio.ServicerContext) -> FailoverManager:  # type: ignore[type-arg]
        """The failover manager, once ``host`` is known; aborts the call otherwise."""
        if self._failover is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "failover is not enabled")
        assert self._failover is not None
        if host not in self._fabric.hosts:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"host: unknown host {host!r}")
        return self._failover

    async def Undrain(  # noqa: N802
        self,
        request: operator_pb2.UndrainRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.UndrainResponse:
        """Return a drained host's GPUs to service (``FailoverManager.undrain``): NOT_FOUND
        naming an unknown host, FAILED_PRECONDITION naming a host that is not drained."""
        manager = await self._known_host(request.host, context)
        try:
            gpus = manager.undrain(request.host)
        except FailoverError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return operator_pb2.UndrainResponse(host=request.host, gpus=gpus)

    async def ClearGpu(  # noqa: N802
        self,
        request: operator_pb2.ClearGpuRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.ClearGpuResponse:
        """Forget failed/degraded records (``FailoverManager.clear``); answers the GPUs
        concerned as ``ListGpus`` shows them now. NOT_FOUND naming an unknown host or GPU."""
        manager = await self._known_host(request.host, context)
        gpu = request.gpu if request.HasField("gpu") else None
        try:
            manager.clear(request.host, gpu)
        except FailoverError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        listed = await self.ListGpus(operator_pb2.ListGpusRequest(), context)
        return operator_pb2.ClearGpuResponse(gpus=[
            g for g in listed.gpus if g.host == request.host and (gpu is None or g.gpu == gpu)])

    async def Reload(  # noqa: N802
        self,
        request: operator_pb2.ReloadRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.ReloadResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            "Reload: answered by RoutedOperatorService")

    async def GetLeader(  # noqa: N802
        self,
        request: operator_pb2.GetLeaderRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.GetLeaderResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            "GetLeader: answered by RoutedOperatorService")
