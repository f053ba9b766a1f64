"""The interpreter ``make`` builds ``.venv`` with (Makefile, README "Two commands"): the
distribution's ``/usr/bin/python3`` when it is 3.11, whatever ``python3`` comes first on
``PATH``; ``PYTHON=...`` chooses another; the stamp names the interpreter, so that a ``.venv`` made
with another one is made again. Runs ``make -pn`` (prints make's variables, runs no recipe)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = Path("/usr/bin/python3")
_VAR = re.compile(r"^(PYTHON|PYTHON_REAL|STAMP) :?= (.*)$")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _system_python_usable() -> bool:
    if not SYSTEM_PYTHON.exists():
        return False
    check = "import sys, ensurepip, venv; raise SystemExit(sys.version_info[:2] != (3, 11))"
    ok = subprocess.run([str(SYSTEM_PYTHON), "-c", check], check=False, capture_output=True,
                        timeout=60)
    return ok.returncode == 0


def make_vars(*args: str, path_prefix: Path | None = None) -> dict[str, str]:
    """PYTHON, PYTHON_REAL and STAMP as ``make`` resolves them (``make -pn``), with neither
    the caller's ``PYTHON`` nor an enclosing make's flags in the environment."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHON", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env.get('PATH', '')}"
    out = subprocess.run(["make", "-pn", *args, "venv"], check=False, cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    found: dict[str, str] = {}
    for line in out.stdout.splitlines():
        m = _VAR.match(line)
        if m and m[1] not in found:
            found[m[1]] = m[2]
    assert {"PYTHON", "PYTHON_REAL", "STAMP"} <= found.keys(), out.stdout[-2000:] + out.stderr
    return found


def stamp_for(interpreter: str) -> str:
    return ".venv/.installed" + os.path.realpath(interpreter).replace("/", "-")


@pytest.mark.skipif(not _system_python_usable(),
                    reason="no /usr/bin/python3 3.11 with venv on this machine")
def test_the_distribution_python_wins_over_the_first_python3_on_path(tmp_path: Path) -> None:
    shadow = tmp_path / "python3"  # e.g. a pyenv shim first on PATH
    shadow.symlink_to(sys.executable)
    found = make_vars(path_prefix=tmp_path)
    assert found["PYTHON"] == str(SYSTEM_PYTHON)
    assert found["PYTHON_REAL"] == os.path.realpath(SYSTEM_PYTHON)
    assert found["STAMP"] == stamp_for(str(SYSTEM_PYTHON))


def test_python_given_on_the_command_line_is_used_and_named_by_the_stamp() -> None:
    found = make_vars(f"PYTHON={sys.executable}")
    assert found["PYTHON"] == sys.executable
    assert found["PYTHON_REAL"] == os.path.realpath(sys.executable)
    assert found["STAMP"] == stamp_for(sys.executable)


def test_an_interpreter_that_does_not_run_leaves_no_name_in_the_stamp(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-python"
    found = make_vars(f"PYTHON={missing}")
    assert found["PYTHON_REAL"] == ""
    assert found["STAMP"] == ".venv/.installed"  # the recipe then stops, naming PYTHON
