"""Morphlux's fragmented-slice integer program: hand-checked optima, never worse than the
heuristic on its objective, the time-limit fallback, bad inputs, and the slices-eval table."""

from __future__ import annotations

import heapq

import pytest

from lightrail.controller.cli.main import main
from lightrail.controller.torus.allocator import (
    AllocationPolicy,
    NoCapacityError,
    SliceMode,
    SparePolicy,
    TorusAllocator,
)
from lightrail.controller.torus.evaluation import Allocator, evaluate_slices, generate_trace
from lightrail.controller.torus.ilp import (
    FragmentedInputError,
    FragmentedProblem,
    IlpStatus,
    SlotPair,
    max_edge_load,
    solve_fragmented,
)
from lightrail.controller.torus.ilp_stitch import IlpStitcher
from lightrail.controller.torus.model import FailureDomainKind, TorusFabric
from lightrail.controller.torus.report import render_table


def test_two_slots_in_one_server_load_nothing() -> None:
    # one server with room for both slots: the pair's links stay inside it
    p = FragmentedProblem((2, 2), (SlotPair(0, 1, 2),), {0: 4, 1: 4}, {(0, 1): 2},
                          {(0, 1): ((0, 1),)})
    sol = solve_fragmented(p, 2.0)
    assert sol.status is IlpStatus.OPTIMAL
    assert sol.max_load == 0.0 and sol.slot_server is not None
    assert sol.slot_server[0] == sol.slot_server[1]
    assert sol.pair_routes == ((),)


def test_two_whole_servers_share_the_direct_edge() -> None:
    # servers 0 and 2 have room, server 1 none: 2 links over 4 fibres -> L = 2/4
    p = FragmentedProblem((4, 4), (SlotPair(0, 1, 2),), {0: 4, 1: 0, 2: 4},
                          {(0, 1): 2, (1, 2): 2, (0, 2): 4}, {(0, 2): ((0, 2),)})
    sol = solve_fragmented(p, 2.0)
    assert sol.status is IlpStatus.OPTIMAL and sol.max_load == 0.5
    assert sol.slot_server is not None and set(sol.slot_server) == {0, 2}
    assert sol.pair_routes == ((((0, 2), 2),),)


def test_a_route_may_cross_only_servers_of_the_slice() -> None:
    # 2 links, 1 direct fibre, and a detour through server 1 that holds no slot: no placement
    p = FragmentedProblem((4, 4), (SlotPair(0, 1, 2),), {0: 4, 1: 0, 2: 4},
                          {(0, 1): 4, (1, 2): 4, (0, 2): 1}, {(0, 2): ((0, 2), (0, 1, 2))})
    assert solve_fragmented(p, 2.0).status is IlpStatus.INFEASIBLE


def test_the_optimum_moves_both_links_to_the_detour() -> None:
    # a third (1-chip) slot must sit on server 1, so the detour 0-1-2 is the slice's own.
    # Direct: 1 link on 1 fibre -> L >= 1. Both links via 1: (0,1) 2/4 and (1,2) 2/4 plus the
    # 1-link pair to the middle slot on one of them: 3/4. So L* = 0.75, direct edge unused.
    p = FragmentedProblem((4, 4, 1), (SlotPair(0, 1, 2), SlotPair(1, 2, 1)),
                          {0: 4, 1: 1, 2: 4}, {(0, 1): 4, (1, 2): 4, (0, 2): 1},
                          {(0, 2): ((0, 2), (0, 1, 2)), (0, 1): ((0, 1),), (1, 2): ((1, 2),)})
    sol = solve_fragmented(p, 2.0)
    assert sol.status is IlpStatus.OPTIMAL and sol.max_load == pytest.approx(0.75)
    assert sol.slot_server is not None and sol.slot_server[2] == 1
    assert sol.pair_routes is not None and sol.pair_routes[0] == (((0, 1, 2), 2),)
    assert max_edge_load(p, sol.pair_routes) == pytest.approx(0.75)
    # the direct split would be worse: 1 direct + 1 via -> 1/1
    assert max_edge_load(p, ((((0, 2), 1), ((0, 1, 2), 1)), (((1, 2), 1),))) == 1.0


def test_ties_on_the_max_load_go_to_the_shorter_route() -> None:
    # one A-B link: direct over 2 fibres (1/2) or via the middle slot's server over 4-fibre
    # edges (1/4 and, with the B-C link, 2/4): both L = 0.5; the second solve takes 1 fibre
    p = FragmentedProblem((4, 4, 1), (SlotPair(0, 1, 1), SlotPair(1, 2, 1)),
                          {0: 4, 1: 1, 2: 4}, {(0, 1): 4, (1, 2): 4, (0, 2): 2},
                          {(0, 2): ((0, 2), (0, 1, 2)), (0, 1): ((0, 1),), (1, 2): ((1, 2),)})
    sol = solve_fragmented(p, 5.0)
    assert sol.status is IlpStatus.OPTIMAL and sol.max_load == pytest.approx(0.5)
    assert sol.pair_routes is not None and sol.pair_routes[0] == (((0, 2), 1),)


@pytest.mark.parametrize("seed", [2, 5])
def test_ilp_never_worse_than_the_heuristic_on_a_seeded_trace(seed: int) -> None:
    fabric = TorusFabric.parse("4x4x4")
    stitcher = IlpStitcher(time_limit_s=2.0)
    alloc = TorusAllocator(fabric, AllocationPolicy.LIGHTRAIL,
                           spares=SparePolicy(FailureDomainKind.RACK, 0), improver=stitcher)
    trace = generate_trace(fabric, 120, seed, load=1.0, mean_hold_s=3600.0,
                           tenant_chips=alloc.free_count())
    live: list[tuple[float, str]] = []
    for tr in trace:
        while live and live[0][0] <= tr.arrival_s:
            alloc.release(heapq.heappop(live)[1])
        try:
            s = alloc.allocate(tr.request)
        except NoCapacityError:
            continue
        heapq.heappush(live, (tr.arrival_s + tr.hold_s, s.slice_id))
        assert s.mode in (SliceMode.CONTIGUOUS, SliceMode.STITCHED)
    assert alloc.check_invariants() == []
    st = stitcher.stats
    assert st.solves > 0 and st.heuristic_load  # the trace needed stitching
    assert len(st.heuristic_load) == len(st.ilp_load)
    for h, i in zip(st.heuristic_load, st.ilp_load, strict=True):
        assert i <= h + 1e-9


def test_a_tiny_time_limit_falls_back_to_the_heuristic() -> None:
    ev = evaluate_slices(torus="4x4x4", requests=150, seed=2, frag_samples=5,
                         allocators=(Allocator.HEURISTIC, Allocator.ILP),
                         ilp_time_limit_s=1e-9)
    h, i = ev.result(Allocator.HEURISTIC), ev.result(Allocator.ILP)
    assert i.ilp_fallbacks > 0 and i.ilp_improved == 0 and i.ilp_rescued == 0
    # every program either fell back or only confirmed the heuristic: same decisions
    assert (i.accepted, i.rejected, i.bandwidth_gbps, i.fragmentation) == (
        h.accepted, h.rejected, h.bandwidth_gbps, h.fragmentation)
    assert "fell back to the heuristic's plan" in render_table(ev)


def test_bad_inputs_name_the_field_and_value() -> None:
    with pytest.raises(FragmentedInputError, match=r"slot_chips\[1\]: must be >= 1, got 0"):
        FragmentedProblem((4, 0), (), {0: 4}, {}, {})
    with pytest.raises(FragmentedInputError, match=r"pairs\[0\]: .* got \(0, 0\)"):
        FragmentedProblem((4,), (SlotPair(0, 0, 1),), {0: 4}, {}, {})
    with pytest.raises(FragmentedInputError, match=r"pairs\[0\].links: must be >= 1, got 0"):
        FragmentedProblem((4, 4), (SlotPair(0, 1, 0),), {0: 4}, {}, {})
    with pytest.raises(FragmentedInputError, match=r"server_free\[3\]: must be >= 0, got -1"):
        FragmentedProblem((4,), (), {3: -1}, {}, {})
    with pytest.raises(FragmentedInputError, match=r"edge_fibres: key .* got \(2, 1\)"):
        FragmentedProblem((4,), (), {1: 4}, {(2, 1): 1}, {})
    with pytest.raises(FragmentedInputError, match=r"routes\[\(0, 2\)\]: 0-2 .* edge_fibres"):
        FragmentedProblem((4,), (), {0: 4}, {(0, 1): 1}, {(0, 2): ((0, 2),)})
    with pytest.raises(FragmentedInputError, match=r"routes\[\(0, 1\)\]: a route must run"):
        FragmentedProblem((4,), (), {0: 4}, {(0, 1): 1}, {(0, 1): ((1, 0),)})
    ok = FragmentedProblem((4,), (), {0: 4}, {}, {})
    with pytest.raises(FragmentedInputError, match="time_limit_s: must be > 0, got 0"):
        solve_fragmented(ok, 0)
    with pytest.raises(FragmentedInputError, match="time_limit_s: must be > 0, got -1"):
        IlpStitcher(time_limit_s=-1)
    with pytest.raises(FragmentedInputError, match="k: must be >= 1, got 0"):
        IlpStitcher(k=0)
    with pytest.raises(ValueError, match="ilp_time_limit_s: must be > 0, got 0"):
        evaluate_slices(torus="4x4", requests=10, ilp_time_limit_s=0)
    with pytest.raises(ValueError, match="allocators: need distinct allocators"):
        evaluate_slices(torus="4x4", requests=10, allocators=())


def test_cli_prints_three_columns_and_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["slices-eval", "--torus", "4x4", "--requests", "60", "--seed", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    header = out[1].split()
    assert header == ["metric", "contiguous-only", "heuristic", "ilp"]
    labels = [line[:26].strip() for line in out[2:]]
    for row in ("rejection rate", "fragmentation", "box fragmentation", "probes above box",
                "Gb/s per chip", "stitched", "ILP solves", "ILP fell back (time limit)",
                "max edge load, heuristic", "max edge load, ILP"):
        assert row in labels
    ilp_row = next(line for line in out if line.startswith("ILP solves"))
    assert ilp_row.split()[-3:-1] == ["-", "-"]  # ILP rows only for the ilp column
    text = "\n".join(out)
    assert "heuristic vs contiguous-only: fragmentation" in text
    assert "ilp vs contiguous-only: fragmentation" in text
    assert "fragmentation: 1 - L/F" in text and "Why bandwidth grows" in text
    assert main(["slices-eval", "--torus", "4x4", "--requests", "30",
                 "--allocator", "heuristic"]) == 0
    one = capsys.readouterr().out.splitlines()
    assert one[1].split() == ["metric", "heuristic"]
    assert not any(line.startswith("ILP solves") for line in one)
    with pytest.raises(SystemExit):
        main(["slices-eval", "--ilp-time-limit", "0"])
    assert "--ilp-time-limit" in capsys.readouterr().err
