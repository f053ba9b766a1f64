"""Helpers shared by the `lightrail` command groups: defaults, argument types, consoles."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from lightrail.agents.channel import ClientTls, ClientTlsError
from lightrail.controller.domain.fabric import (
    BUILTIN_FABRICS,
    MAX_RECONFIGURATION_DELAY_MS,
    FabricError,
    rail_shape,
)

CONTROLLER_ENV = "LIGHTRAIL_CONTROLLER"
CLI_CONFIG_ENV = "LIGHTRAIL_CLI_CONFIG"
BUILTIN_TARGET = "127.0.0.1:50051"


class _DefaultTarget(str):
    """The ``--controller`` default: a plain address string (what the option held before the
    config file existed), whose type tells ``controller_address`` that the option was not
    given."""

    __slots__ = ()


DEFAULT_TARGET: str = _DefaultTarget(os.environ.get(CONTROLLER_ENV) or BUILTIN_TARGET)
"""Default of ``--controller``: resolved by ``controller_address`` ($LIGHTRAIL_CONTROLLER, the
CLI config file, 127.0.0.1:50051); as a string, ``$LIGHTRAIL_CONTROLLER`` or 127.0.0.1:50051."""
CONTROLLER_HELP = ("controller HOST:PORT, or the replicas' addresses HOST:PORT,HOST:PORT,... "
                   "(tried in order; a standby redirects to the leader) "
                   "(default $LIGHTRAIL_CONTROLLER, else 'controller:' in the CLI config file "
                   "$LIGHTRAIL_CLI_CONFIG or ~/.config/lightrail/cli.yaml, else 127.0.0.1:50051)")
AGENT_CONTROLLER_HELP = ("controller HOST:PORT, or the replicas' addresses "
                         "HOST:PORT,HOST:PORT,... (tried in order; a standby redirects to the "
                         "leader) (default $LIGHTRAIL_CONTROLLER or 127.0.0.1:50051)")


def cli_config_path() -> Path:
    """The operator CLI's config file: ``$LIGHTRAIL_CLI_CONFIG``, else
    ``$XDG_CONFIG_HOME/lightrail/cli.yaml``, else ``~/.config/lightrail/cli.yaml`` (the XDG
    base directory rule kubectl-like tools follow)."""
    given = os.environ.get(CLI_CONFIG_ENV)
    if given:
        return Path(given)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "lightrail" / "cli.yaml"


CLI_CONFIG_KEYS = ("controller",)
"""What the CLI config file may hold: ``controller: HOST:PORT[,HOST:PORT...]``."""


@dataclass(frozen=True, slots=True)
class ControllerAddress:
    """Where an operator command connects: ``address`` (``HOST:PORT[,HOST:PORT...]``) and
    ``source``, where it came from (``--controller``, ``$LIGHTRAIL_CONTROLLER``, the config
    file's path, or ``the default``), for error messages."""

    address: str
    source: str


def read_cli_config(path: Path) -> dict[str, str]:
    """The settings of the CLI config file at ``path`` (keys of ``CLI_CONFIG_KEYS``); empty
    when the file does not exist. Raises ``CliUsageError`` naming the file and the key or value
    that cannot be used (unreadable, not YAML, not a mapping, an unknown key, a value that is
    not a non-empty string)."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise CliUsageError(f"CLI config {path}: cannot read it: {reason or exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CliUsageError(f"CLI config {path}: not YAML: {exc}".splitlines()[0]) from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise CliUsageError(f"CLI config {path}: expected a mapping of "
                            f"{', '.join(CLI_CONFIG_KEYS)}, got {type(doc).__name__}")
    out: dict[str, str] = {}
    for key, value in doc.items():
        if key not in CLI_CONFIG_KEYS:
            raise CliUsageError(f"CLI config {path}: unknown key {key!r} (known: "
                                f"{', '.join(CLI_CONFIG_KEYS)})")
        if not isinstance(value, str) or not value.strip():
            raise CliUsageError(f"CLI config {path}: {key}: expected HOST:PORT or "
                                f"HOST:PORT,HOST:PORT,..., got {value!r}")
        out[key] = value.strip()
    return out


def controller_address(given: str | None) -> ControllerAddress:
    """The controller address of an operator command whose ``--controller`` holds ``given``:
    the option when given on the command line, else ``$LIGHTRAIL_CONTROLLER``, else
    ``controller:`` of the CLI config file (``cli_config_path``), else 127.0.0.1:50051. Raises
    ``CliUsageError`` for a config file that cannot be used."""
    if given is not None and not isinstance(given, _DefaultTarget):
        return ControllerAddress(given, "--controller")
    env = os.environ.get(CONTROLLER_ENV)
    if env:
        return ControllerAddress(env, f"${CONTROLLER_ENV}")
    path = cli_config_path()
    configured = read_cli_config(path).get("controller")
    if configured is not None:
        return ControllerAddress(configured, f"'controller:' in {path}")
    return ControllerAddress(BUILTIN_TARGET, "the default")


def address_hint(where: ControllerAddress) -> str:
    """What a connection error adds after the address: where it came from and how to set it."""
    return (f"(address from {where.source}; set it with --controller, ${CONTROLLER_ENV} or "
            f"'controller:' in {cli_config_path()})")


REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    """Where the recorded traces live: ``$LIGHTRAIL_DATA`` or ``../shared/data`` beside the
    repository."""
    env = os.environ.get("LIGHTRAIL_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


DLRM_TRACE = "traces/param-dlrm-8rank/dlrm_kineto.tar.gz"


def make_console(stderr: bool = False) -> Console:
    """A console that does not wrap tables at 80 columns when output is not a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 120)


def run_async(coro: Coroutine[Any, Any, int]) -> int:
    import uvloop

    return uvloop.run(coro)


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def delay_ms(text: str) -> float:
    """argparse type: a reconfiguration delay in ms, finite, 0..``MAX_RECONFIGURATION_DELAY_MS``
    (the config's bound on ``reconfiguration_delay_ms``)."""
    value = non_negative_float(text)
    if value > MAX_RECONFIGURATION_DELAY_MS:
        raise argparse.ArgumentTypeError(
            f"must be <= {MAX_RECONFIGURATION_DELAY_MS:g} ms (MAX_RECONFIGURATION_DELAY_MS), "
            f"got {text}")
    return value


class CliUsageError(ValueError):
    """A command-line option cannot be used; the message names it (never a secret's value)."""


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """``--tls-ca``, ``--tls-cert``, ``--tls-key``: TLS to the controller (README "Security");
    defaults from ``$LIGHTRAIL_TLS_CA``, ``$LIGHTRAIL_TLS_CERT``, ``$LIGHTRAIL_TLS_KEY``."""
    parser.add_argument("--tls-ca", default=os.environ.get("LIGHTRAIL_TLS_CA") or None,
                        metavar="PEM",
                        help="CA that signed the controller's certificate: connect over TLS "
                             "(default $LIGHTRAIL_TLS_CA; none: plaintext, unless --tls-cert "
                             "is given: then the system's trusted roots)")
    parser.add_argument("--tls-cert", default=os.environ.get("LIGHTRAIL_TLS_CERT") or None,
                        metavar="PEM",
                        help="client certificate, for a controller that requires one "
                             "(controller.tls.client_ca_file) (default $LIGHTRAIL_TLS_CERT)")
    parser.add_argument("--tls-key", default=os.environ.get("LIGHTRAIL_TLS_KEY") or None,
                        metavar="PEM",
                        help="private key of --tls-cert (default $LIGHTRAIL_TLS_KEY)")


def client_tls(args: argparse.Namespace) -> ClientTls | None:
    """The ``ClientTls`` of ``add_tls_arguments``' options, None when none is given
    (plaintext). Raises ``CliUsageError`` naming the option of a file that cannot be used."""
    if args.tls_ca is None and args.tls_cert is None and args.tls_key is None:
        return None
    try:
        return ClientTls.from_files(args.tls_ca, args.tls_cert, args.tls_key)
    except ClientTlsError as exc:
        raise CliUsageError(str(exc)) from None


TOKEN_ENV = "LIGHTRAIL_TOKEN"


def add_token_arguments(parser: argparse.ArgumentParser) -> None:
    """``--token`` and ``--token-file``: the operator's bearer token for mutating calls (default
    ``$LIGHTRAIL_TOKEN``)."""
    parser.add_argument("--token", default=None,
                        help="operator bearer token (visible to other users in the process "
                             "list: prefer --token-file or $LIGHTRAIL_TOKEN)")
    parser.add_argument("--token-file", default=None, metavar="PATH",
                        help="file holding the operator bearer token (one line)")


def operator_token(args: argparse.Namespace) -> str | None:
    """The bearer token of ``add_token_arguments``' options: ``--token-file``, else
    ``--token``, else ``$LIGHTRAIL_TOKEN``; None when none is given. Raises ``CliUsageError``
    naming the file when it cannot be read or is empty (never its content)."""
    if args.token_file is not None:
        try:
            token = Path(args.token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise CliUsageError(f"--token-file: cannot read {args.token_file!r}: "
                                f"{reason or exc}") from None
        if not token:
            raise CliUsageError(f"--token-file: {args.token_file!r} is empty")
        return token
    given: str | None = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    return (given.strip() or None) if given is not None else None


class FabricChoices(tuple[str, ...]):
    """``--fabric``'s choices: the built-in names (what completion offers), and every valid
    ``rail:HOSTSxGPUS`` (``fabric_option`` has checked the value by then)."""

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, str):
            return False
        try:
            rail_shape(value)
        except FabricError:
            return False
        return True


def fabric_option(text: str) -> str:
    """argparse type of ``--fabric``: a built-in fabric name or ``rail:HOSTSxGPUS`` (e.g.
    ``rail:1152x8``), returned as given. Raises ``argparse.ArgumentTypeError`` naming the value
    and what is wrong (argparse adds the option: ``argument --fabric: ...``)."""
    try:
        rail_shape(text)
    except FabricError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def fabric_choices() -> FabricChoices:
    """``--fabric``'s ``choices`` (``replay``, ``evaluate``)."""
    return FabricChoices(BUILTIN_FABRICS)
