"""The Opus phase-pattern reader (``agents/replay/trace/opus*.py``): the real Perlmutter files
(facts from ``../shared/data/traces/opus-perlmutter/README.md``), a scaled-down synthetic
experiment, the latency CSVs and malformed input."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightrail.agents.replay.trace.loader import load_workload
from lightrail.agents.replay.trace.model import SourceFormat, TraceError
from lightrail.agents.replay.trace.opus import LLAMA3_8B, read_opus
from lightrail.agents.replay.trace.opus_format import (
    PhaseLabel,
    read_pattern_file,
    read_timed_file,
)
from lightrail.agents.replay.trace.opus_latency import (
    RunMode,
    read_latency_csv,
    read_latency_folder,
)
from lightrail.controller.domain.model import Collective

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces"
OPUS = SHARED / "opus-perlmutter"
needs_data = pytest.mark.skipif(not OPUS.is_dir(), reason="shared opus-perlmutter data absent")


# --- the real files ------------------------------------------------------------------------


@needs_data
@pytest.mark.parametrize("folder,pattern,nodes", [
    ("llama-3-3d-16-latency", "comm_pattern", 4),
    ("llama-3-3d-64-latency", "comm_pattern_no_ctl_issue", 16),
])
def test_real_pattern_counts(folder: str, pattern: str, nodes: int) -> None:
    d = OPUS / folder / pattern
    first = read_pattern_file(d / "comm_pattern_0_rank0.txt")
    second = read_pattern_file(d / f"comm_pattern_{nodes // 2}_rank0.txt")
    for pf, lines, pp in ((first, 64, 32), (second, 62, 31)):
        assert len(pf.phases) == lines
        assert sum(p.label is PhaseLabel.PP for p in pf.phases) == pp
        assert sum(p.label is PhaseLabel.DP for p in pf.phases) == lines - pp
    exp = read_opus(OPUS / folder)
    assert exp.nodes == nodes and exp.world_size == 4 * nodes
    assert exp.phase_lines == (64, 62)
    assert exp.pattern_dir.name == pattern
    assert len(exp.timed_files) == 2


@needs_data
def test_real_16_layout_and_sizes() -> None:
    exp = read_opus(OPUS / "llama-3-3d-16-latency")
    assert exp.pp_group(1).ranks == (1, 9)
    assert exp.pp_group(13).ranks == (5, 13)
    assert exp.dp_group(6).ranks == (2, 6)
    assert exp.dp_group(14).ranks == (10, 14)
    # one step per stage: PP, DP(17), PP(3), DP(18), PP, DP on backend 6
    assert [(p.label.value, p.calls) for p in exp.stages[0]] == [
        ("PP", 1), ("DP", 17), ("PP", 3), ("DP", 18), ("PP", 1), ("DP", 20)]
    assert [(p.label.value, p.calls) for p in exp.stages[1]] == [
        ("PP", 1), ("DP", 17), ("PP", 3), ("DP", 18), ("PP", 1), ("DP", 3)]
    # both timed files: 10 step-marking phases, ~14 s apart (a b24 run)
    assert exp.step_s[0] == pytest.approx(13.985, abs=0.01)
    w = load_workload(OPUS / "llama-3-3d-16-latency")
    assert w.source_format is SourceFormat.OPUS and w.world_size == 16
    op = w.ranks[0][0]
    assert op.collective is Collective.SEND_RECV and op.nbytes == 4 * 8192 * 4096 * 2
    dp_op = w.ranks[0][2]  # after the PP call and its zero-byte closing call
    assert dp_op.collective is Collective.ALL_GATHER
    assert dp_op.nbytes == 8_030_261_248 * 2 // (2 * 4 * 17) // 2
    # the bare pattern folder reads the same (timed files from its parent)
    bare = load_workload(OPUS / "llama-3-3d-16-latency" / "comm_pattern")
    assert bare.ranks == w.ranks


@needs_data
def test_real_64_gaps_cover_the_step() -> None:
    """Patterns and timed files of the 64-GPU folder share call indices: the mapped phases
    tile the step (idle + span per stage = the timed file's step period, within 1 %)."""
    exp = read_opus(OPUS / "llama-3-3d-64-latency")
    for stage in (0, 1):
        total = sum(p.idle_s + p.span_s for p in exp.stages[stage])
        period = exp.step_s[stage]
        assert period is not None
        assert total == pytest.approx(period, rel=0.01)


@needs_data
def test_real_timed_file_quirks() -> None:
    tf = read_timed_file(OPUS / "llama-3-3d-16-latency" / "comm_pattern_v3_b24_pp_1.txt")
    assert len(tf.phases) == 102
    assert len(tf.min_gaps) == 51 and tf.min_gaps[0].gap_ms == pytest.approx(49.307)
    assert tf.summary == {"mean": 145.833, "std": 204.144, "min": 16.507, "max": 607.778}
    stale = [p for p in tf.phases if p.label is PhaseLabel.PP and p.end_backend != 1]
    assert stale  # end_backend not reset (README)
    t0 = read_timed_file(OPUS / "llama-3-3d-16-latency" / "comm_pattern_v3_b24_pp_0.txt")
    assert any(p.end_ms is not None and p.start_ms is not None and p.end_ms < p.start_ms
               for p in t0.phases)


@needs_data
def test_real_latency_csvs() -> None:
    t16 = read_latency_folder(OPUS / "llama-3-3d-16-latency")
    assert t16 is not None
    assert t16.no_controller.mean_s == pytest.approx(10.1775)
    assert t16.delays_ms() == (0, 10, 50, 100, 250, 500, 750, 1000, 2000, 3000)
    assert t16.on_demand[1000.0].mean_s == pytest.approx(15.400833333333333)
    assert t16.provisioning[1000.0].mean_s == pytest.approx(15.121499999999997)
    t64 = read_latency_folder(OPUS / "llama-3-3d-64-latency")
    assert t64 is not None and t64.delays_ms()[-1] == 1000
    assert t64.no_controller.experiment == "output-opus-no-ctl-dp8"
    raw = (OPUS / "llama-3-3d-64-latency" / "latency_results_baseline.csv").read_bytes()
    assert b"\r\n" in raw


# --- synthetic -----------------------------------------------------------------------------

STAGE0 = ["PP start_backend: 1 start_idx: 0 end_backend: 1 end_idx: 0 len: 1",
          "DP start_backend: 5 start_idx: 0 end_backend: 5 end_idx: 1 len: 2",
          "DP start_backend: 6 start_idx: 0 end_backend: 6 end_idx: 0 len: 1",
          "PP start_backend: 1 start_idx: 1 end_backend: 1 end_idx: 1 len: 1",
          "DP start_backend: 5 start_idx: 2 end_backend: 5 end_idx: 3 len: 2",
          "DP start_backend: 6 start_idx: 1 end_backend: 6 end_idx: 1 len: 1",
          "PP start_backend: 1 start_idx: 2 end_backend: 1 end_idx: 2 len: 1",
          "DP start_backend: 5 start_idx: 4 end_backend: 5 end_idx: 5 len: 2",
          "DP start_backend: 6 start_idx: 2 end_backend: 6 end_idx: 2 len: 1"]
# times in ms per line: a step of 1,000 ms; PP span 10, idle 20 before DP, DP span 400 ...
TIMES = [(0, 10), (30, 430), (500, 505), (1000, 1010), (1030, 1430), (1500, 1505),
         (2000, 2010), (2030, 2430), (2500, 2505)]


def _write_experiment(root: Path, *, nodes: int = 2, timed: bool = True) -> Path:
    d = root / "exp"
    (d / "comm_pattern").mkdir(parents=True)
    for n in range(nodes):
        for r in range(4):
            body = "\n".join([f"Node: host{n}, Rank: {r}, Tid: 7", *STAGE0]) + "\n"
            (d / "comm_pattern" / f"comm_pattern_{n}_rank{r}.txt").write_text(body)
    if timed:
        for s in (0, 1):
            lines = [f"{ln}, start_time: {1e6 + a}, end_time: {1e6 + b}"
                     for ln, (a, b) in zip(STAGE0, TIMES, strict=True)]
            (d / f"x_pp_{s}.txt").write_text("\n".join(lines) + "\n")
    (d / "latency_results_baseline.csv").write_bytes(
        b"Experiment,Min latency (s),Average Latency (s),Standard Deviation (s)\r\n"
        b"output-opus-no-ctl,1.0,1.0,0.0\r\n"
        b"output-opus-l_100-baseline,1.5,1.6,0.1\r\n"
        b"output-opus-l_100-provision,1.2,1.3,0.1\r\n")
    return d


def test_synthetic_experiment(tmp_path: Path) -> None:
    exp = read_opus(_write_experiment(tmp_path))
    assert exp.nodes == 2 and exp.dp == 1 and exp.world_size == 8
    assert exp.steps_averaged == (1, 1)  # steps: (0..2] and (3..5]; only the second has a
    st = exp.stages[0]                   # previous step-marking phase to measure from
    assert [(p.label, p.calls) for p in st] == [
        (PhaseLabel.PP, 1), (PhaseLabel.DP, 2), (PhaseLabel.DP, 1)]
    # step 2: PP 2000..2010 after DP6 end 1505: idle 495; DP idle 20, span 400; DP6 70, 5
    assert [round(p.idle_s * 1e3, 6) for p in st] == [495.0, 20.0, 70.0]
    assert [round(p.span_s * 1e3, 6) for p in st] == [10.0, 400.0, 5.0]
    w = exp.workload()
    ops = w.ranks[0]
    # PP call + zero-byte closing call (span 10 ms), DP x2 (span over the second), DP6 + close
    assert [o.collective for o in ops] == [Collective.SEND_RECV] * 2 + [Collective.ALL_GATHER] * 4
    assert [round(o.compute_gap_s * 1e3, 6) for o in ops] == [495, 10, 20, 400, 70, 5]
    assert [o.nbytes for o in ops] == [LLAMA3_8B.pp_call_bytes(), 0,
                                      LLAMA3_8B.dp_unit_bytes(), LLAMA3_8B.dp_unit_bytes(),
                                      LLAMA3_8B.dp_unit_bytes(), 0]
    assert ops[0].group is not None and ops[0].group.ranks == (0, 4)
    assert sum(o.compute_gap_s for o in ops) == pytest.approx(1.0)
    half = exp.workload(0.5)
    assert sum(o.compute_gap_s for o in half.ranks[0]) == pytest.approx(0.5)


def test_synthetic_without_timed_files(tmp_path: Path) -> None:
    exp = read_opus(_write_experiment(tmp_path, timed=False))
    assert all(p.idle_s == 0 and p.span_s == 0 for p in exp.stages[0])
    assert any("gaps are 0" in a for a in exp.assumptions)


# --- malformed input ----------------------------------------------------------------------


def _pattern(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "comm_pattern_0_rank0.txt"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("line,field,value", [
    ("XX start_backend: 1 start_idx: 0 end_backend: 1 end_idx: 0 len: 1", "label", "XX"),
    ("PP start_backend: 5 start_idx: 0 end_backend: 1 end_idx: 0 len: 1", "start_backend", 5),
    ("DP start_backend: 5 start_idx: x end_backend: 5 end_idx: 0 len: 1", "start_idx", "x"),
    ("DP start_backend: 5 start_idx: 0 end_backend: 5 end_idx: 3 len: 2", "len", 2),
    ("DP start_backend: 5 start_idx: 0 end_backend: 9 end_idx: 3 len: 2", "end_backend", 9),
    ("PP start_backend: 1 start_idx: 0 end_backend: 1 end_idx: 0 len: 0", "len", 0),
    ("PP start_backend: 1 start_idx: 0 end_backend: 1 end_idx: 0 len: 1, start_time: 1.0, "
     "end_time: 2.0", "start_time", "1.0"),
    ("garbage", "phase", "garbage"),
    # review of issue 13: one phase of 10^7 calls (6 -> 5, so len is not checked against the
    # indices) took 1 GB; a few of them ran out of memory
    ("DP start_backend: 6 start_idx: 0 end_backend: 5 end_idx: 9 len: 10000000", "len",
     10000000),
])
def test_malformed_pattern_line(tmp_path: Path, line: str, field: str, value: object) -> None:
    p = _pattern(tmp_path, ["Node: h, Rank: 0, Tid: 1", line])
    with pytest.raises(TraceError) as ei:
        read_pattern_file(p)
    err = ei.value
    assert (err.field, err.value, err.line) == (field, value, 2)
    assert str(err).startswith(f"{p}:2: field {field!r}")


def test_malformed_header_and_empty(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="field 'header'") as ei:
        read_pattern_file(_pattern(tmp_path, ["Rank: 0"]))
    assert ei.value.line == 1
    with pytest.raises(TraceError, match="no phase lines"):
        read_pattern_file(_pattern(tmp_path, ["Node: h, Rank: 0, Tid: 1", "# comment"]))


@pytest.mark.parametrize("text,field,value,line", [
    ("PP start_backend: 1 start_idx: 0 end_backend: 1 end_idx: 0 len: 1\n", "start_time", None,
     1),
    ("PP start_backend: 1 start_idx: 0 end_backend: 5 end_idx: 0 len: 1, start_time: 1e9, "
     "end_time: 2.0\n", "start_time", 1e9, 1),
    ("PP start_backend: 1 start_idx: 0 end_backend: 5 end_idx: 0 len: 1, start_time: 1.0, "
     "end_time: nope\n", "end_time", "nope", 1),
    ("PP start_backend: 1 start_idx: 0 end_backend: 5 end_idx: 0 len: 1, start_time: 1.0, "
     "end_time: 2.0\nBackend: 1, Idx: 0, Min Gap: -3 ms\n", "Min Gap", -3.0, 2),
    ("PP start_backend: 1 start_idx: 0 end_backend: 5 end_idx: 0 len: 1, start_time: 1.0, "
     "end_time: 2.0\nAverage time gap: 1.0 ms\nPP start_backend: 1 start_idx: 1 end_backend: 1 "
     "end_idx: 1 len: 1, start_time: 3.0, end_time: 4.0\n", "phase", None, 3),
])
def test_malformed_timed_file(tmp_path: Path, text: str, field: str, value: object,
                              line: int) -> None:
    p = tmp_path / "t_pp_0.txt"
    p.write_text(text)
    with pytest.raises(TraceError) as ei:
        read_timed_file(p)
    assert (ei.value.field, ei.value.line) == (field, line)
    if value is not None:
        assert ei.value.value == value


def test_stage_ranks_must_agree(tmp_path: Path) -> None:
    d = _write_experiment(tmp_path)
    bad = d / "comm_pattern" / "comm_pattern_0_rank2.txt"
    lines = bad.read_text().splitlines()
    lines[2] = "DP start_backend: 5 start_idx: 0 end_backend: 5 end_idx: 2 len: 3"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match="pipeline stage 0") as ei:
        read_opus(d)
    assert ei.value.source == str(bad) and ei.value.line == 3


def test_missing_rank_file(tmp_path: Path) -> None:
    d = _write_experiment(tmp_path)
    (d / "comm_pattern" / "comm_pattern_1_rank3.txt").unlink()
    with pytest.raises(TraceError, match=r"comm_pattern_1_rank3\.txt"):
        read_opus(d)


@pytest.mark.parametrize("row,field", [
    (b"output-opus-l_10-baseline,1.0,x,0.1", "Average Latency (s)"),
    (b"output-opus-l_10-sideways,1.0,1.0,0.1", "Experiment"),
    (b"output-opus-baseline,1.0,1.0,0.1", "Experiment"),
    (b"output-opus-l_10-baseline,2.0,1.0,0.1", "Min latency (s)"),
    (b"output-opus-l_10-baseline,1.0,1.0", "row"),
])
def test_malformed_latency_csv(tmp_path: Path, row: bytes, field: str) -> None:
    p = tmp_path / "latency.csv"
    p.write_bytes(b"Experiment,Min latency (s),Average Latency (s),Standard Deviation (s)\r\n"
                  b"output-opus-no-ctl,1.0,1.0,0.0\r\n" + row + b"\r\n")
    with pytest.raises(TraceError) as ei:
        read_latency_csv(p)
    assert (ei.value.field, ei.value.line) == (field, 3)


def test_latency_csv_modes(tmp_path: Path) -> None:
    rows = read_latency_csv(_write_experiment(tmp_path) / "latency_results_baseline.csv")
    assert [(r.mode, r.delay_ms) for r in rows] == [
        (RunMode.NO_CONTROLLER, None), (RunMode.ON_DEMAND, 100.0),
        (RunMode.PROVISIONING, 100.0)]


def test_several_pattern_folders_need_a_choice(tmp_path: Path) -> None:
    d = _write_experiment(tmp_path)
    (d / "comm_pattern").rename(d / "comm_pattern_a")
    other = d / "comm_pattern_b"
    other.mkdir()
    for p in (d / "comm_pattern_a").iterdir():
        (other / p.name).write_text(p.read_text())
    with pytest.raises(TraceError, match="several per-rank pattern folders") as ei:
        read_opus(d)
    assert ei.value.value == ["comm_pattern_a", "comm_pattern_b"]
    assert read_opus(other).pattern_dir == other  # the folder itself reads


def test_dp_phase_from_backend_6_to_5(tmp_path: Path) -> None:
    """A DP phase that starts on backend 6 and ends on 5 holds its backend-5 calls after the
    last one seen (README example '6:0 -> 5:102 len 20'); the timed file's stale end_backend
    of a one-call PP phase is ignored."""
    from lightrail.agents.replay.trace.opus import _calls
    from lightrail.agents.replay.trace.opus_format import parse_phase_line

    lines = ["DP start_backend: 5 start_idx: 68 end_backend: 5 end_idx: 85 len: 18",
             "PP start_backend: 1 start_idx: 8 end_backend: 5 end_idx: 8 len: 1",
             "DP start_backend: 6 start_idx: 0 end_backend: 5 end_idx: 102 len: 20"]
    phases = [parse_phase_line(tmp_path, i + 1, ln, timed=False) if i != 1 else
              parse_phase_line(tmp_path, 2, ln + ", start_time: 1.0, end_time: 0.5", timed=True)
              for i, ln in enumerate(lines)]
    calls = _calls(phases)
    assert calls[1] == [(1, 8)]
    assert calls[2] == [(6, 0), (6, 1), (6, 2), *[(5, i) for i in range(86, 103)]]


@pytest.mark.parametrize("text", [b"", b"\r\n", b"Experment,Min latency (s)\r\nx,1,1,0\r\n"])
def test_a_latency_results_csv_without_the_header_is_an_error(tmp_path: Path,
                                                              text: bytes) -> None:
    # review of issue 13: an empty or mis-headed latency_results*.csv was left out silently, and
    # evaluate printed '-' for the mode it held
    d = _write_experiment(tmp_path)
    bad = d / "latency_results_provision.csv"
    bad.write_bytes(text)
    with pytest.raises(TraceError) as ei:
        read_latency_folder(d)
    assert (ei.value.field, ei.value.line) == ("header", 1)
    assert str(bad) in str(ei.value)
    (d / "notes.csv").write_bytes(b"a,b\r\n")  # another CSV is still not read
    bad.unlink()
    table = read_latency_folder(d)
    assert table is not None and set(table.on_demand) == {100.0}


def test_the_name_of_a_folder_given_as_dot_is_the_folder_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # review of issue 13: 'lightrail evaluate .' printed ' (opus): 16 ranks ...' and JSON
    # "workload": ""
    d = _write_experiment(tmp_path)
    monkeypatch.chdir(d)
    assert read_opus(Path(".")).name == d.name
    monkeypatch.chdir(d / "comm_pattern")
    assert read_opus(Path(".")).name == "comm_pattern"
    assert read_opus(Path("..")).name == d.name
