"""Kernel log lines about GPUs: the NVIDIA driver's ``NVRM: Xid (...)`` and "GPU has fallen off
the bus" lines, parsed into ``KernelReport``s for a health source (a journald/kmsg reader feeds
``lightrail.agents.host.nvml.NvmlHealthSource.ingest_kernel_message``). PCI addresses are
normalised (``pci_key``) to the form in which NVML and the kernel log agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from lightrail.agents.host.health import XID_FALLEN_OFF_BUS

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
