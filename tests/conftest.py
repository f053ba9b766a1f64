"""Fixtures shared by every test tier: a real etcd member (integration and end-to-end tests).

The ``etcd`` fixture skips a test when the etcd binary is missing, with the reason naming the
binary and the Debian package. CI sets ``LIGHTRAIL_REQUIRE_ETCD=1``, which turns that skip into
a failure so a missing install step cannot pass unnoticed.
"""

from __future__ import annotations

import os

from lightrail.controller.cli import grpc_environment

# Before grpc is imported: the daemon's gRPC environment (no fork handlers, as tests spawn etcd
# and controller processes while gRPC threads run in this one; connections on iomgr), so that
# the controllers run in-process here serve as the daemon does.
os.environ.update(grpc_environment(os.environ))

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from lightrail.controller.store.etcd_server import (
    EmbeddedEtcd,
    EtcdNotInstalledError,
    find_etcd_binary,
)

REQUIRE_ETCD_ENV = "LIGHTRAIL_REQUIRE_ETCD"


def _etcd_binary_or_skip() -> str:
    try:
        return find_etcd_binary()
    except EtcdNotInstalledError as e:
        if os.environ.get(REQUIRE_ETCD_ENV) == "1":
            pytest.fail(f"{e} ({REQUIRE_ETCD_ENV}=1 requires it)", pytrace=False)
        pytest.skip(str(e))


@pytest_asyncio.fixture
async def etcd() -> AsyncIterator[EmbeddedEtcd]:
    """A fresh single-member etcd on free loopback ports, in a temporary data dir, stopped and
    deleted after the test. The tail of etcd's own log (warnings and errors: slow fdatasync,
    requests that took too long) is printed at teardown, so a failed test's report shows it."""
    binary = _etcd_binary_or_skip()
    async with EmbeddedEtcd(binary=binary) as server:
        yield server
        tail = server.log_tail()
        if tail:
            print(f"--- the end of etcd's log ({server.log_path}) ---\n{tail}")
