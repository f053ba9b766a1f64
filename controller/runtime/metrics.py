"""Every Prometheus metric of the controller, declared once (DESIGN.md, "Observability").

Prefix ``lightrail_``; label sets stay small: ``switch``, ``port``, ``job_id``, ``phase``
(collective name), ``method`` (etcd call), ``to`` (leader transitions). The job's label is
``job_id``, not ``job``: Prometheus sets ``job`` to the scrape job and would rename ours
``exported_job``. Every series of a job goes when the job unregisters
(``forget_job``), so a long-running controller does not keep the label sets of every job it
ever served.
All metrics live in ``REGISTRY`` so several controllers in one test process do not collide
with the process-wide default registry.
"""

from __future__ import annotations

import importlib.metadata
import platform
from collections.abc import Mapping

import grpc
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
)

REGISTRY = CollectorRegistry(auto_describe=True)
# The process's own figures (``process_*``: CPU, memory, open files; ``python_*``: GC and
# version), the same on a standby as on the leader; prometheus_client's collectors, which
# read /proc of this process at each scrape.
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_collector)

_LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 120.0,
)
"""Up to the admission timeout and beyond (``admission_timeout_s`` defaults to 30 s): a phase
that waited until its deadline lands in a bucket, not only in +Inf."""

RECONFIGURATIONS = Counter(
    "lightrail_reconfigurations_total",
    "Reconfigurations applied to a switch (one per apply that changed cross-connects).",
    ["switch"],
    registry=REGISTRY,
)
CROSS_CONNECT_CHANGES = Counter(
    "lightrail_cross_connect_changes_total",
    "Cross-connects made or broken on a switch.",
    ["switch", "change"],
    registry=REGISTRY,
)
DEVICE_APPLY_SECONDS = Histogram(
    "lightrail_device_apply_seconds",
    "Time from issuing an apply to the device's confirmation (read-back included), in seconds.",
    ["switch"],
    buckets=_LATENCY_BUCKETS_S,
    registry=REGISTRY,
)
DEVICE_ERRORS = Counter(
    "lightrail_device_errors_total",
    "Driver errors by switch and error class.",
    ["switch", "error"],
    registry=REGISTRY,
)
PHASE_ADMISSION_SECONDS = Histogram(
    "lightrail_phase_admission_seconds",
    "Time from a rank's EnterPhase reaching the controller to its admission, in seconds.",
    ["job_id", "phase"],
    buckets=_LATENCY_BUCKETS_S,
    registry=REGISTRY,
)
PHASE_ADMISSIONS = Counter(
    "lightrail_phase_admissions_total",
    "Rank admissions by outcome (noop: circuits already there; switched: after a "
    "reconfiguration).",
    ["job_id", "outcome"],
    registry=REGISTRY,
)
PHASE_ERRORS = Counter(
    "lightrail_phase_errors_total",
    "EnterPhase calls answered with an error, by reason.",
    ["job_id", "reason"],
    registry=REGISTRY,
)
STALL_SECONDS = Counter(
    "lightrail_stall_seconds_total",
    "Rank-seconds spent waiting in EnterPhase for circuits (sum over ranks).",
    ["job_id"],
    registry=REGISTRY,
)
PROVISIONING = Counter(
    "lightrail_provisioning_phases_total",
    "Phases that needed new circuits, by how provisioning served them (hit: ready when the "
    "first rank came; late: still switching; miss: switched on demand).",
    ["job_id", "outcome"],
    registry=REGISTRY,
)
RECONFIGURE_DECISIONS = Counter(
    "lightrail_reconfigure_decisions_total",
    "Reconfigure-or-not decisions (PCCL) by outcome: switch to the phase's own circuits or "
    "stay on the circuits already there; the numbers behind each are in the job's events.",
    ["job_id", "decision"],
    registry=REGISTRY,
)
FAILOVER_SECONDS = Histogram(
    "lightrail_failover_seconds",
    "Failover timeline: seconds from detection to each stage (planned, device_confirmed, "
    "job_notified).",
    ["stage"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
FAILOVER_NO_SPARE = Counter(
    "lightrail_failover_no_spare_total",
    "Failures that found no spare (alert on this: the job waits for an operator).",
    ["job_id"],
    registry=REGISTRY,
)
GPUS_FAILED = Gauge(
    "lightrail_gpus_failed", "GPUs the controller records as failed.", registry=REGISTRY,
)
DEVICE_ALARMS = Counter(
    "lightrail_device_alarms_total",
    "Alarms raised by switches (each triggers a read-back of the switch).",
    ["switch", "severity"],
    registry=REGISTRY,
)
MQTT_CONNECTED = Gauge(
    "lightrail_mqtt_connected",
    "1 while the leader's MQTT bridge is connected to the broker (0 also when MQTT is not "
    "configured).",
    registry=REGISTRY,
)
MQTT_EVENTS_DROPPED = Counter(
    "lightrail_mqtt_events_dropped_total",
    "Events the MQTT bridge dropped unsent: its buffer was full (broker away or slow).",
    registry=REGISTRY,
)
MQTT_ALARMS_REJECTED = Counter(
    "lightrail_mqtt_alarms_rejected_total",
    "Alarm messages on the MQTT alarms topic rejected as invalid (logged with the field).",
    registry=REGISTRY,
)
JOBS = Gauge("lightrail_jobs", "Registered jobs.", registry=REGISTRY)
CIRCUITS = Gauge(
    "lightrail_cross_connects",
    "Cross-connects currently confirmed on a switch.",
    ["switch"],
    registry=REGISTRY,
)
PHASE_STREAMS = Gauge(
    "lightrail_phase_streams", "Open PhaseStream connections (one per host agent).",
    registry=REGISTRY,
)
LEADER = Gauge(
    "lightrail_leader",
    "1 while this replica holds the leader lease and serves; 0 on a standby.",
    registry=REGISTRY,
)


# Configuration reloads (SIGHUP, ``lightrail reload``; ``lightrail.controller.reload``), named
# after Prometheus's own prometheus_config_last_reload_* series.
CONFIG_RELOAD_FAILURES = Counter(
    "lightrail_config_reload_failures_total",
    "Config reloads refused, the running configuration kept, by reason (invalid: the file "
    "does not validate; needs_restart: a setting changed that only a restart applies).",
    ["reason"],
    registry=REGISTRY,
)
CONFIG_LAST_RELOAD_SUCCESSFUL = Gauge(
    "lightrail_config_last_reload_successful",
    "1 when the last config load (start or reload) was applied, 0 when it was refused.",
    registry=REGISTRY,
)
CONFIG_LAST_RELOAD_SUCCESSFUL.set(1)  # a process runs the config it started with
SWITCH_UP = Gauge(
    "lightrail_switch_up",
    "1 while the switch answers, 0 after its last command, read-back or power poll failed "
    "to reach it (DeviceUnreachable, DeviceTimeout); absent until first contact.",
    ["switch"],
    registry=REGISTRY,
)
RECONFIGURATION_DELAY = Gauge(
    "lightrail_reconfiguration_delay_seconds",
    "A switch's configured reconfiguration delay (delta: time for new cross-connects to carry "
    "light), in seconds; what admission latency is compared with.",
    ["switch"],
    registry=REGISTRY,
)
PORT_POWER_DBM = Gauge(
    "lightrail_port_power_dbm",
    "Optical power of a port that carries a cross-connect, in dBm, polled every "
    "controller.power_poll_interval_s (ports without one have no series).",
    ["switch", "port"],
    registry=REGISTRY,
)
ETCD_REQUEST_SECONDS = Histogram(
    "lightrail_etcd_request_seconds",
    "Time of one etcd request as the store sees it (failover to another member included), by "
    "etcd method, in seconds.",
    ["method"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
             10.0, 30.0),
    registry=REGISTRY,
)
LEADER_TRANSITIONS = Counter(
    "lightrail_leader_transitions_total",
    "Times this replica started leading (to=leader) or stopped (to=standby: resigned or "
    "fenced).",
    ["to"],
    registry=REGISTRY,
)
BUILD_INFO = Info(
    "lightrail_build",
    "The running build: Lightrail, Python and gRPC versions (the value is always 1).",
    registry=REGISTRY,
)


def _package_version() -> str:
    try:
        return importlib.metadata.version("lightrail")
    except importlib.metadata.PackageNotFoundError:  # run from a tree that is not installed
        return "unknown"


BUILD_INFO.info({"version": _package_version(), "python": platform.python_version(),
                 "grpc": grpc.__version__})

_LEADER_TRANSITIONS_TO = {True: LEADER_TRANSITIONS.labels("leader"),
                          False: LEADER_TRANSITIONS.labels("standby")}


def set_leader(leading: bool) -> None:
    """Record that this replica started (``leading``) or stopped leading: ``lightrail_leader``
    and one ``lightrail_leader_transitions_total`` increment."""
    LEADER.set(1 if leading else 0)
    _LEADER_TRANSITIONS_TO[leading].inc()


JOB_METRICS: tuple[Counter | Histogram, ...] = (
    PHASE_ADMISSION_SECONDS, PHASE_ADMISSIONS, PHASE_ERRORS, STALL_SECONDS, PROVISIONING,
    RECONFIGURE_DECISIONS, FAILOVER_NO_SPARE,
)
"""Every metric with a ``job_id`` label (a test checks the registry against this list)."""


def forget_job(job_id: str) -> None:
    """Remove every series labelled ``job_id`` (the job unregistered). O(series of these
    metrics), once per unregistration; off the phase path."""
    for metric in JOB_METRICS:
        metric.remove_by_labels({"job_id": job_id})


def set_reconfiguration_delays(delays_s: Mapping[str, float]) -> None:
    """Export each switch's configured reconfiguration delay (switch id -> seconds)."""
    for switch_id, delay_s in delays_s.items():
        RECONFIGURATION_DELAY.labels(switch_id).set(delay_s)


def forget_port_power(switch_id: str, port: int) -> None:
    """Remove the power series of ``port`` on ``switch_id`` (it no longer carries a
    cross-connect)."""
    PORT_POWER_DBM.remove(switch_id, str(port))


_ETCD_BY_METHOD: dict[str, Histogram] = {}


def observe_etcd_request(method: str, seconds: float) -> None:
    """The store's ``RequestObserver``: one etcd request of ``method`` took ``seconds``
    (the label child cached per method)."""
    child = _ETCD_BY_METHOD.get(method)
    if child is None:
        child = _ETCD_BY_METHOD[method] = ETCD_REQUEST_SECONDS.labels(method)
    child.observe(seconds)
CONFIG_LAST_RELOAD_SUCCESS_TIME = Gauge(
    "lightrail_config_last_reload_success_timestamp_seconds",
    "Wall-clock time (seconds since the epoch) of the last config load applied (start or "
    "reload).",
    registry=REGISTRY,
)
