"""The part of the NVML binding (``nvidia-ml-py``, import name ``pynvml``) the NVML health
source uses, typed once: protocols of the module and its records (so a fake can be injected),
its error codes, event types and counter constants, the error raised when NVML cannot be
initialised, and how an ``NVMLError`` is read and mapped (``call``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Final, Protocol, TypeVar, cast

try:
    import pynvml
except ImportError as _e:  # pragma: no cover - a declared dependency of the project
    raise ImportError(
        "lightrail.agents.host needs the NVML Python binding for --health nvml: pip install "
        "nvidia-ml-py (import name pynvml; not the deprecated 'pynvml' package)"
    ) from _e


class NvmlUnavailableError(RuntimeError):
    """NVML could not be initialised on this host: the NVIDIA driver's ``libnvidia-ml.so.1`` is
    missing, the driver is not loaded, or another init failure. The message says what to
    install, and that a machine without GPUs runs the agent with ``--health emulated``."""


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


# pynvml constants, typed.
ERR_GPU_IS_LOST: Final[int] = int(pynvml.NVML_ERROR_GPU_IS_LOST)
ERR_NOT_SUPPORTED: Final[int] = int(pynvml.NVML_ERROR_NOT_SUPPORTED)
ERR_INVALID_ARGUMENT: Final[int] = int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
ERR_TIMEOUT: Final[int] = int(pynvml.NVML_ERROR_TIMEOUT)
ERR_LIBRARY_NOT_FOUND: Final[int] = int(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
ERR_DRIVER_NOT_LOADED: Final[int] = int(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
ERR_NO_PERMISSION: Final[int] = int(pynvml.NVML_ERROR_NO_PERMISSION)
ERR_FUNCTION_NOT_FOUND: Final[int] = int(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
EVENT_XID: Final[int] = int(pynvml.nvmlEventTypeXidCriticalError)
EVENT_DBE: Final[int] = int(pynvml.nvmlEventTypeDoubleBitEccError)
EVENTS_WANTED: Final[int] = EVENT_XID | EVENT_DBE
TEMPERATURE_GPU: Final[int] = int(pynvml.NVML_TEMPERATURE_GPU)
ECC_UNCORRECTED: Final[int] = int(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
ECC_VOLATILE: Final[int] = int(pynvml.NVML_VOLATILE_ECC)
NVLINK_MAX_LINKS: Final[int] = int(pynvml.NVML_NVLINK_MAX_LINKS)
NVLINK_REPLAY: Final[int] = int(pynvml.NVML_NVLINK_ERROR_DL_REPLAY)
NVLINK_RECOVERY: Final[int] = int(pynvml.NVML_NVLINK_ERROR_DL_RECOVERY)
NVLINK_CRC_FLIT: Final[int] = int(pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)
NVLINK_CRC_DATA: Final[int] = int(pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)
NVLINK_COUNTERS: Final = (NVLINK_REPLAY, NVLINK_RECOVERY, NVLINK_CRC_FLIT, NVLINK_CRC_DATA)
NVML_ERROR: Final[type[Exception]] = pynvml.NVMLError

NVML_HELP: Final = (
    "NVML is the NVIDIA Management Library, libnvidia-ml.so.1, installed with the NVIDIA "
    "driver; install the NVIDIA datacenter driver (and load its kernel module) on GPU hosts. "
    "The Python binding is nvidia-ml-py (import name pynvml). On a machine without GPUs (tests, "
    "demos) run the agent with --health emulated to use emulated GPUs."
)


def nvml_code(err: BaseException) -> int | None:
    """The ``NVML_ERROR_*`` code of an ``NVMLError``, if it has one."""
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


def describe(err: BaseException) -> str:
    """An ``NVMLError`` for people: its text and its NVML code."""
    try:
        text = str(err)
    except Exception:  # NVMLError.__str__ may call into a library that is gone
        text = ""
    code = nvml_code(err)
    return f"{text or type(err).__name__} (NVML code {code})" if code is not None else text


def handle_key(handle: object) -> object:
    """A hashable key for an NVML device handle: real handles are ctypes pointers, and two
    pointer objects to the same device compare unequal, so the address is the key."""
    if isinstance(handle, ctypes._Pointer):
        return ("ptr", ctypes.cast(handle, ctypes.c_void_p).value)
    return handle


T = TypeVar("T")


class GpuLost(Exception):
    """NVML says the GPU is lost (``NVML_ERROR_GPU_IS_LOST``): fatal for that GPU."""


class Unsupported(Exception):
    """The GPU does not support the call (not supported, or an invalid argument such as a link
    the GPU does not have)."""


class NvmlFault(Exception):
    """Any other NVML error: the GPU's state is not known."""


def call(fn: Callable[..., T], *args: object) -> T:
    """Call one NVML function and map its errors: GPU is lost -> ``GpuLost``; not supported or
    invalid argument (no such link) -> ``Unsupported``; anything else -> ``NvmlFault``; each
    with the text of ``describe``."""
    try:
        return fn(*args)
    except NVML_ERROR as e:
        code = nvml_code(e)
        if code == ERR_GPU_IS_LOST:
            raise GpuLost(describe(e)) from e
        if code in (ERR_NOT_SUPPORTED, ERR_INVALID_ARGUMENT):
            raise Unsupported(describe(e)) from e
        raise NvmlFault(describe(e)) from e


def installed_module() -> NvmlModule:
    """The installed ``pynvml`` module, typed as ``NvmlModule``."""
    return cast(NvmlModule, pynvml)
