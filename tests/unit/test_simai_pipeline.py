"""The pipeline traffic of SimAI workloads with pp > 1 (``simai_pipeline``): the stage split
of ``scale_simai``, the send/recv pairs, sizes and GPipe waits against a hand count, the class
schedule against the per-rank one, and the errors of inconsistent headers."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightrail.agents.replay.trace import read_simai
from lightrail.agents.replay.trace.megatron import (
    Demand,
    GroupKind,
    MegatronSchedule,
    ParallelLayout,
    expand_per_rank,
)
from lightrail.agents.replay.trace.model import Direction, TraceError
from lightrail.agents.replay.trace.simai_pipeline import gpipe_waits
from lightrail.agents.replay.trace.simai_scale import scale_simai, stage_layers
from lightrail.controller.domain.model import Collective, ProcessGroup

AR, AG, RS, SR = (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER,
                  Collective.SEND_RECV)


def line(name: str, fwd: str, ig: str, wg: str) -> str:
    return "\t".join([name, "-1", *fwd.split(), *ig.split(), *wg.split(), "100"])


MICROBATCH = [
    line("embedding_layer", "10 ALLREDUCE 16", "20 ALLREDUCE 16", "30 NONE 0"),
    line("attention_layer", "100 ALLREDUCE 16", "200 ALLREDUCE 16", "300 NONE 0"),
    line("embedding_norm", "1000 ALLREDUCE 32", "2000 NONE 0", "3000 NONE 0"),
]
LAYERS = [line("grad_norm", "1 ALLGATHER 64", "1 NONE 0", "1 REDUCESCATTER 800"),
          *MICROBATCH, *MICROBATCH,
          line("cross_entropy1", "5 ALLREDUCE 8", "6 NONE 0", "7 NONE 0")]
HEADER = ("HYBRID_TRANSFORMER_FWD_IN_BCKWD\tmodel_parallel_NPU_group: 2 ep: 1 pp: 3 vpp: 1 "
          "ga: 2 all_gpus: 12 checkpoints: 0 checkpoint_initiates: 0 pp_comm: 1000")


def write(tmp_path: Path, header: str, layers: list[str]) -> Path:
    path = tmp_path / "pipe_A100.txt"
    path.write_text("\n".join([header, str(len(layers)), *layers]) + "\n")
    return path


def test_pipeline_transfers_pairs_sizes_and_waits_by_hand(tmp_path: Path) -> None:
    # tp 2, dp 2, pp 3: rank = tp + 2 * (dp + 2 * stage); rank 4 is stage 1, (tp 0, dp 0)
    workload = read_simai(write(tmp_path, HEADER, LAYERS))
    prev, nxt = ProcessGroup((0, 4)), ProcessGroup((4, 8))
    tp, dp = ProcessGroup((4, 5)), ProcessGroup((4, 6))
    ops = workload.ranks[4]
    assert [(o.collective, o.group, o.direction, o.peer, o.nbytes) for o in ops] == [
        (AG, tp, None, None, 32),                  # grad_norm forward: a 64 B gather, 32 B shards
        (SR, prev, Direction.RECV, 0, 1000),       # microbatch 0 from stage 0
        (AR, tp, None, None, 16), (AR, tp, None, None, 16), (AR, tp, None, None, 32),
        (SR, nxt, Direction.SEND, 8, 1000),        # microbatch 0 to stage 2
        (SR, prev, Direction.RECV, 0, 1000),       # microbatch 1
        (AR, tp, None, None, 16), (AR, tp, None, None, 16), (AR, tp, None, None, 32),
        (SR, nxt, Direction.SEND, 8, 1000),
        (AR, tp, None, None, 8),                   # cross entropy forward
        (SR, nxt, Direction.RECV, 8, 1000),        # backward of microbatch 1 from stage 2
        (AR, tp, None, None, 16), (AR, tp, None, None, 16),
        (SR, prev, Direction.SEND, 0, 1000),       # to stage 0
        (SR, nxt, Direction.RECV, 8, 1000),        # microbatch 0
        (AR, tp, None, None, 16), (AR, tp, None, None, 16),
        (SR, prev, Direction.SEND, 0, 1000),
        (RS, dp, None, None, 800),                 # grad_norm weight gradient
    ]
    # one microbatch: forward 10 + 100 + 1000 ns, backward 20+30 + 200+300 + 2000+3000 ns
    t_f, t_b = 1110e-9, 5550e-9
    assert ops[1].compute_gap_s == pytest.approx(1 * t_f)          # stage 1 waits for stage 0
    assert ops[12].compute_gap_s == pytest.approx(1 * (t_f + t_b))  # waits for stage 2
    # later transfers do not wait, and compute is never theirs: it goes to the next collective
    assert ops[5].compute_gap_s == ops[6].compute_gap_s == ops[15].compute_gap_s == 0.0
    assert ops[13].compute_gap_s == pytest.approx((6 + 7 + 2000 + 3000 + 200) * 1e-9)
    assert ops[17].compute_gap_s == pytest.approx((30 + 2000 + 3000 + 200) * 1e-9)
    assert workload.tail_gap_s[4] == pytest.approx(1 * t_b)
    assert workload.tail_gap_s[0] == 0.0 and workload.tail_gap_s[8] == pytest.approx(2 * t_b)
    # the first stage has no previous, the last no next neighbour
    first, last = workload.ranks[1], workload.ranks[9]
    assert [o.group for o in first if o.collective is SR] == [ProcessGroup((1, 5))] * 4
    assert [o.direction for o in first if o.collective is SR] == \
        [Direction.SEND, Direction.SEND, Direction.RECV, Direction.RECV]
    assert [o.group for o in last if o.collective is SR] == [ProcessGroup((5, 9))] * 4
    assert last[10].compute_gap_s == ops[13].compute_gap_s  # the same compute, no wait
    assert len(first) == len(last) == len(ops) - 4
    notes = " ".join(workload.assumptions)
    assert "pp_comm 1000 B" in notes and "GPipe" in notes
    assert f"{2 * (t_f + t_b) * 1e3:.3f} ms per stage" in notes


def test_the_class_schedule_of_pipeline_pairs_and_waits_is_the_per_rank_one() -> None:
    layout = ParallelLayout(tp=2, dp=2, pp=4)
    demands = [
        Demand(1, SR, GroupKind.PP_PREV, 64, 0.0, Direction.RECV, -1),
        Demand(2, AR, GroupKind.TP, 32, 1e-6),
        Demand(3, SR, GroupKind.PP_NEXT, 64, 0.0, Direction.SEND, 1),
        Demand(4, RS, GroupKind.DP, 800, 2e-6),
    ]
    idle = {0: (0.0, 1e-3, 2e-3, 3e-3)}
    schedule = MegatronSchedule(demands, layout, idle)
    expected = expand_per_rank(demands, layout, idle)
    assert {r: schedule.ops_of(r) for r in range(16)} == expected
    assert schedule.blocks() == (range(0, 4), range(4, 8), range(8, 12), range(12, 16))
    assert expected[6][0].group == ProcessGroup((2, 6)) and expected[6][2].group == \
        ProcessGroup((6, 10))
    assert expected[6][0].compute_gap_s == pytest.approx(1e-3)
    for b, block in enumerate(schedule.blocks()):
        for index in range(len(expected[block.start])):
            assert schedule.groups_at(b, index) == {expected[r][index].group for r in block}
    with pytest.raises(ValueError, match="pp_next group holds a send/recv with peer_step 1"):
        Demand(5, SR, GroupKind.PP_NEXT, 64, 0.0, Direction.SEND, -1)
    with pytest.raises(ValueError, match=r"idle_s\[0\]: expected 4 finite seconds"):
        MegatronSchedule(demands, layout, {0: (1.0,)})
    with pytest.raises(ValueError, match="has no pp_next peer"):
        layout.group(GroupKind.PP_NEXT, 12)


def test_gpipe_waits_add_up_to_the_bubble_on_every_stage() -> None:
    waits = gpipe_waits(4, 3, 7, forward_s=1.0, backward_s=2.0)
    assert waits.idle_s == {3: (0.0, 1.0, 2.0, 3.0), 7: (9.0, 6.0, 3.0, 0.0)}
    assert waits.tail_s == (0.0, 2.0, 4.0, 6.0)
    for s in range(4):
        assert waits.idle_s[3][s] + waits.idle_s[7][s] + waits.tail_s[s] == waits.bubble_s == 9


@pytest.mark.parametrize(
    ("change", "field", "value"),
    [
        (("pp: 3", "pp: 5"), "pp", 5),                      # 12 GPUs in 5 stages
        (("all_gpus: 12", "all_gpus: 9"), "model_parallel_NPU_group", 2),   # tp 2 x pp 3
        ((" pp_comm: 1000", ""), "pp_comm", None),          # pp > 1 needs the message size
        (("pp_comm: 1000", "pp_comm: 0"), "pp_comm", 0),
        (("ga: 2", "ga: 3"), "ga", 3),                      # but 2 microbatches in the file
        (("vpp: 1", "vpp: 0"), "vpp", 0),
        (("pp: 3", "pp: 0"), "pp", 0),
        # review of issue 13: these raised OverflowError / ValueError / MemoryError, named
        # 'ep' or a missing all_gpus, or silently took the last of two values
        (("pp_comm: 1000", "pp_comm: inf"), "pp_comm", "inf"),
        (("pp_comm: 1000", "pp_comm: 1e30"), "pp_comm", "1e30"),
        (("all_gpus: 12", "all_gpus: 0"), "all_gpus", 0),
        (("all_gpus: 12", "all_gpus: -12"), "all_gpus", -12),
        (("all_gpus: 12", "all_gpus: 1000000000"), "all_gpus", 1000000000),
        (("all_gpus: 12", "all_gpus: 12 all_gpus: 6"), "all_gpus", 6),
        (("pp: 3", "pp: 3 pp: 1"), "pp", 1),
        (("pp: 3", "pp:3"), "pp", "pp:3"),   # these were read as pp 1 (dp 6)
        (("pp: 3", "pp 3"), "pp", "pp"),
    ],
)
def test_inconsistent_pipeline_headers_name_field_and_value(
    tmp_path: Path, change: tuple[str, str], field: str, value: object
) -> None:
    path = write(tmp_path, HEADER.replace(*change), LAYERS)
    with pytest.raises(TraceError) as info:
        read_simai(path)
    assert (info.value.field, info.value.value, info.value.line) == (field, value, 1)
    assert str(path) in str(info.value)


def test_a_microbatch_that_does_not_close_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER.replace("ga: 2", "ga: 1"), LAYERS[:-2])  # no embedding_norm
    with pytest.raises(TraceError, match="has no embedding_norm") as info:
        read_simai(path)
    assert info.value.line == 3 + 4  # the second embedding_layer


def test_pp_1_is_read_as_before(tmp_path: Path) -> None:
    header = HEADER.replace("pp: 3", "pp: 1").replace("all_gpus: 12", "all_gpus: 4")
    workload = read_simai(write(tmp_path, header, LAYERS))
    assert not any(o.collective is SR for o in workload.ranks[0])
    assert any("pp=1 with pp_comm 1000 B" in a for a in workload.assumptions)
    assert workload.schedule is not None and workload.schedule.blocks() == (range(0, 4),)


def test_scale_simai_keeps_one_stages_layers_and_its_parameters(tmp_path: Path) -> None:
    body = [line("attention_layer", "1 ALLREDUCE 16", "1 NONE 0", "1 NONE 0"),
            line("mlp_layer", "1 ALLREDUCE 16", "1 NONE 0", "1 NONE 0")] * 6
    whole = [line("grad_norm", "1 ALLGATHER 2000", "1 NONE 0", "1 REDUCESCATTER 4000"),
             line("layernorm", "1 NONE 0", "1 ALLREDUCE 2000", "1 NONE 0"),
             line("embedding_layer", "1 ALLREDUCE 16", "1 NONE 0", "1 NONE 0"), *body,
             line("embedding_norm", "1 ALLREDUCE 100", "1 NONE 0", "1 NONE 0"),
             line("optimizer1", "1 ALLREDUCE 4", "1 NONE 0", "1 NONE 0")]
    # 1000 parameters per TP rank, the embedding 2 x 100 / tp 2 = 100 of them: a stage of 3
    # holds 100 + 900 / 3 = 400, the parameter-sized lines shrink to 0.4
    kept = stage_layers(whole, 3, tp=2)
    assert [t.split()[0] for t in kept] == ["grad_norm", "layernorm", "embedding_layer",
                                            "attention_layer", "mlp_layer", "attention_layer",
                                            "mlp_layer", "embedding_norm", "optimizer1"]
    assert kept[0].split()[4] == "800" and kept[0].split()[10] == "1600"
    assert kept[1].split()[7] == "800" and kept[2:] == [whole[2], *body[:4], *whole[-2:]]
    with pytest.raises(ValueError, match=r"pp: 4 does not divide the 6 transformer layers "
                                         r"\(attention_layer \+ mlp_layer\)"):
        stage_layers(whole, 4, tp=2)
    with pytest.raises(ValueError, match=r"no embedding_layer \.\.\. embedding_norm"):
        stage_layers(body, 2)
    source = tmp_path / "whole.txt"
    first = HEADER.split(" ep:", maxsplit=1)[0]
    source.write_text("\n".join([first, str(len(whole)), *whole]) + "\n")
    scaled = scale_simai(source, tmp_path / "stage.txt", world_size=12, pp=3)
    text = scaled.read_text().splitlines()
    assert "pp: 3" in text[0] and "pp_comm: 16" in text[0]
    assert text[1] == "9" and text[2:] == kept


def test_a_header_field_aicb_does_not_write_is_noted(tmp_path: Path) -> None:
    workload = read_simai(write(tmp_path, HEADER.replace("pp: 3", "pp: 3 PP: 4"), LAYERS))
    assert any("header field(s) PP not read" in a for a in workload.assumptions)
    assert not any("not read" in a for a in read_simai(write(tmp_path, HEADER, LAYERS)).assumptions)
