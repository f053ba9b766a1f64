"""A RESTCONF (RFC 8040) front end for an ``lightrail.emulator.ocs.EmulatedOcs``: the Polatis
``optical-switch`` YANG model in JSON over HTTP on 127.0.0.1.

The server wraps one ``EmulatedOcs``: every request is served by a device command of that model
(``get_cross_connects``, ``apply_bulk``, ``get_power``, ``get_port_status``, ``set_port_admin``,
``info``), so state, reconfiguration delay, injected faults and the change log are the same ones
the in-process driver and the other emulated front ends see.

Resources (root ``/api``; JSON as RFC 7951: uint32 as numbers, decimal64 as strings)::

    GET                 /api/data/optical-switch:product-information
    GET, PATCH, DELETE  /api/data/optical-switch:cross-connects
    GET, PATCH, DELETE  /api/data/optical-switch:cross-connects/pair
    GET, PATCH, DELETE  /api/data/optical-switch:cross-connects/pair=<ingress>
        {"optical-switch:cross-connects": {"pair": [{"ingress": 1, "egress": 9}]}}
    GET                 /api/data/optical-switch:opm-power[/port[=<port-id>]]
        {"optical-switch:opm-power": {"port": [{"port-id": 1, "power": "-3.00"}]}}   (dBm)
    GET, PATCH          /api/data/optical-switch:port-config[/port[=<port-id>]]
        {"optical-switch:port-config": {"port": [{"port-id": 1, "status": "ENABLED",
                                                  "label": "", "peer-port": ""}]}}
    POST                /api/operations/optical-switch:port-set-state
        {"optical-switch:input": {"port-enab": [1], "port-disab": [2]}}
    GET                 /api/data/polatis-switch:system-alarms[/alarm]
                        (also answered as optical-switch:system-alarms, the name issue 4 uses)
        {"polatis-switch:system-alarms": {"alarm": [{"alarm-time": "2026-01-01T00:00:00.000001Z",
                      "alarm-type": "NOTIF_PORT_POWER", "alarm-message": "port 9: LOS: ..."}]}}
    GET                 /.well-known/host-meta   (RFC 8040 section 3.1, root discovery)

Sources:

- The YANG modules ``optical-switch@2018-03-22`` (containers ``cross-connects`` with
  ``list pair {key ingress; leaf egress}``, ``opm-power/port{port-id, power (dBm, decimal64
  2 digits)}``, ``port-config/port{port-id, status ENABLED|DISABLED|FAILED|UNSUPPORTED
  (config false), label, peer-port}``, ``product-information``, ``rpc port-set-state
  {port-enab, port-disab}``) and ``polatis-switch@2017-09-11`` (``system-alarms/alarm{alarm-time
  (key), alarm-type (bits NOTIF_PORT_POWER, NOTIF_PORT_POWER_WARN, NOTIF_SYSTEM, ...),
  alarm-message}``: "the current active system alarms"), as shipped by ONOS in
  ``models/polatis/src/main/yang/`` and used by its Polatis NETCONF driver
  (``drivers/polatis/netconf``: ``PolatisNetconfUtility``, ``PolatisPowerConfig``,
  ``PolatisAlarmConsumer``, ``PolatisFlowRuleProgrammable``).
- Public client scripts for Polatis switches: RESTCONF on TCP port 8008 under root ``/api``,
  ``GET/PUT .../api/data/optical-switch:cross-connects`` with
  ``{"optical-switch:cross-connects": {"pair": [{"ingress": 1, "egress": 13}]}}``,
  ``DELETE .../cross-connects/pair=<ingress>``, ``GET .../optical-switch:opm-power[/port=<n>]``,
  ``application/yang-data+json``, HTTP Basic auth.
- RFC 8040 (RESTCONF: plain PATCH = merge, errors as ``ietf-restconf:errors`` with
  error-type/error-tag/error-path/error-message and the section 7 tag -> status table, entity tags
  and ``If-Match`` -> 412), RFC 7951 (JSON encoding of YANG), RFC 7232 (``If-Match``).

Assumptions (not confirmed against a real Polatis device):

- One strong entity tag, a digest of the content, for a whole top-level container and all its
  descendants; it is returned on GET and on every successful write, and ``If-Match`` on
  PATCH/DELETE is checked against it (412 ``operation-failed`` on mismatch).
- ``PATCH`` of a pair whose ingress is connected elsewhere re-routes it (break, then make, in one
  device command); ``DELETE`` of the list or the container breaks every cross-connect.
- Admin state is changed with the ``port-set-state`` RPC, as in the YANG model (``status`` is
  ``config false``); a PATCH of ``status`` is refused with 400. PATCH sets ``label``/``peer-port``.
- Error mapping of device faults: unknown or wrong-side port -> 400 ``invalid-value``; a port
  already in use -> 409 ``in-use``; a hardware fault (failed or denied port) -> 500
  ``operation-failed``; a partial apply -> 500 ``partial-operation`` (RFC 6241 tag) with one error
  per pair that was not made (``error-path`` names the pair) after a summary error; more pairs
  than ``max_batch`` -> 413 ``too-big``; a nonexistent list entry -> 404 ``invalid-value``.
- ``system-alarms`` lists the alarms the device raised since the server started that are not
  cleared yet; a port alarm's message reads ``"port <n>: <condition>: <description>"`` with
  ``alarm-type`` ``NOTIF_PORT_POWER``, a system alarm ``"<condition>: <description>"`` with
  ``NOTIF_SYSTEM``. ``alarm-time`` is the server's wall clock when it saw the alarm, made unique
  by a microsecond step (it is the list key).

Faults, as a device shows them: an unreachable (or rebooting, or call-dropping) device drops the
TCP connection without an answer (the client sees "server disconnected"; ``stop`` gives a real
"connection refused"); a partitioned device (``EmulatedOcs.set_partitioned``) answers nothing
and keeps the connection open until the partition ends, then drops it; a slow device answers
late (``EmulatedOcs.set_extra_delay``). For tests,
``inject_wire_fault`` mangles the next answers (garbage body, garbage status line, close before
or in the middle of the answer, after the request took effect), ``before_next_write`` runs a
coroutine just before the next write is checked (a concurrent writer, to provoke 412), and
``requests`` / ``wait_requests`` expose every request seen.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import enum
import hashlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import TypeVar

import structlog
from aiohttp import web

from lightrail.drivers.base import (
    AlarmSeverity,
    CrossConnect,
    CrossConnectConflict,
    DeviceAlarm,
    DeviceUnreachable,
    DriverError,
    HardwareFault,
    InvalidPort,
    PartialApply,
    PortAdmin,
    PortOper,
)
from lightrail.emulator.ocs import AlarmSubscription, EmulatedOcs

MEDIA_TYPE = "application/yang-data+json"
"""The RESTCONF JSON media type (RFC 8040 section 11.3.2)."""
ROOT = "/api"
"""The RESTCONF root resource on Polatis switches."""
OPTICAL = "optical-switch"
"""YANG module of cross-connects, ports, power and product information."""
POLATIS = "polatis-switch"
"""YANG module of ``system-alarms``."""
PORT_POWER_ALARM = "NOTIF_PORT_POWER"
"""``alarm-type`` bit of a port alarm (loss of signal, failed port)."""
SYSTEM_ALARM = "NOTIF_SYSTEM"
"""``alarm-type`` bit of a system alarm (reboot)."""

_PORT_MAX = 65535  # optical-switch portFormat: uint32 1..65535
_JSON_TYPES = (MEDIA_TYPE, "application/json")
_WRITE_METHODS = frozenset({"PATCH", "DELETE", "POST", "PUT"})
_log = structlog.get_logger(__name__)

Json = dict[str, object]
_T = TypeVar("_T")


class WireFault(enum.Enum):
    """How the next answer is mangled (``RestconfServer.inject_wire_fault``). The request is
    processed first, so a write takes effect even though its answer is lost."""

    GARBAGE_BODY = "garbage_body"
    """A 200 answer whose body is not JSON."""
    GARBAGE_STATUS_LINE = "garbage_status_line"
    """Bytes that are not HTTP, then the connection closes."""
    CLOSE_BEFORE_RESPONSE = "close_before_response"
    """The connection closes without an answer."""
    CLOSE_MID_RESPONSE = "close_mid_response"
    """Status line, headers and half the body, then the connection closes."""


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request the server saw: ``status`` is None when no HTTP answer was sent."""

    method: str
    path: str
    status: int | None


@dataclass(frozen=True, slots=True)
class ActiveAlarm:
    """One entry of ``system-alarms/alarm`` (``alarm_time`` is the list key)."""

    alarm_time: str
    alarm_type: str
    message: str
    port: int | None
    condition: str

    def to_json(self) -> Json:
        """The RFC 7951 JSON of this list entry."""
        return {
            "alarm-time": self.alarm_time,
            "alarm-type": self.alarm_type,
            "alarm-message": self.message,
        }


@dataclass(frozen=True, slots=True)
class _ArmedFault:
    fault: WireFault
    method: str | None


class _ErrorReply(Exception):
    """Raised inside a handler: answer with RESTCONF errors."""

    def __init__(
        self,
        status: int,
        tag: str,
        message: str,
        *,
        path: str | None = None,
        extra: Sequence[Json] = (),
        error_type: str = "application",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})
        first: Json = {"error-type": error_type, "error-tag": tag, "error-message": message}
        if path is not None:
            first["error-path"] = path
        self.errors: list[Json] = [first, *extra]

    def response(self) -> web.Response:
        response = _json_response(
            {"ietf-restconf:errors": {"error": self.errors}}, status=self.status
        )
        response.headers.update(self.headers)
        return response


class _DropConnection(Exception):
    """Raised inside a handler: close the connection without an answer."""


def _json_response(
    body: Mapping[str, object], *, status: int = 200, etag: str | None = None
) -> web.Response:
    headers = {"ETag": etag} if etag is not None else None
    return web.Response(
        status=status,
        body=json.dumps(body).encode(),
        content_type=MEDIA_TYPE,
        headers=headers,
    )


def _no_content(etag: str | None = None) -> web.Response:
    headers = {"ETag": etag} if etag is not None else None
    return web.Response(status=204, headers=headers)


def _basic_credentials(header: str) -> tuple[str, str] | None:
    """(login, password) of an ``Authorization: Basic ...`` header (RFC 7617), else None."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    login, sep, password = decoded.partition(":")
    return (login, password) if sep else None


def _etag(content: object) -> str:
    digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
    return f'"{digest[:20]}"'


def _pair_path(ingress: int) -> str:
    return f"/{OPTICAL}:cross-connects/pair[ingress='{ingress}']"


def _device_message(error: DriverError, switch_id: str) -> str:
    """The device's reason without the ``switch '<id>': `` prefix of ``DriverError``."""
    text = str(error)
    prefix = f"switch {switch_id!r}: "
    return text.removeprefix(prefix)


def _port_id(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _ErrorReply(400, "invalid-value", f"{where}: {value!r} is not a uint32 port id")
    if not 1 <= value <= _PORT_MAX:
        raise _ErrorReply(400, "invalid-value", f"{where}: {value} is not in 1..{_PORT_MAX}")
    return value


def _key(segment: str, list_name: str) -> int | None:
    """``pair`` -> None, ``pair=3`` -> 3; anything else is a 404."""
    if segment == list_name:
        return None
    name, sep, raw = segment.partition("=")
    if name != list_name or not sep:
        raise _ErrorReply(404, "invalid-value", f"unknown resource {segment!r}")
    if not raw.isdecimal():
        raise _ErrorReply(400, "invalid-value", f"{list_name} key {raw!r} is not a port id")
    return _port_id(int(raw), f"{list_name} key")


class RestconfServer:
    """RESTCONF server for one emulated switch ``device``, on ``host`` (default 127.0.0.1) and
    ``port`` (0: any free port; ``port`` gives the bound one after ``start``).

    Every request needs HTTP Basic credentials ``username``/``password`` (401 otherwise).
    ``start`` and ``stop`` may be repeated: a restart binds the same port again and keeps the
    alarm list and port labels (a management-plane restart; ``EmulatedOcs.reboot`` is the
    device reboot). Use as ``async with RestconfServer(...) as server``.
    """

    def __init__(
        self,
        device: EmulatedOcs,
        *,
        username: str,
        password: str,
        host: str = "127.0.0.1",
        port: int = 0,
        wall_clock: Callable[[], float] = time.time,
        shutdown_timeout_s: float = 1.0,
    ) -> None:
        self._device = device
        self._username = username
        self._password = password
        self._host = host
        self._port = port
        self._wall_clock = wall_clock
        self._shutdown_timeout_s = shutdown_timeout_s
        self._runner: web.AppRunner | None = None
        self._alarm_sub: AlarmSubscription | None = None
        self._alarm_task: asyncio.Task[None] | None = None
        self._alarms: list[ActiveAlarm] = []
        self._last_alarm_us = 0
        self._labels: dict[int, tuple[str, str]] = {}
        self._write_lock = asyncio.Lock()
        self._before_write: list[Callable[[], Awaitable[None]]] = []
        self._wire_faults: list[_ArmedFault] = []
        self._requests: list[RequestRecord] = []
        self._requests_changed = asyncio.Condition()
        self._log = _log.bind(switch=device.switch_id)

    # --- lifetime ----------------------------------------------------------------------------

    @property
    def device(self) -> EmulatedOcs:
        """The emulated switch behind this server."""
        return self._device

    @property
    def port(self) -> int:
        """The TCP port (the bound one once started)."""
        return self._port

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the server."""
        return f"http://{self._host}:{self._port}"

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._runner is not None

    async def start(self) -> None:
        """Listen (again on the same port after a ``stop``). Raises ``OSError`` when the port
        cannot be bound; ``RuntimeError`` when already running."""
        if self._runner is not None:
            raise RuntimeError("RESTCONF server already running")
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(
            app, access_log=None, shutdown_timeout=self._shutdown_timeout_s
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._host, self._port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        if self._alarm_sub is None:
            self._alarm_sub = self._device.alarms()
            self._alarm_task = asyncio.get_running_loop().create_task(
                self._collect_alarms(self._alarm_sub),
                name=f"restconf-alarms-{self._device.switch_id}",
            )
        self._log = _log.bind(switch=self._device.switch_id, port=self._port)
        self._log.info("restconf server listening", host=self._host)

    async def stop(self) -> None:
        """Stop listening and close every connection (clients then get "connection
        refused"); idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        sub, self._alarm_sub = self._alarm_sub, None
        task, self._alarm_task = self._alarm_task, None
        if sub is not None:
            await sub.aclose()
        if task is not None:
            await asyncio.wait_for(task, timeout=self._shutdown_timeout_s)
        self._log.info("restconf server stopped")

    async def __aenter__(self) -> RestconfServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # --- test controls -----------------------------------------------------------------------

    def inject_wire_fault(
        self, fault: WireFault, count: int = 1, *, method: str | None = None
    ) -> None:
        """Mangle the answers of the next ``count`` requests (only those with HTTP ``method``
        when given) as ``fault`` says, after processing them. Raises ``ValueError`` for
        ``count < 1``."""
        if count < 1:
            raise ValueError(f"inject_wire_fault: count must be >= 1, got {count}")
        self._wire_faults += [_ArmedFault(fault, method)] * count

    def clear_wire_faults(self) -> None:
        """Forget armed wire faults."""
        self._wire_faults.clear()

    def before_next_write(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Await ``hook`` once, just before the next write request is checked against its
        ``If-Match`` and executed (e.g. another client changing the cross-connects)."""
        self._before_write.append(hook)

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request seen so far, oldest first (a copy)."""
        return list(self._requests)

    @property
    def write_count(self) -> int:
        """Requests seen with a writing method (PATCH, DELETE, POST, PUT)."""
        return sum(1 for r in self._requests if r.method in _WRITE_METHODS)

    @property
    def active_alarms(self) -> list[ActiveAlarm]:
        """The ``system-alarms`` list now (a copy)."""
        return list(self._alarms)

    async def wait_requests(
        self,
        predicate: Callable[[RequestRecord], bool],
        count: int = 1,
        timeout_s: float = 5.0,
    ) -> None:
        """Wait until at least ``count`` requests matching ``predicate`` were answered (or
        dropped). Raises ``TimeoutError`` after ``timeout_s`` seconds."""
        async with asyncio.timeout(timeout_s), self._requests_changed:
            await self._requests_changed.wait_for(
                lambda: sum(1 for r in self._requests if predicate(r)) >= count
            )

    # --- alarms ------------------------------------------------------------------------------

    async def _collect_alarms(self, sub: AlarmSubscription) -> None:
        async for alarm in sub:
            self._note_alarm(alarm)

    def _note_alarm(self, alarm: DeviceAlarm) -> None:
        if alarm.severity is AlarmSeverity.CLEARED:
            self._alarms = [
                a for a in self._alarms
                if (a.port, a.condition) != (alarm.port, alarm.condition)
            ]
            return
        now_us = max(int(self._wall_clock() * 1_000_000), self._last_alarm_us + 1)
        self._last_alarm_us = now_us
        stamp = datetime.fromtimestamp(now_us / 1_000_000, tz=UTC)
        alarm_time = stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        if alarm.port is None:
            kind = SYSTEM_ALARM
            message = f"{alarm.condition}: {alarm.description}"
        else:
            kind = PORT_POWER_ALARM
            message = f"port {alarm.port}: {alarm.condition}: {alarm.description}"
        self._alarms.append(ActiveAlarm(alarm_time, kind, message, alarm.port, alarm.condition))

    # --- request handling --------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self._device.partitioned:
            # a silent partition: no answer while it lasts (the client sees its own timeout);
            # the request is lost, so the connection is dropped once the partition ends
            await self._device.until_answering()
            return await self._finish(request, None, WireFault.CLOSE_BEFORE_RESPONSE)
        fault = self._take_wire_fault(request.method)
        try:
            self._check_auth(request)
            response = await self._dispatch(request)
        except _ErrorReply as e:
            response = e.response()
        except _DropConnection:
            if fault is not None:  # not used up: the device itself dropped this one
                self._wire_faults.insert(0, _ArmedFault(fault, request.method))
            self._log.debug("dropping connection", method=request.method, path=request.path)
            return await self._finish(request, None, WireFault.CLOSE_BEFORE_RESPONSE)
        return await self._finish(request, response, fault)

    def _take_wire_fault(self, method: str) -> WireFault | None:
        for i, armed in enumerate(self._wire_faults):
            if armed.method is None or armed.method == method:
                del self._wire_faults[i]
                return armed.fault
        return None

    async def _finish(
        self, request: web.Request, response: web.Response | None, fault: WireFault | None
    ) -> web.StreamResponse:
        status: int | None = None if response is None else response.status
        out: web.StreamResponse
        transport = request.transport
        if fault is None and response is not None:
            out = response
        elif fault is WireFault.GARBAGE_BODY:
            out = web.Response(
                status=200, body=b'{"optical-switch:cross-connects": {"pair": [{"ingr\x00',
                content_type=MEDIA_TYPE,
            )
            status = 200
        elif fault is WireFault.CLOSE_MID_RESPONSE and response is not None:
            body = response.body if isinstance(response.body, bytes) else b""
            answer_status = response.status
            if len(body) < 2:  # a 204 has no body to cut: send a 200 with one instead
                body, answer_status = b'{"optical-switch:cross-connects": {}}', 200
            stream = web.StreamResponse(status=answer_status, headers=response.headers)
            stream.content_length = len(body)
            await stream.prepare(request)
            await stream.write(body[: len(body) // 2])
            if transport is not None:
                transport.close()
            status = None
            out = stream
        else:
            if fault is WireFault.GARBAGE_STATUS_LINE and transport is not None:
                transport.write(b"\x15\x03garbage from the device\r\n\r\n")
            if transport is not None:
                transport.close()
            status = None
            out = web.Response(status=204)
        self._log.debug(
            "request", method=request.method, path=request.path, status=status,
            wire_fault=None if fault is None else fault.value,
        )
        async with self._requests_changed:
            self._requests.append(RequestRecord(request.method, request.path, status))
            self._requests_changed.notify_all()
        return out

    def _check_auth(self, request: web.Request) -> None:
        ok = False
        credentials = _basic_credentials(request.headers.get("Authorization", ""))
        if credentials is not None:
            login, password = credentials
            login_ok = hmac.compare_digest(login.encode(), self._username.encode())
            password_ok = hmac.compare_digest(password.encode(), self._password.encode())
            ok = login_ok and password_ok
        if not ok:
            raise _ErrorReply(
                401, "access-denied", "authentication failed", error_type="protocol",
                headers={"WWW-Authenticate": 'Basic realm="restconf"'},
            )

    async def _dispatch(self, request: web.Request) -> web.Response:
        path = request.path.rstrip("/")
        method = request.method
        if path == "/.well-known/host-meta" and method == "GET":
            xrd = (
                '<XRD xmlns="http://docs.oasis-open.org/ns/xri/xrd-1.0">'
                f'<Link rel="restconf" href="{ROOT}"/></XRD>'
            )
            return web.Response(text=xrd, content_type="application/xrd+xml")
        if path == f"{ROOT}/operations/{OPTICAL}:port-set-state":
            if method != "POST":
                raise self._not_allowed(method)
            return await self._port_set_state(request)
        prefix = f"{ROOT}/data/"
        if not path.startswith(prefix):
            raise _ErrorReply(404, "invalid-value", f"unknown resource {request.path!r}")
        top, *rest = path[len(prefix):].split("/")
        if len(rest) > 1:
            raise _ErrorReply(404, "invalid-value", f"unknown resource {request.path!r}")
        return await self._data_resource(request, top, rest[0] if rest else None)

    async def _data_resource(
        self, request: web.Request, top: str, sub: str | None
    ) -> web.Response:
        """Route a datastore resource ``{ROOT}/data/<top>[/<sub>]`` by its top-level node and
        the method; an unknown node is a 404, a method the node does not take a 405."""
        method = request.method
        if top == f"{OPTICAL}:cross-connects":
            return await self._cross_connects(request, sub)
        if top == f"{OPTICAL}:opm-power":
            if method != "GET":
                raise self._not_allowed(method)
            return await self._opm_power(sub)
        if top == f"{OPTICAL}:port-config":
            return await self._port_config(request, sub)
        if top in (f"{POLATIS}:system-alarms", f"{OPTICAL}:system-alarms"):
            if method != "GET":
                raise self._not_allowed(method)
            return await self._system_alarms(top.partition(":")[0], sub)
        if top == f"{OPTICAL}:product-information":
            if method != "GET" or sub is not None:
                raise self._not_allowed(method)
            return await self._product_information()
        raise _ErrorReply(404, "invalid-value", f"unknown resource {request.path!r}")

    @staticmethod
    def _not_allowed(method: str) -> _ErrorReply:
        return _ErrorReply(
            405, "operation-not-supported", f"method {method} not supported here",
            error_type="protocol",
        )

    async def _command(self, call: Awaitable[_T]) -> _T:
        """Run a device command; an unreachable device drops the connection, other device
        errors become RESTCONF errors."""
        try:
            return await call
        except DeviceUnreachable as e:
            raise _DropConnection from e
        except PartialApply as e:
            raise self._partial_error(e) from e
        except InvalidPort as e:
            raise _ErrorReply(
                400, "invalid-value", _device_message(e, self._device.switch_id)
            ) from e
        except CrossConnectConflict as e:
            raise _ErrorReply(
                409, "in-use", _device_message(e, self._device.switch_id),
                path=_pair_path(e.wanted.ingress),
            ) from e
        except HardwareFault as e:
            raise _ErrorReply(
                500, "operation-failed", _device_message(e, self._device.switch_id)
            ) from e
        except DriverError as e:
            raise _ErrorReply(
                500, "operation-failed", _device_message(e, self._device.switch_id)
            ) from e

    def _partial_error(self, error: PartialApply) -> _ErrorReply:
        result = error.result
        made = ", ".join(f"{x.ingress}->{x.egress}" for x in result.added) or "nothing"
        failed = ", ".join(f"{x.ingress}->{x.egress}" for x in sorted(result.failed))
        per_pair: list[Json] = [
            {
                "error-type": "application",
                "error-tag": "partial-operation",
                "error-path": _pair_path(xc.ingress),
                "error-message": reason,
            }
            for xc, reason in sorted(result.failed.items())
        ]
        return _ErrorReply(
            500, "partial-operation",
            f"partial apply: made {made}; not made {failed}",
            path=f"/{OPTICAL}:cross-connects", extra=per_pair,
        )

    @staticmethod
    async def _body(request: web.Request) -> object:
        if request.content_type not in _JSON_TYPES:
            raise _ErrorReply(
                415, "invalid-value",
                f"unsupported media type {request.content_type!r} (use {MEDIA_TYPE})",
                error_type="protocol",
            )
        raw = await request.read()
        try:
            return json.loads(raw)
        except ValueError as e:
            raise _ErrorReply(
                400, "malformed-message", f"request body is not JSON: {e}", error_type="rpc"
            ) from e

    @staticmethod
    def _single_member(body: object, names: Iterable[str]) -> object:
        wanted = list(names)
        if not isinstance(body, dict) or len(body) != 1:
            raise _ErrorReply(
                400, "malformed-message", f"body must be one JSON object member of {wanted}",
                error_type="rpc",
            )
        [(name, value)] = body.items()
        if name not in wanted:
            raise _ErrorReply(400, "unknown-element", f"unexpected member {name!r}")
        return value

    def _check_if_match(self, request: web.Request, current: str) -> None:
        header = request.headers.get("If-Match")
        if header is None:
            return
        tags = [t.strip() for t in header.split(",")]
        if "*" in tags or current in tags:
            return
        raise _ErrorReply(
            412, "operation-failed",
            f"entity tag {header} does not match the current {current}",
            error_type="protocol",
        )

    # --- cross-connects ----------------------------------------------------------------------

    def _xc_etag(self, xcs: Iterable[CrossConnect]) -> str:
        return _etag([[x.ingress, x.egress] for x in sorted(xcs)])

    async def _cross_connects(self, request: web.Request, sub: str | None) -> web.Response:
        key = None if sub is None else _key(sub, "pair")
        if request.method == "GET":
            xcs = await self._command(self._device.get_cross_connects())
            etag = self._xc_etag(xcs)
            pairs: list[Json] = [
                {"ingress": x.ingress, "egress": x.egress} for x in sorted(xcs)
            ]
            if sub is None:
                container: Json = {"pair": pairs} if pairs else {}
                return _json_response({f"{OPTICAL}:cross-connects": container}, etag=etag)
            if key is not None:
                pairs = [p for p in pairs if p["ingress"] == key]
                if not pairs:
                    raise _ErrorReply(404, "invalid-value", f"no pair with ingress {key}")
            return _json_response({f"{OPTICAL}:pair": pairs}, etag=etag)
        if request.method == "PATCH":
            body = await self._body(request)
            wanted = self._parse_pairs(body, sub, key)
            return await self._write(request, lambda: self._merge(wanted))
        if request.method == "DELETE":
            return await self._write(request, lambda: self._delete(key))
        raise self._not_allowed(request.method)

    def _parse_pairs(
        self, body: object, sub: str | None, key: int | None
    ) -> list[CrossConnect]:
        if sub is None:
            container = self._single_member(body, [f"{OPTICAL}:cross-connects"])
            if not isinstance(container, dict):
                raise _ErrorReply(400, "invalid-value", "cross-connects must be an object")
            unknown = set(container) - {"pair"}
            if unknown:
                raise _ErrorReply(400, "unknown-element", f"unexpected members {sorted(unknown)}")
            entries = container.get("pair", [])
        else:
            entries = self._single_member(body, [f"{OPTICAL}:pair", "pair"])
        if not isinstance(entries, list):
            raise _ErrorReply(400, "invalid-value", "pair must be a JSON array")
        out: list[CrossConnect] = []
        seen: set[int] = set()
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise _ErrorReply(400, "invalid-value", f"pair[{i}] must be an object")
            unknown = set(entry) - {"ingress", "egress"}
            if unknown:
                raise _ErrorReply(
                    400, "unknown-element", f"pair[{i}]: unexpected members {sorted(unknown)}"
                )
            if "ingress" not in entry or "egress" not in entry:
                raise _ErrorReply(
                    400, "missing-element", f"pair[{i}] needs both ingress and egress"
                )
            ingress = _port_id(entry["ingress"], f"pair[{i}].ingress")
            egress = _port_id(entry["egress"], f"pair[{i}].egress")
            if key is not None and ingress != key:
                raise _ErrorReply(
                    400, "invalid-value",
                    f"pair[{i}].ingress {ingress} differs from the key {key} in the URL",
                )
            if ingress in seen:
                raise _ErrorReply(400, "invalid-value", f"ingress {ingress} appears twice")
            seen.add(ingress)
            out.append(CrossConnect(ingress, egress))
        return out

    async def _write(
        self, request: web.Request, operation: Callable[[], Awaitable[None]]
    ) -> web.Response:
        async with self._write_lock:
            hooks, self._before_write = self._before_write, []
            for hook in hooks:
                await hook()
            self._check_if_match(request, self._xc_etag(self._device.cross_connects))
            await operation()
            return _no_content(self._xc_etag(self._device.cross_connects))

    async def _merge(self, wanted: Sequence[CrossConnect]) -> None:
        by_ingress = {x.ingress: x for x in self._device.cross_connects}
        breaks: list[CrossConnect] = []
        makes: list[CrossConnect] = []
        for xc in wanted:
            current = by_ingress.get(xc.ingress)
            if current == xc:
                continue
            if current is not None:
                breaks.append(current)
            makes.append(xc)
        limit = self._device.capabilities.max_batch
        if limit is not None and len(breaks) + len(makes) > limit:
            raise _ErrorReply(
                413, "too-big",
                f"{len(breaks) + len(makes)} changes exceed the device batch limit {limit}",
            )
        if breaks or makes:
            await self._command(self._device.apply_bulk(breaks, makes))
        else:
            await self._command(self._device.info())  # a no-op edit still reaches the device

    async def _delete(self, key: int | None) -> None:
        xcs = sorted(self._device.cross_connects)
        if key is not None:
            xcs = [x for x in xcs if x.ingress == key]
            if not xcs:
                raise _ErrorReply(404, "invalid-value", f"no pair with ingress {key}")
        if xcs:
            await self._command(self._device.apply_bulk(xcs, ()))
        else:
            await self._command(self._device.info())

    # --- ports, power, alarms, product information ------------------------------------------

    def _check_port(self, port: int) -> None:
        if port not in self._device.capabilities.port_ids():
            raise _ErrorReply(404, "invalid-value", f"port {port}: no such port")

    async def _opm_power(self, sub: str | None) -> web.Response:
        key = None if sub is None else _key(sub, "port")
        if key is not None:
            self._check_port(key)
        power = await self._command(self._device.get_power(None if key is None else [key]))
        ports: list[Json] = [
            {"port-id": p, "power": f"{dbm:.2f}"} for p, dbm in sorted(power.items())
        ]
        etag = _etag(ports)
        if sub is None:
            return _json_response({f"{OPTICAL}:opm-power": {"port": ports}}, etag=etag)
        return _json_response({f"{OPTICAL}:port": ports}, etag=etag)

    async def _port_config(self, request: web.Request, sub: str | None) -> web.Response:
        key = None if sub is None else _key(sub, "port")
        if key is not None:
            self._check_port(key)
        if request.method == "GET":
            statuses = await self._command(
                self._device.get_port_status(None if key is None else [key])
            )
            ports: list[Json] = []
            for s in statuses:
                if s.oper is PortOper.FAILED:
                    status = "FAILED"
                elif s.admin is PortAdmin.DISABLED:
                    status = "DISABLED"
                else:
                    status = "ENABLED"
                label, peer = self._labels.get(s.port, ("", ""))
                ports.append(
                    {"port-id": s.port, "status": status, "label": label, "peer-port": peer}
                )
            etag = _etag(ports)
            if sub is None:
                return _json_response({f"{OPTICAL}:port-config": {"port": ports}}, etag=etag)
            return _json_response({f"{OPTICAL}:port": ports}, etag=etag)
        if request.method == "PATCH":
            body = await self._body(request)
            if sub is None:
                container = self._single_member(body, [f"{OPTICAL}:port-config"])
                if not isinstance(container, dict) or set(container) - {"port"}:
                    raise _ErrorReply(400, "invalid-value", "port-config must hold only port")
                entries = container.get("port", [])
            else:
                entries = self._single_member(body, [f"{OPTICAL}:port", "port"])
            updates = self._parse_port_config(entries, key)
            await self._command(self._device.info())
            for port, (new_label, new_peer) in updates.items():
                old_label, old_peer = self._labels.get(port, ("", ""))
                self._labels[port] = (
                    old_label if new_label is None else new_label,
                    old_peer if new_peer is None else new_peer,
                )
            return _no_content()
        raise self._not_allowed(request.method)

    def _parse_port_config(
        self, entries: object, key: int | None
    ) -> dict[int, tuple[str | None, str | None]]:
        if not isinstance(entries, list):
            raise _ErrorReply(400, "invalid-value", "port must be a JSON array")
        out: dict[int, tuple[str | None, str | None]] = {}
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or "port-id" not in entry:
                raise _ErrorReply(400, "missing-element", f"port[{i}] needs a port-id")
            port = _port_id(entry["port-id"], f"port[{i}].port-id")
            if key is not None and port != key:
                raise _ErrorReply(
                    400, "invalid-value", f"port[{i}].port-id {port} differs from the key {key}"
                )
            self._check_port(port)
            if "status" in entry:
                raise _ErrorReply(
                    400, "invalid-value",
                    f"port[{i}].status is config false; use {OPTICAL}:port-set-state",
                )
            unknown = set(entry) - {"port-id", "label", "peer-port"}
            if unknown:
                raise _ErrorReply(
                    400, "unknown-element", f"port[{i}]: unexpected members {sorted(unknown)}"
                )
            label = entry.get("label")
            peer = entry.get("peer-port")
            for name, value in (("label", label), ("peer-port", peer)):
                if value is not None and (not isinstance(value, str) or len(value) > 128):
                    raise _ErrorReply(
                        400, "invalid-value", f"port[{i}].{name} must be a string of <= 128"
                    )
            out[port] = (
                label if isinstance(label, str) else None,
                peer if isinstance(peer, str) else None,
            )
        return out

    async def _port_set_state(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        data = self._single_member(body, [f"{OPTICAL}:input", "input"])
        if not isinstance(data, dict) or set(data) - {"port-enab", "port-disab"}:
            raise _ErrorReply(
                400, "invalid-value", "input must hold only port-enab and port-disab"
            )
        changes: list[tuple[int, PortAdmin]] = []
        for name, admin in (("port-enab", PortAdmin.ENABLED), ("port-disab", PortAdmin.DISABLED)):
            ports = data.get(name, [])
            if not isinstance(ports, list):
                raise _ErrorReply(400, "invalid-value", f"{name} must be a JSON array")
            for i, raw in enumerate(ports):
                port = _port_id(raw, f"{name}[{i}]")
                if port not in self._device.capabilities.port_ids():
                    raise _ErrorReply(400, "invalid-value", f"port {port}: no such port")
                changes.append((port, admin))
        for port, admin in changes:
            await self._command(self._device.set_port_admin(port, admin))
        return _no_content()

    async def _system_alarms(self, module: str, sub: str | None) -> web.Response:
        if sub is not None and sub != "alarm":
            raise _ErrorReply(404, "invalid-value", f"unknown resource {sub!r}")
        await self._command(self._device.info())
        alarms = [a.to_json() for a in self._alarms]
        etag = _etag(alarms)
        if sub is None:
            container: Json = {"alarm": alarms} if alarms else {}
            return _json_response({f"{module}:system-alarms": container}, etag=etag)
        return _json_response({f"{module}:alarm": alarms}, etag=etag)

    async def _product_information(self) -> web.Response:
        info = await self._command(self._device.info())
        body: Json = {
            f"{OPTICAL}:product-information": {
                "manufacturer": info.vendor,
                "serial-number": info.switch_id,
                "model-name": info.model,
                "software-version": info.firmware,
            }
        }
        return _json_response(body)

