"""Device alarms: the one rule every alarm takes, whatever brought it (the driver's own
notification channel, or a device or gateway publishing on MQTT ``lightrail/<fabric>/alarms/
<switch>``), the controller's bounded alarm log (``lightrail alarms``), and the validation of an
MQTT alarm payload.

The rule (DESIGN.md "Drivers", "Safety invariant"): log, count
(``lightrail_device_alarms_total``), record, publish a ``device_alarm`` fabric event, and make the
phase service distrust the switch and read it back (``PhaseService.distrust_switch``).
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import structlog

from lightrail.controller.domain.events import FabricEvent, FabricEventKind
from lightrail.controller.runtime import metrics
from lightrail.controller.runtime.events import EventBus
from lightrail.drivers.base import AlarmSeverity, DeviceAlarm, SwitchCapabilities

log = structlog.get_logger(__name__)

ALARM_SOURCES = ("driver", "mqtt")
"""Where an alarm came from: the driver's notification channel, or the MQTT alarms topic."""


@dataclass(frozen=True, slots=True)
class AlarmEntry:
    """One alarm in the log: the alarm, its ``source`` (one of ``ALARM_SOURCES``), when the
    controller received it and, once a CLEARED alarm of the same switch, port and condition
    came, when it was cleared (wall-clock seconds since the epoch)."""

    alarm: DeviceAlarm
    source: str
    raised_unix_s: float
    cleared_unix_s: float | None = None


class AlarmLog:
    """The alarms the controller knows: the active ones (one per switch, port and condition:
    the latest) and the last ``history`` cleared ones (a CLEARED alarm closes the active alarm
    with its switch, port and condition; one with no active alarm is kept as cleared)."""

    def __init__(self, history: int = 256) -> None:
        self._active: dict[tuple[str, int | None, str], AlarmEntry] = {}
        self._cleared: deque[AlarmEntry] = deque(maxlen=history)

    def record(self, alarm: DeviceAlarm, source: str, now_unix_s: float) -> None:
        """Enter ``alarm`` received at ``now_unix_s`` from ``source``."""
        key = (alarm.switch_id, alarm.port, alarm.condition)
        if alarm.severity is AlarmSeverity.CLEARED:
            raised = self._active.pop(key, None)
            if raised is None:
                raised = AlarmEntry(alarm, source, now_unix_s)
            self._cleared.append(AlarmEntry(raised.alarm, raised.source, raised.raised_unix_s,
                                            now_unix_s))
        else:
            self._active[key] = AlarmEntry(alarm, source, now_unix_s)

    def entries(self, switch_id: str | None = None, *, include_cleared: bool = False
                ) -> list[AlarmEntry]:
        """The active alarms (oldest first), then with ``include_cleared`` the cleared ones
        (most recently cleared first); only ``switch_id``'s when given."""
        active = sorted(self._active.values(), key=lambda e: e.raised_unix_s)
        out = [e for e in active if switch_id is None or e.alarm.switch_id == switch_id]
        if include_cleared:
            out.extend(e for e in reversed(self._cleared)
                       if switch_id is None or e.alarm.switch_id == switch_id)
        return out


class Distruster(Protocol):
    """What the rule needs of the phase service: ``PhaseService.distrust_switch``."""

    def distrust_switch(self, switch_id: str) -> None: ...


class DeviceAlarms:
    """Applies the module's rule to every alarm (``raise_alarm``) and keeps ``log``. Never
    blocks (called from the drivers' alarm watchers and the MQTT bridge)."""

    def __init__(self, service: Distruster, events: EventBus, alarm_log: AlarmLog | None = None,
                 *, clock: Callable[[], float] = time.time) -> None:
        self._service = service
        self._events = events
        self.log = AlarmLog() if alarm_log is None else alarm_log
        self._clock = clock

    def raise_alarm(self, alarm: DeviceAlarm, source: str) -> None:
        """Log, count, record and publish ``alarm`` (from ``source``), then distrust its switch
        and read it back."""
        log.warning("device_alarm", switch=alarm.switch_id, port=alarm.port,
                    condition=alarm.condition, severity=alarm.severity.value, source=source)
        metrics.DEVICE_ALARMS.labels(alarm.switch_id, alarm.severity.value).inc()
        now = self._clock()
        self.log.record(alarm, source, now)
        fields = {"condition": alarm.condition, "severity": alarm.severity.value,
                  "source": source, "description": alarm.description}
        if alarm.port is not None:
            fields["port"] = str(alarm.port)
        where = "" if alarm.port is None else f" port {alarm.port}"
        self._events.publish_fabric(FabricEvent(
            FabricEventKind.DEVICE_ALARM,
            f"{alarm.switch_id}{where}: {alarm.condition} ({alarm.severity.value})"
            + (f": {alarm.description}" if alarm.description else ""),
            switch_id=alarm.switch_id, at_unix_s=now, fields=fields))
        self._service.distrust_switch(alarm.switch_id)

    async def watch(self, switch_id: str, alarms: AsyncIterator[DeviceAlarm]) -> None:
        """Apply the rule to each alarm of ``switch_id``'s driver until cancelled."""
        async for alarm in alarms:
            self.raise_alarm(alarm, "driver")


class AlarmPayloadError(ValueError):
    """An MQTT alarm payload is not valid; the message names the field and the value."""


_PAYLOAD_FIELDS = frozenset({"port", "condition", "severity", "description", "at_unix_s"})


def parse_alarm_payload(switch_id: str, payload: bytes,
                        switches: Mapping[str, SwitchCapabilities], now_s: float) -> DeviceAlarm:
    """The alarm a device or gateway published on ``lightrail/<fabric>/alarms/<switch_id>``:
    a JSON object with ``condition`` (non-empty string, e.g. ``LOS``), ``severity`` (one of
    ``AlarmSeverity``'s values), optional ``port`` (an integer port id of that switch, or null
    for a switch-wide alarm), optional ``description`` (string) and optional ``at_unix_s``
    (number; informative). ``switches``: the fabric's switches by id; ``now_s``: the
    ``DeviceAlarm.at_s`` to stamp. Raises ``AlarmPayloadError`` naming the field and value."""
    caps = switches.get(switch_id)
    if caps is None:
        raise AlarmPayloadError(f"switch: unknown switch {switch_id!r} in the topic")
    try:
        data = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AlarmPayloadError(f"(payload): not JSON: {exc} (got {payload[:80]!r})") from None
    if not isinstance(data, dict):
        raise AlarmPayloadError(f"(payload): expected a JSON object, got {data!r:.80}")
    unknown = sorted(set(data) - _PAYLOAD_FIELDS)
    if unknown:
        raise AlarmPayloadError(f"{unknown[0]}: unknown field (got {data[unknown[0]]!r:.80}); "
                                f"expected {', '.join(sorted(_PAYLOAD_FIELDS))}")
    condition = data.get("condition")
    if not isinstance(condition, str) or not condition.strip():
        raise AlarmPayloadError(f"condition: expected a non-empty string, got {condition!r:.80}")
    severity = data.get("severity")
    values = [s.value for s in AlarmSeverity]
    if severity not in values:
        raise AlarmPayloadError(f"severity: expected one of {', '.join(values)}, "
                                f"got {severity!r:.80}")
    port = data.get("port")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool)
                             or port not in caps.port_ids()):
        ids = caps.port_ids()
        raise AlarmPayloadError(f"port: expected a port of {switch_id} ({ids.start}.."
                                f"{ids.stop - 1}) or null, got {port!r:.80}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise AlarmPayloadError(f"description: expected a string, got {description!r:.80}")
    at = data.get("at_unix_s")
    if at is not None and (not isinstance(at, int | float) or isinstance(at, bool)
                           or not math.isfinite(at)):
        raise AlarmPayloadError(f"at_unix_s: expected a number, got {at!r:.80}")
    return DeviceAlarm(switch_id, port, condition.strip(), AlarmSeverity(severity), now_s,
                       description)
