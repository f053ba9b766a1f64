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


def test_a_phase_gets_one_id_per_stream() -> None:
    """Found by an attack on the wire: ids 2 and 5 both bound to one phase; an enter by id 2
    was answered under id 5 (the reply names the phase by ``phase_id_of``), and after id 5 was
    rebound, answers to id 2 came back per rank. A second id for a bound phase is refused."""
    decoder = PhaseKeyDecoder(interner=Interner())
    pair = PhaseKey(ProcessGroup.of([0, 2]), Collective.SEND_RECV)
    ring = PhaseKey(ProcessGroup.of(range(4)), Collective.ALL_REDUCE)
    decoder.define_phase(agent_pb2.DefinePhase(phase_id=2, phase=phase_key_to_pb(pair)))
    with pytest.raises(InvalidRequest, match=(
            r"^define_phase\.phase_id: 5: phase send_recv\[0,2\]#0\.0 is defined as id 2 on "
            r"this stream already")):
        decoder.define_phase(agent_pb2.DefinePhase(phase_id=5, phase=phase_key_to_pb(pair)))
    with pytest.raises(InvalidRequest, match="unknown phase id 5"):
        decoder.phase(5)  # nothing was bound
    assert decoder.phase(2) == pair and decoder.phase_id_of(pair) == 2
    decoder.define_phase(agent_pb2.DefinePhase(phase_id=2, phase=phase_key_to_pb(pair)))  # again
    decoder.define_phase(agent_pb2.DefinePhase(phase_id=2, phase=phase_key_to_pb(ring)))
    decoder.define_phase(agent_pb2.DefinePhase(phase_id=5, phase=phase_key_to_pb(pair)))  # free
    assert (decoder.phase_id_of(ring), decoder.phase_id_of(pair)) == (2, 5)


def test_the_groups_a_stream_binds_are_bounded_in_ranks() -> None:
    """Found by an attack on the wire: each DefinePhase of a 10^6-rank group kept ~80 MB for
    the stream's life, up to 65,536 of them. Each distinct group counts once; a binding that
    is replaced frees its group's ranks; a refusal changes nothing."""
    decoder = PhaseKeyDecoder(interner=Interner(max_ranks=0), max_ranks=10)

    def define(phase_id: int, ranks: range | list[int], seq: int = 0) -> None:
        decoder.define_phase(agent_pb2.DefinePhase(phase_id=phase_id, phase=agent_pb2.PhaseKey(
            group_ranks=ranks, collective=agent_pb2.ALL_REDUCE, seq=seq)))

    define(1, range(6))
    define(2, range(6), seq=1)  # the same group: counted once
    assert decoder.bound_ranks == 6
    with pytest.raises(InvalidRequest, match=(
            r"^define_phase\.phase: a group of 5 ranks would take the groups this stream "
            r"defined to 11 ranks, more than 10$")):
        define(3, range(10, 15))
    with pytest.raises(InvalidRequest, match="unknown phase id 3"):
        decoder.phase(3)
    group = ProcessGroup.of(range(20, 24))
    decoder.define(agent_pb2.DefineGroup(group_id=group.group_id, ranks=group.ranks))
    assert decoder.bound_ranks == 10
    other = ProcessGroup.of([30, 31])
    with pytest.raises(InvalidRequest, match=r"^define_group\.ranks: a group of 2 ranks .* "
                                             r"to 12 ranks, more than 10$"):
        decoder.define(agent_pb2.DefineGroup(group_id=other.group_id, ranks=other.ranks))
    with pytest.raises(InvalidRequest, match="to 12 ranks, more than 10"):
        define(1, [0, 1])  # range(6) stays bound by id 2: nothing would be freed
    assert decoder.phase(1).group == ProcessGroup.of(range(6))  # the refusal changed nothing
    assert decoder.bound_ranks == 10
    define(2, range(20, 24))  # onto a group bound already: nothing added, range(6) kept
    assert decoder.bound_ranks == 10
    define(1, range(2))  # the last binding of range(6) goes: 4 + 2
    assert decoder.bound_ranks == 6
    define(3, range(10, 14))
    assert decoder.bound_ranks == 10


def test_interned_groups_do_not_count_against_a_stream() -> None:
    # shared by every stream and bounded process-wide: a legitimate agent's groups are these
    interner = Interner(max_ranks=100)
    decoder = PhaseKeyDecoder(interner=interner, max_ranks=10)
    for phase_id, n in enumerate((40, 50)):
        decoder.define_phase(agent_pb2.DefinePhase(phase_id=phase_id, phase=agent_pb2.PhaseKey(
            group_ranks=range(n), collective=agent_pb2.ALL_REDUCE)))
    assert decoder.bound_ranks == 0 and len(interner.groups) == 2
    with pytest.raises(InvalidRequest, match="a group of 20 ranks"):  # past the interner
        decoder.define_phase(agent_pb2.DefinePhase(phase_id=9, phase=agent_pb2.PhaseKey(
            group_ranks=range(20), collective=agent_pb2.ALL_REDUCE)))


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


def test_the_groups_all_streams_bind_are_bounded_and_a_closed_stream_gives_its_share_back(
) -> None:
    """Found by a second attack: a bound per stream still let a client that opened three
    streams pin 1.3 GB. The server's streams share ``max_unshared_ranks``."""
    interner = Interner(max_ranks=0, max_unshared_ranks=10)
    one, two = PhaseKeyDecoder(interner=interner), PhaseKeyDecoder(interner=interner)

    def define(decoder: PhaseKeyDecoder, phase_id: int, ranks: range) -> None:
        decoder.define_phase(agent_pb2.DefinePhase(phase_id=phase_id, phase=agent_pb2.PhaseKey(
            group_ranks=ranks, collective=agent_pb2.ALL_REDUCE)))

    define(one, 1, range(6))
    with pytest.raises(InvalidRequest, match=(
            r"^define_phase\.phase: a group of 6 ranks would take the groups all streams "
            r"defined to 12 ranks, more than 10$")):
        define(two, 1, range(10, 16))
    assert (interner.unshared_ranks, two.bound_ranks) == (6, 0)  # the refusal changed nothing
    one.close()  # its stream ended
    assert interner.unshared_ranks == 0
    with pytest.raises(InvalidRequest, match="unknown phase id 1"):
        one.phase(1)
    define(two, 1, range(10, 16))
    assert (interner.unshared_ranks, two.bound_ranks) == (6, 6)
