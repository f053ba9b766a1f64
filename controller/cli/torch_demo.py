"""``lightrail demo --torch``: the PyTorch example (``examples/torch/train_pp_dp.py``, PP=2 x
DP=2 under torchrun) on an embedded etcd, a controller process, the emulated rail of
``lightrail emulate`` and one host agent per emulated host, then the same script on plain gloo;
prints the per-phase summary the ranks wrote and the two runs' losses side by side."""

from __future__ import annotations

import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from lightrail.controller.cli.torch_job import (
    EXAMPLE,
    GATED_BACKEND,
    WORLD,
    GatedRun,
    PhaseRow,
    StepComparison,
    TorchJobError,
    TorchRun,
    compare_steps,
    phase_rows,
    run_gated,
    run_torchrun,
    torch_available,
)

PP_KIND = "send_recv"


def _kind(row: PhaseRow) -> str:
    return "PP" if row.collective == PP_KIND else "DP"


def print_phases(console: Console, gated: GatedRun) -> None:
    """The per-phase table (summed over each group's ranks) and the controller's view."""
    table = Table(title="Per-phase summary (LIGHTRAIL_SUMMARY of every rank, summed over the "
                        "group's ranks)")
    for col in ("group", "kind", "collective", "entered", "noop", "reconfigured", "calls",
                "wait ms"):
        table.add_column(col, justify="left" if col in ("group", "kind", "collective")
                         else "right")
    for r in phase_rows(gated.run.phases):
        table.add_row("{" + ",".join(map(str, r.ranks)) + "}", _kind(r), r.collective,
                      str(r.entered), str(r.noop), str(r.reconfigured), str(r.calls),
                      f"{r.wait_s * 1e3:.1f}")
    console.print(table)
    job = gated.job
    changes = sum(len(log) for log in gated.change_logs.values())
    console.print(
        f"controller: {job.phases_admitted} rank admissions, {job.reconfigurations} "
        f"reconfigurations (lightrail_reconfigurations_total {gated.reconfigurations_total:g}),"
        f" {changes} cross-connect changes in the switches' change logs")
    state = "learned" if job.schedule_learned else "not learned"
    console.print(
        f"provisioning (schedule {state}): {job.provisioning_hits} phases switched ahead and "
        f"ready, {job.provisioning_late} still switching when ranks came, "
        f"{job.provisioning_misses} switched on demand")


def print_losses(console: Console, comparison: list[StepComparison], steps: int) -> bool:
    """The last stage's loss per step, gated next to plain; returns whether every record
    (losses and parameter sums of every rank) is bit-identical."""
    last_stage = [r for r in range(WORLD) if r % 2 == 1]
    table = Table(title=f"Loss per step (float.hex), {GATED_BACKEND} vs gloo")
    table.add_column("step", justify="right")
    for r in last_stage:
        table.add_column(f"rank {r} {GATED_BACKEND}")
        table.add_column(f"rank {r} gloo")
    table.add_column("identical")
    by = {(c.rank, c.step): c for c in comparison}
    for s in range(steps):
        cells = [str(s)]
        for r in last_stage:
            c = by[(r, s)]
            cells += [c.gated.loss or "-" if c.gated else "missing",
                      c.plain.loss or "-" if c.plain else "missing"]
        same = all(c.identical for c in comparison if c.step == s)
        cells.append("yes" if same else "[red]NO[/]")
        table.add_row(*cells)
    console.print(table)
    identical = all(c.identical for c in comparison)
    console.print(
        f"{len(comparison)} step records (losses and parameter sums, {WORLD} ranks x {steps} "
        f"steps): " + ("bit-identical with and without the gate" if identical
                        else "[red]DIFFERENT[/]"))
    return identical


def _failed(err: Console, run: TorchRun) -> int:
    err.print(f"lightrail demo --torch: torchrun ({run.backend}) exited with code "
              f"{run.returncode}; its output ends with:", markup=False)
    err.print(run.output_tail, markup=False, highlight=False)
    return 1


async def torch_demo_main(console: Console, err: Console, *, steps: int, delay_ms: float
                          ) -> int:
    """Run the demo; returns the exit code (2: torch or the example missing, 1: a run
    failed or the losses differ)."""
    if not torch_available():
        err.print("lightrail demo --torch: torch is not installed: pip install "
                  "'lightrail[torch]' (tested with torch 2.13.0)")
        return 2
    if not EXAMPLE.exists():
        err.print(f"lightrail demo --torch: the example {EXAMPLE} is not there (it comes with "
                  "a source checkout)", markup=False)
        return 2
    err.print(f"starting an embedded etcd, the rail OCS in a lightrail emulate process (TL1, "
              f"reconfiguration delay {delay_ms:g} ms), a controller process and {WORLD} host "
              f"agents; then torchrun --nproc-per-node {WORLD} {EXAMPLE.name} --backend "
              f"{GATED_BACKEND} ...", markup=False)
    with tempfile.TemporaryDirectory(prefix="lightrail-torch-demo-") as tmp:
        try:
            gated = await run_gated(Path(tmp) / "gated", steps=steps, delay_ms=delay_ms)
        except TorchJobError as exc:
            err.print(f"lightrail demo --torch: {exc}", markup=False)
            return 1
        if gated.run.returncode != 0:
            return _failed(err, gated.run)
        err.print(f"... {gated.run.wall_s:.1f} s; now the same script with --backend gloo "
                  "(no Lightrail) ...")
        plain = await run_torchrun(Path(tmp) / "plain", backend="gloo", steps=steps)
        if plain.returncode != 0:
            return _failed(err, plain)
    console.print(f"[bold]job {EXAMPLE.name}[/]: PP=2 x DP=2 on {WORLD} CPU processes, one per "
                  f"emulated host on one rail; {steps} steps in {gated.run.wall_s:.1f} s gated, "
                  f"{plain.wall_s:.1f} s on plain gloo")
    print_phases(console, gated)
    same = print_losses(console, compare_steps(gated.run, plain, steps), steps)
    return 0 if same else 1


