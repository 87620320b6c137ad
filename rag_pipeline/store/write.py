"""The index's write paths: the one transaction that swaps a document's version, and state changes.

``replace_document`` is the only place that knows the swap (see ``../shared/notes/DESIGN.md``):
``BEGIN``; take the generations lock (shared) and read the kept embedding generations
(``store.generations``); lock the document row; write ``expected_chunk_count``; delete every chunk of the
document (their vectors go with them, in every generation); ``COPY`` the new chunks in, then their vectors
into each kept generation's table; count the rows stored for (document, new version), in ``chunks`` and in
every generation written; on a mismatch roll back (the previous complete version stays searchable) and raise
``IncompleteWriteError``; else set ``version``, ``status = completed``, ``generations`` and the
statistics; ``COMMIT``. ``add_generation_vectors`` fills one generation for a document's current version
without touching the others. Failures are recorded afterwards by ``record_failure`` in a separate
transaction, so the record survives the rollback.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from rag_pipeline.faults import checkpoint
from rag_pipeline.sources.base import SourceDocument
from rag_pipeline.store.generations import LOCK_KEY as GENERATIONS_LOCK
from rag_pipeline.store.generations import Generation, kept, to_sql_vector

STATUSES = ("pending", "completed", "failed", "permanently_failed", "skipped", "deleted")
"""Every document status (``docs/states.md``); ``skipped`` is terminal but not a failure."""

FAILURE_KINDS = ("transient", "terminal", "skipped")
"""How ``record_failure`` treats an error: retried later, given up at once, or no content to index."""


class IncompleteWriteError(RuntimeError):
    """Rows stored for a document's new version differ from ``expected_chunk_count``, or the vectors given
    do not cover the active generation (it changed since they were computed); rolled back."""


@dataclass(frozen=True)
class ChunkRow:
    """A chunk ready to store: ``embeddings`` maps a generation id to the chunk's float32 vector in it
    (``store.generations``; at least the active generation)."""

    ordinal: int
    text: str
    token_count: int
    embeddings: Mapping[int, np.ndarray]
    pages: Sequence[int] = ()
    heading_path: Sequence[str] = ()
    metadata: Mapping[str, Any] | None = None


def text_sha256(text: str) -> str:
    """Hex SHA-256 of ``text`` as UTF-8: the embedding cache key (with the model id)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chunk_id(document_id: int, version: int, ordinal: int) -> str:
    """Stable chunk id ``"{document_id}:{version}:{ordinal}"``."""
    return f"{document_id}:{version}:{ordinal}"


_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def _json_safe(value: Any) -> Any:
    """Strip U+0000 from every string in a JSON-like value (PostgreSQL JSONB rejects it) and replace lone
    surrogates (JSON ``\\ud800`` escapes, undecodable file names) with U+FFFD (UTF-8 cannot encode them)."""
    if isinstance(value, str):
        return _clean(value)
    if isinstance(value, Mapping):
        return {_clean(str(k)): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _clean(value: str | None) -> str | None:
    """``value`` without U+0000 and with lone surrogates as U+FFFD (for titles, URIs, reasons, log rows; never
    for a document's stable id, which must stay the source's own)."""
    return None if value is None else _SURROGATE_RE.sub("\ufffd", value.replace("\x00", ""))


def expires_at(doc: SourceDocument, doc_type: str | None, expiry_days: Mapping[str, int]) -> datetime | None:
    """``modified_at`` (or now) plus the per-type expiry in days (``expiry_days[doc_type]`` or
    ``expiry_days["*"]``); ``None`` when no expiry applies."""
    days = expiry_days.get(doc_type or "", expiry_days.get("*", 0))
    if not days:
        return None
    base = doc.modified_at or datetime.now(timezone.utc)
    return base + timedelta(days=days)


def ensure_document(conn: psycopg.Connection, source: str, doc: SourceDocument, *, parent_id: int | None = None) -> int:
    """Return the ``documents.id`` for (source, doc.source_id), inserting a ``pending`` row if absent."""
    row = conn.execute(
        """
        INSERT INTO documents (source, source_id, parent_id, uri, title, mime_type, source_version,
                               modified_at, metadata, last_seen_at)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, now())
        ON CONFLICT (source, source_id) DO UPDATE SET last_seen_at = now()
        RETURNING id
        """,
        (source, doc.source_id.replace("\x00", ""), parent_id, _clean(doc.uri), _clean(doc.title), doc.mime_type,
         doc.source_version, doc.modified_at, Jsonb(_json_safe(dict(doc.metadata)))),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _copy_vectors(conn: psycopg.Connection, g: Generation, rows: Sequence[tuple[str, np.ndarray]]) -> None:
    with conn.cursor() as cur:
        with cur.copy(f"COPY {g.table} (chunk_id, embedding) FROM STDIN WITH (FORMAT BINARY)") as copy:
            copy.set_types(["text", g.storage])
            for cid, vector in rows:
                copy.write_row((cid, to_sql_vector(g, vector)))


def replace_document(
    conn: psycopg.Connection,
    document_id: int,
    *,
    doc: SourceDocument,
    content_sha256: str,
    chunks: Sequence[ChunkRow],
    mime_type: str,
    doc_type: str,
    char_count: int,
    page_count: int | None,
    stats: Mapping[str, Any],
    markdown: str,
    expires: datetime | None,
) -> tuple[int, list[int]]:
    """Atomically replace the document's indexed version with ``chunks``; return ``(new version, generation
    ids written)``: every kept generation the chunks carry a vector for.

    Raises ``IncompleteWriteError`` (rolled back) when the stored row count differs from ``len(chunks)`` (in
    ``chunks`` or in a generation) or the chunks carry no vector for the active generation, ``ValueError``
    when ``chunks`` is empty (a completed document always has chunks).
    """
    if not chunks:
        raise ValueError("a completed document needs at least one chunk")
    expected = len(chunks)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock_shared(%s)", (GENERATIONS_LOCK,))
        live = kept(conn)
        written = [g for g in live if all(g.id in c.embeddings for c in chunks)]
        if not any(g.state == "active" for g in written):
            raise IncompleteWriteError("no vectors for the active embedding generation (it changed since they "
                                       "were computed): written again on the next attempt")
        row = conn.execute(
            "SELECT version FROM documents WHERE id = %s FOR UPDATE", (document_id,)
        ).fetchone()
        if row is None:
            raise LookupError(f"document {document_id} does not exist")
        new_version = int(row[0]) + 1
        conn.execute(
            "UPDATE documents SET expected_chunk_count = %s, updated_at = now() WHERE id = %s",
            (expected, document_id),
        )
        conn.execute("DELETE FROM chunks WHERE document_id = %s", (document_id,))
        checkpoint("write.after_delete")
        ids = [chunk_id(document_id, new_version, c.ordinal) for c in chunks]
        with conn.cursor() as cur:
            with cur.copy(
                "COPY chunks (id, document_id, version, ordinal, text, text_sha256, token_count, pages, "
                "heading_path, metadata) FROM STDIN WITH (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["text", "int8", "int4", "int4", "text", "text", "int4", "int4[]", "text[]", "jsonb"])
                for cid, c in zip(ids, chunks, strict=True):
                    copy.write_row((
                        cid, document_id, new_version, c.ordinal, c.text, text_sha256(c.text), c.token_count,
                        list(c.pages), [h.replace("\x00", "") for h in c.heading_path],
                        Jsonb(_json_safe(dict(c.metadata or {}))),
                    ))
        for g in written:
            _copy_vectors(conn, g, [(cid, c.embeddings[g.id]) for cid, c in zip(ids, chunks, strict=True)])
        checkpoint("write.after_insert")
        stored = conn.execute(
            "SELECT count(*) FROM chunks WHERE document_id = %s AND version = %s", (document_id, new_version)
        ).fetchone()[0]
        if stored != expected:
            raise IncompleteWriteError(
                f"stored {stored} chunk rows for version {new_version}, expected {expected}"
            )
        for g in written:
            n = conn.execute(f"SELECT count(*) FROM {g.table} WHERE chunk_id = ANY(%s)", (ids,)).fetchone()[0]
            if n != expected:
                raise IncompleteWriteError(f"stored {n} vectors in embedding generation {g.id} for version "
                                           f"{new_version}, expected {expected}")
        conn.execute(
            """
            INSERT INTO document_markdown (document_id, version, content_sha256, markdown)
            VALUES (%s, %s, %s, %s)
            ON CONFLICT (document_id) DO UPDATE
              SET version = EXCLUDED.version, content_sha256 = EXCLUDED.content_sha256,
                  markdown = EXCLUDED.markdown, created_at = now()
            """,
            (document_id, new_version, content_sha256, markdown.replace("\x00", "")),
        )
        conn.execute(
            """
            UPDATE documents SET
              version = %s, status = 'completed', failure_count = 0, last_error = NULL, generations = %s,
              first_failed_at = NULL, last_failed_at = NULL,
              content_sha256 = %s, seen_sha256 = %s, source_version = %s, seen_source_version = %s,
              uri = %s, title = %s, mime_type = %s, doc_type = %s, modified_at = %s, expires_at = %s,
              chunk_count = %s, char_count = %s, page_count = %s, extraction_stats = %s, metadata = %s,
              ingested_at = now(), ready_at = now(), deleted_at = NULL, updated_at = now()
            WHERE id = %s
            """,
            (new_version, [g.id for g in written], content_sha256, content_sha256, doc.source_version,
             doc.source_version, _clean(doc.uri), _clean(doc.title), mime_type, doc_type, doc.modified_at, expires,
             stored, char_count, page_count, Jsonb(_json_safe(dict(stats))),
             Jsonb(_json_safe(dict(doc.metadata))), document_id),
        )
        checkpoint("write.before_commit")
    return new_version, [g.id for g in written]


def add_generation_vectors(conn: psycopg.Connection, document_id: int, version: int, generation_id: int,
                           vectors: Mapping[str, np.ndarray]) -> bool:
    """Fill generation ``generation_id`` for the current ``version`` of a document, leaving its chunks and
    the other generations alone: ``vectors`` maps each chunk id of that version to its vector. One
    transaction: the vectors missing there are inserted, the count checked, ``generations`` gains the id.
    Returns ``False`` (nothing written) when the document is no longer at ``version``, or the generation is
    not kept any more; raises ``IncompleteWriteError`` (rolled back) when the vectors do not cover the chunks."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock_shared(%s)", (GENERATIONS_LOCK,))
        g = next((g for g in kept(conn) if g.id == generation_id), None)
        row = conn.execute("SELECT version FROM documents WHERE id = %s FOR UPDATE", (document_id,)).fetchone()
        if g is None or row is None or int(row[0]) != version:
            return False
        ids = [r[0] for r in conn.execute(
            f"SELECT c.id FROM chunks c LEFT JOIN {g.table} e ON e.chunk_id = c.id "
            "WHERE c.document_id = %s AND c.version = %s AND e.chunk_id IS NULL", (document_id, version))]
        missing = [cid for cid in ids if cid not in vectors]
        if missing:
            raise IncompleteWriteError(f"no vector for {len(missing)} chunk(s) of version {version} "
                                       f"(e.g. {missing[0]}) in embedding generation {g.id}")
        _copy_vectors(conn, g, [(cid, vectors[cid]) for cid in ids])
        total, done = conn.execute(
            f"SELECT count(c.id), count(e.chunk_id) FROM chunks c LEFT JOIN {g.table} e ON e.chunk_id = c.id "
            "WHERE c.document_id = %s AND c.version = %s", (document_id, version)).fetchone()
        if total != done or total == 0:
            raise IncompleteWriteError(f"embedding generation {g.id} holds {done} of {total} vectors of version {version}")
        conn.execute("UPDATE documents SET generations = array_append(array_remove(generations, %s), %s) "
                     "WHERE id = %s", (g.id, g.id, document_id))
    return True


@dataclass(frozen=True)
class FailureRecord:
    """Outcome of ``record_failure``: the document's ``status`` and ``failure_count`` afterwards, whether
    this attempt was ``recorded`` now (False: its attempt key was counted before, or the document is a
    tombstone), and whether it ``became_permanent`` (``permanently_failed`` reached by this attempt)."""

    status: str
    failure_count: int
    recorded: bool
    became_permanent: bool


def record_failure(
    conn: psycopg.Connection,
    document_id: int,
    *,
    attempt_key: str,
    reason: str,
    kind: str,
    max_failures: int,
    seen_sha256: str | None = None,
    seen_source_version: str | None = None,
    mime_type: str | None = None,
    doc_type: str | None = None,
) -> FailureRecord:
    """Record one failed attempt of ``document_id`` in its own transaction: the one failure policy.

    ``attempt_key`` names the attempt (``sync:<run id>``, ``dagster:<root run id>``): the same key is
    counted once, so a step retried inside a run, a re-delivered run failure or a failure seen by two
    callers never counts twice (ledger: ``document_failures``); a document already ``permanently_failed`` on
    the same content is left as it is. ``kind`` (``FAILURE_KINDS``):
    ``transient`` -> ``failure_count + 1`` and ``failed``, or ``permanently_failed`` at ``max_failures``;
    ``terminal`` (a deterministic content error) -> ``permanently_failed`` at once, ``failure_count + 1``;
    ``skipped`` (empty, no extractable content) -> ``skipped``, count 0, not a
    failure. The count restarts when ``seen_sha256`` differs from the content that failed before (a
    count belongs to one content version); ``seen_*`` None keeps what the row has. ``first_failed_at`` /
    ``last_failed_at`` frame the failures of the current content. The previous complete version's chunks
    are left untouched (still searchable). Raises ``LookupError`` for an unknown document and
    ``ValueError`` for an unknown ``kind``.
    """
    if kind not in FAILURE_KINDS:
        raise ValueError(f"unknown failure kind {kind!r}: {', '.join(FAILURE_KINDS)}")
    with conn.transaction():
        row = conn.execute("SELECT status, failure_count, seen_sha256, seen_source_version FROM documents "
                           "WHERE id = %s FOR UPDATE", (document_id,)).fetchone()
        if row is None:
            raise LookupError(f"document {document_id} does not exist")
        status, count, seen_sha, seen_version = row
        inserted = conn.execute(
            "INSERT INTO document_failures (document_id, attempt_key, reason, terminal) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT DO NOTHING RETURNING 1",
            (document_id, attempt_key, _clean(reason)[:2000], kind != "transient")).fetchone()
        # new content gets a fresh failure budget (a count belongs to one content version)
        changed = bool(seen_sha256 and seen_sha and seen_sha != seen_sha256)
        if inserted is None or status == "deleted" or (status == "permanently_failed" and not changed):
            return FailureRecord(status, count, False, False)  # counted before, or given up on this content
        sha = seen_sha256 or seen_sha
        base = 0 if changed or status in ("completed", "skipped") else count
        if kind == "skipped":
            new_status, new_count = "skipped", 0
        elif kind == "terminal" or base + 1 >= max_failures:
            new_status, new_count = "permanently_failed", base + 1
        else:
            new_status, new_count = "failed", base + 1
        failing = new_status != "skipped"
        conn.execute(
            """
            UPDATE documents SET status = %s, failure_count = %s, last_error = %s, seen_sha256 = %s,
              seen_source_version = %s, mime_type = COALESCE(%s, mime_type), doc_type = COALESCE(%s, doc_type),
              first_failed_at = CASE WHEN NOT %s THEN NULL WHEN %s OR first_failed_at IS NULL THEN now()
                                     ELSE first_failed_at END,
              last_failed_at = CASE WHEN %s THEN now() END,
              deleted_at = NULL, updated_at = now()
            WHERE id = %s
            """,
            (new_status, new_count, _clean(reason)[:2000], sha, seen_source_version or seen_version, mime_type,
             doc_type, failing, changed or base == 0, failing, document_id))
    return FailureRecord(new_status, new_count, True,
                         new_status == "permanently_failed" and status != "permanently_failed")


def reset_failures(conn: psycopg.Connection, document_ids: Sequence[int]) -> int:
    """The retry action: documents ``failed``/``permanently_failed``/``skipped`` go back to ``pending``
    with ``failure_count`` 0 and their seen content forgotten (so the next plan fetches them again);
    previous chunks stay searchable. Returns how many rows changed."""
    if not document_ids:
        return 0
    return conn.execute(
        """
        UPDATE documents SET status = 'pending', failure_count = 0, seen_sha256 = NULL, seen_source_version = NULL,
               first_failed_at = NULL, last_failed_at = NULL, updated_at = now()
        WHERE id = ANY(%s) AND status IN ('failed', 'permanently_failed', 'skipped')
        """, (list(document_ids),)).rowcount


def update_metadata(conn: psycopg.Connection, document_id: int, doc: SourceDocument, *, expires: datetime | None) -> None:
    """Rename/move/metadata change with identical content: update the row only, chunks untouched."""
    conn.execute(
        """
        UPDATE documents SET uri = %s, title = %s, source_version = %s, seen_source_version = %s,
               modified_at = COALESCE(%s, modified_at), metadata = %s, expires_at = %s, updated_at = now()
        WHERE id = %s
        """,
        (_clean(doc.uri), _clean(doc.title), doc.source_version, doc.source_version, doc.modified_at,
         Jsonb(_json_safe(dict(doc.metadata))), expires, document_id),
    )


def mark_deleted(conn: psycopg.Connection, document_ids: Sequence[int]) -> int:
    """Tombstone documents: remove their chunks and Markdown, set ``deleted``/``deleted_at`` (one
    transaction); return how many rows were tombstoned. Children (e-mail attachments) go with them."""
    if not document_ids:
        return 0
    ids = list(document_ids)
    with conn.transaction():
        ids = [r[0] for r in conn.execute(
            """
            WITH RECURSIVE tree AS (
              SELECT id FROM documents WHERE id = ANY(%s)
              UNION SELECT d.id FROM documents d JOIN tree t ON d.parent_id = t.id
            ) SELECT id FROM tree
            """, (ids,)).fetchall()]
        conn.execute("DELETE FROM chunks WHERE document_id = ANY(%s)", (ids,))
        conn.execute("DELETE FROM document_markdown WHERE document_id = ANY(%s)", (ids,))
        cur = conn.execute(
            """
            UPDATE documents SET status = 'deleted', deleted_at = now(), chunk_count = 0,
                   expected_chunk_count = 0, updated_at = now()
            WHERE id = ANY(%s) AND status <> 'deleted'
            """,
            (ids,),
        )
        checkpoint("write.tombstone_before_commit")
        return cur.rowcount


def log_ingest(
    conn: psycopg.Connection,
    *,
    run_id: str | None,
    document_id: int | None,
    source: str,
    source_id: str,
    action: str,
    status: str | None,
    reason: str | None = None,
    version: int | None = None,
    char_count: int | None = None,
    chunk_count: int | None = None,
    embedded_count: int | None = None,
    duration_ms: int | None = None,
) -> None:
    """Append one ``ingest_log`` row (one per document per run). ``run_id``: ``sync:<id>`` or
    ``dagster:<run id>``; ``action``: a ``rag_pipeline.pipeline.outcome.Action`` value."""
    conn.execute(
        """
        INSERT INTO ingest_log (run_id, document_id, source, source_id, version, action, status, reason,
                                char_count, chunk_count, embedded_count, duration_ms)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
        """,
        (run_id, document_id, source, _clean(source_id), version, action, status, _clean(reason),
         char_count, chunk_count, embedded_count, duration_ms),
    )
