"""OperatorService servicer: read-only views for the operator CLI
(proto/lightrail/v1/operator.proto)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import grpc
from lightrail.v1 import operator_pb2, operator_pb2_grpc

from controller.fabric import Fabric
from controller.phase_service import PhaseService, ReconfigurationDone

VERSION = "0.1.0"


class OperatorServicer(operator_pb2_grpc.OperatorServiceServicer):
    """Answers from the coordinator's view (confirmed cross-connects) and the fabric."""

    def __init__(
        self,
        fabric: Fabric,
        service: PhaseService,
        replica_id: str,
        is_leader: Callable[[], bool],
    ) -> None:
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
        return operator_pb2.GetStatusResponse(
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

    async def ListSwitches(  # noqa: N802
        self,
        request: operator_pb2.ListSwitchesRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> operator_pb2.ListSwitchesResponse:
        coord = self._service.coordinator
        out = []
        for sid in sorted(self._fabric.switches):
            sw = self._fabric.switches[sid]
            out.append(
                operator_pb2.SwitchInfo(
                    switch_id=sid,
                    model=sw.model,
                    kind=sw.capabilities.kind.value,
                    port_count=sw.capabilities.port_count,
                    rail=sw.rail if sw.rail is not None else 0,
                    has_rail=sw.rail is not None,
                    reconfiguration_delay_s=sw.reconfiguration_delay_s,
                    cross_connects=len(coord.confirmed(sid)),
                    reconfigurations=self._reconf_by_switch[sid],
                )
            )
        return operator_pb2.ListSwitchesResponse(switches=out)

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
                )
            )
        return operator_pb2.ListJobsResponse(jobs=out)
