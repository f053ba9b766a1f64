"""The host agent's batching (pure: no stream): what one write of accumulated requests puts on
the wire, and in which order."""

from __future__ import annotations

import pytest

from lightrail.agents.host import agent as agent_mod
from lightrail.agents.host.agent import HostAgent, _Encoder, _Kind, _Out
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup

RING = PhaseKey(ProcessGroup.of(range(4)), Collective.ALL_REDUCE)
PAIR = PhaseKey(ProcessGroup.of([0, 2]), Collective.SEND_RECV)


def kinds(batch: object) -> list[str]:
    return [r.WhichOneof("kind") for r in batch.requests]  # type: ignore[attr-defined]


def test_one_instance_goes_out_as_one_enter_many_after_releases_and_holds() -> None:
    enc = _Encoder()
    out = enc.encode([
        _Out(_Kind.ENTER, "job", 0, PAIR, 0, 7, 5.0),
        _Out(_Kind.ENTER, "job", 2, PAIR, 0, 7, 5.0),
        _Out(_Kind.RELEASE, "job", 0, RING, 0),
        _Out(_Kind.HELD, "job", 3, RING, 0),
        _Out(_Kind.RELEASE, "job", 2, RING, 0),
    ])
    assert kinds(out) == ["define_phase", "release_many", "define_group", "held",
                          "define_phase", "enter_many"]
    rel, held, many = out.requests[1].release_many, out.requests[3].held, out.requests[5]
    assert list(rel.ranks) == [0, 2] and rel.phase_id == 0
    assert held.rank == 3 and held.phase.group_id == RING.group.group_id
    e = many.enter_many
    assert (list(e.ranks), e.request_id, e.phase_id, e.timeout_s) == ([0, 2], 7, 1, 5.0)
    # the phase ids stay defined on the stream: no second DefinePhase
    again = enc.encode([_Out(_Kind.RELEASE, "job", 0, PAIR, 0)])
    assert kinds(again) == ["release_many"] and again.requests[0].release_many.phase_id == 1


def test_beyond_the_phase_id_limit_requests_go_out_per_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(agent_mod, "MAX_PHASE_IDS", 1)
    enc = _Encoder()
    out = enc.encode([
        _Out(_Kind.RELEASE, "job", 0, RING, 0),
        _Out(_Kind.ENTER, "job", 0, PAIR, 0, 8, None),
        _Out(_Kind.ENTER, "job", 2, PAIR, 0, 8, None),
    ])
    assert kinds(out) == ["define_phase", "release_many", "define_group", "enter", "enter"]
    assert [r.enter.rank for r in out.requests[3:]] == [0, 2]
    assert not out.requests[3].enter.HasField("timeout_s")  # None: the controller's default


async def test_enters_of_one_instance_share_one_request_id() -> None:
    agent = HostAgent("host0", "127.0.0.1:1")  # never started: no stream
    batch = [_Out(_Kind.ENTER, "job", r, PAIR, 0, 100 + r, 5.0) for r in (0, 2)]
    batch.append(_Out(_Kind.ENTER, "job", 1, RING, 0, 101, 5.0))
    agent._share_ids(batch)
    assert batch[0].request_id == batch[1].request_id != 100
    assert batch[2].request_id == 101  # alone in its instance: unchanged


def test_a_cancel_goes_out_before_the_ranks_next_enter() -> None:
    # the rank gave up request 7 (its job restarts) and enters the ring: the controller must
    # withdraw the wait first, or the enter would find the rank busy
    out = _Encoder().encode([
        _Out(_Kind.ENTER, "job", 0, RING, 1, 9, 5.0),
        _Out(_Kind.RELEASE, "job", 2, RING, 0),
        _Out(_Kind.CANCEL, "job", 0, PAIR, 1, 7),
    ])
    assert kinds(out) == ["cancel_enter", "define_phase", "release_many", "enter_many"]
    c = out.requests[0].cancel_enter
    assert (c.job_id, c.rank, c.request_id) == ("job", 0, 7)
