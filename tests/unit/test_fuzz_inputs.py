"""Bad input, fuzzed (issue 10, section 5): mutated config files and traces give the reader's
own error naming the field (``ConfigError`` / ``TraceError``) or a valid result - never another
exception, a traceback or a hang. Property-based (hypothesis, pinned in requirements.lock),
derandomized and bounded for CI."""

from __future__ import annotations

import contextlib
import gzip
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from lightrail.agents.replay.trace import TraceError, Workload, read_aicb_csv, read_kineto
from lightrail.controller.config import Config, ConfigError, load_config
from tests.fuzz import fuzz_settings

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "deploy" / "examples").glob("*.yaml"))
FUZZ = fuzz_settings(150)
"""150 examples per test in CI; ``LIGHTRAIL_FUZZ_EXAMPLES=3000`` for a longer campaign."""

# values a hostile or corrupt file may carry in any field
ODD = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.lists(st.integers(min_value=-5, max_value=10**12), max_size=5),
    st.dictionaries(st.text(max_size=8), st.integers(), max_size=3),
)


def _paths(doc: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Every key path of a nested dict/list document."""
    out: list[tuple[object, ...]] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append((*prefix, k))
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.append((*prefix, i))
            out.extend(_paths(v, (*prefix, i)))
    return out


def _set(doc: object, path: tuple[object, ...], value: object) -> None:
    node = doc
    for key in path[:-1]:
        node = node[key]  # type: ignore[index]
    node[path[-1]] = value  # type: ignore[index]


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
@FUZZ
@given(data=st.data())
def test_a_config_with_any_field_replaced_is_valid_or_a_config_error(
    tmp_path: Path, example: Path, data: st.DataObject
) -> None:
    doc = yaml.safe_load(example.read_text(encoding="utf-8"))
    paths = _paths(doc)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        _set(doc, data.draw(st.sampled_from(paths)), data.draw(ODD))
        paths = _paths(doc)
    path = tmp_path / "fuzzed.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    try:
        assert isinstance(load_config(path), Config)
    except ConfigError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)


@FUZZ
@given(raw=st.binary(max_size=300))
def test_config_bytes_of_any_kind_are_valid_or_a_config_error(
    tmp_path: Path, raw: bytes
) -> None:
    path = tmp_path / "bytes.yaml"
    path.write_bytes(raw)
    with contextlib.suppress(ConfigError):  # valid, or refused naming the problem
        load_config(path)


AICB = (
    "[rank0 ~ rank7]\n"
    "comm_type,comm_group,comm_group_size,msg_size,stage,dst,src,additional,_elapsed_time,"
    "algbw,busbw,count\n"
    "CommType.all_reduce,CommGroup.dp_group,4,8,init.model_setup,None,None,,None,None,None,1\n"
    "CommType.epoch_end,None,None,0,,None,None,,None,None,None,1\n"
    "CommType.all_reduce,CommGroup.tp_group,2,1000,forward,None,None,,None,None,None,1\n"
    "CommType.all_gather,CommGroup.dp_group,4,4096,step,None,None,,None,None,None,1\n"
    "CommType.epoch_end,None,None,0,,None,None,,None,None,None,1\n"
)
CELL = st.one_of(st.text(max_size=12), st.integers(min_value=-(10**30), max_value=10**30).map(str),
                 st.sampled_from(["None", "", "nan", "1e400", "-0", "CommType.all_to_all",
                                  "CommGroup.ep_group", "0x10"]))


@FUZZ
@given(data=st.data())
def test_an_aicb_csv_with_cells_replaced_is_read_or_a_trace_error(
    tmp_path: Path, data: st.DataObject
) -> None:
    rows = [line.split(",") for line in AICB.splitlines()]
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        r = data.draw(st.integers(min_value=0, max_value=len(rows) - 1))
        c = data.draw(st.integers(min_value=0, max_value=len(rows[r]) - 1))
        rows[r][c] = data.draw(CELL).replace(",", ";").replace("\n", " ")
    if data.draw(st.booleans()):
        del rows[data.draw(st.integers(min_value=0, max_value=len(rows) - 1))]
    path = tmp_path / "job.csv"
    path.write_text("\n".join(",".join(r) for r in rows) + "\n", encoding="utf-8")
    try:
        assert isinstance(read_aicb_csv(path), Workload)
    except TraceError as exc:
        assert exc.field and str(exc).startswith(str(path))


def _kineto_doc() -> dict[str, object]:
    meta = {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
            "dtype": "Float", "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
            "Group size": 2, "Rank": 0}
    return {"schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
            "traceEvents": [
                {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 100,
                 "tid": 1, "ts": 0, "dur": 1000, "args": {"External id": 1}},
                {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 100,
                 "tid": 1, "ts": 100, "dur": 20, "args": {"External id": 2, **meta}},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100,
                 "tid": 1, "ts": 102, "dur": 3, "args": {"correlation": 3, "External id": 2}},
                {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                 "pid": 0, "tid": 7, "ts": 130, "dur": 50,
                 "args": {"correlation": 3, "External id": 2}},
            ]}


@FUZZ
@given(data=st.data(), gz=st.booleans())
def test_a_kineto_trace_with_fields_replaced_is_read_or_a_trace_error(
    tmp_path: Path, data: st.DataObject, gz: bool
) -> None:
    doc = _kineto_doc()
    paths = _paths(doc)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        _set(doc, data.draw(st.sampled_from(paths)), data.draw(ODD))
        paths = _paths(doc)
    raw = json.dumps(doc).encode()
    path = tmp_path / ("rank0.json.gz" if gz else "rank0.json")
    path.write_bytes(gzip.compress(raw) if gz else raw)
    try:
        assert isinstance(read_kineto(path), Workload)
    except TraceError as exc:
        assert exc.field and str(exc).startswith(str(path))


@FUZZ
@given(raw=st.binary(max_size=300), gz=st.booleans())
def test_trace_bytes_of_any_kind_are_read_or_a_trace_error(
    tmp_path: Path, raw: bytes, gz: bool
) -> None:
    path = tmp_path / ("rank0.json.gz" if gz else "rank0.json")
    path.write_bytes(raw)
    with pytest.raises(TraceError):
        read_kineto(path)


def test_found_by_fuzzing_an_event_category_that_is_not_a_string(tmp_path: Path) -> None:
    """An event whose "cat" is a list raised ``TypeError: unhashable type``."""
    doc = _kineto_doc()
    events = doc["traceEvents"]
    assert isinstance(events, list)
    events[1]["cat"] = []
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(TraceError) as info:
        read_kineto(path)
    assert (info.value.field, info.value.value) == ("traceEvents[1].cat", [])


def test_found_by_fuzzing_a_repeat_count_without_bound(tmp_path: Path) -> None:
    """An AICB row with count 10^9 expanded into 10^9 collectives (memory without bound)."""
    path = tmp_path / "job.csv"
    path.write_text(AICB.replace("forward,None,None,,None,None,None,1",
                                 "forward,None,None,,None,None,None,1000000000"),
                    encoding="utf-8")
    with pytest.raises(TraceError) as info:
        read_aicb_csv(path)
    assert (info.value.field, info.value.value, info.value.line) == ("count", "1000000000", 5)
