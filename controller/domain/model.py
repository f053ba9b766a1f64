"""Domain vocabulary shared by the controller, the agents and the trace readers.

A *phase* is one communication phase of a job: a collective on a process group. Its key is the
process group (its rank set), the collective, and a sequence number that tells apart repeated
collectives on the same group within an iteration (DESIGN.md, "Phase protocol"). All-to-all is
served as a sequence of permutations; ``step`` selects one of them (a sub-phase).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_WORLD_SIZE = 1 << 20
"""The most ranks a job may have (1,048,576): the bound of every rank number and rank list on
the wire (``controller.api.codec``) and of the world sizes the trace readers accept."""


SHOWN_RANKS = 16
"""The most ranks a group's ``str`` lists in full (messages, logs, events)."""


class Collective(enum.Enum):
    """Collective operations (NCCL / torch.distributed names)."""

    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"
    BROADCAST = "broadcast"


@dataclass(frozen=True, slots=True, order=True)
class ProcessGroup:
    """A process group identified by its rank set (sorted, no duplicates).

    Groups are keyed by rank set, not name: real traces reuse one name for different rank sets
    on different ranks.
    """

    ranks: tuple[int, ...]
    _hash: int = field(init=False, repr=False, compare=False)
    _id: int = field(init=False, repr=False, compare=False)
    _members: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Hot path: groups key dictionaries on every phase call; hash the rank tuple once.
        object.__setattr__(self, "_hash", hash(self.ranks))
        object.__setattr__(self, "_members", frozenset(self.ranks))
        packed = array("I", self.ranks)
        if sys.byteorder == "big":
            packed.byteswap()
        digest = hashlib.blake2b(packed.tobytes(), digest_size=8).digest()
        object.__setattr__(self, "_id", int.from_bytes(digest, "little") or 1)

    def __hash__(self) -> int:
        return self._hash

    def __str__(self) -> str:
        """The ranks for messages and logs, ``[0,1,2]``; past ``SHOWN_RANKS`` the first ones,
        the last and the count, ``[0,1,...,14,...,2047 (2048 ranks)]``: a message naming a
        group must not grow with it (refusals go to every rank of a batch)."""
        r = self.ranks
        if len(r) <= SHOWN_RANKS:
            return "[" + ",".join(map(str, r)) + "]"
        head = ",".join(map(str, r[:SHOWN_RANKS - 1]))
        return f"[{head},...,{r[-1]} ({len(r)} ranks)]"

    def __eq__(self, other: object) -> bool:
        # Hot path: interned groups compare by identity; different groups almost always
        # differ in their cached hash, so the rank tuples are compared only on a collision.
        if self is other:
            return True
        if not isinstance(other, ProcessGroup):
            return NotImplemented
        return self._hash == other._hash and self.ranks == other.ranks

    def contains(self, rank: int) -> bool:
        """True when ``rank`` is in the group (O(1))."""
        return rank in self._members

    def includes(self, ranks: Iterable[int]) -> bool:
        """True when every one of ``ranks`` is in the group (a set operation, in C)."""
        return self._members.issuperset(ranks)

    @property
    def group_id(self) -> int:
        """A stable 64-bit id of the rank set (BLAKE2b-64 of the ranks as little-endian uint32;
        never 0), used on the wire instead of the rank list once a group is defined."""
        return self._id

    @staticmethod
    def of(ranks: Iterable[int]) -> ProcessGroup:
        """A group from any iterable of ranks; raises ``ValueError`` on an empty or negative set."""
        rs = tuple(sorted(set(ranks)))
        if not rs:
            raise ValueError("process group: empty rank set")
        if rs[0] < 0:
            raise ValueError(f"process group: negative rank {rs[0]}")
        return ProcessGroup(rs)

    @property
    def size(self) -> int:
        """Number of ranks."""
        return len(self.ranks)


@functools.total_ordering
@dataclass(frozen=True, slots=True)
class PhaseKey:
    """One phase of a job: ``collective`` on ``group``, the ``seq``-th such phase in the
    iteration, sub-phase ``step`` (all-to-all permutation index; 0 otherwise). Ordered by
    (group ranks, collective name, seq, step): a total order, so phases of one group with
    different collectives sort too."""

    group: ProcessGroup
    collective: Collective
    seq: int = 0
    step: int = 0
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Hot path: phase keys key the coordinator's dictionaries; hash the fields once.
        object.__setattr__(self, "_hash", hash((self.group, self.collective.value, self.seq,
                                                self.step)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        # As ProcessGroup.__eq__: identity first, then the cached hash, then the fields.
        if self is other:
            return True
        if not isinstance(other, PhaseKey):
            return NotImplemented
        return (self._hash == other._hash and self.group == other.group
                and self.collective is other.collective and self.seq == other.seq
                and self.step == other.step)

    def _order(self) -> tuple[tuple[int, ...], str, int, int]:
        return (self.group.ranks, self.collective.value, self.seq, self.step)

    def __lt__(self, other: PhaseKey) -> bool:
        if not isinstance(other, PhaseKey):
            return NotImplemented
        return self._order() < other._order()

    def __str__(self) -> str:
        return f"{self.collective.value}{self.group}#{self.seq}.{self.step}"


@dataclass(frozen=True, slots=True)
class RankPlacement:
    """Where one rank runs: ``host`` name and local ``gpu`` index."""

    rank: int
    host: str
    gpu: int
