"""The plain-Python core behind the Dagster layer, without Dagster: the diff and its attempt tokens, failed
attempts counted once, guarded pending deletions, the check queries; and the daily reconciliation job."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from rag_pipeline.config import Settings
from rag_pipeline.defs.documents.partitions import documents
from rag_pipeline.defs.sources.jobs import build_reconcile_job
from rag_pipeline.pipeline.inventory import take_inventory
from rag_pipeline.pipeline.plan import Decision, PlannedDocument, diff_documents
from rag_pipeline.pipeline.staged import purge_deletions
from rag_pipeline.pipeline.steps import RunContext
from rag_pipeline.sources.base import SourceDocument
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.store import checks as check_sql
from rag_pipeline.store import staging
from rag_pipeline.store import write as w
from rag_pipeline.store.index import IndexedDocument
from rag_pipeline_tests.test_dagster_helpers import (  # noqa: F401  (fixtures)
    folder,
    index_folder,
    instance,
    resources_for,
    spec_for,
)

NOW = datetime.now(timezone.utc)


def _doc(sid: str, sha: str = "a" * 64, **kw) -> SourceDocument:
    return SourceDocument(**{"source_id": sid, "title": sid, "uri": f"file:///{sid}", "content_sha256": sha, **kw})


def _indexed(sid: str, *, status: str = "completed", sha: str = "a" * 64, version: int = 1, failures: int = 0,
             seen: str | None = None, updated: datetime = NOW) -> IndexedDocument:
    return IndexedDocument(id=hash(sid) % 10_000, source_id=sid, status=status, version=version, content_sha256=sha,
                           seen_sha256=seen or sha, source_version=None, seen_source_version=None,
                           failure_count=failures, last_error=None, expected_chunk_count=2 if version else None,
                           stored_chunks=2 if version else 0, title=sid, uri=f"file:///{sid}", mime_type=None,
                           metadata={}, modified_at=None, updated_at=updated)


def test_diff_plans_and_judges_the_guard():
    state = {sid: _indexed(sid) for sid in ("a", "b", "c", "d", "e")}
    state["gone-before"] = _indexed("gone-before", status="deleted")
    listing = [_doc("a"), _doc("b", "b" * 64), _doc("c"), _doc("d"), _doc("new")]
    diff = diff_documents("s", listing, state, Settings())
    assert {p.doc.source_id: p.decision for p in diff.work} == {"b": Decision.CHANGE, "new": Decision.ADD}
    assert [i.source_id for i in diff.vanished] == ["e"]  # a tombstone does not vanish twice
    assert diff.summary() == {"added": 1, "changed": 1, "deleted": 1, "unchanged": 3, "retry": 0, "backoff": 0,
                              "repair": 0, "pending": 0, "check": 0, "reembed": 0, "skip": 0}
    assert diff.guard.passed  # 1 of 5 = 20%
    # a change feed names its deletions; nothing else vanishes
    feed = diff_documents("s", [_doc("a")], state, Settings(), full_listing=False, deleted_ids=["c", "zz"])
    assert [i.source_id for i in feed.vanished] == ["c"] and feed.mode == "changes"
    # the feed does not mention failed documents: the index does (index_retries)
    state["f"] = _indexed("f", status="failed", failures=1, updated=NOW - timedelta(hours=1))
    retried = diff_documents("s", [], state, Settings(), full_listing=False, index_retries=True)
    assert [(p.doc.source_id, p.decision) for p in retried.work] == [("f", Decision.RETRY)]


@pytest.mark.parametrize("change, differs", [
    ({}, False),  # the same attempt: the same token, whatever the tick
    ({"doc": _doc("x", "b" * 64)}, True),  # new content
    ({"doc": _doc("x", title="renamed")}, True),  # a rename (metadata only)
    ({"indexed": _indexed("x", version=2)}, True),  # content A -> B -> A again: the index version moved on
    ({"indexed": _indexed("x", failures=1)}, True),  # one more failure: the next attempt
    ({"indexed": _indexed("x", status="deleted")}, True),  # a tombstone revived with the same content
])
def test_attempt_token(change, differs):
    base = PlannedDocument(_doc("x"), Decision.CHANGE, _indexed("x"))
    other = PlannedDocument(change.get("doc", base.doc), Decision.CHANGE, change.get("indexed", base.indexed))
    assert (other.attempt_token != base.attempt_token) is differs


def test_failed_attempts_count_once_per_key_and_new_content_restarts(store, folder):
    ids = index_folder(store, folder, names=["bees.md", "tides.txt"])
    with store.connection() as conn:
        def record(conn, document_id, **kw):
            return w.record_failure(conn, document_id, kind="transient", **kw)

        first = record(conn, ids["bees.md"], attempt_key="run-1", reason="timeout", max_failures=3)
        again = record(conn, ids["bees.md"], attempt_key="run-1", reason="timeout", max_failures=3)
        assert (first.status, first.failure_count, first.recorded) == ("failed", 1, True)
        assert (again.failure_count, again.recorded) == (1, False)  # a re-delivered failure
        second = record(conn, ids["bees.md"], attempt_key="run-2", reason="timeout", max_failures=3)
        assert second.failure_count == 2
        fresh = record(conn, ids["bees.md"], attempt_key="run-3", reason="timeout", max_failures=3,
                       seen_sha256="c" * 64)  # the attempt was for new content: a fresh budget
        assert (fresh.status, fresh.failure_count, fresh.became_permanent) == ("failed", 1, False)
        for n in (4, 5):
            last = record(conn, ids["bees.md"], attempt_key=f"run-{n}", reason="timeout", max_failures=3,
                          seen_sha256="c" * 64)
        assert (last.status, last.failure_count, last.became_permanent) == ("permanently_failed", 3, True)
        after = record(conn, ids["bees.md"], attempt_key="run-6", reason="timeout", max_failures=3)
        assert (after.status, after.recorded) == ("permanently_failed", False)
        # the previous complete version stays searchable throughout
        assert check_sql.chunk_counts(conn, [ids["bees.md"]])[ids["bees.md"]].stored == 1
        ledger = conn.execute("SELECT attempt_key FROM document_failures ORDER BY attempt_key").fetchall()
        assert [r[0] for r in ledger] == [f"run-{n}" for n in range(1, 7)]  # each attempt once


def test_pending_deletions_are_guarded_and_go_stale(store, folder):
    ids = index_folder(store, folder)
    source = LocalFolderSource(folder)
    settings = Settings(database_url=store.url)
    (folder / "comets.md").unlink()
    with store.connection() as conn:
        ctx = RunContext(conn, source.name, settings, "test:purge")

        def purge():
            return [(o.document_id, o.source_id) for o in purge_deletions(ctx)]

        diff = take_inventory(source, conn, settings)
        assert diff.guard.passed and staging.pending_deletions(conn, source.name) == [(ids["comets.md"], "comets.md")]
        # seen again after the inventory (e.g. restored and re-ingested): kept
        conn.execute("UPDATE documents SET last_seen_at = clock_timestamp() WHERE id = %s", (ids["comets.md"],))
        assert purge() == []
        take_inventory(source, conn, settings)
        # an old pending list is not applied: the listing behind it is stale
        conn.execute("UPDATE pending_deletions SET detected_at = detected_at - interval '2 hours'")
        assert purge() == []
        take_inventory(source, conn, settings)
        assert purge() == [(ids["comets.md"], "comets.md")]
        assert check_sql.chunk_counts(conn, [ids["comets.md"]])[ids["comets.md"]].passed  # tombstone: no chunks
        # a failed guard empties the list: nothing can be purged afterwards
        for name in ("bees.md", "tides.txt"):
            (folder / name).unlink()
        tripped = take_inventory(source, conn, settings)
        assert not tripped.guard.passed and staging.pending_deletions(conn, source.name) == []


@pytest.mark.parametrize("status, version, expected, stored, other, passed", [
    ("completed", 2, 3, 3, 0, True),  # the current version complete
    ("completed", 2, 3, 2, 0, False),  # a row missing
    ("completed", 2, 3, 3, 1, False),  # a row of another version left behind
    ("pending", 0, None, 0, 0, True),  # never written: nothing expected, nothing stored
    ("failed", 1, 2, 2, 0, True),  # failed update: the previous version still complete
    ("deleted", 1, 0, 1, 0, False),  # a tombstone with chunks
])
def test_chunk_count_semantics(status, version, expected, stored, other, passed):
    count = check_sql.ChunkCount(1, "s", "x", status, version, expected, stored, other)
    assert count.passed is passed


def test_daily_reconciliation_job(instance, folder, database_url, store):
    spec = spec_for(folder)
    index_folder(store, folder)
    instance.add_dynamic_partitions(documents.name, ["docs:comets.md", "docs:bees.md"])
    job = build_reconcile_job(spec)
    (folder / "comets.md").unlink()  # 1 of 5: within the guard
    result = job.execute_in_process(resources=resources_for(database_url, [spec]), instance=instance)
    assert result.success
    assert instance.get_dynamic_partitions(documents.name) == ["docs:bees.md"]
    (output,) = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    metadata = {k: v.value for k, v in output.step_output_data.metadata.items()}
    assert (metadata["deleted"], metadata["count_skipped-unchanged"], metadata["guard_passed"]) == (1, 4, True)
    for name in ("bees.md", "tides.txt"):  # 2 of 4: the guard trips and the run fails, nothing deleted
        (folder / name).unlink()
    tripped = job.execute_in_process(resources=resources_for(database_url, [spec]), instance=instance,
                                     raise_on_error=False)
    assert not tripped.success
    (failure,) = [e for e in tripped.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "would delete 2 of 4 documents (50%)" in failure.step_failure_data.user_failure_data.description
    with store.connection() as conn:
        assert conn.execute("SELECT count(*) FROM documents WHERE status = 'completed'").fetchone()[0] == 4
