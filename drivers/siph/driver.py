"""Driver for silicon-photonic MZI mesh switches (config ``model: siph``; DESIGN.md, "Drivers").

The switch is an N x N Beneš network of 2x2 Mach-Zehnder interferometer (MZI) elements, one
thermo-optic heater per element, driven by a Qontrol-style multi-channel DAC over its ASCII serial
protocol carried over TCP (``lightrail.emulator.servers.mzi`` speaks it back). One apply is:

1. read the heaters (``vall?``), convert them to element states through the calibration table,
   trace the light paths: that is the switch state now;
2. the target on ``ports`` plus every cross-connect outside ``ports`` as it is gives the new
   partial permutation; unspecified inputs are routed to unused outputs (first the output they
   reach now, else the lowest unused: ``lightrail.drivers.siph.benes.complete_permutation``);
3. Beneš routing with the looping algorithm (``lightrail.drivers.siph.benes.route``), preferring
the element
   states the device holds so unchanged connections mostly keep their paths;
4. elements that carry only filler paths (inputs no cross-connect asked for) are set *off*
   (a set-point that is neither the bar nor the cross voltage), so their light is dropped and
   unused ports stay dark where the mesh allows (``darken_unused``, default on);
5. per-element calibrated heater set-points (``CalibrationTable``), ONE vector write
   (``vvec0=v0,v1,...``) that sets every element at once;
6. settle (``settle_time_s``, microseconds for thermo-optic MZIs), read back (``vall?``), convert
   back, trace, and compare the whole light-path permutation with what was written
   (``VerificationMismatch`` if it differs).

Honest caveats (rearrangeable, not strictly non-blocking):

- A Beneš network is rearrangeably non-blocking: changing one connection can force others onto
  different internal paths. Every element switches in the one vector write, so a cross-connect
  outside ``ports`` keeps its ingress -> egress mapping but may be *re-routed internally*, which
  interrupts its light for the settle time (a glitch of about ``settle_time_s``). The driver
  prefers the current element states to keep such re-routes rare, logs every one
  (``rerouted outside ports``), keeps them in ``last_rerouted``, and refuses the apply with
  ``ReroutingRequired`` when the switch option ``reroute_outside_ports`` is false.
  ``SwitchCapabilities`` has no field for this; ``MESH_PROPERTIES`` states it.
- MZIs are unitary 2x2 elements: an element that passes one connection also passes its partner
  input. A partial permutation therefore leaves *filler* paths between unused ports that cannot
  always be darkened (e.g. with N-1 connections the last unused ingress always reaches the last
  unused egress). The driver remembers the fillers it routed and ``get_cross_connects`` reports
  lit paths minus them; a new driver instance (controller restart) reports a previous
  instance's surviving fillers as cross-connects until an apply on their ports re-classifies
  them.
- "Breaking" a cross-connect means it is no longer intended; its light path may stay lit as a
  filler when the mesh cannot darken it.

Ports are canonical (``lightrail.drivers.base``): ingress 1..N is network input 0..N-1, egress
N+1..2N
is network output 0..N-1. Heater channel c drives element ``benes.BenesNetwork.element(c)``
(stage-major); a daisy chain of 8-channel modules may have spare channels after the last
element, which are written as 0 V.

The wire syntax, error codes and port <-> network mapping are in ``lightrail.drivers.siph.wire``,
the heater calibration in ``lightrail.drivers.siph.calibration``.

Protocol source (Qontrol Ltd, ``qontrol`` Python library v1.1.1, github.com/takeqontrol/api,
``qontrol.py``): commands are ``[header][channel][operator][value]\\n`` with operator ``=`` (set)
or ``?`` (get); a set answers ``OK``; ``id?`` answers ``<type>-<serial>`` (e.g. ``Q8iv-0001``);
``nchan?`` the channel count; ``vall?`` one value per line per channel; ``VVEC<ch>=v0,v1,...``
sets consecutive channels from ``ch`` (the library's ``set_all_values``); errors are lines
``E<code>:<channel>`` (regex ``[A-Za-z]{1,3}(\\d+):(\\d+)``) with codes from the library's
``COMMON_ERRORS`` and ``Qx_ERRORS`` (``QontrolError``). Power, port status, port admin and
alarms are Lightrail extensions prefixed ``lr`` (a Qontrol DAC has no optical monitors; a lab
reads monitor photodiodes elsewhere): ``lrpwr?`` and ``lrport?`` answer 2N lines, ``lradm<p>=``
sets admin state, and ``lrsub`` turns a connection into an alarm stream (``ALM,...`` lines).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass

import structlog

from lightrail.drivers.base import (
    AlarmSeverity,
    ApplyMode,
    ApplyResult,
    CommandGate,
    CrossConnect,
    DeviceAlarm,
    DeviceInfo,
    DeviceTimeout,
    DeviceUnreachable,
    Driver,
    DriverError,
    HardwareFault,
    InvalidPort,
    PartialApply,
    PortAdmin,
    PortOper,
    PortStatus,
    ProtocolError,
    SwitchCapabilities,
    SwitchKind,
    SwitchSpec,
    VerificationMismatch,
    check_apply_request,
    check_gate,
    minimal_diff,
)
from lightrail.drivers.options import DriverConfigError, DriverContext
from lightrail.drivers.siph import benes
from lightrail.drivers.siph.benes import BenesNetwork, ElementState
from lightrail.drivers.siph.calibration import CalibrationTable
from lightrail.drivers.siph.options import DEFAULT_TIMEOUT_S, SiphOptions
from lightrail.drivers.siph.wire import (
    ERROR_RE,
    ERROR_TEXT,
    ID_RE,
    NUMBER_RE,
    QontrolError,
    egress_to_output,
    format_volts,
    ingress_to_input,
    lit_cross_connects,
)
from lightrail.drivers.timing import Sleep

_log = structlog.get_logger(__name__)

# --- properties and errors ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MeshProperties:
    """What ``SwitchCapabilities`` cannot say about an MZI Beneš mesh.

    ``rearrangeable``: changing a connection may re-route others internally.
    ``reroutes_outside_ports``: so an apply may glitch cross-connects outside its ports for
    about one settle time (their ingress -> egress mapping is kept).
    ``filler_paths``: unused inputs are routed somewhere (dark only where the mesh allows).
    """

    rearrangeable: bool = True
    reroutes_outside_ports: bool = True
    filler_paths: bool = True


MESH_PROPERTIES = MeshProperties()
"""The properties of every Beneš MZI mesh this driver drives."""


class HeaterChannelFault(HardwareFault):
    """The DAC reported a fault on one heater channel (over-voltage E01, over-current E02,
    output error E05, ...). ``element`` is the MZI element the channel drives (None for a
    spare channel)."""

    def __init__(
        self, switch_id: str, code: QontrolError, channel: int, element: benes.Element | None,
        command: str,
    ) -> None:
        where = f"channel {channel}" + (f" ({element})" if element is not None else "")
        super().__init__(
            switch_id,
            f"{ERROR_TEXT[code]} on heater {where} (E{int(code):02d}) in reply to {command!r}",
        )
        self.code = code
        self.channel = channel
        self.element = element


class ReroutingRequired(DriverError):
    """The apply would re-route cross-connects outside its ports (a glitch of about one settle
    time) and the switch option ``reroute_outside_ports`` forbids it. Nothing was written."""

    def __init__(self, switch_id: str, rerouted: Iterable[CrossConnect]) -> None:
        self.rerouted = tuple(sorted(rerouted))
        super().__init__(
            switch_id,
            f"apply would re-route cross-connects outside its ports: {list(self.rerouted)}",
        )


# --- the driver --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


def _close_writer(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, RuntimeError):  # the loop may be closing
        writer.close()


class SiphDriver:
    """A ``lightrail.drivers.base.Driver`` for a Beneš MZI mesh behind a Qontrol-style DAC at
    ``host:port`` (TCP).

    ``capabilities`` must be N x N with N a power of two in 2..64; ``calibration`` gives the
    heater set-points; ``timeout_s`` bounds each request/reply exchange; ``sleep`` waits the
    settle time (injectable). One connection carries the commands; after any error (timeout,
    garbage, closed connection, error reply) it is dropped and the next call reconnects, so a
    desynchronised stream never leaks into a later reply.

    All methods raise ``DriverError`` subclasses only: ``DeviceUnreachable`` (connection refused
    or dropped, also mid-reply; or the driver is not open), ``DeviceTimeout``, ``ProtocolError``
    (a reply that does not parse, or an E10-E15 rejection), ``HeaterChannelFault`` (a
    ``HardwareFault`` naming the channel and element), ``InvalidPort``, ``CrossConnectConflict``,
    ``PartialApply``, ``VerificationMismatch``, ``ReroutingRequired``.
    """

    def __init__(
        self,
        switch_id: str,
        capabilities: SwitchCapabilities,
        *,
        host: str,
        port: int,
        calibration: CalibrationTable | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        reroute_outside_ports: bool = True,
        darken_unused: bool = True,
        sleep: Sleep = asyncio.sleep,
        command_gate: CommandGate | None = None,
    ) -> None:
        self._gate = command_gate
        if capabilities.kind is not SwitchKind.NXN:
            raise ValueError("capabilities.kind: an MZI mesh is N x N")
        self._net = BenesNetwork(capabilities.port_count)
        self._size = capabilities.port_count
        if calibration is None:
            calibration = CalibrationTable.uniform(self._size)
        if calibration.size != self._size:
            raise ValueError(
                f"calibration: table is for {calibration.size} ports, switch has {self._size}"
            )
        if timeout_s <= 0:
            raise ValueError(f"timeout_s: must be > 0, got {timeout_s}")
        self._switch_id = switch_id
        self._caps = SwitchCapabilities(
            kind=SwitchKind.NXN,
            port_count=self._size,
            atomic_bulk=True,
            settle_time_s=capabilities.settle_time_s,
            max_batch=None,
            readback=True,
        )
        self._host = host
        self._port = port
        self._cal = calibration
        self._timeout_s = timeout_s
        self._allow_reroute = reroute_outside_ports
        self._darken = darken_unused
        self._sleep = sleep
        self._log = _log.bind(switch=switch_id)
        self._conn: _Conn | None = None
        self._io_lock = asyncio.Lock()
        self._apply_lock = asyncio.Lock()
        self._opened = False
        self._device_id = ""
        self._channels = 0
        self._fillers: frozenset[CrossConnect] = frozenset()
        self._streams: set[asyncio.StreamWriter] = set()
        self.last_rerouted: frozenset[CrossConnect] = frozenset()
        """Cross-connects outside its ports the last apply re-routed internally (glitched)."""
        self.writes = 0
        """Vector writes issued by this driver (tests and metrics)."""

    # --- identity ------------------------------------------------------------------------------

    @property
    def switch_id(self) -> str:
        """The switch this driver controls."""
        return self._switch_id

    @property
    def calibration(self) -> CalibrationTable:
        """The calibration table in use."""
        return self._cal

    @property
    def mesh_properties(self) -> MeshProperties:
        """Beneš-mesh behaviour ``SwitchCapabilities`` cannot express (re-routes, fillers)."""
        return MESH_PROPERTIES

    async def open(self) -> None:
        """Connect and identify the device (``id?``, ``nchan?``). Raises
        ``DeviceUnreachable``, ``DeviceTimeout``, ``ProtocolError`` (not a Qontrol-style id),
        ``DriverError`` (fewer channels than the mesh has elements)."""
        self._opened = True
        try:
            async with self._io_lock:
                if self._conn is None:
                    await self._connect()
        except DriverError:
            self._opened = False
            raise
        self._log.debug("opened", device_id=self._device_id, channels=self._channels)

    async def close(self) -> None:
        """Disconnect and end every ``events()`` iterator; idempotent."""
        self._opened = False
        conn, self._conn = self._conn, None
        if conn is not None:
            _close_writer(conn.writer)
        streams, self._streams = self._streams, set()
        for writer in streams:
            _close_writer(writer)

    async def info(self) -> DeviceInfo:
        """Identity and capabilities (``id?`` is asked again). Raises like ``open``."""
        ident = (await self._exchange("id?", 1))[0]
        return DeviceInfo(
            self._switch_id, "Qontrol-compatible DAC", f"mzi-benes-{self._size}x{self._size}",
            ident, self._caps,
        )

    # --- state ---------------------------------------------------------------------------------

    async def _read_volts(self) -> list[float]:
        lines = await self._exchange("vall?", self._channels)
        return [self._number(line, "vall?") for line in lines]

    async def _read_paths(
        self,
    ) -> tuple[tuple[ElementState | None, ...], tuple[benes.LightPath, ...]]:
        states = self._cal.states(await self._read_volts())
        return states, benes.trace(self._size, states)

    async def get_cross_connects(self) -> frozenset[CrossConnect]:
        """Read the heaters back and report every lit light path as a cross-connect, except
        the filler paths this driver routed for unused inputs. Raises ``DeviceUnreachable``,
        ``DeviceTimeout``, ``ProtocolError``."""
        _, paths = await self._read_paths()
        lit = lit_cross_connects(self._size, paths)
        return lit - self._fillers

    def _check_request(self, target: frozenset[CrossConnect], ports: frozenset[int]) -> None:
        check_apply_request(self._switch_id, self._caps, target, ports)

    async def apply(
        self,
        target: frozenset[CrossConnect],
        ports: frozenset[int],
        mode: ApplyMode = ApplyMode.MINIMAL,
        *,
        current: frozenset[CrossConnect] | None = None,
    ) -> ApplyResult:
        """Make the cross-connects on ``ports`` equal ``target`` with one vector write
        (module docstring: read, route, write, settle, read back; the result is
        ``verified``). ``current`` is not used: routing needs the element states, so the
        heaters are read (one ``vall?``) and the diff is taken against the state they show.

        Cross-connects outside ``ports`` keep their ingress -> egress mapping but may be
        re-routed inside the mesh, dark for about one settle time (see ``last_rerouted``;
        ``ReroutingRequired`` when the switch forbids it). MINIMAL reports only what differs
        and issues no write when nothing does; REPLACE reports every cross-connect on
        ``ports`` as removed and the whole target as added, and always writes.

        Raises ``InvalidPort`` (unknown port, target leaving ``ports``, a cross-connect on
        ``ports`` that also uses a port outside them), ``CrossConnectConflict``,
        ``ReroutingRequired``, ``HeaterChannelFault`` (over-voltage or over-current: the device
        rejects the vector, nothing changed), ``PartialApply`` (an output error left some
        heaters at their old set-points; ``result`` says which cross-connects are and are not
        in place, from a read-back), ``VerificationMismatch`` (read-back differs from what was
        written), ``DeviceUnreachable``, ``DeviceTimeout``, ``ProtocolError``.
        """
        self._check_request(target, ports)
        async with self._apply_lock:
            return await self._apply(target, ports, mode)

    async def _apply(
        self, target: frozenset[CrossConnect], ports: frozenset[int], mode: ApplyMode
    ) -> ApplyResult:
        sid = self._switch_id
        n = self._size
        states, paths = await self._read_paths()
        intended = lit_cross_connects(n, paths) - self._fillers
        diff = minimal_diff(sid, intended, target, ports, mode)
        if mode is ApplyMode.MINIMAL and diff.empty:
            return ApplyResult()
        removed, added = diff.breaks, diff.makes
        outside = intended - diff.unchanged - frozenset(removed)
        desired = outside | target
        new_states, fillers = self._plan(desired, states, paths)
        new_paths = benes.trace(n, new_states)
        expected = lit_cross_connects(n, new_paths)
        rerouted = self._rerouted(outside, paths, states, new_states)
        self.last_rerouted = rerouted
        if rerouted:
            self._log.warning(
                "rerouted outside ports",
                rerouted=[f"{x.ingress}->{x.egress}" for x in sorted(rerouted)],
                glitch_s=self._caps.settle_time_s,
            )
            if not self._allow_reroute:
                raise ReroutingRequired(sid, rerouted)
        volts = self._cal.setpoints(new_states) + (0.0,) * (
            self._channels - self._net.element_count
        )
        try:
            await self._write_vector(volts)
        except HeaterChannelFault as e:
            if e.code is not QontrolError.OUTPUT:
                raise
            await self._sleep(self._caps.settle_time_s)
            return await self._partial(e, desired, expected & fillers, removed, added)
        await self._sleep(self._caps.settle_time_s)
        _, after_paths = await self._read_paths()
        lit_after = lit_cross_connects(n, after_paths)
        self._fillers = expected & fillers & lit_after
        if lit_after != expected:
            raise VerificationMismatch(sid, expected - lit_after, lit_after - expected)
        self._log.debug(  # per reconfiguration: debug (in metrics and events)
            "applied", removed=len(removed), added=len(added), rerouted=len(rerouted),
            fillers=len(self._fillers),
        )
        return ApplyResult(removed, added, verified=True)

    def _plan(
        self,
        desired: frozenset[CrossConnect],
        states: Sequence[ElementState | None],
        paths: Sequence[benes.LightPath],
    ) -> tuple[tuple[ElementState | None, ...], frozenset[CrossConnect]]:
        """Element states (None = off) realising ``desired``, and the filler cross-connects
        routed for unused inputs (lit or darkened)."""
        n = self._size
        partial = {
            ingress_to_input(xc.ingress): egress_to_output(n, xc.egress) for xc in desired
        }
        full = benes.complete_permutation(n, partial, [p.output for p in paths])
        routed = benes.route(n, full, prefer=states)
        fillers = frozenset(
            CrossConnect(i + 1, n + 1 + o) for i, o in enumerate(full) if i not in partial
        )
        if not self._darken or not fillers:
            return routed, fillers
        carries_real = [False] * self._net.element_count
        for p in benes.trace(n, routed):
            if p.input in partial:
                for channel in p.channels:
                    carries_real[channel] = True
        final = tuple(
            s if real else None for s, real in zip(routed, carries_real, strict=True)
        )
        return final, fillers

    def _rerouted(
        self,
        outside: Iterable[CrossConnect],
        paths: Sequence[benes.LightPath],
        states: Sequence[ElementState | None],
        new_states: Sequence[ElementState | None],
    ) -> frozenset[CrossConnect]:
        out: set[CrossConnect] = set()
        for xc in outside:
            path = paths[ingress_to_input(xc.ingress)]
            if any(states[c] != new_states[c] for c in path.channels):
                out.add(xc)
        return frozenset(out)

    async def _partial(
        self,
        fault: HeaterChannelFault,
        desired: frozenset[CrossConnect],
        fillers: frozenset[CrossConnect],
        removed: tuple[CrossConnect, ...],
        added: tuple[CrossConnect, ...],
    ) -> ApplyResult:
        """After an output error: read back and raise ``PartialApply`` saying what is in place
        (or return the full result when the read-back shows the whole intent anyway)."""
        _, paths = await self._read_paths()
        lit = lit_cross_connects(self._size, paths)
        self._fillers = fillers & lit
        intended = lit - self._fillers
        if intended == desired:
            self._log.warning("output error without effect on cross-connects", error=str(fault))
            return ApplyResult(removed, added)
        reason = str(fault)
        failed: dict[CrossConnect, str] = {}
        for xc in added:
            if xc not in intended:
                failed[xc] = reason
        for xc in removed:
            if xc in intended:
                failed[xc] = reason
        for xc in desired - set(added):
            if xc not in intended:
                failed[xc] = f"lost by a partial write (not on the ports given): {reason}"
        result = ApplyResult(
            removed=tuple(xc for xc in removed if xc not in intended),
            added=tuple(xc for xc in added if xc in intended),
            failed=failed,
        )
        self._log.error("partial apply", failed=len(failed), error=reason)
        raise PartialApply(self._switch_id, result)

    async def _write_vector(self, volts: Sequence[float]) -> None:
        line = "vvec0=" + ",".join(format_volts(v) for v in volts)
        reply = (await self._exchange(line, 1))[0]
        self.writes += 1
        if reply != "OK":
            self._drop()
            raise ProtocolError(self._switch_id, f"expected OK to vvec0=..., got {reply[:60]!r}")

    # --- ports, power, alarms (Lightrail extensions) -------------------------------------------

    def _check_port(self, port: int) -> None:
        if port not in self._caps.port_ids():
            raise InvalidPort(self._switch_id, port, "no such port")

    def _port_lines(self, command: str, lines: Sequence[str]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for line in lines:
            fields = line.split(",")
            if not fields[0].isdecimal() or int(fields[0]) not in self._caps.port_ids():
                raise self._protocol(f"bad port line in reply to {command}: {line[:60]!r}")
            out[int(fields[0])] = fields[1:]
        if len(out) != len(self._caps.port_ids()):
            raise self._protocol(f"reply to {command} does not cover every port")
        return out

    async def set_port_admin(self, port: int, admin: PortAdmin) -> None:
        """Enable or disable ``port`` (``lradm<port>=1|0``). Raises ``InvalidPort``,
        ``DeviceUnreachable``, ``DeviceTimeout``, ``ProtocolError``."""
        self._check_port(port)
        value = 1 if admin is PortAdmin.ENABLED else 0
        reply = (await self._exchange(f"lradm{port}={value}", 1))[0]
        if reply != "OK":
            self._drop()
            raise self._protocol(f"expected OK to lradm{port}=, got {reply[:60]!r}")

    async def get_port_status(self, ports: Iterable[int] | None = None) -> list[PortStatus]:
        """Status of ``ports`` (default: all) in the order given (``lrport?``). Raises
        ``InvalidPort``, ``DeviceUnreachable``, ``DeviceTimeout``, ``ProtocolError``."""
        wanted = list(self._caps.port_ids() if ports is None else ports)
        for port in wanted:
            self._check_port(port)
        lines = await self._exchange("lrport?", len(self._caps.port_ids()))
        table = self._port_lines("lrport?", lines)
        out: list[PortStatus] = []
        for port in wanted:
            fields = table[port]
            try:
                admin, oper = PortAdmin(fields[0]), PortOper(fields[1])
            except (IndexError, ValueError):
                raise self._protocol(f"bad status of port {port}: {fields!r}") from None
            out.append(PortStatus(port, admin, oper))
        return out

    async def get_power(self, ports: Iterable[int] | None = None) -> dict[int, float]:
        """Optical power per port in dBm (``lrpwr?``, the mesh's monitor photodiodes). Raises
        ``InvalidPort``, ``DeviceUnreachable``, ``DeviceTimeout``, ``ProtocolError``."""
        wanted = list(self._caps.port_ids() if ports is None else ports)
        for port in wanted:
            self._check_port(port)
        lines = await self._exchange("lrpwr?", len(self._caps.port_ids()))
        table = self._port_lines("lrpwr?", lines)
        out: dict[int, float] = {}
        for port in wanted:
            fields = table[port]
            if len(fields) != 1:
                raise self._protocol(f"bad power of port {port}: {fields!r}")
            out[port] = self._number(fields[0], "lrpwr?")
        return out

    def events(self) -> AsyncIterator[DeviceAlarm]:
        """Alarms until ``close``, on a second connection in ``lrsub`` mode opened by the first
        ``__anext__`` (``subscribe_alarms`` opens it at once). Raises ``DeviceUnreachable``
        when not open; the iterator raises ``DeviceUnreachable``/``DeviceTimeout`` when the
        stream cannot be opened and ``ProtocolError`` on a line that does not parse, and ends
        when the device closes the stream or the driver is closed."""
        if not self._opened:
            raise DeviceUnreachable(self._switch_id, "driver is not open")
        return SiphAlarmStream(self)

    async def subscribe_alarms(self) -> SiphAlarmStream:
        """Like ``events`` but the stream is open (the device is delivering to it) on return.
        Raises ``DeviceUnreachable``, ``DeviceTimeout``, ``ProtocolError``."""
        stream = SiphAlarmStream(self)
        await stream.connect()
        return stream

    async def _open_stream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        sid = self._switch_id
        if not self._opened:
            raise DeviceUnreachable(sid, "driver is not open")
        check_gate(self._gate, sid)
        try:
            async with asyncio.timeout(self._timeout_s):
                reader, writer = await asyncio.open_connection(self._host, self._port)
                writer.write(b"lrsub\n")
                await writer.drain()
                first = await reader.readline()
        except TimeoutError:
            raise DeviceTimeout(sid, "alarm stream did not open in time") from None
        except OSError as e:
            raise DeviceUnreachable(sid, f"alarm stream: {e}") from None
        if first.rstrip(b"\r\n") != b"OK":
            _close_writer(writer)
            raise self._protocol(f"expected OK to lrsub, got {first[:60]!r}")
        self._streams.add(writer)
        return reader, writer

    def _forget_stream(self, writer: asyncio.StreamWriter) -> None:
        self._streams.discard(writer)
        _close_writer(writer)

    def _parse_alarm(self, raw: bytes) -> DeviceAlarm:
        try:
            text = raw.decode("ascii").rstrip("\r\n")
            tag, port, condition, severity, at_s, description = text.split(",", 5)
            if tag != "ALM":
                raise ValueError(tag)
            return DeviceAlarm(
                self._switch_id,
                None if port == "-" else int(port),
                condition,
                AlarmSeverity(severity),
                float(at_s),
                description,
            )
        except ValueError:
            raise self._protocol(f"bad alarm line {raw[:80]!r}") from None

    # --- wire ----------------------------------------------------------------------------------

    def _protocol(self, message: str) -> ProtocolError:
        return ProtocolError(self._switch_id, message)

    def _number(self, text: str, command: str) -> float:
        if NUMBER_RE.fullmatch(text) is None:
            self._drop()
            raise self._protocol(f"expected a number in reply to {command}, got {text[:40]!r}")
        return float(text)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            _close_writer(conn.writer)

    async def _connect(self) -> _Conn:
        """Open the command connection and identify the device (holding ``_io_lock``)."""
        sid = self._switch_id
        try:
            async with asyncio.timeout(self._timeout_s):
                reader, writer = await asyncio.open_connection(self._host, self._port)
        except TimeoutError:
            raise DeviceTimeout(sid, f"connect to {self._host}:{self._port} timed out") from None
        except OSError as e:
            raise DeviceUnreachable(sid, f"connect to {self._host}:{self._port}: {e}") from None
        conn = _Conn(reader, writer)
        self._conn = conn
        ident = (await self._raw(conn, "id?", 1))[0]
        if ID_RE.fullmatch(ident) is None:
            self._drop()
            raise self._protocol(f"not a Qontrol-style device id: {ident[:40]!r}")
        count = (await self._raw(conn, "nchan?", 1))[0]
        if not count.isdecimal():
            self._drop()
            raise self._protocol(f"expected a channel count in reply to nchan?, got {count!r}")
        channels = int(count)
        if channels < self._net.element_count:
            self._drop()
            raise DriverError(
                sid,
                f"device {ident} has {channels} channels, a {self._size}-port Beneš mesh "
                f"needs {self._net.element_count}",
            )
        if self._device_id and ident != self._device_id:
            self._log.warning("device id changed", was=self._device_id, now=ident)
        self._device_id = ident
        self._channels = channels
        return conn

    async def _exchange(self, command: str, lines: int) -> list[str]:
        """Send ``command``, return ``lines`` reply lines (reconnecting first when needed)."""
        if not self._opened:
            raise DeviceUnreachable(self._switch_id, "driver is not open")
        async with self._io_lock:
            conn = self._conn
            if conn is not None and (conn.reader.at_eof() or conn.writer.is_closing()):
                self._drop()  # the device closed it while idle (e.g. it restarted)
                conn = None
            if conn is None:
                conn = await self._connect()
            return await self._raw(conn, command, lines)

    async def _raw(self, conn: _Conn, command: str, lines: int) -> list[str]:
        sid = self._switch_id
        check_gate(self._gate, sid)
        name = command.split("=", 1)[0] + ("=..." if "=" in command else "")
        try:
            async with asyncio.timeout(self._timeout_s):
                conn.writer.write(f"{command}\n".encode("ascii"))
                await conn.writer.drain()
                out: list[str] = []
                while len(out) < lines:
                    raw = await conn.reader.readline()
                    out.append(self._decode(raw, name, len(out)))
                return out
        except TimeoutError:
            self._drop()
            raise DeviceTimeout(
                sid, f"no complete reply to {name!r} within {self._timeout_s} s"
            ) from None
        except ValueError:  # a line longer than the stream limit
            self._drop()
            raise self._protocol(f"reply line to {name!r} too long") from None
        except OSError as e:
            self._drop()
            raise DeviceUnreachable(sid, f"connection lost during {name!r}: {e}") from None
        except DriverError:
            self._drop()
            raise

    def _decode(self, raw: bytes, command: str, received: int) -> str:
        sid = self._switch_id
        if not raw and not received:
            raise DeviceUnreachable(
                sid, f"device closed the connection before replying to {command!r}"
            )
        if not raw:
            raise DeviceUnreachable(
                sid, f"device closed the connection mid-reply to {command!r} after "
                     f"{received} lines",
            )
        if not raw.endswith(b"\n"):
            raise DeviceUnreachable(sid, f"device closed the connection mid-reply to "
                                         f"{command!r} after {raw[:40]!r}")
        try:
            text = raw.decode("ascii").rstrip("\r\n")
        except UnicodeDecodeError:
            raise self._protocol(f"non-ASCII reply to {command!r}: {raw[:40]!r}") from None
        m = ERROR_RE.fullmatch(text)
        if m is not None:
            raise self._device_error(int(m.group(1)), int(m.group(2)), command)
        return text

    def _device_error(self, code: int, channel: int, command: str) -> DriverError:
        sid = self._switch_id
        try:
            err = QontrolError(code)
        except ValueError:
            return self._protocol(f"unknown error E{code:02d}:{channel:02d} to {command!r}")
        if err in (
            QontrolError.OVER_VOLTAGE, QontrolError.OVER_CURRENT, QontrolError.POWER,
            QontrolError.CALIBRATION, QontrolError.OUTPUT,
        ):
            element = (
                self._net.element(channel) if channel < self._net.element_count else None
            )
            return HeaterChannelFault(sid, err, channel, element, command)
        if err is QontrolError.TIMED_OUT:
            return DeviceTimeout(sid, f"device timed out on {command!r} (E16)")
        return self._protocol(
            f"device rejected {command!r}: {ERROR_TEXT[err]} "
            f"(E{code:02d}, channel {channel})"
        )


class SiphAlarmStream(AsyncIterator[DeviceAlarm]):
    """Alarms of one ``SiphDriver`` from one ``lrsub`` connection (``SiphDriver.events``)."""

    def __init__(self, driver: SiphDriver) -> None:
        self._driver = driver
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._done = False

    def __aiter__(self) -> SiphAlarmStream:
        return self

    async def connect(self) -> None:
        """Open the stream now (idempotent). Raises ``DeviceUnreachable``, ``DeviceTimeout``,
        ``ProtocolError``."""
        if self._conn is None and not self._done:
            self._conn = await self._driver._open_stream()

    async def __anext__(self) -> DeviceAlarm:
        await self.connect()
        if self._conn is None:
            raise StopAsyncIteration
        reader, _ = self._conn
        try:
            raw = await reader.readline()
        except OSError:
            raw = b""
        if not raw.endswith(b"\n"):
            await self.aclose()
            raise StopAsyncIteration
        return self._driver._parse_alarm(raw)

    async def aclose(self) -> None:
        """End the stream (a pending ``__anext__`` ends with ``StopAsyncIteration``)."""
        self._done = True
        conn, self._conn = self._conn, None
        if conn is not None:
            self._driver._forget_stream(conn[1])


def make_driver(spec: SwitchSpec, context: DriverContext) -> Driver:
    """The driver for ``spec`` (config ``model: siph``): an N x N switch, N a power of two in
    2..64, with ``lightrail.drivers.siph.options.SiphOptions``; ``context.command_gate`` is asked
    before every command.

    Raises ``lightrail.drivers.options.DriverConfigError`` naming the switch, the model and the
    option (or the switch's kind or size).
    """
    sid, model = spec.switch_id, spec.model
    options = SiphOptions.from_spec(spec)
    caps = spec.capabilities
    if caps.kind is not SwitchKind.NXN:
        raise DriverConfigError(sid, model, "kind: an MZI mesh is nxn")
    try:
        benes.check_size(caps.port_count)
    except ValueError as e:
        raise DriverConfigError(sid, model, str(e)) from None
    try:
        calibration = options.calibration_table(caps.port_count)
    except (ValueError, OSError) as e:
        option = "calibration" if options.calibration_file is None else "calibration_file"
        raise DriverConfigError(sid, model, str(e), option=option) from None
    return SiphDriver(
        sid, caps, host=options.host, port=options.port, calibration=calibration,
        timeout_s=options.timeout_s, reroute_outside_ports=options.reroute_outside_ports,
        darken_unused=options.darken_unused, command_gate=context.command_gate,
    )
