"""Protobuf <-> domain conversion, at the gRPC edge only.

Imports only the domain (``lightrail.controller.domain``) and the generated stubs
(``lightrail.v1``): the job-side library (``lightrail.agents.client``) and the host agent load it.
Encoding the coordinator's decisions lives with the servicer, in
``lightrail.controller.api.replies``.

Bad input raises ``InvalidRequest`` whose message names the field and the value; callers map it
to ``INVALID_ARGUMENT`` (unary) or an ``INVALID_PHASE`` reply (stream).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import grpc

from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.events import JobEvent, JobEventKind
from lightrail.controller.domain.model import (
    MAX_WORLD_SIZE,
    Collective,
    PhaseKey,
    ProcessGroup,
    RankPlacement,
)
from lightrail.controller.domain.parallelism import (
    ParallelismError,
    ParallelismSpec,
    RankOrder,
    check_schedule_shape,
)
from lightrail.v1 import agent_pb2

MAX_TIMEOUT_S = 24 * 3600.0
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_id(field: str, value: str, *, allow_empty: bool = False) -> None:
    """Job and tenant ids become etcd keys and metric labels: 1-128 characters of
    ``[A-Za-z0-9._-]``, starting with a letter or digit. Raises ``InvalidRequest``."""
    if allow_empty and not value:
        return
    if not _ID.match(value):
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise InvalidRequest(f"{field}: {shown!r} is not 1-128 characters of [A-Za-z0-9._-] "
                             "starting with a letter or digit")


def check_timeout(timeout_s: float, field: str = "timeout_s") -> float:
    """A timeout given: a finite number of seconds in (0, 24 h]. Raises ``InvalidRequest``."""
    if not math.isfinite(timeout_s) or timeout_s <= 0 or timeout_s > MAX_TIMEOUT_S:
        raise InvalidRequest(f"{field}: {timeout_s!r} is not a finite number of seconds in "
                             f"(0, {MAX_TIMEOUT_S:.0f}]")
    return timeout_s


def timeout_from_pb(request: agent_pb2.EnterPhaseRequest | agent_pb2.EnterMany,
                    field: str = "timeout_s") -> float | None:
    """An EnterPhase's admission timeout, s, checked (``check_timeout``); None when the
    request gives none (the optional ``timeout_s`` is absent: the controller's default).
    Raises ``InvalidRequest`` naming ``field`` (the path of ``timeout_s`` in the request)."""
    if not request.HasField("timeout_s"):
        return None
    return check_timeout(request.timeout_s, field)

ERROR_METADATA_KEY = "lightrail-error"
"""Trailing metadata key of a refused unary EnterPhase/ReleasePhase: the ``ErrorCode`` value,
so clients tell a refusal (e.g. device failure, UNAVAILABLE) from a transport failure."""

LEADER_METADATA_KEY = "lightrail-leader"
"""Trailing metadata key of a call a standby replica redirects (status UNAVAILABLE, with
``ERROR_METADATA_KEY`` ``NOT_LEADER``): the leader's advertised address, ``host:port``; empty
while no leader is known (an election in progress): the client tries another replica. Its
presence tells a redirect from a refusal (a ``NOT_LEADER`` without it is final)."""


REFUSAL_STATUS: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.UNKNOWN_JOB: grpc.StatusCode.NOT_FOUND,
    ErrorCode.INVALID_RANK: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_PHASE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.RANK_BUSY: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.DEVICE_FAILURE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.PLACEMENT_CHANGED: grpc.StatusCode.ABORTED,
    ErrorCode.NOT_LEADER: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.SWITCH_MAINTENANCE: grpc.StatusCode.FAILED_PRECONDITION,
}
"""gRPC status of a refused unary EnterPhase/ReleasePhase, sent with ``ERROR_METADATA_KEY``."""


async def abort_refused(
    context: grpc.aio.ServicerContext, code: ErrorCode, message: str  # type: ignore[type-arg]
) -> NoReturn:
    """Abort a unary call as a refusal: its status from ``REFUSAL_STATUS`` and the
    ``ErrorCode`` in trailing metadata (the controller and the host agent's local endpoint
    answer alike, so ``lightrail.agents.client`` tells a refusal from a transport failure)."""
    await context.abort(REFUSAL_STATUS[code], message, ((ERROR_METADATA_KEY, code.value),))
    raise AssertionError("unreachable: ServicerContext.abort raises")


def compute_gap_hint(value: float) -> float:
    """A compute-gap hint: anything not finite and >= 0 counts as unknown (0)."""
    return value if math.isfinite(value) and value >= 0 else 0.0


class InvalidRequest(ValueError):
    """A request field is missing or out of range."""


COLLECTIVE_FROM_PB: dict[int, Collective] = {
    agent_pb2.ALL_REDUCE: Collective.ALL_REDUCE,
    agent_pb2.REDUCE_SCATTER: Collective.REDUCE_SCATTER,
    agent_pb2.ALL_GATHER: Collective.ALL_GATHER,
    agent_pb2.ALL_TO_ALL: Collective.ALL_TO_ALL,
    agent_pb2.SEND_RECV: Collective.SEND_RECV,
    agent_pb2.BROADCAST: Collective.BROADCAST,
}
COLLECTIVE_TO_PB: dict[Collective, agent_pb2.Collective.ValueType] = {
    v: k for k, v in COLLECTIVE_FROM_PB.items()  # type: ignore[misc]
}

ERROR_TO_PB: dict[ErrorCode, agent_pb2.PhaseErrorCode.ValueType] = {
    ErrorCode.DEADLINE_EXCEEDED: agent_pb2.DEADLINE_EXCEEDED,
    ErrorCode.UNKNOWN_JOB: agent_pb2.UNKNOWN_JOB,
    ErrorCode.INVALID_RANK: agent_pb2.INVALID_RANK,
    ErrorCode.INVALID_PHASE: agent_pb2.INVALID_PHASE,
    ErrorCode.RANK_BUSY: agent_pb2.RANK_BUSY,
    ErrorCode.DEVICE_FAILURE: agent_pb2.DEVICE_FAILURE,
    ErrorCode.PLACEMENT_CHANGED: agent_pb2.PLACEMENT_CHANGED,
    ErrorCode.NOT_LEADER: agent_pb2.NOT_LEADER,
    ErrorCode.CANCELLED: agent_pb2.CANCELLED,
    ErrorCode.SWITCH_MAINTENANCE: agent_pb2.SWITCH_MAINTENANCE,
}
ERROR_FROM_PB: dict[int, ErrorCode] = {v: k for k, v in ERROR_TO_PB.items()}

EVENT_TO_PB: dict[JobEventKind, agent_pb2.JobEventKind.ValueType] = {
    JobEventKind.REGISTERED: agent_pb2.JOB_REGISTERED,
    JobEventKind.RECONFIGURED: agent_pb2.JOB_RECONFIGURED,
    JobEventKind.PLACEMENT_CHANGED: agent_pb2.JOB_PLACEMENT_CHANGED,
    JobEventKind.UNREGISTERED: agent_pb2.JOB_UNREGISTERED,
    JobEventKind.PHASE_ERROR: agent_pb2.JOB_PHASE_ERROR,
    JobEventKind.DECISION: agent_pb2.JOB_RECONFIGURE_DECISION,
}


_MAX_GROUPS = 65536
MAX_PHASE_ID = 65535
"""The largest ``DefinePhase.phase_id`` (a stream defines at most 65536 phases)."""


MAX_STREAM_RANKS = 1 << 22
"""Ranks the groups one stream has bound (``DefineGroup`` ids and ``DefinePhase`` phases) may
hold together (4,194,304: four groups of ``MAX_WORLD_SIZE``), counting only groups that are not
interned (an interned group is shared by every stream and bounded by ``MAX_INTERNED_RANKS``).
A stream's bindings live as long as the stream, and a group costs some 80 bytes per rank:
without this bound, once the interner is full, one client could hold 65,536 groups of 10^6
ranks (an attack on the wire found 80 MB per such group). Each distinct group counts once,
however many bindings name it."""


MAX_UNSHARED_RANKS = 1 << 23
"""Ranks the groups bound on all the streams of a server, not interned, may hold together
(8,388,608: two streams' ``MAX_STREAM_RANKS``): with one bound per stream only, a client that
opens many streams could still hold any amount (a second attack held 1.3 GB with three).
Together with ``MAX_INTERNED_RANKS`` this bounds what phase definitions can pin, about 1 GB at
some 80 bytes per rank."""


MAX_INTERNED_RANKS = 1 << 22
"""Ranks the interned groups of a server hold together (4,194,304: tens of MB): the tables live
as long as the process and any client's request adds to them, so their size is bounded in
ranks, not only in entries (65,536 groups of 10^6 ranks each would take hundreds of GB)."""


class Interner:
    """Process-wide canonical ``ProcessGroup`` and ``PhaseKey`` objects: equal keys decoded on
    any stream are the same object, so the coordinator's dictionary lookups compare by
    identity instead of comparing rank tuples. Bounded (``max_entries`` of each, and
    ``max_ranks`` ranks in all interned groups); beyond it keys are used as decoded (correct,
    only slower), and a phase is interned only with its group."""

    def __init__(self, max_entries: int = _MAX_GROUPS,
                 max_ranks: int = MAX_INTERNED_RANKS,
                 max_unshared_ranks: int = MAX_UNSHARED_RANKS) -> None:
        self._max = max_entries
        self._max_ranks = max_ranks
        self._ranks = 0
        self.max_unshared_ranks = max_unshared_ranks
        """The bound of ``unshared_ranks``."""
        self.unshared_ranks = 0
        """Ranks of the groups, not interned, that the streams' decoders bind now (each
        decoder adds and removes its own)."""
        self.groups: dict[tuple[int, ...], ProcessGroup] = {}
        """Interned groups by their rank list as received."""
        self._interned: set[int] = set()  # id() of each interned group (they live forever)
        self._phases: dict[PhaseKey, PhaseKey] = {}

    def admit(self, raw: tuple[int, ...], group: ProcessGroup) -> None:
        """Intern ``group``, decoded from the rank list ``raw`` (not interned yet), if both
        bounds allow."""
        if len(self.groups) < self._max and self._ranks + len(raw) <= self._max_ranks:
            self.groups[raw] = group
            self._interned.add(id(group))
            self._ranks += len(raw)

    def holds(self, group: ProcessGroup) -> bool:
        """Whether ``group`` is the interned object (shared, kept for the process's life)."""
        return id(group) in self._interned

    def phase(self, key: PhaseKey) -> PhaseKey:
        """The canonical object equal to ``key``."""
        got = self._phases.get(key)
        if got is not None:
            return got
        if len(self._phases) < self._max and id(key.group) in self._interned:
            self._phases[key] = key
        return key

    @property
    def max_entries(self) -> int:
        """The bound on each table."""
        return self._max


class PhaseKeyDecoder:
    """Decodes ``PhaseKey`` messages of one stream (or of the unary calls), interning process
    groups and phase keys in ``interner`` (shared by every stream of a server): a job has few
    distinct groups, so the hot path neither sorts nor hashes a rank list per call. Groups
    arrive by rank list or by ``group_id`` after a ``DefineGroup``; the id is a hash of the
    ranks, checked on definition. Phases arrive by ``phase_id`` after a ``DefinePhase``
    (``phase``); ``phase_id_of`` maps back for the replies, so a phase has one id per stream.
    The groups a stream binds that are not interned hold at most ``max_ranks`` ranks
    together (``MAX_STREAM_RANKS``)."""

    def __init__(self, max_groups: int = _MAX_GROUPS, interner: Interner | None = None,
                 max_ranks: int = MAX_STREAM_RANKS) -> None:
        self._max = max_groups
        self._max_ranks = max_ranks
        self._interner = interner or Interner(max_groups)
        self._groups = self._interner.groups
        self._by_id: dict[int, ProcessGroup] = {}
        self._phases: dict[int, PhaseKey] = {}
        self._phase_ids: dict[PhaseKey, int] = {}
        self._bound: dict[ProcessGroup, int] = {}  # each bound group: how many bindings
        self._bound_ranks = 0

    def _group(self, raw: tuple[int, ...], field: str) -> ProcessGroup:
        group = self._groups.get(raw)
        if group is None:
            if not raw:
                raise InvalidRequest(f"{field}: empty")
            if len(set(raw)) != len(raw):
                raise InvalidRequest(f"{field}: duplicate ranks in {list(raw)[:16]}")
            if max(raw) >= MAX_WORLD_SIZE:
                raise InvalidRequest(f"{field}: rank {max(raw)} >= {MAX_WORLD_SIZE}")
            group = ProcessGroup.of(raw)
            self._interner.admit(raw, group)
        return group

    def define(self, pb: agent_pb2.DefineGroup) -> None:
        """Bind ``pb.group_id`` to ``pb.ranks``. Raises ``InvalidRequest`` when the id is not
        the hash of the ranks (a client bug: it would silently alias another group)."""
        group = self._group(tuple(pb.ranks), "define_group.ranks")
        if group.group_id != pb.group_id:
            raise InvalidRequest(
                f"define_group.group_id: {pb.group_id:#x} is not the id of ranks "
                f"{list(group.ranks)[:16]} ({group.group_id:#x})")
        if pb.group_id not in self._by_id and len(self._by_id) >= self._max:
            raise InvalidRequest(f"define_group: this stream already defined {self._max} "
                                 "groups; send the rank list instead")
        self._rebind(group, self._by_id.get(pb.group_id), "define_group.ranks")
        self._by_id[pb.group_id] = group

    def define_phase(self, pb: agent_pb2.DefinePhase) -> None:
        """Bind ``pb.phase_id`` (<= ``MAX_PHASE_ID``) to ``pb.phase`` for this stream (a new
        binding replaces an old one). Raises ``InvalidRequest`` naming the field: also for a
        phase this stream bound to another id already (the replies name a phase by its one
        id; a second would be answered under the first) and for a group past the stream's
        ``max_ranks``; nothing bound before is changed then."""
        if pb.phase_id > MAX_PHASE_ID:
            raise InvalidRequest(f"define_phase.phase_id: {pb.phase_id} > {MAX_PHASE_ID}")
        if not pb.HasField("phase"):
            raise InvalidRequest("define_phase.phase: missing")
        phase = self.decode(pb.phase, "define_phase.phase")
        other = self._phase_ids.get(phase)
        if other is not None and other != pb.phase_id:
            raise InvalidRequest(
                f"define_phase.phase_id: {pb.phase_id}: phase {phase} is defined as id {other} "
                "on this stream already (one id per phase: the replies name it)")
        old = self._phases.get(pb.phase_id)
        self._rebind(phase.group, None if old is None else old.group, "define_phase.phase")
        if old is not None and self._phase_ids.get(old) == pb.phase_id:
            del self._phase_ids[old]
        self._phases[pb.phase_id] = phase
        self._phase_ids[phase] = pb.phase_id

    def _rebind(self, group: ProcessGroup, old: ProcessGroup | None, field: str) -> None:
        """Count a binding of ``group`` in place of one of ``old`` (None: a new binding).
        Raises ``InvalidRequest`` naming ``field``, the counts unchanged, when the stream's
        groups would then hold more than ``max_ranks`` ranks, or all streams' groups more
        than the interner's ``max_unshared_ranks``."""
        self._bind(group)
        if old is not None:
            self._unbind(old)
        interner = self._interner
        if self._bound_ranks > self._max_ranks or (
                interner.unshared_ranks > interner.max_unshared_ranks):
            stream, server = self._bound_ranks, interner.unshared_ranks
            if old is not None:
                self._bind(old)
            self._unbind(group)
            if stream > self._max_ranks:
                raise InvalidRequest(
                    f"{field}: a group of {len(group.ranks)} ranks would take the groups this "
                    f"stream defined to {stream} ranks, more than {self._max_ranks}")
            raise InvalidRequest(
                f"{field}: a group of {len(group.ranks)} ranks would take the groups all "
                f"streams defined to {server} ranks, more than {interner.max_unshared_ranks}")

    def _bind(self, group: ProcessGroup) -> None:
        if self._interner.holds(group):
            return  # shared: the interner's bound covers it
        n = self._bound.get(group, 0)
        if not n:
            self._bound_ranks += len(group.ranks)
            self._interner.unshared_ranks += len(group.ranks)
        self._bound[group] = n + 1

    def _unbind(self, group: ProcessGroup) -> None:
        if self._interner.holds(group):
            return
        n = self._bound[group] - 1
        if n:
            self._bound[group] = n
        else:
            del self._bound[group]
            self._bound_ranks -= len(group.ranks)
            self._interner.unshared_ranks -= len(group.ranks)

    def close(self) -> None:
        """Forget every binding (the stream ended): its groups no longer count against the
        server's ``max_unshared_ranks``. The decoder can be used again, with no bindings."""
        self._interner.unshared_ranks -= self._bound_ranks
        self._bound.clear()
        self._bound_ranks = 0
        self._by_id.clear()
        self._phases.clear()
        self._phase_ids.clear()

    @property
    def bound_ranks(self) -> int:
        """Ranks of the distinct groups, not interned, that this stream's bindings name."""
        return self._bound_ranks

    def phase(self, phase_id: int, field: str = "phase_id") -> PhaseKey:
        """The phase bound to ``phase_id`` on this stream. Raises ``InvalidRequest`` naming
        ``field`` when it is not defined."""
        phase = self._phases.get(phase_id)
        if phase is None:
            raise InvalidRequest(f"{field}: unknown phase id {phase_id} (send DefinePhase "
                                 "first on this stream)")
        return phase

    def phase_id_of(self, phase: PhaseKey) -> int | None:
        """The id this stream defined for ``phase`` (the latest), or None."""
        return self._phase_ids.get(phase)

    def decode(self, pb: agent_pb2.PhaseKey, field: str = "phase") -> PhaseKey:
        """Raises ``InvalidRequest`` naming ``field`` for an empty group, an undefined group id
        or an unknown collective."""
        if pb.group_id:
            group = self._by_id.get(pb.group_id)
            if group is None:
                raise InvalidRequest(f"{field}.group_id: unknown group {pb.group_id:#x} "
                                     "(send DefineGroup first on this stream)")
        else:
            group = self._group(tuple(pb.group_ranks), f"{field}.group_ranks")
        coll = COLLECTIVE_FROM_PB.get(pb.collective)
        if coll is None:
            raise InvalidRequest(f"{field}.collective: unspecified or unknown ({pb.collective})")
        return self._interner.phase(PhaseKey(group, coll, pb.seq, pb.step))


def phase_key_to_pb(phase: PhaseKey, *, by_id: bool = False) -> agent_pb2.PhaseKey:
    """Encode a ``PhaseKey``: with the rank list, or with ``group_id`` only (``by_id``; the
    receiver must have had a ``DefineGroup`` for it)."""
    if by_id:
        return agent_pb2.PhaseKey(
            group_id=phase.group.group_id,
            collective=COLLECTIVE_TO_PB[phase.collective],
            seq=phase.seq,
            step=phase.step,
        )
    return agent_pb2.PhaseKey(
        group_ranks=phase.group.ranks,
        collective=COLLECTIVE_TO_PB[phase.collective],
        seq=phase.seq,
        step=phase.step,
    )


@dataclass(frozen=True, slots=True)
class ParallelismRequest:
    """A decoded ``ParallelismSpec`` message: the spec and the schedule's shape."""

    spec: ParallelismSpec
    microbatches: int
    layers_per_stage: int


_ORDER_FROM_PB = {
    agent_pb2.RANK_ORDER_UNSPECIFIED: RankOrder.MEGATRON,
    agent_pb2.RANK_ORDER_MEGATRON: RankOrder.MEGATRON,
    agent_pb2.RANK_ORDER_MEGATRON_TP_PP_DP: RankOrder.MEGATRON_TP_PP_DP,
    agent_pb2.RANK_ORDER_TORCHTITAN: RankOrder.TORCHTITAN,
}
_ORDER_TO_PB = {
    RankOrder.MEGATRON: agent_pb2.RANK_ORDER_MEGATRON,
    RankOrder.MEGATRON_TP_PP_DP: agent_pb2.RANK_ORDER_MEGATRON_TP_PP_DP,
    RankOrder.TORCHTITAN: agent_pb2.RANK_ORDER_TORCHTITAN,
}


def parallelism_from_pb(pb: agent_pb2.ParallelismSpec) -> ParallelismRequest:
    """Decode; degrees and counts of 0 mean 1. Raises ``InvalidRequest`` naming the field
    (``parallelism.<field>``) for an unknown order or strategy, an invalid spec or a schedule
    of more than ``MAX_LAYER_PASSES`` layer passes (``check_schedule_shape``)."""
    order = _ORDER_FROM_PB.get(pb.order)
    if order is None:
        raise InvalidRequest(f"parallelism.order: unknown rank order {pb.order}")
    if pb.ep_strategy not in (agent_pb2.EP_STRATEGY_UNSPECIFIED, agent_pb2.EP_STRATEGY_MATCHINGS):
        raise InvalidRequest(f"parallelism.ep_strategy: unknown strategy {pb.ep_strategy}")
    microbatches, layers_per_stage = pb.microbatches or 1, pb.layers_per_stage or 1
    try:
        spec = ParallelismSpec(
            tp=pb.tp or 1, pp=pb.pp or 1, dp_replicate=pb.dp_replicate or 1,
            dp_shard=pb.dp_shard or 1, ep=pb.ep or 1, cp=pb.cp or 1, order=order)
        check_schedule_shape(spec.pp, microbatches, layers_per_stage)
    except ParallelismError as exc:
        raise InvalidRequest(f"parallelism.{exc}") from None
    return ParallelismRequest(spec, microbatches, layers_per_stage)


def parallelism_to_pb(
    spec: ParallelismSpec, microbatches: int = 1, layers_per_stage: int = 1
) -> agent_pb2.ParallelismSpec:
    """Encode a ``ParallelismSpec``."""
    return agent_pb2.ParallelismSpec(
        tp=spec.tp, pp=spec.pp, dp_replicate=spec.dp_replicate, dp_shard=spec.dp_shard,
        ep=spec.ep, cp=spec.cp, order=_ORDER_TO_PB[spec.order], microbatches=microbatches,
        layers_per_stage=layers_per_stage, ep_strategy=agent_pb2.EP_STRATEGY_MATCHINGS)


def placements_from_pb(ranks: Sequence[agent_pb2.RankPlacement]) -> list[RankPlacement]:
    """Decode placements; raises ``InvalidRequest`` for an empty list or empty host."""
    if not ranks:
        raise InvalidRequest("ranks: empty")
    if len(ranks) > MAX_WORLD_SIZE:
        raise InvalidRequest(f"ranks: {len(ranks)} ranks exceed {MAX_WORLD_SIZE}")
    out = []
    for i, r in enumerate(ranks):
        if not r.host:
            raise InvalidRequest(f"ranks[{i}].host: empty")
        out.append(RankPlacement(r.rank, r.host, r.gpu))
    return out


def event_to_pb(event: JobEvent) -> agent_pb2.JobEvent:
    """Encode a job event."""
    return agent_pb2.JobEvent(
        job_id=event.job_id,
        kind=EVENT_TO_PB[event.kind],
        at_unix_s=event.at_unix_s,
        message=event.message,
        fields=dict(event.fields),
    )
