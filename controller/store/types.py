"""Values of the etcd store: what reads and watches return, leases, and the JSON envelope.

Every value is stored as JSON in a versioned envelope ``{"schema": 1, "data": ...}``
(``encode_value`` / ``decode_value``); keys in these records are relative to the store prefix.
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from lightrail.controller.store.errors import CorruptValue, UnsupportedSchema

SCHEMA_VERSION: Final = 1
"""Version written in the ``schema`` field of every JSON envelope."""


class EventKind(enum.Enum):
    """Kind of a watch event."""

    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as read from etcd. ``key`` is relative to the store prefix; ``value`` is the
    decoded ``data`` of the envelope; revisions are etcd store revisions; ``lease_id`` is the
    attached lease or None."""

    key: str
    value: object
    create_revision: int
    mod_revision: int
    version: int
    lease_id: int | None


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A put or delete seen by a watch. ``value`` is the decoded data for a put and None for a
    delete; ``mod_revision`` is the revision of the change (of the deletion for a delete)."""

    kind: EventKind
    key: str
    value: object | None
    mod_revision: int


@dataclass(frozen=True, slots=True)
class WatchEvents:
    """Events that arrived together, in revision order (never empty)."""

    events: tuple[WatchEvent, ...]

    @property
    def revision(self) -> int:
        """Revision of the last event."""
        return self.events[-1].mod_revision


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every key under ``prefix`` at store revision ``revision``: relative key -> decoded data.

    A watch yields one instead of events when the revision it had to resume from was compacted:
    the consumer must replace its view by this one ("rebuild"); events after it start at
    ``revision + 1``."""

    prefix: str
    items: Mapping[str, object]
    revision: int


WatchBatch = WatchEvents | Snapshot
"""What a watch yields."""


@dataclass(slots=True)
class LeaseAuthority:
    """Until when the holder of a lease may act on it: ``until_s`` (the store's clock, seconds)
    is the send time of the last keep-alive etcd acknowledged (or of the grant) plus half the
    TTL, the self-fencing bound of ``lightrail.controller.store.election``; minus infinity once
    the lease is lost. Kept by the store's keep-alive task; read without waiting for any task
    to run, so a process frozen past it (SIGSTOP, a long GC pause) sees it expired the moment
    it resumes."""

    until_s: float = float("-inf")


@dataclass(frozen=True, slots=True, eq=False)
class Lease:
    """An etcd lease kept alive by the store that granted it.

    ``ttl_s`` is the TTL etcd granted (etcd raises requests below its minimum, about 2 s with
    default timing). ``renewal_late`` is set while no keep-alive has succeeded for ``ttl_s / 2``
    seconds (cleared by the next success); ``lost`` is set, for good, when the lease is gone:
    etcd reported it expired, it was not renewed within ``ttl_s`` (measured from the send time of
    the last successful keep-alive, so never later than etcd's own expiry), or it was revoked.
    ``lost`` implies ``renewal_late``.
    """

    id: int
    ttl_s: int
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    renewal_late: asyncio.Event = field(default_factory=asyncio.Event)
    authority: LeaseAuthority = field(default_factory=LeaseAuthority)


@dataclass(frozen=True, slots=True)
class PendingWrite:
    """One write of a batch (``EtcdStore.write_batch``): ``value`` is an encoded envelope
    (``encode_value``), or None for a delete."""

    value: bytes | None


@dataclass(frozen=True, slots=True)
class TxnOutcome:
    """Result of ``EtcdStore.conditional_put``: whether the put was applied, and the key as it
    is after the transaction (None if absent)."""

    succeeded: bool
    current: KeyValue | None


def encode_value(obj: object) -> bytes:
    """Encode ``obj`` in a schema-versioned envelope (compact JSON, UTF-8). Raises
    TypeError/ValueError if ``obj`` is not JSON-serialisable (NaN and infinities included)."""
    return json.dumps(
        {"schema": SCHEMA_VERSION, "data": obj}, separators=(",", ":"), allow_nan=False
    ).encode()


def decode_value(key: str, raw: bytes) -> object:
    """Decode an envelope written by ``encode_value``; ``key`` (relative) names the value in
    errors. Raises CorruptValue (not JSON, not an envelope), UnsupportedSchema (another schema
    version)."""
    try:
        envelope = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptValue(key, f"not JSON ({e})") from e
    if not isinstance(envelope, dict) or set(envelope) != {"schema", "data"}:
        raise CorruptValue(key, "not a {schema, data} envelope")
    schema = envelope["schema"]
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise CorruptValue(key, f"schema is not an integer: {schema!r}")
    if schema != SCHEMA_VERSION:
        raise UnsupportedSchema(key, schema, supported=SCHEMA_VERSION)
    data: object = envelope["data"]
    return data


RequestObserver = Callable[[str, float], None]
"""Called once per etcd request (``client.EtcdClient.call``) with its method (``range``,
``put``, ``delete_range``, ``txn``, ``compact``, ``lease_grant``, ``lease_revoke``,
``lease_keep_alive``, ``watch``: a watch's creation) and the seconds it took, failover and
retries included, whether it succeeded or raised. Must not block or raise."""
