"""One document in three persisted steps: Markdown, chunks, embeddings (plain Python, no Dagster).

The Dagster per-document assets (``defs/documents``) are thin wrappers around these functions:

1. ``stage_markdown``: fetch, hash and extract one listed document; stage the Markdown in PostgreSQL
   (``document_stage``). Unchanged content (same hash as the completed version) stops here.
2. ``stage_chunks``: chunk the staged Markdown for the embedder; stage the chunk texts.
3. ``write_embeddings``: for a batch of documents, embed the staged chunks (embedding cache first, each
   distinct text once) and swap each document's version in one transaction
   (``store.write.replace_document``). A completed document whose chunks were embedded by another model
   is *re-embedded* from its stored chunk texts and Markdown, never re-extracted.

Errors follow ``sync.py``: a deterministic content error (password, unsupported, empty, no text, a
source's skip reason) makes the document ``permanently_failed`` at once (action ``failed``); anything
else is transient and returned as action ``error`` with its reason, without touching the document:
whoever runs the step counts the failed attempt (``store.staging.record_attempt_failure``, once per
attempt). Only database errors raise.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from rag_pipeline.chunking import Chunk, chunk_for_embedder
from rag_pipeline.config import Settings
from rag_pipeline.embedding.base import Embedder, EmbeddingError
from rag_pipeline.extraction.types import Extraction, ExtractionError, NoTextError
from rag_pipeline.faults import checkpoint
from rag_pipeline.sources.base import DocumentSkipped, Source, SourceDocument, SourceError
from rag_pipeline.store import index as idx_store
from rag_pipeline.store import staging
from rag_pipeline.store import write as w
from rag_pipeline.store.index import IndexedDocument
from rag_pipeline.sync import extract_or_reuse

log = logging.getLogger(__name__)

PREVIEW_CHARS = 600
"""Characters of Markdown (or chunk text) kept as a step's preview."""


@dataclass
class StepOutcome:
    """What one step did to one document.

    ``action``: ``staged`` | ``unchanged`` | ``chunked`` | ``written`` | ``re-embedded`` | ``skipped``
    (nothing to do, ``reason`` says why) | ``failed`` (``permanently_failed`` now, ``reason``) | ``error``
    (transient, ``reason``; the document is untouched and the attempt must be counted by the caller).
    ``status``: the document's status afterwards (None when it has no row). Counts: ``char_count``
    characters, ``page_count`` pages, ``chunk_count`` chunks, ``embedded``/``reused`` chunk vectors
    computed/taken from the cache; ``duration_s`` seconds; ``preview`` the first ``PREVIEW_CHARS``
    characters of the Markdown (or of the first chunk).
    """

    source_id: str
    document_id: int | None
    action: str
    status: str | None
    reason: str | None = None
    char_count: int | None = None
    page_count: int | None = None
    chunk_count: int | None = None
    model: str | None = None
    embedded: int = 0
    reused: int = 0
    version: int | None = None
    duration_s: float = 0.0
    preview: str = ""
    stats: dict[str, Any] = field(default_factory=dict)
    became_permanent: bool = False

    @property
    def chars_per_page(self) -> float | None:
        """Characters per page, when the format has pages."""
        if self.char_count is None or not self.page_count:
            return None
        return self.char_count / self.page_count

    @property
    def is_error(self) -> bool:
        """A transient failure the caller must count and retry later."""
        return self.action == "error"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _terminal(conn: psycopg.Connection, source: str, doc_id: str, document_id: int, previous: str | None,
              reason: str, *, settings: Settings, sha: str | None, source_version: str | None,
              started: float) -> StepOutcome:
    """Record a deterministic content error: ``permanently_failed`` at once, staged work dropped."""
    status, _count = w.record_failure(conn, document_id, reason=reason, terminal=True,
                                      max_failures=settings.max_failures, seen_sha256=sha,
                                      seen_source_version=source_version)
    staging.clear_stage(conn, [document_id])
    w.log_ingest(conn, run_id=None, document_id=document_id, source=source, source_id=doc_id, action="failed",
                 status=status, reason=reason)
    return StepOutcome(doc_id, document_id, "failed", status, reason, duration_s=time.perf_counter() - started,
                       became_permanent=previous != "permanently_failed")


def listed_documents(source: Source, source_ids: Sequence[str]) -> dict[str, SourceDocument]:
    """The listing entries of ``source_ids`` (one full listing); an id the source does not list (or a failed
    listing) maps to a bare ``SourceDocument`` with only its id, whose fetch then reports the problem."""
    wanted = set(source_ids)
    found: dict[str, SourceDocument] = {}
    try:
        found = {d.source_id: d for d in source.list_documents().documents if d.source_id in wanted}
    except SourceError as exc:
        log.warning("%s: listing for %d document(s) failed: %s", source.name, len(wanted), exc)
    return {sid: found.get(sid) or SourceDocument(source_id=sid, title=sid, uri="") for sid in source_ids}


def stage_markdown(conn: psycopg.Connection, source: Source, doc: SourceDocument, settings: Settings) -> StepOutcome:
    """Step 1 for one listed document: fetch, hash, extract, stage the Markdown.

    Creates the ``pending`` row of a new document (revives a tombstone). Unchanged content of a complete
    document only refreshes its metadata (action ``unchanged``); unchanged content of a permanently failed
    one is skipped. Extraction is reused from the stage (same hash) or from any completed document with the
    same content before running ``extraction.extract``. Returns a ``StepOutcome`` (see module docstring).
    """
    started = time.perf_counter()
    i = staging.find_document(conn, source.name, doc.source_id)
    document_id = i.id if i else w.ensure_document(conn, source.name, doc)
    previous = i.status if i else None
    if i is not None and i.status == "deleted":
        conn.execute("UPDATE documents SET status = 'pending', deleted_at = NULL, failure_count = 0, "
                     "updated_at = now() WHERE id = %s", (document_id,))
        previous = "pending"
    sha = None
    try:
        if doc.skip_reason:
            raise DocumentSkipped(doc.skip_reason)
        data = source.fetch(doc)
        checkpoint("ingest.after_fetch")
        sha = _sha256(data)
        if i is not None and i.status == "completed" and i.complete and sha == i.content_sha256:
            w.update_metadata(conn, document_id, doc, expires=w.expires_at(doc, None, settings.expiry_days))
            conn.execute("UPDATE documents SET seen_sha256 = %s WHERE id = %s", (sha, document_id))
            staging.clear_stage(conn, [document_id])
            return StepOutcome(doc.source_id, document_id, "unchanged", "completed", "content unchanged",
                               chunk_count=i.stored_chunks, duration_s=time.perf_counter() - started)
        if i is not None and i.status == "permanently_failed" and sha == i.seen_sha256:
            return StepOutcome(doc.source_id, document_id, "skipped", i.status,
                               f"permanently failed and content unchanged: {i.last_error}",
                               duration_s=time.perf_counter() - started)
        extraction = _extraction_for(conn, document_id, sha, data, doc, settings)
        checkpoint("ingest.after_extract")
        staging.save_stage(conn, document_id, content_sha256=sha, listing=doc, extraction=extraction)
        return StepOutcome(doc.source_id, document_id, "staged", previous or "pending", None,
                           char_count=extraction.char_count, page_count=extraction.page_count,
                           duration_s=time.perf_counter() - started, preview=extraction.markdown[:PREVIEW_CHARS],
                           stats=dict(extraction.stats))
    except DocumentSkipped as exc:
        reason, terminal = exc.reason, True
    except ExtractionError as exc:
        reason, terminal = exc.reason, exc.terminal
    except SourceError as exc:
        reason, terminal = str(exc), not exc.transient
    except psycopg.Error:
        raise
    except Exception as exc:  # one bad document never stops the others
        log.exception("unexpected error on %s", doc.source_id)
        reason, terminal = f"{type(exc).__name__}: {exc}", False
    if terminal:
        return _terminal(conn, source.name, doc.source_id, document_id, previous, reason, settings=settings,
                         sha=sha, source_version=doc.source_version, started=started)
    return StepOutcome(doc.source_id, document_id, "error", previous or "pending", reason,
                       duration_s=time.perf_counter() - started)


def _extraction_for(conn: psycopg.Connection, document_id: int, sha: str, data: bytes, doc: SourceDocument,
                    settings: Settings) -> Extraction:
    staged = staging.load_stage(conn, document_id)
    if staged is not None and staged.content_sha256 == sha:
        return Extraction(staged.markdown, staged.mime_type, staged.doc_type, staged.page_count, staged.char_count,
                          {**staged.stats, "reused_extraction": True})
    return extract_or_reuse(conn, sha, data, doc, settings)


def stage_chunks(conn: psycopg.Connection, source: str, source_id: str, embedder: Embedder,
                 settings: Settings) -> StepOutcome:
    """Step 2: chunk the staged Markdown of (``source``, ``source_id``) for ``embedder`` and stage the chunks.

    Nothing staged (unchanged or failed content) gives action ``skipped``; Markdown without any chunk makes
    the document ``permanently_failed`` (no text).
    """
    started = time.perf_counter()
    i = staging.find_document(conn, source, source_id)
    if i is None:
        return StepOutcome(source_id, None, "skipped", None, "not in the index")
    staged = staging.load_stage(conn, i.id)
    if staged is None:
        return StepOutcome(source_id, i.id, "skipped", i.status, "nothing staged: no new content to chunk",
                           chunk_count=i.stored_chunks if i.status == "completed" else None)
    try:
        chunks = chunk_for_embedder(staged.markdown, embedder, chunk_size=settings.chunk_size,
                                    chunk_overlap=settings.chunk_overlap)
        if not chunks:
            raise NoTextError("no text extracted")
        staging.save_stage_chunks(conn, i.id, chunks)
    except ExtractionError as exc:
        if exc.terminal:
            return _terminal(conn, source, source_id, i.id, i.status, exc.reason, settings=settings,
                             sha=staged.content_sha256, source_version=staged.listing.source_version, started=started)
        return StepOutcome(source_id, i.id, "error", i.status, exc.reason, duration_s=time.perf_counter() - started)
    except psycopg.Error:
        raise
    except Exception as exc:
        log.exception("chunking failed on %s", source_id)
        return StepOutcome(source_id, i.id, "error", i.status, f"{type(exc).__name__}: {exc}",
                           duration_s=time.perf_counter() - started)
    tokens = [c.token_count for c in chunks]
    return StepOutcome(source_id, i.id, "chunked", i.status, None, char_count=staged.char_count,
                       page_count=staged.page_count, chunk_count=len(chunks), duration_s=time.perf_counter() - started,
                       preview=chunks[0].text[:PREVIEW_CHARS],
                       stats={"max_tokens": max(tokens), "mean_tokens": round(sum(tokens) / len(tokens), 1)})


@dataclass
class _Pending:
    indexed: IndexedDocument
    kind: str  # write | re-embed
    doc: SourceDocument
    sha: str
    chunks: list[Chunk]
    markdown: str
    mime_type: str
    doc_type: str
    page_count: int | None
    char_count: int
    stats: dict[str, Any]
    expires: datetime | None
    started: float


def _other_model(conn: psycopg.Connection, i: IndexedDocument, model: str) -> str | None:
    row = conn.execute("SELECT embedding_model FROM chunks WHERE document_id = %s AND version = %s "
                       "AND embedding_model <> %s LIMIT 1", (i.id, i.version, model)).fetchone()
    return row[0] if row else None


def _stored_version(conn: psycopg.Connection, i: IndexedDocument, embedder: Embedder, settings: Settings,
                    started: float) -> _Pending:
    """The current version of a completed document, as stored: its chunk texts and Markdown (re-chunked from
    that Markdown only when a chunk exceeds the embedder's token limit)."""
    row = conn.execute(
        """
        SELECT d.content_sha256, d.mime_type, d.doc_type, d.page_count, d.char_count, d.extraction_stats,
               d.expires_at, d.source_version, COALESCE(m.markdown, '')
        FROM documents d LEFT JOIN document_markdown m ON m.document_id = d.id WHERE d.id = %s
        """, (i.id,)).fetchone()
    sha, mime, doc_type, pages, chars, stats, expires, source_version, markdown = row
    rows = conn.execute(
        "SELECT ordinal, text, token_count, pages, heading_path, metadata FROM chunks "
        "WHERE document_id = %s AND version = %s ORDER BY ordinal", (i.id, i.version)).fetchall()
    chunks = [Chunk(text=r[1], ordinal=r[0], pages=tuple(r[3]), heading_path=tuple(r[4]), token_count=r[2],
                    metadata=dict(r[5] or {})) for r in rows]
    counts = embedder.count_tokens([c.text for c in chunks])
    if markdown and any(n > embedder.max_tokens for n in counts):
        chunks = chunk_for_embedder(markdown, embedder, chunk_size=settings.chunk_size,
                                    chunk_overlap=settings.chunk_overlap)
    else:
        chunks = [Chunk(c.text, c.ordinal, c.pages, c.heading_path, n, c.metadata) for c, n in zip(chunks, counts, strict=True)]
    doc = SourceDocument(source_id=i.source_id, title=i.title or i.source_id, uri=i.uri or "", mime_type=mime,
                         modified_at=i.modified_at, source_version=source_version, metadata=dict(i.metadata or {}))
    return _Pending(i, "re-embed", doc, sha, chunks, markdown, mime or "application/octet-stream",
                    doc_type or "unknown", pages, chars or len(markdown), dict(stats or {}), expires, started)


def write_embeddings(conn: psycopg.Connection, source: str, source_ids: Sequence[str], embedder: Embedder,
                     settings: Settings, *, force: bool = False) -> list[StepOutcome]:
    """Step 3 for a batch of documents of ``source``: embed and atomically write; one outcome per id, in order.

    A document with staged chunks gets a new version from them (action ``written``). A ``completed``
    document holding chunks of a model other than ``embedder.model_id`` (or any completed one when
    ``force``) is re-embedded from its stored chunk texts (action ``re-embedded``): a new version swapped in
    one transaction, so readers see the old vectors or the new ones, never a mix. Anything else is
    ``skipped``. An embedding failure is a transient ``error`` for every document of the batch.
    """
    model = embedder.model_id
    outcomes: dict[str, StepOutcome] = {}
    pending: list[_Pending] = []
    for sid in dict.fromkeys(source_ids):
        started = time.perf_counter()
        i = staging.find_document(conn, source, sid)
        if i is None or i.status == "deleted":
            outcomes[sid] = StepOutcome(sid, i.id if i else None, "skipped", i.status if i else None, "not in the index")
            continue
        staged = staging.load_stage(conn, i.id)
        if staged is not None and staged.chunks:
            pending.append(_Pending(i, "write", staged.listing, staged.content_sha256, staged.chunks, staged.markdown,
                                    staged.mime_type, staged.doc_type, staged.page_count, staged.char_count,
                                    staged.stats, w.expires_at(staged.listing, staged.doc_type, settings.expiry_days),
                                    started))
        elif i.status == "completed" and i.version > 0 and (force or _other_model(conn, i, model)):
            pending.append(_stored_version(conn, i, embedder, settings, started))
        else:
            reason = "embeddings up to date" if i.status == "completed" else f"nothing staged (status {i.status})"
            outcomes[sid] = StepOutcome(sid, i.id, "skipped", i.status, reason, model=model if
                                        i.status == "completed" else None,
                                        chunk_count=i.stored_chunks if i.status == "completed" else None)
    if pending:
        _embed_and_write(conn, source, pending, embedder, outcomes)
    return [outcomes[sid] for sid in dict.fromkeys(source_ids)]


def _embed_and_write(conn: psycopg.Connection, source: str, pending: list[_Pending], embedder: Embedder,
                     outcomes: dict[str, StepOutcome]) -> None:
    model = embedder.model_id
    try:
        vectors, missing = idx_store.vectors_for_texts(conn, embedder, [c.text for p in pending for c in p.chunks])
        checkpoint("ingest.after_embed")
    except EmbeddingError as exc:
        for p in pending:
            outcomes[p.indexed.source_id] = StepOutcome(p.indexed.source_id, p.indexed.id, "error", p.indexed.status,
                                                        str(exc), duration_s=time.perf_counter() - p.started)
        return
    fresh = set(missing)
    for p in pending:
        i = p.indexed
        rows = [w.ChunkRow(c.ordinal, c.text, c.token_count, vectors[c.text], c.pages, c.heading_path,
                           c.metadata) for c in p.chunks]
        embedded_here = {c.text for c in p.chunks if c.text in fresh}
        fresh -= embedded_here
        try:
            version = w.replace_document(
                conn, i.id, doc=p.doc, content_sha256=p.sha, chunks=rows, embedding_model=model,
                mime_type=p.mime_type, doc_type=p.doc_type, char_count=p.char_count, page_count=p.page_count,
                stats=p.stats, markdown=p.markdown, expires=p.expires)
        except w.IncompleteWriteError as exc:
            outcomes[i.source_id] = StepOutcome(i.source_id, i.id, "error", i.status, str(exc),
                                                duration_s=time.perf_counter() - p.started)
            continue
        staging.clear_stage(conn, [i.id])
        action = "re-embedded" if p.kind == "re-embed" else ("added" if i.version == 0 else "updated")
        w.log_ingest(conn, run_id=None, document_id=i.id, source=source, source_id=i.source_id, action=action,
                     status="completed", version=version, char_count=p.char_count, chunk_count=len(rows),
                     embedded_count=len(embedded_here),
                     duration_ms=int((time.perf_counter() - p.started) * 1000))
        outcomes[i.source_id] = StepOutcome(
            i.source_id, i.id, "re-embedded" if p.kind == "re-embed" else "written", "completed", None,
            char_count=p.char_count, page_count=p.page_count, chunk_count=len(rows), model=model,
            embedded=len(embedded_here), reused=len(rows) - len(embedded_here), version=version,
            duration_s=time.perf_counter() - p.started, preview=p.chunks[0].text[:PREVIEW_CHARS])
