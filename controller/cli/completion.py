"""`lightrail completion bash|zsh|fish`: a shell completion script generated from the real
argument parser, so every subcommand, option and choice the parser knows completes.

The parser is read once into a neutral tree (:func:`command_tree`: commands, their options,
which options take a value, their choices, which values are paths) and rendered per shell:

* bash: one function ``_lightrail`` registered with ``complete -F``; it walks ``COMP_WORDS``
  down the subcommands (skipping option values) and offers the subcommands, options or
  choices of where the cursor is, and file names where a path goes.
* zsh: the bash script under zsh's ``bashcompinit`` (zsh's own emulation of bash's
  ``complete``/``compgen``), so both shells complete alike.
* fish: ``complete -c lightrail`` lines with each command's and option's help as description.

Why generated here and not by a library (December 2026): shtab 1.13 writes bash and zsh but no
fish (its fish issue #134 has been open since 2024); argcomplete 3.7 runs the Python program on
every TAB, and ``lightrail`` imports gRPC and rich before it can answer. The scripts here are
static: a TAB costs the shell only. The bash function's variables avoid the names zsh treats
specially (``path`` is tied to ``$PATH``, ``words`` holds zsh's completion words), so the same
body runs under ``bashcompinit``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

SHELLS = ("bash", "zsh", "fish")

PATH_METAVARS = frozenset({"PATH", "PEM", "FILE", "DIR"})
PATH_DESTS = frozenset({"config", "trace", "workload", "out", "socket", "nccl_socket",
                        "write_config", "logs"})
"""Arguments whose value is a file or directory name (completed with file names): those with
one of ``PATH_METAVARS`` as metavar or one of ``PATH_DESTS`` as destination."""


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One option of a command. ``flags``: its option strings (``-h``, ``--help``);
    ``takes_value``: whether the next word is its value; ``choices``: the values it accepts
    (empty: any); ``path``: its value is a file name; ``help``: one line."""

    flags: tuple[str, ...]
    takes_value: bool
    choices: tuple[str, ...]
    path: bool
    help: str


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """One command: ``path`` from the root (``()`` for ``lightrail`` itself, ``("switch",
    "show")`` for a nested one), its ``help`` line, ``options``, ``subcommands`` (in the
    parser's order), ``positional_choices`` (the fixed values its positionals take) and
    ``positional_path`` (a positional takes a file name)."""

    path: tuple[str, ...]
    help: str
    options: tuple[OptionSpec, ...]
    subcommands: tuple[CommandSpec, ...]
    positional_choices: tuple[str, ...]
    positional_path: bool

    def walk(self) -> list[CommandSpec]:
        """This command and every command below it, depth first in the parser's order."""
        out = [self]
        for sub in self.subcommands:
            out.extend(sub.walk())
        return out


def _one_line(text: str | None) -> str:
    if not text or text == argparse.SUPPRESS:
        return ""
    line = " ".join(text.split()).replace("%%", "%")
    return re.sub(r"%\(\w+\)s", "", line)


def _is_path(action: argparse.Action) -> bool:
    return action.metavar in PATH_METAVARS or action.dest in PATH_DESTS


def command_tree(parser: argparse.ArgumentParser, path: tuple[str, ...] = (),
                 help_line: str = "") -> CommandSpec:
    """The completion tree of ``parser`` (the ``lightrail`` parser of ``main.build_parser``,
    or any argparse parser): every subparser, option and choice; suppressed options are left
    out."""
    options: list[OptionSpec] = []
    subcommands: list[CommandSpec] = []
    choices: list[str] = []
    positional_path = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: _one_line(a.help) for a in action._choices_actions}
            for name, sub in action.choices.items():
                subcommands.append(command_tree(sub, (*path, name), helps.get(name, "")))
        elif action.option_strings:
            if action.help == argparse.SUPPRESS:
                continue
            options.append(OptionSpec(
                flags=tuple(action.option_strings), takes_value=action.nargs != 0,
                choices=tuple(str(c) for c in action.choices or ()),
                path=_is_path(action), help=_one_line(action.help)))
        elif action.choices:
            choices.extend(str(c) for c in action.choices)
        else:
            positional_path = positional_path or _is_path(action)
    return CommandSpec(path, help_line or _one_line(parser.description), tuple(options),
                       tuple(subcommands), tuple(choices), positional_path)


# --- bash -----------------------------------------------------------------------------------


def _key(path: tuple[str, ...]) -> str:
    return " ".join(path)


def _bash_case(name: str, rows: list[tuple[str, str]]) -> str:
    """A bash function ``name KEY`` setting ``REPLY`` to the words of ``KEY``."""
    lines = [f"{name}() {{", '    case "$1" in']
    lines += [f"        {_bash_quote(key)}) REPLY={_bash_quote(words)} ;;"
              for key, words in rows if words]
    lines += ["        *) REPLY='' ;;", "    esac", "}"]
    return "\n".join(lines)


def _bash_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def bash_script(tree: CommandSpec, prog: str = "lightrail") -> str:
    """The bash completion script of ``tree``: ``source`` it, or put it in
    ``~/.local/share/bash-completion/completions/lightrail``."""
    cmds = tree.walk()
    fn = "_" + re.sub(r"\W", "_", prog)
    subs = [(_key(c.path), " ".join(s.path[-1] for s in c.subcommands)) for c in cmds]
    opts = [(_key(c.path), " ".join(f for o in c.options for f in o.flags)) for c in cmds]
    valued = [(_key(c.path), " ".join(f for o in c.options if o.takes_value for f in o.flags))
              for c in cmds]
    values = [(f"{_key(c.path)}|{f}", " ".join(o.choices) if o.choices else "@path")
              for c in cmds for o in c.options if o.takes_value and (o.choices or o.path)
              for f in o.flags]
    positional = [(_key(c.path), " ".join(c.positional_choices)) for c in cmds]
    path_positional = [(_key(c.path), "1") for c in cmds if c.positional_path]
    body = f"""\
# bash completion for {prog}; generated by `{prog} completion bash` from its parser.
{_bash_case(fn + "_subcommands", subs)}
{_bash_case(fn + "_options", opts)}
{_bash_case(fn + "_valued", valued)}
{_bash_case(fn + "_values", values)}
{_bash_case(fn + "_positional", positional)}
{_bash_case(fn + "_positional_path", path_positional)}
{fn}_has() {{
    local w
    for w in $2; do [[ "$w" == "$1" ]] && return 0; done
    return 1
}}
{fn}() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" cmd="" i w REPLY
    COMPREPLY=()
    for (( i = 1; i < COMP_CWORD; i++ )); do
        w="${{COMP_WORDS[i]}}"
        if [[ "$w" == -* ]]; then
            {fn}_valued "$cmd"
            [[ "$w" != *=* ]] && {fn}_has "$w" "$REPLY" && (( i++ ))
            continue
        fi
        {fn}_subcommands "$cmd"
        {fn}_has "$w" "$REPLY" && cmd="${{cmd:+$cmd }}$w"
    done
    local prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    if (( COMP_CWORD > 1 )) && [[ "$prev" == -* ]]; then
        {fn}_valued "$cmd"
        if {fn}_has "$prev" "$REPLY"; then
            {fn}_values "$cmd|$prev"
            if [[ "$REPLY" == "@path" ]]; then
                COMPREPLY=( $(compgen -f -- "$cur") )
            elif [[ -n "$REPLY" ]]; then
                COMPREPLY=( $(compgen -W "$REPLY" -- "$cur") )
            fi
            return 0
        fi
    fi
    if [[ "$cur" == -* ]]; then
        {fn}_options "$cmd"
        COMPREPLY=( $(compgen -W "$REPLY" -- "$cur") )
        return 0
    fi
    local offer
    {fn}_subcommands "$cmd"; offer="$REPLY"
    {fn}_positional "$cmd"; offer="$offer $REPLY"
    COMPREPLY=( $(compgen -W "$offer" -- "$cur") )
    {fn}_positional_path "$cmd"
    [[ -n "$REPLY" ]] && COMPREPLY+=( $(compgen -f -- "$cur") )
    return 0
}}
complete -o filenames -F {fn} {prog}
"""
    return body


def zsh_script(tree: CommandSpec, prog: str = "lightrail") -> str:
    """The zsh completion script of ``tree``: the bash script under zsh's ``bashcompinit``
    (``source`` it from ``~/.zshrc`` after ``compinit``)."""
    return (f"# zsh completion for {prog}; generated by `{prog} completion zsh` from its parser:\n"
            "# the bash completion under zsh's bash emulation (bashcompinit).\n"
            "autoload -U +X compinit && { (( $+functions[compdef] )) || compinit }\n"
            "autoload -U +X bashcompinit && bashcompinit\n"
            + bash_script(tree, prog).split("\n", 1)[1])


# --- fish -----------------------------------------------------------------------------------


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def fish_script(tree: CommandSpec, prog: str = "lightrail") -> str:
    """The fish completion script of ``tree``: put it in
    ``~/.config/fish/completions/lightrail.fish``."""
    lines = [f"# fish completion for {prog}; generated by `{prog} completion fish` from its "
             "parser.", f"complete -c {prog} -f"]
    for cmd in tree.walk():
        cond = (" ; and ".join(f"__fish_seen_subcommand_from {w}" for w in cmd.path)
                if cmd.path else "__fish_use_subcommand")
        below = [s.path[-1] for s in cmd.subcommands]
        sub_cond = cond if not cmd.path or not below else (
            f"{cond} ; and not __fish_seen_subcommand_from {' '.join(below)}")
        for sub in cmd.subcommands:
            lines.append(f"complete -c {prog} -n {_fish_quote(sub_cond)} -a {sub.path[-1]} "
                         f"-d {_fish_quote(sub.help[:80])}")
        if cmd.positional_choices:
            lines.append(f"complete -c {prog} -n {_fish_quote(sub_cond)} -a "
                         f"{_fish_quote(' '.join(cmd.positional_choices))}")
        if cmd.positional_path:
            lines.append(f"complete -c {prog} -n {_fish_quote(sub_cond)} -F")
        for o in cmd.options:
            flags = " ".join(f"-l {f[2:]}" if f.startswith("--") else f"-s {f[1:]}"
                             for f in o.flags)
            value = ""
            if o.takes_value:
                value = (f" -x -a {_fish_quote(' '.join(o.choices))}" if o.choices
                         else " -r -F" if o.path else " -x")
            lines.append(f"complete -c {prog} -n {_fish_quote(sub_cond)} {flags}{value} "
                         f"-d {_fish_quote(o.help[:80])}")
    return "\n".join(lines) + "\n"


RENDERERS: dict[str, Callable[[CommandSpec, str], str]] = {
    "bash": bash_script, "zsh": zsh_script, "fish": fish_script}


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser`` for ``shell`` (one of ``SHELLS``). Raises
    ``ValueError`` naming an unknown shell."""
    if shell not in RENDERERS:
        raise ValueError(f"shell: expected one of {', '.join(SHELLS)}, got {shell!r}")
    return RENDERERS[shell](command_tree(parser), parser.prog)


def add_parsers(subcommands: argparse._SubParsersAction[argparse.ArgumentParser],
                root: argparse.ArgumentParser) -> None:
    """Register ``lightrail completion SHELL``, printing the script of ``root`` (the whole
    ``lightrail`` parser, complete once every group has registered)."""
    c = subcommands.add_parser(
        "completion", help="print a shell completion script (bash, zsh or fish)",
        description="Print the completion script of SHELL, generated from this command's "
                    "parser. bash: lightrail completion bash > "
                    "~/.local/share/bash-completion/completions/lightrail; zsh: "
                    "lightrail completion zsh > ~/.zfunc/lightrail.zsh and source it from "
                    "~/.zshrc; fish: lightrail completion fish > "
                    "~/.config/fish/completions/lightrail.fish")
    c.add_argument("shell", choices=SHELLS, help="the shell to complete in")

    def cmd_completion(args: argparse.Namespace) -> int:
        sys.stdout.write(completion_script(root, args.shell))
        return 0

    c.set_defaults(func=cmd_completion)
