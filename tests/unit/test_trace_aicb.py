"""AICB CSV and SimAI readers, rank layout and format detection, on small inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightrail.agents.replay.trace import (
    MAX_MESSAGE_BYTES,
    Direction,
    GroupKind,
    ParallelLayout,
    RankCoords,
    SourceFormat,
    TraceError,
    load_workload,
    read_aicb_csv,
    read_simai,
)
from lightrail.controller.domain.model import Collective, ProcessGroup

HEADER = "comm_type,comm_group,comm_group_size,msg_size,stage,dst,src,additional,_elapsed_time," \
    "algbw,busbw,count"


def row(comm_type: str, group: str, size: str, msg: str, stage: str = "forward",
        additional: str = "", count: str = "1") -> str:
    return f"{comm_type},{group},{size},{msg},{stage},None,None,{additional},None,None,None,{count}"


EPOCH_END = row("CommType.epoch_end", "None", "None", "0", "")


def write_csv(tmp_path: Path, rows: list[str], *, world: int | None = 8) -> Path:
    lines = ([f"[rank0 ~ rank{world - 1}]"] if world is not None else []) + [HEADER, *rows]
    path = tmp_path / "job.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


TP2_DP4 = [
    row("CommType.all_reduce", "CommGroup.dp_group", "4", "8", "init.model_setup"),
    EPOCH_END,
    row("CommType.all_reduce", "CommGroup.tp_group", "2", "1000", "forward.MegatronRowLinear"),
    row("CommType.computation", "None", "None", "0", "forward.compute"),
    row("NONE", "CommGroup.tp_group", "2", "4096", "forward.noop"),
    row("CommType.all_gather", "CommGroup.dp_group", "4", "4096", "step"),
    row("CommType.reduce_scatter", "CommGroup.dp_group", "4", "8192", "step"),
    EPOCH_END,
]


# --- layout ------------------------------------------------------------------------------------


def test_megatron_layout_puts_tp_fastest_then_dp_then_pp() -> None:
    layout = ParallelLayout(tp=2, dp=3, pp=2)
    assert layout.world_size == 12
    assert layout.rank(RankCoords(tp=1, dp=2, pp=1)) == 1 + 2 * (2 + 3 * 1)
    assert all(layout.rank(layout.coords(r)) == r for r in range(12))
    assert layout.group(GroupKind.TP, 7) == ProcessGroup((6, 7))
    assert layout.group(GroupKind.DP, 7) == ProcessGroup((7, 9, 11))
    assert layout.group(GroupKind.PP, 7) == ProcessGroup((1, 7))
    assert layout.group(GroupKind.EMBEDDING, 3) == ProcessGroup((3, 9))


def test_expert_groups_split_dp_into_blocks_and_strides() -> None:
    layout = ParallelLayout(tp=2, dp=4, pp=1, ep=2)
    assert layout.group(GroupKind.EP, 4) == ProcessGroup((4, 6))
    assert layout.group(GroupKind.EP_DP, 4) == ProcessGroup((0, 4))
    assert layout.group(GroupKind.EP_TP, 5) == ProcessGroup((4, 5, 6, 7))


def test_layout_rejects_an_ep_that_does_not_divide_dp() -> None:
    with pytest.raises(ValueError, match="does not divide"):
        ParallelLayout(tp=1, dp=6, pp=1, ep=4)


# --- AICB CSV ----------------------------------------------------------------------------------


def test_csv_expands_the_first_iteration_to_every_rank(tmp_path: Path) -> None:
    workload = read_aicb_csv(write_csv(tmp_path, TP2_DP4))
    assert workload.source_format is SourceFormat.AICB_CSV
    assert workload.world_size == 8
    assert sorted(workload.ranks) == list(range(8))
    assert workload.iteration == "first iteration (lines 5-9)"
    ops = workload.ranks[3]
    assert [op.collective for op in ops] == [
        Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER
    ]
    assert ops[0].group == ProcessGroup((2, 3))
    assert ops[1].group == ProcessGroup((1, 3, 5, 7))
    assert ops[1].nbytes == 4096 // 4  # AICB gives the gathered size; nbytes is the shard
    assert ops[2].nbytes == 8192
    assert all(op.compute_gap_s == 0 for op in ops)
    assert any("tp_idx + 2*(dp_idx + 4*pp_idx)" in a for a in workload.assumptions)


def test_csv_none_rows_with_a_size_are_not_demand(tmp_path: Path) -> None:
    workload = read_aicb_csv(write_csv(tmp_path, TP2_DP4))
    assert all(op.nbytes != 4096 or op.collective is Collective.ALL_GATHER
               for op in workload.ranks[0])
    assert len(workload.ranks[0]) == 3
    assert any("1 'NONE' row(s)" in a for a in workload.assumptions)
    assert any("1 'computation' row(s)" in a for a in workload.assumptions)


def test_csv_world_size_from_group_sizes_without_rank_line(tmp_path: Path) -> None:
    workload = read_aicb_csv(write_csv(tmp_path, TP2_DP4, world=None))
    assert workload.world_size == 8
    assert any("no '[rank0 ~ rankN]' line" in a for a in workload.assumptions)


def test_csv_count_repeats_a_row(tmp_path: Path) -> None:
    rows = [EPOCH_END, row("CommType.all_reduce", "CommGroup.dp_group", "8", "64", count="3"),
            EPOCH_END]
    workload = read_aicb_csv(write_csv(tmp_path, rows))
    assert len(workload.ranks[5]) == 3


def test_csv_pipeline_sends_go_to_the_neighbour_stage(tmp_path: Path) -> None:
    rows = [
        EPOCH_END,
        row("CommType.isend", "CommGroup.pp_group", "4", "512", "forward_step", "send_next"),
        row("CommType.irecv", "CommGroup.pp_group", "4", "512", "backward_step", "recv_next"),
        EPOCH_END,
    ]
    workload = read_aicb_csv(write_csv(tmp_path, rows, world=4))  # pp=4, tp=dp=1
    first = workload.ranks[0]
    assert [(op.direction, op.peer) for op in first] == [(Direction.SEND, 1), (Direction.RECV, 1)]
    assert first[0].group == ProcessGroup((0, 1, 2, 3))
    assert workload.ranks[3] == ()  # the last stage has no next stage
    assert any("one pipeline stage's schedule" in a for a in workload.assumptions)


def test_csv_pipeline_rows_without_a_pipeline_size_are_an_error(tmp_path: Path) -> None:
    rows = [
        EPOCH_END,
        row("CommType.isend", "CommGroup.pp_group", "1", "512", "forward_step", "send_next"),
        EPOCH_END,
    ]
    with pytest.raises(TraceError, match="pipeline size is unknown") as info:
        read_aicb_csv(write_csv(tmp_path, rows, world=4))
    assert info.value.line == 4


def test_csv_group_size_that_does_not_fit_the_layout_is_an_error(tmp_path: Path) -> None:
    rows = [EPOCH_END, row("CommType.all_reduce", "CommGroup.tp_group", "3", "64"), EPOCH_END]
    with pytest.raises(TraceError, match="does not make the world size") as info:
        read_aicb_csv(write_csv(tmp_path, rows))
    assert info.value.line == 1


@pytest.mark.parametrize(
    ("bad_row", "field", "value"),
    [
        (row("CommType.all_reduce", "CommGroup.tp_group", "2", "12x"), "msg_size", "12x"),
        (row("CommType.all_reduce", "CommGroup.tp_group", "two", "12"), "comm_group_size", "two"),
        (row("CommType.all_shuffle", "CommGroup.tp_group", "2", "12"), "comm_type",
         "CommType.all_shuffle"),
        (row("CommType.all_reduce", "CommGroup.xy_group", "2", "12"), "comm_group",
         "CommGroup.xy_group"),
        (row("CommType.all_reduce", "CommGroup.tp_group", "2", "-5"), "msg_size", "-5"),
        ("CommType.all_reduce,CommGroup.tp_group,2", "msg_size", None),
    ],
    ids=["bad-number", "bad-group-size", "unknown-comm-type", "unknown-group", "negative",
         "missing-column"],
)
def test_csv_malformed_row_names_file_line_and_field(
    tmp_path: Path, bad_row: str, field: str, value: object
) -> None:
    path = write_csv(tmp_path, [*TP2_DP4[:3], bad_row, *TP2_DP4[3:]])
    with pytest.raises(TraceError) as info:
        read_aicb_csv(path)
    assert info.value.line == 6
    assert info.value.field == field
    assert info.value.value == value
    assert str(info.value).startswith(f"{path}:6: field {field!r}")


def test_csv_header_without_a_required_column_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "job.csv"
    path.write_text("[rank0 ~ rank7]\ncomm_type,comm_group,msg_size,stage\n")
    with pytest.raises(TraceError, match="comm_group_size") as info:
        read_aicb_csv(path)
    assert info.value.line == 2


def test_csv_without_a_complete_iteration_is_an_error(tmp_path: Path) -> None:
    rows = [row("CommType.all_reduce", "CommGroup.dp_group", "8", "8", "init.x"), EPOCH_END]
    with pytest.raises(TraceError, match="no complete iteration"):
        read_aicb_csv(write_csv(tmp_path, rows))


# --- SimAI -------------------------------------------------------------------------------------

SIMAI_HEADER = ("HYBRID_TRANSFORMER_FWD_IN_BCKWD\tmodel_parallel_NPU_group: 2 ep: 1 pp: 1 vpp: 2 "
                "ga: 1 all_gpus: 8 checkpoints: 0 checkpoint_initiates: 0 pp_comm: 0")


def layer(name: str, fwd: str, ig: str, wg: str) -> str:
    return "\t".join([name, "-1", *fwd.split(), *ig.split(), *wg.split(), "100"])


SIMAI_LAYERS = [
    layer("embedding", "1000 ALLREDUCE 64", "2000 NONE 4096", "3000 NONE 0"),
    layer("attention", "4000 ALLREDUCE 128", "5000 ALLREDUCE 256", "6000 REDUCESCATTER 800"),
]


def write_simai(
    tmp_path: Path, header: str, layers: list[str], *, count: int | None = None
) -> Path:
    path = tmp_path / "job_A100.txt"
    path.write_text("\n".join([header, str(len(layers) if count is None else count), *layers])
                    + "\n")
    return path


def test_simai_order_groups_and_gaps(tmp_path: Path) -> None:
    workload = read_simai(write_simai(tmp_path, SIMAI_HEADER, SIMAI_LAYERS))
    assert workload.source_format is SourceFormat.SIMAI
    assert workload.world_size == 8
    ops = workload.ranks[5]
    # forward L0, forward L1, then L1 input-grad, L1 weight-grad; L0 has no backward collective
    assert [(op.collective, op.nbytes) for op in ops] == [
        (Collective.ALL_REDUCE, 64),
        (Collective.ALL_REDUCE, 128),
        (Collective.ALL_REDUCE, 256),
        (Collective.REDUCE_SCATTER, 800),
    ]
    assert [op.group_name for op in ops] == ["tp", "tp", "tp", "dp"]
    assert ops[0].group == ProcessGroup((4, 5))
    assert ops[3].group == ProcessGroup((1, 3, 5, 7))
    assert [op.compute_gap_s for op in ops] == pytest.approx([1e-6, 4e-6, 5e-6, 6e-6])
    # the NONE input-gradient slot of L0 carries 4096 B: not demand, but its compute counts
    assert workload.tail_gap_s[5] == pytest.approx(5e-6)


def test_simai_world_size_from_argument_when_header_lacks_it(tmp_path: Path) -> None:
    header = "HYBRID_TRANSFORMER_FWD_IN_BCKWD\tmodel_parallel_NPU_group: 2 checkpoints: 0"
    path = write_simai(tmp_path, header, SIMAI_LAYERS)
    with pytest.raises(TraceError, match="all_gpus"):
        read_simai(path)
    workload = read_simai(path, world_size=4)
    assert sorted(workload.ranks) == [0, 1, 2, 3]
    assert workload.ranks[2][-1].group == ProcessGroup((0, 2))
    with pytest.raises(TraceError, match="all_gpus"):
        read_simai(write_simai(tmp_path, SIMAI_HEADER, SIMAI_LAYERS), world_size=16)


def test_simai_expert_suffixes_select_expert_groups(tmp_path: Path) -> None:
    header = SIMAI_HEADER.replace("ep: 1", "ep: 2")
    layers = [layer("moe", "10 ALLTOALL_EP 64", "10 NONE 0", "10 ALLREDUCE_DP_EP 32")]
    ops = read_simai(write_simai(tmp_path, header, layers)).ranks[0]
    assert ops[0].group == ProcessGroup((0, 2))  # EP block of dp indices 0..1 (tp 0)
    assert ops[0].split_nbytes == (32, 32)
    assert ops[1].group == ProcessGroup((0, 4))  # dp indices 0 and 2


@pytest.mark.parametrize(
    ("bad_layer", "field", "value"),
    [
        (layer("x", "10 ALLREDUCE 1e3", "1 NONE 0", "1 NONE 0"), "fwd_comm_size", "1e3"),
        (layer("x", "10 ALLFOO 64", "1 NONE 0", "1 NONE 0"), "fwd_comm_type", "ALLFOO"),
        (layer("x", "10 ALLREDUCE 64", "1 NONE 0", "-3 NONE 0"), "wg_compute_time", "-3"),
        ("x\t-1\t10\tALLREDUCE\t64", "<layer>", "x\t-1\t10\tALLREDUCE\t64"),
    ],
    ids=["bad-number", "unknown-type", "negative-time", "short-line"],
)
def test_simai_malformed_layer_names_file_line_and_field(
    tmp_path: Path, bad_layer: str, field: str, value: object
) -> None:
    path = write_simai(tmp_path, SIMAI_HEADER, [SIMAI_LAYERS[0], bad_layer])
    with pytest.raises(TraceError) as info:
        read_simai(path)
    assert (info.value.line, info.value.field, info.value.value) == (4, field, value)
    assert str(path) in str(info.value)


def test_simai_unsupported_type_and_wrong_layer_count(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="workload type") as info:
        read_simai(write_simai(tmp_path, "DLRM_PLUS foo: 1", SIMAI_LAYERS))
    assert info.value.line == 1
    with pytest.raises(TraceError, match="layer count") as info:
        read_simai(write_simai(tmp_path, SIMAI_HEADER, SIMAI_LAYERS, count=3))
    assert info.value.line == 2


# --- format detection ----------------------------------------------------------------------------


def test_loader_dispatches_by_format(tmp_path: Path) -> None:
    assert load_workload(write_csv(tmp_path, TP2_DP4)).source_format is SourceFormat.AICB_CSV
    simai = write_simai(tmp_path, SIMAI_HEADER, SIMAI_LAYERS)
    assert load_workload(simai).source_format is SourceFormat.SIMAI


def test_loader_rejects_unknown_formats_and_missing_paths(tmp_path: Path) -> None:
    odd = tmp_path / "trace.parquet"
    odd.write_bytes(b"PAR1")
    with pytest.raises(TraceError, match="unknown format") as info:
        load_workload(odd)
    assert info.value.field == "format"
    with pytest.raises(TraceError, match="no such file"):
        load_workload(tmp_path / "absent.json")


def test_an_oversized_msg_size_is_refused_naming_the_field(tmp_path: Path) -> None:
    """Regression (issue 10): msg_size 10^26 was accepted, crashed the host agent's encoder
    (uint64 out of range) and made evaluate print an ideal iteration of 1.97e27 ms."""
    huge = str(10**26)
    path = write_csv(tmp_path, [*TP2_DP4[:3],
                                row("CommType.all_reduce", "CommGroup.tp_group", "2", huge),
                                *TP2_DP4[3:]])
    with pytest.raises(TraceError) as info:
        read_aicb_csv(path)
    assert (info.value.field, info.value.value, info.value.line) == ("msg_size", huge, 6)
    assert f"must be <= {MAX_MESSAGE_BYTES}" in str(info.value)
    # the largest allowed size still reads
    ok = write_csv(tmp_path, [*TP2_DP4[:3], row("CommType.all_reduce", "CommGroup.tp_group", "2",
                                                 str(MAX_MESSAGE_BYTES)), *TP2_DP4[3:]])
    assert max(op.nbytes for ops in read_aicb_csv(ok).ranks.values() for op in ops) == (
        MAX_MESSAGE_BYTES)
