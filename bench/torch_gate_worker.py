"""A torchrun worker of bench/torch_gate.py: times small all-reduces on a plain gloo group and
on the same ranks' lightrail group, in three patterns, and writes the figures to
``$OUT/gate-<rank>.json``. Run only by bench/torch_gate.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def timed(calls: int, step: object) -> float:
    """Seconds per call of ``step(i)`` over ``calls`` calls (after a barrier-free warm-up)."""
    start = time.perf_counter()
    for i in range(calls):
        step(i)  # type: ignore[operator]
    return (time.perf_counter() - start) / calls


def main() -> None:
    dist.init_process_group("cpu:lightrail")
    calls = int(os.environ.get("CALLS", "300"))
    repeats = int(os.environ.get("REPEATS", "5"))
    world = list(range(dist.get_world_size()))
    plain = dist.new_group(world, backend="gloo")
    gated = dist.new_group(world)  # the default backend: lightrail
    t = torch.ones(16)
    out = torch.empty(16 * len(world))

    def same_phase(group: dist.ProcessGroup) -> object:
        return lambda i: dist.all_reduce(t, group=group)

    def alternate(group: dist.ProcessGroup) -> object:
        # all_reduce and all_gather alternate: two phases on the same circuits, so every call
        # begins a phase whose admission is a no-op (the circuits are there)
        def step(i: int) -> None:
            if i % 2:
                dist.all_gather_into_tensor(out, t, group=group)
            else:
                dist.all_reduce(t, group=group)
        return step

    figures: dict[str, list[float]] = {k: [] for k in (
        "plain_same", "gated_same", "plain_alternate", "gated_alternate")}
    for group in (plain, gated):  # warm-up: connections, the first reconfiguration
        timed(20, alternate(group))
    for _ in range(repeats):  # interleaved: the machine's speed drifts
        figures["plain_same"].append(timed(calls, same_phase(plain)))
        figures["gated_same"].append(timed(calls, same_phase(gated)))
        figures["plain_alternate"].append(timed(calls, alternate(plain)))
        figures["gated_alternate"].append(timed(calls, alternate(gated)))
    rank = dist.get_rank()
    Path(os.environ["OUT"], f"gate-{rank}.json").write_text(json.dumps(figures),
                                                            encoding="utf-8")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
