"""Process groups of a ParallelismSpec, checked member by member against hand-computed meshes.

Rank formulas (fastest axis first; see controller/parallelism.py for the sources):
  MEGATRON "tp-cp-ep-dp-pp" and TORCHTITAN [pp, dp_replicate, dp_shard, cp, tp]:
      rank = tp + TP*(cp + CP*(dp + DP*pp)),   dp = dp_shard + DP_SHARD*dp_replicate
  MEGATRON_TP_PP_DP "tp-cp-ep-pp-dp":
      rank = tp + TP*(cp + CP*(pp + PP*dp))
"""

from __future__ import annotations

import pytest

from lightrail.controller.domain.parallelism import (
    Dim,
    ParallelismError,
    ParallelismSpec,
    RankCoords,
    RankOrder,
)

MEGATRON = RankOrder.MEGATRON
TITAN = RankOrder.TORCHTITAN
TP_PP_DP = RankOrder.MEGATRON_TP_PP_DP


def ranks(spec: ParallelismSpec, dim: Dim) -> list[tuple[int, ...]]:
    return [g.ranks for g in spec.groups(dim)]


# --- tp=2, pp=2, dp=2 on 8 ranks -------------------------------------------------------------


@pytest.mark.parametrize("order", [MEGATRON, TITAN])
def test_tp2_pp2_dp2_pp_last_orders(order: RankOrder) -> None:
    # rank = tp + 2*dp + 4*pp
    spec = ParallelismSpec(tp=2, pp=2, dp_replicate=2, order=order)
    assert spec.world_size == 8
    assert ranks(spec, Dim.TP) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert ranks(spec, Dim.DP) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert ranks(spec, Dim.DP_REPLICATE) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert ranks(spec, Dim.DP_CP) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert ranks(spec, Dim.PP) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert ranks(spec, Dim.CP) == [(r,) for r in range(8)]
    assert ranks(spec, Dim.DP_SHARD) == [(r,) for r in range(8)]
    assert spec.coords(6) == RankCoords(
        rank=6, tp=0, cp=0, dp_shard=0, dp_replicate=1, dp=1, pp=1, ep=0, expert_dp=1
    )
    assert spec.group_of(Dim.PP, 6).ranks == (2, 6)
    assert spec.group_of(Dim.DP, 6).ranks == (4, 6)
    assert spec.stage_pairs(0) == spec.groups(Dim.PP)


def test_tp2_pp2_dp2_tp_pp_dp_order() -> None:
    # rank = tp + 2*pp + 4*dp  (Megatron --use-tp-pp-dp-mapping)
    spec = ParallelismSpec(tp=2, pp=2, dp_replicate=2, order=TP_PP_DP)
    assert ranks(spec, Dim.TP) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert ranks(spec, Dim.PP) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert ranks(spec, Dim.DP) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    c = spec.coords(6)
    assert (c.tp, c.pp, c.dp) == (0, 1, 1)
    assert spec.rank_of(tp=1, pp=1, dp_replicate=0) == 3


def test_megatron_docstring_example_16_gpus() -> None:
    """Megatron-Core initialize_model_parallel docstring: 16 GPUs, tp=2, pp=4 -> dp=2."""
    spec = ParallelismSpec(tp=2, pp=4, dp_replicate=2)
    assert ranks(spec, Dim.DP) == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11),
                                   (12, 14), (13, 15)]
    assert ranks(spec, Dim.TP) == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11),
                                   (12, 13), (14, 15)]
    assert ranks(spec, Dim.PP) == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]


# --- tp=2, cp=2, dp=2 ------------------------------------------------------------------------


@pytest.mark.parametrize("order", [MEGATRON, TITAN, TP_PP_DP])
def test_tp2_cp2_dp2(order: RankOrder) -> None:
    # rank = tp + 2*cp + 4*dp in every order when pp == 1
    spec = ParallelismSpec(tp=2, cp=2, dp_replicate=2, order=order)
    assert ranks(spec, Dim.TP) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert ranks(spec, Dim.CP) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert ranks(spec, Dim.DP) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert ranks(spec, Dim.DP_CP) == [(0, 2, 4, 6), (1, 3, 5, 7)]
    assert ranks(spec, Dim.PP) == [(r,) for r in range(8)]
    c = spec.coords(5)
    assert (c.tp, c.cp, c.dp, c.pp) == (1, 0, 1, 0)


def test_hsdp_split_dp_shard_is_inner() -> None:
    # dp = dp_shard + 2*dp_replicate; rank = tp + 2*dp (tp=2, dp_replicate=2, dp_shard=2)
    for order in (MEGATRON, TITAN):
        spec = ParallelismSpec(tp=2, dp_replicate=2, dp_shard=2, order=order)
        assert ranks(spec, Dim.DP_SHARD) == [(0, 2), (1, 3), (4, 6), (5, 7)]
        assert ranks(spec, Dim.DP_REPLICATE) == [(0, 4), (1, 5), (2, 6), (3, 7)]
        assert ranks(spec, Dim.DP) == [(0, 2, 4, 6), (1, 3, 5, 7)]
        assert ranks(spec, Dim.DP_SHARD_CP) == ranks(spec, Dim.DP_SHARD)
        c = spec.coords(6)
        assert (c.dp_shard, c.dp_replicate, c.dp) == (1, 1, 3)


# --- EP carved out of DP x CP ----------------------------------------------------------------


@pytest.mark.parametrize("order", [MEGATRON, TITAN, TP_PP_DP])
def test_ep2_with_dp4(order: RankOrder) -> None:
    # tp=2, dp=4 (sharded), ep=2: rank = tp + 2*j with j = dp; ep = j % 2, expert_dp = j // 2
    spec = ParallelismSpec(tp=2, dp_shard=4, ep=2, order=order)
    assert ranks(spec, Dim.EP) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert ranks(spec, Dim.EXPERT_DP) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert ranks(spec, Dim.TP) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    c = spec.coords(6)
    assert (c.ep, c.expert_dp) == (1, 1)
    assert spec.group_of(Dim.EP, 6).ranks[c.ep] == 6


def test_ep_spans_dp_replicate_in_megatron_only_when_divisible() -> None:
    # dp_replicate=2, dp_shard=2, ep=2: EP stays within a replica (j = dp_shard + 2*dp_replicate)
    for order in (MEGATRON, TITAN):
        spec = ParallelismSpec(dp_replicate=2, dp_shard=2, ep=2, order=order)
        assert ranks(spec, Dim.EP) == [(0, 1), (2, 3)]
        assert ranks(spec, Dim.EXPERT_DP) == [(0, 2), (1, 3)]


def test_ep_borrows_cp_first() -> None:
    # cp=2, dp_shard=2, ep=2, tp=1: j = cp + 2*dp; EP = consecutive j = the CP groups
    spec = ParallelismSpec(cp=2, dp_shard=2, ep=2, order=TITAN)
    assert ranks(spec, Dim.EP) == ranks(spec, Dim.CP) == [(0, 1), (2, 3)]
    # ep=4 over cp=2 x dp_shard=2: one EP group of all four ranks, expert-DP singletons
    spec4 = ParallelismSpec(cp=2, dp_shard=2, ep=4, order=TITAN)
    assert ranks(spec4, Dim.EP) == [(0, 1, 2, 3)]
    assert ranks(spec4, Dim.EXPERT_DP) == [(0,), (1,), (2,), (3,)]


def test_megatron_ep_smaller_than_cp() -> None:
    # Megatron accepts ep=2 with cp=4 (torchtitan does not): EP = pairs of consecutive cp
    spec = ParallelismSpec(cp=4, ep=2, order=MEGATRON)
    assert ranks(spec, Dim.EP) == [(0, 1), (2, 3)]
    assert ranks(spec, Dim.EXPERT_DP) == [(0, 2), (1, 3)]


def test_groups_at_stage_and_stage_pairs() -> None:
    spec = ParallelismSpec(tp=2, pp=3, dp_replicate=2)  # rank = tp + 2*dp + 4*pp
    assert [g.ranks for g in spec.groups_at_stage(Dim.DP, 1)] == [(4, 6), (5, 7)]
    assert [g.ranks for g in spec.groups_at_stage(Dim.TP, 2)] == [(8, 9), (10, 11)]
    assert [g.ranks for g in spec.stage_pairs(1)] == [(4, 8), (5, 9), (6, 10), (7, 11)]


def test_every_rank_in_exactly_one_group_and_coords_round_trip() -> None:
    spec = ParallelismSpec(tp=2, pp=2, dp_replicate=2, dp_shard=2, cp=2, ep=4, order=TITAN)
    for dim in Dim:
        seen = [r for g in spec.groups(dim) for r in g.ranks]
        assert sorted(seen) == list(range(spec.world_size)), dim
        assert all(g.size == spec.size(dim) for g in spec.groups(dim)), dim
    for r in range(spec.world_size):
        c = spec.coords(r)
        assert spec.rank_of(tp=c.tp, cp=c.cp, dp_shard=c.dp_shard,
                            dp_replicate=c.dp_replicate, pp=c.pp) == r
        assert spec.group_of(Dim.DP, r).ranks[c.dp] == r
        assert spec.group_of(Dim.EXPERT_DP, r).ranks[c.expert_dp] == r


def test_spec_is_a_value() -> None:
    a = ParallelismSpec(tp=2, dp_replicate=2)
    b = ParallelismSpec(tp=2, dp_replicate=2)
    a.groups(Dim.TP)  # fills a's cache only
    assert a == b
    assert hash(a) == hash(b)


# --- invalid specs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp": 0}, r"tp: must be >= 1, got 0"),
        ({"pp": -2}, r"pp: must be >= 1, got -2"),
        ({"cp": True}, r"cp: must be an integer >= 1, got True"),
        ({"dp_shard": 2.0}, r"dp_shard: must be an integer >= 1, got 2.0"),
        ({"order": "tp-cp-ep-dp-pp"}, r"order: must be a RankOrder"),
        ({"dp_shard": 4, "ep": 3}, r"ep: 3 must divide dp_shard\*cp = 4\*1 = 4"),
        # EP cannot cross dp_replicate (Megatron: expert-DP divisible by DistOpt instances)
        ({"dp_replicate": 4, "ep": 2}, r"ep: 2 must divide dp_shard\*cp = 1\*1 = 1"),
        ({"cp": 4, "ep": 2, "order": TITAN}, r"ep: 2 must be a multiple of cp = 4"),
        ({"pp": 2, "cp": 2, "order": TP_PP_DP}, r"ep: 1 must equal cp = 2 .* pp = 2 > 1"),
        ({"pp": 2, "dp_shard": 2, "ep": 2, "order": TP_PP_DP}, r"ep: 2 must equal cp = 1"),
    ],
)
def test_invalid_spec_names_field_and_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ParallelismError, match=message):
        ParallelismSpec(**kwargs)  # type: ignore[arg-type]


def test_valid_edge_specs() -> None:
    ParallelismSpec(cp=4, ep=2, order=MEGATRON)  # Megatron does not require cp | ep
    ParallelismSpec(pp=2, cp=2, ep=2, order=TP_PP_DP)  # ep == cp
    ParallelismSpec(cp=2, pp=2, order=MEGATRON)  # pp-last order: any cp


def test_world_size_mismatch() -> None:
    spec = ParallelismSpec(tp=2, pp=2, dp_replicate=2)
    spec.check_world_size(8)
    with pytest.raises(
        ParallelismError,
        match=r"world_size: the job has 16 ranks but tp\*pp\*dp_replicate\*dp_shard\*cp = "
        r"2\*2\*2\*1\*1 = 8",
    ):
        spec.check_world_size(16)


def test_bad_rank_and_coordinates() -> None:
    spec = ParallelismSpec(tp=2, pp=2)
    with pytest.raises(ParallelismError, match=r"rank: 4 out of range 0..3"):
        spec.coords(4)
    with pytest.raises(ParallelismError, match=r"rank: -1 out of range"):
        spec.group_of(Dim.TP, -1)
    with pytest.raises(ParallelismError, match=r"tp: coordinate 2 out of range 0..1"):
        spec.rank_of(tp=2)
    with pytest.raises(ParallelismError, match=r"stage: 1 out of range 0..0"):
        spec.stage_pairs(1)
    with pytest.raises(ParallelismError, match=r"stage: 2 out of range 0..1"):
        spec.groups_at_stage(Dim.TP, 2)
    with pytest.raises(ParallelismError, match=r"dim: PP groups span every stage"):
        spec.groups_at_stage(Dim.PP, 0)
