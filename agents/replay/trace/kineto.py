"""PyTorch profiler (Kineto) traces -> :class:`Workload`.

Input: a directory or tarball (``.tar.gz`` / ``.tgz`` / ``.tar``) of per-rank Chrome-trace JSON
files (each possibly gzipped), or one such file for one rank. Format: the Chrome trace event
format written by ``torch.profiler`` through Kineto (``traceEvents`` of ``ph: "X"`` complete
events, microsecond ``ts``/``dur``, ``distributedInfo`` with the rank).

How one rank's calls are found
------------------------------
A collective leaves nested CPU events on the thread that issued it: ``c10d::allreduce_`` >
``record_param_comms`` > ``nccl:all_reduce``. Each outermost nest of such events is one *call*.
Its metadata comes from (in that order):

1. ``record_param_comms`` args written by PyTorch >= 2.1 (``torch/csrc/profiler/util.cpp``,
   ``saveNcclMeta``): ``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``dtype``,
   ``Group size``, ``Process Group Name``, ``Process Group Ranks``, ``Global rank start`` /
   ``stride``, ``In split size`` / ``Out split size``, ``Src Rank`` / ``Dst Rank``; the same keys
   copied onto the NCCL kernel by Kineto (merged in; the CPU op wins on conflict);
2. older traces (e.g. PARAM's DLRM): the ``nccl:<collective>`` annotation's ``Input Dims`` and
   ``Input type`` (the collective's input tensors).

Each NCCL kernel is tied to its call through its ``correlation`` id: the CUDA runtime launch with
that id lies inside the call on the CPU thread (``External id`` is the fallback). A kernel that
carries ``Collective name`` but has no enqueuing CPU op is a call of its own.

Process group of a call, in order: ``Process Group Ranks`` (a JSON list or the string
``"[0, 1]"``; an empty list means ranks ``0 .. Group size - 1``, which PyTorch writes for the
default group; a list truncated by the profiler, ``"[0, ..., 29, ...]"``, is rebuilt from
``Global rank start`` / ``stride``); else ``Global rank start`` / ``stride`` with ``Group size``;
else ``distributedInfo.pg_config`` of the same file by ``Process Group Name`` (names are unique
within one process, never across ranks); else ``Group size == world size`` (then it *is* the
world group); else unknown (``CommOp.group is None``, approximate). Only when no call in the whole
trace carries any metadata (the old format) is the world group assumed, and
``Workload.assumptions`` says so.

Iteration
---------
The iteration is one ``ProfilerStep#N`` span: the highest ``N`` recorded on every rank whose span
ends inside the trace window and whose calls all have their GPU kernel; ``step=`` picks another.
Calls belong to the step whose CPU span contains their issue time (calls on other threads, e.g.
DDP's autograd thread, included). Without ``ProfilerStep`` spans the whole trace is the iteration.

Timing
------
A call runs from the start of its first NCCL kernel to the end of its last one (GPU timeline, the
same clock as the CPU events in a Kineto trace); without a kernel, its CPU span (noted).
``compute_gap_s`` = start of this call - the latest end of the rank's earlier calls in the step
(the step start for the first), clamped to 0 when calls overlap (noted); ``tail_gap_s`` = step
end - the latest end of its calls. ``nbytes`` = ``In msg nelems`` x size of ``dtype`` (legacy:
the ``Input Dims`` element count x size of ``Input type``), i.e. the collective's input on this
rank as :class:`CommOp` defines it.
Kernel durations include waiting for the slowest rank and rank clocks are not aligned, so gaps
are per-rank wall-clock windows, not pure compute.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import re
import tarfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from lightrail.agents.replay.trace.model import (
    MAX_MESSAGE_BYTES,
    CommOp,
    Direction,
    SourceFormat,
    TraceError,
    Workload,
)
from lightrail.controller.domain.model import MAX_WORLD_SIZE, Collective, ProcessGroup

__all__ = ["read_kineto"]

_US = 1e-6
_EPS_US = 1e-3


def _eps_us(at_us: float) -> float:
    """The tolerance of a comparison of timestamps near ``at_us`` (µs): ``_EPS_US``, or four
    ulps of ``at_us`` when that is more (float64 timestamps of ~1e16 µs, as traces with
    per-rank epoch offsets record them, are 2 µs apart: a child event can round past its
    parent by that much)."""
    return max(_EPS_US, 4 * math.ulp(at_us))
_GZIP_MAGIC = b"\x1f\x8b"
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME_RE = re.compile(r"(?:rank|worker)[_\-]?(\d+)", re.IGNORECASE)
_P2P_TITLE_RE = re.compile(r"(\d+)\s*(?:->|<-)\s*(\d+)")
_TRUNCATION_MARK = "..."
_CPU_CATS = frozenset({"cpu_op", "user_annotation", "Operator"})
_RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime"})
_NCCL_KERNEL_PREFIXES = ("ncclKernel", "ncclDevKernel", "ncclDevFunc")
_NCCL_META_KEYS = frozenset({
    "Collective name", "dtype", "In msg nelems", "Out msg nelems", "In split size",
    "Out split size", "Group size", "Process Group Name", "Process Group Description",
    "Process Group Ranks", "Global rank start", "Global rank stride", "Rank", "Src Rank",
    "Dst Rank",
})

# Element size in bytes, by c10::ScalarType name (``dtype`` metadata, c10::toString) and by the
# C++ type name the legacy ``Input type`` carries (caffe2::TypeMeta::name).
_DTYPE_NBYTES: Mapping[str, int] = {
    "Bool": 1, "Byte": 1, "Char": 1, "QInt8": 1, "QUInt8": 1, "QUInt4x2": 1, "QUInt2x4": 1,
    "Bits1x8": 1, "Bits2x4": 1, "Bits4x2": 1, "Bits8": 1, "Float8_e5m2": 1, "Float8_e4m3fn": 1,
    "Float8_e5m2fnuz": 1, "Float8_e4m3fnuz": 1, "Float8_e8m0fnu": 1,
    "Short": 2, "Half": 2, "BFloat16": 2, "Bits16": 2, "UInt16": 2,
    "Int": 4, "Float": 4, "QInt32": 4, "ComplexHalf": 4, "UInt32": 4,
    "Long": 8, "Double": 8, "ComplexFloat": 8, "UInt64": 8, "ComplexDouble": 16,
    "bool": 1, "signed char": 1, "unsigned char": 1, "int8_t": 1, "uint8_t": 1,
    "short int": 2, "short": 2, "c10::Half": 2, "c10::BFloat16": 2,
    "int": 4, "unsigned int": 4, "float": 4, "c10::complex<c10::Half>": 4,
    "long int": 8, "long": 8, "long long": 8, "int64_t": 8, "double": 8,
    "c10::complex<float>": 8, "c10::complex<double>": 16,
}


@dataclass(frozen=True, slots=True)
class _Span:
    start_us: float
    end_us: float


@dataclass(frozen=True, slots=True)
class _RawEvent:
    name: str
    thread: str
    start_us: float
    end_us: float
    args: Mapping[str, object]


@dataclass(slots=True)
class _Call:
    """A collective call as found in one rank's file (mutable while kernels are linked)."""

    thread: str
    cpu: _Span | None
    name: str
    meta: dict[str, object]
    dims: object
    dim_types: object
    c10d_dims: object
    external_ids: frozenset[int] = frozenset()
    kernels: list[_Span] = field(default_factory=list)

    @property
    def issue_us(self) -> float:
        if self.cpu is not None:
            return self.cpu.start_us
        return min(k.start_us for k in self.kernels)


@dataclass(frozen=True, slots=True)
class _Step:
    number: int
    span: _Span


@dataclass(frozen=True, slots=True)
class _Launch:
    """A CUDA runtime call (kernel launch) on a CPU thread."""

    thread: str
    ts_us: float


@dataclass(frozen=True, slots=True)
class _DistInfo:
    rank: int | None
    world_size: int | None
    pg_table: Mapping[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class _RankFile:
    source: str
    rank: int | None
    world_size: int | None
    steps: Mapping[int, _Step]
    calls: tuple[_Call, ...]
    window: _Span
    has_nccl_kernels: bool
    orphan_kernels: int
    pg_table: Mapping[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class _Timed:
    op: CommOp
    issue_us: float
    span: _Span
    on_gpu: bool


@dataclass(frozen=True, slots=True)
class _Skipped:
    name: str


@dataclass(frozen=True, slots=True)
class _GroupInfo:
    group: ProcessGroup | None
    recorded_order: tuple[int, ...] | None
    notes: tuple[str, ...]
    approximate: bool


@dataclass(frozen=True, slots=True)
class _IntList:
    values: tuple[int, ...]
    truncated: bool


def read_kineto(path: Path, *, step: int | None = None) -> Workload:
    """Read a Kineto trace (directory, tarball or one JSON / JSON.gz file) into a Workload. A
    directory with no JSON trace files is read from the tarballs in it (a dataset folder).

    ``step`` selects ``ProfilerStep#<step>`` instead of the default (see the module docstring).
    Returns a Workload of ``SourceFormat.KINETO`` whose ``ranks`` hold the recorded ranks (plus,
    for a trace of some ranks only, the ranks that share every process group of a recorded rank,
    copied and marked approximate). Raises :class:`TraceError` naming the file, the field and
    the value on anything that is not a readable Kineto trace (truncated or foreign file, bad
    metadata, duplicate ranks, a missing step).
    """
    path = Path(path)
    files = [_parse_rank_file(source, data) for source, data in _iter_sources(path)]
    if not files:
        raise TraceError(path, "traceEvents", None, "no *.json or *.json.gz trace file found")
    return _build_workload(path, files, step)


# --- input files -----------------------------------------------------------------------------


def _is_trace_name(name: str) -> bool:
    return name.endswith((".json", ".json.gz"))


def _iter_sources(path: Path) -> Iterator[tuple[str, bytes]]:
    if path.is_dir():
        found = False
        for file in sorted(p for p in path.rglob("*") if p.is_file() and _is_trace_name(p.name)):
            found = True
            yield str(file), file.read_bytes()
        if not found:  # a dataset folder holding the trace as a tarball (and its LICENSE)
            for tarball in sorted(p for p in path.iterdir() if p.is_file()
                                  and p.name.endswith((".tar.gz", ".tgz", ".tar"))):
                yield from _iter_sources(tarball)
        return
    if not path.is_file():
        raise TraceError(path, "path", str(path), "no such file or directory")
    if path.name.endswith((".tar.gz", ".tgz", ".tar")):
        try:
            with tarfile.open(path, "r:*") as archive:
                for member in sorted(archive.getmembers(), key=lambda m: m.name):
                    if not (member.isfile() and _is_trace_name(member.name)):
                        continue
                    handle = archive.extractfile(member)
                    if handle is None:
                        continue
                    yield f"{path}!{member.name}", handle.read()
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise TraceError(
                path, "archive", path.name, f"not a readable tar archive: {exc}"
            ) from exc
        return
    yield str(path), path.read_bytes()


def _load_json(source: str, data: bytes) -> dict[str, object]:
    if data.startswith(_GZIP_MAGIC):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(
                source, "gzip", len(data), f"truncated or corrupt gzip: {exc}"
            ) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(source, "<file>", data[:16], f"not UTF-8 JSON text: {exc}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        snippet = text[max(0, exc.pos - 20) : exc.pos + 20]
        raise TraceError(
            source, "<json>", snippet, f"not valid JSON (truncated?): {exc.msg} at char {exc.pos}"
        ) from exc
    if not isinstance(doc, dict):
        raise TraceError(source, "<top level>", type(doc).__name__, "not a Kineto trace object")
    if not isinstance(doc.get("traceEvents"), list):
        raise TraceError(
            source, "traceEvents", doc.get("traceEvents"),
            "missing or not a list: not a Kineto trace",
        )
    return doc


# --- one rank file ---------------------------------------------------------------------------


def _number(source: str, index: int, event: Mapping[str, object], key: str) -> float:
    value = event.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TraceError(source, f"traceEvents[{index}].{key}", value, "not a finite number")
    return float(value)


def _args_of(event: Mapping[str, object]) -> Mapping[str, object]:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _parse_rank_file(source: str, data: bytes) -> _RankFile:
    doc = _load_json(source, data)
    events = doc["traceEvents"]
    assert isinstance(events, list)
    info = _distributed_info(source, doc)

    steps: dict[int, _Step] = {}
    comm_events: dict[str, list[_RawEvent]] = {}
    launches: dict[int, _Launch] = {}
    kernels: list[_RawEvent] = []
    first_us = math.inf
    last_us = -math.inf
    window_end: float | None = None
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise TraceError(source, f"traceEvents[{index}]", event, "event is not an object")
        phase = event.get("ph")
        name = event.get("name")
        if phase == "i" and name == "Record Window End":
            window_end = _number(source, index, event, "ts")
            continue
        if phase != "X" or not isinstance(name, str):
            continue
        start = _number(source, index, event, "ts")
        duration = _number(source, index, event, "dur")
        if duration < 0:
            raise TraceError(source, f"traceEvents[{index}].dur", duration, "negative duration")
        end = start + duration
        first_us = min(first_us, start)
        last_us = max(last_us, end)
        cat = event.get("cat")
        if cat is not None and not isinstance(cat, str):
            raise TraceError(source, f"traceEvents[{index}].cat", cat, "not a string")
        args = _args_of(event)
        thread = f"{event.get('pid')}/{event.get('tid')}"
        raw = _RawEvent(name, thread, start, end, args)
        step_match = _STEP_RE.match(name)
        if step_match and cat in _CPU_CATS:
            number = int(step_match.group(1))
            steps[number] = _Step(number, _Span(start, end))
        elif cat in _CPU_CATS and (
            name == "record_param_comms" or name.startswith(("nccl:", "c10d::"))
        ):
            comm_events.setdefault(thread, []).append(raw)
        elif cat in _RUNTIME_CATS and isinstance(args.get("correlation"), int):
            correlation = args["correlation"]
            assert isinstance(correlation, int)
            launches[correlation] = _Launch(thread, start)
        elif cat == "kernel" and (
            name.startswith(_NCCL_KERNEL_PREFIXES) or "Collective name" in args
        ):
            kernels.append(raw)
    if not math.isfinite(first_us):
        raise TraceError(source, "traceEvents", len(events), "no complete ('X') events")

    calls = _calls_from_cpu(comm_events)
    orphans = _link_kernels(calls, kernels, launches)
    return _RankFile(
        source=source,
        rank=info.rank,
        world_size=info.world_size,
        steps=steps,
        calls=tuple(calls),
        window=_Span(first_us, last_us if window_end is None else max(window_end, first_us)),
        has_nccl_kernels=bool(kernels),
        orphan_kernels=orphans,
        pg_table=info.pg_table,
    )


def _distributed_info(source: str, doc: Mapping[str, object]) -> _DistInfo:
    info = doc.get("distributedInfo")
    if info is None:
        return _DistInfo(None, None, {})
    if not isinstance(info, dict):
        raise TraceError(source, "distributedInfo", info, "not an object")
    rank = _opt_int(source, "distributedInfo.rank", info.get("rank"))
    world = _opt_int(source, "distributedInfo.world_size", info.get("world_size"))
    if rank is not None and rank < 0:
        raise TraceError(source, "distributedInfo.rank", rank, "negative rank")
    if world is not None and not 1 <= world <= MAX_WORLD_SIZE:
        raise TraceError(source, "distributedInfo.world_size", world,
                         f"must be 1..{MAX_WORLD_SIZE} (MAX_WORLD_SIZE)")
    table: dict[str, tuple[int, ...]] = {}
    configs = info.get("pg_config")
    if isinstance(configs, list):
        for i, cfg in enumerate(configs):
            if not isinstance(cfg, dict) or "pg_name" not in cfg or "ranks" not in cfg:
                continue
            parsed = _int_list(source, f"distributedInfo.pg_config[{i}].ranks", cfg["ranks"])
            size = _opt_int(source, f"distributedInfo.pg_config[{i}].pg_size", cfg.get("pg_size"))
            if parsed.truncated:
                continue
            ranks = parsed.values
            if not ranks and size is not None and size > 0:
                ranks = tuple(range(size))
            if ranks:
                table[str(cfg["pg_name"])] = ranks
    return _DistInfo(rank, world, table)


def _calls_from_cpu(comm_events: Mapping[str, list[_RawEvent]]) -> list[_Call]:
    """Group each thread's nested comm CPU events into calls (one per outermost event)."""
    calls: list[_Call] = []
    for thread, evs in comm_events.items():
        evs.sort(key=lambda e: (e.start_us, -e.end_us))
        cluster: list[_RawEvent] = []
        for ev in evs:
            outer = cluster[0] if cluster else None
            if outer and ev.start_us <= outer.end_us and (
                    ev.end_us <= outer.end_us + _eps_us(outer.end_us)):
                cluster.append(ev)
                continue
            if cluster:
                calls.extend(_call_from_cluster(thread, cluster))
            cluster = [ev]
        if cluster:
            calls.extend(_call_from_cluster(thread, cluster))
    return calls


def _call_from_cluster(thread: str, cluster: Sequence[_RawEvent]) -> list[_Call]:
    rpc = next(
        (e for e in cluster if e.name == "record_param_comms" and "Collective name" in e.args), None
    )
    annotation = next((e for e in cluster if e.name.startswith("nccl:")), None)
    c10d = next((e for e in cluster if e.name.startswith("c10d::")), None)
    if rpc is not None:
        name = str(rpc.args["Collective name"])
    elif annotation is not None:
        name = annotation.name[len("nccl:") :]
    elif c10d is not None:
        name = c10d.name[len("c10d::") :].rstrip("_")
    else:
        return []  # a bare record_param_comms without metadata: a wait / barrier marker
    dims_source = annotation if annotation is not None and "Input Dims" in annotation.args else None
    if dims_source is None:
        dims_source = next((e for e in cluster if "Input Dims" in e.args and e is not c10d), None)
    return [
        _Call(
            thread=thread,
            cpu=_Span(cluster[0].start_us, cluster[0].end_us),
            name=name,
            meta=dict(rpc.args) if rpc is not None else {},
            dims=dims_source.args.get("Input Dims") if dims_source else None,
            dim_types=dims_source.args.get("Input type") if dims_source else None,
            c10d_dims=c10d.args.get("Input Dims") if c10d is not None else None,
            external_ids=frozenset(
                ext for e in cluster if isinstance(ext := e.args.get("External id"), int)
            ),
        )
    ]


class _CallIndex:
    """Finds the call whose CPU span contains a kernel launch (calls on one thread are
    disjoint: each is an outermost nest)."""

    def __init__(self, calls: Sequence[_Call]) -> None:
        self._spans: dict[str, list[_Span]] = {}
        self._indices: dict[str, list[int]] = {}
        for i in sorted(range(len(calls)), key=lambda i: _cpu_span(calls[i]).start_us):
            self._spans.setdefault(calls[i].thread, []).append(_cpu_span(calls[i]))
            self._indices.setdefault(calls[i].thread, []).append(i)
        self._starts = {t: [s.start_us for s in spans] for t, spans in self._spans.items()}

    def containing(self, launch: _Launch) -> int | None:
        starts = self._starts.get(launch.thread)
        if not starts:
            return None
        eps = _eps_us(launch.ts_us)
        pos = bisect.bisect_right(starts, launch.ts_us + eps) - 1
        if pos < 0:
            return None
        span = self._spans[launch.thread][pos]
        inside = span.start_us - eps <= launch.ts_us <= span.end_us + eps
        return self._indices[launch.thread][pos] if inside else None


def _cpu_span(call: _Call) -> _Span:
    assert call.cpu is not None
    return call.cpu


def _link_kernels(
    calls: list[_Call], kernels: Sequence[_RawEvent], launches: Mapping[int, _Launch]
) -> int:
    """Attach each NCCL kernel to the call that launched it; returns kernels left unexplained."""
    index = _CallIndex(calls)
    by_external = {ext: i for i, call in enumerate(calls) for ext in call.external_ids}
    orphans = 0
    for kernel in kernels:
        correlation = kernel.args.get("correlation")
        launch = launches.get(correlation) if isinstance(correlation, int) else None
        target = index.containing(launch) if launch is not None else None
        if target is None:
            ext = kernel.args.get("External id")
            if isinstance(ext, int) and ext != kernel.args.get("correlation"):
                target = by_external.get(ext)
        span = _Span(kernel.start_us, kernel.end_us)
        if target is not None:
            call = calls[target]
            call.kernels.append(span)
            for key, value in kernel.args.items():
                # Kineto copies the CPU op's NCCL metadata onto the kernel, sometimes only part
                # of it; the CPU op wins where both have a key.
                if key in _NCCL_META_KEYS and key not in call.meta:
                    call.meta[key] = value
        elif "Collective name" in kernel.args:
            calls.append(
                _Call(
                    thread=kernel.thread,
                    cpu=None,
                    name=str(kernel.args["Collective name"]),
                    meta={k: v for k, v in kernel.args.items() if k in _NCCL_META_KEYS},
                    dims=None,
                    dim_types=None,
                    c10d_dims=None,
                    kernels=[span],
                )
            )
        else:
            orphans += 1
    return orphans


# --- metadata values -------------------------------------------------------------------------


def _opt_int(source: str, field_name: str, value: object) -> int | None:
    """An integer field that may be absent (``None``); numeric strings are accepted."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TraceError(source, field_name, value, "not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise TraceError(source, field_name, value, "not an integer")


def _int_list(source: str, field_name: str, value: object) -> _IntList:
    """A list of ints written as a JSON list or as the profiler's string ``"[0, 1, ...]"``.

    A trailing ``...`` (``format_list`` in PyTorch truncates after 30 entries) marks the list as
    truncated; the entries before it are kept.
    """
    items: list[object]
    if isinstance(value, list):
        items = list(value)
    elif isinstance(value, str):
        text = value.strip()
        if not (text.startswith("[") and text.endswith("]")):
            raise TraceError(source, field_name, value, "not a list like '[0, 1]'")
        inner = text[1:-1].strip()
        items = [part.strip() for part in inner.split(",")] if inner else []
    else:
        raise TraceError(source, field_name, value, "not a list of integers")
    truncated = False
    if items and items[-1] == _TRUNCATION_MARK:
        truncated = True
        items = items[:-1]
    values = []
    for item in items:
        number = _opt_int(source, field_name, item)
        if number is None:
            raise TraceError(source, field_name, value, "not a list of integers")
        values.append(number)
    return _IntList(tuple(values), truncated)


@dataclass(frozen=True, slots=True)
class _Mapped:
    collective: Collective
    direction: Direction | None


_SILENT_NAMES = frozenset({"", "wait", "barrier", "coalesced", "monitoredbarrier"})


def _classify(name: str) -> _Mapped | _Skipped | None:
    """Collective for a PyTorch collective name (``allreduce``, ``_allgather_base``,
    ``all_to_allv``, ``nccl:send 0->1`` ...); ``None`` for names that move no data (wait,
    barrier, coalescing markers); :class:`_Skipped` for collectives outside :class:`Collective`
    (reduce, gather, scatter, ...)."""
    token = name.strip().split(" ")[0].lower() if name.strip() else ""
    key = token.replace("_", "")
    if key in _SILENT_NAMES:
        return None
    if key in {"send", "isend"}:
        return _Mapped(Collective.SEND_RECV, Direction.SEND)
    if key in ("recv", "irecv", "recvanysource"):
        return _Mapped(Collective.SEND_RECV, Direction.RECV)
    for prefix, collective in (
        ("allreduce", Collective.ALL_REDUCE),
        ("reducescatter", Collective.REDUCE_SCATTER),
        ("allgather", Collective.ALL_GATHER),
        ("alltoall", Collective.ALL_TO_ALL),
        ("broadcast", Collective.BROADCAST),
    ):
        if key.startswith(prefix):
            return _Mapped(collective, None)
    return _Skipped(token or name)


@dataclass(frozen=True, slots=True)
class _Sizes:
    in_nbytes: int
    in_elems: int | None
    out_elems: int | None
    elem_nbytes: int | None


def _sizes(source: str, call: _Call, where: str) -> _Sizes:
    meta = call.meta
    if "In msg nelems" in meta:
        in_elems = _opt_int(source, f"In msg nelems ({where})", meta["In msg nelems"])
        out_elems = _opt_int(source, f"Out msg nelems ({where})", meta.get("Out msg nelems"))
        if in_elems is None or in_elems < 0:
            raise TraceError(source, f"In msg nelems ({where})", in_elems, "must be >= 0")
        dtype = meta.get("dtype")
        elem = _DTYPE_NBYTES.get(str(dtype)) if isinstance(dtype, str) else None
        if elem is None:
            raise TraceError(source, f"dtype ({where})", dtype, "unknown element type")
        if in_elems * elem > MAX_MESSAGE_BYTES:
            raise TraceError(source, f"In msg nelems ({where})", in_elems,
                             f"{in_elems * elem} B > {MAX_MESSAGE_BYTES} B (MAX_MESSAGE_BYTES)")
        return _Sizes(in_elems * elem, in_elems, out_elems, elem)
    if call.dims is not None:
        return _sizes_from_dims(source, call, where)
    raise TraceError(
        source, f"In msg nelems ({where})", None,
        f"collective {call.name!r} records no size (no 'In msg nelems', no 'Input Dims')",
    )


def _sizes_from_dims(source: str, call: _Call, where: str) -> _Sizes:
    dims, types = call.dims, call.dim_types
    if not isinstance(dims, list) or (types is not None and not isinstance(types, list)):
        raise TraceError(source, f"Input Dims ({where})", dims, "not a list of shapes")
    type_list: list[object] = list(types) if isinstance(types, list) else []
    total = 0
    elems = 0
    elem_sizes = set()
    for i, shape in enumerate(dims):
        kind = type_list[i] if i < len(type_list) else None
        elem = _DTYPE_NBYTES.get(kind) if isinstance(kind, str) else None
        if elem is None:
            continue  # TensorList, Scalar, or an argument that is not a tensor
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise TraceError(source, f"Input Dims ({where})", dims, "shape is not a list of sizes")
        numel = math.prod(shape)
        total += numel * elem
        elems += numel
        elem_sizes.add(elem)
    if not elem_sizes:
        raise TraceError(
            source, f"Input Dims ({where})", dims, f"no tensor of a known type (types: {types})"
        )
    if total > MAX_MESSAGE_BYTES:
        raise TraceError(source, f"Input Dims ({where})", dims,
                         f"{total} B > {MAX_MESSAGE_BYTES} B (MAX_MESSAGE_BYTES)")
    uniform = len(elem_sizes) == 1
    return _Sizes(total, elems if uniform else None, None, elem_sizes.pop() if uniform else None)


def _resolve_group(
    source: str, call: _Call, where: str, world_size: int, pg_table: Mapping[str, tuple[int, ...]]
) -> _GroupInfo:
    meta = call.meta
    name = meta.get("Process Group Name")
    size = _opt_int(source, f"Group size ({where})", meta.get("Group size"))
    start = _opt_int(source, f"Global rank start ({where})", meta.get("Global rank start"))
    stride = _opt_int(source, f"Global rank stride ({where})", meta.get("Global rank stride"))
    arithmetic: tuple[int, ...] | None = None
    if start is not None and start >= 0 and stride and stride > 0 and size and size > 0:
        arithmetic = tuple(range(start, start + stride * size, stride))
    by_name = pg_table.get(str(name)) if name is not None else None
    if "Process Group Ranks" in meta:
        return _group_from_rank_list(source, meta["Process Group Ranks"], where, size,
                                     arithmetic, by_name)
    if arithmetic is not None:
        note = "process group from Global rank start/stride (no rank list recorded)"
        return _GroupInfo(ProcessGroup.of(arithmetic), arithmetic, (note,), False)
    if by_name is not None and (size is None or len(by_name) == size):
        note = f"process group {name!s} from distributedInfo.pg_config (no rank list recorded)"
        return _GroupInfo(ProcessGroup.of(by_name), by_name, (note,), False)
    if size is not None and size == world_size:
        world = tuple(range(world_size))
        note = f"no rank list recorded; Group size {size} equals the world size"
        return _GroupInfo(ProcessGroup.of(world), world, (note,), False)
    if size is not None:
        return _GroupInfo(None, None, (f"process group of {size} ranks, ranks not recorded",), True)
    return _GroupInfo(None, None, ("no process group recorded",), True)


def _group_from_rank_list(
    source: str,
    recorded: object,
    where: str,
    size: int | None,
    arithmetic: tuple[int, ...] | None,
    by_name: tuple[int, ...] | None,
) -> _GroupInfo:
    """The group of a call that records ``Process Group Ranks`` (``recorded``), checked
    against its ``Group size`` (``size``). A list the profiler truncated is completed from the
    start/stride ranks (``arithmetic``) or the named group of ``distributedInfo.pg_config``
    (``by_name``) when one of them extends it; else the group is unknown. An empty list is the
    default group ``0 .. size-1``. Raises ``TraceError`` on a malformed list, an empty one
    without a size, a length other than ``size``, or a duplicate or negative rank."""
    field_name = f"Process Group Ranks ({where})"
    parsed = _int_list(source, field_name, recorded)
    if parsed.truncated:
        prefix = parsed.values
        for candidate, origin in ((arithmetic, "Global rank start/stride"),
                                  (by_name, "distributedInfo.pg_config")):
            if candidate and candidate[: len(prefix)] == prefix and (
                size is None or len(candidate) == size
            ):
                note = f"Process Group Ranks truncated by the profiler; ranks from {origin}"
                return _GroupInfo(ProcessGroup.of(candidate), candidate, (note,), False)
        note = (
            f"Process Group Ranks truncated after {len(prefix)} of {size} ranks and no "
            "start/stride recorded: process group unknown"
        )
        return _GroupInfo(None, None, (note,), True)
    if not parsed.values:
        if size is None or size < 1:
            raise TraceError(
                source, f"Group size ({where})", size, "needed to read an empty rank list"
            )
        ranks = tuple(range(size))
        note = f"empty Process Group Ranks read as ranks 0..{size - 1} (the default group)"
        return _GroupInfo(ProcessGroup.of(ranks), ranks, (note,), False)
    ranks = parsed.values
    if size is not None and size != len(ranks):
        raise TraceError(source, field_name, recorded,
                         f"{len(ranks)} ranks but Group size is {size}")
    if len(set(ranks)) != len(ranks) or min(ranks) < 0:
        raise TraceError(source, field_name, recorded, "duplicate or negative rank")
    return _GroupInfo(ProcessGroup.of(ranks), ranks, (), False)


def _splits(
    source: str,
    call: _Call,
    *,
    key: str,
    where: str,
    elems: int | None,
    elem_nbytes: int | None,
    group: _GroupInfo,
) -> tuple[tuple[int, ...] | None, tuple[str, ...]]:
    """Per-peer bytes from ``In split size`` / ``Out split size`` (rows of dim 0 per peer, in
    group-rank order; ``[]`` = equal splits). Returns (splits or None, notes if not exact)."""
    raw = call.meta.get(key)
    if raw is None:
        return None, (f"{key} not recorded: per-peer bytes unknown",)
    parsed = _int_list(source, f"{key} ({where})", raw)
    size_hint = _opt_int(source, f"Group size ({where})", call.meta.get("Group size"))
    n = group.group.size if group.group is not None else size_hint
    if parsed.truncated:
        return None, (
            f"{key} truncated by the profiler after {len(parsed.values)} of {n} entries: "
            "per-peer bytes unknown (nbytes is the recorded total)",
        )
    if elems is None or elem_nbytes is None:
        return None, (f"{key}: element count unknown, per-peer bytes unknown",)
    if not parsed.values:
        if n is None or n < 1:
            return None, (f"{key} is [] (equal splits) but the group size is unknown",)
        if elems % n:
            return None, (f"{key} is [] but {elems} elements do not split evenly over {n} ranks",)
        return _in_group_order((elems // n * elem_nbytes,) * n, group), ()
    values = parsed.values
    if n is not None and len(values) != n:
        raise TraceError(source, f"{key} ({where})", raw, f"{len(values)} entries for {n} ranks")
    if any(v < 0 for v in values):
        raise TraceError(source, f"{key} ({where})", raw, "negative split")
    rows = sum(values)
    if rows == 0:
        if elems:
            raise TraceError(source, f"{key} ({where})", raw, f"all zero but {elems} elements")
        return _in_group_order(values, group), ()
    if elems % rows:
        raise TraceError(source, f"{key} ({where})", raw,
                         f"sums to {rows} rows but {elems} elements are not whole rows")
    per_row = elems // rows * elem_nbytes
    return _in_group_order(tuple(v * per_row for v in values), group), ()


def _in_group_order(splits: tuple[int, ...], group: _GroupInfo) -> tuple[int, ...]:
    """Reorder splits recorded in ``Process Group Ranks`` order to ascending global rank."""
    order = group.recorded_order
    if order is None or list(order) == sorted(order) or len(order) != len(splits):
        return splits
    by_rank = dict(zip(order, splits, strict=True))
    return tuple(by_rank[r] for r in sorted(order))


def _peer(
    source: str, call: _Call, mapped: _Mapped, where: str
) -> tuple[int | None, tuple[str, ...]]:
    key = "Dst Rank" if mapped.direction is Direction.SEND else "Src Rank"
    peer = _opt_int(source, f"{key} ({where})", call.meta.get(key))
    if peer is not None:
        return peer, ()
    match = _P2P_TITLE_RE.search(call.name)
    if match:
        return int(match.group(2)), ("peer from the profiling title 'nccl:send a->b' (group rank)",)
    return None, (f"{key} not recorded: peer unknown",)


# --- calls -> ops ----------------------------------------------------------------------------


def _to_timed(
    source: str,
    rank: int,
    call: _Call,
    *,
    world_size: int,
    pg_table: Mapping[str, tuple[int, ...]],
    has_kernels: bool,
) -> _Timed | _Skipped | None:
    mapped = _classify(call.name)
    if not isinstance(mapped, _Mapped):
        return mapped
    where = f"{call.name!r} call at ts={call.issue_us:.3f}us"
    sizes = _sizes(source, call, where)
    group = _resolve_group(source, call, where, world_size, pg_table)
    if group.group is not None and not group.group.contains(rank):
        raise TraceError(source, f"Process Group Ranks ({where})", group.group.ranks,
                         f"does not contain this file's rank {rank}")
    notes = list(group.notes)
    approximate = group.approximate
    split_nbytes = recv_split_nbytes = None
    direction = peer = None
    if mapped.collective is Collective.ALL_TO_ALL:
        split_nbytes, split_notes = _splits(
            source, call, key="In split size", where=where, elems=sizes.in_elems,
            elem_nbytes=sizes.elem_nbytes, group=group,
        )
        recv_split_nbytes, recv_notes = _splits(
            source, call, key="Out split size", where=where, elems=sizes.out_elems,
            elem_nbytes=sizes.elem_nbytes, group=group,
        )
        if split_nbytes is not None and sum(split_nbytes) != sizes.in_nbytes:
            raise TraceError(
                source, f"In split size ({where})", call.meta.get("In split size"),
                f"splits add up to {sum(split_nbytes)} B, input is {sizes.in_nbytes} B",
            )
        if split_notes:
            notes.extend(split_notes)
            approximate = True
        elif recv_notes:
            notes.extend(recv_notes)
        notes.extend(_uneven_note(call))
    elif mapped.collective is Collective.SEND_RECV:
        direction = mapped.direction
        peer, peer_notes = _peer(source, call, mapped, where)
        notes.extend(peer_notes)
        approximate = approximate or peer is None
    if call.kernels:
        span = _Span(min(k.start_us for k in call.kernels), max(k.end_us for k in call.kernels))
    else:
        assert call.cpu is not None
        span = call.cpu
        if has_kernels:
            notes.append("no GPU kernel recorded for this call: timing from the CPU call")
    name = call.meta.get("Process Group Name")
    desc = call.meta.get("Process Group Description")
    group_name = str(name) if name is not None else (str(desc) if desc is not None else "")
    op = CommOp(
        collective=mapped.collective,
        group=group.group,
        group_name=group_name,
        nbytes=sizes.in_nbytes,
        compute_gap_s=0.0,
        approximate=approximate,
        notes=tuple(notes),
        split_nbytes=split_nbytes,
        recv_split_nbytes=recv_split_nbytes,
        direction=direction,
        peer=peer,
    )
    return _Timed(op, call.issue_us, span, on_gpu=bool(call.kernels))


def _uneven_note(call: _Call) -> tuple[str, ...]:
    """Legacy traces: ``c10d::alltoall_base_`` Input Dims are [output, input, ...]."""
    dims = call.c10d_dims
    if not (isinstance(dims, list) and len(dims) >= 2):
        return ()
    out_shape, in_shape = dims[0], dims[1]
    if not (isinstance(out_shape, list) and isinstance(in_shape, list) and out_shape and in_shape):
        return ()
    if not all(isinstance(d, int) for d in (*out_shape, *in_shape)):
        return ()
    out_elems, in_elems = math.prod(out_shape), math.prod(in_shape)
    if out_elems == in_elems:
        return ()
    return (f"receives {out_elems} elements but sends {in_elems}: the exchange is uneven",)


# --- workload ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _RankOps:
    rank: int
    file: _RankFile
    timed: tuple[_Timed, ...]
    skipped: tuple[str, ...]


def _rank_of(file: _RankFile, single: bool) -> tuple[int, str | None]:
    if file.rank is not None:
        return file.rank, None
    match = _RANK_IN_NAME_RE.search(Path(file.source.split("!")[-1]).name)
    if match:
        return int(match.group(1)), f"rank of {file.source} taken from its file name"
    if single:
        return 0, "no rank recorded (distributedInfo.rank); rank 0 assumed"
    raise TraceError(file.source, "distributedInfo.rank", None,
                     "no rank recorded and none in the file name")


def _ranked_files(files: Sequence[_RankFile], assumptions: list[str]) -> dict[int, _RankFile]:
    """Each trace file by the rank it records (``_rank_of``; how a rank was found when not
    recorded is appended to ``assumptions``). Raises ``TraceError`` when two files claim one
    rank, or a file of several has no rank."""
    ranked: dict[int, _RankFile] = {}
    for file in files:
        rank, note = _rank_of(file, len(files) == 1)
        if note:
            assumptions.append(note)
        if rank in ranked:
            raise TraceError(file.source, "distributedInfo.rank", rank,
                             f"rank already read from {ranked[rank].source}")
        ranked[rank] = file
    return ranked


def _world_of(path: Path, ranked: Mapping[int, _RankFile], assumptions: list[str]) -> int:
    """The job's world size: the one the files record, else inferred from the ranks and group
    sizes seen (said in ``assumptions``). Raises ``TraceError`` when the files disagree or a
    rank falls outside it."""
    worlds = {f.world_size for f in ranked.values() if f.world_size is not None}
    if len(worlds) > 1:
        raise TraceError(path, "distributedInfo.world_size", sorted(worlds), "ranks disagree")
    if worlds:
        world_size = worlds.pop()
    else:
        world_size = _infer_world(ranked)
        assumptions.append(f"world size not recorded; {world_size} inferred from the ranks seen")
    for rank, file in ranked.items():
        if rank >= world_size:
            raise TraceError(file.source, "distributedInfo.rank", rank,
                             f"outside the world of {world_size} ranks")
    return world_size


def _build_workload(path: Path, files: list[_RankFile], step: int | None) -> Workload:
    assumptions: list[str] = []
    ranked = _ranked_files(files, assumptions)
    world_size = _world_of(path, ranked, assumptions)

    per_rank = {
        rank: _rank_ops(rank, file, world_size) for rank, file in sorted(ranked.items())
    }
    legacy = not any(call.meta for file in files for call in file.calls)
    label, spans = _select_step(path, per_rank, step, assumptions)
    ops: dict[int, tuple[CommOp, ...]] = {}
    tails: dict[int, float] = {}
    for rank, rank_ops in per_rank.items():
        ops[rank], tails[rank] = _sequence(rank_ops, spans[rank])
        _report_skips(rank_ops, assumptions)
    if legacy and any(op.group is None for seq in ops.values() for op in seq):
        ops = _assume_world(ops, world_size)
        assumptions.append(
            "no process group recorded (Kineto trace without record_param_comms metadata): the "
            f"world group of {world_size} ranks is assumed for every collective"
        )
    if any(
        op.collective is Collective.ALL_TO_ALL and op.split_nbytes is None
        for seq in ops.values() for op in seq
    ):
        assumptions.append(
            "some all-to-all calls have no exact per-peer split sizes; a replay has to assume "
            "equal splits for them (see each call's notes)"
        )
    if any(not r.file.has_nccl_kernels for r in per_rank.values()):
        assumptions.append("some ranks have no NCCL kernels in their trace: their gaps come from "
                           "the CPU timeline")
    else:
        assumptions.append(
            "compute gaps from the GPU timeline (NCCL kernel start minus the previous call's "
            "kernel end); they include idle time and waiting for peers"
        )
    ops, tails = _expand_partial(ops, tails, world_size, assumptions)
    return Workload(
        name=path.name,
        source_format=SourceFormat.KINETO,
        world_size=world_size,
        ranks=ops,
        assumptions=tuple(assumptions),
        iteration=label,
        tail_gap_s=tails,
    )


def _infer_world(ranked: Mapping[int, _RankFile]) -> int:
    highest = max(ranked)
    for file in ranked.values():
        for call in file.calls:
            size = call.meta.get("Group size")
            if isinstance(size, int):
                highest = max(highest, size - 1)
    return highest + 1


def _rank_ops(rank: int, file: _RankFile, world_size: int) -> _RankOps:
    timed: list[_Timed] = []
    skipped: list[str] = []
    for call in file.calls:
        result = _to_timed(
            file.source, rank, call, world_size=world_size, pg_table=file.pg_table,
            has_kernels=file.has_nccl_kernels,
        )
        if isinstance(result, _Timed):
            timed.append(result)
        elif isinstance(result, _Skipped):
            skipped.append(result.name)
    timed.sort(key=lambda t: (t.issue_us, t.span.start_us))
    return _RankOps(rank, file, tuple(timed), tuple(skipped))


def _select_step(
    path: Path, per_rank: Mapping[int, _RankOps], step: int | None, assumptions: list[str]
) -> tuple[str, dict[int, _Span]]:
    with_steps = {rank for rank, r in per_rank.items() if r.file.steps}
    if not with_steps:
        if step is not None:
            raise TraceError(path, "ProfilerStep", step, "the trace has no ProfilerStep spans")
        assumptions.append("no ProfilerStep spans: the whole trace window is one iteration")
        return "whole trace", {rank: r.file.window for rank, r in per_rank.items()}
    if with_steps != set(per_rank):
        missing = sorted(set(per_rank) - with_steps)
        raise TraceError(per_rank[missing[0]].file.source, "ProfilerStep", None,
                         "this rank has no ProfilerStep spans but other ranks do")
    common = set.intersection(*(set(r.file.steps) for r in per_rank.values()))
    if step is not None:
        for r in per_rank.values():
            if step not in r.file.steps:
                raise TraceError(r.file.source, "ProfilerStep", step,
                                 f"not recorded (steps: {sorted(r.file.steps)})")
        chosen = step
        why = "requested"
    else:
        if not common:
            raise TraceError(path, "ProfilerStep", None, "no step number recorded on every rank")
        complete = [n for n in common if all(_complete(r, n) for r in per_rank.values())]
        if complete:
            chosen, why = max(complete), "the latest step complete on every rank"
        else:
            chosen, why = max(common), "no step is complete on every rank; the latest one"
    assumptions.append(
        f"iteration: ProfilerStep#{chosen} ({why}; steps recorded on every rank: "
        f"{', '.join(map(str, sorted(common)))})"
    )
    return f"ProfilerStep#{chosen}", {
        rank: r.file.steps[chosen].span for rank, r in per_rank.items()
    }


def _complete(rank_ops: _RankOps, number: int) -> bool:
    span = rank_ops.file.steps[number].span
    if span.end_us > rank_ops.file.window.end_us + _eps_us(span.end_us):
        return False
    if not rank_ops.file.has_nccl_kernels:
        return True
    return all(t.on_gpu for t in rank_ops.timed if span.start_us <= t.issue_us < span.end_us)


def _sequence(rank_ops: _RankOps, span: _Span) -> tuple[tuple[CommOp, ...], float]:
    """The calls issued inside ``span``, with gaps; returns (ops, tail gap in seconds)."""
    chosen = [t for t in rank_ops.timed if span.start_us <= t.issue_us < span.end_us]
    result: list[CommOp] = []
    previous_end = span.start_us
    for timed in chosen:
        gap_us = timed.span.start_us - previous_end
        op = timed.op
        if gap_us < 0:
            op = replace(op, notes=(*op.notes, f"overlaps the previous call by {-gap_us:.1f} us"))
        result.append(replace(op, compute_gap_s=max(0.0, gap_us) * _US))
        previous_end = max(previous_end, timed.span.end_us)
    tail_s = max(0.0, span.end_us - previous_end) * _US
    return tuple(result), tail_s


def _report_skips(rank_ops: _RankOps, assumptions: list[str]) -> None:
    counts: dict[str, int] = {}
    for name in rank_ops.skipped:
        counts[name] = counts.get(name, 0) + 1
    for name, count in sorted(counts.items()):
        assumptions.append(f"rank {rank_ops.rank}: {count} {name!r} call(s) skipped: not a "
                           "collective Lightrail models")
    if rank_ops.file.orphan_kernels:
        assumptions.append(
            f"rank {rank_ops.rank}: {rank_ops.file.orphan_kernels} NCCL kernel(s) with neither "
            "metadata nor an enqueuing CPU op were ignored"
        )


def _assume_world(
    ops: Mapping[int, tuple[CommOp, ...]], world_size: int
) -> dict[int, tuple[CommOp, ...]]:
    world = ProcessGroup.of(tuple(range(world_size)))
    note = f"world group assumed ({world_size} ranks): the trace records no process group"
    return {
        rank: tuple(
            op if op.group is not None else replace(
                op,
                group=world,
                group_name=op.group_name or "world (assumed)",
                approximate=True,
                notes=(*(n for n in op.notes if n != "no process group recorded"), note),
                split_nbytes=op.split_nbytes if op.split_nbytes is None
                or len(op.split_nbytes) == world_size else None,
                recv_split_nbytes=op.recv_split_nbytes if op.recv_split_nbytes is None
                or len(op.recv_split_nbytes) == world_size else None,
            )
            for op in seq
        )
        for rank, seq in ops.items()
    }


def _expand_partial(
    ops: dict[int, tuple[CommOp, ...]],
    tails: dict[int, float],
    world_size: int,
    assumptions: list[str],
) -> tuple[dict[int, tuple[CommOp, ...]], dict[int, float]]:
    """Give unrecorded ranks the sequence of a recorded rank when they share all its groups."""
    missing = [r for r in range(world_size) if r not in ops]
    if not missing:
        return ops, tails
    recorded = sorted(ops)
    added: dict[int, int] = {}
    # Linear in the world size: group membership is a set lookup, and the ranks copied from
    # one source share one sequence (a world of 10^6 ranks once took hours here).
    for target in missing:
        for source in recorded:
            seq = ops[source]
            if seq and all(
                op.group is not None and op.group.contains(target)
                and op.collective is not Collective.SEND_RECV
                for op in seq
            ):
                added[target] = source
                break
    copies: dict[int, tuple[CommOp, ...]] = {}
    for target, source in added.items():
        copied = copies.get(source)
        if copied is None:
            note = f"copied from rank {source}: this rank is not in the trace"
            copied = copies[source] = tuple(
                replace(op, approximate=True, notes=(*op.notes, note), split_nbytes=None,
                        recv_split_nbytes=None)
                for op in ops[source]
            )
        ops[target] = copied
        tails[target] = tails[source]
    by_source: dict[int, list[int]] = {}
    for target, source in added.items():
        by_source.setdefault(source, []).append(target)
    listed = ", ".join(map(str, recorded))
    assumptions.append(f"trace records rank(s) {listed} of {world_size}")
    for source, targets in sorted(by_source.items()):
        assumptions.append(
            f"rank(s) {', '.join(map(str, targets))} assumed to run the same sequence as rank "
            f"{source} (they belong to every process group it uses)"
        )
    rest = [r for r in missing if r not in added]
    if rest:
        shown = ", ".join(map(str, rest[:16])) + (" ..." if len(rest) > 16 else "")
        assumptions.append(f"ranks {shown} are not in the trace and cannot be derived; absent")
    return ops, tails
