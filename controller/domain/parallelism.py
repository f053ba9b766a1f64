"""Declared parallelism: degrees, rank order, rank coordinates and the process groups of every
parallelism dimension. Pure: no I/O.

A ``ParallelismSpec`` gives the degrees of tensor (TP), pipeline (PP), data (DP, split into
``dp_replicate`` x ``dp_shard``), expert (EP) and context (CP) parallelism and the rank order.
World size = tp * pp * dp_replicate * dp_shard * cp; EP does not multiply it: it is carved out of
the data x context dimension (expert-data-parallel folding), as both frameworks do.

Rank orders (``RankOrder``)
---------------------------
A rank is the mixed-radix number of its coordinates, fastest-varying axis first:

* ``MEGATRON`` = ``"tp-cp-ep-dp-pp"``, Megatron-Core's default ``order`` of
  ``initialize_model_parallel`` (``megatron/core/parallel_state.py``, ``RankGenerator`` and
  ``generate_masked_orthogonal_rank_groups``):
  ``rank = tp + TP*(cp + CP*(dp + DP*pp))``; ``ep`` is inert in the dense generator (ep=1).
* ``MEGATRON_TP_PP_DP`` = ``"tp-cp-ep-pp-dp"``, selected by Megatron-LM's
  ``--use-tp-pp-dp-mapping``: ``rank = tp + TP*(cp + CP*(pp + PP*dp))``.
* ``TORCHTITAN``: torchtitan's ``ParallelDims`` device mesh
  (``torchtitan/distributed/parallel_dims.py``): ``init_device_mesh`` over
  ``[pp, dp_replicate, dp_shard, cp, tp]`` in row-major order, tp innermost:
  ``rank = tp + TP*(cp + CP*(dp_shard + DP_SHARD*(dp_replicate + DP_REPLICATE*pp)))``.

Note: ``MEGATRON`` and ``TORCHTITAN`` give the *same* rank -> (tp, cp, dp, pp) map (tp fastest,
pp slowest in both); they differ in what they accept for EP (below). ``MEGATRON_TP_PP_DP`` is a
genuinely different layout.

DP split. torchtitan has ``dp_replicate`` (DDP/HSDP replicas) and ``dp_shard`` (FSDP) as mesh
axes, dp_shard inner. Megatron-Core has one ``dp`` axis; its partial distributed optimizer
(``num_distributed_optimizer_instances`` = our ``dp_replicate``) shards within contiguous chunks
of the dp-cp group (``intra_partial_data_parallel_size``), i.e. dp_shard is the inner part of
Megatron's dp index: ``dp = dp_shard + DP_SHARD * dp_replicate`` in every order here.

EP rule (exactly what is implemented). Let ``j`` be the flattened data x context index with cp
fastest: ``j = cp + CP*(dp_shard + DP_SHARD*dp_replicate)`` (Megatron's dp-cp group order,
torchtitan's ``dp_shard_cp`` then ``dp_replicate``). The expert-parallel index is ``j mod EP`` and
the expert-data-parallel index ``j div EP``: an EP group is ``EP`` consecutive values of ``j`` with
the same (tp, pp). This is Megatron-Core's expert ``RankGenerator(tp=etp, ep=EP, dp=DP*CP/EP,
pp=PP, cp=1)`` with ``etp = tp`` (its default, ``expert_tensor_parallel_size=None``), and
torchtitan's EP mesh ``[pp, dp_replicate, dp_shard*cp/ep, ep, tp]`` with ``etp == tp`` ("EP
borrows all cp and some dp_shard degree"). With ``MEGATRON_TP_PP_DP`` and ``pp > 1`` Megatron-Core
requires ``ep == cp`` (below), so there the EP groups are the CP groups. Expert tensor parallelism
other than ``etp = tp`` is not modelled.

Validation (``ParallelismError``, the message names the field and the value):

* every degree an ``int`` >= 1 (torchtitan ``ParallelDims._validate``: "Parallelism degree
  should be >= 1");
* world size = tp*pp*dp_replicate*dp_shard*cp (torchtitan: "Invalid parallel dims ... !=
  WORLD_SIZE"; Megatron-Core: "world_size is not divisible by" tp*pp*cp) — checked by
  ``check_world_size`` against a job's rank count;
* ``(dp_shard*cp) % ep == 0``: torchtitan ``(dp_shard * cp) % ep == 0``; Megatron-Core
  ``world_size % (etp*ep*pp) == 0`` together with "Expert data parallel size should be divisible
  by partial DistOpt shard factor" (``num_distributed_optimizer_instances`` = dp_replicate);
* ``TORCHTITAN``: ``ep % cp == 0`` (torchtitan: EP borrows *all* of cp);
* ``MEGATRON_TP_PP_DP`` with pp > 1: ``ep == cp``, also when ep == 1 (Megatron-Core: "When not
  using pp-last rank ordering, the data parallel size of the attention and moe layers must be
  the same", i.e. DP*CP/EP == DP; so this order cannot combine PP with CP unless EP == CP).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from lightrail.controller.domain.model import ProcessGroup


class ParallelismError(ValueError):
    """A parallelism spec is invalid; the message names the field and the value."""


MAX_LAYER_PASSES = 1 << 14
"""The most layer passes one training step's schedule may have: microbatches x pp x
layers_per_stage (16,384). Each pass adds up to four phases per direction; a step beyond it would
take seconds to derive on the controller's event loop (2^32 microbatches never ended), and no
declared schedule of that length is provisioned usefully."""


def check_schedule_shape(pp: int, microbatches: int, layers_per_stage: int) -> None:
    """Raise ``ParallelismError`` naming the field unless ``microbatches`` and
    ``layers_per_stage`` are >= 1 and microbatches x ``pp`` x layers_per_stage is at most
    ``MAX_LAYER_PASSES``."""
    for name, value in (("microbatches", microbatches), ("layers_per_stage", layers_per_stage)):
        if value < 1:
            raise ParallelismError(f"{name}: must be >= 1, got {value}")
    if microbatches * pp * layers_per_stage > MAX_LAYER_PASSES:
        raise ParallelismError(
            f"microbatches: {microbatches} microbatches x pp {pp} x layers_per_stage "
            f"{layers_per_stage} = {microbatches * pp * layers_per_stage} layer passes exceed "
            f"{MAX_LAYER_PASSES}")


class RankOrder(enum.Enum):
    """How ranks are numbered across the parallelism dimensions (see the module docstring).
    The value is the framework's own spelling, fastest axis first for Megatron."""

    MEGATRON = "tp-cp-ep-dp-pp"
    MEGATRON_TP_PP_DP = "tp-cp-ep-pp-dp"
    TORCHTITAN = "pp-dp_replicate-dp_shard-cp-tp"


class Dim(enum.Enum):
    """Parallelism dimensions whose process groups a spec yields.

    ``DP`` = dp_replicate x dp_shard (Megatron's ``dp`` group, torchtitan's ``dp``);
    ``DP_CP`` = DP x CP, the dense-gradient group (Megatron's ``dp-cp`` group: "we piggyback GPUs
    of context parallelism on data parallel group for weight gradient all-reduce"; torchtitan's
    ``dp_cp``); ``DP_SHARD_CP`` = dp_shard x CP, the FSDP / distributed-optimizer shard group
    (torchtitan ``dp_shard_cp``, Megatron's intra-partial dp-cp group); ``EXPERT_DP`` = the
    expert-data-parallel group (Megatron ``_EXPERT_DATA_PARALLEL_GROUP``; torchtitan
    ``dp_replicate`` x ``dp_shard_mod_ep``)."""

    TP = "tp"
    PP = "pp"
    CP = "cp"
    DP = "dp"
    DP_SHARD = "dp_shard"
    DP_REPLICATE = "dp_replicate"
    DP_CP = "dp_cp"
    DP_SHARD_CP = "dp_shard_cp"
    EP = "ep"
    EXPERT_DP = "expert_dp"


@dataclass(frozen=True, slots=True)
class RankCoords:
    """The coordinates of one rank. ``dp`` = dp_shard + DP_SHARD * dp_replicate (the rank in its
    DP group); ``ep`` / ``expert_dp``: its index in its EP / expert-data-parallel group."""

    rank: int
    tp: int
    cp: int
    dp_shard: int
    dp_replicate: int
    dp: int
    pp: int
    ep: int
    expert_dp: int


@dataclass(frozen=True, slots=True)
class _Axis:
    name: str
    size: int
    stride: int


@dataclass(frozen=True, slots=True)
class _Mesh:
    """Axes fastest first; rank = sum(coord * stride)."""

    axes: tuple[_Axis, ...]

    @staticmethod
    def of(sizes: list[tuple[str, int]]) -> _Mesh:
        stride = 1
        axes: list[_Axis] = []
        for name, size in sizes:
            axes.append(_Axis(name, size, stride))
            stride *= size
        return _Mesh(tuple(axes))

    def axis(self, name: str) -> _Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    def coord(self, rank: int, name: str) -> int:
        a = self.axis(name)
        return (rank // a.stride) % a.size

    def flat(self, rank: int, names: tuple[str, ...]) -> int:
        """Index of ``rank`` in the flattened ``names`` axes (in mesh order, fastest first)."""
        index, scale = 0, 1
        for a in self.axes:
            if a.name in names:
                index += ((rank // a.stride) % a.size) * scale
                scale *= a.size
        return index


@dataclass(frozen=True, slots=True)
class _GroupTable:
    groups: tuple[ProcessGroup, ...]
    index_of_rank: tuple[int, ...]


_DENSE_AXES: dict[Dim, tuple[str, ...]] = {
    Dim.TP: ("tp",),
    Dim.PP: ("pp",),
    Dim.CP: ("cp",),
    Dim.DP: ("dp_shard", "dp_replicate"),
    Dim.DP_SHARD: ("dp_shard",),
    Dim.DP_REPLICATE: ("dp_replicate",),
    Dim.DP_CP: ("cp", "dp_shard", "dp_replicate"),
    Dim.DP_SHARD_CP: ("cp", "dp_shard"),
}
_EXPERT_AXES: dict[Dim, tuple[str, ...]] = {
    Dim.EP: ("ep",),
    Dim.EXPERT_DP: ("edp", "dp_replicate"),  # torchtitan splits edp; Megatron's edp spans both
}


def _check_degree(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParallelismError(f"{name}: must be an integer >= 1, got {value!r}")
    if value < 1:
        raise ParallelismError(f"{name}: must be >= 1, got {value}")
    return value


@dataclass(frozen=True)
class ParallelismSpec:
    """Degrees and rank order of a job's parallelism; validated on construction.

    Raises ``ParallelismError`` naming the field and value (see the module docstring for the
    rules and their sources). Groups are computed lazily and cached (O(world size) per
    dimension); the spec is otherwise an immutable value (equality and hash ignore the cache).
    """

    tp: int = 1
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    ep: int = 1
    cp: int = 1
    order: RankOrder = RankOrder.MEGATRON
    _tables: dict[Dim, _GroupTable] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )
    _pairs: dict[int, tuple[ProcessGroup, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp_replicate", "dp_shard", "ep", "cp"):
            _check_degree(name, getattr(self, name))
        if not isinstance(self.order, RankOrder):
            raise ParallelismError(f"order: must be a RankOrder, got {self.order!r}")
        if self.ep > 1:
            dsc = self.dp_shard * self.cp
            if dsc % self.ep != 0:
                raise ParallelismError(
                    f"ep: {self.ep} must divide dp_shard*cp = {self.dp_shard}*{self.cp} = {dsc} "
                    "(EP is carved out of the data x context dimension; Megatron-Core: "
                    "world_size % (tp*ep*pp) == 0 and expert-DP divisible by dp_replicate; "
                    "torchtitan: (dp_shard*cp) % ep == 0)"
                )
            if self.order is RankOrder.TORCHTITAN and self.ep % self.cp != 0:
                raise ParallelismError(
                    f"ep: {self.ep} must be a multiple of cp = {self.cp} with order "
                    f"{self.order.name} (torchtitan: EP borrows all of cp, ep % cp == 0)"
                )
        if self.order is RankOrder.MEGATRON_TP_PP_DP and self.pp > 1 and self.ep != self.cp:
            raise ParallelismError(
                f"ep: {self.ep} must equal cp = {self.cp} with order {self.order.value!r} and "
                f"pp = {self.pp} > 1 (Megatron-Core: without pp-last ordering the data-parallel "
                "size of attention and MoE layers, dp and dp*cp/ep, must be the same)"
            )

    # --- sizes --------------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        """Number of ranks: tp * pp * dp_replicate * dp_shard * cp."""
        return self.tp * self.pp * self.dp_replicate * self.dp_shard * self.cp

    @property
    def dp(self) -> int:
        """Data-parallel degree dp_replicate * dp_shard."""
        return self.dp_replicate * self.dp_shard

    @property
    def expert_dp(self) -> int:
        """Expert-data-parallel degree dp * cp / ep."""
        return self.dp * self.cp // self.ep

    def size(self, dim: Dim) -> int:
        """Ranks per group of ``dim``."""
        return {
            Dim.TP: self.tp,
            Dim.PP: self.pp,
            Dim.CP: self.cp,
            Dim.DP: self.dp,
            Dim.DP_SHARD: self.dp_shard,
            Dim.DP_REPLICATE: self.dp_replicate,
            Dim.DP_CP: self.dp * self.cp,
            Dim.DP_SHARD_CP: self.dp_shard * self.cp,
            Dim.EP: self.ep,
            Dim.EXPERT_DP: self.expert_dp,
        }[dim]

    def check_world_size(self, world_size: int) -> None:
        """Raise ``ParallelismError`` unless a job of ``world_size`` ranks fits this spec."""
        if world_size != self.world_size:
            raise ParallelismError(
                f"world_size: the job has {world_size} ranks but tp*pp*dp_replicate*dp_shard*cp"
                f" = {self.tp}*{self.pp}*{self.dp_replicate}*{self.dp_shard}*{self.cp} = "
                f"{self.world_size}"
            )

    # --- meshes -------------------------------------------------------------------------------

    def _dense(self) -> _Mesh:
        if self.order is RankOrder.MEGATRON_TP_PP_DP:
            return _Mesh.of([("tp", self.tp), ("cp", self.cp), ("pp", self.pp),
                             ("dp_shard", self.dp_shard), ("dp_replicate", self.dp_replicate)])
        # MEGATRON tp-cp-(ep)-dp-pp and TORCHTITAN [pp, dp_replicate, dp_shard, cp, tp]
        return _Mesh.of([("tp", self.tp), ("cp", self.cp), ("dp_shard", self.dp_shard),
                         ("dp_replicate", self.dp_replicate), ("pp", self.pp)])

    def _expert(self) -> _Mesh:
        if self.order is RankOrder.MEGATRON_TP_PP_DP:
            # Megatron expert RankGenerator(tp, ep, dp=edp, pp, cp=1), order tp-cp-ep-pp-dp.
            return _Mesh.of([("tp", self.tp), ("ep", self.ep), ("pp", self.pp),
                             ("edp", self.expert_dp), ("dp_replicate", 1)])
        if self.order is RankOrder.MEGATRON:
            # Megatron expert RankGenerator order tp-cp-ep-dp-pp: edp spans all of dp*cp/ep.
            return _Mesh.of([("tp", self.tp), ("ep", self.ep), ("edp", self.expert_dp),
                             ("dp_replicate", 1), ("pp", self.pp)])
        # torchtitan EP mesh [pp, dp_replicate, dp_shard*cp/ep, ep, tp].
        return _Mesh.of([("tp", self.tp), ("ep", self.ep),
                         ("edp", self.dp_shard * self.cp // self.ep),
                         ("dp_replicate", self.dp_replicate), ("pp", self.pp)])

    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ParallelismError(f"rank: {rank!r} out of range 0..{self.world_size - 1}")

    def coords(self, rank: int) -> RankCoords:
        """The coordinates of ``rank``; raises ``ParallelismError`` when it is out of range."""
        self._check_rank(rank)
        d, e = self._dense(), self._expert()
        return RankCoords(
            rank=rank,
            tp=d.coord(rank, "tp"),
            cp=d.coord(rank, "cp"),
            dp_shard=d.coord(rank, "dp_shard"),
            dp_replicate=d.coord(rank, "dp_replicate"),
            dp=d.flat(rank, _DENSE_AXES[Dim.DP]),
            pp=d.coord(rank, "pp"),
            ep=e.coord(rank, "ep"),
            expert_dp=e.flat(rank, _EXPERT_AXES[Dim.EXPERT_DP]),
        )

    def rank_of(
        self, *, tp: int = 0, cp: int = 0, dp_shard: int = 0, dp_replicate: int = 0, pp: int = 0
    ) -> int:
        """The rank at the given dense coordinates (inverse of ``coords``); raises
        ``ParallelismError`` naming a coordinate outside its degree."""
        d = self._dense()
        rank = 0
        for name, value in (("tp", tp), ("cp", cp), ("dp_shard", dp_shard),
                            ("dp_replicate", dp_replicate), ("pp", pp)):
            a = d.axis(name)
            if not 0 <= value < a.size:
                raise ParallelismError(f"{name}: coordinate {value} out of range 0..{a.size - 1}")
            rank += value * a.stride
        return rank

    # --- groups -------------------------------------------------------------------------------

    def _table(self, dim: Dim) -> _GroupTable:
        table = self._tables.get(dim)
        if table is not None:
            return table
        if dim in _DENSE_AXES:
            mesh, names = self._dense(), _DENSE_AXES[dim]
        else:
            mesh, names = self._expert(), _EXPERT_AXES[dim]
        # Mixed radix: a group = base + every combination of the masked axes; the bases are the
        # ranks whose masked coordinates are 0. Both lists come out ascending (strides grow).
        offsets, bases = [0], [0]
        for a in mesh.axes:
            step = [i * a.stride for i in range(a.size)]
            if a.name in names:
                offsets = [o + d for d in step for o in offsets]
            else:
                bases = [b + d for d in step for b in bases]
        index_of_rank = [0] * self.world_size
        groups: list[ProcessGroup] = []
        for i, b in enumerate(bases):
            members = tuple(b + o for o in offsets)
            for r in members:
                index_of_rank[r] = i
            groups.append(ProcessGroup(members))
        table = _GroupTable(tuple(groups), tuple(index_of_rank))
        self._tables[dim] = table
        return table

    def groups(self, dim: Dim) -> tuple[ProcessGroup, ...]:
        """Every process group of ``dim``, ordered by lowest rank (the order in which
        Megatron-Core's ``generate_masked_orthogonal_rank_groups`` lists them). Each rank is in
        exactly one group; a degree of 1 gives world-size singleton groups. Cached per spec
        object: O(world size) the first time."""
        return self._table(dim).groups

    def group_of(self, dim: Dim, rank: int) -> ProcessGroup:
        """The group of ``dim`` that ``rank`` belongs to; raises ``ParallelismError`` for a rank
        out of range."""
        self._check_rank(rank)
        table = self._table(dim)
        return table.groups[table.index_of_rank[rank]]

    def groups_at_stage(self, dim: Dim, stage: int) -> tuple[ProcessGroup, ...]:
        """The groups of ``dim`` whose ranks sit in pipeline stage ``stage`` (every dimension
        but PP keeps the stage fixed). Raises ``ParallelismError`` for PP or a bad stage."""
        if dim is Dim.PP:
            raise ParallelismError("dim: PP groups span every stage; use stage_pairs")
        if not 0 <= stage < self.pp:
            raise ParallelismError(f"stage: {stage} out of range 0..{self.pp - 1}")
        pp_axis = self._dense().axis("pp")
        return tuple(
            g for g in self.groups(dim) if (g.ranks[0] // pp_axis.stride) % pp_axis.size == stage
        )

    def stage_pairs(self, stage: int) -> tuple[ProcessGroup, ...]:
        """The 2-rank groups {rank in stage ``stage``, its peer in stage ``stage + 1``} with the
        same (tp, cp, dp) coordinates: the links of the pipeline chain across one stage
        boundary, ordered by lowest rank (cached). Raises ``ParallelismError`` unless
        0 <= stage < pp - 1."""
        if not 0 <= stage < self.pp - 1:
            raise ParallelismError(
                f"stage: {stage} out of range 0..{self.pp - 2} (boundaries of {self.pp} stages)"
            )
        pairs = self._pairs.get(stage)
        if pairs is None:
            stride = self._dense().axis("pp").stride
            pairs = tuple(
                ProcessGroup((g.ranks[stage], g.ranks[stage] + stride))
                for g in self.groups(Dim.PP)
            )
            self._pairs[stage] = pairs
        return pairs
