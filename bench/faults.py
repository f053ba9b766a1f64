"""Fault campaign (issue 10, section 4): kill, pause and break parts of a running Lightrail
while a recorded training step replays through it, and count what the safety invariant
promises never happens.

Everything runs on loopback, each part in its own process as in production: etcd, the emulated
switches (``lightrail emulate``: TL1 Polatis and RESTCONF devices whose change and command logs
outlive every controller), three controller replicas (``lightrail controller``; one leads on
an etcd lease, the others stand by and redirect), and, in this process, the replay: the DLRM
8-rank Kineto step of ``../shared/data`` on ``demo-4x2`` through one host agent per host
(``lightrail.agents.replay.replayer.Replayer``), following the leader across takeovers.

Cases (each seeded, each stopping by itself):

* ``leader-kill``: the leader is SIGKILLed at a random point of a reconfiguration (after a
  seeded random wait, the moment a switch receives a write command, plus a seeded offset within
  the device's settle time), then restarted as a standby. Takeover time: SIGKILL to a standby
  serving as leader (gRPC health SERVING), in lease TTLs.
* ``leader-pause``: the leader is stopped (SIGSTOP) for 1.5 lease TTLs, then continued
  (SIGCONT). Every replica logs in to the TL1 switches with its own account, so each device's
  command log (control API ``/devices/{id}/commands``) names the sender: the paused replica
  must not send one command after it was stopped. Time: SIGSTOP to the new leader serving.
* ``device-faults``: seeded random device faults (unreachable, slow, partial apply, denied
  port, reboot keeping or losing cross-connects) on the TL1 and the RESTCONF rail while replays
  run: every affected rank gets an explicit error (counted by code) or is admitted after
  confirmation. Time: fault injected to the replay's end (completed or failed explicitly).
* ``fuzz``: the property-based tests of bad input (``tests/fuzz.py``: config, traces, every gRPC
  request through the real servicers, TL1 and RESTCONF replies) with ``--fuzz-examples``
  examples per test instead of CI's bound (``LIGHTRAIL_FUZZ_EXAMPLES``); runs = tests, crashes =
  tests that found an input without a clear error. Time: per test.
* ``etcd-member`` (with ``tests/etcd_cluster.py``, over TLS with client certificates): a random
  member of a 3-member etcd cluster killed and restarted, and a compaction during the
  controllers' watches, while a replay runs; lease TTL ``ETCD_CASE_TTL_S``. The replay must go
  on and no replica may fence itself. Time: kill to the next completed iteration.

For every case: ``unsafe`` = admissions onto circuits the switch had not confirmed, or whose
circuits changed while held (``tests/invariants.check_holds`` on the change logs; circuits a
device dropped on its own, a reboot losing its cross-connects, are its fault and noted apart);
``lost`` = cross-connects the leader's view (``ListCircuits``) holds that the switch does not,
after the campaign; ``doubled`` = cross-connects the switch holds that the leader's view does
not, plus makes of a cross-connect that was already made (change logs); ``crashes`` = controller
replicas that exited without being killed, replays that stalled (no iteration within 60 s) or
failed with an error that is not explicit.

    .venv/bin/python bench/faults.py [--kills 50] [--pauses 3] [--device-faults 20]
        [--etcd-kills 3] [--fuzz-examples 1000] [--seed 1] [--cases leader-kill,...]

prints one table: case, runs, p50/p99 of the case's time, lost, doubled, unsafe, crashes.
``tests/faults/`` runs a bounded subset of the same code in ``make test``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # tests/invariants.py, tests/etcd_cluster.py
    sys.path.insert(0, str(REPO))
from support import description  # noqa: E402

from lightrail.agents.client import ControllerClient  # noqa: E402
from lightrail.agents.errors import PhaseError  # noqa: E402
from lightrail.agents.replay.replayer import HostSlot, Replayer, ReplayError  # noqa: E402
from lightrail.agents.replay.trace.loader import load_workload  # noqa: E402
from lightrail.agents.replay.trace.model import Workload  # noqa: E402
from lightrail.controller.cli.embedded import (  # noqa: E402
    ChildEmulator,
    embedded_config,
    spawn_emulator,
)
from lightrail.controller.cli.progress import ProgressTask, progress_display  # noqa: E402
from lightrail.controller.config import (  # noqa: E402
    Config,
    EtcdTlsSection,
    FabricSection,
    build_fabric,
)
from lightrail.controller.domain.fabric import Fabric  # noqa: E402
from lightrail.controller.store.etcd_server import EmbeddedEtcd  # noqa: E402
from lightrail.drivers.base import CrossConnect  # noqa: E402
from lightrail.emulator.control import ControlClient  # noqa: E402
from lightrail.emulator.ocs import ChangeAction, ChangeRecord  # noqa: E402
from lightrail.emulator.servers.fabric import rail_section  # noqa: E402
from lightrail.v1 import operator_pb2, operator_pb2_grpc  # noqa: E402
from tests.invariants import Violation, check_holds  # noqa: E402

DLRM = REPO.parent / "shared" / "data" / "traces" / "param-dlrm-8rank" / "dlrm_kineto.tar.gz"
LEASE_TTL_S = 2.0
"""The controllers' leader lease TTL (etcd's minimum the config allows): takeovers are
reported in these units."""
DELAY_MS = 20.0
"""Reconfiguration delay of the emulated rails: the window a leader-kill aims into."""
ETCD_CASE_TTL_S = 6.0
"""The lease TTL of the etcd-member case: a leader keeps its authority for TTL/2 after its last
acknowledged keep-alive, and losing the raft leader costs etcd an election (500 ms election
timeout in tests/etcd_cluster.py) plus the client's failover to another member; a 2 s lease
(1 s of authority) cannot always ride that out, a production-like one must."""
DEVICE_LOSS_GRACE_S = 1.0
"""How long after a device dropped circuits on its own an admission onto them is still the
device's fault: the RESTCONF driver polls alarms every second (its default), so the controller
may learn of a reboot that late."""
STALL_S = 60.0
"""A replay that completes no iteration for this long is counted as stalled."""


# --- results ---------------------------------------------------------------------------------


RUN_LISTENERS: list[Callable[[CaseResult], None]] = []
"""Called with a case's result after each of its runs (``main``'s progress display)."""


@dataclass(slots=True)
class CaseResult:
    """One row of the table: ``times_s`` per run (what the case measures, seconds; scaled to
    lease TTLs where ``in_ttls``), the counts the invariant promises to keep at 0, and notes."""

    case: str
    runs: int = 0
    times_s: list[float] = field(default_factory=list)
    in_ttls: bool = False
    lost: int = 0
    doubled: int = 0
    unsafe: int = 0
    crashes: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def count_run(self) -> None:
        """One more run of the case done: ``runs`` + 1, then every ``RUN_LISTENERS`` entry."""
        self.runs += 1
        for listener in RUN_LISTENERS:
            listener(self)


    def cells(self) -> list[str]:
        """The table row's cells."""
        unit = " TTL" if self.in_ttls else " s"
        scale = 1 / LEASE_TTL_S if self.in_ttls else 1.0
        if self.times_s:
            xs = sorted(t * scale for t in self.times_s)
            p50 = f"{statistics.median(xs):.2f}{unit}"
            p99 = f"{xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]:.2f}{unit}"
        else:
            p50 = p99 = "-"
        return [self.case, str(self.runs), p50, p99, str(self.lost), str(self.doubled),
                str(self.unsafe), str(self.crashes)]


def print_table(results: Sequence[CaseResult]) -> None:
    """The campaign's table, then each case's explicit errors and notes."""
    head = ["case", "runs", "p50", "p99", "lost", "doubled", "unsafe", "crashes"]
    rows = [head, *(r.cells() for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for k, row in enumerate(rows):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if k == 0:
            print("  ".join("-" * w for w in widths))
    for r in results:
        if r.errors:
            print(f"{r.case}: explicit errors: "
                  + ", ".join(f"{k} x{v}" for k, v in sorted(r.errors.items())))
        for note in r.notes:
            print(f"{r.case}: {note}")


# --- the stack: etcd, emulator, replicas -----------------------------------------------------


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(slots=True)
class Replica:
    """One ``lightrail controller`` child process on a fixed gRPC port, logging in to the TL1
    switches as ``user``; restartable."""

    index: int
    config: Path
    grpc_target: str
    user: str
    log: Path
    proc: asyncio.subprocess.Process | None = None
    killed: bool = False
    """Set when the campaign killed or stopped it on purpose."""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self, timeout_s: float = 60.0) -> None:
        """Start it; returns once it serves gRPC (as a standby or leader)."""
        self.killed = False
        with self.log.open("ab") as err:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "lightrail.controller", "--config", str(self.config),
                "--announce=serving", stdout=asyncio.subprocess.PIPE, stderr=err,
                stdin=asyncio.subprocess.DEVNULL)
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        if not line:
            rc = await self.proc.wait()
            raise RuntimeError(f"replica {self.index} exited with {rc} before serving; "
                               f"see {self.log}")

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(sig)

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; SIGCONT first in case it is stopped."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.signal(signal.SIGKILL)
            await self.proc.wait()


async def serving(target: str) -> bool:
    """Whether the controller at ``target`` leads (gRPC health SERVING)."""
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            reply = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=0.5)
    except grpc.aio.AioRpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


@dataclass(slots=True)
class Stack:
    """A running stack: the emulator, the replicas and their addresses."""

    fabric: Fabric
    emulator: ChildEmulator
    control: ControlClient
    replicas: list[Replica]
    etcd_endpoints: list[str]

    @property
    def targets(self) -> str:
        """Every replica's address, for ``--controller``."""
        return ",".join(r.grpc_target for r in self.replicas)

    async def leader(self, timeout_s: float = 30.0, exclude: Replica | None = None) -> Replica:
        """The replica serving as leader (polled every 20 ms). Raises ``TimeoutError``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            live = [r for r in self.replicas if r.alive and r is not exclude]
            states = await asyncio.gather(*(serving(r.grpc_target) for r in live))
            for r, ok in zip(live, states, strict=True):
                if ok:
                    return r
            await asyncio.sleep(0.02)
        raise TimeoutError(f"no replica leads within {timeout_s} s")

    def crashed(self) -> list[Replica]:
        """Replicas that exited although the campaign did not kill them."""
        return [r for r in self.replicas
                if r.proc is not None and r.proc.returncode is not None and not r.killed]


def _with_login(section: FabricSection, user: str, password: str) -> FabricSection:
    """``section`` (a served rail section) with every TL1 switch's login set to
    ``user``/``password``."""
    assert section.rail is not None
    options = {sid: ({**o, "username": user, "password": password}
                     if section.rail.models.get(sid) == "tl1" else dict(o))
               for sid, o in section.rail.switch_options.items()}
    return section.model_copy(update={"rail": section.rail.model_copy(
        update={"switch_options": options})})


@contextlib.asynccontextmanager
async def stack(
    etcd_endpoints: list[str],
    *,
    replicas: int = 3,
    models: dict[str, str] | None = None,
    admission_timeout_s: float = 20.0,
    etcd_tls: EtcdTlsSection | None = None,
    lease_ttl_s: float = LEASE_TTL_S,
    tmp: Path,
) -> AsyncIterator[Stack]:
    """The emulator (demo-4x2 rails, TL1 unless ``models`` says otherwise per switch) and
    ``replicas`` controller processes against ``etcd_endpoints`` (over TLS with ``etcd_tls``);
    stops them on exit."""
    section = rail_section("demo-4x2", delay_ms=DELAY_MS)
    if models:
        assert section.rail is not None
        section = section.model_copy(update={"rail": section.rail.model_copy(
            update={"models": models})})
    accounts = {f"ctl-{i}": f"pw-{i}" for i in range(replicas)}
    async with spawn_emulator(section, accounts=accounts) as emulator, \
            ControlClient(emulator.control_url) as control:
        reps: list[Replica] = []
        for i in range(replicas):
            cfg: Config = embedded_config(etcd_endpoints[0],
                                          _with_login(emulator.section, f"ctl-{i}", f"pw-{i}"),
                                          admission_timeout_s=admission_timeout_s,
                                          replica_id=f"ctl-{i}")
            port = free_port()
            cfg = cfg.model_copy(update={
                "controller": cfg.controller.model_copy(update={"listen": f"127.0.0.1:{port}"}),
                "etcd": cfg.etcd.model_copy(update={"endpoints": etcd_endpoints,
                                                    "lease_ttl_s": lease_ttl_s,
                                                    "tls": etcd_tls}),
            })
            data = cfg.model_dump(mode="json")
            data["logging"] = {"level": "warning", "format": "console"}
            path = tmp / f"ctl-{i}.yaml"
            path.write_text(yaml.safe_dump(data), encoding="utf-8")
            reps.append(Replica(i, path, f"127.0.0.1:{port}", f"ctl-{i}", tmp / f"ctl-{i}.log"))
        st = Stack(build_fabric(emulator.section), emulator, control, reps, etcd_endpoints)
        try:
            await asyncio.gather(*(r.start() for r in reps))
            await st.leader()
            yield st
        finally:
            await asyncio.gather(*(r.stop() for r in reps))


# --- the replay --------------------------------------------------------------------------------


@dataclass(slots=True)
class Replay:
    """A replay running in this process against the stack, with its progress."""

    replayer: Replayer
    task: asyncio.Task[object]
    client: ControllerClient
    progress: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def stop(self) -> None:
        """Cancel the replay (mid-iteration) and wait for it; its holds are final after."""
        if not self.task.done():
            self.task.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):  # counted by the case
            await asyncio.wait_for(self.task, 30)

    async def iterations(self, n: int, timeout_s: float = STALL_S) -> bool:
        """Wait until ``n`` more iterations completed; False when it stalled or ended."""
        goal = self.progress + n
        deadline = time.monotonic() + timeout_s
        while self.progress < goal:
            if self.task.done():
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline:
                return self.progress >= goal
        return True


@contextlib.asynccontextmanager
async def replay(st: Stack, workload: Workload, job_id: str,
                 iterations: int = 100_000) -> AsyncIterator[Replay]:
    """A replay of ``workload`` (compute gaps scaled by 0.05) for ``iterations`` steps through
    one host agent per host, following the leader among every replica. Cancelled on exit."""
    hosts = [HostSlot(h.name, tuple(range(h.gpu_count))) for h in st.fabric.hosts.values()]
    replayer = Replayer(workload, st.targets, hosts, job_id=job_id, iterations=iterations,
                        time_scale=0.05, timeout_s=30.0)
    client = ControllerClient(st.targets, retry_budget_s=30.0)
    task: asyncio.Task[object] = asyncio.create_task(replayer.run(client), name=job_id)
    r = Replay(replayer, task, client)

    def on_progress(done: int, _total: int) -> None:
        r.progress = done
        r.changed.set()

    replayer.on_progress = on_progress
    try:
        yield r
    finally:
        await r.stop()
        await client.close()


# --- checks ------------------------------------------------------------------------------------


def doubled_makes(logs: dict[str, list[ChangeRecord]]) -> int:
    """Makes of a cross-connect that was already made (no break in between), per change log."""
    count = 0
    for log in logs.values():
        made: set[CrossConnect] = set()
        for rec in sorted(log, key=lambda r: r.at_s):
            if rec.action is ChangeAction.MAKE:
                count += rec.cross_connect in made
                made.add(rec.cross_connect)
            else:
                made.discard(rec.cross_connect)
    return count


async def leader_view(st: Stack) -> dict[str, frozenset[CrossConnect]]:
    """The leader's view of every switch (``ListCircuits``)."""
    leader = await st.leader()
    async with grpc.aio.insecure_channel(leader.grpc_target) as ch:
        reply = await operator_pb2_grpc.OperatorServiceStub(ch).ListCircuits(
            operator_pb2.ListCircuitsRequest(), timeout=10)
    out: dict[str, set[CrossConnect]] = {sid: set() for sid in st.fabric.switches}
    for x in reply.cross_connects:
        out.setdefault(x.switch_id, set()).add(CrossConnect(x.ingress, x.egress))
    return {sid: frozenset(v) for sid, v in out.items()}


async def _quiet_state(st: Stack, timeout_s: float = 10.0
                       ) -> tuple[dict[str, frozenset[CrossConnect]],
                                  dict[str, frozenset[CrossConnect]]]:
    """The leader's view and the switches' state once no switch changed for 1 s (and the view
    read before and after the switches agrees), or at ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last = -1
    while True:
        changes = sum(d.change_count for d in await st.control.devices())
        if changes == last or time.monotonic() > deadline:
            view = await leader_view(st)
            devices = {sid: (await st.control.device(sid)).cross_connects or frozenset()
                       for sid in st.fabric.switches}
            if view == await leader_view(st) or time.monotonic() > deadline:
                return view, devices
        last = changes
        await asyncio.sleep(1.0)


async def settle_and_check(st: Stack, result: CaseResult, replays: Sequence[Replay]) -> None:
    """After a case: compare the leader's view with the switches (lost, doubled), check every
    hold against the change logs (unsafe) and count crashed replicas."""
    view, devices = await _quiet_state(st)
    for sid in st.fabric.switches:
        lost, extra = view[sid] - devices[sid], devices[sid] - view[sid]
        result.lost += len(lost)
        result.doubled += len(extra)
        if lost or extra:
            result.notes.append(f"{sid}: leader's view lacks {sorted(extra)} and has "
                                f"{sorted(lost)} the switch lacks")
    logs = await st.control.change_logs()
    result.doubled += doubled_makes(logs)
    device_lost: list[Violation] = []
    for r in replays:
        violations = check_holds(st.fabric, r.replayer.placements, r.replayer.holds, logs,
                                 device_losses=device_lost,
                                 device_loss_grace_s=DEVICE_LOSS_GRACE_S)
        result.unsafe += len(violations)
        for v in violations[:3]:
            result.notes.append(f"unsafe: {v}")
    if device_lost:
        held = sum(1 for v in device_lost if v.problem.startswith("broken"))
        result.notes.append(
            f"circuits a device dropped on its own (a reboot losing its cross-connects), the "
            f"device's fault and not counted as unsafe: {held} rank-holds lost them while "
            f"held, {len(device_lost) - held} were admitted at most {DEVICE_LOSS_GRACE_S:g} s "
            "after the loss, before the controller could know (tests/invariants.check_holds "
            "device_losses)")
    crashed = st.crashed()
    result.crashes += len(crashed)
    for c in crashed:
        result.notes.append(f"replica {c.index} exited with {c.proc.returncode if c.proc else '?'}"
                            f" (log {c.log})")


# --- cases -------------------------------------------------------------------------------------


async def wait_for_write(st: Stack, timeout_s: float) -> bool:
    """Poll the switches until one receives a write command; False after ``timeout_s``."""
    async def writes() -> int:
        return sum(d.write_count for d in await st.control.devices())

    before = await writes()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await writes() > before:
            return True
        await asyncio.sleep(0.002)
    return False


async def leader_kill(st: Stack, workload: Workload, runs: int, rng: random.Random
                      ) -> CaseResult:
    """SIGKILL the leader ``runs`` times, each at a random point of a reconfiguration."""
    result = CaseResult("leader-kill", in_ttls=True)
    async with replay(st, workload, "kill") as rp:
        if not await rp.iterations(1):
            result.crashes += 1
            result.notes.append(f"replay did not start: {_outcome(rp.task)}")
            return result
        mid = 0
        for _ in range(runs):
            leader = await st.leader()
            await asyncio.sleep(rng.uniform(0.05, 0.5))
            if await wait_for_write(st, 5.0):
                mid += 1
                await asyncio.sleep(rng.uniform(0.0, DELAY_MS / 1000))
            leader.killed = True
            leader.signal(signal.SIGKILL)
            t0 = time.monotonic()
            await st.leader(timeout_s=10 * LEASE_TTL_S, exclude=leader)
            result.times_s.append(time.monotonic() - t0)
            result.count_run()
            assert leader.proc is not None
            await leader.proc.wait()
            # back as a standby while the replay goes on under the new leader
            _, going = await asyncio.gather(leader.start(), rp.iterations(1))
            if not going:
                result.crashes += 1
                result.notes.append(f"replay stalled or ended after kill {result.runs}: "
                                    f"{_outcome(rp.task)}")
                break
        result.notes.append(f"{mid} of {result.runs} kills landed while a switch was being "
                            f"written; {rp.progress} iterations replayed")
    await settle_and_check(st, result, [rp])  # once the replay stopped: its holds are final
    return result


async def leader_pause(st: Stack, workload: Workload, runs: int, rng: random.Random
                       ) -> CaseResult:
    """SIGSTOP the leader for 1.5 lease TTLs, SIGCONT it, count its device commands."""
    result = CaseResult("leader-pause", in_ttls=True)
    commands_after = 0
    async with replay(st, workload, "pause") as rp:
        if not await rp.iterations(1):
            result.crashes += 1
            result.notes.append(f"replay did not start: {_outcome(rp.task)}")
            return result
        for _ in range(runs):
            leader = await st.leader()
            await asyncio.sleep(rng.uniform(0.05, 0.5))
            leader.killed = True
            leader.signal(signal.SIGSTOP)
            t0 = time.monotonic()
            paused_at = t0 + 0.05  # commands already on the wire may still arrive
            await st.leader(timeout_s=10 * LEASE_TTL_S, exclude=leader)
            result.times_s.append(time.monotonic() - t0)
            result.count_run()
            await asyncio.sleep(max(0.0, t0 + 1.5 * LEASE_TTL_S - time.monotonic()))
            leader.signal(signal.SIGCONT)
            await asyncio.sleep(LEASE_TTL_S)  # time to send whatever it still would
            for sid, sw in st.fabric.switches.items():
                if sw.model != "tl1":
                    continue
                late = [c for c in await st.control.commands(sid)
                        if c.user == leader.user and c.at_s > paused_at]
                commands_after += len(late)
                if late:
                    result.notes.append(
                        f"replica {leader.index} sent to {sid} after it was stopped: "
                        + ", ".join(f"{c.code} at +{c.at_s - t0:.3f} s" for c in late))
            assert leader.proc is not None
            try:
                rc = await asyncio.wait_for(leader.proc.wait(), 10)
                result.notes.append(f"paused replica {leader.index} exited with {rc} "
                                    "(fenced) after SIGCONT")
            except TimeoutError:
                leader.signal(signal.SIGKILL)
                await leader.proc.wait()
                result.notes.append(f"paused replica {leader.index} still ran 10 s after "
                                    "SIGCONT; killed")
            await leader.start()
            if not await rp.iterations(1):
                result.crashes += 1
                result.notes.append(f"replay stalled after pause {result.runs}: "
                                    f"{_outcome(rp.task)}")
                break
    await settle_and_check(st, result, [rp])
    result.notes.append(f"device commands from a paused replica after it was stopped: "
                        f"{commands_after}")
    result.unsafe += commands_after
    return result


_FAULTS: list[Callable[[random.Random, int], dict[str, object]]] = [
    lambda rng, _n: {"fault": "unreachable", "on": True},
    lambda rng, _n: {"fault": "slow", "delay_s": rng.choice([0.05, 0.2])},
    lambda rng, _n: {"fault": "partial_apply", "nth": rng.randint(1, 2)},
    lambda rng, n: {"fault": "deny_port", "port": rng.randint(1, n)},
    lambda rng, _n: {"fault": "reboot", "keep_cross_connects": True, "down_s": 0.3},
    lambda rng, _n: {"fault": "reboot", "keep_cross_connects": False, "down_s": 0.3},
]


async def device_faults(st: Stack, workload: Workload, runs: int, rng: random.Random
                        ) -> CaseResult:
    """Inject ``runs`` seeded random faults, one at a time for 0.5-1.5 s, each during a
    replay of a few iterations; a replay that fails is counted by its error code and the next
    one starts."""
    result = CaseResult("device-faults")
    replays: list[Replay] = []
    k = 0
    while result.runs < runs:
        async with replay(st, workload, f"faults{k}", iterations=3) as rp:
            k += 1
            replays.append(rp)
            if not await rp.iterations(1):
                _count_outcome(result, rp.task)
                continue
            sid = rng.choice(sorted(st.fabric.switches))
            ports = st.fabric.switches[sid].capabilities.port_count
            fault = rng.choice(_FAULTS)(rng, ports)
            t0 = time.monotonic()
            await st.control.inject(sid, fault)
            result.count_run()
            await asyncio.sleep(rng.uniform(0.5, 1.5))
            await st.control.clear(sid)
            try:
                await asyncio.wait_for(asyncio.shield(rp.task), STALL_S)
                result.times_s.append(time.monotonic() - t0)
            except TimeoutError:
                result.crashes += 1
                result.notes.append(f"replay stalled after {fault} on {sid}")
            except BaseException:
                pass
            if rp.task.done():
                _count_outcome(result, rp.task)
    await settle_and_check(st, result, replays)
    return result


def _outcome(task: asyncio.Task[object]) -> str:
    if not task.done():
        return "still running"
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return "completed" if exc is None else f"{type(exc).__name__}: {exc}"


def _count_outcome(result: CaseResult, task: asyncio.Task[object]) -> None:
    """Count a finished replay: completed, an explicit error (by its code), or a crash."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is None:
        result.errors["completed"] = result.errors.get("completed", 0) + 1
        return
    cause = exc.__cause__ if isinstance(exc, ReplayError) else exc
    if isinstance(cause, PhaseError):
        key = cause.code.name.lower()
        result.errors[key] = result.errors.get(key, 0) + 1
    else:
        result.crashes += 1
        result.notes.append(f"replay failed without an explicit error: "
                            f"{type(exc).__name__}: {exc}")


async def etcd_member(workload: Workload, runs: int, rng: random.Random, tmp: Path
                      ) -> CaseResult:
    """Kill and restart an etcd member ``runs`` times (and compact once) under a replay."""
    from tests.etcd_cluster import EtcdCluster  # type: ignore[import-not-found,unused-ignore]

    result = CaseResult("etcd-member")
    async with EtcdCluster(members=3, tls=True) as cluster:
        files = cluster.client_tls
        assert files is not None
        tls = EtcdTlsSection(ca_file=str(files.ca_file), cert_file=str(files.cert_file),
                             key_file=str(files.key_file))
        await _etcd_member_runs(cluster, tls, workload, runs, rng, tmp, result)
    return result


async def _etcd_member_runs(cluster: Any, tls: EtcdTlsSection, workload: Workload, runs: int,
                            rng: random.Random, tmp: Path, result: CaseResult) -> None:
    async with stack(list(cluster.endpoints), etcd_tls=tls, lease_ttl_s=ETCD_CASE_TTL_S,
                     tmp=tmp) as st, \
            replay(st, workload, "etcd") as rp:
        if not await rp.iterations(1):
            result.crashes += 1
            result.notes.append(f"replay did not start: {_outcome(rp.task)}")
            return
        for i in range(runs):
            member = rng.randrange(3)
            t0 = time.monotonic()
            await cluster.kill(member)
            ok = await rp.iterations(1)
            await cluster.restart(member)
            result.count_run()
            if not ok:
                result.crashes += 1
                result.notes.append(f"replay stalled with member {member} down")
                break
            result.times_s.append(time.monotonic() - t0)
            if i == 0:
                await cluster.compact()
                if not await rp.iterations(1):
                    result.crashes += 1
                    result.notes.append("replay stalled after a compaction")
                    break
        await rp.stop()
        await settle_and_check(st, result, [rp])


# --- main ------------------------------------------------------------------------------------


CASES = ("leader-kill", "leader-pause", "device-faults", "etcd-member", "fuzz")
FUZZ_TESTS = ("tests/unit/test_fuzz_inputs.py", "tests/unit/test_fuzz_wire.py",
              "tests/integration/test_fuzz_grpc.py", "tests/integration/test_fuzz_drivers.py")
"""The property-based test modules the ``fuzz`` case runs."""


@dataclass(frozen=True, slots=True)
class Plan:
    """How many runs of each case, and the seed."""

    kills: int = 50
    pauses: int = 3
    device_faults: int = 20
    etcd_kills: int = 3
    seed: int = 1
    cases: tuple[str, ...] = CASES
    logs: Path | None = None
    """Where the replicas' configs and logs are kept (default: a temporary directory)."""
    fuzz_examples: int = 1000


async def fuzz(examples: int) -> CaseResult:
    """Run ``FUZZ_TESTS`` with ``examples`` examples per test (a child pytest, so its own
    controller and etcd); count the tests and the failures."""
    result = CaseResult("fuzz")
    env = {**os.environ, "LIGHTRAIL_FUZZ_EXAMPLES": str(examples), "LIGHTRAIL_REQUIRE_ETCD": "1"}
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FUZZ_TESTS,
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    passed = failed = 0
    for line in text.splitlines()[::-1]:
        if " passed" in line or " failed" in line:
            for count, word in re.findall(r"(\d+) (passed|failed|error)", line):
                passed += int(count) if word == "passed" else 0
                failed += int(count) if word != "passed" else 0
            break
    result.runs = passed + failed
    result.crashes = failed if proc.returncode in (0, 1) else max(failed, 1)
    if result.runs:
        result.times_s = [(time.monotonic() - t0) / result.runs] * result.runs
    result.notes.append(f"{examples} examples per test, pytest exit {proc.returncode}")
    result.notes.extend(line for line in text.splitlines() if line.startswith("FAILED"))
    return result


async def campaign(plan: Plan, workload: Workload | None = None) -> list[CaseResult]:
    """Run the cases of ``plan``; returns one result per case."""
    workload = workload or load_workload(DLRM)
    rng = random.Random(plan.seed)
    results: list[CaseResult] = []
    with contextlib.ExitStack() as dirs:
        tmp = plan.logs or Path(dirs.enter_context(
            tempfile.TemporaryDirectory(prefix="lightrail-faults-")))
        tmp.mkdir(parents=True, exist_ok=True)
        controller_cases = [c for c in ("leader-kill", "leader-pause") if c in plan.cases]
        if controller_cases:
            async with EmbeddedEtcd() as etcd, stack([etcd.endpoint], tmp=tmp) as st:
                if "leader-kill" in plan.cases:
                    results.append(await leader_kill(st, workload, plan.kills, rng))
                if "leader-pause" in plan.cases:
                    results.append(await leader_pause(st, workload, plan.pauses, rng))
        if "device-faults" in plan.cases:
            async with EmbeddedEtcd() as etcd, stack(
                    [etcd.endpoint], replicas=1, tmp=tmp,
                    models={"ocs-rail0": "tl1", "ocs-rail1": "restconf"}) as st:
                results.append(await device_faults(st, workload, plan.device_faults, rng))
        if "etcd-member" in plan.cases:
            results.append(await etcd_member(workload, plan.etcd_kills, rng, tmp))
    if "fuzz" in plan.cases:
        results.append(await fuzz(plan.fuzz_examples))
    return results


def planned_runs(plan: Plan) -> dict[str, int]:
    """How many runs each case of ``plan`` makes (fuzz: its tests, counted once at the end)."""
    runs = {"leader-kill": plan.kills, "leader-pause": plan.pauses,
            "device-faults": plan.device_faults, "etcd-member": plan.etcd_kills, "fuzz": 0}
    return {c: runs[c] for c in plan.cases}


@contextlib.contextmanager
def campaign_progress(plan: Plan, console: Console | None = None
                      ) -> Iterator[ProgressTask]:
    """A progress display of the campaign's runs (``controller/cli/progress.py``: on stderr,
    drawn only on a terminal), advanced by ``CaseResult.count_run`` while the block runs."""
    planned = planned_runs(plan)
    done: dict[str, int] = {}
    with progress_display("fault campaign", sum(planned.values()), console=console) as bar:

        def listener(result: CaseResult) -> None:
            done[result.case] = result.runs
            bar.update(sum(done.values()), description=(
                f"fault campaign: {result.case} {result.runs}/{planned.get(result.case, 0)}"))

        RUN_LISTENERS.append(listener)
        try:
            yield bar
        finally:
            RUN_LISTENERS.remove(listener)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--kills", type=int, default=50)
    p.add_argument("--pauses", type=int, default=3)
    p.add_argument("--device-faults", type=int, default=20)
    p.add_argument("--etcd-kills", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fuzz-examples", type=int, default=1000,
                   help="examples per property-based test in the fuzz case (CI runs 50-150)")
    p.add_argument("--logs", type=Path, default=None,
                   help="keep the replicas' configs and logs in this directory")
    p.add_argument("--cases", default=",".join(CASES),
                   help=f"comma-separated subset of {', '.join(CASES)}")
    args = p.parse_args(argv)
    cases = tuple(c.strip() for c in args.cases.split(",") if c.strip())
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        p.error(f"--cases: unknown {unknown} (known: {', '.join(CASES)})")
    if not DLRM.exists():
        print(f"faults: {DLRM} not found (the shared data lives beside the repository)",
              file=sys.stderr)
        return 2
    plan = Plan(args.kills, args.pauses, args.device_faults, args.etcd_kills, args.seed, cases,
                args.logs, args.fuzz_examples)
    started = time.monotonic()
    with campaign_progress(plan):
        results = asyncio.run(campaign(plan))
    print(f"fault campaign, seed {plan.seed}, lease TTL {LEASE_TTL_S:g} s, reconfiguration "
          f"delay {DELAY_MS:g} ms, {time.monotonic() - started:.0f} s")
    print_table(results)
    bad = sum(r.lost + r.doubled + r.unsafe + r.crashes for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
