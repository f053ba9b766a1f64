"""GPU health on one host: domain types, the XID classification, and the NVML health source
(DESIGN.md "Failover"; issue 5 §1).

A *health source* watches the GPUs of one host and reports, per GPU, a ``HealthState``. Its
``events()`` yield a ``HealthEvent`` on every change of a GPU's state (never twice for the same
state, so a GPU reported lost by two signals gives one failure event); ``snapshot()`` gives the
current state of every GPU. Two implementations share the ``HealthSource`` protocol:
``NvmlHealthSource`` here (real GPUs through NVML, Python binding ``nvidia-ml-py``, import name
``pynvml``) and ``lightrail.emulator.gpus.EmulatedHealthSource`` (scriptable failures for tests and
the
demo, and the fallback on machines without NVML when configured).

Signals of ``NvmlHealthSource``
- XID critical-error and double-bit-ECC events from an NVML event set, waited on in a worker
  thread with a timeout (``HealthConfig.event_wait_timeout_s``) so that shutdown is bounded.
- A poll every ``HealthConfig.poll_interval_s``: volatile uncorrected ECC count, GPU temperature,
  and for every active NVLink its state and error counters.
- Kernel log lines (``ingest_kernel_message``): ``NVRM: Xid (...)`` lines and "GPU has fallen
  off the bus" lines, for a journald/kmsg reader to feed.
- ``NVML_ERROR_GPU_IS_LOST`` from any call: fatal for that GPU. After it NVML answers "GPU is
  lost" at once on every call, so the GPU is never polled again (no hot loop) and is dropped
  from the event set; only ``restore`` (a record from the controller) can bring it back.
- Any other NVML error: the GPU's state is UNKNOWN (not HEALTHY) and its polls back off
  exponentially up to ``HealthConfig.error_backoff_max_s``.

XID classification (``classify_xid``; defaults in ``HealthConfig``) and the sources relied on:
- 79 "GPU has fallen off the bus" -> FAILED (and the GPU is treated as lost). NVIDIA Xid
  catalogue (docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Errors with the Xid Catalog");
  NVML's ``NVML_ERROR_GPU_IS_LOST`` reads "the GPU has fallen off the bus or has otherwise
  become inaccessible" (NVML API reference, nvmlReturn_t).
- 48 double-bit (uncorrectable) ECC error -> FAILED. NVIDIA "Dynamic Page Retirement"
  (docs.nvidia.com/deploy/dynamic-page-retirement, "Visibility": "XID 48: A DBE has occurred")
  and "GPU Memory Error Management" ("User Visible Statistics": "XID 48 indicates an
  uncorrectable ECC error has occurred"); NVIDIA Health Validation rates Xid 48 CRITICAL, drain.
- 63 page retirement / row remapping *recorded* -> DEGRADED: the memory is still protected, the
  remap takes effect at the next GPU reset (same two NVIDIA pages: "XID 63: successful recording
  of a row-remapping entry to the InfoROM" / "a page has successfully been retired").
- 64 page retirement / row remapping *failed* -> FAILED: the GPU could not protect itself
  ("XID 64: a failure in recording a row-remapping entry to the InfoROM"; DCGM reports a
  row-remap failure as ``DCGM_FR_ROW_REMAP_FAILURE``). A policy choice: we fail over rather
  than keep computing on memory that can no longer be remapped.
- 94 contained ECC error -> DEGRADED: error containment terminated only the application that
  touched the bad memory and offlined the page; other work goes on and no reset is needed
  (NVIDIA "GPU Memory Error Management", "Error Containment" and "Response to Uncorrectable
  Contained ECC Errors").
- 95 uncontained ECC error -> FAILED: containment failed and every workload on the GPU may be
  affected; a GPU reset is required (same NVIDIA document; DCGM ``DCGM_FR_UNCONTAINED_ERROR``).
- Any other XID (application faults such as 13, 31, 43, 45 dominate) does not change the GPU's
  state; it is logged. Sites can widen ``failed_xids`` / ``degraded_xids``.

Polled thresholds (``HealthConfig``), after DCGM's passive health watches (NVIDIA DCGM
``modules/health/DcgmHealthWatch.cpp`` and ``dcgm_gpu_hardware_limits.h``):
- Volatile uncorrected ECC count >= ``ecc_uncorrected_degraded_count`` -> DEGRADED. DCGM's memory
  watch *fails* on any volatile DBE; we degrade instead because the counter cannot tell a
  contained error (XID 94) from an uncontained one (XID 95), and the XID event that comes with
  the error decides between DEGRADED and FAILED.
- GPU temperature >= ``temperature_degraded_c`` -> DEGRADED, cleared below the threshold minus
  ``temperature_hysteresis_c`` (DCGM's thermal watch warns on thermal throttling).
- NVLink replay + recovery errors >= ``nvlink_replay_recovery_errors`` in one poll, or CRC
  (flit + data) errors >= ``nvlink_crc_errors_per_s`` per second, or an active link going down
  -> DEGRADED for ``nvlink_hold_s``. DCGM uses 1 error per minute (``DCGM_LIMIT_MAX_NVLINK_ERROR``)
  and 100 CRC errors per second (``DCGM_LIMIT_MAX_NVLINK_CRC_ERROR``); it *fails* on replay and
  recovery errors, we degrade: the GPU still computes correctly and the controller decides.

States rank FAILED > UNKNOWN > DEGRADED > HEALTHY: the worst finding of a GPU is its state, and
not knowing is worse than a known degradation.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import enum
import re
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol, TypeVar, cast

import structlog

try:
    import pynvml
except ImportError as _e:  # pragma: no cover - a declared dependency of the project
    raise ImportError(
        "lightrail.agents.host.health needs the NVML Python binding: pip install nvidia-ml-py "
        "(import name pynvml; not the deprecated 'pynvml' package)"
    ) from _e

_log = structlog.get_logger(__name__)

WallClock = Callable[[], float]
"""Returns wall-clock time in seconds since the epoch (``time.time``); stamps events."""
Monotonic = Callable[[], float]
"""Returns monotonic time in seconds (``time.monotonic``); schedules polls and backoff."""
Sleep = Callable[[float], Awaitable[None]]
"""Waits the given number of seconds (``asyncio.sleep``)."""

T = TypeVar("T")

# --------------------------------------------------------------------------------------------
# Domain types


@dataclass(frozen=True, slots=True, order=True)
class GpuId:
    """One GPU: ``index`` is the NVML device index (0-based) on ``host``."""

    host: str
    index: int

    def __str__(self) -> str:
        return f"{self.host}/gpu{self.index}"


class HealthState(enum.Enum):
    """Health of one GPU. ``FAILED`` triggers failover; ``DEGRADED`` and ``UNKNOWN`` keep a GPU
    from being picked as a spare; ``UNKNOWN`` also means "could not be read", never healthy."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNKNOWN = "unknown"
    FAILED = "failed"

    @property
    def severity(self) -> int:
        """Rank for "worst of": HEALTHY 0 < DEGRADED 1 < UNKNOWN 2 < FAILED 3."""
        return _SEVERITY[self]

    @property
    def unhealthy(self) -> bool:
        """True for the states an agent restart must not forget: DEGRADED and FAILED."""
        return self in (HealthState.DEGRADED, HealthState.FAILED)


_SEVERITY: Final = {
    HealthState.HEALTHY: 0,
    HealthState.DEGRADED: 1,
    HealthState.UNKNOWN: 2,
    HealthState.FAILED: 3,
}


class EventSource(enum.Enum):
    """Which signal produced a health finding."""

    NVML_EVENT = "nvml-event"
    """An NVML event set (XID critical error, double-bit ECC)."""
    NVML_POLL = "nvml-poll"
    """A periodic NVML read (ECC counts, temperature, NVLink) or an NVML error."""
    KERNEL_LOG = "kernel-log"
    """A ``NVRM:`` line of the kernel log."""
    EMULATED = "emulated"
    """``lightrail.emulator.gpus.EmulatedHealthSource``."""
    RESTORED = "restored"
    """A record kept across an agent restart (local state file or the controller's record)."""


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """A GPU's health changed to ``state`` at ``at_s`` (wall clock, seconds since the epoch).
    ``xid`` is the NVIDIA XID that caused it, if any; ``reason`` is for people."""

    gpu: GpuId
    state: HealthState
    reason: str
    xid: int | None
    at_s: float
    source: EventSource


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """The current health of one GPU: ``state`` since ``since_s`` (wall clock, seconds).
    ``uuid`` is the NVML UUID (``GPU-...``) when known, so that a record about a GPU that was
    since replaced (same index, new UUID) can be recognised."""

    gpu: GpuId
    state: HealthState
    reason: str
    xid: int | None
    since_s: float
    source: EventSource
    uuid: str | None = None


class HealthSource(Protocol):
    """Health of the GPUs of one host (DESIGN.md "Failover").

    ``run`` monitors until cancelled. ``events`` subscribes from this moment on: every change of
    a GPU's state, in order, exactly once per change. ``snapshot`` is the current state of every
    GPU. ``restore`` replaces the kept record of unhealthy GPUs (after an agent restart, from the
    local state file merged with the controller's record). ``wait_alive`` returns when the host
    can send a heartbeat (the emulated host blocks here while its heartbeat is stopped).
    """

    @property
    def host(self) -> str:
        """The host name used in every ``GpuId``."""
        ...

    async def run(self) -> None:
        """Monitor until cancelled."""
        ...

    def events(self) -> AsyncIterator[HealthEvent]:
        """Health changes from now on."""
        ...

    def snapshot(self) -> Mapping[GpuId, GpuHealth]:
        """Current health of every GPU."""
        ...

    def restore(self, unhealthy: Mapping[GpuId, GpuHealth]) -> None:
        """Make ``unhealthy`` the kept record of unhealthy GPUs; GPUs not in it lose theirs."""
        ...

    async def wait_alive(self) -> None:
        """Return when the host can send a heartbeat."""
        ...


# --------------------------------------------------------------------------------------------
# Configuration and classification

XID_FALLEN_OFF_BUS: Final = 79
"""XID 79: the GPU has fallen off the bus (NVIDIA Xid catalogue)."""

XID_DESCRIPTIONS: Final[Mapping[int, str]] = {
    48: "double-bit (uncorrectable) ECC error",
    63: "ECC page retirement / row remapping recorded",
    64: "ECC page retirement / row remapping failed",
    79: "GPU has fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
}
"""Short descriptions of the XIDs that change health, after NVIDIA's Xid catalogue and GPU
Memory Error Management documents (see the module docstring)."""

DEFAULT_FAILED_XIDS: Final = frozenset({48, 64, 79, 95})
DEFAULT_DEGRADED_XIDS: Final = frozenset({63, 94})


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """Polling, thresholds and fallback of the GPU health sources. Raises ``ValueError`` when a
    value is out of range or an XID is both failed and degraded."""

    poll_interval_s: float = 5.0
    """Seconds between polls of a healthy GPU."""
    event_wait_timeout_s: float = 1.0
    """Timeout of one ``nvmlEventSetWait`` in seconds: bounds how long shutdown waits."""
    error_backoff_max_s: float = 60.0
    """Longest wait in seconds between NVML attempts after repeated errors (polls of a GPU
    whose reads fail, and event waits)."""
    temperature_degraded_c: float = 85.0
    """GPU core temperature in °C at or above which the GPU is DEGRADED."""
    temperature_hysteresis_c: float = 5.0
    """°C below ``temperature_degraded_c`` the temperature must fall to clear DEGRADED."""
    ecc_uncorrected_degraded_count: int = 1
    """Volatile uncorrected ECC errors (since the last driver load) at which the GPU is DEGRADED."""
    nvlink_replay_recovery_errors: int = 1
    """Replay plus recovery errors on one NVLink within one poll that degrade the GPU."""
    nvlink_crc_errors_per_s: float = 100.0
    """CRC flit plus data errors per second on one NVLink that degrade the GPU."""
    nvlink_hold_s: float = 60.0
    """Seconds an NVLink finding keeps the GPU DEGRADED after the last offending poll."""
    failed_xids: frozenset[int] = DEFAULT_FAILED_XIDS
    """XIDs that make a GPU FAILED."""
    degraded_xids: frozenset[int] = DEFAULT_DEGRADED_XIDS
    """XIDs that make a GPU DEGRADED."""
    emulated_fallback: bool = False
    """``create_health_source`` returns an emulated source when NVML cannot be initialised."""
    emulated_gpus: int = 8
    """Number of GPUs of that emulated source."""

    def __post_init__(self) -> None:
        positive = {
            "poll_interval_s": self.poll_interval_s,
            "event_wait_timeout_s": self.event_wait_timeout_s,
            "error_backoff_max_s": self.error_backoff_max_s,
            "nvlink_crc_errors_per_s": self.nvlink_crc_errors_per_s,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"HealthConfig.{name} must be > 0, got {value}")
        if self.temperature_hysteresis_c < 0 or self.nvlink_hold_s < 0:
            raise ValueError("HealthConfig hysteresis and hold times must be >= 0")
        if self.ecc_uncorrected_degraded_count < 1 or self.nvlink_replay_recovery_errors < 1:
            raise ValueError("HealthConfig error-count thresholds must be >= 1")
        if self.emulated_gpus < 0:
            raise ValueError(f"HealthConfig.emulated_gpus must be >= 0, got {self.emulated_gpus}")
        both = self.failed_xids & self.degraded_xids
        if both:
            raise ValueError(f"XIDs {sorted(both)} are both in failed_xids and degraded_xids")


DEFAULT_CONFIG: Final = HealthConfig()


def classify_xid(xid: int, config: HealthConfig = DEFAULT_CONFIG) -> HealthState | None:
    """The state an XID puts a GPU in: FAILED, DEGRADED, or ``None`` when the XID does not change
    the GPU's health (application faults and XIDs outside both configured sets)."""
    if xid in config.failed_xids:
        return HealthState.FAILED
    if xid in config.degraded_xids:
        return HealthState.DEGRADED
    return None


def xid_reason(xid: int) -> str:
    """``"XID 79: GPU has fallen off the bus"``, or ``"XID n"`` for an XID without description."""
    description = XID_DESCRIPTIONS.get(xid)
    return f"XID {xid}: {description}" if description else f"XID {xid}"


# --------------------------------------------------------------------------------------------
# Kernel log lines

PciKey = tuple[int, int, int]
"""(domain, bus, device) of a PCI address, the form in which NVML and the kernel log agree."""

_BUS = r"(?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
_XID_LINE: Final = re.compile(r"NVRM: Xid \(" + _BUS + r"\): (?P<xid>\d+)")
_OFF_BUS_LINE: Final = re.compile(
    r"NVRM: GPU (?:at )?" + _BUS + r":? (?:GPU )?has fallen off the bus"
)


@dataclass(frozen=True, slots=True)
class KernelReport:
    """What one ``NVRM:`` kernel log line says about a GPU: an XID, or that it fell off the bus
    (``xid`` is then 79)."""

    pci: PciKey
    xid: int
    fallen_off_bus: bool


def pci_key(bus_id: str | bytes) -> PciKey | None:
    """Parse ``00000000:2B:00.0`` (NVML) or ``0000:2b:00`` (kernel log) into (domain, bus,
    device); ``None`` when it is not a PCI address."""
    text = bus_id.decode(errors="replace") if isinstance(bus_id, bytes) else bus_id
    m = re.fullmatch(r"\s*([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.[0-7])?\s*",
                     text.removeprefix("PCI:"))
    if m is None:
        return None
    return (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16))


def parse_kernel_message(line: str) -> KernelReport | None:
    """The GPU finding in one kernel log line, or ``None``. Recognises the NVIDIA driver's
    ``NVRM: Xid (PCI:0000:2b:00): 79, ...`` and ``NVRM: GPU 0000:2b:00.0: GPU has fallen off the
    bus.`` / ``NVRM: GPU at 0000:01:00.0 has fallen off the bus.`` forms."""
    m = _XID_LINE.search(line)
    if m is not None:
        key = pci_key(m.group("bus"))
        if key is not None:
            xid = int(m.group("xid"))
            return KernelReport(key, xid, fallen_off_bus=xid == XID_FALLEN_OFF_BUS)
    m = _OFF_BUS_LINE.search(line)
    if m is not None:
        key = pci_key(m.group("bus"))
        if key is not None:
            return KernelReport(key, XID_FALLEN_OFF_BUS, fallen_off_bus=True)
    return None


# --------------------------------------------------------------------------------------------
# State, transitions and fan-out shared by every source


class HealthSubscription(AsyncIterator[HealthEvent]):
    """Health events of one source from the moment of subscription, in order, none dropped.
    ``aclose`` ends the iteration; a subscription nobody references any more (its reader task
    was cancelled) is released by the source on its own."""

    def __init__(self, hub: HealthHub) -> None:
        self._hub = hub
        self._queue: asyncio.Queue[HealthEvent | None] = asyncio.Queue()
        self._closed = False

    def __aiter__(self) -> HealthSubscription:
        return self

    async def __anext__(self) -> HealthEvent:
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        event = await self._queue.get()
        if event is None:
            raise StopAsyncIteration
        return event

    def _offer(self, event: HealthEvent | None) -> None:
        self._queue.put_nowait(event)

    async def aclose(self) -> None:
        """Unsubscribe; a pending ``__anext__`` ends with ``StopAsyncIteration``."""
        if not self._closed:
            self._closed = True
            self._hub._unsubscribe(self)
            self._offer(None)


class HealthHub:
    """The health of every GPU of one host, its transitions and their delivery.

    Thread-safe: ``set`` may be called from any thread (NVML's event thread, the poll thread,
    the event loop); a transition is computed under a lock and handed to the event loop in that
    same order, so subscribers see transitions in the order they happened. Setting the state a
    GPU already has is not a transition and yields no event. While ``held`` (a hung emulated
    host) transitions are kept and delivered on release.
    """

    def __init__(self, host: str, *, wall_clock: WallClock = time.time) -> None:
        self._host = host
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._gpus: dict[GpuId, GpuHealth] = {}
        self._subscribers: weakref.WeakSet[HealthSubscription] = weakref.WeakSet()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._held = False
        self._pending: list[HealthEvent] = []

    @property
    def host(self) -> str:
        return self._host

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop subscribers live on (set by ``subscribe`` and by sources' ``run``)."""
        self._loop = loop

    def add_gpu(
        self,
        index: int,
        *,
        state: HealthState = HealthState.UNKNOWN,
        reason: str = "not yet observed",
        source: EventSource = EventSource.NVML_POLL,
        uuid: str | None = None,
    ) -> GpuId:
        """Register GPU ``index`` with an initial state (no event)."""
        gpu = GpuId(self._host, index)
        with self._lock:
            self._gpus[gpu] = GpuHealth(gpu, state, reason, None, self._wall_clock(), source, uuid)
        return gpu

    def set(
        self,
        gpu: GpuId,
        state: HealthState,
        reason: str,
        xid: int | None,
        source: EventSource,
    ) -> HealthEvent | None:
        """Record the state of ``gpu``; return (and deliver) the event when the state changed.
        The same state with another reason updates the snapshot only (no event). Raises
        ``KeyError`` for a GPU that was never added."""
        with self._lock:
            current = self._gpus[gpu]
            if current.state is state:
                if (current.reason, current.xid, current.source) != (reason, xid, source):
                    self._gpus[gpu] = GpuHealth(gpu, state, reason, xid, current.since_s,
                                                source, current.uuid)
                return None
            at_s = self._wall_clock()
            self._gpus[gpu] = GpuHealth(gpu, state, reason, xid, at_s, source, current.uuid)
            event = HealthEvent(gpu, state, reason, xid, at_s, source)
            if self._held:
                self._pending.append(event)
            else:
                self._deliver_locked(event)
            return event

    def set_uuid(self, gpu: GpuId, uuid: str) -> None:
        """Record the NVML UUID of ``gpu`` (learned at discovery)."""
        with self._lock:
            current = self._gpus[gpu]
            self._gpus[gpu] = GpuHealth(current.gpu, current.state, current.reason, current.xid,
                                        current.since_s, current.source, uuid)

    def get(self, gpu: GpuId) -> GpuHealth:
        """Current health of ``gpu``; ``KeyError`` when unknown."""
        with self._lock:
            return self._gpus[gpu]

    def snapshot(self) -> dict[GpuId, GpuHealth]:
        """Current health of every GPU, by GPU."""
        with self._lock:
            return dict(sorted(self._gpus.items()))

    def subscribe(self) -> HealthSubscription:
        """Events from now on. Call inside the running event loop."""
        loop = asyncio.get_running_loop()
        sub = HealthSubscription(self)
        with self._lock:
            self._loop = loop
            self._subscribers.add(sub)
        return sub

    @property
    def subscriber_count(self) -> int:
        """Live subscriptions."""
        with self._lock:
            return len(self._subscribers)

    def hold(self, held: bool) -> None:
        """Keep transitions back while ``held``; releasing delivers the kept ones in order."""
        with self._lock:
            self._held = held
            if not held:
                pending, self._pending = self._pending, []
                for event in pending:
                    self._deliver_locked(event)

    def _deliver_locked(self, event: HealthEvent) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        for sub in list(self._subscribers):
            loop.call_soon_threadsafe(sub._offer, event)

    def _unsubscribe(self, sub: HealthSubscription) -> None:
        with self._lock:
            self._subscribers.discard(sub)


# --------------------------------------------------------------------------------------------
# NVML


class NvmlUnavailableError(RuntimeError):
    """NVML could not be initialised on this host: the NVIDIA driver's ``libnvidia-ml.so.1`` is
    missing, the driver is not loaded, or another init failure. The message says what to
    install; ``HealthConfig.emulated_fallback`` selects the emulated source instead."""


class PciInfo(Protocol):
    """The part of ``pynvml.nvmlPciInfo_t`` used here."""

    @property
    def busId(self) -> bytes | str:  # noqa: N802 - pynvml's field name
        """``00000000:2B:00.0``."""
        ...


class EventData(Protocol):
    """The part of ``pynvml.c_nvmlEventData_t`` used here."""

    @property
    def device(self) -> object:
        """Handle of the GPU the event is about."""
        ...

    @property
    def eventType(self) -> int:  # noqa: N802 - pynvml's field name
        """One ``nvmlEventType*`` bit."""
        ...

    @property
    def eventData(self) -> int:  # noqa: N802 - pynvml's field name
        """The XID for ``nvmlEventTypeXidCriticalError``."""
        ...


class NvmlModule(Protocol):
    """The functions of ``pynvml`` (``nvidia-ml-py``) this module calls, typed. The real module
    or a fake with the same names is injected into ``NvmlHealthSource``; errors are raised as
    ``pynvml.NVMLError`` subclasses, constants are ``pynvml``'s."""

    def nvmlInit(self) -> None: ...  # noqa: N802
    def nvmlShutdown(self) -> None: ...  # noqa: N802
    def nvmlDeviceGetCount(self) -> int: ...  # noqa: N802
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> object: ...  # noqa: N802
    def nvmlDeviceGetUUID(self, handle: object, /) -> str: ...  # noqa: N802
    def nvmlDeviceGetPciInfo(self, handle: object, /) -> PciInfo: ...  # noqa: N802
    def nvmlDeviceGetSupportedEventTypes(self, handle: object, /) -> int: ...  # noqa: N802
    def nvmlEventSetCreate(self) -> object: ...  # noqa: N802
    def nvmlDeviceRegisterEvents(  # noqa: N802
        self, handle: object, event_types: int, event_set: object, /
    ) -> None: ...
    def nvmlEventSetWait(self, event_set: object, timeout_ms: int, /) -> EventData: ...  # noqa: N802
    def nvmlEventSetFree(self, event_set: object, /) -> None: ...  # noqa: N802
    def nvmlDeviceGetTemperature(self, handle: object, sensor: int, /) -> int: ...  # noqa: N802
    def nvmlDeviceGetTotalEccErrors(  # noqa: N802
        self, handle: object, error_type: int, counter_type: int, /
    ) -> int: ...
    def nvmlDeviceGetNvLinkState(self, handle: object, link: int, /) -> int: ...  # noqa: N802
    def nvmlDeviceGetNvLinkErrorCounter(  # noqa: N802
        self, handle: object, link: int, counter: int, /
    ) -> int: ...


# pynvml constants, typed once.
_ERR_GPU_IS_LOST: Final[int] = int(pynvml.NVML_ERROR_GPU_IS_LOST)
_ERR_NOT_SUPPORTED: Final[int] = int(pynvml.NVML_ERROR_NOT_SUPPORTED)
_ERR_INVALID_ARGUMENT: Final[int] = int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
_ERR_TIMEOUT: Final[int] = int(pynvml.NVML_ERROR_TIMEOUT)
_ERR_LIBRARY_NOT_FOUND: Final[int] = int(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
_ERR_DRIVER_NOT_LOADED: Final[int] = int(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
_ERR_NO_PERMISSION: Final[int] = int(pynvml.NVML_ERROR_NO_PERMISSION)
_ERR_FUNCTION_NOT_FOUND: Final[int] = int(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
_EVENT_XID: Final[int] = int(pynvml.nvmlEventTypeXidCriticalError)
_EVENT_DBE: Final[int] = int(pynvml.nvmlEventTypeDoubleBitEccError)
_EVENTS_WANTED: Final[int] = _EVENT_XID | _EVENT_DBE
_TEMPERATURE_GPU: Final[int] = int(pynvml.NVML_TEMPERATURE_GPU)
_ECC_UNCORRECTED: Final[int] = int(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
_ECC_VOLATILE: Final[int] = int(pynvml.NVML_VOLATILE_ECC)
_NVLINK_MAX_LINKS: Final[int] = int(pynvml.NVML_NVLINK_MAX_LINKS)
_NVLINK_REPLAY: Final[int] = int(pynvml.NVML_NVLINK_ERROR_DL_REPLAY)
_NVLINK_RECOVERY: Final[int] = int(pynvml.NVML_NVLINK_ERROR_DL_RECOVERY)
_NVLINK_CRC_FLIT: Final[int] = int(pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)
_NVLINK_CRC_DATA: Final[int] = int(pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)
_NVLINK_COUNTERS: Final = (_NVLINK_REPLAY, _NVLINK_RECOVERY, _NVLINK_CRC_FLIT, _NVLINK_CRC_DATA)
_NVML_ERROR: Final[type[Exception]] = pynvml.NVMLError

_NVML_HELP: Final = (
    "NVML is the NVIDIA Management Library, libnvidia-ml.so.1, installed with the NVIDIA "
    "driver; install the NVIDIA datacenter driver (and load its kernel module) on GPU hosts. "
    "The Python binding is nvidia-ml-py (import name pynvml). On a machine without GPUs set "
    "the agent's health config emulated_fallback: true to use the emulated GPU health source."
)


def _nvml_code(err: BaseException) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


def _describe(err: BaseException) -> str:
    try:
        text = str(err)
    except Exception:  # NVMLError.__str__ may call into a library that is gone
        text = ""
    code = _nvml_code(err)
    return f"{text or type(err).__name__} (NVML code {code})" if code is not None else text


def _handle_key(handle: object) -> object:
    """A hashable key for an NVML device handle: real handles are ctypes pointers, and two
    pointer objects to the same device compare unequal, so the address is the key."""
    if isinstance(handle, ctypes._Pointer):
        return ("ptr", ctypes.cast(handle, ctypes.c_void_p).value)
    return handle


class _GpuLost(Exception):
    pass


class _Unsupported(Exception):
    pass


class _NvmlFault(Exception):
    pass


@dataclass(frozen=True, slots=True)
class _Finding:
    state: HealthState
    reason: str
    xid: int | None
    source: EventSource


@dataclass(slots=True)
class _Link:
    """One active NVLink: the last counter values (poller-owned)."""

    counters: dict[int, int | None] = field(
        default_factory=lambda: dict.fromkeys(_NVLINK_COUNTERS)
    )
    unsupported: set[int] = field(default_factory=set)
    active: bool = True


@dataclass(slots=True)
class _Gpu:
    """Per-GPU monitor state. ``lost``, ``latched`` and ``findings`` are guarded by the source's
    lock; the rest belongs to the (single) poller."""

    gpu: GpuId
    handle: object | None
    uuid: str | None
    pci: PciKey | None
    log: structlog.typing.FilteringBoundLogger
    lost: bool = False
    latched: _Finding | None = None
    findings: dict[str, _Finding] = field(default_factory=dict)
    errors_in_row: int = 0
    next_poll_s: float = 0.0
    temperature_supported: bool = True
    ecc_supported: bool = True
    hot: bool = False
    links: dict[int, _Link] = field(default_factory=dict)
    nvlink_bad_until_s: float = 0.0
    nvlink_reason: str = ""
    last_poll_s: float | None = None


def _worst(findings: Iterable[_Finding]) -> _Finding | None:
    worst: _Finding | None = None
    for f in findings:
        if worst is None or f.state.severity > worst.state.severity:
            worst = f
    return worst


class NvmlHealthSource:
    """GPU health of this host read through NVML (see the module docstring for the signals,
    the XID classification and its sources).

    Lifecycle: ``open`` initialises NVML, discovers the GPUs (index, UUID, PCI bus id, active
    NVLinks) and starts the event thread; ``run`` opens if needed and polls every
    ``config.poll_interval_s`` until cancelled, then closes; ``close`` stops the event thread
    (bounded by ``config.event_wait_timeout_s``) and shuts NVML down. ``open`` raises
    ``NvmlUnavailableError`` when NVML cannot be initialised.

    Injection for tests: ``nvml`` (a fake exposing the ``NvmlModule`` functions and raising
    ``pynvml.NVMLError`` subclasses), ``wall_clock`` (event stamps), ``monotonic`` (poll and
    backoff schedule), ``sleep`` (between polls) and ``backoff_wait`` (the event thread's wait
    after an NVML error; returns True to stop).
    """

    def __init__(
        self,
        host: str,
        config: HealthConfig = DEFAULT_CONFIG,
        *,
        nvml: NvmlModule | None = None,
        wall_clock: WallClock = time.time,
        monotonic: Monotonic = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        backoff_wait: Callable[[float], bool] | None = None,
    ) -> None:
        self._host = host
        self._config = config
        self._nvml: NvmlModule = nvml if nvml is not None else cast(NvmlModule, pynvml)
        self._monotonic = monotonic
        self._sleep = sleep
        self._hub = HealthHub(host, wall_clock=wall_clock)
        self._lock = threading.RLock()
        self._gpus: list[_Gpu] = []
        self._by_handle: dict[object, _Gpu] = {}
        self._by_pci: dict[PciKey, _Gpu] = {}
        self._stop = threading.Event()
        self._backoff_wait = backoff_wait if backoff_wait is not None else self._stop.wait
        self._thread: threading.Thread | None = None
        self._opened = False
        self._closed = False
        self._restored: dict[GpuId, GpuHealth] | None = None
        self._thread_error: BaseException | None = None
        self._log = _log.bind(host=host)
        self.event_wait_errors = 0
        """NVML errors seen by the event thread (other than timeouts)."""

    # ---- HealthSource

    @property
    def host(self) -> str:
        return self._host

    @property
    def config(self) -> HealthConfig:
        return self._config

    def events(self) -> HealthSubscription:
        """Health changes from now on (call inside the running event loop)."""
        return self._hub.subscribe()

    def snapshot(self) -> dict[GpuId, GpuHealth]:
        """Current health of every discovered GPU, by GPU."""
        return self._hub.snapshot()

    async def wait_alive(self) -> None:
        """A real host is alive while this agent runs (a hung host hangs the agent itself)."""
        return None

    def restore(self, unhealthy: Mapping[GpuId, GpuHealth]) -> None:
        """Make ``unhealthy`` the kept (latched) findings: each listed GPU keeps its state until
        the next ``restore`` without it; every other GPU loses its latched finding (a lost GPU
        is then polled again and, if still lost, fails again at once). An entry whose UUID
        differs from the device's is about a replaced GPU and is dropped. Before ``open`` the
        record is kept and applied at discovery."""
        with self._lock:
            if not self._opened:
                self._restored = dict(unhealthy)
                return
            self._apply_restore_locked(unhealthy)

    async def run(self) -> None:
        """Open if needed, then poll every ``config.poll_interval_s`` until cancelled; close on
        the way out. Raises ``NvmlUnavailableError`` when NVML cannot be initialised and
        ``RuntimeError`` when the event thread died of an unexpected exception."""
        if not self._opened:
            await self.open()
        try:
            while True:
                await asyncio.to_thread(self.poll_once)
                if self._thread_error is not None:
                    raise RuntimeError(
                        f"NVML event thread of host {self._host} died"
                    ) from self._thread_error
                await self._sleep(self._config.poll_interval_s)
        finally:
            await self.close()

    async def __aenter__(self) -> NvmlHealthSource:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- lifecycle

    async def open(self) -> None:
        """Initialise NVML, discover the GPUs and start the event thread. Raises
        ``NvmlUnavailableError`` (naming the library and what to install) when NVML cannot be
        initialised; per-GPU discovery errors make that GPU FAILED (lost) or UNKNOWN instead."""
        if self._opened:
            return
        self._hub.attach_loop(asyncio.get_running_loop())
        await asyncio.to_thread(self._open_blocking)
        thread = threading.Thread(
            target=self._events_main, name=f"nvml-events-{self._host}", daemon=True
        )
        self._thread = thread
        thread.start()

    async def close(self) -> None:
        """Stop the event thread (waits at most ``event_wait_timeout_s`` plus one second) and
        shut NVML down. If the thread does not stop in time NVML is left initialised: freeing
        an event set a thread is still waiting on is unsafe, and the process is exiting."""
        if self._closed or not self._opened:
            self._closed = True
            return
        self._closed = True
        self._stop.set()
        thread = self._thread
        if thread is not None:
            await asyncio.to_thread(thread.join, self._config.event_wait_timeout_s + 1.0)
            if thread.is_alive():
                self._log.error("nvml_event_thread_did_not_stop",
                                timeout_s=self._config.event_wait_timeout_s + 1.0)
                return
        try:
            await asyncio.to_thread(self._nvml.nvmlShutdown)
        except _NVML_ERROR as e:
            self._log.warning("nvml_shutdown_failed", error=_describe(e))

    def _open_blocking(self) -> None:
        try:
            self._nvml.nvmlInit()
        except _NVML_ERROR as e:
            code = _nvml_code(e)
            if code == _ERR_LIBRARY_NOT_FOUND:
                what = "the NVML library libnvidia-ml.so.1 was not found"
            elif code == _ERR_DRIVER_NOT_LOADED:
                what = "the NVIDIA kernel driver is not loaded"
            elif code == _ERR_NO_PERMISSION:
                what = "no permission to open the NVIDIA devices"
            elif code == _ERR_FUNCTION_NOT_FOUND:
                what = "libnvidia-ml.so.1 is too old for nvidia-ml-py"
            else:
                what = "nvmlInit failed"
            raise NvmlUnavailableError(
                f"NVML unavailable on host {self._host}: {what} ({_describe(e)}). {_NVML_HELP}"
            ) from e
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
        except _NVML_ERROR as e:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            raise NvmlUnavailableError(
                f"NVML on host {self._host} cannot count GPUs ({_describe(e)}). {_NVML_HELP}"
            ) from e
        with self._lock:
            for index in range(count):
                self._discover(index)
            self._opened = True
            if self._restored is not None:
                self._apply_restore_locked(self._restored)
                self._restored = None
        self._log.info("nvml_gpus_discovered", gpus=count,
                       lost=[g.gpu.index for g in self._gpus if g.lost])

    def _discover(self, index: int) -> None:
        gpu = self._hub.add_gpu(index, reason="not yet polled")
        log = self._log.bind(gpu=index)
        g = _Gpu(gpu=gpu, handle=None, uuid=None, pci=None, log=log)
        g.findings["poll"] = _Finding(HealthState.UNKNOWN, "not yet polled", None,
                                      EventSource.NVML_POLL)
        self._gpus.append(g)
        try:
            g.handle = self._call(self._nvml.nvmlDeviceGetHandleByIndex, index)
            self._by_handle[_handle_key(g.handle)] = g
            g.uuid = str(self._call(self._nvml.nvmlDeviceGetUUID, g.handle))
            self._hub.set_uuid(gpu, g.uuid)
            g.pci = pci_key(self._call(self._nvml.nvmlDeviceGetPciInfo, g.handle).busId)
            if g.pci is not None:
                self._by_pci[g.pci] = g
            g.log = log.bind(uuid=g.uuid)
            self._discover_links(g)
        except _GpuLost:
            self._mark_lost_locked(g, "NVML: GPU is lost (at discovery)", None,
                                   EventSource.NVML_POLL)
        except (_NvmlFault, _Unsupported) as e:
            g.findings.pop("poll", None)
            g.findings["nvml"] = _Finding(HealthState.UNKNOWN, f"NVML discovery failed: {e}",
                                          None, EventSource.NVML_POLL)
            g.log.warning("nvml_discovery_failed", error=str(e))
        self._refresh_locked(g)

    def _discover_links(self, g: _Gpu) -> None:
        for link in range(_NVLINK_MAX_LINKS):
            try:
                active = self._call(self._nvml.nvmlDeviceGetNvLinkState, g.handle, link)
            except _Unsupported:
                continue
            if active:
                g.links[link] = _Link()
        if g.links:
            g.log.info("nvlinks_discovered", links=sorted(g.links))

    # ---- polling

    def poll_once(self) -> None:
        """Poll every GPU that is due: not lost, and past its backoff. Blocking (NVML calls);
        ``run`` calls it in a worker thread. Never polls a lost GPU."""
        now_s = self._monotonic()
        with self._lock:
            due = [g for g in self._gpus if not g.lost and g.handle is not None
                   and now_s >= g.next_poll_s]
        for g in due:
            self._poll_gpu(g, now_s)

    def _poll_gpu(self, g: _Gpu, now_s: float) -> None:
        findings: dict[str, _Finding] = {}
        try:
            self._poll_temperature(g, findings)
            self._poll_ecc(g, findings)
            self._poll_nvlinks(g, now_s, findings)
        except _GpuLost:
            with self._lock:
                self._mark_lost_locked(g, "NVML: GPU is lost", None, EventSource.NVML_POLL)
                self._refresh_locked(g)
            return
        except _NvmlFault as e:
            g.errors_in_row += 1
            delay_s = self._backoff_s(g.errors_in_row, self._config.poll_interval_s)
            g.next_poll_s = now_s + delay_s
            g.log.warning("nvml_poll_failed", error=str(e), errors_in_row=g.errors_in_row,
                          next_poll_in_s=delay_s)
            with self._lock:
                g.findings.pop("poll", None)
                g.findings["nvml"] = _Finding(HealthState.UNKNOWN, f"NVML error: {e}", None,
                                              EventSource.NVML_POLL)
                self._refresh_locked(g)
            return
        g.errors_in_row = 0
        g.next_poll_s = now_s
        g.last_poll_s = now_s
        with self._lock:
            if g.lost:
                return
            g.findings = findings
            self._refresh_locked(g)

    def _poll_temperature(self, g: _Gpu, findings: dict[str, _Finding]) -> None:
        if not g.temperature_supported:
            return
        try:
            temp_c = float(self._call(self._nvml.nvmlDeviceGetTemperature, g.handle,
                                      _TEMPERATURE_GPU))
        except _Unsupported:
            g.temperature_supported = False
            return
        cfg = self._config
        if temp_c >= cfg.temperature_degraded_c:
            g.hot = True
        elif temp_c < cfg.temperature_degraded_c - cfg.temperature_hysteresis_c:
            g.hot = False
        if g.hot:
            findings["temperature"] = _Finding(
                HealthState.DEGRADED,
                f"temperature {temp_c:.0f} °C (threshold {cfg.temperature_degraded_c:.0f} °C)",
                None, EventSource.NVML_POLL)

    def _poll_ecc(self, g: _Gpu, findings: dict[str, _Finding]) -> None:
        if not g.ecc_supported:
            return
        try:
            count = int(self._call(self._nvml.nvmlDeviceGetTotalEccErrors, g.handle,
                                   _ECC_UNCORRECTED, _ECC_VOLATILE))
        except _Unsupported:  # ECC disabled or not on this board
            g.ecc_supported = False
            return
        if count >= self._config.ecc_uncorrected_degraded_count:
            findings["ecc"] = _Finding(
                HealthState.DEGRADED, f"{count} uncorrected ECC errors since driver load",
                None, EventSource.NVML_POLL)

    def _poll_nvlinks(self, g: _Gpu, now_s: float, findings: dict[str, _Finding]) -> None:
        if not g.links:
            return
        cfg = self._config
        dt_s = now_s - g.last_poll_s if g.last_poll_s is not None else None
        bad: list[str] = []
        for link_id, link in sorted(g.links.items()):
            try:
                active = self._call(self._nvml.nvmlDeviceGetNvLinkState, g.handle, link_id)
            except _Unsupported:
                active = link.active
            if link.active and not active:
                bad.append(f"NVLink {link_id} down")
            link.active = bool(active)
            deltas: dict[int, int] = {}
            for counter in _NVLINK_COUNTERS:
                if counter in link.unsupported:
                    continue
                try:
                    value = int(self._call(self._nvml.nvmlDeviceGetNvLinkErrorCounter,
                                           g.handle, link_id, counter))
                except _Unsupported:
                    link.unsupported.add(counter)
                    continue
                last = link.counters[counter]
                link.counters[counter] = value
                if last is not None and value >= last:
                    deltas[counter] = value - last
            replay = deltas.get(_NVLINK_REPLAY, 0) + deltas.get(_NVLINK_RECOVERY, 0)
            crc = deltas.get(_NVLINK_CRC_FLIT, 0) + deltas.get(_NVLINK_CRC_DATA, 0)
            if replay >= cfg.nvlink_replay_recovery_errors:
                bad.append(f"NVLink {link_id}: {replay} replay/recovery errors")
            if dt_s is not None and dt_s > 0 and crc / dt_s >= cfg.nvlink_crc_errors_per_s:
                bad.append(f"NVLink {link_id}: {crc / dt_s:.0f} CRC errors/s")
        if bad:
            g.nvlink_bad_until_s = now_s + cfg.nvlink_hold_s
            g.nvlink_reason = "; ".join(bad)
        if now_s < g.nvlink_bad_until_s or bad:
            findings["nvlink"] = _Finding(HealthState.DEGRADED, g.nvlink_reason, None,
                                          EventSource.NVML_POLL)

    def _backoff_s(self, errors_in_row: int, base_s: float) -> float:
        exponent = min(errors_in_row - 1, 30)
        return float(min(base_s * (2**exponent), self._config.error_backoff_max_s))

    # ---- NVML calls and findings

    def _call(self, fn: Callable[..., T], *args: object) -> T:
        """Call one NVML function; map its errors: GPU is lost -> ``_GpuLost``; not supported
        or invalid argument (no such link) -> ``_Unsupported``; anything else -> ``_NvmlFault``."""
        try:
            return fn(*args)
        except _NVML_ERROR as e:
            code = _nvml_code(e)
            if code == _ERR_GPU_IS_LOST:
                raise _GpuLost(_describe(e)) from e
            if code in (_ERR_NOT_SUPPORTED, _ERR_INVALID_ARGUMENT):
                raise _Unsupported(_describe(e)) from e
            raise _NvmlFault(_describe(e)) from e

    def _mark_lost_locked(self, g: _Gpu, reason: str, xid: int | None,
                          source: EventSource) -> None:
        if not g.lost:
            g.lost = True
            g.log.error("gpu_lost", reason=reason, xid=xid, source=source.value)
        else:
            g.log.info("gpu_lost_again", reason=reason, xid=xid, source=source.value)
        self._latch_locked(g, _Finding(HealthState.FAILED, reason, xid, source))

    def _latch_locked(self, g: _Gpu, finding: _Finding) -> None:
        if g.latched is None or finding.state.severity > g.latched.state.severity:
            g.latched = finding

    def _refresh_locked(self, g: _Gpu) -> None:
        candidates = list(g.findings.values())
        if g.latched is not None:
            candidates.append(g.latched)
        worst = _worst(candidates)
        if worst is None:
            worst = _Finding(HealthState.HEALTHY, "no fault found", None, EventSource.NVML_POLL)
        event = self._hub.set(g.gpu, worst.state, worst.reason, worst.xid, worst.source)
        if event is not None:
            g.log.info("gpu_health_changed", state=event.state.value, reason=event.reason,
                       xid=event.xid, source=event.source.value)

    def _apply_restore_locked(self, unhealthy: Mapping[GpuId, GpuHealth]) -> None:
        present = {g.gpu for g in self._gpus}
        for gpu in unhealthy:
            if gpu not in present:
                self._log.warning("restored_gpu_not_present", gpu=gpu.index)
        for g in self._gpus:
            entry: GpuHealth | None = unhealthy.get(g.gpu)
            if entry is not None and entry.uuid and g.uuid and entry.uuid != g.uuid:
                g.log.info("restored_record_for_replaced_gpu", recorded_uuid=entry.uuid)
                entry = None
            if entry is None or not entry.state.unhealthy:
                g.latched = None
                if g.lost:  # poll it again: if it is still lost it fails again at once
                    g.lost = False
                    g.next_poll_s = 0.0
            else:
                g.latched = _Finding(entry.state, entry.reason, entry.xid, EventSource.RESTORED)
            self._refresh_locked(g)

    # ---- XIDs from events and the kernel log

    def ingest_kernel_message(self, line: str) -> KernelReport | None:
        """Apply one kernel log line (see ``parse_kernel_message``) to the GPU at its PCI
        address; returns what it said, or ``None`` when the line is not about a known GPU."""
        report = parse_kernel_message(line)
        if report is None:
            return None
        with self._lock:
            g = self._by_pci.get(report.pci)
            if g is None:
                self._log.warning("kernel_message_for_unknown_gpu", pci=report.pci, xid=report.xid)
                return None
            self._apply_xid_locked(g, report.xid, EventSource.KERNEL_LOG)
        return report

    def _apply_xid_locked(self, g: _Gpu, xid: int, source: EventSource) -> None:
        state = classify_xid(xid, self._config)
        if state is None:
            g.log.info("xid_without_health_impact", xid=xid, source=source.value)
            return
        if xid == XID_FALLEN_OFF_BUS:
            self._mark_lost_locked(g, xid_reason(xid), xid, source)
        else:
            self._latch_locked(g, _Finding(state, xid_reason(xid), xid, source))
        self._refresh_locked(g)

    def _on_event(self, data: EventData) -> None:
        event_type = int(data.eventType)
        with self._lock:
            g = self._by_handle.get(_handle_key(data.device))
            if g is None:
                self._log.warning("nvml_event_for_unknown_device", event_type=event_type)
                return
            if event_type & _EVENT_XID:
                self._apply_xid_locked(g, int(data.eventData), EventSource.NVML_EVENT)
            elif event_type & _EVENT_DBE:
                self._latch_locked(g, _Finding(HealthState.FAILED, "double-bit ECC error event",
                                               None, EventSource.NVML_EVENT))
                self._refresh_locked(g)

    # ---- event thread

    def _create_event_set(self) -> tuple[object | None, int]:
        """A new event set with every GPU that is not lost registered; (set, registered)."""
        try:
            event_set = self._nvml.nvmlEventSetCreate()
        except _NVML_ERROR as e:
            self._log.warning("nvml_event_set_create_failed", error=_describe(e))
            return None, 0
        registered = 0
        with self._lock:
            gpus = [g for g in self._gpus if not g.lost and g.handle is not None]
        for g in gpus:
            try:
                supported = int(self._call(self._nvml.nvmlDeviceGetSupportedEventTypes, g.handle))
                mask = supported & _EVENTS_WANTED
                if mask:
                    self._call(self._nvml.nvmlDeviceRegisterEvents, g.handle, mask, event_set)
                    registered += 1
            except _GpuLost:
                with self._lock:
                    self._mark_lost_locked(g, "NVML: GPU is lost", None, EventSource.NVML_EVENT)
                    self._refresh_locked(g)
            except (_Unsupported, _NvmlFault) as e:
                g.log.warning("nvml_event_registration_failed", error=str(e))
        return event_set, registered

    def _free_event_set(self, event_set: object | None) -> None:
        if event_set is None:
            return
        try:
            self._nvml.nvmlEventSetFree(event_set)
        except _NVML_ERROR as e:
            self._log.warning("nvml_event_set_free_failed", error=_describe(e))

    def _events_main(self) -> None:
        """Wait for NVML events until stopped. A wait times out every ``event_wait_timeout_s``
        so the stop flag is seen; after an error the thread backs off exponentially (up to
        ``error_backoff_max_s``) so a GPU that answers "lost" at once cannot spin it, and a
        "GPU is lost" rebuilds the set without the lost GPU."""
        timeout_ms = max(1, round(self._config.event_wait_timeout_s * 1000))
        event_set: object | None = None
        rebuild = True
        failures = 0
        try:
            while not self._stop.is_set():
                if rebuild:
                    self._free_event_set(event_set)
                    event_set, registered = self._create_event_set()
                    rebuild = False
                    if event_set is None:
                        failures += 1
                        rebuild = True
                        if self._backoff_wait(self._backoff_s(failures, 1.0)):
                            break
                        continue
                    if registered == 0:
                        self._log.info("nvml_no_gpu_registered_for_events")
                        break
                try:
                    data = self._nvml.nvmlEventSetWait(event_set, timeout_ms)
                except _NVML_ERROR as e:
                    code = _nvml_code(e)
                    if code == _ERR_TIMEOUT:
                        failures = 0
                        continue
                    failures += 1
                    self.event_wait_errors += 1
                    rebuild = code == _ERR_GPU_IS_LOST
                    delay_s = self._backoff_s(failures, self._config.event_wait_timeout_s)
                    self._log.warning("nvml_event_wait_failed", error=_describe(e),
                                      failures_in_row=failures, retry_in_s=delay_s)
                    if self._backoff_wait(delay_s):
                        break
                    continue
                failures = 0
                self._on_event(data)
        except Exception as e:  # surfaced by run(): an unexpected exit is an error
            self._thread_error = e
            self._log.exception("nvml_event_thread_crashed")
        finally:
            self._free_event_set(event_set)


async def create_health_source(
    host: str,
    config: HealthConfig = DEFAULT_CONFIG,
    *,
    nvml: NvmlModule | None = None,
) -> HealthSource:
    """An opened ``NvmlHealthSource`` for ``host``; when NVML cannot be initialised, an
    ``lightrail.emulator.gpus.EmulatedHealthSource`` with ``config.emulated_gpus`` GPUs if
    ``config.emulated_fallback``, else ``NvmlUnavailableError`` naming what to install."""
    source = NvmlHealthSource(host, config, nvml=nvml)
    try:
        await source.open()
    except NvmlUnavailableError as e:
        if not config.emulated_fallback:
            raise
        from lightrail.emulator.gpus import EmulatedHealthSource

        _log.warning("nvml_unavailable_using_emulated_gpus", host=host, error=str(e),
                     gpus=config.emulated_gpus)
        return EmulatedHealthSource(host, config.emulated_gpus, config=config)
    return source
