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

from lightrail.controller.domain.fabric import Fabric, Host


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


@dataclass(frozen=True, slots=True)
class _Candidate:
    """A GPU of ``host`` in the failed GPU's domain, wired to its switch."""

    host: Host
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
    switch_id = failed_ep.switch_id
    used_per_host: dict[str, int] = {}
    for (h, _), _job in in_use.items():
        used_per_host[h] = used_per_host.get(h, 0) + 1
    in_domain = [h for h in fabric.hosts.values()
                 if h.name != failed_host and h.failure_domain == domain]
    wired = [_Candidate(h, gpu) for h in in_domain for gpu in range(h.gpu_count)
             if fabric.has_gpu(h.name, gpu)
             and fabric.endpoint_of_gpu(h.name, gpu).switch_id == switch_id]
    free = [c for c in wired
            if (c.host.name, c.gpu) not in in_use and (c.host.name, c.gpu) not in unhealthy]
    if not in_domain:
        reason = f"no other host in failure domain {domain!r}"
    elif not wired:
        reason = f"no GPU in failure domain {domain!r} is wired to switch {switch_id!r}"
    elif not free:
        reason = (f"every GPU in failure domain {domain!r} wired to switch "
                  f"{switch_id!r} is in use or unhealthy")
    else:
        best = min(free, key=lambda c: (not c.host.spare, used_per_host.get(c.host.name, 0),
                                        c.host.name, c.gpu))
        return SpareChoice(best.host.name, best.gpu)
    raise NoSpare(f"no spare for {failed_host}/gpu{failed_gpu}: {reason}")
