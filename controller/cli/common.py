"""Helpers shared by the `lightrail` command groups: defaults, argument types, consoles."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from rich.console import Console

DEFAULT_TARGET = os.environ.get("LIGHTRAIL_CONTROLLER", "127.0.0.1:50051")
CONTROLLER_HELP = ("controller HOST:PORT, or the replicas' addresses HOST:PORT,HOST:PORT,... "
                   "(tried in order; a standby redirects to the leader) "
                   "(default $LIGHTRAIL_CONTROLLER or 127.0.0.1:50051)")


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


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value
