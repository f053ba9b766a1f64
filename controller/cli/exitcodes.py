"""Exit codes of ``lightrail controller`` (README "Exit codes"), and the one line a failure
prints instead of a traceback (``--debug`` prints the traceback as well).

| code | meaning | what a supervisor should do |
|---|---|---|
| 0 | stopped on SIGTERM/SIGINT | nothing |
| 1 | internal error (a bug: please report it with ``--debug`` output) | restart |
| 2 | bad usage or an invalid config file (``lightrail check-config`` says why) | do not restart |
| 3 | the state store (etcd) unreachable at start | restart later |
| 4 | fenced: the leader lease was not renewed in time | restart (it rejoins as a standby) |
| 5 | a switch could not be opened or read back at start | restart later |
| 141 | the reader of the output went away (``lightrail ... \\| head``) | nothing |

The systemd unit sets ``RestartPreventExitStatus=2``: restarting cannot fix a config error.
"""

from __future__ import annotations

import enum
import traceback
from dataclasses import dataclass


class ExitCode(enum.IntEnum):
    """What ``lightrail controller`` exits with."""

    OK = 0
    INTERNAL_ERROR = 1
    CONFIG_ERROR = 2
    STORE_UNAVAILABLE = 3
    FENCED = 4
    DEVICE_UNAVAILABLE = 5


@dataclass(frozen=True, slots=True)
class Failure:
    """How the daemon ends after ``exc``: its exit code and the one line to print."""

    code: ExitCode
    message: str


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``, exception groups flattened (a ``TaskGroup`` wraps what a
    task raised), in order."""
    if isinstance(exc, BaseExceptionGroup):
        out: list[BaseException] = []
        for inner in exc.exceptions:
            out.extend(leaves(inner))
        return out
    return [exc]


def one_line(exc: BaseException) -> str:
    """``exc`` as one line: its message, or its type when it has none."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def traceback_text(exc: BaseException) -> str:
    """The full traceback of ``exc`` (for ``--debug``)."""
    return "".join(traceback.format_exception(exc))
