"""Tables behind the per-document steps (revision 0002): staged work, failed attempts, pending deletions.

* ``document_stage``: what ``rag_pipeline.ingest`` hands from one step to the next (Markdown, then chunk
  texts). A staged row counts only while it is newer than the document's last write
  (``documents.ingested_at``): a stage left behind by a failed run never overwrites newer content.
* ``document_failures``: one row per (document, attempt key). ``record_attempt_failure`` counts a failed
  attempt once per key, so a failure seen twice (a retried sensor tick, a re-delivered run-failure
  event) does not count twice.
* ``pending_deletions``: documents gone from a source, written by an inventory whose deletion guard
  passed and consumed by ``purge_pending_deletions``.

Also ``load_diff_state``: the per-source document state the diff needs, without the chunk-count join of
``store.index.load_index_state`` (``stored_chunks`` is ``documents.chunk_count``, written by the same
transaction as the chunks), so one sensor tick over 100,000 documents stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from rag_pipeline.chunking import Chunk
from rag_pipeline.extraction.types import Extraction
from rag_pipeline.sources.base import SourceDocument
from rag_pipeline.store import write as w
from rag_pipeline.store.index import IndexedDocument

_INDEXED_COLUMNS = """
    d.id, d.source_id, d.status, d.version, d.content_sha256, d.seen_sha256, d.source_version,
    d.seen_source_version, d.failure_count, d.last_error, d.expected_chunk_count, {stored},
    d.title, d.uri, d.mime_type, d.metadata, d.modified_at, d.updated_at
"""


def document_to_json(doc: SourceDocument) -> dict[str, Any]:
    """A ``SourceDocument`` as a JSON-safe dict (``modified_at`` as ISO 8601); inverse of ``document_from_json``."""
    return {
        "source_id": doc.source_id, "title": doc.title, "uri": doc.uri, "mime_type": doc.mime_type,
        "size": doc.size, "modified_at": doc.modified_at.isoformat() if doc.modified_at else None,
        "source_version": doc.source_version, "content_sha256": doc.content_sha256,
        "metadata": w._json_safe(dict(doc.metadata)), "skip_reason": doc.skip_reason,
    }


def document_from_json(data: Mapping[str, Any]) -> SourceDocument:
    """Rebuild a ``SourceDocument`` from ``document_to_json`` output; raises ``KeyError`` without ``source_id``."""
    modified = data.get("modified_at")
    return SourceDocument(
        source_id=data["source_id"], title=data.get("title") or data["source_id"], uri=data.get("uri") or "",
        mime_type=data.get("mime_type"), size=data.get("size"),
        modified_at=datetime.fromisoformat(modified) if modified else None,
        source_version=data.get("source_version"), content_sha256=data.get("content_sha256"),
        metadata=dict(data.get("metadata") or {}), skip_reason=data.get("skip_reason"),
    )


def find_document(conn: psycopg.Connection, source: str, source_id: str) -> IndexedDocument | None:
    """The top-level ``documents`` row of (``source``, ``source_id``) with its stored chunk count for the
    current version, or ``None``."""
    stored = ("(SELECT count(*) FROM chunks c WHERE c.document_id = d.id AND c.version = d.version)")
    row = conn.execute(
        f"SELECT {_INDEXED_COLUMNS.format(stored=stored)} FROM documents d "
        "WHERE d.source = %s AND d.source_id = %s AND d.parent_id IS NULL",
        (source, source_id),
    ).fetchone()
    return IndexedDocument(*row) if row else None


def load_diff_state(conn: psycopg.Connection, source: str) -> dict[str, IndexedDocument]:
    """Every top-level document of ``source`` (tombstones included) keyed by ``source_id``, with
    ``stored_chunks`` taken from ``documents.chunk_count`` (no scan of ``chunks``)."""
    rows = conn.execute(
        f"SELECT {_INDEXED_COLUMNS.format(stored='d.chunk_count')} FROM documents d "
        "WHERE d.source = %s AND d.parent_id IS NULL",
        (source,),
    ).fetchall()
    return {r[1]: IndexedDocument(*r) for r in rows}


# -- staged work ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class StagedDocument:
    """A document between steps: the fetched content's hash, the listing it came with, the Markdown and
    its statistics, and (after ``document_chunks``) the chunks. ``staged_at`` is timezone-aware."""

    document_id: int
    content_sha256: str
    listing: SourceDocument
    markdown: str
    mime_type: str
    doc_type: str
    page_count: int | None
    char_count: int
    stats: dict[str, Any]
    chunks: list[Chunk] | None
    staged_at: datetime


def save_stage(conn: psycopg.Connection, document_id: int, *, content_sha256: str, listing: SourceDocument,
               extraction: Extraction) -> None:
    """Stage the Markdown of ``document_id`` (replacing any earlier stage; chunks cleared)."""
    conn.execute(
        """
        INSERT INTO document_stage (document_id, content_sha256, listing, markdown, mime_type, doc_type,
                                    page_count, char_count, stats, chunks, staged_at)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, NULL, clock_timestamp())
        ON CONFLICT (document_id) DO UPDATE SET
          content_sha256 = EXCLUDED.content_sha256, listing = EXCLUDED.listing, markdown = EXCLUDED.markdown,
          mime_type = EXCLUDED.mime_type, doc_type = EXCLUDED.doc_type, page_count = EXCLUDED.page_count,
          char_count = EXCLUDED.char_count, stats = EXCLUDED.stats, chunks = NULL, staged_at = clock_timestamp()
        """,
        (document_id, content_sha256, Jsonb(document_to_json(listing)), extraction.markdown.replace("\x00", ""),
         extraction.mime_type, extraction.doc_type, extraction.page_count, extraction.char_count,
         Jsonb(w._json_safe(dict(extraction.stats)))),
    )


def save_stage_chunks(conn: psycopg.Connection, document_id: int, chunks: Sequence[Chunk]) -> None:
    """Attach the chunk texts to the staged document; raises ``LookupError`` when nothing is staged."""
    payload = [{"text": c.text, "ordinal": c.ordinal, "pages": list(c.pages), "heading_path": list(c.heading_path),
                "token_count": c.token_count, "metadata": w._json_safe(dict(c.metadata))} for c in chunks]
    cur = conn.execute("UPDATE document_stage SET chunks = %s WHERE document_id = %s",
                       (Jsonb(w._json_safe(payload)), document_id))
    if cur.rowcount != 1:
        raise LookupError(f"document {document_id} has no staged Markdown")


def load_stage(conn: psycopg.Connection, document_id: int) -> StagedDocument | None:
    """The valid staged work of ``document_id`` (newer than its last write), or ``None``."""
    row = conn.execute(
        """
        SELECT s.document_id, s.content_sha256, s.listing, s.markdown, s.mime_type, s.doc_type, s.page_count,
               s.char_count, s.stats, s.chunks, s.staged_at
        FROM document_stage s JOIN documents d ON d.id = s.document_id
        WHERE s.document_id = %s AND (d.ingested_at IS NULL OR s.staged_at > d.ingested_at)
        """,
        (document_id,),
    ).fetchone()
    if row is None:
        return None
    chunks = None if row[9] is None else [
        Chunk(text=c["text"], ordinal=c["ordinal"], pages=tuple(c["pages"]), heading_path=tuple(c["heading_path"]),
              token_count=c["token_count"], metadata=dict(c["metadata"])) for c in row[9]]
    return StagedDocument(row[0], row[1], document_from_json(row[2]), row[3], row[4], row[5], row[6], row[7],
                          dict(row[8] or {}), chunks, row[10])


def clear_stage(conn: psycopg.Connection, document_ids: Sequence[int]) -> int:
    """Drop the staged work of ``document_ids``; return how many rows went."""
    if not document_ids:
        return 0
    return conn.execute("DELETE FROM document_stage WHERE document_id = ANY(%s)", (list(document_ids),)).rowcount


# -- failed attempts ------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttemptResult:
    """Outcome of ``record_attempt_failure``: the document's ``status`` and ``failure_count`` afterwards,
    whether this attempt was ``recorded`` now (False: seen before, or nothing to count), and whether it
    ``became_permanent`` (``permanently_failed`` reached with this attempt)."""

    status: str
    failure_count: int
    recorded: bool
    became_permanent: bool


def record_attempt_failure(conn: psycopg.Connection, document_id: int, *, attempt_key: str, reason: str,
                           max_failures: int, source: str | None = None, seen_sha256: str | None = None,
                           seen_source_version: str | None = None) -> AttemptResult:
    """Count one failed attempt of ``document_id`` identified by ``attempt_key`` (e.g. a Dagster run id).

    Idempotent per (document, attempt key). A ``failed``/``pending``/``completed`` document goes to
    ``failed`` with ``failure_count + 1``, or ``permanently_failed`` at ``max_failures`` (previous complete
    chunks stay searchable); a ``deleted`` or already ``permanently_failed`` one is left as it is.
    ``seen_sha256``/``seen_source_version``: the content the attempt was for, when known (the listing's hash):
    recorded so the next diff plans a retry of *that* content, and new content restarts the count
    (``store.write.record_failure``); None keeps what the row has. Writes an ``ingest_log`` row. Raises
    ``LookupError`` when the document does not exist.
    """
    with conn.transaction():
        row = conn.execute(
            "SELECT status, failure_count, seen_sha256, seen_source_version, source, source_id "
            "FROM documents WHERE id = %s FOR UPDATE", (document_id,)).fetchone()
        if row is None:
            raise LookupError(f"document {document_id} does not exist")
        status, count, seen_sha, seen_version, doc_source, source_id = row
        inserted = conn.execute(
            "INSERT INTO document_failures (document_id, attempt_key, reason) VALUES (%s, %s, %s) "
            "ON CONFLICT DO NOTHING RETURNING 1", (document_id, attempt_key, (reason or "")[:2000])).fetchone()
        if inserted is None or status in ("deleted", "permanently_failed"):
            return AttemptResult(status, count, False, False)
        new_status, new_count = w.record_failure(conn, document_id, reason=reason, terminal=False,
                                                 max_failures=max_failures, seen_sha256=seen_sha256 or seen_sha,
                                                 seen_source_version=seen_source_version or seen_version)
        w.log_ingest(conn, run_id=None, document_id=document_id, source=source or doc_source, source_id=source_id,
                     action="failed", status=new_status, reason=reason)
    return AttemptResult(new_status, new_count, True, new_status == "permanently_failed")


# -- pending deletions ----------------------------------------------------------------------------

def replace_pending_deletions(conn: psycopg.Connection, source: str, documents: Sequence[tuple[int, str]]) -> None:
    """Make ``documents`` (``(document_id, source_id)`` pairs) the whole pending-deletion list of ``source``."""
    with conn.transaction():
        conn.execute("DELETE FROM pending_deletions WHERE source = %s", (source,))
        if documents:
            with conn.cursor() as cur:
                with cur.copy("COPY pending_deletions (source, document_id, source_id) FROM STDIN") as copy:
                    for document_id, source_id in documents:
                        copy.write_row((source, document_id, source_id))


def pending_deletions(conn: psycopg.Connection, source: str) -> list[tuple[int, str]]:
    """The pending-deletion list of ``source`` as ``(document_id, source_id)`` pairs, ordered by source id."""
    return [(int(r[0]), r[1]) for r in conn.execute(
        "SELECT document_id, source_id FROM pending_deletions WHERE source = %s ORDER BY source_id",
        (source,)).fetchall()]


PENDING_MAX_AGE_S = 3600.0
"""Pending deletions older than this (seconds) are dropped unapplied: the listing that found them is stale."""


def purge_pending_deletions(conn: psycopg.Connection, source: str, *,
                            max_age_s: float = PENDING_MAX_AGE_S) -> list[tuple[int, str]]:
    """Tombstone the pending deletions of ``source`` (chunks and Markdown removed, row kept as ``deleted``)
    and empty the list, in one transaction. Kept instead: a document written or seen again since it was
    listed as pending, and every entry older than ``max_age_s`` seconds (run the inventory again). Returns
    the ``(document_id, source_id)`` pairs tombstoned."""
    with conn.transaction():
        rows = conn.execute(
            """
            SELECT p.document_id, p.source_id FROM pending_deletions p JOIN documents d ON d.id = p.document_id
            WHERE p.source = %s AND d.status <> 'deleted'
              AND p.detected_at >= clock_timestamp() - make_interval(secs => %s)
              AND d.updated_at <= p.detected_at AND COALESCE(d.last_seen_at, d.updated_at) <= p.detected_at
            ORDER BY p.source_id
            """,
            (source, max_age_s),
        ).fetchall()
        conn.execute("DELETE FROM pending_deletions WHERE source = %s", (source,))
        ids = [int(r[0]) for r in rows]
        w.mark_deleted(conn, ids)
        clear_stage(conn, ids)
        for document_id, source_id in rows:
            w.log_ingest(conn, run_id=None, document_id=document_id, source=source, source_id=source_id,
                         action="deleted", status="deleted", reason="gone from the source")
    return [(int(r[0]), r[1]) for r in rows]
