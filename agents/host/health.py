"""GPU health on one host: the model every health source shares (DESIGN.md "Failover"; issue 5
§1): ``GpuId``, ``HealthState``, ``HealthEvent``, ``GpuHealth``, the ``HealthSource`` protocol,
``HealthConfig`` and the XID classification.

A *health source* watches the GPUs of one host and reports, per GPU, a ``HealthState``. Its
``events()`` yield a ``HealthEvent`` on every change of a GPU's state (never twice for the same
state, so a GPU reported lost by two signals gives one failure event); ``snapshot()`` gives the
current state of every GPU. Two implementations share the ``HealthSource`` protocol:
``lightrail.agents.host.nvml.NvmlHealthSource`` (real GPUs through NVML, Python binding
``nvidia-ml-py``, import name ``pynvml``) and ``lightrail.emulator.gpus.EmulatedHealthSource``
(scriptable failures for tests and the demo). The composition root picks one (``lightrail agent
--health nvml|emulated``); the host agent never imports the emulator. Both build on
``lightrail.agents.host.hub.HealthHub`` (state, transitions and their delivery);
``lightrail.agents.host.kernel`` reads the kernel log's ``NVRM:`` lines.

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

import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

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
    """Polling and thresholds of the GPU health sources. Raises ``ValueError`` when a
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
