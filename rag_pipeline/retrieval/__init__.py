"""Retrieval: top-k chunks by cosine similarity that the caller may read, current versions only.

Every query names who asks: ``principals`` (expanded with ``everyone``, their e-mail domains and every
group that contains them, from ``group_members``), or ``admin=True`` for an unfiltered query; a query
with neither raises ``AccessDenied``. Only chunks of a document's current ``version`` of a non-deleted,
non-hidden document whose ``expires_at`` is unset or in the future, with a vector in the *active*
embedding generation (``store.generations``: the query text is embedded with that generation's model, so a
rollout never answers from part of the corpus), and whose scope (``documents.principals``) meets the
caller's expanded principals are eligible.

``search`` is the one query of the index (``query`` and ``benchmarks/bench_permissions.py`` call it):

* a caller who can read fewer than ``EXACT_BELOW_DOCUMENTS`` documents and ``EXACT_BELOW_CHUNKS`` chunks
  gets an exact answer (those documents' chunks, found through the GIN index on ``documents.principals``,
  ranked by distance);
* otherwise pgvector's HNSW index with its iterative scan (``hnsw.iterative_scan = relaxed_order``,
  re-ordered by distance), so a filter keeps scanning instead of returning fewer rows; should it still
  come back short of ``k`` (the scan's ``hnsw.max_scan_tuples`` reached), the exact query answers.

So a query returns exactly ``min(k, eligible chunks)`` rows. ``query`` logs every query to
``retrieval_log``: the principals, how many of the unfiltered top-k the permission filter removed, and
with ``recheck=True`` how many hits the source's fresh answer dropped (``rag_pipeline.permissions``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import psycopg

from rag_pipeline.config import Settings
from rag_pipeline.embedding.base import Embedder
from rag_pipeline.store import generations as gens
from rag_pipeline.store.db import Store
from rag_pipeline.store.generations import Generation


def _settings() -> Settings:
    from rag_pipeline.config import get_settings

    return get_settings()

EXACT_BELOW_DOCUMENTS = 2000
"""A caller who can read fewer documents than this (and fewer than ``EXACT_BELOW_CHUNKS`` chunks) is answered
by an exact scan of their chunks."""
EXACT_BELOW_CHUNKS = 10_000
"""The exact path's cost grows with the readable chunks (about 3 µs each on 2 cores,
``benchmarks/bench_permissions.py``): above this, the HNSW path answers."""
EF_SEARCH = 400
"""``hnsw.ef_search`` of the approximate path (at least ``4 * k``, at most ``MAX_EF_SEARCH``)."""
MAX_EF_SEARCH = 1000
"""pgvector's upper bound for ``hnsw.ef_search``; a larger ``k`` relies on the iterative scan (and the
exact fallback) for its rows."""

_VISIBLE = """d.status IN ('completed', 'failed', 'permanently_failed', 'pending')
  AND d.deleted_at IS NULL AND d.hidden_reason IS NULL
  AND (d.expires_at IS NULL OR d.expires_at > now())
  AND (%(source)s::text IS NULL OR d.source = %(source)s::text)"""
_READABLE = "(%(readable)s::text[] IS NULL OR d.principals && %(readable)s::text[])"
_COLUMNS = """c.id, d.id, d.source, d.source_id, d.title, d.uri, c.version, c.ordinal, c.pages, c.heading_path,
  c.text, e.embedding <=> %(v)s, d.modified_at,
  EXTRACT(EPOCH FROM now() - COALESCE(d.modified_at, d.ingested_at, d.created_at))"""


class AccessDenied(PermissionError):
    """A query named no principal and did not say it is an admin query."""


@dataclass(frozen=True)
class Hit:
    """One ranked chunk: ``score`` is cosine similarity in [-1, 1] (higher is closer); ``version`` the
    document version the chunk belongs to (always the indexed one); ``age_s`` seconds since the
    document's ``modified_at`` (or ingest time when unknown)."""

    chunk_id: str
    document_id: int
    source: str
    source_id: str
    title: str | None
    uri: str | None
    version: int
    ordinal: int
    pages: list[int]
    heading_path: list[str]
    text: str
    score: float
    modified_at: datetime | None
    age_s: float


@dataclass(frozen=True)
class SearchResult:
    """``hits`` best first; ``strategy``: ``exact`` | ``hnsw`` | ``hnsw+exact`` (the approximate scan came
    back short and the exact query answered)."""

    hits: list[Hit]
    strategy: str


def _hits(rows: Sequence[tuple]) -> list[Hit]:
    return [Hit(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], list(r[8]), list(r[9]), r[10], 1.0 - float(r[11]),
                r[12], float(r[13])) for r in rows]


def search(conn: psycopg.Connection, vector: np.ndarray, *, k: int, readable: Sequence[str] | None,
           source: str | None = None, generation: Generation | None = None, exact_below: int = EXACT_BELOW_DOCUMENTS,
           exact_below_chunks: int = EXACT_BELOW_CHUNKS, ef_search: int = EF_SEARCH) -> SearchResult:
    """The top ``k`` eligible chunks nearest ``vector`` (float32, ``generation``'s dimension) by cosine
    distance, in ``generation``'s vectors (default: the active generation).

    ``readable``: the caller's *expanded* principals (``permissions.groups.expand``), or ``None`` for an
    admin (no permission filter). ``exact_below`` / ``exact_below_chunks``: answer exactly when fewer
    documents and chunks are readable (``exact_below=0``: never). Statements are never prepared (a generic
    plan would lose the per-caller choice of index). Runs in its own transaction (``SET LOCAL``); raises
    only database errors."""
    g = generation or gens.active(conn)
    params = {"v": gens.to_sql_vector(g, vector), "source": source, "k": k,
              "readable": list(readable) if readable is not None else None}
    with conn.transaction():
        if readable is not None and exact_below > 0:
            n, chunks = conn.execute(
                "SELECT count(*), COALESCE(sum(chunk_count), 0) FROM (SELECT d.chunk_count FROM documents d "
                "WHERE d.principals && %(readable)s::text[] AND d.deleted_at IS NULL AND d.hidden_reason IS NULL "
                "AND (%(source)s::text IS NULL OR d.source = %(source)s::text) LIMIT %(limit)s) s",
                {**params, "limit": exact_below}, prepare=False).fetchone()
            if n < exact_below and chunks < exact_below_chunks:
                return SearchResult(_exact(conn, g, params), "exact")
        conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        conn.execute("SET LOCAL hnsw.ef_search = %d" % min(MAX_EF_SEARCH, max(int(ef_search), 4 * k)))
        rows = conn.execute(
            f"""
            WITH nearest AS MATERIALIZED (
                SELECT {_COLUMNS}
                FROM {g.table} e JOIN chunks c ON c.id = e.chunk_id
                JOIN documents d ON d.id = c.document_id AND d.version = c.version
                WHERE {_VISIBLE} AND {_READABLE}
                ORDER BY e.embedding <=> %(v)s
                LIMIT %(k)s)
            SELECT * FROM nearest ORDER BY 12
            """, params, prepare=False).fetchall()
        if len(rows) == k:
            return SearchResult(_hits(rows), "hnsw")
        return SearchResult(_exact(conn, g, params), "hnsw+exact")


def _exact(conn: psycopg.Connection, g: Generation, params: dict) -> list[Hit]:
    # "+ 0" keeps the planner off the HNSW index: every eligible chunk is ranked.
    return _hits(conn.execute(
        f"""
        SELECT {_COLUMNS}
        FROM documents d JOIN chunks c ON c.document_id = d.id AND c.version = d.version
        JOIN {g.table} e ON e.chunk_id = c.id
        WHERE {_VISIBLE} AND {_READABLE}
        ORDER BY (e.embedding <=> %(v)s) + 0
        LIMIT %(k)s
        """, params, prepare=False).fetchall())


def query(store: Store, embedder: Embedder, text: str, *, k: int = 5, source: str | None = None,
          principals: Sequence[str] | None = None, admin: bool = False, recheck: bool = False,
          sources: Mapping[str, object] | None = None, settings: Settings | None = None) -> list[Hit]:
    """Return up to ``k`` ``Hit``s for ``text`` that the caller may read (ranked, best first) and log the query.

    The text is embedded with the active generation's embedder: ``embedder`` (the configured one) when it
    is that generation's model, else one built from the generation's recorded settings over ``settings``
    (default ``config.get_settings()``): during a rollout and after a rollback queries keep the active model.

    ``principals``: who asks (``permissions.principals.parse_principal`` forms; a bare e-mail is a user);
    ``admin``: an unfiltered query (still current, visible versions only). ``recheck``: ask each hit's
    source (``sources``: connector by source name; a hit whose source is not there, or whose source
    cannot answer, is dropped: fail closed) whether the caller may still read it, drop those it may not,
    and write the source's answer into the index (``permissions.sync.apply_scopes``). ``source``
    restricts to one source. Raises ``AccessDenied`` with neither ``principals`` nor ``admin``,
    ``ValueError`` for ``k < 1``, empty text or an invalid principal."""
    from rag_pipeline.permissions import expand, parse_principal, recheck_hits

    if k < 1:
        raise ValueError("k must be at least 1")
    if not text.strip():
        raise ValueError("query text is empty")
    given = [parse_principal(p) for p in (principals or [])]
    if not given and not admin:
        raise AccessDenied("a query must name the principal it runs as (or say it is an admin query)")
    started = time.perf_counter()
    with store.connection() as conn:
        g, query_embedder = gens.query_embedder(conn, settings or _settings(), embedder)
        vector = np.asarray(query_embedder.embed([text])[0], dtype=np.float32)
        readable = None if admin else sorted(expand(conn, given))
        result = search(conn, vector, k=k, readable=readable, source=source, generation=g)
        hits = result.hits
        filtered = None
        if readable is not None:
            unfiltered = search(conn, vector, k=k, readable=None, source=source, generation=g)
            ids = sorted({h.document_id for h in unfiltered.hits})
            hidden = {r[0] for r in conn.execute(
                "SELECT id FROM documents WHERE id = ANY(%s) AND NOT principals && %s::text[]",
                (ids, readable)).fetchall()}
            filtered = sum(1 for h in unfiltered.hits if h.document_id in hidden)
        dropped: list[int] = []
        if recheck and hits:
            hits, dropped = recheck_hits(conn, hits, readable, sources or {}, given)
        conn.execute(
            """
            INSERT INTO retrieval_log (query, k, embedding_model, chunk_ids, scores, document_ids, versions,
                                       document_ages_s, duration_ms, principals, admin, filtered_count,
                                       recheck_dropped, recheck_dropped_ids, generation)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            """,
            (text.replace("\x00", ""), k, g.model, [h.chunk_id for h in hits], [h.score for h in hits],
             [h.document_id for h in hits], [h.version for h in hits], [h.age_s for h in hits],
             int((time.perf_counter() - started) * 1000), given, admin, filtered,
             len(dropped) if recheck else None, dropped if recheck else None, g.id),
        )
    return hits


__all__ = ["EXACT_BELOW_CHUNKS", "EXACT_BELOW_DOCUMENTS", "AccessDenied", "Hit", "SearchResult", "query", "search"]
