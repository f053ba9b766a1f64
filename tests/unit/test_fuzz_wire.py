"""Bad input, fuzzed (issue 10, section 5): the device-side wire parsers fed random and mutated
replies directly. TL1 bytes split into frames and decode to frames or ``Tl1SyntaxError``; the
RESTCONF JSON shape parsers give their result or ``ValueError`` (which the driver turns into
``ProtocolError``); an HTTP error answer always maps to a ``DriverError``. Never another
exception. (The drivers over real sockets: tests/integration/test_fuzz_drivers.py.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from lightrail.drivers.base import DeviceAlarm, DriverError
from lightrail.drivers.restconf.wire import (
    RawAlarm,
    alarm_from_raw,
    error_for_answer,
    parse_alarms,
    parse_cross_connects,
    parse_errors,
    parse_port_config,
    parse_power,
    parse_product_information,
)
from lightrail.drivers.tl1.wire import (
    CompletionCode,
    FrameSplitter,
    Tl1SyntaxError,
    decode_frame,
    format_response,
    parse_alarm_line,
    parse_port_list,
    port_number,
)
from tests.fuzz import fuzz_settings

FUZZ = fuzz_settings(150)
WHEN = datetime(2026, 1, 2, 3, 4, 5)

# --- TL1 ---------------------------------------------------------------------------------------

TL1_TEXT = st.one_of(
    st.text(alphabet=st.characters(codec="latin-1"), max_size=40),
    st.sampled_from(['1,9', '1:-3.0', '\u00b2,9', '9:\u00b2', 'SYSTEM:SIZE=8x8', '"', '\\',
                     '/*', '*/', ';', '>', '<', 'M  7 COMPLD', '9' * 30, 'nan', '1e999']),
)
"""Fragments a corrupt TL1 answer may hold (Latin-1: the bytes the driver decodes)."""


def _reply(ctag: str, completion: CompletionCode, error_code: str | None,
           lines: list[str], comments: list[str]) -> bytes:
    return format_response("OST", WHEN, ctag, completion, error_code=error_code, lines=lines,
                           comments=comments).encode("latin-1")


TL1_REPLY = st.builds(
    _reply, ctag=st.one_of(st.just("7"), st.text(
        alphabet=st.characters(codec="latin-1"), max_size=8).filter(lambda t: t.strip() == t)),
    completion=st.sampled_from(CompletionCode), error_code=st.one_of(
        st.none(), st.sampled_from(["IIAC", "SAAS", "PLNA", "ZZZZ", "iiac", "II"])),
    lines=st.lists(TL1_TEXT, max_size=4), comments=st.lists(TL1_TEXT, max_size=2))


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    """``base`` with bytes replaced, inserted or cut."""
    raw = bytearray(draw(base))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["replace", "insert", "cut"]))
        at = draw(st.integers(0, max(len(raw) - 1, 0)))
        if op == "replace" and raw:
            raw[at] = draw(st.integers(0, 255))
        elif op == "insert":
            raw[at:at] = draw(st.binary(max_size=8))
        else:
            del raw[at:at + draw(st.integers(1, 16))]
    return bytes(raw)


TL1_BYTES = st.one_of(mutated(TL1_REPLY), st.binary(max_size=200))


@FUZZ
@given(stream=st.lists(TL1_BYTES, min_size=1, max_size=3), chunk=st.integers(1, 64))
def test_tl1_bytes_of_any_kind_split_into_frames_or_a_syntax_error(
    stream: list[bytes], chunk: int
) -> None:
    data = b"".join(stream)
    splitter = FrameSplitter(max_chars=4096)
    try:
        for i in range(0, len(data), chunk):
            for raw in splitter.feed(data[i:i + chunk]):
                decode_frame(raw)
    except Tl1SyntaxError as exc:
        assert str(exc)


@FUZZ
@given(text=st.one_of(TL1_TEXT, st.builds(
    lambda aid, rest: f"{aid}:{rest}", st.one_of(st.just("\u00b2"), TL1_TEXT), TL1_TEXT)))
@example(text='\u00b2:CR,LOS,SA,01-02,03-04-05:"x"')
def test_tl1_alarm_and_port_lists_parse_or_give_a_syntax_error(text: str) -> None:
    for parse in (parse_alarm_line, parse_port_list):
        try:
            parse(text)
        except Tl1SyntaxError as exc:
            assert str(exc)


# --- RESTCONF ----------------------------------------------------------------------------------

JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**400), 10**400), st.floats(),
    st.text(max_size=12), st.sampled_from(["9", "\u00b2", "\u0663", "-3.00", "nan", "1e999",
                                           "ENABLED", "FAILED", "2026-01-01T00:00:00Z",
                                           "0001-01-01T00:00:00", "port 9: LOS: gone"]))
JSON = st.recursive(JSON_LEAF, lambda kids: st.one_of(
    st.lists(kids, max_size=3), st.dictionaries(st.text(max_size=10), kids, max_size=3)),
    max_leaves=12)

GOOD: dict[str, object] = {
    "optical-switch:cross-connects": {"pair": [{"ingress": 1, "egress": 9}]},
    "optical-switch:opm-power": {"port": [{"port-id": 1, "power": "-3.00"}]},
    "optical-switch:port-config": {"port": [{"port-id": 1, "status": "ENABLED"}]},
    "polatis-switch:system-alarms": {"alarm": [{
        "alarm-time": "2026-01-01T00:00:00+00:00", "alarm-type": "NOTIF_PORT_POWER",
        "alarm-message": "port 9: LOS: port 9 failed"}]},
    "optical-switch:product-information": {"manufacturer": "Polatis", "model-name": "6000"},
}
PARSERS: list[Callable[[object], object]] = [
    parse_cross_connects, parse_power, parse_port_config, parse_alarms,
    parse_product_information]


def _paths(doc: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    if isinstance(doc, dict):
        items: list[tuple[object, object]] = list(doc.items())
    elif isinstance(doc, list):
        items = list(enumerate(doc))
    else:
        return out
    for k, v in items:
        out.append((*prefix, k))
        out.extend(_paths(v, (*prefix, k)))
    return out


@st.composite
def mutated_doc(draw: st.DrawFn) -> object:
    """A good answer with some value replaced by any JSON value."""
    doc = json.loads(json.dumps(GOOD))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = draw(JSON)
    return doc


def _parse_all(doc: object) -> None:
    for parse in PARSERS:
        try:
            result = parse(doc)
        except ValueError as exc:
            assert str(exc)
            continue
        if parse is parse_alarms:
            for raw in result:  # type: ignore[attr-defined]
                try:
                    assert isinstance(alarm_from_raw("sw", raw), DeviceAlarm)
                except ValueError as exc:
                    assert str(exc)


@FUZZ
@given(doc=st.one_of(mutated_doc(), JSON))
@example(doc={"optical-switch:opm-power": {"port": [{"port-id": 1, "power": 10**400}]}})
@example(doc={"polatis-switch:system-alarms": {"alarm": [{
    "alarm-time": "0001-01-01T00:00:00", "alarm-message": "x"}]}})
def test_restconf_answers_of_any_shape_parse_or_give_a_value_error(doc: object) -> None:
    _parse_all(doc)


@FUZZ
@given(status=st.integers(100, 999), body=st.one_of(
    st.binary(max_size=200), JSON.map(lambda d: json.dumps(d).encode()),
    st.sampled_from([b"[" * 100_000, b'{"ietf-restconf:errors": {"error": [{"error-tag": 1}]}}',
                     b'{"ietf-restconf:errors": {"error": "x"}}'])),
    port=st.one_of(st.none(), st.integers(1, 16)))
@example(status=409, body=b"[" * 100_000, port=None)
def test_restconf_error_answers_of_any_kind_map_to_a_driver_error(
    status: int, body: bytes, port: int | None
) -> None:
    assert isinstance(parse_errors(body), list)
    error = error_for_answer("sw", status, body, "GET x", port=port)
    assert isinstance(error, DriverError) and "switch 'sw'" in str(error)


@pytest.mark.parametrize("power", [10**400, "nan", "inf", "-1e999"])
def test_found_by_fuzzing_a_power_reading_that_is_no_number(power: object) -> None:
    """``"power": 10**400`` (an integer JSON allows) raised ``OverflowError`` from
    ``float()``, past the driver's ``except ValueError``; NaN and infinities came back as
    readings. Each is now a ``ValueError`` naming the port and the value."""
    with pytest.raises(ValueError, match=r"port 1 power: .* is not a finite number"):
        parse_power({"optical-switch:opm-power": {"port": [{"port-id": 1, "power": power}]}})


def test_found_by_fuzzing_an_alarm_time_before_the_epoch_range() -> None:
    """An alarm-time of year 1 without a UTC offset raised ``OverflowError``/``ValueError``
    from ``timestamp()`` (local time); it is now read as UTC, and a time that is no RFC 3339
    date-and-time is a ``ValueError`` naming the field."""
    alarm = alarm_from_raw("sw", RawAlarm("0001-01-01T00:00:00", "X", "port 9: LOS: gone"))
    assert (alarm.at_s, alarm.port, alarm.condition) == (-62135596800.0, 9, "LOS")
    with pytest.raises(ValueError, match="alarm-time: 'soon' is not an RFC 3339"):
        alarm_from_raw("sw", RawAlarm("soon", "X", "x"))


def test_found_by_fuzzing_nested_brackets_in_an_error_body() -> None:
    """A body of 100,000 ``[`` raised ``RecursionError`` from ``json.loads`` (not a
    ``ValueError``): ``parse_errors`` now finds no errors in it and the answer maps by its
    status."""
    assert parse_errors(b"[" * 100_000) == []


def test_found_by_fuzzing_a_superscript_digit_as_a_port() -> None:
    """``"\u00b2"`` (a Latin-1 byte a device may send) passed ``str.isdigit`` and then raised
    ``ValueError`` from ``int``: in a port list, and as the aid of an alarm line (the TL1
    driver's alarm reader and ``get_port_status``). It is no port number."""
    with pytest.raises(Tl1SyntaxError, match="bad port '\u00b2'"):
        parse_port_list("1&\u00b2")
    assert port_number("\u00b2") is None
    assert port_number("12") == 12
