"""What the trace readers produce: per-rank sequences of collective calls for one iteration.

A :class:`Workload` is one training iteration seen from every rank the source describes: for each
rank, the collectives it issues in order (:class:`CommOp`), each with the compute time before it.
A replay tool walks these sequences to drive ``EnterPhase`` / ``ReleasePhase`` (DESIGN.md, "Phase
protocol"); whatever a reader had to assume is stated in ``Workload.assumptions`` and, per call,
in ``CommOp.notes``.

Byte counts follow the NCCL / ``torch.distributed`` meaning of a collective's *input* on one rank
(see :class:`CommOp`). Sources: PyTorch profiler ``record_param_comms`` metadata
(``torch/csrc/profiler/util.cpp``: ``In msg nelems``, ``Out msg nelems``, ``In split size``, ...),
NCCL collective semantics (docs.nvidia.com/deeplearning/nccl, "Collective Operations").
"""

from __future__ import annotations

import abc
import enum
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from lightrail.controller.domain.model import Collective, ProcessGroup

_VALUE_REPR_MAX = 120
_K = TypeVar("_K")
_V = TypeVar("_V")


MAX_MESSAGE_BYTES = 2**50
"""The largest collective a trace may record, in bytes (1 PiB: beyond any accelerator's memory
by orders of magnitude, and far inside the wire's ``uint64`` ``nbytes``). A larger size is a
corrupt or hostile input; the readers refuse it naming the field and value."""


MAX_OPS_PER_ITERATION = 100_000
"""The most collectives one rank may issue in one iteration of a workload (a 1,000-layer model
with 100 micro-batches stays below it); a generated schedule that repeats a row more often is
refused naming the ``count``, instead of expanding without bound."""


class TraceError(ValueError):
    """A trace or workload file that cannot be read as it claims to be.

    The message names the file (and line, for text formats), the field and the bad value, e.g.
    ``workload.csv:17: field 'msg_size' = 'abc': not an integer``.

    Attributes: ``source`` (file, or ``archive!member``), ``field``, ``value``, ``reason`` and
    ``line`` (1-based, or ``None`` when the format has no lines to speak of).
    """

    def __init__(
        self,
        source: str | os.PathLike[str],
        field: str,
        value: object,
        reason: str,
        *,
        line: int | None = None,
    ) -> None:
        self.source = os.fspath(source)
        self.field = field
        self.value = value
        self.reason = reason
        self.line = line
        where = self.source if line is None else f"{self.source}:{line}"
        shown = repr(value)
        if len(shown) > _VALUE_REPR_MAX:
            shown = shown[: _VALUE_REPR_MAX - 3] + "..."
        super().__init__(f"{where}: field {field!r} = {shown}: {reason}")


class SourceFormat(enum.Enum):
    """The kind of input a :class:`Workload` was read from."""

    KINETO = "kineto"
    """PyTorch profiler (Kineto) Chrome-trace JSON, one file per rank."""
    AICB_CSV = "aicb_csv"
    """AICB physical workload CSV (aliyun/aicb ``workload/physical``), generated, not profiled."""
    SIMAI = "simai"
    """SimAI / ASTRA-sim layer workload text (aliyun/aicb ``workload/simAI``), generated."""
    OPUS = "opus"
    """Opus artifact phase patterns (per-rank pattern files, timed files; opusfabric/Opus)."""
    SYNTHETIC = "synthetic"
    """Built in code (tests, benchmarks), not read from any file."""


class Direction(enum.Enum):
    """Direction of a point-to-point :attr:`Collective.SEND_RECV` call on the issuing rank."""

    SEND = "send"
    RECV = "recv"


@dataclass(frozen=True, slots=True)
class CommOp:
    """One collective call issued by one rank.

    ``nbytes`` is the size of the algorithm input this rank contributes, in bytes
    (elements x element size):

    - all-reduce: the buffer being reduced (same on every rank of the group);
    - broadcast: the buffer (the root sends it, the others receive that many bytes);
    - all-gather: this rank's shard (the output is ``group.size * nbytes``);
    - reduce-scatter: the full input buffer (this rank's output is ``nbytes / group.size``);
    - all-to-all: the whole send buffer, summed over all peers including itself
      (``sum(split_nbytes)`` when the splits are known);
    - send/recv: the message size, sent (``Direction.SEND``) or received (``Direction.RECV``).

    Fields:
        collective: which collective.
        group: the process group (its rank set), or ``None`` when the source does not say which
            group it was - never silently the world group.
        group_name: the source's label for the group (PyTorch ``Process Group Name``, AICB
            ``tp``/``dp``/...); only a label: the same name can denote different rank sets on
            different ranks, so groups are compared by ``group`` alone.
        nbytes: see above, >= 0.
        compute_gap_s: seconds between the end of the previous call of this rank in the iteration
            (or the start of the iteration, for the first call) and the start of this one, >= 0.
            It is the window a reconfiguration can hide in.
        approximate: some field was inferred rather than recorded (``notes`` say which).
        notes: how fields were derived, human-readable; every approximate op has at least one.
        split_nbytes: all-to-all only: bytes this rank sends to each member of ``group``, in the
            order of ``group.ranks`` (ascending global rank, which is group-rank order for
            ``torch.distributed.new_group``); ``None`` when not recorded or not exact.
        recv_split_nbytes: all-to-all only: bytes this rank receives from each member, same order.
        direction: send/recv only: which side this rank is.
        peer: send/recv only: global rank of the other side, ``None`` when not recorded.

    Raises ``ValueError`` when the fields contradict each other (a size below 0 or above
    ``MAX_MESSAGE_BYTES``, a split list that does not sum to ``nbytes`` or does not match the
    group size, a direction on a collective that is not send/recv, a non-finite or negative
    gap)."""

    collective: Collective
    group: ProcessGroup | None
    group_name: str
    nbytes: int
    compute_gap_s: float
    approximate: bool = False
    notes: tuple[str, ...] = ()
    split_nbytes: tuple[int, ...] | None = None
    recv_split_nbytes: tuple[int, ...] | None = None
    direction: Direction | None = None
    peer: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.nbytes <= MAX_MESSAGE_BYTES:
            raise ValueError(f"CommOp: nbytes {self.nbytes} outside 0..{MAX_MESSAGE_BYTES} "
                             "(MAX_MESSAGE_BYTES)")
        if not math.isfinite(self.compute_gap_s) or self.compute_gap_s < 0:
            raise ValueError(f"CommOp: compute_gap_s must be finite and >= 0: {self.compute_gap_s}")
        if self.approximate and not self.notes:
            raise ValueError("CommOp: an approximate op needs a note saying why")
        is_a2a = self.collective is Collective.ALL_TO_ALL
        for name, splits in (("split_nbytes", self.split_nbytes),
                             ("recv_split_nbytes", self.recv_split_nbytes)):
            if splits is None:
                continue
            if not is_a2a:
                raise ValueError(f"CommOp: {name} given for {self.collective.value}")
            if any(s < 0 for s in splits):
                raise ValueError(f"CommOp: negative entry in {name} {splits}")
            if self.group is not None and len(splits) != self.group.size:
                raise ValueError(
                    f"CommOp: {name} has {len(splits)} entries for a group of {self.group.size}"
                )
        if self.split_nbytes is not None and sum(self.split_nbytes) != self.nbytes:
            raise ValueError(
                f"CommOp: split_nbytes sums to {sum(self.split_nbytes)}, nbytes is {self.nbytes}"
            )
        is_p2p = self.collective is Collective.SEND_RECV
        if is_p2p and self.direction is None:
            raise ValueError("CommOp: send_recv needs a direction")
        if not is_p2p and (self.direction is not None or self.peer is not None):
            raise ValueError(f"CommOp: direction/peer given for {self.collective.value}")
        if self.peer is not None and self.peer < 0:
            raise ValueError(f"CommOp: negative peer {self.peer}")


def _frozen_mapping(items: Mapping[_K, _V]) -> Mapping[_K, _V]:
    return MappingProxyType(dict(items))


class RankSchedule(abc.ABC):
    """One schedule that every rank of a job runs on its own process groups, kept by class of
    ranks instead of per rank (generated workloads: AICB, SimAI). A job of 9,216 ranks is 9,216
    sequences of the same calls; a schedule computes a rank's sequence when asked and says which
    ranks behave alike, so nothing is materialized per rank.

    Contract (what :func:`lightrail.agents.replay.evaluate.evaluate` relies on):

    - ``blocks()`` partitions ``0 .. world_size-1`` into ranges, in rank order; the ranks of one
      block issue the same sequence up to the process groups: the same collectives, group
      sizes, byte counts and compute gaps, op by op (and the workload's tail gap is equal
      across a block);
    - ``ops_of(rank)`` equals what a per-rank reader would store for ``rank``, every op's group
      containing ``rank``;
    - ``groups_at(block, index)`` is the set of the groups the ranks of ``block`` use at
      position ``index`` of their sequences (those that run at once on the rails).
    """

    world_size: int

    @abc.abstractmethod
    def ops_of(self, rank: int) -> tuple[CommOp, ...]:
        """``rank``'s calls in issue order; ``KeyError`` outside ``0 .. world_size-1``."""

    @abc.abstractmethod
    def blocks(self) -> tuple[range, ...]:
        """The ranks in ranges that run alike (see the class docstring)."""

    @abc.abstractmethod
    def groups_at(self, block: int, index: int) -> frozenset[ProcessGroup]:
        """The groups of op ``index`` over the ranks of ``blocks()[block]``; ``IndexError``
        when the block's sequence is shorter."""


class ScheduledRanks(Mapping[int, tuple[CommOp, ...]]):
    """``Workload.ranks`` of a :class:`RankSchedule`: every rank ``0 .. world_size-1``, its
    sequence computed on each lookup (nothing stored per rank). Iterating it materializes the
    sequences one at a time; code that can work per class reads ``schedule`` instead."""

    __slots__ = ("schedule",)

    def __init__(self, schedule: RankSchedule) -> None:
        self.schedule = schedule

    def __getitem__(self, rank: int) -> tuple[CommOp, ...]:
        if not isinstance(rank, int) or not 0 <= rank < self.schedule.world_size:
            raise KeyError(rank)
        return self.schedule.ops_of(rank)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.schedule.world_size))

    def __len__(self) -> int:
        return self.schedule.world_size

    def __contains__(self, rank: object) -> bool:
        return isinstance(rank, int) and 0 <= rank < self.schedule.world_size

    def __repr__(self) -> str:
        return f"ScheduledRanks({type(self.schedule).__name__}, {len(self)} ranks)"


def block_of(blocks: Sequence[range], rank: int) -> int:
    """Index of the block of ``blocks`` (ranges in rank order) holding ``rank``;
    ``KeyError`` when none does."""
    lo, hi = 0, len(blocks)
    while lo < hi:
        mid = (lo + hi) // 2
        if rank < blocks[mid].start:
            hi = mid
        elif rank >= blocks[mid].stop:
            lo = mid + 1
        else:
            return mid
    raise KeyError(rank)


@dataclass(frozen=True, slots=True)
class Workload:
    """One iteration of a job, per rank.

    Fields:
        name: a label for the job (usually the input file name).
        source_format: what it was read from.
        world_size: number of ranks in the job (ranks are ``0 .. world_size-1``).
        ranks: rank -> its collective calls in issue order, for one iteration. Only ranks the
            source describes (or that could be derived soundly) are present; ``assumptions``
            say how the others relate. A :class:`ScheduledRanks` (generated schedules) holds
            every rank and computes each sequence when asked; ``schedule`` gives its classes.
        assumptions: statements a replay prints before running, e.g. "no process group
            recorded; world group assumed".
        iteration: which iteration of the source was taken (e.g. ``"ProfilerStep#6"``).
        tail_gap_s: rank -> seconds of compute after its last call until the iteration ends
            (0 for ranks not listed), so iterations can be replayed back to back.

    The mappings are stored read-only. Raises ``ValueError`` on a rank outside
    ``0 .. world_size-1`` or a call whose group does not contain the rank issuing it.
    """

    name: str
    source_format: SourceFormat
    world_size: int
    ranks: Mapping[int, tuple[CommOp, ...]]
    assumptions: tuple[str, ...] = ()
    iteration: str = ""
    tail_gap_s: Mapping[int, float] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"Workload: world_size must be >= 1: {self.world_size}")
        object.__setattr__(self, "tail_gap_s", _frozen_mapping(self.tail_gap_s))
        if isinstance(self.ranks, ScheduledRanks):
            if self.ranks.schedule.world_size != self.world_size:
                raise ValueError(f"Workload: schedule of {self.ranks.schedule.world_size} ranks "
                                 f"for world_size {self.world_size}")
            self._check_tails()
            return  # the schedule builds valid sequences (RankSchedule's contract)
        object.__setattr__(self, "ranks", _frozen_mapping(self.ranks))
        for rank, ops in self.ranks.items():
            if not 0 <= rank < self.world_size:
                raise ValueError(f"Workload: rank {rank} outside 0..{self.world_size - 1}")
            for i, op in enumerate(ops):
                if op.group is not None and not op.group.contains(rank):
                    raise ValueError(
                        f"Workload: rank {rank} op #{i} on group {op.group.ranks} without it"
                    )
        self._check_tails()

    def _check_tails(self) -> None:
        for rank, gap in self.tail_gap_s.items():
            if rank not in self.ranks:
                raise ValueError(f"Workload: tail_gap_s for rank {rank} which has no ops entry")
            if not math.isfinite(gap) or gap < 0:
                raise ValueError(f"Workload: tail_gap_s[{rank}] must be finite and >= 0: {gap}")

    @property
    def schedule(self) -> RankSchedule | None:
        """The class-based schedule behind ``ranks``, or None for per-rank sequences."""
        return self.ranks.schedule if isinstance(self.ranks, ScheduledRanks) else None

    def groups(self) -> frozenset[ProcessGroup]:
        """Every known process group used by any rank."""
        return frozenset(op.group for ops in self.ranks.values() for op in ops if op.group)

    def collective_counts(self, rank: int) -> Mapping[Collective, int]:
        """Number of calls per collective on ``rank`` (``KeyError`` if the rank is absent)."""
        counts: dict[Collective, int] = {}
        for op in self.ranks[rank]:
            counts[op.collective] = counts.get(op.collective, 0) + 1
        return MappingProxyType(counts)


def int_field(source: str | os.PathLike[str], line: int, column: str, value: str, *, minimum: int,
              maximum: int | None = None) -> int:
    """``value`` (field ``column`` of ``source`` at ``line``) as an integer in ``minimum ..
    maximum``; ``TraceError`` naming the file, line, field and value otherwise."""
    try:
        number = int(value.strip())
    except ValueError:
        raise TraceError(source, column, value, "not an integer", line=line) from None
    if number < minimum:
        raise TraceError(source, column, value, f"must be >= {minimum}", line=line)
    if maximum is not None and number > maximum:
        raise TraceError(source, column, value, f"must be <= {maximum}", line=line)
    return number


def non_negative_float(source: str | os.PathLike[str], line: int, column: str, value: str,
                       unit: str) -> float:
    """``value`` (field ``column`` of ``source`` at ``line``) as a finite number >= 0 in
    ``unit``; ``TraceError`` naming the file, line, field and value otherwise."""
    try:
        number = float(value)
    except ValueError:
        raise TraceError(source, column, value, f"not a number ({unit})", line=line) from None
    if not math.isfinite(number) or number < 0:
        raise TraceError(source, column, number, f"not a finite value >= 0 {unit}", line=line)
    return number
