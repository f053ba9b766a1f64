"""The controller daemon: wires config, etcd, leader election, drivers, reconciler, coordinator,
gRPC services and metrics into one ``asyncio.TaskGroup`` (DESIGN.md "Style").

Start-up order: connect to etcd -> win the leader lease -> store the inventory -> open drivers
-> read every switch back -> recover jobs from etcd -> serve gRPC and /metrics. On takeover or
restart, the switches are the truth about cross-connects; etcd holds intent (jobs, plans).

Self-fencing: when the leader lease cannot be renewed in time, the daemon stops answering phase
calls and exits with ``LeadershipLost`` before another replica could take over; the supervisor
(systemd, Kubernetes) restarts it and it campaigns again.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from lightrail.controller.api.agent_service import AgentServicer
from lightrail.controller.api.operator_service import OperatorServicer
from lightrail.controller.config import Config, build_fabric
from lightrail.controller.core.advisor import CostAdvisor
from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.core.costmodel import LinkModel
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.fabric import Fabric
from lightrail.controller.runtime import metrics
from lightrail.controller.runtime.events import EventBus
from lightrail.controller.runtime.failover import FailoverManager
from lightrail.controller.runtime.phase_service import PhaseService
from lightrail.controller.runtime.reconciler import Reconciler
from lightrail.controller.store.election import LeaderElection
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.health import EtcdHealthStore
from lightrail.controller.store.jobs import CorruptJobRecord, EtcdJobRepository
from lightrail.controller.store.writer import CoalescingWriter
from lightrail.drivers.base import Driver
from lightrail.drivers.registry import DriverRegistry
from lightrail.v1 import agent_pb2_grpc, operator_pb2_grpc

log = structlog.get_logger(__name__)


class LeadershipLost(RuntimeError):
    """The leader lease could not be renewed; the daemon fenced itself and must restart."""


@dataclass(frozen=True, slots=True)
class RunningController:
    """Handed to ``on_started``: where the running controller listens."""

    replica_id: str
    grpc_target: str
    metrics_url: str
    fabric: Fabric
    service: PhaseService = field(repr=False)


def fabric_to_json(fabric: Fabric) -> dict[str, object]:
    """The inventory as stored under ``/lightrail/v1/inventory``."""
    return {
        "name": fabric.name,
        "hosts": [
            {"name": h.name, "failure_domain": h.failure_domain, "gpus": h.gpu_count,
             "spare": h.spare}
            for h in fabric.hosts.values()
        ],
        "switches": [
            {"id": s.switch_id, "model": s.model, "kind": s.capabilities.kind.value,
             "ports": s.capabilities.port_count, "rail": s.rail,
             "reconfiguration_delay_s": s.reconfiguration_delay_s}
            for s in fabric.switches.values()
        ],
        "wiring": [
            {"host": e.endpoint_id.host, "nic": e.endpoint_id.nic, "gpu": e.gpu, "rail": e.rail,
             "switch": e.switch_id, "tx_port": e.tx_port, "rx_port": e.rx_port}
            for e in fabric.endpoints.values()
        ],
    }


async def run_controller(
    cfg: Config,
    stop: asyncio.Event,
    *,
    drivers: DriverRegistry | None = None,
    on_started: Callable[[RunningController], None] | None = None,
) -> None:
    """Run the daemon until ``stop`` is set. ``drivers`` builds each switch's driver by its
    ``model`` (default: the built-in device families only); the composition root registers
    what else it serves, e.g. the emulator's ``model: emulated``
    (``lightrail.controller.cli.drivers.driver_registry``).

    Raises ``LeadershipLost`` after self-fencing, ``StoreError`` when etcd is unreachable at
    start, ``DriverError`` when a switch cannot be read back at start; a bug in any task
    propagates (fail loud).
    """
    fabric = build_fabric(cfg.fabric)
    ccfg = cfg.controller
    if drivers is None:
        drivers = DriverRegistry()
    log_ = log.bind(replica=ccfg.replica_id, fabric=fabric.name)
    store = EtcdStore.connect(cfg.etcd.endpoints[0])
    async with store:
        election = LeaderElection(store, ccfg.replica_id,
                                  ttl_s=max(2, round(cfg.etcd.lease_ttl_s)))
        log_.info("campaigning", endpoint=cfg.etcd.endpoints[0])
        campaign = asyncio.ensure_future(election.campaign())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({campaign, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not campaign.done():
            campaign.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await campaign
            return
        stopper.cancel()
        campaign.result()
        metrics.LEADER.set(1)
        log_.info("leader")
        try:
            await _serve(cfg, fabric, store, election, drivers, stop, on_started)
        finally:
            metrics.LEADER.set(0)
            await _bounded("resign", election.resign(), ccfg.shutdown_timeout_s)


async def _serve(
    cfg: Config,
    fabric: Fabric,
    store: EtcdStore,
    election: LeaderElection,
    registry: DriverRegistry,
    stop: asyncio.Event,
    on_started: Callable[[RunningController], None] | None,
) -> None:
    ccfg = cfg.controller
    timeout = ccfg.shutdown_timeout_s
    await store.put_json("inventory", fabric_to_json(fabric))
    drivers: dict[str, Driver] = {}
    metrics_server, metrics_thread = None, None
    server: grpc.aio.Server | None = None
    health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
    lost = False
    try:
        for sid, sw in fabric.switches.items():  # inside the try: a failed open closes the rest
            drv = registry.create(sw.spec)
            drivers[sid] = drv
            await drv.open()
        async with asyncio.TaskGroup() as tg:
            writer = CoalescingWriter(store)
            writer_task = tg.create_task(writer.run(), name="etcd-writer")
            # A fenced replica sends no device command: a new leader never races it on a switch.
            reconciler = Reconciler(drivers, may_command=election.is_leader.is_set)
            reconciler.start(tg)
            advisor = CostAdvisor(fabric, LinkModel.from_gbps(
                ccfg.link_gbps, ccfg.link_alpha_us * 1e-6)) if ccfg.reconfigure_or_not else None
            coordinator = PhaseCoordinator(fabric, default_timeout_s=ccfg.admission_timeout_s,
                                           provisioning=ccfg.provisioning,
                                           learn_iterations=ccfg.learn_iterations,
                                           advisor=advisor)
            events = EventBus()
            service = PhaseService(coordinator, reconciler, events, state_writer=writer.put)
            service.start(tg)
            alarm_watchers = [
                tg.create_task(service.watch_alarms(sid, drv.events()), name=f"alarms/{sid}")
                for sid, drv in drivers.items()
            ]
            state = await reconciler.read_back_all()
            for sid, xcs in state.items():
                service.refresh_switch(sid, xcs)
            # A reconfiguration cut short by a crash of the previous leader reads back as made
            # while its light may still be settling: wait one reconfiguration delay before any
            # admission can rely on what was read back.
            await asyncio.sleep(max((sw.reconfiguration_delay_s
                                     for sw in fabric.switches.values()), default=0.0))
            repo = EtcdJobRepository(store)
            await _recover_jobs(repo, coordinator)
            for job_id in coordinator.job_ids():
                coordinator.mark_recovering(job_id, service.now() + ccfg.recovery_grace_s)
            # Layouts and plans live as long as the daemon: keep the cyclic GC from rescanning
            # them on every collection (large jobs hold ~100k plan objects).
            gc.freeze()
            metrics.JOBS.set(len(coordinator.job_ids()))

            def is_leader() -> bool:
                return election.is_leader.is_set()

            health_store = EtcdHealthStore(store, writer.put)
            failover = FailoverManager(service, repo, events,
                                       heartbeat_interval_s=ccfg.heartbeat_interval_s,
                                       heartbeat_deadline_s=ccfg.heartbeat_deadline_s,
                                       store=health_store)
            failover.restore_failed(await health_store.load_failed())
            failover.start(tg)
            server = grpc.aio.server()
            agent_pb2_grpc.add_AgentServiceServicer_to_server(
                AgentServicer(service, repo, events, is_leader, failover), server)
            operator_pb2_grpc.add_OperatorServiceServicer_to_server(
                OperatorServicer(fabric, service, ccfg.replica_id, is_leader, failover), server)
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            port = server.add_insecure_port(ccfg.listen)
            host = ccfg.listen.rsplit(":", 1)[0]
            await server.start()
            await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
            mhost, mport = ccfg.metrics_listen.rsplit(":", 1)
            metrics_server, metrics_thread = start_http_server(
                int(mport), addr=mhost, registry=metrics.REGISTRY)
            metrics_url = f"http://{mhost}:{metrics_server.server_port}/metrics"
            running = RunningController(ccfg.replica_id, f"{host}:{port}", metrics_url, fabric,
                                        service)
            log.info("serving", grpc=running.grpc_target, metrics=metrics_url,
                     jobs=len(coordinator.job_ids()),
                     cross_connects=sum(len(x) for x in state.values()))
            if on_started is not None:
                on_started(running)
            fenced = asyncio.ensure_future(election.fenced.wait())
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({fenced, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            fenced.cancel()
            lost = election.fenced.is_set()
            await health_servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
            service.cancel_all(
                ErrorCode.NOT_LEADER if lost else ErrorCode.CANCELLED,
                "controller lost its leader lease" if lost else "controller shutting down",
            )
            await server.stop(grace=min(1.0, timeout))
            for watcher in alarm_watchers:
                watcher.cancel()
            await failover.stop(timeout)
            await service.drain(timeout)
            await writer.flush(timeout)
            writer_task.cancel()
            await reconciler.stop(timeout)
        # raised outside the TaskGroup, so callers see it, not an ExceptionGroup
        if lost:
            raise LeadershipLost("leader lease not renewed within half its TTL; fenced")
    finally:
        if server is not None:
            await _bounded("grpc server stop", server.stop(grace=None), timeout)
        if metrics_server is not None:
            ms, mt = metrics_server, metrics_thread

            def stop_metrics() -> None:  # blocking calls: run off the event loop
                ms.shutdown()
                ms.server_close()
                if mt is not None:
                    mt.join(timeout)

            await _bounded("metrics server stop", asyncio.to_thread(stop_metrics), timeout)
        for sid, drv in drivers.items():
            await _bounded(f"driver close {sid}", drv.close(), timeout)


async def _bounded(what: str, aw: Awaitable[object], timeout_s: float) -> None:
    """Await a shutdown step for at most ``timeout_s``; a failure is logged, not raised (the
    rest of the shutdown still runs)."""
    try:
        await asyncio.wait_for(aw, timeout_s)
    except Exception as exc:
        log.warning("shutdown_step_failed", step=what, error=repr(exc))


async def _recover_jobs(repo: EtcdJobRepository, coordinator: PhaseCoordinator) -> None:
    try:
        records = await repo.load_all()
    except CorruptJobRecord as exc:
        # Fail loud: guessing at a job's placement could rewire another tenant's circuits.
        raise CorruptJobRecord(f"job recovery stopped: {exc}") from exc
    for rec in records:
        coordinator.register_job(rec.job_id, rec.tenant, rec.placements, rec.declared_phases)
        log.info("job_recovered", job=rec.job_id, ranks=len(rec.placements))


__all__ = ["LeadershipLost", "RunningController", "run_controller"]
