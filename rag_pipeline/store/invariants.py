"""The sync invariant as SQL checks: plain functions that return every violation they find.

The invariant (``../shared/notes/DESIGN.md``): for every document present in a source, the index holds
exactly the chunks of the document's current version and nothing else; a document that left the
source has no chunks; every status tells the truth; readers see the old version or the new one,
never both and never neither.

Two layers:

* ``check_index(conn)`` needs nothing but the database. It holds at *every* commit point, including
  right after a crash (SIGKILL, PostgreSQL stopped) in the middle of a sync, because each document's
  swap is one transaction. Checks, by ``Violation.kind``:

  - ``mixed_versions``: a document has chunk rows of two or more versions;
  - ``stale_chunks``: chunk rows whose version is not the document's ``version``;
  - ``incomplete_completed``: a ``completed`` document whose stored rows differ from
    ``expected_chunk_count`` (or from ``chunk_count``), or that has no rows at all;
  - ``bad_ordinals``: the stored ordinals of the current version are not ``0..n-1``;
  - ``lost_previous_version``: a ``pending``/``failed``/``permanently_failed`` document that was
    complete once (``version > 0``) no longer holds that version's ``expected_chunk_count`` rows,
    so readers would see *neither* version (a tombstone coming back has ``expected_chunk_count`` 0:
    its previous version was deleted on purpose and no rows are expected);
  - ``chunks_without_version``: a document never completed (``version = 0``) has chunk rows;
  - ``deleted_with_chunks``: a tombstone (``deleted``) still has chunk rows or Markdown;
  - ``tombstone_mismatch``: ``deleted_at`` is set on a live document or missing on a tombstone;
  - ``markdown_mismatch``: a ``completed`` document's stored Markdown is of another version or
    content hash than the document row;
  - ``not_in_active_generation``: a document with a searchable version (``version > 0``, not deleted)
    does not list the active embedding generation (``store.generations``): readers would not find it;
  - ``generation_incomplete``: a document lists a kept generation whose table lacks a vector of one of the
    current version's chunks.

* ``check_against_listing(conn, source, listing, ...)`` compares with what the source holds now
  (``{source_id: content SHA-256}``). With ``converged=True`` (after a sync that ran to the end)
  every listed document must be ``completed`` at exactly that hash (``not_current``, ``missing``,
  ``not_completed``) and every other top-level document of the source must be a tombstone
  (``not_deleted``). With ``converged=False`` (after a crash) a ``completed`` document may hold any
  content the source had at some point (``acceptable`` adds the earlier hashes per id); holding
  anything else is ``unknown_content``.

Every function returns ``list[Violation]`` sorted by (kind, source, source_id); an empty list means
the invariant holds. They only read; raise ``psycopg.Error`` on database errors.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import psycopg


@dataclass(frozen=True, order=True)
class Violation:
    """One broken rule: ``kind`` (see module docstring), the document (``source``, ``source_id``,
    ``document_id``) and a human-readable ``detail`` with the numbers found."""

    kind: str
    source: str
    source_id: str
    document_id: int
    detail: str


# Each query returns (document_id, source, source_id, detail) rows for one kind of violation.
_INDEX_CHECKS: dict[str, str] = {
    "mixed_versions": """
        SELECT d.id, d.source, d.source_id,
               'chunk versions ' || string_agg(DISTINCT c.version::text, ',') || ', document version ' || d.version
        FROM documents d JOIN chunks c ON c.document_id = d.id
        GROUP BY d.id HAVING count(DISTINCT c.version) > 1
    """,
    "stale_chunks": """
        SELECT d.id, d.source, d.source_id,
               count(*) || ' chunk rows of version ' || min(c.version) || '..' || max(c.version)
               || ' but the document is at version ' || d.version
        FROM documents d JOIN chunks c ON c.document_id = d.id AND c.version <> d.version
        GROUP BY d.id
    """,
    "incomplete_completed": """
        SELECT d.id, d.source, d.source_id,
               'stored ' || COALESCE(s.n, 0) || ' rows, expected_chunk_count ' || COALESCE(d.expected_chunk_count::text, 'NULL')
               || ', chunk_count ' || d.chunk_count
        FROM documents d
        LEFT JOIN (SELECT document_id, version, count(*) AS n FROM chunks GROUP BY 1, 2) s
               ON s.document_id = d.id AND s.version = d.version
        WHERE d.status = 'completed'
          AND (COALESCE(s.n, 0) = 0 OR d.expected_chunk_count IS DISTINCT FROM COALESCE(s.n, 0)
               OR d.chunk_count <> COALESCE(s.n, 0))
    """,
    "bad_ordinals": """
        SELECT d.id, d.source, d.source_id,
               'ordinals ' || min(c.ordinal) || '..' || max(c.ordinal) || ' for ' || count(*) || ' rows'
        FROM documents d JOIN chunks c ON c.document_id = d.id AND c.version = d.version
        GROUP BY d.id HAVING min(c.ordinal) <> 0 OR max(c.ordinal) <> count(*) - 1
    """,
    "lost_previous_version": """
        SELECT d.id, d.source, d.source_id,
               d.status || ' at version ' || d.version || ': stored ' || COALESCE(s.n, 0)
               || ' rows of it, expected_chunk_count ' || COALESCE(d.expected_chunk_count::text, 'NULL')
        FROM documents d
        LEFT JOIN (SELECT document_id, version, count(*) AS n FROM chunks GROUP BY 1, 2) s
               ON s.document_id = d.id AND s.version = d.version
        WHERE d.status IN ('pending', 'failed', 'permanently_failed', 'skipped') AND d.version > 0
          AND (COALESCE(d.expected_chunk_count, 0) > 0 OR COALESCE(s.n, 0) > 0)
          AND d.expected_chunk_count IS DISTINCT FROM COALESCE(s.n, 0)
    """,
    "chunks_without_version": """
        SELECT d.id, d.source, d.source_id, count(*) || ' chunk rows on a never-completed document'
        FROM documents d JOIN chunks c ON c.document_id = d.id
        WHERE d.version = 0 GROUP BY d.id
    """,
    "deleted_with_chunks": """
        SELECT d.id, d.source, d.source_id,
               (SELECT count(*) FROM chunks c WHERE c.document_id = d.id) || ' chunk rows, '
               || (SELECT count(*) FROM document_markdown m WHERE m.document_id = d.id) || ' markdown rows'
        FROM documents d
        WHERE d.status = 'deleted'
          AND (EXISTS (SELECT 1 FROM chunks c WHERE c.document_id = d.id)
               OR EXISTS (SELECT 1 FROM document_markdown m WHERE m.document_id = d.id))
    """,
    "tombstone_mismatch": """
        SELECT d.id, d.source, d.source_id,
               'status ' || d.status || ' with deleted_at ' || COALESCE(d.deleted_at::text, 'NULL')
        FROM documents d
        WHERE (d.status = 'deleted') <> (d.deleted_at IS NOT NULL)
    """,
    "markdown_mismatch": """
        SELECT d.id, d.source, d.source_id,
               'document version ' || d.version || ' sha ' || COALESCE(d.content_sha256, 'NULL')
               || '; markdown version ' || COALESCE(m.version::text, 'none') || ' sha '
               || COALESCE(m.content_sha256, 'none')
        FROM documents d LEFT JOIN document_markdown m ON m.document_id = d.id
        WHERE d.status = 'completed'
          AND (m.document_id IS NULL OR m.version <> d.version OR m.content_sha256 IS DISTINCT FROM d.content_sha256)
    """,
}


def _generation_checks(conn: psycopg.Connection) -> dict[str, str]:
    """The per-generation checks for the kept generations now (their tables are named by id)."""
    from rag_pipeline.store.generations import kept

    gens = kept(conn)
    active = next((g for g in gens if g.state == "active"), None)
    checks: dict[str, str] = {}
    if active is not None:
        checks["not_in_active_generation"] = f"""
            SELECT d.id, d.source, d.source_id,
                   'version ' || d.version || ' (' || d.status || ') not in active generation {active.id}, lists '
                   || COALESCE(array_to_string(d.generations, ','), '')
            FROM documents d WHERE d.version > 0 AND d.deleted_at IS NULL AND NOT {active.id} = ANY(d.generations)
        """
    parts = [f"""
            SELECT d.id, d.source, d.source_id,
                   'generation {g.id} holds ' || count(e.chunk_id) || ' of ' || count(c.id) || ' vectors of version '
                   || d.version
            FROM documents d JOIN chunks c ON c.document_id = d.id AND c.version = d.version
            LEFT JOIN {g.table} e ON e.chunk_id = c.id
            WHERE {g.id} = ANY(d.generations) GROUP BY d.id HAVING count(e.chunk_id) <> count(c.id)
        """ for g in gens]
    if parts:
        checks["generation_incomplete"] = " UNION ALL ".join(parts)
    return checks


def check_index(conn: psycopg.Connection, *, source: str | None = None) -> list[Violation]:
    """Every violation of the source-independent rules (module docstring), optionally for one
    ``source`` only. Runs in one read-only snapshot (REPEATABLE READ) so a concurrent sync cannot
    make a consistent index look broken half-way through the checks."""
    found: list[Violation] = []
    with conn.transaction():
        if conn.autocommit:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        for kind, sql in {**_INDEX_CHECKS, **_generation_checks(conn)}.items():
            rows = conn.execute(
                f"SELECT * FROM ({sql}) v(document_id, source, source_id, detail) "
                "WHERE %(source)s::text IS NULL OR v.source = %(source)s::text",
                {"source": source},
            ).fetchall()
            found.extend(Violation(kind, r[1], r[2], int(r[0]), r[3]) for r in rows)
    return sorted(found)


def check_against_listing(
    conn: psycopg.Connection,
    source: str,
    listing: Mapping[str, str],
    *,
    converged: bool,
    acceptable: Mapping[str, Collection[str]] | None = None,
) -> list[Violation]:
    """Compare the index with the source's current ``listing`` (``{source_id: hex SHA-256 of the
    content}``); see the module docstring for ``converged``. ``acceptable``: per source id, earlier
    content hashes a crash may legitimately leave indexed (used only when ``converged`` is False).
    Only top-level documents (no attachments) are compared."""
    rows = conn.execute(
        """
        SELECT id, source_id, status, content_sha256, version FROM documents
        WHERE source = %s AND parent_id IS NULL
        """,
        (source,),
    ).fetchall()
    by_id = {r[1]: r for r in rows}
    found: list[Violation] = []
    for sid, sha in listing.items():
        row = by_id.get(sid)
        if row is None:
            if converged:
                found.append(Violation("missing", source, sid, 0, "listed by the source, absent from the index"))
            continue
        doc_id, _, status, indexed_sha, version = row
        if converged:
            if status != "completed":
                found.append(Violation("not_completed", source, sid, doc_id, f"status {status} at version {version}"))
            elif indexed_sha != sha:
                found.append(Violation("not_current", source, sid, doc_id,
                                       f"indexed content {indexed_sha}, source has {sha}"))
        elif status == "completed":
            allowed = {sha, *((acceptable or {}).get(sid, ()))}
            if indexed_sha not in allowed:
                found.append(Violation("unknown_content", source, sid, doc_id,
                                       f"indexed content {indexed_sha} was never this document's content"))
    if converged:
        for sid, (doc_id, _, status, _, version) in by_id.items():
            if sid not in listing and status != "deleted":
                found.append(Violation("not_deleted", source, sid, doc_id,
                                       f"gone from the source but {status} at version {version}"))
    return sorted(found)


__all__ = ["Violation", "check_against_listing", "check_index"]
