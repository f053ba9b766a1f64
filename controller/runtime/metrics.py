"""Every Prometheus metric of the controller, declared once (DESIGN.md, "Observability").

Prefix ``lightrail_``; label sets stay small: ``switch``, ``job_id``, ``phase`` (collective
name). The job's label is ``job_id``, not ``job``: Prometheus sets ``job`` to the scrape job and
would rename ours ``exported_job``.
All metrics live in ``REGISTRY`` so several controllers in one test process do not collide
with the process-wide default registry.
"""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
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
CONFIG_LAST_RELOAD_SUCCESS_TIME = Gauge(
    "lightrail_config_last_reload_success_timestamp_seconds",
    "Wall-clock time (seconds since the epoch) of the last config load applied (start or "
    "reload).",
    registry=REGISTRY,
)
