"""Permission sync: read who may read each indexed document from its source and write it into the index,
apart from content (nothing is fetched, extracted or embedded).

``sync_permissions(source, conn, settings)`` is called by every content sync (``pipeline.sync.sync_source``)
and on its own, more often, by the Dagster ``<name>_permission_sensor``. Steps:

1. which documents: with a source that has ``permission_changes`` and a saved permission cursor, those the
   source reports changed plus those never read or last unreadable; otherwise every live top-level document;
2. their scopes from ``source.permissions`` in batches of ``BATCH``, written by ``apply_scopes``: a changed
   scope updates ``documents.principals`` (and the children's: an attachment inherits its parent's scope);
   a scope the source could not read becomes the empty scope with ``permissions_error`` (**fail closed**:
   readable by nobody but an admin query);
3. the groups named by any of the source's scopes, read and closed transitively (``groups.read_groups``),
   replace the source's ``group_members`` rows; a group that could not be read keeps none;
4. the permission cursor is saved (``source_cursors`` under ``permissions:<source>``) only after all that
   committed.

A source without permission data (no ``permissions`` method; every built-in connector has one) gets its
``default_principals`` attribute or, when it has none, the empty scope with a reason.
Runs of one source are serialised by an advisory lock of their own (``locks.source_lock`` on
``permissions:<source>``), so an older read never overwrites a newer one. Raises only database errors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import psycopg

from rag_pipeline.config import Settings
from rag_pipeline.permissions.groups import groups_in, read_groups, store_groups
from rag_pipeline.permissions.principals import MAX_PRINCIPAL_CHARS, parse_principal
from rag_pipeline.pipeline.locks import source_lock
from rag_pipeline.sources.base import Scope, SourceDocument, SourceError
from rag_pipeline.store import index as idx

log = logging.getLogger(__name__)

BATCH = 200
"""Documents per ``source.permissions`` call."""
MAX_PRINCIPALS = 10_000
"""Most principals one document's scope may hold; a longer scope is unreadable (fail closed)."""
_CURSOR_PREFIX = "permissions:"
_SEP = chr(31)


def permission_cursor_key(source: str) -> str:
    """The ``source_cursors`` key of ``source``'s permission cursor."""
    return _CURSOR_PREFIX + source


@dataclass
class PermissionReport:
    """One permission sync: ``mode`` (``full`` | ``changes`` | ``skipped``: another run held the lock),
    ``read`` documents asked about, ``updated`` documents whose scope changed (children included),
    ``unreadable`` ``{source_id: reason}`` (now readable by nobody), ``groups`` expanded,
    ``group_errors`` ``{group: reason}`` (those grant nothing), ``duration_s``."""

    source: str
    mode: str
    read: int = 0
    updated: int = 0
    unreadable: dict[str, str] = field(default_factory=dict)
    groups: int = 0
    group_errors: dict[str, str] = field(default_factory=dict)
    duration_s: float = 0.0

    def summary(self) -> dict[str, object]:
        """JSON-able counts (Dagster metadata, the CLI)."""
        return {"mode": self.mode, "read": self.read, "updated": self.updated, "unreadable": len(self.unreadable),
                "groups": self.groups, "group_errors": len(self.group_errors)}


def checked_scope(scope: Scope | None) -> Scope:
    """``scope`` with every principal validated (``parse_principal``); a missing scope, a malformed
    principal or more than ``MAX_PRINCIPALS`` make the whole scope unreadable (never a partial grant)."""
    if scope is None:
        return Scope.unreadable("the source returned no permissions for this document")
    if scope.error:
        return Scope.unreadable(scope.error[:1000])
    if len(scope.principals) > MAX_PRINCIPALS:
        return Scope.unreadable(f"more than {MAX_PRINCIPALS} principals")
    try:
        return Scope.of({parse_principal(p) for p in scope.principals})
    except (ValueError, TypeError, AttributeError) as exc:
        return Scope.unreadable(f"malformed principal from the source: {str(exc)[:MAX_PRINCIPAL_CHARS]}")


def apply_scopes(conn: psycopg.Connection, source: str, scopes: Mapping[str, Scope]) -> int:
    """Write ``scopes`` (``{source_id: Scope}``, each passed through ``checked_scope``) of ``source``'s
    documents and copy each parent's scope to every child of the source that differs from it, in one transaction. Returns the number of rows
    (parents and children) whose scope or error changed; the others only get ``permissions_synced_at``."""
    if not scopes:
        return 0
    ids = sorted(scopes)
    checked = [checked_scope(scopes[i]) for i in ids]
    given = (ids, [_SEP.join(sorted(s.principals)) for s in checked], [s.error for s in checked])
    with conn.transaction():
        changed = conn.execute(
            """
            WITH given AS (
                SELECT g.source_id, g.error,
                       CASE WHEN g.joined = '' THEN '{}'::text[] ELSE string_to_array(g.joined, %(sep)s) END AS p
                FROM unnest(%(ids)s::text[], %(joined)s::text[], %(errors)s::text[]) AS g(source_id, joined, error))
            UPDATE documents d SET principals = g.p, permissions_error = g.error, permissions_synced_at = now()
              FROM given g
             WHERE d.source = %(source)s AND d.source_id = g.source_id
               AND (d.principals IS DISTINCT FROM g.p OR d.permissions_error IS DISTINCT FROM g.error)
            RETURNING d.id
            """, {"sep": _SEP, "ids": given[0], "joined": given[1], "errors": given[2], "source": source}).fetchall()
        conn.execute("UPDATE documents SET permissions_synced_at = now() WHERE source = %s AND source_id = ANY(%s)",
                     (source, ids))
        children = conn.execute(
            """
            UPDATE documents c SET principals = p.principals, permissions_error = p.permissions_error,
                                   permissions_synced_at = now()
              FROM documents p
             WHERE c.parent_id = p.id AND p.source = %s
               AND (c.principals IS DISTINCT FROM p.principals OR c.permissions_error IS DISTINCT FROM p.permissions_error)
            RETURNING c.id
            """, (source,)).fetchall()
    return len(changed) + len(children)


def _documents_to_read(conn: psycopg.Connection, source: str, changed_ids: Collection[str] | None) -> list[SourceDocument]:
    """Live top-level documents of ``source``: all, or those in ``changed_ids`` plus those never read or
    last unreadable."""
    rows = conn.execute(
        """
        SELECT source_id, title, uri, mime_type, modified_at, COALESCE(seen_source_version, source_version), metadata
        FROM documents
        WHERE source = %s AND status <> 'deleted' AND parent_id IS NULL
          AND (%s::text[] IS NULL OR source_id = ANY(%s::text[]) OR permissions_synced_at IS NULL
               OR permissions_error IS NOT NULL)
        ORDER BY source_id
        """, (source, None if changed_ids is None else sorted(changed_ids),
              None if changed_ids is None else sorted(changed_ids))).fetchall()
    return [SourceDocument(source_id=r[0], title=r[1] or r[0], uri=r[2] or "", mime_type=r[3], modified_at=r[4],
                           source_version=r[5], metadata=dict(r[6] or {})) for r in rows]


def read_scopes(source, documents: Sequence[SourceDocument]) -> dict[str, Scope]:
    """``{source_id: Scope}`` for ``documents`` from ``source`` (see module docstring): one call per
    ``BATCH``; a call that raises ``SourceError`` makes its batch unreadable with the error as reason. Every
    scope is passed through ``checked_scope`` (a missing or malformed one is unreadable)."""
    out: dict[str, Scope] = {}
    reader = getattr(source, "permissions", None)
    if reader is None:
        default = getattr(source, "default_principals", None)
        scope = (Scope.of(default) if default is not None else
                 Scope.unreadable(f"source {source.name} carries no permissions and no default scope "
                                  "(its default_principals) is configured"))
        return {d.source_id: checked_scope(scope) for d in documents}
    for start in range(0, len(documents), BATCH):
        batch = list(documents[start:start + BATCH])
        try:
            got = reader(batch)
        except SourceError as exc:
            reason = f"permission read failed: {exc}"
            got = {d.source_id: Scope.unreadable(reason) for d in batch}
        for d in batch:
            out[d.source_id] = checked_scope(got.get(d.source_id) if isinstance(got, Mapping) else None)
    return out


def sync_permissions(source, conn: psycopg.Connection, settings: Settings | None = None, *,
                     full: bool = False, wait: bool = True) -> PermissionReport:
    """Bring ``source``'s scopes and groups in the index up to date (module docstring). ``full``: ignore the
    permission cursor and read every document. ``wait``: wait for a concurrent permission sync of the
    source (else return ``mode="skipped"``). ``settings`` is accepted for symmetry with the content sync."""
    started = time.perf_counter()
    name = source.name
    with source_lock(conn, permission_cursor_key(name), wait=wait) as held:
        if held is None:
            return PermissionReport(name, "skipped")
        cursor = None if full else idx.get_cursor(conn, permission_cursor_key(name))
        changed_ids: list[str] | None = None
        next_cursor: str | None = None
        feed = getattr(source, "permission_changes", None)
        if feed is not None:
            try:
                changes = feed(cursor)
                changed_ids, next_cursor = changes.changed_ids, changes.next_cursor
            except SourceError as exc:
                log.warning("%s: permission change feed failed (%s): reading every document", name, exc)
                changed_ids, next_cursor = None, None
        documents = _documents_to_read(conn, name, changed_ids)
        scopes = read_scopes(source, documents)
        report = PermissionReport(name, "full" if changed_ids is None else "changes", read=len(documents))
        report.updated = apply_scopes(conn, name, scopes)
        report.unreadable = {i: s.error for i, s in scopes.items() if s.error}
        if report.unreadable:
            log.warning("%s: permissions of %d document(s) could not be read: readable by nobody until they can",
                        name, len(report.unreadable))
        if getattr(source, "group_members", None) is not None:
            named = groups_in({r[0]: r[1] for r in conn.execute(
                "SELECT source_id, principals FROM documents WHERE source = %s AND status <> 'deleted'",
                (name,)).fetchall()})
            expansion = read_groups(source, named)
            store_groups(conn, name, expansion)
            report.groups = len(expansion.closure)
            report.group_errors = dict(expansion.errors)
            if expansion.errors:
                log.warning("%s: %d group(s) could not be read: they grant nothing until they can", name,
                            len(expansion.errors))
        if next_cursor:
            idx.save_cursor(conn, permission_cursor_key(name), next_cursor)
        report.duration_s = time.perf_counter() - started
        return report
