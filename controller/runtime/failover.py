"""Failover: GPU health and heartbeats in, spares rewired in (LUMION, Morphlux).

A failure is a fatal health event from a host agent (NVML XID 79 fallen off the bus, 48
double-bit ECC, ...; ``agents/health.py``) or a host whose heartbeats stop for longer than
``heartbeat_deadline_s``. For every rank on a failed GPU the manager picks a spare
(``lightrail.controller.core.spares``), has the coordinator void the job's collectives in flight
and rewire the
failed endpoint's circuits to the spare (``PhaseService.failover``), waits for the switch to
confirm, stores the new placement in etcd and tells the job (WatchJob: PLACEMENT_CHANGED with the
new placement). Every step is timed: detected -> planned -> device confirmed -> job notified,
in metrics and in the job's event.

No spare is a clear, alerted state (metric, log error, job event), not a crash; the rank stays
failed and the job waits for an operator (``lightrail failover`` with an explicit spare, or
``lightrail drain``).
"""

from __future__ import annotations

import asyncio
import enum
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from lightrail.controller.core.spares import NoSpare, SpareChoice, pick_spare
from lightrail.controller.domain.errors import FailoverBusy, FailoverError, UnknownJob
from lightrail.controller.domain.events import FabricEvent, FabricEventKind, JobEvent, JobEventKind
from lightrail.controller.domain.model import RankPlacement
from lightrail.controller.runtime import metrics
from lightrail.controller.runtime.events import EventBus
from lightrail.controller.runtime.phase_service import PhaseService
from lightrail.controller.store.errors import StoreError
from lightrail.controller.store.jobs import JobRecord, JobRepository
from lightrail.drivers.base import DriverError

log = structlog.get_logger(__name__)

DRAINED = "drained: "
"""How the reason of a GPU failed by ``drain`` begins (``undrain`` returns exactly those)."""


class GpuState(enum.Enum):
    """Health of one GPU as the controller records it (the controller's record wins)."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    FAILED = "failed"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class GpuRecord:
    """The controller's record of one GPU; ``since_s`` is monotonic seconds."""

    state: GpuState
    reason: str
    since_s: float


@dataclass(frozen=True, slots=True)
class FailoverTimeline:
    """One failover, seconds from detection to each step."""

    job_id: str
    rank: int
    from_host: str
    from_gpu: int
    to_host: str
    to_gpu: int
    planned_s: float
    device_confirmed_s: float
    job_notified_s: float


class RankMoved(FailoverError):
    """The rank is no longer on the failed GPU (another failover moved it first)."""


class HealthStore(Protocol):
    """Where the manager keeps what must survive a controller restart (etcd in the daemon:
    ``lightrail.controller.store.health.EtcdHealthStore``):
    GPU failure records (``gpus/<host>/<gpu>``) and host presence (``hosts/<host>/presence``,
    under a lease that lives while the host's health stream is open)."""

    def put(self, key: str, obj: object) -> None: ...

    def delete(self, key: str) -> None: ...

    async def host_online(self, host: str, ttl_s: int) -> object: ...

    async def host_offline(self, token: object) -> None: ...


class FailoverManager:
    """Owns GPU health records and host heartbeats; runs failovers one at a time per job.

    ``clock`` (monotonic seconds) is injectable for tests; the heartbeat watchdog runs in the
    caller's TaskGroup (``start``).
    """

    def __init__(
        self,
        service: PhaseService,
        jobs: JobRepository,
        events: EventBus,
        *,
        heartbeat_interval_s: float = 1.0,
        heartbeat_deadline_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        store: HealthStore | None = None,
    ) -> None:
        self._store = store
        self._service = service
        self._jobs = jobs
        self._events = events
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_deadline_s = heartbeat_deadline_s
        self._clock = clock
        self._gpus: dict[tuple[str, int], GpuRecord] = {}
        self._last_heartbeat: dict[str, float] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._tg: asyncio.TaskGroup | None = None
        self.timelines: list[FailoverTimeline] = []
        self._tasks: set[asyncio.Task[None]] = set()

    # --- inputs -------------------------------------------------------------------------------

    def start(self, tg: asyncio.TaskGroup) -> None:
        """Start the heartbeat watchdog in ``tg``."""
        self._tg = tg
        self._tasks.add(tg.create_task(self._watchdog(), name="heartbeat-watchdog"))

    async def stop(self, timeout_s: float) -> None:
        """Cancel the watchdog and failovers in progress (bounded)."""
        tasks = [t for t in self._tasks if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    def heartbeat(self, host: str) -> None:
        """A host agent spoke."""
        self._last_heartbeat[host] = self._clock()

    def report(self, host: str, gpu: int, state: GpuState, reason: str, *,
               echoed: bool = False) -> None:
        """A GPU's health as its agent sees it. A transition to FAILED starts a failover for
        every rank on it; the same failure reported again (e.g. a kernel message and XID 79)
        starts nothing new. The controller's FAILED record is not cleared by a later
        "healthy" report of a restarted agent. ``echoed``: a FAILED report that repeats the
        controller's own record (``GpuHealth.controller_record``) records nothing new: after
        an operator cleared the record it stays cleared."""
        key = (host, gpu)
        prev = self._gpus.get(key)
        if prev is not None and prev.state is GpuState.FAILED:
            return  # the controller's record wins; only an operator clears a failure
        if echoed and state is GpuState.FAILED:
            return
        if prev is not None and prev.state is state:
            return
        self._gpus[key] = GpuRecord(state, reason, self._clock())
        if state is GpuState.FAILED:
            self._persist(host, gpu, reason)
            self._count_failed()
            self._spawn_failover(host, gpu, reason)

    def _persist(self, host: str, gpu: int, reason: str) -> None:
        if self._store is not None:
            self._store.put(f"gpus/{host}/{gpu}", {"state": GpuState.FAILED.value,
                                                   "reason": reason, "at_unix_s": time.time()})

    def restore_failed(self, records: dict[tuple[str, int], str]) -> None:
        """Failure records read back from etcd at start: they stay failed (and are never picked
        as spares) until an operator clears them."""
        for (host, gpu), reason in records.items():
            self._gpus[(host, gpu)] = GpuRecord(GpuState.FAILED, reason, self._clock())
        self._count_failed()

    async def stream_opened(self, host: str) -> object | None:
        """A host's health stream opened: record its presence (etcd lease while it lasts)."""
        if self._store is None:
            return None
        ttl = max(2, math.ceil(self.heartbeat_deadline_s))
        return await self._store.host_online(host, ttl)

    async def stream_closed(self, token: object | None) -> None:
        """The stream ended: its presence key goes with its lease."""
        if self._store is not None and token is not None:
            await self._store.host_offline(token)

    def _count_failed(self) -> None:
        metrics.GPUS_FAILED.set(sum(1 for r in self._gpus.values()
                                    if r.state is GpuState.FAILED))

    def failed_gpus(self, host: str) -> list[int]:
        """GPUs of ``host`` the controller records as failed."""
        return sorted(g for (h, g), r in self._gpus.items()
                      if h == host and r.state is GpuState.FAILED)

    def record(self, host: str, gpu: int) -> GpuRecord | None:
        """The controller's record of a GPU, if any report or failure set one."""
        return self._gpus.get((host, gpu))

    def heartbeat_age_s(self, host: str) -> float | None:
        """Seconds since the host's last heartbeat (None: never heard of)."""
        last = self._last_heartbeat.get(host)
        return None if last is None else self._clock() - last

    # --- failover -----------------------------------------------------------------------------

    def _spawn_failover(self, host: str, gpu: int, reason: str) -> None:
        user = self._service.coordinator.gpus_in_use().get((host, gpu))
        if user is None:
            log.warning("gpu_failed_unused", host=host, gpu=gpu, reason=reason)
            return
        rank = next(p.rank for p in self._service.coordinator.job(user).placements
                    if (p.host, p.gpu) == (host, gpu))
        detected = self._clock()
        assert self._tg is not None, "FailoverManager.start() not called"
        task = self._tg.create_task(self._guarded(user, reason, detected,
                                                  RankPlacement(rank, host, gpu)),
                                    name=f"failover-{user}-r{rank}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, job_id: str, reason: str, detected: float,
                       failed: RankPlacement) -> None:
        """An automatic failover of ``failed`` (the rank on the GPU that failed): whatever
        goes wrong is reported, never takes the daemon down (a switch or etcd error leaves the
        rank failed, the job told)."""
        rank = failed.rank
        try:
            await self.failover(job_id, rank, reason, detected_s=detected, expected=failed)
        except RankMoved as exc:
            log.info("failover_not_needed", job=job_id, rank=rank, reason=str(exc))
        except NoSpare as exc:
            metrics.FAILOVER_NO_SPARE.labels(job_id).inc()
            log.error("failover_no_spare", job=job_id, rank=rank, reason=exc.reason)
            self._events.publish(JobEvent(job_id, JobEventKind.PHASE_ERROR,
                                          f"rank {rank} failed ({reason}) and {exc.reason}",
                                          fields={"rank": str(rank), "code": "no_spare"}))
        except (FailoverError, UnknownJob, DriverError, StoreError) as exc:
            log.error("failover_failed", job=job_id, rank=rank, error=str(exc))
            self._events.publish(JobEvent(job_id, JobEventKind.PHASE_ERROR,
                                          f"rank {rank} failed ({reason}); failover failed: "
                                          f"{exc}", fields={"rank": str(rank),
                                                             "code": "failover_failed"}))

    async def failover(
        self,
        job_id: str,
        rank: int,
        reason: str,
        *,
        spare: SpareChoice | None = None,
        detected_s: float | None = None,
        expected: RankPlacement | None = None,
    ) -> FailoverTimeline:
        """Move ``rank`` of ``job_id`` to ``spare`` (or the spare ``pick_spare`` chooses).
        ``expected``: where the rank must still be (an automatic failover or a drain saw it
        there); when it moved meanwhile, raises ``RankMoved``.
        Raises ``UnknownJob``, ``NoSpare``, ``FailoverError`` and the ``DriverError`` of a
        failed rewire."""
        detected = self._clock() if detected_s is None else detected_s
        lock = self._locks.setdefault(job_id, asyncio.Lock())
        async with lock:  # one failover per job at a time: each sees the last one's placement
            coord = self._service.coordinator
            layout = coord.job(job_id)
            if not 0 <= rank < layout.world_size:
                raise FailoverError(f"rank: {rank} out of range 0..{layout.world_size - 1}")
            old = layout.placements[rank]
            if expected is not None and old != expected:
                # another failover (or a drain) moved the rank while this one waited for the lock
                raise RankMoved(f"rank {rank} is no longer on {expected.host}/gpu{expected.gpu}"
                                f" (now {old.host}/gpu{old.gpu})")
            unhealthy = {k for k, r in self._gpus.items() if r.state is GpuState.FAILED}
            while True:
                if spare is None:
                    choice = pick_spare(coord.fabric, old.host, old.gpu, coord.gpus_in_use(),
                                        unhealthy)
                    to = choice
                else:
                    to = spare
                settled = self._service.ports_settled()
                try:
                    fut = self._service.failover(job_id, rank, to.host, to.gpu)
                    break
                except FailoverBusy:
                    # the ports are being switched (or read back): wait until that completes
                    await asyncio.wait_for(settled.wait(), self.heartbeat_deadline_s + 30.0)
            planned = self._clock()
            await fut
            confirmed = self._clock()
            new_layout = coord.job(job_id)
            await self._jobs.save(JobRecord(job_id, coord.tenant(job_id), new_layout.placements,
                                            coord.declared_phases(job_id)))
            stored = self._clock()
            self._events.publish(JobEvent(
                job_id, JobEventKind.PLACEMENT_CHANGED,
                f"rank {rank} moved from {old.host}/gpu{old.gpu} to {to.host}/gpu{to.gpu} "
                f"({reason}); restart from the last checkpoint",
                fields={"rank": str(rank), "from": f"{old.host}/gpu{old.gpu}",
                        "to": f"{to.host}/gpu{to.gpu}", "reason": reason,
                        "placement": ";".join(f"{p.rank}={p.host}/gpu{p.gpu}"
                                              for p in new_layout.placements),
                        "planned_s": f"{planned - detected:.6f}",
                        "device_confirmed_s": f"{confirmed - detected:.6f}",
                        "stored_s": f"{stored - detected:.6f}"}))
            notified = self._clock()
            tl = FailoverTimeline(job_id, rank, old.host, old.gpu, to.host, to.gpu,
                                  planned - detected, confirmed - detected, notified - detected)
            self.timelines.append(tl)
            self._events.publish_fabric(FabricEvent(
                FabricEventKind.FAILOVER,
                f"job {job_id} rank {rank}: {old.host}/gpu{old.gpu} -> {to.host}/gpu{to.gpu} "
                f"({reason}) in {tl.job_notified_s * 1e3:.1f} ms",
                job_id=job_id,
                fields={"rank": str(rank), "from": f"{old.host}/gpu{old.gpu}",
                        "to": f"{to.host}/gpu{to.gpu}", "reason": reason,
                        "planned_s": f"{tl.planned_s:.6f}",
                        "device_confirmed_s": f"{tl.device_confirmed_s:.6f}",
                        "stored_s": f"{stored - detected:.6f}",
                        "job_notified_s": f"{tl.job_notified_s:.6f}"}))
            metrics.FAILOVER_SECONDS.labels("planned").observe(tl.planned_s)
            metrics.FAILOVER_SECONDS.labels("device_confirmed").observe(tl.device_confirmed_s)
            metrics.FAILOVER_SECONDS.labels("job_notified").observe(tl.job_notified_s)
            log.info("failover_done", job=job_id, rank=rank, to=f"{to.host}/gpu{to.gpu}",
                     planned_s=tl.planned_s, confirmed_s=tl.device_confirmed_s,
                     notified_s=tl.job_notified_s)
            return tl

    async def drain(self, host: str, reason: str) -> list[FailoverTimeline]:
        """Mark every GPU of ``host`` failed and fail over every rank on it."""
        out: list[FailoverTimeline] = []
        coord = self._service.coordinator
        gpus = coord.fabric.hosts[host].gpu_count
        for gpu in range(gpus):
            self._gpus[(host, gpu)] = GpuRecord(GpuState.FAILED, f"{DRAINED}{reason}",
                                                self._clock())
            self._persist(host, gpu, f"{DRAINED}{reason}")
        self._count_failed()
        for gpu in range(gpus):
            user = coord.gpus_in_use().get((host, gpu))
            if user is None:
                continue
            rank = next(p.rank for p in coord.job(user).placements
                        if (p.host, p.gpu) == (host, gpu))
            try:
                out.append(await self.failover(user, rank, f"{DRAINED}{reason}",
                                               expected=RankPlacement(rank, host, gpu)))
            except RankMoved:
                continue  # an automatic failover got there first
        return out

    def undrain(self, host: str) -> list[int]:
        """Return a drained ``host`` to service: its GPUs that ``drain`` marked failed are
        ``UNKNOWN`` until their agent reports (a spare host is a spare again: unknown GPUs
        are not failed) and their etcd records are deleted (``gpus/<host>/<gpu>``). GPUs that
        failed for another reason stay failed (``clear`` forgets those). Returns the GPUs
        returned, sorted. Raises ``FailoverError`` naming the host when none of its GPUs is
        drained, ``KeyError`` for a host the fabric does not have."""
        gpus = self._service.coordinator.fabric.hosts[host].gpu_count
        drained = [g for g in range(gpus) if (rec := self._gpus.get((host, g))) is not None
                   and rec.state is GpuState.FAILED and rec.reason.startswith(DRAINED)]
        if not drained:
            raise FailoverError(f"host: {host!r} is not drained")
        self._forget(host, drained, "undrained")
        return drained

    def clear(self, host: str, gpu: int | None = None) -> list[int]:
        """Forget the failed or degraded record of ``gpu`` of ``host`` (None: every GPU of
        it), e.g. after a repair: ``UNKNOWN`` until the agent reports, the etcd record
        deleted. Returns the GPUs cleared (empty: none was failed or degraded). Raises
        ``FailoverError`` naming a GPU the host does not have, ``KeyError`` for an unknown
        host."""
        count = self._service.coordinator.fabric.hosts[host].gpu_count
        if gpu is not None and not 0 <= gpu < count:
            raise FailoverError(f"gpu: {host}/gpu{gpu} does not exist ({host} has GPUs "
                                f"0..{count - 1})")
        wanted = range(count) if gpu is None else (gpu,)
        cleared = [g for g in wanted if (rec := self._gpus.get((host, g))) is not None
                   and rec.state in (GpuState.FAILED, GpuState.DEGRADED)]
        self._forget(host, cleared, "cleared by an operator")
        return cleared

    def _forget(self, host: str, gpus: list[int], reason: str) -> None:
        """Mark ``gpus`` of ``host`` ``UNKNOWN`` (``reason``) and delete their etcd records."""
        for g in gpus:
            self._gpus[(host, g)] = GpuRecord(GpuState.UNKNOWN, reason, self._clock())
            if self._store is not None:
                self._store.delete(f"gpus/{host}/{g}")
        self._count_failed()
        if gpus:
            log.info("gpus_returned", host=host, gpus=gpus, reason=reason)

    # --- heartbeats -----------------------------------------------------------------------------

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_s / 2)
            now = self._clock()
            for host, last in list(self._last_heartbeat.items()):
                if now - last <= self.heartbeat_deadline_s:
                    continue
                del self._last_heartbeat[host]  # report the silence once
                log.error("heartbeat_lost", host=host, silent_s=now - last)
                # a host-dead verdict: its ranks no longer keep recovered jobs frozen
                self._service.hosts_dead([host])
                gpus = self._service.coordinator.fabric.hosts[host].gpu_count
                for gpu in range(gpus):
                    self.report(host, gpu, GpuState.FAILED,
                                f"no heartbeat for {now - last:.2f} s")

