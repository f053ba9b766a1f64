"""AICB workload CSV -> :class:`Workload` for every rank.

Both formats come from Alibaba's AICB (github.com/aliyun/aicb) and are *generated from the model*,
not profiled: one schedule that every rank runs on its own process groups. The readers expand it
to all ranks with the Megatron rank layout (:class:`ParallelLayout`): TP fastest, then DP, then
PP, ``rank = tp_idx + tp * (dp_idx + dp * pp_idx)``; expert parallelism splits each DP group
into consecutive blocks of ``ep`` (EP groups) and strides of ``ep`` (expert-data-parallel
groups), as Megatron-LM's ``initialize_model_parallel`` builds them.

Message sizes are bytes in the nccl-tests convention AICB uses (``utils/benchmark_logger.py``,
``calc_bw_log``): the whole buffer of the collective, i.e. the gathered output of an all-gather
and the full input of a reduce-scatter. ``CommOp.nbytes`` is converted to the per-rank input
(an all-gather's shard is ``size / group size``).

AICB CSV (``workload/physical/model_workload/*.csv``): a first line ``[rank0 ~ rankN]``, then
the columns ``comm_type,comm_group,comm_group_size,msg_size,stage,dst,src,additional,
_elapsed_time,algbw,busbw,count``. ``CommType.epoch_end`` rows close the init section and each
iteration; the first iteration after init is taken. Rows of ``computation``, ``barrier``,
``NONE`` (whatever their size) are not demand and are skipped. No compute times: gaps are 0.

SimAI text, the other AICB output, is read by ``lightrail.agents.replay.trace.simai``.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lightrail.agents.replay.trace.megatron import (
    Demand,
    GroupKind,
    ParallelLayout,
    RankCoords,
    schedule_ranks,
)
from lightrail.agents.replay.trace.model import (
    MAX_MESSAGE_BYTES,
    MAX_OPS_PER_ITERATION,
    Direction,
    SourceFormat,
    TraceError,
    Workload,
    int_field,
)
from lightrail.controller.domain.model import Collective

__all__ = ["GroupKind", "ParallelLayout", "RankCoords", "read_aicb_csv"]

_WORLD_LINE_RE = re.compile(r"^\[\s*rank(\d+)\s*~\s*rank(\d+)\s*\]$")
_REQUIRED_COLUMNS = ("comm_type", "comm_group", "comm_group_size", "msg_size", "stage")
_NONE_VALUES = frozenset({"", "None", "NONE", "none"})


# --- AICB CSV -----------------------------------------------------------------------------------

_AICB_COLLECTIVES: Mapping[str, Collective] = {
    "all_reduce": Collective.ALL_REDUCE,
    "all_gather": Collective.ALL_GATHER,
    "all_gather_into_tensor": Collective.ALL_GATHER,
    "reduce_scatter": Collective.REDUCE_SCATTER,
    "reduce_scatter_tensor": Collective.REDUCE_SCATTER,
    "all_to_all": Collective.ALL_TO_ALL,
    "broadcast": Collective.BROADCAST,
    "isend": Collective.SEND_RECV,
    "irecv": Collective.SEND_RECV,
}
_AICB_NOT_DEMAND = frozenset({"computation", "barrier", "NONE", "None", "none"})
_AICB_UNSUPPORTED = frozenset({"reduce"})
_AICB_GROUPS: Mapping[str, GroupKind] = {
    "tp_group": GroupKind.TP,
    "dp_group": GroupKind.DP,
    "pp_group": GroupKind.PP,
    "ep_group": GroupKind.EP,
    "ep_dp_group": GroupKind.EP_DP,
    "ep_tp_group": GroupKind.EP_TP,
    "embedding_group": GroupKind.EMBEDDING,
    "all": GroupKind.WORLD,
    "all_nodes": GroupKind.WORLD,
}
_P2P_STEPS: Mapping[str, tuple[Direction, int]] = {
    "send_next": (Direction.SEND, 1),
    "send_prev": (Direction.SEND, -1),
    "recv_next": (Direction.RECV, 1),
    "recv_prev": (Direction.RECV, -1),
}


@dataclass(frozen=True, slots=True)
class _CsvRow:
    line: int
    comm_type: str
    group: GroupKind | None
    group_size: int | None
    msg_size: int
    stage: str
    additional: str
    count: int


def _read_lines(source: Path) -> list[str]:
    try:
        return source.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise TraceError(source, "<file>", str(exc)[:60], "not UTF-8 text") from exc


def _parse_csv_rows(source: Path, lines: Sequence[str]) -> tuple[int | None, list[_CsvRow]]:
    world: int | None = None
    first = 0
    if lines and (match := _WORLD_LINE_RE.match(lines[0].strip())):
        low, high = int(match.group(1)), int(match.group(2))
        if low != 0 or high < low:
            raise TraceError(source, "[rank0 ~ rankN]", lines[0], "ranks must start at 0", line=1)
        world = high + 1
        first = 1
    records = list(csv.reader(lines[first:]))
    if not records:
        raise TraceError(source, "comm_type", None, "no header row", line=first + 1)
    header = [h.strip() for h in records[0]]
    for column in _REQUIRED_COLUMNS:
        if column not in header:
            raise TraceError(source, column, None, "missing column in the header", line=first + 1)
    rows: list[_CsvRow] = []
    for offset, record in enumerate(records[1:]):
        line = first + 2 + offset
        if not record or all(not cell.strip() for cell in record):
            continue
        if len(record) < len(header):
            raise TraceError(source, header[len(record)], None, "missing column", line=line)
        if len(record) > len(header):
            raise TraceError(source, "<row>", record, "more fields than the header", line=line)
        rows.append(_csv_row(source, line, dict(zip(header, record, strict=True))))
    return world, rows


def _csv_row(source: Path, line: int, cells: Mapping[str, str]) -> _CsvRow:
    raw_type = cells["comm_type"].strip()
    comm_type = raw_type.removeprefix("CommType.")
    known = {"epoch_end", *_AICB_COLLECTIVES, *_AICB_NOT_DEMAND, *_AICB_UNSUPPORTED}
    if comm_type not in known:
        raise TraceError(source, "comm_type", raw_type, "unknown AICB comm_type", line=line)
    raw_group = cells["comm_group"].strip()
    group: GroupKind | None = None
    if raw_group not in _NONE_VALUES:
        group = _AICB_GROUPS.get(raw_group.removeprefix("CommGroup."))
        if group is None:
            raise TraceError(source, "comm_group", raw_group, "unknown AICB comm_group", line=line)
    raw_size = cells["comm_group_size"].strip()
    group_size = (
        None if raw_size in _NONE_VALUES
        else int_field(source, line, "comm_group_size", raw_size, minimum=1)
    )
    raw_msg = cells["msg_size"].strip()
    msg_size = 0 if raw_msg in _NONE_VALUES else int_field(
        source, line, "msg_size", raw_msg, minimum=0, maximum=MAX_MESSAGE_BYTES
    )
    raw_count = cells.get("count", "").strip()
    count = 1 if raw_count in _NONE_VALUES else int_field(
        source, line, "count", raw_count, minimum=1, maximum=MAX_OPS_PER_ITERATION
    )
    if comm_type in _AICB_COLLECTIVES:
        if group is None:
            raise TraceError(source, "comm_group", raw_group, "a collective needs a group",
                             line=line)
        if group_size is None:
            raise TraceError(source, "comm_group_size", raw_size, "a collective needs a size",
                             line=line)
    return _CsvRow(line, comm_type, group, group_size, msg_size, cells["stage"].strip(),
                   cells.get("additional", "").strip(), count)


def _group_sizes(source: Path, rows: Sequence[_CsvRow]) -> dict[GroupKind, int]:
    """The size of each group kind the collective rows name, in ranks (pipeline send/recv rows
    of size 1, as older AICB writes them, say nothing). Raises ``TraceError`` when two rows give
    one kind different sizes."""
    sizes: dict[GroupKind, int] = {}
    first_line: dict[GroupKind, int] = {}
    for row in rows:
        if row.comm_type not in _AICB_COLLECTIVES:
            continue
        assert row.group is not None and row.group_size is not None
        if row.comm_type in ("isend", "irecv") and row.group_size == 1:
            continue  # older AICB writes size 1 on pipeline send/recv rows
        seen = sizes.setdefault(row.group, row.group_size)
        line = first_line.setdefault(row.group, row.line)
        if seen != row.group_size:
            raise TraceError(source, "comm_group_size", row.group_size,
                             f"{row.group.value} group was {seen} on line {line}",
                             line=row.line)
    return sizes


def _check_rows_fit(source: Path, rows: Sequence[_CsvRow], layout: ParallelLayout) -> None:
    """Raise ``TraceError`` on the first row ``layout`` cannot run: a pipeline send/recv
    without a pipeline, or a collective (but send/recv) whose group size is not its group's in
    the layout."""
    p2p = next((r for r in rows if r.comm_type in ("isend", "irecv")), None)
    if p2p is not None and layout.pp == 1:
        raise TraceError(source, "comm_group_size", p2p.group_size,
                         "pipeline send/recv but the pipeline size is unknown (1)", line=p2p.line)
    for row in rows:
        if row.comm_type in _AICB_COLLECTIVES and row.comm_type not in ("isend", "irecv"):
            assert row.group is not None
            expected = layout.group_size(row.group)
            if row.group_size != expected:
                raise TraceError(source, "comm_group_size", row.group_size,
                                 f"a {row.group.value} group has {expected} ranks in this layout",
                                 line=row.line)


def _infer_layout(
    source: Path, world: int | None, rows: Sequence[_CsvRow], assumptions: list[str]
) -> ParallelLayout:
    """The parallel layout the rows' group sizes and ``world`` (the ``[rank0 ~ rankN]`` line,
    None when absent: then the product of the sizes, said in ``assumptions``) make: TP and EP
    default to 1, a missing DP or PP is what the world size leaves. Raises ``TraceError`` when
    the sizes do not make the world size or a row does not fit the layout."""
    sizes = _group_sizes(source, rows)
    tp = sizes.get(GroupKind.TP, 1)
    dp = sizes.get(GroupKind.DP)
    pp = sizes.get(GroupKind.PP)
    ep = sizes.get(GroupKind.EP, 1)
    if world is None:
        pp, dp = pp or 1, dp or 1
        world = tp * dp * pp
        assumptions.append(f"no '[rank0 ~ rankN]' line: world size {world} from the group sizes")
    elif dp is None and pp is None:
        pp, dp = 1, world // tp
    elif dp is None:
        assert pp is not None
        dp = world // (tp * pp)
    elif pp is None:
        pp = world // (tp * dp)
    if tp * dp * pp != world:
        raise TraceError(source, "[rank0 ~ rankN]", world,
                         f"tp {tp} x dp {dp} x pp {pp} does not make the world size", line=1)
    try:
        layout = ParallelLayout(tp=tp, dp=dp, pp=pp, ep=ep)
    except ValueError as exc:
        raise TraceError(source, "comm_group_size", ep, str(exc)) from exc
    _check_rows_fit(source, rows, layout)
    return layout


def _iteration_rows(
    source: Path, rows: Sequence[_CsvRow], assumptions: list[str]
) -> tuple[str, list[_CsvRow]]:
    segments: list[list[_CsvRow]] = [[]]
    closed: list[bool] = [False]
    for row in rows:
        if row.comm_type == "epoch_end":
            closed[-1] = True
            segments.append([])
            closed.append(False)
        else:
            segments[-1].append(row)
    if not any(closed):
        assumptions.append("no epoch_end marker: every non-init row is the iteration")
        body = [r for r in rows if not r.stage.startswith("init")]
        return "all non-init rows", body
    for segment, done in zip(segments, closed, strict=True):
        demand = [r for r in segment if r.comm_type in _AICB_COLLECTIVES]
        if done and demand and not all(r.stage.startswith("init") for r in demand):
            label = f"first iteration (lines {segment[0].line}-{segment[-1].line})"
            return label, segment
    raise TraceError(source, "comm_type", "CommType.epoch_end", "no complete iteration between "
                     "epoch_end markers after the init section")


def read_aicb_csv(path: Path) -> Workload:
    """Read an AICB workload CSV into a Workload for all ranks of the layout.

    Returns ``SourceFormat.AICB_CSV``, one op sequence per rank (``0 .. world-1``, world from the
    ``[rank0 ~ rankN]`` line), gaps 0. Raises :class:`TraceError` naming the file, line and field
    on a malformed row (bad number, unknown comm_type or comm_group, missing column), group
    sizes that do not fit one layout, or no complete iteration.
    """
    path = Path(path)
    assumptions: list[str] = [
        "AICB schedule generated from the model, not profiled: every rank runs the same "
        "sequence on its own process groups",
    ]
    world, rows = _parse_csv_rows(path, _read_lines(path))
    layout = _infer_layout(path, world, rows, assumptions)
    assumptions.append(layout.describe())
    label, body = _iteration_rows(path, rows, assumptions)
    demands: list[Demand] = []
    skipped: dict[str, int] = {}
    for row in body:
        if row.comm_type not in _AICB_COLLECTIVES:
            skipped[row.comm_type] = skipped.get(row.comm_type, 0) + row.count
            continue
        assert row.group is not None
        direction: Direction | None = None
        step = 0
        if row.comm_type in ("isend", "irecv"):
            if row.additional not in _P2P_STEPS:
                raise TraceError(path, "additional", row.additional,
                                 "isend/irecv needs send_next/send_prev/recv_next/recv_prev",
                                 line=row.line)
            direction, step = _P2P_STEPS[row.additional]
            expected = Direction.SEND if row.comm_type == "isend" else Direction.RECV
            if direction is not expected:
                raise TraceError(path, "additional", row.additional,
                                 f"contradicts comm_type {row.comm_type}", line=row.line)
        demand = Demand(row.line, _AICB_COLLECTIVES[row.comm_type], row.group, row.msg_size,
                         0.0, direction, step)
        demands.extend([demand] * row.count)
        if len(demands) > MAX_OPS_PER_ITERATION:
            raise TraceError(path, "count", row.count,
                             f"the iteration reaches {len(demands)} collectives per rank, more "
                             f"than {MAX_OPS_PER_ITERATION} (MAX_OPS_PER_ITERATION)",
                             line=row.line)
    for comm_type, count in sorted(skipped.items()):
        assumptions.append(f"{count} '{comm_type}' row(s) in the iteration are not demand: skipped")
    if any(d.collective is Collective.SEND_RECV for d in demands):
        assumptions.append(
            "AICB writes one pipeline stage's schedule; every stage is assumed to run it, and a "
            "send/recv towards a missing neighbour stage is dropped"
        )
    assumptions.append("the AICB CSV has no compute times: every compute gap is 0")
    return Workload(
        name=path.name,
        source_format=SourceFormat.AICB_CSV,
        world_size=layout.world_size,
        ranks=schedule_ranks(demands, layout),
        assumptions=tuple(assumptions),
        iteration=label,
    )
