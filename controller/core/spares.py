"""Spare selection for failover (LUMION, Morphlux): which free GPU takes over a failed one.
Pure: no I/O.

Rule: the spare must be healthy, free (no job uses it), in the failed GPU's failure domain and
wired to the same switch as the failed GPU's NIC, so the failed endpoint's circuits can be moved
to the spare's ports on that switch without touching any other switch or job. Among candidates,
GPUs of hosts marked ``spare`` come first (they exist for this), then hosts with the fewest GPUs
in use (spreading later failures), then by name (deterministic).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from lightrail.controller.domain.fabric import Fabric


class NoSpare(Exception):
    """No GPU satisfies the rule; ``reason`` says which condition left none."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SpareChoice:
    """The GPU that takes over."""

    host: str
    gpu: int


def pick_spare(
    fabric: Fabric,
    failed_host: str,
    failed_gpu: int,
    in_use: Mapping[tuple[str, int], str],
    unhealthy: Collection[tuple[str, int]],
) -> SpareChoice:
    """The spare for ``failed_gpu`` of ``failed_host`` by the module's rule. Raises
    ``NoSpare`` (a clear, alertable state, not a crash) and ``KeyError`` for a GPU the fabric
    does not wire."""
    failed_ep = fabric.endpoint_of_gpu(failed_host, failed_gpu)
    domain = fabric.hosts[failed_host].failure_domain
    used_per_host: dict[str, int] = {}
    for (h, _), _job in in_use.items():
        used_per_host[h] = used_per_host.get(h, 0) + 1
    best: tuple[bool, int, str, int] | None = None
    seen_domain = seen_switch = seen_free = False
    for host in fabric.hosts.values():
        if host.name == failed_host or host.failure_domain != domain:
            continue
        seen_domain = True
        for gpu in range(host.gpu_count):
            if not fabric.has_gpu(host.name, gpu):
                continue
            if fabric.endpoint_of_gpu(host.name, gpu).switch_id != failed_ep.switch_id:
                continue
            seen_switch = True
            if (host.name, gpu) in in_use or (host.name, gpu) in unhealthy:
                continue
            seen_free = True
            key = (not host.spare, used_per_host.get(host.name, 0), host.name, gpu)
            if best is None or key < best:
                best = key
    if best is None:
        if not seen_domain:
            reason = f"no other host in failure domain {domain!r}"
        elif not seen_switch:
            reason = (f"no GPU in failure domain {domain!r} is wired to switch "
                      f"{failed_ep.switch_id!r}")
        else:
            reason = (f"every GPU in failure domain {domain!r} wired to switch "
                      f"{failed_ep.switch_id!r} is in use or unhealthy")
        raise NoSpare(f"no spare for {failed_host}/gpu{failed_gpu}: {reason}")
    _, _, host_name, gpu = best
    if seen_free is False:  # pragma: no cover - best implies a free candidate
        raise NoSpare("internal: no free candidate")
    return SpareChoice(host_name, gpu)
