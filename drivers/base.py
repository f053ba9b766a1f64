"""The device contract every switch driver implements (DESIGN.md, "Drivers").

Vocabulary: a *port* is a canonical 1-based integer. On an N x N switch, ingress ports are
1..N and egress ports N+1..2N (Polatis numbering); a *cross-connect* joins one ingress to one
egress and is directed. On a duplex switch every port is bidirectional and a cross-connect joins
two ports in both directions; it is stored with ``ingress < egress``.

A switch state is a partial permutation: no ingress appears twice and no egress appears twice.
Drivers translate canonical port ids to vendor naming at the edge.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable


class SwitchKind(enum.Enum):
    """How a switch's ports are organised."""

    NXN = "nxn"
    """Ingress 1..N, egress N+1..2N; a cross-connect is directed ingress -> egress."""
    DUPLEX = "duplex"
    """Ports 1..N are bidirectional; a cross-connect joins two ports both ways."""


class ApplyMode(enum.Enum):
    """How ``Driver.apply`` reaches the target state."""

    MINIMAL = "minimal"
    """Break only the cross-connects on the given ports that differ from the target, then make."""
    REPLACE = "replace"
    """Break every cross-connect on the given ports, then make the whole target."""


class CrossConnect(NamedTuple):
    """One cross-connect on one switch: ``ingress -> egress`` (canonical port ids, 1-based).
    Immutable and ordered by (ingress, egress). A named tuple, not a dataclass: the hot path
    hashes and compares cross-connects by the thousand per reconfiguration (set differences of
    plans against switch views), and a tuple's hash and equality run in C."""

    ingress: int
    egress: int

    def ports(self) -> tuple[int, int]:
        """Both ports this cross-connect occupies."""
        return (self.ingress, self.egress)


@dataclass(frozen=True, slots=True)
class SwitchCapabilities:
    """What a device can do, as reported by ``Driver.info``.

    ``port_count`` is N: an N x N switch has 2N port ids (1..2N), a duplex switch N (1..N).
    ``settle_time_s`` is the reconfiguration delay (delta) after a cross-connect is made until
    light passes (MEMS: milliseconds; silicon photonics: microseconds).
    ``max_batch`` is the most cross-connects one device command may carry (None: unlimited).
    """

    kind: SwitchKind
    port_count: int
    atomic_bulk: bool
    settle_time_s: float
    max_batch: int | None = None
    readback: bool = True

    def port_ids(self) -> range:
        """All canonical port ids of the switch."""
        n = self.port_count * 2 if self.kind is SwitchKind.NXN else self.port_count
        return range(1, n + 1)

    def is_ingress(self, port: int) -> bool:
        """True when ``port`` may be the ingress side of a cross-connect."""
        if self.kind is SwitchKind.NXN:
            return 1 <= port <= self.port_count
        return 1 <= port <= self.port_count

    def is_egress(self, port: int) -> bool:
        """True when ``port`` may be the egress side of a cross-connect."""
        if self.kind is SwitchKind.NXN:
            return self.port_count < port <= 2 * self.port_count
        return 1 <= port <= self.port_count


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """Identity and capabilities of a connected device."""

    switch_id: str
    vendor: str
    model: str
    firmware: str
    capabilities: SwitchCapabilities


OptionValue = str | int | float | bool
"""One value of a switch's driver options, as the config file gives it."""


@dataclass(frozen=True, slots=True)
class SwitchSpec:
    """What a driver is built from: one switch as configured (the controller converts its own
    switch record into this; drivers never see the controller's types).

    ``model`` names the driver family (``lightrail.drivers.registry``); ``capabilities`` give
    the port layout, settle time and ``max_batch`` from config; ``options`` are the driver's
    settings verbatim from config (``switches[<id>].options``), parsed by the driver's options
    model (``lightrail.drivers.options.DriverOptions``); they are left out of ``repr`` (a
    password may be among them).
    """

    switch_id: str
    model: str
    capabilities: SwitchCapabilities
    options: Mapping[str, OptionValue] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What one ``Driver.apply`` did. ``failed`` maps each cross-connect that could not be
    made or broken to the reason the device gave.

    ``verified`` is True when the driver read the device back after its writes and found
    exactly the target on every port it changed (else it raised ``VerificationMismatch``): the
    caller may take ``removed``/``added`` as confirmed by the device without reading it again.
    False when nothing was read back (nothing to do, verification switched off, or a device
    without read-back)."""

    removed: tuple[CrossConnect, ...] = ()
    added: tuple[CrossConnect, ...] = ()
    failed: Mapping[CrossConnect, str] = field(default_factory=dict)
    verified: bool = False

    @property
    def ok(self) -> bool:
        """True when nothing failed."""
        return not self.failed


class PortAdmin(enum.Enum):
    """Administrative state of a port."""

    ENABLED = "enabled"
    DISABLED = "disabled"


class PortOper(enum.Enum):
    """Operational state of a port as the device reports it."""

    UP = "up"
    DOWN = "down"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class PortStatus:
    """One port's state."""

    port: int
    admin: PortAdmin
    oper: PortOper


class AlarmSeverity(enum.Enum):
    """Severity of a device alarm (ITU-T X.733 levels used by TL1 and RESTCONF devices)."""

    CRITICAL = "critical"
    MAJOR = "major"
    MINOR = "minor"
    WARNING = "warning"
    CLEARED = "cleared"


@dataclass(frozen=True, slots=True)
class DeviceAlarm:
    """An autonomous alarm raised by a device (e.g. loss of signal on a port)."""

    switch_id: str
    port: int | None
    condition: str
    severity: AlarmSeverity
    at_s: float
    description: str = ""


# --- errors ------------------------------------------------------------------------------------


class DriverError(Exception):
    """Base of every driver error. ``retryable`` says whether the same call may succeed later."""

    retryable: bool = False

    def __init__(self, switch_id: str, message: str) -> None:
        super().__init__(f"switch {switch_id!r}: {message}")
        self.switch_id = switch_id


CommandGate = Callable[[], bool]
"""Asked right before a driver writes each command to its device (``DriverContext``): False
means the controller may not command devices now and nothing is sent (``NotLeader``)."""


def check_gate(gate: CommandGate | None, switch_id: str) -> None:
    """Raise ``NotLeader`` (nothing sent) when ``gate`` is given and refuses."""
    if gate is not None and not gate():
        raise NotLeader(switch_id, "command refused: this controller may no longer command "
                                   "devices (leader lease lost or not renewed in time)")


class DeviceUnreachable(DriverError):
    """The device did not accept a connection or the connection dropped."""

    retryable = True


class DeviceTimeout(DriverError):
    """The device did not answer within the deadline."""

    retryable = True


class AuthenticationFailed(DriverError):
    """The device rejected the credentials."""


class InvalidPort(DriverError):
    """A port id does not exist on the device or is on the wrong side (ingress/egress)."""

    def __init__(self, switch_id: str, port: int, reason: str) -> None:
        super().__init__(switch_id, f"port {port}: {reason}")
        self.port = port


class CrossConnectConflict(DriverError):
    """A cross-connect would reuse an ingress or egress port already in use."""

    def __init__(self, switch_id: str, wanted: CrossConnect, existing: CrossConnect) -> None:
        super().__init__(
            switch_id,
            f"cross-connect {wanted.ingress}->{wanted.egress} conflicts with "
            f"{existing.ingress}->{existing.egress}",
        )
        self.wanted = wanted
        self.existing = existing


class PartialApply(DriverError):
    """Some cross-connects of a bulk apply were made and some were not; ``result`` says which."""

    retryable = True

    def __init__(self, switch_id: str, result: ApplyResult) -> None:
        super().__init__(switch_id, f"partial apply: {len(result.failed)} failed")
        self.result = result


class VerificationMismatch(DriverError):
    """Read-back after apply differs from the target."""

    retryable = True

    def __init__(
        self,
        switch_id: str,
        missing: Iterable[CrossConnect],
        unexpected: Iterable[CrossConnect],
    ) -> None:
        self.missing = tuple(sorted(missing))
        self.unexpected = tuple(sorted(unexpected))
        super().__init__(
            switch_id,
            f"read-back mismatch: missing {list(self.missing)}, unexpected {list(self.unexpected)}",
        )


class HardwareFault(DriverError):
    """The device reports a hardware fault (failed port, mirror, heater, over-current)."""


class NotLeader(DriverError):
    """This controller lost its leader lease (fenced itself): it may not command devices, so
    that a new leader never races it on a switch (DESIGN.md "High availability")."""


class ProtocolError(DriverError):
    """The device answered something the driver cannot parse."""

    retryable = True


# --- the protocol ------------------------------------------------------------------------------


@runtime_checkable
class Driver(Protocol):
    """An asynchronous switch driver. All methods raise ``DriverError`` subclasses only.

    ``apply(target, ports, mode, current=...)``: make the cross-connects on ``ports`` equal
    ``target`` (every cross-connect in ``target`` must lie within ``ports``). Cross-connects on
    ports outside ``ports`` are never touched: this is how jobs on disjoint ports stay
    independent. The changes are ``minimal_diff`` of the state now and ``target``; breaks are
    issued before makes. ``current``, when given, is the state the caller holds as confirmed
    (e.g. the reconciler's view): the driver diffs against it instead of reading the device
    first; a device that differs from it shows as a refused command or a read-back mismatch.
    Where the device reads back, the driver reads back the ports it changed and raises
    ``VerificationMismatch`` when they differ from ``target`` (``ApplyResult.verified``).
    Returns what was removed and added; raises ``PartialApply`` when the device made only part
    of it.
    """

    @property
    def switch_id(self) -> str: ...

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def info(self) -> DeviceInfo: ...

    async def get_cross_connects(self) -> frozenset[CrossConnect]: ...

    async def apply(
        self,
        target: frozenset[CrossConnect],
        ports: frozenset[int],
        mode: ApplyMode = ApplyMode.MINIMAL,
        *,
        current: frozenset[CrossConnect] | None = None,
    ) -> ApplyResult: ...

    async def set_port_admin(self, port: int, admin: PortAdmin) -> None: ...

    async def get_port_status(self, ports: Iterable[int] | None = None) -> list[PortStatus]: ...

    async def get_power(self, ports: Iterable[int] | None = None) -> dict[int, float]:
        """Optical power per port in dBm."""
        ...

    def events(self) -> AsyncIterator[DeviceAlarm]: ...


def side_bounds(caps: SwitchCapabilities) -> tuple[int, int, int, int]:
    """(first, last) ingress and (first, last) egress port ids, as ``is_ingress`` /
    ``is_egress`` define them (range checks without a method call per port)."""
    n = caps.port_count
    if caps.kind is SwitchKind.NXN:
        return 1, n, n + 1, 2 * n
    return 1, n, 1, n


def check_partial_permutation(
    switch_id: str, caps: SwitchCapabilities, xcs: Iterable[CrossConnect]
) -> None:
    """Raise ``InvalidPort`` or ``CrossConnectConflict`` unless ``xcs`` is a valid partial
    permutation for a switch with ``caps``: each ingress an ingress port and each egress an
    egress port (``SwitchCapabilities.is_ingress`` / ``is_egress``), ingress < egress on a
    duplex switch, and no port used by two different cross-connects."""
    in_lo, in_hi, out_lo, out_hi = side_bounds(caps)
    duplex = caps.kind is SwitchKind.DUPLEX
    by_port: dict[int, CrossConnect] = {}
    get = by_port.get
    for xc in xcs:
        ingress, egress = xc.ingress, xc.egress
        if not in_lo <= ingress <= in_hi:
            raise InvalidPort(switch_id, ingress, "not an ingress port")
        if not out_lo <= egress <= out_hi:
            raise InvalidPort(switch_id, egress, "not an egress port")
        if duplex and ingress >= egress:
            raise InvalidPort(switch_id, ingress, "duplex cross-connect needs ingress < egress")
        other = get(ingress)
        if other is None:
            other = get(egress)
        if other is not None and other != xc:
            raise CrossConnectConflict(switch_id, xc, other)
        by_port[ingress] = xc
        by_port[egress] = xc


def check_apply_request(
    switch_id: str,
    caps: SwitchCapabilities,
    target: Iterable[CrossConnect],
    ports: Iterable[int],
) -> None:
    """Validate an ``apply(target, ports)`` request before any device command: every port
    exists, every target cross-connect lies within ``ports``, and ``target`` is a partial
    permutation. Raises ``InvalidPort`` or ``CrossConnectConflict``."""
    scope = frozenset(ports)
    if scope:
        valid = caps.port_ids()
        if min(scope) < valid.start or max(scope) >= valid.stop:
            bad = min(p for p in scope if p not in valid)
            raise InvalidPort(switch_id, bad, "no such port")
    targets = tuple(target)
    for xc in targets:
        if xc.ingress not in scope or xc.egress not in scope:
            port = xc.ingress if xc.ingress not in scope else xc.egress
            raise InvalidPort(
                switch_id, port,
                f"target cross-connect {xc.ingress}->{xc.egress} leaves the ports given",
            )
    check_partial_permutation(switch_id, caps, targets)


def cross_connects_on_ports(
    switch_id: str, xcs: Iterable[CrossConnect], ports: frozenset[int]
) -> frozenset[CrossConnect]:
    """The cross-connects among ``xcs`` that lie on ``ports`` (what an apply restricted to
    ``ports`` may break). Raises ``InvalidPort`` for one joining a port in ``ports`` to one
    outside them: breaking it would touch a port the caller does not own."""
    out: set[CrossConnect] = set()
    for xc in xcs:
        inside_in = xc.ingress in ports
        inside_out = xc.egress in ports
        if inside_in != inside_out:
            outside = xc.egress if inside_in else xc.ingress
            raise InvalidPort(
                switch_id, outside,
                f"cross-connect {xc.ingress}->{xc.egress} on the ports given also uses "
                f"port {outside} outside them",
            )
        if inside_in:
            out.add(xc)
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class CrossConnectDiff:
    """What an apply restricted to some ports must do, from ``minimal_diff``: ``breaks``, then
    ``makes`` (each sorted by ingress, then egress), while the cross-connects in ``unchanged``
    stay as they are (on those ports, already in the target)."""

    breaks: tuple[CrossConnect, ...]
    makes: tuple[CrossConnect, ...]
    unchanged: frozenset[CrossConnect]

    @property
    def empty(self) -> bool:
        """True when nothing has to be broken or made (no device command is needed)."""
        return not self.breaks and not self.makes

    def changed_ports(self) -> frozenset[int]:
        """Every port a break or a make uses: the ports a read-back after the apply checks.
        No cross-connect in ``unchanged`` uses one of them (both states are partial
        permutations)."""
        return frozenset().union(*self.breaks, *self.makes)


def minimal_diff(
    switch_id: str,
    current: Iterable[CrossConnect],
    target: frozenset[CrossConnect],
    ports: frozenset[int],
    mode: ApplyMode = ApplyMode.MINIMAL,
) -> CrossConnectDiff:
    """The changes that make the cross-connects on ``ports`` equal ``target`` (DESIGN.md,
    "Reconfiguration": minimal diff per switch, break only what must change, then make).

    ``current`` is the switch's state (all of it, or at least every cross-connect touching
    ``ports``); only the cross-connects on ``ports`` are considered, so nothing outside them is
    ever broken. MINIMAL breaks the ones not in ``target`` and makes the missing ones; REPLACE
    breaks every one and makes the whole target. ``target`` must lie within ``ports``
    (``check_apply_request``). Raises ``InvalidPort`` for a current cross-connect joining a
    port in ``ports`` to one outside them (``cross_connects_on_ports``)."""
    on_ports = cross_connects_on_ports(switch_id, current, ports)
    if mode is ApplyMode.MINIMAL:
        return CrossConnectDiff(
            breaks=tuple(sorted(on_ports - target)),
            makes=tuple(sorted(target - on_ports)),
            unchanged=on_ports & target,
        )
    return CrossConnectDiff(
        breaks=tuple(sorted(on_ports)), makes=tuple(sorted(target)), unchanged=frozenset()
    )


def check_read_back(
    switch_id: str,
    target: Iterable[CrossConnect],
    ports: frozenset[int],
    read: Iterable[CrossConnect],
) -> None:
    """Verify a read-back after an apply: the cross-connects in ``read`` that touch ``ports``
    (usually ``CrossConnectDiff.changed_ports``) must be exactly those of ``target`` that touch
    them. Raises ``VerificationMismatch`` naming the missing and the unexpected ones (one that
    also uses a port outside ``ports`` counts as unexpected)."""

    def touching(xcs: Iterable[CrossConnect]) -> frozenset[CrossConnect]:
        return frozenset([xc for xc in xcs if xc.ingress in ports or xc.egress in ports])

    expected = touching(target)
    actual = touching(read)
    if actual != expected:
        raise VerificationMismatch(switch_id, expected - actual, actual - expected)
