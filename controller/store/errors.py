"""Errors of the etcd store: every store operation raises a ``StoreError``.

``StoreUnavailable`` (etcd unreachable or too slow; retryable) is told apart from
``CorruptValue`` (a stored value that is not our envelope; retrying will not help) and
``StoreRequestFailed`` (etcd rejected the request).
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error raised by the store, the election and the coalescing writer."""


class StoreUnavailable(StoreError):
    """etcd could not be reached or did not answer within the timeout. Retryable."""


class StoreRequestFailed(StoreError):
    """etcd answered with an error (invalid argument, compacted revision, ...). Not retryable
    as is."""


class RevisionCompacted(StoreRequestFailed):
    """The requested revision was compacted; etcd keeps history from ``compacted_revision`` on."""

    def __init__(self, message: str, compacted_revision: int) -> None:
        super().__init__(message)
        self.compacted_revision = compacted_revision


class StoreClosed(StoreError):
    """The store was closed while the operation was pending."""


class CorruptValue(StoreError):
    """A stored value is not a Lightrail JSON envelope. ``key`` is the relative key."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"corrupt value at key {key!r}: {reason}")
        self.key = key
        self.reason = reason


class UnsupportedSchema(CorruptValue):
    """A stored envelope has schema version ``schema``, which this code cannot read (written by
    a newer release); ``supported`` is the version this release reads and writes."""

    def __init__(self, key: str, schema: int, *, supported: int) -> None:
        super().__init__(key, f"schema version {schema}, this release reads {supported}")
        self.schema = schema
        self.supported = supported


class FlushFailed(StoreError):
    """``CoalescingWriter`` gave up writing after its bounded retries."""


class FlushTimeout(StoreError):
    """``CoalescingWriter.flush`` did not finish within its timeout."""
