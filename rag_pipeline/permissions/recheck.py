"""Re-check: before hits are returned, ask each hit's source whether the caller may still read it.

Permission changes reach an index with a delay (the permission sync's interval); for sensitive corpora a
query can pass ``recheck=True`` and each hit's document (its parent for an attachment) is read again with
``source.permissions``. A hit is kept only when the fresh scope names the caller (directly, or through a
group whose members, read again from the source, still include the caller);
a source that is not configured here, cannot answer, or answers with an error drops the hit (fail
closed). The fresh scope (``sync.apply_scopes``) and the fresh members of the groups it read
(``groups.store_groups``) are written into the index, so the next query of anyone sees them at once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import psycopg

from rag_pipeline.permissions.groups import is_group, read_groups, store_groups
from rag_pipeline.permissions.principals import implied
from rag_pipeline.permissions.sync import apply_scopes, read_scopes
from rag_pipeline.sources.base import Scope, SourceDocument

log = logging.getLogger(__name__)


def recheck_hits(conn: psycopg.Connection, hits: Sequence, readable: Sequence[str] | None,
                 sources: Mapping[str, object], given: Sequence[str] = ()) -> tuple[list, list[int]]:
    """``(kept hits, dropped document ids)``. ``hits``: ``retrieval.Hit``s; ``readable``: the caller's
    expanded principals (``None``: an admin, who keeps every hit whose source still answers); ``given``:
    the caller's own principals (before group expansion); ``sources``: connector by source name.

    A hit the caller reads directly (themselves, ``everyone``, their domain) is kept on the fresh scope
    alone; one the caller reads only through groups is kept only when a fresh read of those groups'
    members (``groups.read_groups``) still contains the caller."""
    ids = sorted({h.document_id for h in hits})
    rows = conn.execute(
        """
        SELECT d.id, d.source, top.source_id, top.title, top.uri, top.mime_type, top.metadata
        FROM documents d JOIN documents top ON top.id = COALESCE(d.parent_id, d.id)
        WHERE d.id = ANY(%s)
        """, (ids,)).fetchall()
    verdict: dict[int, bool] = {}
    by_source: dict[str, dict[str, SourceDocument]] = {}
    for doc_id, source, sid, title, uri, mime, metadata in rows:
        by_source.setdefault(source, {})[sid] = SourceDocument(source_id=sid, title=title or sid, uri=uri or "",
                                                              mime_type=mime, metadata=dict(metadata or {}))
    fresh: dict[tuple[str, str], Scope] = {}
    for source, docs in by_source.items():
        connector = sources.get(source)
        if connector is None:
            log.warning("re-check: source %s is not configured here: its hits are dropped", source)
            scopes = {sid: Scope.unreadable("source not configured for the re-check") for sid in docs}
        else:
            scopes = read_scopes(connector, list(docs.values()))
            apply_scopes(conn, source, scopes)
        for sid, scope in scopes.items():
            fresh[(source, sid)] = scope
    mine = None if readable is None else set(readable)
    base = implied(given)
    membership: dict[tuple[str, frozenset[str]], bool] = {}
    for doc_id, source, sid, *_ in rows:
        scope = fresh.get((source, sid)) or Scope.unreadable("not re-checked")
        if scope.error is not None:
            verdict[doc_id] = False
        elif mine is None or scope.principals & base:
            verdict[doc_id] = True
        else:
            via = frozenset(g for g in scope.principals & mine if is_group(g))
            if (source, via) not in membership:
                reader = sources[source]
                expansion = (read_groups(reader, via) if via and getattr(reader, "group_members", None) is not None
                             else None)
                if expansion is not None:
                    store_groups(conn, source, expansion, only=via)  # the index learns the fresh membership
                membership[(source, via)] = bool(expansion) and any(
                    base & expansion.closure.get(g, set()) for g in via if g not in expansion.errors)
            verdict[doc_id] = membership[(source, via)]
    kept = [h for h in hits if verdict.get(h.document_id, False)]
    dropped = sorted({h.document_id for h in hits if not verdict.get(h.document_id, False)})
    if dropped:
        log.info("re-check dropped %d document(s) the caller may no longer read", len(dropped))
    return kept, dropped
