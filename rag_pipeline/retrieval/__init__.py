"""Retrieval: top-k chunks by cosine similarity, current versions only, expired documents excluded;
every query and what it returned is written to ``retrieval_log``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from rag_pipeline.embedding.base import Embedder
from rag_pipeline.store.db import Store


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


def query(store: Store, embedder: Embedder, text: str, *, k: int = 5, source: str | None = None) -> list[Hit]:
    """Return up to ``k`` ``Hit``s for ``text`` (ranked, best first) and log the query.

    Only chunks of a document's current ``version`` of a non-deleted document whose ``expires_at`` is
    unset or in the future are eligible; ``source`` restricts to one source. pgvector's iterative
    HNSW scan keeps filtered queries from returning fewer than ``k`` rows. Raises ``ValueError`` for
    ``k < 1`` or empty text.
    """
    if k < 1:
        raise ValueError("k must be at least 1")
    if not text.strip():
        raise ValueError("query text is empty")
    started = time.perf_counter()
    vector = np.asarray(embedder.embed([text])[0], dtype=np.float32)
    with store.connection() as conn:
        with conn.transaction():
            conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
            conn.execute("SET LOCAL hnsw.ef_search = %s" % max(40, 4 * k))
            rows = conn.execute(
                """
                SELECT c.id, d.id, d.source, d.source_id, d.title, d.uri, c.version, c.ordinal, c.pages,
                       c.heading_path, c.text, 1 - (c.embedding <=> %(v)s) AS score, d.modified_at,
                       EXTRACT(EPOCH FROM now() - COALESCE(d.modified_at, d.ingested_at, d.created_at))
                FROM chunks c JOIN documents d ON d.id = c.document_id AND d.version = c.version
                WHERE d.status IN ('completed', 'failed', 'permanently_failed', 'pending')
                  AND d.deleted_at IS NULL
                  AND (d.expires_at IS NULL OR d.expires_at > now())
                  AND c.embedding_model = %(model)s
                  AND (%(source)s::text IS NULL OR d.source = %(source)s::text)
                ORDER BY c.embedding <=> %(v)s
                LIMIT %(k)s
                """,
                {"v": vector, "model": embedder.model_id, "source": source, "k": k},
            ).fetchall()
        hits = [Hit(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], list(r[8]), list(r[9]), r[10], float(r[11]),
                    r[12], float(r[13])) for r in rows]
        conn.execute(
            """
            INSERT INTO retrieval_log (query, k, embedding_model, chunk_ids, scores, document_ids, versions,
                                       document_ages_s, duration_ms)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
            """,
            (text.replace("\x00", ""), k, embedder.model_id, [h.chunk_id for h in hits], [h.score for h in hits],
             [h.document_id for h in hits], [h.version for h in hits], [h.age_s for h in hits],
             int((time.perf_counter() - started) * 1000)),
        )
    return hits


__all__ = ["Hit", "query"]
