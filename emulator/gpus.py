"""Emulated GPU health: hosts whose GPUs can be failed, degraded and recovered on command, for
tests, the demo and machines without GPUs (``lightrail agent --health emulated``; DESIGN.md
"Emulator": "Emulated hosts report GPU health and can be failed on command").

``EmulatedHealthSource`` implements ``lightrail.agents.host.health.HealthSource``, so the agent
runs the same code on it as on ``lightrail.agents.host.nvml.NvmlHealthSource``: every GPU
starts HEALTHY, each scripted change is one ``HealthEvent`` (none when the GPU already has that
state: failing a GPU twice gives one failure event), and XIDs are classified by the same
``classify_xid``. ``stop_heartbeat`` simulates a hung host: ``wait_alive`` blocks (the agent's
heartbeat loop stops) and health events are held back until ``resume_heartbeat``.
``EmulatedHosts`` holds one source per host.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator, Mapping

import structlog

from lightrail.agents.host.health import (
    DEFAULT_CONFIG,
    XID_FALLEN_OFF_BUS,
    EventSource,
    GpuHealth,
    GpuId,
    HealthConfig,
    HealthEvent,
    HealthState,
    classify_xid,
    xid_reason,
)
from lightrail.agents.host.hub import HealthHub, HealthSubscription
from lightrail.controller.domain.timing import WallClock

_log = structlog.get_logger(__name__)


class EmulatedHealthSource:
    """``gpu_count`` emulated GPUs on ``host`` (indices 0..gpu_count-1), all HEALTHY at start.

    Scripted changes (``fail``, ``degrade``, ``recover``, ``set_unknown``, ``inject_xid``)
    return the ``HealthEvent`` they caused, or ``None`` when the GPU already had that state.
    They raise ``KeyError`` for a GPU index the host does not have and ``ValueError`` for a GPU
    of another host. ``wall_clock`` stamps events (seconds since the epoch).
    """

    def __init__(
        self,
        host: str,
        gpu_count: int = 8,
        *,
        config: HealthConfig = DEFAULT_CONFIG,
        wall_clock: WallClock = time.time,
    ) -> None:
        if gpu_count < 0:
            raise ValueError(f"gpu_count must be >= 0, got {gpu_count}")
        self._host = host
        self._config = config
        self._hub = HealthHub(host, wall_clock=wall_clock)
        self._gpus = tuple(
            self._hub.add_gpu(i, state=HealthState.HEALTHY, reason="emulated GPU",
                              source=EventSource.EMULATED)
            for i in range(gpu_count)
        )
        self._alive = asyncio.Event()
        self._alive.set()
        self._log = _log.bind(host=host)

    # ---- HealthSource

    @property
    def host(self) -> str:
        return self._host

    @property
    def gpus(self) -> tuple[GpuId, ...]:
        """Every GPU of this host, by index."""
        return self._gpus

    def events(self) -> HealthSubscription:
        """Health changes from now on (call inside the running event loop)."""
        return self._hub.subscribe()

    def snapshot(self) -> dict[GpuId, GpuHealth]:
        """Current health of every GPU, by GPU."""
        return self._hub.snapshot()

    async def run(self) -> None:
        """Nothing to poll: wait until cancelled (scripted changes happen on command)."""
        self._hub.attach_loop(asyncio.get_running_loop())
        await asyncio.Event().wait()

    async def wait_alive(self) -> None:
        """Return at once, or when the heartbeat resumes after ``stop_heartbeat``."""
        await self._alive.wait()

    def restore(self, unhealthy: Mapping[GpuId, GpuHealth]) -> None:
        """Listed GPUs take their recorded state; every other GPU becomes HEALTHY."""
        for gpu in self._gpus:
            entry = unhealthy.get(gpu)
            if entry is not None and entry.state.unhealthy:
                self._set(gpu, entry.state, entry.reason, entry.xid, EventSource.RESTORED)
            else:
                self._set(gpu, HealthState.HEALTHY, "restored healthy", None,
                          EventSource.RESTORED)

    # ---- scripted failures

    def fail(
        self, gpu: GpuId | int, xid: int | None = XID_FALLEN_OFF_BUS, reason: str | None = None
    ) -> HealthEvent | None:
        """Make ``gpu`` FAILED, by default as XID 79 (fallen off the bus)."""
        if reason is None:
            reason = xid_reason(xid) if xid is not None else "failed (emulated)"
        return self._set(self._gpu(gpu), HealthState.FAILED, reason, xid, EventSource.EMULATED)

    def degrade(
        self, gpu: GpuId | int, reason: str = "degraded (emulated)", xid: int | None = None
    ) -> HealthEvent | None:
        """Make ``gpu`` DEGRADED."""
        return self._set(self._gpu(gpu), HealthState.DEGRADED, reason, xid, EventSource.EMULATED)

    def set_unknown(
        self, gpu: GpuId | int, reason: str = "NVML error (emulated)"
    ) -> HealthEvent | None:
        """Make ``gpu`` UNKNOWN, as an NVML read error would."""
        return self._set(self._gpu(gpu), HealthState.UNKNOWN, reason, None, EventSource.EMULATED)

    def recover(self, gpu: GpuId | int, reason: str = "recovered (emulated)") -> HealthEvent | None:
        """Make ``gpu`` HEALTHY again (after a reset or a replacement)."""
        return self._set(self._gpu(gpu), HealthState.HEALTHY, reason, None, EventSource.EMULATED)

    def inject_xid(self, gpu: GpuId | int, xid: int) -> HealthEvent | None:
        """Report an XID as NVML would: classified by ``classify_xid`` with this source's
        config; an XID that does not change health changes nothing. A GPU is never moved to a
        less severe state by an XID (a FAILED GPU stays FAILED after an XID 94)."""
        target = self._gpu(gpu)
        state = classify_xid(xid, self._config)
        if state is None:
            self._log.info("xid_without_health_impact", gpu=target.index, xid=xid)
            return None
        if self._hub.get(target).state.severity >= state.severity:
            return None
        return self._set(target, state, xid_reason(xid), xid, EventSource.EMULATED)

    # ---- hung host

    @property
    def heartbeat_stopped(self) -> bool:
        """True while the host is hung (``stop_heartbeat``)."""
        return not self._alive.is_set()

    def stop_heartbeat(self) -> None:
        """Simulate a hung host: ``wait_alive`` blocks and events are held back."""
        self._alive.clear()
        self._hub.hold(True)
        self._log.info("heartbeat_stopped")

    def resume_heartbeat(self) -> None:
        """End the hang: ``wait_alive`` returns and the held events are delivered in order."""
        self._hub.hold(False)
        self._alive.set()
        self._log.info("heartbeat_resumed")

    # ---- internals

    def _gpu(self, gpu: GpuId | int) -> GpuId:
        if isinstance(gpu, GpuId):
            if gpu.host != self._host:
                raise ValueError(f"{gpu} is not a GPU of host {self._host}")
            index = gpu.index
        else:
            index = gpu
        if not 0 <= index < len(self._gpus):
            raise KeyError(f"host {self._host} has no GPU {index} (it has {len(self._gpus)})")
        return self._gpus[index]

    def _set(
        self, gpu: GpuId, state: HealthState, reason: str, xid: int | None, source: EventSource
    ) -> HealthEvent | None:
        event = self._hub.set(gpu, state, reason, xid, source)
        if event is not None:
            self._log.info("gpu_health_changed", gpu=gpu.index, state=state.value,
                           reason=reason, xid=xid, source=source.value)
        return event


class EmulatedHosts(Mapping[str, EmulatedHealthSource]):
    """Emulated health sources of many hosts, by host name. ``hosts`` is a list of names or a
    count (names ``host000``, ``host001``, ...); each host has ``gpus_per_host`` GPUs."""

    def __init__(
        self,
        hosts: Iterable[str] | int,
        gpus_per_host: int = 8,
        *,
        config: HealthConfig = DEFAULT_CONFIG,
        wall_clock: WallClock = time.time,
    ) -> None:
        names = [f"host{i:03d}" for i in range(hosts)] if isinstance(hosts, int) else list(hosts)
        if len(set(names)) != len(names):
            raise ValueError("host names must be unique")
        self._sources = {
            name: EmulatedHealthSource(name, gpus_per_host, config=config, wall_clock=wall_clock)
            for name in names
        }

    def __getitem__(self, host: str) -> EmulatedHealthSource:
        return self._sources[host]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)

    def gpus(self) -> list[GpuId]:
        """Every GPU of every host, by host then index."""
        return [gpu for source in self._sources.values() for gpu in source.gpus]

    def fail(self, gpu: GpuId, xid: int | None = XID_FALLEN_OFF_BUS) -> HealthEvent | None:
        """Fail ``gpu`` on its host (``KeyError`` for an unknown host)."""
        return self._sources[gpu.host].fail(gpu, xid)

    def snapshot(self) -> dict[GpuId, GpuHealth]:
        """Current health of every GPU of every host."""
        out: dict[GpuId, GpuHealth] = {}
        for source in self._sources.values():
            out.update(source.snapshot())
        return out
