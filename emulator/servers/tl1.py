"""An emulated Polatis-dialect TL1 switch: a TCP server on 127.0.0.1 wrapping one ``EmulatedOcs``.

The wrapped device holds the state, the timing (reconfiguration delay, power that drops while
switching), the alarms, the injected faults and the change log, so a TL1 device and any other
view of the same ``EmulatedOcs`` always agree. The server only translates: TL1 text in,
``EmulatedOcs`` device commands, TL1 text out. Port numbering is Polatis N x N: ingress 1..N,
egress N+1..2N (canonical ids, so no translation). Wire syntax and its sources:
``lightrail.drivers.tl1.wire``.

Commands (``<ports>``: ``&`` lists and ``&&`` ranges; empty or ``ALL``: every port where noted)::

    ACT-USER::<user>:<ctag>::<password>;   COMPLD | DENY PICC (bad user/password),
                                           IIAC (no user), IPMS (no password)
    CANC-USER::<user>:<ctag>;              COMPLD | DENY PICC (not the logged-in user)
    ENT-PATCH::<ins>,<outs>:<ctag>;        one bulk make, paired in order; COMPLD after the
                                           settle | DENY IIAC/IDNV/SAAS/SROF
    DLT-PATCH::<ports>|ALL:<ctag>;         one bulk break of the patches on those ports (or
                                           all; ports without a patch are ignored)
    RTRV-PATCH::[<ports>|ALL]:<ctag>;      "<in>,<out>" per patch touching the ports
    RTRV-PORT-POWER::[<ports>|ALL]:<ctag>; "<port>:<dBm>" (two decimals)
    RTRV-PORT-SHUTTER::[<ports>|ALL]:<ctag>;  "<port>:OPEN|CLOSED"
    OPR-PORT-SHUTTER::<ports>:<ctag>;      disable (close) ports; RLS-PORT-SHUTTER enables
    RTRV-ALM-ALL::[ALL]:<ctag>;            active port alarms, alarm-line format
    RTRV-NETYPE:::<ctag>;                  "<vendor>,<model>,OCS,<firmware>"
    RTRV-EQPT::SYSTEM:<ctag>:::PARAMETER=SIZE;   "SYSTEM:SIZE=<N>x<N>"
    RTRV-HDR:::<ctag>;                     COMPLD

Any command other than ACT-USER before a login is denied ``PLNA`` (GR-833 "login not
active"); an unknown command ``ICNV``; a missing or malformed ctag ``IICT`` with ctag ``0``;
a port that does not exist or is on the wrong side ``IDNV`` with ``/* Invalid OXC port: N */``
(as observed on Polatis); an empty aid ``IIAC``; a make on a port in use ``SAAS`` (assumption:
GR-833 "already assigned"); a refused or failed operation ``SROF`` with one comment per failed
patch ``/* <in>,<out>: <reason> */``. Autonomous ``REPT ALM EQPT`` messages (``**`` major,
``A`` cleared, ...) go to every logged-in session for each ``EmulatedOcs`` alarm.

Ordering: ACT-USER and CANC-USER wait for every earlier command of their connection and every
later command waits for them; configuration commands (ENT/DLT/OPR/RLS) run one at a time, in
arrival order, across all connections; retrievals run as soon as they arrive, so a RTRV sent
after a slow ENT-PATCH is answered first (replies carry the ctag).

How ``EmulatedOcs`` faults show on the wire:

- unreachable / dropped calls: the connection is closed without a reply (``UnreachableMode.CLOSE``,
  as a crashed device's TCP stack would) or the command is never answered (``SILENT``, a
  partitioned network);
- silent partition (``EmulatedOcs.set_partitioned``): no command gets a reply, a login
  included, and the connection stays open; commands that arrived during it are dropped;
- slow (``set_extra_delay``): replies come late by that delay;
- denied port: DENY ``SROF`` (hardware fault) or ``IDNV`` (invalid port), nothing changed;
- partial apply (``fail_make``): DENY ``SROF`` whose comments name each patch not made; the
  ones made before it stay made (read them back);
- silently dropped makes: COMPLD, but RTRV-PATCH does not show them;
- failed port: a ``** REPT ALM`` (LOS) at once, makes on it DENY ``SROF``;
- reboot: at the start every connection is dropped and the listener closed (connection
  refused); when the device is back the server listens again on the same port; sessions must
  log in again. Cross-connects are kept or lost as the reboot says.

Test-only wire faults (``inject_wire_fault``): a reply replaced by garbage, a reply cut in the
middle and the connection closed, a reply sent one byte per write, a reply never sent.

Sources (details in ``lightrail.drivers.tl1.wire``): response/DENY/autonomous framing from Telcordia
GR-831/GR-833 as reproduced in vendor TL1 manuals; Polatis command forms (ACT-USER, ENT-PATCH
pairs, DLT-PATCH ALL or empty aid, RTRV-PATCH lists and ranges, the shutter commands,
RTRV-PORT-POWER, RTRV-NETYPE, RTRV-EQPT SIZE) and Polatis DENY behaviour (``IDNV`` +
``Invalid OXC port: N`` for a bad port, ``IIAC`` ``Empty parameters``, ``PICC`` for a bad
login, ``IPMS`` for a missing password, ``IICT`` for a parse error) from public Polatis TL1
client scripts and a Polatis TL1 conformance test suite. Assumptions (no Polatis manual
available): ``PLNA`` before login, ``SAAS`` for a port in use, ``SROF`` with per-patch comments
for a partial bulk, DLT-PATCH ignoring ports without a patch, the REPT ALM layout and modifier,
and the RTRV-ALM-ALL line layout.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType, TracebackType

import structlog

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
from lightrail.drivers.tl1.wire import (
    CTAG_RE,
    AlarmCode,
    AlarmLine,
    CompletionCode,
    FrameSplitter,
    Tl1Command,
    Tl1SyntaxError,
    format_alarm_line,
    format_autonomous,
    format_response,
    parse_command,
    parse_port_list,
)
from lightrail.emulator.ocs import AlarmSubscription, EmulatedOcs

_log = structlog.get_logger(__name__)

DEFAULT_USERS: Mapping[str, str] = MappingProxyType({"admin": "root"})
"""Accepted logins (user -> password) unless the server is given others (Polatis defaults)."""

GARBAGE = b"\r\n\n\x00\xff\xfe#%GARBAGE%#\x07 \x1b[0m\r\n;"
"""What a ``WireFault.GARBAGE`` reply sends instead of the real one."""

_MAX_COMMAND_CHARS = 64 * 1024
_READ_CHUNK = 4096
_CONFIG_CODES = frozenset({"ENT-PATCH", "DLT-PATCH", "OPR-PORT-SHUTTER", "RLS-PORT-SHUTTER"})
_SESSION_CODES = frozenset({"ACT-USER", "CANC-USER"})
_NOTIFICATION = MappingProxyType(
    {
        AlarmSeverity.CRITICAL: ("CR", AlarmCode.CRITICAL),
        AlarmSeverity.MAJOR: ("MJ", AlarmCode.MAJOR),
        AlarmSeverity.MINOR: ("MN", AlarmCode.MINOR),
        AlarmSeverity.WARNING: ("NA", AlarmCode.NON_ALARM),
        AlarmSeverity.CLEARED: ("CL", AlarmCode.NON_ALARM),
    }
)

UtcNow = Callable[[], datetime]
"""Returns the wall-clock time (a UTC ``datetime``) stamped on responses."""
CommandHook = Callable[[Tl1Command], Awaitable[None]]
"""Called with each command after its ordering wait and before it runs (tests)."""


def _utc_now() -> datetime:
    return datetime.now(UTC)


class UnreachableMode(enum.Enum):
    """How the server shows an unreachable device (``EmulatedOcs.set_unreachable`` or
    ``drop_next_calls``) on the wire."""

    CLOSE = "close"
    """Close the connection without answering."""
    SILENT = "silent"
    """Never answer the command; the connection stays open."""


class WireFault(enum.Enum):
    """A test-only fault applied to the next reply of any connection."""

    GARBAGE = "garbage"
    """Send ``GARBAGE`` instead of the reply."""
    CLOSE_MID_REPLY = "close_mid_reply"
    """Send the first half of the reply, then close the connection."""
    SPLIT_BYTES = "split_bytes"
    """Send the reply one byte per write."""
    SILENT = "silent"
    """Do not send the reply."""


@dataclass(frozen=True, slots=True)
class ReceivedCommand:
    """A command the server received (passwords are never recorded): the connection number,
    the user logged in on it at the time (None before ``ACT-USER``; a login command carries the
    user it is for only once accepted), the command code, AID and CTAG, and ``at_s``, when it
    arrived (``time.monotonic``, the device clock of ``EmulatedOcs``)."""

    connection: int
    code: str
    aid: str
    ctag: str | None
    user: str | None = None
    at_s: float = 0.0


@dataclass(frozen=True, slots=True)
class _Reply:
    completion: CompletionCode
    lines: tuple[str, ...] = ()
    error_code: str | None = None
    comments: tuple[str, ...] = ()


class _Deny(Exception):
    """Internal: deny the command with ``code`` and ``comments``."""

    def __init__(self, code: str, *comments: str) -> None:
        super().__init__(code)
        self.code = code
        self.comments = comments


def _ok(lines: Sequence[str] = ()) -> _Reply:
    return _Reply(CompletionCode.COMPLD, tuple(lines))


@dataclass(eq=False, slots=True)
class _Connection:
    number: int
    writer: asyncio.StreamWriter
    user: str | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    barrier: asyncio.Task[None] | None = None
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def closed(self) -> bool:
        return self.writer.is_closing()

    def abort(self) -> None:
        self.writer.transport.abort()


class Tl1Server:
    """A TL1 server for ``device`` on ``host:port`` (port 0: any free port, see ``port``).

    ``users`` maps user names to passwords; ``sid`` is the source identifier in response
    headers (default: the switch id); ``wall_clock`` stamps headers and alarm times;
    ``unreachable`` picks how an unreachable device shows (``UnreachableMode``).
    Use as ``async with Tl1Server(device) as server: ...`` or ``start``/``close``.
    """

    def __init__(
        self,
        device: EmulatedOcs,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        users: Mapping[str, str] = DEFAULT_USERS,
        sid: str | None = None,
        wall_clock: UtcNow = _utc_now,
        unreachable: UnreachableMode = UnreachableMode.CLOSE,
    ) -> None:
        self._device = device
        self._host = host
        self._port = port
        self._users = dict(users)
        self._sid = sid or device.switch_id
        self._wall_clock = wall_clock
        self._unreachable = unreachable
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._numbers = itertools.count(1)
        self._atags = itertools.count(1)
        self._config_lock = asyncio.Lock()
        self._faults: list[tuple[WireFault, str | None]] = []
        self._hook: CommandHook | None = None
        self._commands: list[ReceivedCommand] = []
        self._alarm_sub: AlarmSubscription | None = None
        self._alarm_task: asyncio.Task[None] | None = None
        self._active_alarms: dict[int, str] = {}
        self._restarts = 0
        self._restart_cond = asyncio.Condition()
        self._down = False
        self._log = _log.bind(switch=device.switch_id)

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> int:
        """Listen and follow the device's alarms; returns the bound port. Raises ``OSError``
        when the address is taken."""
        if self._server is not None:
            return self._port
        self._server = await asyncio.start_server(self._serve, self._host, self._port)
        self._port = self._server.sockets[0].getsockname()[1]
        self._alarm_sub = self._device.alarms()
        self._alarm_task = asyncio.create_task(
            self._watch_alarms(self._alarm_sub), name=f"tl1-server-alarms-{self._sid}"
        )
        self._log.info("tl1 server listening", host=self._host, port=self._port)
        return self._port

    async def close(self) -> None:
        """Stop listening, drop every connection, stop following alarms; idempotent."""
        task, self._alarm_task = self._alarm_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        sub, self._alarm_sub = self._alarm_sub, None
        if sub is not None:
            await sub.aclose()
        self._stop_listening()
        tasks = [t for conn in self._connections for t in conn.tasks]
        self._drop_all()
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)

    async def __aenter__(self) -> Tl1Server:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- inspection and test controls ---------------------------------------------------------

    @property
    def device(self) -> EmulatedOcs:
        """The wrapped device."""
        return self._device

    @property
    def host(self) -> str:
        """The listening address."""
        return self._host

    @property
    def port(self) -> int:
        """The listening TCP port (after ``start``)."""
        if self._server is None and not self._down:
            raise RuntimeError("Tl1Server.port: not started")
        return self._port

    @property
    def commands(self) -> list[ReceivedCommand]:
        """Every command received since start (or ``clear_commands``), oldest first (a copy)."""
        return list(self._commands)

    def clear_commands(self) -> None:
        """Forget the received commands."""
        self._commands.clear()

    @property
    def connection_count(self) -> int:
        """Open client connections."""
        return len(self._connections)

    @property
    def restarts(self) -> int:
        """How many times the server came back after a device reboot."""
        return self._restarts

    async def wait_restarts(self, count: int, timeout_s: float = 5.0) -> None:
        """Wait until ``restarts >= count``. Raises ``TimeoutError``."""
        async with asyncio.timeout(timeout_s), self._restart_cond:
            await self._restart_cond.wait_for(lambda: self._restarts >= count)

    def inject_wire_fault(
        self, fault: WireFault, count: int = 1, *, code: str | None = None
    ) -> None:
        """Apply ``fault`` to the next ``count`` replies (any connection), or only to replies to
        commands with ``code`` (e.g. ``"ENT-PATCH"``) when given."""
        if count < 1:
            raise ValueError(f"inject_wire_fault: count must be >= 1, got {count}")
        self._faults.extend([(fault, None if code is None else code.upper())] * count)

    def set_command_hook(self, hook: CommandHook | None) -> None:
        """Call ``hook`` before each command runs (None: none)."""
        self._hook = hook

    def drop_connections(self) -> None:
        """Abort every client connection (a link flap); the server keeps listening."""
        self._drop_all()

    def logout_all(self) -> None:
        """End every session's login (a session timeout); connections stay open and their next
        command is denied ``PLNA``."""
        for conn in self._connections:
            conn.user = None

    # --- connections --------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(next(self._numbers), writer)
        if self._down:
            conn.abort()
            return
        self._connections.add(conn)
        splitter = FrameSplitter(terminators=";", comments=False, max_chars=_MAX_COMMAND_CHARS)
        try:
            while not conn.closed:
                try:
                    data = await reader.read(_READ_CHUNK)
                except (ConnectionError, OSError):
                    break
                if not data:
                    break
                try:
                    frames = splitter.feed(data)
                except Tl1SyntaxError:
                    break
                for raw in frames:
                    self._accept(conn, raw.text)
        finally:
            self._connections.discard(conn)
            if not conn.closed:
                writer.close()

    def _accept(self, conn: _Connection, text: str) -> None:
        text = text.strip()
        if not text:
            return
        try:
            cmd = parse_command(text)
        except Tl1SyntaxError as e:
            self._spawn(conn, self._deny_now(conn, "0", _Deny("ICNV", f"Parse error: {e}")))
            return
        self._commands.append(ReceivedCommand(conn.number, cmd.code, cmd.aid, cmd.ctag,
                                              conn.user, time.monotonic()))
        if cmd.ctag is None or not CTAG_RE.match(cmd.ctag):
            self._spawn(conn, self._deny_now(conn, "0", _Deny("IICT", "Invalid correlation tag")))
            return
        if cmd.code in _SESSION_CODES:
            wait_for = set(conn.tasks)
        elif conn.barrier is not None and not conn.barrier.done():
            wait_for = {conn.barrier}
        else:
            wait_for = set()
        task = self._spawn(conn, self._execute(conn, cmd, wait_for))
        if cmd.code in _SESSION_CODES:
            conn.barrier = task

    def _spawn(self, conn: _Connection, coro: Awaitable[None]) -> asyncio.Task[None]:
        async def run() -> None:
            await coro

        task = asyncio.create_task(run(), name=f"tl1-server-{self._sid}-conn{conn.number}")
        conn.tasks.add(task)
        task.add_done_callback(conn.tasks.discard)
        return task

    async def _deny_now(self, conn: _Connection, ctag: str, deny: _Deny) -> None:
        await self._send(conn, self._frame(ctag, _deny_reply(deny)), reply_to="")

    async def _execute(
        self, conn: _Connection, cmd: Tl1Command, wait_for: set[asyncio.Task[None]]
    ) -> None:
        if wait_for:
            await asyncio.wait(wait_for)
        if conn.closed:
            return
        if self._device.partitioned:  # lost in a silent partition: no reply, connection kept
            await self._device.until_answering()
            return
        if self._hook is not None:
            await self._hook(cmd)
        assert cmd.ctag is not None
        try:
            reply = await self._handle(conn, cmd)
        except _Deny as deny:
            reply = _deny_reply(deny)
        except DeviceUnreachable:
            if self._unreachable is UnreachableMode.CLOSE:
                self._log.debug("tl1 server: device unreachable, dropping connection")
                conn.abort()
            return
        except Exception:
            self._log.exception("tl1 server: command failed", code=cmd.code)
            conn.abort()
            raise
        await self._send(conn, self._frame(cmd.ctag, reply), reply_to=cmd.code)

    def _frame(self, ctag: str, reply: _Reply) -> str:
        return format_response(
            self._sid,
            self._wall_clock(),
            ctag,
            reply.completion,
            error_code=reply.error_code,
            lines=reply.lines,
            comments=reply.comments,
        )

    async def _send(self, conn: _Connection, text: str, *, reply_to: str | None) -> None:
        """Write one frame; ``reply_to`` is the command code of a reply (None: autonomous)."""
        fault = self._take_fault(reply_to)
        data = text.encode("latin-1")
        async with conn.write_lock:
            if conn.closed:
                return
            writer = conn.writer
            try:
                if fault is None:
                    writer.write(data)
                    await writer.drain()
                elif fault is WireFault.GARBAGE:
                    writer.write(GARBAGE)
                    await writer.drain()
                elif fault is WireFault.CLOSE_MID_REPLY:
                    writer.write(data[: len(data) // 2])
                    await writer.drain()
                    writer.close()
                elif fault is WireFault.SPLIT_BYTES:
                    for i in range(len(data)):
                        writer.write(data[i : i + 1])
                        await writer.drain()
                        await asyncio.sleep(0)
                else:  # WireFault.SILENT
                    pass
            except (ConnectionError, OSError):
                conn.abort()

    def _take_fault(self, reply_to: str | None) -> WireFault | None:
        if reply_to is None:
            return None
        for i, (fault, code) in enumerate(self._faults):
            if code is None or code == reply_to:
                del self._faults[i]
                return fault
        return None

    # --- commands -----------------------------------------------------------------------------

    async def _handle(self, conn: _Connection, cmd: Tl1Command) -> _Reply:
        """One command: the session commands, then (logged in only) the configuration
        commands under the configuration lock, else the retrievals. Raises ``_Deny``."""
        code = cmd.code
        if code == "ACT-USER":
            return await self._act_user(conn, cmd)
        if conn.user is None:
            raise _Deny("PLNA", "Login not active")
        if code == "CANC-USER":
            if cmd.aid != conn.user:
                raise _Deny("PICC", "Permission denied")
            conn.user = None
            return _ok()
        if code in _CONFIG_CODES:
            async with self._config_lock:
                return await self._configure(cmd)
        return await self._retrieve(cmd)

    async def _configure(self, cmd: Tl1Command) -> _Reply:
        """ENT-PATCH, DLT-PATCH, OPR-/RLS-PORT-SHUTTER (``cmd.code`` in ``_CONFIG_CODES``)."""
        code = cmd.code
        if code == "ENT-PATCH":
            return await self._ent_patch(cmd)
        if code == "DLT-PATCH":
            return await self._dlt_patch(cmd)
        admin = PortAdmin.DISABLED if code == "OPR-PORT-SHUTTER" else PortAdmin.ENABLED
        for port in self._ports(cmd.aid, allow_all=False):
            await self._device.set_port_admin(port, admin)
        return _ok()

    async def _retrieve(self, cmd: Tl1Command) -> _Reply:
        """The RTRV-* commands; any other code is denied ICNV (command not valid)."""
        code = cmd.code
        device = self._device
        if code == "RTRV-HDR":
            return _ok()
        if code == "RTRV-NETYPE":
            info = await device.info()
            return _ok([f"{info.vendor},{info.model},OCS,{info.firmware}"])
        if code == "RTRV-EQPT":
            if cmd.aid.upper() != "SYSTEM" or "PARAMETER=SIZE" not in map(str.upper, cmd.params):
                raise _Deny("IPNV", "Only SYSTEM PARAMETER=SIZE is supported")
            info = await device.info()
            n = info.capabilities.port_count
            return _ok([f"SYSTEM:SIZE={n}x{n}"])
        if code == "RTRV-PATCH":
            ports = self._ports(cmd.aid, allow_all=True)
            xcs = await device.get_cross_connects()
            wanted = set(ports)
            return _ok(
                [f"{x.ingress},{x.egress}" for x in sorted(xcs) if wanted & set(x.ports())]
            )
        if code == "RTRV-PORT-POWER":
            power = await device.get_power(self._ports(cmd.aid, allow_all=True))
            return _ok([f"{p}:{dbm:.2f}" for p, dbm in power.items()])
        if code == "RTRV-PORT-SHUTTER":
            statuses = await device.get_port_status(self._ports(cmd.aid, allow_all=True))
            return _ok(
                [
                    f"{s.port}:{'OPEN' if s.admin is PortAdmin.ENABLED else 'CLOSED'}"
                    for s in statuses
                ]
            )
        if code == "RTRV-ALM-ALL":
            return await self._rtrv_alarms()
        raise _Deny("ICNV", f"Command not valid: {code}")

    async def _act_user(self, conn: _Connection, cmd: Tl1Command) -> _Reply:
        user = cmd.aid
        if not user:
            raise _Deny("IIAC", "Too few parameters (0/1)")
        password = cmd.params[0] if cmd.params else ""
        if not password:
            raise _Deny("IPMS", "Too few parameters (0/1) in block 1")
        if self._users.get(user) != password:
            raise _Deny("PICC", "Permission denied")
        await self._device.info()  # a login is a device command: honours faults
        conn.user = user
        return _ok()

    async def _ent_patch(self, cmd: Tl1Command) -> _Reply:
        ins_text, sep, outs_text = cmd.aid.partition(",")
        if not sep or "," in outs_text:
            raise _Deny("IIAC", "Expected <ingress ports>,<egress ports>")
        if not ins_text.strip() or not outs_text.strip():
            raise _Deny("IIAC", "Empty parameters")
        ins = self._ports(ins_text, allow_all=False)
        outs = self._ports(outs_text, allow_all=False)
        if len(ins) != len(outs):
            raise _Deny("IIAC", f"{len(ins)} ingress ports but {len(outs)} egress ports")
        makes = [CrossConnect(i, o) for i, o in zip(ins, outs, strict=True)]
        try:
            await self._device.apply_bulk((), makes)
        except CrossConnectConflict as e:
            raise _Deny(
                "SAAS",
                f"{e.wanted.ingress},{e.wanted.egress}: port in use by patch "
                f"{e.existing.ingress},{e.existing.egress}",
            ) from None
        except PartialApply as e:
            raise _Deny(
                "SROF", *(f"{x.ingress},{x.egress}: {why}" for x, why in e.result.failed.items())
            ) from None
        except InvalidPort as e:
            raise _Deny("IDNV", f"Invalid OXC port: {e.port}", _detail(e)) from None
        except HardwareFault as e:
            raise _Deny("SROF", _detail(e)) from None
        except DeviceUnreachable:
            raise
        except DriverError as e:
            raise _Deny("SROF", _detail(e)) from None
        return _ok()

    async def _dlt_patch(self, cmd: Tl1Command) -> _Reply:
        ports = self._ports(cmd.aid, allow_all=True)
        by_port: dict[int, CrossConnect] = {}
        for xc in self._device.cross_connects:
            by_port[xc.ingress] = xc
            by_port[xc.egress] = xc
        breaks = sorted({by_port[p] for p in ports if p in by_port})
        try:
            await self._device.apply_bulk(breaks, ())
        except DeviceUnreachable:
            raise
        except InvalidPort as e:
            raise _Deny("IDNV", f"Invalid OXC port: {e.port}", _detail(e)) from None
        except DriverError as e:
            raise _Deny("SROF", _detail(e)) from None
        return _ok()

    async def _rtrv_alarms(self) -> _Reply:
        statuses = await self._device.get_port_status()
        now = self._wall_clock()
        lines = [
            format_alarm_line(
                AlarmLine(
                    aid=str(s.port),
                    notification="MJ",
                    condition=self._active_alarms.get(s.port, "LOS"),
                    service_affecting=True,
                    occurred_date=f"{now:%m-%d}",
                    occurred_time=f"{now:%H-%M-%S}",
                    description=f"port {s.port} failed",
                )
            )
            for s in statuses
            if s.oper is PortOper.FAILED
        ]
        return _ok(lines)

    def _ports(self, text: str, *, allow_all: bool) -> tuple[int, ...]:
        """The ports of an aid; raises ``_Deny`` IIAC (empty where a list is needed) or IDNV
        (not a port of this device)."""
        valid = self._device.capabilities.port_ids()
        text = text.strip()
        if not text or text.upper() == "ALL":
            if allow_all:
                return tuple(valid)
            raise _Deny("IIAC", "Empty parameters")
        try:
            ports = parse_port_list(text)
        except Tl1SyntaxError:
            bad = next(
                (t for t in text.replace("&", " ").split() if not t.isdecimal()), text
            )
            raise _Deny("IDNV", f"Invalid OXC port: {bad}") from None
        for port in ports:
            if port not in valid:
                raise _Deny("IDNV", f"Invalid OXC port: {port}")
        return ports

    # --- alarms and reboots -------------------------------------------------------------------

    async def _watch_alarms(self, sub: AlarmSubscription) -> None:
        async for alarm in sub:
            if alarm.condition == "REBOOT" and alarm.port is None:
                if alarm.severity is AlarmSeverity.CLEARED:
                    await self._come_up()
                else:
                    self._go_down()
                continue
            if alarm.port is not None:
                if alarm.severity is AlarmSeverity.CLEARED:
                    self._active_alarms.pop(alarm.port, None)
                else:
                    self._active_alarms[alarm.port] = alarm.condition
            self._broadcast(alarm)

    def _broadcast(self, alarm: DeviceAlarm) -> None:
        notification, alarm_code = _NOTIFICATION[alarm.severity]
        now = self._wall_clock()
        line = format_alarm_line(
            AlarmLine(
                aid="SYSTEM" if alarm.port is None else str(alarm.port),
                notification=notification,
                condition=alarm.condition,
                service_affecting=alarm.severity
                in {AlarmSeverity.CRITICAL, AlarmSeverity.MAJOR},
                occurred_date=f"{now:%m-%d}",
                occurred_time=f"{now:%H-%M-%S}",
                description=alarm.description,
            )
        )
        text = format_autonomous(
            self._sid, now, alarm_code, next(self._atags), "REPT ALM EQPT", [line]
        )
        for conn in list(self._connections):
            if conn.user is not None and not conn.closed:
                self._spawn(conn, self._send(conn, text, reply_to=None))

    def _go_down(self) -> None:
        self._log.info("tl1 server: device rebooting, dropping connections")
        self._down = True
        self._stop_listening()
        self._drop_all()

    async def _come_up(self) -> None:
        try:
            self._server = await asyncio.start_server(self._serve, self._host, self._port)
        except OSError as e:
            self._log.error("tl1 server: cannot listen again after reboot", error=str(e))
            return
        self._down = False
        self._log.info("tl1 server: device back, listening", port=self._port)
        async with self._restart_cond:
            self._restarts += 1
            self._restart_cond.notify_all()

    def _stop_listening(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()

    def _drop_all(self) -> None:
        for conn in list(self._connections):
            conn.abort()
        self._connections.clear()


def _deny_reply(deny: _Deny) -> _Reply:
    return _Reply(CompletionCode.DENY, error_code=deny.code, comments=deny.comments)


def _detail(error: DriverError) -> str:
    """The error's message without the ``switch '...': `` prefix."""
    text = str(error)
    prefix = f"switch {error.switch_id!r}: "
    return text[len(prefix) :] if text.startswith(prefix) else text
