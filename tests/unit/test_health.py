"""GPU health: the XID classification, the NVML health source driven by a fake NVML module
(faithful to ``pynvml``: its constants and its ``NVMLError`` subclasses), the emulated source,
and the kept record of unhealthy GPUs.

No test sleeps to wait for an event: events are awaited with a timeout, polls are driven by
hand or by an injected sleep on an injected clock, and the event thread's backoff runs on a
simulated clock.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import queue
import re
import sys
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pynvml
import pytest

from lightrail.agents.host.health import (
    EventSource,
    GpuHealth,
    GpuId,
    HealthConfig,
    HealthEvent,
    HealthSource,
    HealthState,
    classify_xid,
)
from lightrail.agents.host.hub import HealthHub
from lightrail.agents.host.kernel import parse_kernel_message, pci_key
from lightrail.agents.host.nvml import NvmlHealthSource
from lightrail.agents.host.nvml_binding import NvmlUnavailableError
from lightrail.agents.host.state import (
    EMPTY,
    HealthStateError,
    UnhealthyGpuStore,
    UnhealthyRecord,
    merge,
    record_event,
)
from lightrail.controller.cli.daemons import HealthSourceUnavailable, open_health_source
from lightrail.controller.cli.main import build_parser
from lightrail.emulator.gpus import EmulatedHealthSource, EmulatedHosts

HOST = "h1"
WAIT_S = 5.0
"""Upper bound on waiting for an event that must come (never reached when the code is right)."""

CFG = HealthConfig(poll_interval_s=1.0, event_wait_timeout_s=0.02, error_backoff_max_s=60.0)


# --------------------------------------------------------------------------------------------
# The fake NVML module


@dataclass(frozen=True)
class FakeHandle:
    """A device handle; equal handles denote the same device (as the address of a real one)."""

    index: int


@dataclass(frozen=True)
class FakePciInfo:
    busId: bytes  # noqa: N815 - pynvml's field name


@dataclass(frozen=True)
class FakeEventData:
    device: object
    eventType: int  # noqa: N815 - pynvml's field name
    eventData: int  # noqa: N815 - pynvml's field name


@dataclass
class FakeEventSet:
    registered: set[int] = field(default_factory=set)
    freed: bool = False


@dataclass
class FakeGpu:
    """What one fake GPU answers. ``errors`` maps a pynvml function name to the NVMLError
    subclass it raises; ``lost`` makes every per-device call raise NVMLError_GpuIsLost."""

    index: int
    temperature_c: int = 40
    ecc_uncorrected: int | None = 0
    nvlinks: dict[int, bool] = field(default_factory=dict)
    nvlink_counters: Counter[tuple[int, int]] = field(default_factory=Counter)
    lost: bool = False
    errors: dict[str, type[Exception]] = field(default_factory=dict)

    @property
    def bus_id(self) -> bytes:
        return f"00000000:{0x3B + self.index:02X}:00.0".encode()

    @property
    def uuid(self) -> str:
        return f"GPU-0000000{self.index}-fake"


class FakeNvml:
    """The pynvml functions NvmlHealthSource uses, on fake GPUs. Counts every call per function
    and GPU index. Thread-safe (the source calls it from its event and poll threads)."""

    def __init__(self, gpus: int = 2, *, init_error: type[Exception] | None = None) -> None:
        self.gpus = [FakeGpu(i) for i in range(gpus)]
        self.init_error = init_error
        self.calls: Counter[tuple[str, int | None]] = Counter()
        self.wait_error: type[Exception] | None = None
        self.event_sets: list[FakeEventSet] = []
        self.shutdown_calls = 0
        self._lock = threading.Lock()
        self._events: queue.Queue[FakeEventData] = queue.Queue()
        self._cond = threading.Condition()
        self._outstanding = 0
        self._handed_out = False

    # ---- test controls

    def push_event(self, index: int, event_type: int, data: int = 0) -> None:
        with self._cond:
            self._outstanding += 1
        self._events.put(FakeEventData(FakeHandle(index), event_type, data))

    def push_xid(self, index: int, xid: int) -> None:
        self.push_event(index, pynvml.nvmlEventTypeXidCriticalError, xid)

    def wait_idle(self, timeout_s: float = WAIT_S) -> bool:
        """True once every pushed event was handed out and the source came back to wait (so it
        finished handling it)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._outstanding == 0, timeout_s)

    def device_calls(self, index: int) -> int:
        with self._lock:
            return sum(n for (_, i), n in self.calls.items() if i == index)

    # ---- internals

    def _count(self, fn: str, index: int | None) -> None:
        with self._lock:
            self.calls[(fn, index)] += 1

    def _device(self, fn: str, handle: object) -> FakeGpu:
        assert isinstance(handle, FakeHandle)
        self._count(fn, handle.index)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise pynvml.NVMLError_GpuIsLost()
        error = gpu.errors.get(fn)
        if error is not None:
            raise error()
        return gpu

    # ---- pynvml API

    def nvmlInit(self) -> None:  # noqa: N802
        self._count("nvmlInit", None)
        if self.init_error is not None:
            raise self.init_error()

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:  # noqa: N802
        self._device("nvmlDeviceGetHandleByIndex", FakeHandle(index))
        return FakeHandle(index)

    def nvmlDeviceGetUUID(self, handle: object) -> str:  # noqa: N802
        return self._device("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetPciInfo(self, handle: object) -> FakePciInfo:  # noqa: N802
        return FakePciInfo(self._device("nvmlDeviceGetPciInfo", handle).bus_id)

    def nvmlDeviceGetSupportedEventTypes(self, handle: object) -> int:  # noqa: N802
        self._device("nvmlDeviceGetSupportedEventTypes", handle)
        return int(pynvml.nvmlEventTypeAll)

    def nvmlEventSetCreate(self) -> object:  # noqa: N802
        es = FakeEventSet()
        self.event_sets.append(es)
        return es

    def nvmlDeviceRegisterEvents(  # noqa: N802
        self, handle: object, event_types: int, event_set: object
    ) -> None:
        gpu = self._device("nvmlDeviceRegisterEvents", handle)
        assert isinstance(event_set, FakeEventSet)
        assert event_types & pynvml.nvmlEventTypeXidCriticalError
        event_set.registered.add(gpu.index)

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> FakeEventData:  # noqa: N802
        assert isinstance(event_set, FakeEventSet) and not event_set.freed
        with self._cond:
            if self._handed_out:
                self._handed_out = False
                self._outstanding -= 1
                self._cond.notify_all()
        self._count("nvmlEventSetWait", None)
        if self.wait_error is not None:
            raise self.wait_error()
        if any(self.gpus[i].lost for i in event_set.registered):
            raise pynvml.NVMLError_GpuIsLost()
        try:
            data = self._events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError_Timeout() from None
        with self._cond:
            self._handed_out = True
        return data

    def nvmlEventSetFree(self, event_set: object) -> None:  # noqa: N802
        assert isinstance(event_set, FakeEventSet)
        event_set.freed = True

    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:  # noqa: N802
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._device("nvmlDeviceGetTemperature", handle).temperature_c

    def nvmlDeviceGetTotalEccErrors(  # noqa: N802
        self, handle: object, error_type: int, counter_type: int
    ) -> int:
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        assert counter_type == pynvml.NVML_VOLATILE_ECC
        gpu = self._device("nvmlDeviceGetTotalEccErrors", handle)
        if gpu.ecc_uncorrected is None:
            raise pynvml.NVMLError_NotSupported()
        return gpu.ecc_uncorrected

    def nvmlDeviceGetNvLinkState(self, handle: object, link: int) -> int:  # noqa: N802
        gpu = self._device("nvmlDeviceGetNvLinkState", handle)
        if link not in gpu.nvlinks:
            raise pynvml.NVMLError_NotSupported()
        return int(gpu.nvlinks[link])

    def nvmlDeviceGetNvLinkErrorCounter(  # noqa: N802
        self, handle: object, link: int, counter: int
    ) -> int:
        gpu = self._device("nvmlDeviceGetNvLinkErrorCounter", handle)
        if link not in gpu.nvlinks:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.nvlink_counters[(link, counter)]


class FakeClock:
    """One injected clock for wall and monotonic time, moved by hand."""

    def __init__(self, start_s: float = 1_000_000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, dt_s: float) -> None:
        self.now_s += dt_s


class SimulatedBackoff:
    """The event thread's backoff wait on a simulated clock: records each delay and stops the
    thread once ``horizon_s`` of simulated time has passed."""

    def __init__(self, horizon_s: float) -> None:
        self.horizon_s = horizon_s
        self.delays: list[float] = []
        self.finished = threading.Event()

    def __call__(self, delay_s: float) -> bool:
        self.delays.append(delay_s)
        if sum(self.delays) >= self.horizon_s:
            self.finished.set()
            return True
        return False


async def next_event(events: AsyncIterator[HealthEvent], timeout_s: float = WAIT_S) -> HealthEvent:
    return await asyncio.wait_for(anext(events), timeout_s)


def make_source(
    fake: FakeNvml,
    clock: FakeClock | None = None,
    config: HealthConfig = CFG,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    backoff_wait: Callable[[float], bool] | None = None,
) -> NvmlHealthSource:
    clock = clock or FakeClock()
    return NvmlHealthSource(HOST, config, nvml=fake, wall_clock=clock, monotonic=clock,
                            sleep=sleep, backoff_wait=backoff_wait)


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml(gpus=2)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def source(fake: FakeNvml, clock: FakeClock) -> AsyncIterator[NvmlHealthSource]:
    src = make_source(fake, clock)
    try:
        yield src
    finally:
        await src.close()


async def open_healthy(src: NvmlHealthSource, count: int = 2) -> AsyncIterator[HealthEvent]:
    """Subscribe, open, poll once; consume the first HEALTHY event of every GPU."""
    events = src.events()
    await src.open()
    src.poll_once()
    for _ in range(count):
        ev = await next_event(events)
        assert ev.state is HealthState.HEALTHY
    return events


def g(index: int, host: str = HOST) -> GpuId:
    return GpuId(host, index)


# --------------------------------------------------------------------------------------------
# Classification and parsing


@pytest.mark.parametrize(
    ("xid", "state"),
    [
        (79, HealthState.FAILED),
        (48, HealthState.FAILED),
        (95, HealthState.FAILED),
        (64, HealthState.FAILED),
        (94, HealthState.DEGRADED),
        (63, HealthState.DEGRADED),
        (13, None),
        (31, None),
        (43, None),
    ],
)
def test_xid_classification(xid: int, state: HealthState | None) -> None:
    assert classify_xid(xid) is state


def test_xid_classification_is_configurable_and_validated() -> None:
    cfg = HealthConfig(failed_xids=frozenset({79, 74}), degraded_xids=frozenset())
    assert classify_xid(74, cfg) is HealthState.FAILED
    assert classify_xid(94, cfg) is None
    with pytest.raises(ValueError, match="both"):
        HealthConfig(failed_xids=frozenset({94}), degraded_xids=frozenset({94}))
    with pytest.raises(ValueError, match="poll_interval_s"):
        HealthConfig(poll_interval_s=0)


@pytest.mark.parametrize(
    ("line", "pci", "xid", "off_bus"),
    [
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1101, GPU has fallen off the bus.",
         (0, 0x3B, 0), 79, True),
        ("[ 5107.6] NVRM: Xid (PCI:0000:3c:00): 94, pid=7, Contained: SM (0x1).",
         (0, 0x3C, 0), 94, False),
        ("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", (0, 0x3B, 0), 79, True),
        ("NVRM: GPU at 0000:3b:00.0 has fallen off the bus.", (0, 0x3B, 0), 79, True),
    ],
)
def test_kernel_messages_are_parsed(
    line: str, pci: tuple[int, int, int], xid: int, off_bus: bool
) -> None:
    report = parse_kernel_message(line)
    assert report is not None
    assert (report.pci, report.xid, report.fallen_off_bus) == (pci, xid, off_bus)


def test_unrelated_kernel_lines_and_bus_ids() -> None:
    assert parse_kernel_message("NVRM: GPU at PCI:0000:01:00: GPU-bc0fa0b9-cac2") is None
    assert parse_kernel_message("usbhid 2-3:1.0: suspend error -5") is None
    assert pci_key(b"00000000:3B:00.0") == pci_key("0000:3b:00") == (0, 0x3B, 0)
    assert pci_key("not a bus id") is None


# --------------------------------------------------------------------------------------------
# NVML source: discovery, events and polling


async def test_discovery_reports_unknown_until_polled_then_healthy(
    source: NvmlHealthSource, fake: FakeNvml
) -> None:
    as_protocol: HealthSource = source
    events = as_protocol.events()
    await source.open()
    snap = source.snapshot()
    assert [h.state for h in snap.values()] == [HealthState.UNKNOWN, HealthState.UNKNOWN]
    source.poll_once()
    first = [await next_event(events), await next_event(events)]
    assert {(e.gpu, e.state, e.source) for e in first} == {
        (g(0), HealthState.HEALTHY, EventSource.NVML_POLL),
        (g(1), HealthState.HEALTHY, EventSource.NVML_POLL),
    }
    assert source.snapshot()[g(1)].uuid == fake.gpus[1].uuid
    assert [es.registered for es in fake.event_sets] == [{0, 1}]


@pytest.mark.parametrize("kernel_first", [True, False], ids=["kernel-then-xid", "xid-then-kernel"])
async def test_gpu_reported_lost_twice_gives_one_failure_event(
    source: NvmlHealthSource, fake: FakeNvml, kernel_first: bool
) -> None:
    events = await open_healthy(source)
    kernel_line = "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
    if kernel_first:
        assert source.ingest_kernel_message(kernel_line) is not None
        fake.push_xid(0, 79)
    else:
        fake.push_xid(0, 79)
        assert await asyncio.to_thread(fake.wait_idle)
        assert source.ingest_kernel_message(kernel_line) is not None
    assert await asyncio.to_thread(fake.wait_idle)
    # NVML now answers "GPU is lost" on every call: a third report, still no second event.
    fake.gpus[0].lost = True
    source.poll_once()
    # A sentinel on the other GPU: every event before it has been delivered.
    fake.gpus[1].temperature_c = 95
    source.poll_once()

    failed = await next_event(events)
    assert (failed.gpu, failed.state, failed.xid) == (g(0), HealthState.FAILED, 79)
    assert failed.source is (EventSource.KERNEL_LOG if kernel_first else EventSource.NVML_EVENT)
    sentinel = await next_event(events)
    assert (sentinel.gpu, sentinel.state) == (g(1), HealthState.DEGRADED)
    assert source.snapshot()[g(0)].state is HealthState.FAILED


async def test_lost_gpu_is_never_polled_again_no_hot_loop(fake: FakeNvml, clock: FakeClock) -> None:
    cycles = 1000
    done = asyncio.Event()
    count = 0

    async def sleep(delay_s: float) -> None:
        nonlocal count
        clock.advance(delay_s)
        count += 1
        if count == 1:
            fake.gpus[0].lost = True  # falls off the bus after the first, healthy poll
        if count >= cycles:
            done.set()
            await asyncio.Event().wait()
        await asyncio.sleep(0)

    src = make_source(fake, clock, sleep=sleep)
    events = src.events()
    task = asyncio.create_task(src.run(), name="health-run")
    await asyncio.wait_for(done.wait(), WAIT_S * 6)
    lost_calls_at_end = fake.device_calls(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    states = [(await next_event(events)).state for _ in range(3)]
    assert sorted(s.value for s in states) == ["failed", "healthy", "healthy"]
    polls_of_gpu1 = fake.calls[("nvmlDeviceGetTemperature", 1)]
    assert polls_of_gpu1 == cycles  # the healthy GPU is polled on every cycle ...
    assert fake.calls[("nvmlDeviceGetTemperature", 0)] == 2  # ... the lost one: never again
    calls_before_loss = 1 + 1 + 1 + 36 + 1 + 1 + 1  # discovery, events, first poll
    assert lost_calls_at_end <= calls_before_loss + 2
    assert fake.calls[("nvmlEventSetWait", None)] < 200  # waits are paced by their timeout


async def test_event_wait_that_fails_at_once_backs_off(fake: FakeNvml, clock: FakeClock) -> None:
    backoff = SimulatedBackoff(horizon_s=3600.0)
    fake.wait_error = pynvml.NVMLError_Unknown
    src = make_source(fake, clock, backoff_wait=backoff)
    await src.open()
    assert await asyncio.to_thread(backoff.finished.wait, WAIT_S)  # the simulated hour is over
    await src.close()

    waits = fake.calls[("nvmlEventSetWait", None)]
    assert waits == len(backoff.delays) == src.event_wait_errors
    assert waits < 90  # about 12 doublings from 20 ms, then one try a minute for the hour
    assert backoff.delays == sorted(backoff.delays)
    assert max(backoff.delays) == CFG.error_backoff_max_s
    assert fake.shutdown_calls == 1 and all(es.freed for es in fake.event_sets)


async def test_event_wait_reporting_lost_rebuilds_the_set_without_the_lost_gpu(
    source: NvmlHealthSource, fake: FakeNvml
) -> None:
    events = await open_healthy(source)
    fake.gpus[1].lost = True  # the event set now answers "GPU is lost"
    ev = await next_event(events)
    assert (ev.gpu, ev.state, ev.source) == (g(1), HealthState.FAILED, EventSource.NVML_EVENT)
    fake.push_xid(0, 94)  # the rebuilt set still delivers the other GPU's events
    ev = await next_event(events)
    assert (ev.gpu, ev.state, ev.xid) == (g(0), HealthState.DEGRADED, 94)
    assert len(fake.event_sets) == 2
    assert fake.event_sets[0].freed and fake.event_sets[1].registered == {0}
    assert source.event_wait_errors == 1


async def test_unknown_nvml_error_reports_unknown_not_healthy(
    source: NvmlHealthSource, fake: FakeNvml, clock: FakeClock
) -> None:
    events = await open_healthy(source)
    fake.gpus[1].errors["nvmlDeviceGetTemperature"] = pynvml.NVMLError_Unknown
    source.poll_once()
    ev = await next_event(events)
    assert (ev.gpu, ev.state) == (g(1), HealthState.UNKNOWN)
    assert "Unknown Error" in ev.reason
    # The failing GPU backs off: over 1000 one-second cycles it is tried ~25 times, not 1000.
    for _ in range(1000):
        clock.advance(1.0)
        source.poll_once()
    tries = fake.calls[("nvmlDeviceGetTemperature", 1)]
    assert 1 + 10 <= tries <= 1 + 30
    assert fake.calls[("nvmlDeviceGetTemperature", 0)] == 1 + 1 + 1000
    assert source.snapshot()[g(1)].state is HealthState.UNKNOWN
    # When reads work again the GPU is healthy again.
    del fake.gpus[1].errors["nvmlDeviceGetTemperature"]
    clock.advance(CFG.error_backoff_max_s)
    source.poll_once()
    ev = await next_event(events)
    assert (ev.gpu, ev.state) == (g(1), HealthState.HEALTHY)


async def test_unknown_error_at_discovery_is_unknown(fake: FakeNvml) -> None:
    fake.gpus[0].errors["nvmlDeviceGetUUID"] = pynvml.NVMLError_Unknown
    src = make_source(fake)
    try:
        await src.open()
        snap = src.snapshot()
        assert snap[g(0)].state is HealthState.UNKNOWN
        assert "discovery" in snap[g(0)].reason
    finally:
        await src.close()


async def test_gpu_lost_at_discovery_is_failed(fake: FakeNvml) -> None:
    fake.gpus[1].lost = True
    src = make_source(fake)
    events = src.events()
    try:
        await src.open()
        ev = await next_event(events)
        assert (ev.gpu, ev.state) == (g(1), HealthState.FAILED)
        src.poll_once()
        assert fake.device_calls(1) == 1  # only the handle lookup that said "lost"
    finally:
        await src.close()


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (pynvml.NVMLError_LibraryNotFound, "libnvidia-ml.so.1 was not found"),
        (pynvml.NVMLError_DriverNotLoaded, "driver is not loaded"),
    ],
)
async def test_nvml_unavailable_is_a_clear_error(error: type[Exception], says: str) -> None:
    fake = FakeNvml(init_error=error)
    src = make_source(fake)
    with pytest.raises(NvmlUnavailableError) as info:
        await src.open()
    message = str(info.value)
    for needle in (says, "NVIDIA driver", "nvidia-ml-py", "--health emulated", HOST):
        assert needle in message


def test_agent_health_source_is_chosen_explicitly() -> None:
    parser = build_parser()
    assert parser.parse_args(["agent"]).health == "nvml"
    assert parser.parse_args(["agent", "--health", "emulated"]).health == "emulated"
    with pytest.raises(SystemExit):  # the old silent fallback is gone
        parser.parse_args(["agent", "--health", "auto"])


async def test_emulated_health_source_only_when_asked() -> None:
    src = await open_health_source("emulated", HOST, emulated_gpus=4)
    assert isinstance(src, EmulatedHealthSource)
    assert sorted(src.snapshot()) == [g(i) for i in range(4)]
    with pytest.raises(ValueError, match="auto"):
        await open_health_source("auto", HOST, emulated_gpus=4)


async def test_missing_nvml_binding_names_the_package_and_the_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    for name in ("lightrail.agents.host.nvml", "lightrail.agents.host.nvml_binding"):
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(HealthSourceUnavailable) as info:
        await open_health_source("nvml", HOST, emulated_gpus=4)
    assert "pip install nvidia-ml-py" in str(info.value)
    assert "--health emulated" in str(info.value)


async def test_real_nvml_on_a_machine_without_gpus() -> None:
    probe = NvmlHealthSource(HOST, CFG)
    try:
        await probe.open()
    except NvmlUnavailableError as e:
        assert "libnvidia-ml.so.1" in str(e) or "driver" in str(e)
        # the cause is named, not only the generic help text (which mentions both)
        assert re.match(rf"NVML unavailable on host {HOST}: (the NVML library libnvidia-ml"
                        r"\.so\.1 was not found|the NVIDIA kernel driver is not loaded) ",
                        str(e)), str(e)
    else:
        await probe.close()
        pytest.skip("NVML works on this machine: the no-GPU fallback is not exercised")
    with pytest.raises(HealthSourceUnavailable, match="--health emulated"):  # no fallback
        await open_health_source("nvml", HOST, emulated_gpus=2)


async def test_xid_events_classified_and_latched(
    source: NvmlHealthSource, fake: FakeNvml
) -> None:
    events = await open_healthy(source)
    fake.push_xid(0, 13)  # an application fault: no health change
    fake.push_xid(0, 94)
    ev = await next_event(events)
    assert (ev.gpu, ev.state, ev.xid, ev.reason) == (
        g(0), HealthState.DEGRADED, 94, "XID 94: contained ECC error")
    source.poll_once()  # a clean poll does not clear an XID
    fake.push_xid(0, 95)
    ev = await next_event(events)
    assert (ev.state, ev.xid) == (HealthState.FAILED, 95)
    fake.push_event(1, pynvml.nvmlEventTypeDoubleBitEccError)
    ev = await next_event(events)
    assert (ev.gpu, ev.state, ev.xid) == (g(1), HealthState.FAILED, None)
    assert source.snapshot()[g(0)].state is HealthState.FAILED


async def test_temperature_threshold_with_hysteresis(
    source: NvmlHealthSource, fake: FakeNvml
) -> None:
    events = await open_healthy(source)
    fake.gpus[0].temperature_c = 86
    source.poll_once()
    ev = await next_event(events)
    assert (ev.state, ev.gpu) == (HealthState.DEGRADED, g(0))
    assert "86 °C" in ev.reason
    fake.gpus[0].temperature_c = 82  # below the threshold, within the hysteresis
    source.poll_once()
    fake.gpus[0].temperature_c = 79
    source.poll_once()
    ev = await next_event(events)
    assert (ev.state, ev.gpu) == (HealthState.HEALTHY, g(0))


async def test_uncorrected_ecc_degrades_and_unsupported_ecc_is_not_asked_again(
    fake: FakeNvml,
) -> None:
    fake.gpus[1].ecc_uncorrected = None  # ECC disabled on this board
    src = make_source(fake)
    try:
        events = await open_healthy(src)
        fake.gpus[0].ecc_uncorrected = 2
        for _ in range(5):
            src.poll_once()
        ev = await next_event(events)
        assert (ev.gpu, ev.state) == (g(0), HealthState.DEGRADED)
        assert "2 uncorrected ECC errors" in ev.reason
        assert fake.calls[("nvmlDeviceGetTotalEccErrors", 1)] == 1
    finally:
        await src.close()


async def test_nvlink_errors_degrade_for_the_hold_time(fake: FakeNvml, clock: FakeClock) -> None:
    fake.gpus[0].nvlinks = {0: True, 1: True, 2: False}
    src = make_source(fake, clock)
    try:
        events = await open_healthy(src)
        fake.gpus[0].nvlink_counters[(1, pynvml.NVML_NVLINK_ERROR_DL_REPLAY)] += 3
        clock.advance(1.0)
        src.poll_once()
        ev = await next_event(events)
        assert (ev.gpu, ev.state) == (g(0), HealthState.DEGRADED)
        assert "NVLink 1: 3 replay/recovery errors" in ev.reason
        clock.advance(CFG.nvlink_hold_s - 2)
        src.poll_once()  # still held
        clock.advance(2.0)
        src.poll_once()
        ev = await next_event(events)
        assert (ev.gpu, ev.state) == (g(0), HealthState.HEALTHY)
        # CRC errors count by rate: 50/s is fine, 200/s degrades.
        fake.gpus[0].nvlink_counters[(0, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)] += 50
        clock.advance(1.0)
        src.poll_once()
        fake.gpus[0].nvlink_counters[(0, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)] += 200
        clock.advance(1.0)
        src.poll_once()
        ev = await next_event(events)
        assert "NVLink 0: 200 CRC errors/s" in ev.reason
        fake.gpus[0].nvlinks[0] = False
        clock.advance(1.0)
        src.poll_once()
        assert "NVLink 0 down" in src.snapshot()[g(0)].reason
        # Link 2 was inactive at discovery and is never polled: 7 polls x 2 links x 4 counters.
        assert fake.calls[("nvmlDeviceGetNvLinkErrorCounter", 0)] == 7 * 2 * 4
    finally:
        await src.close()


async def test_close_is_bounded_and_releases_nvml(fake: FakeNvml) -> None:
    src = make_source(fake)
    await src.open()
    await asyncio.wait_for(src.close(), CFG.event_wait_timeout_s + 2.0)
    assert fake.shutdown_calls == 1
    assert all(es.freed for es in fake.event_sets)
    await src.close()  # idempotent
    assert fake.shutdown_calls == 1


async def test_restore_keeps_unhealthy_gpus_across_a_restart(fake: FakeNvml) -> None:
    record = {
        g(0): GpuHealth(g(0), HealthState.FAILED, "XID 79: GPU has fallen off the bus", 79,
                        1.0, EventSource.NVML_EVENT, fake.gpus[0].uuid),
        g(1): GpuHealth(g(1), HealthState.DEGRADED, "XID 94", 94, 1.0, EventSource.NVML_EVENT,
                        "GPU-replaced-since"),
    }
    src = make_source(fake)
    src.restore(record)  # before open: applied at discovery
    try:
        await src.open()
        src.poll_once()  # NVML itself sees nothing wrong
        snap = src.snapshot()
        assert (snap[g(0)].state, snap[g(0)].source) == (HealthState.FAILED, EventSource.RESTORED)
        assert snap[g(1)].state is HealthState.HEALTHY  # a different UUID: another GPU now
        src.restore({})  # the controller cleared it
        assert src.snapshot()[g(0)].state is HealthState.HEALTHY
    finally:
        await src.close()


async def test_event_thread_crash_stops_run(fake: FakeNvml, clock: FakeClock) -> None:
    def boom(delay_s: float) -> bool:
        raise RuntimeError("bug in backoff")

    fake.wait_error = pynvml.NVMLError_Unknown
    polled = asyncio.Event()

    async def sleep(delay_s: float) -> None:
        polled.set()
        await asyncio.sleep(0.01)

    src = make_source(fake, clock, backoff_wait=boom, sleep=sleep)
    with pytest.raises(RuntimeError, match="event thread of host h1 died"):
        await asyncio.wait_for(src.run(), WAIT_S)


# --------------------------------------------------------------------------------------------
# Emulated source


async def test_emulated_source_scripted_failures() -> None:
    clock = FakeClock()
    src = EmulatedHealthSource("e1", 4, wall_clock=clock)
    source: HealthSource = src  # the same interface as the NVML source
    assert set(source.snapshot()) == set(src.gpus)
    events = src.events()
    assert {h.state for h in src.snapshot().values()} == {HealthState.HEALTHY}
    assert src.fail(2) is not None
    assert src.fail(2, xid=48) is None  # already failed: one failure event
    assert src.inject_xid(1, 13) is None
    assert src.inject_xid(1, 94) is not None
    assert src.inject_xid(2, 94) is None  # a FAILED GPU is not made better by an XID
    src.degrade(3, "fan")
    src.recover(3)
    src.set_unknown(0)
    got = [await next_event(events) for _ in range(5)]
    assert [(e.gpu.index, e.state, e.xid) for e in got] == [
        (2, HealthState.FAILED, 79),
        (1, HealthState.DEGRADED, 94),
        (3, HealthState.DEGRADED, None),
        (3, HealthState.HEALTHY, None),
        (0, HealthState.UNKNOWN, None),
    ]
    assert got[0].reason == "XID 79: GPU has fallen off the bus"
    assert got[0].at_s == clock.now_s and got[0].source is EventSource.EMULATED
    with pytest.raises(KeyError):
        src.fail(4)
    with pytest.raises(ValueError, match="not a GPU of host"):
        src.fail(GpuId("other", 0))
    await events.aclose()
    with pytest.raises(StopAsyncIteration):
        await anext(events)


async def test_dropped_subscription_is_released() -> None:
    hub = HealthHub(HOST)
    hub.add_gpu(0)

    async def reader() -> None:
        async for _ in hub.subscribe():
            pass

    task = asyncio.create_task(reader())
    await asyncio.sleep(0)
    assert hub.subscriber_count == 1
    task.cancel()
    await asyncio.wait([task])
    del task
    gc.collect()
    assert hub.subscriber_count == 0
    assert hub.set(g(0), HealthState.FAILED, "x", None, EventSource.NVML_POLL) is not None


async def test_emulated_hung_host_stops_heartbeat_and_holds_events() -> None:
    src = EmulatedHealthSource("e1", 2)
    events = src.events()
    await asyncio.wait_for(src.wait_alive(), WAIT_S)
    src.stop_heartbeat()
    assert src.heartbeat_stopped
    alive = asyncio.create_task(src.wait_alive())
    pending_event = asyncio.create_task(anext(events))
    src.fail(0)
    for _ in range(5):
        await asyncio.sleep(0)
    assert not alive.done() and not pending_event.done()
    src.resume_heartbeat()
    await asyncio.wait_for(alive, WAIT_S)
    ev = await asyncio.wait_for(pending_event, WAIT_S)
    assert (ev.gpu, ev.state) == (GpuId("e1", 0), HealthState.FAILED)


async def test_emulated_hosts() -> None:
    hosts = EmulatedHosts(3, gpus_per_host=2)
    assert list(hosts) == ["host000", "host001", "host002"]
    assert len(hosts.gpus()) == 6
    events = hosts["host001"].events()
    hosts.fail(GpuId("host001", 1))
    ev = await next_event(events)
    assert ev.gpu == GpuId("host001", 1)
    failed = [gpu for gpu, h in hosts.snapshot().items() if h.state is HealthState.FAILED]
    assert failed == [GpuId("host001", 1)]
    with pytest.raises(ValueError, match="unique"):
        EmulatedHosts(["a", "a"])


# --------------------------------------------------------------------------------------------
# The kept record of unhealthy GPUs


def health(index: int, state: HealthState, since_s: float, host: str = HOST) -> GpuHealth:
    return GpuHealth(GpuId(host, index), state, f"{state.value} reason", None, since_s,
                     EventSource.NVML_EVENT, f"GPU-{index}")


def event(index: int, state: HealthState, at_s: float) -> HealthEvent:
    return HealthEvent(g(index), state, f"{state.value} reason", None, at_s, EventSource.NVML_POLL)


def test_record_event_keeps_degraded_and_failed_only() -> None:
    r = record_event(EMPTY, event(0, HealthState.FAILED, 10.0), uuid="GPU-0")
    r = record_event(r, event(1, HealthState.DEGRADED, 11.0))
    assert record_event(r, event(1, HealthState.UNKNOWN, 12.0)) is r
    r = record_event(r, event(1, HealthState.HEALTHY, 13.0))
    assert list(r.gpus) == [g(0)]
    assert (r.gpus[g(0)].uuid, r.as_of_s) == ("GPU-0", 13.0)
    assert record_event(r, event(1, HealthState.HEALTHY, 14.0)) is r


def test_merge_controller_record_wins() -> None:
    local = UnhealthyRecord.of(
        {
            g(0): health(0, HealthState.FAILED, 100.0),  # controller says degraded: it wins
            g(1): health(1, HealthState.FAILED, 100.0),  # cleared by the controller later
            g(2): health(2, HealthState.FAILED, 300.0),  # news the controller has not heard
        },
        300.0,
    )
    controller = UnhealthyRecord.of(
        {
            g(0): health(0, HealthState.DEGRADED, 90.0),
            g(3): health(3, HealthState.FAILED, 150.0),  # only the controller knows
        },
        200.0,
    )
    merged = merge(local, controller)
    assert {gpu.index: h.state for gpu, h in merged.gpus.items()} == {
        0: HealthState.DEGRADED,
        2: HealthState.FAILED,
        3: HealthState.FAILED,
    }
    assert merge(local, None) is local
    assert merge(EMPTY, controller).gpus == controller.gpus


def test_store_round_trip_and_missing_file(tmp_path: Path) -> None:
    store = UnhealthyGpuStore(tmp_path / "state" / "unhealthy.json")
    assert store.load() == EMPTY
    record = UnhealthyRecord.of({g(3): health(3, HealthState.FAILED, 5.0)}, 6.0)
    store.save(record)
    assert store.load() == record
    doc = json.loads(store.path.read_text())
    assert doc["schema_version"] == 1 and doc["gpus"][0]["state"] == "failed"
    assert os.listdir(store.path.parent) == ["unhealthy.json"]


def test_store_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = UnhealthyGpuStore(tmp_path / "unhealthy.json")
    old = UnhealthyRecord.of({g(0): health(0, HealthState.FAILED, 5.0)}, 5.0)
    store.save(old)

    def crash(src: str, dst: str) -> None:
        raise OSError("disk pulled")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk pulled"):
        store.save(EMPTY)
    monkeypatch.undo()
    assert store.load() == old  # the old file is intact ...
    assert os.listdir(tmp_path) == ["unhealthy.json"]  # ... and no temporary file is left


@pytest.mark.parametrize(
    "text", ["{not json", '{"schema_version": 2, "gpus": []}', '{"schema_version": 1}']
)
def test_store_rejects_a_bad_file_naming_it(tmp_path: Path, text: str) -> None:
    path = tmp_path / "unhealthy.json"
    path.write_text(text)
    with pytest.raises(HealthStateError, match=r"unhealthy\.json"):
        UnhealthyGpuStore(path).load()


async def test_agent_restart_does_not_forget_an_unhealthy_gpu(tmp_path: Path) -> None:
    store = UnhealthyGpuStore(tmp_path / "unhealthy.json")
    before = EmulatedHealthSource(HOST, 4)
    events = before.events()
    before.fail(2)
    store.record(await next_event(events))

    after = EmulatedHealthSource(HOST, 4)  # the restarted agent's source: all healthy
    after.restore(merge(store.load(), None).gpus)
    assert after.snapshot()[g(2)].state is HealthState.FAILED
    assert after.snapshot()[g(2)].source is EventSource.RESTORED
    # The controller's newer record (an operator repaired GPU 2) wins.
    controller = UnhealthyRecord.of({}, store.load().as_of_s + 10.0)
    after.restore(merge(store.load(), controller).gpus)
    assert after.snapshot()[g(2)].state is HealthState.HEALTHY
