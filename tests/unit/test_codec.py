"""The API codec's checks of request fields (pure: no server)."""

from __future__ import annotations

import math

import pytest

from lightrail.controller.api.codec import MAX_TIMEOUT_S, InvalidRequest, timeout_from_pb
from lightrail.v1 import agent_pb2


def test_an_absent_timeout_is_the_controller_default() -> None:
    assert timeout_from_pb(agent_pb2.EnterPhaseRequest(job_id="j")) is None
    # a sender from before the field was optional that sent 0 put nothing on the wire
    old = agent_pb2.EnterPhaseRequest.FromString(
        agent_pb2.EnterPhaseRequest(job_id="j", rank=1).SerializeToString())
    assert timeout_from_pb(old) is None


def test_a_given_timeout_is_used_as_given() -> None:
    assert timeout_from_pb(agent_pb2.EnterPhaseRequest(timeout_s=2.5)) == 2.5
    assert timeout_from_pb(agent_pb2.EnterPhaseRequest(timeout_s=MAX_TIMEOUT_S)) == MAX_TIMEOUT_S


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan, MAX_TIMEOUT_S * 2])
def test_a_given_timeout_must_be_a_positive_finite_number_of_seconds(bad: float) -> None:
    with pytest.raises(InvalidRequest, match=r"^timeout_s: .* is not a finite number of seconds"):
        timeout_from_pb(agent_pb2.EnterPhaseRequest(timeout_s=bad))
