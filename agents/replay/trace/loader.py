"""Pick the reader for a trace or workload file by its shape.

=========================================  ==============================
input                                      reader
=========================================  ==============================
Opus experiment / pattern folder           :func:`~lightrail.agents.replay.trace.opus.read_opus`
directory of ``*.json`` / ``*.json.gz``    :func:`~lightrail.agents.replay.trace.kineto.read_kineto`
``*.tar.gz`` / ``*.tgz`` / ``*.tar``       :func:`~lightrail.agents.replay.trace.kineto.read_kineto`
``*.json`` / ``*.json.gz``                 :func:`~lightrail.agents.replay.trace.kineto.read_kineto`
``*.csv``                                  :func:`~lightrail.agents.replay.trace.aicb.read_aicb_csv`
``*.txt``                                  :func:`~lightrail.agents.replay.trace.simai.read_simai`
=========================================  ==============================
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from lightrail.agents.replay.trace.aicb import read_aicb_csv
from lightrail.agents.replay.trace.kineto import read_kineto
from lightrail.agents.replay.trace.model import TraceError, Workload
from lightrail.agents.replay.trace.opus import is_opus_folder, read_opus
from lightrail.agents.replay.trace.simai import read_simai

__all__ = ["load_workload"]

_KINETO_SUFFIXES = (".json", ".json.gz", ".tar.gz", ".tgz", ".tar")


_RANK_RANGE = re.compile(r"^\[rank(\d+)\s*~\s*rank(\d+)\]\s*$")


def _header_has_world(path: Path) -> bool:
    with path.open(encoding="utf-8", errors="replace") as f:
        return "all_gpus" in f.readline()


def sibling_csv_world_size(path: Path) -> int | None:
    """World size of the AICB CSV beside a SimAI file, or None.

    AICB writes the SimAI workload of a model next to its physical CSV, named with the CSV's
    stem plus a suffix (``X.csv`` and ``X_A100.txt``); the CSV's first line ``[rank0 ~ rankN]``
    gives the world size that older SimAI headers lack. Only a CSV whose stem prefixes the
    text file's stem is used; with several, the longest stem wins.
    """
    best: tuple[int, int] | None = None
    for csv in path.parent.glob("*.csv"):
        if not path.stem.startswith(csv.stem):
            continue
        with csv.open(encoding="utf-8", errors="replace") as f:
            m = _RANK_RANGE.match(f.readline())
        if m is not None:
            cand = (len(csv.stem), int(m.group(2)) - int(m.group(1)) + 1)
            best = cand if best is None or cand > best else best
    return best[1] if best is not None else None


def load_workload(path: Path, *, world_size: int | None = None) -> Workload:
    """Read any supported trace or workload into a :class:`Workload`.

    ``world_size`` is passed to the SimAI reader for headers without ``all_gpus`` (when not
    given, it is taken from the AICB CSV beside the file: ``sibling_csv_world_size``); other
    formats record it themselves and ignore it. Raises :class:`TraceError` for a path that
    does not exist, a format it does not know, or any error of the chosen reader.
    """
    path = Path(path)
    name = path.name.lower()
    if path.is_dir():
        if is_opus_folder(path):
            return read_opus(path).workload()
        return read_kineto(path)
    if not path.is_file():
        raise TraceError(path, "path", str(path), "no such file or directory")
    if name.endswith(_KINETO_SUFFIXES):
        return read_kineto(path)
    if name.endswith(".csv"):
        return read_aicb_csv(path)
    if name.endswith(".txt"):
        if world_size is None and not _header_has_world(path):
            world_size = sibling_csv_world_size(path)
            if world_size is not None:
                w = read_simai(path, world_size=world_size)
                note = (f"world size {world_size} taken from the AICB CSV beside the file "
                        "(the SimAI header has no all_gpus)")
                return dataclasses.replace(w, assumptions=(*w.assumptions, note))
        return read_simai(path, world_size=world_size)
    raise TraceError(
        path, "format", path.suffix,
        "unknown format: expected a Kineto trace (directory, .tar.gz, .json, .json.gz), "
        "an AICB .csv or a SimAI .txt",
    )
