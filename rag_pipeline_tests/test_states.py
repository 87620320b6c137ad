"""Document statuses over time (issue 4, part 7; the state machine of ``docs/states.md``).

One test per transition: pending -> completed; pending/completed -> failed -> failed ->
permanently_failed (transient faults, ``max_failures``); a deterministic content error ->
permanently_failed at once; permanently_failed stays put until the content changes (which restarts the
failure count); success resets
``failure_count``; completed -> deleted -> completed when the document comes back; failed -> deleted;
an interrupted run leaves new documents ``pending``. Each state change leaves an ``ingest_log`` row
with its reason, and ``check_index`` finds nothing wrong after every step.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from rag_pipeline import faults
from rag_pipeline.retrieval import query
from rag_pipeline.sources.base import SourceError
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.store.invariants import check_index
from rag_pipeline.pipeline.sync import EXIT_DOCUMENT_FAILURES, EXIT_OK, sync_source
from rag_pipeline_tests.invariant_fakes import (
    CountingEmbedder,
    MemorySource,
    RecordingNotifier,
    chunks_of,
    count_extractions,
    document,
    ingest_actions,
    marker,
    paragraph,
)

OUTAGE = "503 service unavailable"


@pytest.fixture
def extract_calls(monkeypatch) -> list[str]:
    """File names passed to ``rag_pipeline.extraction.extract`` (the real function runs)."""
    return count_extractions(monkeypatch)


def state(store, source: str, sid: str) -> tuple[str, int, str | None, int]:
    """(status, failure_count, last_error, version) of a document, after checking the invariant."""
    with store.connection() as conn:
        assert check_index(conn) == []
        row = document(conn, source, sid)
    return row["status"], row["failure_count"], row["last_error"], row["version"]


def test_transient_faults_fail_then_fail_then_permanently_fail(settings, store, embedder):
    assert settings.max_failures == 3
    rng = random.Random(1)
    src = MemorySource()
    src.put("doc", f"{paragraph(marker(rng), rng)}\n".encode())
    src.fetch_errors["doc"] = SourceError(OUTAGE, transient=True)
    notifier = RecordingNotifier()

    seen = []
    for _ in range(3):
        report = sync_source(src, store, embedder, settings, notifier=notifier)
        assert report.exit_code == EXIT_DOCUMENT_FAILURES
        seen.append(state(store, src.name, "doc"))
    assert seen == [("failed", 1, OUTAGE, 0), ("failed", 2, OUTAGE, 0), ("permanently_failed", 3, OUTAGE, 0)]
    assert len(src.fetches) == 3
    alerts = notifier.of("permanently_failed")
    assert len(alerts) == 1 and alerts[0][2]["documents"] == [{"source_id": "doc", "reason": OUTAGE}]

    # Unchanged content: left alone (no fetch, no new alert), whether or not the fault is still there.
    for fault_cleared in (False, True):
        if fault_cleared:
            del src.fetch_errors["doc"]
        report = sync_source(src, store, embedder, settings, notifier=notifier)
        assert [(d.action, d.status) for d in report.documents] == [("skipped-unchanged", "permanently_failed")]
        assert state(store, src.name, "doc") == ("permanently_failed", 3, OUTAGE, 0)
    assert len(src.fetches) == 3 and len(notifier.of("permanently_failed")) == 1

    # New content: tried again, and this time it works.
    src.put("doc", f"{paragraph(marker(rng), rng)}\n".encode())
    report = sync_source(src, store, embedder, settings, notifier=notifier)
    assert report.exit_code == EXIT_OK
    assert state(store, src.name, "doc") == ("completed", 0, None, 1)
    with store.connection() as conn:
        assert [(a, s) for a, s, _ in ingest_actions(conn, src.name, "doc")] == [
            ("failed", "failed"), ("failed", "failed"), ("failed", "permanently_failed"), ("added", "completed")]
        assert {r for _, _, r in ingest_actions(conn, src.name, "doc")[:3]} == {OUTAGE}


def test_empty_and_textless_documents_are_skipped_not_failed(tmp_path, settings, store, embedder, extract_calls):
    """Nothing to index is the terminal ``skipped`` state: no failure counted, no alert, exit 0; left alone
    while the content stays the same; indexed once it has text."""
    rng = random.Random(2)
    root = tmp_path / "docs"
    root.mkdir()
    (root / "good.md").write_text(paragraph(marker(rng), rng) + "\n")
    (root / "empty.md").write_bytes(b"")
    (root / "blank.md").write_text("   \n\n\t\n")
    src = LocalFolderSource(root)
    notifier = RecordingNotifier()
    report = sync_source(src, store, embedder, settings, notifier=notifier)
    assert report.exit_code == EXIT_OK
    assert {d.source_id: (d.action, d.status) for d in report.documents if d.source_id != "good.md"} == {
        "empty.md": ("skipped", "skipped"), "blank.md": ("skipped", "skipped")}
    assert state(store, src.name, "empty.md") == ("skipped", 0, "empty", 0)
    status, count, reason, version = state(store, src.name, "blank.md")
    assert (status, count, version) == ("skipped", 0, 0) and reason.startswith("no text")
    assert state(store, src.name, "good.md")[0] == "completed"
    assert notifier.of("permanently_failed") == []

    extractions = len(extract_calls)
    again = sync_source(src, store, embedder, settings, notifier=notifier)
    assert {d.source_id: d.action for d in again.documents} == {
        "good.md": "skipped-unchanged", "empty.md": "skipped-unchanged", "blank.md": "skipped-unchanged"}
    assert len(extract_calls) == extractions and notifier.of("permanently_failed") == []
    assert state(store, src.name, "empty.md") == ("skipped", 0, "empty", 0)

    text_marker = marker(rng)
    (root / "empty.md").write_text(paragraph(text_marker, rng) + "\n")
    fixed = sync_source(src, store, embedder, settings, notifier=notifier)
    assert {d.source_id: (d.action, d.status) for d in fixed.documents}["empty.md"] == ("added", "completed")
    assert state(store, src.name, "empty.md") == ("completed", 0, None, 1)
    assert query(store, embedder, text_marker, k=1, source=src.name, admin=True)[0].source_id == "empty.md"


def test_success_resets_failure_count_and_failed_keeps_the_previous_version(settings, store, embedder):
    rng = random.Random(3)
    src = MemorySource()
    v1_text = paragraph(marker(rng), rng)
    src.put("doc", f"{v1_text}\n".encode())
    sync_source(src, store, embedder, settings)
    assert state(store, src.name, "doc") == ("completed", 0, None, 1)

    v2_marker = marker(rng)
    src.put("doc", f"{paragraph(v2_marker, rng)}\n".encode())
    src.fetch_errors["doc"] = SourceError(OUTAGE, transient=True)
    for n in (1, 2):
        sync_source(src, store, embedder, settings)
        assert state(store, src.name, "doc") == ("failed", n, OUTAGE, 1)
        # Readers still find version 1 (the previous complete version), and only it.
        hits = query(store, embedder, v1_text, k=3, source=src.name, admin=True)
        assert [(h.source_id, h.version, h.text) for h in hits] == [("doc", 1, v1_text)]

    del src.fetch_errors["doc"]
    counting = CountingEmbedder(embedder)
    report = sync_source(src, store, counting, settings)
    assert [(d.action, d.status) for d in report.documents] == [("updated", "completed")]
    assert state(store, src.name, "doc") == ("completed", 0, None, 2)
    assert len(counting.texts) == 1 and v2_marker in counting.texts[0]
    with store.connection() as conn:
        assert [(v, text) for _, v, _, text, _ in chunks_of(conn, document(conn, src.name, "doc")["id"])] == [
            (2, counting.texts[0])]


def test_completed_deleted_then_back_again(tmp_path, settings, store, embedder):
    rng = random.Random(4)
    root = tmp_path / "docs"
    root.mkdir()
    for i in range(6):
        (root / f"f{i}.md").write_text(paragraph(marker(rng), rng) + "\n")
    src = LocalFolderSource(root)
    sync_source(src, store, embedder, settings)
    data = (root / "f2.md").read_bytes()
    with store.connection() as conn:
        first = document(conn, src.name, "f2.md")

    (root / "f2.md").unlink()
    report = sync_source(src, store, embedder, settings)
    assert report.deleted == ["f2.md"]
    with store.connection() as conn:
        gone = document(conn, src.name, "f2.md")
        assert (gone["status"], gone["all_chunks"], gone["chunk_count"], gone["id"]) == ("deleted", 0, 0, first["id"])
        assert gone["deleted_at"] is not None and check_index(conn) == []
        assert conn.execute("SELECT count(*) FROM document_markdown WHERE document_id = %s",
                            (gone["id"],)).fetchone()[0] == 0

    (root / "f2.md").write_bytes(data)
    back = sync_source(src, store, embedder, settings)
    assert {d.source_id: (d.action, d.status) for d in back.documents}["f2.md"] == ("added", "completed")
    with store.connection() as conn:
        row = document(conn, src.name, "f2.md")
        assert (row["id"], row["status"], row["version"], row["deleted_at"]) == (first["id"], "completed", 2, None)
        assert row["stored"] == row["expected_chunk_count"] == first["stored"]
        assert [a for a, _, _ in ingest_actions(conn, src.name, "f2.md")] == ["added", "deleted", "added"]
        assert check_index(conn) == []


def test_failed_document_that_leaves_the_source_is_deleted(settings, store, embedder):
    rng = random.Random(5)
    src = MemorySource()
    for i in range(10):
        src.put(f"m{i}", f"{paragraph(marker(rng), rng)}\n".encode())
    src.fetch_errors["m3"] = SourceError(OUTAGE, transient=True)
    sync_source(src, store, embedder, settings)
    assert state(store, src.name, "m3") == ("failed", 1, OUTAGE, 0)
    src.delete("m3")
    report = sync_source(src, store, embedder, settings)
    assert report.deleted == ["m3"]
    assert state(store, src.name, "m3")[0] == "deleted"


def test_interrupted_run_leaves_new_documents_pending(tmp_path, settings, store, embedder, monkeypatch):
    """An exception that escapes the sync after embedding (a crash, in-process): a new document is
    ``pending`` with no chunks, a changed one stays ``completed`` at its previous version, a tombstone
    that came back is ``pending`` with nothing searchable; the next run completes them all."""
    rng = random.Random(6)
    root = tmp_path / "docs"
    root.mkdir()
    for i in range(6):
        (root / f"f{i}.md").write_text(paragraph(marker(rng), rng) + "\n")
    src = LocalFolderSource(root)
    sync_source(src, store, embedder, settings)
    revived = (root / "f5.md").read_bytes()
    (root / "f5.md").unlink()
    assert sync_source(src, store, embedder, settings).deleted == ["f5.md"]

    (root / "f0.md").write_text(paragraph(marker(rng), rng) + "\n")  # changed
    (root / "new.md").write_text(paragraph(marker(rng), rng) + "\n")  # new
    (root / "f5.md").write_bytes(revived)  # back again
    monkeypatch.setattr(faults, "_hits", Counter())
    monkeypatch.setenv("RAG_FAULT_INJECT", "pipeline.after_embed:raise")
    with pytest.raises(faults.InjectedFault):
        sync_source(src, store, embedder, settings)
    monkeypatch.delenv("RAG_FAULT_INJECT")
    assert state(store, src.name, "new.md") == ("pending", 0, None, 0)
    assert state(store, src.name, "f0.md") == ("completed", 0, None, 1)
    assert state(store, src.name, "f5.md") == ("pending", 0, None, 1)
    with store.connection() as conn:
        assert document(conn, src.name, "f5.md")["all_chunks"] == 0
        assert document(conn, src.name, "new.md")["all_chunks"] == 0

    report = sync_source(src, store, embedder, settings)
    assert report.exit_code == EXIT_OK
    # f5.md is "updated": its row already had version 1 (from before the tombstone); it becomes version 2.
    assert {d.source_id: d.action for d in report.documents if d.action != "skipped-unchanged"} == {
        "f0.md": "updated", "new.md": "added", "f5.md": "updated"}
    assert [state(store, src.name, s)[:2] for s in ("f0.md", "new.md", "f5.md")] == [("completed", 0)] * 3


def test_new_content_gets_a_fresh_failure_budget(settings, store, embedder):
    rng = random.Random(7)
    src = MemorySource()
    src.put("doc", f"{paragraph(marker(rng), rng)}\n".encode())
    src.fetch_errors["doc"] = SourceError(OUTAGE, transient=True)
    for _ in range(3):
        sync_source(src, store, embedder, settings)
    assert state(store, src.name, "doc")[:2] == ("permanently_failed", 3)

    # new content while the outage lasts: a new version with its own count, not permanently_failed again
    src.put("doc", f"{paragraph(marker(rng), rng)}\n".encode())
    sync_source(src, store, embedder, settings)
    assert state(store, src.name, "doc")[:2] == ("failed", 1)
    sync_source(src, store, embedder, settings)
    assert state(store, src.name, "doc")[:2] == ("failed", 2)
    del src.fetch_errors["doc"]
    sync_source(src, store, embedder, settings)
    assert state(store, src.name, "doc") == ("completed", 0, None, 1)
