"""The NCCL socket's frame codec (lightrail.agents.nccl.wire): round trips of every frame,
bad input rejected with ``FrameError`` naming the field (property-based, settings of
tests/fuzz.py), and the constants of the C header (agents/nccl/lightrail_nccl_wire.h) equal to
the codec's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightrail.agents.nccl import wire
from lightrail.agents.nccl.registration import register_comm
from lightrail.controller.domain.model import Collective
from tests.fuzz import fuzz_settings

HEADER = Path(__file__).resolve().parents[2] / "agents" / "nccl" / "lightrail_nccl_wire.h"

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"),
               max_size=40)
collective = st.sampled_from(list(Collective))


@st.composite
def registers(draw: st.DrawFn) -> wire.Register:
    ranks = draw(st.lists(u32, min_size=1, max_size=16, unique=True))
    name = draw(text)
    comm_hash = draw(u64.filter(lambda h: h != 0)) if not name else draw(u64)
    return wire.Register(name, comm_hash, draw(text.filter(bool)), tuple(ranks),
                         draw(st.sampled_from(ranks)), draw(st.booleans()))


@st.composite
def inits(draw: st.DrawFn) -> wire.Init:
    nranks = draw(st.integers(1, 2**32 - 1))
    return wire.Init(draw(u32), nranks, draw(st.integers(0, nranks - 1)), draw(u32), draw(u64),
                     draw(text))


frames = st.one_of(
    inits(),
    st.builds(wire.Enter, u32, collective, u64, u64, st.integers(1, 2**32 - 1)),
    st.builds(wire.Release, u32, collective, u64),
    st.builds(wire.Fini, u32),
    registers(),
    st.builds(wire.Admit, u64, st.sampled_from(list(wire.Status)), u32, st.booleans(), text),
    st.builds(wire.Registered, st.sampled_from(list(wire.Status)), text),
)


def _decode_all(data: bytes) -> wire.Frame:
    header = wire.decode_header(data)
    body = data[wire.HEADER_BYTES:]
    if len(body) != header.length:
        raise wire.FrameError(f"length={header.length}; {len(body)} bytes follow")
    return wire.decode(header.type, body)


@fuzz_settings(200)
@given(frames)
def test_every_frame_survives_a_round_trip(frame: wire.Frame) -> None:
    assert _decode_all(wire.encode(frame)) == frame


@fuzz_settings(200)
@given(frames, st.data())
def test_a_mutated_frame_decodes_or_is_refused_with_frame_error(
    frame: wire.Frame, data: st.DataObject
) -> None:
    raw = bytearray(wire.encode(frame))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    try:
        decoded = _decode_all(bytes(raw[:cut]))
    except wire.FrameError as exc:
        assert re.match(r"\w+( length)?=|\w+ is empty", str(exc)), str(exc)  # names the field
    else:
        assert wire.encode(decoded) == bytes(raw[:cut])


@fuzz_settings(200)
@given(st.binary(max_size=64))
def test_random_bytes_are_refused_with_frame_error(data: bytes) -> None:
    with pytest.raises(wire.FrameError):
        _decode_all(data)


@pytest.mark.parametrize(("ftype", "body", "message"), [
    (wire.FrameType.ENTER, bytes(24) + b"\1\0\0\0", "kind=0 is not a collective"),
    (wire.FrameType.ENTER, bytes([1, 0, 0, 0, 1, 0, 0, 0]) + bytes(20),
     "timeout_ms=0; an admission timeout is required"),
    (wire.FrameType.ENTER, bytes([1, 0, 0, 0, 1, 7, 0, 0]) + bytes(16) + b"\1\0\0\0",
     "pad=b'\\x07\\x00\\x00' is not zero"),
    (wire.FrameType.RELEASE, bytes(15), "length=15 for a RELEASE frame; 16 expected"),
    (wire.FrameType.INIT, bytes(26), "rank=0 is not a rank of a communicator of nranks=0"),
    (wire.FrameType.INIT, bytes([0] * 4 + [2, 0, 0, 0] + [0] * 16 + [2, 0]) + b"\xff\xfe",
     "comm_name=b'\\xff\\xfe' is not UTF-8"),
    (wire.FrameType.ADMIT, bytes(20)[:8] + b"\x63\0\0\0" + bytes(8),
     "status=99 is not a status"),
])
def test_bad_fields_are_named(ftype: wire.FrameType, body: bytes, message: str) -> None:
    with pytest.raises(wire.FrameError) as info:
        wire.decode(ftype, body)
    assert message in str(info.value)


def test_values_that_do_not_fit_are_refused_when_encoding() -> None:
    with pytest.raises(wire.FrameError, match="seq=-1 is not a u64"):
        wire.encode(wire.Release(1, Collective.ALL_REDUCE, -1))
    with pytest.raises(wire.FrameError, match="comm_name length=2000 bytes; at most 1024"):
        wire.encode(wire.Init(1, 2, 0, 1, 0, "x" * 2000))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"job_id": ""}, "job_id is empty"),
    ({"comm_name": ""}, "comm_name is empty and comm_hash=0"),
    ({"global_ranks": [0, 0]}, "ranks=[0, 0] has duplicates"),
    ({"rank": 5}, "rank=5 is not one of ranks=[0, 1]"),
])
def test_register_comm_refuses_bad_values_before_sending(
    kwargs: dict[str, object], message: str, tmp_path: Path
) -> None:
    args: dict[str, object] = {"comm_name": "dp", "job_id": "job", "global_ranks": [0, 1],
                               "rank": 0}
    args.update(kwargs)
    with pytest.raises(wire.FrameError) as info:
        register_comm(str(tmp_path / "absent.sock"), **args)  # type: ignore[arg-type]
    assert message in str(info.value)


def test_register_comm_without_an_agent_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        register_comm(str(tmp_path / "absent.sock"), "dp", "job", [0, 1], 0)


def _defines() -> dict[str, int]:
    out = {}
    for name, value in re.findall(r"^#define (LR_\w+) (0x[0-9A-Fa-f]+|\d+)u?\b",
                                  HEADER.read_text(encoding="utf-8"), re.M):
        out[name] = int(value, 0)
    return out


def test_the_c_header_and_the_codec_agree() -> None:
    d = _defines()
    assert d["LR_MAGIC"] == wire.MAGIC
    assert d["LR_MAGIC"].to_bytes(4, "little") == b"LRNC"
    assert d["LR_VERSION"] == wire.VERSION
    assert d["LR_HEADER_BYTES"] == wire.HEADER_BYTES
    assert d["LR_MAX_PAYLOAD"] == wire.MAX_PAYLOAD
    assert d["LR_MAX_NAME"] == wire.MAX_NAME
    assert {t.name: t.value for t in wire.FrameType} == {
        n[3:]: v for n, v in d.items()
        if n[3:] in {"INIT", "ENTER", "RELEASE", "FINI", "REGISTER", "ADMIT", "REGISTERED"}}
    assert {c.name: code for c, code in wire.COLLECTIVE_CODES.items()} == {
        c.name: d[f"LR_{c.name}"] for c in Collective}
    assert {s.name: s.value for s in wire.Status} == {
        "OK": d["LR_OK"],
        **{n.removeprefix("LR_STATUS_"): v for n, v in d.items() if n.startswith("LR_STATUS_")}}
