"""A torchrun worker for tests/integration/test_torch_backend.py: every kind of call the
lightrail backend gates, on a TP x DP layout of 4 ranks (2 per host), with the job's results
written as exact hex floats to ``$OUT/result-<rank>.json``.

The script is the same with and without Lightrail: it calls ``init_process_group("gloo")``;
the test gates it with ``LIGHTRAIL_GATE=1`` alone (the backend autoloads with torch).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist


def hexes(t: torch.Tensor) -> list[str]:
    return [float(v).hex() for v in t.flatten().tolist()]


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # Every rank makes every group in the same order, members or not (pytorch issue 134314).
    tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    pair_01 = dist.new_group([0, 1])  # ranks 2 and 3 are not members
    tp, dp = tp_groups[rank // 2], dp_groups[rank % 2]
    dp_ranks = [rank % 2, rank % 2 + 2]
    peer = dp_ranks[1] if rank == dp_ranks[0] else dp_ranks[0]
    torch.manual_seed(1000 + rank)
    x = torch.randn(8)
    out: dict[str, object] = {"backend": dist.get_backend(dp)}

    t = x.clone()
    dist.all_reduce(t, group=tp)  # one host: never gated
    out["tp_all_reduce"] = hexes(t)
    t = x.clone()
    dist.all_reduce(t, group=dp)
    dist.all_reduce(t, group=dp)  # the same run
    out["dp_all_reduce"] = hexes(t)
    g = torch.empty(16)
    dist.all_gather_into_tensor(g, x, group=dp)
    out["all_gather_into_tensor"] = hexes(g)
    parts = [torch.empty(8) for _ in range(2)]
    dist.all_gather(parts, x, group=dp)
    out["all_gather"] = [hexes(p) for p in parts]
    b = x.clone()
    dist.broadcast(b, src=dp_ranks[0], group=dp)
    out["broadcast"] = hexes(b)
    a2a = torch.empty(8)
    dist.all_to_all_single(a2a, x, group=dp)
    out["all_to_all_single"] = hexes(a2a)
    recv = torch.empty(8)
    ops = [dist.P2POp(dist.isend, x, peer, group=dp), dist.P2POp(dist.irecv, recv, peer, group=dp)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    out["batch_isend_irecv"] = hexes(recv)
    if rank in (0, 1):
        t = x.clone()
        dist.all_reduce(t, group=pair_01)
        out["pair_01"] = hexes(t)
    dist.barrier(group=dp)
    t = x.clone()
    dist.all_reduce(t)  # the world
    out["world_all_reduce"] = hexes(t)
    Path(os.environ["OUT"], f"result-{rank}.json").write_text(json.dumps(out), encoding="utf-8")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
