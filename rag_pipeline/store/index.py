"""Read side of the index used by the sync: per-document state, cursors, runs, reuse lookups."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from rag_pipeline.embedding.base import Embedder
from rag_pipeline.sources.base import SourceDocument
from rag_pipeline.store.generations import Generation, from_sql_vector
from rag_pipeline.store.write import text_sha256


@dataclass(frozen=True)
class IndexedDocument:
    """A ``documents`` row as the diff needs it. ``stored_chunks`` counts chunk rows of the current
    ``version`` (the completeness check compares it with ``expected_chunk_count``)."""

    id: int
    source_id: str
    status: str
    version: int
    content_sha256: str | None
    seen_sha256: str | None
    source_version: str | None
    seen_source_version: str | None
    failure_count: int
    last_error: str | None
    expected_chunk_count: int | None
    stored_chunks: int
    title: str | None
    uri: str | None
    mime_type: str | None
    metadata: dict[str, Any]
    modified_at: datetime | None
    updated_at: datetime
    doc_type: str | None = None
    generations: tuple[int, ...] = ()
    """The embedding generations holding every vector of the current version (``store.generations``)."""

    @property
    def complete(self) -> bool:
        """Stored rows equal the expectation (and there is at least one)."""
        return self.expected_chunk_count is not None and self.stored_chunks == self.expected_chunk_count > 0

    def needs_work(self, max_failures: int) -> bool:
        """Whether the index alone says this document needs another attempt, whatever a change feed
        reports: interrupted (``pending``), ``completed`` with rows missing, or ``failed`` within the limit."""
        return (self.status == "pending" or (self.status == "completed" and not self.complete)
                or (self.status == "failed" and self.failure_count < max_failures))

    @property
    def live(self) -> bool:
        """Not a tombstone."""
        return self.status != "deleted"


_COLUMNS = """
    d.id, d.source_id, d.status, d.version, d.content_sha256, d.seen_sha256, d.source_version,
    d.seen_source_version, d.failure_count, d.last_error, d.expected_chunk_count, {stored},
    d.title, d.uri, d.mime_type, d.metadata, d.modified_at, d.updated_at, d.doc_type, d.generations
"""
def _indexed(row: Sequence[Any]) -> IndexedDocument:
    return IndexedDocument(*row[:-1], generations=tuple(row[-1] or ()))


_STORED_ROWS = "(SELECT count(*) FROM chunks c WHERE c.document_id = d.id AND c.version = d.version)"


def load_index_state(conn: psycopg.Connection, source: str, *, count_rows: bool = True) -> dict[str, IndexedDocument]:
    """Every top-level document of ``source`` (tombstones included), keyed by ``source_id``: the state
    read once per listing. ``count_rows``: ``stored_chunks`` counts the chunk rows of each current version
    (what a full reconciliation needs to find and repair missing rows); False takes
    ``documents.chunk_count``, written by the same transaction as the chunks (a sensor tick over 100,000
    documents stays cheap)."""
    rows = conn.execute(
        f"SELECT {_COLUMNS.format(stored=_STORED_ROWS if count_rows else 'd.chunk_count')} FROM documents d "
        "WHERE d.source = %s AND d.parent_id IS NULL", (source,)).fetchall()
    return {r[1]: _indexed(r) for r in rows}


def find_document(conn: psycopg.Connection, source: str, source_id: str) -> IndexedDocument | None:
    """The top-level ``documents`` row of (``source``, ``source_id``) with its stored chunk rows, or ``None``."""
    row = conn.execute(
        f"SELECT {_COLUMNS.format(stored=_STORED_ROWS)} FROM documents d "
        "WHERE d.source = %s AND d.source_id = %s AND d.parent_id IS NULL", (source, source_id)).fetchone()
    return _indexed(row) if row else None


def children_of(conn: psycopg.Connection, parent_id: int) -> list[IndexedDocument]:
    """The child documents (e-mail attachments) of ``parent_id``, tombstones included, by ``source_id``."""
    rows = conn.execute(f"SELECT {_COLUMNS.format(stored=_STORED_ROWS)} FROM documents d WHERE d.parent_id = %s "
                        "ORDER BY d.source_id", (parent_id,)).fetchall()
    return [_indexed(r) for r in rows]


def document_from_index(i: IndexedDocument) -> SourceDocument:
    """The best ``SourceDocument`` the index alone can give for ``i`` (when no listing names it: a change
    feed's retry or repair, a partition materialized from the UI): stable id, title, uri, MIME type,
    modification time, source version, metadata."""
    return SourceDocument(source_id=i.source_id, title=i.title or i.source_id, uri=i.uri or "",
                          mime_type=i.mime_type, modified_at=i.modified_at,
                          source_version=i.seen_source_version or i.source_version, metadata=dict(i.metadata or {}))


def get_cursor(conn: psycopg.Connection, source: str) -> str | None:
    """The saved change-feed cursor of ``source``, or ``None``."""
    row = conn.execute("SELECT cursor FROM source_cursors WHERE source = %s", (source,)).fetchone()
    return row[0] if row else None


def save_cursor(conn: psycopg.Connection, source: str, cursor: str) -> None:
    """Save ``cursor`` for ``source`` (call only after the sync that used it has committed)."""
    conn.execute(
        """
        INSERT INTO source_cursors (source, cursor) VALUES (%s, %s)
        ON CONFLICT (source) DO UPDATE SET cursor = EXCLUDED.cursor, updated_at = now()
        """,
        (source, cursor),
    )


def cached_embeddings(conn: psycopg.Connection, g: Generation, sha256s: Sequence[str]) -> dict[str, np.ndarray]:
    """Vectors generation ``g`` already holds for these chunk-text hashes (the embedding cache):
    ``{text_sha256: float32 vector}``; absent hashes are missing from the result."""
    if not sha256s:
        return {}
    rows = conn.execute(
        f"""
        SELECT DISTINCT ON (c.text_sha256) c.text_sha256, e.embedding
        FROM chunks c JOIN {g.table} e ON e.chunk_id = c.id WHERE c.text_sha256 = ANY(%s)
        """,
        (list(set(sha256s)),),
    ).fetchall()
    return {sha: from_sql_vector(vec) for sha, vec in rows}


def vectors_for_texts(conn: psycopg.Connection, g: Generation, embedder: Embedder, texts: Sequence[str], *,
                      before_embed: Callable[[int], None] | None = None) -> tuple[dict[str, np.ndarray], list[str]]:
    """A vector in generation ``g`` for every distinct text of ``texts``: from the embedding cache (chunks
    with the same text SHA-256 that ``g`` holds a vector for) where possible, else embedded with
    ``embedder`` (``g``'s) in one call.

    Returns ``({text: float32 vector}, texts embedded now)``; ``before_embed(n)`` is called before the
    embedder with the number of texts it gets. Raises the embedder's ``EmbeddingError``.
    """
    hashes = {t: text_sha256(t) for t in texts}
    cached = cached_embeddings(conn, g, list(hashes.values()))
    vectors = {t: cached[h] for t, h in hashes.items() if h in cached}
    missing = [t for t in hashes if t not in vectors]
    if missing:
        if before_embed is not None:
            before_embed(len(missing))
        vectors.update(zip(missing, embedder.embed(missing), strict=True))
    return vectors, missing


@dataclass(frozen=True)
class StoredExtraction:
    """Markdown stored for some document with the same content hash (reused instead of re-extracting)."""

    markdown: str
    mime_type: str
    doc_type: str
    page_count: int | None
    char_count: int
    stats: dict[str, Any]


def stored_extraction(conn: psycopg.Connection, content_sha256: str) -> StoredExtraction | None:
    """The Markdown and statistics of a completed document whose content hash is ``content_sha256``."""
    row = conn.execute(
        """
        SELECT m.markdown, d.mime_type, d.doc_type, d.page_count, d.char_count, d.extraction_stats
        FROM document_markdown m JOIN documents d ON d.id = m.document_id
        WHERE m.content_sha256 = %s AND d.status = 'completed' AND d.content_sha256 = %s
        LIMIT 1
        """,
        (content_sha256, content_sha256),
    ).fetchone()
    if row is None or not row[0]:
        return None
    return StoredExtraction(row[0], row[1] or "application/octet-stream", row[2] or "unknown", row[3],
                            row[4] or len(row[0]), dict(row[5] or {}))


def start_run(conn: psycopg.Connection, source: str, mode: str) -> int:
    """Insert a ``sync_runs`` row (status ``running``) and return its id.

    Call only while holding the source's sync lock: rows of ``source`` still ``running`` then belong
    to runs that died (SIGKILL, lost connection, an exception that escaped) and are closed first as
    ``interrupted``, so ``running`` never outlives its process by more than one run."""
    conn.execute(
        "UPDATE sync_runs SET status = 'interrupted', finished_at = now() WHERE source = %s AND status = 'running'",
        (source,),
    )
    return int(conn.execute(
        "INSERT INTO sync_runs (source, mode) VALUES (%s, %s) RETURNING id", (source, mode)
    ).fetchone()[0])


def finish_run(conn: psycopg.Connection, run_id: int, *, status: str, mode: str, listed: int | None,
               guard_passed: bool, guard_reason: str | None, counts: dict[str, Any]) -> None:
    """Close a ``sync_runs`` row with its outcome."""
    conn.execute(
        """
        UPDATE sync_runs SET finished_at = now(), status = %s, mode = %s, listed = %s, guard_passed = %s,
               guard_reason = %s, counts = %s WHERE id = %s
        """,
        (status, mode, listed, guard_passed, guard_reason, Jsonb(counts), run_id),
    )
