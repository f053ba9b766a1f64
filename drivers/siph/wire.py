"""The Qontrol-style serial protocol of the MZI mesh's heater DAC, as the SiPh driver
(``lightrail.drivers.siph.driver``) and the emulated mesh (``lightrail.emulator.servers.mzi``)
both speak it, and the mapping between canonical ports and the mesh's network inputs/outputs.

Protocol source (Qontrol Ltd, ``qontrol`` Python library v1.1.1, github.com/takeqontrol/api,
``qontrol.py``): commands are ``[header][channel][operator][value]\\n`` with operator ``=`` (set)
or ``?`` (get); a set answers ``OK``; ``id?`` answers ``<type>-<serial>`` (e.g. ``Q8iv-0001``);
``nchan?`` the channel count; ``vall?`` one value per line per channel; ``VVEC<ch>=v0,v1,...``
sets consecutive channels from ``ch`` (the library's ``set_all_values``); errors are lines
``E<code>:<channel>`` (regex ``[A-Za-z]{1,3}(\\d+):(\\d+)``) with codes from the library's
``COMMON_ERRORS`` and ``Qx_ERRORS`` (``QontrolError``).

Ports: ingress 1..N is network input 0..N-1, egress N+1..2N is network output 0..N-1.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable

from lightrail.drivers.base import CrossConnect
from lightrail.drivers.siph import benes

CHANNELS_PER_MODULE = 8
"""Channels of one Q8iv-style module; a daisy chain has a multiple of this."""

ERROR_RE = re.compile(r"[A-Za-z]{1,3}(\d+):(\d+)")
"""An error reply line ``E<code>:<channel>`` (the ``qontrol`` library's error regex)."""
ID_RE = re.compile(r"Q\w+-[0-9A-Fa-f*]+")
"""A Qontrol device id as ``id?`` answers it, ``<type>-<serial>`` (e.g. ``Q8iv-0001``)."""
NUMBER_RE = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
"""A decimal number as a reply line carries it (``vall?``, ``lrpwr?``)."""


class QontrolError(enum.IntEnum):
    """Error codes of Qontrol modules (``qontrol.py`` ``COMMON_ERRORS`` and ``Qx_ERRORS``),
    replied as ``E<code:02d>:<channel:02d>``."""

    UNKNOWN = 0
    OVER_VOLTAGE = 1
    OVER_CURRENT = 2
    POWER = 3
    CALIBRATION = 4
    OUTPUT = 5
    UNRECOGNISED_COMMAND = 10
    UNRECOGNISED_PARAMETER = 11
    UNRECOGNISED_CHANNEL = 12
    FORBIDDEN = 13
    BUFFER_OVERFLOW = 14
    SERIAL = 15
    TIMED_OUT = 16
    TOO_MANY_ERRORS = 30
    FIRMWARE_TRAP = 31
    POWERED_UP = 90


ERROR_TEXT: dict[QontrolError, str] = {
    QontrolError.UNKNOWN: "unknown error",
    QontrolError.OVER_VOLTAGE: "over-voltage",
    QontrolError.OVER_CURRENT: "over-current",
    QontrolError.POWER: "power error",
    QontrolError.CALIBRATION: "calibration error",
    QontrolError.OUTPUT: "output error",
    QontrolError.UNRECOGNISED_COMMAND: "unrecognised command",
    QontrolError.UNRECOGNISED_PARAMETER: "unrecognised input parameter",
    QontrolError.UNRECOGNISED_CHANNEL: "unrecognised channel",
    QontrolError.FORBIDDEN: "operation forbidden",
    QontrolError.BUFFER_OVERFLOW: "serial buffer overflow",
    QontrolError.SERIAL: "serial communication error",
    QontrolError.TIMED_OUT: "command timed out",
    QontrolError.TOO_MANY_ERRORS: "too many errors",
    QontrolError.FIRMWARE_TRAP: "firmware trap",
    QontrolError.POWERED_UP: "powered up",
}


def format_error(code: QontrolError, channel: int) -> str:
    """The reply line (without newline) for error ``code`` on ``channel``, e.g. ``E02:05``."""
    return f"E{int(code):02d}:{channel:02d}"


def format_volts(volts: float) -> str:
    """A voltage as written on the wire (4 decimals, 0.1 mV)."""
    return f"{volts:.4f}"


def ingress_to_input(port: int) -> int:
    """Network input (0-based) of canonical ingress ``port`` (1..N)."""
    return port - 1


def egress_to_output(size: int, port: int) -> int:
    """Network output (0-based) of canonical egress ``port`` (N+1..2N)."""
    return port - size - 1


def path_cross_connect(size: int, path: benes.LightPath) -> CrossConnect | None:
    """The canonical cross-connect a lit light path makes (None when its light is lost)."""
    if path.output is None:
        return None
    return CrossConnect(path.input + 1, size + 1 + path.output)


def lit_cross_connects(size: int, paths: Iterable[benes.LightPath]) -> frozenset[CrossConnect]:
    """The cross-connects of every lit path in ``paths`` (canonical port ids)."""
    out: set[CrossConnect] = set()
    for p in paths:
        xc = path_cross_connect(size, p)
        if xc is not None:
            out.add(xc)
    return frozenset(out)
