"""The pipeline (PP) traffic of a SimAI workload with ``pp > 1``: where the send/recv of
``pp_comm`` bytes between neighbouring stages go in a rank's sequence.

What SimAI and AICB do (aliyun/SimAI ``astra-sim-alibabacloud/astra-sim/workload/``,
aliyun/aicb ``workload_generator/SimAI_training_workload_generator.py`` and
``utils/utils.py``; read December 2026):

* **Layers per stage.** AICB divides the model's layers by the pipeline degree before it
  writes the file (``utils.py`` ``get_params``: ``args.num_layers //= pipeline_model_parallel``),
  so the layer lines of a file with ``pp > 1`` are *one stage's* layers; SimAI runs the same
  file on every rank (``Workload.cc`` reads one layer list for all NPUs). Every stage here runs
  every layer line; a file for ``pp`` stages made from a whole-model file keeps ``1/pp`` of its
  transformer layers (``lightrail.agents.replay.trace.simai_scale.scale_simai``).
* **Microbatches.** AICB unrolls gradient accumulation into the file: the layer set from
  ``embedding_layer`` to ``embedding_norm`` is written ``ga`` times (``workload_generate``:
  ``for _ in range(self.ga_num)``), between the gradient-norm lines before and the
  cross-entropy / optimizer lines after. SimAI walks the layer list forward then backward
  (``Workload::iterate_hybrid_parallel_Transformer_fwd_in_bckwd``), so the microbatches run all
  forward, then all backward in reverse: GPipe order, not 1F1B.
* **``pp_comm``.** ``dump_file`` writes ``pp_comm = 2 * micro_batch * seq_length * hidden``
  bytes (``/ tp`` with sequence parallelism): one stage boundary's activation (forward) or its
  gradient (backward) for one microbatch. SimAI never puts it on the network: its groups are
  built with ``PP_size = 1`` (``system/Sys.cc`` ``mock_nccl_grobal_group_init``) and the
  pipeline appears only in the end-of-run report (``Layer.cc`` ``Layer::report``):
  ``Expose_PP_time = 2 * vpp * GA * pp_comm`` at 1 GiB/s scaled by ``1 / pp_overlap_ratio``
  and then by ``(1 - pp_overlap_ratio)`` (0 at its default ratio 1), and a bubble of
  ``(PP - 1) / (GA * vpp)`` times the compute and exposed TP time of every layer but
  ``embedding_layer`` (Megatron's interleaved 1F1B bubble fraction; Narayanan et al., SC'21).
  ``Workload.cc`` warns of a format mismatch when ``pp != 1`` and ``pp_comm == 0``.
* **``vpp``.** AICB writes ``vpp: num_layers`` (the layers per stage after the division), not
  an interleaving degree; SimAI uses it only in the two report formulas above.

What Lightrail makes of it (the rails need the messages as phases): per microbatch and rank,
``2 * vpp * GA`` becomes two transfers per direction and stage boundary with ``vpp`` taken as 1
(no interleaving): in the forward sweep the first layer of microbatch ``m`` is preceded by a
RECV from stage ``s-1`` and its last layer followed by a SEND to stage ``s+1``; in the backward
sweep the last layer's input gradient is preceded by a RECV from ``s+1`` and the first layer's
weight gradient followed by a SEND to ``s-1``. Each is a SEND_RECV of ``pp_comm`` bytes on the
pair of the two ranks (same TP and DP coordinates: ``GroupKind.PP_NEXT`` / ``PP_PREV``); the
first and last stage have no peer on one side. A transfer has no compute gap of its own (the
compute before it goes to the next collective, so a stage that leaves it out keeps it).
SimAI's bubble is placed where GPipe waits (:func:`gpipe_waits`: before a stage's first
forward and first backward receive, and after its last collective), from the layers' compute
only (SimAI adds the exposed TP time too), so each stage is a class of its own and every
stage's iteration holds the same ``(pp-1) * (t_f + t_b)`` of waiting.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lightrail.agents.replay.trace.megatron import GroupKind
from lightrail.agents.replay.trace.model import Direction, TraceError

__all__ = ["MICROBATCH_FIRST", "MICROBATCH_LAST", "LayerPass", "Pipeline", "PipelineTransfer",
           "PipelineWaits", "gpipe_waits", "microbatch_blocks", "pipeline_order",
           "simai_pipeline"]

MICROBATCH_FIRST = "embedding_layer"
"""The layer name AICB writes first in each microbatch's layer set."""
MICROBATCH_LAST = "embedding_norm"
"""The layer name AICB writes last in each microbatch's layer set."""


class LayerPass(enum.Enum):
    """One of the three passes of a SimAI layer line."""

    FORWARD = "fwd"
    INPUT_GRAD = "ig"
    WEIGHT_GRAD = "wg"


@dataclass(frozen=True, slots=True)
class Pipeline:
    """The pipeline fields of a SimAI header: ``pp`` stages, ``vpp`` and ``ga`` as written
    (defaults 1), ``pp_comm_bytes`` per stage-boundary message (0 without a pipeline)."""

    pp: int
    vpp: int
    ga: int
    pp_comm_bytes: int


@dataclass(frozen=True, slots=True)
class PipelineTransfer:
    """A pipeline send/recv of ``nbytes`` in a rank's sequence, on its pair of ``kind``
    (``PP_NEXT``: with stage s+1, ``PP_PREV``: with stage s-1), for ``microbatch``
    (0-based), next to the layer line ``line``."""

    kind: GroupKind
    direction: Direction
    nbytes: int
    microbatch: int
    line: int

    @property
    def peer_step(self) -> int:
        """The peer's stage relative to the rank's."""
        return 1 if self.kind is GroupKind.PP_NEXT else -1


def simai_pipeline(source: Path, params: Mapping[str, int], world: int, tp: int) -> Pipeline:
    """The pipeline of a SimAI header's ``params`` for ``world`` GPUs and TP degree ``tp``.

    Raises :class:`TraceError` (line 1) naming the field and value: ``pp``, ``vpp`` or ``ga``
    below 1, ``pp`` not dividing the world size, or ``pp > 1`` without a positive ``pp_comm``
    (SimAI's ``Workload.cc`` calls that a format mismatch: there is no message size)."""
    pp = params.get("pp", 1)
    vpp = params.get("vpp", 1)
    ga = params.get("ga", 1)
    for name, value in (("pp", pp), ("vpp", vpp), ("ga", ga)):
        if value < 1:
            raise TraceError(source, name, value, "must be >= 1", line=1)
    if world % pp:
        raise TraceError(source, "pp", pp, f"does not divide the world size {world} "
                         "(all_gpus)", line=1)
    if world % (tp * pp):
        raise TraceError(source, "model_parallel_NPU_group", tp,
                         f"tp {tp} x pp {pp} does not divide the world size {world}", line=1)
    pp_comm = params.get("pp_comm", 0)
    if pp > 1 and pp_comm <= 0:
        raise TraceError(source, "pp_comm", params.get("pp_comm"),
                         f"pp={pp} needs the bytes of one pipeline send (AICB writes "
                         "2 x micro_batch x seq_length x hidden)", line=1)
    if pp_comm < 0:
        raise TraceError(source, "pp_comm", pp_comm, "must be >= 0", line=1)
    return Pipeline(pp, vpp, ga, pp_comm)


def microbatch_blocks(
    source: Path, names: Sequence[str], lines: Sequence[int], ga: int
) -> tuple[range, ...]:
    """The layer indices of each microbatch: from each ``embedding_layer`` line to the next
    ``embedding_norm`` line (AICB writes ``ga`` of them); one block of every layer when the
    file has neither name. Raises :class:`TraceError` naming the file, line and field when a
    block does not close, or when their number is not ``ga`` (field ``ga``, line 1)."""
    blocks: list[range] = []
    start: int | None = None
    for i, name in enumerate(names):
        if name == MICROBATCH_FIRST:
            if start is not None:
                raise TraceError(source, "<layer>", name, f"a microbatch opened at line "
                                 f"{lines[start]} has no {MICROBATCH_LAST} before this one",
                                 line=lines[i])
            start = i
        elif name == MICROBATCH_LAST:
            if start is None:
                raise TraceError(source, "<layer>", name,
                                 f"no {MICROBATCH_FIRST} opens this microbatch", line=lines[i])
            blocks.append(range(start, i + 1))
            start = None
    if start is not None:
        raise TraceError(source, "<layer>", MICROBATCH_FIRST,
                         f"the microbatch it opens has no {MICROBATCH_LAST}", line=lines[start])
    if not blocks:
        if ga != 1:
            raise TraceError(source, "ga", ga, f"but the layer lines have no "
                             f"{MICROBATCH_FIRST} ... {MICROBATCH_LAST} microbatch to count",
                             line=1)
        return (range(len(names)),)
    if len(blocks) != ga:
        raise TraceError(source, "ga", ga, f"but the file holds {len(blocks)} microbatch(es) "
                         f"({MICROBATCH_FIRST} ... {MICROBATCH_LAST})", line=1)
    return tuple(blocks)


def pipeline_order(
    lines: Sequence[int], blocks: Sequence[range], pp_comm_bytes: int
) -> Iterator[tuple[int, LayerPass] | PipelineTransfer]:
    """SimAI's order over ``len(lines)`` layers (forward first to last, then per layer last to
    first the input then the weight gradient) with the pipeline transfers of ``blocks``
    (microbatches) in place, as the module docstring says. ``blocks`` empty: no transfer."""
    first = {b.start: m for m, b in enumerate(blocks) if len(b)}
    last = {b.stop - 1: m for m, b in enumerate(blocks) if len(b)}
    for i in range(len(lines)):
        if i in first:
            yield PipelineTransfer(GroupKind.PP_PREV, Direction.RECV, pp_comm_bytes, first[i],
                                   lines[i])
        yield i, LayerPass.FORWARD
        if i in last:
            yield PipelineTransfer(GroupKind.PP_NEXT, Direction.SEND, pp_comm_bytes, last[i],
                                   lines[i])
    for i in reversed(range(len(lines))):
        if i in last:
            yield PipelineTransfer(GroupKind.PP_NEXT, Direction.RECV, pp_comm_bytes, last[i],
                                   lines[i])
        yield i, LayerPass.INPUT_GRAD
        yield i, LayerPass.WEIGHT_GRAD
        if i in first:
            yield PipelineTransfer(GroupKind.PP_PREV, Direction.SEND, pp_comm_bytes, first[i],
                                   lines[i])


@dataclass(frozen=True, slots=True)
class PipelineWaits:
    """What each stage of a GPipe pipeline waits for the others in one iteration: ``idle_s``,
    per demand index the seconds of each stage (``pp`` values) before that demand (for
    ``MegatronSchedule``'s ``idle_s``); ``tail_s``, the seconds of each stage after its last
    demand; ``forward_s`` / ``backward_s``, one microbatch's forward / backward compute of a
    stage, from which both are made."""

    idle_s: Mapping[int, tuple[float, ...]]
    tail_s: tuple[float, ...]
    forward_s: float
    backward_s: float

    @property
    def bubble_s(self) -> float:
        """Seconds every stage waits in all: ``(pp - 1) * (forward_s + backward_s)``."""
        return (len(self.tail_s) - 1) * (self.forward_s + self.backward_s)


def gpipe_waits(
    pp: int,
    first_forward_recv: int | None,
    first_backward_recv: int | None,
    forward_s: float,
    backward_s: float,
) -> PipelineWaits:
    """The waits of a GPipe iteration (all forward, then all backward) of ``pp`` stages that
    each take ``forward_s`` / ``backward_s`` per microbatch: stage ``s`` waits ``s * forward_s``
    before its first forward receive (demand index ``first_forward_recv``), ``(pp-1-s) *
    (forward_s + backward_s)`` before its first backward receive (``first_backward_recv``) and
    ``s * backward_s`` after its last demand (the next iteration waits for stage 0): ``(pp-1) *
    (forward_s + backward_s)`` per stage, the bubble SimAI adds as ``(PP-1)/(GA*vpp)`` of the
    compute with ``vpp`` 1 (``Layer.cc``; GPipe, Huang et al., NeurIPS 2019). A None index
    (no such demand) gets no wait."""
    idle: dict[int, tuple[float, ...]] = {}
    if first_forward_recv is not None:
        idle[first_forward_recv] = tuple(s * forward_s for s in range(pp))
    if first_backward_recv is not None:
        idle[first_backward_recv] = tuple((pp - 1 - s) * (forward_s + backward_s)
                                          for s in range(pp))
    tail = tuple(s * backward_s for s in range(pp))
    return PipelineWaits(idle, tail, forward_s, backward_s)
