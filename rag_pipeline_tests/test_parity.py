"""Parity of the two callers (issue 10): the same folder synced by the CLI route (``sync_source``) and by
materializing the Dagster partitions (``routes.DagsterRoute``: the sensor's plan, one run of the three
per-document assets per document, the guarded inventory and purge) gives the same ``documents``,
``chunks`` and ``ingest_log`` actions, day by day: a first sync with an e-mail and its attachment, a day
with a changed and a deleted file, and a same-dimension model change."""

from __future__ import annotations

import shutil

import pytest

from rag_pipeline.embedding import SentenceTransformerEmbedder
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.store import Store
from rag_pipeline.store.invariants import check_index
from rag_pipeline_tests.conftest import new_database
from rag_pipeline_tests.routes import open_route

NOTES = {
    f"n{i}.md": f"# Note {i}\n\nThe lighthouse on island {i} was repainted in spring; keeper number {i} logged it.\n"
    for i in range(6)
}


def _day0(root, shared_dir) -> None:
    root.mkdir()
    for name, text in NOTES.items():
        (root / name).write_text(text)
    shutil.copy(shared_dir / "corpus" / "fake-email-attachment.eml", root / "mail.eml")


def _snapshot(store: Store, source: str) -> dict:
    """What both routes must agree on, read with plain SQL: documents (with children and their embedding
    generations), chunk texts per document and version and which of generations 1 and 2 hold their vectors,
    the generations, and the ingest_log actions per document in order."""
    with store.connection() as conn:
        documents = conn.execute(
            "SELECT d.source_id, d.status, d.version, d.content_sha256, d.chunk_count, d.doc_type, d.generations, "
            "p.source_id FROM documents d LEFT JOIN documents p ON p.id = d.parent_id WHERE d.source = %s "
            "ORDER BY d.source_id", (source,)).fetchall()
        chunks = conn.execute(
            "SELECT d.source_id, c.version, c.ordinal, c.text, e1.embedding IS NOT NULL, e2.embedding IS NOT NULL "
            "FROM chunks c JOIN documents d ON d.id = c.document_id "
            "LEFT JOIN chunk_embeddings_1 e1 ON e1.chunk_id = c.id LEFT JOIN chunk_embeddings_2 e2 ON e2.chunk_id = c.id "
            "WHERE d.source = %s ORDER BY 1, 2, 3", (source,)).fetchall()
        generations = conn.execute("SELECT id, model, state FROM embedding_generations ORDER BY id").fetchall()
        log = conn.execute("SELECT source_id, action, status FROM ingest_log WHERE source = %s ORDER BY id",
                           (source,)).fetchall()
    actions: dict[str, list[tuple[str, str]]] = {}
    for sid, action, status in log:
        actions.setdefault(sid, []).append((action, status))
    return {"documents": documents, "chunks": chunks, "actions": actions, "generations": generations}


@pytest.fixture
def second_model(tmp_path, embedder):
    """The bundled weights under another model id (a same-dimension model change)."""
    link = tmp_path / "minilm-renamed"
    link.symlink_to(embedder.path, target_is_directory=True)
    return SentenceTransformerEmbedder(str(link))


def test_cli_and_dagster_routes_leave_the_same_index(tmp_path, shared_dir, pg_server, template_db, settings,
                                                     embedder, second_model):
    snapshots = {}
    for name in ("cli", "dagster"):
        root = tmp_path / name / "docs"
        _day0(root.parent.mkdir(parents=True) or root, shared_dir)
        store = Store(new_database(pg_server, template_db))
        route_settings = settings.model_copy(update={"database_url": store.url})
        source = LocalFolderSource(root, name="local:parity")  # one source name for both: comparable rows
        days = []
        with open_route(name) as route:
            first = route(source, store, embedder, route_settings)
            assert first.exit_code == 0, first
            (root / "n1.md").write_text(NOTES["n1.md"] + "\nIn autumn the lamp was replaced by an LED.\n")
            (root / "n2.md").unlink()  # 1 of 7 documents: within the guard
            second = route(source, store, embedder, route_settings)
            assert second.exit_code == 0 and second.deleted == ["n2.md"], second
            third = route(source, store, second_model, route_settings)  # the model changed
            assert third.exit_code == 0, third
            days = [first.actions, second.actions, third.actions]
        with store.connection() as conn:
            assert check_index(conn) == []
        snapshots[name] = (_snapshot(store, source.name), days)

    cli, dagster = snapshots["cli"], snapshots["dagster"]
    assert cli[1] == dagster[1]  # each day's last action per document
    assert cli[0]["actions"] == dagster[0]["actions"]
    assert cli[0]["documents"] == dagster[0]["documents"]
    assert cli[0]["chunks"] == dagster[0]["chunks"]
    assert cli[0]["generations"] == dagster[0]["generations"]

    # and what they agree on is right: the attachment is a child document, the change and the deletion
    # are applied, and after the model change every chunk has vectors in both generations, the new one active
    docs = {row[0]: row for row in cli[0]["documents"]}
    attachment = "mail.eml#attachment/1/fake-attachment.txt"
    assert docs[attachment][1] == "completed" and docs[attachment][7] == "mail.eml"
    assert docs["n2.md"][1] == "deleted" and docs["n1.md"][2] == 2  # updated on day 1; day 2 adds vectors only
    assert {(row[4], row[5]) for row in cli[0]["chunks"]} == {(True, True)}
    assert cli[0]["generations"] == [(1, embedder.model_id, "retired"), (2, second_model.model_id, "active")]
    assert {tuple(sorted(row[6])) for row in cli[0]["documents"] if row[1] == "completed"} == {(1, 2)}
    assert cli[1][0] == {**{n: "added" for n in NOTES}, "mail.eml": "added", attachment: "added"}
    assert cli[1][1] == {"n1.md": "updated", "n2.md": "deleted"}
    assert cli[1][2] == {sid: "re-embedded" for sid in [*NOTES, "mail.eml", attachment] if sid != "n2.md"}
    assert any("LED" in row[3] for row in cli[0]["chunks"] if row[0] == "n1.md")
