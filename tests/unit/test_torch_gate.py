"""The torch gate's phase mapping and configuration, without torch (lightrail.agents.torch.gate,
lightrail.agents.torch.config). The transport is a recording double: the unit under test is
the gate's run logic; the real path is in tests/e2e/test_torch_job.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from lightrail.agents.errors import Admission, PhaseError, PlacementChanged
from lightrail.agents.torch import config as gate_config
from lightrail.agents.torch.gate import GateLoop, LoopTransport, RankGate, phase_key
from lightrail.controller.domain.errors import ErrorCode
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup

DP = phase_key(ProcessGroup.of((0, 2)), Collective.ALL_REDUCE)
PP = phase_key(ProcessGroup.of((0, 1)), Collective.SEND_RECV)
DP_GATHER = phase_key(ProcessGroup.of((0, 2)), Collective.ALL_GATHER)


@dataclass
class Recorder:
    """Records EnterPhase/ReleasePhase in order; ``refuse`` makes the next enter fail."""

    calls: list[tuple[str, PhaseKey, int]] = field(default_factory=list)
    refuse: ErrorCode | None = None
    noop: bool = False
    released: threading.Event = field(default_factory=threading.Event)

    def enter(self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0,
              timeout_s: float | None = 30.0, nbytes: int = 0,
              compute_gap_s: float = 0.0) -> Admission:
        self.calls.append(("enter", phase, nbytes))
        if self.refuse is not None:
            code, self.refuse = self.refuse, None
            raise PhaseError(code, "refused")
        return Admission(self.noop, 1, 0.0 if self.noop else 0.01)

    def release_phase(self, job_id: str, rank: int, phase: PhaseKey,
                      iteration: int = 0) -> None:
        self.calls.append(("release", phase, 0))
        self.released.set()


class Work:
    """A backend work: completes when ``finish()`` is called (any thread)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.callbacks: list[object] = []
        self.waited = 0

    def finish(self) -> None:
        self.done.set()
        for cb in self.callbacks:
            cb()  # type: ignore[operator]


def on_done(work: Work, cb: object) -> None:
    if work.done.is_set():
        cb()  # type: ignore[operator]
    else:
        work.callbacks.append(cb)


def no_future(work: Work, cb: object) -> None:
    raise RuntimeError("this backend has no completion future (gloo send/recv)")


def wait(work: Work) -> None:
    work.waited += 1
    assert work.done.wait(5.0), "work never completed"


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


def make_gate(rec: Recorder, *, linger_s: float = 60.0,
              hosts: list[str] | None = None) -> RankGate:
    return RankGate("job", 0, rec, GateLoop(), hosts=hosts, timeout_s=5.0, linger_s=linger_s)


def kinds(rec: Recorder) -> list[tuple[str, PhaseKey]]:
    return [(k, p) for k, p, _ in rec.calls]


def test_calls_of_one_phase_are_one_run(rec: Recorder) -> None:
    gate = make_gate(rec)
    works = [Work() for _ in range(3)]
    for w in works:
        assert gate.call(DP, 64, _const(w), on_done, wait) is w
    assert kinds(rec) == [("enter", DP)]
    assert rec.calls[0][2] == 64  # the first call's bytes are the hint
    [stats] = gate.stats()
    assert (stats.entered, stats.calls, stats.reconfigured, stats.noop) == (1, 3, 1, 0)
    for w in works:
        w.finish()
    gate.close()
    assert kinds(rec) == [("enter", DP), ("release", DP)]


def test_a_call_elsewhere_waits_for_the_run_then_releases_before_entering(
        rec: Recorder) -> None:
    gate = make_gate(rec)
    w1 = Work()
    gate.call(PP, 8, lambda: w1, no_future, wait)
    threading.Timer(0.05, w1.finish).start()
    w2 = Work()
    gate.call(DP, 8, lambda: w2, on_done, wait)  # blocks until w1 completed
    assert w1.done.is_set() and w1.waited == 1
    assert kinds(rec) == [("enter", PP), ("release", PP), ("enter", DP)]
    # another kind on the same group is another phase
    w2.finish()
    gate.call(DP_GATHER, 8, _done, on_done, wait)
    assert kinds(rec)[-2:] == [("release", DP), ("enter", DP_GATHER)]
    gate.close()


def test_completed_run_is_released_after_the_linger(rec: Recorder) -> None:
    gate = make_gate(rec, linger_s=0.0)
    w = Work()
    gate.call(DP, 8, lambda: w, on_done, wait)
    assert not rec.released.is_set()
    w.finish()
    assert rec.released.wait(5.0)
    assert kinds(rec) == [("enter", DP), ("release", DP)]
    # the next call of the same phase is a new run: entered again
    w2 = Work()
    gate.call(DP, 8, lambda: w2, on_done, wait)
    assert kinds(rec)[-1] == ("enter", DP)
    assert gate.stats()[0].entered == 2
    w2.finish()
    gate.close()


def test_a_call_inside_the_linger_keeps_the_run(rec: Recorder) -> None:
    gate = make_gate(rec, linger_s=60.0)
    w = Work()
    gate.call(DP, 8, lambda: w, on_done, wait)
    w.finish()
    gate.call(DP, 8, _done, on_done, wait)
    assert kinds(rec) == [("enter", DP)]
    gate.close()


def test_scale_up_groups_are_never_gated(rec: Recorder) -> None:
    gate = make_gate(rec, hosts=["h0", "h0", "h1"])
    tp = phase_key(ProcessGroup.of((0, 1)), Collective.ALL_REDUCE)
    w = Work()
    assert gate.call(tp, 8, lambda: w, on_done, wait) is w
    assert rec.calls == []
    gate.call(DP, 8, _done, on_done, wait)  # rank 2 is on h1
    assert kinds(rec) == [("enter", DP)]
    gate.close()


def test_refusal_raises_before_issuing(rec: Recorder) -> None:
    gate = make_gate(rec)
    rec.refuse = ErrorCode.DEADLINE_EXCEEDED
    issued: list[Work] = []

    def issue() -> Work:
        issued.append(Work())
        return issued[-1]

    with pytest.raises(PhaseError) as exc:
        gate.call(DP, 8, issue, on_done, wait)
    assert exc.value.code is ErrorCode.DEADLINE_EXCEEDED and issued == []
    gate.call(DP, 8, _done, on_done, wait)  # the rank can try again
    gate.close()


def test_placement_changed_raises_at_the_next_call(rec: Recorder) -> None:
    gate = make_gate(rec)
    gate.call(DP, 8, _done, on_done, wait)
    gate.placement_changed("rank 0 moved to host9/gpu0")
    with pytest.raises(PlacementChanged, match="host9"):
        gate.call(DP, 8, _done, on_done, wait)
    gate.close()


def test_closed_gate_refuses(rec: Recorder) -> None:
    gate = make_gate(rec)
    gate.close()
    with pytest.raises(PhaseError) as exc:
        gate.call(DP, 8, _done, on_done, wait)
    assert exc.value.code is ErrorCode.CANCELLED


def test_summary_file(rec: Recorder, tmp_path: object) -> None:
    import json
    from pathlib import Path

    gate = make_gate(rec)
    gate.call(PP, 8, _done, no_future, wait)
    gate.call(DP, 8, _done, on_done, wait)
    gate.close()
    path = Path(str(tmp_path)) / "s.json"
    gate.write_summary(path)
    doc = json.loads(path.read_text())
    assert doc["rank"] == 0 and doc["job_id"] == "job"
    assert [(p["group"], p["collective"], p["entered"]) for p in doc["phases"]] == [
        ([0, 1], "send_recv", 1), ([0, 2], "all_reduce", 1)]
    holds = doc["holds"]
    assert [(h["group"], h["collective"]) for h in holds] == [([0, 1], "send_recv"),
                                                              ([0, 2], "all_reduce")]
    assert all(h["admitted_s"] <= h["released_s"] for h in holds)
    assert holds[0]["released_s"] <= holds[1]["admitted_s"]


def _const(w: Work) -> Callable[[], Work]:
    return lambda: w


def _done() -> Work:
    w = Work()
    w.finish()
    return w


# --- configuration ------------------------------------------------------------------------


def test_config_placeholders_and_defaults() -> None:
    env = {"LOCAL_RANK": "1", "LIGHTRAIL_HOST": "host{rank}",
           "LIGHTRAIL_AGENT": "unix:///tmp/a-{local_rank}.sock", "MASTER_PORT": "29500",
           "CUDA_VISIBLE_DEVICES": "4,5"}
    cfg = gate_config.load(3, 4, env)
    assert cfg.host == "host3" and cfg.target == "unix:///tmp/a-1.sock" and cfg.via_agent
    assert cfg.gpu == 5 and cfg.job_id == "torch-29500" and cfg.register
    assert cfg.timeout_s == 60.0 and cfg.linger_s == pytest.approx(0.002)
    node = gate_config.load(5, 8, {"GROUP_RANK": "2", "LIGHTRAIL_HOST": "node{group_rank}"})
    assert node.host == "node2"
    direct = gate_config.load(0, 1, {"LIGHTRAIL_CONTROLLER": "a:1,b:2",
                                     "TORCHELASTIC_RUN_ID": "run7"})
    assert direct.target == "a:1,b:2" and not direct.via_agent and direct.job_id == "run7"


@pytest.mark.parametrize(("env", "named"), [
    ({"LIGHTRAIL_TIMEOUT_S": "0"}, "LIGHTRAIL_TIMEOUT_S: must be finite and > 0, got '0'"),
    ({"LIGHTRAIL_TIMEOUT_S": "soon"}, "LIGHTRAIL_TIMEOUT_S: expected a number, got 'soon'"),
    ({"LIGHTRAIL_LINGER_MS": "-1"}, "LIGHTRAIL_LINGER_MS"),
    ({"LIGHTRAIL_LINGER_MS": "nan"}, "LIGHTRAIL_LINGER_MS"),
    ({"LIGHTRAIL_GPU": "x"}, "LIGHTRAIL_GPU: expected a GPU index, got 'x'"),
    ({"LIGHTRAIL_REGISTER": "maybe"}, "LIGHTRAIL_REGISTER: expected 1 or 0, got 'maybe'"),
    ({"LIGHTRAIL_HOST": "h{node}"}, "LIGHTRAIL_HOST: 'h{node}' has a bad placeholder"),
    ({"LIGHTRAIL_AGENT": "10.0.0.1:5"}, "LIGHTRAIL_AGENT: expected unix:///path"),
    ({"LIGHTRAIL_AGENT": "unix:///a", "LIGHTRAIL_CONTROLLER": "c:1"}, "both set"),
    ({"LOCAL_RANK": "2", "CUDA_VISIBLE_DEVICES": "0"}, "CUDA_VISIBLE_DEVICES: '0' lists 1"),
    ({"LOCAL_RANK": "-1"}, "LOCAL_RANK: expected a non-negative integer, got '-1'"),
])
def test_config_errors_name_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(gate_config.GateConfigError) as exc:
        gate_config.load(0, 2, env)
    assert named in str(exc.value)


def test_gate_flag() -> None:
    assert gate_config.gate_requested({"LIGHTRAIL_GATE": "1"})
    assert not gate_config.gate_requested({})
    with pytest.raises(gate_config.GateConfigError, match="LIGHTRAIL_GATE"):
        gate_config.gate_requested({"LIGHTRAIL_GATE": "2"})


def test_a_long_run_keeps_nothing_per_call(rec: Recorder) -> None:
    gate = make_gate(rec, linger_s=60.0)
    for _ in range(2000):
        gate.call(DP, 8, _done, on_done, wait)  # completed works
    for _ in range(2000):
        gate.call(DP, 8, _done, no_future, wait)  # works without a completion future
    run = gate._run
    assert run is not None and len(run.pending) <= 1025
    assert kinds(rec) == [("enter", DP)] and gate.stats()[0].calls == 4000
    gate.close()
    assert kinds(rec) == [("enter", DP), ("release", DP)]


def test_loop_transport_runs_an_async_client_in_the_gate_loop() -> None:
    class Async:
        def __init__(self) -> None:
            self.loops: list[asyncio.AbstractEventLoop] = []

        async def enter(self, job_id: str, rank: int, phase: PhaseKey, iteration: int = 0,
                        timeout_s: float | None = 30.0, nbytes: int = 0,
                        compute_gap_s: float = 0.0) -> Admission:
            self.loops.append(asyncio.get_running_loop())
            return Admission(True, 1, 0.0)

        async def release_phase(self, job_id: str, rank: int, phase: PhaseKey,
                                iteration: int = 0) -> None:
            self.loops.append(asyncio.get_running_loop())

    loop = GateLoop()
    client = Async()
    gate = RankGate("job", 0, LoopTransport(loop, client), loop, linger_s=60.0)
    gate.call(DP, 8, _done, on_done, wait)
    gate.close()
    assert client.loops == [loop.loop, loop.loop]
    assert gate.stats()[0].noop == 1
