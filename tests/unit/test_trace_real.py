"""The trace readers on the real inputs in shared/data (facts checked by reading the files)."""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from lightrail.agents.replay.trace import SourceFormat, TraceError, Workload, load_workload
from lightrail.controller.domain.model import Collective, ProcessGroup

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
DLRM = DATA / "traces" / "param-dlrm-8rank" / "dlrm_kineto.tar.gz"
HTA = DATA / "traces" / "hta-nccl" / "nccl_data.json.gz"
AICB = DATA / "workloads" / "aicb"
LLAMA7B_CSV = AICB / "L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1.csv"
LLAMA7B_SIMAI = AICB / "L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1_A100.txt"
LLAMA13B_ZERO3 = AICB / "L13B-D1-C04_Llama13B_zero3_mbs1.csv"
# The SimAI header of this file has no all_gpus; shared/data/README.md: 128 ranks.
SIMAI_WORLD = 128

AR, AG, RS, A2A, BC = (
    Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER,
    Collective.ALL_TO_ALL, Collective.BROADCAST,
)

pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"real data not present at {DATA}")


@cache
def load(path: Path) -> Workload:
    return load_workload(path, world_size=SIMAI_WORLD if path.suffix == ".txt" else None)


# Folders in a format no reader handles yet: the Opus artifact's phase patterns and latency CSVs
# (issue 13 adds their reader). Checked below to be refused with a clear error, not mis-read.
NOT_YET_READ = (DATA / "traces" / "opus-perlmutter",)


def data_files(*, unread: bool = False) -> list[Path]:
    if not DATA.is_dir():
        return []
    skip = {"LICENSE", "README.md"}
    files = (p for p in DATA.rglob("*") if p.is_file() and p.name not in skip)
    return sorted(p for p in files if any(p.is_relative_to(d) for d in NOT_YET_READ) == unread)


@pytest.mark.parametrize("path", data_files(), ids=lambda p: p.name)
def test_every_data_file_loads(path: Path) -> None:
    expected = {".gz": SourceFormat.KINETO, ".csv": SourceFormat.AICB_CSV,
                ".txt": SourceFormat.SIMAI}[path.suffix]
    workload = load(path)
    assert workload.source_format is expected
    assert workload.ranks
    assert all(ops for ops in workload.ranks.values())


@pytest.mark.parametrize("path", data_files(unread=True)[:3] + data_files(unread=True)[-2:],
                         ids=lambda p: p.name)
def test_unread_format_is_refused_with_the_file_named(path: Path) -> None:
    with pytest.raises(TraceError, match=re.escape(str(path))):
        load_workload(path)


# --- PARAM DLRM, 8 ranks, legacy Kineto ---------------------------------------------------------


def test_dlrm_has_eight_ranks_with_the_same_sequence() -> None:
    workload = load(DLRM)
    assert workload.world_size == 8
    assert sorted(workload.ranks) == list(range(8))
    assert workload.iteration == "ProfilerStep#10"
    sequences = {tuple(op.collective for op in ops) for ops in workload.ranks.values()}
    assert sequences == {(A2A, A2A, A2A, A2A, AR, A2A, AR, AR)}
    for rank in range(8):
        assert [op.nbytes for op in workload.ranks[rank]] == [
            6144 * 4, 24 * 8, 384 * 4, 3392 * 4, 394241 * 4, 6144 * 4, 112 * 4, 226960 * 4
        ]


def test_dlrm_records_no_group_so_the_world_is_assumed_and_said() -> None:
    workload = load(DLRM)
    world = ProcessGroup(tuple(range(8)))
    assert all(op.group == world and op.approximate
               for ops in workload.ranks.values() for op in ops)
    assert any("world group of 8 ranks is assumed" in a for a in workload.assumptions)


def test_dlrm_all_to_all_splits_unknown_and_the_uneven_one_flagged() -> None:
    workload = load(DLRM)
    a2a = [op for op in workload.ranks[3] if op.collective is A2A]
    assert all(op.split_nbytes is None for op in a2a)
    # c10d::alltoall_base_ on rank 3: output [13312] elements, input [3392]
    assert "receives 13312 elements but sends 3392: the exchange is uneven" in a2a[3].notes


def test_dlrm_gap_before_the_first_call_is_from_the_step_start_to_its_kernel() -> None:
    # rank 0: ProfilerStep#10 starts at 1694128201426674 us, the first NCCL kernel at ...429795
    first = load(DLRM).ranks[0][0]
    assert first.compute_gap_s == pytest.approx(3121e-6)
    assert all(op.compute_gap_s >= 0 for ops in load(DLRM).ranks.values() for op in ops)


# --- HTA, rank 0 of a 2-GPU DDP job, modern NCCL metadata ----------------------------------------


def test_hta_rank0_uses_the_two_rank_group_from_process_group_ranks() -> None:
    workload = load(HTA)
    assert workload.world_size == 2
    assert workload.iteration == "ProfilerStep#6"
    ops = workload.ranks[0]
    assert [op.collective for op in ops] == [BC, BC, AR, AR, AR, AR, AR]
    assert {op.group for op in ops} == {ProcessGroup((0, 1))}
    assert {op.group_name for op in ops} == {"0"}
    assert not any(op.approximate for op in ops)
    # In msg nelems x dtype: 53120 Float, 53 Long, then five Float all-reduces (DDP buckets)
    assert [op.nbytes for op in ops] == [
        53120 * 4, 53 * 8, 2049000 * 4, 7875584 * 4, 6563840 * 4, 6637568 * 4, 2431040 * 4
    ]


def test_hta_other_rank_is_a_marked_copy_of_rank0() -> None:
    workload = load(HTA)
    assert any("trace records rank(s) 0 of 2" in a for a in workload.assumptions)
    copied = workload.ranks[1]
    assert [op.nbytes for op in copied] == [op.nbytes for op in workload.ranks[0]]
    assert all(op.approximate for op in copied)


def test_hta_first_gap_is_the_step_start_to_the_first_broadcast_kernel() -> None:
    # ProfilerStep#6 at 4458676859077.781 us; first broadcast kernel at 4458676865084.389 us
    first = load(HTA).ranks[0][0]
    assert first.compute_gap_s == pytest.approx(6006.608e-6, rel=1e-6)


# --- AICB Llama-7B Megatron TP2 (CSV) and the same model in SimAI form ---------------------------


def test_llama7b_csv_gives_128_ranks_with_tp_groups_of_two() -> None:
    workload = load(LLAMA7B_CSV)
    assert workload.world_size == 128
    assert sorted(workload.ranks) == list(range(128))
    assert workload.iteration == "first iteration (lines 11-150)"
    tp = {op.group for op in workload.ranks[5] if op.group_name == "tp"}
    assert tp == {ProcessGroup((4, 5))}
    dp = {op.group for op in workload.ranks[1] if op.group_name == "dp"}
    assert dp == {ProcessGroup(tuple(range(1, 128, 2)))}
    assert len(workload.groups()) == 64 + 2


def test_llama7b_csv_iteration_content() -> None:
    ops = load(LLAMA7B_CSV).ranks[0]
    assert len(ops) == 140
    counts = Counter((op.collective, op.group_name) for op in ops)
    assert counts == {(AR, "tp"): 135, (BC, "tp"): 2, (AR, "dp"): 1, (RS, "dp"): 1,
                      (AG, "dp"): 1}
    (rs,) = (op for op in ops if op.collective is RS)
    (ag,) = (op for op in ops if op.collective is AG)
    assert rs.nbytes == 10366697472
    assert ag.nbytes == 5183348736 // 64  # the shard of the gathered parameters
    assert sum(op.nbytes == 0 for op in ops) == 1  # step._allreduce_layernorm_grads
    assert all(op.compute_gap_s == 0 for op in ops)


def test_llama7b_simai_matches_the_csv_tp_all_reduces() -> None:
    workload = load(LLAMA7B_SIMAI)
    assert workload.world_size == 128
    ops = workload.ranks[0]
    assert len(ops) == 142
    assert Counter(op.collective for op in ops) == {AR: 139, AG: 1, BC: 1, RS: 1}
    tp_16mib = sum(op.nbytes == 16777216 and op.group_name == "tp" for op in ops)
    csv_16mib = sum(op.nbytes == 16777216 and op.group_name == "tp"
                    for op in load(LLAMA7B_CSV).ranks[0])
    assert tp_16mib == csv_16mib == 130
    assert ops[-1].collective is RS
    assert ops[-1].group == ProcessGroup(tuple(range(0, 128, 2)))
    assert ops[-1].nbytes == 13509853184


def test_llama7b_simai_gaps_are_the_layer_compute_times() -> None:
    workload = load(LLAMA7B_SIMAI)
    ops = workload.ranks[0]
    # layer 4 (first attention) forward: 539986 ns, layer 5 (first mlp) forward: 486330 ns
    assert ops[3].compute_gap_s == pytest.approx(539986e-9)
    assert ops[4].compute_gap_s == pytest.approx(486330e-9)
    total = sum(op.compute_gap_s for op in ops) + workload.tail_gap_s[0]
    assert total == pytest.approx(104618147e-9)  # every compute time in the file


# --- AICB Llama-13B DeepSpeed ZeRO-3 -------------------------------------------------------------


def test_llama13b_zero3_is_one_dp_group_of_128() -> None:
    workload = load(LLAMA13B_ZERO3)
    assert workload.world_size == 128
    assert workload.iteration == "first iteration (lines 733-1555)"
    assert workload.groups() == {ProcessGroup(tuple(range(128)))}
    counts = Counter(op.collective for op in workload.ranks[77])
    assert counts == {AG: 807, RS: 14, AR: 2}


def test_simai_world_size_from_the_sibling_csv(tmp_path: Path) -> None:
    """An older SimAI header has no all_gpus: the AICB CSV beside it says [rank0 ~ rankN]."""
    from lightrail.agents.replay.trace.loader import sibling_csv_world_size

    txt = tmp_path / "M_tp2_A100.txt"
    txt.write_text(
        "HYBRID_TRANSFORMER_FWD_IN_BCKWD\tmodel_parallel_NPU_group: 2 checkpoints: 0 "
        "checkpoint_initiates: 0\n1\n"
        "l0\t-1\t100\tALLREDUCE\t64\t100\tNONE\t0\t100\tNONE\t0\t100\n"
    )
    assert sibling_csv_world_size(txt) is None
    (tmp_path / "M_tp2.csv").write_text("[rank0 ~ rank7]\ncomm_type,comm_group\n")
    (tmp_path / "Other.csv").write_text("[rank0 ~ rank3]\n")
    assert sibling_csv_world_size(txt) == 8
    w = load_workload(txt)
    assert w.world_size == 8
    assert any("taken from the AICB CSV" in a for a in w.assumptions)


def test_the_dataset_folder_of_a_tarball_reads_as_the_tarball() -> None:
    """``lightrail replay ../shared/data/traces/param-dlrm-8rank`` (the folder the README
    names holds the tarball and its LICENSE): the same workload as the tarball itself."""
    from lightrail.agents.replay.trace.loader import load_workload

    folder, tarball = load_workload(DLRM.parent), load_workload(DLRM)
    assert folder.world_size == tarball.world_size == 8
    assert {r: len(ops) for r, ops in folder.ranks.items()} == {
        r: len(ops) for r, ops in tarball.ranks.items()}
    assert all(folder.ranks.values())
