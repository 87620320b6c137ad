"""Listing + diff: read a source's listing or change feed, read the index state once, plan (``plan.py``).

``list_and_diff`` is the one place that talks to a source's ``list_documents``/``changes``; the sync, the
Dagster sensor and the inventory asset all start here. Source errors never raise: they make the diff
incomplete (``listing_error``), so the deletion guard holds every deletion back. ``verification_due``
tells whether a full listing should also hash every file (local folders: ``RAG_LOCAL_VERIFY_INTERVAL_S``).
"""

from __future__ import annotations

import logging

import psycopg

from rag_pipeline.config import Settings
from rag_pipeline.permissions.visibility import apply_guard_visibility
from rag_pipeline.pipeline.plan import SourceDiff, diff_documents
from rag_pipeline.sources.base import ChangeFeedUnavailable, Source, SourceDocument, SourceError
from rag_pipeline.store import staging
from rag_pipeline.store.generations import kept
from rag_pipeline.store.index import load_index_state

log = logging.getLogger(__name__)

VERIFY_MODE = "full+verify"
"""``sync_runs.mode`` of a full listing that also hashed every file."""


def verification_due(conn: psycopg.Connection, source: Source, settings: Settings) -> bool:
    """Whether ``source`` lists without reading content (``verifiable``) and its last full verification
    (a finished ``sync_runs`` row in ``VERIFY_MODE``) is older than ``local_verify_interval_s`` seconds (or
    never happened while documents exist). 0 disables periodic verification."""
    if not getattr(source, "verifiable", False) or settings.local_verify_interval_s <= 0:
        return False
    row = conn.execute(
        "SELECT (SELECT max(started_at) FROM sync_runs WHERE source = %s AND mode = %s "
        "        AND status NOT IN ('running', 'interrupted')), "
        "       (SELECT min(created_at) FROM documents WHERE source = %s), now()",
        (source.name, VERIFY_MODE, source.name)).fetchone()
    last, first_document, now = row
    since = last or first_document
    return since is not None and (now - since).total_seconds() >= settings.local_verify_interval_s


def list_and_diff(source: Source, conn: psycopg.Connection, settings: Settings, *, cursor: str | None = None,
                  verify: bool = False, count_rows: bool = True,
                  allow_mass_delete: bool = False, confirm_delete: int | None = None) -> SourceDiff:
    """List ``source`` (its change feed since ``cursor`` when given and usable, else a full listing; with
    ``verify`` a verifying listing), read its index state once and diff (``plan.diff_documents``).

    ``count_rows``: count each current version's chunk rows (finds missing rows to repair) rather than
    trusting ``documents.chunk_count``. Documents lacking vectors in a kept embedding generation are planned
    ``REEMBED`` (``store.generations``).
    The diff's ``next_cursor`` is the cursor valid after this listing (None when the listing failed or the
    source has no feed). Only database errors raise."""
    options = dict(allow_mass_delete=allow_mass_delete, confirm_delete=confirm_delete)
    if cursor:
        try:
            changes = source.changes(cursor)
        except ChangeFeedUnavailable as exc:
            log.info("%s: %s; doing a full listing", source.name, exc)
        except SourceError as exc:
            return _diff(conn, source, settings, [], count_rows, complete=False, full_listing=False,
                         incomplete_reason=f"change feed failed: {exc}", listing_error=f"change feed failed: {exc}",
                         **options)
        else:
            diff = _diff(conn, source, settings, changes.upserts, count_rows, complete=changes.complete,
                         incomplete_reason=changes.incomplete_reason, full_listing=False,
                         deleted_ids=changes.deleted_ids, **options)
            diff.next_cursor = changes.next_cursor if changes.complete else None
            return diff
    try:
        inventory = source.list_documents(verify=True) if verify else source.list_documents()
    except SourceError as exc:
        return _diff(conn, source, settings, [], count_rows, complete=False, incomplete_reason=f"listing failed: {exc}",
                     listing_error=f"listing failed: {exc}", **options)
    diff = _diff(conn, source, settings, inventory.documents, count_rows, complete=inventory.complete,
                 incomplete_reason=inventory.incomplete_reason, **options)
    diff.next_cursor = inventory.cursor if inventory.complete else None
    return diff


def _diff(conn: psycopg.Connection, source: Source, settings: Settings, docs: list[SourceDocument],
          count_rows: bool, *, listing_error: str | None = None, full_listing: bool = True,
          **kwargs) -> SourceDiff:
    state = load_index_state(conn, source.name, count_rows=count_rows)
    diff = diff_documents(source.name, docs, state, settings, full_listing=full_listing,
                          index_retries=not full_listing, generations=[g.id for g in kept(conn)], **kwargs)
    diff.listing_error = listing_error
    return diff


def cursor_after(diff: SourceDiff, previous: str | None) -> str | None:
    """The change-feed cursor to keep once ``diff`` has been acted on: the listing's next cursor, or
    ``previous`` when the listing was incomplete or the deletion guard held deletions back (they must be
    seen again by the next run, and by the override; advancing past them would lose them until a full
    reconciliation). The sync and the Dagster sensor both keep their position with this rule."""
    if not diff.complete or (diff.vanished and not diff.guard.passed):
        return previous
    return diff.next_cursor


def take_inventory(source: Source, conn: psycopg.Connection, settings: Settings, *,
                   allow_mass_delete: bool = False, confirm_delete: int | None = None) -> SourceDiff:
    """A full listing + diff whose vanished documents become the source's pending deletions when the guard
    passes; the pending list is emptied when it does not (nothing can be purged then), and the held
documents are hidden or shown by the source's policy (``permissions.visibility``). The Dagster
    ``source_inventory`` asset; ``pipeline.staged.purge_deletions`` applies the list."""
    diff = list_and_diff(source, conn, settings, allow_mass_delete=allow_mass_delete,
                         confirm_delete=confirm_delete)
    staging.replace_pending_deletions(
        conn, source.name, [(i.id, i.source_id) for i in diff.vanished] if diff.guard.passed else [])
    apply_guard_visibility(conn, source, diff)
    return diff
