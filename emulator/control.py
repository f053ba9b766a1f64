"""Fault-injection control API for the emulated devices of a fabric (DESIGN.md, "Emulator").

A small JSON-over-HTTP API on 127.0.0.1 over an ``lightrail.emulator.ocs.EmulatedFabricDevices``
registry, shared by every emulated device whatever protocol front end (TL1, RESTCONF, MZI) it
has, since all of them wrap the same ``EmulatedOcs`` objects::

    GET    /devices                 {"devices": [<summary>, ...]}
    GET    /devices/{id}            <summary> + {"cross_connects": [{"ingress", "egress"}]}
    GET    /devices/{id}/changes    {"device", "changes": [{"at_s", "action" (make|break),
                                    "ingress", "egress", "commanded"}, ...]}: the change log,
                                    oldest first (``commanded`` false: the device's own doing);
                                    ``?since=K`` skips the first K entries
    GET    /devices/{id}/commands   {"device", "commands": [{"connection", "user", "code",
                                    "at_s"}, ...]}: every command the device's TL1 front end
                                    received, with the user logged in on its connection
                                    (``?since=K`` as above; 404 for a device without one)
    POST   /devices/{id}/faults     one fault (below) -> 200 {"device", "applied"}
                                    (reboot: 202, answered once the device is down)
    DELETE /devices/{id}/faults     clear every fault -> 200 {"device", "applied"}

    summary: {"id", "kind" (nxn|duplex), "port_count", "settle_time_s", "max_batch",
              "cross_connect_count", "command_count", "write_count", "change_count",
              "rebooting", "partitioned",
              "injected": [faults injected through this API since the last clear]}

Fault bodies (``fault`` selects the ``EmulatedOcs`` method; other members are its arguments)::

    {"fault": "unreachable", "on": true|false}                     set_unreachable
    {"fault": "partition", "on": true|false}                       set_partitioned (silent:
                                                                  connections stay open,
                                                                  commands get no answer)
    {"fault": "drop_next_calls", "count": 2}                      drop_next_calls
    {"fault": "slow", "delay_s": 0.5}                             set_extra_delay (seconds)
    {"fault": "deny_port", "port": 5, "kind": "hardware_fault"|"invalid_port",
     "reason": "denied"}                                          deny_port
    {"fault": "allow_port", "port": 5}                            allow_port
    {"fault": "partial_apply", "nth": 2, "reason": "..."}         fail_make (k-th make fails)
    {"fault": "silent_makes", "port": 5}                          drop_makes_silently
    {"fault": "fail_port", "port": 5, "condition": "LOS"}         fail_port (raises an alarm)
    {"fault": "repair_port", "port": 5}                           repair_port
    {"fault": "reboot", "keep_cross_connects": true, "down_s": 1.0}
                                                                  reboot (in the background)
    {"fault": "clear"}                                            clear_faults

Errors: ``{"error": message, "field": name, "value": value}`` with 400 for bad input (the
message names the field and the value: unknown fault, unknown or missing member, wrong type,
out-of-range number, a port the device lacks, a body that is not a JSON object), 404 for an
unknown device or path, 405 for a wrong method, 409 for a reboot while one is running.

``at_s`` in the change log is the device's clock: ``time.monotonic`` of the emulator process,
which on Linux (``CLOCK_MONOTONIC``) is the same clock in every process of the machine, so a
replay's hold times and a standalone emulator's change log compare directly.

``ControlClient`` is the async client for tests and the CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

import aiohttp
import structlog
from aiohttp import web

from lightrail.drivers.base import AlarmSeverity, CrossConnect, SwitchKind
from lightrail.emulator.ocs import (
    ChangeAction,
    ChangeRecord,
    DenialKind,
    EmulatedFabricDevices,
    EmulatedOcs,
)
from lightrail.emulator.servers.tl1 import ReceivedCommand

CommandLog = Callable[[], Sequence[ReceivedCommand]]
"""The commands a device's protocol front end received so far, oldest first."""

FAULTS = (
    "unreachable", "partition", "drop_next_calls", "slow", "deny_port", "allow_port",
    "partial_apply", "silent_makes", "fail_port", "repair_port", "reboot", "clear",
)
"""Fault names accepted in ``POST /devices/{id}/faults``."""

_REBOOT_START_TIMEOUT_S = 10.0
_log = structlog.get_logger(__name__)

Json = dict[str, object]


class ControlInputError(Exception):
    """Invalid control input; ``field`` and ``value`` name the culprit (answered as 400)."""

    def __init__(self, field: str, value: object, message: str, status: int = 400) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.value = value
        self.status = status

    def response(self) -> web.Response:
        """The JSON error answer."""
        return web.json_response(
            {"error": str(self), "field": self.field, "value": self.value}, status=self.status
        )


# --- validation ----------------------------------------------------------------------------------


def _int(body: Mapping[str, object], name: str, minimum: int) -> int:
    if name not in body:
        raise ControlInputError(name, None, "missing")
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ControlInputError(name, value, f"must be an integer, got {value!r}")
    if value < minimum:
        raise ControlInputError(name, value, f"must be >= {minimum}, got {value}")
    return value


def _seconds(body: Mapping[str, object], name: str, default: float | None = None) -> float:
    if name not in body:
        if default is None:
            raise ControlInputError(name, None, "missing")
        return default
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ControlInputError(name, value, f"must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ControlInputError(name, value, f"must be a finite number >= 0, got {value}")
    return float(value)


def _bool(body: Mapping[str, object], name: str) -> bool:
    if name not in body:
        raise ControlInputError(name, None, "missing")
    value = body[name]
    if not isinstance(value, bool):
        raise ControlInputError(name, value, f"must be true or false, got {value!r}")
    return value


def _text(body: Mapping[str, object], name: str, default: str) -> str:
    value = body.get(name, default)
    if not isinstance(value, str) or not value or len(value) > 200:
        raise ControlInputError(
            name, value, f"must be a non-empty string of at most 200 characters, got {value!r}"
        )
    return value


def _port(body: Mapping[str, object], device: EmulatedOcs) -> int:
    port = _int(body, "port", 1)
    ports = device.capabilities.port_ids()
    if port not in ports:
        raise ControlInputError(
            "port", port,
            f"{port} is not a port of device {device.switch_id!r} "
            f"({ports.start}..{ports.stop - 1})",
        )
    return port


_MEMBERS: Mapping[str, frozenset[str]] = {
    "unreachable": frozenset({"on"}),
    "partition": frozenset({"on"}),
    "drop_next_calls": frozenset({"count"}),
    "slow": frozenset({"delay_s"}),
    "deny_port": frozenset({"port", "kind", "reason"}),
    "allow_port": frozenset({"port"}),
    "partial_apply": frozenset({"nth", "reason"}),
    "silent_makes": frozenset({"port"}),
    "fail_port": frozenset({"port", "condition"}),
    "repair_port": frozenset({"port"}),
    "reboot": frozenset({"keep_cross_connects", "down_s"}),
    "clear": frozenset(),
}


@dataclass(frozen=True, slots=True)
class FaultRequest:
    """A validated fault: ``name`` (one of ``FAULTS``) and its normalised arguments."""

    name: str
    args: Mapping[str, object]

    def to_json(self) -> Json:
        """``{"fault": name, **args}``."""
        return {"fault": self.name, **self.args}


def parse_fault(body: object, device: EmulatedOcs) -> FaultRequest:
    """Validate a ``POST /devices/{id}/faults`` body for ``device``. Raises
    ``ControlInputError`` naming the field and the value."""
    if not isinstance(body, dict):
        raise ControlInputError(
            "body", body, f"must be a JSON object with a 'fault' member, got {body!r}"
        )
    name = body.get("fault")
    if not isinstance(name, str) or name not in _MEMBERS:
        raise ControlInputError(
            "fault", name, f"unknown fault {name!r} (known: {', '.join(FAULTS)})"
        )
    unknown = sorted(set(body) - _MEMBERS[name] - {"fault"})
    if unknown:
        raise ControlInputError(
            unknown[0], body[unknown[0]],
            f"unknown member for fault {name!r} (value {body[unknown[0]]!r}; known: "
            f"{', '.join(sorted(_MEMBERS[name])) or 'none'})",
        )
    return FaultRequest(name, _fault_args(name, body, device))


def _fault_args(name: str, body: Mapping[str, object], device: EmulatedOcs) -> Json:
    """The normalised arguments of fault ``name`` (known, its members checked) from ``body``,
    defaults filled in. Raises ``ControlInputError`` naming the member and the value."""
    args: Json
    if name in ("unreachable", "partition"):
        args = {"on": _bool(body, "on")}
    elif name == "drop_next_calls":
        args = {"count": _int(body, "count", 0)}
    elif name == "slow":
        args = {"delay_s": _seconds(body, "delay_s")}
    elif name == "deny_port":
        kind = body.get("kind", DenialKind.HARDWARE_FAULT.value)
        kinds = [k.value for k in DenialKind]
        if kind not in kinds:
            raise ControlInputError("kind", kind, f"must be one of {kinds}, got {kind!r}")
        args = {"port": _port(body, device), "kind": kind,
                "reason": _text(body, "reason", "denied")}
    elif name == "partial_apply":
        args = {"nth": _int(body, "nth", 1),
                "reason": _text(body, "reason", "mirror did not latch")}
    elif name == "fail_port":
        args = {"port": _port(body, device), "condition": _text(body, "condition", "LOS")}
    elif name in ("allow_port", "silent_makes", "repair_port"):
        args = {"port": _port(body, device)}
    elif name == "reboot":
        args = {"keep_cross_connects": _bool(body, "keep_cross_connects"),
                "down_s": _seconds(body, "down_s", 0.0)}
    else:
        args = {}
    return args


# --- server --------------------------------------------------------------------------------------


class ControlServer:
    """The control API over ``devices`` on ``host`` (127.0.0.1) and ``port`` (0: any free
    port; ``port`` gives the bound one after ``start``). ``command_logs`` gives, per switch id,
    the command log of its TL1 front end (``GET /devices/{id}/commands``). Use as
    ``async with``."""

    def __init__(
        self,
        devices: EmulatedFabricDevices,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        shutdown_timeout_s: float = 1.0,
        command_logs: Mapping[str, CommandLog] | None = None,
    ) -> None:
        self._devices = devices
        self._command_logs = dict(command_logs or {})
        self._host = host
        self._port = port
        self._shutdown_timeout_s = shutdown_timeout_s
        self._runner: web.AppRunner | None = None
        self._injected: dict[str, list[Json]] = {}
        self._reboots: dict[str, asyncio.Task[None]] = {}
        self._log = _log.bind(component="emulator-control")

    @property
    def port(self) -> int:
        """The TCP port (the bound one once started)."""
        return self._port

    @property
    def url(self) -> str:
        """``http://host:port`` of the API."""
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        """Listen. Raises ``OSError`` when the port cannot be bound."""
        if self._runner is not None:
            raise RuntimeError("control server already running")
        app = web.Application()
        app.router.add_get("/devices", self._list)
        app.router.add_get("/devices/{id}", self._show)
        app.router.add_get("/devices/{id}/changes", self._changes)
        app.router.add_get("/devices/{id}/commands", self._commands)
        app.router.add_post("/devices/{id}/faults", self._inject)
        app.router.add_delete("/devices/{id}/faults", self._clear)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=self._shutdown_timeout_s)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._host, self._port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        self._log = _log.bind(component="emulator-control", port=self._port)
        self._log.info("control API listening", host=self._host)

    async def stop(self) -> None:
        """Stop listening; reboots still running are waited for (bounded by the shutdown
        timeout, then cancelled). Idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        tasks = list(self._reboots.values())
        self._reboots.clear()
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=self._shutdown_timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> ControlServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # --- handlers ------------------------------------------------------------------------------

    def _device(self, request: web.Request) -> EmulatedOcs:
        switch_id = request.match_info["id"]
        device = self._devices.get(switch_id)
        if device is None:
            raise ControlInputError("id", switch_id, f"unknown device {switch_id!r}", 404)
        return device

    def _summary(self, device: EmulatedOcs) -> Json:
        caps = device.capabilities
        task = self._reboots.get(device.switch_id)
        return {
            "id": device.switch_id,
            "kind": caps.kind.value,
            "port_count": caps.port_count,
            "settle_time_s": caps.settle_time_s,
            "max_batch": caps.max_batch,
            "cross_connect_count": len(device.cross_connects),
            "command_count": device.command_count,
            "write_count": device.write_count,
            "change_count": len(device.change_log),
            "rebooting": task is not None and not task.done(),
            "partitioned": device.partitioned,
            "injected": list(self._injected.get(device.switch_id, [])),
        }

    async def _list(self, request: web.Request) -> web.Response:
        del request
        return web.json_response(
            {"devices": [self._summary(self._devices[sid]) for sid in sorted(self._devices)]}
        )

    async def _show(self, request: web.Request) -> web.Response:
        try:
            device = self._device(request)
        except ControlInputError as e:
            return e.response()
        body = self._summary(device)
        body["cross_connects"] = [
            {"ingress": x.ingress, "egress": x.egress} for x in sorted(device.cross_connects)
        ]
        return web.json_response(body)

    async def _changes(self, request: web.Request) -> web.Response:
        try:
            device = self._device(request)
            since = _since(request)
        except ControlInputError as e:
            return e.response()
        changes = device.change_log[since:]
        return web.json_response({"device": device.switch_id, "changes": [
            {"at_s": c.at_s, "action": c.action.value, "ingress": c.cross_connect.ingress,
             "egress": c.cross_connect.egress, "commanded": c.commanded} for c in changes]})

    async def _commands(self, request: web.Request) -> web.Response:
        try:
            device = self._device(request)
            since = _since(request)
            log = self._command_logs.get(device.switch_id)
            if log is None:
                raise ControlInputError(
                    "id", device.switch_id,
                    f"device {device.switch_id!r} records no commands (only devices served "
                    "over TL1 do)", 404)
        except ControlInputError as e:
            return e.response()
        return web.json_response({"device": device.switch_id, "commands": [
            {"connection": c.connection, "user": c.user, "code": c.code, "at_s": c.at_s}
            for c in log()[since:]]})

    async def _inject(self, request: web.Request) -> web.Response:
        try:
            device = self._device(request)
            try:
                body = await request.json(loads=json.loads)
            except ValueError as e:
                raise ControlInputError("body", None, f"is not JSON: {e}") from e
            fault = parse_fault(body, device)
            status = await self._apply(device, fault)
        except ControlInputError as e:
            self._log.info("fault request refused", error=str(e))
            return e.response()
        self._log.info("fault injected", device=device.switch_id, **fault.to_json())
        return web.json_response(
            {"device": device.switch_id, "applied": fault.to_json()}, status=status
        )

    async def _clear(self, request: web.Request) -> web.Response:
        try:
            device = self._device(request)
        except ControlInputError as e:
            return e.response()
        fault = FaultRequest("clear", {})
        await self._apply(device, fault)
        self._log.info("faults cleared", device=device.switch_id)
        return web.json_response({"device": device.switch_id, "applied": fault.to_json()})

    async def _apply(self, device: EmulatedOcs, fault: FaultRequest) -> int:
        """Call the device's fault method; returns the HTTP status to answer."""
        a = fault.args
        sid = device.switch_id
        actions: Mapping[str, Callable[[], None]] = {
            "unreachable": lambda: device.set_unreachable(bool(a["on"])),
            "partition": lambda: device.set_partitioned(bool(a["on"])),
            "drop_next_calls": lambda: device.drop_next_calls(_as_int(a["count"])),
            "slow": lambda: device.set_extra_delay(_as_float(a["delay_s"])),
            "deny_port": lambda: device.deny_port(
                _as_int(a["port"]), DenialKind(a["kind"]), str(a["reason"])
            ),
            "allow_port": lambda: device.allow_port(_as_int(a["port"])),
            "partial_apply": lambda: device.fail_make(_as_int(a["nth"]), str(a["reason"])),
            "silent_makes": lambda: device.drop_makes_silently(_as_int(a["port"])),
            "fail_port": lambda: device.fail_port(_as_int(a["port"]), str(a["condition"])),
            "repair_port": lambda: device.repair_port(_as_int(a["port"])),
            "clear": device.clear_faults,
        }
        if fault.name == "reboot":
            await self._reboot(device, bool(a["keep_cross_connects"]), _as_float(a["down_s"]))
            self._injected.setdefault(sid, []).append(fault.to_json())
            return 202
        actions[fault.name]()
        if fault.name == "clear":
            self._injected.pop(sid, None)
        else:
            self._injected.setdefault(sid, []).append(fault.to_json())
        return 200

    async def _reboot(self, device: EmulatedOcs, keep: bool, down_s: float) -> None:
        """Start a reboot in the background and return once it has begun (the device raised
        its REBOOT alarm), or after a bound if a long command holds the device."""
        sid = device.switch_id
        running = self._reboots.get(sid)
        if running is not None and not running.done():
            raise ControlInputError("fault", "reboot", f"device {sid!r} is already rebooting", 409)
        alarms = device.alarms()
        try:
            task = asyncio.get_running_loop().create_task(
                device.reboot(keep_cross_connects=keep, down_s=down_s),
                name=f"emulator-reboot-{sid}",
            )
            self._reboots[sid] = task
            task.add_done_callback(self._reboot_done)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_REBOOT_START_TIMEOUT_S):
                    async for alarm in alarms:
                        if alarm.condition == "REBOOT" and (
                            alarm.severity is not AlarmSeverity.CLEARED
                        ):
                            break
        finally:
            await alarms.aclose()

    def _reboot_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:  # a bug in the device model: make it loud
            self._log.error("reboot failed", error=repr(error))


def _since(request: web.Request) -> int:
    """The ``since`` query parameter (default 0). Raises ``ControlInputError``."""
    raw = request.query.get("since", "0")
    if not raw.isdecimal():
        raise ControlInputError("since", raw, f"must be an integer >= 0, got {raw!r}")
    return int(raw)


def _as_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an int, got {value!r}")
    return value


def _as_float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


# --- client --------------------------------------------------------------------------------------


class ControlApiError(Exception):
    """The control API refused a request: HTTP ``status``, and the ``field``/``value`` it
    named."""

    def __init__(self, status: int, message: str, field: str | None, value: object) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.field = field
        self.value = value


@dataclass(frozen=True, slots=True)
class DeviceState:
    """One device as ``GET /devices/{id}`` reports it (``cross_connects`` is None in the
    ``GET /devices`` listing)."""

    switch_id: str
    kind: SwitchKind
    port_count: int
    command_count: int
    write_count: int
    change_count: int
    cross_connect_count: int
    rebooting: bool
    injected: tuple[Mapping[str, object], ...]
    partitioned: bool = False
    cross_connects: frozenset[CrossConnect] | None = None

    @staticmethod
    def from_json(doc: object) -> DeviceState:
        """Parse one summary. Raises ``ValueError`` on an unexpected shape."""
        if not isinstance(doc, dict):
            raise ValueError(f"device summary must be an object, got {doc!r}")
        xcs_doc = doc.get("cross_connects")
        xcs: frozenset[CrossConnect] | None = None
        if isinstance(xcs_doc, list):
            xcs = frozenset(
                CrossConnect(_as_int(x["ingress"]), _as_int(x["egress"])) for x in xcs_doc
            )
        injected = doc.get("injected", [])
        if not isinstance(injected, list):
            raise ValueError("injected must be a list")
        return DeviceState(
            switch_id=str(doc["id"]),
            kind=SwitchKind(doc["kind"]),
            port_count=_as_int(doc["port_count"]),
            command_count=_as_int(doc["command_count"]),
            write_count=_as_int(doc["write_count"]),
            change_count=_as_int(doc["change_count"]),
            cross_connect_count=_as_int(doc["cross_connect_count"]),
            rebooting=bool(doc["rebooting"]),
            partitioned=bool(doc.get("partitioned", False)),
            injected=tuple(i for i in injected if isinstance(i, dict)),
            cross_connects=xcs,
        )


class ControlClient:
    """Async client of the control API at ``url`` (``http://127.0.0.1:port``). Use as
    ``async with ControlClient(url) as client``; the HTTP session is created on entry.

    Every call raises ``ControlApiError`` when the API refuses, ``aiohttp.ClientError`` when it
    cannot be reached.
    """

    def __init__(self, url: str, *, timeout_s: float = 10.0) -> None:
        self._url = url.rstrip("/")
        self._timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        """The API's base URL."""
        return self._url

    async def __aenter__(self) -> ControlClient:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self._timeout_s)
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def _call(self, method: str, path: str, body: object = None) -> Json:
        if self._session is None:
            raise RuntimeError("ControlClient used outside 'async with'")
        async with self._session.request(method, f"{self._url}{path}", json=body) as response:
            doc = await response.json(content_type=None)
            if not isinstance(doc, dict):
                raise ControlApiError(response.status, f"unexpected answer {doc!r}", None, None)
            if response.status >= 400:
                field = doc.get("field")
                raise ControlApiError(
                    response.status, str(doc.get("error", "")),
                    field if isinstance(field, str) else None, doc.get("value"),
                )
            return doc

    async def devices(self) -> list[DeviceState]:
        """Every device (``cross_connects`` not included)."""
        doc = await self._call("GET", "/devices")
        items = doc.get("devices", [])
        if not isinstance(items, list):
            raise ControlApiError(200, "devices must be a list", None, None)
        return [DeviceState.from_json(d) for d in items]

    async def device(self, switch_id: str) -> DeviceState:
        """One device with its cross-connects."""
        return DeviceState.from_json(await self._call("GET", f"/devices/{switch_id}"))

    async def change_log(self, switch_id: str, since: int = 0) -> list[ChangeRecord]:
        """The device's change log from entry ``since``, oldest first (``ChangeRecord``s
        stamped with the emulator's ``time.monotonic``)."""
        doc = await self._call("GET", f"/devices/{switch_id}/changes?since={since}")
        items = doc.get("changes")
        if not isinstance(items, list):
            raise ControlApiError(200, "changes must be a list", None, None)
        try:
            return [ChangeRecord(float(c["at_s"]), switch_id, ChangeAction(c["action"]),
                                 CrossConnect(_as_int(c["ingress"]), _as_int(c["egress"])),
                                 c.get("commanded", True) is not False)
                    for c in items]
        except (KeyError, TypeError, ValueError) as e:
            raise ControlApiError(200, f"unexpected change record: {e}", None, None) from e

    async def commands(self, switch_id: str, since: int = 0) -> list[ReceivedCommand]:
        """The commands the device's TL1 front end received from entry ``since``, oldest
        first, each with the user logged in on its connection."""
        doc = await self._call("GET", f"/devices/{switch_id}/commands?since={since}")
        items = doc.get("commands")
        if not isinstance(items, list):
            raise ControlApiError(200, "commands must be a list", None, None)
        try:
            return [ReceivedCommand(_as_int(c["connection"]), str(c["code"]), "", None,
                                    None if c["user"] is None else str(c["user"]),
                                    float(c["at_s"])) for c in items]
        except (KeyError, TypeError, ValueError) as e:
            raise ControlApiError(200, f"unexpected command record: {e}", None, None) from e

    async def change_logs(self) -> dict[str, list[ChangeRecord]]:
        """Every device's change log, by switch id."""
        return {d.switch_id: await self.change_log(d.switch_id) for d in await self.devices()}

    async def inject(self, switch_id: str, fault: Mapping[str, object]) -> Json:
        """Send one fault body (module docstring); returns the answer."""
        return await self._call("POST", f"/devices/{switch_id}/faults", dict(fault))

    async def clear(self, switch_id: str) -> Json:
        """Clear every fault of the device."""
        return await self._call("DELETE", f"/devices/{switch_id}/faults")

    async def set_unreachable(self, switch_id: str, on: bool) -> Json:
        """Make the device (un)reachable."""
        return await self.inject(switch_id, {"fault": "unreachable", "on": on})

    async def set_partitioned(self, switch_id: str, on: bool) -> Json:
        """Start (or end) a silent partition of the device: its connections stay open and its
        commands get no answer."""
        return await self.inject(switch_id, {"fault": "partition", "on": on})

    async def set_slow(self, switch_id: str, delay_s: float) -> Json:
        """Delay every device command by ``delay_s`` seconds (0: normal)."""
        return await self.inject(switch_id, {"fault": "slow", "delay_s": delay_s})

    async def deny_port(
        self, switch_id: str, port: int, *, kind: str = "hardware_fault", reason: str = "denied"
    ) -> Json:
        """Reject makes on ``port`` (``kind``: hardware_fault or invalid_port)."""
        return await self.inject(
            switch_id, {"fault": "deny_port", "port": port, "kind": kind, "reason": reason}
        )

    async def fail_make(self, switch_id: str, nth: int, reason: str = "mirror did not latch"
                        ) -> Json:
        """The ``nth`` make of the next big enough bulk command fails (partial apply)."""
        return await self.inject(
            switch_id, {"fault": "partial_apply", "nth": nth, "reason": reason}
        )

    async def fail_port(self, switch_id: str, port: int, condition: str = "LOS") -> Json:
        """Fail ``port`` with an alarm."""
        return await self.inject(
            switch_id, {"fault": "fail_port", "port": port, "condition": condition}
        )

    async def reboot(self, switch_id: str, *, keep_cross_connects: bool, down_s: float = 0.0
                     ) -> Json:
        """Reboot the device; returns once it is down."""
        return await self.inject(
            switch_id,
            {"fault": "reboot", "keep_cross_connects": keep_cross_connects, "down_s": down_s},
        )
