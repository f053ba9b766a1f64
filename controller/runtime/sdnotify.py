"""systemd's service notification protocol (``sd_notify(3)``), without a library: the daemon
tells its supervisor READY / RELOADING / STOPPING, a STATUS line and the watchdog keep-alive.

The protocol (systemd's ``sd_notify(3)`` and ``systemd.service(5)`` "Type=notify"): each
notification is one datagram of newline-separated ``KEY=VALUE`` lines sent to the AF_UNIX
socket named by ``$NOTIFY_SOCKET`` (a path, or an abstract-namespace name when it starts with
``@``). ``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``, when set, naming this process) ask for
``WATCHDOG=1`` at least that often; sd_watchdog_enabled(3) advises half of it. Without
``$NOTIFY_SOCKET`` every call is a no-op, so the daemon runs the same outside systemd.

Why not a library (December 2026): ``sdnotify`` on PyPI has had no release since 2017; the
protocol is one ``sendto``. A notification that cannot be sent is logged, never raised: the
supervisor's own timeouts (``TimeoutStartSec=``, ``WatchdogSec=``) then act, which is the
loud failure systemd designs for.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Mapping

import structlog

log = structlog.get_logger(__name__)

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"
WATCHDOG_USEC_ENV = "WATCHDOG_USEC"
WATCHDOG_PID_ENV = "WATCHDOG_PID"


class SystemdNotifier:
    """Sends notifications to ``address`` (``$NOTIFY_SOCKET``'s value; None: every call is a
    no-op). ``watchdog_usec``: the supervisor's watchdog timeout in microseconds (None: no
    watchdog). Build it with ``from_environ``."""

    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self.address = address
        self.watchdog_usec = watchdog_usec
        self._sock: socket.socket | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> SystemdNotifier:
        """The notifier ``environ`` (default ``os.environ``) describes: ``$NOTIFY_SOCKET``, and
        ``$WATCHDOG_USEC`` when it is a positive integer and ``$WATCHDOG_PID`` is unset or this
        process's id (sd_watchdog_enabled(3)); anything else means no watchdog."""
        env = os.environ if environ is None else environ
        address = env.get(NOTIFY_SOCKET_ENV) or None
        usec_text = env.get(WATCHDOG_USEC_ENV, "")
        pid_text = env.get(WATCHDOG_PID_ENV, "")
        usec = int(usec_text) if usec_text.isdecimal() and int(usec_text) > 0 else None
        if pid_text and (not pid_text.isdecimal() or int(pid_text) != os.getpid()):
            usec = None
        return cls(address, usec)

    @property
    def enabled(self) -> bool:
        """True when notifications go somewhere (``$NOTIFY_SOCKET`` was set)."""
        return self.address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """How often to send ``WATCHDOG=1``, in seconds: half the watchdog timeout (None: no
        watchdog was asked for, or no socket to send it to)."""
        if self.address is None or self.watchdog_usec is None:
            return None
        return self.watchdog_usec / 2e6

    def notify(self, *lines: str) -> bool:
        """Send ``lines`` (``KEY=VALUE`` each) as one datagram. Returns True when sent, False
        when disabled or the send failed (logged as a warning, not raised)."""
        if self.address is None or not lines:
            return False
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)  # never stall the event loop on a full queue
            self._sock.sendto("\n".join(lines).encode("utf-8"), target)
        except OSError as exc:
            log.warning("sd_notify_failed", socket=self.address, lines=list(lines),
                        error=exc.strerror or repr(exc))
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """``READY=1`` (start-up or a reload finished), with a ``STATUS=`` line if given."""
        return self.notify("READY=1", *_status(status))

    def reloading(self, status: str | None = None) -> bool:
        """``RELOADING=1`` with ``MONOTONIC_USEC=`` (systemd 253+ reads it; older ones ignore
        it); follow with ``ready`` once the reload is done."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}", *_status(status))

    def stopping(self, status: str | None = None) -> bool:
        """``STOPPING=1``: the daemon is shutting down."""
        return self.notify("STOPPING=1", *_status(status))

    def status(self, status: str) -> bool:
        """A ``STATUS=`` line alone (``systemctl status`` shows it)."""
        return self.notify(*_status(status))

    def watchdog(self) -> bool:
        """One ``WATCHDOG=1`` keep-alive."""
        return self.notify("WATCHDOG=1")

    async def run_watchdog(self) -> None:
        """Send ``WATCHDOG=1`` every ``watchdog_interval_s`` from this event loop, until
        cancelled, so that a wedged loop stops the keep-alives and the supervisor restarts the
        daemon. Returns at once when no watchdog was asked for."""
        interval = self.watchdog_interval_s
        if interval is None:
            return
        while True:
            self.watchdog()
            await asyncio.sleep(interval)

    def close(self) -> None:
        """Close the socket (a later notification opens a new one)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _status(status: str | None) -> tuple[str, ...]:
    """The ``STATUS=`` line of ``status`` (one line: newlines become spaces), none for None."""
    return () if status is None else (f"STATUS={' '.join(status.splitlines())}",)


__all__ = ["SystemdNotifier"]
