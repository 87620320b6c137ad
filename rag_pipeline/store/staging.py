"""Tables behind the Dagster per-document assets (revisions 0002, 0003): staged work, pending deletions.

* ``document_stage``: what one asset hands to the next (the listing, the Markdown and its statistics, the
  attachments' bytes, then the chunk texts), so the steps of ``rag_pipeline.pipeline.steps`` can run as
  three assets. A staged row counts only while it is newer than the document's last write
  (``documents.ingested_at``): a stage left behind by a failed run never overwrites newer content.
* ``pending_deletions``: documents gone from a source, written by an inventory whose deletion guard
  passed and claimed by the purge asset (``claim_pending_deletions``), which tombstones them with
  ``pipeline.steps.delete``.

Failed attempts are not here: every caller records them with ``store.write.record_failure``.
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
from rag_pipeline.store.index import IndexedDocument, load_index_state

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


# -- staged work ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class StagedDocument:
    """A document between steps: the fetched content's hash, the listing it came with, the Markdown and
    its statistics, the attachments as ``(file name, bytes)``, and (after ``document_chunks``) the chunks.
    ``staged_at`` is timezone-aware."""

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
    children: list[tuple[str, bytes]]

    @property
    def extraction(self) -> Extraction:
        """The staged ``Extraction`` (attachments included)."""
        return Extraction(self.markdown, self.mime_type, self.doc_type, self.page_count, self.char_count,
                          dict(self.stats), list(self.children))


def save_stage(conn: psycopg.Connection, document_id: int, *, content_sha256: str, listing: SourceDocument,
               extraction: Extraction) -> None:
    """Stage the Markdown of ``document_id`` with its attachments (replacing any earlier stage; chunks
    cleared)."""
    conn.execute(
        """
        INSERT INTO document_stage (document_id, content_sha256, listing, markdown, mime_type, doc_type,
                                    page_count, char_count, stats, chunks, children_names, children_data, staged_at)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, NULL, %s, %s, clock_timestamp())
        ON CONFLICT (document_id) DO UPDATE SET
          content_sha256 = EXCLUDED.content_sha256, listing = EXCLUDED.listing, markdown = EXCLUDED.markdown,
          mime_type = EXCLUDED.mime_type, doc_type = EXCLUDED.doc_type, page_count = EXCLUDED.page_count,
          char_count = EXCLUDED.char_count, stats = EXCLUDED.stats, chunks = NULL,
          children_names = EXCLUDED.children_names, children_data = EXCLUDED.children_data,
          staged_at = clock_timestamp()
        """,
        (document_id, content_sha256, Jsonb(document_to_json(listing)), extraction.markdown.replace("\x00", ""),
         extraction.mime_type, extraction.doc_type, extraction.page_count, extraction.char_count,
         Jsonb(w._json_safe(dict(extraction.stats))), [n for n, _ in extraction.children],
         [d for _, d in extraction.children]),
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
               s.char_count, s.stats, s.chunks, s.staged_at, s.children_names, s.children_data
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
    children = list(zip(row[11] or [], [bytes(d) for d in row[12] or []], strict=True))
    return StagedDocument(row[0], row[1], document_from_json(row[2]), row[3], row[4], row[5], row[6], row[7],
                          dict(row[8] or {}), chunks, row[10], children)


def clear_stage(conn: psycopg.Connection, document_ids: Sequence[int]) -> int:
    """Drop the staged work of ``document_ids``; return how many rows went."""
    if not document_ids:
        return 0
    return conn.execute("DELETE FROM document_stage WHERE document_id = ANY(%s)", (list(document_ids),)).rowcount


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


def claim_pending_deletions(conn: psycopg.Connection, source: str, *,
                            max_age_s: float = PENDING_MAX_AGE_S) -> list[IndexedDocument]:
    """Empty the pending-deletion list of ``source`` and return the entries still valid, to tombstone now:
    not a tombstone already, not written or seen again since it was listed as pending, and younger than
    ``max_age_s`` seconds (older ones are dropped: run the inventory again). One transaction."""
    with conn.transaction():
        rows = conn.execute(
            """
            SELECT p.source_id FROM pending_deletions p JOIN documents d ON d.id = p.document_id
            WHERE p.source = %s AND d.status <> 'deleted'
              AND p.detected_at >= clock_timestamp() - make_interval(secs => %s)
              AND d.updated_at <= p.detected_at AND COALESCE(d.last_seen_at, d.updated_at) <= p.detected_at
            ORDER BY p.source_id
            """,
            (source, max_age_s),
        ).fetchall()
        conn.execute("DELETE FROM pending_deletions WHERE source = %s", (source,))
    wanted = {r[0] for r in rows}
    state = load_index_state(conn, source, count_rows=False)
    return [state[sid] for sid in sorted(wanted) if sid in state]
