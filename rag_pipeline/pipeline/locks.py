"""The locks every route takes: one per source, one per document (PostgreSQL advisory locks).

A whole-source sync (``rag-pipeline sync``, the daily reconciliation) holds its source's lock
*exclusively*; a per-document step (a Dagster partition run, a backfill batch) holds it *shared* plus an
exclusive lock per document. So a sensor run and a reconciliation never process one document at once, two
partition runs of one document queue up, and partition runs of different documents run side by side.
Document locks are taken in sorted order (no deadlock between batches). Session-level locks: they end
with the connection, so a killed process never leaves one behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterable, Iterator

import psycopg

log = logging.getLogger(__name__)


def lock_key(*parts: str) -> int:
    """The signed 64-bit advisory-lock key of ``parts`` (``("source", name)`` or ``("document", name, id)``)."""
    text = "rag_pipeline:" + "\x1f".join(parts)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()[:8], "big", signed=True)


def source_key(source: str) -> int:
    """The lock key of source ``source`` (its configured name)."""
    return lock_key("source", source)


@contextlib.contextmanager
def source_lock(conn: psycopg.Connection, source: str, *, exclusive: bool = True,
                wait: bool = True) -> Iterator[str | None]:
    """Hold the source's lock for the block. Yields ``"acquired"`` (free), ``"waited"`` (another holder
    finished first) or ``None`` (busy and ``wait`` is False: nothing held, the caller skips)."""
    key = source_key(source)
    suffix = "" if exclusive else "_shared"
    if conn.execute(f"SELECT pg_try_advisory_lock{suffix}(%s)", (key,)).fetchone()[0]:
        state = "acquired"
    elif not wait:
        yield None
        return
    else:
        log.warning("%s: another sync holds the source lock: waiting for it", source)
        conn.execute(f"SELECT pg_advisory_lock{suffix}(%s)", (key,))
        state = "waited"
    try:
        yield state
    finally:
        conn.execute(f"SELECT pg_advisory_unlock{suffix}(%s)", (key,))


@contextlib.contextmanager
def document_locks(conn: psycopg.Connection, source: str, source_ids: Iterable[str]) -> Iterator[None]:
    """Hold the exclusive lock of each document of ``source_ids`` (sorted, waiting) for the block."""
    keys = sorted({lock_key("document", source, sid) for sid in source_ids})
    held: list[int] = []
    try:
        for key in keys:
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
            held.append(key)
        yield
    finally:
        for key in reversed(held):
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


@contextlib.contextmanager
def document_step(conn: psycopg.Connection, source: str, source_ids: Iterable[str]) -> Iterator[None]:
    """What a per-document step holds: the source's lock shared, then its documents' locks."""
    with source_lock(conn, source, exclusive=False), document_locks(conn, source, source_ids):
        yield
