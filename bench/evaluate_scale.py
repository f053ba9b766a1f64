"""``lightrail evaluate`` at 9,216 GPUs (issue 13 §2): time and peak memory of pricing a SimAI
workload of that size, by class of ranks (the evaluator's path) and, for comparison, rank by
rank (every rank's sequence materialized, as before issue 13).

Run: ``.venv/bin/python bench/evaluate_scale.py [--world 9216] [--pp 8] [--per-rank]
[--json]``. A script, not a test (pytest does not collect ``bench/``); a few seconds by class,
up to half a minute more with ``--per-rank`` on a shared 2-core machine.

The workload is the shared Llama-7B SimAI file (``$LIGHTRAIL_DATA`` or ``../shared/data``,
``workloads/aicb/L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1_A100.txt``, TP 2) under a header for
``--world`` GPUs in ``--pp`` stages (``lightrail.agents.replay.trace.simai_scale.scale_simai``:
one stage's 32 / pp transformer layers, as AICB writes a pipelined file, so pp must divide
Llama-7B's 32 layers: 8 by default, 12 is refused), written to a temporary folder and removed
afterwards; the reader adds the pipeline send/recv of ``pp_comm`` bytes between the stages
(``lightrail.agents.replay.trace.simai_pipeline``). Each measurement runs in a child process
of its own, so its figures are its own:

* ``class`` runs ``lightrail evaluate FILE --json`` (reading the file, sizing the rail fabric
  from the job, pricing every policy at the default delays);
* ``per-rank`` (``--per-rank``) reads the same file, copies every rank's sequence into a plain
  dictionary (``Workload.ranks`` materialized: the per-rank path) and evaluates that on the same
  fabric.

``wall s`` is the child's wall time from start to exit (``time.perf_counter`` around it,
interpreter start and imports included); ``peak MiB`` its peak resident set size as it reports
it at the end (``getrusage(RUSAGE_SELF).ru_maxrss``: the ``peak_rss_mib`` of ``lightrail
evaluate --json``). ``reading s`` and ``evaluate s`` are what the child reports. The iteration
times at δ = 10 ms are printed so both paths can be seen to agree.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from support import description

from lightrail.agents.replay.trace.simai_scale import scale_simai
from lightrail.controller.cli.common import shared_data_dir

SIMAI_LLAMA7B = "workloads/aicb/L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1_A100.txt"
LIGHTRAIL = Path(sys.executable).with_name("lightrail")


@dataclass(frozen=True, slots=True)
class Row:
    """One measured child process."""

    path: str
    world_size: int
    fabric: str
    representatives: int
    wall_s: float
    peak_mib: float
    evaluate_s: float
    reading_s: float | None
    iteration_ms_at_10ms: dict[str, float | None]


def _run(argv: list[str]) -> tuple[dict[str, object], float, float]:
    """Run ``argv``, parse its JSON stdout; its wall time (s) and the peak RSS it reports
    (``peak_rss_mib``, MiB)."""
    started = time.perf_counter()
    child = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({child.returncode}): {child.stderr.strip()}")
    data: dict[str, object] = json.loads(child.stdout)
    return data, wall, float(str(data["peak_rss_mib"]))


def _row(path: str, data: dict[str, object], wall: float, peak: float) -> Row:
    results = data["results"]
    assert isinstance(results, list)
    at10 = {str(r["policy"]): r["iteration_ms"] for r in results if r["delay_ms"] == 10.0}
    reps = data["representatives"]
    assert isinstance(reps, list)
    load = data.get("load_s")
    return Row(path, int(str(data["world_size"])), str(data["fabric"]), len(reps), wall, peak,
               float(str(data["elapsed_s"])), None if load is None else float(str(load)), at10)


def _per_rank_child(file: Path) -> None:
    """In the child: read ``file``, materialize every rank's sequence, evaluate that; print
    the JSON with this process's reading time and peak RSS, as ``lightrail evaluate`` does."""
    from lightrail.agents.replay.evaluate import evaluate, evaluation_to_json, peak_rss_mib
    from lightrail.agents.replay.trace.loader import load_workload
    from lightrail.agents.replay.trace.model import Workload

    started = time.perf_counter()
    read = load_workload(file)
    workload = Workload(read.name, read.source_format, read.world_size, dict(read.ranks),
                        read.assumptions, read.iteration, read.tail_gap_s)
    load_s = time.perf_counter() - started
    data = evaluation_to_json(evaluate(workload))
    data["load_s"] = round(load_s, 3)
    data["peak_rss_mib"] = round(peak_rss_mib(), 1)
    print(json.dumps(data))


def main() -> None:
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--world", type=int, default=9216, help="GPUs (default 9216)")
    ap.add_argument("--pp", type=int, default=8,
                    help="pipeline stages, a divisor of the 32 layers (default 8)")
    ap.add_argument("--per-rank", action="store_true",
                    help="also price it rank by rank (every sequence materialized)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--per-rank-child", metavar="FILE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.per_rank_child:
        _per_rank_child(Path(args.per_rank_child))
        return
    source = shared_data_dir() / SIMAI_LLAMA7B
    if not source.is_file():
        raise SystemExit(f"shared SimAI workload not found: {source} (set LIGHTRAIL_DATA)")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="lightrail-scale-") as tmp:
        try:
            file = scale_simai(source, Path(tmp) / f"L7B_tp2_pp{args.pp}_{args.world}.txt",
                               world_size=args.world, pp=args.pp)
        except ValueError as exc:
            raise SystemExit(f"evaluate_scale: {exc}") from None
        runs = [("class", [str(LIGHTRAIL), "evaluate", str(file), "--json"])]
        if args.per_rank:
            runs.append(("per-rank", [sys.executable, __file__, "--per-rank-child", str(file)]))
        for mode, argv in runs:
            data, wall, peak = _run(argv)
            rows.append(_row(mode, data, wall, peak))
        header = file.read_text(encoding="utf-8").splitlines()[0]
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return
    print(f"workload: {source.name} under the header\n  {header}")
    print(f"{'path':<9} {'ranks':>6} {'fabric':<12} {'reps':>4} {'wall s':>7} {'peak MiB':>8} "
          f"{'reading s':>9} {'evaluate s':>10}  iteration ms at δ=10 ms")
    for r in rows:
        at10 = ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} n/a"
                         for k, v in r.iteration_ms_at_10ms.items())
        reading = f"{r.reading_s:.2f}" if r.reading_s is not None else "-"
        print(f"{r.path:<9} {r.world_size:>6} {r.fabric:<12} {r.representatives:>4} "
              f"{r.wall_s:>7.2f} {r.peak_mib:>8.0f} {reading:>9} {r.evaluate_s:>10.2f}  {at10}")
    aims = "met" if all(r.wall_s < 30 and r.peak_mib < 1024 for r in rows if r.path == "class") \
        else "NOT met"
    print(f"aim (< 30 s and < 1 GiB by class, whole process): {aims}")


if __name__ == "__main__":
    main()
