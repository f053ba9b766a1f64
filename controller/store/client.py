"""The etcd v3 client under the store: one gRPC channel per cluster member, TLS, failover between
members, error translation, bounded shutdown steps.

Only the store package uses this module; no gRPC or generated object leaves the package.

Choice (issue 10): our own thin client over ``grpc.aio`` and stubs generated from etcd's v3 API
(``proto/lightrail/etcdapi``: the KV, Watch, Lease, Cluster and Maintenance messages of etcd's
``rpc.proto``/``kv.proto``, checked field by field against the stubs aetcd 1.0.0 ships).
aetcd, used before, opens one plaintext channel to one endpoint. Of the asyncio clients on PyPI
(December 2026), none had both TLS with client certificates and several endpoints with a track
record: etcd3aio 0.3.0 (both, but one maintainer, one release, five weeks of history),
etcd-client-py 0.5.1 (Rust bindings: no TLS options, no revisions in replies), etcetra 0.1.19
(last release 2024-04, one endpoint, no client certificate), etcd3-async-client 0.3.1 (one
endpoint, no client certificate), etcd-sdk-python 0.0.7 (synchronous). docs/ARCHITECTURE.md
("Store client") records the same.

Members and failover: ``EtcdClient`` keeps one channel per endpoint (TLS: the same CA and client
certificate for all; each member's certificate must name the host its endpoint dials) and sends
every call to the current member. A call that fails because the connection failed moves the
client to the next member and is sent again there, each full round of failures followed by a
short backoff, until the call's deadline; then ``StoreUnavailable`` names every endpoint with its
last error. Whether a call may be sent again depends on whether it could already have been
applied (``Retry``): a read, a put or delete (writing the same value again leaves the same
state), a keep-alive or a revoke are resent after any transport failure; a transaction with
compares or a compaction only when the failed attempt never left this process (the channel had
no connection: gRPC's "failed to connect" status), since a transaction that was applied but
whose answer was lost would be resent and fail its compare.

etcd and gRPC behaviour relied on:
- gRPC fails a call at once (status UNAVAILABLE, details starting ``failed to connect to all
  addresses``) when its channel has no connection and the last attempt to connect failed: such
  a call was not sent;
- etcd answers UNAVAILABLE while a member has no raft leader (``etcdserver: no leader``,
  ``leader changed``, ``request timed out``), and UNKNOWN ``context deadline exceeded`` when a
  member's own request to the leader timed out (a keep-alive while the leader was killed):
  transient;
- a watch stream carrying the metadata ``hasleader: true`` is closed by a member that loses its
  leader instead of going silent (etcd's Go client sends it: ``rpctypes.MetadataRequireLeaderKey``);
- grpcio's asyncio client reports a write to a stream whose connection has just gone as status
  INTERNAL with details ``"Internal error from Core"`` (grpc/grpc#36066, grpc/grpc#14109).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final, TypeVar

import grpc
import grpc.aio
import structlog

from lightrail.controller.store.errors import (
    RevisionCompacted,
    StoreClosed,
    StoreError,
    StoreRequestFailed,
    StoreUnavailable,
)
from lightrail.controller.store.types import RequestObserver
from lightrail.etcdapi import kv_pb2, rpc_pb2, rpc_pb2_grpc

SHUTDOWN_TIMEOUT_S: Final = 5.0
"""Bound (seconds) on each step of closing a client, a watch or a background task."""

_CHANNEL_OPTIONS: Final[Mapping[str, int | str]] = MappingProxyType(
    {
        # gRPC's default reconnect backoff grows to 120 s; an etcd restart must be seen in ~1 s.
        "grpc.initial_reconnect_backoff_ms": 100,
        "grpc.min_reconnect_backoff_ms": 100,
        "grpc.max_reconnect_backoff_ms": 1000,
        # A prefix read answers in one message; gRPC's default cap is 4 MiB.
        "grpc.max_receive_message_length": 64 * 1024 * 1024,
        # Detect a hung (not closed) etcd on long-lived watch streams. etcd refuses pings more
        # often than --grpc-keepalive-min-time (5 s by default).
        "grpc.keepalive_time_ms": 10_000,
        "grpc.keepalive_timeout_ms": 5_000,
        "grpc.http2.max_pings_without_data": 0,
    }
)

_RETRY_BACKOFF_S: Final = (0.05, 0.1, 0.2, 0.5)
"""Pause after each full round of members failed (seconds; the last repeats)."""

_ATTEMPTS_PER_BUDGET: Final = 3
"""A call that may be resent gives each attempt at most this fraction of its time (1/3): a
member whose leader just died keeps a proposal until etcd's request timeout (5 s and more),
while another member answers once a new leader is elected (about one election timeout)."""

_WATCH_METADATA: Final = (("hasleader", "true"),)

# What grpcio's asyncio client reports when it writes to a stream whose connection has just gone
# (etcd stopping): status INTERNAL generated by the client itself, not by etcd
# (grpc/grpc#36066; INTERNAL during server shutdown: grpc/grpc#14109). A transport failure.
_GRPC_CLIENT_INTERNAL_DETAILS: Final = "Internal error from Core"
# Go context errors that etcd passes on as status UNKNOWN when a member's own request to the
# raft leader ran out of time or was cancelled (seen on LeaseKeepAlive while the leader was just
# killed): the member could not serve, a transient failure.
_ETCD_CONTEXT_ERRORS: Final = frozenset({"context deadline exceeded", "context canceled"})
# gRPC's status for a call failed because its channel has no connection (never sent).
_NOT_CONNECTED_DETAILS: Final = "failed to connect to all addresses"

_T = TypeVar("_T")

_log = structlog.get_logger(__name__)


class Retry(enum.Enum):
    """When a call that failed on one member may be sent again (to the next one)."""

    ALWAYS = "always"
    """After any transport failure: sending it twice leaves the same state."""
    IF_NOT_SENT = "if_not_sent"
    """Only when it never left this process (the channel had no connection)."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for TLS to etcd: ``ca_file`` verifies the members' certificates;
    ``cert_file`` and ``key_file`` (both or neither) are the client certificate etcd's
    ``--client-cert-auth`` asks for. Raises ValueError when only one of them is given."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("etcd TLS: cert_file and key_file go together")

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials from the files. Raises StoreError naming a file that
        cannot be read."""

        def read(path: Path | None) -> bytes | None:
            if path is None:
                return None
            try:
                return path.read_bytes()
            except OSError as e:
                raise StoreError(f"etcd TLS: cannot read {path}: {e.strerror}") from None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> (host, port). Raises ValueError for anything else."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdecimal():
        raise ValueError(f"etcd endpoint must be HOST:PORT, got {endpoint!r}")
    return host, int(port)


@dataclass(frozen=True, slots=True)
class _Member:
    """One cluster member: its endpoint, channel and the stubs on it."""

    endpoint: str
    channel: grpc.aio.Channel
    kv: rpc_pb2_grpc.KVAsyncStub
    watch: rpc_pb2_grpc.WatchAsyncStub
    lease: rpc_pb2_grpc.LeaseAsyncStub

    @classmethod
    def open(cls, endpoint: str, credentials: grpc.ChannelCredentials | None) -> _Member:
        options = list(_CHANNEL_OPTIONS.items())
        channel = (
            grpc.aio.insecure_channel(endpoint, options=options)
            if credentials is None
            else grpc.aio.secure_channel(endpoint, credentials, options=options)
        )
        return cls(
            endpoint=endpoint,
            channel=channel,
            kv=rpc_pb2_grpc.KVStub(channel),
            watch=rpc_pb2_grpc.WatchStub(channel),
            lease=rpc_pb2_grpc.LeaseStub(channel),
        )


class EtcdClient:
    """Calls to an etcd cluster at ``endpoints`` (``"HOST:PORT"`` each, one per member), over TLS
    when ``tls`` is given; see the module doc for failover. Every call is bounded by
    ``timeout_s`` seconds unless it says otherwise; ``observe`` times each (``RequestObserver``).

    Create inside a running event loop; ``connect()`` starts connecting to every member (so a
    failover finds a connection ready); ``close()`` closes the channels. Raises ValueError for a
    malformed endpoint or an empty list, StoreError for unreadable TLS files."""

    def __init__(
        self, endpoints: Sequence[str], *, timeout_s: float, tls: TlsFiles | None = None,
        observe: RequestObserver | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        for endpoint in endpoints:
            parse_endpoint(endpoint)
        credentials = None if tls is None else tls.credentials()
        self.endpoints = tuple(endpoints)
        self.timeout_s = timeout_s
        self._tls = tls
        self._members = [_Member.open(e, credentials) for e in self.endpoints]
        self._current = 0
        self._answered: set[int] = set()  # members whose last call succeeded
        self._closed = False
        self._observe = observe

    @property
    def current_endpoint(self) -> str:
        """The endpoint calls go to now (it changes on failover)."""
        return self._members[self._current].endpoint

    def connect(self) -> None:
        """Start connecting to every member (returns at once)."""
        for member in self._members:
            member.channel.get_state(try_to_connect=True)

    async def close(self) -> None:
        """Close every channel (pending calls fail), each bounded by ``SHUTDOWN_TIMEOUT_S``."""
        self._closed = True
        for member in self._members:
            await bounded(member.channel.close(None), SHUTDOWN_TIMEOUT_S, "channel.close")

    # ----------------------------------------------------------------- unary calls

    async def range(self, op: str, request: rpc_pb2.RangeRequest) -> rpc_pb2.RangeResponse:
        """KV.Range (resent on failover). Raises StoreUnavailable, StoreRequestFailed."""
        return await self.call(op, lambda m, t: m.kv.Range(request, timeout=t),
                               retry=Retry.ALWAYS, method="range")

    async def put(self, op: str, request: rpc_pb2.PutRequest) -> rpc_pb2.PutResponse:
        """KV.Put (resent on failover). Raises as ``range``."""
        return await self.call(op, lambda m, t: m.kv.Put(request, timeout=t), retry=Retry.ALWAYS,
                               method="put")

    async def delete_range(
        self, op: str, request: rpc_pb2.DeleteRangeRequest
    ) -> rpc_pb2.DeleteRangeResponse:
        """KV.DeleteRange (resent on failover: ``deleted`` then counts only the keys the last
        attempt found). Raises as ``range``."""
        return await self.call(op, lambda m, t: m.kv.DeleteRange(request, timeout=t),
                               retry=Retry.ALWAYS, method="delete_range")

    async def txn(self, op: str, request: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse:
        """KV.Txn: resent after any transport failure only without compares (then it is a batch
        of puts and deletes), else only if not sent. Raises as ``range``."""
        retry = Retry.IF_NOT_SENT if len(request.compare) else Retry.ALWAYS
        return await self.call(op, lambda m, t: m.kv.Txn(request, timeout=t), retry=retry,
                               method="txn")

    async def compact(
        self, op: str, request: rpc_pb2.CompactionRequest
    ) -> rpc_pb2.CompactionResponse:
        """KV.Compact (resent only if not sent). Raises as ``range``."""
        return await self.call(op, lambda m, t: m.kv.Compact(request, timeout=t),
                               retry=Retry.IF_NOT_SENT, method="compact")

    async def lease_grant(
        self, op: str, request: rpc_pb2.LeaseGrantRequest
    ) -> rpc_pb2.LeaseGrantResponse:
        """Lease.LeaseGrant (resent on failover: a lease granted by a lost attempt expires
        after its TTL). Raises as ``range``."""
        return await self.call(op, lambda m, t: m.lease.LeaseGrant(request, timeout=t),
                               retry=Retry.ALWAYS, method="lease_grant")

    async def lease_revoke(
        self, op: str, request: rpc_pb2.LeaseRevokeRequest
    ) -> rpc_pb2.LeaseRevokeResponse:
        """Lease.LeaseRevoke (resent on failover; a resent revoke of a lease already revoked
        answers NOT_FOUND). Raises as ``range``."""
        return await self.call(op, lambda m, t: m.lease.LeaseRevoke(request, timeout=t),
                               retry=Retry.ALWAYS, method="lease_revoke")

    async def lease_keep_alive_once(
        self, op: str, lease_id: int, timeout_s: float
    ) -> rpc_pb2.LeaseKeepAliveResponse:
        """One keep-alive of ``lease_id`` on a LeaseKeepAlive stream of its own, within
        ``timeout_s`` seconds (resent on failover). Raises as ``range``; StoreUnavailable when
        the stream ends without a reply."""

        async def once(member: _Member, remaining_s: float) -> rpc_pb2.LeaseKeepAliveResponse:
            # Requests are written on the call (grpc-stubs 1.53 lacks the iterator-less form).
            call = member.lease.LeaseKeepAlive(timeout=remaining_s)  # type: ignore[call-arg]
            try:
                await call.write(rpc_pb2.LeaseKeepAliveRequest(ID=lease_id))
                reply = await call.read()
            finally:
                call.cancel()
            if not isinstance(reply, rpc_pb2.LeaseKeepAliveResponse):
                raise StoreUnavailable(f"{op}: etcd {member.endpoint} closed the stream")
            return reply

        return await self.call(op, once, retry=Retry.ALWAYS, timeout_s=timeout_s,
                               method="lease_keep_alive")

    async def call(
        self,
        op: str,
        invoke: Callable[[_Member, float], Awaitable[_T]],
        *,
        retry: Retry,
        timeout_s: float | None = None,
        method: str = "other",
    ) -> _T:
        """``invoke(member, remaining_s)`` on the current member, moving to the next one after a
        transport failure while ``retry`` allows and time is left (``timeout_s``, default the
        client's). ``op`` names the call in errors, ``method`` the etcd method to the observer
        (the one place every request is timed). Raises StoreUnavailable naming the endpoints
        and their last errors, StoreRequestFailed (etcd refused), StoreClosed."""
        started = time.perf_counter()
        try:
            return await self._attempts(op, invoke, retry, timeout_s)
        finally:
            if self._observe is not None:
                self._observe(method, time.perf_counter() - started)

    async def _attempts(self, op: str, invoke: Callable[[_Member, float], Awaitable[_T]],
                        retry: Retry, timeout_s: float | None) -> _T:
        loop = asyncio.get_running_loop()
        budget_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = loop.time() + budget_s
        failures: dict[str, str] = {}
        attempt = 0
        while True:
            if self._closed:
                raise StoreClosed(f"{op}: store was closed")
            index = self._current
            member = self._members[index]
            remaining_s = deadline - loop.time()
            if retry is Retry.ALWAYS and len(self._members) > 1:
                remaining_s = min(remaining_s, budget_s / _ATTEMPTS_PER_BUDGET)
            try:
                result = await invoke(member, max(remaining_s, 0.001))
            except grpc.aio.AioRpcError as e:
                if not is_transport_failure(e):
                    raise StoreRequestFailed(
                        f"{op}: etcd {member.endpoint} refused: {describe(e)}"
                    ) from e
                failures[member.endpoint] = describe(e) + self._hint(e)
                if retry is Retry.IF_NOT_SENT and not _not_sent(e):
                    raise StoreUnavailable(
                        f"{op}: etcd {member.endpoint} unavailable: {describe(e)} (not resent: "
                        "it may have been applied)"
                    ) from e
                error: BaseException = e
            except (StoreUnavailable, TimeoutError) as e:
                failures[member.endpoint] = describe(e)
                error = e
            else:
                self._answered.add(index)
                return result
            self._advance(index, failures[member.endpoint])
            attempt += 1
            left_s = deadline - loop.time()
            if left_s <= 0:
                raise StoreUnavailable(
                    f"{op}: etcd unavailable: no member answered within {budget_s:g} s: "
                    + "; ".join(f"{endpoint}: {why}" for endpoint, why in failures.items())
                ) from error
            if attempt % len(self._members) == 0:
                pause_s = _RETRY_BACKOFF_S[
                    min(attempt // len(self._members) - 1, len(_RETRY_BACKOFF_S) - 1)
                ]
                await asyncio.sleep(min(pause_s, left_s))

    def _hint(self, error: grpc.aio.AioRpcError) -> str:
        """What a connection failure most likely means, for the error message ("" if
        nothing specific)."""
        details = error.details() or ""
        if not _not_sent(error):
            return ""
        if self._tls is None:
            if "Socket closed" in details or "Connection reset" in details:
                return " (the member closed a plaintext connection: does it require TLS, etcd.tls?)"
            return ""
        if "CERTIFICATE_VERIFY_FAILED" in details or "Ssl handshake failed" in details:
            return (
                " (TLS: the member's certificate is not signed by etcd.tls.ca_file or does not "
                "name the host dialed)"
            )
        if "TSI_DATA_CORRUPTED" in details or "Socket closed" in details:
            return (
                " (TLS: the member refused this client: no client certificate "
                "(etcd.tls.cert_file/key_file), or one its trusted CA did not sign)"
            )
        return ""

    def _advance(self, failed_index: int, why: str) -> None:
        """Move to the member after ``failed_index`` (unless another call already moved on);
        logs when a member that answered before fails (``why``)."""
        if failed_index in self._answered:
            self._answered.discard(failed_index)
            _log.warning(
                "etcd.member_failed", endpoint=self._members[failed_index].endpoint, error=why
            )
        if self._current == failed_index:
            self._current = (failed_index + 1) % len(self._members)

    # ----------------------------------------------------------------- watches

    async def open_watch(self, op: str, request: rpc_pb2.WatchCreateRequest) -> WatchStream:
        """Create a watch on the current member (resent on failover within the client's
        timeout) and return it once etcd confirmed it. Raises RevisionCompacted when
        ``start_revision`` was compacted, StoreUnavailable, StoreRequestFailed."""

        async def create(member: _Member, remaining_s: float) -> WatchStream:
            call = member.watch.Watch(metadata=_WATCH_METADATA)  # type: ignore[call-arg]
            try:
                await call.write(rpc_pb2.WatchRequest(create_request=request))
                first = await asyncio.wait_for(call.read(), remaining_s)
                _check_watch_response(op, member.endpoint, first)
            except BaseException:
                call.cancel()
                raise
            return WatchStream(op, member.endpoint, call, on_break=self._on_break(member))

        return await self.call(op, create, retry=Retry.ALWAYS, method="watch")

    def _on_break(self, member: _Member) -> Callable[[str], None]:
        index = self._members.index(member)
        return lambda why: self._advance(index, why)


class WatchStream:
    """One etcd watch on one member: iterate it for the events of each etcd response (all events
    of a revision come in one response), ``cancel()`` when done.

    Raises (from iteration) RevisionCompacted when etcd cancels the watch because its start
    revision was compacted, StoreUnavailable when the stream breaks or ends (the client then
    moves to the next member), StoreRequestFailed for another cancellation."""

    def __init__(
        self,
        op: str,
        endpoint: str,
        call: grpc.aio.StreamStreamCall[rpc_pb2.WatchRequest, rpc_pb2.WatchResponse],
        *,
        on_break: Callable[[str], None],
    ) -> None:
        self.endpoint = endpoint
        self._op = op
        self._call = call
        self._on_break = on_break

    def cancel(self) -> None:
        """End the stream (idempotent)."""
        self._call.cancel()

    def __aiter__(self) -> AsyncIterator[list[kv_pb2.Event]]:
        return self._events()

    async def _events(self) -> AsyncIterator[list[kv_pb2.Event]]:
        op, endpoint = self._op, self.endpoint
        while True:
            try:
                response = await self._call.read()
            except grpc.aio.AioRpcError as e:
                self._on_break(describe(e))
                if is_transport_failure(e):
                    raise StoreUnavailable(
                        f"{op}: etcd {endpoint} unavailable: {describe(e)}"
                    ) from e
                raise StoreRequestFailed(f"{op}: etcd {endpoint} refused: {describe(e)}") from e
            try:
                _check_watch_response(op, endpoint, response)
            except StoreUnavailable as e:
                self._on_break(str(e))
                raise
            assert isinstance(response, rpc_pb2.WatchResponse)
            if response.events:
                yield list(response.events)


def _check_watch_response(op: str, endpoint: str, response: object) -> None:
    """Raise for a watch response that ends the watch (or for none at all)."""
    if not isinstance(response, rpc_pb2.WatchResponse):
        raise StoreUnavailable(f"{op}: etcd {endpoint} ended the watch stream")
    if response.compact_revision:
        raise RevisionCompacted(
            f"{op}: revision compacted (etcd keeps history from {response.compact_revision})",
            int(response.compact_revision),
        )
    if response.canceled:
        reason = response.cancel_reason or "no reason given"
        if "no leader" in reason or "leader changed" in reason:
            raise StoreUnavailable(f"{op}: etcd {endpoint} canceled the watch: {reason}")
        raise StoreRequestFailed(f"{op}: etcd {endpoint} canceled the watch: {reason}")


# --------------------------------------------------------------------- errors


@contextmanager
def translated(op: str) -> Iterator[None]:
    """Map gRPC errors and timeouts raised in the block to the ``StoreError`` hierarchy; ``op``
    names the operation in the message. Raises StoreUnavailable (transport failure, timeout),
    StoreRequestFailed (etcd refused); a StoreError passes unchanged."""
    try:
        yield
    except StoreError:
        raise
    except TimeoutError as e:
        raise StoreUnavailable(f"{op}: etcd unavailable: {describe(e)}") from e
    except grpc.aio.AioRpcError as e:
        if is_transport_failure(e):
            raise StoreUnavailable(f"{op}: etcd unavailable: {describe(e)}") from e
        raise StoreRequestFailed(f"{op}: etcd error: {describe(e)}") from e


def describe(error: BaseException) -> str:
    """One line for ``error``: a gRPC status as ``CODE: details`` (its repr spans lines), a
    StoreError as its message, anything else as its repr."""
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    if isinstance(error, StoreError):
        return str(error)
    if isinstance(error, TimeoutError):
        return "timed out"
    return " ".join(repr(error).split())


def is_transport_failure(error: grpc.aio.AioRpcError) -> bool:
    """Whether ``error`` means the connection failed or the member could not serve (no leader,
    its request to the leader timed out) rather than etcd refusing the request."""
    code = error.code()
    details = error.details() or ""
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return True
    if code == grpc.StatusCode.UNKNOWN and details in _ETCD_CONTEXT_ERRORS:
        return True
    return code == grpc.StatusCode.INTERNAL and details == _GRPC_CLIENT_INTERNAL_DETAILS


def _not_sent(error: grpc.aio.AioRpcError) -> bool:
    details = error.details() or ""
    return error.code() == grpc.StatusCode.UNAVAILABLE and details.startswith(
        _NOT_CONNECTED_DETAILS
    )


def grpc_code(error: BaseException) -> grpc.StatusCode | None:
    """The gRPC status code behind ``error`` (searched along its ``__cause__`` chain), if any."""
    current: BaseException | None = error
    while current is not None:
        if isinstance(current, grpc.aio.AioRpcError):
            code: grpc.StatusCode = current.code()
            return code
        current = current.__cause__
    return None


def prefix_range_end(prefix: bytes) -> bytes:
    """End of the range holding every key that starts with ``prefix`` (etcd convention: the
    prefix with its last byte below 0xff incremented and what follows dropped; ``b"\\0"``, every
    key, when there is none)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


# --------------------------------------------------------------------- shutdown helpers


async def bounded(aw: Awaitable[object], timeout_s: float, what: str) -> None:
    """Await ``aw`` for at most ``timeout_s``; log instead of raising on timeout or error (used in
    shutdown paths only; ``what`` names the step in the log)."""
    try:
        await asyncio.wait_for(aw, timeout_s)
    except TimeoutError:
        _log.warning("etcd.shutdown_step_timed_out", step=what, timeout_s=timeout_s)
    except (grpc.aio.AioRpcError, StoreError) as e:
        _log.warning("etcd.shutdown_step_failed", step=what, error=describe(e))


async def cancel_task(task: asyncio.Task[object], timeout_s: float) -> None:
    """Cancel ``task`` and wait for it at most ``timeout_s`` seconds (logs if it did not stop)."""
    task.cancel()
    _done, pending = await asyncio.wait({task}, timeout=timeout_s)
    if pending:
        _log.error("etcd.task_did_not_stop", task=task.get_name(), timeout_s=timeout_s)
