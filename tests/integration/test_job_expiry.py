"""Orphaned jobs (issue 14 section 3): a job with no open phase stream, waiting call or watch
for ``controller.job_idle_expiry_s`` is unregistered (its holds released, its circuits left,
its record gone from etcd, its GPUs free for the next job); ``lightrail jobs unregister``
removes one at once and needs an operator identity where operators are configured."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc
import pytest

from lightrail.agents.client import ControllerClient
from lightrail.agents.host.agent import HostAgent
from lightrail.agents.replay.replayer import HostSlot, Replayer, ReplayError
from lightrail.agents.replay.trace.loader import load_workload
from lightrail.controller.api.auth import token_sha256
from lightrail.controller.cli.embedded import embedded_config, running_controller
from lightrail.controller.config import Config, FabricSection, OperatorConfig, build_fabric
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.emulator.ocs import EmulatedFabricDevices
from lightrail.v1 import agent_pb2, agent_pb2_grpc, operator_pb2, operator_pb2_grpc

KEPT = [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(4)]  # host0, host1
ORPHAN = [RankPlacement(r, f"host{2 + r // 2}", r % 2) for r in range(4)]  # host2, host3
RING = PhaseKey(ProcessGroup.of(range(4)), Collective.ALL_REDUCE)
TOKEN = "expiry-test-token"
WAIT_S = 20.0


def config(etcd: EmbeddedEtcd, expiry_s: float | None, operators: bool = False) -> Config:
    cfg = embedded_config(etcd.endpoint, FabricSection.model_validate(
        {"builtin": "demo-4x2", "reconfiguration_delay_ms": 2}), admission_timeout_s=5.0)
    ops = [OperatorConfig(name="ops", token_sha256=token_sha256(TOKEN))] if operators else []
    return cfg.model_copy(update={"controller": cfg.controller.model_copy(
        update={"job_idle_expiry_s": expiry_s, "operators": ops})})


async def jobs(target: str) -> dict[str, operator_pb2.JobInfo]:
    async with grpc.aio.insecure_channel(target) as ch:
        resp = await operator_pb2_grpc.OperatorServiceStub(ch).ListJobs(
            operator_pb2.ListJobsRequest(), timeout=5)
    return {j.job_id: j for j in resp.jobs}


class Unregistrations:
    """The UNREGISTERED events of every job, from a WatchJob of all jobs (which attaches no
    job: only a watch of one job keeps that job alive)."""

    def __init__(self, target: str) -> None:
        self._channel = grpc.aio.insecure_channel(target)
        self._call = agent_pb2_grpc.AgentServiceStub(self._channel).WatchJob(
            agent_pb2.WatchJobRequest(job_id=""))

    async def next(self, job_id: str) -> str:
        """The message of ``job_id``'s UNREGISTERED event, waiting at most ``WAIT_S``."""
        async with asyncio.timeout(WAIT_S):
            async for event in self._call:
                if event.job_id == job_id and event.kind == agent_pb2.JOB_UNREGISTERED:
                    return str(event.message)
        raise AssertionError(f"the watch ended before {job_id!r} was unregistered")

    async def close(self) -> None:
        self._call.cancel()
        await self._channel.close(None)


async def stored(etcd: EmbeddedEtcd, job_id: str) -> bool:
    async with EtcdStore.connect(etcd.endpoint) as store:
        return await store.get_json(f"jobs/{job_id}") is not None


async def test_a_job_without_clients_expires_and_one_with_a_stream_stays(
    etcd: EmbeddedEtcd, devices: EmulatedFabricDevices
) -> None:
    async with running_controller(config(etcd, 1.0), devices=devices) as rc:
        target = rc.grpc_target
        watch = Unregistrations(target)
        agents = [HostAgent(f"host{h}", target) for h in (0, 1)]
        for a in agents:
            a.start()
        try:
            async with ControllerClient(target, retry_budget_s=2.0) as client:
                # registered first, but its ranks' host agents keep a phase stream open
                await client.register_job("kept", KEPT)
                await asyncio.gather(*(agents[p.rank // 2].enter("kept", p.rank, RING, 0, 5.0)
                                       for p in KEPT))
                # its ranks enter a ring through unary calls, hold it, and the client goes
                await client.register_job("orphan", ORPHAN)
                await asyncio.gather(*(client.enter("orphan", p.rank, RING, timeout_s=5.0)
                                       for p in ORPHAN))
            circuits = {sid: d.cross_connects for sid, d in devices.items()}
            assert any(circuits.values())
            listed = await jobs(target)
            assert not listed["kept"].HasField("idle_s")  # attached: its agents' streams

            reason = await watch.next("orphan")
            assert reason.startswith("expired: no stream and no call for ")
            assert "controller.job_idle_expiry_s = 1" in reason
            listed = await jobs(target)
            assert "orphan" not in listed
            assert "kept" in listed and not listed["kept"].HasField("idle_s")
            assert not await stored(etcd, "orphan") and await stored(etcd, "kept")
            # its circuits stay until another job needs the ports
            assert {sid: d.cross_connects for sid, d in devices.items()} == circuits
            # and its GPUs are free again
            async with ControllerClient(target, retry_budget_s=2.0) as client:
                assert await client.register_job("next", ORPHAN) == 4
                await client.unregister_job("next")
        finally:
            for a in agents:
                await a.close()
        # once its streams close, the kept job goes too
        assert (await watch.next("kept")).startswith("expired")
        assert "kept" not in await jobs(target)
        await watch.close()


async def cli(*argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lightrail.controller.cli.main", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_jobs_unregister_needs_an_operator_where_operators_are_configured(
    etcd: EmbeddedEtcd, devices: EmulatedFabricDevices
) -> None:
    async with running_controller(config(etcd, None, operators=True), devices=devices) as rc:
        target = rc.grpc_target
        async with ControllerClient(target, retry_budget_s=2.0) as client:
            await client.register_job("stuck", ORPHAN)
        assert not (await jobs(target))["stuck"].HasField("idle_s")  # expiry is off
        rc_, out, err = await cli("jobs", "unregister", "stuck", "--controller", target)
        assert rc_ == 1 and "UNAUTHENTICATED: RemoveJob needs an operator identity" in err
        assert "stuck" in await jobs(target)
        rc_, out, err = await cli("jobs", "unregister", "stuck", "--controller", target,
                                  "--token", TOKEN)
        assert (rc_, err) == (0, "") and "job stuck unregistered" in out
        assert "stuck" not in await jobs(target) and not await stored(etcd, "stuck")
        rc_, out, err = await cli("jobs", "unregister", "stuck", "--controller", target,
                                  "--token", TOKEN)
        assert rc_ == 1 and "NOT_FOUND: job_id: unknown job 'stuck'" in err


@pytest.mark.parametrize("bad", [0, -1, "soon"])
def test_bad_expiry_is_refused_naming_the_field(bad: object) -> None:
    from pydantic import ValidationError

    from lightrail.controller.config import ControllerSection
    with pytest.raises(ValidationError, match="job_idle_expiry_s"):
        ControllerSection.model_validate({"job_idle_expiry_s": bad})


DLRM = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces" / \
    "param-dlrm-8rank" / "dlrm_kineto.tar.gz"


async def test_a_failed_unregistration_never_hides_the_error_that_ended_the_replay(
    etcd: EmbeddedEtcd, devices: EmulatedFabricDevices
) -> None:
    """Issue 14 section 3: an operator removes a replaying job; its ranks fail, and so does the
    replay client's own UnregisterJob (NOT_FOUND). The client raises the ranks' error, with
    the failed cleanup as a note, not a traceback of the cleanup."""
    if not DLRM.exists():
        pytest.skip(f"{DLRM} not present")
    async with running_controller(config(etcd, None), devices=devices) as rc:
        target = rc.grpc_target
        fabric = build_fabric(FabricSection.model_validate({"builtin": "demo-4x2"}))
        hosts = [HostSlot(h.name, tuple(range(h.gpu_count))) for h in fabric.hosts.values()]
        replayer = Replayer(load_workload(DLRM), target, hosts, job_id="removed",
                            iterations=1000, time_scale=0.1, timeout_s=10.0)
        one = asyncio.Event()
        replayer.on_progress = lambda done, _n: one.set() if done >= 1 else None
        async with ControllerClient(target, retry_budget_s=2.0) as client:
            run = asyncio.create_task(replayer.run(client))
            await asyncio.wait_for(one.wait(), WAIT_S)
            async with grpc.aio.insecure_channel(target) as ch:
                await operator_pb2_grpc.OperatorServiceStub(ch).RemoveJob(
                    operator_pb2.RemoveJobRequest(job_id="removed"), timeout=10)
            with pytest.raises(ReplayError) as info:
                await asyncio.wait_for(run, 60)
        # the ranks' own error, not the cleanup's: a rank waiting at the removal is answered
        # CANCELLED (PhaseService.unregister_job), one between phases UNKNOWN_JOB at its next
        # enter; which rank fails first depends on where the removal finds them
        assert str(info.value) in (
            "replay failed: unknown_job: job_id: unknown job 'removed'",
            "replay failed: cancelled: job unregistered",
        )
        assert getattr(info.value, "__notes__", []) == [
            "unregistering job 'removed' failed too (JobRegistrationError: NOT_FOUND: job_id: "
            "unknown job 'removed'): it was no longer registered"]
