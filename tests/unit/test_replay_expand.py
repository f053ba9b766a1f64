"""Expanding a trace that records only some ranks into per-rank replay ops."""

from __future__ import annotations

from lightrail.agents.replay.replayer import expand_workload
from lightrail.agents.replay.trace.model import CommOp, Direction, SourceFormat, Workload
from lightrail.controller.domain.model import Collective, ProcessGroup


def _send(peer: int) -> CommOp:
    return CommOp(Collective.SEND_RECV, None, "pp", 1024, 0.0, direction=Direction.SEND,
                  peer=peer)


def test_recorded_ranks_pair_with_their_peer_and_copies_do_not_guess_one() -> None:
    ring = CommOp(Collective.ALL_REDUCE, ProcessGroup.of(range(4)), "dp", 4096, 0.0)
    wl = Workload("t", SourceFormat.KINETO, 4, {0: (ring, _send(1))})
    ranks, notes = expand_workload(wl)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert ranks[0][1].group == ProcessGroup.of([0, 1])  # recorded: {rank, peer}
    for r in (1, 2, 3):
        assert ranks[r][0].group == ProcessGroup.of(range(4))  # the shared group is kept
        assert ranks[r][1].group is None  # rank 0's peer is not rank r's partner
    assert any("ranks 1..3 are assumed to run the same sequence as rank 0" in n for n in notes)
    assert any("peers of rank 0 are not carried over" in n for n in notes)
