"""``lightrail evaluate``'s power/cost constants as options (issue 12 section 4: the README
calls them overridable): validated with the option and value named, used in the estimate, and
printed with the result so the reader knows which constants it rests on; plus the progress
callback of ``evaluate``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightrail.agents.replay.evaluate import EvaluationConfig, evaluate, evaluation_steps
from lightrail.controller.cli.main import main
from lightrail.controller.core.costmodel import (
    PowerCostConfig,
    changed_constants,
    describe_constants,
    estimate_rail_fabric,
    power_cost_notes,
)
from tests.integration.test_cli_errors import two_rank_trace
from tests.unit.test_evaluate import synthetic


def test_given_constants_are_used_and_reported(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(two_rank_trace(tmp_path))
    assert main(["evaluate", trace, "--delay-ms", "1", "--json", "--transceiver-watts", "20",
                 "--ocs-port-usd", "100", "--eps-radix", "32"]) == 0
    power = json.loads(capsys.readouterr().out)["power"]
    assert power["constants"]["transceiver_power_w"] == 20.0
    assert power["constants"]["ocs_port_cost_usd"] == 100.0
    assert power["constants"]["eps_radix"] == 32
    assert power["changed_constants"] == ["eps_radix", "transceiver_power_w",
                                          "ocs_port_cost_usd"]
    expected = estimate_rail_fabric(power["hosts"], power["rails"], PowerCostConfig(
        eps_radix=32, transceiver_power_w=20.0, ocs_port_cost_usd=100.0))
    assert power["photonic"]["power_w"] == round(expected.photonic.power_w, 1)
    assert power["photonic"]["cost_usd"] == round(expected.photonic.cost_usd, 0)
    assert "changed from the defaults: EPS switch radix 32 ports, transceiver 20 W, OCS port " \
           "$100" in power["assumptions"]
    # the constants changed are no longer called assumptions
    assert not any("transceiver 20 W" in a and "are assumptions" in a
                   for a in power["assumptions"])

    assert main(["evaluate", trace, "--delay-ms", "1", "--ocs-port-watts", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "constants: EPS switch radix 64 ports, EPS port 14.27 W, transceiver 16 W, OCS port " \
           "2 W (changed), EPS port $1,000, transceiver $800, OCS port $500" in out


def test_defaults_are_reported_as_before() -> None:
    cfg = PowerCostConfig()
    assert changed_constants(cfg) == ()
    assert "(changed)" not in describe_constants(cfg)
    assert power_cost_notes(cfg) == (
        "Opus (arXiv:2602.12521) per-component power/cost constants not found: transceiver "
        "16 W, OCS port 0.5 W, EPS port $1,000, transceiver $800, OCS port $500 are assumptions",
        "EPS port power 913 W / 64 ports (Tomahawk 5 64x800G switch without optics, vendor "
        "data sheet)")


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--eps-port-watts", "-1", "argument --eps-port-watts: must be a finite number >= 0, got -1"),
    ("--transceiver-watts", "lots", "argument --transceiver-watts: expected a number, got "
                                    "'lots'"),
    ("--ocs-port-usd", "inf", "argument --ocs-port-usd: must be a finite number >= 0, got inf"),
    ("--eps-radix", "1", "argument --eps-radix: must be >= 2, got 1"),
    ("--eps-radix", "6.5", "argument --eps-radix: expected an integer, got '6.5'"),
])
def test_a_bad_constant_is_named_with_its_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str,
        message: str) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", str(two_rank_trace(tmp_path)), "--out", str(out), option, value])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()  # nothing written


def test_evaluate_reports_progress_per_policy_run() -> None:
    cfg = EvaluationConfig(delays_ms=(1.0, 10.0))
    seen: list[tuple[int, int]] = []
    evaluate(synthetic(), cfg, on_progress=lambda done, total: seen.append((done, total)))
    total = evaluation_steps(cfg)
    assert total == 2 + 3 * 2
    assert seen == [(i, total) for i in range(1, total + 1)]
