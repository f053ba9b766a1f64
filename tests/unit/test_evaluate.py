"""``lightrail evaluate`` (lightrail.agents.replay.evaluate) on a small synthetic workload built
here, plus one
real trace when shared/data is present."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import lightrail.agents.replay.evaluate as evaluate_mod
from lightrail.agents.replay.evaluate import (
    DEFAULT_DELAYS_MS,
    EvaluationConfig,
    EvaluationError,
    Policy,
    evaluate,
    evaluate_main,
)
from lightrail.agents.replay.trace.model import CommOp, Direction, SourceFormat, Workload
from lightrail.controller.cli.main import main as cli_main
from lightrail.controller.core.costmodel import LinkModel
from lightrail.controller.domain.model import Collective, ProcessGroup

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WORLD = ProcessGroup.of(range(8))
HTA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces" / "hta-nccl" \
    / "nccl_data.json.gz"


def synthetic(world_size: int = 8) -> Workload:
    """8 ranks (demo-4x2: 4 hosts x 2 GPUs, 2 rails): per iteration a DP-style all-reduce over
    everyone, a PP-style send/recv with the rank on the next host, an all-to-all and another
    all-reduce, with compute gaps of 0.5-3 ms between them."""
    ranks: dict[int, tuple[CommOp, ...]] = {}
    world = ProcessGroup.of(range(world_size))
    for r in range(world_size):
        peer = r ^ 2  # same GPU index (rail) on the neighbouring host
        pair = ProcessGroup.of([r, peer])
        ranks[r] = (
            CommOp(Collective.ALL_REDUCE, world, "dp", 8_000_000, 0.002),
            CommOp(Collective.SEND_RECV, pair, "pp", 2_000_000, 0.0005,
                   direction=Direction.SEND if r < peer else Direction.RECV, peer=peer),
            CommOp(Collective.ALL_TO_ALL, world, "ep", 1_000_000, 0.001),
            CommOp(Collective.ALL_REDUCE, world, "dp", 16_000_000, 0.003),
        )
    return Workload("synthetic", SourceFormat.AICB_CSV, world_size, ranks,
                    tail_gap_s={r: 0.001 for r in ranks})


def test_policies_are_ordered_at_every_delay() -> None:
    ev = evaluate(synthetic())
    assert ev.fabric == "demo-4x2"
    assert (ev.hosts, ev.rails) == (4, 2)
    assert len(ev.representatives) == 1  # every rank runs the same sequence
    assert ev.representatives[0].ranks == 8
    eps = 1e-12
    for d in DEFAULT_DELAYS_MS:
        ideal, ron, prov, on_demand = (ev.result(p, d).iteration_s for p in (
            Policy.IDEAL_EPS, Policy.PROVISIONING_RON, Policy.PROVISIONING, Policy.ON_DEMAND))
        assert ideal is not None and ron is not None and prov is not None
        assert on_demand is not None
        assert ideal <= ron + eps <= prov + 2 * eps <= on_demand + 3 * eps, d
        assert ev.result(Policy.IDEAL_EPS, d).overhead_pct == 0.0
    # at 100 ms every reconfiguration is exposed on demand; provisioning hides up to the gap
    slow = ev.result(Policy.ON_DEMAND, 100.0)
    assert slow.reconfigurations > 0
    assert slow.exposed_delay_s == pytest.approx(slow.reconfigurations * 0.1)
    assert ev.result(Policy.PROVISIONING, 100.0).exposed_delay_s < slow.exposed_delay_s
    # reconfigure-or-not keeps the circuits there when δ is large ...
    assert ev.result(Policy.PROVISIONING_RON, 100.0).stays > 0
    # ... and is as fast as provisioning when δ is a few µs (it still skips switches that
    # gain nothing: the send/recv 0 -> 1 is one hop on the all-reduce ring)
    fast = ev.result(Policy.PROVISIONING_RON, 0.004)
    assert fast.iteration_s == pytest.approx(ev.result(Policy.PROVISIONING, 0.004).iteration_s)
    assert 0 < fast.reconfigurations <= ev.result(Policy.PROVISIONING, 0.004).reconfigurations
    static = ev.result(Policy.STATIC, 10.0)
    assert static.iteration_s is not None and static.reconfigurations == 0
    assert ev.static_plan is not None and "all_reduce" in ev.static_plan


def test_delay_hidden_by_provisioning_costs_nothing() -> None:
    """With δ shorter than every compute gap, provisioning exposes no delay at all except for
    the all-to-all's later matchings, which follow each other without a gap."""
    ev = evaluate(synthetic(), EvaluationConfig(delays_ms=(0.1,)))
    prov = ev.result(Policy.PROVISIONING, 0.1)
    on_demand = ev.result(Policy.ON_DEMAND, 0.1)
    a2a_later_steps = 2  # 4 hosts per rail: 3 matchings
    assert prov.exposed_delay_s == pytest.approx(a2a_later_steps * 0.1e-3)
    assert on_demand.exposed_delay_s == pytest.approx(on_demand.reconfigurations * 0.1e-3)


def test_scale_up_only_workload_has_no_overhead() -> None:
    """Groups inside one host never touch the rails: every policy equals the ideal."""
    ranks = {r: (CommOp(Collective.ALL_REDUCE, ProcessGroup.of([r - r % 2, r - r % 2 + 1]),
                        "tp", 1_000_000, 0.001),) for r in range(8)}
    ev = evaluate(Workload("tp-only", SourceFormat.AICB_CSV, 8, ranks))
    for r in ev.results:
        assert r.overhead_pct == pytest.approx(0.0)
        assert r.reconfigurations == 0
    ideal = ev.result(Policy.IDEAL_EPS, 10.0).iteration_s
    assert ideal == pytest.approx(0.001 + 2 * (1e-6 + 0.5 * 1_000_000 * 8 / 2400e9))


def test_evaluate_main_writes_csv_json_and_png(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(evaluate_mod, "load_workload", lambda _path: synthetic())
    out = tmp_path / "eval"
    rc = evaluate_main(tmp_path / "synthetic.csv", [1.0, 10.0], out)
    assert rc == 0
    printed = capsys.readouterr().out
    assert "provisioning + RON" in printed
    assert "δ=10 ms" in printed
    with (out / "evaluation.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * len(Policy)
    assert {r["policy"] for r in rows} == {p.value for p in Policy}
    data = json.loads((out / "evaluation.json").read_text(encoding="utf-8"))
    assert data["world_size"] == 8
    assert data["delays_ms"] == [1.0, 10.0]
    assert data["power"]["photonic"]["switch_transceivers"] == 0
    assert data["power"]["power_ratio"] > 1
    assert len(data["results"]) == 2 * len(Policy)
    assert (out / "overhead_vs_delay.png").read_bytes()[:8] == PNG_MAGIC


def test_evaluate_without_out_says_nothing_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(evaluate_mod, "load_workload", lambda _path: synthetic())
    assert evaluate_main(tmp_path / "synthetic.csv", [1.0], None) == 0
    assert "no files written: --out DIR writes evaluation.csv" in " ".join(
        capsys.readouterr().out.split())
    assert list(tmp_path.iterdir()) == []


def test_bad_inputs_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert evaluate_main(tmp_path / "missing.csv", None, None) == 2
    assert "no such file" in capsys.readouterr().err
    assert evaluate_main(tmp_path / "missing.csv", [-1.0], None) == 2
    assert "delays_ms" in capsys.readouterr().err
    with pytest.raises(EvaluationError, match="fabric offers") as too_small:
        evaluate(synthetic(world_size=200), EvaluationConfig(fabric="rail-16x8"))
    assert "a fabric that fits: --fabric rail:25x8" in str(too_small.value)
    with pytest.raises(EvaluationError, match="unknown built-in fabric"):
        EvaluationConfig(fabric="nope")
    with pytest.raises(EvaluationError, match="max_ops"):
        EvaluationConfig(max_ops=0)
    with pytest.raises(EvaluationError, match="at least one"):
        EvaluationConfig(delays_ms=())


def test_max_ops_truncates_and_says_so() -> None:
    ev = evaluate(synthetic(), EvaluationConfig(max_ops=2, delays_ms=(10.0,),
                                                link=LinkModel.from_gbps(400)))
    assert ev.representatives[0].ops == 2
    assert any("--max-ops" in n for n in ev.notes)


@pytest.mark.skipif(not HTA.is_file(), reason=f"real trace not present at {HTA}")
def test_cli_evaluates_a_real_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["evaluate", str(HTA), "--delay-ms", "0.1", "10", "--out", str(tmp_path)])
    assert rc == 0
    assert "ideal EPS" in capsys.readouterr().out
    assert (tmp_path / "overhead_vs_delay.png").read_bytes()[:8] == PNG_MAGIC
    data = json.loads((tmp_path / "evaluation.json").read_text(encoding="utf-8"))
    assert data["world_size"] == 2
    assert data["source_format"] == "kineto"
