"""The one way a client opens a gRPC channel to a controller replica: plaintext, or TLS with the
files of ``--tls-ca``/``--tls-cert``/``--tls-key`` (README "Security").

``ClientTls`` holds the PEM files read once (``ClientTls.from_files``); ``open_channel`` opens a
``grpc.aio.secure_channel`` with them, or an ``insecure_channel`` when no ``ClientTls`` is given.
Every controller channel of the agents, the job-side library, the replay tools and the CLI is
opened here (through ``lightrail.agents.leader.LeaderTargets.channel``), so the rule lives in
one place.

Server name: gRPC checks that the controller's certificate names the host part of the address
dialled (a DNS name or IP address in its subjectAltName), e.g. ``ctl-1.example:50051`` needs
``DNS:ctl-1.example``, ``10.0.0.5:50051`` needs ``IP:10.0.0.5``; a redirect to the leader dials
the address the leader advertises (``controller.advertise``), which its certificate must name
too.

Imports only gRPC: the job-side library uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import grpc


class ClientTlsError(ValueError):
    """A TLS file of the client cannot be used; the message names the option and the path
    (never the file's content)."""


def _read_pem(option: str, path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ClientTlsError(f"{option}: cannot read {str(path)!r}: "
                             f"{exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise ClientTlsError(f"{option}: {str(path)!r} is not a PEM file (no '-----BEGIN' line)")
    return data


@dataclass(frozen=True, slots=True)
class ClientTls:
    """TLS to the controller: ``ca_file`` (PEM) verifies the controller's certificate (None:
    the system's trusted roots); ``cert_file``/``key_file`` (PEM, both or neither) are the
    client certificate a controller with ``controller.tls.client_ca_file`` requires. The
    ``*_pem`` fields hold the files' bytes, read by ``from_files``; they never appear in
    ``repr``."""

    ca_file: Path | None
    cert_file: Path | None
    key_file: Path | None
    ca_pem: bytes | None = field(default=None, repr=False)
    cert_pem: bytes | None = field(default=None, repr=False)
    key_pem: bytes | None = field(default=None, repr=False)

    @classmethod
    def from_files(
        cls, ca_file: str | Path | None, cert_file: str | Path | None = None,
        key_file: str | Path | None = None,
    ) -> ClientTls:
        """Read the files now. Raises ``ClientTlsError`` naming the option (``--tls-ca``,
        ``--tls-cert``, ``--tls-key``) for a file that cannot be read or is not PEM, or a
        certificate given without its key (or a key without its certificate)."""
        if (cert_file is None) != (key_file is None):
            given, missing = (("--tls-cert", "--tls-key") if key_file is None
                              else ("--tls-key", "--tls-cert"))
            raise ClientTlsError(f"{given} is given without {missing}: a client certificate "
                                 "needs its private key and the key its certificate")
        ca = None if ca_file is None else Path(ca_file)
        cert = None if cert_file is None else Path(cert_file)
        key = None if key_file is None else Path(key_file)
        return cls(
            ca, cert, key,
            ca_pem=None if ca is None else _read_pem("--tls-ca", ca),
            cert_pem=None if cert is None else _read_pem("--tls-cert", cert),
            key_pem=None if key is None else _read_pem("--tls-key", key),
        )

    def credentials(self) -> grpc.ChannelCredentials:
        """The gRPC channel credentials of these files."""
        return grpc.ssl_channel_credentials(root_certificates=self.ca_pem,
                                            private_key=self.key_pem,
                                            certificate_chain=self.cert_pem)


def open_channel(address: str, tls: ClientTls | None) -> grpc.aio.Channel:
    """A channel to the controller replica at ``address`` (``host:port``, or ``unix:///path``
    for a host agent's local socket): TLS with ``tls`` when given, else plaintext. Open it
    inside the event loop that uses it."""
    if tls is None:
        return grpc.aio.insecure_channel(address)
    return grpc.aio.secure_channel(address, tls.credentials())


def tls_hint(details: str, tls: ClientTls | None) -> str:
    """What a failed connection's ``details`` (gRPC's text) suggests about TLS, as a
    parenthesised hint to append to an error message; ``""`` when nothing. Sources: the
    messages gRPC 1.6x prints for these handshakes (BoringSSL error names)."""
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return (" (TLS: the controller's certificate is not signed by the CA of --tls-ca"
                + (")" if tls is not None and tls.ca_file is not None
                   else "; pass --tls-ca with that CA)"))
    if "Hostname Verification" in details:
        return " (TLS: the controller's certificate does not name the host dialled)"
    if "WRONG_VERSION_NUMBER" in details:
        return " (TLS: the controller does not speak TLS at this address; drop --tls-*)"
    if "Socket closed" in details and "failed to connect" in details:
        if tls is None:
            return " (closed while connecting: the controller may require TLS: --tls-ca)"
        if tls.cert_pem is None:
            return (" (closed while connecting: the controller may require a client "
                    "certificate: --tls-cert and --tls-key)")
        return (" (closed while connecting: the controller may not accept this client "
                "certificate)")
    return ""


__all__ = ["ClientTls", "ClientTlsError", "open_channel", "tls_hint"]
