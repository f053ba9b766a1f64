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
    SWITCH_STATE = "switch_state"
    """A switch stopped answering its driver, or answers again (issue 14)."""


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


EVENT_SCHEMA_VERSION = 1
"""The version of ``EventRecord``'s schema, sent with every event (MQTT JSON and the operator
stream): a consumer checks it before reading the fields; it changes when a field changes
meaning or goes away (a new field does not change it). README "Events and alarms (MQTT)"."""


@dataclass(frozen=True, slots=True)
class EventRecord:
    """A job or fabric event as operators and MQTT see it, the one conversion of
    ``JobEvent``/``FabricEvent`` (``record_of``): MQTT sends ``to_json()``, the operator stream
    the same fields (``lightrail.controller.api.codec.fabric_event_pb``).

    ``event_id``: unique per event (``<replica>-<boot>-<sequence>``); a consumer dedupes on it
    (MQTT QoS 1 may deliver an event twice after a reconnect). ``kind``: a ``JobEventKind`` or
    ``FabricEventKind`` value (``reconfigured``, ``failover``, ...). ``job_id``/``switch_id``:
    None when the event is about no one job / switch. ``at_unix_s``: wall-clock seconds since
    the epoch."""

    event_id: str
    kind: str
    at_unix_s: float
    message: str
    job_id: str | None = None
    switch_id: str | None = None
    fields: Mapping[str, str] = field(default_factory=dict)
    schema_version: int = EVENT_SCHEMA_VERSION

    def to_json(self) -> dict[str, object]:
        """The record as a JSON object: every field by name, absent ids as null, ``fields``
        as an object of strings (keys sorted)."""
        return {
            "schema_version": self.schema_version,
            "event_id": self.event_id,
            "kind": self.kind,
            "at_unix_s": self.at_unix_s,
            "job_id": self.job_id,
            "switch_id": self.switch_id,
            "message": self.message,
            "fields": {k: self.fields[k] for k in sorted(self.fields)},
        }


def record_of(event: JobEvent | FabricEvent, event_id: str) -> EventRecord:
    """``event`` as an ``EventRecord`` under ``event_id``. A job event's ``switch_id`` is the
    one switch its ``switches`` field names, else None."""
    if isinstance(event, JobEvent):
        switches = event.fields.get("switches", "")
        one = switches if switches and "," not in switches else None
        return EventRecord(event_id, event.kind.value, event.at_unix_s, event.message,
                           job_id=event.job_id, switch_id=one, fields=dict(event.fields))
    return EventRecord(event_id, event.kind.value, event.at_unix_s, event.message,
                       job_id=event.job_id, switch_id=event.switch_id,
                       fields=dict(event.fields))


def leadership_event(replica_id: str, address: str, *, leading: bool, reason: str
                     ) -> FabricEvent:
    """The ``leadership`` event of replica ``replica_id`` (serving at ``address``) starting
    (``leading``) or stopping to lead, and why (``reason``: elected, shutdown, leader lease
    lost)."""
    return FabricEvent(
        FabricEventKind.LEADERSHIP,
        f"replica {replica_id} " + ("leads" if leading else f"stops leading ({reason})"),
        fields={"replica_id": replica_id, "state": "leading" if leading else "stepped_down",
                "address": address, "reason": reason})
