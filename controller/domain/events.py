"""Events: what WatchJob streams to the job (``JobEvent``), and what operators and MQTT receive
(every ``JobEvent`` plus the fabric's own ``FabricEvent``s; DESIGN.md "Observability")."""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass, field


class JobEventKind(enum.Enum):
    """Mirrors ``lightrail.v1.JobEventKind``."""

    REGISTERED = "registered"
    RECONFIGURED = "reconfigured"
    PLACEMENT_CHANGED = "placement_changed"
    UNREGISTERED = "unregistered"
    PHASE_ERROR = "phase_error"
    DECISION = "reconfigure_decision"


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One event of one job; ``at_unix_s`` is wall-clock time (seconds since the epoch)."""

    job_id: str
    kind: JobEventKind
    message: str
    at_unix_s: float = field(default_factory=time.time)
    fields: Mapping[str, str] = field(default_factory=dict)


class FabricEventKind(enum.Enum):
    """Events about the fabric and the controller rather than one job's phases."""

    FAILOVER = "failover"
    DEVICE_ALARM = "device_alarm"
    LEADERSHIP = "leadership"
    MAINTENANCE = "maintenance"
    CONFIG_RELOAD = "config_reload"


@dataclass(frozen=True, slots=True)
class FabricEvent:
    """One fabric event; ``switch_id``/``job_id`` are None when it concerns no one switch/job;
    ``at_unix_s`` is wall-clock time (seconds since the epoch)."""

    kind: FabricEventKind
    message: str
    switch_id: str | None = None
    job_id: str | None = None
    at_unix_s: float = field(default_factory=time.time)
    fields: Mapping[str, str] = field(default_factory=dict)
