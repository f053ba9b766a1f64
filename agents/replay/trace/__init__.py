"""Trace readers: real traces and generated schedules -> per-rank collective sequences.

``load_workload(path)`` reads PyTorch profiler (Kineto) traces, AICB workload CSVs and SimAI
workload text into a :class:`Workload`: for each rank, the collectives (:class:`CommOp`) of one
iteration with the compute gap before each, and the assumptions the reader had to make.
"""

from lightrail.agents.replay.trace.aicb import (
    GroupKind,
    ParallelLayout,
    RankCoords,
    read_aicb_csv,
)
from lightrail.agents.replay.trace.kineto import read_kineto
from lightrail.agents.replay.trace.loader import load_workload
from lightrail.agents.replay.trace.model import (
    MAX_MESSAGE_BYTES,
    CommOp,
    Direction,
    SourceFormat,
    TraceError,
    Workload,
)
from lightrail.agents.replay.trace.simai import read_simai

__all__ = [
    "MAX_MESSAGE_BYTES",
    "CommOp",
    "Direction",
    "GroupKind",
    "ParallelLayout",
    "RankCoords",
    "SourceFormat",
    "TraceError",
    "Workload",
    "load_workload",
    "read_aicb_csv",
    "read_kineto",
    "read_simai",
]
