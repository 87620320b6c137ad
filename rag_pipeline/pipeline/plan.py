"""Planning, pure: what one listed document needs, what a listing means for the index, the deletion guard.

No I/O here: ``plan_document`` decides for one listed document against its index row, ``diff_documents``
plans a whole listing (or a change feed's page) against the state read once, ``evaluate_guard`` judges the
deletions. Every caller (``pipeline.sync``, the Dagster sensor and inventory) plans with these functions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from enum import Enum

from rag_pipeline.config import Settings
from rag_pipeline.sources.base import SourceDocument
from rag_pipeline.store.index import IndexedDocument, document_from_index


class Decision(str, Enum):
    """What one listed document needs (``plan_document``): ``ADD`` not in the index, or a tombstone listed
    again; ``CHANGE`` the listing's hash or version differs from what the index saw; ``RETRY`` failed on this
    content and its backoff has passed; ``BACKOFF`` failed and still waiting; ``REPAIR`` completed but stored
    rows differ from the expected count; ``PENDING`` an attempt was interrupted or an operator asked for a
    retry; ``CHECK`` the listing carries neither hash nor version: fetch and compare; ``METADATA`` same
    content, other title/uri/version/metadata; ``REEMBED`` same content, vectors missing in a kept embedding
    generation (a new model rolling out); ``SKIP``
    the source says it cannot be ingested and the index does not say so yet; ``UNCHANGED`` nothing to do."""

    ADD, CHANGE, RETRY, BACKOFF, REPAIR, PENDING = "add", "change", "retry", "backoff", "repair", "pending"
    CHECK, METADATA, REEMBED, SKIP, UNCHANGED = "check", "metadata", "reembed", "skip", "unchanged"

    def __str__(self) -> str:
        return self.value


IDLE = frozenset({Decision.UNCHANGED, Decision.BACKOFF})
"""Decisions that need no work."""


def retry_wait_s(failure_count: int, settings: Settings) -> float:
    """Seconds a ``failed`` document waits after its ``failure_count``-th failure:
    ``retry_backoff_s * 2**(failure_count - 1)`` (1 h, then 2 h with the default 3,600 s)."""
    return settings.retry_backoff_s * (2 ** max(failure_count - 1, 0))


def _metadata_differs(doc: SourceDocument, i: IndexedDocument) -> bool:
    return (doc.title != i.title or doc.uri != i.uri or dict(doc.metadata) != dict(i.metadata or {})
            or (doc.source_version is not None and doc.source_version != i.source_version))


def plan_document(doc: SourceDocument, i: IndexedDocument | None, settings: Settings, *,
                  generations: Collection[int] | None = None, now: datetime | None = None) -> Decision:
    """Decide what ``doc`` (as listed) needs given its index row ``i`` (None: never indexed).

    Content is compared by the listing's ``content_sha256`` when it has one, else by its ``source_version``
    (a local file's size and mtime, an etag), else not at all (``CHECK``). ``generations``: the kept
    embedding generations (``REEMBED`` when the current version lacks vectors in one of them: filled from
    the stored chunk texts). ``now``: for the retry backoff
    (default: the current UTC time). Pure function.
    """
    if i is None or i.status == "deleted":
        return Decision.ADD
    if doc.content_sha256:
        changed: bool | None = doc.content_sha256 != (i.seen_sha256 or i.content_sha256)
    elif doc.source_version is not None:
        changed = doc.source_version != (i.seen_source_version or i.source_version)
    else:
        changed = None  # must fetch to know
    if doc.skip_reason:
        terminal = i.status in ("skipped", "permanently_failed") and i.last_error == doc.skip_reason
        return Decision.UNCHANGED if terminal else Decision.SKIP
    if i.status == "completed":
        if changed:
            return Decision.CHANGE
        if changed is None:
            return Decision.CHECK
        if not i.complete:
            return Decision.REPAIR
        if generations and not set(generations) <= set(i.generations):
            return Decision.REEMBED
        return Decision.METADATA if _metadata_differs(doc, i) else Decision.UNCHANGED
    if i.status == "pending":
        return Decision.PENDING
    if changed:
        return Decision.CHANGE
    if i.status == "failed" and i.failure_count < settings.max_failures:
        waited = (now or datetime.now(timezone.utc)) - i.updated_at
        return Decision.RETRY if waited >= timedelta(seconds=retry_wait_s(i.failure_count, settings)) else Decision.BACKOFF
    if changed is None and i.status in ("permanently_failed", "skipped"):
        return Decision.CHECK
    return Decision.UNCHANGED


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


def evaluate_guard(*, complete: bool, incomplete_reason: str | None, full_listing: bool, listed: int,
                   indexed: int, to_delete: int, max_fraction: float, allow_mass_delete: bool = False,
                   confirm_delete: int | None = None) -> GuardResult:
    """The deletion guard (pure). Deletions only from a complete listing that is not empty while the index
    holds documents of the source, and that removes at most ``max_fraction`` of them. ``indexed`` counts
    the source's live documents. Overrides, both logged by the caller: ``allow_mass_delete`` lifts the
    fraction only; ``confirm_delete`` (the exact number the operator expects to delete) lifts the fraction
    and the empty-listing rule when it equals ``to_delete``. Nothing overrides an incomplete listing.
    """
    def result(passed: bool, reason: str | None) -> GuardResult:
        return GuardResult(passed, reason, complete, listed, indexed, to_delete, max_fraction)

    if not complete:
        return result(False, f"listing incomplete ({incomplete_reason or 'unknown reason'}): nothing deleted")
    confirmed = confirm_delete is not None and confirm_delete == to_delete
    if full_listing and listed == 0 and indexed > 0 and not confirmed:
        return result(False, (f"empty listing while the index holds {indexed} documents of this source: nothing "
                              f"deleted (a source really emptied: --confirm-delete {to_delete}, or "
                              "`rag-pipeline sources retire`)"))
    too_many = to_delete and indexed and to_delete / indexed > max_fraction
    if too_many and not (allow_mass_delete or confirmed):
        return result(False, (f"would delete {to_delete} of {indexed} documents ({to_delete / indexed:.0%}), "
                              f"more than the allowed {max_fraction:.0%}: nothing deleted (if that is right: "
                              f"--confirm-delete {to_delete})"))
    return result(True, None)


@dataclass(frozen=True)
class PlannedDocument:
    """A listed document that needs work: the listing ``doc``, its ``decision``, its ``indexed`` row (None
    when new)."""

    doc: SourceDocument
    decision: Decision
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
        state = f"{i.status[:1]}{i.version}" if i else "n0"
        return f"{digest}-{self.decision.value[:2]}-v{state}{revived}-f{i.failure_count if i else 0}"


@dataclass
class SourceDiff:
    """A listing (or change-feed page) compared with the index.

    ``documents``: every listed document, unique by id; ``work``: those needing the per-document steps;
    ``idle``: those needing nothing now (unchanged, or waiting for their retry backoff); ``unchanged``:
    how many; ``vanished``: live documents gone from the source (a full
    listing) or deleted by the feed; ``guard``: the verdict on deleting them; ``mode``: ``full`` or
    ``changes``; ``next_cursor``: the change-feed cursor valid after this listing; ``listing_error``: why
    the source could not be listed or read (the listing is then incomplete); ``decisions``: counts.
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
    listing_error: str | None = None
    decisions: dict[str, int] = field(default_factory=dict)
    idle: list[PlannedDocument] = field(default_factory=list)

    @property
    def listed(self) -> int:
        """Documents in the listing (or the feed's upserts)."""
        return len(self.documents)

    def summary(self) -> dict[str, int]:
        """``added`` / ``changed`` / ``deleted`` / ``unchanged`` plus the other decisions' counts (the
        inventory's metadata)."""
        d = self.decisions
        out = {"added": d.get("add", 0), "changed": d.get("change", 0) + d.get("metadata", 0),
               "deleted": len(self.vanished), "unchanged": self.unchanged}
        out.update({k.value: d.get(k.value, 0) for k in (Decision.RETRY, Decision.BACKOFF, Decision.REPAIR,
                                                         Decision.PENDING, Decision.CHECK, Decision.REEMBED,
                                                         Decision.SKIP)})
        return out


def diff_documents(source: str, docs: Sequence[SourceDocument], state: Mapping[str, IndexedDocument],
                   settings: Settings, *, complete: bool = True, incomplete_reason: str | None = None,
                   full_listing: bool = True, deleted_ids: Iterable[str] = (), index_retries: bool = False,
                   generations: Collection[int] | None = None, allow_mass_delete: bool = False,
                   confirm_delete: int | None = None,
                   now: datetime | None = None) -> SourceDiff:
    """Plan ``docs`` against ``state`` (``store.index.load_index_state``) and judge deletions. Pure function.

    ``full_listing``: ``docs`` is the whole source, so live documents not in it vanished; otherwise only
    ``deleted_ids`` (a feed's tombstones) vanish. ``index_retries``: also plan live documents the feed did
    not mention but the index says need work (``failed`` within the limit and due, ``pending``,
    incomplete). Duplicated ids in ``docs``: the first wins.
    """
    live = {sid: i for sid, i in state.items() if i.live}
    work: list[PlannedDocument] = []
    idle: list[PlannedDocument] = []
    decisions: dict[str, int] = {}
    seen: set[str] = set()
    unique: list[SourceDocument] = []

    def consider(doc: SourceDocument, i: IndexedDocument | None, *, only: frozenset[Decision] | None = None) -> None:
        decision = plan_document(doc, i, settings, generations=generations, now=now)
        if only is not None and decision not in only:
            return
        decisions[decision.value] = decisions.get(decision.value, 0) + 1
        (idle if decision in IDLE else work).append(PlannedDocument(doc, decision, i))

    for doc in docs:
        if doc.source_id in seen:
            continue
        seen.add(doc.source_id)
        unique.append(doc)
        consider(doc, state.get(doc.source_id))
    if full_listing:
        vanished = [i for sid, i in live.items() if sid not in seen]
    else:
        vanished = [live[sid] for sid in dict.fromkeys(deleted_ids) if sid in live and sid not in seen]
    if index_retries:
        gone = {i.source_id for i in vanished}
        for sid, i in live.items():
            if sid not in seen and sid not in gone and i.needs_work(settings.max_failures):
                consider(document_from_index(i).replace(content_sha256=i.seen_sha256), i,
                         only=frozenset({Decision.RETRY, Decision.REPAIR, Decision.PENDING}))
    guard = evaluate_guard(complete=complete, incomplete_reason=incomplete_reason, full_listing=full_listing,
                           listed=len(unique), indexed=len(live), to_delete=len(vanished),
                           max_fraction=settings.deletion_max_fraction, allow_mass_delete=allow_mass_delete,
                           confirm_delete=confirm_delete)
    return SourceDiff(source, "full" if full_listing else "changes", complete, incomplete_reason, unique, work,
                      len(idle), vanished, guard, len(live), decisions=decisions, idle=idle)
