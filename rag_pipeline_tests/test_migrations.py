"""Upgrading an index made by revision 0002 (with data) to the head: existing rows land in the new states and
vocabulary (0003: empty/no-text documents become ``skipped``, run ids become text, the chunks' model is
recorded on each document; 0004: every document readable by nobody until its permissions are read; 0005: the
vectors of the index's model move into embedding generation 1, others are embedded again from the stored chunk
texts), and the upgraded index syncs like a new one."""

from __future__ import annotations

import psycopg
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from rag_pipeline.pipeline.sync import sync_source
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.store import Store, migrate
from rag_pipeline.store.db import MIGRATIONS_DIR
from rag_pipeline.store.invariants import check_index


def _upgrade_to(url: str, revision: str, *, dimension: int, model: str) -> None:
    engine = sa.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(url), poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        cfg.attributes.update(connection=conn, embedding_dimension=dimension, embedding_model=model)
        command.upgrade(cfg, revision)
        conn.commit()
    engine.dispose()


def test_an_0002_index_with_data_upgrades(pg_server, tmp_path, embedder, settings):
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute("CREATE DATABASE upgrade_from_0002")
    url = psycopg.conninfo.make_conninfo(pg_server, dbname="upgrade_from_0002")
    _upgrade_to(url, "0002", dimension=embedder.dimension, model=embedder.model_id)
    vector = "[" + ",".join(["0.05"] * embedder.dimension) + "]"
    with psycopg.connect(url, autocommit=True) as conn:  # what 0002 held: written with its own SQL
        conn.execute("INSERT INTO documents (source, source_id, status, last_error, failure_count) VALUES "
                     "('s', 'empty.txt', 'permanently_failed', 'empty', 0), "
                     "('s', 'blank.md', 'permanently_failed', 'no text extracted', 0), "
                     "('s', 'locked.pdf', 'permanently_failed', 'password protected', 0), "
                     "('s', 'ok.md', 'completed', NULL, 0)")
        ok = conn.execute("SELECT id FROM documents WHERE source_id = 'ok.md'").fetchone()[0]
        conn.execute("UPDATE documents SET version = 1, expected_chunk_count = 1, chunk_count = 1, content_sha256 = 'c', "
                     "seen_sha256 = 'c' WHERE id = %s", (ok,))
        conn.execute("INSERT INTO document_markdown (document_id, version, content_sha256, markdown) "
                     "VALUES (%s, 1, 'c', 'ok')", (ok,))
        conn.execute("INSERT INTO chunks (id, document_id, version, ordinal, text, text_sha256, embedding, "
                     "embedding_model, token_count) VALUES (%s, %s, 1, 0, 'ok', 'x', %s, 'old-model', 1)",
                     (f"{ok}:1:0", ok, vector))
        conn.execute("INSERT INTO documents (source, source_id, status, failure_count, version, expected_chunk_count, "
                     "chunk_count, content_sha256, seen_sha256) VALUES ('s', 'kept.md', 'completed', 0, 1, 1, 1, 'k', 'k')")
        kept = conn.execute("SELECT id FROM documents WHERE source_id = 'kept.md'").fetchone()[0]
        conn.execute("INSERT INTO document_markdown (document_id, version, content_sha256, markdown) "
                     "VALUES (%s, 1, 'k', 'kept')", (kept,))
        conn.execute("INSERT INTO chunks (id, document_id, version, ordinal, text, text_sha256, embedding, "
                     "embedding_model, token_count) VALUES (%s, %s, 1, 0, 'kept', 'y', %s, %s, 1)",
                     (f"{kept}:1:0", kept, vector, embedder.model_id))
        conn.execute("INSERT INTO ingest_log (run_id, source, source_id, action, status) VALUES "
                     "(7, 's', 'ok.md', 'added', 'completed'), (NULL, 's', 'ok.md', 'skipped-unchanged', 'completed')")
    migrate(url, embedding_dimension=embedder.dimension, embedding_model=embedder.model_id)  # to head
    with psycopg.connect(url) as conn:
        rows = dict((r[0], r[1:]) for r in conn.execute(
            "SELECT source_id, status, failure_count, generations FROM documents").fetchall())
        # 0005: ok.md's chunks were of another model than the index's: their vectors are not carried into
        # generation 1 (they never answered a query of the configured model anyway)
        assert rows == {"empty.txt": ("skipped", 0, []), "blank.md": ("skipped", 0, []),
                        "locked.pdf": ("permanently_failed", 0, []), "ok.md": ("completed", 0, []),
                        "kept.md": ("completed", 0, [1])}
        moved = conn.execute("SELECT chunk_id, embedding::text FROM chunk_embeddings_1").fetchall()
        assert moved == [(f"{kept}:1:0", vector.replace(",", ","))]
        assert conn.execute("SELECT run_id FROM ingest_log ORDER BY id").fetchall() == [("sync:7",), (None,)]
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == "0005"
        assert conn.execute("SELECT id, model, dimension, storage, state FROM embedding_generations").fetchall() == [
            (1, embedder.model_id, embedder.dimension, "vector", "active")]
        assert [(v.kind, v.source_id) for v in check_index(conn)] == [("not_in_active_generation", "ok.md")]
        assert conn.execute("SELECT count(*) FROM chunks").fetchone()[0] == 2  # ok.md's chunk text stays
    from rag_pipeline.pipeline.rollout import reembed

    report = reembed(Store(url), embedder, settings.model_copy(update={"database_url": url}))
    assert [(o.source_id, o.action.value) for o in report.outcomes] == [("ok.md", "re-embedded")]
    with psycopg.connect(url) as conn:
        assert check_index(conn) == []
        assert conn.execute("SELECT generations FROM documents WHERE source_id = 'ok.md'").fetchone()[0] == [1]
        # 0004: existing documents are readable by nobody (never "everyone" by accident) until a sync reads them
        scopes = conn.execute("SELECT DISTINCT principals, permissions_error LIKE 'permissions not read yet%', "
                              "hidden_reason FROM documents").fetchall()
        assert scopes == [([], True, None)]

    folder = tmp_path / "docs"  # the upgraded index syncs like a new one
    folder.mkdir()
    (folder / "a.md").write_text("# Upgrade\n\nAn index made by an earlier release keeps working after the upgrade.\n")
    store = Store(url)
    report = sync_source(LocalFolderSource(folder), store, embedder, settings.model_copy(update={"database_url": url}))
    assert report.exit_code == 0 and [d.action.value for d in report.documents] == ["added"]
