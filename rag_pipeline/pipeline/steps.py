"""The per-document steps, one implementation for every caller.

``fetch_and_extract`` (fetch, hash, extract or reuse) -> ``chunk`` (for the embedder's token limit) ->
``embed_and_write`` (embedding cache first, each distinct text once, then the swap of
``store.write.replace_document`` per document) -> ``attachments`` (child documents of a written parent).
``process`` chains them in memory for a list of documents (``pipeline.sync`` and attachments); the Dagster
per-document assets call the same steps one at a time with the work staged in PostgreSQL between them
(``store.staging``). Every step ends each document in a state with a reason and one ``ingest_log`` row
(``finish``); errors are sorted once, in ``classify``, and recorded by ``fail`` with the one failure
policy (``store.write.record_failure``, keyed by the run's attempt key). Only database errors raise.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import psycopg

from rag_pipeline.chunking import Chunk, chunk_for_embedder
from rag_pipeline.config import Settings
from rag_pipeline.embedding.base import Embedder, EmbeddingError
from rag_pipeline.extraction.types import Extraction, ExtractionError, NoTextError
from rag_pipeline.faults import checkpoint
from rag_pipeline.pipeline import generations as gens
from rag_pipeline.pipeline.outcome import Action, DocumentOutcome
from rag_pipeline.pipeline.plan import Decision
from rag_pipeline.pipeline.spool import Spool, check_size
from rag_pipeline.sources.base import DocumentSkipped, Source, SourceDocument, SourceError, fetch_into
from rag_pipeline.store import index as idx
from rag_pipeline.store import write as w
from rag_pipeline.store.generations import kept as kept_generations
from rag_pipeline.store.index import IndexedDocument

log = logging.getLogger(__name__)

PREVIEW_CHARS = 600
"""Characters of Markdown (or chunk text) kept as a step's preview."""


class Notifier(Protocol):
    """Receives alerts: documents that became ``permanently_failed``, a tripped deletion guard, the
    dead-letter report (``rag_pipeline.notify`` implements it)."""

    def notify(self, event: str, message: str, details: dict[str, Any]) -> None:
        """Send one alert; ``event`` is ``permanently_failed``, ``deletion_guard`` or ``dead_letter``."""
        ...


@dataclass(frozen=True)
class RunContext:
    """Who runs the steps: the connection, the source's configured ``source`` name, the settings and the
    ``run_id`` (``sync:<sync_runs.id>`` or ``dagster:<root run id>``), which is also the attempt key of
    every failure recorded in this run (a retried step in the same run never counts twice)."""

    conn: psycopg.Connection
    source: str
    settings: Settings
    run_id: str


@dataclass
class Work:
    """One document to process: the listing ``doc``, its ``indexed`` row (None when new), the plan's
    ``decision``; for an attachment its ``parent_id`` and its bytes (``data``)."""

    doc: SourceDocument
    indexed: IndexedDocument | None
    decision: Decision
    parent_id: int | None = None
    data: bytes | None = None


@dataclass
class Prepared:
    """A document between steps: its row id, the content hash, the extraction and, after ``chunk``, the
    chunks; ``reembed``: the stored version with vectors to recompute (no fetch, no extraction)."""

    work: Work
    document_id: int
    sha: str
    extraction: Extraction
    started: float
    chunks: list[Chunk] | None = None
    reembed: bool = False


class WriteFailed(RuntimeError):
    """The swap transaction failed for another reason than a row-count mismatch (rolled back)."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def finish(ctx: RunContext, outcome: DocumentOutcome) -> DocumentOutcome:
    """Write the outcome's ``ingest_log`` row (with the run id) and return it."""
    w.log_ingest(ctx.conn, run_id=ctx.run_id, document_id=outcome.document_id, source=ctx.source,
                 source_id=outcome.source_id, action=outcome.action.value, status=outcome.status,
                 reason=outcome.reason, version=outcome.version, char_count=outcome.char_count,
                 chunk_count=outcome.chunk_count, embedded_count=outcome.embedded,
                 duration_ms=int(outcome.duration_s * 1000))
    return outcome


def classify(exc: BaseException) -> tuple[str, str]:
    """``(reason, kind)`` of a step's exception, ``kind`` one of ``store.write.FAILURE_KINDS``: empty or
    no text -> ``skipped``; deterministic content errors, a limit exceeded on this content (size, time,
    memory, OCR pages: ``ExtractionLimitError``, ``DocumentTooLargeError``), a crash of the extraction
    worker on it and a source's refusal -> ``terminal``; anything else (services down, fetch timeouts,
    bugs) -> ``transient``."""
    if isinstance(exc, DocumentSkipped):
        return exc.reason, "terminal"
    if isinstance(exc, ExtractionError):
        return exc.reason, "skipped" if exc.skip else "terminal" if exc.terminal else "transient"
    if isinstance(exc, SourceError):
        return str(exc), "transient" if exc.transient else "terminal"
    if isinstance(exc, (EmbeddingError, w.IncompleteWriteError, WriteFailed)):
        return str(exc), "transient"
    return f"{type(exc).__name__}: {exc}", "transient"


def fail(ctx: RunContext, work: Work, document_id: int, exc: BaseException, *, sha: str | None, started: float,
         mime: str | None = None, doc_type: str | None = None) -> DocumentOutcome:
    """Record a failed attempt (the one failure policy) and return its outcome (``failed``/``skipped``).

    When the bytes were never read (the fetch failed) the listing's hash is what was seen: without it the
    next plan would take the document for changed, ignoring the backoff and, for a permanently failed
    one, fetching (and alerting) again on every sync."""
    reason, kind = classify(exc)
    record = w.record_failure(ctx.conn, document_id, attempt_key=ctx.run_id, reason=reason, kind=kind,
                              max_failures=ctx.settings.max_failures,
                              seen_sha256=sha if sha is not None else work.doc.content_sha256,
                              seen_source_version=work.doc.source_version, mime_type=mime, doc_type=doc_type)
    outcome = DocumentOutcome(work.doc.source_id, work.doc.title, Action.SKIPPED if kind == "skipped" else Action.FAILED,
                              record.status, reason, document_id, duration_s=time.perf_counter() - started,
                              became_permanent=record.became_permanent, transient=kind == "transient")
    return finish(ctx, outcome) if record.recorded else outcome


def open_document(ctx: RunContext, work: Work) -> int:
    """The ``documents.id`` of the work's document: its row, a new ``pending`` row, or a revived tombstone."""
    if work.indexed is None:
        return w.ensure_document(ctx.conn, ctx.source, work.doc, parent_id=work.parent_id)
    if work.indexed.status == "deleted":
        ctx.conn.execute("UPDATE documents SET status = 'pending', deleted_at = NULL, failure_count = 0, "
                         "updated_at = now() WHERE id = %s", (work.indexed.id,))
    return work.indexed.id


def update_metadata(ctx: RunContext, work: Work, document_id: int, *, sha: str | None = None,
                    started: float | None = None) -> DocumentOutcome:
    """Same content, new title/uri/version/metadata: the row only (the expiry keeps the document's type),
    and the content hash seen when the bytes were read. Logged as ``metadata-updated``."""
    i = work.indexed
    doc_type = i.doc_type if i else None
    w.update_metadata(ctx.conn, document_id, work.doc,
                      expires=w.expires_at(work.doc, doc_type, ctx.settings.expiry_days))
    if sha is not None:
        ctx.conn.execute("UPDATE documents SET seen_sha256 = %s WHERE id = %s", (sha, document_id))
    return finish(ctx, DocumentOutcome(
        work.doc.source_id, work.doc.title, Action.METADATA, i.status if i else "completed",
        "content unchanged" if sha is not None else None, document_id,
        i.version if i else None, chunk_count=i.stored_chunks if i else None,
        duration_s=time.perf_counter() - started if started else 0.0))


def extract_or_reuse(conn: psycopg.Connection, content_sha256: str, data: bytes | Path, doc: SourceDocument,
                     settings: Settings) -> Extraction:
    """The document's ``Extraction``: the Markdown already stored for a completed document with the same
    content hash (stats marked ``reused_extraction``), else ``extraction.extract`` on ``data`` (the bytes, or
    the spool file the worker reads itself) with the source's file name (``metadata["filename"]``, else the
    title, else the id). Raises ``ExtractionError``."""
    stored = idx.stored_extraction(conn, content_sha256)
    if stored is not None:
        return Extraction(stored.markdown, stored.mime_type, stored.doc_type, stored.page_count,
                          stored.char_count, {**stored.stats, "reused_extraction": True})
    from rag_pipeline.extraction import extract

    filename = str(doc.metadata.get("filename") or doc.title or doc.source_id)
    return extract(data, filename=filename, declared_mime=doc.mime_type, settings=settings)


def fetch_and_extract(ctx: RunContext, source: Source | None, work: Work, *,
                      reuse: Callable[[str], Extraction | None] | None = None) -> Prepared | DocumentOutcome:
    """Step 1: fetch (``work.data`` for an attachment), hash, extract. Returns the ``Prepared`` document, or
    the outcome when it ends here: unchanged content of a complete document (``metadata-updated``), the same
    content a terminal failure was for (``skipped-unchanged``), or a failure. Without fetching: a
    ``METADATA`` decision updates the row, a ``REEMBED`` decision returns the stored version. ``reuse(sha)``: an extraction already staged for that content."""
    started = time.perf_counter()
    document_id = open_document(ctx, work)
    i = work.indexed
    if work.decision == Decision.REEMBED and i is not None and i.status == "completed":
        return stored_version(ctx, work, started)
    if work.decision == Decision.METADATA and i is not None:
        return update_metadata(ctx, work, document_id, started=started)  # the listing says: same content
    sha = None
    try:
        if work.doc.skip_reason:
            raise DocumentSkipped(work.doc.skip_reason)
        if work.data is not None:  # an attachment, extracted from its parent by the worker
            sha = _sha256(work.data)
            return _extract_fetched(ctx, work, document_id, sha, work.data, len(work.data), started, reuse)
        check_size(work.doc.size, ctx.settings.max_document_mb)  # the listing's size: refused without reading it
        if source is None:
            raise SourceError(f"{work.doc.source_id}: no source to fetch it from")
        with Spool(ctx.settings.max_document_mb) as spool:  # streamed to a private file, capped as it arrives
            fetch_into(source, work.doc, spool)
            sha = spool.sha256
            return _extract_fetched(ctx, work, document_id, sha, spool.finish(), spool.size, started, reuse)
    except psycopg.Error:
        raise
    except Exception as exc:  # one bad document never stops the others
        if not isinstance(exc, (DocumentSkipped, ExtractionError, SourceError)):
            log.exception("unexpected error on %s", work.doc.source_id)
        return fail(ctx, work, document_id, exc, sha=sha, started=started)


def _extract_fetched(ctx: RunContext, work: Work, document_id: int, sha: str, data: bytes | Path, size: int,
                     started: float, reuse: Callable[[str], Extraction | None] | None) -> Prepared | DocumentOutcome:
    """``fetch_and_extract`` once the content is read (``data``: bytes or the spool file, ``size`` bytes,
    ``sha`` its hex SHA-256): unchanged content ends here, else extract (or reuse) it."""
    checkpoint("pipeline.after_fetch")
    i = work.indexed
    if i is not None and i.status == "completed" and i.complete and sha == i.content_sha256:
        return update_metadata(ctx, work, document_id, sha=sha, started=started)
    if (i is not None and i.status in ("permanently_failed", "skipped") and sha == i.seen_sha256
            and work.decision == Decision.CHECK):
        return DocumentOutcome(work.doc.source_id, work.doc.title, Action.UNCHANGED, i.status, i.last_error,
                               document_id, duration_s=time.perf_counter() - started)
    check_size(size, ctx.settings.max_document_mb)  # an attachment (a streamed fetch is capped as it arrives)
    extraction = (reuse(sha) if reuse else None) or extract_or_reuse(ctx.conn, sha, data, work.doc, ctx.settings)
    checkpoint("pipeline.after_extract")
    return Prepared(work, document_id, sha, extraction, started)


def chunk(ctx: RunContext, p: Prepared, embedder: Embedder) -> Prepared | DocumentOutcome:
    """Step 2: cut the Markdown into chunks within the token limit of every model they will be embedded with
    (``pipeline.generations.targets``: the smallest limit of the kept generations, counted with each one's
    tokenizer). Markdown without a chunk ends ``skipped`` (no text)."""
    if p.chunks is not None:
        return p
    try:
        embedder = gens.targets(ctx.conn, ctx.settings, embedder)
        chunks = chunk_for_embedder(p.extraction.markdown, embedder, chunk_size=ctx.settings.chunk_size,
                                    chunk_overlap=ctx.settings.chunk_overlap)
        if not chunks:
            raise NoTextError("no text extracted")
    except psycopg.Error:
        raise
    except Exception as exc:
        if not isinstance(exc, ExtractionError):
            log.exception("chunking failed on %s", p.work.doc.source_id)
        return fail(ctx, p.work, p.document_id, exc, sha=p.sha, started=p.started,
                    mime=p.extraction.mime_type, doc_type=p.extraction.doc_type)
    return replace(p, chunks=chunks)


def stored_version(ctx: RunContext, work: Work, started: float) -> Prepared:
    """The current version of a completed document as stored (chunk texts and Markdown), to re-embed: the
    chunks are cut again from the Markdown by ``chunk`` only when one exceeds the embedder's limit."""
    i = work.indexed
    assert i is not None
    row = ctx.conn.execute(
        """
        SELECT d.content_sha256, d.mime_type, d.doc_type, d.page_count, d.char_count, d.extraction_stats,
               d.source_version, COALESCE(m.markdown, '')
        FROM documents d LEFT JOIN document_markdown m ON m.document_id = d.id WHERE d.id = %s
        """, (i.id,)).fetchone()
    sha, mime, doc_type, pages, chars, stats, source_version, markdown = row
    rows = ctx.conn.execute(
        "SELECT ordinal, text, token_count, pages, heading_path, metadata FROM chunks "
        "WHERE document_id = %s AND version = %s ORDER BY ordinal", (i.id, i.version)).fetchall()
    chunks = [Chunk(text=r[1], ordinal=r[0], pages=tuple(r[3]), heading_path=tuple(r[4]), token_count=r[2],
                    metadata=dict(r[5] or {})) for r in rows]
    doc = work.doc.replace(source_version=source_version, mime_type=mime)
    extraction = Extraction(markdown, mime or "application/octet-stream", doc_type or "unknown", pages,
                            chars or len(markdown), dict(stats or {}))
    return Prepared(replace(work, doc=doc), i.id, sha, extraction, started, chunks=chunks, reembed=True)


def _fit(p: Prepared, embedder: Embedder, settings: Settings) -> tuple[list[Chunk], bool]:
    """The stored chunks of a re-embed, recounted with ``embedder``'s tokenizers, and whether they were cut
    again from the Markdown (one exceeds the smallest limit of the generations written: then every
    generation gets the new chunks, as a new version)."""
    assert p.chunks is not None
    counts = embedder.count_tokens([c.text for c in p.chunks])
    if p.extraction.markdown and any(n > embedder.max_tokens for n in counts):
        return chunk_for_embedder(p.extraction.markdown, embedder, chunk_size=settings.chunk_size,
                                  chunk_overlap=settings.chunk_overlap), True
    return [replace(c, token_count=n) for c, n in zip(p.chunks, counts, strict=True)], False


def _written_action(p: Prepared) -> Action:
    i = p.work.indexed
    if p.reembed:
        return Action.REEMBEDDED
    if p.work.decision == Decision.REPAIR:
        return Action.REPAIRED
    if i is None or i.status == "deleted" or not i.version:
        return Action.ADDED
    return Action.UPDATED


def embed_and_write(ctx: RunContext, batch: Sequence[Prepared], embedder: Embedder, *,
                    emit: Callable[..., None] | None = None) -> list[tuple[Prepared, DocumentOutcome]]:
    """Step 3 for a batch of chunked documents, for every kept embedding generation (``pipeline.generations``:
    ``embedder`` is the configured one or a ``WriteTargets``): per generation one embedding call for every
    distinct text its cache does not hold, then one swap transaction per document writing every generation
    (``store.write.replace_document``). A re-embed whose stored chunks fit every model only fills the
    generations its current version lacks (``store.write.add_generation_vectors``: no new version).

    Returns ``(prepared, outcome)`` per document in order. An embedding failure of the active generation is
    a transient failure of every document of the batch; another generation's failure leaves that generation
    out of this batch (its documents are filled by a later run), logged. A write that stored the wrong row
    count (rolled back) fails that document. ``emit("embedding", count=n)`` before each model call."""
    if not batch:
        return []
    try:
        targets = gens.targets(ctx.conn, ctx.settings, embedder)
    except EmbeddingError as exc:
        return [(p, fail(ctx, p.work, p.document_id, exc, sha=p.sha, started=p.started)) for p in batch]
    fill: dict[int, list[int]] = {}  # batch index -> generation ids to fill (re-embeds that keep their chunks)
    prepared: list[Prepared] = []
    for n, p in enumerate(batch):
        if p.reembed:
            chunks, rechunked = _fit(p, targets, ctx.settings)
            p = replace(p, chunks=chunks)
            have = set(p.work.indexed.generations if p.work.indexed else ())
            lacking = [g for g in targets.generation_ids if g not in have]
            if not rechunked and have and lacking:
                fill[n] = lacking
        prepared.append(p)
    vectors: dict[int, dict[str, np.ndarray]] = {}
    fresh: dict[int, set[str]] = {}
    for target in targets.targets:
        gid = target.generation.id
        texts = [c.text for n, p in enumerate(prepared) if n not in fill or gid in fill[n] for c in p.chunks or ()]
        if not texts:
            continue
        try:
            vectors[gid], missing = idx.vectors_for_texts(
                ctx.conn, target.generation, target.embedder, texts,
                before_embed=(lambda k: emit("embedding", count=k)) if emit else None)
            fresh[gid] = set(missing)
            checkpoint("pipeline.after_embed")
        except EmbeddingError as exc:
            if target is targets.active:
                return [(p, fail(ctx, p.work, p.document_id, exc, sha=p.sha, started=p.started,
                                 mime=p.extraction.mime_type, doc_type=p.extraction.doc_type)) for p in prepared]
            log.warning("embedding generation %s (%s) not written for this batch: %s", gid, target.generation.model, exc)
            targets.skipped[gid] = f"embedding generation {gid} ({target.generation.model}) not written: {exc}"
    out = []
    for n, p in enumerate(prepared):
        chunks = p.chunks or []
        embedded_here = 0
        for gid, done in fresh.items():
            if n not in fill or gid in fill[n]:
                mine = {c.text for c in chunks} & done
                embedded_here += len(mine)
                done -= mine
        x = p.extraction
        try:
            if n in fill:
                version = p.work.indexed.version
                written = [gid for gid in fill[n] if gid in vectors]
                for gid in written:
                    w.add_generation_vectors(ctx.conn, p.document_id, version, gid, {
                        w.chunk_id(p.document_id, version, c.ordinal): vectors[gid][c.text] for c in chunks})
                if not written:  # nothing to fill could be embedded: the document is as it was, say why
                    why = "; ".join(targets.skipped.get(gid, f"embedding generation {gid} not written")
                                    for gid in fill[n])
                    out.append((p, finish(ctx, DocumentOutcome(
                        p.work.doc.source_id, p.work.doc.title, Action.UNCHANGED, "completed", why, p.document_id,
                        version, len(chunks), duration_s=time.perf_counter() - p.started))))
                    continue
            else:
                rows = [w.ChunkRow(c.ordinal, c.text, c.token_count,
                                   {gid: v[c.text] for gid, v in vectors.items()}, c.pages, c.heading_path, c.metadata)
                        for c in chunks]
                version, _ = w.replace_document(
                    ctx.conn, p.document_id, doc=p.work.doc, content_sha256=p.sha, chunks=rows,
                    mime_type=x.mime_type, doc_type=x.doc_type, char_count=x.char_count, page_count=x.page_count,
                    stats=x.stats, markdown=x.markdown,
                    expires=w.expires_at(p.work.doc, x.doc_type, ctx.settings.expiry_days))
        except psycopg.OperationalError:
            raise  # the database went away: nothing more can be recorded in this run
        except Exception as exc:  # rolled back; the previous version stays searchable
            if not isinstance(exc, w.IncompleteWriteError):
                log.exception("writing %s failed", p.work.doc.source_id)
                exc = WriteFailed(f"write failed: {type(exc).__name__}: {exc}")
            out.append((p, fail(ctx, p.work, p.document_id, exc, sha=p.sha, started=p.started)))
            continue
        out.append((p, finish(ctx, DocumentOutcome(
            p.work.doc.source_id, p.work.doc.title, _written_action(p), "completed", None, p.document_id, version,
            len(chunks), x.char_count, x.page_count, targets.model_id, embedded_here,
            max(len(chunks) - embedded_here, 0), time.perf_counter() - p.started,
            preview=chunks[0].text[:PREVIEW_CHARS] if chunks else None, stats=dict(x.stats)))))
    return out


def attachments(ctx: RunContext, parent: Prepared) -> list[Work]:
    """Child documents (e-mail attachments) of a written parent, as work; children that are no longer
    attached are tombstoned, unchanged complete ones left alone. A re-embedded parent's children that lack
    a kept embedding generation are re-embedded too. Attachments of attachments are not followed.
    Ids: ``<parent id>#attachment/<n>/<file name>``."""
    if parent.work.parent_id is not None:
        return []
    rows = idx.children_of(ctx.conn, parent.document_id)
    if parent.reembed:
        kept = {g.id for g in kept_generations(ctx.conn)}
        return [Work(idx.document_from_index(c), c, Decision.REEMBED, parent_id=parent.document_id) for c in rows
                if c.status == "completed" and not kept <= set(c.generations)]
    base = parent.work.doc.source_id
    wanted: dict[str, Work] = {}
    for n, (filename, data) in enumerate(parent.extraction.children, start=1):
        sid = f"{base}#attachment/{n}/{filename}"
        doc = SourceDocument(source_id=sid, title=filename, uri=f"{parent.work.doc.uri}#attachment={n}",
                             metadata={"parent_source_id": base})
        wanted[sid] = Work(doc, None, Decision.ADD, parent_id=parent.document_id, data=data)
    w.mark_deleted(ctx.conn, [c.id for c in rows if c.source_id not in wanted and c.live])
    existing = {c.source_id: c for c in rows}
    return [work for sid, work in wanted.items()
            if not ((c := existing.get(sid)) is not None and c.content_sha256 == _sha256(work.data or b"")
                    and c.status == "completed")]


def process(ctx: RunContext, source: Source | None, work_items: Sequence[Work], embedder: Embedder, *,
            batch_documents: int | None = None, emit: Callable[..., None] | None = None) -> list[DocumentOutcome]:
    """The steps in memory for ``work_items``, ``batch_documents`` at a time (default
    ``settings.sync_batch_documents``): fetch and extract, chunk, one embedding call per batch, the swaps,
    then each written parent's attachments. Returns one outcome per document (attachments included).
    ``emit(event, **data)`` receives ``start`` (``source_id``, ``done``, ``total``), ``embedding``
    (``count``) and ``document`` (``outcome``)."""
    size = batch_documents or ctx.settings.sync_batch_documents
    try:
        embedder = gens.targets(ctx.conn, ctx.settings, embedder)  # once for the run: every kept generation
    except EmbeddingError:
        pass  # each document's chunk step fails with the reason
    queue = list(work_items)
    done, total, outcomes = 0, len(queue), []
    while queue:
        batch, queue = queue[:size], queue[size:]
        ready: list[Prepared] = []
        for work in batch:
            if emit:
                emit("start", source_id=work.doc.source_id, done=done, total=total)
            done += 1
            step = fetch_and_extract(ctx, source, work)
            if isinstance(step, Prepared):
                step = chunk(ctx, step, embedder)
            if isinstance(step, Prepared):
                ready.append(step)
            else:
                outcomes.append(step)
                if emit:
                    emit("document", outcome=step)
        for p, outcome in embed_and_write(ctx, ready, embedder, emit=emit):
            outcomes.append(outcome)
            if emit:
                emit("document", outcome=outcome)
            if outcome.status == "completed":
                children = attachments(ctx, p)
                queue.extend(children)
                total += len(children)
    return outcomes


def delete(ctx: RunContext, documents: Sequence[IndexedDocument], reason: str = "gone from the source") -> list[DocumentOutcome]:
    """Tombstone ``documents`` (chunks, Markdown and staged work removed; children with them) in one
    transaction and log each as ``deleted`` with ``reason``. The deletion guard is the caller's."""
    if not documents:
        return []
    checkpoint("pipeline.before_delete")
    ids = [i.id for i in documents]
    w.mark_deleted(ctx.conn, ids)
    ctx.conn.execute("DELETE FROM document_stage WHERE document_id = ANY(%s)", (ids,))
    return [finish(ctx, DocumentOutcome(i.source_id, i.title, Action.DELETED, "deleted", reason, i.id))
            for i in documents]


def notify_permanent(notifier: Notifier | None, source: str, outcomes: Sequence[DocumentOutcome], *,
                     max_failures: int) -> None:
    """One alert for the documents of ``outcomes`` that became ``permanently_failed`` in this run."""
    docs = [{"source_id": o.source_id, "reason": o.reason} for o in outcomes if o.became_permanent]
    if docs and notifier is not None:
        notifier.notify("permanently_failed", f"{source}: {len(docs)} document(s) became permanently_failed "
                        f"(a content error, or {max_failures} failed attempts)",
                        {"source": source, "documents": docs, "max_failures": max_failures})
