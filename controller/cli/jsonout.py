"""``--json`` output of the operator commands: a controller reply as plain JSON.

Rules (issue 12 §4): keys are the proto's snake_case field names, in the order the proto
declares them (stable across runs and versions that only add fields); numbers are numbers
(64-bit integers too, where protobuf's JSON mapping writes strings); an absent value is
``null`` — an unset ``optional`` field or message, and a field ``x`` whose companion flag
``has_x`` is false (the flag itself is not printed); enums are their value names in lower case.
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

Field = Any
"""A field descriptor (protobuf's pure-Python or upb class: the stubs name two types)."""


def _scalar(field: Field, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM:
        enum_value = field.enum_type.values_by_number.get(value)
        return enum_value.name.lower() if enum_value is not None else value
    if field.type == FieldDescriptor.TYPE_BYTES:
        return value.hex()
    return value


def _value(field: Field, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return to_plain(value)
    return _scalar(field, value)


def to_plain(msg: Message) -> dict[str, Any]:
    """``msg`` as a dict of plain JSON values, by the module's rules."""
    fields = msg.DESCRIPTOR.fields
    names = {f.name for f in fields}
    out: dict[str, Any] = {}
    for field in fields:
        name = field.name
        if name.startswith("has_") and name[4:] in names \
                and field.type == FieldDescriptor.TYPE_BOOL:
            continue  # the companion flag: folded into its field
        value = getattr(msg, name)
        if field.is_repeated:
            entry = field.message_type
            if entry is not None and entry.GetOptions().map_entry:
                vfield = entry.fields_by_name["value"]
                out[name] = {str(k): _value(vfield, v) for k, v in value.items()}
            else:
                out[name] = [_value(field, v) for v in value]
            continue
        if field.has_presence and not msg.HasField(name):
            out[name] = None
            continue
        flag = f"has_{name}"
        if flag in names and not getattr(msg, flag):
            out[name] = None
            continue
        out[name] = _value(field, value)
    return out


def dumps(msg: Message) -> str:
    """``msg`` as indented JSON text."""
    return json.dumps(to_plain(msg), indent=2)
