"""A private MQTT broker for the demo and tests: Debian's mosquitto (``/usr/sbin/mosquitto``,
package ``mosquitto``) as a child process on a loopback port, with its config file in a
temporary directory; anonymous clients, no persistence.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
from pathlib import Path

MOSQUITTO = "/usr/sbin/mosquitto"


def mosquitto_binary() -> str | None:
    """The mosquitto broker's path (``MOSQUITTO``, else ``mosquitto`` on ``PATH``), None when
    it is not installed."""
    if Path(MOSQUITTO).is_file():
        return MOSQUITTO
    return shutil.which("mosquitto")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Mosquitto:
    """One mosquitto broker on ``127.0.0.1:port`` (a free port chosen at construction, kept
    across ``stop``/``start`` so clients reconnect to the same address). Use as an async
    context manager (started on entry, stopped on exit), or ``start``/``stop`` it.
    Raises ``FileNotFoundError`` when mosquitto is not installed."""

    host = "127.0.0.1"

    def __init__(self, binary: str | None = None) -> None:
        found = binary or mosquitto_binary()
        if found is None:
            raise FileNotFoundError(f"mosquitto not found ({MOSQUITTO}; Debian package "
                                    "mosquitto)")
        self.binary = found
        self.port = _free_port()
        self._tmp = tempfile.TemporaryDirectory(prefix="lightrail-mqtt-")
        self.config = Path(self._tmp.name) / "mosquitto.conf"
        self.log = Path(self._tmp.name) / "mosquitto.log"
        self.config.write_text(
            f"listener {self.port} {self.host}\n"
            "allow_anonymous true\n"
            "persistence false\n"
            f"log_dest file {self.log}\n"
            "log_type error\nlog_type warning\n", encoding="utf-8")
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self, timeout_s: float = 10.0) -> None:
        """Start the broker and return once it accepts connections. Raises ``RuntimeError``
        naming its log when it exits or does not listen within ``timeout_s``."""
        log = self.log.open("ab")
        try:
            self._proc = await asyncio.create_subprocess_exec(
                self.binary, "-c", str(self.config), stdin=asyncio.subprocess.DEVNULL,
                stdout=log, stderr=log)
        finally:
            log.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if self._proc.returncode is not None:
                raise RuntimeError(f"mosquitto exited with code {self._proc.returncode} "
                                   f"(log: {self.log})")
            try:
                _, writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                if loop.time() > deadline:
                    await self.stop()
                    raise RuntimeError(f"mosquitto did not listen on {self.host}:{self.port} "
                                       f"within {timeout_s} s (log: {self.log})") from None
                await asyncio.sleep(0.02)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after ``timeout_s``)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def __aenter__(self) -> Mosquitto:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        self._tmp.cleanup()
