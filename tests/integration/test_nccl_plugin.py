"""The NCCL profiler plugin (agents/nccl/, built by ``make nccl-plugin``) loaded as NCCL loads
it (``tests/nccl_harness.py``: dlopen, dlsym ``ncclProfiler_v5``, NCCL's call order), against
the host agents' NCCL endpoints (real Unix sockets) and real host agents talking to a real
controller on real etcd (demo-4x2 fabric, emulated switches)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import structlog

from lightrail.agents.client import ControllerClient
from lightrail.agents.errors import Admission, PhaseError
from lightrail.agents.host.agent import HostAgent
from lightrail.agents.host.nccl_endpoint import NcclEndpoint
from lightrail.agents.nccl import wire
from lightrail.agents.nccl.registration import register_comm
from lightrail.controller.app import RunningController
from lightrail.controller.cli.embedded import embedded_config, running_controller
from lightrail.controller.config import FabricSection
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.emulator.ocs import EmulatedFabricDevices
from tests.nccl_harness import IGNORE, PLUGIN, ROOT, Comm, Plugin

HOSTS = 4
PLACE = [RankPlacement(r, f"host{r}", 0) for r in range(HOSTS)]
DP = ProcessGroup.of(range(HOSTS))
PP = [ProcessGroup.of([0, 1]), ProcessGroup.of([2, 3])]


@pytest.fixture(scope="session")
def plugin_built() -> Path:
    """The plugin, built by the Makefile's rule (as ``make test`` and CI build it)."""
    subprocess.run(["make", "-s", "nccl-plugin"], cwd=ROOT, check=True)
    return PLUGIN


@dataclass(frozen=True, slots=True)
class Call:
    """What a host agent was asked: ``what`` is enter, admitted, refused, cancelled, release."""

    what: str
    job_id: str
    rank: int
    phase: PhaseKey
    nbytes: int = 0
    noop: bool = False


class SpyAgent(HostAgent):
    """A real host agent that also records the calls the endpoint makes."""

    def __init__(self, host: str, target: str) -> None:
        super().__init__(host, target)
        self.calls: list[Call] = []
        self.entering = asyncio.Event()
        self._changed = asyncio.Event()

    def _record(self, call: Call) -> None:
        self.calls.append(call)
        self._changed.set()

    async def until(self, what: str, phase: PhaseKey | None = None) -> None:
        """Wait until a call of kind ``what`` (of ``phase``, when given) has been recorded."""
        while not any(c.what == what and phase in (None, c.phase) for c in self.calls):
            self._changed.clear()
            await asyncio.wait_for(self._changed.wait(), 10)

    async def enter(self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0,
                    timeout_s: float = 30.0, nbytes: int = 0,
                    compute_gap_s: float = 0.0) -> Admission:
        self._record(Call("enter", job_id, rank, phase, nbytes))
        self.entering.set()
        try:
            adm = await super().enter(job_id, rank, phase, iteration, timeout_s, nbytes,
                                      compute_gap_s)
        except asyncio.CancelledError:
            self._record(Call("cancelled", job_id, rank, phase))
            raise
        except PhaseError:
            self._record(Call("refused", job_id, rank, phase))
            raise
        self._record(Call("admitted", job_id, rank, phase, noop=adm.noop))
        return adm

    def release(self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0) -> None:
        self._record(Call("release", job_id, rank, phase))
        super().release(job_id, rank, phase, iteration)

    def seen(self, *what: str) -> list[tuple[str, int, PhaseKey]]:
        """(what, rank, phase) of the recorded calls of the given kinds, in order."""
        return [(c.what, c.rank, c.phase) for c in self.calls if c.what in what]


@dataclass(frozen=True, slots=True)
class Host:
    agent: SpyAgent
    endpoint: NcclEndpoint
    socket: Path


@pytest_asyncio.fixture
async def ctl(etcd: EmbeddedEtcd, devices: EmulatedFabricDevices
              ) -> AsyncIterator[RunningController]:
    cfg = embedded_config(etcd.endpoint, FabricSection.model_validate(
        {"builtin": "demo-4x2", "reconfiguration_delay_ms": 1}), admission_timeout_s=10.0)
    async with running_controller(cfg, devices=devices) as rc:
        async with ControllerClient(rc.grpc_target) as c:
            await c.register_job("job", PLACE)
        yield rc


@asynccontextmanager
async def hosts(ctl: RunningController, tmp_path: Path, n: int = HOSTS,
                registration_wait_s: float = 5.0) -> AsyncIterator[list[Host]]:
    """``n`` host agents, each serving its NCCL socket."""
    stop = asyncio.Event()
    async with AsyncExitStack() as stack:
        out = []
        tasks = []
        for h in range(n):
            agent = SpyAgent(f"host{h}", ctl.grpc_target)
            await stack.enter_async_context(agent)
            endpoint = NcclEndpoint(agent, registration_wait_s=registration_wait_s)
            sock = tmp_path / f"nccl{h}.sock"
            ready = asyncio.Event()
            tasks.append(asyncio.create_task(endpoint.serve(str(sock), stop, ready)))
            await asyncio.wait_for(ready.wait(), 10)
            out.append(Host(agent, endpoint, sock))
        try:
            yield out
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert not any(h.socket.exists() for h in out)  # sockets removed on shutdown


def load(monkeypatch: pytest.MonkeyPatch, socket: Path, version: int = 5) -> Plugin:
    """A plugin instance (one process's) that connects to ``socket`` at its first init."""
    monkeypatch.setenv("LIGHTRAIL_NCCL_SOCKET", str(socket))
    monkeypatch.setenv("LIGHTRAIL_TIMEOUT_S", "10")
    return Plugin(version=version)


async def register(host: Host, name: str, group: ProcessGroup, rank: int, *,
                   job_id: str = "job", gated: bool = True) -> None:
    await asyncio.to_thread(register_comm, str(host.socket), name, job_id, group.ranks, rank,
                            gated=gated)


async def test_ring_all_reduce_and_pp_send_recv_on_two_communicators(
    ctl: RunningController, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    plugin_built: Path,
) -> None:
    """Four ranks on four hosts: three all-reduces on communicator ``dp`` (one phase: one
    enter, the ring), then a send and a recv twice on ``pp0``/``pp1`` (one phase each), then
    ncclCommDestroy of both: every agent saw the enter and release of both phases with the
    global ranks and the kinds, and the first ENTER blocked until every rank had entered."""
    async with hosts(ctl, tmp_path) as hs:
        plugins = []
        comms = []
        for r, h in enumerate(hs):
            pp = f"pp{r // 2}"
            await register(h, "dp", DP, r)
            await register(h, pp, PP[r // 2], r)
            plugin = load(monkeypatch, h.socket)
            comms.append((plugin.init("dp", HOSTS, r), plugin.init(pp, 2, r % 2)))
            plugins.append(plugin)

        def train(r: int) -> None:
            p = plugins[r]
            dp, pp = comms[r]
            for _ in range(3):
                p.collective(dp, "AllReduce", 1 << 20)
            for _ in range(2):
                p.send_recv(pp, 4096, "ncclBfloat16")
            p.finalize(pp)
            p.finalize(dp)

        first = asyncio.ensure_future(asyncio.to_thread(train, 0))
        await asyncio.wait_for(hs[0].agent.entering.wait(), 10)
        assert hs[0].agent.seen("enter") == [("enter", 0, PhaseKey(DP, Collective.ALL_REDUCE))]
        assert not first.done()  # blocked in ENTER: its peers have not entered yet
        await asyncio.wait_for(asyncio.gather(first, *(asyncio.to_thread(train, r)
                                                       for r in range(1, HOSTS))), 30)
        await asyncio.sleep(0)

    ring = PhaseKey(DP, Collective.ALL_REDUCE)
    for r, h in enumerate(hs):
        chain = PhaseKey(PP[r // 2], Collective.SEND_RECV)
        assert h.agent.seen("enter", "admitted", "release") == [
            ("enter", r, ring), ("admitted", r, ring), ("release", r, ring),
            ("enter", r, chain), ("admitted", r, chain), ("release", r, chain)]
        enters = [c for c in h.agent.calls if c.what == "enter"]
        assert [c.nbytes for c in enters] == [4 << 20, 4096 * 2]
        assert {c.job_id for c in h.agent.calls} == {"job"}
        assert h.endpoint.bad_frames == 0
        assert plugins[r].logs[0].startswith("INFO phase gate connected to ")
        assert not any(line.startswith("WARN") for line in plugins[r].logs)
    admitted = [c for h in hs for c in h.agent.calls if c.what == "admitted"]
    assert any(not c.noop for c in admitted if c.phase == ring)  # the ring was switched in


@pytest.mark.parametrize("version", [4, 6])
async def test_the_older_and_newer_abi_gate_the_same_way(
    ctl: RunningController, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    plugin_built: Path, version: int,
) -> None:
    """``ncclProfiler_v4`` (NCCL 2.27: task events at launch) and ``ncclProfiler_v6`` (NCCL
    2.29+) make the same phases as v5: one enter per run of a kind, released at the next kind
    and at finalize."""
    group = ProcessGroup.of([0, 1])
    async with hosts(ctl, tmp_path, n=2) as hs:
        plugins = []
        comms = []
        for r, h in enumerate(hs):
            await register(h, "pair", group, r)
            plugin = load(monkeypatch, h.socket, version)
            comms.append(plugin.init("pair", 2, r))
            plugins.append(plugin)

        def train(r: int) -> None:
            plugins[r].collective(comms[r], "AllReduce", 256)
            plugins[r].collective(comms[r], "AllReduce", 256)
            plugins[r].send_recv(comms[r], 16)
            plugins[r].finalize(comms[r])

        await asyncio.wait_for(asyncio.gather(*(asyncio.to_thread(train, r) for r in (0, 1))),
                               30)
        await asyncio.sleep(0)
    ring = PhaseKey(group, Collective.ALL_REDUCE)
    chain = PhaseKey(group, Collective.SEND_RECV)
    for r, h in enumerate(hs):
        assert h.agent.seen("enter", "release") == [
            ("enter", r, ring), ("release", r, ring), ("enter", r, chain), ("release", r, chain)]
    # the events asked of NCCL: task events (v4) or API events (v5+)
    assert plugins[0].mask.value == ((1 << 1) | (1 << 2) if version == 4
                                     else (1 << 9) | (1 << 10))


async def test_without_an_agent_socket_the_plugin_disables_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plugin_built: Path
) -> None:
    """No agent: init succeeds, asks NCCL for no events, logs one line for the process, and
    calls go through untouched."""
    plugin = load(monkeypatch, tmp_path / "absent.sock")
    a = plugin.init("dp", 2, 0)
    b = plugin.init("pp", 2, 1)
    plugin.collective(a, "AllReduce", 1024)
    plugin.send_recv(b, 8)
    plugin.finalize(a)
    plugin.finalize(b)
    assert plugin.mask.value == 0
    assert len(plugin.logs) == 1
    assert "absent.sock" in plugin.logs[0]
    assert "phase gating off for this process" in plugin.logs[0]


async def test_communicators_outside_lightrail_are_not_gated(
    ctl: RunningController, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    plugin_built: Path,
) -> None:
    """A communicator registered as never gated (inside one host), and one that no
    registration names (after the wait), are answered UNGATED once; their later calls send
    nothing; a gated communicator's phase goes on as usual."""
    async with hosts(ctl, tmp_path, n=1, registration_wait_s=0.05) as hs:
        h = hs[0]
        await register(h, "tp", ProcessGroup.of([0]), 0, gated=False)
        plugin = load(monkeypatch, h.socket)
        tp = plugin.init("tp", 1, 0)
        stray = plugin.init("stray", 2, 0)
        for comm in (tp, tp, stray, stray, tp):
            await asyncio.to_thread(plugin.collective, comm, "AllReduce", 64)
        plugin.finalize(tp)
        plugin.finalize(stray)
        await asyncio.sleep(0)
    assert h.agent.calls == []
    ungated = [line for line in plugin.logs if "is not gated" in line]
    assert len(ungated) == 2
    assert "communicator tp " in ungated[0]
    assert "communicator stray " in ungated[1]


async def test_a_refusal_ends_the_process_by_default(
    ctl: RunningController, tmp_path: Path, plugin_built: Path
) -> None:
    """The controller refuses (an unknown job): the plugin logs why through NCCL's logger and
    ends the process with status 1 (LIGHTRAIL_NCCL_ON_REFUSAL=exit, the default)."""
    async with hosts(ctl, tmp_path, n=1) as hs:
        await register(hs[0], "dp", ProcessGroup.of([0, 1]), 0, job_id="no-such-job")
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.nccl_harness", str(plugin_built), str(hs[0].socket),
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(child.communicate(), 30)
    text = out.decode()
    assert child.returncode == 1, text
    assert "phase all_reduce on communicator dp (rank 0 of 2) not admitted: unknown_job" in text
    assert "exiting (LIGHTRAIL_NCCL_ON_REFUSAL=exit)" in text
    assert [c.what for c in hs[0].agent.calls] == ["enter", "refused"]


async def test_with_continue_a_refused_call_goes_ahead_and_is_logged(
    ctl: RunningController, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    plugin_built: Path,
) -> None:
    monkeypatch.setenv("LIGHTRAIL_NCCL_ON_REFUSAL", "continue")
    async with hosts(ctl, tmp_path, n=1) as hs:
        await register(hs[0], "dp", ProcessGroup.of([0, 1]), 0, job_id="no-such-job")
        plugin = load(monkeypatch, hs[0].socket)
        comm = plugin.init("dp", 2, 0)
        await asyncio.to_thread(plugin.collective, comm, "AllReduce", 64)
        plugin.finalize(comm)
        await asyncio.sleep(0)
    warnings = [line for line in plugin.logs if line.startswith("WARN")]
    assert len(warnings) == 1
    assert "not admitted: unknown_job" in warnings[0]
    assert "the call goes ahead ungated" in warnings[0]
    assert [c.what for c in hs[0].agent.calls] == ["enter", "refused"]  # nothing released


async def _frames(sock: Path, *frames: bytes) -> tuple[asyncio.StreamReader,
                                                       asyncio.StreamWriter]:
    reader, writer = await asyncio.open_unix_connection(str(sock))
    for f in frames:
        writer.write(f)
    await writer.drain()
    return reader, writer


def _header(ftype: int, length: int, *, magic: int = wire.MAGIC, version: int = 1) -> bytes:
    return (magic.to_bytes(4, "little") + version.to_bytes(2, "little")
            + ftype.to_bytes(2, "little") + length.to_bytes(4, "little"))


BAD_FRAMES = {
    "magic=0x64636261": b"abcd" + _header(1, 0)[4:],
    "version=7": _header(1, 0, version=7),
    "type=9 is not a frame type": _header(9, 0),
    "length=70000 exceeds 65536": _header(2, 70000),
    "kind=9 is not a collective": wire.encode(wire.Init(1, 2, 0, 1, 0, "dp")) + _header(2, 28)
    + (1).to_bytes(4, "little") + bytes([9, 0, 0, 0]) + bytes(8) + bytes(8)
    + (1000).to_bytes(4, "little"),
    "comm_id=5 was never announced": wire.encode(wire.Enter(5, Collective.ALL_REDUCE, 1, 0,
                                                            1000)),
    "rank=3 is not one of ranks=[0, 1]": _header(5, 22 + 8 + 3 + 2) + (0).to_bytes(8, "little")
    + (3).to_bytes(4, "little") + (2).to_bytes(4, "little") + bytes([1, 0])
    + (3).to_bytes(2, "little") + (2).to_bytes(2, "little") + (0).to_bytes(4, "little")
    + (1).to_bytes(4, "little") + b"job" + b"dp",
    "ADMIT is sent by the agent": wire.encode(wire.Admit(1, wire.Status.OK)),
    "connection closed inside a frame": _header(4, 4) + b"\x01",
}


async def test_bad_frames_close_the_connection_and_the_agent_carries_on(
    ctl: RunningController, tmp_path: Path
) -> None:
    """Each bad frame: the connection is closed, the log names the field and value, nothing
    reaches the host agent; the next connection is served as usual."""
    async with hosts(ctl, tmp_path, n=1) as hs:
        h = hs[0]
        for expected, data in BAD_FRAMES.items():
            with structlog.testing.capture_logs() as logs:
                reader, writer = await _frames(h.socket, data)
                if expected.startswith("connection closed"):
                    writer.write_eof()
                # the endpoint logs, then closes: the log is there once the reader ends
                assert await asyncio.wait_for(reader.read(), 5) == b"", expected
                writer.close()
            errors = [e["error"] for e in logs
                      if e["event"].startswith("nccl_") and e["log_level"] == "warning"]
            assert len(errors) == 1 and expected in errors[0], (expected, errors)
        assert h.endpoint.bad_frames == len(BAD_FRAMES)
        await register(h, "dp", ProcessGroup.of([0, 1]), 0)  # still served
    assert h.agent.calls == []


async def test_a_closed_connection_releases_its_phase_and_withdraws_its_wait(
    ctl: RunningController, tmp_path: Path
) -> None:
    """A plugin process that dies: its held phase is released, an ENTER still waiting is
    withdrawn (the host agent's enter is cancelled), so its peers are not blocked by a ghost."""
    group = ProcessGroup.of([0, 1])
    ring = PhaseKey(group, Collective.ALL_REDUCE)
    chain = PhaseKey(group, Collective.SEND_RECV)

    def opening(r: int) -> bytes:
        return wire.encode(wire.Init(1, 2, r, 100 + r, 0, "pair")) + wire.encode(
            wire.Enter(1, Collective.ALL_REDUCE, 1, 64, 5000))

    async def admit(reader: asyncio.StreamReader) -> wire.Frame:
        header = wire.decode_header(await reader.readexactly(wire.HEADER_BYTES))
        return wire.decode(header.type, await reader.readexactly(header.length))

    async with hosts(ctl, tmp_path, n=2) as hs:
        for r, h in enumerate(hs):
            await register(h, "pair", group, r)
        conns = [await _frames(h.socket, opening(r)) for r, h in enumerate(hs)]
        replies = [await asyncio.wait_for(admit(reader), 10) for reader, _ in conns]
        assert [(f.seq, f.status) for f in replies if isinstance(f, wire.Admit)] == [
            (1, wire.Status.OK), (1, wire.Status.OK)]
        _, w0 = conns[0]
        w0.close()  # rank 0 dies holding the ring
        # rank 1 moves on to the chain: it waits for rank 0, which never comes
        _, w1 = conns[1]
        w1.write(wire.encode(wire.Release(1, Collective.ALL_REDUCE, 1))
                 + wire.encode(wire.Enter(1, Collective.SEND_RECV, 2, 64, 5000)))
        await hs[1].agent.until("enter", chain)
        w1.close()  # and dies waiting
        await hs[1].agent.until("cancelled")
        await hs[0].agent.until("release")
    assert hs[0].agent.seen("release") == [("release", 0, ring)]
    assert hs[1].agent.seen("release", "cancelled") == [("release", 1, ring),
                                                        ("cancelled", 1, chain)]


def test_the_library_exports_the_abi_versions(plugin_built: Path) -> None:
    """NCCL looks up ``ncclProfiler_v6``, then ``_v5``, then ``_v4`` (dlsym), each named."""
    for version in (4, 5, 6):
        plugin = Plugin(path=plugin_built, version=version)
        assert plugin.api.name == b"Lightrail"


def test_unknown_version_symbol_is_absent(plugin_built: Path) -> None:
    """v3 and older (NCCL <= 2.26) are not offered: NCCL then runs without the plugin."""
    with pytest.raises(ValueError, match="ncclProfiler_v3"):
        Plugin(path=plugin_built, version=3)



async def test_lightrail_agent_serves_the_nccl_socket(
    ctl: RunningController, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    plugin_built: Path,
) -> None:
    """``lightrail agent --nccl-socket PATH`` (a process): the framework side registers, the
    plugin's phases of rank 0 reach the controller through it (rank 1 through an in-process
    agent) and are admitted."""
    sockets = {name: tmp_path / f"{name}.sock" for name in ("agent", "nccl")}
    group = ProcessGroup.of([0, 1])
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lightrail.controller.cli.main", "agent",
        "--controller", ctl.grpc_target, "--host", "host0", "--health", "emulated",
        "--socket", str(sockets["agent"]), "--nccl-socket", str(sockets["nccl"]),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        async with hosts(ctl, tmp_path, n=2) as hs:
            deadline = asyncio.get_running_loop().time() + 20
            while True:
                try:
                    await asyncio.to_thread(register_comm, str(sockets["nccl"]), "pair", "job",
                                            group.ranks, 0)
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    assert asyncio.get_running_loop().time() < deadline, "no NCCL socket"
                    await asyncio.sleep(0.05)  # the agent process is starting
            await register(hs[1], "pair", group, 1)
            p0 = load(monkeypatch, sockets["nccl"])
            c0 = p0.init("pair", 2, 0)
            p1 = load(monkeypatch, hs[1].socket)
            c1 = p1.init("pair", 2, 1)

            def train(p: Plugin, c: Comm) -> None:
                p.collective(c, "AllReduce", 1024)
                p.finalize(c)

            await asyncio.wait_for(asyncio.gather(asyncio.to_thread(train, p0, c0),
                                                  asyncio.to_thread(train, p1, c1)), 30)
            await asyncio.sleep(0)
    finally:
        proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 10)
    ring = PhaseKey(group, Collective.ALL_REDUCE)
    assert hs[1].agent.seen("enter", "admitted", "release") == [
        ("enter", 1, ring), ("admitted", 1, ring), ("release", 1, ring)]
    assert not [line for line in p0.logs if line.startswith("WARN")], p0.logs
    assert proc.returncode == 0, err.decode()
    assert not sockets["nccl"].exists()


async def test_an_agent_that_goes_away_turns_later_phases_into_refusals(
    ctl: RunningController, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    plugin_built: Path,
) -> None:
    """The agent stops after the plugin connected: the next phase is a refusal (with
    ``continue``: logged, the call goes ahead), and later ones go ahead without more lines."""
    monkeypatch.setenv("LIGHTRAIL_NCCL_ON_REFUSAL", "continue")
    async with hosts(ctl, tmp_path, n=1) as hs:
        await register(hs[0], "dp", ProcessGroup.of([0, 1]), 0)
        plugin = load(monkeypatch, hs[0].socket)
        comm = plugin.init("dp", 2, 0)
    # the endpoint is gone (its connections closed)
    plugin.collective(comm, "AllReduce", 64)
    plugin.send_recv(comm, 8)
    plugin.collective(comm, "AllGather", 64)
    plugin.finalize(comm)
    warnings = [line for line in plugin.logs if line.startswith("WARN")]
    assert len(warnings) == 2, plugin.logs
    assert "host agent connection lost" in warnings[0]
    assert "phase all_reduce on communicator dp (rank 0 of 2) not admitted" in warnings[1]
    assert "the call goes ahead ungated" in warnings[1]
    assert hs[0].agent.calls == []


TABLE = [[5.0, 4.0, 3.0],        # Tree: NCCL's pick without the tuner
         [9.0, 8.0, 7.0],        # Ring
         [IGNORE] * 3, [IGNORE] * 3, [IGNORE] * 3, [IGNORE] * 3,
         [6.0, IGNORE, 2.0]]     # PAT
RING_ONLY = [[IGNORE] * 3, [9.0, 8.0, 7.0], *([[IGNORE] * 3] * 5)]


@pytest.mark.parametrize("version", [5, 6])
async def test_the_tuner_runs_ring_on_gated_communicators_across_hosts(
    ctl: RunningController, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    plugin_built: Path, version: int,
) -> None:
    """``ncclTunerPlugin_v5``/``_v6`` of the same library: all-reduce, reduce-scatter and
    all-gather of a gated communicator spanning hosts keep only Ring's costs (NCCL then picks
    Ring, and its protocol among Ring's); a communicator inside one host, a collective of
    another kind, and a communicator the agent answered "not gated" keep NCCL's table."""
    async with hosts(ctl, tmp_path, n=1, registration_wait_s=0.05) as hs:
        await register(hs[0], "dp", ProcessGroup.of([0, 1]), 0)
        plugin = load(monkeypatch, hs[0].socket)
        gated = plugin.init("dp", 2, 0, comm_hash=0xD1)
        stray = plugin.init("stray", 2, 0, comm_hash=0x57)
        await asyncio.to_thread(plugin.collective, stray, "AllReduce", 64)  # -> not gated
        for func in ("AllReduce", "ReduceScatter", "AllGather"):
            assert plugin.tuned(0xD1, 2, func, TABLE, version) == RING_ONLY, func
        assert plugin.tuned(0xD1, 1, "AllReduce", TABLE, version) == TABLE  # one host
        assert plugin.tuned(0xD1, 2, "Broadcast", TABLE, version) == TABLE
        assert plugin.tuned(0x57, 2, "AllReduce", TABLE, version) == TABLE  # not gated
        assert plugin.tuned(0x99, 2, "AllReduce", TABLE, version) == TABLE  # unknown
        no_ring = [row if a != 1 else [IGNORE] * 3 for a, row in enumerate(TABLE)]
        assert plugin.tuned(0xD1, 2, "AllReduce", no_ring, version) == no_ring
        plugin.finalize(gated)
        plugin.finalize(stray)
        assert plugin.tuned(0xD1, 2, "AllReduce", TABLE, version) == TABLE  # finalized


def test_the_tuner_leaves_nccl_alone_without_an_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plugin_built: Path
) -> None:
    plugin = load(monkeypatch, tmp_path / "absent.sock")
    comm = plugin.init("dp", 2, 0, comm_hash=0xD1)
    assert plugin.tuned(0xD1, 2, "AllReduce", TABLE) == TABLE
    plugin.finalize(comm)
    assert (plugin_built.parent / "libnccl-tuner-lightrail.so").resolve() == plugin_built


async def test_the_python_frame_client_gates_in_order_with_no_release_round_trip(
        ctl: RunningController, tmp_path: Path) -> None:
    """``FramePhaseClient`` (the torch gate's transport over LIGHTRAIL_NCCL_SOCKET): a pair's
    two ranks on two agents enter together, a release reaches the agent before the same rank's
    next enter, a refusal raises, and closing releases what is held."""
    from lightrail.agents.errors import ControllerUnavailable
    from lightrail.agents.nccl.client import FramePhaseClient

    pair = ProcessGroup.of((0, 1))
    ar, ag = PhaseKey(pair, Collective.ALL_REDUCE), PhaseKey(pair, Collective.ALL_GATHER)
    async with hosts(ctl, tmp_path, 2) as hs:
        clients = [await asyncio.to_thread(FramePhaseClient, str(hs[r].socket), "job", r)
                   for r in range(2)]

        def steps(r: int) -> list[bool]:
            c = clients[r]
            out = [c.enter("job", r, ar, nbytes=64).noop]
            c.release_phase("job", r, ar)
            out.append(c.enter("job", r, ag, nbytes=64).noop)
            return out

        noops = await asyncio.wait_for(asyncio.gather(*(asyncio.to_thread(steps, r)
                                                        for r in range(2))), 30)
        assert noops == [[False, True], [False, True]]  # ag runs on ar's circuits
        for r in range(2):
            assert hs[r].agent.seen("enter", "release") == [
                ("enter", r, ar), ("release", r, ar), ("enter", r, ag)]
        # a group with a rank the job does not have: refused by the controller, raised here
        await asyncio.to_thread(clients[0].release_phase, "job", 0, ag)
        with pytest.raises(PhaseError) as exc:
            await asyncio.to_thread(clients[0].enter, "job", 0,
                                    PhaseKey(ProcessGroup.of((0, 9)), Collective.ALL_REDUCE))
        assert "9" in str(exc.value) and not isinstance(exc.value, ControllerUnavailable)
        for c in clients:
            await asyncio.to_thread(c.close)
        await hs[1].agent.until("release", ag)  # rank 1 still held it: FINI released it
    with pytest.raises(ControllerUnavailable, match="frame socket"):
        FramePhaseClient(str(tmp_path / "absent.sock"), "job", 0)
