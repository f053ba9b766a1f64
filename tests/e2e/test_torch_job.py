"""End to end with a real PyTorch job (issue 11, section 2): examples/torch/train_pp_dp.py
(PP=2 x DP=2, torch.distributed.pipelining, 4 CPU processes under torchrun) gated by the
``cpu:lightrail`` backend through one ``lightrail agent`` process per emulated host, against a
controller process on a real etcd and the switches of a ``lightrail emulate`` process (TL1 over
sockets). The 4 hosts share one rail, so the pipeline's send/recv and the gradients'
all-reduce need different cross-connects on the same ports: every change of phase reconfigures.

Checked: the job exits 0; every run of a phase was admitted only onto confirmed circuits and
none was broken while held (tests/invariants.check_holds on the switches' change logs); the
rail did reconfigure; the controller's provisioning learned the schedule; each rank's summary
shows both kinds of groups; and every rank's per-step loss and parameter sum are bit-identical
to the same script run with plain gloo (the gate changes timing, never results).
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from lightrail.agents.replay.replayer import HoldRecord
from lightrail.controller.cli.torch_job import (
    WORLD,
    TorchRun,
    compare_steps,
    host_of,
    phase_rows,
    run_gated,
    run_torchrun,
    torch_available,
)
from lightrail.controller.config import build_fabric
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.emulator.ocs import ChangeAction
from tests.invariants import check_holds

needs_torch = pytest.mark.skipif(
    not torch_available(), reason="torch is not installed (pip install 'lightrail[torch]')")

STEPS = 5
PP_GROUPS = {(0, 1), (2, 3)}
DP_GROUPS = {(0, 2), (1, 3)}


def holds_of(run: TorchRun) -> list[HoldRecord]:
    """The gate's admitted/released times of every run of every phase, as ``HoldRecord``s.
    Fails the test when the summaries do not have them."""
    out: list[HoldRecord] = []
    for p in run.phases:
        assert p.holds is not None, (
            "the gate's summary has no 'holds' (admitted, released monotonic seconds per run): "
            "the invariant cannot be checked")
        assert len(p.holds) == p.entered, p
        key = PhaseKey(ProcessGroup.of(p.ranks), Collective(p.collective))
        out.extend(HoldRecord(p.rank, key, a, r) for a, r in p.holds)
    return out


def output_of(run: TorchRun) -> str:
    return f"torchrun ({run.backend}) exited {run.returncode}:\n{run.output_tail}"


@needs_torch
async def test_a_pp_dp_job_reconfigures_the_rail_safely_with_unchanged_losses(
    etcd: EmbeddedEtcd, tmp_path: Path
) -> None:
    if importlib.util.find_spec("lightrail.agents.torch") is None:
        pytest.fail("lightrail.agents.torch (the backend) is missing")
    # the plain run goes alongside (its own rendezvous port): only wall time is shared
    gated, plain = await asyncio.gather(
        run_gated(tmp_path / "gated", steps=STEPS, etcd_endpoint=etcd.endpoint,
                  timeout_s=120.0),
        run_torchrun(tmp_path / "plain", backend="gloo", steps=STEPS, timeout_s=120.0))
    assert gated.run.returncode == 0, output_of(gated.run)
    assert plain.returncode == 0, output_of(plain)

    # the numerics: bit for bit, every rank, every step (losses on stage 1, weights everywhere)
    comparison = compare_steps(gated.run, plain, STEPS)
    assert len(comparison) == WORLD * STEPS
    assert all(c.identical for c in comparison), [c for c in comparison if not c.identical]
    assert all(c.gated is not None and (c.gated.loss is None) == (c.rank % 2 == 0)
               for c in comparison)

    # both kinds of groups went through the gate, each phase entered at every step
    rows = {(r.collective, r.ranks): r for r in phase_rows(gated.run.phases)}
    assert {g for c, g in rows if c == Collective.SEND_RECV.value} == PP_GROUPS, rows
    assert {g for c, g in rows if c == Collective.ALL_REDUCE.value} == DP_GROUPS, rows
    assert set(rows) == ({("send_recv", g) for g in PP_GROUPS}
                         | {("all_reduce", g) for g in DP_GROUPS}), rows
    for row in rows.values():
        assert row.reporting == 2, row  # each member rank wrote it
        # at least once per step and rank (more when a rank idled past the linger inside one)
        assert row.entered >= 2 * STEPS, row
        assert row.noop + row.reconfigured == row.entered, row
    switched = sum(r.reconfigured for r in rows.values())
    assert all(rows[("all_reduce", g)].reconfigured > 0 for g in DP_GROUPS), rows
    assert all(rows[("send_recv", g)].reconfigured > 0 for g in PP_GROUPS), rows

    # the rail reconfigured at the phase changes: makes and breaks on the one switch
    logs = gated.change_logs
    assert set(logs) == {"ocs-rail0"}
    actions = [rec.action for rec in logs["ocs-rail0"]]
    assert actions.count(ChangeAction.BREAK) > 0
    assert actions.count(ChangeAction.MAKE) >= 2 * len(PP_GROUPS | DP_GROUPS)
    assert gated.reconfigurations_total >= 2 * (STEPS - 1)
    assert gated.job.reconfigurations >= 2 * (STEPS - 1)
    assert gated.job.phases_admitted == sum(r.entered for r in rows.values())
    assert switched > 0

    # the safety invariant: no run admitted before its cross-connects were made, none of them
    # broken while a rank held the phase
    placements = [RankPlacement(r, host_of(r), 0) for r in range(WORLD)]
    holds = holds_of(gated.run)
    violations = check_holds(build_fabric(gated.section), placements, holds, logs)
    assert violations == [], violations[:5]

    # provisioning learned the order of the phases and switched some ahead of the ranks
    assert gated.job.schedule_learned, gated.job
    assert gated.job.provisioning_hits + gated.job.provisioning_late > 0, gated.job


@pytest.mark.parametrize("extra", [["--trace", "x.json"], ["--fail-gpu"],
                                   ["--devices", "emulated"]])
def test_demo_torch_refuses_the_replay_options(extra: list[str]) -> None:
    # a child process: the demo configures logging for its whole process
    proc = subprocess.run([sys.executable, "-m", "lightrail.controller.cli.main", "demo",
                           "--torch", *extra], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 2, proc.stderr
    assert "--torch runs its own job" in proc.stderr
