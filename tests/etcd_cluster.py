"""A real etcd cluster on loopback for HA tests: ``EtcdCluster`` (N member processes, optional TLS
with client certificates, certificates made at test time with the ``openssl`` CLI).

    async with EtcdCluster(members=3, tls=True) as cluster:
        store = EtcdStore.connect(cluster.endpoints, tls=cluster.client_tls)
        await cluster.kill(cluster.index_of(store.current_endpoint))
        await cluster.restart(0)

Members talk to each other in plaintext on loopback peer ports; clients reach them on
``https://127.0.0.1:PORT`` with ``--client-cert-auth`` (a client must present a certificate
signed by the cluster's CA) when ``tls`` is set, plain ``http`` otherwise. Raft timing is
shortened (heartbeat 50 ms, election timeout 500 ms) so a new leader is elected in about a second
after a member is killed; etcd's minimum lease TTL is then 1 s.

etcd behaviour relied on (etcd v3.4 flags, https://etcd.io/docs/v3.4/op-guide/configuration/):
a member restarted on an existing data directory rejoins its cluster and ignores the
``--initial-cluster*`` flags; ``--client-cert-auth`` refuses a client without a certificate
signed by ``--trusted-ca-file``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from lightrail.controller.store.client import TlsFiles
from lightrail.controller.store.errors import StoreError
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.etcd_server import (
    EtcdStartError,
    _free_port,
    find_etcd_binary,
)

OPENSSL: Final = "openssl"
HEARTBEAT_MS: Final = 50
ELECTION_TIMEOUT_MS: Final = 500
_LOG_TAIL_BYTES: Final = 3000


class OpensslMissing(RuntimeError):
    """The openssl CLI (Debian package ``openssl``) is not on PATH."""


@dataclass(frozen=True, slots=True)
class CertPair:
    """A PEM certificate and its private key."""

    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    path = shutil.which(OPENSSL)
    if path is None:
        raise OpensslMissing("openssl not found on PATH; install the Debian package 'openssl'")
    subprocess.run([path, *args], check=True, capture_output=True, timeout=30)


def make_ca(directory: Path, name: str) -> CertPair:
    """A self-signed CA ``name`` (EC P-256, valid one day) written to ``directory``. Raises
    OpensslMissing, CalledProcessError."""
    pair = CertPair(directory / f"{name}.pem", directory / f"{name}-key.pem")
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(pair.key), "-out", str(pair.cert), "-days", "1",
        "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )
    return pair


def issue(ca: CertPair, directory: Path, name: str, *, server: bool) -> CertPair:
    """A certificate ``name`` signed by ``ca``: for a server, naming 127.0.0.1 and localhost and
    usable both ways (etcd's gateway dials its own member with it); else a client certificate
    only. Raises OpensslMissing, CalledProcessError."""
    pair = CertPair(directory / f"{name}.pem", directory / f"{name}-key.pem")
    csr = directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    usage = "serverAuth,clientAuth" if server else "clientAuth"
    lines = [f"extendedKeyUsage={usage}", "keyUsage=critical,digitalSignature,keyEncipherment"]
    if server:
        lines.append("subjectAltName=IP:127.0.0.1,DNS:localhost")
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(pair.key), "-out", str(csr), "-subj", f"/CN={name}",
    )
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-set_serial", str(uuid.uuid4().int >> 64), "-days", "1", "-extfile", str(ext),
        "-out", str(pair.cert),
    )
    return pair


@dataclass(slots=True)
class _Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    proc: asyncio.subprocess.Process | None = None


class EtcdCluster:
    """``members`` etcd processes forming one cluster on loopback (see module doc).

    ``endpoints`` lists ``"127.0.0.1:PORT"`` per member (index i is member i); with ``tls``,
    ``ca``, ``server`` and ``client`` are the certificate files and ``client_tls`` the
    ``TlsFiles`` a store connects with. ``kill(i)`` SIGKILLs member i, ``restart(i)`` starts it
    again on its data dir and waits until it answers, ``compact()`` compacts the history to the
    current revision. Times are in seconds. Raises
    EtcdNotInstalledError / OpensslMissing from ``start`` when a tool is missing,
    EtcdStartError when the cluster does not answer within ``start_timeout_s``."""

    def __init__(
        self, members: int = 3, *, tls: bool = True, start_timeout_s: float = 30.0
    ) -> None:
        if members < 1:
            raise ValueError("members must be >= 1")
        self.size = members
        self.tls = tls
        self.start_timeout_s = start_timeout_s
        self.binary = find_etcd_binary()
        self.dir = Path(tempfile.mkdtemp(prefix="lightrail-etcd-cluster-"))
        self.token = f"lightrail-{uuid.uuid4().hex[:12]}"
        self._members = [
            _Member(
                name=f"m{i}",
                client_port=_free_port(),
                peer_port=_free_port(),
                data_dir=self.dir / f"m{i}",
                log_path=self.dir / f"m{i}.log",
            )
            for i in range(members)
        ]
        self.ca: CertPair | None = None
        self.server: CertPair | None = None
        self.client: CertPair | None = None

    @property
    def endpoints(self) -> list[str]:
        """``"127.0.0.1:PORT"`` of each member's client port, in member order."""
        return [f"127.0.0.1:{m.client_port}" for m in self._members]

    @property
    def client_tls(self) -> TlsFiles | None:
        """The CA and client certificate a store connects with (None without TLS)."""
        if self.ca is None or self.client is None:
            return None
        return TlsFiles(ca_file=self.ca.cert, cert_file=self.client.cert, key_file=self.client.key)

    def index_of(self, endpoint: str | None) -> int:
        """The member serving ``endpoint``. Raises ValueError for an endpoint not of this
        cluster."""
        return self.endpoints.index(endpoint or "")

    def running(self, i: int) -> bool:
        """Whether member ``i``'s process is alive."""
        proc = self._members[i].proc
        return proc is not None and proc.returncode is None

    def log_tail(self, i: int) -> str:
        """The end of member ``i``'s log."""
        try:
            with self._members[i].log_path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - _LOG_TAIL_BYTES))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _args(self, m: _Member) -> list[str]:
        scheme = "https" if self.tls else "http"
        client = f"{scheme}://127.0.0.1:{m.client_port}"
        peer = f"http://127.0.0.1:{m.peer_port}"
        initial = ",".join(f"{o.name}=http://127.0.0.1:{o.peer_port}" for o in self._members)
        args = [
            self.binary,
            f"--name={m.name}",
            f"--data-dir={m.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={initial}",
            f"--initial-cluster-token={self.token}",
            "--initial-cluster-state=new",
            f"--heartbeat-interval={HEARTBEAT_MS}",
            f"--election-timeout={ELECTION_TIMEOUT_MS}",
            "--logger=zap",
            "--log-outputs=stderr",
            "--log-level=warn",
        ]
        if self.tls:
            assert self.ca is not None and self.server is not None
            args += [
                "--client-cert-auth",
                f"--trusted-ca-file={self.ca.cert}",
                f"--cert-file={self.server.cert}",
                f"--key-file={self.server.key}",
            ]
        return args

    async def start(self) -> None:
        """Make the certificates (with ``tls``), start every member and wait until each one
        answers a linearizable read (so the cluster has a leader)."""
        if self.tls:
            self.ca = make_ca(self.dir, "ca")
            self.server = issue(self.ca, self.dir, "server", server=True)
            self.client = issue(self.ca, self.dir, "client", server=False)
        for i in range(self.size):
            await self._spawn(i)
        await asyncio.gather(*(self._wait_ready(i) for i in range(self.size)))

    async def _spawn(self, i: int) -> None:
        m = self._members[i]
        with m.log_path.open("ab") as log_file:
            m.proc = await asyncio.create_subprocess_exec(
                *self._args(m),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
            )

    async def _wait_ready(self, i: int) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            proc = self._members[i].proc
            if proc is None or proc.returncode is not None:
                raise EtcdStartError(f"etcd member {i} exited during start:\n{self.log_tail(i)}")
            try:
                async with EtcdStore.connect(
                    self.endpoints[i], tls=self.client_tls, timeout_s=1.0
                ):
                    return
            except StoreError as e:
                last = e
                await asyncio.sleep(0.05)
        raise EtcdStartError(
            f"etcd member {i} did not answer within {self.start_timeout_s} s ({last}):\n"
            f"{self.log_tail(i)}"
        )

    async def kill(self, i: int) -> None:
        """SIGKILL member ``i`` (a crash) and reap it. No-op if it is not running."""
        m = self._members[i]
        proc, m.proc = m.proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.kill()
        await proc.wait()

    async def stop(self, i: int) -> None:
        """SIGTERM member ``i`` and reap it (SIGKILL after 10 s)."""
        m = self._members[i]
        proc, m.proc = m.proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def restart(self, i: int) -> None:
        """Start member ``i`` again on its data dir (stopping it first if it runs) and wait
        until it answers. Raises EtcdStartError."""
        await self.stop(i)
        await self._spawn(i)
        await self._wait_ready(i)

    async def compact(self) -> int:
        """Compact the cluster's history up to its current revision (a watch resuming from an
        older revision then gets a snapshot); returns that revision. Raises StoreError."""
        async with EtcdStore.connect(self.endpoints, tls=self.client_tls) as store:
            revision = await store.current_revision()
            await store.compact(revision)
        return revision

    async def close(self) -> None:
        """Kill every member and delete the cluster's directory."""
        try:
            for i in range(self.size):
                await self.kill(i)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
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
