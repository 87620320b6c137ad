"""Embedding generations: the vectors of one embedding model, in a table of their own, beside the others.

A *generation* is one (model, dimension) the index holds vectors for: a row of ``embedding_generations``
and a table ``chunk_embeddings_<id>`` (``chunk_id`` -> ``embedding``, one row per chunk of the current
versions, deleted with its chunk) with its own HNSW index. ``storage`` is pgvector's ``vector`` up to
``MAX_VECTOR_DIMENSION`` (2,000) dimensions and ``halfvec`` (16-bit floats) up to ``MAX_HALFVEC_DIMENSION``
(4,000): the limits of pgvector's HNSW index; a larger dimension is refused (``DimensionError``) before any
DDL: truncate with ``RAG_EMBEDDING_DIMENSIONS`` (models trained for it) or pick another model.

States: ``building`` (created for a newly configured model, filled by ``rag-pipeline reembed`` / the
Dagster backfill / the syncs), ``active`` (exactly one: every query reads it), ``retired`` (the previous
active one, kept as the rollback target until ``drop_after``: ``RAG_GENERATION_KEEP_DAYS``), ``dropped``
(table gone). Every write of a document goes to every *kept* generation (building, active, retired), so
the rollback target is as current as the active one; ``documents.generations`` lists the generations that
hold the vectors of the document's current version (written in the same transaction as the vectors).

A generation becomes active only when it is complete: every current document (a ``version`` > 0, not
deleted) lists it (``activate``: one transaction, under a lock on the generations table; the previous
active one becomes ``retired``). ``activate`` also rolls back: a retired generation that is complete can
be made active again.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import psycopg

MAX_VECTOR_DIMENSION = 2000
"""Largest dimension stored as ``vector`` (pgvector's HNSW limit for ``vector``)."""
MAX_HALFVEC_DIMENSION = 4000
"""Largest dimension stored at all, as ``halfvec`` (pgvector's HNSW limit for ``halfvec``)."""
STATES = ("building", "active", "retired", "dropped")
KEPT = ("building", "active", "retired")
LOCK_KEY = 0x6A17E7A1
"""Transaction advisory lock: held exclusively while a generation is created, activated or dropped, shared
by every write of vectors (``store.write``), so a write sees one set of kept generations from start to end."""


class DimensionError(ValueError):
    """The embedding dimension cannot be stored and indexed (over ``MAX_HALFVEC_DIMENSION``, or < 1)."""


class GenerationError(RuntimeError):
    """A generation operation is not possible now (incomplete, unknown, dropped); the message says why."""


def storage_for(dimension: int) -> str:
    """``vector`` or ``halfvec`` for ``dimension``; raises ``DimensionError`` (before any DDL) otherwise."""
    if not isinstance(dimension, int) or dimension < 1:
        raise DimensionError(f"embedding dimension {dimension!r} is not a positive integer")
    if dimension <= MAX_VECTOR_DIMENSION:
        return "vector"
    if dimension <= MAX_HALFVEC_DIMENSION:
        return "halfvec"
    raise DimensionError(
        f"embedding dimension {dimension:,} is over {MAX_HALFVEC_DIMENSION:,}, the most pgvector's HNSW index holds "
        f"(as halfvec): set RAG_EMBEDDING_DIMENSIONS to {MAX_HALFVEC_DIMENSION:,} or less to truncate the vectors (for "
        "models trained for it, e.g. qwen3-embedding, text-embedding-3-*) or choose another model")


@dataclass(frozen=True)
class Generation:
    """One ``embedding_generations`` row. ``spec``: the non-secret embedding settings the generation was
    created with (``RAG_EMBEDDING_*`` but the key), enough to rebuild its embedder."""

    id: int
    model: str
    dimension: int
    storage: str
    state: str
    spec: dict[str, Any]
    created_at: datetime
    activated_at: datetime | None
    retired_at: datetime | None
    drop_after: datetime | None

    @property
    def table(self) -> str:
        """The generation's vector table (a trusted identifier: built from the integer id)."""
        return f"chunk_embeddings_{int(self.id)}"

    @property
    def cast(self) -> str:
        """The SQL type a query vector is cast to: ``vector(d)`` or ``halfvec(d)``."""
        return f"{self.storage}({int(self.dimension)})"

    @property
    def opclass(self) -> str:
        return f"{self.storage}_cosine_ops"


_COLUMNS = "id, model, dimension, storage, state, spec, created_at, activated_at, retired_at, drop_after"


def _row(r: Sequence[Any]) -> Generation:
    return Generation(int(r[0]), r[1], int(r[2]), r[3], r[4], dict(r[5] or {}), r[6], r[7], r[8], r[9])


SECRET_MARKERS = ("_key", "secret", "password", "access_token")
"""A setting whose name contains one of these is never recorded with a generation (``RAG_EMBEDDING_API_KEY``)."""


def spec_of(settings: Any) -> dict[str, Any]:
    """The non-secret embedding settings (``embedding_*`` fields of ``Settings`` whose name has none of
    ``SECRET_MARKERS``) recorded with a generation, to rebuild its embedder later."""
    return {k: v for k, v in settings.model_dump(mode="json").items()
            if k.startswith("embedding_") and not any(m in k for m in SECRET_MARKERS)}


def embedder_spec(embedder: Any, settings: Any) -> dict[str, Any]:
    """``spec_of(settings)``, with the model a sentence-transformers ``embedder`` really loads (its
    ``model_id`` is the bundled name or the local path), or an embedder's own ``settings_spec`` (a dict of
    settings that rebuild it) when it has one."""
    spec = spec_of(settings)
    own = getattr(embedder, "settings_spec", None)
    if isinstance(own, Mapping):
        spec.update(own)
    else:
        from rag_pipeline.embedding.sentence_transformers import SentenceTransformerEmbedder

        if isinstance(embedder, SentenceTransformerEmbedder):
            spec["embedding_model"] = embedder.model_id
    return spec


def ensure_for(conn: psycopg.Connection, embedder: Any, settings: Any) -> Generation:
    """``ensure`` for ``embedder`` (its model id, dimension and ``embedder_spec``)."""
    return ensure(conn, model=embedder.model_id, dimension=embedder.dimension, spec=embedder_spec(embedder, settings))


def activate_if_complete(conn: psycopg.Connection, model: str, *, keep_days: float) -> Generation | None:
    """Activate the ``building`` generation of ``model`` once it is complete (the end of a rollout); returns
    it, or ``None`` when there is none or it is not complete yet. A retired generation (rolled back from)
    is never activated again by this: only by an explicit ``activate``."""
    g = next((g for g in kept(conn) if g.model == model and g.state == "building"), None)
    if g is None or conn.execute(  # the cheap test first (every sync and document run of a rollout asks)
            "SELECT EXISTS (SELECT 1 FROM documents WHERE version > 0 AND deleted_at IS NULL "
            "AND NOT %s = ANY(generations))", (g.id,)).fetchone()[0]:
        return None
    try:
        return activate(conn, g.id, keep_days=keep_days)  # counts the chunks too, under the lock
    except GenerationError:  # not complete, or a document arrived without it since: a later run finishes
        return None


def table_ddl(generation_id: int, dimension: int, storage: str) -> list[str]:
    """The statements that create generation ``generation_id``'s table and HNSW index (used by migration
    0005 for the first generation and by ``create``)."""
    table = f"chunk_embeddings_{int(generation_id)}"
    return [
        f"CREATE TABLE {table} (chunk_id text PRIMARY KEY REFERENCES chunks(id) ON DELETE CASCADE, "
        f"embedding {storage}({int(dimension)}) NOT NULL)",
        f"CREATE INDEX {table}_hnsw ON {table} USING hnsw (embedding {storage}_cosine_ops)",
    ]


def all_generations(conn: psycopg.Connection) -> list[Generation]:
    """Every generation, oldest first (dropped ones included)."""
    return [_row(r) for r in conn.execute(f"SELECT {_COLUMNS} FROM embedding_generations ORDER BY id").fetchall()]


def kept(conn: psycopg.Connection) -> list[Generation]:
    """The generations every write goes to (building, active, retired), oldest first."""
    return [g for g in all_generations(conn) if g.state in KEPT]


def active(conn: psycopg.Connection) -> Generation:
    """The active generation; raises ``GenerationError`` when there is none (an index never opened)."""
    row = conn.execute(f"SELECT {_COLUMNS} FROM embedding_generations WHERE state = 'active'").fetchone()
    if row is None:
        raise GenerationError("the index has no active embedding generation (open it with Store.open first)")
    return _row(row)


def get(conn: psycopg.Connection, generation_id: int) -> Generation:
    """Generation ``generation_id``; raises ``GenerationError`` when there is no such generation."""
    row = conn.execute(f"SELECT {_COLUMNS} FROM embedding_generations WHERE id = %s", (generation_id,)).fetchone()
    if row is None:
        raise GenerationError(f"no embedding generation {generation_id}")
    return _row(row)


def ensure(conn: psycopg.Connection, *, model: str, dimension: int, spec: Mapping[str, Any]) -> Generation:
    """The kept generation of ``model`` (checked to have ``dimension``), created when there is none: active
    when the index has no active generation (a new index), else ``building`` beside the active one.

    Raises ``DimensionError`` for a dimension that cannot be stored (before any DDL) and
    ``GenerationError`` when ``model`` has a kept generation of another dimension."""
    storage = storage_for(dimension)
    for g in kept(conn):
        if g.model == model:
            if g.dimension != dimension:
                raise GenerationError(f"generation {g.id} of model {model!r} has {g.dimension} dimensions, the "
                                      f"configured embedder {dimension}: a model id names one dimension")
            return g
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        again = next((g for g in kept(conn) if g.model == model), None)
        if again is not None:
            return again
        state = "building" if conn.execute(
            "SELECT 1 FROM embedding_generations WHERE state = 'active'").fetchone() else "active"
        new_id = int(conn.execute(
            "INSERT INTO embedding_generations (model, dimension, storage, state, spec, activated_at) "
            "VALUES (%s, %s, %s, %s, %s, CASE WHEN %s = 'active' THEN now() END) RETURNING id",
            (model, dimension, storage, state, json.dumps(dict(spec)), state)).fetchone()[0])
        for statement in table_ddl(new_id, dimension, storage):
            conn.execute(statement)
    return get(conn, new_id)


@dataclass(frozen=True)
class Progress:
    """How far generation ``generation`` is: ``documents`` current documents (version > 0, not deleted) of
    which ``documents_done`` hold it; ``chunks`` chunk rows of those current versions, ``chunks_done`` of
    them with a vector in it."""

    generation: int
    documents: int
    documents_done: int
    chunks: int
    chunks_done: int

    @property
    def complete(self) -> bool:
        return self.documents_done == self.documents and self.chunks_done == self.chunks


def progress(conn: psycopg.Connection, g: Generation) -> Progress:
    """``Progress`` of ``g`` (one pass over the current documents and their chunk rows)."""
    docs, done = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE %s = ANY(generations)) FROM documents "
        "WHERE version > 0 AND deleted_at IS NULL", (g.id,)).fetchone()
    chunks, chunks_done = conn.execute(
        f"SELECT count(c.id), count(e.chunk_id) FROM documents d JOIN chunks c ON c.document_id = d.id "
        f"AND c.version = d.version LEFT JOIN {g.table} e ON e.chunk_id = c.id "
        "WHERE d.version > 0 AND d.deleted_at IS NULL").fetchone()
    return Progress(g.id, int(docs), int(done), int(chunks), int(chunks_done))


def activate(conn: psycopg.Connection, generation_id: int, *, keep_days: float) -> Generation:
    """Make generation ``generation_id`` the one queries read, in one transaction: it must be kept and
    complete (``progress``); the previous active one becomes ``retired`` until ``keep_days`` days from now
    (the rollback target). Returns the activated generation; activating the active one changes nothing.
    Raises ``GenerationError`` (incomplete, dropped, unknown)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        g = get(conn, generation_id)
        if g.state == "active":
            return g
        if g.state not in KEPT:
            raise GenerationError(f"generation {g.id} ({g.model}) was dropped: build it again with rag-pipeline reembed")
        # documents of this transaction's snapshot; a write that commits later goes to every kept generation
        p = progress(conn, g)
        if not p.complete:
            raise GenerationError(
                f"generation {g.id} ({g.model}) is not complete: {p.documents_done:,} of {p.documents:,} documents, "
                f"{p.chunks_done:,} of {p.chunks:,} chunks; run rag-pipeline reembed to fill it")
        conn.execute("UPDATE embedding_generations SET state = 'retired', retired_at = now(), "
                     "drop_after = now() + make_interval(secs => %s) WHERE state = 'active'",
                     (float(keep_days) * 86400,))
        conn.execute("UPDATE embedding_generations SET state = 'active', activated_at = now(), retired_at = NULL, "
                     "drop_after = NULL WHERE id = %s", (g.id,))
    return get(conn, generation_id)


def drop_expired(conn: psycopg.Connection, *, now: datetime | None = None) -> list[Generation]:
    """Drop every retired generation past its ``drop_after`` (its table goes; the row stays as ``dropped``)
    and return them."""
    dropped = []
    for g in kept(conn):
        if g.state != "retired" or g.drop_after is None:
            continue
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
            row = conn.execute("SELECT 1 FROM embedding_generations WHERE id = %s AND state = 'retired' AND "
                               "drop_after <= COALESCE(%s, now())", (g.id, now)).fetchone()
            if row is None:
                continue
            conn.execute(f"DROP TABLE IF EXISTS {g.table}")
            conn.execute("UPDATE embedding_generations SET state = 'dropped', drop_after = NULL WHERE id = %s", (g.id,))
            conn.execute("UPDATE documents SET generations = array_remove(generations, %s) WHERE %s = ANY(generations)",
                         (g.id, g.id))
            dropped.append(g)
    return dropped


_BUILT: dict[tuple[int, str], Any] = {}
_BUILT_LOCK = threading.Lock()


def embedder_for(g: Generation, settings: Any, configured: Any = None) -> Any:
    """The embedder (``rag_pipeline.embedding.Embedder``) of generation ``g``: ``configured`` when it embeds
    ``g``'s model, else one built from ``g.spec`` over ``settings`` (cached per process). Raises
    ``EmbeddingError`` when it cannot be built or its model id or dimension differ from the generation's."""
    if configured is not None and configured.model_id == g.model:
        return configured
    key = (g.id, g.model)
    with _BUILT_LOCK:
        hit = _BUILT.get(key)
    if hit is not None:
        return hit
    from rag_pipeline.embedding import get_embedder
    from rag_pipeline.embedding.base import EmbeddingError

    try:
        known = type(settings).model_fields
        update = {k: v for k, v in g.spec.items() if k in known}
        if "embedding_model" not in update:  # recorded without settings (migration 0005, an older migrate call):
            # those indexes were built by sentence-transformers, whose model id is the model name or path
            update["embedding_model"] = g.model
            if "embedding_provider" in known:
                update["embedding_provider"] = "sentence-transformers"
        emb = get_embedder(settings.model_copy(update=update))
    except Exception as exc:  # noqa: BLE001 - any construction failure: this generation cannot be embedded now
        raise EmbeddingError(f"embedder of generation {g.id} ({g.model}) cannot be built: {type(exc).__name__}: "
                             f"{exc}") from None
    if emb.model_id != g.model or emb.dimension != g.dimension:
        raise EmbeddingError(f"generation {g.id} holds {g.model} ({g.dimension} dimensions) but its recorded "
                             f"settings build {emb.model_id} ({emb.dimension})")
    with _BUILT_LOCK:
        _BUILT.setdefault(key, emb)
    return emb


def query_embedder(conn: psycopg.Connection, settings: Any, embedder: Any) -> tuple[Generation, Any]:
    """The active generation and the embedder a query text must be embedded with to search it (the
    configured one, or the active generation's own during a rollout or after a rollback)."""
    g = active(conn)
    return g, embedder_for(g, settings, embedder)


def drop(conn: psycopg.Connection, generation_id: int) -> Generation:
    """Drop a generation now (its table goes; the row stays as ``dropped``): one being built that is not
    wanted any more (its model abandoned, its endpoint gone), or a rollback target before its time. Raises
    ``GenerationError`` for the active one or an unknown id."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        g = get(conn, generation_id)
        if g.state == "active":
            raise GenerationError(f"generation {g.id} ({g.model}) is the active one: activate another first")
        if g.state == "dropped":
            return g
        conn.execute(f"DROP TABLE IF EXISTS {g.table}")
        conn.execute("UPDATE embedding_generations SET state = 'dropped', drop_after = NULL WHERE id = %s", (g.id,))
        conn.execute("UPDATE documents SET generations = array_remove(generations, %s) WHERE %s = ANY(generations)",
                     (g.id, g.id))
    return get(conn, generation_id)


def to_sql_vector(g: Generation, vector: np.ndarray) -> Any:
    """``vector`` (float32, ``g.dimension``) as the Python value psycopg adapts to ``g``'s column type."""
    from pgvector import HalfVector, Vector

    v = np.asarray(vector, dtype=np.float32)
    return HalfVector(v) if g.storage == "halfvec" else Vector(v)


def from_sql_vector(value: Any) -> np.ndarray:
    """A stored ``vector``/``halfvec`` as a float32 array."""
    return np.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value, dtype=np.float32)
