"""Opus phase patterns (Perlmutter, Llama 3 8B, TP4 x PP2 x DP) -> :class:`Workload`.

Input (``../shared/data/traces/opus-perlmutter/README.md``): an experiment folder
(``llama-3-3d-16-latency``: per-rank pattern folder(s) ``comm_pattern*/``, the timed files
``*_pp_0.txt``/``*_pp_1.txt``, the latency CSVs) or a bare per-rank pattern folder (its parent
is searched for the timed files). File syntax: :mod:`lightrail.agents.replay.trace.opus_format`.

Layout (README, "Experiment configuration"): 4 GPUs per node, TP 4 inside a node (NVLink: not
in the pattern files, never on the rails), PP 2, DP = nodes / 2. Global rank = node * 4 + local
rank (``comm_pattern_<node>_rank<local>.txt``); nodes 0 .. N/2-1 are pipeline stage 0, the rest
stage 1. A PP phase of rank r runs on {r, r +- 4N/2} (its peer in the other stage); a DP phase
on the ranks of the same local rank on the nodes of r's stage (the FSDP shard group).

One iteration: the files do not mark steps. A DP phase that starts on backend 6 occurs once per
training step (indices 0, 3, 6, ... on that backend, in pattern and timed files alike); a step
is the phases after one such phase up to and including the next. The first partial step
(warm-up) is dropped. Every complete step of a stage must have the same phase sequence.

Compute gaps (from the timed files, per stage, never across files: clocks of different nodes
are not aligned): each phase becomes its ``len`` calls. A call's time is placed inside its timed
phase linearly (``start_time`` .. ``max(start_time, end_time)``; an ``end_time`` before
``start_time`` - the phase's calls completed after the next phase began - gives the phase no
duration). A pattern call is found in the timed file by its step and its call index on its backend,
as an offset in that step's index range (scaled by the ratio of the two files' per-step ranges
when they differ, nearest recorded call: the 16-GPU timed files come from a ``b24`` run, the
patterns from the measured ``b16`` runs). The stale ``end_backend`` is not used: a DP phase
that starts on backend 6 holds the backend-5 calls after the last one seen, up to its
``end_idx``. Per phase of the step: the
idle gap before it (end of the previous phase -> its first call: the window a switch can hide in)
and its span (first call -> end of its last call: compute interleaved with the calls, under its
circuits) are averaged over the complete steps. In the Workload the first call of a phase has
the idle gap; the span is spread evenly over the gaps of the phase's later calls; a one-call
phase with a span gets a zero-byte closing call of the same kind after it (so the span is time
under the phase's circuits, not a window to switch in).

Message sizes are not recorded; they are derived from the model (torchtitan ``llama3`` 8B:
dim 4096, 32 layers, vocab 128,256, 8,030,261,248 parameters; ``local_batch_size`` 8, seq 8192,
PP microbatch 4, bf16 - the README's configuration table):

* PP call (one microbatch's activation or its gradient): ``microbatch * seq * dim * 2`` B =
  268,435,456 B (assumed unsharded by TP: every TP rank sends the whole hidden state).
* DP call (one FSDP unit's bf16 parameters, gathered or reduce-scattered over the DP group;
  priced as an all-gather): ``params / PP / TP / 17 * 2`` B full (17 units per stage: 16
  transformer blocks plus the embedding or the output layer, torchtitan's wrapping), of which a
  rank holds ``1 / DP``.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lightrail.agents.replay.trace.model import (
    CommOp,
    Direction,
    SourceFormat,
    TraceError,
    Workload,
)
from lightrail.agents.replay.trace.opus_format import (
    OpusPhase,
    PatternFile,
    PhaseLabel,
    TimedFile,
    read_pattern_file,
    read_timed_file,
)
from lightrail.controller.domain.model import Collective, ProcessGroup

__all__ = [
    "GPUS_PER_NODE",
    "LLAMA3_8B",
    "ModelShape",
    "OpusExperiment",
    "StagePhase",
    "find_pattern_dir",
    "is_opus_folder",
    "read_opus",
]

GPUS_PER_NODE = 4
"""Perlmutter GPU nodes: 4 A100 per node, one Slingshot NIC each (README)."""
TP = 4
PP = 2
STEP_BACKEND = 6
"""The backend whose DP phase marks one training step (see the module docstring)."""

PATTERN_FILE_RE = re.compile(r"^comm_pattern_(\d+)_rank(\d+)\.txt$")
TIMED_FILE_RE = re.compile(r"_pp_([01])\.txt$")


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the message sizes are derived from (see the module docstring). Units: counts and
    bytes per element."""

    params: int
    dim: int
    seq: int
    microbatch: int
    local_batch: int
    bytes_per_elem: int
    fsdp_units_per_stage: int

    def pp_call_bytes(self) -> int:
        """Bytes of one PP send/recv: ``microbatch * seq * dim * bytes_per_elem``."""
        return self.microbatch * self.seq * self.dim * self.bytes_per_elem

    def dp_unit_bytes(self) -> int:
        """Full (gathered) bytes of one FSDP unit on one TP rank:
        ``params / PP / TP / units * bytes_per_elem``."""
        return self.params * self.bytes_per_elem // (PP * TP * self.fsdp_units_per_stage)


LLAMA3_8B = ModelShape(params=8_030_261_248, dim=4096, seq=8192, microbatch=4, local_batch=8,
                       bytes_per_elem=2, fsdp_units_per_stage=17)
"""Llama 3 8B as the Opus runs trained it (torchtitan ``llama3`` flavor 8B; README table)."""


@dataclass(frozen=True, slots=True)
class StagePhase:
    """One phase of a stage's step: ``label``, ``calls`` (the ``len`` field), ``idle_s``
    (idle gap before it, s) and ``span_s`` (its first call -> end of its last call, s)."""

    label: PhaseLabel
    calls: int
    idle_s: float
    span_s: float


@dataclass(frozen=True, slots=True)
class OpusExperiment:
    """A read experiment: ``nodes`` (4 GPUs each), per stage the step's phases
    (``stages[0]``, ``stages[1]``), ``step_s`` (per stage, the mean step period of its timed
    file, s; None without timed files), the files read and the assumptions made."""

    name: str
    nodes: int
    pattern_dir: Path
    timed_files: tuple[Path, ...]
    stages: tuple[tuple[StagePhase, ...], tuple[StagePhase, ...]]
    step_s: tuple[float | None, float | None]
    steps_averaged: tuple[int, int]
    phase_lines: tuple[int, int]
    model: ModelShape
    assumptions: tuple[str, ...]

    @property
    def world_size(self) -> int:
        return self.nodes * GPUS_PER_NODE

    @property
    def dp(self) -> int:
        return self.nodes // PP

    def stage_of_node(self, node: int) -> int:
        return node // self.dp

    def pp_group(self, rank: int) -> ProcessGroup:
        """The PP pair of ``rank``: itself and the same local rank on the node ``nodes / 2``
        away."""
        node = rank // GPUS_PER_NODE
        shift = self.dp * GPUS_PER_NODE
        peer = rank + shift if self.stage_of_node(node) == 0 else rank - shift
        return ProcessGroup.of([rank, peer])

    def dp_group(self, rank: int) -> ProcessGroup:
        """The DP (FSDP shard) group of ``rank``: its local rank on every node of its stage."""
        node, local = divmod(rank, GPUS_PER_NODE)
        first = self.stage_of_node(node) * self.dp
        return ProcessGroup.of([(first + n) * GPUS_PER_NODE + local for n in range(self.dp)])

    def _call(self, label: PhaseLabel, rank: int, stage: int, gap_s: float, *,
              closing: bool) -> CommOp:
        """One call of ``rank``: PP -> send/recv with its peer, DP -> all-gather of one FSDP
        unit's shard; ``closing``: the zero-byte call that ends a one-call phase's span."""
        if label is PhaseLabel.PP:
            pp = self.pp_group(rank)
            peer = next(r for r in pp.ranks if r != rank)
            return CommOp(Collective.SEND_RECV, pp, "pp",
                          0 if closing else self.model.pp_call_bytes(), gap_s,
                          direction=Direction.SEND if stage == 0 else Direction.RECV, peer=peer)
        return CommOp(Collective.ALL_GATHER, self.dp_group(rank), "dp",
                      0 if closing else self.model.dp_unit_bytes() // self.dp, gap_s)

    def workload(self, gap_scale: float = 1.0) -> Workload:
        """The job as a :class:`Workload`: every rank runs its stage's step (see the module
        docstring), compute gaps multiplied by ``gap_scale`` (> 0; a calibration factor, named
        in the assumptions when not 1)."""
        if not math.isfinite(gap_scale) or gap_scale <= 0:
            raise ValueError(f"gap_scale: must be finite and > 0, got {gap_scale}")
        ranks: dict[int, tuple[CommOp, ...]] = {}
        for rank in range(self.world_size):
            stage = self.stage_of_node(rank // GPUS_PER_NODE)
            ops: list[CommOp] = []
            for ph in self.stages[stage]:
                idle, span = ph.idle_s * gap_scale, ph.span_s * gap_scale
                ops.append(self._call(ph.label, rank, stage, idle, closing=False))
                if ph.calls > 1:
                    ops.extend(self._call(ph.label, rank, stage, span / (ph.calls - 1),
                                          closing=False) for _ in range(ph.calls - 1))
                elif span > 0:
                    ops.append(self._call(ph.label, rank, stage, span, closing=True))
            ranks[rank] = tuple(ops)
        notes = list(self.assumptions)
        if gap_scale != 1.0:
            notes.append(f"compute gaps scaled by {gap_scale:.4f} (calibration)")
        return Workload(self.name, SourceFormat.OPUS, self.world_size, ranks, tuple(notes),
                        iteration="one steady-state training step (see assumptions)")


# --- discovery -----------------------------------------------------------------------------


def _pattern_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.is_file() and PATTERN_FILE_RE.match(p.name))


def find_pattern_dir(path: Path) -> Path | None:
    """The per-rank pattern folder of ``path``: ``path`` itself when it holds
    ``comm_pattern_<N>_rank<M>.txt`` files, else its subfolder ``comm_pattern`` (the one the
    measured 16-GPU runs used, README), else its only ``comm_pattern*`` subfolder with such files;
    None when there is none. Raises ``TraceError`` when several candidates leave it ambiguous."""
    if not path.is_dir():
        return None
    if _pattern_files(path):
        return path
    subs = sorted(d for d in path.iterdir() if d.is_dir() and d.name.startswith("comm_pattern")
                  and _pattern_files(d))
    if not subs:
        return None
    exact = [d for d in subs if d.name == "comm_pattern"]
    if exact:
        return exact[0]
    if len(subs) > 1:
        raise TraceError(path, "pattern folder", [d.name for d in subs],
                         "several per-rank pattern folders and none named comm_pattern: give "
                         "the one to read")
    return subs[0]


def is_opus_folder(path: Path) -> bool:
    """True when ``path`` is an Opus experiment folder or per-rank pattern folder."""
    try:
        return find_pattern_dir(path) is not None
    except TraceError:
        return True


def _find_timed(pattern_dir: Path, root: Path) -> dict[int, Path]:
    """Timed files (``*_pp_0.txt``, ``*_pp_1.txt``) in ``root`` or, for a bare pattern folder,
    its parent; by stage."""
    where = [root] if root != pattern_dir else [pattern_dir, pattern_dir.parent]
    for d in where:
        found: dict[int, list[Path]] = {}
        for p in sorted(d.iterdir()) if d.is_dir() else []:
            m = TIMED_FILE_RE.search(p.name)
            if p.is_file() and m and not PATTERN_FILE_RE.match(p.name):
                found.setdefault(int(m.group(1)), []).append(p)
        if found:
            for stage, paths in found.items():
                if len(paths) > 1:
                    raise TraceError(d, f"timed file of stage {stage}",
                                     [p.name for p in paths], "more than one; keep one")
            return {s: ps[0] for s, ps in found.items()}
    return {}


# --- steps and calls -----------------------------------------------------------------------


Call = tuple[int, int]
"""(backend, call index)."""


def _calls(phases: Sequence[OpusPhase]) -> list[list[Call]]:
    """Each phase's calls in order, without the stale ``end_backend`` (module docstring)."""
    last5 = -1
    out: list[list[Call]] = []
    for ph in phases:
        b, s, n = ph.start_backend, ph.start_idx, ph.length
        if ph.label is PhaseLabel.DP and b == STEP_BACKEND:
            m5 = ph.end_idx - last5
            if 1 <= m5 < n and ph.end_idx > last5 >= 0:
                calls = [(b, s + i) for i in range(n - m5)]
                calls += [(5, last5 + 1 + i) for i in range(m5)]
            else:
                calls = [(b, s + i) for i in range(n)]
        else:
            calls = [(b, s + i) for i in range(n)]
        for cb, ci in calls:
            if cb == 5:
                last5 = max(last5, ci)
        out.append(calls)
    return out


def _steps(phases: Sequence[OpusPhase]) -> dict[int, tuple[int, int]]:
    """Complete steps: key (start index of the closing step-marking phase on backend 6) ->
    (index of its first phase, index of its closing phase) in ``phases``."""
    marks = [i for i, ph in enumerate(phases)
             if ph.label is PhaseLabel.DP and ph.start_backend == STEP_BACKEND]
    return {phases[b].start_idx: (a + 1, b) for a, b in itertools.pairwise(marks)}


Where = tuple[int, int, int]
"""A call's (phase index, position in the phase, calls in the phase)."""


@dataclass(frozen=True, slots=True)
class _StepCalls:
    """Per (step key, backend): call index -> where it is, and the step's index range."""

    at: Mapping[tuple[int, int], Mapping[int, Where]]
    span: Mapping[tuple[int, int], tuple[int, int]]


def _step_calls(calls: Sequence[Sequence[Call]],
                steps: Mapping[int, tuple[int, int]]) -> _StepCalls:
    at: dict[tuple[int, int], dict[int, Where]] = {}
    for key, (a, b) in steps.items():
        for pi in range(a, b + 1):
            for pos, (backend, idx) in enumerate(calls[pi]):
                at.setdefault((key, backend), {})[idx] = (pi, pos, len(calls[pi]))
    return _StepCalls(at, {k: (min(v), max(v)) for k, v in at.items()})


@dataclass(frozen=True, slots=True)
class _Timeline:
    """The timed file's calls by step and backend (``_StepCalls``) and its phases."""

    phases: tuple[OpusPhase, ...]
    calls: _StepCalls

    def call_time(self, key: int, backend: int, idx: int, lo: int, hi: int, *,
                  end: bool) -> float:
        """Start (or end) time in ms of the pattern call ``idx`` on ``backend`` in step
        ``key`` whose calls there span ``lo..hi``: the timed call at the same offset in the
        timed step's range (scaled when the ranges differ; the nearest call the timed file
        has). KeyError when the timed file has no such step or backend."""
        at = self.calls.at[(key, backend)]
        tlo, thi = self.calls.span[(key, backend)]
        target = tlo + ((idx - lo) * (thi - tlo + 1)) // (hi - lo + 1)
        near = target if target in at else min(at, key=lambda i: (abs(i - target), i))
        pi, pos, n = at[near]
        ph = self.phases[pi]
        assert ph.start_ms is not None and ph.end_ms is not None
        s, e = ph.start_ms, max(ph.start_ms, ph.end_ms)
        return s + (e - s) * (pos + (1 if end else 0)) / n


def _timeline(tf: TimedFile) -> _Timeline:
    return _Timeline(tf.phases, _step_calls(_calls(tf.phases), _steps(tf.phases)))


def _step_period_s(tf: TimedFile) -> float | None:
    starts = [ph.start_ms for ph in tf.phases
              if ph.label is PhaseLabel.DP and ph.start_backend == STEP_BACKEND
              and ph.start_ms is not None]
    if len(starts) < 2:
        return None
    return (starts[-1] - starts[0]) / (len(starts) - 1) / 1e3


# --- reading -------------------------------------------------------------------------------


def _read_patterns(pattern_dir: Path) -> dict[tuple[int, int], PatternFile]:
    files: dict[tuple[int, int], PatternFile] = {}
    for p in _pattern_files(pattern_dir):
        m = PATTERN_FILE_RE.match(p.name)
        assert m is not None
        node, local = int(m.group(1)), int(m.group(2))
        pf = read_pattern_file(p)
        if pf.local_rank != local:
            raise TraceError(p, "Rank", pf.local_rank, f"the file name says local rank {local}",
                             line=1)
        files[(node, local)] = pf
    nodes = 1 + max(n for n, _ in files)
    missing = [f"comm_pattern_{n}_rank{r}.txt" for n in range(nodes)
               for r in range(GPUS_PER_NODE) if (n, r) not in files]
    extra = [k for k in files if k[1] >= GPUS_PER_NODE]
    if extra:
        raise TraceError(pattern_dir, "local rank", extra[0][1],
                         f"Perlmutter nodes have {GPUS_PER_NODE} GPUs (local ranks 0..3)")
    if missing:
        raise TraceError(pattern_dir, "files", missing[:4],
                         f"missing for {nodes} nodes x {GPUS_PER_NODE} ranks")
    if nodes % PP or nodes < PP:
        raise TraceError(pattern_dir, "nodes", nodes,
                         f"PP {PP} needs an even number of nodes (TP4 x PP2 x DP)")
    return files


def _signature(ph: OpusPhase) -> tuple[PhaseLabel, int, int, int, int]:
    return (ph.label, ph.start_backend, ph.start_idx, ph.end_idx, ph.length)


def _stage_body(files: Mapping[tuple[int, int], PatternFile], nodes: int,
                stage: int) -> PatternFile:
    """The body every rank of ``stage`` shares (README); TraceError naming the first file that
    differs."""
    dp = nodes // PP
    members = [files[(n, r)] for n in range(stage * dp, (stage + 1) * dp)
               for r in range(GPUS_PER_NODE)]
    ref = members[0]
    sig = [_signature(p) for p in ref.phases]
    for pf in members[1:]:
        other = [_signature(p) for p in pf.phases]
        if other != sig:
            i = next((k for k, (a, b) in enumerate(zip(sig, other, strict=False)) if a != b),
                     min(len(sig), len(other)))
            line = pf.phases[i].line if i < len(pf.phases) else None
            raise TraceError(pf.path, "phase", i + 1,
                             f"differs from {ref.path.name} (every rank of pipeline stage "
                             f"{stage} must run the same pattern)", line=line)
    return ref


def _structure(phases: Sequence[OpusPhase], a: int, b: int) -> tuple[tuple[PhaseLabel, int], ...]:
    return tuple((phases[i].label, phases[i].length) for i in range(a, b + 1))


def _stage_template(
    body: PatternFile, timed: TimedFile | None, stage: int, notes: list[str]
) -> tuple[tuple[StagePhase, ...], int]:
    """The stage's step: phases with idle gaps and spans averaged over the complete steps that
    the timed file covers (zeros without a timed file); and how many steps were averaged."""
    phases = body.phases
    steps = _steps(phases)
    if not steps:
        raise TraceError(body.path, "phase", None,
                         f"fewer than two DP phases on backend {STEP_BACKEND}: no complete "
                         "training step to take")
    shapes = Counter(_structure(phases, a, b) for a, b in steps.values())
    shape, _ = shapes.most_common(1)[0]
    keys = [k for k, (a, b) in sorted(steps.items()) if _structure(phases, a, b) == shape]
    if len(shapes) > 1:
        notes.append(f"stage {stage}: {len(steps) - len(keys)} of {len(steps)} steps differ "
                     "from the most common phase sequence and are left out")
    if timed is None:
        return tuple(StagePhase(lab, n, 0.0, 0.0) for lab, n in shape), 0
    tl = _timeline(timed)
    calls = _calls(phases)
    mine = _step_calls(calls, steps)

    def when(key: int, pi: int, pos: int, *, end: bool) -> float:
        backend, idx = calls[pi][pos]
        lo, hi = mine.span[(key, backend)]
        return tl.call_time(key, backend, idx, lo, hi, end=end)

    idle = [0.0] * len(shape)
    span = [0.0] * len(shape)
    used = negative = 0
    closing = {b: k for k, (_, b) in steps.items()}
    for key in keys:
        a, b = steps[key]
        prev = closing.get(a - 1)
        if prev is None:
            continue
        try:
            prev_end = when(prev, a - 1, len(calls[a - 1]) - 1, end=True)
            row_idle, row_span = [], []
            for pi in range(a, b + 1):
                start = when(key, pi, 0, end=False)
                stop = when(key, pi, len(calls[pi]) - 1, end=True)
                if start < prev_end:
                    negative += 1
                row_idle.append(max(0.0, start - prev_end))
                row_span.append(max(0.0, stop - start))
                prev_end = max(prev_end, stop)
        except KeyError:
            continue
        used += 1
        idle = [x + y for x, y in zip(idle, row_idle, strict=True)]
        span = [x + y for x, y in zip(span, row_span, strict=True)]
    if used == 0:
        notes.append(f"stage {stage}: the timed file {timed.path.name} covers none of the "
                     "pattern's steps: compute gaps 0")
        return tuple(StagePhase(lab, n, 0.0, 0.0) for lab, n in shape), 0
    if negative:
        notes.append(f"stage {stage}: {negative} mapped phase starts fell before the previous "
                     "phase's end (calls mapped across runs): idle gap taken as 0 there")
    return tuple(StagePhase(lab, n, idle[i] / used / 1e3, span[i] / used / 1e3)
                 for i, (lab, n) in enumerate(shape)), used


def read_opus(path: Path) -> OpusExperiment:
    """Read an Opus experiment folder or per-rank pattern folder (module docstring).

    Raises ``TraceError`` (naming file, line, field and value) for a missing or malformed file,
    ranks of one stage whose patterns differ, or a pattern without a complete step; ``OSError``
    when a file cannot be read."""
    path = Path(path)
    pattern_dir = find_pattern_dir(path)
    if pattern_dir is None:
        raise TraceError(path, "path", str(path),
                         "no comm_pattern_<N>_rank<M>.txt files here or in a comm_pattern* "
                         "subfolder")
    files = _read_patterns(pattern_dir)
    nodes = 1 + max(n for n, _ in files)
    timed_paths = _find_timed(pattern_dir, path)
    timed = {s: read_timed_file(p) for s, p in timed_paths.items()}
    dp = nodes // PP
    notes = [
        f"Opus pattern folder {pattern_dir.name}: {nodes} nodes x {GPUS_PER_NODE} GPUs, "
        f"TP {TP} (NVLink, not in the patterns) x PP {PP} x DP {dp}; global rank = node * 4 + "
        "local rank; nodes 0.." f"{dp - 1} are stage 0 (README)",
        "one iteration = one steady-state training step (between two DP phases that start on "
        "backend 6); the warm-up step is dropped",
        f"message sizes derived, not recorded: PP call {LLAMA3_8B.pp_call_bytes():,} B "
        "(microbatch 4 x seq 8192 x dim 4096 x 2 B bf16, unsharded by TP); DP call: one FSDP "
        f"unit of {LLAMA3_8B.dp_unit_bytes():,} B gathered over DP (8,030,261,248 params / PP 2 "
        "/ TP 4 / 17 units x 2 B), each rank holding 1/DP; every DP call priced as an "
        "all-gather",
    ]
    if not timed:
        notes.append("no timed files (*_pp_0.txt, *_pp_1.txt) beside the patterns: compute "
                     "gaps are 0")
    stages: list[tuple[StagePhase, ...]] = []
    used: list[int] = []
    lines: list[int] = []
    for stage in range(PP):
        body = _stage_body(files, nodes, stage)
        lines.append(len(body.phases))
        tf = timed.get(stage)
        if timed and tf is None:
            notes.append(f"no timed file for stage {stage}: its compute gaps are 0")
        template, n = _stage_template(body, tf, stage, notes)
        stages.append(template)
        used.append(n)
        if tf is not None:
            notes.append(f"stage {stage}: compute gaps from {tf.path.name}, averaged over {n} "
                         "steps; calls mapped by step and call index on their backend (scaled "
                         "to the timed step's index range where it differs)")
    periods = tuple(_step_period_s(timed[s]) if s in timed else None for s in range(PP))
    name = Path(os.path.abspath(path)).name  # '.' and 'x/' have a name too (no symlink resolved)
    return OpusExperiment(
        name=name, nodes=nodes, pattern_dir=pattern_dir,
        timed_files=tuple(timed_paths[s] for s in sorted(timed_paths)),
        stages=(stages[0], stages[1]), step_s=(periods[0], periods[1]),
        steps_averaged=(used[0], used[1]), phase_lines=(lines[0], lines[1]),
        model=LLAMA3_8B, assumptions=tuple(notes))
