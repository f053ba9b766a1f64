"""The gRPC health name the Kubernetes probes ask (``lightrail.replica``, issue 12 section 3):
SERVING on the leader and on a standby, which serves by redirecting, while the overall status
stays SERVING on the leader only (two replicas on one real etcd)."""

from __future__ import annotations

from contextlib import AsyncExitStack

from grpc_health.v1 import health_pb2

from lightrail.controller.api.routing import REPLICA_HEALTH
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.emulator.ocs import EmulatedFabricDevices
from tests.integration.test_replicas import first_leader, health, replica, replica_config

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def test_replica_health_is_serving_on_standby_and_leader(
    etcd: EmbeddedEtcd, devices: EmulatedFabricDevices
) -> None:
    async with AsyncExitStack() as stack:
        replicas = [await stack.enter_async_context(replica(replica_config(etcd, rid), devices))
                    for rid in ("h0", "h1")]
        leader = await first_leader(replicas)
        standby = next(r for r in replicas if r is not leader)
        for r in replicas:
            assert await health(r.serving.grpc_target, REPLICA_HEALTH) == SERVING
        assert await health(leader.serving.grpc_target, "") == SERVING
        assert await health(standby.serving.grpc_target, "") == NOT_SERVING
