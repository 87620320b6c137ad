"""Connections and migrations for the index database (PostgreSQL + pgvector)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import psycopg
from pgvector.psycopg import register_vector

from rag_pipeline.config import Settings
from rag_pipeline.store.embedded import resolve_database_url

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_MIGRATION_LOCK_KEY = 0x7261675F6D6967  # "rag_mig": one migrator at a time across processes


class IndexConfigurationError(RuntimeError):
    """The index was created for another embedding model or dimension than the one configured."""


def migrate(url: str, *, embedding_dimension: int, embedding_model: str) -> None:
    """Bring the schema at ``url`` to the newest Alembic revision (idempotent, concurrency-safe).

    ``embedding_dimension`` fixes ``chunks.embedding`` at creation. Holds a PostgreSQL advisory lock so
    that concurrent processes migrate once. Raises ``IndexConfigurationError`` when the existing index
    has another dimension.
    """
    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config

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
                row = conn.execute(
                    sa.text("SELECT value FROM index_settings WHERE key = 'embedding_dimension'")
                ).first()
            finally:
                conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": _MIGRATION_LOCK_KEY})
                conn.commit()
    finally:
        engine.dispose()
    if row is not None and int(row[0]) != embedding_dimension:
        raise IndexConfigurationError(
            f"the index stores {row[0]}-dimensional embeddings but model {embedding_model!r} has "
            f"{embedding_dimension}; point RAG_DATABASE_URL at a new database or re-create the index"
        )


class Store:
    """The index database: a URL plus helpers to open connections with pgvector registered.

    Build with ``Store.open(settings, embedding_dimension=..., embedding_model=...)``, which resolves the
    URL (starting the embedded server when ``RAG_DATABASE_URL`` is unset) and migrates the schema.
    """

    def __init__(self, url: str) -> None:
        self.url = url

    @classmethod
    def open(cls, settings: Settings, *, embedding_dimension: int, embedding_model: str) -> Store:
        """Resolve the database URL, migrate, and return a ``Store``; raises ``psycopg.Error`` on connect failures."""
        url = resolve_database_url(settings.database_url)
        migrate(url, embedding_dimension=embedding_dimension, embedding_model=embedding_model)
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
