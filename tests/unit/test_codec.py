"""The API codec's checks of request fields (pure: no server)."""

from __future__ import annotations

import math

import pytest

from lightrail.controller.api.codec import (
    MAX_TIMEOUT_S,
    Interner,
    InvalidRequest,
    PhaseKeyDecoder,
    phase_key_to_pb,
    timeout_from_pb,
)
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup
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


def test_phase_ids_bind_per_stream_to_interned_phase_keys() -> None:
    interner = Interner()
    one, two = PhaseKeyDecoder(interner=interner), PhaseKeyDecoder(interner=interner)
    ring = PhaseKey(ProcessGroup.of(range(4)), Collective.ALL_REDUCE)
    pair = PhaseKey(ProcessGroup.of([0, 2]), Collective.SEND_RECV)
    one.define_phase(agent_pb2.DefinePhase(phase_id=5, phase=phase_key_to_pb(ring)))
    two.define_phase(agent_pb2.DefinePhase(phase_id=9, phase=phase_key_to_pb(ring)))
    assert one.phase(5) == ring
    assert one.phase(5) is two.phase(9)  # one object process-wide: lookups by identity
    assert one.phase_id_of(ring) == 5 and two.phase_id_of(ring) == 9
    with pytest.raises(InvalidRequest, match=r"enter_many\.phase_id: unknown phase id 9"):
        one.phase(9, "enter_many.phase_id")  # ids are per stream
    one.define_phase(agent_pb2.DefinePhase(phase_id=5, phase=phase_key_to_pb(pair)))
    assert one.phase(5) == pair and one.phase_id_of(ring) is None  # rebound
    with pytest.raises(InvalidRequest, match=r"define_phase\.phase: missing"):
        one.define_phase(agent_pb2.DefinePhase(phase_id=6))
    with pytest.raises(InvalidRequest, match=r"define_phase\.phase\.collective"):
        one.define_phase(agent_pb2.DefinePhase(phase_id=6, phase=agent_pb2.PhaseKey(
            group_ranks=[0, 1])))


def test_the_interned_groups_are_bounded_in_ranks_not_only_in_entries() -> None:
    """Found while fuzzing the servicers: any client's request added its groups to the
    process-wide tables, bounded to 65,536 entries of any size (each up to 10^6 ranks). Past
    ``max_ranks`` in all, groups and their phases are used as decoded, not kept."""
    interner = Interner(max_ranks=10)
    decoder = PhaseKeyDecoder(interner=interner)

    def ring(n: int) -> PhaseKey:
        return decoder.decode(agent_pb2.PhaseKey(group_ranks=range(n),
                                                 collective=agent_pb2.ALL_REDUCE))

    small, big = ring(4), ring(8)
    assert list(interner.groups) == [(0, 1, 2, 3)]  # 4 + 8 ranks would exceed 10
    assert ring(4) is small  # interned: one object
    assert ring(8) == big and ring(8) is not big  # used as decoded
