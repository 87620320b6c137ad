"""What the pipeline did: one action vocabulary and one outcome type for every caller.

``Action`` values are what ``ingest_log.action`` holds (revision 0003 checks them), whichever caller ran the
step (the CLI, the daily reconciliation, a Dagster partition run, the retry action).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Action(str, Enum):
    """What happened to one document in one run: ``added`` its first complete version (or a tombstone
    revived); ``updated`` new content as a new version; ``repaired`` the same content re-written because
    stored rows were missing; ``re-embedded`` the same chunk texts with vectors of the configured model;
    ``metadata-updated`` title/uri/version/metadata only; ``skipped-unchanged`` nothing to do (unchanged,
    waiting for its backoff, or failed on the same content); ``skipped`` terminal, not a failure (empty, no
    extractable text); ``failed`` the attempt failed (``failed`` or ``permanently_failed``, with the reason);
    ``deleted`` gone from the source or its source retired; ``retry-requested`` an operator reset the count."""

    ADDED = "added"
    UPDATED = "updated"
    REPAIRED = "repaired"
    REEMBEDDED = "re-embedded"
    METADATA = "metadata-updated"
    UNCHANGED = "skipped-unchanged"
    SKIPPED = "skipped"
    FAILED = "failed"
    DELETED = "deleted"
    RETRY_REQUESTED = "retry-requested"

    def __str__(self) -> str:
        return self.value


@dataclass
class DocumentOutcome:
    """What one step or run did to one document.

    ``action``: an ``Action``; ``status``: the document's status afterwards (None when it has no row);
    ``reason``: why (failures, skips); ``document_id``: the ``documents.id``; ``version``: the version
    written. Counts: ``chunk_count`` chunks, ``char_count`` characters, ``page_count`` pages,
    ``embedded``/``reused`` chunk vectors computed now / taken from the embedding cache; ``duration_s``
    seconds; ``preview``: the start of the Markdown or first chunk (Dagster metadata); ``stats``: the
    extraction's quality record; ``became_permanent``: this attempt made it ``permanently_failed``;
    ``transient``: the attempt failed for a reason that may pass (timeout, service down, a limit), whether or
    not it used up the document's budget: the Dagster step fails so the run shows it.
    """

    source_id: str
    title: str | None
    action: Action
    status: str | None
    reason: str | None = None
    document_id: int | None = None
    version: int | None = None
    chunk_count: int | None = None
    char_count: int | None = None
    page_count: int | None = None
    model: str | None = None
    embedded: int = 0
    reused: int = 0
    duration_s: float = 0.0
    preview: str = ""
    stats: dict[str, Any] = field(default_factory=dict)
    became_permanent: bool = False
    transient: bool = False

    @property
    def chars_per_page(self) -> float | None:
        """Characters per page, when the format has pages."""
        if self.char_count is None or not self.page_count:
            return None
        return self.char_count / self.page_count
