"""The Megatron rank layout and a generated schedule expanded over it, by class of ranks.

AICB and SimAI workloads (``lightrail.agents.replay.trace.aicb``) are one schedule every rank
runs on its own process groups. :class:`ParallelLayout` places ranks as Megatron-LM does (TP
fastest, then DP, then PP; expert groups inside DP), :class:`Demand` is one collective of the
schedule, and :class:`MegatronSchedule` gives any rank's sequence on demand and the classes of
ranks that run alike (pipeline stages with the same send/recv neighbours), so a job of 9,216
ranks is never materialized rank by rank (``lightrail.agents.replay.trace.model.RankSchedule``).
A pipeline send/recv runs on the pair of a rank and its peer of the next or previous stage
(``GroupKind.PP_NEXT`` / ``PP_PREV``), and a stage's wait for the pipeline before a demand
(``idle_s``) is added to that demand's gap, so stages that wait differently are classes of
their own.

Source of the layout: Megatron-LM ``megatron/core/parallel_state.py``
(``initialize_model_parallel``, order tp-dp-pp; expert-parallel groups as consecutive blocks of
``ep`` DP ranks, expert-data-parallel groups as strides of ``ep``).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lightrail.agents.replay.trace.model import CommOp, Direction, RankSchedule, ScheduledRanks
from lightrail.controller.domain.model import Collective, ProcessGroup

__all__ = ["Demand", "GroupKind", "MegatronSchedule", "ParallelLayout", "RankCoords",
           "expand_per_rank", "op_for", "schedule_ranks"]


class GroupKind(enum.Enum):
    """A parallelism dimension's process group, as AICB / SimAI name them."""

    TP = "tp"
    DP = "dp"
    PP = "pp"
    EP = "ep"
    EP_DP = "ep_dp"
    """Expert-data-parallel: the DP ranks that hold the same experts (stride ``ep``)."""
    EP_TP = "ep_tp"
    """Tensor x expert parallel: the TP ranks of one EP block."""
    EMBEDDING = "embedding"
    """First and last pipeline stage of one pipeline (tied embeddings)."""
    PP_NEXT = "pp_next"
    """A rank and its peer of the next pipeline stage (same TP and DP coordinates): the pair
    of one pipeline send/recv (stage s -> s+1 forward, s+1 -> s backward)."""
    PP_PREV = "pp_prev"
    """A rank and its peer of the previous pipeline stage: the same pairs seen from s+1."""
    WORLD = "world"


_PAIR_STEPS = {GroupKind.PP_NEXT: 1, GroupKind.PP_PREV: -1}
"""The pipeline pair kinds and the peer stage each holds (relative to the rank's)."""


@dataclass(frozen=True, slots=True)
class RankCoords:
    """Position of a rank along each parallelism dimension (0-based)."""

    tp: int
    dp: int
    pp: int


@dataclass(frozen=True, slots=True)
class ParallelLayout:
    """Megatron rank layout: ``rank = tp_idx + tp * (dp_idx + dp * pp_idx)``.

    ``ep`` must divide ``dp``. Raises ``ValueError`` on degrees < 1 or an ``ep`` that does not
    divide ``dp``. Source: Megatron-LM ``megatron/core/parallel_state.py``
    (``initialize_model_parallel``, order tp-dp-pp).
    """

    tp: int
    dp: int
    pp: int
    ep: int = 1

    def __post_init__(self) -> None:
        if min(self.tp, self.dp, self.pp, self.ep) < 1:
            raise ValueError(f"ParallelLayout: degrees must be >= 1: {self}")
        if self.dp % self.ep:
            raise ValueError(f"ParallelLayout: ep {self.ep} does not divide dp {self.dp}")

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return self.tp * self.dp * self.pp

    def rank(self, coords: RankCoords) -> int:
        """Global rank of a position."""
        return coords.tp + self.tp * (coords.dp + self.dp * coords.pp)

    def coords(self, rank: int) -> RankCoords:
        """Position of a global rank; ``ValueError`` outside ``0 .. world_size-1``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside 0..{self.world_size - 1}")
        return RankCoords(rank % self.tp, (rank // self.tp) % self.dp, rank // (self.tp * self.dp))

    def group_size(self, kind: GroupKind) -> int:
        """Size of every group of ``kind``."""
        return {
            GroupKind.TP: self.tp,
            GroupKind.DP: self.dp,
            GroupKind.PP: self.pp,
            GroupKind.EP: self.ep,
            GroupKind.EP_DP: self.dp // self.ep,
            GroupKind.EP_TP: self.tp * self.ep,
            GroupKind.EMBEDDING: 2 if self.pp > 1 else 1,
            GroupKind.PP_NEXT: 2,
            GroupKind.PP_PREV: 2,
            GroupKind.WORLD: self.world_size,
        }[kind]

    def group(self, kind: GroupKind, rank: int) -> ProcessGroup:
        """The group of ``kind`` that contains ``rank``. ``ValueError`` for a pipeline pair
        (``PP_NEXT`` / ``PP_PREV``) of a rank of the last / first stage, which has no peer
        on that side."""
        c = self.coords(rank)
        block = c.dp - c.dp % self.ep
        if kind is GroupKind.TP:
            members = [RankCoords(t, c.dp, c.pp) for t in range(self.tp)]
        elif kind is GroupKind.DP:
            members = [RankCoords(c.tp, d, c.pp) for d in range(self.dp)]
        elif kind is GroupKind.PP:
            members = [RankCoords(c.tp, c.dp, p) for p in range(self.pp)]
        elif kind is GroupKind.EP:
            members = [RankCoords(c.tp, d, c.pp) for d in range(block, block + self.ep)]
        elif kind is GroupKind.EP_DP:
            members = [RankCoords(c.tp, d, c.pp) for d in range(c.dp % self.ep, self.dp, self.ep)]
        elif kind is GroupKind.EP_TP:
            blocks = range(block, block + self.ep)
            members = [RankCoords(t, d, c.pp) for d in blocks for t in range(self.tp)]
        elif kind is GroupKind.EMBEDDING:
            members = [RankCoords(c.tp, c.dp, p) for p in sorted({0, self.pp - 1})]
        elif kind in (GroupKind.PP_NEXT, GroupKind.PP_PREV):
            peer = c.pp + (1 if kind is GroupKind.PP_NEXT else -1)
            if not 0 <= peer < self.pp:
                raise ValueError(f"rank {rank} of stage {c.pp} has no {kind.value} peer "
                                 f"(pp={self.pp})")
            members = [RankCoords(c.tp, c.dp, p) for p in sorted((c.pp, peer))]
        else:
            return ProcessGroup.of(tuple(range(self.world_size)))
        return ProcessGroup.of(tuple(self.rank(m) for m in members))

    def stage_groups(self, kind: GroupKind, stage: int) -> tuple[ProcessGroup, ...]:
        """The distinct groups of ``kind`` that hold a rank of pipeline stage ``stage``, in
        order of their lowest such rank (``ValueError`` for a stage outside ``0 .. pp-1``). A
        TP group of stage 0 is ``group(TP, r)`` for some ``r`` of that stage; a PP group spans
        every stage."""
        if not 0 <= stage < self.pp:
            raise ValueError(f"stage {stage} outside 0..{self.pp - 1}")
        per_stage = self.tp * self.dp
        seen: set[int] = set()
        out: list[ProcessGroup] = []
        for rank in range(stage * per_stage, (stage + 1) * per_stage):
            if rank in seen:
                continue
            group = self.group(kind, rank)
            seen.update(group.ranks)
            out.append(group)
        return tuple(out)

    def describe(self) -> str:
        """The layout as a sentence for ``Workload.assumptions``."""
        ep = f", ep={self.ep} (consecutive DP blocks)" if self.ep > 1 else ""
        return (
            "rank layout: Megatron order, TP fastest, then DP, then PP: "
            f"rank = tp_idx + {self.tp}*(dp_idx + {self.dp}*pp_idx) "
            f"(tp={self.tp}, dp={self.dp}, pp={self.pp}{ep})"
        )


@dataclass(frozen=True, slots=True)
class Demand:
    """One collective of the schedule, before expansion to ranks: from ``line`` of the source,
    ``collective`` on each rank's group of ``kind``, ``size_bytes`` in the generator's
    convention (the whole buffer: see ``lightrail.agents.replay.trace.aicb``), ``gap_s`` of
    compute before it; send/recv only: ``direction`` and ``peer_step``, the pipeline stage of
    the peer relative to the rank's (+1 next, -1 previous)."""

    line: int
    collective: Collective
    kind: GroupKind
    size_bytes: int
    gap_s: float
    direction: Direction | None = None
    peer_step: int = 0

    def __post_init__(self) -> None:
        step = _PAIR_STEPS.get(self.kind)
        if step is not None and (self.collective is not Collective.SEND_RECV
                                 or self.peer_step != step):
            raise ValueError(f"Demand (line {self.line}): a {self.kind.value} group holds a "
                             f"send/recv with peer_step {step}, got {self.collective.value} "
                             f"with peer_step {self.peer_step}")


def _sharing(kind: GroupKind, group: ProcessGroup, rank: int) -> tuple[int, ...]:
    """The ranks whose group of ``kind`` is ``group`` (found for ``rank``): every member, but
    only ``rank`` for a pipeline pair (its peer's pair of the same kind is the next one)."""
    return (rank,) if kind in _PAIR_STEPS else group.ranks


def op_for(demand: Demand, group: ProcessGroup, name: str, peer: int | None) -> CommOp:
    """The :class:`CommOp` of ``demand`` on ``group`` (labelled ``name``), with ``peer`` for a
    send/recv: an all-gather's bytes become this rank's shard (rounded up, and marked
    approximate, when the size does not divide), an all-to-all's become equal splits when they
    divide."""
    notes: list[str] = []
    approximate = False
    nbytes = demand.size_bytes
    splits: tuple[int, ...] | None = None
    if demand.collective is Collective.ALL_GATHER:
        nbytes, rest = divmod(demand.size_bytes, group.size)
        if rest:
            nbytes += 1
            approximate = True
            notes.append(
                f"gathered size {demand.size_bytes} B is not a multiple of the group size "
                f"{group.size}: shard rounded up to {nbytes} B"
            )
    elif demand.collective is Collective.ALL_TO_ALL:
        if demand.size_bytes % group.size == 0:
            splits = (demand.size_bytes // group.size,) * group.size
            notes.append("total size only: equal splits, as the generator assumes")
        else:
            approximate = True
            notes.append("total size does not split evenly: per-peer bytes unknown")
    return CommOp(
        collective=demand.collective,
        group=group,
        group_name=name,
        nbytes=nbytes,
        compute_gap_s=demand.gap_s,
        approximate=approximate,
        notes=tuple(notes),
        split_nbytes=splits,
        direction=demand.direction,
        peer=peer,
    )


def _checked_idle(
    idle_s: Mapping[int, Sequence[float]], demands: int, pp: int
) -> dict[int, tuple[float, ...]]:
    """``idle_s`` checked: demand indices in range, one finite value >= 0 per stage."""
    out: dict[int, tuple[float, ...]] = {}
    for index, values in idle_s.items():
        if not 0 <= index < demands:
            raise ValueError(f"idle_s: demand index {index} outside 0..{demands - 1}")
        if len(values) != pp or not all(math.isfinite(v) and v >= 0 for v in values):
            raise ValueError(f"idle_s[{index}]: expected {pp} finite seconds >= 0 (one per "
                             f"stage), got {tuple(values)}")
        out[index] = tuple(float(v) for v in values)
    return out


def _idled(demand: Demand, idle: Mapping[int, Sequence[float]], index: int, stage: int) -> Demand:
    """``demand`` with the idle time of ``stage`` before it added to its gap."""
    extra = idle.get(index)
    if extra is None or not extra[stage]:
        return demand
    return dataclasses.replace(demand, gap_s=demand.gap_s + extra[stage])


def expand_per_rank(
    demands: Sequence[Demand],
    layout: ParallelLayout,
    idle_s: Mapping[int, Sequence[float]] | None = None,
) -> dict[int, tuple[CommOp, ...]]:
    """Every rank's sequence, materialized (the per-rank form :class:`MegatronSchedule`
    computes on demand); ops are shared between the members of one group. ``idle_s``: per
    demand index, seconds each pipeline stage waits before it (added to the gap)."""
    idle = _checked_idle(idle_s or {}, len(demands), layout.pp)
    cache: dict[tuple[int, ProcessGroup, int | None, int], CommOp] = {}
    ops: dict[int, list[CommOp]] = {rank: [] for rank in range(layout.world_size)}
    groups: dict[tuple[GroupKind, int], ProcessGroup] = {}
    for index, demand in enumerate(demands):
        for rank in range(layout.world_size):
            peer: int | None = None
            if demand.collective is Collective.SEND_RECV:
                c = layout.coords(rank)
                stage = c.pp + demand.peer_step
                if not 0 <= stage < layout.pp:
                    continue  # first / last pipeline stage: no neighbour on that side
                peer = layout.rank(RankCoords(c.tp, c.dp, stage))
            key = (demand.kind, rank)
            group = groups.get(key)
            if group is None:
                group = layout.group(demand.kind, rank)
                for member in _sharing(demand.kind, group, rank):
                    groups[(demand.kind, member)] = group
            own_stage = layout.coords(rank).pp
            op = cache.get((index, group, peer, own_stage))
            if op is None:
                op = op_for(_idled(demand, idle, index, own_stage), group, demand.kind.value,
                            peer)
                cache[(index, group, peer, own_stage)] = op
            ops[rank].append(op)
    return {rank: tuple(seq) for rank, seq in ops.items()}


class MegatronSchedule(RankSchedule):
    """``demands`` run by every rank of ``layout`` on its own groups, by class of ranks.

    Rank ``r``'s sequence is every demand in order, on ``layout.group(kind, r)``; a send/recv
    whose peer stage (``stage + peer_step``) is outside the pipeline is left out (first and last
    stage), so pipeline stages with the same neighbours form one block. ``idle_s`` (demand
    index -> seconds per stage, ``pp`` values each; ``ValueError`` otherwise) adds the time a
    stage waits for the pipeline before a demand to its gap: stages that wait differently are
    blocks of their own. No sequence is stored:
    groups are made when a rank or a stage asks for them and kept (each group once, looked up
    by the ranks asked for), calls are made anew on each ``ops_of``. ``ValueError`` when a
    demand's group would not hold the ranks that
    issue it (an embedding group with more than two pipeline stages: the middle stages are not
    in it); :func:`expand_per_rank` gives the per-rank form then.
    """

    def __init__(
        self,
        demands: Sequence[Demand],
        layout: ParallelLayout,
        idle_s: Mapping[int, Sequence[float]] | None = None,
    ) -> None:
        if layout.pp > 2 and any(d.kind is GroupKind.EMBEDDING for d in demands):
            raise ValueError("MegatronSchedule: an embedding group over more than 2 stages does "
                             "not hold the middle stages")
        self.world_size = layout.world_size
        self._demands = tuple(demands)
        self._layout = layout
        self._idle = _checked_idle(idle_s or {}, len(self._demands), layout.pp)
        present = [(self._present(stage), self._stage_idle(stage))
                   for stage in range(layout.pp)]
        per_stage = layout.tp * layout.dp
        blocks: list[range] = []
        self._block_demands: list[tuple[int, ...]] = []
        self._block_stages: list[range] = []
        first = 0
        for stage in range(1, layout.pp + 1):
            if stage == layout.pp or present[stage] != present[first]:
                blocks.append(range(first * per_stage, stage * per_stage))
                self._block_demands.append(present[first][0])
                self._block_stages.append(range(first, stage))
                first = stage
        self._blocks = tuple(blocks)
        self._groups: dict[tuple[GroupKind, int], ProcessGroup] = {}
        self._stage_groups: dict[tuple[GroupKind, int], tuple[ProcessGroup, ...]] = {}
        self._at: dict[tuple[int, GroupKind], frozenset[ProcessGroup]] = {}

    def _stage_idle(self, stage: int) -> tuple[tuple[int, float], ...]:
        """The idle seconds ``idle_s`` adds before demands of ``stage`` (index, s; 0 left out)."""
        return tuple((i, v[stage]) for i, v in sorted(self._idle.items()) if v[stage])

    def _present(self, stage: int) -> tuple[int, ...]:
        """Indices of the demands a rank of pipeline ``stage`` issues."""
        return tuple(i for i, d in enumerate(self._demands)
                     if d.collective is not Collective.SEND_RECV
                     or 0 <= stage + d.peer_step < self._layout.pp)

    def _group(self, kind: GroupKind, rank: int) -> ProcessGroup:
        group = self._groups.get((kind, rank))
        if group is None:
            group = self._layout.group(kind, rank)
            for member in _sharing(kind, group, rank):
                self._groups[(kind, member)] = group
        return group

    def ops_of(self, rank: int) -> tuple[CommOp, ...]:
        """``rank``'s sequence, as :func:`expand_per_rank` gives it (``KeyError`` outside the
        world)."""
        if not 0 <= rank < self.world_size:
            raise KeyError(rank)
        layout = self._layout
        c = layout.coords(rank)
        ops: list[CommOp] = []
        for index in self._block_demands[self._block_index(c.pp)]:
            demand = _idled(self._demands[index], self._idle, index, c.pp)
            peer: int | None = None
            if demand.collective is Collective.SEND_RECV:
                peer = layout.rank(RankCoords(c.tp, c.dp, c.pp + demand.peer_step))
            ops.append(op_for(demand, self._group(demand.kind, rank), demand.kind.value, peer))
        return tuple(ops)

    def _block_index(self, stage: int) -> int:
        for i, stages in enumerate(self._block_stages):
            if stage in stages:
                return i
        raise KeyError(stage)  # pragma: no cover - blocks cover every stage

    def blocks(self) -> tuple[range, ...]:
        """Runs of consecutive pipeline stages with the same send/recv neighbours: one block
        without pipeline send/recv, else first stage, middle stages, last stage."""
        return self._blocks

    def groups_at(self, block: int, index: int) -> frozenset[ProcessGroup]:
        """Every group of op ``index``'s kind over the block's stages (``IndexError`` past the
        block's sequence)."""
        kind = self._demands[self._block_demands[block][index]].kind
        key = (block, kind)
        groups = self._at.get(key)
        if groups is None:
            found: set[ProcessGroup] = set()
            for stage in self._block_stages[block]:
                sg = self._stage_groups.get((kind, stage))
                if sg is None:
                    sg = self._layout.stage_groups(kind, stage)
                    self._stage_groups[(kind, stage)] = sg
                found.update(sg)
            groups = frozenset(found)
            self._at[key] = groups
        return groups


def schedule_ranks(
    demands: Sequence[Demand],
    layout: ParallelLayout,
    idle_s: Mapping[int, Sequence[float]] | None = None,
) -> Mapping[int, tuple[CommOp, ...]]:
    """``Workload.ranks`` of ``demands`` over ``layout`` (``idle_s``: pipeline waits, see
    :class:`MegatronSchedule`): by class of ranks (nothing stored per rank), or every rank's
    sequence where a demand's group would not hold its ranks (``Workload`` then refuses it, as
    it always has)."""
    try:
        return ScheduledRanks(MegatronSchedule(demands, layout, idle_s))
    except ValueError:
        return expand_per_rank(demands, layout, idle_s)
