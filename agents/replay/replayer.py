"""Trace replay: drive every rank of a recorded job through a controller, in scaled time.

Each rank walks its sequence of collectives (``lightrail.agents.replay.trace``): it computes for
the recorded
compute gap (times ``time_scale``), enters the phase through its host's agent (one PhaseStream
per host), waits like a real collective until every rank of the group is in it, "transfers"
for ``nbytes / link_gbps`` (times ``time_scale``) and releases.

Placement rule (documented, deterministic): hosts are taken in inventory order, spares skipped.
When the job has as many ranks as the hosts' GPUs, ranks fill hosts in blocks (rank r on host
r // G, GPU r % G: torchrun / Megatron order, so tensor parallelism stays on NVLink); when it
has fewer, ranks are spread round-robin over hosts first (rank r on host r % H, GPU r // H), so
that every multi-rank collective crosses hosts and uses the rails. A collective over ranks on
several hosts becomes, on each rail, circuits among those hosts' NICs
(``lightrail.controller.core.planner``).

Latency reported per phase instance (one collective of one iteration): *control-plane admission
latency* = time from the last rank's EnterPhase to the last admission, minus the device time of
the reconfiguration that admitted it (device delay excluded), floored at 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from lightrail.agents.channel import ClientTls
from lightrail.agents.client import (
    ControllerClient,
    JobRegistrationError,
    RankSession,
    placement_of,
)
from lightrail.agents.errors import PhaseError, PlacementChanged
from lightrail.agents.host.agent import HostAgent
from lightrail.agents.leader import LeaderTargets
from lightrail.agents.replay.trace.model import CommOp, Workload
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.events import JobEvent
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.domain.timing import Backoff, BackoffState
from lightrail.v1 import operator_pb2, operator_pb2_grpc


class _Restart(Exception):
    """The job restarts the iteration after a placement change (seen by another rank)."""


class ReplayError(RuntimeError):
    """The replay cannot run (the job does not fit the fabric, a rank failed)."""


@dataclass(frozen=True, slots=True)
class HostSlot:
    """A host the replay may place ranks on, with its wired GPU indices."""

    name: str
    gpus: tuple[int, ...]


class FabricTooSmall(ReplayError):
    """The job has more ranks than the fabric has GPUs to place them on. The message says
    both; callers add how to ask for a fabric that fits (they know how the fabric was chosen).
    Attributes: ``world_size`` (ranks), ``hosts`` and ``gpus_per_host`` of the fabric offered
    (GPUs per host: the fewest wired on any host), ``capacity`` (their product)."""

    def __init__(self, world_size: int, hosts: int, gpus_per_host: int) -> None:
        self.world_size = world_size
        self.hosts = hosts
        self.gpus_per_host = gpus_per_host
        self.capacity = hosts * gpus_per_host
        super().__init__(f"job has {world_size} ranks but the fabric offers {hosts} hosts x "
                         f"{gpus_per_host} GPUs = {self.capacity}")


def place_ranks(world_size: int, hosts: Sequence[HostSlot]) -> list[RankPlacement]:
    """Place ``world_size`` ranks by the module's documented rule. Raises ``ReplayError`` when
    the fabric has no hosts, ``FabricTooSmall`` when the ranks do not fit."""
    if not hosts:
        raise ReplayError("fabric has no hosts to place ranks on")
    g = min(len(h.gpus) for h in hosts)
    capacity = g * len(hosts)
    if world_size > capacity:
        raise FabricTooSmall(world_size, len(hosts), g)
    if world_size == capacity:
        return [RankPlacement(r, hosts[r // g].name, hosts[r // g].gpus[r % g])
                for r in range(world_size)]
    n = len(hosts)
    return [RankPlacement(r, hosts[r % n].name, hosts[r % n].gpus[r // n])
            for r in range(world_size)]


@dataclass(frozen=True, slots=True)
class ReplayOp:
    """One phase a rank goes through: ``phase`` None when the group is unknown (no circuit is
    requested; counted as unplanned)."""

    collective: Collective
    group: ProcessGroup | None
    nbytes: int
    gap_s: float


_WATCH_BACKOFF = Backoff(initial_s=0.1, max_s=2.0)
"""Waits before re-watching after a job-event stream breaks, seconds."""


def expand_workload(workload: Workload) -> tuple[dict[int, list[ReplayOp]], list[str]]:
    """Per-rank replay ops and the notes to print. A trace that records only some ranks of a
    symmetric job is expanded: every rank of its groups runs the same sequence (said in the
    notes). Send/recv with a known peer but no group becomes the pair {rank, peer} (for the
    recorded ranks only)."""
    notes = list(workload.assumptions)
    ranks: dict[int, list[ReplayOp]] = {}
    for r, ops in workload.ranks.items():
        ranks[r] = replay_ops(r, ops)
    missing = [r for r in range(workload.world_size) if r not in ranks]
    if missing and ranks:
        template_rank = min(ranks)
        template = workload.ranks[template_rank]
        for r in missing:
            # a recorded peer is a global rank of the template's pair, not of this rank's:
            # a copy with no group of its own stays unplanned rather than guess a partner
            ranks[r] = [_to_replay(r, dataclasses.replace(op, peer=None)) for op in template]
        notes.append(
            f"trace records ranks {sorted(workload.ranks)} of {workload.world_size}; ranks "
            f"{_span(missing)} are assumed to run the same sequence as rank {template_rank}"
        )
        if any(op.group is None and op.peer is not None for op in template):
            notes.append(f"send/recv peers of rank {template_rank} are not carried over to "
                         f"ranks {_span(missing)}: those calls are not planned there")
    return ranks, notes


def replay_ops(rank: int, ops: Sequence[CommOp]) -> list[ReplayOp]:
    """``rank``'s recorded ``ops`` as it replays them: a send/recv with a peer but no group
    runs on the pair {rank, peer}; a group without ``rank`` or of one rank is no group
    (unplanned)."""
    return [_to_replay(rank, op) for op in ops]


def _to_replay(rank: int, op: CommOp) -> ReplayOp:
    group = op.group
    if group is None and op.collective is Collective.SEND_RECV and op.peer is not None:
        group = ProcessGroup.of([rank, op.peer])
    if group is not None and not group.contains(rank):
        group = None
    if group is not None and group.size < 2:
        group = None
    return ReplayOp(op.collective, group, op.nbytes, op.compute_gap_s)


def _span(ranks: Sequence[int]) -> str:
    rs = sorted(ranks)
    if rs and rs == list(range(rs[0], rs[-1] + 1)) and len(rs) > 2:
        return f"{rs[0]}..{rs[-1]}"
    return ", ".join(map(str, rs))


@dataclass(slots=True)
class _Instance:
    """One phase instance seen by the replay: arrival and admission times per rank."""

    label: str
    expected: int
    sends: list[float] = field(default_factory=list)
    admits: list[float] = field(default_factory=list)
    device_s: float = 0.0
    switched: bool = False
    all_in: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Future[bool] | None = None
    """Resolved True when every rank is in, False when the job restarts (``_barrier``)."""


@dataclass(frozen=True, slots=True)
class HoldRecord:
    """One rank inside one phase: admitted at ``admitted_s``, released at ``released_s``
    (``time.monotonic`` seconds). Used to check the safety invariant after a replay."""

    rank: int
    phase: PhaseKey
    admitted_s: float
    released_s: float
    attempt: int = 0
    """Index into ``Replayer.placement_history``: which placement the job ran on."""


@dataclass(frozen=True, slots=True)
class PhaseRow:
    """One line of the summary: phases of one collective over groups of one size."""

    phase: str
    count: int
    reconfigurations: int
    p50_ms: float
    p99_ms: float
    device_ms: float
    stall_ms_per_iter: float


@dataclass(frozen=True, slots=True)
class ProvisioningStats:
    """How the controller's provisioning served the phases that needed new circuits."""

    hits: int
    late: int
    misses: int
    learned: bool

    @property
    def hit_rate(self) -> float:
        """Hits over all phases that needed new circuits (0 when none did)."""
        n = self.hits + self.late + self.misses
        return self.hits / n if n else 0.0


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What a replay measured. ``stall_ms_per_iter``: mean per-rank time blocked in EnterPhase
    per iteration, in ms."""

    job_id: str
    world_size: int
    iterations: int
    rows: tuple[PhaseRow, ...]
    notes: tuple[str, ...]
    unplanned_ops: int
    scale_up_ops: int
    wall_s: float
    stall_ms_per_iter: float
    placements: tuple[RankPlacement, ...]
    provisioning: ProvisioningStats | None = None


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))
    return s[k]


class Replayer:
    """Runs one workload through a controller at ``target`` (``host:port``, or the replicas'
    addresses ``a:1,b:2``: the host agents and the operator calls follow the leader), over TLS
    with ``tls`` when given (``lightrail.agents.channel.ClientTls``)."""

    def __init__(
        self,
        workload: Workload,
        target: str,
        hosts: Sequence[HostSlot],
        *,
        job_id: str = "replay",
        iterations: int = 3,
        time_scale: float = 1.0,
        link_gbps: float = 100.0,
        timeout_s: float = 30.0,
        max_ops: int | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        if iterations < 1:
            raise ReplayError(f"iterations: must be >= 1, got {iterations}")
        if time_scale < 0:
            raise ReplayError(f"time_scale: must be >= 0, got {time_scale}")
        self.workload = workload
        self.target = target
        self.tls = tls
        self.job_id = job_id
        self.iterations = iterations
        self.time_scale = time_scale
        self.bytes_per_s = link_gbps * 1e9 / 8
        self.timeout_s = timeout_s
        self.on_progress = on_progress
        self.placements = place_ranks(workload.world_size, hosts)
        self.ops, notes = expand_workload(workload)
        if not any(self.ops.values()):
            raise ReplayError(f"{workload.name}: no collectives in the iteration "
                              f"({workload.iteration or 'whole trace'}): nothing to replay")
        if max_ops is not None:
            if max_ops < 1:
                raise ReplayError(f"max_ops: must be >= 1, got {max_ops}")
            longest = max((len(v) for v in self.ops.values()), default=0)
            if longest > max_ops:
                self.ops = {r: v[:max_ops] for r, v in self.ops.items()}
                notes.append(f"only the first {max_ops} of up to {longest} collectives per "
                             "rank are replayed (--max-ops)")
        self.notes = tuple(notes)
        self._instances: dict[tuple[int, int, PhaseKey], _Instance] = {}
        self._agents: dict[str, HostAgent] = {}
        self._attempt = 0
        self._arrived = 0
        self._restart = asyncio.Event()
        self._restart_done = asyncio.Event()
        self._new_placement: list[RankPlacement] | None = None
        self.restarts = 0
        """How many times the job restarted from its checkpoint after a failover."""
        self.placement_events: list[JobEvent] = []
        self.placement_history: list[tuple[RankPlacement, ...]] = [tuple(self.placements)]
        """The placement of each attempt (a failover starts a new one)."""
        self._stall_s = 0.0
        self._unplanned = 0
        self._done_iters: dict[int, int] = {}
        self._hosts = [p.host for p in self.placements]
        self._scale_up = 0
        self.holds: list[HoldRecord] = []
        """Every admission of the run, for invariant checks."""

    async def run(self, client: ControllerClient) -> ReplayReport:
        """Register the job through ``client``, run all ranks, unregister. Raises
        ``ReplayError`` if any rank fails (the first error is the message) and
        ``JobRegistrationError`` if the controller refuses the job. A failed unregistration
        never hides what ended the run: it becomes a note of the raised error, or of the
        report (the controller expires the job after ``controller.job_idle_expiry_s``)."""
        await client.register_job(self.job_id, self.placements, tenant="replay")
        try:
            report = await self._run_ranks(client)
            report = dataclasses.replace(report, provisioning=await self._provisioning())
        except BaseException as exc:
            failed = await self._unregister(client)
            if failed is not None:
                exc.add_note(failed)
            raise
        failed = await self._unregister(client)
        if failed is not None:
            report = dataclasses.replace(report, notes=(*report.notes, failed))
        return report

    async def _unregister(self, client: ControllerClient) -> str | None:
        """Unregister the job; None when done, else one line saying why not."""
        try:
            await client.unregister_job(self.job_id)
        except Exception as exc:  # cleanup: reported, never raised over the run's outcome
            gone = (isinstance(exc, JobRegistrationError)
                    and exc.status is grpc.StatusCode.NOT_FOUND)
            return (f"unregistering job {self.job_id!r} failed too ({type(exc).__name__}: "
                    f"{exc}): " + ("it was no longer registered" if gone else
                                   "the controller expires it after "
                                   "controller.job_idle_expiry_s"))
        return None

    async def _provisioning(self) -> ProvisioningStats | None:
        """The controller's provisioning counters for this job (None if it has none), from
        the leader. Raises ``NoLeader`` and the leader's ``grpc.aio.AioRpcError``."""

        targets = LeaderTargets(self.target, tls=self.tls)

        async def attempt(address: str) -> operator_pb2.ListJobsResponse:
            async with targets.channel(address) as ch:
                jobs: operator_pb2.ListJobsResponse = await operator_pb2_grpc.OperatorServiceStub(
                    ch).ListJobs(operator_pb2.ListJobsRequest(), timeout=10.0)
                return jobs

        resp = await targets.call(attempt)
        for j in resp.jobs:
            if j.job_id == self.job_id:
                return ProvisioningStats(j.provisioning_hits, j.provisioning_late,
                                         j.provisioning_misses, j.schedule_learned)
        return None

    async def _agent(self, host: str) -> HostAgent:
        agent = self._agents.get(host)
        if agent is None:
            agent = HostAgent(host, self.target, tls=self.tls)
            self._agents[host] = agent
            agent.start()
            await agent.wait_connected(10.0)
        return agent

    async def _run_ranks(self, client: ControllerClient) -> ReplayReport:
        start = time.monotonic()
        watcher = asyncio.create_task(self._watch(client), name="replay-watch")
        try:
            for h in sorted({p.host for p in self.placements}):
                await self._agent(h)
            first: BaseException | None = None
            try:
                async with asyncio.TaskGroup() as tg:
                    for p in self.placements:
                        tg.create_task(self._rank(p.rank), name=f"rank{p.rank}")
            except* PhaseError as eg:
                first = eg.exceptions[0]
            # raised here, not inside ``except*``: there CPython before 3.11.4 (Debian 12's
            # 3.11.2) wraps it in an ExceptionGroup (gh-103590)
            if first is not None:
                raise ReplayError(f"replay failed: {first}") from first
        finally:
            watcher.cancel()
            for a in self._agents.values():
                await a.close()
        return self._report(time.monotonic() - start)

    async def _watch(self, client: ControllerClient) -> None:
        """A placement change (failover) restarts the job from its last checkpoint: here, the
        iteration in progress, on the new placement."""
        backoff = BackoffState(_WATCH_BACKOFF)
        while True:
            try:
                async for ev in client.watch(self.job_id):
                    backoff.reset()
                    placement = placement_of(ev)
                    if placement is not None:
                        self.placement_events.append(ev)
                        self._new_placement = placement
                        self._signal_restart()
                return  # the job was unregistered
            except PhaseError as exc:
                if exc.code is ErrorCode.UNKNOWN_JOB:
                    raise
                # the stream broke (controller restart, leader change): watch again
                await asyncio.sleep(backoff.next_s())

    async def _rejoin(self, rank: int) -> RankSession:
        """Wait until every rank has given up the iteration, then continue on the new
        placement (the failed rank's process now runs on the spare's host)."""
        self._signal_restart()
        done = self._restart_done
        self._arrived += 1
        if self._arrived == len(self.placements):
            if self._new_placement is not None:
                self.placements = list(self._new_placement)
                self._hosts = [p.host for p in self.placements]
            self.placement_history.append(tuple(self.placements))
            self._attempt += 1
            self.restarts += 1
            self._arrived = 0
            self._restart_done = asyncio.Event()
            self._restart.clear()
            done.set()
        else:
            await asyncio.wait_for(done.wait(), self.timeout_s)
        agent = await self._agent(self.placements[rank].host)
        return RankSession(agent, self.job_id, rank, timeout_s=self.timeout_s,
                           hosts=self._hosts)

    async def _rank(self, rank: int) -> None:
        session = RankSession(await self._agent(self.placements[rank].host), self.job_id, rank,
                              timeout_s=self.timeout_s, hosts=self._hosts)
        it = 0
        while it < self.iterations:
            try:
                await self._interruptible(self._iteration(session, rank, it))
            except (PlacementChanged, _Restart):
                session = await self._rejoin(rank)
                continue  # the same iteration again, from its checkpoint
            self._done_iters[it] = self._done_iters.get(it, 0) + 1
            if self.on_progress is not None and self._done_iters[it] == len(self.placements):
                self.on_progress(it + 1, self.iterations)
            it += 1

    async def _interruptible(self, iteration: Coroutine[Any, Any, None]) -> None:
        """Run one rank's ``iteration``; when the job restarts (a failover seen by any rank or
        by the watch) cancel it wherever it waits and raise ``_Restart``. A rank that entered
        a phase of the old attempt just after the controller refused the waiting ones would
        otherwise wait there for peers that already restarted (and they for it): cancelling
        its enter withdraws the wait at the controller (``HostAgent.enter``)."""
        task = asyncio.ensure_future(iteration)
        restart = asyncio.ensure_future(self._restart.wait())
        try:
            await asyncio.wait({task, restart}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            restart.cancel()
        if task.done():
            task.result()  # PlacementChanged / _Restart / a failure propagate
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, PhaseError, _Restart):
            await task
        raise _Restart

    async def _iteration(self, session: RankSession, rank: int, it: int) -> None:
        ops = self.ops.get(rank, [])
        tail = self.workload.tail_gap_s.get(rank, 0.0)
        session.start_iteration(it)
        for op in ops:
            if self._restart.is_set():
                raise _Restart
            if op.gap_s > 0 and self.time_scale > 0:
                await asyncio.sleep(op.gap_s * self.time_scale)
            if op.group is None:
                self._unplanned += 1
                continue
            if session.is_scale_up_only(op.group):
                self._scale_up += 1  # NVLink inside the host: no circuit, no controller
                continue
            if op.collective is Collective.ALL_TO_ALL:
                await self._all_to_all(session, rank, it, op)
            else:
                await self._collective(session, rank, it, op)
        if tail > 0 and self.time_scale > 0:
            await asyncio.sleep(tail * self.time_scale)

    def _instance(self, it: int, key: PhaseKey, label: str, expected: int) -> _Instance:
        ikey = (self._attempt, it, key)
        inst = self._instances.get(ikey)
        if inst is None:
            inst = _Instance(label, expected)
            self._instances[ikey] = inst
        return inst

    async def _transfer(self, nbytes: int) -> None:
        if self.time_scale > 0 and nbytes > 0:
            await asyncio.sleep(nbytes / self.bytes_per_s * self.time_scale)

    async def _collective(self, session: RankSession, rank: int, it: int, op: ReplayOp) -> None:
        assert op.group is not None
        label = f"{op.collective.value} x{op.group.size}"
        t0 = time.monotonic()
        async with session.phase(op.group.ranks, op.collective, nbytes=op.nbytes,
                                 compute_gap_s=op.gap_s * self.time_scale) as adm:
            t1 = time.monotonic()
            key = session.current_phase
            assert key is not None
            self._record(self._instance(it, key, label, op.group.size), t0, t1, adm.noop,
                         adm.device_s)
            await self._barrier(it, key)
            await self._transfer(op.nbytes)
            self.holds.append(HoldRecord(rank, key, t1, time.monotonic(), self._attempt))

    async def _all_to_all(self, session: RankSession, rank: int, it: int, op: ReplayOp) -> None:
        assert op.group is not None
        label = f"all_to_all x{op.group.size}"
        t0 = time.monotonic()
        # aclosing: a restart or failure in the body releases the step now, not at GC time
        async with contextlib.aclosing(session.all_to_all(op.group.ranks)) as steps:
            async for adm in steps:
                t1 = time.monotonic()
                key = session.current_phase
                assert key is not None
                self._record(self._instance(it, key, label, op.group.size), t0, t1, adm.noop,
                             adm.device_s)
                await self._barrier(it, key)
                await self._transfer(op.nbytes // adm.steps)
                self.holds.append(HoldRecord(rank, key, t1, time.monotonic(), self._attempt))
                t0 = time.monotonic()

    def _record(self, inst: _Instance, t_send: float, t_admit: float, noop: bool,
                device_s: float) -> None:
        inst.sends.append(t_send)
        inst.admits.append(t_admit)
        self._stall_s += t_admit - t_send
        if not noop:
            inst.switched = True
            inst.device_s = max(inst.device_s, device_s)
        if len(inst.admits) >= inst.expected:
            inst.all_in.set()
            if inst.done is not None and not inst.done.done():
                inst.done.set_result(True)

    def _signal_restart(self) -> None:
        """The job restarts: every rank waiting in a barrier gives up the iteration."""
        self._restart.set()
        for inst in self._instances.values():
            if inst.done is not None and not inst.done.done():
                inst.done.set_result(False)

    async def _barrier(self, it: int, key: PhaseKey) -> None:
        """A collective completes only when every rank of the group is in it (or the job
        restarts after a failover: ``_Restart``)."""
        inst = self._instances[(self._attempt, it, key)]
        if inst.all_in.is_set():
            return
        if self._restart.is_set():
            raise _Restart
        if inst.done is None:  # one future all of the group's ranks wait on: no task each
            inst.done = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(self.timeout_s):
                complete = await asyncio.shield(inst.done)
        except TimeoutError:
            complete = False
        if complete or inst.all_in.is_set():
            return
        if self._restart.is_set():
            raise _Restart
        raise TimeoutError(f"collective {key} of iteration {it}: peers did not arrive within "
                           f"{self.timeout_s} s")

    def _report(self, wall_s: float) -> ReplayReport:
        by_label: dict[str, list[_Instance]] = {}
        for inst in self._instances.values():
            by_label.setdefault(inst.label, []).append(inst)
        world = len(self.placements)
        rows = []
        for label in sorted(by_label):
            insts = by_label[label]
            lat = [max(0.0, max(i.admits) - max(i.sends) - i.device_s) * 1e3 for i in insts]
            stall = sum(a - s for i in insts for s, a in zip(i.sends, i.admits, strict=True))
            switched = [i for i in insts if i.switched]
            rows.append(PhaseRow(
                phase=label,
                count=len(insts),
                reconfigurations=len(switched),
                p50_ms=_percentile(lat, 0.50),
                p99_ms=_percentile(lat, 0.99),
                device_ms=(sum(i.device_s for i in switched) / len(switched) * 1e3)
                if switched else 0.0,
                stall_ms_per_iter=stall / world / self.iterations * 1e3,
            ))
        return ReplayReport(
            job_id=self.job_id,
            world_size=world,
            iterations=self.iterations,
            rows=tuple(rows),
            notes=self.notes,
            unplanned_ops=self._unplanned,
            scale_up_ops=self._scale_up,
            wall_s=wall_s,
            stall_ms_per_iter=self._stall_s / world / self.iterations * 1e3,
            placements=tuple(self.placements),
        )


def report_to_json(report: ReplayReport) -> Mapping[str, object]:
    """The report as JSON-ready data (for ``--json``)."""
    return {
        "job_id": report.job_id,
        "world_size": report.world_size,
        "iterations": report.iterations,
        "wall_s": round(report.wall_s, 4),
        "stall_ms_per_iter": round(report.stall_ms_per_iter, 4),
        "unplanned_ops": report.unplanned_ops,
        "scale_up_ops": report.scale_up_ops,
        "notes": list(report.notes),
        "provisioning": None if report.provisioning is None else {
            "hits": report.provisioning.hits, "late": report.provisioning.late,
            "misses": report.provisioning.misses, "learned": report.provisioning.learned,
            "hit_rate": round(report.provisioning.hit_rate, 4)},
        "phases": [
            {"phase": r.phase, "count": r.count, "reconfigurations": r.reconfigurations,
             "admission_p50_ms": round(r.p50_ms, 4), "admission_p99_ms": round(r.p99_ms, 4),
             "device_ms": round(r.device_ms, 4),
             "stall_ms_per_iter": round(r.stall_ms_per_iter, 4)}
            for r in report.rows
        ],
    }
