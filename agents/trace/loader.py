"""Pick the reader for a trace or workload file by its shape.

=========================================  ==============================
input                                      reader
=========================================  ==============================
directory of ``*.json`` / ``*.json.gz``    :func:`~agents.trace.kineto.read_kineto`
``*.tar.gz`` / ``*.tgz`` / ``*.tar``       :func:`~agents.trace.kineto.read_kineto`
``*.json`` / ``*.json.gz``                 :func:`~agents.trace.kineto.read_kineto`
``*.csv``                                  :func:`~agents.trace.aicb.read_aicb_csv`
``*.txt``                                  :func:`~agents.trace.aicb.read_simai`
=========================================  ==============================
"""

from __future__ import annotations

from pathlib import Path

from agents.trace.aicb import read_aicb_csv, read_simai
from agents.trace.kineto import read_kineto
from agents.trace.model import TraceError, Workload

__all__ = ["load_workload"]

_KINETO_SUFFIXES = (".json", ".json.gz", ".tar.gz", ".tgz", ".tar")


def load_workload(path: Path, *, world_size: int | None = None) -> Workload:
    """Read any supported trace or workload into a :class:`Workload`.

    ``world_size`` is passed to the SimAI reader for headers without ``all_gpus``; other
    formats record it themselves and ignore it. Raises :class:`TraceError` for a path that
    does not exist, a format it does not know, or any error of the chosen reader.
    """
    path = Path(path)
    name = path.name.lower()
    if path.is_dir():
        return read_kineto(path)
    if not path.is_file():
        raise TraceError(path, "path", str(path), "no such file or directory")
    if name.endswith(_KINETO_SUFFIXES):
        return read_kineto(path)
    if name.endswith(".csv"):
        return read_aicb_csv(path)
    if name.endswith(".txt"):
        return read_simai(path, world_size=world_size)
    raise TraceError(
        path, "format", path.suffix,
        "unknown format: expected a Kineto trace (directory, .tar.gz, .json, .json.gz), "
        "an AICB .csv or a SimAI .txt",
    )
