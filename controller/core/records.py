"""The phase coordinator's state records: per job, per rank, per phase instance, per
reconfiguration in flight. Mutable where the protocol moves them along; internal to
``lightrail.controller.core`` except ``JobStats``, the counters it reports.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from lightrail.controller.core.planner import JobLayout, Plan
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup


class RankState(enum.Enum):
    """Where one rank is in the phase protocol."""

    IDLE = 0
    WAITING = 1
    HOLDING = 2


@dataclass(slots=True, eq=False)
class EnterBatch:
    """Ranks that asked to enter one phase instance together (one EnterMany of a stream, or
    one EnterPhase): one request id, one arrival and one deadline for all of them (seconds of
    the coordinator's clock). ``route`` is opaque to the core: the shell's id of the stream or
    call that gets the answer. ``waiting``: how many of ``ranks`` still wait in this batch (a
    rank that withdrew or re-attached elsewhere no longer has ``RankSlot.batch`` pointing
    here)."""

    ranks: tuple[int, ...]
    request_id: int
    arrived_s: float
    deadline_s: float
    route: int
    waiting: int


@dataclass(slots=True, eq=False)
class Instance:
    """One phase of one training step of one job: its waiting ranks, in batches in arrival
    order, its holders (they hold every cross-connect of ``plan`` together) and the
    reconfiguration it waits on. State is per instance and per batch, not per rank: admitting
    an instance is one pass over its batches."""

    job_id: str
    phase: PhaseKey
    iteration: int
    plan: Plan
    batches: list[EnterBatch] = field(default_factory=list)
    waiting: int = 0
    """Ranks waiting in ``batches``."""
    holders: set[int] = field(default_factory=set)
    op_id: int | None = None
    queued: bool = False
    verified: bool = True
    """False while its holders' circuits are not known to be there (re-created from holds
    reported after a restart and not found on the switches; a read-back that lost one; a
    switch distrusted after an alarm): nobody joins it without its plan confirmed first."""
    arrived: set[int] = field(default_factory=set)
    """The ranks of the group that entered this instance (waiting, holding or released)."""


@dataclass(slots=True, eq=False)
class RankSlot:
    """One rank of a job: its state, the instance it waits for or holds, its request id and
    the batch it waits in."""

    state: RankState = RankState.IDLE
    instance: Instance | None = None
    request_id: int = 0
    batch: EnterBatch | None = None


def waiting_ranks(
    inst: Instance, slots: list[RankSlot]
) -> list[tuple[EnterBatch, tuple[int, ...]]]:
    """Each batch of ``inst`` with waiting ranks, and those ranks (``slots``: the job's)."""
    out: list[tuple[EnterBatch, tuple[int, ...]]] = []
    for b in inst.batches:
        if not b.waiting:
            continue
        if b.waiting == len(b.ranks):
            out.append((b, b.ranks))
        else:
            out.append((b, tuple(r for r in b.ranks if slots[r].batch is b)))
    return out


@dataclass(frozen=True, slots=True)
class Hint:
    """A rank's reconfigure-or-not hints for a phase: bytes of the collective, compute time
    before it (s)."""

    nbytes: int
    compute_gap_s: float


SwitchPort = tuple[str, int]
"""A port of a switch: (switch id, port)."""


@dataclass(slots=True)
class Successor:
    """What came next on some of a phase's ports: ``phase`` seen ``streak`` times in a row on
    ``ports`` (the predecessor's ports it took last time; None: all of them, a declared
    successor)."""

    phase: PhaseKey
    streak: int
    declared: bool = False
    ports: frozenset[SwitchPort] | None = None


PlanKey = tuple[ProcessGroup, Collective, int]
"""A plan's cache key: group, collective, all-to-all step (a plan does not depend on the
phase's micro-batch or index)."""

InstanceKey = tuple[PhaseKey, int]
"""A phase instance's key: the phase and the training step (iteration)."""


@dataclass(slots=True, eq=False)
class JobRecord:
    """One registered job: layout, schedule, ranks, live phase instances, counters."""

    layout: JobLayout  # replaced on failover
    tenant: str
    declared: tuple[PhaseKey, ...]
    ranks: list[RankSlot]
    plans: dict[PlanKey, Plan] = field(default_factory=dict)
    instances: dict[InstanceKey, Instance] = field(default_factory=dict)
    retired: list[Instance] = field(default_factory=list)
    """Instances a failover closed (``rewiring``): their live holders keep them until they
    release, but nobody joins them; a rank entering the same phase and step gets a new one."""
    admitted: int = 0
    admitted_noop: int = 0
    reconfigurations: int = 0
    last_phase: PhaseKey | None = None
    successors: dict[PhaseKey, list[Successor]] = field(default_factory=dict)
    """Phase -> what followed it, one successor per disjoint set of its ports (a DP group's
    ports go to two PP pairs, each its own successor)."""
    steps: dict[ProcessGroup, int] = field(default_factory=dict)
    hints: dict[PhaseKey, Hint] = field(default_factory=dict)
    last_on_port: dict[str, dict[int, PhaseKey]] = field(default_factory=dict)
    """Switch id -> port -> the phase that last had circuits there (schedule learning)."""
    ports_last_of: dict[str, dict[PhaseKey, set[int]]] = field(default_factory=dict)
    """Switch id -> phase -> the ports it last had circuits on: the inverse of
    ``last_on_port`` (a port is in the set of exactly the phase ``last_on_port`` names), so
    that a new instance looks up only the ports its phase was not last on."""
    provisioned: dict[PhaseKey, int] = field(default_factory=dict)
    """Phase -> the op id that switched it ahead of its ranks."""
    deferred: list[PhaseKey] = field(default_factory=list)
    """Predicted phases whose provisioning waited for a port another op was switching; tried
    again when one of the job's provisioning ops ends."""
    hits: int = 0
    late: int = 0
    misses: int = 0


@dataclass(slots=True)
class Recovery:
    """A job recovered after a restart: ``unsynced`` ranks not yet accounted for (neither
    resynced by their agent nor on a host declared dead). No timer ends it."""

    unsynced: set[int]


@dataclass(slots=True)
class Op:
    """A reconfiguration in flight. ``instance`` None: provisioning ahead of the phase, or a
    failover rewire (then ``phase`` is None too). ``ports``: switch id -> the ports it may
    change (the plan's and those of the cross-connects it breaks)."""

    instance: Instance | None
    job: JobRecord
    job_id: str
    phase: PhaseKey | None
    plan: Plan
    ports: dict[str, frozenset[int]]


@dataclass(frozen=True, slots=True)
class Outage:
    """A switch its driver cannot reach: the last error (one line) and since when, on the
    coordinator's clock (seconds)."""

    error: str
    since_s: float


@dataclass(frozen=True, slots=True, order=True)
class Deadline:
    """A waiting batch's deadline, behind an entry ``(at_s, seq, deadline)`` of the
    coordinator's heap (``CoordinatorState.deadlines``): ordered by ``at_s`` (s), then ``seq``
    (push order, unique), so equal deadlines expire first in, first out. An entry whose batch
    has no waiting rank any more is stale and skipped."""

    at_s: float
    seq: int
    job_id: str = field(compare=False)
    batch: EnterBatch = field(compare=False)


@dataclass(frozen=True, slots=True)
class ProvisioningScore:
    """How a job's phases met their circuits (``JobStats`` has the same counts)."""

    hits: int
    late: int
    misses: int


@dataclass(frozen=True, slots=True)
class JobStats:
    """Counters of one job, for OperatorService and the replay summary."""

    admitted: int
    admitted_noop: int
    reconfigurations: int
    current_phase: str
    provisioning_hits: int = 0
    """Phases whose circuits were switched ahead of time and ready when the first rank came."""
    provisioning_late: int = 0
    """Phases predicted but not ready when the first rank came: still switching, or their
    predecessor was still held (no compute gap to hide the switch in)."""
    provisioning_misses: int = 0
    """Phases that needed a switch on demand (no or a wrong prediction)."""
    schedule_learned: bool = False

    @property
    def hit_rate(self) -> float:
        """Hits over phases that needed new circuits (0 when none did)."""
        n = self.provisioning_hits + self.provisioning_late + self.provisioning_misses
        return self.provisioning_hits / n if n else 0.0
