"""Hot-path benchmark of the phase protocol (DESIGN.md "Phase protocol"): EnterPhase -> admission.

Run: ``.venv/bin/python bench/hot_path.py [--quick] [--n 8 64 256 2048] [--repeat 3]
[--workload ring-pair mixed] [--transport batch32 unary agent8 agent32] [--delay-ms 0]
[--generator cxx python] [--measured B] [--max-measured-s S] [--cell-timeout-s S]
[--pair-dependency] [--no-pin] [--json] [--instances FILE]`` (``make bench``: ``make
loadgen`` when gRPC C++ is installed, then the defaults; ``--help`` says what each does). A
script, not a test (pytest does not collect ``bench/``).

Method (after the way the Opus artifact's C++ controller was measured)
-----------------------------------------------------------------------
* The controller runs as a SEPARATE PROCESS (``lightrail controller --config FILE``) against a
  private etcd (``lightrail.controller.store.etcd_server.EmbeddedEtcd``); this process is only
  the load side (uvloop). With two or more cores the controller is pinned to the first core
  and this process, etcd and the C++ load generator (children inherit the affinity) to the
  second (``--no-pin`` to leave them free), so the two sides never take turns on one core; the
  report says which core each got. One etcd + controller per (N, delay, run); runs are
  interleaved (run 1 of every cell, then run 2, ...) and each cell is summarised by its median
  and range: this machine's speed swings by tens of percent.
* Fabric ``rail: {hosts: N, gpus_per_host: 1}``: ONE rank per emulated host, all on GPU 0, so
  every rank's NIC lands on the single rail-0 OCS (N x N ports). With the usual 8 GPUs per host,
  N=8 would be one host and no phase would need a circuit; here every phase reconfigures rail 0.
* One job of N ranks loops over phase boundaries. In the ``ring-pair`` workload (the C++
  reference's method) a *boundary* b is two phases:
  1. ``ALL_REDUCE`` over ``ProcessGroup.of(range(N))`` (a ring over the N hosts: N
     cross-connects);
  2. ``SEND_RECV`` over the PP pair {0, P} with P = 8, or N/2 when N < 16 (N=8: ranks 0 and 4):
     two hosts on rail 0 that are not ring neighbours, so the pair breaks 4 ring cross-connects
     and makes 2, and the next ring restores them. Every phase therefore reconfigures rail 0:
     2 reconfigurations per boundary (checked: the "recfg/b" column counts the device applies
     that changed cross-connects, ``lightrail_reconfigurations_total`` scraped from the
     controller before and after the cell). With provisioning (the controller's default) the
     pair's circuits are made as the ring is released, in the same message as the pair's
     enters, so the pair is admitted without waiting on the wire, but its latency still
     includes that switch.
  Each rank: enter, wait until every rank of the phase is admitted (a barrier, like a real
  collective), release, next phase. No compute gap. Ranks outside the pair go on to the next
  ring at once; the coordinator holds that ring back until ranks 0 and P have entered it too
  (``lightrail.controller.core.scheduling.held_back``), so no artificial pipeline dependency
  is needed any more (``--pair-dependency`` restores it for the per-rank transports).
* The ``mixed`` workload (batch transports, N >= 10) makes a boundary of nine phase instances:
  the DP ring, four PP pairs {i, i + N/2} and an EP all-to-all over five ranks as its four
  shift matchings (``bench/lean_load.py`` ``Workload``); its phases/s counts all nine.
* Iteration number = boundary index b; every phase has ``seq`` 0.
* Transports: ``batch32`` (default) = the batched wire, one PhaseStream per 32 ranks with
  ``EnterMany`` / ``ReleaseMany`` up and ``AdmitMany`` down, driven by a lean generator
  (``bench/lean_load.py`` ``LeanLoad``: the workload, the stop rule and the timing points).
  ``--generator cxx`` (the default once ``make loadgen`` has built ``bench/loadgen``) runs it
  as a C++ program (``bench/cxx_load.py``: this process writes LeanLoad's plan, streams and
  moves into a spec; the binary sends the same messages in the same order on the same
  streams, a blocking reader thread per stream handling the completion its batch brings,
  writes included, under one mutex), without the Python client's own ~110 µs of CPU per
  write + read and two task hops per phase instance, which inflate the latency at small N;
  ``--generator python`` runs it here (one writer coroutine, one reader per stream);
  ``unary`` = one ``lightrail.agents.client.ControllerClient`` (own gRPC channel) per rank;
  ``agent8`` / ``agent32`` = one ``lightrail.agents.host.agent.HostAgent`` per 8 / 32 ranks
  and a task per rank (the agent batches the enters that reach it together into
  ``EnterMany``), ring-pair only.

What is counted
---------------
* Admission latency, per phase instance (one phase of one boundary): for every rank of the
  phase, (its admission time) - (the time the LAST rank of that phase sent its enter),
  floored at 0. p50 / p99 over all ranks of all measured phase instances (ring and pair),
  in ms. It includes the reconfiguration delay delta when the controller has to wait for it.
* ``boundaries``: measured boundaries (warm-up boundaries excluded). ``boundaries/s`` =
  boundaries / window, window = from the first enter of the first measured boundary to the
  last release of the last one. ``phases/s`` = 2 x boundaries/s (phase instances).
* CPU: controller (and etcd) process CPU time from ``/proc/PID/stat`` and this process's
  ``time.process_time()`` (plus, for ``--generator cxx``, the binary's own CPU, all threads,
  as it reports it): as % of one core over the cell, and per measured boundary in µs (and per
  rank-boundary: divided by N) for the batch cells.
* Steal: the hypervisor's steal time on the two pinned cores over each cell (``/proc/stat``,
  ``support.cpu_steal_s``), % of one core (``steal%``; ``steal_pct`` in ``--json``). On this
  kind of VM it ranges from 0 on a quiet host to tens of % when the host is overcommitted,
  and a run's latency tail follows it: read a cell's figures together with its steal.
* Other processes: the CPU the same cores gave to any process but the cell's own (controller,
  etcd, generator, this process) over each cell: their busy time in ``/proc/stat``
  (``support.cpu_busy_s``, tick-sampled) less those processes' CPU (exact), % of one core,
  floored at 0 (``other%``; ``other_pct`` in ``--json``). On a quiet machine the difference
  is -13 to +13 % (ticks against exact clocks); from ``SHARED_OTHER_PCT`` on, the verdict line
  counts the run as one that shared its cores with another job, whose figures are not the
  controller's alone (a process spinning on the controller's core: 45 %, and the N=8 p99
  went from 0.64 to 5.3 ms).

* The machine's floor: before the cells, ``bench/wake_floor.py`` times a one-byte pipe round
  trip between two processes pinned to the controller's and the generator's cores (and on one
  core; not with ``--no-pin``, where the two sides have no cores of their own); the report
  prints it under the table (``wake_floor`` in ``--json``). Each phase's
  latency holds at least one such wake there and back, which on a virtual machine costs tens
  of µs and swings with the host's load.
* ``--instances FILE``: every batch cell's measured phase instances, one JSON object per cell
  and line (``instances_record``): when each instance's last enter was sent and when each
  stream's ``AdmitMany`` arrived, in CLOCK_MONOTONIC seconds (``time.perf_counter``; the C++
  generator's ``steady_clock``), so a tail can be laid beside a scheduler trace taken at the
  same time (``perf record -e sched:sched_switch -e sched:sched_wakeup -a -k CLOCK_MONOTONIC``)
  and told apart: the controller deciding late, or an admission written in time and read late.
* ``--controller-wrapper CMD``: the controller runs under ``CMD`` (a profiler or
  ``valgrind``), with ``--controller-timeout-s`` for its slower start and exit;
  ``bench/controller_instructions.py`` uses it to count the whole controller's instructions
  per boundary with callgrind.

Reference: the Opus artifact's C++ controller, measured this way on a 2-core machine at delay 0:
N=8 p99 0.48 ms, 1255 phases/s; N=64 p99 1.21 ms, 572/s; N=256 p99 3.67 ms, 214/s. Since it
is not stated whether its "phases" are phase instances or ring+pair boundaries, the comparison
is strict: our boundaries/s against its phases/s (the phases/s ratio is printed too).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lightrail.controller.cli import grpc_environment

# Before grpc is imported: the daemon's gRPC environment, as tests/conftest.py does. This
# process starts the controller, etcd and bench/loadgen while gRPC threads run in it.
os.environ.update(grpc_environment(os.environ))

import grpc
import uvloop
from cxx_load import BUILD_HINT, LOADGEN, CxxLoad, loadgen_built
from grpc_health.v1 import health_pb2, health_pb2_grpc
from lean_load import MIXED_MIN_N, WORKLOADS, LeanLoad, LoadError, Workload, pair_peer
from prometheus_client.parser import text_string_to_metric_families
from support import (
    Child,
    at_least,
    cpu_busy_s,
    cpu_steal_s,
    description,
    nonnegative_ms,
    percentile,
    positive_s,
    proc_cpu_s,
)

from lightrail.agents.client import ControllerClient
from lightrail.agents.errors import Admission
from lightrail.agents.host.agent import HostAgent
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.logs import configure_logging
from lightrail.controller.store.etcd_server import EmbeddedEtcd

REPO = Path(__file__).resolve().parents[1]
LIGHTRAIL = REPO / ".venv" / "bin" / "lightrail"

TRANSPORTS = ("batch32", "unary", "agent8", "agent32")
RANKS_PER_AGENT = {"agent8": 8, "agent32": 32, "batch32": 32}
DEFAULT_TRANSPORTS = ("batch32",)
DEFAULT_NS = (8, 64, 256, 2048)
DEFAULT_DELAYS_MS = (0.0,)
DEFAULT_REPEAT = 3
GENERATORS = ("cxx", "python")
"""Load side of the batch cells: ``bench/loadgen`` (C++, ``cxx_load.CxxLoad``) or
``lean_load.LeanLoad`` (Python)."""


@dataclass(frozen=True, slots=True)
class Reference:
    """One figure of the Opus artifact's C++ controller (delay 0, 2-core machine)."""

    n: int
    p99_ms: float
    phases_per_s: float


REFERENCE = (Reference(8, 0.48, 1255.0), Reference(64, 1.21, 572.0), Reference(256, 3.67, 214.0))


@dataclass(frozen=True, slots=True)
class Counts:
    """Boundaries to run for one N: ``warmup`` excluded, then ``measured`` (fewer if the cell
    runs past ``max_measured_s``)."""

    warmup: int
    measured: int


FULL_COUNTS = {8: Counts(20, 400), 64: Counts(10, 200), 256: Counts(5, 100),
               2048: Counts(3, 30)}
QUICK_COUNTS = {8: Counts(5, 60), 64: Counts(3, 40), 256: Counts(2, 20), 2048: Counts(2, 6)}


def counts_for(n: int, quick: bool) -> Counts:
    """The counts for N (the nearest tabulated N at or above it)."""
    table = QUICK_COUNTS if quick else FULL_COUNTS
    for k in sorted(table):
        if n <= k:
            return table[k]
    return table[max(table)]


@dataclass(slots=True)
class CellResult:
    """One cell of the matrix. Times in ms, rates per second, CPU in % of one core."""

    transport: str
    n: int
    delay_ms: float
    ranks_per_stream: int
    repeat: int = 0
    workload: str = "ring-pair"
    generator: str = "python"
    """The load side: ``cxx`` or ``python`` (per-rank transports: always python)."""
    boundaries: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    boundaries_per_s: float = 0.0
    phases_per_s: float = 0.0
    reconfigurations_per_boundary: float = 0.0
    """Device reconfigurations (applies that changed cross-connects, the controller's
    ``lightrail_reconfigurations_total``) per boundary, over the whole cell."""
    switched_admissions_per_boundary: float = 0.0
    """Phase instances whose admission waited for a switch, per measured boundary (a phase
    provisioned ahead, at the release of the one before, is admitted as a no-op)."""
    device_ms: float = 0.0
    wall_s: float = 0.0
    controller_cpu_pct: float = 0.0
    etcd_cpu_pct: float = 0.0
    generator_cpu_pct: float = 0.0
    controller_us_per_boundary: float = 0.0
    """Controller CPU over the measured boundaries, per boundary, µs."""
    generator_us_per_boundary: float = 0.0
    steal_pct: float | None = None
    """The hypervisor's steal time on the two pinned cores (every core when not pinned) over
    the cell, % of one core (``support.cpu_steal_s``): time this VM's vCPUs wanted to run and
    did not. None where ``/proc/stat`` has no steal."""
    other_pct: float | None = None
    """CPU the cell's cores gave to other processes (neither the controller, its etcd, the
    generator nor this process) over the cell, % of one core (``other_pct``): a run that
    shared its cores with another job. None where ``/proc/stat`` could not be read."""
    error: str | None = None

    @property
    def controller_us_per_rank_boundary(self) -> float:
        """Controller CPU per rank and boundary, µs."""
        return self.controller_us_per_boundary / self.n


# --- processes ------------------------------------------------------------------------------


def free_port() -> int:
    """A port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ControllerProcess:
    """``lightrail controller`` as a child process, with its log in ``workdir``."""

    def __init__(self, workdir: Path, etcd_endpoint: str, n: int, delay_ms: float,
                 cpu: int | None = None, *, fabric: str | None = None,
                 lightrail: Path = LIGHTRAIL, wrapper: Sequence[str] = ()) -> None:
        """``fabric``: the config's fabric section (YAML flow), default one rail of ``n``
        one-GPU hosts with ``delay_ms``; ``lightrail``: the entry point to run; ``wrapper``:
        a command line the controller runs under (``--controller-wrapper``), empty for
        none."""
        self.cpu = cpu
        self.lightrail = lightrail
        self.wrapper = tuple(wrapper)
        if fabric is None:
            fabric = (f"{{rail: {{hosts: {n}, gpus_per_host: 1}}, "
                      f"reconfiguration_delay_ms: {delay_ms}}}")
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.metrics_target = f"127.0.0.1:{free_port()}"
        self.config_path = workdir / "controller.yaml"
        self.log_path = workdir / "controller.log"
        self.config_path.write_text(
            "controller: {replica_id: bench, "
            f'listen: "{self.target}", metrics_listen: "{self.metrics_target}", '
            "admission_timeout_s: 60}\n"
            f'etcd: {{endpoints: ["{etcd_endpoint}"], lease_ttl_s: 10}}\n'
            f"fabric: {fabric}\n"
            "logging: {level: warning}\n",
            encoding="utf-8",
        )
        self.proc: Child | None = None

    def device_reconfigurations(self) -> float:
        """``lightrail_reconfigurations_total`` summed over the switches (applies that changed
        cross-connects), from the controller's Prometheus endpoint; NaN when unreadable.
        Blocking (urllib): callers in the loop run it with ``asyncio.to_thread``."""
        try:
            with urllib.request.urlopen(f"http://{self.metrics_target}/metrics",
                                        timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            return math.nan
        return sum(s.value for fam in text_string_to_metric_families(text)
                   if fam.name == "lightrail_reconfigurations"
                   for s in fam.samples if s.name == "lightrail_reconfigurations_total")

    @property
    def pid(self) -> int | None:
        """The controller's pid while it runs."""
        return self.proc.pid if self.proc is not None else None

    def log_tail(self, nbytes: int = 3000) -> str:
        """The end of the controller's stdout/stderr."""
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-nbytes:].decode(errors="replace")

    async def start(self, timeout_s: float = 30.0) -> None:
        """Start it and poll the gRPC health check until SERVING (each probe bounded to 1 s,
        all by ``timeout_s``). Raises RuntimeError with the log tail."""
        with self.log_path.open("ab") as log_file:
            cpu = self.cpu
            self.proc = Child([*self.wrapper, str(self.lightrail), "controller", "--config",
                               str(self.config_path)], cpu,
                              stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        async with grpc.aio.insecure_channel(self.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if self.proc.returncode is not None:
                    raise RuntimeError(f"controller exited with {self.proc.returncode}:\n"
                                       f"{self.log_tail()}")
                if loop.time() > deadline:
                    raise RuntimeError(f"controller not SERVING on {self.target} within "
                                       f"{timeout_s} s:\n{self.log_tail()}")
                try:
                    resp = await stub.Check(health_pb2.HealthCheckRequest(service=""),
                                            timeout=1.0, wait_for_ready=True)
                    if resp.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.05)

    async def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, wait ``timeout_s``, then SIGKILL. Returns the exit code."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout_s)
            except TimeoutError:
                print(f"  controller pid {proc.pid} ignored SIGTERM for {timeout_s} s; killing",
                      file=sys.stderr)
                proc.kill()
                await asyncio.wait_for(proc.wait(), timeout_s)
        return proc.returncode


# --- transports -----------------------------------------------------------------------------


class RankTransport(Protocol):
    """What a rank uses to enter and release phases."""

    async def enter(self, rank: int, phase: PhaseKey, iteration: int) -> Admission: ...

    async def release(self, rank: int, phase: PhaseKey, iteration: int) -> None: ...

    async def close(self) -> None: ...


class UnaryTransport:
    """One ``ControllerClient`` (its own channel) per rank."""

    def __init__(self, target: str, job_id: str, n: int, timeout_s: float) -> None:
        self.job_id = job_id
        self.timeout_s = timeout_s
        self.clients = [ControllerClient(target, retry_budget_s=2.0) for _ in range(n)]

    async def connect(self, timeout_s: float) -> None:
        """Nothing to do: channels connect on the first call (inside the warm-up)."""

    async def enter(self, rank: int, phase: PhaseKey, iteration: int) -> Admission:
        return await self.clients[rank].enter(self.job_id, rank, phase, iteration,
                                              self.timeout_s)

    async def release(self, rank: int, phase: PhaseKey, iteration: int) -> None:
        await self.clients[rank].release_phase(self.job_id, rank, phase, iteration)

    async def close(self) -> None:
        for c in self.clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.close(), 5.0)


class AgentTransport:
    """One ``HostAgent`` (one PhaseStream) per ``per_agent`` consecutive ranks."""

    def __init__(self, target: str, job_id: str, n: int, per_agent: int,
                 timeout_s: float) -> None:
        self.job_id = job_id
        self.timeout_s = timeout_s
        self.per_agent = per_agent
        self.agents = [HostAgent(f"agent{k}", target, reconnect_budget_s=5.0)
                       for k in range(math.ceil(n / per_agent))]

    async def connect(self, timeout_s: float) -> None:
        """Start every agent and wait until its stream is up."""
        for a in self.agents:
            a.start()
        for a in self.agents:
            await a.wait_connected(timeout_s)

    async def enter(self, rank: int, phase: PhaseKey, iteration: int) -> Admission:
        return await self.agents[rank // self.per_agent].enter(
            self.job_id, rank, phase, iteration, self.timeout_s)

    async def release(self, rank: int, phase: PhaseKey, iteration: int) -> None:
        self.agents[rank // self.per_agent].release(self.job_id, rank, phase, iteration)

    async def close(self) -> None:
        for a in self.agents:
            with contextlib.suppress(Exception):
                await a.close(5.0)


# --- load generator -------------------------------------------------------------------------


@dataclass(slots=True)
class _Instance:
    """One phase of one boundary: per-rank send / admission times (perf_counter seconds)."""

    expected: int
    sends: list[float] = field(default_factory=list)
    admits: list[float] = field(default_factory=list)
    releases: list[float] = field(default_factory=list)
    switched: bool = False
    device_s: float = 0.0
    all_in: asyncio.Event = field(default_factory=asyncio.Event)


class StallError(RuntimeError):
    """A barrier or the whole cell did not complete in time."""


class Generator:
    """Drives N ranks through ring / pair boundaries over one transport."""

    def __init__(
        self,
        transport: RankTransport,
        n: int,
        counts: Counts,
        *,
        max_measured_s: float,
        barrier_timeout_s: float,
        pair_dependency: bool,
    ) -> None:
        self.transport = transport
        self.n = n
        self.counts = counts
        self.max_measured_s = max_measured_s
        self.barrier_timeout_s = barrier_timeout_s
        self.pair_dependency = pair_dependency
        self.ring = PhaseKey(ProcessGroup.of(range(n)), Collective.ALL_REDUCE)
        self.pair_ranks = (0, pair_peer(n))
        self.pair = PhaseKey(ProcessGroup.of(self.pair_ranks), Collective.SEND_RECV)
        self.stop_at = counts.warmup + counts.measured
        self.max_started = -1
        self.instances: dict[tuple[int, str], _Instance] = {}
        self.warmup_done = asyncio.Event()

    def _inst(self, b: int, kind: str) -> _Instance:
        inst = self.instances.get((b, kind))
        if inst is None:
            inst = _Instance(self.n if kind == "ring" else 2)
            self.instances[(b, kind)] = inst
        return inst

    async def _barrier(self, event: asyncio.Event, what: str) -> None:
        try:
            await asyncio.wait_for(event.wait(), self.barrier_timeout_s)
        except TimeoutError:
            raise StallError(f"barrier of {what} not complete after "
                             f"{self.barrier_timeout_s} s") from None

    async def _phase(self, rank: int, key: PhaseKey, b: int, kind: str) -> None:
        inst = self._inst(b, kind)
        inst.sends.append(time.perf_counter())
        adm = await self.transport.enter(rank, key, b)
        inst.admits.append(time.perf_counter())
        if not adm.noop:
            inst.switched = True
            inst.device_s = max(inst.device_s, adm.device_s)
        if len(inst.admits) >= inst.expected:
            inst.all_in.set()
        await self._barrier(inst.all_in, f"{kind} of boundary {b}")
        await self.transport.release(rank, key, b)
        inst.releases.append(time.perf_counter())

    async def _rank(self, rank: int) -> None:
        in_pair = rank in self.pair_ranks
        b = 0
        while b < self.stop_at:
            self.max_started = max(self.max_started, b)
            if b == self.counts.warmup:
                self.warmup_done.set()
            await self._phase(rank, self.ring, b, "ring")
            if in_pair:
                await self._phase(rank, self.pair, b, "pair")
            elif self.pair_dependency:
                await self._barrier(self._inst(b, "pair").all_in, f"pair of boundary {b}")
            b += 1

    async def _time_cap(self) -> None:
        """After ``max_measured_s`` past the warm-up, stop at the next boundary (keeping at
        least 5 measured)."""
        w = self.counts.warmup
        await self.warmup_done.wait()
        await asyncio.sleep(self.max_measured_s)
        self.stop_at = max(min(self.stop_at, self.max_started + 1), w + 5)

    def describe_stall(self) -> str:
        """Which phase instances are incomplete (for a stall report)."""
        lines = []
        for (b, kind), inst in sorted(self.instances.items()):
            if len(inst.admits) < inst.expected or len(inst.releases) < inst.expected:
                lines.append(f"boundary {b} {kind}: {len(inst.sends)} sent, "
                             f"{len(inst.admits)} admitted, {len(inst.releases)} released of "
                             f"{inst.expected}")
        return "; ".join(lines[:6]) or "no incomplete phase"

    async def run(self, cell_timeout_s: float) -> None:
        """Run every rank to ``stop_at``. Raises ``StallError`` or the first rank error."""
        cap = asyncio.create_task(self._time_cap(), name="time-cap")
        try:
            async with asyncio.timeout(cell_timeout_s):
                async with asyncio.TaskGroup() as tg:
                    for r in range(self.n):
                        tg.create_task(self._rank(r), name=f"rank{r}")
        except TimeoutError:
            raise StallError(f"cell did not finish within {cell_timeout_s} s: "
                             f"{self.describe_stall()}") from None
        except ExceptionGroup as eg:
            first = eg.exceptions[0]
            raise StallError(f"{type(first).__name__}: {first} | "
                             f"{self.describe_stall()}") from first
        finally:
            cap.cancel()

    def summarize(self, result: CellResult) -> None:
        """Fill the latency and rate fields of ``result`` from the measured boundaries."""
        w = self.counts.warmup
        measured = [b for b in range(w, self.stop_at) if (b, "pair") in self.instances]
        lat: list[float] = []
        switched = 0
        device: list[float] = []
        for b in measured:
            for kind in ("ring", "pair"):
                inst = self.instances[(b, kind)]
                last_send = max(inst.sends)
                lat.extend(max(0.0, a - last_send) * 1e3 for a in inst.admits)
                if inst.switched:
                    switched += 1
                    device.append(inst.device_s * 1e3)
        if not measured:
            return
        start = min(self.instances[(measured[0], "ring")].sends)
        end = max(max(self.instances[(measured[-1], k)].releases) for k in ("ring", "pair"))
        window = end - start
        result.boundaries = len(measured)
        result.p50_ms = percentile(lat, 0.50)
        result.p99_ms = percentile(lat, 0.99)
        result.max_ms = max(lat)
        result.boundaries_per_s = len(measured) / window if window > 0 else 0.0
        result.phases_per_s = 2 * result.boundaries_per_s
        result.switched_admissions_per_boundary = switched / len(measured)
        result.device_ms = sum(device) / len(device) if device else 0.0


# --- matrix ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Options:
    """Command-line choices. ``cpus``: (controller core, generator core), or None when not
    pinned."""

    ns: tuple[int, ...]
    delays_ms: tuple[float, ...]
    transports: tuple[str, ...]
    quick: bool
    json: bool
    pair_dependency: bool
    max_measured_s: float
    cell_timeout_s: float
    repeat: int
    cpus: tuple[int, int] | None
    measured: int | None = None
    """Measured boundaries per cell instead of the table's (profiling)."""
    workloads: tuple[str, ...] = ("ring-pair",)
    """The workloads of the batch cells."""
    generator: str = "python"
    """The batch cells' load side (``GENERATORS``)."""
    instances: Path | None = None
    """Where the batch cells' measured phase instances are appended (``instances_record``)."""
    controller_wrapper: tuple[str, ...] = ()
    """A command line the controller runs under (``valgrind --tool=callgrind``, ``perf
    record``): prepended to its command; empty for none."""
    controller_timeout_s: float = 30.0
    """How long the controller may take to serve, and to exit after SIGTERM, s."""


def log(msg: str) -> None:
    """Progress, to stderr."""
    print(msg, file=sys.stderr, flush=True)


@dataclass(slots=True)
class _CpuMark:
    """CPU seconds of the controller, etcd and this process, the wall clock, and the steal and
    busy seconds of the cell's cores, at one moment."""

    controller_s: float
    etcd_s: float
    generator_s: float
    wall_s: float
    steal_s: float | None
    busy_s: float | None
    """``support.cpu_busy_s`` of the cell's cores: every process's CPU on them."""


def _mark(ctrl: ControllerProcess, etcd: EmbeddedEtcd, cpus: tuple[int, int] | None) -> _CpuMark:
    return _CpuMark(proc_cpu_s(ctrl.pid), proc_cpu_s(etcd.pid), time.process_time(),
                    time.perf_counter(), cpu_steal_s(cpus), cpu_busy_s(cpus))


def steal_pct(start_s: float | None, end_s: float | None, wall_s: float) -> float | None:
    """Steal seconds between two ``cpu_steal_s`` readings as % of one core over ``wall_s``;
    None when either reading is missing or the wall is empty."""
    if start_s is None or end_s is None or wall_s <= 0:
        return None
    return (end_s - start_s) / wall_s * 100


def other_pct(start_busy_s: float | None, end_busy_s: float | None, own_s: float,
              wall_s: float) -> float | None:
    """The cores' busy seconds between two ``cpu_busy_s`` readings less ``own_s`` (the CPU
    seconds of the cell's own processes over the same span), as % of one core over
    ``wall_s``, floored at 0 (the two come from different counters, each to a tick); None
    when either reading is missing or the wall is empty."""
    if start_busy_s is None or end_busy_s is None or wall_s <= 0:
        return None
    return max(0.0, (end_busy_s - start_busy_s - own_s) / wall_s * 100)


def cpu_figures(result: CellResult, start: _CpuMark, end: _CpuMark) -> None:
    """Fill ``result``'s wall, CPU %, steal and other-process figures for the span between two
    marks (``end.generator_s`` with the C++ generator's own CPU added, where there is one)."""
    wall = end.wall_s - start.wall_s
    result.wall_s = wall
    controller_s = end.controller_s - start.controller_s
    etcd_s = end.etcd_s - start.etcd_s
    generator_s = end.generator_s - start.generator_s
    result.controller_cpu_pct = controller_s / wall * 100
    result.etcd_cpu_pct = etcd_s / wall * 100
    result.generator_cpu_pct = generator_s / wall * 100
    result.steal_pct = steal_pct(start.steal_s, end.steal_s, wall)
    result.other_pct = other_pct(start.busy_s, end.busy_s, controller_s + etcd_s + generator_s,
                                 wall)


async def run_lean_cell(
    ctrl: ControllerProcess, etcd: EmbeddedEtcd, transport: str, n: int, delay_ms: float,
    opts: Options, repeat: int, workload: str,
) -> CellResult:
    """One batched (EnterMany) cell of ``workload``: ``bench/lean_load.py``, run in this
    process (``opts.generator`` python) or by ``bench/loadgen`` (cxx; its CPU counts as the
    generator's)."""
    per_stream = min(RANKS_PER_AGENT[transport], n)
    result = CellResult(transport, n, delay_ms, per_stream, repeat, workload, opts.generator)
    job_id = f"bench-{transport}-{workload}-n{n}-r{repeat}"
    admin = ControllerClient(ctrl.target, retry_budget_s=5.0)
    counts = counts_for(n, opts.quick)
    if opts.measured is not None:
        counts = Counts(counts.warmup, opts.measured)
    kind = CxxLoad if opts.generator == "cxx" else LeanLoad
    load = kind(ctrl.target, job_id, Workload.build(workload, n), per_stream,
                counts.warmup, counts.measured, opts.max_measured_s)
    marks: list[_CpuMark] = []
    load.on_measured = lambda: marks.append(_mark(ctrl, etcd, opts.cpus))
    try:
        await admin.register_job(job_id, [RankPlacement(r, f"host{r}", 0) for r in range(n)],
                                 tenant="bench")
        try:
            switches0 = await asyncio.to_thread(ctrl.device_reconfigurations)
            start = _mark(ctrl, etcd, opts.cpus)
            await load.run(opts.cell_timeout_s)
            end = _mark(ctrl, etcd, opts.cpus)
            switches = await asyncio.to_thread(ctrl.device_reconfigurations) - switches0
            result.reconfigurations_per_boundary = switches / max(1, load.stop_at)
        finally:
            with contextlib.suppress(Exception):
                await admin.unregister_job(job_id)
        if isinstance(load, CxxLoad) and load.cpu is not None:  # the binary's own CPU
            end.generator_s += load.cpu.end_s
            if marks and load.cpu.at_measured_s is not None:
                marks[0].generator_s += load.cpu.at_measured_s
        cpu_figures(result, start, end)
        bs = load.measured()
        if marks and bs:
            m = marks[0]
            result.controller_us_per_boundary = (end.controller_s - m.controller_s) / len(bs) * 1e6
            result.generator_us_per_boundary = (end.generator_s - m.generator_s) / len(bs) * 1e6
        summarize_lean(load, result)
        if opts.instances is not None:
            append_instances(opts.instances, instances_record(load, result))
    except (LoadError, OSError, RuntimeError, grpc.aio.AioRpcError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        await admin.close()
    return result


def append_instances(path: Path, record: dict[str, Any]) -> bool:
    """Append one cell's ``instances_record`` to ``path`` as a JSON line; False (said on
    stderr, the cell's figures kept) when the file cannot be written."""
    try:
        with path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")
    except OSError as exc:
        log(f"--instances: could not append to {path}: {exc.strerror or exc}; the cell's "
            "figures are kept")
        return False
    return True


def instances_record(load: LeanLoad, result: CellResult) -> dict[str, Any]:
    """One cell's measured phase instances for ``--instances``: the cell (transport, workload,
    n, delay_ms, run: counted from 0, as ``--json``'s ``repeat``; the table's ``run`` column
    counts from 1) and per instance, in order, ``last_send_s`` / ``first_send_s`` (when
    its last / its first enter was sent), ``admits`` (``[arrival_s, ranks]`` per ``AdmitMany``, in
    arrival order), ``switched`` and ``device_s``. Times are CLOCK_MONOTONIC seconds."""
    return {
        "transport": result.transport, "workload": result.workload, "n": result.n,
        "delay_ms": result.delay_ms, "run": result.repeat,
        "instances": [
            {"last_send_s": i.last_send_s, "first_send_s": i.first_send_s,
             "admits": [[at_s, n] for at_s, n in zip(i.admit_s, i.admit_n, strict=True)],
             "switched": i.switched, "device_s": i.device_s}
            for i in load.measured_instances()
        ],
    }


def summarize_lean(load: LeanLoad, result: CellResult) -> None:
    """Fill the latency and rate fields of ``result`` from the measured boundaries."""
    bs = load.measured()
    insts = load.measured_instances()
    lat: list[float] = []
    device: list[float] = []
    switched = 0
    for inst in insts:
        lat.extend(inst.latencies_ms())
        if inst.switched:
            switched += 1
            device.append(inst.device_s * 1e3)
    window = load.window_s()
    if not bs or not lat:
        return
    result.boundaries = len(bs)
    result.p50_ms = percentile(lat, 0.50)
    result.p99_ms = percentile(lat, 0.99)
    result.max_ms = max(lat)
    result.boundaries_per_s = len(bs) / window if window > 0 else 0.0
    result.phases_per_s = len(insts) / window if window > 0 else 0.0
    result.switched_admissions_per_boundary = switched / len(bs)
    result.device_ms = sum(device) / len(device) if device else 0.0


async def run_cell(
    ctrl: ControllerProcess, etcd: EmbeddedEtcd, transport: str, n: int, delay_ms: float,
    opts: Options, repeat: int, workload: str = "ring-pair",
) -> CellResult:
    """One (transport, N, delay) cell on a running controller (batch cells: the workload
    ``workload``; the per-rank transports run ring-pair only)."""
    if transport.startswith("batch"):
        return await run_lean_cell(ctrl, etcd, transport, n, delay_ms, opts, repeat, workload)
    per_stream = 1 if transport == "unary" else min(RANKS_PER_AGENT[transport], n)
    result = CellResult(transport, n, delay_ms, per_stream, repeat)
    job_id = f"bench-{transport}-n{n}-r{repeat}"
    admin = ControllerClient(ctrl.target, retry_budget_s=5.0)
    placements = [RankPlacement(r, host=f"host{r}", gpu=0) for r in range(n)]
    timeout_s = 30.0
    t: UnaryTransport | AgentTransport
    if transport == "unary":
        t = UnaryTransport(ctrl.target, job_id, n, timeout_s)
    else:
        t = AgentTransport(ctrl.target, job_id, n, RANKS_PER_AGENT[transport], timeout_s)
    gen = Generator(t, n, counts_for(n, opts.quick), max_measured_s=opts.max_measured_s,
                    barrier_timeout_s=timeout_s, pair_dependency=opts.pair_dependency)
    try:
        await admin.register_job(job_id, placements, tenant="bench")
        try:
            await t.connect(10.0)
            switches0 = await asyncio.to_thread(ctrl.device_reconfigurations)
            start = _mark(ctrl, etcd, opts.cpus)
            try:
                await gen.run(opts.cell_timeout_s)
            finally:
                end = _mark(ctrl, etcd, opts.cpus)
                cpu_figures(result, start, end)
                total = max(1, gen.stop_at)  # warm-up included: no mark between
                result.controller_us_per_boundary = (
                    (end.controller_s - start.controller_s) / total * 1e6)
                result.generator_us_per_boundary = (
                    (end.generator_s - start.generator_s) / total * 1e6)
            gen.summarize(result)
            switches = await asyncio.to_thread(ctrl.device_reconfigurations) - switches0
            result.reconfigurations_per_boundary = switches / max(1, gen.stop_at)
        finally:
            await t.close()
            with contextlib.suppress(Exception):
                await admin.unregister_job(job_id)
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        await admin.close()
    return result


async def run_group(n: int, delay_ms: float, opts: Options, repeat: int) -> list[CellResult]:
    """Start etcd + controller for (N, delay), run every transport, stop both."""
    results: list[CellResult] = []
    async with EmbeddedEtcd(name="bench") as etcd:
        with tempfile.TemporaryDirectory(prefix="lightrail-bench-") as tmp:
            ctrl = ControllerProcess(Path(tmp), etcd.endpoint, n, delay_ms,
                                     opts.cpus[0] if opts.cpus else None,
                                     wrapper=opts.controller_wrapper)
            try:
                t0 = time.perf_counter()
                await ctrl.start(opts.controller_timeout_s)
                log(f"run {repeat + 1}/{opts.repeat} N={n} delay={delay_ms:g} ms: controller "
                    f"pid {ctrl.pid} up in {time.perf_counter() - t0:.2f} s")
                cells = [(t, w) for t in opts.transports
                         for w in (opts.workloads if t.startswith("batch") else ("ring-pair",))
                         if w != "mixed" or n >= MIXED_MIN_N]
                for transport, workload in cells:
                    if ctrl.proc is None or ctrl.proc.returncode is not None:
                        results.append(CellResult(transport, n, delay_ms, 0, repeat, workload,
                                                  error="controller died: " + ctrl.log_tail()))
                        continue
                    res = await run_cell(ctrl, etcd, transport, n, delay_ms, opts, repeat,
                                         workload)
                    results.append(res)
                    if res.error:
                        log(f"  {transport} {workload}: ERROR {res.error}")
                    else:
                        log(f"  {transport} {workload}: {res.boundaries} boundaries, p50 "
                            f"{res.p50_ms:.3f} ms, p99 {res.p99_ms:.3f} ms, "
                            f"{res.boundaries_per_s:.1f} boundaries/s, ctrl "
                            f"{res.controller_us_per_boundary:.0f} us/boundary")
            except RuntimeError as exc:
                results.append(CellResult("controller", n, delay_ms, 0, repeat, error=str(exc)))
            finally:
                code = await ctrl.stop(max(15.0, opts.controller_timeout_s))
                if code not in (0, None):
                    log(f"  controller exited with {code}: {ctrl.log_tail(1500)}")
    return results


@dataclass(frozen=True, slots=True)
class Spread:
    """Median and range of one figure over a cell's runs."""

    median: float
    low: float
    high: float

    @staticmethod
    def of(values: Sequence[float]) -> Spread:
        s = sorted(values)
        k = len(s)
        med = s[k // 2] if k % 2 else (s[k // 2 - 1] + s[k // 2]) / 2
        return Spread(med, s[0], s[-1])

    def show(self, fmt: str) -> str:
        return f"{self.median:{fmt}} [{self.low:{fmt}}-{self.high:{fmt}}]"


@dataclass(frozen=True, slots=True)
class CellSummary:
    """A cell's runs: medians and spreads."""

    transport: str
    workload: str
    n: int
    delay_ms: float
    runs: int
    failed: int
    p50_ms: Spread
    p99_ms: Spread
    boundaries_per_s: Spread
    phases_per_s: Spread
    controller_us_per_boundary: Spread
    controller_us_per_rank_boundary: Spread
    generator_us_per_boundary: Spread
    reconfigurations_per_boundary: Spread
    steal_pct: Spread | None = None
    """``CellResult.steal_pct`` over the runs that measured it; None when none did."""
    contended_runs: int = 0
    """Runs with ``steal_pct`` >= ``CONTENDED_STEAL_PCT``."""
    other_pct: Spread | None = None
    """``CellResult.other_pct`` over the runs that measured it; None when none did."""
    shared_runs: int = 0
    """Runs with ``other_pct`` >= ``SHARED_OTHER_PCT``."""


CONTENDED_STEAL_PCT = 10.0
"""Host steal (% of a core over a cell) from which the report calls a run contended: on this
kind of VM such runs had about twice the p50 and half the boundaries/s of a quiet one."""

SHARED_OTHER_PCT = 20.0
"""CPU of other processes on the cell's cores (% of a core over a cell) from which the report
says a run shared its cores: above the accounting noise (-13 to +13 % in quiet runs on this
machine: 10 % flagged 2 of 105 quiet runs) and below one stray spinning process (45 %).
Three stray single-threaded processes spinning on this 2-core machine took the N=8 cells
from a p99 of 0.7 ms and 1180 boundaries/s to 8.5 ms and 480, with no steal."""


def _spread_or_none(values: Sequence[float | None]) -> Spread | None:
    known = [v for v in values if v is not None]
    return Spread.of(known) if known else None


def summarize(results: Sequence[CellResult]) -> list[CellSummary]:
    """One summary per (transport, workload, N, delay), in first-seen order."""
    keys: list[tuple[str, str, int, float]] = []
    for r in results:
        key = (r.transport, r.workload, r.n, r.delay_ms)
        if key not in keys:
            keys.append(key)
    out: list[CellSummary] = []
    for t, w, n, d in keys:
        runs = [r for r in results if (r.transport, r.workload, r.n, r.delay_ms) == (t, w, n, d)]
        ok = [r for r in runs if not r.error]
        if not ok:
            continue
        out.append(CellSummary(
            t, w, n, d, len(runs), len(runs) - len(ok),
            Spread.of([r.p50_ms for r in ok]), Spread.of([r.p99_ms for r in ok]),
            Spread.of([r.boundaries_per_s for r in ok]), Spread.of([r.phases_per_s for r in ok]),
            Spread.of([r.controller_us_per_boundary for r in ok]),
            Spread.of([r.controller_us_per_rank_boundary for r in ok]),
            Spread.of([r.generator_us_per_boundary for r in ok]),
            Spread.of([r.reconfigurations_per_boundary for r in ok]),
            _spread_or_none([r.steal_pct for r in ok]),
            sum(1 for r in ok if r.steal_pct is not None
                and r.steal_pct >= CONTENDED_STEAL_PCT),
            _spread_or_none([r.other_pct for r in ok]),
            sum(1 for r in ok if r.other_pct is not None and r.other_pct >= SHARED_OTHER_PCT)))
    return out


def print_table(results: Sequence[CellResult], opts: Options, elapsed_s: float,
                floor: dict[str, Any] | None = None) -> None:
    """The human-readable report: every run, then each cell's medians against the C++
    reference."""
    head = (f"{'transport':<9} {'workload':<9} {'run':>3} {'N':>5} {'delay':>5} {'bounds':>6} "
            f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'bound/s':>8} {'phases/s':>8} "
            f"{'recfg/b':>7} {'ctrl us/b':>9} {'us/rank-b':>9} {'gen us/b':>8} "
            f"{'ctrl%':>5} {'gen%':>5} {'etcd%':>5} {'steal%':>6} {'other%':>6}")
    print(head)
    print("-" * len(head))
    for r in results:
        if r.error:
            print(f"{r.transport:<9} {r.workload:<9} {r.repeat + 1:>3} {r.n:>5} "
                  f"{r.delay_ms:>5g}  ERROR: {r.error[:300]}")
            continue
        print(f"{r.transport:<9} {r.workload:<9} {r.repeat + 1:>3} {r.n:>5} {r.delay_ms:>5g} "
              f"{r.boundaries:>6} "
              f"{r.p50_ms:>8.3f} {r.p99_ms:>8.3f} {r.max_ms:>8.3f} {r.boundaries_per_s:>8.1f} "
              f"{r.phases_per_s:>8.1f} {r.reconfigurations_per_boundary:>7.2f} "
              f"{r.controller_us_per_boundary:>9.0f} {r.controller_us_per_rank_boundary:>9.2f} "
              f"{r.generator_us_per_boundary:>8.0f} {r.controller_cpu_pct:>4.0f}% "
              f"{r.generator_cpu_pct:>4.0f}% {r.etcd_cpu_pct:>4.0f}% "
              f"{'-' if r.steal_pct is None else f'{r.steal_pct:.0f}%':>6} "
              f"{'-' if r.other_pct is None else f'{r.other_pct:.0f}%':>6}")
    print()
    refs = {ref.n: ref for ref in REFERENCE}
    print("Medians [min-max] over the runs of each cell; C++ = the Opus artifact's controller "
          "(delay 0), ratio = Lightrail / C++ (p99: < 1 is better; rate: > 1 is better):")
    for c in summarize(results):
        print(f"{c.transport} {c.workload} N={c.n} delay={c.delay_ms:g} ms "
              f"({c.runs - c.failed}/{c.runs} "
              f"runs): p50 {c.p50_ms.show('.3f')} ms, p99 {c.p99_ms.show('.3f')} ms, "
              f"{c.boundaries_per_s.show('.0f')} boundaries/s = {c.phases_per_s.show('.0f')} "
              f"phases/s, recfg/b {c.reconfigurations_per_boundary.median:.2f}")
        print(f"    controller CPU {c.controller_us_per_boundary.show('.0f')} us per boundary = "
              f"{c.controller_us_per_rank_boundary.show('.2f')} us per rank-boundary; "
              f"generator {c.generator_us_per_boundary.show('.0f')} us per boundary"
              + ("" if c.steal_pct is None else
                 f"; host steal {c.steal_pct.show('.0f')} % of a core")
              + ("" if c.other_pct is None else
                 f"; other processes {c.other_pct.show('.0f')} % of a core"))
        ref = refs.get(c.n)
        if ref is None or c.delay_ms != 0 or c.workload != "ring-pair":
            continue
        p99_ok = c.p99_ms.median <= ref.p99_ms
        strict = c.boundaries_per_s.median >= ref.phases_per_s
        verdict = "BEATS" if p99_ok and strict else "does NOT beat"
        done = c.runs - c.failed
        caveats = "".join((
            f"; {c.contended_runs} of {done} runs had host steal >= {CONTENDED_STEAL_PCT:g} %"
            if c.contended_runs else "",
            f"; {c.shared_runs} of {done} runs shared their cores with other processes "
            f"(>= {SHARED_OTHER_PCT:g} % of a core)" if c.shared_runs else ""))
        print(f"    C++: p99 {ref.p99_ms:.2f} ms, {ref.phases_per_s:.0f} phases/s -> p99 ratio "
              f"{c.p99_ms.median / ref.p99_ms:.2f}, boundaries/s vs its phases/s "
              f"{c.boundaries_per_s.median / ref.phases_per_s:.2f} (strict), phases/s ratio "
              f"{c.phases_per_s.median / ref.phases_per_s:.2f} -> {verdict} the C++ controller "
              "(strict)" + caveats)
    print()
    print("ring-pair boundary = one ALL_REDUCE ring over all N ranks + one SEND_RECV pair "
          "{0, 8} ({0, N/2} for N < 16); every phase reconfigures rail 0 (recfg/b = device "
          "reconfigurations per boundary from the controller's "
          "lightrail_reconfigurations_total, 2 expected; a phase provisioned at the release "
          "of the one before is switched while its enter is read, inside its latency). "
          "mixed boundary = DP ring + 4 PP pairs + EP all-to-all of 4 matchings "
          "(9 phase instances); phases/s = phase instances/s.")
    print("latency = each rank's admission - the last rank's enter send, per phase instance; "
          "includes delta. One rank per emulated host (rail: hosts=N, gpus_per_host=1). "
          "batch32 = EnterMany/AdmitMany streams of 32 ranks (bench/lean_load.py); agentK = K "
          "ranks on one HostAgent PhaseStream (a task per rank); unary = a channel per rank.")
    pinned = (f"controller on core {opts.cpus[0]}, generator and etcd on core {opts.cpus[1]}"
              if opts.cpus else "not pinned")
    gen = ("cxx (bench/loadgen/loadgen.cc, its CPU in gen us/b and gen%)"
           if opts.generator == "cxx" else "python (bench/lean_load.py)")
    batch = (f"; batch cells' generator: {gen}"
             if any(t.startswith("batch") for t in opts.transports) else "")
    cores = "those two cores" if opts.cpus else "every core"
    print(f"cpu: {pinned} ({os.cpu_count()} cores){batch}. ctrl us/b = controller CPU per "
          "measured boundary (agent/unary cells: over the whole cell, warm-up included). "
          f"steal% = the hypervisor's steal time on {cores}"
          " over the cell (/proc/stat), % of one core: time the VM wanted the CPU and did not "
          "get it; a run with steal ran on a contended host. other% = CPU that other processes "
          f"took on {cores} over the cell (their busy time in /proc/stat less the controller's, "
          "etcd's, the generator's and this process's CPU), % of one core: a run with it "
          "shared its cores with another job.")
    if floor is not None:
        across, one = floor["across"], floor["one_core"]
        print(f"machine floor (bench/wake_floor.py, {across['rounds']} pipe round trips): a "
              f"wake across cores {across['cpus'][0]}<->{across['cpus'][1]} and back takes "
              f"{across['median_us']:.1f} us median, {across['p99_us']:.1f} us p99 (on one "
              f"core: {one['median_us']:.1f} / {one['p99_us']:.1f} us); every phase's latency "
              "holds at least one such round trip (enter: generator -> controller core; "
              "admission: back).")
    print(f"matrix took {elapsed_s:.1f} s ({'quick' if opts.quick else 'full'} counts, "
          f"{opts.repeat} {'interleaved runs' if opts.repeat > 1 else 'run'} per cell)")


WAKE_FLOOR = Path(__file__).resolve().parent / "wake_floor.py"


def measure_wake_floor(cpus: tuple[int, int] | None, rounds: int = 3000) -> dict[str, Any] | None:
    """``bench/wake_floor.py`` across the controller's and the generator's cores, in its own
    process (it forks), started with ``subprocess`` before any thread or child of this one
    exists. None when not pinned, or when it fails (logged: the floor is context, not a
    result)."""
    if cpus is None:
        log("wake floor not measured: not pinned (--no-pin, or one core)")
        return None
    try:
        proc = subprocess.run(
            [sys.executable, str(WAKE_FLOOR), "--cpus", str(cpus[0]), str(cpus[1]),
             "--rounds", str(rounds), "--json"],
            capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        log("wake floor not measured: bench/wake_floor.py took over 120 s")
        return None
    if proc.returncode != 0:
        log(f"wake floor not measured: {proc.stderr.strip()}")
        return None
    floor: dict[str, Any] = json.loads(proc.stdout)
    log(f"wake floor across cores {cpus[0]}<->{cpus[1]}: median "
        f"{floor['across']['median_us']:.1f} us, p99 {floor['across']['p99_us']:.1f} us")
    return floor


class _LeakFilter:
    """Loop exception handler that counts, instead of printing, the "Task was destroyed but it
    is pending!" reports of ``Event.wait`` tasks that ``HostAgent._session`` leaves behind when
    an agent closes (its ``wake`` task is never cancelled); everything else goes to the default
    handler."""

    def __init__(self) -> None:
        self.leaked = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        task = context.get("task")
        if (context.get("message", "").startswith("Task was destroyed but it is pending")
                and isinstance(task, asyncio.Task)
                and getattr(task.get_coro(), "__qualname__", "") == "Event.wait"):
            self.leaked += 1
            return
        loop.default_exception_handler(context)


async def amain(opts: Options, floor: dict[str, Any] | None = None) -> int:
    """Run the matrix, runs interleaved (run 1 of every cell, then run 2, ...); 0 when every
    cell succeeded, 1 otherwise. ``floor``: ``measure_wake_floor``'s figures, for the
    report."""
    configure_logging("warning", "console")
    leaks = _LeakFilter()
    asyncio.get_running_loop().set_exception_handler(leaks)
    if opts.cpus is not None:
        os.sched_setaffinity(0, {opts.cpus[1]})  # etcd, started from here, inherits it
        log(f"pinned: controller -> core {opts.cpus[0]}, generator + etcd -> core "
            f"{opts.cpus[1]}")
    if any(t.startswith("batch") for t in opts.transports):
        log(f"batch cells' generator: {opts.generator}")
    start = time.perf_counter()
    results: list[CellResult] = []
    for rep in range(opts.repeat):
        for n in opts.ns:
            for delay in opts.delays_ms:
                results.extend(await run_group(n, delay, opts, rep))
    elapsed = time.perf_counter() - start
    if leaks.leaked:
        log(f"note: {leaks.leaked} pending HostAgent 'wake' tasks were destroyed at agent close "
            "(agents/host_agent.py HostAgent._session does not cancel them)")
    if opts.json:
        doc: dict[str, Any] = {
            "method": "see bench/hot_path.py docstring",
            "elapsed_s": round(elapsed, 2),
            "quick": opts.quick,
            "cpu_count": os.cpu_count(),
            "pinned": list(opts.cpus) if opts.cpus else None,
            "generator": opts.generator,
            "results": [
                {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(r).items()}
                for r in results
            ],
            "summary": [asdict(c) for c in summarize(results)],
            "reference_cpp_delay0": [asdict(r) for r in REFERENCE],
            "wake_floor": floor,
        }
        print(json.dumps(doc, indent=2))
    else:
        print_table(results, opts, elapsed, floor)
    return 1 if any(r.error for r in results) else 0


def _wrapper(p: argparse.ArgumentParser, value: str) -> tuple[str, ...]:
    """``--controller-wrapper``'s command line, split as a shell would; exits naming the
    option when it is empty, does not split, or its program is not on PATH."""
    try:
        words = tuple(shlex.split(value))
    except ValueError as exc:
        p.error(f"--controller-wrapper: cannot split {value!r}: {exc}")
    if not words:
        p.error("--controller-wrapper: empty command")
    if shutil.which(words[0]) is None:
        p.error(f"--controller-wrapper: {words[0]!r} is not an executable on PATH")
    return words


def parse_args(argv: Sequence[str] | None = None) -> Options:
    """Command line -> ``Options``."""
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--quick", action="store_true", help="small counts")
    p.add_argument("--n", type=at_least(4), nargs="+", default=list(DEFAULT_NS), metavar="N",
                   help="world sizes (default 8 64 256 2048; N >= 4)")
    p.add_argument("--delay-ms", type=nonnegative_ms, nargs="+",
                   default=list(DEFAULT_DELAYS_MS), metavar="MS",
                   help="reconfiguration delays (default 0)")
    p.add_argument("--transport", nargs="+", choices=TRANSPORTS,
                   default=list(DEFAULT_TRANSPORTS),
                   help="batch32 (default): EnterMany streams of 32 ranks, lean generator; "
                        "unary: a channel per rank; agent8 / agent32: a HostAgent stream per "
                        "8 / 32 ranks, a task per rank")
    p.add_argument("--repeat", type=at_least(1), default=DEFAULT_REPEAT,
                   help=f"interleaved runs per cell (default {DEFAULT_REPEAT})")
    p.add_argument("--no-pin", action="store_true",
                   help="do not pin the controller and the generator to separate cores")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--workload", nargs="+", choices=WORKLOADS, default=list(WORKLOADS),
                   help="batch cells: ring-pair (the C++ reference's method) and/or mixed (DP "
                        f"ring, 4 PP pairs, EP all-to-all of 4 matchings; N >= {MIXED_MIN_N}); "
                        "default: both")
    p.add_argument("--generator", choices=GENERATORS, default=None,
                   help="batch cells' load side: cxx (bench/loadgen, the default when built: "
                        "make loadgen) or python (bench/lean_load.py)")
    p.add_argument("--measured", type=at_least(1), default=None, metavar="B",
                   help="batch cells: measure B boundaries (with --max-measured-s: profiling)")
    p.add_argument("--max-measured-s", type=positive_s, default=None,
                   help="stop a cell after this long past warm-up (default 6, quick 2)")
    p.add_argument("--cell-timeout-s", type=positive_s, default=90.0,
                   help="give up on a cell after this long (a stall; default 90)")
    p.add_argument("--instances", type=Path, default=None, metavar="FILE",
                   help="append each batch cell's measured phase instances to FILE, a JSON "
                        "object per line (send and admission times, CLOCK_MONOTONIC s)")
    p.add_argument("--controller-wrapper", default=None, metavar="CMD",
                   help="run the controller under this command line (split as a shell would, "
                        "e.g. 'valgrind --tool=callgrind'): bench/controller_instructions.py")
    p.add_argument("--controller-timeout-s", type=positive_s, default=30.0, metavar="S",
                   help="how long the controller may take to serve, and to exit after "
                        "SIGTERM (default 30; raise it under a slow wrapper)")
    p.add_argument("--pair-dependency", action="store_true",
                   help="per-rank transports: ranks outside the pair wait for it before the "
                        "next ring (the old workaround; not needed since the coordinator holds "
                        "a phase back until every rank of its group has entered it)")
    a = p.parse_args(argv)
    small = [n for n in a.n if n < MIXED_MIN_N]
    if a.workload == ["mixed"] and small and all(t.startswith("batch") for t in a.transport):
        # nothing would run at these N (the default, both workloads, runs ring-pair there)
        p.error(f"--workload mixed: needs every N >= {MIXED_MIN_N}, got --n "
                f"{' '.join(map(str, small))}")
    wrapper = () if a.controller_wrapper is None else _wrapper(p, a.controller_wrapper)
    if a.instances is not None:
        try:  # fail before the first cell, not after it
            a.instances.open("a", encoding="utf-8").close()
        except OSError as exc:
            p.error(f"--instances: cannot write {a.instances}: {exc.strerror or exc}")
    generator = a.generator
    if generator == "cxx" and not loadgen_built():
        p.error(f"--generator cxx: {LOADGEN} is not built: {BUILD_HINT}")
    if generator is None:
        generator = "cxx" if loadgen_built() else "python"
        if generator == "python":
            log(f"generator: python, since {LOADGEN.relative_to(REPO)} is not built; to build "
                f"it: {BUILD_HINT}")
    max_s = a.max_measured_s if a.max_measured_s is not None else (2.0 if a.quick else 6.0)
    cores = sorted(os.sched_getaffinity(0))
    cpus = None if a.no_pin or len(cores) < 2 else (cores[0], cores[1])
    return Options(tuple(a.n), tuple(a.delay_ms), tuple(a.transport), a.quick, a.json,
                   a.pair_dependency, max_s, a.cell_timeout_s, a.repeat, cpus, a.measured,
                   tuple(a.workload), generator, a.instances, wrapper, a.controller_timeout_s)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    opts = parse_args(argv)
    try:
        floor = measure_wake_floor(opts.cpus)  # before the loop, its threads and children
        return uvloop.run(amain(opts, floor))
    except KeyboardInterrupt:
        # the loop's runner cancelled the matrix first: etcd, the controller and the
        # generator are stopped and their folders deleted by the time this runs
        log("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
