"""TL1 driver for Polatis-dialect optical circuit switches (config ``model: tl1``).

One TCP connection per driver (asyncio streams) carrying one TL1 session: ``ACT-USER`` at
connect, ``CANC-USER`` at close, and a fresh login on every reconnect. Commands are pipelined:
each gets its own ctag (1..999999), several may be in flight at once, and a background reader
matches replies to callers by ctag, so replies may come back in any order and a reply that
arrives after its caller timed out is dropped. Autonomous ``REPT ALM`` messages become
``DeviceAlarm`` s on ``events()``. The wire syntax and its sources are in
``lightrail.drivers.tl1.wire``.

Commands used (canonical port ids are Polatis port numbers: ingress 1..N, egress N+1..2N)::

    ACT-USER::<user>:<ctag>::<password>;      CANC-USER::<user>:<ctag>:;
    RTRV-PATCH:::<ctag>:;  RTRV-PATCH::<ports>:<ctag>:;     ->  "<in>,<out>" per patch
    DLT-PATCH::<ports>:<ctag>:;                (deletes the patches on those ports)
    ENT-PATCH::<ins>,<outs>:<ctag>:;           (bulk, paired in order)
    RTRV-PORT-POWER::<ports>:<ctag>:;          ->  "<port>:<dBm>"
    RTRV-PORT-SHUTTER / OPR-PORT-SHUTTER / RLS-PORT-SHUTTER::<ports>:<ctag>:;
    RTRV-ALM-ALL::ALL:<ctag>:;  RTRV-NETYPE:::<ctag>:;  RTRV-EQPT::SYSTEM:<ctag>:::PARAMETER=SIZE;

``apply`` computes the minimal diff (``lightrail.drivers.base.minimal_diff``) against the
caller's confirmed state when it is given, else against the patches it reads back on the given
ports (one RTRV-PATCH), then issues the breaks as DLT-PATCH (chunks of ``max_batch``,
pipelined) and, only once every break is confirmed, the makes as ENT-PATCH (chunks sent one
after the other), then reads back the ports it changed (one RTRV-PATCH) and raises
``VerificationMismatch`` unless they hold exactly the target. One reconcile of 2 breaks and 2
makes from the reconciler's view is therefore DLT, ENT, RTRV. TL1 has no transaction spanning
DLT and ENT: when the ENT is refused after the DLT took effect the driver reads back the given
ports and raises ``PartialApply`` saying what changed.

DENY error codes (Telcordia GR-833 names; Polatis usage where observed) map to errors
(``lightrail.drivers.tl1.errors``; the session and its ctag matching are in
``lightrail.drivers.tl1.session``):

=====================================================  =======================================
``PICC`` ``PLNA`` ``PIUI`` ``PIUC`` ``PIPW``            ``AuthenticationFailed`` (a command
                                                       denied ``PLNA`` is retried once after a
                                                       new login)
``IIAC`` ``IDNV`` ``IDRG``                             ``InvalidPort`` (the port from the
                                                       comment, else the first port sent)
``SAAS``                                               ``CrossConnectConflict`` (the existing
                                                       cross-connect found by a read-back)
``SROF`` ``SWFA`` ``SPFA`` ``EQWT``                    ``HardwareFault``
``SDNR`` ``SARB``                                      ``DeviceTimeout`` (retryable: not ready)
``ICNV`` ``IICM``                                      ``UnsupportedOperation``
``IICT`` ``IPNV`` ``IPMS`` ``IPEX`` ``IBEX`` ``IBMS``  ``Tl1CommandRejected``
``ISCH`` ``ISPC`` ``IITA`` ``IISP`` ``IISY``, others
=====================================================  =======================================

Transport errors: connection refused, reset or closed -> ``DeviceUnreachable``; no reply within
``timeout_s`` -> ``DeviceTimeout``; a reply that cannot be parsed -> ``ProtocolError`` (the
connection is dropped; the next call reconnects). A read-only command that fails because the
connection turned out to be dead before any reply started is retried once on a new connection.

Options (``switches[<id>].options``, ``lightrail.drivers.tl1.options.Tl1Options``; an
unknown key is rejected): ``host``,
``port`` (required); ``username`` or ``username_env``,
``password`` or ``password_env`` (the name of an environment variable, read at each login;
credentials are never logged); ``timeout_s`` (per command, plus the settle time for ENT-PATCH;
default 5), ``connect_timeout_s`` (3), ``reconnect_interval_s`` (1: how often ``events()``
subscribers reconnect after a drop), ``tid`` (target identifier, default empty), ``verify``
(read back after apply, default true), ``los_threshold_dbm`` (power at or below which a port is
DOWN in ``get_port_status``, default -30). Port status: admin from the shutter (OPEN enabled,
CLOSED disabled), oper FAILED when an alarm other than NA/CL is active on the port, else UP when
its power is above ``los_threshold_dbm``, else DOWN.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from types import MappingProxyType

import structlog

from lightrail.drivers.alarm_stream import AlarmStream
from lightrail.drivers.base import (
    AlarmSeverity,
    ApplyMode,
    ApplyResult,
    AuthenticationFailed,
    CommandGate,
    CrossConnect,
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
    SwitchKind,
    SwitchSpec,
    check_apply_request,
    check_gate,
    check_read_back,
    minimal_diff,
)
from lightrail.drivers.options import DriverContext
from lightrail.drivers.timing import Clock, Sleep
from lightrail.drivers.tl1.errors import deny_error
from lightrail.drivers.tl1.options import Tl1Options
from lightrail.drivers.tl1.session import ConnectionLost, Tl1Session
from lightrail.drivers.tl1.wire import (
    Tl1Autonomous,
    Tl1Response,
    Tl1SyntaxError,
    format_port_list,
    parse_alarm_line,
    port_number,
    tl1_value,
)

_log = structlog.get_logger(__name__)

_ALARM_QUEUE_SIZE = 1024
_PATCH_RE = re.compile(r"^\s*(\d+)\s*,\s*(\d+)\s*$")
_VALUE_RE = re.compile(r"^\s*(\d+)\s*:\s*(\S+)\s*$")
_SIZE_RE = re.compile(r"SIZE=(\d+)x(\d+)", re.IGNORECASE)

_SEVERITY: Mapping[str, AlarmSeverity] = MappingProxyType(
    {
        "CR": AlarmSeverity.CRITICAL,
        "MJ": AlarmSeverity.MAJOR,
        "MN": AlarmSeverity.MINOR,
        "NA": AlarmSeverity.WARNING,
        "NR": AlarmSeverity.WARNING,
        "CL": AlarmSeverity.CLEARED,
    }
)


# --- the driver ----------------------------------------------------------------------------------


class Tl1Driver:
    """A ``lightrail.drivers.base.Driver`` speaking Polatis TL1 to ``options.host:options.port``.

    ``spec.capabilities`` (from config) gives the port layout, the settle time and
    ``max_batch``; ``info`` checks the device's reported size against it. ``clock`` stamps
    received alarms (``DeviceAlarm.at_s``), ``sleep`` paces reconnection; ``environ`` is where
    ``username_env``/``password_env`` are looked up (default ``os.environ``); ``command_gate``
    is asked before every command (``lightrail.drivers.options.DriverContext``).

    Every call other than ``open`` raises ``DeviceUnreachable`` before ``open`` or after
    ``close``. The connection is made by ``open`` and remade on demand after a drop.
    """

    def __init__(
        self,
        spec: SwitchSpec,
        options: Tl1Options,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        environ: Mapping[str, str] | None = None,
        command_gate: CommandGate | None = None,
    ) -> None:
        self._switch_id = spec.switch_id
        self._caps = spec.capabilities
        self._opts = options
        self._clock = clock
        self._sleep = sleep
        self._environ = os.environ if environ is None else environ
        self._gate = command_gate
        self._session: Tl1Session | None = None
        self._username: str | None = None
        self._connect_lock = asyncio.Lock()
        self._apply_lock = asyncio.Lock()
        self._opened = False
        self._session_up = False
        """A session was open since the last loss was logged: the next loss is news (warning);
        later ones, while every reconnect fails, are logged at debug (one warning per outage,
        not one per attempt)."""
        self._subscribers: set[AlarmStream] = set()
        self._reconnect_task: asyncio.Task[None] | None = None
        self._log = _log.bind(switch=spec.switch_id)

    @property
    def switch_id(self) -> str:
        """The switch this driver controls."""
        return self._switch_id

    @property
    def capabilities(self) -> SwitchCapabilities:
        """The configured capabilities."""
        return self._caps

    # --- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect and log in. Raises ``DeviceUnreachable``, ``DeviceTimeout``,
        ``AuthenticationFailed``, ``ProtocolError``."""
        self._opened = True
        try:
            await self._ensure_session()
        except BaseException:
            self._opened = False
            raise

    async def close(self) -> None:
        """Log out (best effort), disconnect and end every ``events()`` stream; idempotent."""
        self._opened = False
        task, self._reconnect_task = self._reconnect_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        session, self._session = self._session, None
        if session is not None:
            if session.alive and self._username is not None:
                with contextlib.suppress(DriverError, ValueError):
                    await session.command(
                        "CANC-USER",
                        aid=tl1_value(self._username),
                        timeout_s=min(1.0, self._opts.timeout_s),
                        secret=True,
                    )
            await session.close()
        for stream in list(self._subscribers):
            await stream.aclose()

    # --- reads --------------------------------------------------------------------------------

    async def info(self) -> DeviceInfo:
        """Identity (RTRV-NETYPE) and capabilities (from config, checked against RTRV-EQPT
        SYSTEM SIZE on an N x N switch). Raises ``DriverError`` when the device's size differs
        from the configured ``port_count``, ``ProtocolError``, ``DeviceUnreachable``,
        ``DeviceTimeout``."""
        netype, size = await asyncio.gather(
            self._checked("RTRV-NETYPE"),
            self._checked("RTRV-EQPT", aid="SYSTEM", params=("", "PARAMETER=SIZE")),
        )
        if not netype.lines:
            raise ProtocolError(self._switch_id, "RTRV-NETYPE returned no line")
        fields = [f.strip() for f in netype.lines[0].split(",")]
        if len(fields) < 4:
            raise ProtocolError(self._switch_id, f"bad RTRV-NETYPE line {netype.lines[0]!r}")
        vendor, model, _kind, firmware = fields[:4]
        match = next((m for m in map(_SIZE_RE.search, size.lines) if m is not None), None)
        if match is None:
            raise ProtocolError(self._switch_id, "RTRV-EQPT returned no SIZE")
        ins, outs = int(match[1]), int(match[2])
        n = self._caps.port_count
        if self._caps.kind is SwitchKind.NXN and (ins, outs) != (n, n):
            raise DriverError(
                self._switch_id,
                f"device reports size {ins}x{outs}, config says {n}x{n} (port_count {n})",
            )
        return DeviceInfo(self._switch_id, vendor, model, firmware, self._caps)

    async def get_cross_connects(self) -> frozenset[CrossConnect]:
        """Every cross-connect on the switch (RTRV-PATCH). Raises ``DeviceUnreachable``,
        ``DeviceTimeout``, ``ProtocolError``."""
        return await self._read_patches(None)

    async def get_power(self, ports: Iterable[int] | None = None) -> dict[int, float]:
        """Optical power in dBm of ``ports`` (default: all), in the order given
        (RTRV-PORT-POWER). Raises ``InvalidPort``, ``DeviceUnreachable``, ``DeviceTimeout``,
        ``ProtocolError``."""
        wanted = self._port_args(ports)
        if not wanted:
            return {}
        resp = await self._checked("RTRV-PORT-POWER", aid=format_port_list(wanted), ports=wanted)
        values = self._port_values(resp, "RTRV-PORT-POWER")
        out: dict[int, float] = {}
        for port in wanted:
            raw = values.get(port)
            if raw is None:
                raise ProtocolError(self._switch_id, f"RTRV-PORT-POWER: no value for port {port}")
            try:
                dbm = float(raw)
            except ValueError:
                dbm = math.nan
            if not math.isfinite(dbm):  # "nan" and "1e999" parse, but are no reading
                raise ProtocolError(
                    self._switch_id, f"RTRV-PORT-POWER: bad value {raw!r} for port {port}"
                )
            out[port] = dbm
        return out

    async def get_port_status(self, ports: Iterable[int] | None = None) -> list[PortStatus]:
        """Status of ``ports`` (default: all) in the order given, from RTRV-PORT-SHUTTER,
        RTRV-PORT-POWER and RTRV-ALM-ALL sent together (see the module docstring). Raises
        ``InvalidPort``, ``UnsupportedOperation`` (no shutters), ``DeviceUnreachable``,
        ``DeviceTimeout``, ``ProtocolError``."""
        wanted = self._port_args(ports)
        if not wanted:
            return []
        aid = format_port_list(wanted)
        shutter, power, alarms = await asyncio.gather(
            self._checked("RTRV-PORT-SHUTTER", aid=aid, ports=wanted),
            self._checked("RTRV-PORT-POWER", aid=aid, ports=wanted),
            self._checked("RTRV-ALM-ALL", aid="ALL"),
        )
        shutters = self._port_values(shutter, "RTRV-PORT-SHUTTER")
        powers = self._port_values(power, "RTRV-PORT-POWER")
        failed: set[int] = set()
        for line in alarms.lines:
            try:
                alarm = parse_alarm_line(line)
            except Tl1SyntaxError as e:
                raise ProtocolError(self._switch_id, f"RTRV-ALM-ALL: {e}") from None
            port = port_number(alarm.aid)
            if port is not None and alarm.notification not in {"NA", "NR", "CL"}:
                failed.add(port)
        out: list[PortStatus] = []
        for port in wanted:
            state, level = shutters.get(port), powers.get(port)
            if state is None or level is None:
                raise ProtocolError(self._switch_id, f"no shutter or power for port {port}")
            if state.upper() not in {"OPEN", "CLOSED"}:
                raise ProtocolError(self._switch_id, f"bad shutter state {state!r}")
            admin = PortAdmin.ENABLED if state.upper() == "OPEN" else PortAdmin.DISABLED
            try:
                lit = float(level) > self._opts.los_threshold_dbm
            except ValueError:
                raise ProtocolError(self._switch_id, f"bad power {level!r}") from None
            oper = PortOper.UP if lit else PortOper.DOWN
            if port in failed:
                oper = PortOper.FAILED
            out.append(PortStatus(port, admin, oper))
        return out

    # --- writes -------------------------------------------------------------------------------

    async def set_port_admin(self, port: int, admin: PortAdmin) -> None:
        """Enable (RLS-PORT-SHUTTER) or disable (OPR-PORT-SHUTTER) ``port``. Raises
        ``InvalidPort``, ``UnsupportedOperation``, ``DeviceUnreachable``, ``DeviceTimeout``."""
        self._port_args([port])
        code = "RLS-PORT-SHUTTER" if admin is PortAdmin.ENABLED else "OPR-PORT-SHUTTER"
        await self._checked(code, aid=str(port), ports=[port])

    async def apply(
        self,
        target: frozenset[CrossConnect],
        ports: frozenset[int],
        mode: ApplyMode = ApplyMode.MINIMAL,
        *,
        current: frozenset[CrossConnect] | None = None,
    ) -> ApplyResult:
        """Make the cross-connects on ``ports`` equal ``target``: diff against ``current`` (the
        caller's confirmed state) or, without it, against a read-back of ``ports``, DLT-PATCH
        the breaks, ENT-PATCH the makes, read back the ports changed (``verify``; then the
        result is ``verified``). Nothing to do returns an empty ``ApplyResult`` without a DLT
        or ENT command.

        Raises ``InvalidPort`` (a port the switch lacks, a target cross-connect leaving
        ``ports``, a cross-connect on ``ports`` that also uses a port outside them),
        ``CrossConnectConflict`` (``target`` is not a partial permutation, or the device refused
        a make because a port is in use), ``HardwareFault``, ``PartialApply`` (part of it took
        effect; ``result`` says what, learnt by reading back), ``VerificationMismatch``,
        ``DeviceUnreachable``, ``DeviceTimeout``, ``ProtocolError``.
        """
        check_apply_request(self._switch_id, self._caps, target, ports)
        if not ports:
            return ApplyResult()
        async with self._apply_lock:
            state = await self._read_patches(ports) if current is None else current
            diff = minimal_diff(self._switch_id, state, target, ports, mode)
            if diff.empty:
                return ApplyResult()
            breaks, makes = list(diff.breaks), list(diff.makes)
            self._log.debug("tl1 apply", breaks=len(breaks), makes=len(makes))
            await self._break(breaks, makes, ports)
            added = await self._make(breaks, makes, ports)
            if not (self._opts.verify and self._caps.readback):
                return ApplyResult(tuple(breaks), tuple(added))
            changed = diff.changed_ports()
            check_read_back(self._switch_id, target, changed, await self._read_patches(changed))
            return ApplyResult(tuple(breaks), tuple(added), verified=True)

    def events(self) -> AsyncIterator[DeviceAlarm]:
        """Alarms (REPT ALM) from now on until ``close``; while a stream is open the driver
        reconnects by itself after a drop (every ``reconnect_interval_s``). Alarms sent while
        disconnected are lost. ``DeviceAlarm.at_s`` is the driver's ``clock`` at receipt (the
        device's ocrdat/ocrtm wall time is not used); ``port`` is None for a non-port aid.
        Raises ``DeviceUnreachable`` when not open."""
        if not self._opened:
            raise DeviceUnreachable(self._switch_id, "driver is not open")
        stream = AlarmStream(self._unsubscribe, _ALARM_QUEUE_SIZE)
        self._subscribers.add(stream)
        if self._session is None or not self._session.alive:
            self._start_reconnect()
        return stream

    # --- apply steps --------------------------------------------------------------------------

    async def _break(
        self, breaks: list[CrossConnect], makes: list[CrossConnect], ports: frozenset[int]
    ) -> None:
        if not breaks:
            return
        chunks = self._chunks(breaks)
        results = await asyncio.gather(
            *(self._send_patch_command("DLT-PATCH", chunk) for chunk in chunks),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if not errors:
            return
        first = errors[0]
        if not isinstance(first, DriverError):
            raise first
        after = await self._learn(ports)
        first = self._refine(first, breaks, after or frozenset())
        if after is None:
            raise first
        removed = [xc for xc in breaks if xc not in after]
        if len(removed) == len(breaks):
            self._log.warning(
                "tl1 DLT-PATCH reply lost but read-back shows it done", error=str(first)
            )
            return
        if not removed:
            raise first
        failed = {xc: str(first) for xc in breaks if xc in after}
        failed.update(dict.fromkeys(makes, "not attempted: a break failed"))
        raise PartialApply(self._switch_id, ApplyResult(tuple(removed), (), failed))

    async def _make(
        self, breaks: list[CrossConnect], makes: list[CrossConnect], ports: frozenset[int]
    ) -> list[CrossConnect]:
        added: list[CrossConnect] = []
        chunks = self._chunks(makes)
        for n, chunk in enumerate(chunks):
            try:
                await self._send_patch_command("ENT-PATCH", chunk)
            except DriverError as error:
                later = [xc for rest in chunks[n + 1 :] for xc in rest]
                after = await self._learn(ports)
                if after is None:
                    error = self._refine(error, chunk, frozenset())
                    if not breaks and not added:
                        raise error from None
                    failed = {xc: f"unknown: {error}" for xc in chunk}
                    failed.update(dict.fromkeys(later, "not attempted: an earlier command failed"))
                    raise PartialApply(
                        self._switch_id, ApplyResult(tuple(breaks), tuple(added), failed)
                    ) from error
                denial = error
                error = self._refine(error, chunk, after)
                made_now = [xc for xc in chunk if xc in after]
                if len(made_now) == len(chunk):
                    self._log.warning(
                        "tl1 ENT-PATCH reply lost but read-back shows it done", error=str(error)
                    )
                    added += chunk
                    continue
                added += made_now
                if not breaks and not added:
                    raise error from None
                failed = {
                    xc: self._reason_for(xc, denial, str(error))
                    for xc in chunk
                    if xc not in after
                }
                failed.update(dict.fromkeys(later, "not attempted: an earlier command failed"))
                raise PartialApply(
                    self._switch_id, ApplyResult(tuple(breaks), tuple(added), failed)
                ) from error
            added += chunk
        return added

    async def _send_patch_command(self, code: str, chunk: list[CrossConnect]) -> None:
        """DLT-PATCH by ingress ports, or ENT-PATCH with paired lists; DENY raises
        ``_Denied``."""
        if code == "DLT-PATCH":
            aid = format_port_list(sorted(xc.ingress for xc in chunk))
            timeout_s = self._opts.timeout_s
        else:
            ordered = sorted(chunk)
            aid = (
                format_port_list(xc.ingress for xc in ordered)
                + ","
                + format_port_list(xc.egress for xc in ordered)
            )
            timeout_s = self._opts.timeout_s + self._caps.settle_time_s
        resp = await self._run(code, aid=aid, idempotent=False, timeout_s=timeout_s)
        if resp.denied:
            raise _Denied(self._switch_id, resp, [p for xc in chunk for p in xc.ports()], chunk)

    def _refine(
        self, error: DriverError, wanted: Sequence[CrossConnect], after: frozenset[CrossConnect]
    ) -> DriverError:
        """A DENY mapped with the state read back after it (for conflicts)."""
        if isinstance(error, _Denied):
            return deny_error(
                self._switch_id, error.response, ports=error.ports, wanted=wanted, current=after
            )
        return error

    @staticmethod
    def _reason_for(xc: CrossConnect, error: DriverError, default: str) -> str:
        """The DENY comment naming ``xc`` (``<in>,<out>: reason``), else ``default``."""
        comments: Sequence[str] = ()
        if isinstance(error, _Denied):
            comments = error.response.comments
        key = f"{xc.ingress},{xc.egress}"
        for comment in comments:
            head, sep, reason = comment.partition(":")
            if sep and head.strip() == key:
                return reason.strip() or comment
        return default

    async def _learn(self, ports: frozenset[int]) -> frozenset[CrossConnect] | None:
        """The cross-connects touching ``ports`` after a failure (including any that also use
        ports outside them: a conflict), or None when that read fails too."""
        try:
            return await self._read_patches(ports)
        except DriverError as e:  # the caller raises the command's error, which says enough
            self._log.debug("tl1 read-back after a failed command failed too", error=str(e))
            return None

    def _chunks(self, xcs: list[CrossConnect]) -> list[list[CrossConnect]]:
        limit = self._caps.max_batch
        if not xcs:
            return []  # nothing to send: an ENT-PATCH needs at least one port
        if limit is None or len(xcs) <= limit:
            return [xcs]
        return [xcs[i : i + limit] for i in range(0, len(xcs), limit)]

    # --- command plumbing ---------------------------------------------------------------------

    async def _read_patches(self, ports: Iterable[int] | None) -> frozenset[CrossConnect]:
        wanted = None if ports is None else sorted(ports)
        aid = "" if wanted is None else format_port_list(wanted)
        resp = await self._checked("RTRV-PATCH", aid=aid, ports=wanted or ())
        return frozenset(self._parse_patch(line) for line in resp.lines)

    def _parse_patch(self, line: str) -> CrossConnect:
        m = _PATCH_RE.match(line)
        if m is None:
            raise ProtocolError(self._switch_id, f"bad RTRV-PATCH line {line!r}")
        a, b = int(m[1]), int(m[2])
        caps = self._caps
        if caps.kind is SwitchKind.DUPLEX:
            if a == b or a not in caps.port_ids() or b not in caps.port_ids():
                raise ProtocolError(self._switch_id, f"bad duplex patch {line!r}")
            return CrossConnect(min(a, b), max(a, b))
        if caps.is_ingress(a) and caps.is_egress(b):
            return CrossConnect(a, b)
        if caps.is_ingress(b) and caps.is_egress(a):
            return CrossConnect(b, a)
        raise ProtocolError(self._switch_id, f"patch {line!r} is not ingress,egress")

    def _port_values(self, resp: Tl1Response, code: str) -> dict[int, str]:
        out: dict[int, str] = {}
        for line in resp.lines:
            m = _VALUE_RE.match(line)
            if m is None:
                raise ProtocolError(self._switch_id, f"{code}: bad line {line!r}")
            out[int(m[1])] = m[2]
        return out

    def _port_args(self, ports: Iterable[int] | None) -> list[int]:
        valid = self._caps.port_ids()
        if ports is None:
            return list(valid)
        wanted = list(dict.fromkeys(ports))
        for port in wanted:
            if port not in valid:
                raise InvalidPort(self._switch_id, port, "no such port")
        return wanted

    async def _checked(
        self,
        code: str,
        *,
        aid: str = "",
        params: Sequence[str] = (),
        ports: Sequence[int] = (),
    ) -> Tl1Response:
        """A read-only or idempotent command whose DENY raises the mapped error."""
        resp = await self._run(code, aid=aid, params=params, idempotent=True)
        if resp.denied:
            raise deny_error(self._switch_id, resp, ports=ports)
        return resp

    async def _run(
        self,
        code: str,
        *,
        aid: str = "",
        params: Sequence[str] = (),
        idempotent: bool,
        timeout_s: float | None = None,
    ) -> Tl1Response:
        """Send on the current session (connecting and logging in first when needed). A
        ``PLNA`` denial is retried once after a new login; an idempotent command whose
        connection proved dead before its reply started is retried once on a new one."""
        for attempt in (1, 2):
            session, fresh = await self._ensure_session()
            try:
                resp = await session.command(code, aid=aid, params=params, timeout_s=timeout_s)
            except ConnectionLost as e:
                if idempotent and attempt == 1 and not fresh and not e.mid_reply:
                    self._log.info("tl1 connection was dead; retrying once", code=code)
                    continue
                raise
            if resp.denied and resp.error_code == "PLNA" and attempt == 1:
                self._log.warning("tl1 session not logged in; logging in again", code=code)
                await session.close()
                continue
            return resp
        raise AssertionError("unreachable")  # pragma: no cover

    async def _ensure_session(self) -> tuple[Tl1Session, bool]:
        """The live session and whether it was made by this call."""
        session = self._session
        if session is not None and session.alive:
            return session, False
        async with self._connect_lock:
            if not self._opened:
                raise DeviceUnreachable(self._switch_id, "driver is not open")
            session = self._session
            if session is not None and session.alive:
                return session, False
            session = await self._connect()
            self._session = session
            return session, True

    async def _connect(self) -> Tl1Session:
        opts = self._opts
        sid = self._switch_id
        username, password = self._credentials()
        try:
            user_value, password_value = tl1_value(username), tl1_value(password)
        except ValueError:
            raise AuthenticationFailed(sid, "credentials must be printable ASCII") from None
        where = f"{opts.host}:{opts.port}"
        check_gate(self._gate, sid)  # no new session for a controller that may not command
        try:
            async with asyncio.timeout(opts.connect_timeout_s):
                reader, writer = await asyncio.open_connection(opts.host, opts.port)
        except TimeoutError:
            raise DeviceUnreachable(
                sid, f"connect to {where}: no answer within {opts.connect_timeout_s:g} s"
            ) from None
        except OSError as e:
            raise DeviceUnreachable(sid, f"connect to {where} failed: {e.strerror or e}") from None
        session = Tl1Session(
            sid,
            reader,
            writer,
            timeout_s=opts.timeout_s,
            tid=opts.tid,
            on_autonomous=self._on_autonomous,
            on_lost=self._on_lost,
            command_gate=self._gate,
        )
        session.start()
        try:
            resp = await session.command(
                "ACT-USER", aid=user_value, params=(password_value,), secret=True
            )
        except BaseException:
            await session.close()
            raise
        if resp.denied:
            await session.close()
            error = deny_error(sid, resp)
            if isinstance(error, DeviceTimeout):
                raise error
            # the comment may echo the user name: keep only the code
            raise AuthenticationFailed(sid, f"login rejected (DENY {resp.error_code})")
        self._username = username
        self._log.info("tl1 session open", host=opts.host, port=opts.port)
        self._session_up = True
        return session

    def _credentials(self) -> tuple[str, str]:
        """Username and password, ``*_env`` variables read now. Raises
        ``AuthenticationFailed`` naming a variable that is unset or empty."""
        values: list[str] = []
        for name in ("username", "password"):
            value = self._opts.credential(name, self._environ)
            if value is None:
                raise AuthenticationFailed(
                    self._switch_id,
                    f"{name}: environment variable {self._opts.credential_variable(name)!r} "
                    "is not set",
                )
            values.append(value)
        return values[0], values[1]

    def _on_lost(self, error: DriverError) -> None:
        if not self._opened:
            return
        if self._session_up:
            self._session_up = False
            self._log.warning("tl1 connection lost", error=str(error))
        else:  # still down: the outage was logged when it began
            self._log.debug("tl1 connection lost", error=str(error))
        if self._subscribers:
            self._start_reconnect()

    def _start_reconnect(self) -> None:
        task = self._reconnect_task
        if task is None or task.done():
            self._reconnect_task = asyncio.get_running_loop().create_task(
                self._reconnect_loop(), name=f"tl1-reconnect-{self._switch_id}"
            )

    async def _reconnect_loop(self) -> None:
        while self._opened and self._subscribers:
            try:
                await self._ensure_session()
                return
            except AuthenticationFailed as e:
                self._log.error("tl1 reconnect: login rejected; giving up", error=str(e))
                return
            except DriverError as e:
                self._log.debug("tl1 reconnect failed", error=str(e))
            await self._sleep(self._opts.reconnect_interval_s)

    def _on_autonomous(self, frame: Tl1Autonomous) -> None:
        if not frame.message.startswith("REPT ALM"):
            self._log.debug("tl1 autonomous message ignored", message=frame.message)
            return
        for line in frame.lines:
            try:
                alarm = parse_alarm_line(line)
            except Tl1SyntaxError as e:
                self._log.warning("tl1 bad alarm line", error=str(e))
                continue
            event = DeviceAlarm(
                switch_id=self._switch_id,
                port=port_number(alarm.aid),
                condition=alarm.condition,
                severity=_SEVERITY.get(alarm.notification, AlarmSeverity.WARNING),
                at_s=self._clock(),
                description=alarm.description,
            )
            self._log.info(
                "tl1 alarm", port=event.port, condition=event.condition,
                severity=event.severity.value,
            )
            for stream in self._subscribers:
                stream.offer(event)

    def _unsubscribe(self, stream: AlarmStream) -> None:
        self._subscribers.discard(stream)


class _Denied(DriverError):
    """Internal: a DENY from DLT/ENT-PATCH, mapped once the state is read back."""

    def __init__(
        self,
        switch_id: str,
        response: Tl1Response,
        ports: Sequence[int],
        wanted: Sequence[CrossConnect],
    ) -> None:
        super().__init__(switch_id, "; ".join(response.comments) or f"DENY {response.error_code}")
        self.response = response
        self.ports = tuple(ports)
        self.wanted = tuple(wanted)


def make_driver(spec: SwitchSpec, context: DriverContext) -> Driver:
    """The unopened TL1 driver for ``spec`` (config ``model: tl1``); ``context.environ`` is where
    the ``*_env`` credentials are read at each login. Raises
    ``lightrail.drivers.options.DriverConfigError`` for missing, malformed or unknown options."""
    return Tl1Driver(spec, Tl1Options.from_spec(spec), environ=context.environ,
                     command_gate=context.command_gate)
