"""SQL behind the index's asset checks, as plain functions (the CLI and tests use them without Dagster).

Each function only reads and returns a frozen result with ``passed`` and the numbers that explain it:

* ``chunk_counts``: per document, expected vs stored chunk rows of its current version, and rows of
  any other version (``chunk_count_complete``);
* ``mixed_versions``: documents with chunk rows of two or more versions (``index_versions_unique``);
* ``permanently_failed``: documents given up on, with their reasons (``no_permanently_failed_documents``);
* ``generation_status``: each kept embedding generation's progress (documents and chunks embedded vs
  current) and whether the configured model's generation is the active, complete one
  (``embedding_generation_progress``).

Raise ``psycopg.Error`` on database errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from rag_pipeline.store.generations import Generation, Progress, kept, progress

import psycopg


@dataclass(frozen=True)
class ChunkCount:
    """One document's chunk rows: ``expected`` (``expected_chunk_count``, None before its first write),
    ``stored`` (rows of the current ``version``), ``other_versions`` (rows of any other version).

    ``passed``: a document never written (``version`` 0) holds no rows; a written one holds exactly
    ``expected`` (> 0) rows of its current version and none of another. ``deleted`` documents must hold none.
    """

    document_id: int
    source: str
    source_id: str
    status: str
    version: int
    expected: int | None
    stored: int
    other_versions: int

    @property
    def passed(self) -> bool:
        """Whether the rows match the expectation (see class docstring)."""
        if self.other_versions:
            return False
        if self.status == "deleted" or self.version == 0:
            return self.stored == 0
        return self.expected is not None and self.expected > 0 and self.stored == self.expected


def chunk_counts(conn: psycopg.Connection, document_ids: Sequence[int]) -> dict[int, ChunkCount]:
    """``ChunkCount`` per id in ``document_ids`` (ids that do not exist are absent)."""
    if not document_ids:
        return {}
    rows = conn.execute(
        """
        SELECT d.id, d.source, d.source_id, d.status, d.version, d.expected_chunk_count,
               count(c.id) FILTER (WHERE c.version = d.version),
               count(c.id) FILTER (WHERE c.version <> d.version)
        FROM documents d LEFT JOIN chunks c ON c.document_id = d.id
        WHERE d.id = ANY(%s)
        GROUP BY d.id
        """,
        (list(document_ids),),
    ).fetchall()
    return {int(r[0]): ChunkCount(int(r[0]), r[1], r[2], r[3], int(r[4]), r[5], int(r[6]), int(r[7])) for r in rows}


@dataclass(frozen=True)
class MixedVersions:
    """Documents holding chunk rows of more than one version: ``count`` and up to ``limit`` ``examples``
    as ``(source, source_id, versions)``."""

    count: int
    examples: list[tuple[str, str, list[int]]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No document has chunks of two versions."""
        return self.count == 0


def mixed_versions(conn: psycopg.Connection, *, limit: int = 20) -> MixedVersions:
    """Find documents whose chunks span several versions (one index scan of ``chunks``)."""
    rows = conn.execute(
        """
        SELECT d.source, d.source_id, m.versions, count(*) OVER ()
        FROM (SELECT document_id, array_agg(DISTINCT version ORDER BY version) AS versions
              FROM chunks GROUP BY document_id HAVING count(DISTINCT version) > 1) m
        JOIN documents d ON d.id = m.document_id
        ORDER BY d.source, d.source_id LIMIT %s
        """,
        (limit,),
    ).fetchall()
    return MixedVersions(int(rows[0][3]) if rows else 0, [(r[0], r[1], list(r[2])) for r in rows])


@dataclass(frozen=True)
class FailedDocument:
    """A ``permanently_failed`` document: where it is, why (``reason``), attempts, when it last changed."""

    source: str
    source_id: str
    title: str | None
    reason: str | None
    failure_count: int
    updated_at: datetime


@dataclass(frozen=True)
class PermanentlyFailed:
    """``count`` permanently failed documents and up to ``limit`` of them (most recent first)."""

    count: int
    documents: list[FailedDocument] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No document is permanently failed."""
        return self.count == 0


def permanently_failed(conn: psycopg.Connection, *, source: str | None = None, limit: int = 50) -> PermanentlyFailed:
    """List ``permanently_failed`` documents (of ``source`` when given) with their reasons."""
    rows = conn.execute(
        """
        SELECT source, source_id, title, last_error, failure_count, updated_at, count(*) OVER ()
        FROM documents WHERE status = 'permanently_failed' AND (%(source)s::text IS NULL OR source = %(source)s)
        ORDER BY updated_at DESC, source, source_id LIMIT %(limit)s
        """,
        {"source": source, "limit": limit},
    ).fetchall()
    return PermanentlyFailed(int(rows[0][6]) if rows else 0, [FailedDocument(*r[:6]) for r in rows])


@dataclass(frozen=True)
class GenerationStatus:
    """The kept embedding generations (``store.generations``) with their ``Progress``, and the configured
    ``model``: ``passed`` when the configured model's generation is the active one and complete (no rollout
    under way); while one is, ``rollout`` is that generation's progress."""

    model: str
    generations: list[tuple[Generation, Progress]]

    @property
    def active(self) -> tuple[Generation, Progress] | None:
        return next(((g, p) for g, p in self.generations if g.state == "active"), None)

    @property
    def rollout(self) -> tuple[Generation, Progress] | None:
        """The configured model's generation when it is not the active one."""
        return next(((g, p) for g, p in self.generations if g.model == self.model and g.state != "active"), None)

    @property
    def passed(self) -> bool:
        a = self.active
        return a is not None and a[0].model == self.model and a[1].complete


def generation_status(conn: psycopg.Connection, model: str) -> GenerationStatus:
    """``GenerationStatus`` of the index for the configured ``model`` (one progress count per kept generation)."""
    return GenerationStatus(model, [(g, progress(conn, g)) for g in kept(conn)])
