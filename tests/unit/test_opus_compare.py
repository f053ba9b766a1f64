"""``lightrail evaluate`` on an Opus experiment folder (``agents/replay/opus_compare.py``,
``agents/replay/opus_policies.py``): the table's numbers for one δ against a hand computation on
a scaled-down synthetic folder, the JSON, the CLI, and the real folders' shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightrail.agents.replay.evaluate import DEFAULT_SCALE_UP
from lightrail.agents.replay.opus_compare import (
    PERLMUTTER_LINK,
    compare,
    comparison_to_json,
    opus_evaluate_main,
)
from lightrail.agents.replay.opus_policies import PhaseCost, hybrid_s, split_rails_s
from lightrail.agents.replay.trace.opus import LLAMA3_8B
from lightrail.agents.replay.trace.opus_format import PhaseLabel
from lightrail.controller.cli.main import main as cli_main

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces"
OPUS = SHARED / "opus-perlmutter"

STEP = ["PP start_backend: 1 start_idx: {p} end_backend: 1 end_idx: {p} len: 1",
        "DP start_backend: 5 start_idx: {d0} end_backend: 5 end_idx: {d1} len: 2",
        "DP start_backend: 6 start_idx: {s} end_backend: 6 end_idx: {s} len: 1"]
# per step (ms from its start): PP 0..10, idle 20, DP 30..430, idle 70, DP6 500..505; 1 s steps
TIMES = [(0, 10), (30, 430), (500, 505)]


def _lines(steps: int) -> list[str]:
    return [ln.format(p=k, d0=2 * k, d1=2 * k + 1, s=k) for k in range(steps) for ln in STEP]


def _folder(root: Path, nodes: int = 4) -> Path:
    d = root / "exp"
    (d / "comm_pattern").mkdir(parents=True)
    for n in range(nodes):
        for r in range(4):
            (d / "comm_pattern" / f"comm_pattern_{n}_rank{r}.txt").write_text(
                "\n".join([f"Node: h{n}, Rank: {r}, Tid: 1", *_lines(3)]) + "\n")
    for s in (0, 1):
        timed = [f"{ln}, start_time: {1e6 + 1000 * (i // 3) + TIMES[i % 3][0]}, "
                 f"end_time: {1e6 + 1000 * (i // 3) + TIMES[i % 3][1]}"
                 for i, ln in enumerate(_lines(3))]
        (d / f"t_pp_{s}.txt").write_text("\n".join(timed) + "\n")
    (d / "latency_results.csv").write_bytes(
        b"Experiment,Min latency (s),Average Latency (s),Standard Deviation (s)\r\n"
        b"output-opus-no-ctl,1.0,1.0,0.0\r\n"
        b"output-opus-l_0-baseline,1.05,1.05,0.0\r\n"
        b"output-opus-l_100-baseline,1.6,1.6,0.0\r\n"
        b"output-opus-l_0-provision,1.01,1.01,0.0\r\n"
        b"output-opus-l_100-provision,1.3,1.3,0.0\r\n")
    return d


def test_one_delay_by_hand(tmp_path: Path) -> None:
    """δ = 100 ms on 4 nodes (TP4 x PP2 x DP2): per step PP -> DP -> DP6 -> PP, the two DP
    phases on one group: 2 circuit changes per step. Hand computation with the α-β link."""
    c = compare(_folder(tmp_path))
    alpha, beta = PERLMUTTER_LINK.alpha_s, PERLMUTTER_LINK.beta_s_per_byte
    pp = alpha + LLAMA3_8B.pp_call_bytes() * beta              # one send of 268 MB
    shard = LLAMA3_8B.dp_unit_bytes() // 2
    dp = alpha + shard * beta                                  # 2-rank ring all-gather: 1 step
    # the zero-byte closing calls of the one-call phases cost their α each
    comm = (pp + alpha) + 2 * dp + (dp + alpha)
    gaps = 1.0                                                 # idle + span per step, s
    f = (1.0 - comm) / gaps                                    # calibrated on no-controller
    assert c.gap_scale == pytest.approx(f, rel=1e-6)
    assert c.predicted_no_controller_s == pytest.approx(1.0, abs=1e-9)
    row = next(r for r in c.rows if r.delay_ms == 100)
    assert row.reconfigurations_on_demand == 2
    assert row.predicted_on_demand_s == pytest.approx(1.0 + 2 * 0.1, abs=1e-9)
    # provisioning hides δ in the idle gap before each switched phase: DP 20 ms, PP 495 ms
    prov_over = max(0.0, 0.1 - 0.020 * f) + max(0.0, 0.1 - 0.495 * f)
    assert row.predicted_provisioning_s == pytest.approx(1.0 + prov_over, abs=1e-9)
    assert row.err_on_demand_pct == pytest.approx((0.2 - 0.6) / 0.6 * 100)
    assert row.err_provisioning_pct == pytest.approx((prov_over - 0.3) / 0.3 * 100)
    # against the same mode's δ = 0 run: on-demand 1.6 - 1.05, provisioning 1.3 - 1.01
    assert row.err0_on_demand_pct == pytest.approx((0.2 - 0.55) / 0.55 * 100)
    assert row.err0_provisioning_pct == pytest.approx((prov_over - 0.29) / 0.29 * 100)
    assert row.hybrid_s <= min(row.static_cycle_s, row.split_rails_s) + 1e-9
    assert row.best_s == pytest.approx(
        min(row.predicted_ron_s, row.static_cycle_s, row.hybrid_s, row.split_rails_s),
        abs=1e-9)
    data = comparison_to_json(c)
    j = next(r for r in data["rows"] if r["delay_ms"] == 100)
    assert j["measured"] == {"on_demand_s": 1.6, "provisioning_s": 1.3}
    assert j["predicted"]["on_demand_s"] == pytest.approx(1.2, abs=1e-4)
    assert j["overhead_error_pct"]["on_demand"] == pytest.approx(-66.67, abs=0.01)
    assert json.loads(json.dumps(data)) == data


def test_hybrid_and_split_by_hand() -> None:
    """Two phases per step, idle 0.2 s before each; per phase direct 0.01 s, cycle 0.05 s, and
    1 GB sent per GPU (NVLink copy 1e9 B / 300 GB/s = 3.33 ms on split rails)."""
    nvlink = DEFAULT_SCALE_UP
    copy = 1e9 * nvlink.beta_s_per_byte
    phases = [PhaseCost(PhaseLabel.PP, 0.2, 1.0, 0.01, 0.05, 1e9),
              PhaseCost(PhaseLabel.DP, 0.2, 1.0, 0.01, 0.05, 1e9)]
    # split: 2 rails each: direct x 2, plus the copy (1 or 3 PP rails: x4 and x4/3 -> worse)
    t, r = split_rails_s([phases], nvlink)
    assert r == 2 and t == pytest.approx(2.4 + 2 * (0.02 + copy))
    # δ below the idle gap: switch to direct circuits before every phase, nothing exposed
    t, sw = hybrid_s([phases], 0.1, nvlink)
    assert t == pytest.approx(2.4 + 0.02) and sw == 2
    # δ = 1 s: switching exposes 0.8 s; staying on split rails costs 2 x (0.01 + copy): stay
    t, sw = hybrid_s([phases], 1.0, nvlink)
    assert t == pytest.approx(2.4 + 2 * (0.02 + copy)) and sw == 0


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _folder(tmp_path)
    assert cli_main(["evaluate", str(d), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["source_format"] == "opus" and data["world_size"] == 16
    assert [r["delay_ms"] for r in data["rows"]] == [0.0, 100.0]
    assert cli_main(["evaluate", str(d), "--out", str(tmp_path / "o"), "--delay-ms", "5"]) == 0
    cap = capsys.readouterr()
    assert "--delay-ms not used" in cap.err
    assert json.loads((tmp_path / "o" / "opus_comparison.json").read_text()) == data
    assert opus_evaluate_main(d) == 0
    out = capsys.readouterr().out
    assert "calibration (no-controller row only)" in out


def test_folder_without_csv_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _folder(tmp_path)
    (d / "latency_results.csv").unlink()
    assert opus_evaluate_main(d) == 2
    assert "latency CSVs" in capsys.readouterr().err


def test_csvs_with_only_the_no_controller_run_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # review of issue 13: said 'delays_ms: give at least one delay' (no option was given)
    d = _folder(tmp_path)
    csv = d / "latency_results.csv"
    csv.write_bytes(b"\r\n".join(csv.read_bytes().split(b"\r\n")[:2]) + b"\r\n")
    assert opus_evaluate_main(d) == 2
    err = capsys.readouterr().err
    assert "field 'Experiment'" in err and "only the no-controller run" in err, err


@pytest.mark.skipif(not OPUS.is_dir(), reason="shared opus-perlmutter data absent")
@pytest.mark.parametrize("folder,delays", [
    ("llama-3-3d-16-latency", 10), ("llama-3-3d-64-latency", 8)])
def test_real_folders(folder: str, delays: int) -> None:
    c = compare(OPUS / folder)
    assert len(c.rows) == delays
    assert c.predicted_no_controller_s == pytest.approx(c.measured_no_controller_s, rel=1e-3)
    at0 = c.rows[0]
    assert at0.delay_ms == 0
    for r in c.rows:
        # 3 PP and 3 DP phases per step, each a change of circuits on demand
        assert r.reconfigurations_on_demand == 6
        assert r.predicted_on_demand_s == pytest.approx(
            at0.predicted_on_demand_s + 6 * r.delay_ms / 1e3, rel=1e-6)
        assert r.predicted_provisioning_s <= r.predicted_on_demand_s + 1e-9
        assert r.best_s <= r.predicted_ron_s + 1e-9


def test_evaluate_help_names_what_out_writes_for_an_opus_folder(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # review of issue 13: --out's help named only evaluation.csv/.json/.png, but an Opus
    # experiment folder writes opus_comparison.json alone
    with pytest.raises(SystemExit):
        cli_main(["evaluate", "--help"])
    assert "opus_comparison.json" in " ".join(capsys.readouterr().out.split())
