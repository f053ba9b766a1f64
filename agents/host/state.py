"""The kept record of unhealthy GPUs, so that an agent restart does not forget that a GPU was
unhealthy (issue 5 §1).

The agent keeps the record in a local JSON state file (``UnhealthyGpuStore``; the path is
configurable, writes are atomic: a temporary file in the same directory, fsync, ``os.replace``,
fsync of the directory). On start it loads the file and hands the record to its health source
(``HealthSource.restore``); when it learns the controller's record it applies ``merge``:

**The controller's record wins when they disagree.** For a GPU the controller has an entry for,
the controller's entry is kept. For a GPU only the local record lists, the controller's silence
is a disagreement only if the controller's record is at least as new as the local entry
(``controller.as_of_s >= entry.since_s``): an operator repaired or cleared the GPU, and the
entry is dropped. A local entry newer than the controller's record is news the controller has
not heard yet (the GPU failed while the agent was cut off) and is kept so it can be reported.
Timestamps are wall-clock seconds since the epoch on both sides (hosts are NTP-synchronised;
skew only matters for a failure within the skew of the controller's record).

What is kept: DEGRADED and FAILED GPUs (``HealthState.unhealthy``). A HEALTHY event removes the
GPU; UNKNOWN ("could not read") changes nothing, since it says nothing about the GPU itself.

File format (schema version 1)::

    {"schema_version": 1, "as_of_s": 1767225600.0,
     "gpus": [{"host": "h1", "index": 3, "state": "failed", "reason": "XID 79: ...",
               "xid": 79, "since_s": 1767225599.5, "source": "nvml-event",
               "uuid": "GPU-..."}]}
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Final

import structlog

from lightrail.agents.host.health import EventSource, GpuHealth, GpuId, HealthEvent, HealthState

SCHEMA_VERSION: Final = 1

_log = structlog.get_logger(__name__)


class HealthStateError(Exception):
    """The state file cannot be read: not JSON, an unknown schema version, or a bad entry.
    The message names the file; delete it to start without a local record (the controller's
    record is applied when the agent connects)."""


@dataclass(frozen=True, slots=True)
class UnhealthyRecord:
    """Unhealthy GPUs by GPU, as of ``as_of_s`` (wall clock, seconds since the epoch: the time
    the record was last changed, or when the controller's view was taken)."""

    gpus: Mapping[GpuId, GpuHealth] = field(default_factory=lambda: MappingProxyType({}))
    as_of_s: float = 0.0

    @staticmethod
    def of(gpus: Mapping[GpuId, GpuHealth], as_of_s: float) -> UnhealthyRecord:
        """A record holding a read-only copy of ``gpus``, sorted by GPU."""
        return UnhealthyRecord(MappingProxyType(dict(sorted(gpus.items()))), as_of_s)


EMPTY: Final = UnhealthyRecord()


def record_event(
    record: UnhealthyRecord, event: HealthEvent, *, uuid: str | None = None
) -> UnhealthyRecord:
    """The record after ``event``: DEGRADED/FAILED enter (or replace) the GPU's entry, HEALTHY
    removes it, UNKNOWN leaves the record as it is. Pure."""
    if event.state is HealthState.UNKNOWN:
        return record
    gpus = dict(record.gpus)
    if event.state.unhealthy:
        previous = gpus.get(event.gpu)
        gpus[event.gpu] = GpuHealth(
            event.gpu, event.state, event.reason, event.xid, event.at_s, event.source,
            uuid if uuid is not None else (previous.uuid if previous else None),
        )
    elif gpus.pop(event.gpu, None) is None:
        return record
    return UnhealthyRecord.of(gpus, max(record.as_of_s, event.at_s))


def merge(local: UnhealthyRecord, controller: UnhealthyRecord | None) -> UnhealthyRecord:
    """The record to apply after an agent restart: the controller's record wins where they
    disagree (see the module docstring); ``None`` (controller not reached yet) keeps
    ``local``. Pure."""
    if controller is None:
        return local
    gpus = dict(controller.gpus)
    for gpu, entry in local.gpus.items():
        if gpu not in gpus and entry.since_s > controller.as_of_s:
            gpus[gpu] = entry
    return UnhealthyRecord.of(gpus, max(local.as_of_s, controller.as_of_s))


def _encode(record: UnhealthyRecord) -> str:
    entries = [
        {
            "host": h.gpu.host,
            "index": h.gpu.index,
            "state": h.state.value,
            "reason": h.reason,
            "xid": h.xid,
            "since_s": h.since_s,
            "source": h.source.value,
            "uuid": h.uuid,
        }
        for h in record.gpus.values()
    ]
    doc = {"schema_version": SCHEMA_VERSION, "as_of_s": record.as_of_s, "gpus": entries}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _decode(text: str, path: Path) -> UnhealthyRecord:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise HealthStateError(f"{path}: not JSON ({e})") from e
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
        version = doc.get("schema_version") if isinstance(doc, dict) else None
        raise HealthStateError(
            f"{path}: schema_version {version!r} is not {SCHEMA_VERSION}"
        )
    try:
        gpus: dict[GpuId, GpuHealth] = {}
        for item in doc["gpus"]:
            gpu = GpuId(str(item["host"]), int(item["index"]))
            xid = item.get("xid")
            uuid = item.get("uuid")
            gpus[gpu] = GpuHealth(
                gpu,
                HealthState(item["state"]),
                str(item["reason"]),
                int(xid) if xid is not None else None,
                float(item["since_s"]),
                EventSource(item["source"]),
                str(uuid) if uuid is not None else None,
            )
        return UnhealthyRecord.of(gpus, float(doc["as_of_s"]))
    except (KeyError, TypeError, ValueError) as e:
        raise HealthStateError(f"{path}: bad entry ({e!r})") from e


class UnhealthyGpuStore:
    """The local state file of unhealthy GPUs at ``path`` (JSON, see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)

    @property
    def path(self) -> Path:
        return self._path

    def load(self) -> UnhealthyRecord:
        """The record in the file; the empty record when there is no file. Raises
        ``HealthStateError`` (naming the file) when it cannot be parsed, ``OSError`` when it
        cannot be read."""
        try:
            text = self._path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return EMPTY
        return _decode(text, self._path)

    def save(self, record: UnhealthyRecord) -> None:
        """Write ``record`` atomically: a temporary file in the same directory is written and
        fsynced, then ``os.replace``d over the state file and the directory fsynced, so a crash
        leaves either the old or the new file, never a torn one. Raises ``OSError``."""
        directory = self._path.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{self._path.name}.", suffix=".tmp",
                                        dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(_encode(record))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp_name, self._path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name)
            raise
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        _log.debug("unhealthy_gpus_saved", path=str(self._path), gpus=len(record.gpus))

    def record(self, event: HealthEvent, *, uuid: str | None = None) -> UnhealthyRecord:
        """Load, apply ``event`` (``record_event``), save if it changed; return the record."""
        before = self.load()
        after = record_event(before, event, uuid=uuid)
        if after is not before:
            self.save(after)
        return after
