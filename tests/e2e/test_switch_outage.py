"""A switch goes away (issue 14, sections 1, 2 and 4): closed (its connections refused) or
silent (a partition: connections kept, nothing answered), during replays on both rails of
demo-4x2, its switches served over TL1 by ``lightrail emulate``. The job that needs the lost
switch is refused DEVICE_FAILURE naming it; the job on the other rail keeps running;
``lightrail switches --json`` shows the switch unreachable with its last error, then up; after
the switch is back a new replay succeeds without a controller restart."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from lightrail.agents.client import ControllerClient
from lightrail.agents.replay.replayer import HostSlot, Replayer, ReplayError
from lightrail.agents.replay.trace.model import CommOp, SourceFormat, Workload
from lightrail.controller.cli.embedded import embedded_config, running_controller, spawn_emulator
from lightrail.controller.domain.model import Collective, ProcessGroup
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.emulator.control import ControlClient
from lightrail.emulator.servers.fabric import rail_section

WAIT_S = 60.0
DEVICE_WAIT_S = 0.5


def ring_and_all_to_all(ranks: int = 4) -> Workload:
    """Each rank: a ring all-reduce over every rank, then an all-to-all: every iteration
    switches the rail between the ring and the all-to-all's matchings."""
    group = ProcessGroup.of(range(ranks))
    ops = (CommOp(Collective.ALL_REDUCE, group, "dp", 1 << 20, 0.001),
           CommOp(Collective.ALL_TO_ALL, group, "ep", 1 << 20, 0.001))
    return Workload("outage", SourceFormat.SYNTHETIC, ranks, {r: ops for r in range(ranks)})


async def switches(target: str) -> dict[str, dict[str, object]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lightrail.controller.cli.main", "switches", "--controller",
        target, "--json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
    assert proc.returncode == 0, err.decode()
    return {s["switch_id"]: s for s in json.loads(out)["switches"]}


async def until_state(target: str, switch_id: str, state: str) -> dict[str, object]:
    """``lightrail switches --json`` until ``switch_id`` is in ``state`` (polling the CLI, as
    an operator would; at most ``WAIT_S``)."""
    async with asyncio.timeout(WAIT_S):
        while True:
            info = (await switches(target))[switch_id]
            if info["state"] == state:
                return info
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("fault", ["unreachable", "partition"])
async def test_a_lost_switch_fails_its_job_fast_and_spares_the_other_rail(
        etcd: EmbeddedEtcd, fault: str) -> None:
    async with spawn_emulator(rail_section("demo-4x2", delay_ms=1.0)) as emulator, ControlClient(
            emulator.control_url) as control:
        served = emulator.section
        assert served.rail is not None
        for options in served.rail.switch_options.values():
            options["timeout_s"] = 0.5  # short driver timeouts: a silent switch shows quickly
        cfg = embedded_config(etcd.endpoint, served, admission_timeout_s=20.0)
        cfg = cfg.model_copy(update={"controller": cfg.controller.model_copy(
            update={"device_wait_s": DEVICE_WAIT_S})})
        async with running_controller(cfg) as rc:
            target = rc.grpc_target
            rail0 = [HostSlot(f"host{h}", (0,)) for h in range(4)]  # GPU 0s: ocs-rail0 only
            rail1 = [HostSlot(f"host{h}", (1,)) for h in range(4)]  # GPU 1s: ocs-rail1 only

            def replay(job: str, hosts: list[HostSlot], iterations: int) -> Replayer:
                return Replayer(ring_and_all_to_all(), target, hosts, job_id=job,
                                iterations=iterations, time_scale=0.0, timeout_s=20.0)

            async with ControllerClient(target, retry_budget_s=5.0) as client:
                # both rails work
                assert (await replay("warm", rail0, 1).run(client)).iterations == 1
                before = await switches(target)
                assert {s["state"] for s in before.values()} == {"up"}
                assert before["ocs-rail0"]["cross_connects"] is not None

                await control.inject("ocs-rail0", {"fault": fault, "on": True})
                lost = replay("on-rail0", rail0, 3)
                spared = replay("on-rail1", rail1, 5)
                results = await asyncio.gather(lost.run(client), spared.run(client),
                                               return_exceptions=True)
                err, done = results
                assert isinstance(err, ReplayError), err
                assert "device_failure" in str(err) and "ocs-rail0" in str(err), err
                assert not isinstance(done, BaseException), done
                assert done.iterations == 5  # the other rail kept running

                info = await until_state(target, "ocs-rail0", "unreachable")
                assert info["cross_connects"] is None  # unknown, never a false 0
                assert info["last_error"] and info["unreachable_for_s"] is not None
                assert (await switches(target))["ocs-rail1"]["state"] == "up"
                # while it stays away, a job that needs it is refused DEVICE_FAILURE naming it
                # (not left to its admission timeout, whose error is DEADLINE_EXCEEDED)
                with pytest.raises(ReplayError, match=r"device_failure: phase .*: switch "
                                   r"'ocs-rail0' is unreachable \(") as again:
                    await replay("again", rail0, 1).run(client)
                assert "switch 'ocs-rail0': " not in str(again.value)  # named once

                await control.inject("ocs-rail0", {"fault": fault, "on": False})
                back = await until_state(target, "ocs-rail0", "up")
                assert back["cross_connects"] is not None and back["unreachable_for_s"] is None
                # no restart: a new replay on the recovered rail succeeds
                assert (await replay("after", rail0, 2).run(client)).iterations == 2
