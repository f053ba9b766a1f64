"""``EtcdClient.call``'s failover rule on scripted gRPC outcomes (no etcd): which failures move
to the next member and resend, which are raised, and what the error names."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest

from lightrail.controller.store.client import EtcdClient, Retry, prefix_range_end
from lightrail.controller.store.errors import StoreRequestFailed, StoreUnavailable

ENDPOINTS = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
NOT_CONNECTED = "failed to connect to all addresses; last error: UNKNOWN: Connection refused"


def status(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    metadata = grpc.aio.Metadata()
    return grpc.aio.AioRpcError(code, metadata, metadata, details, details)


class Script:
    """Answers each attempt with the next outcome (an error to raise or a value), recording the
    endpoint it went to."""

    def __init__(self, *outcomes: object) -> None:
        self.outcomes = list(outcomes)
        self.sent_to: list[str] = []

    async def __call__(self, member: object, remaining_s: float) -> object:
        self.sent_to.append(member.endpoint)  # type: ignore[attr-defined]
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


async def run(script: Script, retry: Retry, timeout_s: float = 2.0) -> object:
    client = EtcdClient(ENDPOINTS, timeout_s=timeout_s)
    try:
        return await client.call("op", script, retry=retry)
    finally:
        await client.close()


async def test_a_call_that_was_never_sent_moves_to_the_next_member_whatever_its_kind() -> None:
    for retry in Retry:
        script = Script(status(grpc.StatusCode.UNAVAILABLE, NOT_CONNECTED), "answer")
        assert await run(script, retry) == "answer"
        assert script.sent_to == ENDPOINTS[:2]


async def test_a_call_that_may_have_been_applied_is_resent_only_if_that_is_safe() -> None:
    broken = status(grpc.StatusCode.UNAVAILABLE, "Socket closed")
    script = Script(broken, "answer")
    assert await run(script, Retry.ALWAYS) == "answer"
    assert script.sent_to == ENDPOINTS[:2]

    script = Script(status(grpc.StatusCode.UNAVAILABLE, "Socket closed"), "never")
    with pytest.raises(StoreUnavailable) as info:
        await run(script, Retry.IF_NOT_SENT)
    assert script.sent_to == ENDPOINTS[:1]
    assert "127.0.0.1:1" in str(info.value) and "may have been applied" in str(info.value)


async def test_etcd_refusing_is_raised_at_once_naming_the_member() -> None:
    script = Script(status(grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: bad"), "never")
    with pytest.raises(StoreRequestFailed) as info:
        await run(script, Retry.ALWAYS)
    assert script.sent_to == ENDPOINTS[:1]
    assert str(info.value) == "op: etcd 127.0.0.1:1 refused: FAILED_PRECONDITION: etcdserver: bad"


async def test_a_member_without_leader_is_transient_and_context_errors_too() -> None:
    script = Script(
        status(grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader"),
        status(grpc.StatusCode.UNKNOWN, "context deadline exceeded"),
        "answer",
    )
    assert await run(script, Retry.ALWAYS) == "answer"
    assert script.sent_to == ENDPOINTS


async def test_when_no_member_answers_in_time_every_endpoint_is_named() -> None:
    script = Script(*[status(grpc.StatusCode.UNAVAILABLE, NOT_CONNECTED)] * 100)
    with pytest.raises(StoreUnavailable) as info:
        await run(script, Retry.ALWAYS, timeout_s=0.3)
    message = str(info.value)
    assert message.startswith("op: etcd unavailable: no member answered within 0.3 s: ")
    assert all(f"{endpoint}: UNAVAILABLE: failed to connect" in message for endpoint in ENDPOINTS)
    assert len(script.sent_to) >= 3  # every member tried, then again after a pause


def test_prefix_range_end_follows_the_etcd_convention() -> None:
    assert prefix_range_end(b"/a/") == b"/a0"
    assert prefix_range_end(b"a\xff") == b"b"
    assert prefix_range_end(b"\xff\xff") == b"\0"


async def test_every_call_is_observed_once_with_its_method_failover_included() -> None:
    observed: list[tuple[str, float]] = []
    client = EtcdClient(ENDPOINTS, timeout_s=2.0,
                        observe=lambda method, s: observed.append((method, s)))
    try:
        script = Script(status(grpc.StatusCode.UNAVAILABLE, NOT_CONNECTED), "answer")
        assert await client.call("op", script, retry=Retry.ALWAYS, method="put") == "answer"
        assert [m for m, _ in observed] == ["put"]  # two attempts, one request
        refused = Script(status(grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: bad"))
        with pytest.raises(StoreRequestFailed):
            await client.call("op", refused, retry=Retry.ALWAYS, method="txn")
        assert [m for m, _ in observed] == ["put", "txn"]  # an error is timed too
        assert all(s >= 0 for _, s in observed)
    finally:
        await client.close()
