"""High availability as deployed (issue 10, Done when): three controller replicas, each its own
process, against a 3-member etcd cluster over TLS with client certificates, driving emulated
TL1 switches that live in their own process (``lightrail emulate``). The CLI pointed at a
standby gets its answer from the leader; SIGKILL the leader and a standby takes over, reads the
switches back, and the CLI (still pointed at a standby) answers from the new leader."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, redirect_stderr, redirect_stdout

import pytest_asyncio

from lightrail.agents.client import ControllerClient
from lightrail.controller.cli.embedded import (
    ChildController,
    embedded_config,
    spawn_controller,
    spawn_emulator,
)
from lightrail.controller.cli.main import main as cli_main
from lightrail.controller.config import Config, EtcdSection, EtcdTlsSection
from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.store.etcd import EtcdStore
from lightrail.emulator.control import ControlClient
from lightrail.emulator.servers.fabric import rail_section
from tests.conftest import _etcd_binary_or_skip
from tests.etcd_cluster import EtcdCluster

WAIT_S = 20.0
"""Bound on each wait for an election outcome (a deadline, not a timing assertion)."""
PLACE = [RankPlacement(r, f"host{r // 2}", r % 2) for r in range(8)]
RING = PhaseKey(ProcessGroup.of(range(8)), Collective.ALL_REDUCE)


@pytest_asyncio.fixture
async def cluster() -> AsyncIterator[EtcdCluster]:
    _etcd_binary_or_skip()
    async with EtcdCluster(members=3, tls=True) as c:
        yield c


def tls_section(cluster: EtcdCluster) -> EtcdTlsSection:
    assert cluster.ca is not None and cluster.client is not None
    return EtcdTlsSection(ca_file=str(cluster.ca.cert), cert_file=str(cluster.client.cert),
                          key_file=str(cluster.client.key))


async def cli(*argv: str) -> tuple[int, str, str]:
    """``lightrail ARGV`` in a thread (it runs its own event loop): exit code, stdout, stderr."""
    def run() -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            rc = cli_main(list(argv))
        return rc, out.getvalue(), err.getvalue()

    return await asyncio.to_thread(run)


async def leader_id(cluster: EtcdCluster, other_than: str | None = None) -> str:
    """The replica id in the leader key, once it names one (other than ``other_than``)."""
    async with EtcdStore.connect(cluster.endpoints, tls=cluster.client_tls) as store:
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while True:
            record = await store.get_json("leader")
            if isinstance(record, dict) and record.get("replica_id") not in (None, other_than):
                return str(record["replica_id"])
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"no new leader within {WAIT_S} s (last {record!r})")
            await asyncio.sleep(0.05)


async def status_from(target: str, want: str) -> dict[str, object]:
    """``lightrail status --controller TARGET --json`` until the leader answering is ``want``
    (a standby may still point at the dead leader for a moment)."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while True:
        rc, out, err = await cli("status", "--controller", target, "--json")
        if rc == 0:
            doc: dict[str, object] = json.loads(out)
            if doc.get("replica_id") == want:
                return doc
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"status via {target}: rc {rc}, {out or err}")
        await asyncio.sleep(0.1)


async def test_three_replicas_on_a_tls_etcd_cluster_and_the_cli_at_a_standby(
        cluster: EtcdCluster) -> None:
    async with AsyncExitStack() as stack:
        emulator = await stack.enter_async_context(
            spawn_emulator(rail_section("demo-4x2", delay_ms=2)))
        control = await stack.enter_async_context(ControlClient(emulator.control_url))
        etcd = EtcdSection(endpoints=cluster.endpoints, tls=tls_section(cluster),
                           lease_ttl_s=2.0)
        configs: dict[str, Config] = {}
        for i in range(3):
            rid = f"r{i}"
            cfg = embedded_config(cluster.endpoints[0], emulator.section,
                                  admission_timeout_s=10.0, replica_id=rid)
            # no host agents here: the recovered job's ranks never resync, so the new
            # leader's host-dead verdict (after recovery_grace_s) releases its circuits
            configs[rid] = cfg.model_copy(update={"etcd": etcd, "controller": cfg.controller.
                                                  model_copy(update={"recovery_grace_s": 1.0})})
        started = await asyncio.gather(*(  # the three start at once, as a deployment would
            stack.enter_async_context(spawn_controller(c, announce="serving"))
            for c in configs.values()))
        replicas: dict[str, ChildController] = dict(zip(configs, started, strict=True))
        first = await leader_id(cluster)
        standby = next(c for rid, c in replicas.items() if rid != first)

        # the CLI given only a standby's address answers from the leader
        doc = await status_from(standby.grpc_target, first)
        assert doc["replica_id"] == first

        # a job switches the emulated rails through the leader, found via the standby
        client = await stack.enter_async_context(
            ControllerClient(standby.grpc_target, retry_budget_s=WAIT_S))
        assert await client.register_job("job", PLACE) == 8
        await asyncio.gather(*(client.enter("job", r, RING, timeout_s=10) for r in range(8)))
        for r in range(8):
            await client.release_phase("job", r, RING)
        ring = (await control.device("ocs-rail0")).cross_connects
        assert ring is not None and len(ring) == 4

        # SIGKILL the leader: a standby takes over and reads the switches back
        os.kill(replicas[first].pid, signal.SIGKILL)
        second = await leader_id(cluster, other_than=first)
        assert second != first
        survivor = next(c for rid, c in replicas.items() if rid not in (first, second))
        doc = await status_from(survivor.grpc_target, second)
        assert doc["replica_id"] == second
        rc, out, err = await cli("circuits", "--controller", survivor.grpc_target, "--json")
        assert rc == 0, err
        on_rail0 = {(x["ingress"], x["egress"]) for x in json.loads(out)["cross_connects"]
                    if x["switch_id"] == "ocs-rail0"}
        assert on_rail0 == {(x.ingress, x.egress) for x in ring}
        # and the job, recovered from etcd, still runs through the new leader
        await asyncio.gather(*(client.enter("job", r, RING, timeout_s=10) for r in range(8)))
