"""Who may make a mutating operator call (Failover, Drain, and those to come): README
"Security".

A call names its operator by a bearer token in its metadata (``authorization: Bearer
<token>``; the controller keeps only the token's SHA-256) or by the subject CN of the client
certificate its TLS connection presented (verified by ``controller.tls.client_ca_file``).
With no operator configured, mutating calls are accepted only from loopback peers (the
operator is on the controller's host) and refused from anywhere else. Read-only calls
(GetStatus, ListX) are not checked here.

Refusals: UNAUTHENTICATED when the call presents no identity, or a token that matches no
operator; PERMISSION_DENIED for a client certificate whose subject is not an operator, or a
call from beyond loopback while no operator is configured. The message names the call and
what was missing; it never contains the token.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

import grpc
import structlog

if TYPE_CHECKING:
    _Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]

log = structlog.get_logger(__name__)

AUTHORIZATION_KEY = "authorization"
"""The metadata key of the bearer token (lowercase, as gRPC metadata keys are)."""
BEARER = "Bearer "


@dataclass(frozen=True, slots=True)
class OperatorIdentity:
    """One configured operator (``controller.operators``): ``name``, and how it is known:
    ``token_sha256`` (lowercase hex SHA-256 of its bearer token) and/or ``subject`` (its client
    certificate's subject CN). At least one is set."""

    name: str
    token_sha256: str | None = None
    subject: str | None = None


def token_sha256(token: str) -> str:
    """The lowercase hex SHA-256 of ``token``'s UTF-8 bytes (what ``token_sha256`` holds)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def is_loopback_peer(peer: str) -> bool:
    """True when ``peer`` (gRPC's ``context.peer()``: ``ipv4:127.0.0.1:5000``,
    ``ipv6:[::1]:5000``, ``unix:/path``) is on this host: a loopback address (also IPv4
    mapped into IPv6) or a Unix socket."""
    kind, _, rest = peer.partition(":")
    if kind == "unix":
        return True
    if kind not in ("ipv4", "ipv6"):
        return False
    host = rest.rsplit(":", 1)[0].strip("[]")
    host = host.replace("%5B", "").replace("%5D", "")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


class OperatorAuth:
    """Checks the operator identity of mutating calls against ``operators`` (empty: loopback
    peers only). Raises ``ValueError`` for two operators with one name."""

    def __init__(self, operators: Sequence[OperatorIdentity]) -> None:
        self.replace(operators)

    def replace(self, operators: Sequence[OperatorIdentity]) -> None:
        """From now on check calls against ``operators`` (a config reload; the next call
        sees all of the new list, none of the old). Raises ``ValueError`` for two operators
        with one name, keeping the current list."""
        names = [o.name for o in operators]
        if len(set(names)) != len(names):
            raise ValueError(f"operators: a name is listed twice in {names}")
        self.operators = tuple(operators)
        self._by_subject = {o.subject: o for o in operators if o.subject is not None}
        self._tokens = [(o.token_sha256, o) for o in operators if o.token_sha256 is not None]

    def _by_token(self, token: str) -> OperatorIdentity | None:
        digest = token_sha256(token)
        found = None
        for expected, op in self._tokens:  # compare with every one: no early exit
            if hmac.compare_digest(digest, expected):
                found = op
        return found

    async def require(self, context: _Context, call: str) -> str:
        """The name of the operator making ``call`` (``"loopback"`` when no operator is
        configured and the peer is on this host); otherwise aborts the call
        (UNAUTHENTICATED or PERMISSION_DENIED, see the module doc). Logs each decision."""
        peer = context.peer()
        token = _bearer(context)
        if not self.operators:
            if is_loopback_peer(peer):
                log.info("operator_call", call=call, operator="loopback", peer=peer)
                return "loopback"
            await _refuse(context, grpc.StatusCode.PERMISSION_DENIED, call, peer,
                          f"{call}: no operator is configured (controller.operators), so "
                          f"mutating calls are accepted only from loopback; this call came "
                          f"from {peer}")
        if token is not None:
            op = self._by_token(token)
            if op is None:
                await _refuse(context, grpc.StatusCode.UNAUTHENTICATED, call, peer,
                              f"{call}: the bearer token matches no operator of "
                              "controller.operators")
            log.info("operator_call", call=call, operator=op.name, by="token", peer=peer)
            return op.name
        subject = _subject(context)
        if subject is not None:
            op = self._by_subject.get(subject)
            if op is None:
                await _refuse(context, grpc.StatusCode.PERMISSION_DENIED, call, peer,
                              f"{call}: client certificate subject CN {subject!r} is not an "
                              "operator of controller.operators")
            log.info("operator_call", call=call, operator=op.name, by="certificate", peer=peer)
            return op.name
        await _refuse(context, grpc.StatusCode.UNAUTHENTICATED, call, peer,
                      f"{call} needs an operator identity: a bearer token (metadata "
                      "'authorization: Bearer <token>', lightrail --token) or a client "
                      "certificate whose subject CN is an operator of controller.operators")


def _bearer(context: _Context) -> str | None:
    """The bearer token of the call's metadata, None when there is none."""
    for key, value in context.invocation_metadata() or ():
        if key == AUTHORIZATION_KEY and isinstance(value, str) and value.startswith(BEARER):
            return value[len(BEARER):].strip()
    return None


def _subject(context: _Context) -> str | None:
    """The subject CN of the client certificate the TLS handshake verified, None without."""
    for name in context.auth_context().get("x509_common_name") or ():
        return name.decode("utf-8", "replace")
    return None


async def _refuse(context: _Context, code: grpc.StatusCode, call: str, peer: str,
                  message: str) -> NoReturn:
    log.warning("operator_call_refused", call=call, peer=peer, code=code.name)
    await context.abort(code, message)
    raise AssertionError("unreachable: ServicerContext.abort raises")


__all__ = [
    "AUTHORIZATION_KEY",
    "OperatorAuth",
    "OperatorIdentity",
    "is_loopback_peer",
    "token_sha256",
]
