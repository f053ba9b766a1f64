"""Rail plans: the phase schedule of one training step of a declared-parallelism job, and the
circuits each parallelism dimension needs on each rail. Pure: no I/O, no clock.

Circuits always come from ``lightrail.controller.core.planner.plan_phase`` (the planner stays the
single source
of truth: rings for ring collectives, bidirectional pairs for SEND_RECV, shift permutations for
ALL_TO_ALL); this module only decides *which* phases (groups x collectives) a step has and in
which order, and merges the per-group plans of one dimension into a rail configuration.

Rules (Opus: E. Ding, C. Ouyang, R. Singh, "Photonic Rails in ML Datacenters", HotNets 2025,
arXiv:2507.08119, and "Photonic Rails in ML Datacenters with Opus", arXiv:2602.12521 —
parallelism-driven rail reconfiguration; each rule below also names its framework source):

* TP stays inside the host on scale-up (NVLink) and needs no circuit (Opus; Megatron-Core's
  note that adjacent ranks should share a DGX box). A TP group that spans hosts would get the
  planner's ring like any ring collective; ``DimPlan.scale_up_only`` tells.
* DP: the gradient collective is a ring over the DP peers with the same (pp, tp) index on each
  rail (Opus). With CP > 1 the gradient group is DP x CP (Megatron-Core's dp-cp group,
  torchtitan's dp_cp / dp_shard_cp), so the ring spans the DP x CP peers with the same
  (pp, tp). Unsharded (dp_shard == 1): one ALL_REDUCE on ``Dim.DP_CP``. Sharded
  (dp_shard > 1, ZeRO / FSDP / Megatron distributed optimizer): REDUCE_SCATTER on
  ``Dim.DP_SHARD_CP``, ALL_REDUCE on ``Dim.DP_REPLICATE`` when dp_replicate > 1 (HSDP,
  Megatron's inter-instance group), then the parameter ALL_GATHER on ``Dim.DP_SHARD_CP``.
  Expert gradients (ep > 1): one ALL_REDUCE on ``Dim.EXPERT_DP`` (Megatron's expert-data-
  parallel group; the sharded variants use the same ranks, hence the same ring).
* PP: a chain between adjacent stages with the same (dp, cp, tp) index (Opus). One host NIC can
  only be in one bidirectional pair at a time, so the chain is one configuration per stage
  boundary s (pairs stage s <-> s+1, SEND_RECV on 2-rank groups); boundaries s and s+2 use
  disjoint ports.
* EP all-to-all (Opus; PCCL / SiP-ML "sequence of permutations"): ``EpStrategy.MATCHINGS`` runs
  it as the planner's time-multiplexed shift permutations (k-1 sub-phases over k hosts);
  ``EpStrategy.FORWARD`` holds only sub-phase 0 (shift 1 = host i -> i+1: the unidirectional ring
  over the EP hosts, the same cross-connects as a ring collective on that group) and forwards all
  of the all-to-all over it (up to k-1 hops). Which one to use is the cost model's decision
  (issue 3 §3), taken outside this module.
* CP as a ring (ring attention passes K/V blocks around the CP group; Megatron-Core CP uses a
  ring of P2P exchanges): the planner's ring, declared as ALL_GATHER on ``Dim.CP``.

Schedule of one step (``plan_step``): all-forward-then-all-backward (GPipe order, no 1F1B
interleaving), one linearisation of what the ranks do; each rank sees its own phases in a valid
order. ``layers_per_stage`` repeats the per-layer phases. For microbatch mb, stage s = 0..pp-1:
CP ring, TP all-reduce, EP dispatch and combine all-to-alls (per layer), then PP send s -> s+1.
Backward, stages pp-1..0: EP combine and dispatch all-to-alls, TP all-reduce, CP ring (per
layer), then PP send s -> s-1. Finally the gradient collectives above. ``seq`` numbers repeated
collectives on one group within the step (``PhaseKey`` semantics); ``step`` is the all-to-all
sub-phase.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from lightrail.controller.core.planner import (
    JobLayout,
    Plan,
    SwitchTarget,
    all_to_all_steps,
    plan_phase,
)
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.domain.parallelism import (
    Dim,
    ParallelismError,
    ParallelismSpec,
    check_schedule_shape,
)
from lightrail.drivers.base import CrossConnect


class RailPlanError(ValueError):
    """A step cannot be planned; the message names the field and the value."""


class EpStrategy(enum.Enum):
    """How an EP all-to-all is served: time-multiplexed matchings (one sub-phase per shift
    permutation) or forwarding over the shift-1 ring (one configuration, multi-hop)."""

    MATCHINGS = "matchings"
    FORWARD = "forward"


class StepPart(enum.Enum):
    """Where in the training step a schedule slot lies."""

    FORWARD = "forward"
    BACKWARD = "backward"
    GRADIENT_SYNC = "gradient_sync"


@dataclass(frozen=True, slots=True)
class RailConfiguration:
    """One circuit configuration of a dimension: the phases (one per group, ``seq`` 0) that run
    at the same time, and the union of their plans per switch (port-disjoint by construction,
    checked). ``label`` says which one ("all", "boundary 0-1", "shift 1")."""

    label: str
    phases: tuple[PhaseKey, ...]
    targets: tuple[SwitchTarget, ...]

    @property
    def empty(self) -> bool:
        """True when no circuit is needed (every group on one host: scale-up only)."""
        return not self.targets

    def circuits(self, switch_id: str) -> frozenset[CrossConnect]:
        """The cross-connects this configuration needs on ``switch_id`` (empty if none)."""
        for t in self.targets:
            if t.switch_id == switch_id:
                return t.cross_connects
        return frozenset()


@dataclass(frozen=True, slots=True)
class DimPlan:
    """What one parallelism dimension needs in a step: its groups, the collectives the schedule
    runs on them, and its rail configurations (one, or one per PP boundary / all-to-all
    sub-phase). Every collective is planned; ``configurations[i].phases`` carry the first."""

    dim: Dim
    collectives: tuple[Collective, ...]
    groups: tuple[ProcessGroup, ...]
    configurations: tuple[RailConfiguration, ...]

    @property
    def scale_up_only(self) -> bool:
        """True when the dimension needs no circuit at all (e.g. TP inside the host)."""
        return all(c.empty for c in self.configurations)

    @property
    def cross_connect_count(self) -> int:
        """Cross-connects over all configurations and switches."""
        return sum(len(t.cross_connects) for c in self.configurations for t in c.targets)


@dataclass(frozen=True, slots=True)
class ScheduleSlot:
    """One phase boundary of the step: ``phases`` (one per group of ``dim``, with ``seq`` and
    ``step`` set) run concurrently on configuration ``configuration`` of ``dims[dim]``.
    ``stage``: the pipeline stage (for PP: the lower stage of the boundary), None for gradient
    collectives; ``microbatch`` None for gradient collectives."""

    dim: Dim
    collective: Collective
    part: StepPart
    microbatch: int | None
    stage: int | None
    configuration: int
    phases: tuple[PhaseKey, ...]


@dataclass(frozen=True, slots=True)
class RailPlan:
    """The schedule of one step and the per-dimension rail plans of a job (``dims``: read-only,
    only the dimensions the step uses; ``distinct_plans``: how many (group, collective, step)
    plans were computed with ``plan_phase``)."""

    job_id: str
    spec: ParallelismSpec
    slots: tuple[ScheduleSlot, ...]
    dims: Mapping[Dim, DimPlan]
    distinct_plans: int

    def phases(self) -> tuple[PhaseKey, ...]:
        """Every phase of the step in schedule order (the job's declared schedule)."""
        return tuple(p for s in self.slots for p in s.phases)

    def phases_of(self, rank: int) -> tuple[PhaseKey, ...]:
        """The phases ``rank`` enters in one step, in order."""
        return tuple(p for s in self.slots for p in s.phases if p.group.contains(rank))


def contiguous_placement(
    hosts: Sequence[str], gpus_per_host: int, world_size: int
) -> tuple[RankPlacement, ...]:
    """Rank r on host ``hosts[r // gpus_per_host]``, GPU ``r % gpus_per_host``: adjacent ranks
    share a host, so TP (the fastest axis) stays on NVLink (Megatron-Core: "the caller should make
    sure adjacent ranks are on the same DGX box"). Raises ``RailPlanError`` when the hosts are too
    few or a count is < 1."""
    if gpus_per_host < 1:
        raise RailPlanError(f"gpus_per_host: must be >= 1, got {gpus_per_host}")
    if world_size < 1:
        raise RailPlanError(f"world_size: must be >= 1, got {world_size}")
    need = -(-world_size // gpus_per_host)
    if need > len(hosts):
        raise RailPlanError(
            f"hosts: {world_size} ranks at {gpus_per_host} per host need {need} hosts, "
            f"got {len(hosts)}"
        )
    return tuple(
        RankPlacement(r, hosts[r // gpus_per_host], r % gpus_per_host) for r in range(world_size)
    )


class _Planner:
    """Caches plan_phase per (group, collective, step), like the coordinator does."""

    def __init__(self, layout: JobLayout) -> None:
        self.layout = layout
        self.plans: dict[tuple[ProcessGroup, Collective, int], Plan] = {}

    def plan(self, group: ProcessGroup, collective: Collective, step: int = 0) -> Plan:
        key = (group, collective, step)
        plan = self.plans.get(key)
        if plan is None:
            plan = plan_phase(self.layout, PhaseKey(group, collective, 0, step))
            self.plans[key] = plan
        return plan

    def configuration(
        self, dim: Dim, label: str, groups: Sequence[ProcessGroup], collective: Collective,
        step: int = 0,
    ) -> RailConfiguration:
        xcs: dict[str, set[CrossConnect]] = {}
        ports: dict[str, set[int]] = {}
        counts: dict[str, int] = {}
        for g in groups:
            for t in self.plan(g, collective, step).targets:
                sid = t.switch_id
                xcs.setdefault(sid, set()).update(t.cross_connects)
                ports.setdefault(sid, set()).update(t.ports)
                counts[sid] = counts.get(sid, 0) + len(t.ports)
        for sid, n in counts.items():
            if n != len(ports[sid]):
                self._port_clash(dim, label, groups, collective, step, sid)
        targets = tuple(
            SwitchTarget(sid, frozenset(x), frozenset(ports[sid])) for sid, x in sorted(xcs.items())
        )
        return RailConfiguration(
            label, tuple(PhaseKey(g, collective, 0, step) for g in groups), targets
        )

    def _port_clash(
        self, dim: Dim, label: str, groups: Sequence[ProcessGroup], collective: Collective,
        step: int, switch_id: str,
    ) -> None:
        """Raise ``RailPlanError`` naming the first port two groups need on ``switch_id``."""
        used: dict[int, ProcessGroup] = {}
        for g in groups:
            for t in self.plan(g, collective, step).targets:
                if t.switch_id != switch_id:
                    continue
                for p in sorted(t.ports):
                    other = used.setdefault(p, g)
                    if other != g:
                        raise RailPlanError(
                            f"dim {dim.name} ({label}): switch {switch_id!r} port {p} is "
                            f"needed by groups {other.ranks[:8]} and {g.ranks[:8]} at once"
                        )


def plan_step(
    layout: JobLayout,
    spec: ParallelismSpec,
    *,
    microbatches: int = 1,
    layers_per_stage: int = 1,
    ep_strategy: EpStrategy = EpStrategy.MATCHINGS,
) -> RailPlan:
    """The schedule of one training step of ``spec`` on ``layout`` and the circuits of every
    dimension it uses (rules and order in the module docstring).

    Raises ``ParallelismError`` when the job's rank count does not match the spec,
    ``RailPlanError`` for a count < 1, more than ``MAX_LAYER_PASSES`` layer passes
    (``check_schedule_shape``) or two groups of one dimension needing one port at once,
    and ``PlanError`` (from the planner) when a switch cannot carry a pattern (e.g. a ring over
    more than two hosts on a duplex switch).
    """
    spec.check_world_size(layout.world_size)
    try:
        check_schedule_shape(spec.pp, microbatches, layers_per_stage)
    except ParallelismError as exc:
        raise RailPlanError(str(exc)) from None
    planner = _Planner(layout)
    dims: dict[Dim, DimPlan] = {}
    if spec.tp > 1:
        dims[Dim.TP] = _single_configuration(planner, spec, Dim.TP, (Collective.ALL_REDUCE,))
    if spec.cp > 1:
        dims[Dim.CP] = _single_configuration(planner, spec, Dim.CP, (Collective.ALL_GATHER,))
    ep_steps: Mapping[ProcessGroup, int] = {}
    if spec.ep > 1:
        ep = _ep_plan(planner, spec, ep_strategy)
        dims[Dim.EP] = ep.plan
        ep_steps = ep.steps
    if spec.pp > 1:
        dims[Dim.PP] = _pp_plan(planner, spec)
    gradient = _gradient_plan(planner, spec)
    for plan in gradient.dims:
        dims[plan.dim] = plan

    schedule = _Schedule(spec, dims, ep_steps)
    for mb in range(microbatches):
        schedule.forward(mb, layers_per_stage)
    for mb in range(microbatches):
        schedule.backward(mb, layers_per_stage)
    schedule.gradient_sync(gradient.ops)

    return RailPlan(
        job_id=layout.job_id,
        spec=spec,
        slots=tuple(schedule.slots),
        dims=MappingProxyType(dims),
        distinct_plans=len(planner.plans),
    )


# --- dimensions and their configurations -------------------------------------------------------


def _single_configuration(
    planner: _Planner, spec: ParallelismSpec, dim: Dim, collectives: tuple[Collective, ...]
) -> DimPlan:
    """``dim`` served by one configuration for all its ``collectives`` (e.g. reduce-scatter and
    all-gather: the same ring). Raises ``RailPlanError`` when a later collective needs other
    circuits than the first, or (from the planner) when groups clash on a port."""
    groups = spec.groups(dim)
    cfg = planner.configuration(dim, "all", groups, collectives[0])
    for other in collectives[1:]:
        again = planner.configuration(dim, "all", groups, other)
        if again.targets != cfg.targets:
            raise RailPlanError(
                f"dim {dim.name}: {other.value} needs other circuits than "
                f"{collectives[0].value}; one configuration per dimension is assumed"
            )
    return DimPlan(dim, collectives, groups, (cfg,))


@dataclass(frozen=True, slots=True)
class _EpPlan:
    """The EP dimension's plan and, per EP group, how many all-to-all sub-phases it runs (1 with
    ``EpStrategy.FORWARD``, the planner's shift count with ``MATCHINGS``)."""

    plan: DimPlan
    steps: Mapping[ProcessGroup, int]


def _ep_plan(planner: _Planner, spec: ParallelismSpec, strategy: EpStrategy) -> _EpPlan:
    """One configuration per all-to-all sub-phase s ("shift s+1"), holding the EP groups that
    have that many sub-phases (module docstring: EP all-to-all)."""
    groups = spec.groups(Dim.EP)
    steps: dict[ProcessGroup, int] = {}
    for g in groups:
        steps[g] = 1 if strategy is EpStrategy.FORWARD else all_to_all_steps(planner.layout, g)
    cfgs = tuple(
        planner.configuration(
            Dim.EP, f"shift {s + 1}", [g for g in groups if steps[g] > s],
            Collective.ALL_TO_ALL, s,
        )
        for s in range(max(steps.values()))
    )
    return _EpPlan(DimPlan(Dim.EP, (Collective.ALL_TO_ALL,), groups, cfgs), MappingProxyType(steps))


def _pp_plan(planner: _Planner, spec: ParallelismSpec) -> DimPlan:
    """One configuration per stage boundary s ("boundary s-s+1": the SEND_RECV pairs of stage s
    and s+1); the groups are every boundary's pairs in boundary order."""
    cfgs = tuple(
        planner.configuration(
            Dim.PP, f"boundary {s}-{s + 1}", spec.stage_pairs(s), Collective.SEND_RECV
        )
        for s in range(spec.pp - 1)
    )
    pairs = tuple(g for s in range(spec.pp - 1) for g in spec.stage_pairs(s))
    return DimPlan(Dim.PP, (Collective.SEND_RECV,), pairs, cfgs)


@dataclass(frozen=True, slots=True)
class _GradOp:
    """One gradient collective of the step, run on every group of ``dim``."""

    dim: Dim
    collective: Collective


@dataclass(frozen=True, slots=True)
class _GradientPlan:
    """The gradient dimensions' plans (in planning order) and the gradient collectives in
    schedule order (module docstring: DP)."""

    dims: tuple[DimPlan, ...]
    ops: tuple[_GradOp, ...]


def _gradient_plan(planner: _Planner, spec: ParallelismSpec) -> _GradientPlan:
    """Unsharded: ALL_REDUCE on DP_CP (if it has > 1 rank). Sharded: REDUCE_SCATTER on
    DP_SHARD_CP, ALL_REDUCE on DP_REPLICATE (HSDP), ..., ALL_GATHER on DP_SHARD_CP last. Expert
    gradients (ep > 1, expert_dp > 1): ALL_REDUCE on EXPERT_DP, before the all-gather."""
    dims: list[DimPlan] = []
    ops: list[_GradOp] = []

    def add(dim: Dim, collectives: tuple[Collective, ...]) -> None:
        dims.append(_single_configuration(planner, spec, dim, collectives))
        ops.append(_GradOp(dim, collectives[0]))

    if spec.dp_shard == 1:
        if spec.size(Dim.DP_CP) > 1:
            add(Dim.DP_CP, (Collective.ALL_REDUCE,))
    else:
        add(Dim.DP_SHARD_CP, (Collective.REDUCE_SCATTER, Collective.ALL_GATHER))
        if spec.dp_replicate > 1:
            add(Dim.DP_REPLICATE, (Collective.ALL_REDUCE,))
    if spec.ep > 1 and spec.expert_dp > 1:
        add(Dim.EXPERT_DP, (Collective.ALL_REDUCE,))
    if spec.dp_shard > 1:
        ops.append(_GradOp(Dim.DP_SHARD_CP, Collective.ALL_GATHER))
    return _GradientPlan(tuple(dims), tuple(ops))


# --- schedule ----------------------------------------------------------------------------------


class _Schedule:
    """Builds the step's slots in order (module docstring: schedule), numbering repeated
    collectives per (group, collective) in ``seq`` and caching the per-stage groups."""

    def __init__(
        self, spec: ParallelismSpec, dims: Mapping[Dim, DimPlan],
        ep_steps: Mapping[ProcessGroup, int],
    ) -> None:
        self.spec = spec
        self.dims = dims
        self.ep_steps = ep_steps
        plan = dims.get(Dim.EP)
        self.ep_configurations = 0 if plan is None else len(plan.configurations)
        self.slots: list[ScheduleSlot] = []
        self._seqs: dict[tuple[ProcessGroup, Collective], int] = {}
        self._stage_groups: dict[tuple[Dim, int], tuple[ProcessGroup, ...]] = {}

    def forward(self, mb: int, layers_per_stage: int) -> None:
        """Microbatch ``mb``'s forward pass: stages 0..pp-1, each its layers then PP s -> s+1."""
        pp = self.spec.pp
        for s in range(pp):
            for _ in range(layers_per_stage):
                self._layer(StepPart.FORWARD, mb, s)
            if s < pp - 1:
                self._emit(Dim.PP, Collective.SEND_RECV, StepPart.FORWARD, mb, s,
                           self.spec.stage_pairs(s), cfg=s)

    def backward(self, mb: int, layers_per_stage: int) -> None:
        """Microbatch ``mb``'s backward pass: stages pp-1..0, each its layers then PP s -> s-1."""
        for s in reversed(range(self.spec.pp)):
            for _ in range(layers_per_stage):
                self._layer(StepPart.BACKWARD, mb, s)
            if s > 0:
                self._emit(Dim.PP, Collective.SEND_RECV, StepPart.BACKWARD, mb, s - 1,
                           self.spec.stage_pairs(s - 1), cfg=s - 1)

    def gradient_sync(self, ops: Sequence[_GradOp]) -> None:
        """The gradient collectives, in order, each on every group of its dimension."""
        for op in ops:
            self._emit(op.dim, op.collective, StepPart.GRADIENT_SYNC, None, None,
                       self.spec.groups(op.dim))

    def _at_stage(self, dim: Dim, stage: int) -> tuple[ProcessGroup, ...]:
        key = (dim, stage)
        got = self._stage_groups.get(key)
        if got is None:
            got = self.spec.groups_at_stage(dim, stage)
            self._stage_groups[key] = got
        return got

    def _layer(self, part: StepPart, mb: int, s: int) -> None:
        """One layer of stage ``s``: CP, TP, EP dispatch, EP combine (reversed backward)."""
        ops: list[Dim] = [Dim.CP, Dim.TP, Dim.EP, Dim.EP]
        if part is StepPart.BACKWARD:
            ops.reverse()
        for dim in ops:
            plan = self.dims.get(dim)
            if plan is None:
                continue
            groups = self._at_stage(dim, s)
            if dim is Dim.EP:
                self._emit(dim, Collective.ALL_TO_ALL, part, mb, s, groups,
                           steps=self.ep_configurations)
            else:
                self._emit(dim, plan.collectives[0], part, mb, s, groups)

    def _emit(
        self, dim: Dim, collective: Collective, part: StepPart, mb: int | None,
        stage: int | None, groups: Sequence[ProcessGroup], cfg: int = 0, steps: int = 1,
    ) -> None:
        """One slot per sub-phase (``steps``: all-to-all sub-phases, else 1) on configuration
        ``cfg + step``; an all-to-all slot holds only the groups with that many sub-phases."""
        seq_of: list[int] = []
        for g in groups:
            k = (g, collective)
            n = self._seqs.get(k, 0)
            self._seqs[k] = n + 1
            seq_of.append(n)
        for step in range(steps):
            phases = tuple(
                PhaseKey(g, collective, seq_of[i], step)
                for i, g in enumerate(groups)
                if collective is not Collective.ALL_TO_ALL or self.ep_steps[g] > step
            )
            self.slots.append(ScheduleSlot(dim, collective, part, mb, stage, cfg + step, phases))
