"""The controller daemon: wires config, etcd, leader election, drivers, reconciler, coordinator,
gRPC services and metrics into one ``asyncio.TaskGroup`` (DESIGN.md "Style").

Start-up order: connect to etcd -> serve gRPC (health NOT_SERVING, every phase and operator
call redirected to the leader, ``lightrail.controller.api.routing``) and /metrics
(``lightrail_leader 0``) as a standby -> win the leader lease, publishing the advertised
address in the leader key -> store the inventory -> open drivers -> read every switch back ->
recover jobs from etcd -> hand the calls to the leader's servicers (health SERVING). A standby
that wins the election becomes the leader in the same process, on the gRPC server it already
runs. On takeover or restart, the switches are the truth about cross-connects; etcd holds
intent (jobs, plans).

Self-fencing: when the leader lease cannot be renewed in time, the daemon stops answering phase
calls and exits with ``LeadershipLost`` before another replica could take over; the supervisor
(systemd, Kubernetes) restarts it and it rejoins as a standby. A fenced leader does not turn
back into a standby in the same process: its coordinator, reconciler and drivers hold the state
of a reign another replica may already have changed, and a fresh process rebuilds all of it
from the switches and etcd, the one path takeover already proves.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import structlog
from grpc_health.v1 import health
from prometheus_client import start_http_server

from lightrail.controller.api.agent_service import AgentServicer
from lightrail.controller.api.auth import OperatorAuth, OperatorIdentity
from lightrail.controller.api.operator_service import VERSION, OperatorServicer
from lightrail.controller.api.routing import LeaderRoute, LeaderView, add_routed_services
from lightrail.controller.config import (
    WILDCARD_HOSTS,
    Config,
    ControllerSection,
    EtcdSection,
    build_fabric,
)
from lightrail.controller.core.advisor import CostAdvisor
from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.core.costmodel import LinkModel
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.events import leadership_event
from lightrail.controller.domain.fabric import Fabric
from lightrail.controller.reload import ConfigReloader
from lightrail.controller.runtime import metrics
from lightrail.controller.runtime.alarms import DeviceAlarms
from lightrail.controller.runtime.events import EventBus
from lightrail.controller.runtime.failover import FailoverManager
from lightrail.controller.runtime.journal import EventJournal
from lightrail.controller.runtime.liveness import JobLiveness, expire_idle_jobs
from lightrail.controller.runtime.maintenance import SwitchMaintenance
from lightrail.controller.runtime.mqtt import (
    EventOutputs,
    MqttBridge,
    MqttSettings,
    MqttSetupError,
    MqttTls,
    ReplicaStatus,
    read_credential,
)
from lightrail.controller.runtime.phase_service import PhaseService
from lightrail.controller.runtime.ports import PortReader
from lightrail.controller.runtime.power import PowerPoller
from lightrail.controller.runtime.reconciler import Reconciler
from lightrail.controller.store.client import TlsFiles
from lightrail.controller.store.election import LeaderElection
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.health import EtcdHealthStore
from lightrail.controller.store.jobs import CorruptJobRecord, EtcdJobRepository
from lightrail.controller.store.maintenance import EtcdMaintenanceStore
from lightrail.controller.store.writer import CoalescingWriter
from lightrail.drivers.base import CommandGate, CrossConnect, Driver
from lightrail.drivers.credentials import CredentialEnviron
from lightrail.drivers.options import DriverContext
from lightrail.drivers.registry import DriverRegistry

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = structlog.get_logger(__name__)


class LeadershipLost(RuntimeError):
    """The leader lease could not be renewed; the daemon fenced itself and must restart."""


class TlsSetupError(ValueError):
    """``controller.tls`` names files the gRPC server cannot use; the message names them."""


@dataclass(frozen=True, slots=True)
class RunningController:
    """Handed to ``on_started``: where the running controller listens."""

    replica_id: str
    grpc_target: str
    metrics_url: str
    fabric: Fabric
    service: PhaseService = field(repr=False)


@dataclass(frozen=True, slots=True)
class ServingReplica:
    """Handed to ``on_serving``: where a replica serves from start, standby or leader.
    ``grpc_target``: the bound gRPC address; ``advertise``: the address it publishes in the
    leader key while it leads (``controller.advertise``); ``metrics_url``: its /metrics page."""

    replica_id: str
    grpc_target: str
    advertise: str
    metrics_url: str


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
    on_serving: Callable[[ServingReplica], None] | None = None,
    reloader: ConfigReloader | None = None,
) -> None:
    """Run the daemon until ``stop`` is set. ``drivers`` builds each switch's driver by its
    ``model`` (default: the built-in device families only); the composition root registers
    what else it serves, e.g. the emulator's ``model: emulated``
    (``lightrail.controller.cli.drivers.driver_registry``). ``on_serving`` is called once gRPC
    and /metrics serve (as a standby), ``on_started`` once this replica leads and serves the
    phase calls. ``reloader`` (``lightrail controller --config``) answers the Reload call and
    reaches the operator check and, while leading, the coordinator and event bus.

    Raises ``LeadershipLost`` after self-fencing, ``StoreError`` when etcd is unreachable at
    start, ``DriverError`` when a switch cannot be read back at start; a bug in any task
    propagates (fail loud).
    """
    fabric = build_fabric(cfg.fabric)
    metrics.set_reconfiguration_delays(
        {sid: sw.reconfiguration_delay_s for sid, sw in fabric.switches.items()})
    ccfg = cfg.controller
    if drivers is None:
        drivers = DriverRegistry()
    log_ = log.bind(replica=ccfg.replica_id, fabric=fabric.name)
    mqtt = _mqtt_settings(cfg, fabric)  # raises MqttSetupError before any start
    store = connect_store(cfg.etcd)
    async with store:
        front = _Front()
        try:
            election = await _start_front(front, ccfg, store, cfg.etcd.lease_ttl_s, reloader)
            log_.info("standby", grpc=front.grpc_target, advertise=front.route.own_address,
                      metrics=front.metrics_url)
            if on_serving is not None:
                on_serving(ServingReplica(ccfg.replica_id, front.grpc_target,
                                          front.route.own_address, front.metrics_url))
            log_.info("campaigning", endpoints=cfg.etcd.endpoints)
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
            metrics.set_leader(True)
            log_.info("leader")
            try:
                await _serve(cfg, fabric, store, election, drivers, stop, on_started, front,
                             reloader, mqtt=mqtt)
            finally:
                metrics.set_leader(False)
                await _bounded("resign", election.resign(), ccfg.shutdown_timeout_s)
        finally:
            await _close_front(front, ccfg.shutdown_timeout_s)


async def _serve(
    cfg: Config,
    fabric: Fabric,
    store: EtcdStore,
    election: LeaderElection,
    registry: DriverRegistry,
    stop: asyncio.Event,
    on_started: Callable[[RunningController], None] | None,
    front: _Front,
    reloader: ConfigReloader | None = None,
    mqtt: MqttSettings | None = None,
) -> None:
    """Serve as the leader until ``stop`` is set or the lease is lost, in the module's start-up
    order: store the inventory, open the drivers, start the core (``_start_core``), read every
    switch back, recover the jobs, start failover, hand ``front``'s calls to the leader's
    servicers, call ``on_started``; then the ordered shutdown (``_shut_down``) and, whatever
    happened, close the drivers opened (``_close_opened``). Raises ``LeadershipLost`` when
    fenced."""
    ccfg = cfg.controller
    timeout = ccfg.shutdown_timeout_s
    await store.put_json("inventory", fabric_to_json(fabric))
    opened = _Opened()
    lost = False
    try:
        # inside the try: a failed open closes the rest
        await _open_drivers(fabric, registry, opened.drivers, election.may_command)
        async with asyncio.TaskGroup() as tg:
            core = _start_core(tg, ccfg, fabric, store, election, opened.drivers)
            outputs = await EventOutputs.start(tg, core.journal, _mqtt_bridge(
                mqtt, core, fabric, ccfg.replica_id))
            state = await _read_back_switches(core, fabric)
            repo = EtcdJobRepository(store)
            await _restore_jobs(repo, core)
            health_store = EtcdHealthStore(store, core.writer.put, core.writer.delete)
            failover = await _start_failover(tg, core, repo, health_store, ccfg)
            maintenance = SwitchMaintenance(core.service, EtcdMaintenanceStore(store),
                                            core.events)
            await maintenance.restore()  # before serving: a new leader keeps maintenance
            if core.coordinator.unsynced_hosts():
                tg.create_task(_recovery_verdict(core, failover, ccfg.recovery_grace_s),
                               name="recovery-verdict")

            def is_leader() -> bool:
                return election.is_leader.is_set()

            if reloader is not None:  # reloads now reach the coordinator and the event bus
                reloader.lead(core.coordinator, core.events)
            expiry_s = ccfg.job_idle_expiry_s
            liveness = JobLiveness(time.monotonic) if expiry_s else None
            agents = AgentServicer(core.service, repo, core.events, is_leader, failover,
                                   liveness)
            expiry = None
            if liveness is not None and expiry_s:
                expiry = tg.create_task(
                    expire_idle_jobs(liveness, core.coordinator.job_ids, agents.retire_job,
                                     expiry_s, asyncio.sleep), name="job-expiry")
            await front.route.lead(
                agents,
                OperatorServicer(fabric, core.service, ccfg.replica_id, is_leader, failover,
                                 journal=core.journal, alarm_log=core.alarms.log,
                                 retire=agents.retire_job, liveness=liveness,
                                 maintenance=maintenance,
                                 ports=PortReader(opened.drivers, core.coordinator),
                                 contacts=core.reconciler.contact_of))
            running = RunningController(ccfg.replica_id, front.grpc_target, front.metrics_url,
                                        fabric, core.service)
            log.info("serving", grpc=running.grpc_target, metrics=front.metrics_url,
                     jobs=len(core.coordinator.job_ids()),
                     cross_connects=sum(len(x) for x in state.values()))
            if on_started is not None:
                on_started(running)
            core.events.publish_fabric(leadership_event(
                ccfg.replica_id, front.route.own_address, leading=True, reason="elected"))
            lost = await _until_stopped_or_fenced(election, stop)
            if expiry is not None:  # no job is expired by a replica on its way out
                expiry.cancel()
            core.events.publish_fabric(leadership_event(
                ccfg.replica_id, front.route.own_address, leading=False,
                reason="leader lease lost" if lost else "shutdown"))
            await _shut_down(core, front, failover, lost=lost, timeout_s=timeout)
            await outputs.stop(min(2.0, timeout))
        # raised outside the TaskGroup, so callers see it, not an ExceptionGroup
        if lost:
            raise LeadershipLost("leader lease not renewed within half its TTL; fenced")
    finally:
        await _close_opened(opened, timeout)


@dataclass(frozen=True, slots=True)
class _MetricsServer:
    """The running Prometheus exporter: its WSGI server, the thread serving it, and the URL of
    its ``/metrics`` page."""

    server: WSGIServer
    thread: threading.Thread
    url: str


@dataclass(slots=True)
class _Opened:
    """What ``_serve`` has opened and must close on the way out, whatever happened: the switch
    drivers (by switch id, in opening order). Mutable on purpose: each driver is recorded
    before it is opened, so a failed open still closes everything opened before it."""

    drivers: dict[str, Driver] = field(default_factory=dict)


@dataclass(slots=True)
class _Front:
    """What every replica serves from start, leader or standby, and closes on the way out:
    the gRPC server (routed services and health, ``lightrail.controller.api.routing``) once
    built, the metrics server once started, the route, and the bound addresses. Mutable on
    purpose, like ``_Opened``: each part is recorded as soon as it exists."""

    server: grpc.aio.Server | None = None
    metrics: _MetricsServer | None = None
    route: LeaderRoute = field(init=False)
    grpc_target: str = ""
    metrics_url: str = ""


def _advertised(ccfg: ControllerSection, port: int) -> str:
    """The address published while leading: ``controller.advertise``, else the listen host
    with the bound ``port``; a listen address binding every interface advertises this host's
    name instead (logged: set ``controller.advertise`` when other hosts resolve it
    differently)."""
    if ccfg.advertise is not None:
        return ccfg.advertise
    host = ccfg.listen.rsplit(":", 1)[0]
    if host in WILDCARD_HOSTS:
        name = socket.gethostname()
        log.warning("advertise_defaulted", listen=ccfg.listen, advertise=f"{name}:{port}",
                    hint="set controller.advertise to the address clients dial")
        return f"{name}:{port}"
    return f"{host}:{port}"


async def _start_front(
    front: _Front, ccfg: ControllerSection, store: EtcdStore, lease_ttl_s: float,
    reloader: ConfigReloader | None = None,
) -> LeaderElection:
    """Bind and start ``front``'s gRPC server as a standby (every call redirected, health
    NOT_SERVING) and the /metrics exporter; return the election that campaigns with the
    advertised address (``_advertised``), whose view of the leader the redirects name."""
    server = front.server = grpc.aio.server()
    port = _bind(server, ccfg)
    host = ccfg.listen.rsplit(":", 1)[0]
    front.grpc_target = f"{host}:{port}"
    advertise = _advertised(ccfg, port)
    election = LeaderElection(store, ccfg.replica_id, ttl_s=max(2, round(lease_ttl_s)),
                              address=advertise)

    def leader_address() -> str | None:
        leader = election.leader
        return None if leader is None else leader.address

    def leader_view() -> LeaderView:
        leader, since = election.leader, election.leader_since_s
        return LeaderView(None if leader is None else leader.replica_id,
                          None if leader is None else leader.address, election.transitions,
                          None if leader is None or since is None else time.monotonic() - since)

    front.route = LeaderRoute(leader_address, advertise,
                              health.aio.HealthServicer(),  # type: ignore[attr-defined]
                              replica_id=ccfg.replica_id, leader_view=leader_view)
    auth = _operator_auth(ccfg)
    if reloader is not None:
        reloader.attach_auth(auth)
    add_routed_services(server, front.route, auth, None if reloader is None else reloader.reload)
    await front.route.standby()
    await server.start()
    front.metrics = _start_metrics(ccfg.metrics_listen)
    front.metrics_url = front.metrics.url
    return election


def _is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (``127.0.0.0/8``, ``[::1]``); False
    for the wildcard hosts and everything else."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bind(server: grpc.aio.Server, ccfg: ControllerSection) -> int:
    """Add ``ccfg.listen`` to ``server``, TLS with ``ccfg.tls`` (mTLS when it has a
    ``client_ca_file``), else plaintext with a warning when the address is reachable from
    beyond this host. Returns the bound port. Raises ``TlsSetupError`` naming the files when
    the certificate or key cannot be used, ``RuntimeError`` (gRPC) when the address cannot be
    bound."""
    tls = ccfg.tls
    host = ccfg.listen.rsplit(":", 1)[0]
    if tls is None:
        if not _is_loopback_host(host):
            log.warning("grpc_plaintext_beyond_loopback", listen=ccfg.listen,
                        hint="set controller.tls: agents' and operators' calls, tokens "
                             "included, cross the network unencrypted")
        return server.add_insecure_port(ccfg.listen)
    try:
        key, cert = Path(tls.key_file).read_bytes(), Path(tls.cert_file).read_bytes()
        client_ca = (None if tls.client_ca_file is None
                     else Path(tls.client_ca_file).read_bytes())
    except OSError as exc:
        raise TlsSetupError(f"controller.tls: cannot read {exc.filename}: "
                            f"{exc.strerror or exc}") from None
    credentials = grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None)
    try:
        return server.add_secure_port(ccfg.listen, credentials)
    except RuntimeError as exc:
        raise TlsSetupError(f"controller.tls: cannot serve {ccfg.listen} with cert_file "
                            f"{tls.cert_file!r} and key_file {tls.key_file!r} (not a PEM "
                            f"certificate and its key?): {exc}") from None


def _operator_auth(ccfg: ControllerSection) -> OperatorAuth:
    """Who may make mutating operator calls: ``ccfg.operators``; none configured is logged
    as a warning (loopback callers only)."""
    if not ccfg.operators:
        log.warning("no_operators_configured",
                    hint="mutating operator calls (failover, drain) are accepted only from "
                         "loopback; list controller.operators to allow others")
    return OperatorAuth([OperatorIdentity(o.name, o.token_sha256, o.subject)
                         for o in ccfg.operators])


async def _close_front(front: _Front, timeout_s: float) -> None:
    """Close what ``_start_front`` started, each step bounded by ``timeout_s`` and logged, not
    raised, on failure: the gRPC server, then the metrics server (off the event loop)."""
    if front.server is not None:
        await _bounded("grpc server stop", front.server.stop(grace=None), timeout_s)
    if front.metrics is not None:
        ms = front.metrics

        def stop_metrics() -> None:  # blocking calls: run off the event loop
            ms.server.shutdown()
            ms.server.server_close()
            ms.thread.join(timeout_s)

        await _bounded("metrics server stop", asyncio.to_thread(stop_metrics), timeout_s)


@dataclass(frozen=True, slots=True)
class _Core:
    """The leader's running core: the coalescing etcd writer and its task, the reconciler, the
    coordinator, the event bus, the phase service, one alarm watcher task per switch and the
    power poll task."""

    writer: CoalescingWriter
    writer_task: asyncio.Task[None]
    reconciler: Reconciler
    coordinator: PhaseCoordinator
    events: EventBus
    service: PhaseService
    alarm_watchers: list[asyncio.Task[None]]
    alarms: DeviceAlarms = field(kw_only=True)
    """The one rule of device alarms (the drivers' and MQTT's) and the alarm log."""
    journal: EventJournal = field(kw_only=True)
    """Every event numbered, the recent ones kept (MQTT, ``StreamEvents``)."""
    power_poll: asyncio.Task[None] | None = None
    """The optical power poll (``PowerPoller``), None when ``power_poll_interval_s`` is 0."""


async def _open_drivers(fabric: Fabric, registry: DriverRegistry,
                        drivers: dict[str, Driver], may_command: CommandGate) -> None:
    """Create and open each switch's driver in ``fabric`` order, entering it in ``drivers``
    before opening it (so the caller closes it even when its ``open`` fails). Every driver asks
    ``may_command`` before each command it sends (the leader lease's authority), so a replica
    that lost its lease, even one paused past it, sends nothing. Raises what
    ``DriverRegistry.create`` or ``Driver.open`` raise."""
    for sid, sw in fabric.switches.items():
        drv = registry.create(sw.spec, DriverContext(environ=CredentialEnviron(),
                                                     command_gate=may_command))
        drivers[sid] = drv
        await drv.open()


def _mqtt_settings(cfg: Config, fabric: Fabric) -> MqttSettings | None:
    """The MQTT bridge's settings from ``cfg.mqtt`` (None: no MQTT), credentials read now.
    Raises ``MqttSetupError`` naming the field."""
    m = cfg.mqtt
    if m is None:
        return None
    return MqttSettings(
        host=m.host, port=m.port, topic_prefix=m.topic_prefix or f"lightrail/{fabric.name}",
        client_id=m.client_id or f"lightrail-{cfg.controller.replica_id}",
        keepalive_s=m.keepalive_s, buffer_events=m.buffer_events,
        username=m.username or read_credential("username_env", env=m.username_env),
        password=read_credential("password_env" if m.password_env else "password_file",
                                 env=m.password_env, file=m.password_file),
        tls=None if m.tls is None else MqttTls(m.tls.ca_file, m.tls.cert_file, m.tls.key_file))


def _mqtt_bridge(settings: MqttSettings | None, core: _Core, fabric: Fabric,
                 replica_id: str) -> MqttBridge | None:
    """The MQTT bridge of the leader's ``core`` (None without ``settings``)."""
    if settings is None:
        return None
    return MqttBridge(settings, core.journal, core.alarms.raise_alarm,
                      {sid: sw.capabilities for sid, sw in fabric.switches.items()},
                      ReplicaStatus(replica_id, VERSION, fabric.name))


def _start_core(
    tg: asyncio.TaskGroup,
    ccfg: ControllerSection,
    fabric: Fabric,
    store: EtcdStore,
    election: LeaderElection,
    drivers: dict[str, Driver],
) -> _Core:
    """Build the core and start its tasks in ``tg``: the etcd writer, the reconciler (which
    commands devices only while this replica leads), the coordinator (with the cost advisor
    when ``reconfigure_or_not``), the phase service, one alarm watcher per switch and the
    power poll (every ``power_poll_interval_s`` seconds, unless 0)."""
    writer = CoalescingWriter(store)
    writer_task = tg.create_task(writer.run(), name="etcd-writer")
    # A fenced replica sends no device command: a new leader never races it on a switch.
    reconciler = Reconciler(drivers, may_command=election.may_command)
    reconciler.start(tg)
    advisor = CostAdvisor(fabric, LinkModel.from_gbps(
        ccfg.link_gbps, ccfg.link_alpha_us * 1e-6)) if ccfg.reconfigure_or_not else None
    coordinator = PhaseCoordinator(fabric, default_timeout_s=ccfg.admission_timeout_s,
                                   provisioning=ccfg.provisioning,
                                   learn_iterations=ccfg.learn_iterations,
                                   advisor=advisor, device_wait_s=ccfg.device_wait_s)
    events = EventBus()
    service = PhaseService(coordinator, reconciler, events, state_writer=writer.put)
    service.start(tg)
    # fail fast on a switch that stops answering (issue 14): the service tells the coordinator
    reconciler.reachability_listeners.append(service.switch_reachability)
    alarms = DeviceAlarms(service, events)
    journal = EventJournal(events, ccfg.replica_id)
    alarm_watchers = [
        tg.create_task(alarms.watch(sid, drv.events()), name=f"alarms/{sid}")
        for sid, drv in drivers.items()
    ]
    power_poll = None
    if ccfg.power_poll_interval_s > 0:  # off the phase path; reads only ports in use
        poller = PowerPoller(drivers, reconciler, ccfg.power_poll_interval_s)
        power_poll = tg.create_task(poller.run(), name="power-poll")
    return _Core(writer, writer_task, reconciler, coordinator, events, service, alarm_watchers,
                 power_poll,
                 alarms=alarms, journal=journal)


async def _read_back_switches(core: _Core, fabric: Fabric) -> dict[str, frozenset[CrossConnect]]:
    """Read every switch back into the phase service's view (the switches are the truth about
    cross-connects), then wait the fabric's longest reconfiguration delay. Returns the
    cross-connects read, by switch id. Raises ``DriverError`` when a switch cannot be read."""
    state = await core.reconciler.read_back_all()
    for sid, xcs in state.items():
        core.service.refresh_switch(sid, xcs)
    # A reconfiguration cut short by a crash of the previous leader reads back as made
    # while its light may still be settling: wait one reconfiguration delay before any
    # admission can rely on what was read back.
    await asyncio.sleep(max((sw.reconfiguration_delay_s
                             for sw in fabric.switches.values()), default=0.0))
    return state


async def _restore_jobs(repo: EtcdJobRepository, core: _Core) -> None:
    """Register the jobs stored in etcd, each frozen until its ranks resync or their hosts are
    declared dead (``PhaseCoordinator.mark_recovering``); then freeze the GC generations and
    set the job gauge. Raises ``CorruptJobRecord``."""
    coordinator = core.coordinator
    await _recover_jobs(repo, coordinator)
    for job_id in coordinator.job_ids():
        coordinator.mark_recovering(job_id)
    # Layouts and plans live as long as the daemon: keep the cyclic GC from rescanning
    # them on every collection (large jobs hold ~100k plan objects).
    gc.freeze()
    metrics.JOBS.set(len(coordinator.job_ids()))


async def _recovery_verdict(core: _Core, failover: FailoverManager, window_s: float) -> None:
    """``window_s`` after a restart, the hosts that still keep a recovered job frozen and have
    not been heard from since (no heartbeat) are declared dead: their agents did not come back.
    A host that was heard from is not: its ranks stay frozen until they resync or its
    heartbeat deadline passes (``FailoverManager``'s watchdog). No circuit of a live rank is
    ever unfrozen by this timer."""
    await asyncio.sleep(window_s)
    dead = sorted(h for h in core.coordinator.unsynced_hosts()
                  if failover.heartbeat_age_s(h) is None)
    if dead:
        log.warning("recovery_hosts_dead", hosts=dead, window_s=window_s)
        core.service.hosts_dead(dead)


async def _start_failover(
    tg: asyncio.TaskGroup,
    core: _Core,
    repo: EtcdJobRepository,
    health_store: EtcdHealthStore,
    ccfg: ControllerSection,
) -> FailoverManager:
    """The failover manager, with the GPUs ``health_store`` holds as failed restored, started
    in ``tg`` (heartbeat interval and deadline from ``ccfg``)."""
    failover = FailoverManager(core.service, repo, core.events,
                               heartbeat_interval_s=ccfg.heartbeat_interval_s,
                               heartbeat_deadline_s=ccfg.heartbeat_deadline_s,
                               store=health_store)
    failover.restore_failed(await health_store.load_failed())
    failover.start(tg)
    return failover


def _start_metrics(listen: str) -> _MetricsServer:
    """Start the Prometheus exporter of ``metrics.REGISTRY`` on ``listen`` (``host:port``; port
    0 picks a free one)."""
    mhost, mport = listen.rsplit(":", 1)
    server, thread = start_http_server(int(mport), addr=mhost, registry=metrics.REGISTRY)
    return _MetricsServer(server, thread, f"http://{mhost}:{server.server_port}/metrics")


async def _until_stopped_or_fenced(election: LeaderElection, stop: asyncio.Event) -> bool:
    """Wait until ``stop`` is set or ``election`` fences this replica; True when fenced."""
    fenced = asyncio.ensure_future(election.fenced.wait())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({fenced, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    fenced.cancel()
    return election.fenced.is_set()


async def _shut_down(
    core: _Core,
    front: _Front,
    failover: FailoverManager,
    *,
    lost: bool,
    timeout_s: float,
) -> None:
    """The ordered shutdown inside the task group: redirect new calls and report NOT_SERVING
    (``LeaderRoute.step_down``), fail every waiting rank (NOT_LEADER when ``lost``, else
    CANCELLED), stop gRPC (grace up to 1 s: the process exits after leading), stop the alarm
    watchers, the power poll and failover, drain the phase service, flush the etcd writer, stop the
    reconciler; each wait at most ``timeout_s``."""
    await front.route.step_down()
    core.service.cancel_all(
        ErrorCode.NOT_LEADER if lost else ErrorCode.CANCELLED,
        "controller lost its leader lease" if lost else "controller shutting down",
    )
    if front.server is not None:
        await front.server.stop(grace=min(1.0, timeout_s))
    for watcher in core.alarm_watchers:
        watcher.cancel()
    if core.power_poll is not None:
        core.power_poll.cancel()
    await failover.stop(timeout_s)
    await core.service.drain(timeout_s)
    await core.writer.flush(timeout_s)
    core.writer_task.cancel()
    await core.reconciler.stop(timeout_s)


async def _close_opened(opened: _Opened, timeout_s: float) -> None:
    """Close the drivers ``_serve`` opened, each bounded by ``timeout_s`` and logged, not
    raised, on failure."""
    for sid, drv in opened.drivers.items():
        await _bounded(f"driver close {sid}", drv.close(), timeout_s)


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


__all__ = ["LeadershipLost", "MqttSetupError", "RunningController",
           "ServingReplica", "TlsSetupError",
           "run_controller"]


def connect_store(section: EtcdSection) -> EtcdStore:
    """A store (not yet opened) on every endpoint of ``section``, failing over between them,
    over TLS with ``section.tls``'s files when it is set."""
    tls = section.tls
    files = None if tls is None else TlsFiles(
        ca_file=Path(tls.ca_file),
        cert_file=None if tls.cert_file is None else Path(tls.cert_file),
        key_file=None if tls.key_file is None else Path(tls.key_file),
    )
    return EtcdStore.connect(section.endpoints, tls=files, observe=metrics.observe_etcd_request)
