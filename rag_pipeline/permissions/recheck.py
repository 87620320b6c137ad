"""Re-check: before hits are returned, ask each hit's source whether the caller may still read it.

Permission changes reach an index with a delay (the permission sync's interval); for sensitive corpora a
query can pass ``recheck=True`` and each hit's document (its parent for an attachment) is read again with
``source.permissions``. A hit is kept only when the fresh scope meets the caller's expanded principals;
a source that is not configured here, cannot answer, or answers with an error drops the hit (fail
closed). The fresh scope is written into the index (``sync.apply_scopes``), so the next query of anyone
sees it at once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import psycopg

from rag_pipeline.permissions.sync import apply_scopes, checked_scope, read_scopes
from rag_pipeline.sources.base import Scope, SourceDocument

log = logging.getLogger(__name__)


def recheck_hits(conn: psycopg.Connection, hits: Sequence, readable: Sequence[str] | None,
                 sources: Mapping[str, object]) -> tuple[list, list[int]]:
    """``(kept hits, dropped document ids)``. ``hits``: ``retrieval.Hit``s; ``readable``: the caller's
    expanded principals (``None``: an admin, who keeps every hit whose source still answers);
    ``sources``: connector by source name."""
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
            scopes = {sid: checked_scope(s) for sid, s in read_scopes(connector, list(docs.values())).items()}
            apply_scopes(conn, source, scopes)
        for sid, scope in scopes.items():
            fresh[(source, sid)] = scope
    mine = None if readable is None else set(readable)
    for doc_id, source, sid, *_ in rows:
        scope = fresh.get((source, sid)) or Scope.unreadable("not re-checked")
        verdict[doc_id] = scope.error is None and (mine is None or bool(scope.principals & mine))
    kept = [h for h in hits if verdict.get(h.document_id, False)]
    dropped = sorted({h.document_id for h in hits if not verdict.get(h.document_id, False)})
    if dropped:
        log.info("re-check dropped %d document(s) the caller may no longer read", len(dropped))
    return kept, dropped
