"""One sync of one source: listing or change feed -> plan -> per-document steps -> guarded deletions -> cursor.

``sync_source`` is what ``rag-pipeline sync`` and the daily Dagster reconciliation call; the Dagster
per-document assets run the same steps (``pipeline.steps``) one partition at a time. It keeps the
invariant of ``docs/design.md``: for every document present in the source the index holds exactly the
chunks of its current version; a document that left the source has none (once the deletion guard
agrees); every status tells the truth.

Order of work: documents to add or update first (so a moved file can reuse the vectors of its old path),
then deletions (or, when the guard holds them back, hiding them: ``permissions.visibility``), then the
cursor (saved only after the work it covers has committed), then the permission sync
(``permissions.sync``: who may read each document, from the source's own permission data). The whole run holds
the source's lock exclusively (``pipeline.locks``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from rag_pipeline.config import Settings
from rag_pipeline.embedding.base import Embedder
from rag_pipeline.faults import checkpoint
from rag_pipeline.permissions.sync import PermissionReport, sync_permissions
from rag_pipeline.permissions.visibility import apply_guard_visibility
from rag_pipeline.pipeline import steps
from rag_pipeline.pipeline.inventory import (
    VERIFY_MODE,
    cursor_after,
    list_and_diff,
    verification_due,
)
from rag_pipeline.pipeline.locks import document_locks, source_lock
from rag_pipeline.pipeline.outcome import Action, DocumentOutcome
from rag_pipeline.pipeline.plan import GuardResult
from rag_pipeline.pipeline.steps import Notifier, RunContext, Work
from rag_pipeline.sources.base import Source
from rag_pipeline.store import generations as gens
from rag_pipeline.store import index as idx
from rag_pipeline.store.db import Store

log = logging.getLogger(__name__)

EXIT_OK, EXIT_DOCUMENT_FAILURES, EXIT_GUARD, EXIT_LOCKED = 0, 1, 2, 3


@dataclass
class SyncReport:
    """The outcome of ``sync_source``: per-document ``documents`` (every listed one, unchanged ones with
    action ``skipped-unchanged``, and deletions), ``deleted`` source ids, the ``guard``, ``lock`` (acquired |
    waited | skipped), ``mode`` (full | full+verify | changes | none), ``held_back`` (ids the guard kept),
    ``hidden`` (of those, how many queries no longer see: ``permissions.visibility``), ``permissions`` (the
    permission sync that followed the content: ``permissions.sync.PermissionReport``)."""

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
    listed: int = 0
    hidden: int = 0
    permissions: PermissionReport | None = None

    @property
    def failed(self) -> list[DocumentOutcome]:
        """Documents attempted in this run that failed (``action == failed``). Documents left alone because
        they already failed permanently on the same content are not counted again; skipped documents (no
        content) are not failures."""
        return [d for d in self.documents if d.action == Action.FAILED]

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
            out[d.action.value] = out.get(d.action.value, 0) + 1
        return out


def sync_source(
    source: Source,
    store: Store,
    embedder: Embedder,
    settings: Settings,
    *,
    full: bool = False,
    allow_mass_delete: bool = False,
    confirm_delete: int | None = None,
    wait_for_lock: bool = True,
    notifier: Notifier | None = None,
    progress: Callable[[str, dict[str, Any]], None] | None = None,
) -> SyncReport:
    """Sync ``source`` into the index and return a ``SyncReport``.

    ``full``: ignore the stored cursor: full listing and reconciliation. ``allow_mass_delete``: lift the
    guard's fraction; ``confirm_delete``: the exact number of deletions the operator expects (lifts the
    fraction and the empty-listing rule when it matches); both logged, neither overrides an incomplete
    listing. ``wait_for_lock``: wait for a concurrent sync or partition run of the source (``lock="waited"``)
    or return at once (``lock="skipped"``, exit code 3). ``progress(event, data)`` receives ``plan``,
    ``start``, ``document`` and ``embedding`` events. Raises only for database errors; every
    document-level error ends in the document's state.
    """
    started = time.perf_counter()
    with store.connection() as conn, source_lock(conn, source.name, wait=wait_for_lock) as lock:
        if lock is None:
            log.warning("another sync of %s is running: skipped", source.name)
            guard = GuardResult(True, None, True, 0, 0, 0, settings.deletion_max_fraction)
            return SyncReport(source.name, None, "none", "skipped", guard, duration_s=time.perf_counter() - started)
        return _sync_locked(source, conn, embedder, settings, lock=lock, full=full, started=started,
                            allow_mass_delete=allow_mass_delete, confirm_delete=confirm_delete, notifier=notifier,
                            progress=progress)


def _sync_locked(source: Source, conn: psycopg.Connection, embedder: Embedder, settings: Settings, *, lock: str,
                 full: bool, started: float, allow_mass_delete: bool, confirm_delete: int | None,
                 notifier: Notifier | None, progress: Callable[[str, dict[str, Any]], None] | None) -> SyncReport:
    def emit(event: str, **data: Any) -> None:
        if progress:
            progress(event, data)

    cursor = None if full else idx.get_cursor(conn, source.name)
    verify = cursor is None and verification_due(conn, source, settings)
    run_id = idx.start_run(conn, source.name, VERIFY_MODE if verify else "full")
    ctx = RunContext(conn, source.name, settings, f"sync:{run_id}")
    for dropped in gens.drop_expired(conn):
        log.info("embedding generation %s (%s) dropped: kept past its rollback window", dropped.id, dropped.model)
    gens.ensure_for(conn, embedder, settings)  # a newly configured model: its generation builds beside the active one
    checkpoint("sync.after_start")
    diff = list_and_diff(source, conn, settings, cursor=cursor, verify=verify,
                         allow_mass_delete=allow_mass_delete, confirm_delete=confirm_delete)
    mode = VERIFY_MODE if verify and diff.mode == "full" else diff.mode
    checkpoint("sync.after_listing")
    guard = diff.guard
    if (allow_mass_delete or confirm_delete is not None) and guard.passed and diff.vanished:
        log.warning("%s: deletion override in force: deleting %d of %d documents", source.name,
                    len(diff.vanished), diff.indexed)

    emit("plan", work=len(diff.work), delete=len(diff.vanished), listed=diff.listed)
    work = [Work(p.doc, p.indexed, p.decision) for p in diff.work]
    outcomes: list[DocumentOutcome] = []
    size = settings.sync_batch_documents
    for start in range(0, len(work), size):
        batch = work[start:start + size]
        with document_locks(conn, source.name, [w.doc.source_id for w in batch]):
            outcomes += steps.process(ctx, source, batch, embedder, emit=emit)

    deleted: list[DocumentOutcome] = []
    if diff.vanished and guard.passed:
        with document_locks(conn, source.name, [i.source_id for i in diff.vanished]):
            deleted = steps.delete(ctx, diff.vanished)
        for o in deleted:
            emit("document", outcome=o)
    elif diff.vanished or not guard.passed:
        log.error("%s: deletion guard: %s", source.name, guard.reason)
    if not guard.passed and notifier is not None:
        notifier.notify("deletion_guard", f"{source.name}: deletion guard tripped: {guard.reason}",
                        {"source": source.name, "listed": guard.listed, "indexed": guard.indexed,
                         "to_delete": guard.to_delete})

    hidden, _ = apply_guard_visibility(conn, source, diff)
    checkpoint("sync.before_cursor")
    next_cursor = cursor_after(diff, None)
    if diff.next_cursor and next_cursor is None:
        log.warning("%s: cursor not advanced: %d deletion(s) held back by the guard", source.name, len(diff.vanished))
    if next_cursor:
        idx.save_cursor(conn, source.name, next_cursor)
    steps.notify_permanent(notifier, source.name, outcomes, max_failures=settings.max_failures)
    permissions = sync_permissions(source, conn, settings)
    activated = gens.activate_if_complete(conn, embedder.model_id, keep_days=settings.generation_keep_days)
    if activated is not None:
        log.info("embedding generation %s (%s) is complete and now active", activated.id, activated.model)

    idle = [DocumentOutcome(p.doc.source_id, p.doc.title, Action.UNCHANGED, p.indexed.status,
                            p.indexed.last_error if p.indexed.status != "completed" else None, p.indexed.id,
                            p.indexed.version, chunk_count=p.indexed.stored_chunks) for p in diff.idle if p.indexed]
    report = SyncReport(source.name, run_id, mode, lock, guard, idle + outcomes + deleted, [o.source_id for o in deleted],
                        diff.listing_error, sum(o.embedded for o in outcomes), time.perf_counter() - started,
                        held_back=[] if guard.passed else sorted(i.source_id for i in diff.vanished),
                        listed=diff.listed, hidden=hidden, permissions=permissions)
    status = {EXIT_OK: "succeeded", EXIT_DOCUMENT_FAILURES: "documents_failed", EXIT_GUARD: "guard_tripped"}[
        report.exit_code]
    idx.finish_run(conn, run_id, status=status, mode=mode, listed=diff.listed, guard_passed=guard.passed,
                   guard_reason=guard.reason, counts={**report.counts(), "embedded": report.embedded,
                                                                "held_back": report.held_back[:100], "hidden": hidden,
                                                                "permissions": permissions.summary(),
                                                                **({"activated_generation": activated.id} if activated else {})})
    return report
