"""RESTCONF wire format of the Polatis ``optical-switch`` model for ``lightrail.drivers.restconf``:
JSON
shapes of the answers (RFC 7951), RESTCONF error bodies (RFC 8040 section 7) and the HTTP
status -> ``lightrail.drivers.base`` error mapping. Pure functions, no I/O.

Shapes (sources in ``lightrail.drivers.restconf`` and ``lightrail.emulator.servers.restconf``)::

    {"optical-switch:cross-connects": {"pair": [{"ingress": 1, "egress": 9}]}}
    {"optical-switch:opm-power": {"port": [{"port-id": 1, "power": "-3.00"}]}}     (dBm)
    {"optical-switch:port-config": {"port": [{"port-id": 1, "status": "ENABLED"}]}}
    {"polatis-switch:system-alarms": {"alarm": [{"alarm-time": "...Z",
        "alarm-type": "NOTIF_PORT_POWER", "alarm-message": "port 9: LOS: port 9 failed"}]}}
    {"ietf-restconf:errors": {"error": [{"error-type": "application", "error-tag": "in-use",
        "error-path": "...", "error-message": "..."}]}}

Port ids (uint32) are accepted as JSON numbers or digit strings, power (decimal64) as JSON
strings (RFC 7951 section 6.1) or numbers. Parsers raise ``ValueError`` on any other shape;
the driver turns that into ``ProtocolError``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from lightrail.drivers.base import (
    AlarmSeverity,
    AuthenticationFailed,
    CrossConnect,
    CrossConnectConflict,
    DeviceAlarm,
    DeviceTimeout,
    DeviceUnreachable,
    DriverError,
    HardwareFault,
    InvalidPort,
    ProtocolError,
)

XC_CONTAINER = "optical-switch:cross-connects"
"""Module-qualified name of the cross-connects container."""

PAIR_PATH = re.compile(r"pair\[ingress='?(\d+)'?\]")
"""An ``error-path`` naming one pair; group 1 is its ingress."""
_PORT_IN_TEXT = re.compile(r"\bport\s+(\d+)\b", re.IGNORECASE)
_CONFLICT = re.compile(r"(\d+)\s*->\s*(\d+)\D+?(\d+)\s*->\s*(\d+)")
_PORT_ALARM = re.compile(r"^port (\d+): ([^:]+): (.*)$", re.DOTALL)
_SYSTEM_ALARM = re.compile(r"^([A-Za-z0-9_.-]+): (.*)$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class RestconfErrorEntry:
    """One ``ietf-restconf:errors/error`` entry of a device answer."""

    tag: str
    message: str
    path: str | None = None


def parse_errors(body: bytes) -> list[RestconfErrorEntry]:
    """The RESTCONF errors in an answer body (empty when it has none or is not JSON)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: brackets nested too deep
        return []
    errors = doc.get("ietf-restconf:errors") if isinstance(doc, dict) else None
    entries = errors.get("error") if isinstance(errors, dict) else None
    if not isinstance(entries, list):
        return []
    out: list[RestconfErrorEntry] = []
    for entry in entries:
        if isinstance(entry, dict):
            tag = entry.get("error-tag")
            message = entry.get("error-message", "")
            path = entry.get("error-path")
            out.append(RestconfErrorEntry(
                str(tag) if tag is not None else "",
                str(message),
                str(path) if path is not None else None,
            ))
    return out


def _member(doc: object, *names: str) -> object:
    """The value of the one member of ``doc`` named one of ``names`` (module-qualified or
    not). Raises ``ValueError``."""
    if not isinstance(doc, dict):
        raise ValueError(f"expected a JSON object with {names[0]!r}, got {type(doc).__name__}")
    for name in names:
        if name in doc:
            return doc[name]
    raise ValueError(f"missing member {names[0]!r} (got {sorted(doc)})")


def _entries(container: object, list_name: str) -> list[dict[str, object]]:
    if not isinstance(container, dict):
        raise ValueError(f"expected an object holding {list_name!r}")
    items = container.get(list_name, [])
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ValueError(f"{list_name!r} must be a list of objects")
    return items


def _uint(value: object, what: str) -> int:
    """A uint32 leaf: a JSON number or a string of ASCII digits (RFC 7951 section 6.1)."""
    if isinstance(value, bool):
        raise ValueError(f"{what}: {value!r} is not a port id")
    if isinstance(value, int) and 0 <= value < 2**32:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10:
        return _uint(int(value), what)
    raise ValueError(f"{what}: {_shown(value)} is not a port id")


def _decimal(value: object, what: str) -> float:
    """A decimal64 leaf: a JSON string (RFC 7951 section 6.1) or number, finite."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{what}: {_shown(value)} is not a number")
    try:
        number = float(value)
    except (ValueError, OverflowError):  # OverflowError: an integer beyond any float
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"{what}: {_shown(value)} is not a finite number")
    return number


def _shown(value: object, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters (a device may send anything)."""
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 128 else \
        f"an integer of {len(str(value))} digits"
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class ProductInformation:
    """The ``product-information`` container ("unknown" for a missing leaf)."""

    manufacturer: str
    model_name: str
    software_version: str
    serial_number: str


def parse_product_information(doc: object) -> ProductInformation:
    """From ``{"optical-switch:product-information": {"manufacturer": ..., "model-name": ...,
    "software-version": ..., "serial-number": ...}}``. Raises ``ValueError``."""
    product = _member(doc, "optical-switch:product-information", "product-information")
    if not isinstance(product, dict):
        raise ValueError("product-information must be an object")
    leaf = {
        k: str(product.get(k, "unknown"))
        for k in ("manufacturer", "model-name", "software-version", "serial-number")
    }
    return ProductInformation(
        leaf["manufacturer"], leaf["model-name"], leaf["software-version"],
        leaf["serial-number"],
    )


def parse_cross_connects(doc: object) -> frozenset[CrossConnect]:
    """Cross-connects from ``{"optical-switch:cross-connects": {"pair": [{"ingress": i,
    "egress": e}]}}``. Raises ``ValueError``."""
    container = _member(doc, XC_CONTAINER, "cross-connects")
    return frozenset(
        CrossConnect(_uint(p.get("ingress"), "ingress"), _uint(p.get("egress"), "egress"))
        for p in _entries(container, "pair")
    )


def parse_power(doc: object) -> dict[int, float]:
    """dBm by port from ``{"optical-switch:opm-power": {"port": [{"port-id": n, "power":
    "-3.00"}]}}`` (ports without a reading are left out). Raises ``ValueError``."""
    container = _member(doc, "optical-switch:opm-power", "opm-power")
    out: dict[int, float] = {}
    for entry in _entries(container, "port"):
        port = _uint(entry.get("port-id"), "port-id")
        if "power" in entry:
            out[port] = _decimal(entry["power"], f"port {port} power")
    return out


def parse_port_config(doc: object) -> dict[int, str]:
    """``status`` by port from ``{"optical-switch:port-config": {"port": [{"port-id": n,
    "status": "ENABLED"}]}}``. Raises ``ValueError``."""
    container = _member(doc, "optical-switch:port-config", "port-config")
    out: dict[int, str] = {}
    for entry in _entries(container, "port"):
        port = _uint(entry.get("port-id"), "port-id")
        status = entry.get("status", "UNSUPPORTED")
        if not isinstance(status, str):
            raise ValueError(f"port {port} status: {status!r} is not a string")
        out[port] = status
    return out


@dataclass(frozen=True, slots=True)
class RawAlarm:
    """One ``system-alarms/alarm`` entry as the device sent it."""

    alarm_time: str
    alarm_type: str
    message: str


def parse_alarms(doc: object) -> list[RawAlarm]:
    """Entries of ``{"polatis-switch:system-alarms": {"alarm": [...]}}``. Raises
    ``ValueError``."""
    container = _member(
        doc, "polatis-switch:system-alarms", "optical-switch:system-alarms", "system-alarms"
    )
    out: list[RawAlarm] = []
    for entry in _entries(container, "alarm"):
        stamp, kind, message = (
            entry.get("alarm-time"), entry.get("alarm-type", ""), entry.get("alarm-message")
        )
        if not isinstance(stamp, str) or not isinstance(kind, str) or not isinstance(
            message, str
        ):
            raise ValueError(f"alarm entry {entry!r} lacks alarm-time or alarm-message")
        out.append(RawAlarm(stamp, kind, message))
    return out


def alarm_from_raw(switch_id: str, raw: RawAlarm) -> DeviceAlarm:
    """The ``DeviceAlarm`` of one ``system-alarms`` entry (mapping in the module docstring).
    An ``alarm-time`` without a UTC offset is read as UTC (RFC 3339 requires one; never the
    controller's local time). Raises ``ValueError`` naming the field when ``alarm-time`` is
    not an RFC 3339 date-and-time."""
    try:
        when = datetime.fromisoformat(raw.alarm_time)
    except ValueError:
        raise ValueError(f"alarm-time: {_shown(raw.alarm_time)} is not an RFC 3339 "
                         "date-and-time") from None
    at_s = (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()
    bits = raw.alarm_type.split()
    if "NOTIF_PORT_POWER" in bits:
        severity = AlarmSeverity.MAJOR
    elif "NOTIF_PORT_POWER_WARN" in bits:
        severity = AlarmSeverity.MINOR
    else:
        severity = AlarmSeverity.WARNING
    port: int | None = None
    condition = bits[0] if bits else "ALARM"
    description = raw.message
    if (m := _PORT_ALARM.match(raw.message)) is not None:
        port, condition, description = int(m.group(1)), m.group(2), m.group(3)
    elif (m := _SYSTEM_ALARM.match(raw.message)) is not None:
        condition, description = m.group(1), m.group(2)
    elif (m := _PORT_IN_TEXT.search(raw.message)) is not None:
        port = int(m.group(1))
    return DeviceAlarm(switch_id, port, condition, severity, at_s, description)


class UnparsedConflict(DriverError):
    """HTTP 409 whose message does not name the two cross-connects (the driver then looks
    for the conflict in a read-back)."""


def error_for_answer(
    switch_id: str, status: int, body: bytes, what: str, *, port: int | None = None
) -> DriverError:
    """The driver error for an HTTP error answer with ``status`` and ``body`` to the request
    ``what`` (table in the ``lightrail.drivers.restconf`` docstring); ``port`` is the port a port
    resource
    was asked for (a 404 then means ``InvalidPort``)."""
    errors = parse_errors(body)
    text = "; ".join(e.message for e in errors if e.message) or (
        body[:120].decode(errors="replace") or "no details"
    )
    message = f"{what}: HTTP {status}: {text}"
    tag = errors[0].tag if errors else ""
    if status in (401, 403):
        return AuthenticationFailed(switch_id, f"{what}: HTTP {status}: credentials rejected")
    if status == 404 and port is not None:
        return InvalidPort(switch_id, port, text)
    if status == 400 and tag == "invalid-value":
        bad = _port_in(errors)
        if bad is not None:
            return InvalidPort(switch_id, bad, text)
    if status == 409:
        conflict = _parse_conflict(text)
        if conflict is not None:
            return CrossConnectConflict(switch_id, conflict[0], conflict[1])
        return UnparsedConflict(switch_id, message)
    if status == 413:
        return DriverError(switch_id, message)
    if status in (502, 503):
        return DeviceUnreachable(switch_id, message)
    if status == 504:
        return DeviceTimeout(switch_id, message)
    if status >= 500:
        return HardwareFault(switch_id, message)
    return ProtocolError(switch_id, message)


def _port_in(errors: Sequence[RestconfErrorEntry]) -> int | None:
    for entry in errors:
        m = _PORT_IN_TEXT.search(entry.message)
        if m is not None:
            return int(m.group(1))
    return None


def _parse_conflict(text: str) -> tuple[CrossConnect, CrossConnect] | None:
    m = _CONFLICT.search(text)
    if m is None:
        return None
    a, b, c, d = (int(g) for g in m.groups())
    return CrossConnect(a, b), CrossConnect(c, d)
