"""Job events: what WatchJob streams to the job and MQTT publishes (DESIGN.md "Observability")."""

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
