"""Concurrency (issue 4, part 5): two syncs of one source at once, each in its own thread with its
own connection, and a reader during a write.

The first sync is held at a known point by its ``progress`` callback (or a checkpoint hook) while
the second starts, so the overlap is certain rather than left to timing; the second's wait is seen
in ``pg_locks`` before the first is let go.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rag_pipeline import faults
from rag_pipeline.retrieval import query
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.store.invariants import check_against_listing, check_index
from rag_pipeline.pipeline.sync import EXIT_LOCKED, EXIT_OK, sync_source
from rag_pipeline_tests.invariant_fakes import CountingEmbedder, document, marker, paragraph, sha256


def _folder(root: Path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    root.mkdir()
    for i in range(n):
        (root / f"c{i}.md").write_text(f"{paragraph(marker(rng), rng)}\n\n{paragraph(marker(rng), rng)}\n")


def _listing(root: Path) -> dict[str, str]:
    return {p.name: sha256(p.read_bytes()) for p in sorted(root.iterdir())}


def _wait_until(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _advisory_waiters(store) -> int:
    with store.connection() as conn:
        return conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchone()[0]


class Gate:
    """A ``progress`` callback that holds its sync at the first ``start`` event until ``open()``."""

    def __init__(self) -> None:
        self.entered, self._open = threading.Event(), threading.Event()

    def __call__(self, event: str, data: dict) -> None:
        if event == "start" and not self.entered.is_set():
            self.entered.set()
            assert self._open.wait(120), "gate never opened"

    def open(self) -> None:
        self._open.set()


def test_second_sync_waits_and_finds_nothing_left_to_do(tmp_path, settings, store, embedder):
    root = tmp_path / "docs"
    _folder(root, 6, 1)
    src = LocalFolderSource(root)
    first_embedder, second_embedder = CountingEmbedder(embedder), CountingEmbedder(embedder)
    gate = Gate()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(sync_source, src, store, first_embedder, settings, progress=gate)
        assert gate.entered.wait(60)
        second = pool.submit(sync_source, src, store, second_embedder, settings)
        _wait_until(lambda: _advisory_waiters(store) == 1, "the second sync to wait for the lock")
        assert not second.done()
        gate.open()
        a, b = first.result(timeout=120), second.result(timeout=120)
    assert (a.lock, b.lock) == ("acquired", "waited")
    assert a.exit_code == b.exit_code == EXIT_OK
    assert a.counts() == {"added": 6} and b.counts() == {"skipped-unchanged": 6}
    assert second_embedder.calls == 0 and b.embedded == 0  # nothing done twice
    with store.connection() as conn:
        assert check_index(conn) == []
        assert check_against_listing(conn, src.name, _listing(root), converged=True) == []
        versions = conn.execute("SELECT DISTINCT d.version, c.version FROM documents d JOIN chunks c "
                                "ON c.document_id = d.id WHERE d.source = %s", (src.name,)).fetchall()
        assert versions == [(1, 1)]
        assert conn.execute("SELECT count(*) FROM ingest_log WHERE action = 'added'").fetchone()[0] == 6
        runs = conn.execute("SELECT id, status FROM sync_runs ORDER BY id").fetchall()
        assert [r[1] for r in runs] == ["succeeded", "succeeded"] and [r[0] for r in runs] == [a.run_id, b.run_id]


def test_waiting_sync_picks_up_changes_made_meanwhile(tmp_path, settings, store, embedder):
    """Changes made while the second sync waits: each document ends with exactly one version, the
    folder's, whichever of the two syncs wrote it."""
    root = tmp_path / "docs"
    _folder(root, 6, 2)
    src = LocalFolderSource(root)
    assert sync_source(src, store, embedder, settings).exit_code == EXIT_OK
    rng = random.Random(3)
    (root / "c0.md").write_text(paragraph(marker(rng), rng) + "\n")  # changed before the first run lists
    gate = Gate()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(sync_source, src, store, embedder, settings, progress=gate)
        assert gate.entered.wait(60)
        second = pool.submit(sync_source, src, store, embedder, settings)
        _wait_until(lambda: _advisory_waiters(store) == 1, "the second sync to wait for the lock")
        (root / "c5.md").write_text(paragraph(marker(rng), rng) + "\n")  # after the first run listed
        (root / "new.md").write_text(paragraph(marker(rng), rng) + "\n")
        gate.open()
        a, b = first.result(timeout=120), second.result(timeout=120)
    assert (a.lock, b.lock) == ("acquired", "waited")
    assert {d.source_id: d.action for d in a.documents}["c0.md"] == "updated"
    assert {d.source_id: d.action for d in b.documents}["new.md"] == "added"
    with store.connection() as conn:
        assert check_index(conn) == []
        assert check_against_listing(conn, src.name, _listing(root), converged=True) == []
        for sid in ("c0.md", "c5.md"):
            row = document(conn, src.name, sid)
            assert row["version"] == 2 and row["all_chunks"] == row["stored"]


def test_sync_that_must_not_wait_is_skipped(tmp_path, settings, store, embedder):
    root = tmp_path / "docs"
    _folder(root, 3, 4)
    src = LocalFolderSource(root)
    gate = Gate()
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(sync_source, src, store, embedder, settings, progress=gate)
        assert gate.entered.wait(60)
        try:
            skipped = sync_source(src, store, embedder, settings, wait_for_lock=False)
        finally:
            gate.open()
        a = first.result(timeout=120)
    assert (skipped.lock, skipped.exit_code, skipped.run_id, skipped.documents) == ("skipped", EXIT_LOCKED, None, [])
    assert a.lock == "acquired" and a.exit_code == EXIT_OK
    with store.connection() as conn:
        assert conn.execute("SELECT count(*) FROM sync_runs").fetchone()[0] == 1
        assert check_against_listing(conn, src.name, _listing(root), converged=True) == []


def test_readers_see_the_old_version_until_the_swap_commits(tmp_path, settings, store, embedder, monkeypatch):
    """A reader on its own connection, while a sync is inside a document's swap transaction (old rows
    deleted, new rows inserted, not committed): it sees version 1 whole; after the commit, version 2."""
    rng = random.Random(5)
    root = tmp_path / "docs"
    root.mkdir()
    old_text, new_text = paragraph(marker(rng), rng), paragraph(marker(rng), rng)
    (root / "one.md").write_text(old_text + "\n")
    src = LocalFolderSource(root)
    sync_source(src, store, embedder, settings)
    (root / "one.md").write_text(new_text + "\n")

    inside, release = threading.Event(), threading.Event()
    real = faults.checkpoint

    def holding(point: str) -> None:
        if point == "write.before_commit":
            inside.set()
            assert release.wait(120)
        real(point)

    import rag_pipeline.store.write as write_module

    monkeypatch.setattr(write_module, "checkpoint", holding)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(sync_source, src, store, embedder, settings)
        assert inside.wait(60)
        try:
            with store.connection() as conn:
                assert check_index(conn) == []
                row = document(conn, src.name, "one.md")
                assert (row["version"], row["stored"], row["all_chunks"]) == (1, 1, 1)
            hits = query(store, embedder, new_text, k=5, source=src.name, admin=True)
            assert [(h.version, h.text) for h in hits] == [(1, old_text)]
        finally:
            release.set()
        assert running.result(timeout=120).exit_code == EXIT_OK
    hits = query(store, embedder, new_text, k=5, source=src.name, admin=True)
    assert [(h.version, h.text) for h in hits] == [(2, new_text)]


@pytest.mark.parametrize("runs", [3])
def test_many_syncs_at_once_write_each_version_once(runs, tmp_path, settings, store, embedder):
    """``runs`` syncs started together on a fresh folder: every document is added exactly once and
    every text embedded once, whoever gets the lock first."""
    root = tmp_path / "docs"
    _folder(root, 8, 6)
    src = LocalFolderSource(root)
    counting = [CountingEmbedder(embedder) for _ in range(runs)]
    start = threading.Barrier(runs)

    def one(i: int):
        start.wait()
        return sync_source(src, store, counting[i], settings)

    with ThreadPoolExecutor(runs) as pool:
        reports = list(pool.map(one, range(runs)))
    assert sorted(r.lock for r in reports).count("acquired") >= 1
    assert all(r.exit_code == EXIT_OK for r in reports)
    assert sum(r.counts().get("added", 0) for r in reports) == 8
    texts = [t for c in counting for t in c.texts]
    assert len(texts) == len(set(texts))  # no text embedded twice
    with store.connection() as conn:
        assert check_index(conn) == []
        assert check_against_listing(conn, src.name, _listing(root), converged=True) == []
        assert conn.execute("SELECT count(DISTINCT text) FROM chunks").fetchone()[0] == len(texts)


# -- a Dagster partition run and a whole-source sync (issue 10, part 3) -----------------------------

def _write_actions(store, source: str) -> dict[str, list[str]]:
    """Per document, the ingest_log actions that swapped in a version (added/updated/repaired/re-embedded)."""
    with store.connection() as conn:
        rows = conn.execute(
            "SELECT source_id, action FROM ingest_log WHERE source = %s AND action IN "
            "('added', 'updated', 'repaired', 're-embedded') ORDER BY id", (source,)).fetchall()
    out: dict[str, list[str]] = {}
    for sid, action in rows:
        out.setdefault(sid, []).append(action)
    return out


def test_reconcile_waits_for_a_partition_run_and_does_not_redo_its_document(tmp_path, settings, store, embedder):
    """A partition run (``pipeline.staged``, what the Dagster assets call) holds the source lock shared and the
    document's lock; a whole-source sync started meanwhile waits (seen in ``pg_locks``), then finds the
    document written and does not write it again."""
    from rag_pipeline.pipeline.staged import stage_chunks, stage_markdown, write_embeddings
    from rag_pipeline.pipeline.steps import RunContext

    root = tmp_path / "docs"
    _folder(root, 4, 11)
    src = LocalFolderSource(root)
    doc = next(d for d in src.list_documents().documents if d.source_id == "c0.md")
    held, go = threading.Event(), threading.Event()

    def partition_run() -> str:
        with store.connection() as conn:
            ctx = RunContext(conn, src.name, settings, "dagster:test-run")
            stage_markdown(ctx, src, doc)
            stage_chunks(ctx, doc.source_id, embedder)
            # the embeddings step: hold its locks until the sync is seen waiting, then write
            from rag_pipeline.pipeline import locks
            with locks.document_step(conn, src.name, [doc.source_id]):
                held.set()
                assert go.wait(120)
                out = write_embeddings(ctx, [doc.source_id], embedder)
            return out[doc.source_id].action.value

    with ThreadPoolExecutor(2) as pool:
        run = pool.submit(partition_run)
        assert held.wait(120)
        sync = pool.submit(sync_source, src, store, embedder, settings)
        _wait_until(lambda: _advisory_waiters(store) >= 1, "the sync to wait for the partition run's lock")
        assert not sync.done()
        go.set()
        action, report = run.result(timeout=120), sync.result(timeout=300)
    assert action == "added" and report.lock == "waited" and report.exit_code == EXIT_OK
    assert {d.source_id: d.action.value for d in report.documents}["c0.md"] == "skipped-unchanged"
    assert _write_actions(store, src.name) == {f"c{i}.md": ["added"] for i in range(4)}  # each written once
    with store.connection() as conn:
        assert check_index(conn) == [] and check_against_listing(conn, src.name, _listing(root), converged=True) == []


def test_partition_run_waits_for_a_running_sync(tmp_path, settings, store, embedder):
    """The other way round: while a whole-source sync holds the source lock, a partition run of one of its
    documents waits for it, then finds the document written (nothing extracted or written twice)."""
    from rag_pipeline.pipeline.staged import stage_markdown
    from rag_pipeline.pipeline.steps import RunContext

    root = tmp_path / "docs"
    _folder(root, 3, 12)
    src = LocalFolderSource(root)
    doc = next(d for d in src.list_documents().documents if d.source_id == "c1.md")
    gate = Gate()

    def partition_markdown():
        with store.connection() as conn:
            return stage_markdown(RunContext(conn, src.name, settings, "dagster:test-run-2"), src, doc)

    with ThreadPoolExecutor(2) as pool:
        sync = pool.submit(sync_source, src, store, embedder, settings, progress=gate)
        assert gate.entered.wait(60)
        run = pool.submit(partition_markdown)
        _wait_until(lambda: _advisory_waiters(store) >= 1, "the partition run to wait for the sync's lock")
        assert not run.done()
        gate.open()
        report, step = sync.result(timeout=300), run.result(timeout=120)
    assert report.exit_code == EXIT_OK and report.lock == "acquired"
    assert step.action.value == "metadata-updated" and step.status == "completed"  # content already indexed
    assert _write_actions(store, src.name) == {f"c{i}.md": ["added"] for i in range(3)}
