"""gRPC TLS and operator identity (issue 10, section 6), over real loopback sockets with
certificates made at test time (openssl, ``tests/etcd_cluster.py``): a controller with a
server certificate refuses plaintext clients and clients that do not trust its CA, each with a
one-line reason; with ``client_ca_file`` it refuses clients without a certificate and the host
agent, its health link and the job client connect with theirs; mutating operator calls (Drain,
Failover) need a configured operator's token or certificate subject, read-only calls do not."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from lightrail.agents.channel import ClientTls
from lightrail.agents.client import ControllerClient
from lightrail.agents.host.agent import HostAgent
from lightrail.agents.host.reporter import HealthReporter
from lightrail.agents.leader import LeaderTargets, NoLeader
from lightrail.controller.api.auth import AUTHORIZATION_KEY, token_sha256
from lightrail.controller.cli.embedded import embedded_config, running_controller
from lightrail.controller.cli.operator import operator_call
from lightrail.controller.config import (
    Config,
    ControllerTlsSection,
    FabricSection,
    OperatorConfig,
)
from lightrail.controller.domain.model import RankPlacement
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.emulator.gpus import EmulatedHealthSource
from lightrail.emulator.ocs import EmulatedFabricDevices
from lightrail.v1 import operator_pb2, operator_pb2_grpc
from tests.etcd_cluster import CertPair, issue, make_ca

TOKEN = "lr-test-token-5f0c3e9a"


@dataclass(frozen=True)
class Pki:
    """The test's certificates: ``ca`` signs the controller's (``server``: 127.0.0.1,
    localhost) and the clients' (``alice``: an operator's subject, ``agent``: a host agent);
    ``other`` is a CA nobody uses."""

    ca: CertPair
    other: CertPair
    server: CertPair
    alice: CertPair
    agent: CertPair

    def client(self, who: CertPair | None = None, ca: CertPair | None = None) -> ClientTls:
        """TLS trusting ``ca`` (default: the controller's CA), with ``who``'s certificate."""
        return ClientTls.from_files((ca or self.ca).cert, None if who is None else who.cert,
                                    None if who is None else who.key)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d, "lightrail-ca")
    return Pki(ca, make_ca(d, "other-ca"), issue(ca, d, "controller", server=True),
               issue(ca, d, "alice", server=False), issue(ca, d, "agent-1", server=False))


def tls_config(etcd: EmbeddedEtcd, pki: Pki, *, mtls: bool,
               operators: Sequence[OperatorConfig]) -> Config:
    cfg = embedded_config(
        etcd.endpoint,
        FabricSection.model_validate({"builtin": "demo-4x2", "reconfiguration_delay_ms": 2}),
        admission_timeout_s=5.0)
    tls = ControllerTlsSection(cert_file=str(pki.server.cert), key_file=str(pki.server.key),
                               client_ca_file=str(pki.ca.cert) if mtls else None)
    ccfg = cfg.controller.model_copy(update={"tls": tls, "operators": list(operators)})
    return cfg.model_copy(update={"controller": ccfg})


async def status(target: str, tls: ClientTls | None) -> operator_pb2.GetStatusResponse:
    resp = await operator_call(LeaderTargets(target, tls=tls),
                               lambda s: s.GetStatus(operator_pb2.GetStatusRequest(), timeout=5))
    assert isinstance(resp, operator_pb2.GetStatusResponse)
    return resp


async def drain(target: str, tls: ClientTls | None, token: str | None = None
                ) -> operator_pb2.DrainResponse:
    md = () if token is None else ((AUTHORIZATION_KEY, f"Bearer {token}"),)
    resp = await operator_call(
        LeaderTargets(target, tls=tls),
        lambda s: s.Drain(operator_pb2.DrainRequest(host="host3", reason="test"), timeout=10,
                          metadata=md))
    assert isinstance(resp, operator_pb2.DrainResponse)
    return resp


async def refused(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    """The gRPC error ``call`` ends with (it must fail)."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def cli(*argv: str) -> tuple[int, str]:
    """``lightrail ARGV`` as a child process: its exit code and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lightrail.controller.cli.main", *argv,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    return proc.returncode or 0, err.decode()


async def test_tls_server_and_operator_tokens(
    etcd: EmbeddedEtcd, devices: EmulatedFabricDevices, pki: Pki, tmp_path: Path
) -> None:
    cfg = tls_config(etcd, pki, mtls=False,
                     operators=[OperatorConfig(name="ops", token_sha256=token_sha256(TOKEN))])
    async with running_controller(cfg, devices=devices) as rc:
        target = rc.grpc_target
        # a plaintext client, and one that does not trust the controller's CA: refused, with
        # the reason on one line
        with pytest.raises(NoLeader, match="may require TLS: --tls-ca"):
            await status(target, None)
        with pytest.raises(NoLeader, match="not signed by the CA of --tls-ca"):
            await status(target, pki.client(ca=pki.other))
        # trusting the CA: read-only calls are open, without a token
        assert (await status(target, pki.client())).leader
        # Drain: no token, a wrong one -> UNAUTHENTICATED naming the call, never the token
        exc = await refused(drain(target, pki.client()))
        assert exc.code() is grpc.StatusCode.UNAUTHENTICATED
        assert "Drain needs an operator identity" in (exc.details() or "")
        exc = await refused(drain(target, pki.client(), token="not-the-token"))
        assert exc.code() is grpc.StatusCode.UNAUTHENTICATED
        assert "not-the-token" not in (exc.details() or "")
        assert "matches no operator" in (exc.details() or "")
        # the operator's token: the call is made (host3 has no ranks: nothing fails over)
        assert list((await drain(target, pki.client(), token=TOKEN)).failovers) == []
        # Failover: refused without the token, answered (NOT_FOUND: no such job) with it
        req = operator_pb2.FailoverRequest(job_id="nope", rank=0)
        targets = LeaderTargets(target, tls=pki.client())
        exc = await refused(operator_call(targets, lambda s: s.Failover(req, timeout=5)))
        assert exc.code() is grpc.StatusCode.UNAUTHENTICATED
        exc = await refused(operator_call(targets, lambda s: s.Failover(
            req, timeout=5, metadata=((AUTHORIZATION_KEY, f"Bearer {TOKEN}"),))))
        assert exc.code() is grpc.StatusCode.NOT_FOUND
        # the CLI: --tls-ca, and --token-file for a mutating call
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN + "\n")
        base = ("--controller", target, "--tls-ca", str(pki.ca.cert))
        rc_, err = await cli("drain", "host3", *base)
        assert rc_ == 1
        assert "UNAUTHENTICATED: Drain needs an operator identity" in err
        rc_, err = await cli("drain", "host3", *base, "--token-file", str(token_file))
        assert (rc_, err) == (0, "")
        rc_, err = await cli("status", "--controller", target)
        assert rc_ == 1
        assert "may require TLS" in err


async def test_mtls_agents_and_operator_subjects(
    etcd: EmbeddedEtcd, devices: EmulatedFabricDevices, pki: Pki
) -> None:
    cfg = tls_config(etcd, pki, mtls=True, operators=[OperatorConfig(name="alice",
                                                                     subject="alice")])
    async with running_controller(cfg, devices=devices) as rc:
        target = rc.grpc_target
        # client certificates are required: trusting the CA is not enough
        with pytest.raises(NoLeader, match="may require a client certificate"):
            await status(target, pki.client())
        agent_tls = pki.client(pki.agent)
        assert (await status(target, agent_tls)).leader
        # a certificate whose subject is not an operator's: PERMISSION_DENIED on Drain
        exc = await refused(drain(target, agent_tls))
        assert exc.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "'agent-1' is not an operator" in (exc.details() or "")
        # alice's certificate names the operator
        assert list((await drain(target, pki.client(pki.alice))).failovers) == []
        # the job client, the host agent's phase stream and its health link, over mTLS
        async with ControllerClient(target, tls=agent_tls) as client, \
                HostAgent("host0", target, tls=agent_tls) as agent:
            assert await client.register_job("tls-job", [RankPlacement(0, "host0", 0),
                                                         RankPlacement(1, "host1", 0)]) == 2
            await agent.wait_connected(10.0)
            reporter = HealthReporter(EmulatedHealthSource("host0", 2), target, tls=agent_tls)
            task = asyncio.create_task(reporter.run())
            try:
                await asyncio.wait_for(reporter.acked.wait(), 10.0)
            finally:
                task.cancel()
            await client.unregister_job("tls-job")


async def test_plaintext_channel_to_a_tls_controller_is_one_line(
    etcd: EmbeddedEtcd, devices: EmulatedFabricDevices, pki: Pki
) -> None:
    """A TLS client dialling a plaintext controller is told so."""
    cfg = embedded_config(etcd.endpoint, FabricSection(builtin="demo-4x2"))
    async with running_controller(cfg, devices=devices) as rc:
        with pytest.raises(NoLeader, match="does not speak TLS at this address"):
            await status(rc.grpc_target, pki.client())
        # no operators configured: mutating calls from loopback are accepted
        async with grpc.aio.insecure_channel(rc.grpc_target) as ch:
            resp = await operator_pb2_grpc.OperatorServiceStub(ch).Drain(
                operator_pb2.DrainRequest(host="host3"), timeout=10)
        assert list(resp.failovers) == []
