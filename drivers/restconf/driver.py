"""RESTCONF driver for optical circuit switches on the Polatis ``optical-switch`` YANG model
(config ``model: restconf``; DESIGN.md, "Drivers").

Wire protocol: RESTCONF (RFC 8040) with JSON bodies (RFC 7951, ``application/yang-data+json``)
over HTTP(S) with Basic auth, one ``aiohttp.ClientSession`` per driver, created in ``open``.
Paths under the root (``/api`` on Polatis switches)::

    GET     data/optical-switch:product-information            -> vendor, model, firmware
    GET     data/optical-switch:cross-connects                 -> pairs {ingress, egress}, ETag
    DELETE  data/optical-switch:cross-connects/pair=<ingress>  one break, If-Match
    PATCH   data/optical-switch:cross-connects                 bulk make (merge), If-Match
    GET     data/optical-switch:opm-power                      -> port-id, power (dBm)
    GET     data/optical-switch:port-config                    -> port-id, status
    POST    operations/optical-switch:port-set-state           port-enab / port-disab
    GET     data/polatis-switch:system-alarms                  -> alarm-time, -type, -message

Sources: the Polatis YANG modules ``optical-switch@2018-03-22`` and ``polatis-switch@2017-09-11``
(ONOS ``models/polatis``; ONOS's Polatis NETCONF driver uses the same containers), public client
scripts for Polatis RESTCONF (port 8008, root ``/api``, the JSON shapes above, ``DELETE
.../pair=<ingress>``), RFC 8040 (errors, entity tags, status codes) and RFC 7232 (``If-Match``).
``lightrail.emulator.servers.restconf`` documents which details are assumptions;
``lightrail.drivers.restconf.wire``
holds the JSON shapes and the HTTP -> error mapping.

``apply`` computes the minimal diff restricted to ``ports``
(``lightrail.drivers.base.minimal_diff``; cross-connects outside ``ports`` are never touched)
against the caller's confirmed state and the entity tag of the driver's last answer about the
cross-connects when it has both, else against a read of the cross-connects and their tag
(the caller's state must come from this driver's answers: a reconciler's view); it issues
one ``DELETE`` per break, then the makes in one ``PATCH`` (chunks of ``max_batch`` when the
device has one), every write with ``If-Match`` of the tag the previous answer carried. On 412
(someone else changed the cross-connects since that tag) it reads again, recomputes and
retries once. After a write fails it reads back to learn what took effect: all of it ->
success (the answer was lost); none of it -> the mapped error; part of it -> ``PartialApply``
whose result says what was and was not done (per pair reasons from RESTCONF ``error-path``).
A successful apply is verified by one read-back, checked on the ports it changed
(``VerificationMismatch``), unless ``verify`` is off.
aiohttp itself re-sends an idempotent request (GET, DELETE) once when the connection drops
before the answer (RFC 9112 section 9.3.1); a re-sent DELETE whose first copy took effect gets
412 (stale tag) or 404 (pair gone), both handled as "re-read, account, retry".

HTTP -> error mapping (``lightrail.drivers.base`` hierarchy; retryable ones marked *):
    401, 403                          AuthenticationFailed
    400 invalid-value naming a port   InvalidPort
    404 on a port resource            InvalidPort
    400 (other), 404 (other), 405, 406, 415, other 4xx, unparsable body, bad HTTP
                                      ProtocolError*
    409 in-use                        CrossConnectConflict (parsed from the message, else found
                                      by read-back)
    412 (and 404 on a DELETE)         re-read and retry once, then ConcurrentModification*
                                      (defined here)
    413 too-big                       DriverError
    500 partial-operation             PartialApply*
    500 (other), 501, other 5xx       HardwareFault
    502, 503                          DeviceUnreachable*
    504                               DeviceTimeout*
    connection refused / dropped / closed mid-answer
                                      DeviceUnreachable*
    no answer within ``timeout_s``    DeviceTimeout*

Alarms: ``events()`` polls ``system-alarms`` every ``alarm_poll_interval_s`` seconds (default
1 s). Each alarm in the list (identified by its time, port, condition and text) is delivered
once per iterator, including those already active at the first poll; when one leaves the list
a CLEARED alarm is delivered. Severity by ``alarm-type``: NOTIF_PORT_POWER -> MAJOR,
NOTIF_PORT_POWER_WARN -> MINOR, others -> WARNING. Port and condition come from messages
``"port <n>: <condition>: <text>"`` (``"<condition>: <text>"`` for system alarms); otherwise
the port is searched as ``port <n>`` and the condition is the alarm type. ``at_s`` is the alarm
time in seconds since the Unix epoch. Poll failures are logged and polling goes on.

Options (``switches[<id>].options``, ``lightrail.drivers.restconf.options.RestconfOptions``;
unknown keys are rejected): ``host`` (required), ``port`` (8008),
``scheme`` (http|https), ``root`` (/api), ``username``/``password`` or ``username_env``/
``password_env`` (names of environment variables; credentials are never logged),
``timeout_s`` (10), ``alarm_poll_interval_s`` (1), ``los_threshold_dbm`` (-30: a port with less
power is oper DOWN), ``verify`` (true).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass

import aiohttp
import structlog

from lightrail.drivers.base import (
    ApplyMode,
    ApplyResult,
    CommandGate,
    CrossConnect,
    CrossConnectConflict,
    DeviceAlarm,
    DeviceInfo,
    DeviceTimeout,
    DeviceUnreachable,
    Driver,
    DriverError,
    InvalidPort,
    PartialApply,
    PortAdmin,
    PortOper,
    PortStatus,
    ProtocolError,
    SwitchCapabilities,
    SwitchSpec,
    check_apply_request,
    check_gate,
    check_read_back,
    minimal_diff,
)
from lightrail.drivers.options import DriverContext
from lightrail.drivers.restconf.alarms import AlarmFeed
from lightrail.drivers.restconf.options import (
    RestconfCredentials,
    RestconfOptions,
    resolve_credentials,
)
from lightrail.drivers.restconf.wire import (
    PAIR_PATH,
    XC_CONTAINER,
    UnparsedConflict,
    alarm_from_raw,
    error_for_answer,
    parse_alarms,
    parse_cross_connects,
    parse_errors,
    parse_port_config,
    parse_power,
    parse_product_information,
)

MEDIA_TYPE = "application/yang-data+json"
"""RESTCONF JSON media type (RFC 8040 section 11.3.2)."""

_XC = XC_CONTAINER
_log = structlog.get_logger(__name__)


class ConcurrentModification(DriverError):
    """The cross-connects changed under the driver twice in a row (HTTP 412 again after one
    re-read and retry): another client is writing to the switch."""

    retryable = True


# --- wire helpers --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Reply:
    status: int
    etag: str | None
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class _Stale(Exception):
    """HTTP 412 (or 404 on a break): the cross-connects changed since they were read."""


class _WriteFailed(Exception):
    """A write got an error answer: ``error`` is the mapped driver error, ``reasons`` the
    per-pair messages by ingress, ``partial`` true for ``partial-operation``."""

    def __init__(self, error: DriverError, reasons: Mapping[int, str], partial: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.reasons = dict(reasons)
        self.partial = partial


# --- the driver ----------------------------------------------------------------------------------


class RestconfDriver:
    """A ``lightrail.drivers.base.Driver`` for one switch speaking RESTCONF (module docstring).

    ``capabilities`` come from the configuration (the YANG model does not describe the port
    layout or the reconfiguration delay); the device supplies vendor, model and firmware. Every
    call before ``open`` or after ``close`` raises ``DeviceUnreachable``.
    """

    def __init__(
        self,
        switch_id: str,
        capabilities: SwitchCapabilities,
        settings: RestconfOptions,
        credentials: RestconfCredentials,
        command_gate: CommandGate | None = None,
    ) -> None:
        self._switch_id = switch_id
        self._gate = command_gate
        self._caps = capabilities
        self._settings = settings
        self._credentials = credentials
        self._session: aiohttp.ClientSession | None = None
        self._xc_etag: str | None = None  # of the last answer about the cross-connects
        self._feeds: list[AlarmFeed] = []
        self._log = _log.bind(switch=switch_id, url=settings.base_url)

    def __repr__(self) -> str:
        return f"RestconfDriver(switch_id={self._switch_id!r}, url={self._settings.base_url!r})"

    @property
    def switch_id(self) -> str:
        """The switch this driver controls."""
        return self._switch_id

    @property
    def settings(self) -> RestconfOptions:
        """Address, deadlines and options in use."""
        return self._settings

    # --- lifetime ------------------------------------------------------------------------------

    async def open(self) -> None:
        """Create the HTTP session and read ``product-information`` (checks address and
        credentials). Raises ``DeviceUnreachable``, ``DeviceTimeout``,
        ``AuthenticationFailed``, ``ProtocolError``. Idempotent."""
        if self._session is not None:
            return
        authorization = aiohttp.encode_basic_auth(
            self._credentials.username, self._credentials.password
        )
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self._settings.timeout_s),
            headers={"Accept": MEDIA_TYPE, "Authorization": authorization},
        )
        try:
            info = await self.info()
        except BaseException:
            await self.close()
            raise
        self._log.info("opened", vendor=info.vendor, model=info.model, firmware=info.firmware)

    async def close(self) -> None:
        """End every ``events()`` iterator and close the session; idempotent."""
        feeds, self._feeds = self._feeds, []
        for feed in feeds:
            await feed.aclose()
        session, self._session = self._session, None
        self._xc_etag = None
        if session is not None:
            await session.close()

    # --- HTTP ----------------------------------------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, object] | None = None,
        if_match: str | None = None,
    ) -> _Reply:
        """One HTTP exchange. Raises ``DeviceUnreachable`` (not open, refused, dropped, closed
        mid-answer), ``DeviceTimeout``, ``ProtocolError`` (not HTTP), ``NotLeader`` when
        the command gate refuses (nothing sent)."""
        check_gate(self._gate, self._switch_id)
        session = self._session
        if session is None:
            raise DeviceUnreachable(self._switch_id, "driver is not open")
        url = f"{self._settings.base_url}/{path}"
        headers: dict[str, str] = {}
        data: bytes | None = None
        if if_match is not None:
            headers["If-Match"] = if_match
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = MEDIA_TYPE
        what = f"{method} {path}"
        try:
            async with session.request(method, url, data=data, headers=headers) as response:
                payload = await response.read()
                reply = _Reply(response.status, response.headers.get("ETag"), payload)
        except TimeoutError as e:
            raise DeviceTimeout(
                self._switch_id, f"{what}: no answer within {self._settings.timeout_s} s"
            ) from e
        except aiohttp.ClientConnectorError as e:
            raise DeviceUnreachable(self._switch_id, f"{what}: cannot connect: {e}") from e
        except aiohttp.ServerDisconnectedError as e:
            raise DeviceUnreachable(
                self._switch_id, f"{what}: connection closed before the answer"
            ) from e
        except aiohttp.ClientPayloadError as e:
            raise DeviceUnreachable(
                self._switch_id, f"{what}: connection closed in the middle of the answer"
            ) from e
        except aiohttp.ClientResponseError as e:
            raise ProtocolError(
                self._switch_id, f"{what}: not an HTTP answer: {e.message}"
            ) from e
        except aiohttp.ClientError as e:
            raise DeviceUnreachable(self._switch_id, f"{what}: {type(e).__name__}: {e}") from e
        self._log.debug("restconf", method=method, path=path, status=reply.status)
        return reply

    def _decode(self, reply: _Reply, what: str) -> object:
        try:
            return json.loads(reply.body)
        except (ValueError, RecursionError) as e:  # RecursionError: nested too deep
            raise ProtocolError(
                self._switch_id, f"{what}: answer is not JSON: {reply.body[:80]!r}"
            ) from e

    async def _get(self, path: str, *, port: int | None = None) -> tuple[object, str | None]:
        reply = await self._send("GET", path)
        if not reply.ok:
            raise self._error_for(reply, f"GET {path}", port=port)
        return self._decode(reply, f"GET {path}"), reply.etag

    def _protocol(self, what: str, error: ValueError) -> ProtocolError:
        return ProtocolError(self._switch_id, f"{what}: unexpected answer: {error}")

    def _error_for(self, reply: _Reply, what: str, *, port: int | None = None) -> DriverError:
        return error_for_answer(self._switch_id, reply.status, reply.body, what, port=port)

    # --- reads ---------------------------------------------------------------------------------

    async def info(self) -> DeviceInfo:
        """Identity from ``product-information``; capabilities from the configuration.
        Raises ``DeviceUnreachable``, ``DeviceTimeout``, ``AuthenticationFailed``,
        ``ProtocolError``."""
        path = "data/optical-switch:product-information"
        doc, _ = await self._get(path)
        try:
            product = parse_product_information(doc)
        except ValueError as e:
            raise self._protocol(f"GET {path}", e) from e
        return DeviceInfo(
            self._switch_id, product.manufacturer, product.model_name,
            product.software_version, self._caps,
        )

    async def _read_cross_connects(self) -> tuple[frozenset[CrossConnect], str | None]:
        path = f"data/{_XC}"
        doc, etag = await self._get(path)
        try:
            xcs = parse_cross_connects(doc)
        except ValueError as e:
            raise self._protocol(f"GET {path}", e) from e
        self._xc_etag = etag
        return xcs, etag

    async def get_cross_connects(self) -> frozenset[CrossConnect]:
        """Read back every cross-connect on the switch. Raises ``DeviceUnreachable``,
        ``DeviceTimeout``, ``AuthenticationFailed``, ``ProtocolError``."""
        xcs, _ = await self._read_cross_connects()
        return xcs

    def _check_ports(self, ports: Iterable[int]) -> list[int]:
        valid = self._caps.port_ids()
        out = list(ports)
        for port in out:
            if port not in valid:
                raise InvalidPort(self._switch_id, port, "no such port")
        return out

    async def get_power(self, ports: Iterable[int] | None = None) -> dict[int, float]:
        """Optical power per port in dBm from ``opm-power`` (default: every port the device
        reports). Raises ``InvalidPort`` (unknown port, or no reading for it),
        ``DeviceUnreachable``, ``DeviceTimeout``, ``ProtocolError``."""
        wanted = None if ports is None else self._check_ports(ports)
        path = "data/optical-switch:opm-power"
        doc, _ = await self._get(path)
        try:
            power = parse_power(doc)
        except ValueError as e:
            raise self._protocol(f"GET {path}", e) from e
        if wanted is None:
            return power
        out: dict[int, float] = {}
        for port in wanted:
            if port not in power:
                raise InvalidPort(self._switch_id, port, "the device reports no power for it")
            out[port] = power[port]
        return out

    async def get_port_status(self, ports: Iterable[int] | None = None) -> list[PortStatus]:
        """Status of ``ports`` (default: all) in the order given, from ``port-config``
        (``status``) and ``opm-power``: FAILED -> oper FAILED; DISABLED -> admin DISABLED, oper
        DOWN; ENABLED -> oper UP when the power is at least ``los_threshold_dbm``, else DOWN.
        Raises ``InvalidPort``, ``DeviceUnreachable``, ``DeviceTimeout``, ``ProtocolError``."""
        wanted = list(self._caps.port_ids()) if ports is None else self._check_ports(ports)
        path = "data/optical-switch:port-config"
        doc, _ = await self._get(path)
        try:
            statuses = parse_port_config(doc)
        except ValueError as e:
            raise self._protocol(f"GET {path}", e) from e
        power = await self.get_power()
        out: list[PortStatus] = []
        for port in wanted:
            status = statuses.get(port)
            if status is None:
                raise InvalidPort(self._switch_id, port, "not in the device's port-config")
            lit = power.get(port, float("-inf")) >= self._settings.los_threshold_dbm
            if status == "FAILED":
                out.append(PortStatus(port, PortAdmin.ENABLED, PortOper.FAILED))
            elif status == "DISABLED":
                out.append(PortStatus(port, PortAdmin.DISABLED, PortOper.DOWN))
            elif status in ("ENABLED", "UNSUPPORTED"):
                oper = PortOper.UP if lit else PortOper.DOWN
                out.append(PortStatus(port, PortAdmin.ENABLED, oper))
            else:
                raise ProtocolError(
                    self._switch_id, f"GET {path}: port {port} has unknown status {status!r}"
                )
        return out

    async def set_port_admin(self, port: int, admin: PortAdmin) -> None:
        """Enable or disable ``port`` with the ``port-set-state`` RPC. Raises ``InvalidPort``,
        ``DeviceUnreachable``, ``DeviceTimeout``, ``AuthenticationFailed``,
        ``ProtocolError``."""
        self._check_ports([port])
        key = "port-enab" if admin is PortAdmin.ENABLED else "port-disab"
        path = "operations/optical-switch:port-set-state"
        reply = await self._send("POST", path, body={"optical-switch:input": {key: [port]}})
        if not reply.ok:
            raise self._error_for(reply, f"POST {path}", port=port)
        self._log.info("port admin set", port=port, admin=admin.value)

    async def _read_alarms(self) -> list[DeviceAlarm]:
        path = "data/polatis-switch:system-alarms"
        doc, _ = await self._get(path)
        try:
            return [alarm_from_raw(self._switch_id, raw) for raw in parse_alarms(doc)]
        except ValueError as e:
            raise self._protocol(f"GET {path}", e) from e

    def events(self) -> AsyncIterator[DeviceAlarm]:
        """Alarms by polling ``system-alarms`` (module docstring), until ``close``. Raises
        ``DeviceUnreachable`` when not open."""
        if self._session is None:
            raise DeviceUnreachable(self._switch_id, "driver is not open")
        feed = AlarmFeed(self._switch_id, self._read_alarms, self._settings.alarm_poll_interval_s)
        self._feeds.append(feed)
        return feed

    # --- apply ---------------------------------------------------------------------------------

    async def apply(
        self,
        target: frozenset[CrossConnect],
        ports: frozenset[int],
        mode: ApplyMode = ApplyMode.MINIMAL,
        *,
        current: frozenset[CrossConnect] | None = None,
    ) -> ApplyResult:
        """Make the cross-connects on ``ports`` equal ``target`` (module docstring): breaks
        (one DELETE each), then makes (one PATCH, or chunks of ``max_batch``), then a read-back
        of the ports changed (``verified``). With ``current`` (the caller's confirmed state) and
        a known entity tag the writes go out without a read first; a device that changed since
        answers 412 and the driver reads, recomputes and retries once. Nothing to do issues no
        write.

        Raises ``InvalidPort`` (unknown port, target leaving ``ports``, a cross-connect
        straddling ``ports``), ``CrossConnectConflict`` (``target`` not a partial permutation,
        or the device refuses), ``PartialApply`` (part took effect; ``result`` says what),
        ``VerificationMismatch``, ``ConcurrentModification``, ``HardwareFault``,
        ``AuthenticationFailed``, ``DeviceUnreachable``, ``DeviceTimeout``,
        ``ProtocolError``."""
        check_apply_request(self._switch_id, self._caps, target, ports)
        removed: list[CrossConnect] = []
        added: list[CrossConnect] = []
        wrote = False
        breaks: Sequence[CrossConnect] = ()
        makes: Sequence[CrossConnect] = ()
        for attempt in (1, 2):
            state: frozenset[CrossConnect]
            etag: str | None
            if attempt == 1 and current is not None and self._xc_etag is not None:
                state, etag = current, self._xc_etag
            else:
                state, etag = await self._read_cross_connects()
                # after a 412/404: count what the first attempt's writes did without an answer
                # (e.g. a DELETE that took effect, lost its answer and was re-sent)
                removed += [x for x in breaks if x not in state and x not in removed]
                added += [x for x in makes if x in state and x not in added]
            diff = minimal_diff(self._switch_id, state, target, ports, mode)
            breaks, makes = diff.breaks, diff.makes
            if diff.empty:
                break
            wrote = True
            try:
                await self._write(breaks, makes, etag, removed, added)
            except _Stale as e:
                if attempt == 1:
                    self._log.info("cross-connects changed under us; re-reading", reason=str(e))
                    continue
                error = ConcurrentModification(self._switch_id,
                                               f"cross-connects keep changing: {e}")
                await self._settle_failure(error, breaks, makes, removed, added, {}, False)
            except _WriteFailed as e:
                await self._settle_failure(
                    e.error, breaks, makes, removed, added, e.reasons, e.partial
                )
            except DriverError as e:
                await self._settle_failure(e, breaks, makes, removed, added, {}, False)
            break
        if not wrote:
            return ApplyResult()
        # per reconfiguration: debug (counted in metrics, recorded as an event)
        self._log.debug("applied", removed=len(removed), added=len(added))
        if not self._settings.verify:
            return ApplyResult(tuple(removed), tuple(added))
        changed = frozenset(p for xc in removed + added for p in xc.ports())
        state, _ = await self._read_cross_connects()
        check_read_back(self._switch_id, target, changed, state)
        return ApplyResult(tuple(removed), tuple(added), verified=True)

    async def _write(
        self,
        breaks: Sequence[CrossConnect],
        makes: Sequence[CrossConnect],
        etag: str | None,
        removed: list[CrossConnect],
        added: list[CrossConnect],
    ) -> None:
        """Breaks then makes, chaining entity tags; appends what the device acknowledged.
        Raises ``_Stale``, ``_WriteFailed`` or transport ``DriverError``s."""
        self._xc_etag = None  # unknown until an answer carries the next one
        for xc in breaks:
            path = f"data/{_XC}/pair={xc.ingress}"
            reply = await self._send("DELETE", path, if_match=etag)
            if reply.status in (412, 404):
                raise _Stale(f"DELETE {path}: HTTP {reply.status}")
            if not reply.ok:
                raise self._write_failed(reply, f"DELETE {path}")
            removed.append(xc)
            etag = self._xc_etag = reply.etag
        limit = self._caps.max_batch or max(len(makes), 1)
        for i in range(0, len(makes), limit):
            chunk = makes[i : i + limit]
            body = {_XC: {"pair": [{"ingress": x.ingress, "egress": x.egress} for x in chunk]}}
            path = f"data/{_XC}"
            reply = await self._send("PATCH", path, body=body, if_match=etag)
            if reply.status == 412:
                raise _Stale(f"PATCH {path}: HTTP 412")
            if not reply.ok:
                raise self._write_failed(reply, f"PATCH {path}")
            added.extend(chunk)
            etag = self._xc_etag = reply.etag

    def _write_failed(self, reply: _Reply, what: str) -> _WriteFailed:
        errors = parse_errors(reply.body)
        reasons: dict[int, str] = {}
        for entry in errors:
            m = PAIR_PATH.search(entry.path or "")
            if m is not None:
                reasons[int(m.group(1))] = entry.message
        partial = reply.status == 500 and any(e.tag == "partial-operation" for e in errors)
        return _WriteFailed(self._error_for(reply, what), reasons, partial)

    async def _settle_failure(
        self,
        error: DriverError,
        breaks: Sequence[CrossConnect],
        makes: Sequence[CrossConnect],
        removed: list[CrossConnect],
        added: list[CrossConnect],
        reasons: Mapping[int, str],
        partial: bool,
    ) -> None:
        """A write failed: read back to learn what took effect. Returns when everything did
        (the answer was lost); raises ``error`` when nothing changed, else ``PartialApply``."""
        sid = self._switch_id
        text = str(error).removeprefix(f"switch {sid!r}: ")
        try:
            state, _ = await self._read_cross_connects()
        except DriverError as read_error:
            self._log.warning("read-back after a failed write failed", error=str(read_error))
            state = None
        if state is not None:
            _count_read_back(state, breaks, makes, removed, added)
        failed = _not_applied(breaks, makes, removed, added, reasons, text, state is not None)
        if not failed:
            self._log.warning("write answer lost, but the read-back shows it took effect",
                              error=text)
            return
        if not removed and not added and not partial:
            if isinstance(error, UnparsedConflict):
                raise self._conflict_in(error, makes, state)
            raise error
        result = ApplyResult(tuple(removed), tuple(added), failed)
        self._log.warning(
            "partial apply", removed=len(removed), added=len(added), failed=len(failed)
        )
        raise PartialApply(sid, result) from error

    def _conflict_in(
        self,
        error: DriverError,
        makes: Sequence[CrossConnect],
        state: frozenset[CrossConnect] | None,
    ) -> DriverError:
        """A 409 whose message did not name the cross-connects: find the conflict in the
        read-back state (``error`` itself when it cannot be found)."""
        if state is None:
            return error
        for make in makes:
            for existing in state:
                if existing != make and set(existing.ports()) & set(make.ports()):
                    return CrossConnectConflict(self._switch_id, make, existing)
        return error


def _count_read_back(
    state: frozenset[CrossConnect],
    breaks: Sequence[CrossConnect],
    makes: Sequence[CrossConnect],
    removed: list[CrossConnect],
    added: list[CrossConnect],
) -> None:
    """Add to ``removed`` / ``added`` the breaks gone from and the makes present in the
    read-back ``state`` that the answers did not confirm (their answer was lost)."""
    for xc in breaks:
        if xc not in state and xc not in removed:
            removed.append(xc)
    for xc in makes:
        if xc in state and xc not in added:
            added.append(xc)


def _not_applied(
    breaks: Sequence[CrossConnect],
    makes: Sequence[CrossConnect],
    removed: Sequence[CrossConnect],
    added: Sequence[CrossConnect],
    reasons: Mapping[int, str],
    text: str,
    read_back: bool,
) -> dict[CrossConnect, str]:
    """Each break not removed and make not added, with its reason: the device's per-pair
    message (``reasons``, by ingress port) for a make, else ``text``; prefixed "outcome
    unknown: " when the read-back failed (``read_back`` False)."""
    prefix = "" if read_back else "outcome unknown: "
    failed: dict[CrossConnect, str] = {}
    for xc in breaks:
        if xc not in removed:
            failed[xc] = prefix + text
    for xc in makes:
        if xc not in added:
            failed[xc] = prefix + reasons.get(xc.ingress, text)
    return failed


def make_driver(spec: SwitchSpec, context: DriverContext) -> Driver:
    """An unopened RESTCONF driver for ``spec`` (config ``model: restconf``) from its
    ``options`` (``RestconfOptions``), credentials resolved from ``context.environ``. Raises
    ``lightrail.drivers.options.DriverConfigError`` naming the switch, the model and the option
    when the options are invalid or unknown or a credential is missing."""
    options = RestconfOptions.from_spec(spec)
    credentials = resolve_credentials(spec, options, context.environ)
    return RestconfDriver(spec.switch_id, spec.capabilities, options, credentials,
                          command_gate=context.command_gate)
