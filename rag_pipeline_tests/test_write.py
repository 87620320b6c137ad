"""The write transaction: a fault between insert and commit leaves the previous version intact."""

from __future__ import annotations

from rag_pipeline.retrieval import query
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.pipeline.sync import sync_source


def _chunk_texts(store, source_id):
    with store.connection() as conn:
        return conn.execute(
            "SELECT c.version, c.text FROM chunks c JOIN documents d ON d.id = c.document_id "
            "WHERE d.source_id = %s ORDER BY c.version, c.ordinal", (source_id,)).fetchall()


def test_fault_between_insert_and_commit_keeps_previous_version(tmp_path, settings, store, embedder, monkeypatch):
    doc = tmp_path / "a_policy.md"  # listed (and written) first
    doc.write_text("# Policy\n\nVisitors must sign in at the front desk before entering the lab.\n")
    other = tmp_path / "b_other.md"
    other.write_text("# Other\n\nThe cafeteria opens at eight in the morning.\n")
    source = LocalFolderSource(tmp_path)
    assert sync_source(source, store, embedder, settings).ok
    before = _chunk_texts(store, "a_policy.md")
    assert before and all(v == 1 for v, _ in before)

    doc.write_text("# Policy\n\nVisitors now register online; the front desk is closed.\n")
    other.write_text("# Other\n\nThe cafeteria opens at nine in the morning.\n")
    # the first document written in this run fails after its COPY, before COMMIT
    monkeypatch.setenv("RAG_FAULT_INJECT", "write.after_insert@1:raise")
    report = sync_source(source, store, embedder, settings)
    monkeypatch.delenv("RAG_FAULT_INJECT")
    outcomes = {d.source_id: d for d in report.documents}
    assert outcomes["a_policy.md"].status == "failed"
    assert "injected fault" in outcomes["a_policy.md"].reason
    assert outcomes["b_other.md"].status == "completed"  # one bad write never stops the others

    # the failed document still has exactly its previous version, searchable
    assert _chunk_texts(store, "a_policy.md") == before
    with store.connection() as conn:
        status, version, expected, failures = conn.execute(
            "SELECT status, version, expected_chunk_count, failure_count FROM documents WHERE source_id = %s",
            ("a_policy.md",)).fetchone()
    assert (status, version, failures) == ("failed", 1, 1)
    assert expected == len(before)
    hits = query(store, embedder, "where do visitors sign in?", k=1, admin=True)
    assert hits[0].version == 1

    # the next sync converges: both at version 2, failure count reset
    again = sync_source(source, store, embedder, settings)
    assert again.ok
    with store.connection() as conn:
        rows = conn.execute("SELECT source_id, status, version, failure_count FROM documents ORDER BY 1").fetchall()
    assert rows == [("a_policy.md", "completed", 2, 0), ("b_other.md", "completed", 2, 0)]
    assert {v for v, _ in _chunk_texts(store, "a_policy.md")} == {2}
