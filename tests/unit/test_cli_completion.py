"""``lightrail completion``: the scripts come from the real parser; the bash one is loaded into
a real bash and asked what completes (issue 12 section 4, shell completion)."""

from __future__ import annotations

import io
import shutil
import subprocess
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from lightrail.controller.cli.completion import command_tree, completion_script
from lightrail.controller.cli.main import build_parser, main

# one probe per line: the words typed (a trailing space: completing a new, empty word)
PROBES = (
    "lightrail ",
    "lightrail sw",
    "lightrail replay --fa",
    "lightrail replay --fabric ",
    "lightrail completion ",
    "lightrail circuits --switch status --j",
    "lightrail evaluate --out ",
    "lightrail status --controller sw",
)

DRIVER = r"""
source "$1"
while IFS= read -r line; do
    read -ra COMP_WORDS <<< "$line"
    [[ "$line" == *" " ]] && COMP_WORDS+=("")
    COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
    COMPREPLY=()
    _lightrail
    printf '%s\t%s\n' "$line" "${COMPREPLY[*]}"
done
"""


@pytest.fixture(scope="module")
def completions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """What the generated bash function offers for each of ``PROBES``, run in one bash."""
    bash = shutil.which("bash")
    assert bash is not None, "bash is needed to check the bash completion"
    folder = tmp_path_factory.mktemp("completion")
    script = folder / "lightrail.bash"
    script.write_text(completion_script(build_parser(), "bash"), encoding="utf-8")
    (folder / "outdir").mkdir()
    done = subprocess.run([bash, "--norc", "-c", DRIVER, "bash", str(script)],
                          input="\n".join(PROBES) + "\n", capture_output=True, text=True,
                          cwd=folder, timeout=30, check=True)
    assert done.stderr == ""
    out: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        probe, _, words = line.partition("\t")
        out[probe] = words.split()
    assert set(out) == set(PROBES)
    return out


def test_every_subcommand_completes_after_lightrail(completions: dict[str, list[str]]) -> None:
    names = [s.path[-1] for s in command_tree(build_parser()).subcommands]
    assert "completion" in names and "status" in names
    assert sorted(completions["lightrail "]) == sorted(names)


def test_a_prefix_offers_the_subcommands_it_starts(completions: dict[str, list[str]]) -> None:
    names = [s.path[-1] for s in command_tree(build_parser()).subcommands]
    expected = sorted(n for n in names if n.startswith("sw"))
    assert "switches" in expected
    assert sorted(completions["lightrail sw"]) == expected


def test_options_and_their_choices_complete(completions: dict[str, list[str]]) -> None:
    assert completions["lightrail replay --fa"] == ["--fabric"]
    assert completions["lightrail replay --fabric "] == ["demo-4x2", "rail-16x8"]
    assert completions["lightrail completion "] == ["bash", "zsh", "fish"]
    # the value of --switch ("status") is not taken for a subcommand
    assert sorted(completions["lightrail circuits --switch status --j"]) == ["--job", "--json"]
    # a path option completes file names; a free value (an address) completes nothing
    assert "outdir" in completions["lightrail evaluate --out "]
    assert completions["lightrail status --controller sw"] == []


def test_every_command_and_option_is_in_the_zsh_and_fish_scripts() -> None:
    parser = build_parser()
    tree = command_tree(parser)
    fish = completion_script(parser, "fish")
    zsh = completion_script(parser, "zsh")
    assert "bashcompinit" in zsh and "complete -o filenames -F _lightrail lightrail" in zsh
    for cmd in tree.walk()[1:]:
        assert f" -a {cmd.path[-1]} " in fish, cmd.path
        assert f"'{' '.join(cmd.path)}')" in zsh, cmd.path
        lines = [line for line in fish.splitlines()
                 if line.startswith(f"complete -c lightrail -n '__fish_seen_subcommand_from "
                                    f"{cmd.path[0]}")]
        for option in cmd.options:
            for flag in option.flags:
                word = f" -l {flag[2:]}" if flag.startswith("--") else f" -s {flag[1:]}"
                assert any(word + " " in line for line in lines), (cmd.path, flag)


def test_lightrail_completion_prints_the_script(tmp_path: Path) -> None:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["completion", "fish"]) == 0
    assert buf.getvalue() == completion_script(build_parser(), "fish")
    with pytest.raises(SystemExit) as exc:
        main(["completion", "tcsh"])
    assert exc.value.code == 2
    with pytest.raises(ValueError, match="shell: expected one of bash, zsh, fish, got 'tcsh'"):
        completion_script(build_parser(), "tcsh")
