"""The Opus artifact's latency CSVs: measured iteration time per run.

Source: ``../shared/data/traces/opus-perlmutter/README.md`` ("Latency CSVs"). Header
``Experiment,Min latency (s),Average Latency (s),Standard Deviation (s)``, one row per run, CRLF
line ends. Each value is over 6 step-to-step intervals (steps 4..10) of one node's log, seconds
per training iteration. ``Experiment`` is the run's output directory name: ``no-controller`` or
``no-ctl`` (reference run, no pattern loaded), else ``l_<N>`` (emulated reconfiguration delay of
N ms) with ``baseline`` (on-demand) or ``provision`` (provisioning). File names differ between
the folders (16 GPUs: ``latency_results_provision_v3_baseline.csv``,
``..._v5_provision.csv``; 64 GPUs: ``latency_results_baseline.csv``,
``latency_results_provision.csv``): the mode is read from each row, not the file name.
"""

from __future__ import annotations

import csv
import enum
import io
import re
from dataclasses import dataclass
from pathlib import Path

from lightrail.agents.replay.trace.model import TraceError, non_negative_float

__all__ = ["LatencyRow", "LatencyTable", "RunMode", "read_latency_csv", "read_latency_folder"]

LATENCY_PREFIX = "latency_results"
"""How the artifact names its latency CSVs (README "Contents"): such a file must be one."""
HEADER = ("Experiment", "Min latency (s)", "Average Latency (s)", "Standard Deviation (s)")
_DELAY_RE = re.compile(r"(?:^|-)l_(\d+)(?:-|$)")
_NO_CTL_RE = re.compile(r"(?:^|-)(no-controller|no-ctl)(?:-|$)")
_MODE_RE = re.compile(r"(?:^|-)(baseline|provision)(?:-|$)")


class RunMode(enum.Enum):
    """What the run measured."""

    NO_CONTROLLER = "no_controller"
    ON_DEMAND = "on_demand"
    """``baseline``: the topology is requested at the phase boundary."""
    PROVISIONING = "provisioning"
    """``provision``: the next topology is requested early."""


@dataclass(frozen=True, slots=True)
class LatencyRow:
    """One run: ``mode``, ``delay_ms`` (None for no-controller), seconds per iteration
    (``min_s``, ``mean_s``, ``std_s``), the ``experiment`` name, ``source`` file and ``line``."""

    experiment: str
    mode: RunMode
    delay_ms: float | None
    min_s: float
    mean_s: float
    std_s: float
    source: Path
    line: int


@dataclass(frozen=True, slots=True)
class LatencyTable:
    """The rows of one or more CSVs: ``no_controller`` (the reference run; rows of several files
    must agree) and, per mode, delay (ms) -> row."""

    no_controller: LatencyRow
    on_demand: dict[float, LatencyRow]
    provisioning: dict[float, LatencyRow]

    def delays_ms(self) -> tuple[float, ...]:
        """Every δ measured in either mode, ascending."""
        return tuple(sorted(set(self.on_demand) | set(self.provisioning)))


def _row(path: Path, line: int, cells: list[str]) -> LatencyRow:
    if len(cells) != len(HEADER):
        raise TraceError(path, "row", cells, f"expected {len(HEADER)} columns", line=line)
    name = cells[0].strip()
    if _NO_CTL_RE.search(name):
        mode, delay = RunMode.NO_CONTROLLER, None
    else:
        m = _MODE_RE.search(name)
        d = _DELAY_RE.search(name)
        if m is None:
            raise TraceError(path, "Experiment", name, "neither no-controller/no-ctl nor "
                             "baseline/provision", line=line)
        if d is None:
            raise TraceError(path, "Experiment", name, "no l_<N> delay (ms) in the name",
                             line=line)
        mode = RunMode.ON_DEMAND if m.group(1) == "baseline" else RunMode.PROVISIONING
        delay = float(d.group(1))
    lo = non_negative_float(path, line, HEADER[1], cells[1], "s")
    mean = non_negative_float(path, line, HEADER[2], cells[2], "s")
    std = non_negative_float(path, line, HEADER[3], cells[3], "s")
    if lo > mean:
        raise TraceError(path, HEADER[1], lo, f"above the average {mean}", line=line)
    return LatencyRow(name, mode, delay, lo, mean, std, path, line)


def read_latency_csv(path: Path) -> list[LatencyRow]:
    """The rows of one latency CSV (CRLF or LF). Raises ``TraceError`` (file, line, field,
    value) for a wrong header, a row of the wrong width, a name without mode or delay, a
    non-numeric or negative time, a minimum above the average, or the same mode and δ twice."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceError(path, "encoding", exc.reason, "not UTF-8 text") from None
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if not rows or tuple(c.strip() for c in rows[0]) != HEADER:
        raise TraceError(path, "header", rows[0] if rows else "", f"expected {','.join(HEADER)}",
                         line=1)
    out: list[LatencyRow] = []
    seen: dict[tuple[RunMode, float | None], int] = {}
    for i, cells in enumerate(rows[1:], start=2):
        if not cells or all(not c.strip() for c in cells):
            continue
        r = _row(path, i, cells)
        key = (r.mode, r.delay_ms)
        if key in seen:
            raise TraceError(path, "Experiment", r.experiment,
                             f"same mode and delay as line {seen[key]}", line=i)
        seen[key] = i
        out.append(r)
    return out


def read_latency_folder(folder: Path) -> LatencyTable | None:
    """Every ``*.csv`` of ``folder`` with the latency header or named ``latency_results*``
    (as both artifact folders name theirs), merged; None when there is none. Raises
    ``TraceError`` as :func:`read_latency_csv` (so an empty ``latency_results*.csv``, or one
    with another header, is an error, not a file left out), when no no-controller row is found,
    when two files' no-controller rows disagree, or when two files measure the same mode and
    δ."""
    files = sorted(p for p in folder.glob("*.csv") if p.is_file())
    rows: list[LatencyRow] = []
    for p in files:
        with p.open("rb") as f:
            first = f.readline().decode("utf-8-sig", errors="replace").strip()
        if first.startswith(HEADER[0] + ",") or p.name.startswith(LATENCY_PREFIX):
            rows.extend(read_latency_csv(p))
    if not rows:
        return None
    ref = [r for r in rows if r.mode is RunMode.NO_CONTROLLER]
    if not ref:
        raise TraceError(folder, "Experiment", [p.name for p in files],
                         "no no-controller / no-ctl row in the latency CSVs")
    for r in ref[1:]:
        if (r.min_s, r.mean_s, r.std_s) != (ref[0].min_s, ref[0].mean_s, ref[0].std_s):
            raise TraceError(r.source, "Average Latency (s)", r.mean_s,
                             f"no-controller row differs from {ref[0].source.name}:"
                             f"{ref[0].line}", line=r.line)
    by: dict[RunMode, dict[float, LatencyRow]] = {RunMode.ON_DEMAND: {},
                                                  RunMode.PROVISIONING: {}}
    for r in rows:
        if r.mode is RunMode.NO_CONTROLLER:
            continue
        assert r.delay_ms is not None
        prev = by[r.mode].get(r.delay_ms)
        if prev is not None:
            raise TraceError(r.source, "Experiment", r.experiment,
                             f"{r.mode.value} at {r.delay_ms:g} ms also in "
                             f"{prev.source.name}:{prev.line}", line=r.line)
        by[r.mode][r.delay_ms] = r
    return LatencyTable(ref[0], by[RunMode.ON_DEMAND], by[RunMode.PROVISIONING])
