"""TL1 DENY error codes and what they mean as ``lightrail.drivers.base`` errors, with the two
error types only TL1 devices raise (table in ``lightrail.drivers.tl1.driver``).

Sources: Telcordia GR-833 error code names; Polatis usage where observed.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from lightrail.drivers.base import (
    AuthenticationFailed,
    CrossConnect,
    CrossConnectConflict,
    DeviceTimeout,
    DriverError,
    HardwareFault,
    InvalidPort,
)
from lightrail.drivers.tl1.wire import Tl1Response

_PORT_IN_TEXT_RE = re.compile(r"port\D{0,3}(\d+)", re.IGNORECASE)


class Tl1CommandRejected(DriverError):
    """The device denied a command for a reason that is not about ports, state or privilege
    (malformed input, a parameter it does not accept). ``code`` is the TL1 error code. Not
    retryable: the same command would be denied again."""

    def __init__(self, switch_id: str, code: str, message: str) -> None:
        super().__init__(switch_id, message)
        self.code = code


class UnsupportedOperation(DriverError):
    """The device does not support the command this call needs (DENY ``ICNV``/``IICM``), e.g. a
    Polatis model without shutters asked for ``set_port_admin``. Not retryable."""


class DenyCategory(enum.Enum):
    """What a DENY error code says, for the mapping to ``DriverError`` subclasses."""

    AUTH = "auth"
    INVALID_PORT = "invalid_port"
    CONFLICT = "conflict"
    HARDWARE = "hardware"
    BUSY = "busy"
    UNSUPPORTED = "unsupported"
    REJECTED = "rejected"


DENY_CODES: Mapping[str, DenyCategory] = MappingProxyType(
    {
        # privilege (GR-833 P*): bad login, not logged in, illegal user
        "PICC": DenyCategory.AUTH,
        "PLNA": DenyCategory.AUTH,
        "PIUI": DenyCategory.AUTH,
        "PIUC": DenyCategory.AUTH,
        "PIPW": DenyCategory.AUTH,
        # input: the access identifier / data names a port that does not exist or is misplaced
        "IIAC": DenyCategory.INVALID_PORT,
        "IDNV": DenyCategory.INVALID_PORT,
        "IDRG": DenyCategory.INVALID_PORT,
        # status: already assigned (a port in use by another patch)
        "SAAS": DenyCategory.CONFLICT,
        # status / equipment: the operation failed in the device
        "SROF": DenyCategory.HARDWARE,
        "SWFA": DenyCategory.HARDWARE,
        "SPFA": DenyCategory.HARDWARE,
        "EQWT": DenyCategory.HARDWARE,
        # status: not ready, resources busy (try again)
        "SDNR": DenyCategory.BUSY,
        "SARB": DenyCategory.BUSY,
        # the command itself is not valid here
        "ICNV": DenyCategory.UNSUPPORTED,
        "IICM": DenyCategory.UNSUPPORTED,
        # malformed input
        "IICT": DenyCategory.REJECTED,
        "IPNV": DenyCategory.REJECTED,
        "IPMS": DenyCategory.REJECTED,
        "IPEX": DenyCategory.REJECTED,
        "IBEX": DenyCategory.REJECTED,
        "IBMS": DenyCategory.REJECTED,
        "ISCH": DenyCategory.REJECTED,
        "ISPC": DenyCategory.REJECTED,
        "IITA": DenyCategory.REJECTED,
        "IISP": DenyCategory.REJECTED,
        "IISY": DenyCategory.REJECTED,
    }
)
"""DENY error code -> category; codes not listed are ``DenyCategory.REJECTED``."""


def deny_error(
    switch_id: str,
    response: Tl1Response,
    *,
    ports: Sequence[int] = (),
    wanted: Iterable[CrossConnect] = (),
    current: Iterable[CrossConnect] = (),
) -> DriverError:
    """The error for a DENY ``response`` (see the table in the module docstring).

    ``ports`` are the ports the command named (for ``InvalidPort`` when the comment names
    none); ``wanted`` the cross-connects it tried to make and ``current`` the device state read
    back after the denial (for ``CrossConnectConflict``). A conflict whose existing
    cross-connect cannot be found becomes ``Tl1CommandRejected``.
    """
    code = response.error_code or "????"
    detail = f"DENY {code}"
    if response.comments:
        detail += ": " + "; ".join(response.comments)
    category = DENY_CODES.get(code, DenyCategory.REJECTED)
    if category is DenyCategory.AUTH:
        return AuthenticationFailed(switch_id, detail)
    if category is DenyCategory.INVALID_PORT:
        port = _port_named(response.comments)
        if port is None and ports:
            port = ports[0]
        if port is None:
            return Tl1CommandRejected(switch_id, code, detail)
        return InvalidPort(switch_id, port, detail)
    if category is DenyCategory.CONFLICT:
        conflict = _find_conflict(wanted, current)
        if conflict is None:
            return Tl1CommandRejected(switch_id, code, detail)
        return CrossConnectConflict(switch_id, conflict[0], conflict[1])
    if category is DenyCategory.HARDWARE:
        return HardwareFault(switch_id, detail)
    if category is DenyCategory.BUSY:
        return DeviceTimeout(switch_id, detail)
    if category is DenyCategory.UNSUPPORTED:
        return UnsupportedOperation(switch_id, detail)
    return Tl1CommandRejected(switch_id, code, detail)


def _port_named(comments: Iterable[str]) -> int | None:
    for comment in comments:
        m = _PORT_IN_TEXT_RE.search(comment)
        if m is not None:
            return int(m[1])
    return None


def _find_conflict(
    wanted: Iterable[CrossConnect], current: Iterable[CrossConnect]
) -> tuple[CrossConnect, CrossConnect] | None:
    by_port: dict[int, CrossConnect] = {}
    for xc in current:
        by_port[xc.ingress] = xc
        by_port[xc.egress] = xc
    for xc in wanted:
        for port in xc.ports():
            existing = by_port.get(port)
            if existing is not None and existing != xc:
                return xc, existing
    return None
