"""Connections and migrations for the index database (PostgreSQL + pgvector)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import psycopg
from pgvector.psycopg import register_vector

from rag_pipeline.config import Settings
from rag_pipeline.store import generations
from rag_pipeline.store.embedded import resolve_database_url
from rag_pipeline.store.generations import Generation

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_MIGRATION_LOCK_KEY = 0x7261675F6D6967  # "rag_mig": one migrator at a time across processes


class IndexConfigurationError(RuntimeError):
    """The configured embedder cannot be used with this index (a dimension pgvector cannot index, or a model
    id already holding a generation of another dimension); raised before any DDL for the dimension."""


def migrate(url: str, *, embedding_dimension: int, embedding_model: str,
            embedding_spec: dict | None = None) -> Generation:
    """Bring the schema at ``url`` to the newest Alembic revision (idempotent, concurrency-safe) and make
    sure the configured embedder has an embedding generation (``store.generations.ensure``: the active one
    of a new index, else a ``building`` one beside the active); returns that generation.

    The dimension is checked first (``generations.storage_for``: at most 4,000), before any DDL. Holds a
    PostgreSQL advisory lock so that concurrent processes migrate once. Raises ``IndexConfigurationError``.
    """
    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config

    try:
        generations.storage_for(embedding_dimension)
    except generations.DimensionError as exc:
        raise IndexConfigurationError(f"model {embedding_model!r}: {exc}") from None
    # ``creator`` lets any libpq connection string through (URLs and ``key=value`` forms alike).
    engine = sa.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(url),
                              poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
            conn.commit()
            try:
                cfg = Config()
                cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
                cfg.attributes["connection"] = conn
                cfg.attributes["embedding_dimension"] = embedding_dimension
                cfg.attributes["embedding_model"] = embedding_model
                command.upgrade(cfg, "head")
                conn.commit()
            finally:
                conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": _MIGRATION_LOCK_KEY})
                conn.commit()
    finally:
        engine.dispose()
    with psycopg.connect(url, autocommit=True) as pconn:
        register_vector(pconn)
        try:
            return generations.ensure(pconn, model=embedding_model, dimension=embedding_dimension,
                                      spec=embedding_spec or {"embedding_model": embedding_model})
        except generations.GenerationError as exc:
            raise IndexConfigurationError(str(exc)) from None


class Store:
    """The index database: a URL plus helpers to open connections with pgvector registered.

    Build with ``Store.open(settings, embedding_dimension=..., embedding_model=...)``, which resolves the
    URL (starting the embedded server when ``RAG_DATABASE_URL`` is unset) and migrates the schema.
    """

    def __init__(self, url: str) -> None:
        self.url = url

    @classmethod
    def open(cls, settings: Settings, *, embedding_dimension: int, embedding_model: str,
             embedding_spec: dict | None = None) -> Store:
        """Resolve the database URL, migrate, make sure the configured embedder has a generation (``migrate``;
        ``embedding_spec``: the settings that rebuild it, default ``generations.spec_of(settings)``) and return
        a ``Store``; raises ``IndexConfigurationError``, ``psycopg.Error`` on connect failures."""
        url = resolve_database_url(settings.database_url)
        migrate(url, embedding_dimension=embedding_dimension, embedding_model=embedding_model,
                embedding_spec=embedding_spec if embedding_spec is not None else generations.spec_of(settings))
        return cls(url)

    def connect(self, *, autocommit: bool = True) -> psycopg.Connection:
        """Open a new connection (caller closes it) with pgvector types registered."""
        conn = psycopg.connect(self.url, autocommit=autocommit)
        register_vector(conn)
        return conn

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """Context manager: a fresh autocommit connection, closed on exit. Use ``conn.transaction()`` inside."""
        conn = self.connect()
        try:
            yield conn
        finally:
            conn.close()
