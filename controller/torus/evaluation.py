"""Slice allocation on a torus: contiguous-only, the stitching heuristic and Morphlux's ILP.

Pure computation plus optional files. ``evaluate_slices`` replays one seeded arrival/departure
trace through one :class:`~lightrail.controller.torus.allocator.TorusAllocator` per
:class:`Allocator` and reports side by side:

- ``contiguous-only``: a plain electrical torus, free boxes only;
- ``heuristic``: Lightrail's photonic policy with the documented stitching heuristic
  (``lightrail.controller.torus.allocator``);
- ``ilp``: the same with Morphlux's fragmented-slice integer program after the heuristic
  (``lightrail.controller.torus.ilp_stitch``; HiGHS within ``ilp_time_limit_s``, falling back
  to the heuristic's plan at the limit).

Metrics:

- **rejection rate**: requests refused (no placement at arrival; no queueing) / requests, also
  weighted by chips.
- **fragmentation**: ``1 - L / F`` averaged over arrival instants (Poisson arrivals see time
  averages, PASTA), where ``F`` is the free tenant chips and ``L`` the largest slice the
  allocator could grant right then (``TorusAllocator.largest_allocatable``: the largest free box
  for contiguous-only; for the photonic allocators the larger of that and the largest
  whole-server size, a multiple of 4 chips with a box shape of even x and y extents that fits
  the torus, that a dry-run stitch places); 0 when nothing is free. So 0 means any free chip
  could join one slice, 1 - 1/F that only single chips can be granted.
  ``box fragmentation`` uses the largest free box for every allocator (a property of the free
  layout only). The two rows are equal exactly when no stitched probe beats the largest free
  box (``probes above box`` gives how often one did): above the box the probe sizes are sparse
  (on an 8x8x8 torus above 128 chips only 144, 160, 168, 180, 192, ... have such a shape), and
  a stitched slice of that size needs a wholly free server for every full 2x2x1 tile, joined by
  fibres whose both ends are homed on its own chips, one circuit per fibre.
- **allocated bandwidth**: time-averaged aggregate injection bandwidth of the live slices
  (``Slice.bandwidth_gbps``: per chip, for every logical axis, the lanes of its thinnest link x
  ``link_gbps``, doubled when the axis closes into a ring) and the same per allocated chip.
  Contiguous-only slices get the fixed torus wires inside their box; Lightrail slices get their
  circuits, stitched ones possibly over longer (multi-hop) fibre paths, plus idle lanes
  redirected to widen links (Morphlux).

Trace (documented, seeded with ``numpy.random.default_rng(seed)``): Poisson arrivals of rate
``lambda = load * tenant_chips / (E[size] * mean_hold_s)``, exponential holding times of mean
``mean_hold_s``, and request kinds drawn from ``DEFAULT_MIX`` (entries that fit the torus in no
rotation are dropped and the weights renormalised). The first ``warmup_fraction`` of the
arrivals fill the cluster and are left out of every metric.

- **maximum edge load** (``ilp`` only): the integer program's objective, circuits / usable
  fibres on the busiest server-to-server edge of a stitched slice's mesh links, for the
  heuristic's plan and the program's optimum on the same requests (``ilp_stitch.IlpStats``).

Morphlux (arXiv:2508.03674, abstract) reports up to 70% less fragmentation and up to 66% more
bandwidth for tenant allocations with its ILP allocator on a TPU-cluster simulator; our model,
heuristic and trace are not theirs (see ``lightrail.controller.torus.allocator``), so the
figures are comparable in kind only.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from lightrail.controller.torus.allocator import (
    AllocationPolicy,
    NoCapacityError,
    Slice,
    SliceMode,
    SliceRequest,
    SparePolicy,
    TorusAllocator,
)
from lightrail.controller.torus.ilp_stitch import IlpStats, IlpStitcher
from lightrail.controller.torus.model import FailureDomainKind, Shape, TorusFabric

MORPHLUX_FRAGMENTATION_REDUCTION = 0.70
"""Morphlux: "reduce compute fragmentation by up to 70%" (arXiv:2508.03674, abstract)."""
MORPHLUX_BANDWIDTH_GAIN = 0.66
"""Morphlux: "improve the bandwidth of tenant compute allocations by up to 66%"."""
DEFAULT_ILP_TIME_LIMIT_S = 2.0
"""Default HiGHS time limit per stitched request (s); at the limit the heuristic's plan is used."""
MAX_TORUS_CHIPS = 32_768
"""The largest torus ``evaluate_slices`` builds (32x32x32): the fabric's tables grow with the
chips (32x32x32 takes ~40 s and ~0.7 GB before the first request), so a mistyped extent is
refused instead of running for hours."""


class Allocator(Enum):
    """The allocators compared on one trace (module docstring)."""

    CONTIGUOUS_ONLY = "contiguous-only"
    HEURISTIC = "heuristic"
    ILP = "ilp"


@dataclass(frozen=True, slots=True)
class MixEntry:
    """One kind of request in the trace: a ``shape`` or a bare ``size``, with its ``weight``."""

    weight: float
    shape: Shape | None = None
    size: int | None = None

    @property
    def chips(self) -> int:
        """Chips the request asks for."""
        if self.shape is not None:
            return self.shape.volume
        assert self.size is not None
        return self.size

    def label(self) -> str:
        """``4x4x1`` or ``size 12``."""
        return str(self.shape) if self.shape is not None else f"size {self.size}"


DEFAULT_MIX: tuple[MixEntry, ...] = (
    MixEntry(0.10, shape=Shape(1, 1, 1)),
    MixEntry(0.10, shape=Shape(2, 1, 1)),
    MixEntry(0.15, shape=Shape(2, 2, 1)),
    MixEntry(0.15, shape=Shape(2, 2, 2)),
    MixEntry(0.10, shape=Shape(4, 2, 2)),
    MixEntry(0.10, shape=Shape(4, 4, 1)),
    MixEntry(0.08, shape=Shape(4, 4, 2)),
    MixEntry(0.07, shape=Shape(4, 4, 4)),
    MixEntry(0.03, shape=Shape(8, 4, 4)),
    MixEntry(0.04, size=3),
    MixEntry(0.04, size=6),
    MixEntry(0.04, size=12),
)
"""Assumed request mix, skewed to small slices as in multi-tenant inference and fine-tuning
(the workloads Morphlux targets): TPU-style shapes from 1 to 128 chips plus size-only requests
whose shape the allocator picks. Mean about 20 chips on an 8x8x8 torus."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """Arrival ``index`` at ``arrival_s`` holding its slice for ``hold_s`` (simulated s)."""

    index: int
    arrival_s: float
    hold_s: float
    request: SliceRequest


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """Metrics of one allocator over the measured part of the trace (see the module
    docstring). Bandwidths in Gb/s; ``utilization`` is allocated / tenant chips, time-averaged;
    ``stitched_fraction`` the accepted slices that were stitched; ``mean_hops`` fibres per
    inter-server circuit of stitched slices; ``probe_beat_box`` the fragmentation samples in
    which the largest grantable slice was larger than the largest free box; ``wall_s`` the
    replay's wall-clock time. The ``ilp_*`` fields (0 for the other allocators) are the
    :class:`~lightrail.controller.torus.ilp_stitch.IlpStats` of the run over the whole trace
    (warm-up and fragmentation probes included): programs solved, proven optimal, fallbacks at
    the time limit, skipped as too large, with no placement, placements improved or rescued,
    solved but not wired, solver seconds; ``heuristic_max_load`` and ``ilp_max_load`` the mean
    maximum edge load of both on the requests where both placed the slice."""

    allocator: str
    requests: int
    accepted: int
    rejected: int
    rejection_rate: float
    rejected_chip_rate: float
    fragmentation: float
    box_fragmentation: float
    utilization: float
    bandwidth_gbps: float
    bandwidth_per_chip_gbps: float
    stitched_fraction: float
    mean_hops: float
    probe_beat_box: float
    wall_s: float
    ilp_solves: int = 0
    ilp_optimal: int = 0
    ilp_fallbacks: int = 0
    ilp_too_large: int = 0
    ilp_infeasible: int = 0
    ilp_improved: int = 0
    ilp_rescued: int = 0
    ilp_unroutable: int = 0
    ilp_solve_s: float = 0.0
    heuristic_max_load: float = 0.0
    ilp_max_load: float = 0.0


@dataclass(frozen=True, slots=True)
class Change:
    """One photonic allocator against contiguous-only (``C``): ``fragmentation = frag /
    frag_C - 1``, ``bandwidth = bw_per_chip / bw_per_chip_C - 1``, ``rejection = rej / rej_C -
    1`` (negative is better for fragmentation and rejection; 0 when the base is 0)."""

    allocator: str
    fragmentation: float
    bandwidth: float
    rejection: float


@dataclass(frozen=True, slots=True)
class SliceEvaluation:
    """Every allocator on one trace, plus each photonic one's :class:`Change` against
    contiguous-only (when both ran)."""

    torus: str
    seed: int
    requests: int
    load: float
    mean_hold_s: float
    warmup_fraction: float
    spares_per_rack: int
    link_gbps: float
    ilp_time_limit_s: float
    results: tuple[PolicyResult, ...]
    changes: tuple[Change, ...]

    def result(self, allocator: Allocator) -> PolicyResult:
        """The column of ``allocator``; ``KeyError`` if it did not run."""
        for r in self.results:
            if r.allocator == allocator.value:
                return r
        raise KeyError(f"allocator: {allocator.value!r} was not evaluated")


def trace_mix(fabric: TorusFabric, mix: tuple[MixEntry, ...] = DEFAULT_MIX
              ) -> list[MixEntry]:
    """``mix`` without entries that fit ``fabric`` in no rotation (a bare size: in no box,
    as the allocator requires), weights renormalised. Raises ``ValueError`` if nothing is
    left."""
    dims = fabric.dims

    def box_of(n: int) -> bool:
        return any(n % (a * b) == 0 and n // (a * b) <= dims.z
                   for a in range(1, dims.x + 1) for b in range(1, dims.y + 1))

    kept = [m for m in mix if m.chips <= dims.volume and (
        box_of(m.chips) if m.shape is None
        else any(r.fits_in(dims) for r in m.shape.rotations()))]
    total = sum(m.weight for m in kept)
    if not kept or total <= 0:
        raise ValueError(f"mix: no request kind fits the torus {dims}")
    return [MixEntry(m.weight / total, m.shape, m.size) for m in kept]


def generate_trace(fabric: TorusFabric, requests: int, seed: int, *, load: float,
                   mean_hold_s: float, tenant_chips: int,
                   mix: tuple[MixEntry, ...] = DEFAULT_MIX) -> list[TraceRequest]:
    """The seeded trace described in the module docstring. Raises ``ValueError`` for
    ``requests < 1``, ``load <= 0`` or ``mean_hold_s <= 0``."""
    if requests < 1:
        raise ValueError(f"requests: must be >= 1, got {requests}")
    if not load > 0:
        raise ValueError(f"load: must be > 0, got {load}")
    if not mean_hold_s > 0:
        raise ValueError(f"mean_hold_s: must be > 0, got {mean_hold_s}")
    kinds = trace_mix(fabric, mix)
    weights = np.array([m.weight for m in kinds])
    mean_chips = float(sum(m.weight * m.chips for m in kinds))
    rate = load * tenant_chips / (mean_chips * mean_hold_s)
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=requests)
    holds = rng.exponential(mean_hold_s, size=requests)
    picks = rng.choice(len(kinds), size=requests, p=weights)
    out: list[TraceRequest] = []
    now = 0.0
    for i in range(requests):
        now += float(gaps[i])
        m = kinds[int(picks[i])]
        req = SliceRequest(f"tenant-{i}", size=m.size, shape=m.shape, slice_id=f"r{i}")
        out.append(TraceRequest(i, now, float(holds[i]), req))
    return out


@dataclass(frozen=True, slots=True)
class _Held:
    """What one live slice holds: ``chips`` and ``bandwidth_gbps`` (``Slice.bandwidth_gbps``)."""

    chips: int
    bandwidth_gbps: float


@dataclass(slots=True)
class _Live:
    """The slices live during a replay and the time integrals of what they hold: ``chips`` and
    ``bandwidth_gbps`` now, ``chip_s`` (chip-seconds) and ``gbps_s`` (Gb/s x s) integrated from
    the first ``last_t`` on; ``departures`` is a heap of (departure time in s, slice id),
    ``held`` what each live slice holds."""

    last_t: float
    chips: int = 0
    bandwidth_gbps: float = 0.0
    chip_s: float = 0.0
    gbps_s: float = 0.0
    departures: list[tuple[float, str]] = field(default_factory=list)
    held: dict[str, _Held] = field(default_factory=dict)

    def advance(self, t: float) -> None:
        """Integrate what is live up to time ``t`` (s); an earlier ``t`` changes nothing."""
        if t > self.last_t:
            self.chip_s += self.chips * (t - self.last_t)
            self.gbps_s += self.bandwidth_gbps * (t - self.last_t)
            self.last_t = t

    def release_until(self, alloc: TorusAllocator, t: float) -> None:
        """Release from ``alloc``, in departure order, every slice that leaves by time ``t``."""
        while self.departures and self.departures[0][0] <= t:
            left, sid = heapq.heappop(self.departures)
            self.advance(left)
            alloc.release(sid)
            held = self.held.pop(sid)
            self.chips -= held.chips
            self.bandwidth_gbps -= held.bandwidth_gbps

    def hold(self, s: Slice, until_s: float) -> None:
        """Count ``s`` live until it departs at ``until_s``."""
        heapq.heappush(self.departures, (until_s, s.slice_id))
        self.held[s.slice_id] = _Held(s.size, s.bandwidth_gbps)
        self.chips += s.size
        self.bandwidth_gbps += s.bandwidth_gbps


@dataclass(slots=True)
class _Measured:
    """The counts over the measured arrivals (after warm-up): requests accepted and rejected,
    chips rejected and asked for, stitched slices and their mean hops, fragmentation samples
    (by the policy's largest allocatable slice, and by the largest free box)."""

    accepted: int = 0
    rejected: int = 0
    rejected_chips: int = 0
    asked_chips: int = 0
    stitched: int = 0
    hops: list[float] = field(default_factory=list)
    frags: list[float] = field(default_factory=list)
    box_frags: list[float] = field(default_factory=list)
    beat_box: int = 0

    def sample_fragmentation(self, alloc: TorusAllocator, probe_attempts: int) -> None:
        """One sample of each fragmentation of ``alloc`` now (0 when nothing is free)."""
        free = alloc.free_count()
        if free:
            grantable, box = alloc.largest_allocatable(probe_attempts), alloc.largest_free_box()
            self.frags.append(1.0 - grantable / free)
            self.box_frags.append(1.0 - box / free)
            self.beat_box += grantable > box
        else:
            self.frags.append(0.0)
            self.box_frags.append(0.0)

    def reject(self, chips: int) -> None:
        """A request for ``chips`` chips found no placement."""
        self.rejected += 1
        self.rejected_chips += chips
        self.asked_chips += chips

    def accept(self, s: Slice, chips: int) -> None:
        """A request for ``chips`` chips was granted as ``s``."""
        self.accepted += 1
        self.asked_chips += chips
        if s.mode is SliceMode.STITCHED:
            self.stitched += 1
            self.hops.append(s.mean_hops)


def replay(alloc: TorusAllocator, trace: list[TraceRequest], *, warmup: int,
           frag_every: int, probe_attempts: int, name: str | None = None) -> PolicyResult:
    """Replay ``trace`` through ``alloc`` (a column named ``name``, default the policy's
    value); metrics over arrivals with index >= ``warmup``, fragmentation sampled every
    ``frag_every``-th measured arrival."""
    started = time.perf_counter()
    tenant_chips = alloc.free_count()
    measure_from = trace[warmup].arrival_s if warmup < len(trace) else trace[-1].arrival_s
    live = _Live(last_t=measure_from)
    m = _Measured()
    for tr in trace:
        live.release_until(alloc, tr.arrival_s)
        live.advance(tr.arrival_s)
        measured = tr.index >= warmup
        if measured and (tr.index - warmup) % frag_every == 0:
            m.sample_fragmentation(alloc, probe_attempts)
        chips = tr.request.shape.volume if tr.request.shape is not None else \
            tr.request.size or 0
        try:
            s = alloc.allocate(tr.request)
        except NoCapacityError:
            if measured:
                m.reject(chips)
            continue
        live.hold(s, tr.arrival_s + tr.hold_s)
        if measured:
            m.accept(s, chips)
    live.advance(max(live.last_t, trace[-1].arrival_s))
    span = max(live.last_t - measure_from, 1e-12)
    measured_n = m.accepted + m.rejected
    ilp = alloc.improver.stats if isinstance(alloc.improver, IlpStitcher) else IlpStats()
    return PolicyResult(
        allocator=name or alloc.policy.value,
        requests=measured_n,
        accepted=m.accepted,
        rejected=m.rejected,
        rejection_rate=m.rejected / measured_n if measured_n else 0.0,
        rejected_chip_rate=m.rejected_chips / m.asked_chips if m.asked_chips else 0.0,
        fragmentation=float(np.mean(m.frags)) if m.frags else 0.0,
        box_fragmentation=float(np.mean(m.box_frags)) if m.box_frags else 0.0,
        utilization=live.chip_s / span / tenant_chips if tenant_chips else 0.0,
        bandwidth_gbps=live.gbps_s / span,
        bandwidth_per_chip_gbps=live.gbps_s / live.chip_s if live.chip_s else 0.0,
        stitched_fraction=m.stitched / m.accepted if m.accepted else 0.0,
        mean_hops=float(np.mean(m.hops)) if m.hops else 0.0,
        probe_beat_box=m.beat_box / len(m.frags) if m.frags else 0.0,
        wall_s=time.perf_counter() - started,
        ilp_solves=ilp.solves, ilp_optimal=ilp.optimal, ilp_fallbacks=ilp.fallbacks,
        ilp_too_large=ilp.too_large, ilp_infeasible=ilp.infeasible,
        ilp_improved=ilp.improved, ilp_rescued=ilp.rescued, ilp_unroutable=ilp.unroutable,
        ilp_solve_s=ilp.solve_s,
        heuristic_max_load=float(np.mean(ilp.heuristic_load)) if ilp.heuristic_load else 0.0,
        ilp_max_load=float(np.mean(ilp.ilp_load)) if ilp.ilp_load else 0.0,
    )


def evaluate_slices(
    *,
    seed: int = 0,
    torus: str = "8x8x8",
    requests: int = 1000,
    load: float = 1.0,
    mean_hold_s: float = 3600.0,
    warmup_fraction: float = 0.1,
    spares_per_rack: int = 0,
    link_gbps: float = 100.0,
    frag_samples: int = 100,
    probe_attempts: int = 4,
    allocators: tuple[Allocator, ...] = tuple(Allocator),
    ilp_time_limit_s: float = DEFAULT_ILP_TIME_LIMIT_S,
    on_policy: Callable[[str], None] | None = None,
) -> SliceEvaluation:
    """Run ``allocators`` (default all three, in :class:`Allocator` order) on one seeded trace
    (module docstring) and return the comparison (files:
    ``lightrail.controller.cli.slices.write_outputs``).

    ``torus`` is ``"XxYxZ"`` chips (racks ``4x4x4`` clipped to the torus); ``spares_per_rack``
    spares are held in every rack; ``frag_samples`` bounds the fragmentation samples;
    ``probe_attempts`` bounds stitch attempts per probe size; ``ilp_time_limit_s`` is the
    solver's limit per stitched request (s); ``on_policy(name)`` is called before each
    allocator's replay (progress). Raises ``ValueError`` (including
    :class:`~lightrail.controller.torus.TorusError`) for bad arguments, naming the field (a
    torus of more than ``MAX_TORUS_CHIPS`` chips among them)."""
    if not 0 <= warmup_fraction < 1:
        raise ValueError(f"warmup_fraction: must be in [0, 1), got {warmup_fraction}")
    if frag_samples < 1:
        raise ValueError(f"frag_samples: must be >= 1, got {frag_samples}")
    if not allocators or len(set(allocators)) != len(allocators):
        raise ValueError(f"allocators: need distinct allocators, got "
                         f"{[a.value for a in allocators]}")
    if not ilp_time_limit_s > 0:
        raise ValueError(f"ilp_time_limit_s: must be > 0, got {ilp_time_limit_s}")
    chips = Shape.parse(torus, "torus").volume  # before the fabric, built chip by chip
    if chips > MAX_TORUS_CHIPS:
        raise ValueError(f"torus: {torus!r} has {chips} chips, more than {MAX_TORUS_CHIPS} "
                         "(MAX_TORUS_CHIPS)")
    fabric = TorusFabric.parse(torus, link_gbps=link_gbps)
    spares = SparePolicy(FailureDomainKind.RACK, spares_per_rack)

    def make(which: Allocator) -> TorusAllocator:
        if which is Allocator.CONTIGUOUS_ONLY:
            return TorusAllocator(fabric, AllocationPolicy.CONTIGUOUS_ONLY, spares=spares)
        improver = IlpStitcher(time_limit_s=ilp_time_limit_s) if which is Allocator.ILP \
            else None
        return TorusAllocator(fabric, AllocationPolicy.LIGHTRAIL, spares=spares,
                              improver=improver)

    order = [a for a in Allocator if a in allocators]
    allocs = [make(a) for a in order]
    trace = generate_trace(fabric, requests, seed, load=load, mean_hold_s=mean_hold_s,
                           tenant_chips=allocs[0].free_count())
    warmup = int(requests * warmup_fraction)
    frag_every = max(1, (requests - warmup) // frag_samples)

    def run(which: Allocator, alloc: TorusAllocator) -> PolicyResult:
        if on_policy is not None:
            on_policy(which.value)
        return replay(alloc, trace, warmup=warmup, frag_every=frag_every,
                      probe_attempts=probe_attempts, name=which.value)

    results = tuple(run(w, a) for w, a in zip(order, allocs, strict=True))

    def change(new: float, old: float) -> float:
        return new / old - 1.0 if old > 0 else 0.0

    base = next((r for r in results if r.allocator == Allocator.CONTIGUOUS_ONLY.value), None)
    changes = () if base is None else tuple(
        Change(r.allocator, change(r.fragmentation, base.fragmentation),
               change(r.bandwidth_per_chip_gbps, base.bandwidth_per_chip_gbps),
               change(r.rejection_rate, base.rejection_rate))
        for r in results if r is not base)
    ev = SliceEvaluation(
        torus=str(fabric.dims), seed=seed, requests=requests, load=load,
        mean_hold_s=mean_hold_s, warmup_fraction=warmup_fraction,
        spares_per_rack=spares_per_rack, link_gbps=link_gbps,
        ilp_time_limit_s=ilp_time_limit_s, results=results, changes=changes)
    return ev
