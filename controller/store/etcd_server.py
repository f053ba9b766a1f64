"""A single-member etcd run as a child process, for tests, the demo and development.

``EmbeddedEtcd`` starts the ``etcd`` binary (etcd v3.4+, Debian package ``etcd-server``) in a
temporary data directory on free 127.0.0.1 ports (client and peer), waits until it answers a
client read, and can stop (SIGTERM, then SIGKILL after a timeout), kill (SIGKILL) and restart it
on the same ports with the same data (so revisions, keys and leases survive a restart, as on a
real member restart). Production runs a real etcd cluster instead (DESIGN.md, "High
availability").
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import structlog

from lightrail.controller.store.errors import StoreError
from lightrail.controller.store.etcd import EtcdStore

ETCD_BINARY: Final = "etcd"
ETCD_DEBIAN_PACKAGE: Final = "etcd-server"

_PORT_ATTEMPTS: Final = 3
_LOG_TAIL_BYTES: Final = 4000

_log = structlog.get_logger(__name__)


class EtcdNotInstalledError(RuntimeError):
    """The etcd binary is not on PATH."""


class EtcdStartError(RuntimeError):
    """etcd exited early or did not answer before the start timeout."""


def find_etcd_binary(binary: str = ETCD_BINARY) -> str:
    """Absolute path of ``binary`` (a name looked up on PATH, or a path). Raises
    EtcdNotInstalledError naming the binary and the Debian package that ships it."""
    path = shutil.which(binary)
    if path is None:
        raise EtcdNotInstalledError(
            f"etcd binary {binary!r} not found on PATH; install the Debian package "
            f"{ETCD_DEBIAN_PACKAGE!r} (apt-get install {ETCD_DEBIAN_PACKAGE})"
        )
    return path


def _free_port() -> int:
    """A port free on 127.0.0.1 right now (the OS picks it; another process may still take it
    before etcd binds it, which ``start`` retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class EmbeddedEtcd:
    """One etcd member as a child process (see module doc).

    Use as ``async with EmbeddedEtcd() as etcd:`` (starts, then stops and deletes the data dir;
    a start that fails or is cancelled deletes it too) or call ``start``/``stop``/``close``.
    ``endpoint`` is ``"127.0.0.1:PORT"`` for ``EtcdStore.connect``. Times are in seconds.
    Raises EtcdNotInstalledError from the constructor if the binary is missing.
    """

    def __init__(
        self,
        *,
        binary: str = ETCD_BINARY,
        start_timeout_s: float = 30.0,
        stop_timeout_s: float = 10.0,
        probe_timeout_s: float = 0.5,
        name: str = "lightrail",
    ) -> None:
        self.binary = find_etcd_binary(binary)
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self.name = name
        self._dir: Path | None = None
        self._client_port: int | None = None
        self._peer_port: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._log = _log.bind(etcd=name)

    @property
    def endpoint(self) -> str:
        """``"127.0.0.1:PORT"`` of the client port. Raises RuntimeError before the first start."""
        if self._client_port is None:
            raise RuntimeError("etcd was never started")
        return f"127.0.0.1:{self._client_port}"

    @property
    def data_dir(self) -> Path:
        """The member's data directory (kept across restarts)."""
        return self._workdir() / "data"

    @property
    def log_path(self) -> Path:
        """etcd's stdout and stderr, appended across restarts."""
        return self._workdir() / "etcd.log"

    @property
    def running(self) -> bool:
        """True while the child process is alive."""
        return self._proc is not None and self._proc.returncode is None

    @property
    def pid(self) -> int | None:
        """The etcd child's process id while it runs (to pause it with SIGSTOP in a fault
        test, say); None when it is not running."""
        return self._proc.pid if self._proc is not None and self.running else None

    def _workdir(self) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="lightrail-etcd-"))
        return self._dir

    def _args(self, client_port: int, peer_port: int) -> list[str]:
        peer = f"http://127.0.0.1:{peer_port}"
        client = f"http://127.0.0.1:{client_port}"
        return [
            self.binary,
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.name}={peer}",
            f"--initial-cluster-token=lightrail-{uuid.uuid4().hex[:12]}",
            "--initial-cluster-state=new",
            "--logger=zap",
            "--log-outputs=stderr",
            "--log-level=warn",
        ]

    def log_tail(self) -> str:
        """The last 4000 bytes at most of etcd's log (``log_path``: its warnings and errors at
        the level it runs with); "" when there is no log yet."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - _LOG_TAIL_BYTES))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    async def start(self) -> None:
        """Start etcd and wait until it answers a read (each probe bounded by
        ``probe_timeout_s``, all of them by ``start_timeout_s``). The first start picks free ports
        (retrying with new ones if another process grabbed one); later starts reuse them and the
        data dir. Raises EtcdStartError with the tail of etcd's log."""
        if self.running:
            raise RuntimeError("etcd is already running")
        first_start = self._client_port is None
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            if first_start:
                self._client_port, self._peer_port = _free_port(), _free_port()
            try:
                await self._start_once()
                return
            except EtcdStartError:
                in_use = "address already in use" in self.log_tail()
                if not (first_start and in_use and attempt < _PORT_ATTEMPTS):
                    raise
                self._log.warning("etcd.port_taken_retrying", attempt=attempt)

    async def _start_once(self) -> None:
        assert self._client_port is not None and self._peer_port is not None
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log_file:
            self._proc = await asyncio.create_subprocess_exec(
                *self._args(self._client_port, self._peer_port),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
            )
        self._log.info("etcd.starting", pid=self._proc.pid, endpoint=self.endpoint)
        try:
            await self._wait_ready()
        except BaseException:
            await self.stop()
            raise

    async def _wait_ready(self) -> None:
        proc = self._proc
        assert proc is not None
        started = time.monotonic()
        deadline = started + self.start_timeout_s
        last_error: Exception | None = None
        while True:
            if proc.returncode is not None:
                raise EtcdStartError(
                    f"etcd exited with code {proc.returncode} during start; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() >= deadline:
                raise EtcdStartError(
                    f"etcd did not answer on {self.endpoint} within {self.start_timeout_s} s "
                    f"(last error: {last_error!r}); log {self.log_path}:\n{self.log_tail()}"
                )
            # open() reads the revision once; gRPC waitForReady makes the read wait for the
            # connection up to probe_timeout_s, so this loop does not spin.
            try:
                async with EtcdStore.connect(self.endpoint, timeout_s=self.probe_timeout_s):
                    pass
            except StoreError as e:
                last_error = e
                continue
            self._log.info(
                "etcd.ready", endpoint=self.endpoint, start_s=round(time.monotonic() - started, 3)
            )
            return

    async def stop(self) -> None:
        """Stop etcd: SIGTERM, then SIGKILL if it has not exited after ``stop_timeout_s``; the
        process is reaped. No-op if not running. Raises EtcdStartError if even SIGKILL did not
        end it within ``stop_timeout_s``."""
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self.stop_timeout_s)
        except TimeoutError:
            self._log.warning("etcd.sigterm_timed_out", pid=proc.pid, timeout_s=self.stop_timeout_s)
            await self._kill(proc)
        self._log.info("etcd.stopped", pid=proc.pid, returncode=proc.returncode)

    async def kill(self) -> None:
        """Kill etcd with SIGKILL (a crash: no graceful shutdown) and reap it. No-op if not
        running."""
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        await self._kill(proc)
        self._log.info("etcd.killed", pid=proc.pid)

    async def _kill(self, proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is None:
            proc.kill()
        try:
            await asyncio.wait_for(proc.wait(), self.stop_timeout_s)
        except TimeoutError as e:
            raise EtcdStartError(f"etcd pid {proc.pid} survived SIGKILL") from e

    async def restart(self) -> None:
        """Stop, then start again on the same ports with the same data dir; returns once etcd
        answers. Raises as ``stop`` and ``start``."""
        await self.stop()
        await self.start()

    async def close(self) -> None:
        """Stop etcd and delete its data dir and log."""
        try:
            await self.stop()
        finally:
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            # ``__aexit__`` does not run when entering fails (a start error, a Ctrl-C while
            # etcd comes up): delete the data dir here, or each failed start leaves one behind
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
