"""An in-memory optical circuit switch (OCS) for unit tests and the in-process demo.

``EmulatedOcs`` models one switch: its capabilities (N x N with Polatis numbering, ingress
1..N and egress N+1..2N, or duplex with ports 1..N), its state as a partial permutation of
cross-connects (``lightrail.drivers.base.check_partial_permutation``), the reconfiguration delay
(``SwitchCapabilities.settle_time_s``), per-port optical power in dBm, alarms and fault
injection. It does not speak a wire protocol; ``lightrail.emulator.driver.EmulatedDriver`` calls it
in-process. ``EmulatedFabricDevices`` keeps the devices of a fabric by switch id so their state
outlives any driver or controller instance.

Timing of one bulk command (``apply_bulk``): breaks take effect when issued (light stops at
once), then every make is issued and the whole batch settles once; a make takes effect (light
passes) when the settle ends. Every change is recorded in ``change_log`` with the time it took
effect, read from the injectable ``clock``; waiting goes through the injectable ``sleep`` so
tests can run on a manual clock.
"""

from __future__ import annotations

import asyncio
import enum
import time
from array import array
from collections.abc import (
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple

import structlog

from lightrail.drivers.alarm_stream import AlarmStream
from lightrail.drivers.base import (
    AlarmSeverity,
    ApplyResult,
    CrossConnect,
    CrossConnectConflict,
    DeviceAlarm,
    DeviceInfo,
    DeviceUnreachable,
    DriverError,
    HardwareFault,
    InvalidPort,
    PartialApply,
    PortAdmin,
    PortOper,
    PortStatus,
    SwitchCapabilities,
    SwitchKind,
    check_partial_permutation,
    side_bounds,
)
from lightrail.drivers.timing import Clock, Sleep

CONNECTED_POWER_DBM = -3.0
"""Optical power reported on both ports of a settled, lit cross-connect, in dBm."""
NO_LIGHT_DBM = -40.0
"""Power floor reported on a dark port ("no light"), in dBm."""

_ALARM_QUEUE_SIZE = 1024

_log = structlog.get_logger(__name__)


class ChangeAction(enum.Enum):
    """What happened to a cross-connect."""

    MAKE = "make"
    BREAK = "break"


class ChangeRecord(NamedTuple):
    """One cross-connect change on one switch, stamped with the time ``at_s`` (device clock,
    seconds) it took effect: a break when issued, a make when its settle ended. ``commanded``
    is False for a change the device made on its own (a reboot that loses its cross-connects),
    which no controller command caused. ``ChangeLog`` keeps changes as columns and builds
    these when the log is read."""

    at_s: float
    switch_id: str
    action: ChangeAction
    cross_connect: CrossConnect
    commanded: bool = True


_MAKE = 1
_COMMANDED = 2


class ChangeLog:
    """The last ``capacity`` changes of switch ``switch_id``, oldest first: what the e2e and
    invariant tests read to check the safety invariant (no cross-connect a holder uses was
    broken; every admission came after its makes), one entry per cross-connect of every
    reconfiguration of a long-running emulated fabric. Kept as columns, not record objects:
    17 bytes per change (a double, two 32-bit port ids, a byte of flags) against about 110 for
    a ``ChangeRecord`` and its float in a deque. Appends are O(1) per change: the columns grow
    until they hold ``capacity`` entries, then the oldest entry is overwritten (a ring).
    Raises ``ValueError`` for ``capacity`` < 1."""

    __slots__ = ("_at", "_capacity", "_egress", "_flags", "_head", "_ingress", "_switch_id")

    def __init__(self, switch_id: str, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"max_changes: must be >= 1, got {capacity}")
        self._switch_id = switch_id
        self._capacity = capacity
        self._at = array("d")
        self._ingress = array("I")
        self._egress = array("I")
        self._flags = array("B")
        self._head = 0  # once full: the index of the oldest entry

    def __len__(self) -> int:
        return len(self._at)

    def record(self, at_s: float, action: ChangeAction, cross_connects: Sequence[CrossConnect],
               commanded: bool = True) -> None:
        """Append one change of ``action`` at ``at_s`` per cross-connect, in order."""
        n = len(cross_connects)
        if not n:
            return
        flags = (_MAKE if action is ChangeAction.MAKE else 0) | (_COMMANDED if commanded else 0)
        room = self._capacity - len(self._at)
        if n <= room:  # the usual case until the log is full: four extends in C
            self._at.extend(repeat(at_s, n))
            self._ingress.extend([xc.ingress for xc in cross_connects])
            self._egress.extend([xc.egress for xc in cross_connects])
            self._flags.extend(repeat(flags, n))
            return
        if room:
            self.record(at_s, action, cross_connects[:room], commanded)
            cross_connects = cross_connects[room:]
        at, ingress, egress, flag_col = self._at, self._ingress, self._egress, self._flags
        head, capacity = self._head, self._capacity
        for xc in cross_connects[-capacity:]:  # full: overwrite the oldest, one by one
            at[head], ingress[head], egress[head], flag_col[head] = (
                at_s, xc.ingress, xc.egress, flags)
            head = head + 1 if head + 1 < capacity else 0
        self._head = head

    def records(self) -> list[ChangeRecord]:
        """The changes kept, oldest first, as ``ChangeRecord``s (new objects per call)."""
        at, ingress, egress, flag_col = self._at, self._ingress, self._egress, self._flags
        sid, make, brk = self._switch_id, ChangeAction.MAKE, ChangeAction.BREAK
        order = range(len(at)) if not self._head else (
            *range(self._head, len(at)), *range(self._head))
        return [ChangeRecord(at[i], sid, make if flag_col[i] & _MAKE else brk,
                             CrossConnect(ingress[i], egress[i]), bool(flag_col[i] & _COMMANDED))
                for i in order]

    def clear(self) -> None:
        """Forget every change."""
        for column in (self._at, self._ingress, self._egress, self._flags):
            del column[:]
        self._head = 0


class DenialKind(enum.Enum):
    """Which error a denied port raises when a make uses it."""

    HARDWARE_FAULT = "hardware_fault"
    INVALID_PORT = "invalid_port"


@dataclass(frozen=True, slots=True)
class _Denial:
    kind: DenialKind
    reason: str


@dataclass(frozen=True, slots=True)
class _MakeFailure:
    nth: int
    reason: str


AlarmSubscription = AlarmStream
"""Alarms of one device from the moment of subscription (``lightrail.drivers.alarm_stream``)."""


MAX_CHANGES = 1_000_000
"""Changes an ``EmulatedOcs`` keeps in its change log by default (about 17 MB at most:
``ChangeLog``)."""


class EmulatedOcs:
    """One emulated optical circuit switch.

    ``capabilities`` gives the port layout and the reconfiguration delay (``settle_time_s``);
    ``cross_connects`` is the state at power-on (validated, not recorded in the change log).

    Device commands (``info``, ``get_cross_connects``, ``apply_bulk``, ``set_port_admin``,
    ``get_port_status``, ``get_power``) are coroutines that honour the injected faults: they
    raise ``DeviceUnreachable`` while the device is unreachable or rebooting, never answer while
    it is partitioned (``set_partitioned``), and wait the extra delay of a slow device first.
    Bulk commands run one at a time. Fault controls and the inspection properties
    (``cross_connects``, ``change_log``, ``command_count``) are plain methods that never fail.
    """

    def __init__(
        self,
        switch_id: str,
        capabilities: SwitchCapabilities,
        *,
        cross_connects: Iterable[CrossConnect] = (),
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        connected_power_dbm: float = CONNECTED_POWER_DBM,
        vendor: str = "Lightrail",
        model: str = "emulated-ocs",
        firmware: str = "1.0",
        max_changes: int = MAX_CHANGES,
    ) -> None:
        initial = frozenset(cross_connects)
        check_partial_permutation(switch_id, capabilities, initial)
        self._info = DeviceInfo(switch_id, vendor, model, firmware, capabilities)
        self._caps = capabilities
        self._sides = side_bounds(capabilities)
        self._ports = capabilities.port_ids()
        self._clock = clock
        self._sleep = sleep
        self._connected_power_dbm = connected_power_dbm
        self._log = _log.bind(switch=switch_id)
        self._by_port: dict[int, CrossConnect] = {}
        for xc in initial:
            self._by_port[xc.ingress] = xc
            self._by_port[xc.egress] = xc
        self._xcs: set[CrossConnect] = set(initial)
        self._settling: dict[CrossConnect, float] = {}
        # bounded: a long-running emulated fabric must not grow without limit
        self._changes = ChangeLog(switch_id, max_changes)
        self._admin: dict[int, PortAdmin] = {}
        self._failed: dict[int, str] = {}
        self._subscribers: set[AlarmSubscription] = set()
        self._lock = asyncio.Lock()
        self._commands = 0
        self._writes = 0
        # faults
        self._unreachable = False
        self._rebooting = False
        # set while the device answers (no silent partition); partitioned commands wait on it
        self._answering = asyncio.Event()
        self._answering.set()
        self._drop_calls = 0
        self._extra_delay_s = 0.0
        self._denied: dict[int, _Denial] = {}
        self._make_failure: _MakeFailure | None = None
        self._silent_ports: set[int] = set()

    # --- inspection ----------------------------------------------------------------------------

    @property
    def switch_id(self) -> str:
        """The switch id this device answers to."""
        return self._info.switch_id

    @property
    def capabilities(self) -> SwitchCapabilities:
        """The device's capabilities."""
        return self._caps

    @property
    def cross_connects(self) -> frozenset[CrossConnect]:
        """The configured cross-connects now (settling ones included); never fails."""
        return frozenset(self._xcs)

    @property
    def change_log(self) -> list[ChangeRecord]:
        """The changes since power-on (or ``clear_change_log``), oldest first (a copy): the
        last ``max_changes`` of them."""
        return self._changes.records()

    @property
    def command_count(self) -> int:
        """Device commands received, failed ones included."""
        return self._commands

    @property
    def write_count(self) -> int:
        """Bulk apply commands received (``apply_bulk``), refused ones included."""
        return self._writes

    def clear_change_log(self) -> None:
        """Forget the recorded changes."""
        self._changes.clear()

    # --- fault injection -----------------------------------------------------------------------

    def set_unreachable(self, unreachable: bool) -> None:
        """While set, every device command raises ``DeviceUnreachable``."""
        self._unreachable = unreachable

    def set_partitioned(self, partitioned: bool) -> None:
        """A silent partition: while set, every device command waits without an answer and the
        front ends keep their connections open, as a device behind a network that drops its
        packets (the common failure on a real network, unlike a refused or closed connection:
        the client sees only its own timeout, ``DeviceTimeout``). When the partition ends, the
        waiting commands fail with ``DeviceUnreachable`` (their answers are lost) and later
        commands are answered again."""
        if partitioned:
            self._answering.clear()
        else:
            self._answering.set()

    @property
    def partitioned(self) -> bool:
        """True during a silent partition (``set_partitioned``)."""
        return not self._answering.is_set()

    async def until_answering(self) -> None:
        """Return once no silent partition is in force (at once when none is). Protocol front
        ends wait on it with each request that arrives during a partition and then drop the
        request unanswered, so the device answers nothing, not even a login."""
        await self._answering.wait()

    def drop_next_calls(self, count: int) -> None:
        """The next ``count`` device commands raise ``DeviceUnreachable`` (a transient fault)."""
        if count < 0:
            raise ValueError(f"drop_next_calls: count must be >= 0, got {count}")
        self._drop_calls = count

    def set_extra_delay(self, delay_s: float) -> None:
        """Every device command first waits ``delay_s`` seconds (a slow device)."""
        if delay_s < 0:
            raise ValueError(f"set_extra_delay: delay_s must be >= 0, got {delay_s}")
        self._extra_delay_s = delay_s

    def deny_port(
        self, port: int, kind: DenialKind = DenialKind.HARDWARE_FAULT, reason: str = "denied"
    ) -> None:
        """A bulk command making a cross-connect on ``port`` is rejected as a whole (nothing
        changes) with ``HardwareFault`` or ``InvalidPort`` carrying ``reason``."""
        self._check_port(port)
        self._denied[port] = _Denial(kind, reason)

    def allow_port(self, port: int) -> None:
        """Undo ``deny_port``."""
        self._denied.pop(port, None)

    def fail_make(self, nth: int, reason: str = "mirror did not latch") -> None:
        """In the next bulk command with at least ``nth`` makes, the ``nth`` make (1-based, in
        issue order) fails: the breaks and the makes before it take effect, it and the makes
        after it do not (the device stops at the first failure), and the command raises
        ``PartialApply`` whose result says so. One-shot."""
        if nth < 1:
            raise ValueError(f"fail_make: nth is 1-based, got {nth}")
        self._make_failure = _MakeFailure(nth, reason)

    def drop_makes_silently(self, port: int) -> None:
        """Makes on ``port`` are acknowledged but never take effect (a device that lies; only a
        read-back shows it)."""
        self._check_port(port)
        self._silent_ports.add(port)

    def fail_port(self, port: int, condition: str = "LOS") -> None:
        """Mark ``port`` failed: it goes dark (and so does its cross-connect), makes on it raise
        ``HardwareFault``, and a MAJOR alarm with ``condition`` is raised."""
        self._check_port(port)
        self._failed[port] = condition
        self._raise_alarm(port, condition, AlarmSeverity.MAJOR, f"port {port} failed")

    def repair_port(self, port: int) -> None:
        """Undo ``fail_port``; raises a CLEARED alarm."""
        condition = self._failed.pop(port, None)
        if condition is not None:
            self._raise_alarm(port, condition, AlarmSeverity.CLEARED, f"port {port} repaired")

    def clear_faults(self) -> None:
        """Remove every injected fault (failed ports are repaired with a CLEARED alarm)."""
        self._unreachable = False
        self._answering.set()
        self._drop_calls = 0
        self._extra_delay_s = 0.0
        self._denied.clear()
        self._make_failure = None
        self._silent_ports.clear()
        for port in sorted(self._failed):
            self.repair_port(port)

    async def reboot(self, *, keep_cross_connects: bool, down_s: float = 0.0) -> None:
        """Reboot: waits for a running command, then the device is unreachable for ``down_s``
        seconds. Cross-connects survive only with ``keep_cross_connects`` (latching MEMS);
        otherwise each is broken (and logged) when the reboot starts. Raises a WARNING alarm
        ``REBOOT`` at the start and a CLEARED one when the device is back."""
        async with self._lock:
            self._rebooting = True
            try:
                self._raise_alarm(None, "REBOOT", AlarmSeverity.WARNING, "device rebooting")
                self._settling.clear()
                if not keep_cross_connects:
                    now = self._clock()
                    self._break_all(sorted(self._xcs), now, commanded=False)
                await self._sleep(down_s)
            finally:
                self._rebooting = False
            self._raise_alarm(None, "REBOOT", AlarmSeverity.CLEARED, "device up")

    # --- alarms --------------------------------------------------------------------------------

    def alarms(self) -> AlarmSubscription:
        """Subscribe to this device's alarms from now on."""
        sub = AlarmStream(self._unsubscribe, _ALARM_QUEUE_SIZE)
        self._subscribers.add(sub)
        return sub

    def _unsubscribe(self, sub: AlarmSubscription) -> None:
        self._subscribers.discard(sub)

    def _raise_alarm(
        self, port: int | None, condition: str, severity: AlarmSeverity, description: str
    ) -> None:
        alarm = DeviceAlarm(
            self.switch_id, port, condition, severity, self._clock(), description
        )
        self._log.info(
            "alarm", port=port, condition=condition, severity=severity.value
        )
        for sub in self._subscribers:
            sub.offer(alarm)

    # --- device commands -----------------------------------------------------------------------

    async def info(self) -> DeviceInfo:
        """Identity and capabilities. Raises ``DeviceUnreachable``."""
        await self._enter()
        return self._info

    async def get_cross_connects(self) -> frozenset[CrossConnect]:
        """The configured cross-connects (read-back). Raises ``DeviceUnreachable``."""
        await self._enter()
        return frozenset(self._xcs)

    async def get_cross_connects_on(self, ports: Iterable[int]) -> frozenset[CrossConnect]:
        """The configured cross-connects that use any of ``ports`` (a read-back of those ports,
        one command). Raises ``DeviceUnreachable``."""
        if not self._answers_at_once():
            await self._enter_with_faults()
        by_port = self._by_port
        return frozenset([xc for p in ports if (xc := by_port.get(p)) is not None])

    async def apply_bulk(
        self, breaks: Sequence[CrossConnect], makes: Sequence[CrossConnect]
    ) -> ApplyResult:
        """One bulk command: break every cross-connect of ``breaks`` (each must exist), then
        make every one of ``makes`` in order, then wait one settle (``settle_time_s``, only when
        something is made).

        The batch is validated first and rejected as a whole, nothing changed, with
        ``InvalidPort`` (unknown port, wrong side, duplex ingress >= egress, a break that does
        not exist, a port denied as INVALID_PORT), ``CrossConnectConflict`` (a make reuses a
        port that stays or becomes used), ``HardwareFault`` (failed port, port denied as
        HARDWARE_FAULT) or ``DriverError`` (more than ``max_batch`` entries). Raises
        ``PartialApply`` when ``fail_make`` is armed; ``DeviceUnreachable`` while unreachable.
        """
        if not self._answers_at_once():
            await self._enter_with_faults()
        self._writes += 1
        if self._caps.settle_time_s == 0 and not self._lock.locked():
            # Nothing below suspends (no settle wait): the command runs to its end before any
            # other starts, as under the lock, without the lock's acquire and release.
            return self._apply_at_once(breaks, makes)
        async with self._lock:
            return await self._apply_settled(breaks, makes)

    def _apply_at_once(
        self, breaks: Sequence[CrossConnect], makes: Sequence[CrossConnect]
    ) -> ApplyResult:
        """``apply_bulk`` on a switch without a settle time: light passes as soon as a
        cross-connect is made (its change is stamped with the clock read after the makes)."""
        self._validate(breaks, makes)
        self._break_all(breaks, self._clock())
        made, effective, failed = self._make_all(makes, None)
        if effective:
            self._record_makes(effective, self._clock())
        return self._apply_result(breaks, made, failed)

    async def _apply_settled(
        self, breaks: Sequence[CrossConnect], makes: Sequence[CrossConnect]
    ) -> ApplyResult:
        """``apply_bulk`` under the lock: the breaks, the makes, then one settle wait (the
        makes stay dark until it ends)."""
        self._validate(breaks, makes)
        now = self._clock()
        self._break_all(breaks, now)
        deadline_s = now + self._caps.settle_time_s
        made, effective, failed = self._make_all(makes, deadline_s)
        if made:
            await self._settle(effective, deadline_s)
        return self._apply_result(breaks, made, failed)

    def _break_all(self, breaks: Sequence[CrossConnect], now_s: float, *,
                   commanded: bool = True) -> None:
        """Break the existing cross-connects ``breaks``, each logged at ``now_s``
        (``commanded``: False for the device's own, a reboot's)."""
        xcs, by_port, settling = self._xcs, self._by_port, self._settling
        for xc in breaks:
            xcs.discard(xc)
            if settling:
                settling.pop(xc, None)
            if by_port.get(xc.ingress) == xc:
                del by_port[xc.ingress]
            if by_port.get(xc.egress) == xc:
                del by_port[xc.egress]
        self._changes.record(now_s, ChangeAction.BREAK, breaks, commanded)

    def _make_all(
        self, makes: Sequence[CrossConnect], dark_until_s: float | None
    ) -> tuple[list[CrossConnect], list[CrossConnect], dict[CrossConnect, str]]:
        """Make the validated ``makes`` in order: (acknowledged, acknowledged and real,
        failed with why). An armed ``fail_make`` fails its make and every later one; a make on
        a silent port is acknowledged but not made. ``dark_until_s``: the settle deadline
        (device clock, s) until which the made cross-connects pass no light (None: none)."""
        failure = self._make_failure
        if failure is not None and len(makes) >= failure.nth:
            self._make_failure = None
        else:
            failure = None
        failed: dict[CrossConnect, str] = {}
        if failure is None and not self._silent_ports:  # the usual case: all of them
            made = effective = list(makes)
        else:
            made, effective = [], []
            silent = self._silent_ports
            for i, xc in enumerate(makes, start=1):
                if failure is not None and i >= failure.nth:
                    failed[xc] = (
                        failure.reason
                        if i == failure.nth
                        else f"not attempted: make #{failure.nth} failed"
                    )
                    continue
                made.append(xc)
                if xc.ingress not in silent and xc.egress not in silent:
                    effective.append(xc)
        xcs, by_port, settling = self._xcs, self._by_port, self._settling
        for xc in effective:
            xcs.add(xc)
            by_port[xc.ingress] = xc
            by_port[xc.egress] = xc
            if dark_until_s is not None:
                settling[xc] = dark_until_s
        return made, effective, failed

    def _record_makes(self, made: list[CrossConnect], at_s: float) -> None:
        """Log ``made`` as made at ``at_s`` (when light passes) and end their settling."""
        settling = self._settling
        if settling:
            for xc in made:
                settling.pop(xc, None)
        self._changes.record(at_s, ChangeAction.MAKE, made)

    def _apply_result(self, breaks: Sequence[CrossConnect], made: list[CrossConnect],
                      failed: dict[CrossConnect, str]) -> ApplyResult:
        """The command's answer; raises ``PartialApply`` carrying it when a make failed."""
        result = ApplyResult(removed=tuple(breaks), added=tuple(made), failed=failed)
        self._log.debug("applied", breaks=len(breaks), makes=len(made), failed=len(failed))
        if failed:
            raise PartialApply(self.switch_id, result)
        return result

    async def set_port_admin(self, port: int, admin: PortAdmin) -> None:
        """Enable or disable a port; a disabled port is dark. Raises ``InvalidPort``,
        ``DeviceUnreachable``."""
        await self._enter()
        self._check_port(port)
        self._admin[port] = admin

    async def get_port_status(self, ports: Iterable[int] | None = None) -> list[PortStatus]:
        """Status of ``ports`` (default: all) in the order given. ``oper`` is FAILED on a failed
        port, UP when light passes through its cross-connect, DOWN otherwise. Raises
        ``InvalidPort``, ``DeviceUnreachable``."""
        await self._enter()
        out: list[PortStatus] = []
        for port in self._ports if ports is None else ports:
            self._check_port(port)
            if port in self._failed:
                oper = PortOper.FAILED
            elif self._port_lit(port):
                oper = PortOper.UP
            else:
                oper = PortOper.DOWN
            out.append(PortStatus(port, self._admin.get(port, PortAdmin.ENABLED), oper))
        return out

    async def get_power(self, ports: Iterable[int] | None = None) -> dict[int, float]:
        """Optical power in dBm of ``ports`` (default: all): ``connected_power_dbm`` while light
        passes through the port's cross-connect (settled, both ports enabled and not failed),
        ``NO_LIGHT_DBM`` otherwise (unconnected, switching, disabled or failed). Raises
        ``InvalidPort``, ``DeviceUnreachable``."""
        await self._enter()
        out: dict[int, float] = {}
        for port in self._ports if ports is None else ports:
            self._check_port(port)
            out[port] = self._connected_power_dbm if self._port_lit(port) else NO_LIGHT_DBM
        return out

    # --- internals -----------------------------------------------------------------------------

    def _answers_at_once(self) -> bool:
        """Count a command and return True when no emulated fault touches it (the usual
        case: the hot commands go on without awaiting a coroutine); False when
        ``_enter_with_faults`` must answer it (and count it)."""
        if (self._unreachable or self._rebooting or self._drop_calls or self._extra_delay_s
                or not self._answering.is_set()):
            return False
        self._commands += 1
        return True

    async def _enter(self) -> None:
        """Every device command starts here: answered at once, or as the armed faults say."""
        if not self._answers_at_once():
            await self._enter_with_faults()

    async def _enter_with_faults(self) -> None:
        self._commands += 1
        if not self._answering.is_set():
            await self._answering.wait()
            raise DeviceUnreachable(
                self.switch_id, "no answer during a silent partition (emulated fault)"
            )
        if self._unreachable or self._rebooting:
            raise DeviceUnreachable(self.switch_id, "no answer (emulated fault)")
        if self._drop_calls:
            self._drop_calls -= 1
            raise DeviceUnreachable(self.switch_id, "connection dropped (emulated fault)")
        if self._extra_delay_s:
            await self._sleep(self._extra_delay_s)

    def _check_port(self, port: int) -> None:
        if port not in self._ports:
            raise InvalidPort(self.switch_id, port, "no such port")

    def _validate(self, breaks: Sequence[CrossConnect], makes: Sequence[CrossConnect]) -> None:
        sid = self.switch_id
        caps = self._caps
        limit = caps.max_batch
        if limit is not None and len(breaks) + len(makes) > limit:
            raise DriverError(
                sid, f"batch of {len(breaks) + len(makes)} exceeds max_batch {limit}"
            )
        # The ports' state after the breaks and the makes so far, as an overlay on the port
        # map (None: freed): O(batch), not O(switch).
        occupied: dict[int, CrossConnect | None] = {}
        by_port = self._by_port
        for xc in breaks:
            if occupied.get(xc.ingress, by_port.get(xc.ingress)) != xc:
                raise InvalidPort(
                    sid, xc.ingress, f"no cross-connect {xc.ingress}->{xc.egress} to break"
                )
            occupied[xc.ingress] = None
            occupied[xc.egress] = None
        denied, failed = self._denied, self._failed
        faults = bool(denied or failed)  # the usual case has none: no lookups per port
        duplex = caps.kind is SwitchKind.DUPLEX
        in_lo, in_hi, out_lo, out_hi = self._sides
        for xc in makes:
            if not in_lo <= xc.ingress <= in_hi:
                raise InvalidPort(sid, xc.ingress, "not an ingress port")
            if not out_lo <= xc.egress <= out_hi:
                raise InvalidPort(sid, xc.egress, "not an egress port")
            if duplex and xc.ingress >= xc.egress:
                raise InvalidPort(sid, xc.ingress, "duplex cross-connect needs ingress < egress")
            for port in xc:
                if faults:
                    self._check_faults(port)
                other = occupied[port] if port in occupied else by_port.get(port)
                if other is not None:
                    raise CrossConnectConflict(sid, xc, other)
                occupied[port] = xc

    def _check_faults(self, port: int) -> None:
        """Raise what the device answers for a make on a denied or failed ``port``."""
        denial = self._denied.get(port)
        if denial is not None:
            if denial.kind is DenialKind.INVALID_PORT:
                raise InvalidPort(self.switch_id, port, denial.reason)
            raise HardwareFault(self.switch_id, f"port {port}: {denial.reason}")
        condition = self._failed.get(port)
        if condition is not None:
            raise HardwareFault(self.switch_id, f"port {port} failed ({condition})")

    async def _settle(self, made: list[CrossConnect], deadline_s: float) -> None:
        """Wait the settle time, then record the makes at the time light passes. When the wait
        is cancelled the mirrors still move: the makes are recorded at ``deadline_s`` and stay
        dark (``_settling``) until the clock reaches it."""
        try:
            if self._caps.settle_time_s > 0:  # no loop round trip for an instant switch
                await self._sleep(self._caps.settle_time_s)
        except BaseException:
            self._changes.record(deadline_s, ChangeAction.MAKE, made)
            raise
        self._record_makes(made, max(self._clock(), deadline_s))

    def _port_lit(self, port: int) -> bool:
        xc = self._by_port.get(port)
        if xc is None:
            return False
        deadline_s = self._settling.get(xc)
        if deadline_s is not None:
            if self._clock() < deadline_s:
                return False
            del self._settling[xc]
        for p in xc.ports():
            if p in self._failed or self._admin.get(p, PortAdmin.ENABLED) is PortAdmin.DISABLED:
                return False
        return True


class EmulatedFabricDevices(Mapping[str, EmulatedOcs]):
    """The emulated devices of a fabric by switch id. Outlives drivers and controllers, so a
    controller restarted in a test reconnects to the same devices and finds their state.

    New devices created by ``ensure`` share the registry's ``clock`` and ``sleep``.
    """

    def __init__(self, *, clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep) -> None:
        self._clock = clock
        self._sleep = sleep
        self._devices: dict[str, EmulatedOcs] = {}

    def __getitem__(self, switch_id: str) -> EmulatedOcs:
        return self._devices[switch_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._devices)

    def __len__(self) -> int:
        return len(self._devices)

    def add(self, device: EmulatedOcs) -> EmulatedOcs:
        """Register ``device``; raises ``ValueError`` when its switch id is taken."""
        if device.switch_id in self._devices:
            raise ValueError(f"emulated device {device.switch_id!r} already registered")
        self._devices[device.switch_id] = device
        return device

    def ensure(self, switch_id: str, capabilities: SwitchCapabilities) -> EmulatedOcs:
        """The device ``switch_id``, created empty with ``capabilities`` when missing. Raises
        ``ValueError`` when an existing device has other capabilities."""
        device = self._devices.get(switch_id)
        if device is None:
            device = EmulatedOcs(switch_id, capabilities, clock=self._clock, sleep=self._sleep)
            self._devices[switch_id] = device
        elif device.capabilities != capabilities:
            raise ValueError(
                f"emulated device {switch_id!r} has capabilities {device.capabilities}, "
                f"not {capabilities}"
            )
        return device
