"""End-to-end smoke test of the core on generated Markdown/text files (no ../shared needed)."""

from __future__ import annotations

from rag_pipeline.retrieval import query
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.pipeline.sync import sync_source


def test_sync_then_query_then_noop(tmp_path, settings, store, embedder):
    (tmp_path / "a.md").write_text("# Apples\n\nApples are red fruit that grow on trees in orchards.\n")
    (tmp_path / "b.txt").write_text("Submarines travel under the ocean using ballast tanks and sonar.\n")
    source = LocalFolderSource(tmp_path)
    report = sync_source(source, store, embedder, settings)
    assert {d.source_id: d.status for d in report.documents} == {"a.md": "completed", "b.txt": "completed"}
    hits = query(store, embedder, "how do submarines dive?", k=1, admin=True)
    assert hits[0].source_id == "b.txt"
    calls = embedder.calls
    again = sync_source(source, store, embedder, settings)
    assert [d.action for d in again.documents] == ["skipped-unchanged", "skipped-unchanged"]
    assert embedder.calls == calls and again.embedded == 0
