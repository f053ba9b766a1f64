"""Hot-path writes to the etcd store without awaiting etcd (DESIGN.md: "Nothing on the hot path
waits for etcd"): ``CoalescingWriter``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import TracebackType
from typing import Final, Self

import structlog

from lightrail.controller.domain.timing import Backoff, Sleep
from lightrail.controller.store.client import SHUTDOWN_TIMEOUT_S, cancel_task
from lightrail.controller.store.errors import (
    FlushFailed,
    FlushTimeout,
    StoreError,
    StoreUnavailable,
)
from lightrail.controller.store.etcd import MAX_TXN_OPS, EtcdStore
from lightrail.controller.store.types import PendingWrite, encode_value

_MAX_TXN_BYTES: Final = 1_000_000
"""Bytes of keys and values per transaction we aim under (etcd's ``--max-request-bytes`` is
1.5 MiB by default)."""

DEFAULT_WRITE_BACKOFF: Final = Backoff(initial_s=0.1, max_s=2.0)
"""Pacing of retried writes unless the caller passes its own."""

_log = structlog.get_logger(__name__)


class CoalescingWriter:
    """Asynchronous, coalescing writes for the hot path (DESIGN.md: "Nothing on the hot path
    waits for etcd").

    ``put``/``delete`` record the latest value per key and return at once (no await, no etcd
    round trip; not thread-safe: call from the event loop). A background task (``run()``, or
    started by ``async with``) writes everything pending in transactions of at most
    ``max_ops_per_txn`` keys, so repeated writes to one key between two flushes cost one etcd
    write. A write that fails with StoreUnavailable is retried with ``backoff`` up to
    ``max_attempts`` attempts; then ``run()`` raises FlushFailed, and so do later ``put``,
    ``delete`` and ``flush`` calls (fail loud). Other store errors fail at once.
    """

    def __init__(
        self,
        store: EtcdStore,
        *,
        backoff: Backoff = DEFAULT_WRITE_BACKOFF,
        max_attempts: int = 8,
        max_ops_per_txn: int = 64,
        close_timeout_s: float = 10.0,
        sleep: Sleep = asyncio.sleep,
        name: str = "etcd-coalescing-writer",
    ) -> None:
        if not 1 <= max_ops_per_txn <= MAX_TXN_OPS:
            raise ValueError(f"max_ops_per_txn must be in 1..{MAX_TXN_OPS}")
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self._store = store
        self._backoff = backoff
        self._max_attempts = max_attempts
        self._max_ops = max_ops_per_txn
        self._close_timeout_s = close_timeout_s
        self._sleep = sleep
        self._name = name
        self._pending: dict[str, PendingWrite] = {}
        self._seq = 0  # number of put/delete calls so far
        self._written = 0  # every call up to this number is in etcd
        self._wake = asyncio.Event()
        self._round_done = asyncio.Event()
        self._failure: FlushFailed | None = None
        self._running = False
        self._task: asyncio.Task[None] | None = None
        self._log = _log.bind(writer=name)

    @property
    def pending(self) -> int:
        """Keys waiting to be written."""
        return len(self._pending)

    def put(self, key: str, obj: object) -> None:
        """Schedule ``obj`` to be stored at ``key`` (a later put or delete of the key replaces it).
        Encodes at once: raises TypeError/ValueError for a value JSON cannot encode, ValueError
        for a bad key, FlushFailed if the writer has failed."""
        self._record(key, PendingWrite(encode_value(obj)))

    def delete(self, key: str) -> None:
        """Schedule ``key`` to be deleted. Raises as ``put``."""
        self._record(key, PendingWrite(None))

    def _record(self, key: str, write: PendingWrite) -> None:
        if self._failure is not None:
            raise self._failure
        self._store.full_key(key)  # validates now, not in the background
        self._pending.pop(key, None)  # keep insertion order = order of last write
        self._pending[key] = write
        self._seq += 1
        self._wake.set()

    async def run(self) -> None:
        """Write pending values until cancelled. Raises FlushFailed (see class doc)."""
        if self._running:
            raise RuntimeError("CoalescingWriter.run is already running")
        self._running = True
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if not self._pending:
                    continue
                batch, self._pending = self._pending, {}
                seq = self._seq
                try:
                    await self._write(batch)
                except asyncio.CancelledError:
                    # Not known to be written: pending again, unless superseded meanwhile.
                    self._pending = {**batch, **self._pending}
                    raise
                except FlushFailed as e:
                    self._failure = e
                    self._log.error("etcd.writer_failed", error=str(e), keys=len(batch))
                    raise
                self._written = seq
                self._end_round()
        finally:
            self._running = False
            self._end_round()

    def _end_round(self) -> None:
        done, self._round_done = self._round_done, asyncio.Event()
        done.set()

    async def _write(self, batch: Mapping[str, PendingWrite]) -> None:
        keys = list(batch)
        while keys:
            chunk: dict[str, PendingWrite] = {}
            nbytes = 0
            for key in keys:
                size = len(key) + len(batch[key].value or b"")
                if chunk and (len(chunk) >= self._max_ops or nbytes + size > _MAX_TXN_BYTES):
                    break
                chunk[key] = batch[key]
                nbytes += size
            attempt = 0
            while True:
                try:
                    await self._store.write_batch(chunk)
                    break
                except StoreUnavailable as e:
                    attempt += 1
                    if attempt >= self._max_attempts:
                        raise FlushFailed(
                            f"{self._name}: {len(chunk)} keys not written after {attempt} "
                            f"attempts: {e}"
                        ) from e
                    delay_s = self._backoff.delay_s(attempt - 1)
                    self._log.warning(
                        "etcd.writer_retrying", error=str(e), attempt=attempt, delay_s=delay_s
                    )
                    await self._sleep(delay_s)
                except StoreError as e:
                    raise FlushFailed(f"{self._name}: write rejected: {e}") from e
            del keys[: len(chunk)]

    async def flush(self, timeout_s: float) -> None:
        """Wait until every put/delete made before this call is in etcd. Raises FlushTimeout
        after ``timeout_s`` seconds, FlushFailed if the writer failed, RuntimeError if it is not
        running."""
        target = self._seq
        try:
            async with asyncio.timeout(timeout_s):
                while self._written < target:
                    if self._failure is not None:
                        raise self._failure
                    if not self._running and (self._task is None or self._task.done()):
                        raise RuntimeError(f"{self._name} is not running: nothing writes")
                    await self._round_done.wait()
        except TimeoutError as e:
            raise FlushTimeout(
                f"{self._name}: {target - self._written} writes not flushed in {timeout_s} s"
            ) from e

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self.run(), name=self._name)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Flush (bounded by ``close_timeout_s``) unless leaving on an exception, then stop the
        task. Raises FlushFailed / FlushTimeout when leaving normally."""
        task, self._task = self._task, None
        try:
            if exc is None and task is not None and not task.done():
                await self.flush(self._close_timeout_s)
        finally:
            if task is not None:
                await cancel_task(task, SHUTDOWN_TIMEOUT_S)
        if exc is None and self._failure is not None:
            raise self._failure
