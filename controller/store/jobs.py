"""Durable job records: spec and rank placement, as JSON under ``/lightrail/v1/jobs/<job>``.

Registration writes through (it is not on the hot path); the controller recovers every job from
here on restart. A record that does not parse raises ``CorruptJobRecord`` naming the key and
field; recovery skips it loudly instead of guessing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from lightrail.controller.domain.model import Collective, PhaseKey, ProcessGroup, RankPlacement
from lightrail.controller.store.etcd import EtcdStore
from lightrail.controller.store.types import encode_value

MAX_RECORD_BYTES = 1_000_000
"""The largest encoded job record (bytes) a registration may store: one etcd put, under etcd's
``--max-request-bytes`` (1.5 MiB by default) with room for the key and the transaction. A job
record holds every rank's placement and the declared schedule (about 20 bytes per rank and 60
per declared phase of a small group)."""


class CorruptJobRecord(ValueError):
    """A stored job record is not what this version writes."""


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A registered job as stored."""

    job_id: str
    tenant: str
    placements: tuple[RankPlacement, ...]
    declared_phases: tuple[PhaseKey, ...] = ()

    def encoded_bytes(self) -> int:
        """The size of the record as stored (``encode_value`` of ``to_json``), bytes."""
        return len(encode_value(self.to_json()))

    def to_json(self) -> dict[str, object]:
        """The JSON object stored in etcd."""
        return {
            "job_id": self.job_id,
            "tenant": self.tenant,
            "ranks": [[p.rank, p.host, p.gpu] for p in self.placements],
            "declared_phases": [
                {"group": list(ph.group.ranks), "collective": ph.collective.value,
                 "seq": ph.seq, "step": ph.step}
                for ph in self.declared_phases
            ],
        }

    @staticmethod
    def from_json(key: str, obj: object) -> JobRecord:
        """Parse a stored record. Raises ``CorruptJobRecord`` naming ``key`` and the field."""
        if not isinstance(obj, Mapping):
            raise CorruptJobRecord(f"{key}: expected an object, got {type(obj).__name__}")
        try:
            job_id = obj["job_id"]
            tenant = obj["tenant"]
            ranks = obj["ranks"]
            declared = obj.get("declared_phases", [])
            if not isinstance(job_id, str) or not isinstance(tenant, str):
                raise TypeError("job_id/tenant must be strings")
            placements = tuple(
                RankPlacement(int(r), str(h), int(g)) for r, h, g in ranks
            )
            phases = tuple(
                PhaseKey(ProcessGroup.of(d["group"]), Collective(d["collective"]),
                         int(d["seq"]), int(d["step"]))
                for d in declared
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptJobRecord(f"{key}: {type(exc).__name__}: {exc}") from None
        return JobRecord(job_id, tenant, placements, phases)


class JobRepository(Protocol):
    """Where job records live (etcd in the daemon)."""

    async def save(self, record: JobRecord) -> None: ...

    async def delete(self, job_id: str) -> None: ...

    async def load_all(self) -> list[JobRecord]: ...


class EtcdJobRepository:
    """``JobRepository`` over ``lightrail.controller.store.etcd.EtcdStore``: one key per job under
    ``jobs/``."""

    PREFIX = "jobs/"

    def __init__(self, store: EtcdStore) -> None:
        self._store = store

    async def save(self, record: JobRecord) -> None:
        """Write through. Raises ``StoreError``."""
        await self._store.put_json(self.PREFIX + record.job_id, record.to_json())

    async def delete(self, job_id: str) -> None:
        """Remove a job's record (no error when absent). Raises ``StoreError``."""
        await self._store.delete(self.PREFIX + job_id)

    async def load_all(self) -> list[JobRecord]:
        """Every stored job. Raises ``CorruptJobRecord`` for a record that does not parse
        (the message names the key) and ``StoreError``."""
        snap = await self._store.get_prefix_json(self.PREFIX)
        return [JobRecord.from_json(self._store.full_key(k), v)
                for k, v in sorted(snap.items.items())]
