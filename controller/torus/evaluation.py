"""Slice allocation on a torus: contiguous-only vs Lightrail's photonic stitching, one trace.

Pure computation plus optional files. ``evaluate_slices`` replays one seeded arrival/departure
trace through two :class:`~lightrail.controller.torus.allocator.TorusAllocator` instances, one per
policy, and
reports side by side:

- **rejection rate**: requests refused (no placement at arrival; no queueing) / requests, also
  weighted by chips.
- **fragmentation**: ``1 - L / F`` averaged over arrival instants (Poisson arrivals see time
  averages, PASTA), where ``F`` is the free tenant chips and ``L`` the largest slice the policy
  could grant right then (``TorusAllocator.largest_allocatable``: the largest free box for
  contiguous-only; for Lightrail the larger of that and the largest whole-server size, a
  multiple of 4 chips, that a dry-run stitch places); 0 when nothing is free.
  ``box fragmentation`` uses the largest free box for both (a property of the free layout
  only).
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

Morphlux (arXiv:2508.03674) reports up to 70% less fragmentation and up to 66% more bandwidth for
tenant allocations with its ILP allocator on a TPU-cluster simulator; our model, heuristic and
trace are not theirs (see ``lightrail.controller.torus.allocator``), so the figures are comparable
in kind
only.
"""

from __future__ import annotations

import csv
import heapq
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

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
from lightrail.controller.torus.model import FailureDomainKind, Shape, TorusFabric

MORPHLUX_FRAGMENTATION_REDUCTION = 0.70
"""Morphlux: "reduce compute fragmentation by up to 70%" (arXiv:2508.03674, abstract)."""
MORPHLUX_BANDWIDTH_GAIN = 0.66
"""Morphlux: "improve the bandwidth of tenant compute allocations by up to 66%"."""


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
    """Metrics of one policy over the measured part of the trace (see the module docstring).
    Bandwidths in Gb/s; ``utilization`` is allocated / tenant chips, time-averaged;
    ``stitched_fraction`` the accepted slices that were stitched; ``mean_hops`` fibres per
    inter-server circuit of stitched slices; ``wall_s`` the replay's wall-clock time."""

    policy: str
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
    wall_s: float


@dataclass(frozen=True, slots=True)
class SliceEvaluation:
    """Both policies on one trace, plus Lightrail's relative change against contiguous-only:
    ``fragmentation_reduction = 1 - frag_L / frag_C``, ``bandwidth_gain = bw_per_chip_L /
    bw_per_chip_C - 1``, ``rejection_reduction = 1 - rej_L / rej_C`` (0 when the base is 0)."""

    torus: str
    seed: int
    requests: int
    load: float
    mean_hold_s: float
    warmup_fraction: float
    spares_per_rack: int
    link_gbps: float
    results: tuple[PolicyResult, ...]
    fragmentation_reduction: float
    bandwidth_gain: float
    rejection_reduction: float

    def result(self, policy: AllocationPolicy) -> PolicyResult:
        """The row of ``policy``."""
        return next(r for r in self.results if r.policy == policy.value)


def trace_mix(fabric: TorusFabric, mix: tuple[MixEntry, ...] = DEFAULT_MIX
              ) -> list[MixEntry]:
    """``mix`` without entries that fit ``fabric`` in no rotation, weights renormalised.
    Raises ``ValueError`` if nothing is left."""
    dims = fabric.dims
    kept = [m for m in mix if m.chips <= dims.volume and (
        m.shape is None or any(r.fits_in(dims) for r in m.shape.rotations()))]
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

    def sample_fragmentation(self, alloc: TorusAllocator, probe_attempts: int) -> None:
        """One sample of each fragmentation of ``alloc`` now (0 when nothing is free)."""
        free = alloc.free_count()
        if free:
            self.frags.append(1.0 - alloc.largest_allocatable(probe_attempts) / free)
            self.box_frags.append(1.0 - alloc.largest_free_box() / free)
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
           frag_every: int, probe_attempts: int) -> PolicyResult:
    """Replay ``trace`` through ``alloc``; metrics over arrivals with index >= ``warmup``,
    fragmentation sampled every ``frag_every``-th measured arrival."""
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
    return PolicyResult(
        policy=alloc.policy.value,
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
        wall_s=time.perf_counter() - started,
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
    out_dir: Path | None = None,
    on_policy: Callable[[str], None] | None = None,
) -> SliceEvaluation:
    """Run both policies on one seeded trace (module docstring) and return the comparison;
    with ``out_dir``, also write ``slices_eval.csv``, ``slices_eval.json`` and
    ``slices_eval.png`` there (see :func:`write_outputs`).

    ``torus`` is ``"XxYxZ"`` chips (racks ``4x4x4`` clipped to the torus); ``spares_per_rack``
    spares are held in every rack; ``frag_samples`` bounds the fragmentation samples;
    ``probe_attempts`` bounds stitch attempts per probe size; ``on_policy(name)`` is called
    before each policy's replay (progress). Raises ``ValueError`` (including
    :class:`~lightrail.controller.torus.TorusError`) for bad arguments."""
    if not 0 <= warmup_fraction < 1:
        raise ValueError(f"warmup_fraction: must be in [0, 1), got {warmup_fraction}")
    if frag_samples < 1:
        raise ValueError(f"frag_samples: must be >= 1, got {frag_samples}")
    fabric = TorusFabric.parse(torus, link_gbps=link_gbps)
    spares = SparePolicy(FailureDomainKind.RACK, spares_per_rack)
    allocs = [TorusAllocator(fabric, policy, spares=spares) for policy in AllocationPolicy]
    trace = generate_trace(fabric, requests, seed, load=load, mean_hold_s=mean_hold_s,
                           tenant_chips=allocs[0].free_count())
    warmup = int(requests * warmup_fraction)
    frag_every = max(1, (requests - warmup) // frag_samples)
    def run(alloc: TorusAllocator) -> PolicyResult:
        if on_policy is not None:
            on_policy(alloc.policy.value)
        return replay(alloc, trace, warmup=warmup, frag_every=frag_every,
                      probe_attempts=probe_attempts)

    results = tuple(run(a) for a in allocs)
    base, light = results

    def reduction(new: float, old: float) -> float:
        return 1.0 - new / old if old > 0 else 0.0

    ev = SliceEvaluation(
        torus=str(fabric.dims), seed=seed, requests=requests, load=load,
        mean_hold_s=mean_hold_s, warmup_fraction=warmup_fraction,
        spares_per_rack=spares_per_rack, link_gbps=link_gbps, results=results,
        fragmentation_reduction=reduction(light.fragmentation, base.fragmentation),
        bandwidth_gain=(light.bandwidth_per_chip_gbps / base.bandwidth_per_chip_gbps - 1.0
                        if base.bandwidth_per_chip_gbps > 0 else 0.0),
        rejection_reduction=reduction(light.rejection_rate, base.rejection_rate),
    )
    if out_dir is not None:
        write_outputs(ev, out_dir)
    return ev


_COLUMNS = (
    ("rejection rate", "rejection_rate", "{:.1%}"),
    ("rejected chips", "rejected_chip_rate", "{:.1%}"),
    ("fragmentation", "fragmentation", "{:.1%}"),
    ("box fragmentation", "box_fragmentation", "{:.1%}"),
    ("utilization", "utilization", "{:.1%}"),
    ("bandwidth Gb/s", "bandwidth_gbps", "{:,.0f}"),
    ("Gb/s per chip", "bandwidth_per_chip_gbps", "{:.0f}"),
    ("stitched", "stitched_fraction", "{:.1%}"),
    ("hops (stitched)", "mean_hops", "{:.2f}"),
    ("accepted", "accepted", "{}"),
    ("rejected", "rejected", "{}"),
    ("wall s", "wall_s", "{:.1f}"),
)


def render_table(ev: SliceEvaluation) -> str:
    """The comparison as a plain-text table (one column per policy) with Lightrail's change
    and Morphlux's reported figures."""
    head = (f"Slices on a {ev.torus} torus: {ev.requests} requests (first "
            f"{ev.warmup_fraction:.0%} warm-up), load {ev.load:g}, seed {ev.seed}, "
            f"{ev.spares_per_rack} spare(s) per rack, {ev.link_gbps:g} Gb/s lanes")
    names = [r.policy for r in ev.results]
    rows = [[label, *(fmt.format(getattr(r, attr)) for r in ev.results)]
            for label, attr, fmt in _COLUMNS]
    widths = [max(len(x) for x in col) for col in zip(["metric", *names], *rows, strict=True)]
    lines = [head, "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w)
                             in enumerate(zip(["metric", *names], widths, strict=True)))]
    lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w)
                        in enumerate(zip(row, widths, strict=True))) for row in rows]
    lines.append(
        f"Lightrail vs contiguous-only: fragmentation -{ev.fragmentation_reduction:.0%} "
        f"(Morphlux: up to -{MORPHLUX_FRAGMENTATION_REDUCTION:.0%}), bandwidth per chip "
        f"{ev.bandwidth_gain:+.0%} (Morphlux: up to +{MORPHLUX_BANDWIDTH_GAIN:.0%}), "
        f"rejections -{ev.rejection_reduction:.0%}")
    lines += _LEGEND
    return "\n".join(lines)


_LEGEND = (
    "fragmentation: 1 - (largest slice the policy could grant) / (free chips), mean over "
    "arrivals; box fragmentation: the same with the largest free box, a property of the free "
    "layout only: the two rows match while the largest slice either policy can grant is a "
    "free box.",
    "bandwidth: injection bandwidth of the live slices (per chip and axis, the lanes of the "
    "thinnest link x the lane rate, doubled when the axis closes into a ring); Lightrail's "
    "gain comes from circuits that close rings and from idle lanes redirected to widen links, "
    "so it grows even when few slices are stitched.",
    "stitched: accepted slices built from pieces joined by circuits; hops: fibres per "
    "inter-server circuit of those slices.",
)
"""What the rows mean, printed under the table (the module docstring has the definitions)."""


def write_outputs(ev: SliceEvaluation, out_dir: Path) -> list[Path]:
    """Write ``slices_eval.csv`` (one row per policy), ``slices_eval.json`` (configuration,
    rows, relative changes, Morphlux's figures) and ``slices_eval.png`` (bar charts) into
    ``out_dir`` (created if needed). Returns the paths written. Raises ``OSError``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "slices_eval.csv"
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(asdict(ev.results[0])))
        writer.writeheader()
        for r in ev.results:
            writer.writerow(asdict(r))
    json_path = out_dir / "slices_eval.json"
    doc = asdict(ev)
    doc["morphlux_reported"] = {"fragmentation_reduction_up_to": MORPHLUX_FRAGMENTATION_REDUCTION,
                                "bandwidth_gain_up_to": MORPHLUX_BANDWIDTH_GAIN,
                                "source": "arXiv:2508.03674 (abstract)"}
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    png_path = out_dir / "slices_eval.png"
    _plot(ev, png_path)
    return [csv_path, json_path, png_path]


def _plot(ev: SliceEvaluation, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = (("rejection rate", "rejection_rate", 100.0, "%"),
               ("fragmentation", "fragmentation", 100.0, "%"),
               ("bandwidth per chip", "bandwidth_per_chip_gbps", 1.0, "Gb/s"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(11, 3.4))
    for ax, (title, attr, scale, unit) in zip(axes, metrics, strict=True):
        values = [float(getattr(r, attr)) * scale for r in ev.results]
        ax.bar([r.policy for r in ev.results], values, color=["#888888", "#2a7ab9"])
        ax.set_title(title)
        ax.set_ylabel(unit)
    fig.suptitle(f"{ev.torus} torus, {ev.requests} requests, load {ev.load:g}, "
                 f"seed {ev.seed}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
