"""Shared fixtures: the embedded PostgreSQL (one server per session, a fresh database per test),
the real embedding model, and the path of ``../shared``.

``../shared`` is always present in CI (``CI=true``): there a missing folder fails the test run
instead of skipping. In a user's clone without it, tests that need it are skipped with the reason.
"""

from __future__ import annotations

import itertools
import os
import uuid
from pathlib import Path

import psycopg
import pytest

from rag_pipeline.config import Settings
from rag_pipeline.store import Store, migrate

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
_counter = itertools.count()
_CACHE: list[str] = []


def pytest_configure(config) -> None:
    """The embedder's local model exports (``RAG_EMBEDDING_CACHE_DIR``) go to a folder of this test session
    (subprocesses inherit it), not to the user's cache: every session makes its own export once."""
    import tempfile

    if "RAG_EMBEDDING_CACHE_DIR" not in os.environ:
        _CACHE.append(tempfile.mkdtemp(prefix="rag-embedding-cache-"))
        os.environ["RAG_EMBEDDING_CACHE_DIR"] = _CACHE[0]


def pytest_unconfigure(config) -> None:
    import shutil

    for folder in _CACHE:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``<repo>/../shared`` (read-only test material)."""
    if not (SHARED / "corpus").is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"{SHARED} is missing: CI must provide ../shared beside the clone")
        pytest.skip(f"{SHARED} not present (a clone without the team's shared test material)")
    return SHARED


@pytest.fixture(scope="session")
def embedder():
    """The real default embedder (all-MiniLM-L6-v2, bundled), loaded once per session."""
    from rag_pipeline.embedding import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder()


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory) -> str:
    """URL of a session-scoped embedded PostgreSQL (its own data directory under pytest's tmp)."""
    from rag_pipeline.store.embedded import start_embedded

    return start_embedded(tmp_path_factory.mktemp("pg") / "data")


def _with_db(url: str, dbname: str) -> str:
    conninfo = psycopg.conninfo.conninfo_to_dict(url)
    conninfo["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**conninfo)


@pytest.fixture(scope="session")
def template_db(pg_server, embedder) -> str:
    """A migrated template database; each test clones it (fast, isolated)."""
    name = "rag_template"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    migrate(_with_db(pg_server, name), embedding_dimension=embedder.dimension, embedding_model=embedder.model_id)
    return name


def new_database(pg_server: str, template_db: str) -> str:
    """Create a fresh migrated database cloned from the template; return its URL."""
    name = f"t_{next(_counter)}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {template_db}")
    return _with_db(pg_server, name)


@pytest.fixture
def database_url(pg_server, template_db) -> str:
    """A fresh, migrated database for this test."""
    return new_database(pg_server, template_db)


@pytest.fixture
def settings(database_url) -> Settings:
    """Settings pointing at this test's database, retrying a failed document on the next sync
    (``retry_backoff_s=0``; the default backoff of an hour is pinned in ``test_config.py`` and exercised by
    the tests that set it explicitly); every other setting at its default."""
    return Settings(database_url=database_url, retry_backoff_s=0)


@pytest.fixture
def store(database_url) -> Store:
    """The ``Store`` of this test's database."""
    return Store(database_url)


@pytest.fixture
def fetches(monkeypatch) -> list[str]:
    """Source ids ``LocalFolderSource.fetch_to`` (what the pipeline reads through; ``fetch`` calls it too)
    was called for during the test (the real read runs)."""
    from rag_pipeline.sources.local import LocalFolderSource

    seen: list[str] = []
    real = LocalFolderSource.fetch_to

    def counting(self, document, out):
        seen.append(document.source_id)
        return real(self, document, out)

    monkeypatch.setattr(LocalFolderSource, "fetch_to", counting)
    return seen
