"""A source's listing (or change feed) diffed against the index: what to ingest, what to delete, the guard.

Plain Python behind the Dagster ``source_inventory`` asset and ``source_diff_sensor``. The ``documents``
table is the truth: every listed document is planned with ``sync.plan_document`` against its row, so
lost Dagster cursors or partitions never lose work, they only cost a full listing.

* ``diff_documents`` (pure): plan each listed document; find vanished ones; judge the deletion guard.
* ``list_and_diff``: list the source (or read its change feed from ``feed_cursor``), load the index
  state and diff; never raises for source errors (they make the diff incomplete).
* ``take_inventory``: ``list_and_diff`` with a full listing, then record the vanished documents as
  pending deletions only when the guard passed (otherwise clear them).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import psycopg

from rag_pipeline.config import Settings
from rag_pipeline.sources.base import ChangeFeedUnavailable, Source, SourceDocument, SourceError
from rag_pipeline.store import staging
from rag_pipeline.store.index import IndexedDocument, document_from_index
from rag_pipeline.sync import GuardResult, evaluate_guard, plan_document

log = logging.getLogger(__name__)

NEEDS_RUN = ("add", "change", "retry", "repair", "pending", "check", "metadata", "skip")
"""``plan_document`` decisions that need the per-document steps to run."""


@dataclass(frozen=True)
class PlannedDocument:
    """A listed document that needs work: the listing ``doc``, the ``decision`` of ``plan_document``, and its
    ``indexed`` row (None when new)."""

    doc: SourceDocument
    decision: str
    indexed: IndexedDocument | None

    @property
    def attempt_token(self) -> str:
        """Short text that changes whenever another attempt is due: content (hash, or version token, or
        size and time), title/uri/version listed, the index version written and the failures counted.
        Stable while one attempt is in flight (used in Dagster run keys)."""
        d = self.doc
        content = d.content_sha256 or d.source_version or f"{d.size}:{d.modified_at.isoformat() if d.modified_at else ''}"
        digest = hashlib.sha1("\x1f".join([content, d.title or "", d.uri or "", d.source_version or "",
                                           d.skip_reason or ""]).encode()).hexdigest()[:12]
        i = self.indexed
        revived = "r" if i is not None and i.status == "deleted" else ""
        return f"{digest}-v{i.version if i else 0}{revived}-f{i.failure_count if i else 0}"


@dataclass
class SourceDiff:
    """A listing compared with the index.

    ``documents``: every listed document; ``work``: those needing the per-document steps; ``unchanged``:
    how many need nothing; ``vanished``: live indexed documents gone from the source (a full listing) or
    deleted by the feed; ``guard``: the deletion guard's verdict on deleting them; ``mode``: ``full`` or
    ``changes``; ``next_cursor``: the change-feed cursor valid after this listing, when the source has one.
    """

    source: str
    mode: str
    complete: bool
    incomplete_reason: str | None
    documents: list[SourceDocument]
    work: list[PlannedDocument]
    unchanged: int
    vanished: list[IndexedDocument]
    guard: GuardResult
    indexed: int
    next_cursor: str | None = None
    decisions: dict[str, int] = field(default_factory=dict)

    @property
    def listed(self) -> int:
        """Documents in the listing (or the feed's upserts)."""
        return len(self.documents)

    def summary(self) -> dict[str, int]:
        """``added`` / ``changed`` / ``deleted`` / ``unchanged`` plus ``retry``, ``repair``, ``pending``,
        ``check``, ``skip`` counts (the inventory's metadata)."""
        d = self.decisions
        return {"added": d.get("add", 0), "changed": d.get("change", 0) + d.get("metadata", 0),
                "deleted": len(self.vanished), "unchanged": self.unchanged, "retry": d.get("retry", 0),
                "repair": d.get("repair", 0), "pending": d.get("pending", 0), "check": d.get("check", 0),
                "skip": d.get("skip", 0)}


def diff_documents(source: str, docs: Sequence[SourceDocument], state: dict[str, IndexedDocument],
                   settings: Settings, *, complete: bool = True, incomplete_reason: str | None = None,
                   full_listing: bool = True, deleted_ids: Iterable[str] = (), index_retries: bool = False,
                   allow_mass_delete: bool = False) -> SourceDiff:
    """Plan ``docs`` against ``state`` (``load_diff_state`` output) and judge deletions. Pure function.

    ``full_listing``: ``docs`` is the whole source, so live documents not in it vanished; otherwise only
    ``deleted_ids`` (a feed's tombstones) vanish. ``index_retries``: also plan live documents the feed did
    not mention but the index says need work (``failed`` within the limit, ``pending``, incomplete).
    """
    live = {sid: i for sid, i in state.items() if i.status != "deleted"}
    work: list[PlannedDocument] = []
    decisions: dict[str, int] = {}
    unchanged = 0
    seen: set[str] = set()
    unique: list[SourceDocument] = []
    for doc in docs:
        if doc.source_id in seen:
            continue
        seen.add(doc.source_id)
        unique.append(doc)
        i = state.get(doc.source_id)
        decision = plan_document(doc, i, settings)
        decisions[decision] = decisions.get(decision, 0) + 1
        if decision in NEEDS_RUN:
            work.append(PlannedDocument(doc, decision, i))
        else:
            unchanged += 1
    if full_listing:
        vanished = [i for sid, i in live.items() if sid not in seen]
    else:
        vanished = [live[sid] for sid in dict.fromkeys(deleted_ids) if sid in live and sid not in seen]
    if index_retries:
        gone = {i.source_id for i in vanished}
        for sid, i in live.items():
            if sid in seen or sid in gone:
                continue
            if not i.needs_work(settings.max_failures):
                continue
            doc = document_from_index(i).replace(content_sha256=i.seen_sha256)
            decision = plan_document(doc, i, settings)
            if decision in ("retry", "repair", "pending"):
                decisions[decision] = decisions.get(decision, 0) + 1
                work.append(PlannedDocument(doc, decision, i))
    guard = evaluate_guard(complete=complete, incomplete_reason=incomplete_reason, full_listing=full_listing,
                           listed=len(unique), indexed=len(live), to_delete=len(vanished),
                           max_fraction=settings.deletion_max_fraction, allow_mass_delete=allow_mass_delete)
    return SourceDiff(source, "full" if full_listing else "changes", complete, incomplete_reason, unique, work,
                      unchanged, vanished, guard, len(live), decisions=decisions)


def list_and_diff(source: Source, conn: psycopg.Connection, settings: Settings, *,
                  feed_cursor: str | None = None) -> SourceDiff:
    """List ``source`` (its change feed since ``feed_cursor`` when given and usable, else a full listing),
    load its index state and diff. Source errors make the diff incomplete (the guard then fails); only
    database errors raise."""
    if feed_cursor:
        try:
            changes = source.changes(feed_cursor)
        except ChangeFeedUnavailable as exc:
            log.info("%s: %s; doing a full listing", source.name, exc)
        except SourceError as exc:
            state = staging.load_diff_state(conn, source.name)
            diff = diff_documents(source.name, [], state, settings, complete=False,
                                  incomplete_reason=f"change feed failed: {exc}", full_listing=False,
                                  index_retries=True)
            diff.next_cursor = feed_cursor
            return diff
        else:
            state = staging.load_diff_state(conn, source.name)
            diff = diff_documents(source.name, changes.upserts, state, settings, complete=changes.complete,
                                  incomplete_reason=changes.incomplete_reason, full_listing=False,
                                  deleted_ids=changes.deleted_ids, index_retries=True)
            diff.next_cursor = changes.next_cursor if changes.complete else feed_cursor
            return diff
    try:
        inventory = source.list_documents()
        docs, complete, reason, cursor = (list(inventory.documents), inventory.complete,
                                          inventory.incomplete_reason, inventory.cursor)
    except SourceError as exc:
        docs, complete, reason, cursor = [], False, f"listing failed: {exc}", None
    state = staging.load_diff_state(conn, source.name)
    diff = diff_documents(source.name, docs, state, settings, complete=complete, incomplete_reason=reason)
    diff.next_cursor = cursor if complete else None
    return diff


def take_inventory(source: Source, conn: psycopg.Connection, settings: Settings, *,
                   allow_mass_delete: bool = False) -> SourceDiff:
    """Full listing + diff; the vanished documents become the source's pending deletions when the deletion
    guard passes, and the pending list is emptied when it does not (nothing can be purged then)."""
    diff = list_and_diff(source, conn, settings)
    if allow_mass_delete and diff.vanished:
        diff.guard = evaluate_guard(complete=diff.complete, incomplete_reason=diff.incomplete_reason,
                                    full_listing=True, listed=diff.listed, indexed=diff.indexed,
                                    to_delete=len(diff.vanished), max_fraction=settings.deletion_max_fraction,
                                    allow_mass_delete=True)
    staging.replace_pending_deletions(
        conn, source.name, [(i.id, i.source_id) for i in diff.vanished] if diff.guard.passed else [])
    return diff
