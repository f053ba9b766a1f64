"""Config validation: unknown keys and wrong types are rejected with the field path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lightrail.controller.cli.main import main
from lightrail.controller.config import ConfigError, build_fabric, load_config, parse_config

WIRING: list[dict[str, object]] = [
    {"host": "a", "nic": 0, "gpu": 0, "rail": 0, "switch": "ocs0", "tx_port": 1, "rx_port": 5},
    {"host": "b", "nic": 0, "gpu": 0, "rail": 0, "switch": "ocs0", "tx_port": 2, "rx_port": 6},
]
INLINE: dict[str, object] = {
    "name": "lab",
    "hosts": [{"name": "a", "gpus": 1}, {"name": "b", "gpus": 1}],
    "switches": [{"id": "ocs0", "ports": 4, "rail": 0, "reconfiguration_delay_ms": 25}],
    "wiring": WIRING,
}


def test_defaults_give_the_demo_fabric() -> None:
    cfg = load_config(None)
    fabric = build_fabric(cfg.fabric)
    assert fabric.name == "demo-4x2"
    assert len(fabric.hosts) == 4 and sorted(fabric.switches) == ["ocs-rail0", "ocs-rail1"]
    assert cfg.controller.listen == "127.0.0.1:50051"


def test_inline_fabric() -> None:
    cfg = parse_config({"fabric": INLINE})
    fabric = build_fabric(cfg.fabric)
    assert fabric.switches["ocs0"].reconfiguration_delay_s == pytest.approx(0.025)
    assert fabric.endpoint_of_gpu("b", 0).tx_port == 2


def test_generated_rail_fabric() -> None:
    cfg = parse_config({"fabric": {"rail": {"hosts": 3, "gpus_per_host": 2, "spares": 1}}})
    fabric = build_fabric(cfg.fabric)
    assert len(fabric.hosts) == 4 and fabric.hosts["host3"].spare
    assert fabric.switches["ocs-rail1"].capabilities.port_count == 4


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"controler": {}}, "controler: Extra inputs are not permitted"),
        ({"controller": {"listen": 5}}, "controller.listen: Input should be a valid string"),
        ({"controller": {"admission_timeout_s": -1}},
         "controller.admission_timeout_s: Input should be greater than 0 (got -1)"),
        ({"etcd": {"endpoints": "localhost:2379"}}, "etcd.endpoints: Input should be a valid list"),
        ({"fabric": {"builtin": "nope"}}, "fabric.builtin: Input should be 'demo-4x2'"),
        ({"fabric": {**INLINE, "switches": [{"id": "ocs0", "ports": "many"}]}},
         "fabric.switches.0.ports: Input should be a valid integer"),
        ({"fabric": {**INLINE, "switches": [{"id": "ocs0", "ports": 4, "colour": "red"}]}},
         "fabric.switches.0.colour: Extra inputs are not permitted"),
        ({"fabric": {"builtin": "demo-4x2", "hosts": [{"name": "a", "gpus": 1}]}},
         "give one of builtin, rail or hosts/switches/wiring"),
        ([1, 2], "(top level): expected a mapping, got list"),
        ({"controller": {"admission_timeout_s": True}},
         "controller.admission_timeout_s: Input should be a valid number"),
        ({"controller": {"recovery_grace_s": float("inf")}},
         "controller.recovery_grace_s: Input should be a finite number"),
        ({"controller": {"metrics_listen": "0.0.0.0:99999"}},
         "expected HOST:PORT with a port in 0..65535, got '0.0.0.0:99999'"),
        # '²' passes str.isdigit() but int() refuses it: a ValueError, not a clear error
        ({"controller": {"metrics_listen": "127.0.0.1:\u00b2"}},
         "expected HOST:PORT with a port in 0..65535, got '127.0.0.1:\u00b2'"),
        ({"fabric": {"rail": {"hosts": 100000, "gpus_per_host": 64}}},
         "rail: more than 131072 GPUs"),
    ],
)
def test_bad_config_names_the_field(data: object, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "test.yaml")
    assert any(expected in p for p in info.value.problems), info.value.problems
    assert str(info.value).startswith("test.yaml: invalid configuration")


def test_inconsistent_wiring_names_the_endpoint() -> None:
    bad = {**INLINE, "wiring": [{**WIRING[0], "tx_port": 7}]}
    with pytest.raises(ConfigError, match=r"wiring\[a/nic0\].tx_port: 7 is not an ingress port"):
        parse_config({"fabric": bad})
    dup = {**INLINE, "wiring": [WIRING[0], {**WIRING[1], "tx_port": 1}]}
    with pytest.raises(ConfigError, match=r"port ocs0:1 already wired to a/nic0"):
        parse_config({"fabric": dup})


def test_files(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("controller:\n  replica_id: r1\nfabric:\n  builtin: rail-16x8\n")
    assert load_config(good).controller.replica_id == "r1"
    broken = tmp_path / "broken.yaml"
    broken.write_text("controller: [unclosed\n")
    with pytest.raises(ConfigError, match=r"\(yaml\)"):
        load_config(broken)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(binary)


def test_shipped_example_configs_are_valid() -> None:
    examples = sorted((Path(__file__).resolve().parents[2] / "deploy" / "examples").glob("*.yaml"))
    assert examples, "deploy/examples has no configs"
    for path in examples:
        fabric = build_fabric(load_config(path).fabric)
        assert fabric.switches, path


# --- driver options through `lightrail check-config` --------------------------------------------

DRIVER_OPTIONS: dict[str, dict[str, str | int | float | bool]] = {
    "tl1": {"host": "10.0.0.11", "port": 3082, "username": "admin", "password_env": "TL1_PW"},
    "restconf": {"host": "10.0.0.12", "username": "admin", "password": "pw"},
    "siph": {"host": "10.0.0.13", "port": 9999},
    "emulated": {},
}
"""Valid options of one switch per driver model (switch id ``sw-<model>``)."""


def _four_driver_config(
    tmp_path: Path, extra: dict[str, str | int | float | bool] | None = None
) -> Path:
    switches = [
        {"id": f"sw-{model}", "model": model, "ports": 8, "rail": 0,
         "options": {**options, **(extra or {})}}
        for model, options in DRIVER_OPTIONS.items()
    ]
    wiring = [
        {"host": "a", "nic": 0, "gpu": 0, "rail": 0, "switch": "sw-tl1", "tx_port": 1,
         "rx_port": 9},
        {"host": "b", "nic": 0, "gpu": 0, "rail": 0, "switch": "sw-tl1", "tx_port": 2,
         "rx_port": 10},
    ]
    fabric = {"name": "four", "hosts": [{"name": "a", "gpus": 1}, {"name": "b", "gpus": 1}],
              "switches": switches, "wiring": wiring}
    path = tmp_path / "four.yaml"
    path.write_text(yaml.safe_dump({"fabric": fabric}), encoding="utf-8")
    return path


def test_check_config_accepts_valid_options_of_every_driver(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", str(_four_driver_config(tmp_path))]) == 0
    assert "OK: fabric 'four'" in capsys.readouterr().out


def test_check_config_rejects_a_mistyped_option_of_every_driver(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``timout_s: 2`` (for ``timeout_s``) used to pass silently for TL1 and the emulator."""
    assert main(["check-config", str(_four_driver_config(tmp_path, {"timout_s": 2}))]) == 2
    err = capsys.readouterr().err
    for model in DRIVER_OPTIONS:
        assert f"switches[sw-{model}].options.timout_s (model '{model}'): unknown option" in err
    assert err.count("got 2") == len(DRIVER_OPTIONS)


def test_check_config_names_the_option_and_value_of_a_wrong_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", str(_four_driver_config(tmp_path, {"verify": "yes"}))]) == 2
    err = capsys.readouterr().err
    for model in ("tl1", "restconf"):
        assert f"switches[sw-{model}].options.verify (model '{model}'): " in err
    assert "valid boolean, got 'yes'" in err


def test_the_mixed_fabric_example_checks(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    example = Path(__file__).parents[2] / "deploy" / "examples" / "mixed-fabric.yaml"
    monkeypatch.setenv("POLATIS_USER", "admin")
    monkeypatch.setenv("POLATIS_PASSWORD", "example-only")
    assert main(["check-config", str(example)]) == 0
    monkeypatch.delenv("POLATIS_PASSWORD")
    assert main(["check-config", str(example)]) == 2
    err = capsys.readouterr().err
    assert "switches[ocs-restconf].options.password_env (model 'restconf'): environment " \
           "variable 'POLATIS_PASSWORD' is not set" in err
    assert "example-only" not in err
