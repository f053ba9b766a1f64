"""Where an operator command finds the controller (controller/cli/common.py
``controller_address``): --controller, else $LIGHTRAIL_CONTROLLER, else ``controller:`` in the
CLI config file, else 127.0.0.1:50051; a connection error names the address and where it came
from (issue 12 section 4)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lightrail.controller.cli.common import (
    DEFAULT_TARGET,
    CliUsageError,
    cli_config_path,
    controller_address,
)
from lightrail.controller.cli.main import build_parser

ENTRY = "import sys; from lightrail.controller.cli.main import main; sys.exit(main())"


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No $LIGHTRAIL_CONTROLLER; the CLI config file is ``tmp_path/cli.yaml`` (absent)."""
    monkeypatch.delenv("LIGHTRAIL_CONTROLLER", raising=False)
    path = tmp_path / "cli.yaml"
    monkeypatch.setenv("LIGHTRAIL_CLI_CONFIG", str(path))
    return path


def test_the_option_wins_then_the_environment_then_the_file(
        no_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given = build_parser().parse_args(["status"]).controller
    assert given is DEFAULT_TARGET  # the option's default tells "not given"
    assert controller_address(given).address == "127.0.0.1:50051"
    assert controller_address(given).source == "the default"
    no_env.write_text("controller: a:1,b:2\n", encoding="utf-8")
    where = controller_address(given)
    assert (where.address, where.source) == ("a:1,b:2", f"'controller:' in {no_env}")
    monkeypatch.setenv("LIGHTRAIL_CONTROLLER", "env:3")
    assert controller_address(given).address == "env:3"
    assert controller_address(given).source == "$LIGHTRAIL_CONTROLLER"
    explicit = build_parser().parse_args(["status", "--controller", "cli:4"]).controller
    assert controller_address(explicit).address == "cli:4"
    assert controller_address(explicit).source == "--controller"


def test_the_default_file_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LIGHTRAIL_CLI_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert cli_config_path() == tmp_path / "lightrail" / "cli.yaml"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert cli_config_path() == Path.home() / ".config" / "lightrail" / "cli.yaml"


@pytest.mark.parametrize(("text", "message"), [
    ("controller: [a, b]\n", "controller: expected HOST:PORT or HOST:PORT,HOST:PORT,..., "
                             "got ['a', 'b']"),
    ("controler: a:1\n", "unknown key 'controler' (known: controller)"),
    ("- a:1\n", "expected a mapping of controller, got list"),
    ("controller: [\n", "not YAML"),
    ("controller: ''\n", "controller: expected HOST:PORT"),
])
def test_a_bad_config_file_is_named_with_the_key_and_value(
        no_env: Path, text: str, message: str) -> None:
    no_env.write_text(text, encoding="utf-8")
    with pytest.raises(CliUsageError) as exc:
        controller_address(DEFAULT_TARGET)
    assert str(exc.value).startswith(f"CLI config {no_env}: ") and message in str(exc.value)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lightrail(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "LIGHTRAIL_CONTROLLER"}
    return subprocess.run([sys.executable, "-c", ENTRY, *args], capture_output=True, text=True,
                          env={**base, **env}, timeout=60, check=False)


def test_status_without_controller_names_the_address_and_the_file(tmp_path: Path) -> None:
    port = closed_port()
    config = tmp_path / "cli.yaml"
    config.write_text(f"controller: 127.0.0.1:{port}\n", encoding="utf-8")
    for verb in ("status", "events", "alarms"):  # events/alarms: their own stream code
        done = lightrail({"LIGHTRAIL_CLI_CONFIG": str(config)}, verb)
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"lightrail {verb}: "), done.stderr
        assert f"127.0.0.1:{port}" in lines[0]
        assert f"address from 'controller:' in {config}" in lines[0]
        assert "--controller, $LIGHTRAIL_CONTROLLER" in lines[0]
    config.write_text("controller: 5\n", encoding="utf-8")
    done = lightrail({"LIGHTRAIL_CLI_CONFIG": str(config)}, "status")
    assert done.returncode == 2
    assert done.stderr.strip() == (f"lightrail status: CLI config {config}: controller: "
                                   "expected HOST:PORT or HOST:PORT,HOST:PORT,..., got 5")
    env_port = closed_port()
    done = lightrail({"LIGHTRAIL_CLI_CONFIG": str(config),
                      "LIGHTRAIL_CONTROLLER": f"127.0.0.1:{env_port}"}, "switches")
    assert done.returncode == 1
    assert f"127.0.0.1:{env_port}" in done.stderr
    assert "address from $LIGHTRAIL_CONTROLLER" in done.stderr
