"""An emulated silicon-photonic MZI mesh switch behind a Qontrol-style DAC, on a TCP socket.

The device is an N x N Beneš network (``lightrail.drivers.siph.benes``) of 2x2 MZI elements, one
thermo-optic
heater per element on one DAC channel (channel c drives ``BenesNetwork.element(c)``; the chain
has ``ceil(elements / 8) * 8`` channels like a daisy chain of 8-channel Q8iv modules, spare
channels have no optical effect). Each element's state follows its heater read-back through the
calibration table (``lightrail.drivers.siph.CalibrationTable``): within ``tolerance_v`` of
``v_bar`` it is
bar, of ``v_cross`` cross, anything else is undefined and modelled as lossy (light reaching it is
dropped). The lit light paths are the switch's optical state.

That optical state lives in a wrapped ``lightrail.emulator.ocs.EmulatedOcs`` (N x N, Polatis
numbering),
which provides the reconfiguration delay (``settle_time_s``, microseconds), the change log
(``ChangeRecord``), per-port power, port admin/status, alarms and fault injection, so invariant
checks read every device the same way. Each accepted heater write becomes one
``EmulatedOcs.apply_bulk``: paths that go dark are broken, new paths made, and paths that keep
their ingress -> egress mapping but move inside the mesh (any element on them changed state)
are broken and made again (the glitch a rearrangeable network causes; ``last_rerouted``). The
reply is sent after the settle.

Wire protocol (ASCII lines ending in ``\\n``; after Qontrol's ``qontrol.py`` v1.1.1,
github.com/takeqontrol/api; ``lightrail.drivers.siph`` documents the source):

- ``id?`` -> ``Q8iv-0001``; ``nchan?`` -> channel count; ``firmware?``; ``vfull?`` ->
  ``12.000 V``; ``ifull?`` -> ``24.000 mA``.
- ``v<ch>=<volts>`` / ``i<ch>=<mA>`` -> ``OK``; ``v<ch>?`` / ``i<ch>?`` -> value;
  ``vall?`` / ``iall?`` -> one value per channel, one per line; ``vvec<ch>=<v0>,<v1>,...``
  (and ``ivec``) sets consecutive channels from ``ch`` in one write -> ``OK``;
  ``imax<ch>?`` / ``imax<ch>=<mA>`` the per-channel current limit.
- errors ``E<code:02d>:<channel:02d>``: E01 over-voltage (above ``vfull``), E02 over-current
  (``volts / heater_ohm`` above the channel's ``imax``), E05 output error (a stuck channel, a
  failed port), E10 unrecognised command, E11 bad value, E12 bad channel.
- Lightrail extensions: ``lrpwr?`` -> 2N lines ``<port>,<dBm>``; ``lrport?`` -> 2N lines
  ``<port>,<admin>,<oper>``; ``lradm<port>=1|0``; ``lrsub`` -> ``OK``, then the connection
  carries alarms as ``ALM,<port or ->,<condition>,<severity>,<at_s>,<description>`` lines.

Assumptions (not documented by Qontrol): a vector write with any bad value is rejected as a
whole (nothing changes) with the error of the first bad channel; a write that over-currents is
rejected rather than clamped; a stuck channel (``stick_channels``) keeps its old output, the
other channels of the write take effect and the reply is ``E05:<ch>`` (or ``OK`` when silent).

Faults: everything ``EmulatedOcs`` offers, directly on ``ocs`` or through
``lightrail.emulator.control``
when ``ocs`` is registered in an ``EmulatedFabricDevices`` (pass ``ocs=devices.ensure(...)``, or
``devices.add(server.ocs)``):

- ``set_unreachable``, ``drop_next_calls``, ``reboot`` (while down): a command gets no reply and
  the connection is closed; ``set_extra_delay``: every command waits first (slow device).
- ``fail_port``/``deny_port``: a write that would light a path through the port is rejected as
  a whole with ``E05`` naming the edge element's channel; the failed port raises its alarm.
- ``reboot`` without keeping cross-connects (here or behind the server's back): the DAC lost
  power too, every heater returns to 0 V and the optics show what 0 V lights (dark with the
  default calibration). With ``keep_cross_connects`` the heaters hold.
- ``fail_make`` (partial apply): a mesh cannot drop one path alone (each element carries two),
  so the heaters of the elements that had to change for the failed makes keep their old
  outputs, the optics follow the heaters and the reply is ``E05:<channel>``.
- ``drop_makes_silently``: the heaters are right but the path stays dark (a broken waveguide):
  only optical power shows it.

Server-level: ``garble_next_replies``, ``close_mid_next_reply``, ``stick_channels``
(``silent`` or answering ``E05``), ``set_imax``, ``stop``/``start`` (restart on the same port,
state kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections.abc import Iterable, Mapping
from types import TracebackType

import structlog

from lightrail.drivers.base import (
    CrossConnect,
    DeviceUnreachable,
    HardwareFault,
    InvalidPort,
    PartialApply,
    PortAdmin,
    PortOper,
    SwitchCapabilities,
    SwitchKind,
)
from lightrail.drivers.siph import benes
from lightrail.drivers.siph.calibration import CalibrationTable
from lightrail.drivers.siph.wire import (
    CHANNELS_PER_MODULE,
    QontrolError,
    format_error,
    format_volts,
    lit_cross_connects,
)
from lightrail.drivers.timing import Clock, Sleep
from lightrail.emulator.ocs import AlarmSubscription, EmulatedOcs

DEFAULT_SETTLE_S = 10e-6
"""Reconfiguration delay of a thermo-optic MZI mesh (10 microseconds)."""
VFULL_V = 12.0
"""Full-scale output voltage of a Q8iv channel (``qontrol.py`` DEVICE_PROPERTIES)."""
IFULL_MA = 24.0
"""Full-scale output current of a Q8iv channel in mA (``qontrol.py`` DEVICE_PROPERTIES)."""
DEFAULT_HEATER_OHM = 250.0
"""Heater resistance (ohm): 2.5 V drives 10 mA."""
DEFAULT_IMAX_MA = 20.0
"""Default per-channel current limit (mA): over-current above 5 V on a 250 ohm heater."""
GARBAGE = b"\xff\xfe#?garbage\x00\n"
"""What ``garble_next_replies`` sends instead of a reply."""

_STOP_TIMEOUT_S = 5.0
_COMMAND_RE = re.compile(r"([A-Za-z]+)(\d*)([=?])(.*)")
_log = structlog.get_logger(__name__)


class _Reject(Exception):
    """A command error: reply ``line`` and change nothing."""

    def __init__(self, code: QontrolError, channel: int) -> None:
        super().__init__(format_error(code, channel))
        self.line = format_error(code, channel)


class MziMeshServer:
    """One emulated MZI mesh switch ``switch_id`` of ``size`` ports (a power of two, 2..64) on
    ``host:port`` (port 0: any free port, kept across ``stop``/``start``).

    ``calibration`` is the device's true per-element calibration (default: uniform defaults);
    ``settle_time_s`` the reconfiguration delay; ``heater_ohm`` and ``imax_ma`` the electrical
    model; ``clock``/``sleep`` are passed to the wrapped ``EmulatedOcs``. ``ocs`` wraps an
    existing N x N device instead (its own delay, clock and sleep apply; its cross-connects are
    replaced by what 0 V lights at the first command). Use as ``async with MziMeshServer(...)
    as server`` or ``start``/``stop``. Raises ``ValueError`` naming the field for a bad
    ``size``, ``calibration``, ``heater_ohm`` or ``ocs``.
    """

    def __init__(
        self,
        switch_id: str,
        size: int,
        *,
        calibration: CalibrationTable | None = None,
        settle_time_s: float = DEFAULT_SETTLE_S,
        host: str = "127.0.0.1",
        port: int = 0,
        heater_ohm: float = DEFAULT_HEATER_OHM,
        imax_ma: float = DEFAULT_IMAX_MA,
        device_id: str = "Q8iv-0001",
        firmware: str = "2.4.1",
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        ocs: EmulatedOcs | None = None,
    ) -> None:
        self._net = benes.BenesNetwork(size)
        self._cal = calibration if calibration is not None else CalibrationTable.uniform(size)
        if self._cal.size != size:
            raise ValueError(f"calibration: table is for {self._cal.size} ports, not {size}")
        if heater_ohm <= 0:
            raise ValueError(f"heater_ohm: must be > 0, got {heater_ohm}")
        self._size = size
        self._channels = -(-self._net.element_count // CHANNELS_PER_MODULE) * CHANNELS_PER_MODULE
        self._setpoint_v = [0.0] * self._channels
        self._measured_v = [0.0] * self._channels
        self._imax_ma = [imax_ma] * self._channels
        self._heater_ohm = heater_ohm
        self._device_id = device_id
        self._firmware = firmware
        self._host = host
        self._port = port
        self._log = _log.bind(switch=switch_id)
        if ocs is None:
            caps = SwitchCapabilities(
                kind=SwitchKind.NXN, port_count=size, atomic_bulk=True,
                settle_time_s=settle_time_s,
            )
            ocs = EmulatedOcs(
                switch_id, caps, cross_connects=self._lit(), clock=clock, sleep=sleep,
                vendor="Lightrail", model=f"mzi-benes-{size}x{size}", firmware=firmware,
            )
        elif ocs.capabilities.kind is not SwitchKind.NXN or ocs.capabilities.port_count != size:
            raise ValueError(f"ocs: must be an N x N device with {size} ports")
        self._ocs = ocs
        # the optical state as this server last left it; anything else was done behind its
        # back (a reboot through the control API) and is resynchronised on the next command
        self._committed = ocs.cross_connects
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._subs: set[AlarmSubscription] = set()
        self._lock = asyncio.Lock()
        # faults
        self._garble = 0
        self._garble_after = 0
        self._close_mid = False
        self._close_after = 0
        self._stuck: set[int] = set()
        self._stuck_silent = False
        # inspection
        self.writes = 0
        """Accepted heater writes (single-channel or vector) that reached the optics."""
        self.last_rerouted: frozenset[CrossConnect] = frozenset()
        """Cross-connects the last write kept but re-routed inside the mesh (glitched)."""
        self.received: list[str] = []
        """Every command line received, oldest first (``vvec`` values elided)."""

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen (again) on ``host:port``; the first start picks the port when it is 0."""
        if self._server is not None:
            return
        self._server = await asyncio.start_server(
            self._serve, self._host, self._port, reuse_address=True
        )
        self._port = self._server.sockets[0].getsockname()[1]
        self._log.debug("listening", port=self._port)

    async def stop(self) -> None:
        """Stop listening and close every connection (device state is kept)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for sub in list(self._subs):
            await sub.aclose()
        for writer in list(self._writers):
            writer.close()  # the handler's next read sees EOF and returns
        tasks = list(self._tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=_STOP_TIMEOUT_S)
            for task in pending:  # stuck in a slow command: give up on it
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> MziMeshServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # --- inspection ----------------------------------------------------------------------------

    @property
    def host(self) -> str:
        """Listening address."""
        return self._host

    @property
    def port(self) -> int:
        """Listening TCP port (0 before the first ``start`` when none was given)."""
        return self._port

    @property
    def ocs(self) -> EmulatedOcs:
        """The wrapped permutation-level device: state, change log, timing, fault injection."""
        return self._ocs

    @property
    def network(self) -> benes.BenesNetwork:
        """The mesh's shape."""
        return self._net

    @property
    def channel_count(self) -> int:
        """DAC channels (a multiple of 8, at least the element count)."""
        return self._channels

    @property
    def setpoints_v(self) -> tuple[float, ...]:
        """Heater set-points as last written (V, by channel)."""
        return tuple(self._setpoint_v)

    @property
    def measured_v(self) -> tuple[float, ...]:
        """Heater outputs (V, by channel): the set-points except on stuck channels."""
        return tuple(self._measured_v)

    @property
    def element_states(self) -> tuple[benes.ElementState | None, ...]:
        """Element states from the heater outputs (None: undefined, lossy)."""
        return self._cal.states(self._measured_v)

    @property
    def alarm_streams(self) -> int:
        """Connections currently in ``lrsub`` alarm-stream mode."""
        return len(self._subs)

    @property
    def cross_connects(self) -> frozenset[CrossConnect]:
        """The lit light paths (the wrapped device's state)."""
        return self._ocs.cross_connects

    def _lit(self, measured: list[float] | None = None) -> frozenset[CrossConnect]:
        states = self._cal.states(self._measured_v if measured is None else measured)
        return lit_cross_connects(self._size, benes.trace(self._size, states))

    # --- faults --------------------------------------------------------------------------------

    def garble_next_replies(self, count: int = 1, *, after: int = 0) -> None:
        """After ``after`` normal replies, the next ``count`` replies are replaced by one line
        of non-ASCII garbage (the commands themselves still take effect)."""
        if count < 0 or after < 0:
            raise ValueError(f"garble_next_replies: count {count} and after {after} must be >= 0")
        self._garble = count
        self._garble_after = after

    def close_mid_next_reply(self, *, after: int = 0) -> None:
        """After ``after`` normal replies, the next reply is cut in half and the connection
        closed (the command itself still takes effect)."""
        if after < 0:
            raise ValueError(f"close_mid_next_reply: after must be >= 0, got {after}")
        self._close_mid = True
        self._close_after = after

    def stick_channels(self, channels: Iterable[int], *, silent: bool = False) -> None:
        """Heater ``channels`` stop following writes: they keep their output. A write that
        changes one answers ``E05:<channel>`` (output error), or ``OK`` when ``silent`` (a
        device that lies; only a read-back shows it)."""
        chans = set(channels)
        for ch in chans:
            if not 0 <= ch < self._channels:
                raise ValueError(f"stick_channels: channel {ch} not in 0..{self._channels - 1}")
        self._stuck = chans
        self._stuck_silent = silent

    def set_imax(self, channel: int, imax_ma: float) -> None:
        """Current limit of ``channel`` in mA."""
        if not 0 <= channel < self._channels:
            raise ValueError(f"set_imax: channel {channel} not in 0..{self._channels - 1}")
        self._imax_ma[channel] = imax_ma

    def clear_faults(self) -> None:
        """Remove every server-level and device-level injected fault."""
        self._garble = 0
        self._close_mid = False
        self._stuck = set()
        self._stuck_silent = False
        self._ocs.clear_faults()

    async def reboot(self, *, keep_cross_connects: bool, down_s: float = 0.0) -> None:
        """Reboot the device (``EmulatedOcs.reboot``): unreachable for ``down_s`` seconds.
        Without ``keep_cross_connects`` the DAC outputs return to 0 V and the optical state
        becomes whatever 0 V gives (dark with the default calibration)."""
        await self._ocs.reboot(keep_cross_connects=keep_cross_connects, down_s=down_s)
        async with self._lock:
            await self._resync()

    async def _resync(self) -> None:
        """When the optics lost cross-connects behind the server's back (``EmulatedOcs.reboot``
        without keeping them, e.g. through ``lightrail.emulator.control``), the DAC lost power too:
        zero
        every heater and make whatever 0 V lights."""
        if self._ocs.cross_connects == self._committed:
            return
        self._log.info("optics changed behind the DAC (power loss): heaters to 0 V")
        self._setpoint_v = [0.0] * self._channels
        self._measured_v = [0.0] * self._channels
        lit = self._lit()
        current = self._ocs.cross_connects
        if lit != current:
            await self._ocs.apply_bulk(sorted(current - lit), sorted(lit - current))
        self._committed = self._ocs.cross_connects

    # --- connections ---------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._writers.add(writer)
        try:
            while True:
                raw = await reader.readline()
                if not raw.endswith(b"\n"):
                    return
                text = raw.decode("ascii", errors="replace").strip()
                if not text:
                    continue
                self.received.append(text.split("=", 1)[0] + "=..." if "vec" in text.lower()
                                     else text)
                try:
                    await self._ocs.info()  # honours unreachable, rebooting, slow
                    if text.lower() == "lrsub":
                        await self._alarm_stream(reader, writer)
                        return
                    async with self._lock:
                        await self._resync()
                        reply = await self._handle(text)
                except DeviceUnreachable:
                    return
                if not await self._send(writer, reply):
                    return
        except (OSError, ValueError):
            return
        finally:
            self._writers.discard(writer)
            if task is not None:
                self._tasks.discard(task)
            writer.close()

    async def _send(self, writer: asyncio.StreamWriter, lines: list[str]) -> bool:
        data = "".join(f"{line}\n" for line in lines).encode("ascii")
        if self._garble:
            if self._garble_after:
                self._garble_after -= 1
            else:
                self._garble -= 1
                data = GARBAGE
        if self._close_mid:
            if self._close_after:
                self._close_after -= 1
            else:
                self._close_mid = False
                writer.write(data[: max(1, len(data) // 2)])
                await writer.drain()
                return False
        writer.write(data)
        await writer.drain()
        return True

    async def _alarm_stream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        sub = self._ocs.alarms()
        self._subs.add(sub)

        async def close_on_eof() -> None:
            with contextlib.suppress(OSError):
                while await reader.read(1024):
                    pass
            await sub.aclose()

        eof = asyncio.create_task(close_on_eof(), name="mzi-alarm-eof")
        try:
            writer.write(b"OK\n")
            await writer.drain()
            async for alarm in sub:
                port = "-" if alarm.port is None else str(alarm.port)
                description = alarm.description.replace("\n", " ")
                line = (
                    f"ALM,{port},{alarm.condition},{alarm.severity.value},"
                    f"{alarm.at_s:.6f},{description}\n"
                )
                writer.write(line.encode("ascii", errors="replace"))
                await writer.drain()
        finally:
            eof.cancel()
            await asyncio.gather(eof, return_exceptions=True)
            await sub.aclose()
            self._subs.discard(sub)

    # --- commands ------------------------------------------------------------------------------

    async def _handle(self, text: str) -> list[str]:
        m = _COMMAND_RE.fullmatch(text)
        if m is None:
            return [format_error(QontrolError.UNRECOGNISED_COMMAND, 0)]
        header, ch_text, op, value = m.group(1).lower(), m.group(2), m.group(3), m.group(4)
        ch = int(ch_text) if ch_text else None
        try:
            if op == "?":
                if value:
                    raise _Reject(QontrolError.UNRECOGNISED_PARAMETER, ch or 0)
                return await self._query(header, ch)
            return await self._set(header, ch, value)
        except _Reject as e:
            return [e.line]

    def _channel(self, ch: int | None) -> int:
        if ch is None or not 0 <= ch < self._channels:
            raise _Reject(QontrolError.UNRECOGNISED_CHANNEL, ch or 0)
        return ch

    def _port_id(self, port: int | None) -> int:
        if port is None or port not in self._ocs.capabilities.port_ids():
            raise _Reject(QontrolError.UNRECOGNISED_CHANNEL, port or 0)
        return port

    async def _query(self, header: str, ch: int | None) -> list[str]:
        scalar = {
            "id": self._device_id,
            "nchan": str(self._channels),
            "firmware": self._firmware,
            "vfull": f"{VFULL_V:.3f} V",
            "ifull": f"{IFULL_MA:.3f} mA",
        }
        if header in scalar and ch is None:
            return [scalar[header]]
        if header == "v":
            return [format_volts(self._measured_v[self._channel(ch)])]
        if header == "i":
            return [f"{self._current_ma(self._measured_v[self._channel(ch)]):.4f}"]
        if header == "imax":
            return [f"{self._imax_ma[self._channel(ch)]:.4f}"]
        if header == "vall" and ch is None:
            return [format_volts(v) for v in self._measured_v]
        if header == "iall" and ch is None:
            return [f"{self._current_ma(v):.4f}" for v in self._measured_v]
        if header == "lrpwr" and ch is None:
            power = await self._ocs.get_power()
            return [f"{p},{dbm:.2f}" for p, dbm in sorted(power.items())]
        if header == "lrport" and ch is None:
            status = await self._ocs.get_port_status()
            return [f"{s.port},{s.admin.value},{s.oper.value}" for s in status]
        raise _Reject(QontrolError.UNRECOGNISED_COMMAND, ch or 0)

    async def _set(self, header: str, ch: int | None, value: str) -> list[str]:
        if header in ("v", "i"):
            channel = self._channel(ch)
            number = self._parse(value, channel)
            volts = number if header == "v" else number / 1000.0 * self._heater_ohm
            self._check(channel, volts)
            return await self._commit({channel: volts})
        if header in ("vvec", "ivec"):
            start = self._channel(ch)
            texts = value.split(",")
            if start + len(texts) > self._channels:
                raise _Reject(QontrolError.UNRECOGNISED_CHANNEL, self._channels)
            changes: dict[int, float] = {}
            for offset, item in enumerate(texts):
                channel = start + offset
                number = self._parse(item, channel)
                changes[channel] = (
                    number if header == "vvec" else number / 1000.0 * self._heater_ohm
                )
            for channel, volts in changes.items():
                self._check(channel, volts)
            return await self._commit(changes)
        if header == "imax":
            channel = self._channel(ch)
            limit = self._parse(value, channel)
            if limit > IFULL_MA:
                raise _Reject(QontrolError.UNRECOGNISED_PARAMETER, channel)
            self._imax_ma[channel] = limit
            return ["OK"]
        if header == "lradm":
            port = self._port_id(ch)
            if value not in ("0", "1"):
                raise _Reject(QontrolError.UNRECOGNISED_PARAMETER, port)
            admin = PortAdmin.ENABLED if value == "1" else PortAdmin.DISABLED
            await self._ocs.set_port_admin(port, admin)
            return ["OK"]
        raise _Reject(QontrolError.UNRECOGNISED_COMMAND, ch or 0)

    @staticmethod
    def _parse(text: str, channel: int) -> float:
        try:
            number = float(text)
        except ValueError:
            raise _Reject(QontrolError.UNRECOGNISED_PARAMETER, channel) from None
        if not math.isfinite(number) or number < 0:
            raise _Reject(QontrolError.UNRECOGNISED_PARAMETER, channel)
        return number

    def _current_ma(self, volts: float) -> float:
        return volts / self._heater_ohm * 1000.0

    def _check(self, channel: int, volts: float) -> None:
        if volts > VFULL_V:
            raise _Reject(QontrolError.OVER_VOLTAGE, channel)
        if self._current_ma(volts) > self._imax_ma[channel] + 1e-9:
            raise _Reject(QontrolError.OVER_CURRENT, channel)

    def _edge_channel(self, port: int) -> int:
        """The heater channel of the first- or last-stage element at canonical ``port``."""
        if port <= self._size:
            return self._net.input_element(port - 1)
        return self._net.output_element(port - self._size - 1)

    async def _commit(self, changes: Mapping[int, float]) -> list[str]:
        """Apply heater ``changes`` (channel -> volts, validated): update the optics through
        one ``EmulatedOcs.apply_bulk`` (waits the settle), then the reply."""
        setpoints = list(self._setpoint_v)
        measured = list(self._measured_v)
        stuck_hit: list[int] = []
        for channel, volts in sorted(changes.items()):
            setpoints[channel] = volts
            if channel in self._stuck:
                if abs(volts - measured[channel]) > 1e-9:
                    stuck_hit.append(channel)
                continue
            measured[channel] = volts
        old_states = self._cal.states(self._measured_v)
        new_states = self._cal.states(measured)
        old_paths = benes.trace(self._size, old_states)
        new_paths = benes.trace(self._size, new_states)
        new = lit_cross_connects(self._size, new_paths)
        old = self._ocs.cross_connects
        glitched = frozenset(
            xc for xc in old & new
            if any(
                old_states[c] != new_states[c] for c in old_paths[xc.ingress - 1].channels
            )
        )
        breaks = sorted((old - new) | glitched)
        makes = sorted((new - old) | glitched)
        if makes:
            ports = sorted({p for xc in makes for p in xc.ports()})
            for status in await self._ocs.get_port_status(ports):
                if status.oper is PortOper.FAILED:
                    self._log.info("write rejected: failed port", port=status.port)
                    return [format_error(QontrolError.OUTPUT, self._edge_channel(status.port))]
        if breaks or makes:
            try:
                await self._ocs.apply_bulk(breaks, makes)
            except (HardwareFault, InvalidPort) as e:
                self._log.info("write rejected by the optics", error=str(e))
                m = re.search(r"port (\d+)", str(e))
                port = int(m.group(1)) if m else 0
                known = port in self._ocs.capabilities.port_ids()
                channel = self._edge_channel(port) if known else 0
                return [format_error(QontrolError.OUTPUT, channel)]
            except PartialApply as e:
                # EmulatedOcs.fail_make armed (control API "partial_apply"): the heaters of the
                # elements that had to change for the failed makes did not move (E05)
                stuck = sorted({
                    c
                    for x in e.result.failed
                    for c in new_paths[x.ingress - 1].channels
                    if old_states[c] != new_states[c]
                })
                for c in stuck:
                    measured[c] = self._measured_v[c]
                lit = self._lit(measured)
                current = self._ocs.cross_connects
                if lit != current:
                    await self._ocs.apply_bulk(sorted(current - lit), sorted(lit - current))
                stuck_hit = sorted(set(stuck_hit) | set(stuck))
                self._log.info("partial write", stuck=stuck)
        self._committed = self._ocs.cross_connects
        self._setpoint_v = setpoints
        self._measured_v = measured
        self.writes += 1
        self.last_rerouted = glitched
        self._log.debug(
            "heaters written", channels=len(changes), breaks=len(breaks), makes=len(makes),
            rerouted=len(glitched),
        )
        if stuck_hit and (not self._stuck_silent or not set(stuck_hit) <= self._stuck):
            return [format_error(QontrolError.OUTPUT, stuck_hit[0])]
        return ["OK"]
