"""Finding the leading controller among several replicas (DESIGN.md "High availability").

Agents and the CLI take a list of controller addresses (``--controller a:1,b:2,c:3``). A call
goes to the replica believed to lead first, then to the others in the order given. A standby
answers with a redirect (status UNAVAILABLE, trailing metadata ``lightrail-leader``: the
leader's address, empty while an election runs; ``lightrail.controller.api.routing``), which is
followed at once, at most ``max_redirects`` times per pass; an address that cannot be reached
(UNAVAILABLE without a refusal code) is skipped. When no address of a pass leads,
``NoLeader`` lists every address tried and why.

Channels: ``LeaderTargets.channel`` opens every channel to a replica, plaintext or TLS
(``tls``, ``lightrail.agents.channel``); a failure's reason carries a hint when it looks like a
TLS mismatch (``LeaderTargets.describe``).

Imports only the API codec (its metadata keys), the channel rule and gRPC: the job-side library,
the host agent and the CLI all use it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from lightrail.agents.channel import ClientTls, open_channel, tls_hint
from lightrail.controller.api.codec import ERROR_METADATA_KEY, LEADER_METADATA_KEY

T = TypeVar("T")

MAX_REDIRECTS = 3
"""Redirects one pass follows at most: a standby names the leader; more than a few hops means
replicas disagree while an election settles, and the caller backs off instead."""


def parse_targets(targets: str | Sequence[str]) -> tuple[str, ...]:
    """Controller addresses from ``a:1,b:2`` (or a sequence of them), in order, duplicates
    dropped, blanks around commas ignored. Raises ``ValueError`` naming the value when no
    address is given or one is empty."""
    items = targets.split(",") if isinstance(targets, str) else list(targets)
    out: list[str] = []
    for item in items:
        address = item.strip()
        if not address:
            raise ValueError(f"controller: empty address in {targets!r} "
                             "(expected HOST:PORT[,HOST:PORT...])")
        if address not in out:
            out.append(address)
    if not out:
        raise ValueError(f"controller: no address in {targets!r}")
    return tuple(out)


def _metadata(exc: grpc.aio.AioRpcError) -> dict[str, str]:
    md: Sequence[tuple[str, str | bytes]] = exc.trailing_metadata() or ()  # type: ignore[assignment]
    return {k: v for k, v in md if isinstance(v, str)}


def redirect_of(exc: grpc.aio.AioRpcError) -> str | None:
    """The leader's address a standby's redirect names; ``""`` for a redirect naming none (an
    election in progress); None when ``exc`` is not a redirect."""
    if exc.code() is not grpc.StatusCode.UNAVAILABLE:
        return None
    return _metadata(exc).get(LEADER_METADATA_KEY)


def is_unreachable(exc: grpc.aio.AioRpcError) -> bool:
    """True when ``exc`` is a transport failure (UNAVAILABLE with no refusal code): the replica
    could not be reached or went away mid-call."""
    return exc.code() is grpc.StatusCode.UNAVAILABLE and ERROR_METADATA_KEY not in _metadata(exc)


def describe(exc: grpc.aio.AioRpcError) -> str:
    """One line for an attempt that did not reach the leader: ``CODE: details``."""
    return f"{exc.code().name}: {exc.details() or 'no details'}"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One address tried in a pass, and why it did not answer as the leader."""

    address: str
    reason: str


class NoLeader(Exception):
    """No address of a pass led. ``attempts``: every address tried, in order, with the
    reason (unreachable, or a redirect that led nowhere)."""

    def __init__(self, attempts: Sequence[Attempt]) -> None:
        self.attempts = tuple(attempts)
        super().__init__("no controller replica leads: tried " + "; ".join(
            f"{a.address} ({a.reason})" for a in self.attempts))


class LeaderTargets:
    """The addresses of the controller replicas and the one believed to lead (``current``,
    the first at start), and how to reach them (``tls``: None for plaintext). ``call`` makes
    one pass over them. Not thread-safe; one event loop. Raises ``ValueError``
    (``parse_targets``) for an empty list, ``ValueError`` for ``max_redirects`` < 0."""

    def __init__(self, targets: str | Sequence[str], *, max_redirects: int = MAX_REDIRECTS,
                 tls: ClientTls | None = None) -> None:
        if max_redirects < 0:
            raise ValueError(f"max_redirects: must be >= 0, got {max_redirects}")
        self.addresses = parse_targets(targets)
        self.current = self.addresses[0]
        self.max_redirects = max_redirects
        self.tls = tls

    def channel(self, address: str) -> grpc.aio.Channel:
        """A new channel to the replica at ``address``, TLS when ``tls`` is set
        (``lightrail.agents.channel.open_channel``); the caller closes it."""
        return open_channel(address, self.tls)

    def describe(self, exc: grpc.aio.AioRpcError) -> str:
        """``describe(exc)`` plus a TLS hint when the failure looks like a TLS mismatch
        (``lightrail.agents.channel.tls_hint``)."""
        return describe(exc) + tls_hint(exc.details() or "", self.tls)

    def __str__(self) -> str:
        return ",".join(self.addresses)

    def order(self) -> list[str]:
        """The addresses in the order a pass tries them: ``current`` first, then the rest as
        given."""
        return [self.current, *(a for a in self.addresses if a != self.current)]

    async def call(self, attempt: Callable[[str], Awaitable[T]]) -> T:
        """``attempt(address)`` on the leader: tried on each address of ``order()``, following
        redirects (at most ``max_redirects``); the address that answered becomes ``current``.
        Raises ``NoLeader`` when no address led, and any other ``grpc.aio.AioRpcError``
        ``attempt`` raised (the leader's own answer, e.g. NOT_FOUND)."""
        queue = [(a, False) for a in self.order()]  # (address, named by a redirect)
        tried: list[Attempt] = []
        seen: set[str] = set()
        redirects = 0
        while queue:
            address, redirected = queue.pop(0)
            if address in seen and not redirected:
                continue
            seen.add(address)
            try:
                result = await attempt(address)
            except grpc.aio.AioRpcError as exc:
                leader = redirect_of(exc)
                if leader is None and not is_unreachable(exc):
                    raise
                tried.append(Attempt(address, self.describe(exc)))
                if leader and leader != address and redirects < self.max_redirects:
                    redirects += 1
                    queue.insert(0, (leader, True))
                continue
            self.current = address
            return result
        raise NoLeader(tried)


__all__ = [
    "MAX_REDIRECTS",
    "Attempt",
    "LeaderTargets",
    "NoLeader",
    "describe",
    "is_unreachable",
    "parse_targets",
    "redirect_of",
]
