"""``source_diff_sensor`` evaluated with ``dg.build_sensor_context`` against a real folder and the embedded
PostgreSQL: new, changed, deleted documents, the deletion guard, retries of failed documents, and the
bookkeeping (partitions, run keys, backpressure)."""

from __future__ import annotations

import hashlib
import json
import re

import dagster as dg
import psycopg
import pytest
from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus

from rag_pipeline.config import Settings
from rag_pipeline.defs.documents.jobs import ingest_job
from rag_pipeline.defs.documents.partitions import documents
from rag_pipeline.defs.ingestion.resources import SettingsResource
from rag_pipeline.defs.sources.config import spec_from_dict
from rag_pipeline.defs.sources.jobs import build_inventory_job
from rag_pipeline.defs.sources.sensors import build_source_diff_sensor, source_diff_tick
from rag_pipeline.sources.base import ChangeSet, Inventory, SourceDocument
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline_tests.test_dagster_helpers import (  # noqa: F401  (fixtures)
    TEXTS,
    folder,
    index_folder,
    instance,
    keys_for,
    resources_for,
    spec_for,
)


def tick(instance, spec, database_url, *, cursor=None, apply_partitions=True, **settings_overrides):
    """Evaluate the sensor once; apply its partition requests to ``instance`` like the daemon does."""
    sensor = build_source_diff_sensor(spec, ingest_job, build_inventory_job(spec))
    resources = resources_for(database_url, [spec])
    if settings_overrides:
        resources["rag_settings"] = SettingsResource(
            overrides=json.dumps({"database_url": database_url, **settings_overrides}))
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources)
    result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    if apply_partitions:
        for request in result.dynamic_partitions_requests or []:
            if isinstance(request, dg.AddDynamicPartitionsRequest):
                instance.add_dynamic_partitions(documents.name, list(request.partition_keys))
            else:
                for key in request.partition_keys:
                    instance.delete_dynamic_partition(documents.name, key)
    return result


def document_runs(result: dg.SensorResult) -> dict[str, dg.RunRequest]:
    return {r.partition_key: r for r in result.run_requests if r.job_name == "ingest_documents"}


def inventory_runs(result: dg.SensorResult) -> list[dg.RunRequest]:
    return [r for r in result.run_requests if r.job_name == "docs_inventory"]


def test_new_documents_get_partitions_and_runs(instance, folder, database_url):
    spec = spec_for(folder)
    first = tick(instance, spec, database_url)
    keys = keys_for(spec, sorted(TEXTS))
    (add,) = first.dynamic_partitions_requests
    assert isinstance(add, dg.AddDynamicPartitionsRequest) and sorted(add.partition_keys) == keys
    runs = document_runs(first)
    assert sorted(runs) == keys
    bees = runs["docs:bees.md"]
    assert bees.tags == {"rag/source": "docs", "rag/decision": "add"}
    listing = json.loads(bees.run_config["ops"]["document_markdown"]["config"]["listing"])
    stat = (folder / "bees.md").stat()  # a local listing is stat-only: its version is size and mtime
    assert listing["source_id"] == "bees.md" and listing["source_version"] == f"{stat.st_size}:{stat.st_mtime_ns}"
    # the very first tick also materializes the inventory (guard check included), without purging
    (inventory,) = inventory_runs(first)
    assert inventory.asset_selection == [dg.AssetKey(["docs", "source_inventory"]), dg.AssetKey(["docs", "purge_deleted_documents"])]

    # nothing changed: the same run keys again (Dagster drops duplicates), no partitions to add
    second = tick(instance, spec, database_url, cursor=first.cursor)
    assert not second.dynamic_partitions_requests
    assert {k: r.run_key for k, r in document_runs(second).items()} == {k: r.run_key for k, r in runs.items()}
    assert not inventory_runs(second)


def test_only_changed_documents_are_requested(instance, folder, database_url, store):
    spec = spec_for(folder)
    index_folder(store, folder)
    rebuilt = tick(instance, spec, database_url, cursor="{}")
    # the index is the truth: partitions are rebuilt from the listing, no document needs a run
    assert not rebuilt.run_requests and len(instance.get_dynamic_partitions(documents.name)) == 5
    quiet = tick(instance, spec, database_url, cursor=rebuilt.cursor)
    assert not quiet.run_requests and quiet.skip_reason.skip_message == "5 listed, nothing to do"

    (folder / "tides.txt").write_text("Tides rise and fall twice a day.\n")
    changed = tick(instance, spec, database_url, cursor=quiet.cursor)
    (run,) = changed.run_requests
    assert (run.partition_key, run.tags["rag/decision"]) == ("docs:tides.txt", "change")
    assert run.run_key.startswith("docs:tides.txt|") and run.run_key.endswith("-ch-vc1-f0")  # change, completed v1


def test_deletion_within_guard_requests_inventory_and_purge(instance, tmp_path, database_url, store):
    folder = tmp_path / "docs"
    folder.mkdir()
    for n in range(6):
        (folder / f"note{n}.txt").write_text(f"Note number {n} about a different topic.\n")
    spec = spec_for(folder)
    index_folder(store, folder)
    first = tick(instance, spec, database_url, cursor="{}")
    assert not first.run_requests
    (folder / "note3.txt").unlink()  # 1 of 6 = 17%, within the 20% guard
    result = tick(instance, spec, database_url, cursor=first.cursor)
    (inventory,) = inventory_runs(result)
    assert inventory.asset_selection == [dg.AssetKey(["docs", "source_inventory"]),
                                         dg.AssetKey(["docs", "purge_deleted_documents"])]
    assert inventory.tags["rag/reason"] == "deletions"
    assert not document_runs(result)
    # the vanished document keeps its partition until the purge removes it
    assert "docs:note3.txt" in instance.get_dynamic_partitions(documents.name)


@pytest.mark.parametrize("case", ["too_many", "empty", "missing"])
def test_guard_trip_requests_inventory_without_purge(instance, folder, database_url, store, case):
    spec = spec_for(folder)
    index_folder(store, folder)
    if case == "too_many":  # 2 of 5 = 40% > 20%
        (folder / "bees.md").unlink()
        (folder / "tides.txt").unlink()
        reason = ("would delete 2 of 5 documents (40%), more than the allowed 20%: nothing deleted (if that is "
                  "right: --confirm-delete 2)")
    elif case == "empty":  # an unmounted share looks like an empty folder
        for f in folder.iterdir():
            f.unlink()
        reason = ("empty listing while the index holds 5 documents of this source: nothing deleted (a source "
                  "really emptied: --confirm-delete 5, or `rag-pipeline sources retire`)")
    else:
        folder.rename(folder.with_name("elsewhere"))
        reason = f"listing incomplete (listing failed: source folder {folder} does not exist or is not a directory): nothing deleted"
    result = tick(instance, spec, database_url, cursor="{}")
    (inventory,) = inventory_runs(result)
    assert inventory.asset_selection == [dg.AssetKey(["docs", "source_inventory"])]  # no purge requested
    assert inventory.tags["rag/reason"] == "guard" and inventory.tags["rag/guard"] == reason
    assert not document_runs(result)
    # partitions of listed documents are (re)added, but nothing is dropped on a failed guard
    assert not [r for r in result.dynamic_partitions_requests if isinstance(r, dg.DeleteDynamicPartitionsRequest)]
    # the same situation on the next tick maps to the same run key: one alert a day, not one per tick
    again = tick(instance, spec, database_url, cursor=result.cursor)
    assert inventory_runs(again)[0].run_key == inventory.run_key
    with store.connection() as conn:
        assert conn.execute("SELECT count(*) FROM documents WHERE status = 'completed'").fetchone()[0] == 5


def test_failed_documents_are_retried_with_backoff(instance, folder, database_url, store):
    spec = spec_for(folder)
    ids = index_folder(store, folder, names=["bees.md", "tides.txt", "volcano.md"])
    with store.connection() as conn:  # the states the failure sensor leaves behind
        conn.execute("UPDATE documents SET status = 'failed', failure_count = 1, last_error = 'timeout' WHERE id = %s",
                     (ids["bees.md"],))
        conn.execute("UPDATE documents SET status = 'permanently_failed', failure_count = 3, last_error = 'timeout', "
                     "seen_sha256 = content_sha256 WHERE id = %s", (ids["tides.txt"],))
        conn.execute("UPDATE documents SET status = 'failed', failure_count = 2, last_error = 'timeout', "
                     "seen_sha256 = content_sha256 WHERE id = %s", (ids["volcano.md"],))
    for name in ("glaciers.txt", "comets.md"):
        (folder / name).unlink()  # keep only the three indexed documents listed

    # within the backoff (1 h * 2**(n-1)): nothing is retried yet
    waiting = tick(instance, spec, database_url, cursor="{}", retry_backoff_s=3600)
    assert not document_runs(waiting)
    # backoff elapsed (0 s): both failed documents are retried; the permanently failed one is not
    due = tick(instance, spec, database_url, cursor="{}", retry_backoff_s=0)
    runs = document_runs(due)
    assert sorted(runs) == ["docs:bees.md", "docs:volcano.md"]
    assert runs["docs:bees.md"].tags["rag/decision"] == "retry" and runs["docs:bees.md"].run_key.endswith("-f1")
    assert runs["docs:volcano.md"].run_key.endswith("-f2")
    # a permanently failed document comes back only when its content changes
    (folder / "tides.txt").write_text("Neap tides happen at the quarter moons.\n")
    changed = document_runs(tick(instance, spec, database_url, cursor="{}", retry_backoff_s=3600))
    assert list(changed) == ["docs:tides.txt"] and changed["docs:tides.txt"].tags["rag/decision"] == "change"


def test_in_flight_runs_limit_requests(instance, folder, database_url):
    spec = spec_for(folder, max_inflight_runs=3)
    instance.add_run(DagsterRun(job_name="ingest_documents", run_id="inflight-1", status=DagsterRunStatus.STARTED,
                                tags={"rag/source": "docs", "dagster/partition": "docs:bees.md"}))
    result = tick(instance, spec, database_url)
    runs = document_runs(result)
    # 3 allowed in flight, 1 running: 2 more, never the running one; the others wait for a later tick
    assert len(runs) == 2 and "docs:bees.md" not in runs
    assert json.loads(result.cursor)["waiting"] == 2


def test_stale_partitions_are_dropped_after_a_complete_listing(instance, folder, database_url):
    spec = spec_for(folder)
    instance.add_dynamic_partitions(documents.name, ["docs:long-gone.md", "other:kept.md"])
    result = tick(instance, spec, database_url, apply_partitions=False)
    deletes = [r for r in result.dynamic_partitions_requests if isinstance(r, dg.DeleteDynamicPartitionsRequest)]
    assert [list(r.partition_keys) for r in deletes] == [["docs:long-gone.md"]]  # another source's key is kept


def test_one_tick_is_fast_for_an_unchanged_source(instance, folder, database_url, store, monkeypatch):
    spec = spec_for(folder)
    index_folder(store, folder)
    tick(instance, spec, database_url, cursor="{}")
    statements, listings = [], []
    real_execute, real_list = psycopg.Cursor.execute, LocalFolderSource.list_documents

    def execute(self, query, *args, **kwargs):
        statements.append(" ".join(str(query.as_string(self) if hasattr(query, "as_string") else query).split()))
        return real_execute(self, query, *args, **kwargs)

    def list_documents(self, *args, **kwargs):
        listings.append(kwargs.get("verify", False))
        return real_list(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", execute)
    monkeypatch.setattr(LocalFolderSource, "list_documents", list_documents)
    monkeypatch.setattr(LocalFolderSource, "fetch_to", lambda self, doc, out: pytest.fail(f"the tick fetched {doc.source_id}"))
    quiet = tick(instance, spec, database_url, cursor="{}")
    # work, not time (the scale figures are in benchmarks/bench_sensor.py): one stat-only listing, no
    # fetch, two SQL statements (the index state from documents.chunk_count: no chunk-table count; the kept
    # embedding generations, a table of a few rows), no write
    assert listings == [False]
    queries = [q for q in statements if "FROM pg_type" not in q]  # psycopg/pgvector type registration
    assert len(queries) == 2 and queries[0].startswith("SELECT d.id, d.source_id") and "d.chunk_count" in queries[0]
    assert queries[1].startswith("SELECT id, model") and "FROM embedding_generations" in queries[1]
    assert not [q for q in statements if re.search(r"\bchunks\b|^(INSERT|UPDATE|DELETE)\b", q, re.I)]
    assert not quiet.run_requests and not quiet.dynamic_partitions_requests
    assert quiet.skip_reason.skip_message == "5 listed, nothing to do"


class FeedSource:
    """A source with a change feed (like Zotero or Drive), held in memory: ``docs`` by id, a version counter,
    and the feed's upserts and deletions since each version."""

    name = "feed:test"

    def __init__(self) -> None:
        self.docs: dict[str, SourceDocument] = {}
        self.version = 0
        self.log: list[tuple[int, str, str]] = []  # (version, op, source_id)
        self.feed_reads: list[str | None] = []

    def put(self, sid: str, text: str) -> None:
        self.version += 1
        sha = hashlib.sha256(text.encode()).hexdigest()
        self.docs[sid] = SourceDocument(source_id=sid, title=sid, uri=f"feed://{sid}", content_sha256=sha,
                                        source_version=str(self.version))
        self.log.append((self.version, "put", sid))

    def delete(self, sid: str) -> None:
        self.version += 1
        del self.docs[sid]
        self.log.append((self.version, "delete", sid))

    def list_documents(self) -> Inventory:
        return Inventory(documents=list(self.docs.values()), complete=True, cursor=str(self.version))

    def changes(self, cursor: str | None) -> ChangeSet:
        self.feed_reads.append(cursor)
        since = int(cursor or 0)
        ups = {sid for v, op, sid in self.log if v > since and op == "put" and sid in self.docs}
        gone = [sid for v, op, sid in self.log if v > since and op == "delete" and sid not in self.docs]
        return ChangeSet(upserts=[self.docs[s] for s in sorted(ups)], deleted_ids=gone, next_cursor=str(self.version))

    def fetch(self, document: SourceDocument) -> bytes:
        raise NotImplementedError


def test_change_feed_is_used_and_not_skipped_past_waiting_documents(instance, database_url, store):
    source = FeedSource()
    for n in range(6):
        source.put(f"item{n}", f"text {n}")
    spec = spec_from_dict({"name": "zot", "kind": "zotero", "library": "users/1", "max_inflight_runs": 4})
    settings = Settings(database_url=database_url)

    def feed_tick(cursor):
        context = dg.build_sensor_context(instance=instance, cursor=cursor)
        return source_diff_tick(context, spec, source, store, settings, ingest_job_name="ingest_documents",
                                inventory_job_name="zot_inventory")

    first = feed_tick(None)  # no cursor: a full listing; 6 new documents, 4 run slots
    assert len(document_runs(first)) == 4 and source.feed_reads == []
    assert json.loads(first.cursor) == {**json.loads(first.cursor), "feed": None, "waiting": 2}  # stay on listings
    with store.connection() as conn:  # the first four got written meanwhile
        for doc in list(source.docs.values())[:4]:
            conn.execute("INSERT INTO documents (source, source_id, status, version, content_sha256, seen_sha256, "
                         "source_version, seen_source_version, title, uri, expected_chunk_count, chunk_count, "
                         "generations) VALUES (%s, %s, 'completed', 1, %s, %s, %s, %s, %s, %s, 1, 1, '{1}')",
                         (source.name, doc.source_id, doc.content_sha256, doc.content_sha256, doc.source_version,
                          doc.source_version, doc.title, doc.uri))
    second = feed_tick(first.cursor)
    assert sorted(document_runs(second)) == ["zot:item4", "zot:item5"] and source.feed_reads == []
    assert json.loads(second.cursor)["feed"] == "6"  # everything requested: from now on, the feed
    source.put("item1", "text 1, edited")
    source.delete("item2")
    third = feed_tick(second.cursor)
    assert source.feed_reads == ["6"]
    # only what the feed reports; item4/item5 were requested by the second tick (their runs create their rows,
    # and a failed one is recorded by the failure sensor, so the index brings it back as a retry)
    assert {k: r.tags["rag/decision"] for k, r in document_runs(third).items()} == {"zot:item1": "change"}
    (inventory,) = [r for r in third.run_requests if r.job_name == "zot_inventory"]
    # the feed's tombstones go through the same fraction guard: 1 of the 4 indexed is 25% > 20%
    assert inventory.tags["rag/guard"].startswith("would delete 1 of 4 documents (25%)")
    assert inventory.asset_selection == [dg.AssetKey(["zot", "source_inventory"])]
    # the guard held the tombstone back: the feed position stays, so the next tick sees it again (and the
    # override applies it), as the CLI's sync keeps its cursor (pipeline.inventory.cursor_after)
    assert json.loads(third.cursor)["feed"] == "6"
    fourth = feed_tick(third.cursor)
    assert source.feed_reads == ["6", "6"]
    assert [r for r in fourth.run_requests if r.job_name == "zot_inventory"][0].tags["rag/guard"].startswith(
        "would delete 1 of 4 documents (25%)")
