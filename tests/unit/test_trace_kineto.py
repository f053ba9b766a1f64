"""Kineto reader on small hand-built traces (one behaviour per test)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from lightrail.agents.replay.trace import (
    CommOp,
    Direction,
    SourceFormat,
    TraceError,
    Workload,
    read_kineto,
)
from lightrail.controller.domain.model import MAX_WORLD_SIZE, Collective, ProcessGroup

Event = dict[str, object]

CPU_PID = 100
GPU_PID = 0
GPU_TID = 7


class TraceBuilder:
    """Builds one rank's Kineto trace: CPU calls, their launches and NCCL kernels."""

    def __init__(self, rank: int | None = 0, world: int | None = 2) -> None:
        self.rank = rank
        self.world = world
        self.events: list[Event] = []
        self.pg_config: list[dict[str, object]] = []
        self._next_id = 1000

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id

    def step(self, number: int, ts: float, dur: float) -> None:
        self.events.append({
            "ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}",
            "pid": CPU_PID, "tid": 1, "ts": ts, "dur": dur, "args": {"External id": self._id()},
        })

    def call(
        self,
        ts: float,
        meta: dict[str, object] | None,
        *,
        kernel: tuple[float, float] | None = None,
        kernel_meta: dict[str, object] | None = None,
        tid: int = 1,
        dur: float = 20.0,
        annotation: str | None = None,
        annotation_args: dict[str, object] | None = None,
        kernel_external_id: int | None = None,
    ) -> None:
        """A record_param_comms (with ``meta``) enqueuing one kernel via cudaLaunchKernel."""
        ext = self._id()
        correlation = self._id()
        self.events.append({
            "ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": CPU_PID,
            "tid": tid, "ts": ts, "dur": dur, "args": {"External id": ext, **(meta or {})},
        })
        if annotation is not None:
            self.events.append({
                "ph": "X", "cat": "user_annotation", "name": annotation, "pid": CPU_PID,
                "tid": tid, "ts": ts + 1, "dur": dur - 2,
                "args": {"External id": self._id(), **(annotation_args or {})},
            })
        if kernel is None:
            return
        self.events.append({
            "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": CPU_PID,
            "tid": tid, "ts": ts + 2, "dur": 3, "args": {"correlation": correlation,
                                                         "External id": ext},
        })
        self.kernel(kernel, correlation, kernel_meta, kernel_external_id or ext)

    def kernel(
        self,
        span: tuple[float, float],
        correlation: int,
        meta: dict[str, object] | None,
        external_id: int,
    ) -> None:
        self.events.append({
            "ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "pid": GPU_PID, "tid": GPU_TID, "ts": span[0], "dur": span[1],
            "args": {"correlation": correlation, "External id": external_id, **(meta or {})},
        })

    def compute_kernel(self, ts: float, dur: float) -> None:
        self.events.append({
            "ph": "X", "cat": "kernel", "name": "volta_sgemm_128x32_nt", "pid": GPU_PID,
            "tid": GPU_TID, "ts": ts, "dur": dur, "args": {"correlation": self._id()},
        })

    def doc(self) -> dict[str, object]:
        info: dict[str, object] = {"backend": "nccl"}
        if self.rank is not None:
            info["rank"] = self.rank
        if self.world is not None:
            info["world_size"] = self.world
        if self.pg_config:
            info["pg_config"] = self.pg_config
        return {"schemaVersion": 1, "distributedInfo": info, "traceEvents": self.events}

    def write(self, path: Path) -> Path:
        data = json.dumps(self.doc()).encode()
        path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
        return path


def nccl_meta(
    collective: str = "allreduce",
    nelems: int = 1024,
    *,
    ranks: object = "[0, 1]",
    size: int | None = 2,
    name: str = "0",
    dtype: str = "Float",
    out_nelems: int | None = None,
    extra: dict[str, object] | None = None,
) -> dict[str, object]:
    meta: dict[str, object] = {
        "Collective name": collective, "In msg nelems": nelems,
        "Out msg nelems": nelems if out_nelems is None else out_nelems, "dtype": dtype,
        "In split size": "[]", "Out split size": "[]", "Process Group Name": name,
        "Process Group Description": "default_pg",
    }
    if ranks is not None:
        meta["Process Group Ranks"] = ranks
    if size is not None:
        meta["Group size"] = size
    meta.update(extra or {})
    return meta


def only_op(workload: Workload, rank: int = 0) -> CommOp:
    ops = workload.ranks[rank]
    assert len(ops) == 1, ops
    return ops[0]


def one_call_trace(tmp_path: Path, meta: dict[str, object], *, world: int = 2) -> Workload:
    builder = TraceBuilder(rank=0, world=world)
    builder.step(1, 0, 1000)
    builder.call(100, meta, kernel=(130, 50))
    return read_kineto(builder.write(tmp_path / "rank0.json"))


# --- process groups ------------------------------------------------------------------------------


def test_kernel_without_group_fields_takes_them_from_the_enqueuing_cpu_op(tmp_path: Path) -> None:
    builder = TraceBuilder(rank=0, world=4)
    builder.step(1, 0, 1000)
    cpu = nccl_meta(ranks="[0, 2]", size=2, name="5")
    kernel_only = {k: v for k, v in cpu.items() if "Process Group" not in k}
    # The kernel's External id points nowhere: only the correlation id ties it to the CPU op.
    builder.call(100, cpu, kernel=(130, 50), kernel_meta=kernel_only, kernel_external_id=4242)
    op = only_op(read_kineto(builder.write(tmp_path / "rank0.json")))
    assert op.group == ProcessGroup((0, 2))
    assert op.group_name == "5"
    assert not op.approximate
    assert op.compute_gap_s == pytest.approx(130e-6)


def test_kernel_metadata_fills_a_cpu_op_without_metadata(tmp_path: Path) -> None:
    builder = TraceBuilder(rank=0, world=4)
    builder.step(1, 0, 1000)
    builder.call(100, None, annotation="nccl:all_reduce", kernel=(130, 50),
                 kernel_meta=nccl_meta(nelems=256, ranks="[0, 3]", size=2))
    op = only_op(read_kineto(builder.write(tmp_path / "rank0.json")))
    assert op.collective is Collective.ALL_REDUCE
    assert op.nbytes == 256 * 4
    assert op.group == ProcessGroup((0, 3))


def test_group_unknown_when_no_op_records_its_ranks(tmp_path: Path) -> None:
    builder = TraceBuilder(rank=0, world=4)
    builder.step(1, 0, 1000)
    meta = nccl_meta(ranks=None, size=2, name="7")
    builder.call(100, meta, kernel=(130, 50), kernel_meta=meta)
    workload = read_kineto(builder.write(tmp_path / "rank0.json"))
    op = only_op(workload)
    assert op.group is None
    assert op.approximate
    assert any("ranks not recorded" in note for note in op.notes)
    assert not any("world group" in a for a in workload.assumptions)


def test_kernel_only_call_without_group_fields_is_unknown_not_world(tmp_path: Path) -> None:
    builder = TraceBuilder(rank=0, world=2)
    builder.step(1, 0, 1000)
    meta = {k: v for k, v in nccl_meta().items() if "Process Group" not in k and k != "Group size"}
    builder.kernel((130, 50), correlation=1, meta=meta, external_id=1)
    workload = read_kineto(builder.write(tmp_path / "rank0.json"))
    op = only_op(workload)
    assert op.group is None
    assert op.approximate
    assert op.notes == ("no process group recorded",)


def test_group_size_equal_to_world_size_is_the_world_group(tmp_path: Path) -> None:
    op = only_op(one_call_trace(tmp_path, nccl_meta(ranks=None, size=4), world=4))
    assert op.group == ProcessGroup((0, 1, 2, 3))
    assert not op.approximate


def test_legacy_trace_without_any_group_assumes_world_and_says_so(tmp_path: Path) -> None:
    builder = TraceBuilder(rank=0, world=4)
    builder.step(1, 0, 1000)
    builder.call(100, None, annotation="nccl:all_reduce",
                 annotation_args={"Input Dims": [[10, 3]], "Input type": ["c10::Half"]},
                 kernel=(130, 50))
    workload = read_kineto(builder.write(tmp_path / "rank0.json"))
    op = only_op(workload)
    assert op.nbytes == 10 * 3 * 2
    assert op.group == ProcessGroup((0, 1, 2, 3))
    assert op.approximate
    assert any("world group of 4 ranks is assumed" in a for a in workload.assumptions)


@pytest.mark.parametrize("ranks", ["[0, 1]", [0, 1], " [0,1] "])
def test_process_group_ranks_as_string_or_json_list(tmp_path: Path, ranks: object) -> None:
    op = only_op(one_call_trace(tmp_path, nccl_meta(ranks=ranks)))
    assert op.group == ProcessGroup((0, 1))


def test_empty_rank_list_means_ranks_zero_to_group_size(tmp_path: Path) -> None:
    op = only_op(one_call_trace(tmp_path, nccl_meta(ranks="[]", size=4), world=8))
    assert op.group == ProcessGroup((0, 1, 2, 3))
    assert any("empty Process Group Ranks" in note for note in op.notes)


def test_truncated_rank_list_is_rebuilt_from_start_and_stride(tmp_path: Path) -> None:
    shown = ", ".join(str(2 * i) for i in range(30))
    meta = nccl_meta(ranks=f"[{shown}, ...]", size=32,
                     extra={"Global rank start": 0, "Global rank stride": 2})
    op = only_op(one_call_trace(tmp_path, meta, world=64))
    assert op.group == ProcessGroup(tuple(range(0, 64, 2)))
    assert not op.approximate


def test_truncated_rank_list_without_stride_leaves_the_group_unknown(tmp_path: Path) -> None:
    shown = ", ".join(str(i) for i in range(30))
    op = only_op(one_call_trace(tmp_path, nccl_meta(ranks=f"[{shown}, ...]", size=40), world=64))
    assert op.group is None
    assert op.approximate


def test_group_name_reused_for_different_rank_sets_on_different_ranks(tmp_path: Path) -> None:
    rank0 = TraceBuilder(rank=0, world=4)
    rank0.step(1, 0, 1000)
    rank0.call(100, nccl_meta(ranks="[0, 1]", name="1"), kernel=(130, 50))
    rank2 = TraceBuilder(rank=2, world=4)
    rank2.step(1, 0, 1000)
    rank2.call(100, nccl_meta(ranks=None, size=2, name="1"), kernel=(130, 50))
    rank2.pg_config = [{"pg_name": "1", "pg_desc": "tp", "pg_size": 2, "ranks": [2, 3]}]
    trace_dir = tmp_path / "job"
    trace_dir.mkdir()
    rank0.write(trace_dir / "rank0.json")
    rank2.write(trace_dir / "rank2.json")
    workload = read_kineto(trace_dir)
    assert only_op(workload, 0).group == ProcessGroup((0, 1))
    assert only_op(workload, 2).group == ProcessGroup((2, 3))
    assert only_op(workload, 0).group_name == only_op(workload, 2).group_name == "1"
    assert workload.groups() == {ProcessGroup((0, 1)), ProcessGroup((2, 3))}


def test_group_must_contain_the_rank_of_the_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="does not contain this file's rank 0"):
        one_call_trace(tmp_path, nccl_meta(ranks="[2, 3]"), world=4)


# --- all-to-all splits ---------------------------------------------------------------------------


def test_uneven_all_to_all_with_explicit_splits(tmp_path: Path) -> None:
    # 12 rows of 2 floats: 1 row to rank 0, 3 to rank 1, 8 to rank 2.
    meta = nccl_meta("all_to_allv", 24, ranks="[0, 1, 2]", size=3, out_nelems=6,
                     extra={"In split size": "[1, 3, 8]", "Out split size": "[1, 1, 1]"})
    op = only_op(one_call_trace(tmp_path, meta, world=3))
    assert op.collective is Collective.ALL_TO_ALL
    assert op.nbytes == 24 * 4
    assert op.split_nbytes == (8, 24, 64)
    assert op.recv_split_nbytes == (8, 8, 8)
    assert not op.approximate


def test_all_to_all_with_empty_split_list_splits_equally(tmp_path: Path) -> None:
    op = only_op(one_call_trace(tmp_path, nccl_meta("all_to_all", 40, ranks="[0, 1]")))
    assert op.split_nbytes == (80, 80)
    assert not op.approximate


def test_all_to_all_with_truncated_split_list_is_approximate_with_the_recorded_total(
    tmp_path: Path,
) -> None:
    shown = ", ".join(["1"] * 30)
    truncated = f"[{shown}, ...]"
    meta = nccl_meta("all_to_all", 1000, ranks="[]", size=32,
                     extra={"In split size": truncated, "Out split size": truncated})
    op = only_op(one_call_trace(tmp_path, meta, world=32))
    assert op.nbytes == 1000 * 4  # the recorded total, not the sum of the 30 shown splits
    assert op.split_nbytes is None
    assert op.approximate
    assert any("truncated" in note for note in op.notes)


def test_splits_follow_ascending_rank_order(tmp_path: Path) -> None:
    meta = nccl_meta("all_to_all", 4, ranks="[1, 0]", extra={"In split size": "[3, 1]"})
    op = only_op(one_call_trace(tmp_path, meta))
    assert op.split_nbytes == (4, 12)  # rank 0 gets the second recorded split


def test_split_list_of_the_wrong_length_is_an_error(tmp_path: Path) -> None:
    meta = nccl_meta("all_to_all", 4, ranks="[0, 1]", extra={"In split size": "[1, 1, 2]"})
    with pytest.raises(TraceError, match="In split size") as info:
        one_call_trace(tmp_path, meta)
    assert "rank0.json" in str(info.value)
    assert "3 entries for 2 ranks" in str(info.value)


# --- sizes, names, p2p ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("collective", "nelems", "expected", "kind"),
    [
        ("_allgather_base", 100, 200, Collective.ALL_GATHER),
        ("_reduce_scatter_base", 100, 200, Collective.REDUCE_SCATTER),
        ("broadcast", 7, 14, Collective.BROADCAST),
        ("allreduce_coalesced", 3, 6, Collective.ALL_REDUCE),
    ],
)
def test_collective_names_and_input_bytes(
    tmp_path: Path, collective: str, nelems: int, expected: int, kind: Collective
) -> None:
    op = only_op(one_call_trace(tmp_path, nccl_meta(collective, nelems, dtype="BFloat16")))
    assert op.collective is kind
    assert op.nbytes == expected


def test_unknown_dtype_is_an_error_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="dtype") as info:
        one_call_trace(tmp_path, nccl_meta(dtype="Quaternion"))
    assert "'Quaternion'" in str(info.value)


def test_send_with_destination_rank(tmp_path: Path) -> None:
    op = only_op(one_call_trace(tmp_path, nccl_meta("send", 16, extra={"Dst Rank": 1})))
    assert op.collective is Collective.SEND_RECV
    assert op.direction is Direction.SEND
    assert op.peer == 1


def test_wait_is_ignored_and_unsupported_collectives_are_reported(tmp_path: Path) -> None:
    builder = TraceBuilder(rank=0, world=2)
    builder.step(1, 0, 1000)
    builder.call(100, nccl_meta(), kernel=(130, 50))
    builder.call(300, nccl_meta("wait", 0, ranks="[]", size=None, dtype="Byte"))
    builder.call(400, nccl_meta("reduce", 8), kernel=(430, 10))
    workload = read_kineto(builder.write(tmp_path / "rank0.json"))
    assert [op.collective for op in workload.ranks[0]] == [Collective.ALL_REDUCE]
    assert any("'reduce' call(s) skipped" in a for a in workload.assumptions)


# --- iteration and timing ------------------------------------------------------------------------


def test_gaps_come_from_the_gpu_timeline_and_are_clamped(tmp_path: Path) -> None:
    builder = TraceBuilder(rank=0, world=2)
    builder.step(1, 1000, 1000)
    builder.call(1100, nccl_meta(), kernel=(1200, 100))  # gap 200 us from the step start
    builder.compute_kernel(1300, 50)
    builder.call(1150, nccl_meta(), kernel=(1450, 50), tid=2)  # 150 us after the first ended
    builder.call(1400, nccl_meta(), kernel=(1480, 40))  # starts before the previous one ended
    workload = read_kineto(builder.write(tmp_path / "rank0.json"))
    gaps = [op.compute_gap_s for op in workload.ranks[0]]
    assert gaps == pytest.approx([200e-6, 150e-6, 0.0])
    assert any("overlaps the previous call" in n for n in workload.ranks[0][2].notes)
    assert workload.tail_gap_s[0] == pytest.approx((2000 - 1520) * 1e-6)


def test_call_without_kernel_in_a_gpu_trace_uses_cpu_time_and_makes_the_step_incomplete(
    tmp_path: Path,
) -> None:
    builder = TraceBuilder(rank=0, world=2)
    builder.step(1, 0, 1000)
    builder.call(100, nccl_meta(nelems=1), kernel=(130, 50))
    builder.step(2, 1000, 1000)
    builder.call(1100, nccl_meta(nelems=2))  # its kernel fell outside the recording
    path = builder.write(tmp_path / "rank0.json")
    workload = read_kineto(path)
    assert workload.iteration == "ProfilerStep#1"
    assert only_op(workload).nbytes == 4
    chosen = read_kineto(path, step=2)
    assert chosen.iteration == "ProfilerStep#2"
    assert any("timing from the CPU call" in n for n in only_op(chosen).notes)


def test_latest_complete_step_is_taken_and_calls_outside_it_are_dropped(tmp_path: Path) -> None:
    builder = TraceBuilder(rank=0, world=2)
    for number, start in ((3, 0), (4, 1000)):
        builder.step(number, start, 1000)
        builder.call(start + 100, nccl_meta(nelems=number), kernel=(start + 130, 50))
    builder.call(2500, nccl_meta(nelems=99), kernel=(2530, 10))  # after the last step
    workload = read_kineto(builder.write(tmp_path / "rank0.json"))
    assert workload.iteration == "ProfilerStep#4"
    assert [op.nbytes for op in workload.ranks[0]] == [16]


def test_missing_step_is_an_error(tmp_path: Path) -> None:
    builder = TraceBuilder(rank=0, world=2)
    builder.step(1, 0, 1000)
    builder.call(100, nccl_meta(), kernel=(130, 50))
    with pytest.raises(TraceError, match="ProfilerStep"):
        read_kineto(builder.write(tmp_path / "rank0.json"), step=9)


def test_trace_without_steps_is_one_iteration(tmp_path: Path) -> None:
    builder = TraceBuilder(rank=0, world=2)
    builder.call(100, nccl_meta(), kernel=(130, 50))
    workload = read_kineto(builder.write(tmp_path / "rank0.json"))
    assert workload.iteration == "whole trace"
    assert len(workload.ranks[0]) == 1
    assert any("no ProfilerStep" in a for a in workload.assumptions)


# --- ranks and inputs ----------------------------------------------------------------------------


def test_single_rank_trace_extends_to_ranks_sharing_all_its_groups(tmp_path: Path) -> None:
    workload = one_call_trace(tmp_path, nccl_meta())
    assert set(workload.ranks) == {0, 1}
    assert not only_op(workload, 0).approximate
    copied = only_op(workload, 1)
    assert copied.approximate
    assert copied.group == ProcessGroup((0, 1))
    assert any("rank(s) 1 assumed to run the same sequence as rank 0" in a
               for a in workload.assumptions)


def test_rank_from_file_name_and_tarball_of_gzipped_files(tmp_path: Path) -> None:
    archive = tmp_path / "job.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for rank in (0, 1):
            builder = TraceBuilder(rank=None, world=2)
            builder.step(1, 0, 1000)
            builder.call(100, nccl_meta(nelems=10 + rank), kernel=(130, 50))
            data = gzip.compress(json.dumps(builder.doc()).encode())
            member = tarfile.TarInfo(f"job/worker{rank}.pt.trace.json.gz")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    workload = read_kineto(archive)
    assert workload.source_format is SourceFormat.KINETO
    assert {r: only_op(workload, r).nbytes for r in workload.ranks} == {0: 40, 1: 44}
    assert any("file name" in a for a in workload.assumptions)


def test_duplicate_rank_is_an_error(tmp_path: Path) -> None:
    for name in ("a.json", "b.json"):
        builder = TraceBuilder(rank=0, world=2)
        builder.call(100, nccl_meta(), kernel=(130, 50))
        builder.write(tmp_path / name)
    with pytest.raises(TraceError, match="rank already read"):
        read_kineto(tmp_path)


@pytest.mark.parametrize(
    ("content", "field"),
    [
        (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "du', "<json>"),
        (bytes(range(256)) * 4, "<file>"),
        (b'[{"ph": "X"}]', "<top level>"),
        (b'{"schemaVersion": 1, "events": []}', "traceEvents"),
        (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": "soon", "dur": 1}]}',
         "traceEvents[0].ts"),
        (gzip.compress(b'{"traceEvents": []}')[:-6], "gzip"),
    ],
    ids=["truncated-json", "random-bytes", "json-list", "other-json-object", "bad-ts",
         "truncated-gzip"],
)
def test_broken_or_foreign_file_names_the_file_and_the_field(
    tmp_path: Path, content: bytes, field: str
) -> None:
    path = tmp_path / "rank3.json"
    path.write_bytes(content)
    with pytest.raises(TraceError) as info:
        read_kineto(path)
    assert info.value.field == field
    assert info.value.source == str(path)
    assert str(path) in str(info.value)


def test_broken_member_of_a_tarball_is_named(tmp_path: Path) -> None:
    archive = tmp_path / "job.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = b'{"traceEvents": ['
        member = tarfile.TarInfo("job/rank1.json")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    with pytest.raises(TraceError, match=r"job\.tar\.gz!job/rank1\.json"):
        read_kineto(archive)


def test_directory_without_traces_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("nothing here")
    with pytest.raises(TraceError, match=r"no \*\.json"):
        read_kineto(tmp_path)


@pytest.mark.parametrize("where", ["In msg nelems", "Input Dims"])
def test_an_oversized_collective_is_refused_naming_the_field(tmp_path: Path, where: str) -> None:
    """Regression (issue 10): Input Dims [[10^30]] was accepted and crashed the host agent's
    encoder an iteration later (uint64 out of range); the reader now refuses any size above
    MAX_MESSAGE_BYTES, naming the field and the value."""
    builder = TraceBuilder(rank=0, world=2)
    builder.step(1, 0, 1000)
    if where == "In msg nelems":
        builder.call(100, nccl_meta(nelems=10**30), kernel=(130, 50))
    else:
        builder.call(100, None, annotation="nccl:all_reduce",
                     annotation_args={"Input Dims": [[10**30]], "Input type": ["float"]},
                     kernel=(130, 50))
    with pytest.raises(TraceError) as info:
        read_kineto(builder.write(tmp_path / "rank0.json"))
    assert info.value.field.startswith(where)
    assert "MAX_MESSAGE_BYTES" in str(info.value) and str(10**30) in str(info.value)


def test_a_world_of_a_million_ranks_is_expanded_in_linear_time(tmp_path: Path) -> None:
    """Regression (issue 10): a trace of rank 0 in a world of 10^6 ranks hung (still running
    after 300 s): the check whether an unrecorded rank may copy rank 0's sequence scanned the
    world group's rank tuple per rank. Now group membership is a set lookup and the copies
    share one sequence; a world beyond MAX_WORLD_SIZE is refused naming the field."""
    world = 10**6
    workload = one_call_trace(tmp_path, nccl_meta(ranks=None, size=world), world=world)
    assert len(workload.ranks) == world
    assert workload.ranks[world - 1] is workload.ranks[1]  # one shared copy
    (op,) = workload.ranks[world - 1]
    assert op.approximate and "copied from rank 0: this rank is not in the trace" in op.notes
    with pytest.raises(TraceError) as info:
        one_call_trace(tmp_path, nccl_meta(ranks=None, size=2), world=MAX_WORLD_SIZE + 1)
    assert info.value.field == "distributedInfo.world_size"
    assert info.value.value == MAX_WORLD_SIZE + 1


@pytest.mark.parametrize("base_us", [0.0, 1e16])
def test_nesting_tolerance_is_relative_to_the_timestamps(tmp_path: Path, base_us: float) -> None:
    """Regression (issue 10): with 17-digit timestamps (~1e16 us, per-rank epoch offsets)
    float64 rounding puts a child event's end 2 us past its parent's; a fixed 1e-3 us
    tolerance split them and the collective "recorded no size". The tolerance is now a few
    ulps of the timestamps: the same 2 us overrun at small timestamps still does not nest."""
    builder = TraceBuilder(rank=0, world=2)
    builder.step(1, base_us, 10_000)
    builder.call(base_us + 100, nccl_meta(), annotation="nccl:all_reduce",
                 annotation_args={}, kernel=(base_us + 130, 50))
    child = next(e for e in builder.events if e["name"] == "nccl:all_reduce")
    child["ts"], child["dur"] = base_us + 102, 20.0  # parent: ts 100, dur 20: 2 us past it
    path = builder.write(tmp_path / "rank0.json")
    if base_us:
        assert only_op(read_kineto(path)).nbytes == 1024 * 4
    else:
        with pytest.raises(TraceError, match="records no size"):
            read_kineto(path)
