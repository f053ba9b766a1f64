"""The Opus artifact's phase-pattern files: per-rank pattern files and timed pattern files.

Source: ``opusfabric/Opus`` (``evaluation/llama-3-3d-*-latency/``), as described in
``../shared/data/traces/opus-perlmutter/README.md`` ("File formats"). This module only parses;
:mod:`lightrail.agents.replay.trace.opus` turns the phases into a :class:`Workload`.

Per-rank pattern file (``comm_pattern_<N>_rank<M>.txt``): a header
``Node: <X>, Rank: <M>, Tid: <tid>``, then one line per phase
``<PP|DP> start_backend: <b0> start_idx: <i0> end_backend: <b1> end_idx: <i1> len: <n>``.
Lines starting with ``N`` or ``#`` and empty lines are skipped, as the Opus shim skips them.

Timed pattern file (``*_pp_0.txt``, ``*_pp_1.txt``): no header; each phase line adds
``, start_time: <t0>, end_time: <t1>`` (ms since local midnight). ``_pp_1`` ends with
``Backend: 1, Idx: <k>, Min Gap: <g> ms`` lines and four summary lines (mean, population
standard deviation, minimum, maximum of those gaps, ms). Known quirks, accepted here and
handled by the workload builder: ``end_backend`` is stale (not reset at a new phase), and
``end_time`` can be smaller than ``start_time``.

Backends (README, "How the patterns were produced"): 1 = PP; 2, 5, 6 = DP (FSDP); 0 (default
group) and 3 (TP) were dropped by the notebook.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from pathlib import Path

from lightrail.agents.replay.trace.model import (
    MAX_OPS_PER_ITERATION,
    TraceError,
    non_negative_float,
)

__all__ = [
    "DP_BACKENDS",
    "PP_BACKENDS",
    "MinGap",
    "OpusPhase",
    "PatternFile",
    "PhaseLabel",
    "TimedFile",
    "read_pattern_file",
    "read_timed_file",
]

PP_BACKENDS = frozenset({1})
"""Backend ids the notebook labels PP."""
DP_BACKENDS = frozenset({2, 5, 6})
"""Backend ids the notebook labels DP."""
MS_PER_DAY = 86_400_000.0
"""Timestamps are ms since local midnight: anything at or beyond a day is corrupt."""
MAX_CALL_INDEX = 10_000_000
"""The largest call index accepted (a 10-step run makes under 1,000 calls per backend)."""

_PHASE_RE = re.compile(
    r"^(?P<label>\S+) start_backend: (?P<start_backend>\S+) start_idx: (?P<start_idx>\S+) "
    r"end_backend: (?P<end_backend>\S+) end_idx: (?P<end_idx>\S+) len: (?P<len>[^,\s]+)"
    r"(?:, start_time: (?P<start_time>\S+), end_time: (?P<end_time>\S+))?$")
_HEADER_RE = re.compile(r"^Node: (?P<node>[^,]+), Rank: (?P<rank>\S+), Tid: (?P<tid>\S+)$")
_MIN_GAP_RE = re.compile(r"^Backend: (?P<backend>\S+), Idx: (?P<idx>\S+), "
                         r"Min Gap: (?P<gap>\S+) ms$")
_SUMMARY_RE = re.compile(r"^(?P<what>Average time gap|Standard deviation|Minimum time gap|"
                         r"Maximum time gap): (?P<value>\S+) ms$")
_SUMMARY_KEYS = {"Average time gap": "mean", "Standard deviation": "std",
                 "Minimum time gap": "min", "Maximum time gap": "max"}


class PhaseLabel(enum.Enum):
    """The notebook's label of a phase."""

    PP = "PP"
    DP = "DP"


@dataclass(frozen=True, slots=True)
class OpusPhase:
    """One phase line. ``end_backend`` is as recorded (stale in timed files, see the module
    docstring); ``length`` is the ``len`` field (calls on backends 1/2/5/6); ``line`` is the
    1-based line number; ``start_ms``/``end_ms`` are the timed files' times (None in per-rank
    pattern files)."""

    label: PhaseLabel
    start_backend: int
    start_idx: int
    end_backend: int
    end_idx: int
    length: int
    line: int
    start_ms: float | None = None
    end_ms: float | None = None


@dataclass(frozen=True, slots=True)
class PatternFile:
    """A per-rank pattern file: ``node`` (the header's ``Node``: a hostname or an index),
    ``local_rank`` (the header's ``Rank``), ``tid``, and its phases in order."""

    path: Path
    node: str
    local_rank: int
    tid: int
    phases: tuple[OpusPhase, ...]


@dataclass(frozen=True, slots=True)
class MinGap:
    """One ``Backend: b, Idx: k, Min Gap: g ms`` line of a ``_pp_1`` file."""

    backend: int
    idx: int
    gap_ms: float


@dataclass(frozen=True, slots=True)
class TimedFile:
    """A timed pattern file: its phases (with times) and, for ``_pp_1``, the min-gap lines and
    the summary (``mean``, ``std``, ``min``, ``max`` in ms; empty when absent)."""

    path: Path
    phases: tuple[OpusPhase, ...]
    min_gaps: tuple[MinGap, ...]
    summary: dict[str, float]


def _int(path: Path, line: int, name: str, text: str, lo: int = 0,
         hi: int = MAX_CALL_INDEX) -> int:
    try:
        v = int(text)
    except ValueError:
        raise TraceError(path, name, text, "not an integer", line=line) from None
    if not lo <= v <= hi:
        raise TraceError(path, name, v, f"outside {lo}..{hi}", line=line)
    return v


def _ms(path: Path, line: int, name: str, text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise TraceError(path, name, text, "not a number (ms)", line=line) from None
    if not math.isfinite(v) or not 0 <= v < MS_PER_DAY:
        raise TraceError(path, name, v, "not a time of day in ms (0 <= t < 86,400,000)",
                         line=line)
    return v


def parse_phase_line(path: Path, line: int, text: str, *, timed: bool) -> OpusPhase:
    """One phase line of ``path`` (1-based ``line``). ``timed``: the line must carry
    ``start_time``/``end_time`` (timed files) or must not (per-rank pattern files).

    Checks (TraceError naming the field and value): label PP/DP; backends of the label
    (``start_backend`` PP: 1, DP: 2/5/6; ``end_backend`` any of 1/2/5/6, stale in timed
    files); indices and ``len`` non-negative integers, 1 <= ``len`` <=
    ``MAX_OPS_PER_ITERATION`` (a phase is part of one step); in pattern files, a phase
    that starts and ends on one backend has ``end_idx - start_idx + 1 == len``; in either, a PP
    phase (one backend) has ``end_idx - start_idx + 1 == len``.
    """
    m = _PHASE_RE.match(text)
    if m is None:
        raise TraceError(path, "phase", text, "not a phase line '<PP|DP> start_backend: B "
                         "start_idx: I end_backend: B end_idx: I len: N"
                         + (", start_time: T, end_time: T'" if timed else "'"), line=line)
    try:
        label = PhaseLabel(m["label"])
    except ValueError:
        raise TraceError(path, "label", m["label"], "expected PP or DP", line=line) from None
    sb = _int(path, line, "start_backend", m["start_backend"], 0, 99)
    allowed = PP_BACKENDS if label is PhaseLabel.PP else DP_BACKENDS
    if sb not in allowed:
        raise TraceError(path, "start_backend", sb, f"a {label.value} phase starts on backend "
                         f"{'/'.join(map(str, sorted(allowed)))}", line=line)
    eb = _int(path, line, "end_backend", m["end_backend"], 0, 99)
    if eb not in PP_BACKENDS | DP_BACKENDS:
        raise TraceError(path, "end_backend", eb, "not a PP/DP backend (1, 2, 5, 6)", line=line)
    si = _int(path, line, "start_idx", m["start_idx"])
    ei = _int(path, line, "end_idx", m["end_idx"])
    n = _int(path, line, "len", m["len"], 1, MAX_OPS_PER_ITERATION)  # calls of one step
    one_backend = label is PhaseLabel.PP or (not timed and eb == sb)
    if one_backend and ei - si + 1 != n:
        raise TraceError(path, "len", n, f"calls {si}..{ei} on one backend are "
                         f"{ei - si + 1}, not {n}", line=line)
    has_times = m["start_time"] is not None
    if has_times != timed:
        raise TraceError(path, "start_time", m["start_time"],
                         "a timed file needs start_time/end_time on every phase line" if timed
                         else "a per-rank pattern file has no times (is this a timed file?)",
                         line=line)
    t0 = _ms(path, line, "start_time", m["start_time"]) if has_times else None
    t1 = _ms(path, line, "end_time", m["end_time"]) if has_times else None
    return OpusPhase(label, sb, si, eb, ei, n, line, t0, t1)


def _lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(path, "encoding", exc.reason, "not UTF-8 text") from None
    return text.splitlines()


def read_pattern_file(path: Path) -> PatternFile:
    """Read a per-rank pattern file (see the module docstring). Raises ``TraceError`` for a
    missing or malformed header, a bad phase line or a file without phases; ``OSError`` when
    it cannot be read."""
    lines = _lines(path)
    if not lines:
        raise TraceError(path, "header", "", "empty file: expected 'Node: X, Rank: M, Tid: T'",
                         line=1)
    h = _HEADER_RE.match(lines[0].strip())
    if h is None:
        raise TraceError(path, "header", lines[0], "expected 'Node: X, Rank: M, Tid: T'", line=1)
    local = _int(path, 1, "Rank", h["rank"], 0, 1023)
    tid = _int(path, 1, "Tid", h["tid"], 0, 2**64 - 1)
    phases: list[OpusPhase] = []
    for i, raw in enumerate(lines[1:], start=2):
        s = raw.strip()
        if not s or s.startswith(("N", "#")):
            continue
        phases.append(parse_phase_line(path, i, s, timed=False))
    if not phases:
        raise TraceError(path, "phase", None, "no phase lines after the header")
    return PatternFile(path, h["node"].strip(), local, tid, tuple(phases))


def read_timed_file(path: Path) -> TimedFile:
    """Read a timed pattern file (see the module docstring): phase lines, then optionally the
    min-gap and summary lines (no phase line may follow them). Raises ``TraceError`` for a bad
    line or a file without phases; ``OSError`` when it cannot be read."""
    phases: list[OpusPhase] = []
    gaps: list[MinGap] = []
    summary: dict[str, float] = {}
    for i, raw in enumerate(_lines(path), start=1):
        s = raw.strip()
        if not s:
            continue
        if g := _MIN_GAP_RE.match(s):
            if summary:
                raise TraceError(path, "Min Gap", s, "a min-gap line after the summary", line=i)
            gaps.append(MinGap(_int(path, i, "Backend", g["backend"], 0, 99),
                               _int(path, i, "Idx", g["idx"]),
                               non_negative_float(path, i, "Min Gap", g["gap"], "ms")))
            continue
        if sm := _SUMMARY_RE.match(s):
            summary[_SUMMARY_KEYS[sm["what"]]] = non_negative_float(
                path, i, sm["what"], sm["value"], "ms")
            continue
        if gaps or summary:
            raise TraceError(path, "phase", s, "a phase line after the gap statistics", line=i)
        phases.append(parse_phase_line(path, i, s, timed=True))
    if not phases:
        raise TraceError(path, "phase", None, "no timed phase lines")
    return TimedFile(path, tuple(phases), tuple(gaps), summary)
