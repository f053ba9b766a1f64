"""Fixtures for integration tests against a real etcd (``etcd`` comes from tests/conftest.py):
stores on a test's own prefix, and the emulated devices a test's controller drives."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack

import pytest
import pytest_asyncio

from lightrail.controller.app import RunningController
from lightrail.controller.cli.embedded import embedded_config, running_controller
from lightrail.controller.config import FabricSection
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.etcd_server import EmbeddedEtcd
from lightrail.emulator.ocs import EmulatedFabricDevices

StoreFactory = Callable[[], Awaitable[EtcdStore]]
"""Opens one more store (another replica's connection) on the test's prefix."""


@pytest.fixture
def store_prefix() -> str:
    """A key prefix of the test's own, so tests never see each other's keys."""
    return f"/lightrail-test/{uuid.uuid4().hex[:12]}/v1"


@pytest_asyncio.fixture
async def store_factory(etcd: EmbeddedEtcd, store_prefix: str) -> AsyncIterator[StoreFactory]:
    """Open any number of stores (each its own connection) on ``store_prefix``; all are closed
    after the test."""
    async with AsyncExitStack() as stack:

        async def open_store() -> EtcdStore:
            store = EtcdStore.connect(etcd.endpoint, prefix=store_prefix, timeout_s=2.0)
            return await stack.enter_async_context(store)

        yield open_store


@pytest_asyncio.fixture
async def store(store_factory: StoreFactory) -> EtcdStore:
    """A connected store on the test's own prefix."""
    return await store_factory()


@pytest_asyncio.fixture
async def devices() -> EmulatedFabricDevices:
    """The emulated switches a test's controller drives (they outlive the controller)."""
    return EmulatedFabricDevices()


@pytest_asyncio.fixture
async def ctl(etcd: EmbeddedEtcd, devices: EmulatedFabricDevices
              ) -> AsyncIterator[RunningController]:
    """A controller on the built-in demo-4x2 fabric (2 ms reconfiguration delay, 5 s admission
    timeout) driving ``devices``, against the test's etcd."""
    cfg = embedded_config(
        etcd.endpoint,
        FabricSection.model_validate({"builtin": "demo-4x2", "reconfiguration_delay_ms": 2}),
        admission_timeout_s=5.0,
    )
    async with running_controller(cfg, devices=devices) as rc:
        yield rc
