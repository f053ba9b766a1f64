"""bench/hot_path.py's command line: every bad value refused before anything starts, naming
the option and the value (``--instances FILE`` too, when the file cannot be written; a write
that fails later loses no cell's figures); the other benchmark scripts' checks alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import hot_path  # noqa: E402


def test_an_unwritable_instances_file_is_refused_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-dir" / "instances.jsonl"
    with pytest.raises(SystemExit) as exit_info:
        hot_path.parse_args(["--instances", str(missing), "--generator", "python"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--instances" in err and str(missing) in err


def test_a_failed_append_is_reported_and_a_good_one_is_a_json_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "instances.jsonl"
    assert hot_path.append_instances(good, {"n": 8, "instances": []})
    assert hot_path.append_instances(good, {"n": 64, "instances": []})
    assert good.read_text(encoding="utf-8").splitlines() == [
        '{"n": 8, "instances": []}', '{"n": 64, "instances": []}']
    assert not hot_path.append_instances(tmp_path, {"n": 8})  # a directory: not writable
    err = capsys.readouterr().err
    assert "--instances: could not append to" in err and str(tmp_path) in err


def test_the_controller_wrapper_is_split_as_a_shell_would() -> None:
    opts = hot_path.parse_args(["--generator", "python", "--controller-wrapper",
                                "valgrind --tool=callgrind '--callgrind-out-file=a b.%p'",
                                "--controller-timeout-s", "600"])
    assert opts.controller_wrapper == ("valgrind", "--tool=callgrind",
                                       "--callgrind-out-file=a b.%p")
    assert opts.controller_timeout_s == 600.0
    default = hot_path.parse_args(["--generator", "python"])
    assert (default.controller_wrapper, default.controller_timeout_s) == ((), 30.0)


@pytest.mark.parametrize(("args", "says"), [
    (["--controller-wrapper", ""], "--controller-wrapper: empty command"),
    (["--controller-wrapper", "no-such-tool-xyz --flag"],
     "--controller-wrapper: 'no-such-tool-xyz' is not an executable on PATH"),
    (["--controller-wrapper", "valgrind '--unclosed"], "--controller-wrapper: cannot split"),
    (["--controller-timeout-s", "0"],
     "argument --controller-timeout-s: must be a number > 0, got 0"),
    (["--n", "3"], "argument --n: must be an integer >= 4, got 3"),
    (["--n", "8", "abc"], "argument --n: must be an integer >= 4, got 'abc'"),
    (["--repeat", "0"], "argument --repeat: must be an integer >= 1, got 0"),
    (["--delay-ms", "-5"], "argument --delay-ms: must be a number >= 0, got -5"),
    (["--delay-ms", "nan"], "argument --delay-ms: must be a number >= 0, got nan"),
    (["--measured", "0"], "argument --measured: must be an integer >= 1, got 0"),
    (["--max-measured-s", "0"], "argument --max-measured-s: must be a number > 0, got 0"),
    (["--cell-timeout-s", "inf"], "argument --cell-timeout-s: must be a number > 0, got inf"),
    (["--workload", "mixed", "--n", "8", "64"],
     "--workload mixed: needs every N >= 10, got --n 8"),
])
def test_a_bad_wrapper_or_timeout_is_refused_naming_the_option(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        hot_path.parse_args(["--generator", "python", *args])
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err


def test_mixed_at_a_small_n_is_skipped_when_both_workloads_run() -> None:
    # the default matrix: ring-pair runs at N=8, mixed only from N=10 on (not an error)
    opts = hot_path.parse_args(["--generator", "python", "--n", "8", "64"])
    assert opts.workloads == ("ring-pair", "mixed") and opts.ns == (8, 64)


@pytest.mark.parametrize(("script", "args", "says"), [
    ("inprocess_path.py", ["--boundaries", "0"],
     "argument --boundaries: must be an integer >= 1, got 0"),
    ("inprocess_path.py", ["--repeat", "0"], "argument --repeat: must be an integer >= 1, got 0"),
    ("inprocess_path.py", ["--n", "3"], "argument --n: must be an integer >= 4, got 3"),
    ("grpc_floor.py", ["--n", "0"], "argument --n: must be an integer >= 4, got 0"),
    ("grpc_floor.py", ["--workload", "mixed", "--n", "8"],
     "--workload mixed: needs every N >= 10, got --n 8"),
    ("grpc_floor.py", ["--max-measured-s", "-1"],
     "argument --max-measured-s: must be a number > 0, got -1"),
])
def test_the_other_scripts_refuse_a_bad_value_naming_the_option(
    script: str, args: list[str], says: str
) -> None:
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr

