"""One sync of one source: listing or change feed -> diff -> guard -> per-document work -> cursor.

``sync_source`` is the single code path behind the CLI, the Dagster job and the sensors. It keeps
the invariant of ``../shared/notes/DESIGN.md``: for every document present in the source the index
holds exactly the chunks of its current version; a document that left the source has none (after
the deletion guard agrees); every status tells the truth.

Order of work: documents to add or update first (so a moved file can reuse the vectors of its old
path), then deletions, then the cursor. Extraction, chunking and embedding happen outside any
transaction; each document's write is one transaction (``store.write.replace_document``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

import psycopg

from rag_pipeline.chunking import Chunk, chunk_for_embedder
from rag_pipeline.config import Settings
from rag_pipeline.embedding.base import Embedder, EmbeddingError
from rag_pipeline.extraction.types import Extraction, ExtractionError, NoTextError
from rag_pipeline.faults import checkpoint
from rag_pipeline.sources.base import (
    ChangeFeedUnavailable,
    DocumentSkipped,
    Source,
    SourceDocument,
    SourceError,
)
from rag_pipeline.store import index as idx_store
from rag_pipeline.store import write as w
from rag_pipeline.store.db import Store
from rag_pipeline.store.index import IndexedDocument, document_from_index

log = logging.getLogger(__name__)

EXIT_OK, EXIT_DOCUMENT_FAILURES, EXIT_GUARD, EXIT_LOCKED = 0, 1, 2, 3


class Notifier(Protocol):
    """Receives alerts: documents that became ``permanently_failed``, a tripped deletion guard."""

    def notify(self, event: str, message: str, details: dict[str, Any]) -> None:
        """Send one alert; ``event`` is ``permanently_failed`` or ``deletion_guard``."""
        ...


@dataclass
class DocumentOutcome:
    """What one sync did to one document. ``action``: added | updated | repaired | metadata-updated |
    skipped-unchanged | failed | deleted. ``status``: the document's status afterwards. ``embedded``:
    chunk texts this document sent to the model; ``reused``: chunk vectors taken from the cache."""

    source_id: str
    title: str | None
    action: str
    status: str
    reason: str | None = None
    chunk_count: int = 0
    char_count: int | None = None
    page_count: int | None = None
    embedded: int = 0
    reused: int = 0
    duration_s: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def chars_per_page(self) -> float | None:
        """Characters per page, when the format has pages."""
        if self.char_count is None or not self.page_count:
            return None
        return self.char_count / self.page_count


@dataclass(frozen=True)
class GuardResult:
    """The deletion guard's verdict: ``passed``; ``reason`` when not; the numbers it judged."""

    passed: bool
    reason: str | None
    complete: bool
    listed: int
    indexed: int
    to_delete: int
    max_fraction: float


@dataclass
class SyncReport:
    """The outcome of ``sync_source``: per-document ``documents`` (deletions included), ``deleted``
    source ids, the ``guard``, ``lock`` (acquired | waited | skipped), ``mode`` (full | changes)."""

    source: str
    run_id: int | None
    mode: str
    lock: str
    guard: GuardResult
    documents: list[DocumentOutcome] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    listing_error: str | None = None
    embedded: int = 0
    duration_s: float = 0.0
    held_back: list[str] = field(default_factory=list)
    """Source ids the deletion guard kept from being deleted (empty when it passed)."""

    @property
    def failed(self) -> list[DocumentOutcome]:
        """Documents attempted in this run that did not complete (``action == "failed"``). Documents
        left alone because they already failed permanently on the same content are not counted again:
        they were reported (and alerted) when they failed; ``rag-pipeline status`` lists them."""
        return [d for d in self.documents if d.action == "failed"]

    @property
    def ok(self) -> bool:
        """Every document ended well, the listing was complete and the guard passed."""
        return self.lock != "skipped" and self.guard.passed and not self.listing_error and not self.failed

    @property
    def exit_code(self) -> int:
        """0 all well; 1 some documents failed; 2 listing incomplete or deletion guard tripped;
        3 another sync of this source held the lock."""
        if self.lock == "skipped":
            return EXIT_LOCKED
        if not self.guard.passed or self.listing_error:
            return EXIT_GUARD
        return EXIT_DOCUMENT_FAILURES if self.failed else EXIT_OK

    def counts(self) -> dict[str, int]:
        """Outcomes counted by action."""
        out: dict[str, int] = {}
        for d in self.documents:
            out[d.action] = out.get(d.action, 0) + 1
        return out


@dataclass
class _Work:
    doc: SourceDocument
    indexed: IndexedDocument | None
    why: str  # add | change | retry | repair | pending | check
    parent_id: int | None = None
    data: bytes | None = None


@dataclass
class _Prepared:
    work: _Work
    document_id: int
    sha: str
    extraction: Extraction
    chunks: list[Chunk]
    started: float


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _metadata_differs(doc: SourceDocument, i: IndexedDocument) -> bool:
    return (doc.title != i.title or doc.uri != i.uri or dict(doc.metadata) != dict(i.metadata or {})
            or (doc.source_version is not None and doc.source_version != i.source_version))


def plan_document(doc: SourceDocument, i: IndexedDocument | None, settings: Settings) -> str:
    """Decide what one listed document needs: ``add`` | ``change`` | ``retry`` | ``repair`` | ``pending`` |
    ``check`` (fetch and compare hashes) | ``metadata`` | ``unchanged`` | ``skip``. Pure function."""
    if i is None or i.status == "deleted":
        return "add"
    if doc.content_sha256:
        changed = doc.content_sha256 != (i.seen_sha256 or i.content_sha256)
    elif doc.source_version is not None:
        changed = doc.source_version != (i.seen_source_version or i.source_version)
    else:
        changed = None  # must fetch to know
    if doc.skip_reason:
        return "unchanged" if i.status == "permanently_failed" and i.last_error == doc.skip_reason else "skip"
    if i.status == "completed":
        if changed:
            return "change"
        if changed is None:
            return "check"
        if not i.complete:
            return "repair"
        return "metadata" if _metadata_differs(doc, i) else "unchanged"
    if i.status == "pending":
        return "pending"
    if changed:
        return "change"
    if i.status == "failed" and i.failure_count < settings.max_failures:
        wait = settings.retry_backoff_s * (2 ** max(i.failure_count - 1, 0))
        return "retry" if _now() - i.updated_at >= timedelta(seconds=wait) else "unchanged"
    if changed is None and i.status == "permanently_failed":
        return "check"
    return "unchanged"


def evaluate_guard(*, complete: bool, incomplete_reason: str | None, full_listing: bool, listed: int,
                   indexed: int, to_delete: int, max_fraction: float, allow_mass_delete: bool) -> GuardResult:
    """The deletion guard (pure): deletions only from a complete listing that is not empty while the
    index holds documents, and that removes at most ``max_fraction`` of the indexed documents (unless
    ``allow_mass_delete``). ``indexed`` counts the source's non-deleted documents."""
    def result(passed: bool, reason: str | None) -> GuardResult:
        return GuardResult(passed, reason, complete, listed, indexed, to_delete, max_fraction)

    if not complete:
        return result(False, f"listing incomplete ({incomplete_reason or 'unknown reason'}): nothing deleted")
    if full_listing and listed == 0 and indexed > 0:
        return result(False, f"empty listing while the index holds {indexed} documents of this source: nothing deleted")
    if to_delete and indexed and to_delete / indexed > max_fraction and not allow_mass_delete:
        return result(False, (f"would delete {to_delete} of {indexed} documents ({to_delete / indexed:.0%}), "
                              f"more than the allowed {max_fraction:.0%}: nothing deleted"))
    return result(True, None)


def extract_or_reuse(conn: psycopg.Connection, content_sha256: str, data: bytes, doc: SourceDocument,
                     settings: Settings) -> Extraction:
    """The document's ``Extraction``: the Markdown already stored for a completed document with the same
    content hash (stats marked ``reused_extraction``), else ``extraction.extract`` on ``data`` with the
    source's file name (``metadata["filename"]``, else the title, else the id). Raises ``ExtractionError``."""
    stored = idx_store.stored_extraction(conn, content_sha256)
    if stored is not None:
        return Extraction(stored.markdown, stored.mime_type, stored.doc_type, stored.page_count,
                          stored.char_count, {**stored.stats, "reused_extraction": True})
    from rag_pipeline.extraction import extract

    filename = str(doc.metadata.get("filename") or doc.title or doc.source_id)
    return extract(data, filename=filename, declared_mime=doc.mime_type, settings=settings)


def _lock_key(source: str) -> int:
    return int.from_bytes(hashlib.sha256(f"rag_pipeline:{source}".encode()).digest()[:8], "big", signed=True)


class _Run:
    """State of one sync run (internal)."""

    def __init__(self, source: Source, store: Store, embedder: Embedder, settings: Settings,
                 conn: psycopg.Connection, run_id: int, notifier: Notifier | None,
                 progress: Callable[[str, dict[str, Any]], None] | None) -> None:
        self.source, self.store, self.embedder, self.settings = source, store, embedder, settings
        self.conn, self.run_id, self.notifier, self.progress = conn, run_id, notifier, progress
        self.outcomes: list[DocumentOutcome] = []
        self.embedded = 0
        self.newly_permanent: list[DocumentOutcome] = []

    def emit(self, event: str, **data: Any) -> None:
        if self.progress:
            self.progress(event, data)

    # -- outcomes -------------------------------------------------------------------------------
    def finish(self, outcome: DocumentOutcome, document_id: int | None, version: int | None = None) -> None:
        self.outcomes.append(outcome)
        w.log_ingest(self.conn, run_id=self.run_id, document_id=document_id, source=self.source.name,
                     source_id=outcome.source_id, action=outcome.action, status=outcome.status,
                     reason=outcome.reason, version=version, char_count=outcome.char_count,
                     chunk_count=outcome.chunk_count, embedded_count=outcome.embedded,
                     duration_ms=int(outcome.duration_s * 1000))
        self.emit("document", outcome=outcome)

    def fail(self, work: _Work, document_id: int, reason: str, *, terminal: bool, sha: str | None,
             started: float, mime: str | None = None, doc_type: str | None = None) -> None:
        previous = work.indexed.status if work.indexed else None
        # When the bytes were never read (the fetch failed), the listing's hash is what was seen: without
        # it the next plan would take the document for changed, ignoring the backoff and, for a
        # permanently_failed one, fetching (and alerting) again on every sync.
        seen = sha if sha is not None else work.doc.content_sha256
        status, count = w.record_failure(
            self.conn, document_id, reason=reason, terminal=terminal, max_failures=self.settings.max_failures,
            seen_sha256=seen, seen_source_version=work.doc.source_version, mime_type=mime, doc_type=doc_type)
        outcome = DocumentOutcome(work.doc.source_id, work.doc.title, "failed", status, reason,
                                  duration_s=time.perf_counter() - started)
        if status == "permanently_failed" and (previous != "permanently_failed" or terminal is False):
            self.newly_permanent.append(outcome)
        self.finish(outcome, document_id)

    # -- per-document work ----------------------------------------------------------------------
    def prepare(self, work: _Work) -> _Prepared | None:
        """Fetch, hash, extract and chunk one document; record its failure and return None on error."""
        started = time.perf_counter()
        conn = self.conn
        document_id = (work.indexed.id if work.indexed else
                       w.ensure_document(conn, self.source.name, work.doc, parent_id=work.parent_id))
        if work.indexed and work.indexed.status == "deleted":
            conn.execute("UPDATE documents SET status = 'pending', deleted_at = NULL, failure_count = 0, "
                         "updated_at = now() WHERE id = %s", (document_id,))
        sha = None
        try:
            if work.doc.skip_reason:
                raise DocumentSkipped(work.doc.skip_reason)
            data = work.data if work.data is not None else self.source.fetch(work.doc)
            checkpoint("sync.after_fetch")
            sha = _sha256(data)
            i = work.indexed
            if i is not None and sha == i.content_sha256 and i.status == "completed" and i.complete:
                w.update_metadata(conn, document_id, work.doc, expires=w.expires_at(
                    work.doc, None, self.settings.expiry_days))
                conn.execute("UPDATE documents SET seen_sha256 = %s WHERE id = %s", (sha, document_id))
                self.finish(DocumentOutcome(work.doc.source_id, work.doc.title, "metadata-updated", "completed",
                                            chunk_count=i.stored_chunks,
                                            duration_s=time.perf_counter() - started), document_id)
                return None
            if i is not None and i.status == "permanently_failed" and sha == i.seen_sha256 and work.why == "check":
                self.finish(DocumentOutcome(work.doc.source_id, work.doc.title, "skipped-unchanged",
                                            i.status, i.last_error), document_id)
                return None
            extraction = extract_or_reuse(conn, sha, data, work.doc, self.settings)
            checkpoint("sync.after_extract")
            chunks = chunk_for_embedder(extraction.markdown, self.embedder, chunk_size=self.settings.chunk_size,
                                        chunk_overlap=self.settings.chunk_overlap)
            if not chunks:
                raise NoTextError("no text extracted")
            return _Prepared(work, document_id, sha, extraction, chunks, started)
        except DocumentSkipped as exc:
            self.fail(work, document_id, exc.reason, terminal=True, sha=sha, started=started)
        except ExtractionError as exc:
            self.fail(work, document_id, exc.reason, terminal=exc.terminal, sha=sha, started=started)
        except SourceError as exc:
            self.fail(work, document_id, str(exc), terminal=not exc.transient, sha=sha, started=started)
        except psycopg.Error:
            raise
        except Exception as exc:  # one bad document never stops the others
            log.exception("unexpected error on %s", work.doc.source_id)
            self.fail(work, document_id, f"{type(exc).__name__}: {exc}", terminal=False, sha=sha, started=started)
        return None

    def embed_and_write(self, batch: Sequence[_Prepared]) -> list[tuple[_Prepared, int]]:
        """Embed the batch's chunk texts (cache first, each distinct text once) and write each document."""
        if not batch:
            return []
        model = self.embedder.model_id
        try:
            vectors, missing = idx_store.vectors_for_texts(
                self.conn, self.embedder, [c.text for p in batch for c in p.chunks],
                before_embed=lambda n: self.emit("embedding", count=n))
            self.embedded += len(missing)
            checkpoint("sync.after_embed")
        except EmbeddingError as exc:
            for p in batch:
                self.fail(p.work, p.document_id, str(exc), terminal=False, sha=p.sha, started=p.started,
                          mime=p.extraction.mime_type, doc_type=p.extraction.doc_type)
            return []
        fresh_set = set(missing)
        written = []
        for p in batch:
            rows = [w.ChunkRow(c.ordinal, c.text, c.token_count, vectors[c.text], c.pages,
                               c.heading_path, c.metadata) for c in p.chunks]
            embedded_here = {c.text for c in p.chunks if c.text in fresh_set}
            fresh_set -= embedded_here
            try:
                version = w.replace_document(
                    self.conn, p.document_id, doc=p.work.doc, content_sha256=p.sha, chunks=rows,
                    embedding_model=model, mime_type=p.extraction.mime_type, doc_type=p.extraction.doc_type,
                    char_count=p.extraction.char_count, page_count=p.extraction.page_count,
                    stats=p.extraction.stats, markdown=p.extraction.markdown,
                    expires=w.expires_at(p.work.doc, p.extraction.doc_type, self.settings.expiry_days))
            except w.IncompleteWriteError as exc:
                self.fail(p.work, p.document_id, str(exc), terminal=False, sha=p.sha, started=p.started)
                continue
            except psycopg.OperationalError:
                raise  # the database went away: nothing more can be recorded in this run
            except Exception as exc:  # rolled back; the previous version stays searchable
                log.exception("writing %s failed", p.work.doc.source_id)
                self.fail(p.work, p.document_id, f"write failed: {type(exc).__name__}: {exc}", terminal=False,
                          sha=p.sha, started=p.started)
                continue
            action = {"add": "added", "repair": "repaired"}.get(p.work.why, "updated")
            if p.work.indexed is None or p.work.indexed.status == "deleted" or not p.work.indexed.version:
                action = "added" if p.work.why != "repair" else action
            self.finish(DocumentOutcome(
                p.work.doc.source_id, p.work.doc.title, action, "completed", None, len(rows),
                p.extraction.char_count, p.extraction.page_count, embedded=len(embedded_here),
                reused=len(rows) - len(embedded_here), duration_s=time.perf_counter() - p.started,
                stats=p.extraction.stats), p.document_id, version)
            written.append((p, version))
        return written

    def children_work(self, parent: _Prepared) -> list[_Work]:
        """Child documents (e-mail attachments) of a written parent; stale children are tombstoned."""
        children = list(parent.extraction.children)
        base = parent.work.doc.source_id
        wanted: dict[str, _Work] = {}
        for n, (filename, data) in enumerate(children, start=1):
            sid = f"{base}#attachment/{n}/{filename}"
            doc = SourceDocument(source_id=sid, title=filename, uri=f"{parent.work.doc.uri}#attachment={n}",
                                 metadata={"parent_source_id": base})
            wanted[sid] = _Work(doc, None, "add", parent_id=parent.document_id, data=data)
        rows = self.conn.execute(
            "SELECT id, source_id, content_sha256, status FROM documents WHERE parent_id = %s",
            (parent.document_id,)).fetchall()
        stale = [r[0] for r in rows if r[1] not in wanted and r[3] != "deleted"]
        w.mark_deleted(self.conn, stale)
        existing = {r[1]: r for r in rows}
        out = []
        for sid, work in wanted.items():
            row = existing.get(sid)
            if row is not None and row[2] == _sha256(work.data or b"") and row[3] == "completed":
                continue
            out.append(work)
        return out

    def process(self, work_items: list[_Work]) -> None:
        """Prepare, embed and write ``work_items`` in batches of ``sync_batch_documents``."""
        queue = list(work_items)
        total = len(queue)
        done = 0
        while queue:
            batch_work = queue[: self.settings.sync_batch_documents]
            del queue[: self.settings.sync_batch_documents]
            prepared = []
            for work in batch_work:
                self.emit("start", source_id=work.doc.source_id, done=done, total=total)
                p = self.prepare(work)
                if p is not None:
                    prepared.append(p)
                done += 1
            for p, _version in self.embed_and_write(prepared):
                if p.work.parent_id is None:  # attachments of attachments are not followed
                    extra = self.children_work(p)
                    queue.extend(extra)
                    total += len(extra)


def sync_source(
    source: Source,
    store: Store,
    embedder: Embedder,
    settings: Settings,
    *,
    full: bool = False,
    allow_mass_delete: bool = False,
    wait_for_lock: bool = True,
    notifier: Notifier | None = None,
    progress: Callable[[str, dict[str, Any]], None] | None = None,
) -> SyncReport:
    """Sync ``source`` into the index and return a ``SyncReport``.

    ``full``: ignore the stored cursor and do a full listing + reconciliation. ``allow_mass_delete``:
    the explicit, logged override of the fraction guard (never of an incomplete or empty listing).
    ``wait_for_lock``: when another sync of the same source runs, wait for it (``lock="waited"``) or
    return at once (``lock="skipped"``, exit code 3). ``progress(event, data)`` receives ``start``,
    ``document``, ``embedding`` events. Raises only for database errors; every document-level error
    ends in the document's state.
    """
    started = time.perf_counter()
    conn = store.connect()
    try:
        key = _lock_key(source.name)
        lock = "acquired"
        if not conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
            if not wait_for_lock:
                log.warning("another sync of %s is running: skipped", source.name)
                guard = GuardResult(True, None, True, 0, 0, 0, settings.deletion_max_fraction)
                return SyncReport(source.name, None, "none", "skipped", guard,
                                  duration_s=time.perf_counter() - started)
            log.warning("another sync of %s is running: waiting for it", source.name)
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
            lock = "waited"
        try:
            return _sync_locked(source, store, embedder, settings, conn, full=full, lock=lock,
                                allow_mass_delete=allow_mass_delete, notifier=notifier, progress=progress,
                                started=started)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
    finally:
        conn.close()


def _sync_locked(source: Source, store: Store, embedder: Embedder, settings: Settings, conn: psycopg.Connection,
                 *, full: bool, lock: str, allow_mass_delete: bool, notifier: Notifier | None,
                 progress: Callable[[str, dict[str, Any]], None] | None, started: float) -> SyncReport:
    cursor = None if full else idx_store.get_cursor(conn, source.name)
    mode = "full"
    changes = None
    listing_error = None
    if cursor is not None:
        try:
            changes = source.changes(cursor)
            mode = "changes"
        except ChangeFeedUnavailable as exc:
            log.info("%s: %s; doing a full listing", source.name, exc)
        except SourceError as exc:
            listing_error = f"change feed failed: {exc}"
    run_id = idx_store.start_run(conn, source.name, mode)
    run = _Run(source, store, embedder, settings, conn, run_id, notifier, progress)
    checkpoint("sync.after_start")

    inventory = None
    if mode == "full" and listing_error is None:
        try:
            inventory = source.list_documents()
        except SourceError as exc:
            listing_error = f"listing failed: {exc}"
    checkpoint("sync.after_listing")

    state = idx_store.load_index_state(conn, source.name)
    live = {sid: i for sid, i in state.items() if i.status != "deleted"}
    work: list[_Work] = []
    seen: set[str] = set()

    def consider(doc: SourceDocument) -> None:
        if doc.source_id in seen:
            return
        seen.add(doc.source_id)
        i = state.get(doc.source_id)
        decision = plan_document(doc, i, settings)
        if decision == "unchanged":
            run.outcomes.append(DocumentOutcome(doc.source_id, doc.title, "skipped-unchanged", i.status,
                                                i.last_error if i.status != "completed" else None,
                                                chunk_count=i.stored_chunks))
        elif decision == "metadata":
            w.update_metadata(conn, i.id, doc, expires=w.expires_at(doc, None, settings.expiry_days))
            run.finish(DocumentOutcome(doc.source_id, doc.title, "metadata-updated", i.status,
                                       chunk_count=i.stored_chunks), i.id)
        else:
            work.append(_Work(doc, i, decision))

    listed_docs: list[SourceDocument] = []
    complete = listing_error is None
    incomplete_reason = listing_error
    to_delete: list[IndexedDocument] = []
    if inventory is not None:
        listed_docs = list(inventory.documents)
        complete = inventory.complete
        incomplete_reason = inventory.incomplete_reason
        listed_ids = {d.source_id for d in listed_docs}
        to_delete = [i for sid, i in live.items() if sid not in listed_ids]
    elif changes is not None:
        listed_docs = list(changes.upserts)
        complete = changes.complete
        incomplete_reason = changes.incomplete_reason
        gone = set(changes.deleted_ids) - {d.source_id for d in listed_docs}
        to_delete = [live[sid] for sid in gone if sid in live]

    for doc in listed_docs:
        consider(doc)
    if mode == "changes":
        # The feed only names what changed: retries, interrupted and incomplete documents come from the index.
        deleting = {d.source_id for d in to_delete}
        for sid, i in live.items():
            if sid in seen or sid in deleting:
                continue
            if i.needs_work(settings.max_failures):
                doc = document_from_index(i)
                why = "repair" if i.status == "completed" else "retry"
                if why == "retry" and plan_document(doc.replace(content_sha256=i.seen_sha256), i, settings) != "retry":
                    continue
                seen.add(sid)
                work.append(_Work(doc, i, why))

    guard = evaluate_guard(complete=complete, incomplete_reason=incomplete_reason, full_listing=mode == "full",
                           listed=len(listed_docs), indexed=len(live), to_delete=len(to_delete),
                           max_fraction=settings.deletion_max_fraction, allow_mass_delete=allow_mass_delete)
    if listing_error and not listed_docs:
        guard = GuardResult(False, listing_error + ": nothing deleted", False, 0, len(live), len(to_delete),
                            settings.deletion_max_fraction)
    if allow_mass_delete and guard.passed and to_delete:
        log.warning("%s: mass-delete override in force: deleting %d of %d documents",
                    source.name, len(to_delete), len(live))

    run.emit("plan", work=len(work), delete=len(to_delete), listed=len(listed_docs))
    run.process(work)

    deleted_ids: list[str] = []
    if to_delete and guard.passed:
        checkpoint("sync.before_delete")
        w.mark_deleted(conn, [i.id for i in to_delete])
        for i in to_delete:
            deleted_ids.append(i.source_id)
            run.finish(DocumentOutcome(i.source_id, i.title, "deleted", "deleted", "gone from the source"), i.id)
    elif to_delete:
        log.error("%s: deletion guard: %s", source.name, guard.reason)
    if not guard.passed and notifier is not None:
        notifier.notify("deletion_guard", f"{source.name}: deletion guard tripped: {guard.reason}",
                        {"source": source.name, "listed": guard.listed, "indexed": guard.indexed,
                         "to_delete": guard.to_delete})

    checkpoint("sync.before_cursor")
    next_cursor = None
    if changes is not None and changes.complete:
        next_cursor = changes.next_cursor
    elif inventory is not None and inventory.complete and inventory.cursor:
        next_cursor = inventory.cursor
    if next_cursor and to_delete and not guard.passed:
        # Deletions held back by the guard must be seen again by the next run (and by the override):
        # advancing the cursor past them would lose them until a full reconciliation.
        log.warning("%s: cursor not advanced: %d deletion(s) held back by the guard", source.name, len(to_delete))
        next_cursor = None
    if next_cursor:
        idx_store.save_cursor(conn, source.name, next_cursor)

    if run.newly_permanent and notifier is not None:
        notifier.notify(
            "permanently_failed",
            f"{source.name}: {len(run.newly_permanent)} document(s) became permanently_failed",
            {"source": source.name, "documents": [{"source_id": o.source_id, "reason": o.reason}
                                                  for o in run.newly_permanent]})

    report = SyncReport(source.name, run_id, mode, lock, guard, run.outcomes, deleted_ids, listing_error,
                        run.embedded, time.perf_counter() - started,
                        held_back=[] if guard.passed else sorted(i.source_id for i in to_delete))
    status = {EXIT_OK: "succeeded", EXIT_DOCUMENT_FAILURES: "documents_failed", EXIT_GUARD: "guard_tripped"}[
        report.exit_code]
    idx_store.finish_run(conn, run_id, status=status, mode=mode, listed=len(listed_docs), guard_passed=guard.passed,
                         guard_reason=guard.reason, counts={**report.counts(), "embedded": run.embedded})
    return report
