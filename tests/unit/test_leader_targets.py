"""Finding the leader among controller replicas (``lightrail.agents.leader``), the standby's
redirect (``lightrail.controller.api.routing.LeaderRoute``) and ``controller.advertise``:
pure logic, the gRPC errors built as the servers send them."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health

from lightrail.agents.leader import MAX_REDIRECTS, LeaderTargets, NoLeader, parse_targets
from lightrail.controller.api.routing import LeaderRoute
from lightrail.controller.config import ConfigError, parse_config


def rpc_error(code: grpc.StatusCode, details: str, *trailing: tuple[str, str]
              ) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details,
                                None)


def redirect(leader: str) -> grpc.aio.AioRpcError:
    return rpc_error(grpc.StatusCode.UNAVAILABLE, f"not the leader; leader is {leader}",
                     ("lightrail-error", "not_leader"), ("lightrail-leader", leader))


def unreachable() -> grpc.aio.AioRpcError:
    return rpc_error(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")


class Replicas:
    """Attempts answered from a table: address -> the error it raises (or None: it leads)."""

    def __init__(self, answers: dict[str, grpc.aio.AioRpcError | None]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    async def __call__(self, address: str) -> str:
        self.calls.append(address)
        exc = self.answers[address]
        if exc is not None:
            raise exc
        return f"answer of {address}"


def test_parse_targets_keeps_order_and_names_bad_values() -> None:
    assert parse_targets("a:1, b:2,a:1") == ("a:1", "b:2")
    assert parse_targets(["c:3", "a:1"]) == ("c:3", "a:1")
    with pytest.raises(ValueError, match=r"controller: empty address in 'a:1,,b:2'"):
        parse_targets("a:1,,b:2")
    with pytest.raises(ValueError, match=r"controller: empty address in ''"):
        parse_targets("")
    with pytest.raises(ValueError, match=r"controller: no address in \[\]"):
        parse_targets([])


async def test_a_standby_redirect_is_followed_and_the_leader_becomes_current() -> None:
    replicas = Replicas({"a:1": redirect("c:3"), "b:2": None, "c:3": None})
    targets = LeaderTargets("a:1,b:2,c:3")
    assert await targets.call(replicas) == "answer of c:3"
    assert replicas.calls == ["a:1", "c:3"]  # straight to the named leader, b:2 not tried
    assert targets.current == "c:3"
    assert await targets.call(replicas) == "answer of c:3"
    assert replicas.calls[-1] == "c:3"  # the next call starts at the leader


async def test_unreachable_addresses_are_skipped_and_none_leading_lists_every_attempt() -> None:
    replicas = Replicas({"a:1": unreachable(), "b:2": None})
    assert await LeaderTargets("a:1,b:2").call(replicas) == "answer of b:2"
    nobody = Replicas({
        "a:1": unreachable(),
        "b:2": rpc_error(grpc.StatusCode.UNAVAILABLE, "not the leader; no leader elected yet",
                         ("lightrail-error", "not_leader"), ("lightrail-leader", "")),
    })
    with pytest.raises(NoLeader) as info:
        await LeaderTargets("a:1,b:2").call(nobody)
    assert str(info.value) == (
        "no controller replica leads: tried a:1 (UNAVAILABLE: failed to connect to all "
        "addresses); b:2 (UNAVAILABLE: not the leader; no leader elected yet)")


async def test_redirects_are_bounded_when_replicas_disagree() -> None:
    # a and b name each other (an election settling): bounded, then NoLeader
    replicas = Replicas({"a:1": redirect("b:2"), "b:2": redirect("a:1")})
    with pytest.raises(NoLeader) as info:
        await LeaderTargets("a:1,b:2").call(replicas)
    assert len(replicas.calls) == MAX_REDIRECTS + 1
    assert [a.address for a in info.value.attempts] == replicas.calls


async def test_the_leaders_own_answers_and_refusals_are_not_retried_elsewhere() -> None:
    not_found = rpc_error(grpc.StatusCode.NOT_FOUND, "job_id: unknown job 'x'")
    replicas = Replicas({"a:1": not_found, "b:2": None})
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await LeaderTargets("a:1,b:2").call(replicas)
    assert info.value is not_found
    # a final NOT_LEADER refusal (no lightrail-leader: e.g. a fenced leader's waiting rank)
    refused = rpc_error(grpc.StatusCode.UNAVAILABLE, "controller lost its leader lease",
                        ("lightrail-error", "not_leader"))
    replicas = Replicas({"a:1": refused, "b:2": None})
    with pytest.raises(grpc.aio.AioRpcError):
        await LeaderTargets("a:1,b:2").call(replicas)
    assert replicas.calls == ["a:1"]


async def test_a_standby_redirect_names_the_leader_or_none() -> None:
    leader: list[str | None] = [None]
    route = LeaderRoute(lambda: leader[0], "me:1",
                        health.aio.HealthServicer())  # type: ignore[attr-defined]
    assert route.redirect_status() == (
        "not the leader; no leader elected yet (election in progress)",
        (("lightrail-error", "not_leader"), ("lightrail-leader", "")))
    leader[0] = "other:2"
    assert route.redirect_status() == (
        "not the leader; leader is other:2",
        (("lightrail-error", "not_leader"), ("lightrail-leader", "other:2")))
    leader[0] = "me:1"  # it won but does not serve yet: no redirect to itself
    details, metadata = route.redirect_status()
    assert details.startswith("me:1 leads but does not serve yet")
    assert ("lightrail-leader", "") in metadata


@pytest.mark.parametrize(("advertise", "message"), [
    ("0.0.0.0:50051", "controller.advertise: Value error, '0.0.0.0:50051' binds every "
                      "interface; advertise an address clients can dial"),
    ("[::]:50051", "controller.advertise: Value error, '[::]:50051' binds every interface"),
    ("ctl-1:0", "controller.advertise: Value error, 'ctl-1:0': advertise the port clients "
                "dial, not 0"),
    ("ctl-1", "controller.advertise: Value error, expected HOST:PORT"),
])
def test_advertise_must_be_dialable(advertise: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"controller": {"advertise": advertise}})
    assert info.value.problems[0].startswith(message)
    assert parse_config({"controller": {"advertise": "ctl-1.example:50051"}}
                        ).controller.advertise == "ctl-1.example:50051"
