"""``lightrail --help`` lists exactly the registered subcommands, each with its help line, and
the verbs issue 12 section 4 asks for are among them."""

from __future__ import annotations

import argparse
import io
import re
from contextlib import redirect_stdout

import pytest

from lightrail.controller.cli.main import build_parser, main

ISSUE12_VERBS = ("events", "alarms", "ports", "maintenance", "switch", "leader", "reload",
                 "uncordon", "completion")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each subcommand of ``parser`` and its help line, in registration order."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help or "" for a in action._choices_actions}
    return {name: helps.get(name, "") for name in action.choices}


def help_text(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "300")  # one line per subcommand
    buf = io.StringIO()
    with redirect_stdout(buf), pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    return buf.getvalue()


def test_help_lists_exactly_the_registered_subcommands(monkeypatch: pytest.MonkeyPatch) -> None:
    registered = subcommands(build_parser())
    text = help_text(["--help"], monkeypatch)
    listed = re.search(r"^usage: lightrail \[-h\] \[--version\] \{([^}]*)\}", text, re.M)
    assert listed is not None, text
    assert listed.group(1).split(",") == list(registered)
    for name, doc in registered.items():
        assert doc.strip(), f"{name} has no help line"
        assert re.search(rf"^    {re.escape(name)} +{re.escape(' '.join(doc.split()))}$",
                         text, re.M), name


ISSUE12_OPTIONS = (["drain", "host1", "--undo"], ["gpus", "--clear", "host1:0"],
                   ["events", "--follow", "--job", "j"], ["switch", "show", "s1", "--dot"],
                   ["ports", "--switch", "s1"])
"""Issue 12's verbs that are options of a verb (drain --undo, gpus --clear, events --follow
--job, switch show --dot, ports --switch)."""


def test_issue12_verbs_are_registered() -> None:
    registered = subcommands(build_parser())
    assert [v for v in ISSUE12_VERBS if v not in registered] == []
    for argv in ISSUE12_OPTIONS:
        build_parser().parse_args(argv)  # exits 2 (failing the test) when one is unknown


def test_every_nested_subcommand_and_option_has_help_and_a_help_page(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def walk(parser: argparse.ArgumentParser, path: list[str]) -> list[list[str]]:
        found: list[list[str]] = []
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, doc in subcommands(parser).items():
                    assert doc.strip(), f"{' '.join([*path, name])} has no help line"
                    found.append([*path, name])
                    assert [f"{' '.join([*path, name])} {o.option_strings or o.dest}"
                            for o in a.choices[name]._actions
                            if not o.help and not isinstance(o, argparse._HelpAction)] == []
                    found.extend(walk(a.choices[name], [*path, name]))
        return found

    paths = walk(build_parser(), [])
    assert ["completion"] in paths
    for path in paths:
        assert help_text([*path, "--help"], monkeypatch).startswith(
            f"usage: lightrail {' '.join(path)}")
