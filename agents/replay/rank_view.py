"""The ranks of a workload as ``lightrail evaluate`` prices them: one representative per class
of ranks that run the same sequence, and per op index the groups that share the rails.

Two ways to the same view (``RankView``): per rank (``per_rank_view``: every rank's replay ops
from ``lightrail.agents.replay.replayer.expand_workload``, classes by ``signature``) for
traces, and by class (``schedule_view``) for generated schedules
(``lightrail.agents.replay.trace.model.RankSchedule``: AICB, SimAI), where nothing is
materialized per rank: the schedule's blocks of ranks that run alike are merged by the same
signature, and the concurrent groups of an op index come from the schedule when the simulator
asks. Both give the same classes, representatives and groups (tests compare them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import overload

from lightrail.agents.replay.replayer import ReplayOp, expand_workload, replay_ops
from lightrail.agents.replay.trace.model import RankSchedule, Workload
from lightrail.controller.domain.model import ProcessGroup

__all__ = ["RankView", "ScheduleGroupsAt", "aligned", "groups_at_of", "max_ops_note",
           "per_rank_view", "rank_view", "same_sequence_ranks", "schedule_view", "signature"]


def aligned(ops: Mapping[int, Sequence[ReplayOp]]) -> bool:
    """True when every rank's sequence has the same length and collectives as the others."""
    seqs = list(ops.values())
    if not seqs:
        return True
    first = seqs[0]
    return all(len(s) == len(first) and all(a.collective is b.collective
                                            for a, b in zip(s, first, strict=True))
               for s in seqs[1:])


def groups_at_of(ops: Mapping[int, Sequence[ReplayOp]]) -> list[frozenset[ProcessGroup]] | None:
    """Per op index, the process groups the ranks' ops at that index run in (the collectives
    that share the rails at once), when every rank's sequence lines up with the others (same
    length and collectives); None when they do not."""
    if not aligned(ops):
        return None
    length = len(next(iter(ops.values())))
    acc: list[set[ProcessGroup]] = [set() for _ in range(length)]
    for seq in ops.values():
        for i, op in enumerate(seq):
            if op.group is not None:
                acc[i].add(op.group)
    return [frozenset(s) for s in acc]


def same_sequence_ranks(
    ops: Mapping[int, Sequence[ReplayOp]], tail_gap_s: Mapping[int, float]
) -> list[list[int]]:
    """The ranks in classes that run the same sequence (collective, group size, bytes, compute
    gap per op, and tail gap): each class sorted, the classes in order of their first rank,
    which represents the class."""
    by_sig: dict[tuple[object, ...], list[int]] = {}
    for r in sorted(ops):
        by_sig.setdefault(signature(ops[r], tail_gap_s.get(r, 0.0)), []).append(r)
    return list(by_sig.values())


@dataclass(frozen=True, slots=True)
class RankView:
    """What the simulator needs of a workload's ranks: ``reps``, each representative's replay
    ops (truncated to ``--max-ops``) in order of rank; ``members``, how many ranks each
    represents; ``groups_at``, per op index the groups running at once (None when the ranks'
    sequences do not line up); ``ranks``, how many ranks have sequences; ``notes``."""

    reps: dict[int, list[ReplayOp]]
    members: dict[int, int]
    groups_at: Sequence[frozenset[ProcessGroup]] | None
    ranks: int
    notes: list[str]


def max_ops_note(max_ops: int, longest: int) -> str:
    return (f"only the first {max_ops} of up to {longest} collectives per rank are evaluated "
            "(--max-ops)")


def signature(ops: Sequence[ReplayOp], tail_s: float) -> tuple[object, ...]:
    """What makes two ranks' evaluations equal: per op the collective, group size (0 without
    a group), bytes and compute gap, and the tail gap."""
    return (tuple((o.collective, o.group.size if o.group else 0, o.nbytes, o.gap_s)
                  for o in ops), tail_s)


def per_rank_view(workload: Workload, max_ops: int | None) -> RankView:
    """The view of every rank's sequence (``expand_workload``), classes by signature (no
    representative when the workload has no rank)."""
    ops, notes = expand_workload(workload)
    longest = max((len(v) for v in ops.values()), default=0)
    if max_ops is not None and longest > max_ops:
        ops = {r: v[:max_ops] for r, v in ops.items()}
        notes.append(max_ops_note(max_ops, longest))
    classes = same_sequence_ranks(ops, workload.tail_gap_s)
    return RankView({m[0]: ops[m[0]] for m in classes}, {m[0]: len(m) for m in classes},
                     groups_at_of(ops), len(ops), notes)


class ScheduleGroupsAt(Sequence[frozenset[ProcessGroup]]):
    """Per op index, the groups (of 2 ranks or more) the blocks of ``schedule`` run at that
    index at once, computed when the simulator asks (only for phases on the rails) and shared
    between indices that run the same groups."""

    def __init__(self, schedule: RankSchedule, blocks: int, length: int) -> None:
        self._schedule = schedule
        self._blocks = blocks
        self._length = length
        self._by_index: dict[int, frozenset[ProcessGroup]] = {}
        self._by_sets: dict[tuple[frozenset[ProcessGroup], ...], frozenset[ProcessGroup]] = {}

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> frozenset[ProcessGroup]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[frozenset[ProcessGroup]]: ...

    def __getitem__(
        self, index: int | slice
    ) -> frozenset[ProcessGroup] | Sequence[frozenset[ProcessGroup]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        if not -self._length <= index < self._length:
            raise IndexError(index)
        index %= self._length
        groups = self._by_index.get(index)
        if groups is None:
            sets = tuple(self._schedule.groups_at(b, index) for b in range(self._blocks))
            groups = self._by_sets.get(sets)
            if groups is None:
                groups = frozenset(g for gs in sets for g in gs if g.size >= 2)
                self._by_sets[sets] = groups
            self._by_index[index] = groups
        return groups


def schedule_view(
    workload: Workload, schedule: RankSchedule, max_ops: int | None
) -> RankView | None:
    """The view of a class-based schedule: one sequence per block of ranks that run alike
    (``RankSchedule.blocks``), blocks merged by signature as ``same_sequence_ranks`` merges
    ranks, so the classes, representatives and groups are those of the per-rank view. None
    when a block's ranks have different tail gaps (the per-rank view handles that)."""
    blocks = schedule.blocks()
    tails = workload.tail_gap_s
    for b in blocks:
        tail = tails.get(b.start, 0.0)
        if any(tails.get(r, 0.0) != tail for r in b):
            return None
    notes = list(workload.assumptions)
    seqs = [replay_ops(b.start, schedule.ops_of(b.start)) for b in blocks]
    longest = max(len(q) for q in seqs)
    if max_ops is not None and longest > max_ops:
        seqs = [q[:max_ops] for q in seqs]
        notes.append(max_ops_note(max_ops, longest))
    first = seqs[0]
    lined_up = all(len(q) == len(first) and all(a.collective is c.collective
                                                for a, c in zip(q, first, strict=True))
                   for q in seqs[1:])
    groups_at = ScheduleGroupsAt(schedule, len(blocks), len(first)) if lined_up else None
    by_sig: dict[tuple[object, ...], int] = {}
    reps: dict[int, list[ReplayOp]] = {}
    members: dict[int, int] = {}
    for b, q in zip(blocks, seqs, strict=True):
        rep = by_sig.setdefault(signature(q, tails.get(b.start, 0.0)), b.start)
        reps.setdefault(rep, q)
        members[rep] = members.get(rep, 0) + len(b)
    return RankView(reps, members, groups_at, schedule.world_size, notes)


def rank_view(workload: Workload, max_ops: int | None) -> RankView:
    """The class-based view of a generated schedule, else the per-rank view."""
    schedule = workload.schedule
    if schedule is not None:
        view = schedule_view(workload, schedule, max_ops)
        if view is not None:
            return view
    return per_rank_view(workload, max_ops)
