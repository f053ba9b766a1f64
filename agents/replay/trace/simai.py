"""SimAI workload text -> :class:`Workload` for every rank.

SimAI workloads (``workload/simAI/model_workload/*.txt`` of Alibaba's AICB,
github.com/aliyun/aicb, read by SimAI's ``astra-sim/workload/Workload.cc``) are *generated from
the model*, not profiled: one schedule that every rank runs on its own process groups, expanded
with the Megatron rank layout (``lightrail.agents.replay.trace.megatron``) and message sizes in
AICB's convention (see ``lightrail.agents.replay.trace.aicb``).

Format: a first line with the parallelism policy and ``key: value`` degrees
(``model_parallel_NPU_group``, ``ep``, ``pp``, ``vpp``, ``ga``, ``all_gpus``, ``pp_comm`` ...),
a line with the layer count, then per layer: name, dependency, then for the forward,
input-gradient and weight-gradient passes a compute time in ns, a collective type and a size in
bytes, and a final update time. Forward and input-gradient collectives run on the TP group,
weight-gradient ones on the DP group; suffixes ``_EP`` / ``_DP_EP`` select the EP /
expert-data-parallel group. The iteration is SimAI's order: forward layers 0..L-1, then for
layers L-1..0 input gradient then weight gradient; compute before a collective is its gap.

With ``pp > 1`` the layer lines are one stage's layers and every stage runs them (as AICB
writes and SimAI runs them); the pipeline send/recv of ``pp_comm`` bytes between the paired
ranks of neighbouring stages and GPipe's waits are added as
``lightrail.agents.replay.trace.simai_pipeline`` describes (with the SimAI and AICB sources it
follows): SimAI itself prices the pipeline only analytically.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lightrail.agents.replay.trace.megatron import (
    Demand,
    GroupKind,
    ParallelLayout,
    schedule_ranks,
)
from lightrail.agents.replay.trace.model import (
    MAX_MESSAGE_BYTES,
    Direction,
    SourceFormat,
    TraceError,
    Workload,
    int_field,
)
from lightrail.agents.replay.trace.simai_pipeline import (
    LayerPass,
    Pipeline,
    PipelineTransfer,
    PipelineWaits,
    gpipe_waits,
    microbatch_blocks,
    pipeline_order,
    simai_pipeline,
)
from lightrail.controller.domain.model import MAX_WORLD_SIZE, Collective

__all__ = ["read_simai"]

_NS = 1e-9
_SIMAI_POLICIES = frozenset({"HYBRID_TRANSFORMER_FWD_IN_BCKWD", "HYBRID_TRANSFORMER"})
_SIMAI_BASES: Mapping[str, Collective] = {
    "ALLREDUCE": Collective.ALL_REDUCE,
    "ALLGATHER": Collective.ALL_GATHER,
    "REDUCESCATTER": Collective.REDUCE_SCATTER,
    "ALLTOALL": Collective.ALL_TO_ALL,
    "BROADCAST": Collective.BROADCAST,
}
_SIMAI_FIELDS = 12
_SIMAI_HEADER_KEYS = frozenset({"model_parallel_NPU_group", "ep", "pp", "vpp", "ga", "all_gpus",
                                "checkpoints", "checkpoint_initiates", "pp_comm"})
"""The header fields AICB writes (``pp_comm`` with or without its colon); others are noted."""


@dataclass(frozen=True, slots=True)
class _Slot:
    compute_ns: int
    collective: Collective | None
    kind: GroupKind
    size_bytes: int


@dataclass(frozen=True, slots=True)
class _Layer:
    line: int
    name: str
    forward: _Slot
    input_grad: _Slot
    weight_grad: _Slot


def _simai_header(source: Path, line: str) -> tuple[str, dict[str, int]]:
    tokens = line.split()
    if not tokens or tokens[0] not in _SIMAI_POLICIES:
        raise TraceError(source, "workload type", tokens[0] if tokens else line,
                         f"not a SimAI workload type this reader supports "
                         f"({', '.join(sorted(_SIMAI_POLICIES))})", line=1)
    params: dict[str, int] = {}
    i = 1
    while i < len(tokens):
        key = tokens[i].rstrip(":")
        if ":" in key:  # 'pp:12' would be left out, and pp read as 1
            raise TraceError(source, key.partition(":")[0], tokens[i],
                             "expected 'KEY: VALUE' (a space after the colon)", line=1)
        if key in _SIMAI_HEADER_KEYS and key != "pp_comm" and not tokens[i].endswith(":"):
            raise TraceError(source, key, tokens[i], f"expected '{key}: VALUE' (no colon)",
                             line=1)
        if tokens[i].endswith(":") or key == "pp_comm":
            if i + 1 >= len(tokens):
                raise TraceError(source, key, None, "missing value", line=1)
            value = tokens[i + 1]
            try:
                number = int(float(value)) if key == "pp_comm" else int(value)
            except (ValueError, OverflowError):  # OverflowError: pp_comm inf
                raise TraceError(source, key, value, "not an integer", line=1) from None
            if key == "pp_comm" and number > MAX_MESSAGE_BYTES:
                raise TraceError(source, key, value, f"must be <= {MAX_MESSAGE_BYTES} B "
                                 "(MAX_MESSAGE_BYTES)", line=1)
            if key in params:
                raise TraceError(source, key, number, f"given twice (first {params[key]})",
                                 line=1)
            params[key] = number
            i += 2
        else:
            i += 1
    return tokens[0], params


def _simai_slot(source: Path, line: int, fields: Sequence[str], at: int, which: LayerPass) -> _Slot:
    names = (f"{which.value}_compute_time", f"{which.value}_comm_type", f"{which.value}_comm_size")
    compute = int_field(source, line, names[0], fields[at], minimum=0)
    raw_type = fields[at + 1]
    size = int_field(source, line, names[2], fields[at + 2], minimum=0, maximum=MAX_MESSAGE_BYTES)
    if raw_type == "NONE":
        return _Slot(compute, None, GroupKind.TP, 0)  # a size on NONE is not demand
    base, _, suffix = raw_type.partition("_")
    collective = _SIMAI_BASES.get(base)
    plain = GroupKind.DP if which is LayerPass.WEIGHT_GRAD else GroupKind.TP
    kind = {"": plain, "EP": GroupKind.EP, "DP_EP": GroupKind.EP_DP}.get(suffix)
    if collective is None or kind is None:
        raise TraceError(source, names[1], raw_type, "unknown SimAI collective type", line=line)
    return _Slot(compute, collective, kind, size)


def _stream_lines(source: Path) -> Iterator[str]:
    """The lines of ``source`` one at a time, split as ``str.splitlines`` splits the whole text
    (so line numbers match a whole-file read). Raises ``TraceError`` for text that is not
    UTF-8, ``OSError`` when the file cannot be opened."""
    with source.open(encoding="utf-8") as f:
        try:
            for raw in f:
                yield from raw.splitlines() or [""]
        except UnicodeDecodeError as exc:
            raise TraceError(source, "<file>", str(exc)[:60], "not UTF-8 text") from exc


def _simai_layers(source: Path, lines: Iterator[str]) -> list[_Layer]:
    """The layer lines after the header (``lines`` is past line 1): line 2 the layer count,
    then one layer per non-blank line."""
    second = next(lines, None)
    if second is None:
        raise TraceError(source, "layer count", None, "missing second line", line=2)
    count = int_field(source, 2, "layer count", second, minimum=0)
    layers: list[_Layer] = []
    for offset, text in enumerate(lines):
        line = 3 + offset
        fields = text.split()
        if not fields:
            continue
        if len(fields) != _SIMAI_FIELDS:
            raise TraceError(source, "<layer>", text,
                             f"{len(fields)} fields, expected {_SIMAI_FIELDS}", line=line)
        int_field(source, line, "dependency", fields[1].lstrip("-"), minimum=0)
        int_field(source, line, "wg_update_time", fields[11], minimum=0)
        layers.append(_Layer(
            line=line,
            name=fields[0],
            forward=_simai_slot(source, line, fields, 2, LayerPass.FORWARD),
            input_grad=_simai_slot(source, line, fields, 5, LayerPass.INPUT_GRAD),
            weight_grad=_simai_slot(source, line, fields, 8, LayerPass.WEIGHT_GRAD),
        ))
    if len(layers) != count:
        raise TraceError(source, "layer count", count, f"but {len(layers)} layer lines follow",
                         line=2)
    return layers


def _simai_demands(
    layers: Sequence[_Layer], blocks: Sequence[range], pp_comm_bytes: int
) -> tuple[list[Demand], int, dict[GroupKind, int]]:
    """The demands of ``layers`` in SimAI's order with the pipeline transfers of ``blocks``
    (``pipeline_order``), the compute (ns) after the last one, and the index of the first
    receive of each pipeline pair kind."""
    demands: list[Demand] = []
    pending_ns = 0
    first_recv: dict[GroupKind, int] = {}
    for item in pipeline_order([layer.line for layer in layers], blocks, pp_comm_bytes):
        if isinstance(item, PipelineTransfer):
            # no compute gap of its own: the first and last stage leave some transfers out,
            # and the compute before one must not go with it (their waits come as idle_s)
            if item.direction is Direction.RECV:
                first_recv.setdefault(item.kind, len(demands))
            demands.append(Demand(item.line, Collective.SEND_RECV, item.kind, item.nbytes,
                                  0.0, item.direction, item.peer_step))
            continue
        layer = layers[item[0]]
        slot = {LayerPass.FORWARD: layer.forward, LayerPass.INPUT_GRAD: layer.input_grad,
                LayerPass.WEIGHT_GRAD: layer.weight_grad}[item[1]]
        pending_ns += slot.compute_ns
        if slot.collective is None:
            continue
        demands.append(Demand(layer.line, slot.collective, slot.kind, slot.size_bytes,
                               pending_ns * _NS))
        pending_ns = 0
    return demands, pending_ns, first_recv


def _simai_assumptions(
    policy: str, params: Mapping[str, int], layout: ParallelLayout, world: int,
    demands: Sequence[Demand],
) -> list[str]:
    """What ``read_simai`` assumes of every SimAI workload (the pipeline's notes apart)."""
    pp = layout.pp
    assumptions = [
        "SimAI schedule generated from the model, not profiled: every rank runs the same "
        "sequence on its own process groups",
        layout.describe(),
        "groups as SimAI's Workload.cc: forward and input-gradient collectives on the TP group, "
        "weight-gradient ones on the DP group (_EP: EP group, _DP_EP: expert-data-parallel)",
        "order as SimAI runs it: forward layers first to last, then per layer last to first the "
        "input-gradient then the weight-gradient collective; SimAI overlaps weight-gradient "
        "collectives with later compute, here they are sequenced",
        "compute gaps are the layer compute times (ns) before each collective; update times are "
        "not modelled",
    ]
    if policy == "HYBRID_TRANSFORMER_FWD_IN_BCKWD" and params.get("checkpoints", 0) > 0:
        assumptions.append("activation checkpointing (forward recompute in backward) not modelled")
    unknown = sorted(set(params) - _SIMAI_HEADER_KEYS)
    if unknown:
        assumptions.append(f"header field(s) {', '.join(unknown)} not read (AICB writes "
                           f"{', '.join(sorted(_SIMAI_HEADER_KEYS))})")
    if "pp" not in params or "all_gpus" not in params:
        assumptions.append(f"header without pp/all_gpus (older AICB): pp={pp}, world={world}")
    if any(d.collective is Collective.BROADCAST for d in demands):
        assumptions.append("BROADCAST layers are kept (SimAI itself ignores them)")
    return assumptions


def _waits(
    pipeline: Pipeline, layers: Sequence[_Layer], blocks: Sequence[range],
    first_recv: Mapping[GroupKind, int],
) -> PipelineWaits:
    """GPipe's waits (``gpipe_waits``) for stages that run ``layers``: one microbatch's
    forward / backward compute is the mean over ``blocks`` of their layers' compute."""
    fwd_ns = sum(layers[i].forward.compute_ns for b in blocks for i in b)
    bwd_ns = sum(layers[i].input_grad.compute_ns + layers[i].weight_grad.compute_ns
                 for b in blocks for i in b)
    count = max(len(blocks), 1)
    return gpipe_waits(pipeline.pp, first_recv.get(GroupKind.PP_PREV),
                       first_recv.get(GroupKind.PP_NEXT), fwd_ns * _NS / count,
                       bwd_ns * _NS / count)


def _pipeline_notes(
    pipeline: Pipeline, blocks: Sequence[range], waits: PipelineWaits
) -> list[str]:
    """The assumptions of a SimAI workload with ``pp > 1``
    (``lightrail.agents.replay.trace.simai_pipeline``)."""
    pp = pipeline.pp
    notes = [
        f"pp={pp}: the layer lines are one stage's layers (AICB divides the model's layers by "
        "pp); every stage runs them",
        f"pipeline send/recv of pp_comm {pipeline.pp_comm_bytes} B between the paired ranks "
        f"of neighbouring stages (same TP and DP coordinates), per microbatch ({len(blocks)}, "
        "header ga) one forward s -> s+1 and one backward s+1 -> s, in SimAI's order: all "
        "forward, then all backward (GPipe order); SimAI itself prices them analytically "
        "(Layer.cc), not on the network",
        f"pipeline bubble as GPipe waits: stage s waits s x {waits.forward_s * 1e3:.3f} ms "
        f"before its first forward receive, (pp-1-s) x "
        f"{(waits.forward_s + waits.backward_s) * 1e3:.3f} ms before its first backward "
        f"receive and s x {waits.backward_s * 1e3:.3f} ms after its last collective: "
        f"{waits.bubble_s * 1e3:.3f} ms per stage, from compute only (SimAI adds (pp-1)/"
        "(ga*vpp) of the compute and exposed TP time analytically)",
    ]
    if pipeline.vpp != 1:
        notes.append(f"vpp={pipeline.vpp} is not modelled as interleaving (AICB writes the "
                     "layers per stage there): one send per microbatch, direction and stage "
                     "boundary, GPipe's bubble")
    return notes


def read_simai(path: Path, *, world_size: int | None = None) -> Workload:
    """Read a SimAI workload text file into a Workload for all ranks.

    ``world_size`` is needed when the header has no ``all_gpus`` (older AICB output); when both
    are given they must agree. Returns ``SourceFormat.SIMAI`` with gaps from the per-layer
    compute times (ns) and ``tail_gap_s`` for the compute after the last collective. With
    ``pp > 1`` every stage runs the layer lines (one stage's layers, as AICB writes them) plus
    the pipeline send/recv of ``pp_comm`` bytes per microbatch between paired ranks of
    neighbouring stages, and waits where GPipe's bubble falls
    (``lightrail.agents.replay.trace.simai_pipeline``). Raises :class:`TraceError` naming the
    file, line and field on an unsupported workload type, a malformed layer line (bad number,
    unknown collective type, wrong field count), a header field of AICB's without its colon or
    any written ``KEY:VALUE`` (no space), a header field given twice, an ``all_gpus``
    outside 1..``MAX_WORLD_SIZE``, a ``pp_comm`` above ``MAX_MESSAGE_BYTES``, inconsistent
    degrees (``pp`` or ``tp x pp`` not dividing ``all_gpus``, an ``ep`` not dividing DP, a
    degree < 1), ``pp > 1`` without a ``pp_comm``, or microbatches (``embedding_layer`` ...
    ``embedding_norm``) that do not close or whose number is not ``ga``.
    """
    path = Path(path)
    lines = _stream_lines(path)
    first = next(lines, None)
    if first is None:
        raise TraceError(path, "workload type", "", "empty file", line=1)
    policy, params = _simai_header(path, first)
    header_world = params.get("all_gpus")
    if header_world is not None and not 1 <= header_world <= MAX_WORLD_SIZE:
        raise TraceError(path, "all_gpus", header_world,
                         f"must be 1..{MAX_WORLD_SIZE} (MAX_WORLD_SIZE)", line=1)
    if header_world is not None and world_size is not None and header_world != world_size:
        raise TraceError(path, "all_gpus", header_world, f"but world_size={world_size} was given",
                         line=1)
    world = header_world if header_world is not None else world_size
    if world is None:
        raise TraceError(path, "all_gpus", None,
                         "world size not in the header; pass world_size", line=1)
    tp = params.get("model_parallel_NPU_group", 1)
    if tp < 1:
        raise TraceError(path, "model_parallel_NPU_group", tp, "must be >= 1", line=1)
    pipeline = simai_pipeline(path, params, world, tp)
    pp = pipeline.pp
    ep = params.get("ep", 1)
    try:
        layout = ParallelLayout(tp=tp, dp=world // (tp * pp), pp=pp, ep=ep)
    except ValueError as exc:
        raise TraceError(path, "ep", ep, str(exc), line=1) from exc
    layers = _simai_layers(path, lines)
    lines_of = [layer.line for layer in layers]
    blocks = microbatch_blocks(path, [layer.name for layer in layers], lines_of,
                               pipeline.ga) if pp > 1 else ()
    demands, pending_ns, first_recv = _simai_demands(layers, blocks, pipeline.pp_comm_bytes)
    assumptions = _simai_assumptions(policy, params, layout, world, demands)
    tails = dict.fromkeys(range(layout.world_size), pending_ns * _NS)
    idle: Mapping[int, tuple[float, ...]] | None = None
    if pp > 1:
        waits = _waits(pipeline, layers, blocks, first_recv)
        assumptions.extend(_pipeline_notes(pipeline, blocks, waits))
        idle = waits.idle_s
        per_stage = layout.tp * layout.dp
        tails = {r: pending_ns * _NS + waits.tail_s[r // per_stage] for r in tails}
    elif pipeline.pp_comm_bytes:
        assumptions.append(f"pp=1 with pp_comm {pipeline.pp_comm_bytes} B (SimAI warns of a "
                           "format mismatch): no pipeline, pp_comm unused")
    return Workload(
        name=path.name,
        source_format=SourceFormat.SIMAI,
        world_size=layout.world_size,
        ranks=schedule_ranks(demands, layout, idle),
        assumptions=tuple(assumptions),
        iteration="one iteration (the whole file)",
        tail_gap_s=tails,
    )
