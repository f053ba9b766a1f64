"""Config reload rules (``lightrail.controller.reload``), on a real config file: the reloadable
settings applied all at once (coordinator, operator check, logging), a bad file or a setting
that needs a restart refused with nothing changed, the field named, no credential shown;
metrics and the CONFIG_RELOAD fabric event of each outcome."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

from lightrail.controller.api.auth import OperatorAuth, token_sha256
from lightrail.controller.config import load_config
from lightrail.controller.core.coordinator import PhaseCoordinator
from lightrail.controller.domain.events import FabricEvent, FabricEventKind
from lightrail.controller.domain.fabric import BUILTIN_FABRICS
from lightrail.controller.reload import RELOADABLE, ConfigReloader, changed_paths
from lightrail.controller.runtime import metrics
from lightrail.controller.runtime.events import EventBus

BASE: dict[str, Any] = {
    "controller": {"replica_id": "r1", "admission_timeout_s": 30},
    "fabric": {"builtin": "demo-4x2"},
    "logging": {"level": "info", "format": "json"},
}
TOKEN = "reload-test-token"


def write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def write(path: Path, data: dict[str, Any]) -> None:
    write_text(path, yaml.safe_dump(data))


def with_(section: str, **values: Any) -> dict[str, Any]:
    data = {k: dict(v) for k, v in BASE.items()}
    data[section] = {**data.get(section, {}), **values}
    return data


def failures(reason: str) -> float:
    value = metrics.REGISTRY.get_sample_value("lightrail_config_reload_failures_total",
                                              {"reason": reason})
    return value or 0.0


def successful() -> float | None:
    return metrics.REGISTRY.get_sample_value("lightrail_config_last_reload_successful")


class Running:
    """A reloader attached as in a leading replica: coordinator, operator check, event bus;
    the fabric events it published."""

    def __init__(self, path: Path) -> None:
        self.reloader = ConfigReloader(path, load_config(path))
        self.coordinator = PhaseCoordinator(BUILTIN_FABRICS["demo-4x2"](0.0),
                                            default_timeout_s=30.0)
        self.auth = OperatorAuth(())
        self.bus = EventBus()
        self.events: list[FabricEvent] = []
        self.reloader.attach_auth(self.auth)
        self.reloader.lead(self.coordinator, self.bus)

    async def reload(self) -> tuple[Any, FabricEvent]:
        stream = self.bus.subscribe_all()
        first = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)  # the subscription is in place
        outcome = await self.reloader.reload("test")
        event = await asyncio.wait_for(first, 5.0)
        await stream.aclose()
        assert isinstance(event, FabricEvent)
        return outcome, event


@pytest.fixture
def cfg_path(tmp_path: Path) -> Path:
    path = tmp_path / "controller.yaml"
    write(path, BASE)
    return path


async def test_reloadable_settings_apply_at_once(cfg_path: Path) -> None:
    saved = structlog.get_config()
    run = Running(cfg_path)
    write(cfg_path, {**with_("controller", admission_timeout_s=7.5, operators=[
        {"name": "oncall", "token_sha256": token_sha256(TOKEN)}]),
        "logging": {"level": "debug", "format": "console"}})
    try:
        outcome, event = await run.reload()
        assert outcome.applied and outcome.error is None
        assert outcome.changed == ("controller.admission_timeout_s", "controller.operators",
                                   "logging.format", "logging.level")
        assert run.coordinator.default_timeout_s == 7.5
        assert [o.name for o in run.auth.operators] == ["oncall"]
        assert structlog.get_config()["wrapper_class"].__name__.endswith("AtDebug")
        assert event.kind is FabricEventKind.CONFIG_RELOAD
        assert event.fields["applied"] == "true"
        assert event.fields["changed"].split(",") == list(outcome.changed)
        assert successful() == 1
        # the same file again: applied, nothing changed
        again, _ = await run.reload()
        assert again.applied and again.changed == ()
    finally:
        structlog.configure(**saved)  # the process's log set-up as it was


async def test_invalid_file_keeps_the_running_configuration(cfg_path: Path) -> None:
    run = Running(cfg_path)
    before = failures("invalid")
    write(cfg_path, with_("controller", admission_timeout_s=-1))
    outcome, event = await run.reload()
    assert not outcome.applied
    assert outcome.error is not None
    assert "controller.admission_timeout_s" in outcome.error and "-1" in outcome.error
    assert run.coordinator.default_timeout_s == 30.0
    assert run.reloader.current.controller.admission_timeout_s == 30.0
    assert failures("invalid") == before + 1
    assert successful() == 0
    assert event.fields["applied"] == "false"
    assert "controller.admission_timeout_s" in event.message
    write_text(cfg_path, "controller: [unclosed\n")
    outcome, _ = await run.reload()
    assert not outcome.applied and outcome.error is not None and "(yaml)" in outcome.error


async def test_a_setting_that_needs_a_restart_is_refused_whole(cfg_path: Path) -> None:
    run = Running(cfg_path)
    before = failures("needs_restart")
    write(cfg_path, with_("controller", listen="127.0.0.1:50099", admission_timeout_s=5))
    outcome, _ = await run.reload()
    assert not outcome.applied
    assert outcome.error is not None
    assert "controller.listen: '127.0.0.1:50051' -> '127.0.0.1:50099'" in outcome.error
    assert "needs a restart" in outcome.error
    assert "controller.admission_timeout_s" not in outcome.error.split("(a reload")[0]
    assert run.coordinator.default_timeout_s == 30.0  # the reloadable part is not applied
    assert failures("needs_restart") == before + 1


async def test_a_credential_in_a_refused_change_is_not_shown(cfg_path: Path) -> None:
    switch: dict[str, Any] = {"id": "s", "ports": 4, "options": {"password": "old-secret"}}
    inline = {"name": "f", "hosts": [{"name": "h", "gpus": 1}], "switches": [switch],
              "wiring": [{"host": "h", "nic": 0, "gpu": 0, "rail": 0, "switch": "s",
                          "tx_port": 1, "rx_port": 5}]}
    write(cfg_path, {**BASE, "fabric": inline})
    run = Running(cfg_path)
    switch["options"] = {"password": "new-secret"}
    write(cfg_path, {**BASE, "fabric": inline})
    outcome, event = await run.reload()
    assert not outcome.applied and outcome.error is not None
    assert "fabric.switches" in outcome.error
    for text in (outcome.error, event.message, *event.fields.values()):
        assert "old-secret" not in text and "new-secret" not in text


def test_changed_paths_compare_leaves() -> None:
    a = load_config(None)
    assert changed_paths(a, a) == []
    b = a.model_copy(update={"logging": a.logging.model_copy(update={"level": "error"})})
    assert changed_paths(a, b) == ["logging.level"]
    assert "logging.level" in RELOADABLE


def test_advertise_option_is_validated_like_the_config_field() -> None:
    from lightrail.controller.cli.daemons import _with_advertise
    from lightrail.controller.config import ConfigError

    cfg = load_config(None)
    assert _with_advertise(cfg, None, None) is cfg
    assert _with_advertise(cfg, "10.0.0.7:50051", None).controller.advertise == "10.0.0.7:50051"
    with pytest.raises(ConfigError, match=r"controller\.advertise.*0\.0\.0\.0:50051"):
        _with_advertise(cfg, "0.0.0.0:50051", None)


def test_the_operator_check_takes_the_operators_of_the_current_config(cfg_path: Path) -> None:
    write(cfg_path, with_("controller", operators=[
        {"name": "oncall", "token_sha256": token_sha256(TOKEN)}]))
    reloader = ConfigReloader(cfg_path, load_config(cfg_path))
    auth = OperatorAuth(())
    reloader.attach_auth(auth)
    assert [o.name for o in auth.operators] == ["oncall"]
