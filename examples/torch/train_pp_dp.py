"""A small MLP trained with torchrun on 4 processes, 2 pipeline stages x 2 data-parallel
replicas (PP=2, DP=2), with ``torch.distributed.pipelining`` (GPipe schedule, 2 microbatches)
and a manual all-reduce of the gradients over each DP group.

Rank layout: ``rank = dp * 2 + stage``. PP groups {0,1} and {2,3} carry the activations and
their gradients (send/recv); DP groups {0,2} and {1,3} average the gradients (all_reduce). On a
fabric whose four hosts share one rail, the two kinds of groups need different circuits, so the
rails reconfigure at every change of phase.

Deterministic: fixed seeds and data, ``torch.use_deterministic_algorithms(True)``, one intra-op
thread. Every rank writes one JSON line per step to ``--losses`` (``{rank}`` in the path is
replaced): the step, the last stage's loss (``None`` on stage 0) and the sum of the stage's
parameters after the optimiser step, both as ``float.hex`` (exact). Two runs that differ only in
``--backend`` (``gloo``, ``cpu:lightrail``) must write identical files.

Run (plain gloo)::

    torchrun --standalone --nproc-per-node 4 examples/torch/train_pp_dp.py \
        --losses '/tmp/steps-{rank}.jsonl'

The backend comes from ``--backend``, else ``$LIGHTRAIL_EXAMPLE_BACKEND``, else ``gloo``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

PP = 2
DP = 2
WORLD = PP * DP
FEATURES = 16
HIDDEN = 32
CLASSES = 4
BATCH = 8
MICROBATCHES = 2


def build_model() -> nn.Sequential:
    """The whole model, identical on every rank (seeded before the call); stage ``s`` keeps
    ``stage_module(model, s)``."""
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def stage_module(model: nn.Sequential, stage: int) -> nn.Sequential:
    """Stage 0: the first four layers; stage 1: the last three."""
    layers = list(model.children())
    return nn.Sequential(*(layers[:4] if stage == 0 else layers[4:]))


def batch(step: int, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed inputs ``[BATCH, FEATURES]`` and class labels ``[BATCH]`` of replica ``dp`` at
    ``step`` (same on both stages of the replica)."""
    gen = torch.Generator().manual_seed(1000 * step + dp)
    x = torch.randn(BATCH, FEATURES, generator=gen)
    y = torch.randint(0, CLASSES, (BATCH,), generator=gen)
    return x, y


def param_sum(module: nn.Module) -> float:
    """The sum of all parameters, in float64 (a fingerprint of the weights)."""
    return float(sum(p.detach().double().sum() for p in module.parameters()))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default=os.environ.get("LIGHTRAIL_EXAMPLE_BACKEND", "gloo"),
                   help="init_process_group backend (gloo, cpu:lightrail; default "
                        "$LIGHTRAIL_EXAMPLE_BACKEND or gloo)")
    p.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    p.add_argument("--losses", default=None,
                   help="JSON-lines file per rank ({rank} replaced); default: stdout only")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    if "lightrail" in args.backend:
        # registers the backend; unneeded where torch's backend autoload entry point of the
        # installed lightrail package does it at ``import torch``
        import lightrail.agents.torch  # noqa: F401
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != WORLD:
        print(f"train_pp_dp: needs {WORLD} processes (PP={PP} x DP={DP}), got {world}",
              file=sys.stderr)
        return 2
    dp, stage = divmod(rank, PP)
    # every rank creates every group, in the same order (a group created on a subset of ranks
    # hangs the others: pytorch issue 134314)
    pp_groups = [dist.new_group([d * PP + s for s in range(PP)]) for d in range(DP)]
    dp_groups = [dist.new_group([d * PP + s for d in range(DP)]) for s in range(PP)]
    pp_group, dp_group = pp_groups[dp], dp_groups[stage]

    torch.manual_seed(0)
    module = stage_module(build_model(), stage)
    micro = BATCH // MICROBATCHES
    pipe = PipelineStage(
        module, stage, PP, torch.device("cpu"), group=pp_group,
        # shapes given: no metadata exchange before the first step; a received activation
        # requires grad (the backward sends its gradient back)
        input_args=torch.empty(micro, FEATURES if stage == 0 else HIDDEN,
                               requires_grad=stage > 0),
        output_args=torch.empty(micro, HIDDEN if stage == 0 else CLASSES, requires_grad=True))
    schedule = ScheduleGPipe(pipe, MICROBATCHES, loss_fn=nn.functional.cross_entropy)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)

    out = Path(args.losses.replace("{rank}", str(rank))) if args.losses else None
    lines: list[str] = []
    for step in range(args.steps):
        x, y = batch(step, dp)
        opt.zero_grad(set_to_none=False)
        loss_hex: str | None = None
        if stage == 0:
            schedule.step(x)
        else:
            losses: list[torch.Tensor] = []
            schedule.step(target=y, losses=losses)
            loss_hex = float(torch.stack(losses).detach().mean()).hex()
        # average the replicas' gradients: every all-reduce issued back to back (one phase),
        # then waited for
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        works = [dist.all_reduce(g, group=dp_group, async_op=True) for g in grads]
        for work in works:
            assert work is not None
            work.wait()
        for g in grads:
            g.div_(DP)
        opt.step()
        record = {"step": step, "rank": rank, "loss": loss_hex,
                  "param_sum": param_sum(module).hex()}
        lines.append(json.dumps(record))
        print(f"rank {rank} step {step} loss {loss_hex} param_sum {record['param_sum']}",
              flush=True)
    if out is not None:
        out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
