"""The lightrail torch backend against a real controller: an unmodified gloo script, gated by
``LIGHTRAIL_GATE=1`` alone, launched as two torchrun "nodes" of 2 ranks (the demo-4x2 fabric's
host0 and host1), every kind of call it gates, results bit-identical to plain gloo, the safety
invariant held on the switches' change logs, the job unregistered at exit."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path

import pytest

from lightrail.agents.client import ControllerClient
from lightrail.agents.replay.replayer import HoldRecord
from lightrail.controller.app import RunningController
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.emulator.ocs import EmulatedFabricDevices
from tests.invariants import check_holds

torch = pytest.importorskip("torch", reason="the optional extra lightrail[torch] is not installed")

JOB = Path(__file__).with_name("torch_collectives_job.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")
pytestmark = pytest.mark.etcd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _launch(out: Path, env: dict[str, str], gated: bool) -> list[str]:
    """Two torchrun nodes of 2 workers each; returns each node's output when one fails."""
    await asyncio.to_thread(out.mkdir)
    port = _free_port()
    procs = []
    node_env = dict(env, OUT=str(out))
    if gated:  # rank = node * 2 + local rank: node n is host<n>
        node_env.update(LIGHTRAIL_HOST="host{group_rank}", LIGHTRAIL_GPU="{local_rank}")
    for node in (0, 1):
        procs.append(await asyncio.create_subprocess_exec(
            str(TORCHRUN), "--nnodes=2", "--nproc-per-node=2", f"--node-rank={node}",
            "--master-addr=127.0.0.1", f"--master-port={port}", str(JOB),
            env=node_env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT))
    try:
        outputs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)),
                                         240)
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()  # torchrun; its workers die with it (PR_SET_PDEATHSIG)
                await p.wait()
    failed = [o.decode(errors="replace")[-4000:] for (o, _), p in zip(outputs, procs,
                                                                       strict=True)
              if p.returncode != 0]
    return failed


def _results(out: Path) -> dict[int, dict[str, object]]:
    return {r: json.loads((out / f"result-{r}.json").read_text()) for r in range(4)}


async def test_unmodified_gloo_script_is_gated_and_numerically_unchanged(
        ctl: RunningController, devices: EmulatedFabricDevices, tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTRAIL_")}
    base.update(OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).parents[2]))
    assert await _launch(tmp_path / "plain", base, gated=False) == []
    gated_env = dict(base, LIGHTRAIL_GATE="1", LIGHTRAIL_CONTROLLER=ctl.grpc_target,
                     LIGHTRAIL_JOB_ID="torch-collectives", LIGHTRAIL_TIMEOUT_S="30",
                     LIGHTRAIL_SUMMARY=str(tmp_path / "summary-{rank}.json"))
    assert await _launch(tmp_path / "gated", gated_env, gated=True) == []

    plain, gated = _results(tmp_path / "plain"), _results(tmp_path / "gated")
    assert {r["backend"] for r in plain.values()} == {"gloo"}
    assert {r["backend"] for r in gated.values()} == {"cpu:lightrail"}  # LIGHTRAIL_GATE
    for rank in range(4):  # the gate changes timing, never results
        assert {k: v for k, v in gated[rank].items() if k != "backend"} == {
            k: v for k, v in plain[rank].items() if k != "backend"}

    summaries = {r: json.loads((tmp_path / f"summary-{r}.json").read_text()) for r in range(4)}
    phases = {(tuple(p["group"]), p["collective"]): p for p in summaries[0]["phases"]}
    # TP and the 0-1 pair run on host0 only: never gated; everything else is, by global ranks
    assert set(phases) == {
        ((0, 2), "all_reduce"), ((0, 2), "all_gather"), ((0, 2), "broadcast"),
        ((0, 2), "all_to_all"), ((0, 2), "send_recv"), ((0, 1, 2, 3), "all_reduce")}
    assert phases[((0, 2), "all_reduce")]["entered"] == 2  # two calls, then the barrier
    assert phases[((0, 2), "all_reduce")]["calls"] == 3
    assert phases[((0, 2), "all_gather")]["calls"] == 2  # into_tensor + list: one run
    assert phases[((0, 2), "send_recv")]["calls"] == 2  # isend + irecv: one run
    ranks_13 = {tuple(p["group"]) for p in summaries[1]["phases"]}
    assert (1, 3) in ranks_13 and (0, 2) not in ranks_13
    assert sum(p["reconfigured"] for s in summaries.values() for p in s["phases"]) > 0

    placements = [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(4)]
    holds = [HoldRecord(rank, PhaseKey(ProcessGroup.of(h["group"]), Collective(h["collective"])),
                        h["admitted_s"], h["released_s"])
             for rank, s in summaries.items() for h in s["holds"]]
    assert len(holds) == sum(p["entered"] for s in summaries.values() for p in s["phases"])
    logs = {sid: dev.change_log for sid, dev in devices.items()}
    assert check_holds(ctl.fabric, placements, holds, logs) == []

    # rank 0 unregistered the job at exit: the id is free again
    async with ControllerClient(ctl.grpc_target) as client:
        assert await client.register_job("torch-collectives", placements) == 4
        await client.unregister_job("torch-collectives")


async def test_bad_environment_names_the_variable(ctl: RunningController,
                                                  tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTRAIL_")}
    env = dict(base, OMP_NUM_THREADS="1", LIGHTRAIL_GATE="1",
               LIGHTRAIL_CONTROLLER=ctl.grpc_target, LIGHTRAIL_TIMEOUT_S="never")
    env.update(OUT=str(tmp_path), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    proc = await asyncio.create_subprocess_exec(  # one worker, no launcher: the error is ours
        sys.executable, str(JOB), env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode != 0
    assert "LIGHTRAIL_TIMEOUT_S: expected a number, got 'never'" in out.decode()
