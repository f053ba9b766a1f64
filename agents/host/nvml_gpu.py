"""Per-GPU monitor state of the NVML health source (``lightrail.agents.host.nvml``): the
findings of each signal, the last NVLink counters, and the worst finding that is the GPU's state.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import structlog

from lightrail.agents.host.health import EventSource, GpuId, HealthState
from lightrail.agents.host.kernel import PciKey
from lightrail.agents.host.nvml_binding import NVLINK_COUNTERS


@dataclass(frozen=True, slots=True)
class Finding:
    """What one signal says about a GPU: its state, why, the XID if any, and the signal."""

    state: HealthState
    reason: str
    xid: int | None
    source: EventSource


@dataclass(slots=True)
class Link:
    """One active NVLink: the last counter values (poller-owned)."""

    counters: dict[int, int | None] = field(
        default_factory=lambda: dict.fromkeys(NVLINK_COUNTERS)
    )
    unsupported: set[int] = field(default_factory=set)
    active: bool = True


@dataclass(slots=True)
class GpuMonitor:
    """Per-GPU monitor state of ``NvmlHealthSource``. ``lost``, ``latched`` and ``findings``
    are guarded by the source's lock; the rest belongs to the (single) poller."""

    gpu: GpuId
    handle: object | None
    uuid: str | None
    pci: PciKey | None
    log: structlog.typing.FilteringBoundLogger
    lost: bool = False
    latched: Finding | None = None
    findings: dict[str, Finding] = field(default_factory=dict)
    errors_in_row: int = 0
    next_poll_s: float = 0.0
    temperature_supported: bool = True
    ecc_supported: bool = True
    hot: bool = False
    links: dict[int, Link] = field(default_factory=dict)
    nvlink_bad_until_s: float = 0.0
    nvlink_reason: str = ""
    last_poll_s: float | None = None


def worst_finding(findings: Iterable[Finding]) -> Finding | None:
    """The most severe finding (``HealthState.severity``; the first of equals), or ``None``."""
    worst: Finding | None = None
    for f in findings:
        if worst is None or f.state.severity > worst.state.severity:
            worst = f
    return worst
