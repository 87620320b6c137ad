"""Per-document and per-source assets materialized in-process against the embedded PostgreSQL and the real
model: metadata, the chunk-count and deletion-guard checks, the re-embed backfill in batches, the guarded
purge, the index-wide checks, and the failure count across three failing runs."""

from __future__ import annotations

import json

import dagster as dg
from dagster._core.events import DagsterEventType

from rag_pipeline.defs.documents.assets import document_embeddings
from rag_pipeline.defs.documents.checks import INDEX_CHECKS
from rag_pipeline.defs.documents.jobs import index_checks_job
from rag_pipeline.defs.documents.partitions import documents
from rag_pipeline.defs.documents.sensors import document_failure_sensor
from rag_pipeline.defs.sources.assets import build_source_assets
from rag_pipeline.config import Settings
from rag_pipeline.defs.ingestion.resources import EmbedderResource
from rag_pipeline.embedding.sentence_transformers import BUNDLED_MODEL, SentenceTransformerEmbedder, resolve_model_path
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.store import generations as gens
from rag_pipeline_tests.test_dagster_helpers import (  # noqa: F401  (fixtures)
    DOCUMENT_ASSETS,
    check_results,
    copy_corpus,
    folder,
    instance,
    keys_for,
    materialize_batch,
    materialize_document,
    metadata_of,
    resources_for,
    spec_for,
    write_folder,
)

PER_DOCUMENT_KEYS = {"characters", "pages", "characters_per_page", "chunks", "model", "duration_s", "skip_reason",
                     "preview", "action", "status", "version"}


def run_index_checks(resources, instance) -> dict[str, dg.AssetCheckEvaluation]:
    """Execute the ``index_checks`` job (the hourly schedule's target) and return its evaluations by name."""
    defs = dg.Definitions(assets=DOCUMENT_ASSETS, asset_checks=INDEX_CHECKS, jobs=[index_checks_job],
                          resources=resources)
    result = defs.resolve_job_def("index_checks").execute_in_process(instance=instance)
    evals = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(evals) == {c.check_key.name for c in INDEX_CHECKS}
    return evals


def _row(store, source_id: str):
    with store.connection() as conn:
        return conn.execute(
            "SELECT status, version, failure_count, last_error, chunk_count FROM documents WHERE source_id = %s",
            (source_id,)).fetchone()


def test_documents_materialize_with_metadata_and_checks(instance, tmp_path, database_url, store, shared_dir, httpserver):
    httpserver.expect_request("/hook").respond_with_data("ok")
    folder = write_folder(tmp_path / "docs", ["bees.md"])
    copy_corpus(shared_dir, folder, ["fake-memo.pdf", "empty.txt"])
    spec = spec_for(folder)
    resources = resources_for(database_url, [spec], webhook_url=httpserver.url_for("/hook"))
    bees, memo, empty = keys_for(spec, ["bees.md", "fake-memo.pdf", "empty.txt"])

    result = materialize_document(instance, resources, memo)
    md = metadata_of(result, "document_markdown")[memo]
    assert PER_DOCUMENT_KEYS <= set(md)
    assert md["action"] == "extracted" and md["pages"] == 1 and md["characters"] > 100
    assert md["characters_per_page"] == md["characters"] and "20,000 bottles of water" in md["preview"]
    chunks_md = metadata_of(result, "document_chunks")[memo]
    written = metadata_of(result, "document_embeddings")[memo]
    assert written["action"] == "added" and written["model"] == "all-MiniLM-L6-v2"
    assert written["chunks"] == chunks_md["chunks"] >= 1 and written["version"] == 1 and written["skip_reason"] == ""
    check = check_results(result, "chunk_count_complete")[memo]
    assert check.passed and check.metadata["stored"].value == check.metadata["expected"].value == written["chunks"]
    assert _row(store, "fake-memo.pdf")[:2] == ("completed", 1)

    # the same content again: nothing re-extracted or re-embedded, the check still holds
    again = materialize_document(instance, resources, memo)
    assert metadata_of(again, "document_markdown")[memo]["skip_reason"] == "content unchanged"
    assert metadata_of(again, "document_embeddings")[memo]["skip_reason"] == "embeddings up to date"
    assert check_results(again, "chunk_count_complete")[memo].passed
    assert _row(store, "fake-memo.pdf")[:2] == ("completed", 1)

    # nothing to index: skipped at once (not a failure), the run itself succeeds, no alert
    skipped = materialize_document(instance, resources, empty)
    assert metadata_of(skipped, "document_markdown")[empty]["skip_reason"] == "empty"
    assert metadata_of(skipped, "document_markdown")[empty]["action"] == "skipped"
    assert metadata_of(skipped, "document_embeddings")[empty]["skip_reason"] == "nothing staged: no new content"
    assert check_results(skipped, "chunk_count_complete")[empty].passed  # nothing indexed, nothing expected
    assert _row(store, "empty.txt")[0] == "skipped"
    assert httpserver.log == []

    # the index-wide checks: no mixed versions, nothing permanently failed (skipped is not), one model
    evals = run_index_checks(resources, instance)
    assert evals["index_versions_unique"].passed
    assert evals["no_permanently_failed_documents"].passed
    assert evals["embedding_generation_progress"].passed
    assert materialize_document(instance, resources, bees).success


def _model_copy(tmp_path):
    """The bundled model's directory under another path: another model id, the same weights."""
    copy = tmp_path / "minilm-copy"
    if not copy.exists():
        copy.symlink_to(resolve_model_path(BUNDLED_MODEL), target_is_directory=True)
    return copy


def test_reembed_backfill_runs_in_batches_without_extraction(instance, tmp_path, database_url, store):
    folder = write_folder(tmp_path / "docs", ["bees.md", "tides.txt", "volcano.md"])
    spec = spec_for(folder)
    resources = resources_for(database_url, [spec])
    keys = keys_for(spec, ["bees.md", "tides.txt", "volcano.md"])
    assert materialize_batch(instance, resources, keys).success  # the initial load, one batch
    with store.connection() as conn:
        before = conn.execute("SELECT document_id, ordinal, text FROM chunks ORDER BY 1, 2").fetchall()
        # a new model is configured (another model id, the same weights): its generation is created
        # beside the active one and two documents are already in it; the warning check shows the progress
        new = SentenceTransformerEmbedder(str(_model_copy(tmp_path)))
        g = gens.ensure_for(conn, new, Settings(database_url=database_url))
        conn.execute("UPDATE documents SET generations = array_append(generations, %s) WHERE source_id = 'volcano.md'",
                     (g.id,))
        conn.execute(f"INSERT INTO {g.table} SELECT e.* FROM chunk_embeddings_1 e JOIN chunks c ON c.id = e.chunk_id "
                     "JOIN documents d ON d.id = c.document_id WHERE d.source_id = 'volcano.md'")
    resources = {**resources, "embedder": EmbedderResource(model=str(_model_copy(tmp_path)))}
    progress = run_index_checks(resources, instance)["embedding_generation_progress"]
    assert not progress.passed and progress.severity == dg.AssetCheckSeverity.WARN
    assert progress.metadata["rollout_documents"].value == "1 / 3"
    assert progress.metadata["active_generation"].value == 1

    # the backfill: only document_embeddings, one ranged run over the three documents
    for sid in ("bees.md", "tides.txt", "volcano.md"):
        (folder / sid).unlink()  # proof that nothing is fetched or extracted again
    batch = materialize_batch(instance, resources, keys, assets=[document_embeddings])
    assert batch.success
    actions = {k: m["action"] for k, m in metadata_of(batch, "document_embeddings").items()}
    assert actions == {keys[0]: "re-embedded", keys[1]: "re-embedded", keys[2]: "skipped-unchanged"}
    per_partition = check_results(batch, "chunk_count_complete")
    assert {k for k in per_partition if k} == set(keys) and all(e.passed for e in per_partition.values())
    with store.connection() as conn:
        after = conn.execute("SELECT document_id, ordinal, text FROM chunks ORDER BY 1, 2").fetchall()
        versions = dict(conn.execute("SELECT source_id, version FROM documents").fetchall())
        logged = conn.execute("SELECT action, count(*) FROM ingest_log GROUP BY 1 ORDER BY 1").fetchall()
    assert after == before  # the same chunk texts, vectors added in the new generation (no new version)
    assert versions == {"bees.md": 1, "tides.txt": 1, "volcano.md": 1}
    with store.connection() as conn:  # the backfill completed the generation: it is the active one now
        assert gens.active(conn).id == g.id and gens.get(conn, 1).state == "retired"
    assert logged == [("added", 3), ("re-embedded", 2)]
    assert all(e.passed for e in run_index_checks(resources, instance).values())


def test_inventory_guard_and_purge(instance, tmp_path, database_url, store, httpserver):
    httpserver.expect_request("/hook").respond_with_data("ok")
    folder = write_folder(tmp_path / "docs")
    spec = spec_for(folder)
    resources = resources_for(database_url, [spec], webhook_url=httpserver.url_for("/hook"))
    keys = keys_for(spec, sorted(p.name for p in folder.iterdir()))
    assert materialize_batch(instance, resources, keys).success
    inventory, purge = build_source_assets(spec)

    (folder / "comets.md").unlink()  # 1 of 5 = 20%: allowed
    result = dg.materialize([inventory, purge], resources=resources, instance=instance)
    assert result.success
    (guard,) = result.get_asset_check_evaluations()
    assert guard.passed and guard.metadata["to_delete"].value == 1 and guard.metadata["indexed"].value == 5
    listed = metadata_of(result, "docs__source_inventory")[None]
    assert (listed["listed"], listed["complete"], listed["deleted"], listed["unchanged"]) == (4, True, 1, 4)
    assert metadata_of(result, "docs__purge_deleted_documents")[None]["deleted"] == 1
    assert _row(store, "comets.md") == ("deleted", 1, 0, None, 0)
    assert "docs:comets.md" not in instance.get_dynamic_partitions(documents.name)
    with store.connection() as conn:
        assert conn.execute("SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id "
                            "WHERE d.source_id = 'comets.md'").fetchone()[0] == 0

    for name in ("bees.md", "tides.txt"):  # 2 of 4 = 50%: the guard trips
        (folder / name).unlink()
    tripped = dg.materialize([inventory, purge], resources=resources, instance=instance, raise_on_error=False)
    assert not tripped.success  # a blocking check failed: the run fails, the purge never starts
    (guard,) = tripped.get_asset_check_evaluations()
    assert not guard.passed
    assert guard.description == ("would delete 2 of 4 documents (50%), more than the allowed 20%: nothing deleted "
                                 "(if that is right: --confirm-delete 2)")
    assert (guard.metadata["to_delete"].value, guard.metadata["indexed"].value) == (2, 4)
    assert not tripped.asset_materializations_for_node("docs__purge_deleted_documents")
    assert _row(store, "bees.md")[0] == "completed"
    (alert,) = [json.loads(req.get_data()) for req, _ in httpserver.log]
    assert alert["event"] == "deletion_guard" and alert["details"]["to_delete"] == 2

    # the explicit, logged override applies a real mass deletion
    override = dg.materialize([inventory, purge], resources=resources, instance=instance,
                              run_config={"ops": {"docs__source_inventory": {"config": {"allow_mass_delete": True}}}})
    assert override.success
    assert _row(store, "bees.md")[0] == "deleted" and _row(store, "tides.txt")[0] == "deleted"


def _fail_sensor(instance, resources, run_id: str):
    run = instance.get_run_by_id(run_id)
    (event,) = [r.dagster_event for r in instance.all_logs(run_id, of_type=DagsterEventType.RUN_FAILURE)]
    context = dg.build_run_status_sensor_context(
        sensor_name="document_failure_sensor", dagster_event=event, dagster_instance=instance, dagster_run=run,
        resources=resources).for_run_failure()
    return document_failure_sensor(context)


def test_failure_count_spans_runs_and_becomes_permanent(instance, tmp_path, database_url, store, httpserver):
    httpserver.expect_request("/hook").respond_with_data("ok")
    folder = write_folder(tmp_path / "docs", ["bees.md"])
    spec = spec_for(folder)
    resources = resources_for(database_url, [spec], webhook_url=httpserver.url_for("/hook"))
    (doc,) = LocalFolderSource(folder).list_documents(verify=True).documents  # as a hashing source lists it
    (key,) = keys_for(spec, ["bees.md"])
    listing = {"ops": {"document_markdown": {"config": {"listing": json.dumps(
        {"source_id": doc.source_id, "title": doc.title, "uri": doc.uri, "content_sha256": doc.content_sha256})}}}}
    (folder / "bees.md").rename(folder / "elsewhere.bin")  # listed by the sensor, gone when the run fetches it

    counts = []
    for attempt in range(3):
        run = materialize_document(instance, resources, key, run_config=listing, raise_on_error=False)
        assert not run.success
        retries = [e for e in run.all_events if e.event_type == DagsterEventType.STEP_UP_FOR_RETRY]
        assert len(retries) == 2  # the RetryPolicy retried inside the run before it failed
        assert _fail_sensor(instance, resources, run.run_id) is None
        counts.append(_row(store, "bees.md")[:3])
        if attempt == 0:  # the same failure delivered twice counts once
            _fail_sensor(instance, resources, run.run_id)
            assert _row(store, "bees.md")[2] == 1
    assert counts == [("failed", 0, 1), ("failed", 0, 2), ("permanently_failed", 0, 3)]
    assert _row(store, "bees.md")[3].startswith("cannot read bees.md")
    with store.connection() as conn:  # the attempts were for the listed content: recorded as seen
        assert conn.execute("SELECT seen_sha256 FROM documents WHERE source_id = 'bees.md'").fetchone()[0] == \
            doc.content_sha256
    (alert,) = [json.loads(req.get_data()) for req, _ in httpserver.log]
    assert alert["event"] == "permanently_failed" and alert["details"]["documents"][0]["source_id"] == "bees.md"
    assert "became permanently_failed" in alert["message"] and alert["details"]["max_failures"] == 3

    # the same content again stays given up on; new content is tried again and success resets the count
    (folder / "elsewhere.bin").rename(folder / "bees.md")
    same = materialize_document(instance, resources, key, run_config=listing)
    assert metadata_of(same, "document_markdown")[key]["action"] == "skipped-unchanged"
    assert metadata_of(same, "document_markdown")[key]["skip_reason"].startswith("cannot read bees.md")
    (folder / "bees.md").write_text("# Bees\n\nBees see ultraviolet light that people cannot.\n")
    assert materialize_document(instance, resources, key).success
    assert _row(store, "bees.md")[:3] == ("completed", 1, 0)


def test_index_versions_unique_fails_on_mixed_versions(instance, tmp_path, database_url, store):
    folder = write_folder(tmp_path / "docs", ["tides.txt"])
    spec = spec_for(folder)
    resources = resources_for(database_url, [spec])
    (key,) = keys_for(spec, ["tides.txt"])
    assert materialize_document(instance, resources, key).success
    with store.connection() as conn:  # what the swap transaction must never leave behind
        conn.execute("INSERT INTO chunks (id, document_id, version, ordinal, text, text_sha256, token_count) "
                     "SELECT id || 'x', document_id, version + 1, ordinal, text, text_sha256, token_count FROM chunks")
    evals = run_index_checks(resources, instance)
    assert not evals["index_versions_unique"].passed
    assert evals["index_versions_unique"].metadata["documents_with_mixed_versions"].value == 1
    assert evals["index_versions_unique"].metadata["examples"].value == [
        {"source": f"local:{folder}", "source_id": "tides.txt", "versions": [1, 2]}]


def test_a_deep_path_gets_a_digest_key_and_materializes(instance, tmp_path, database_url, store):
    """An id whose escaped key would pass ``MAX_KEY_BYTES`` (Dagster's PostgreSQL storage indexes partition
    keys; a btree entry holds ~2,700 bytes) gets a digest key; the run resolves it to the id and indexes the
    document. A digest key that names no listed document is refused: no row, nothing fetched."""
    from rag_pipeline.defs.documents.partitions import MAX_KEY_BYTES, is_digest_key, parse_document_partition_key

    root = tmp_path / "docs"
    parts = ["répertoire"] * 95
    root.joinpath(*parts).mkdir(parents=True)
    root.joinpath(*parts, "deep.md").write_text("# Deep\n\nThe archive kept its oldest maps at the very bottom.\n")
    sid = "/".join([*parts, "deep.md"])
    assert len(f"docs:{sid}".encode()) > MAX_KEY_BYTES  # the plain key would be over the bound
    spec = spec_for(root)
    resources = resources_for(database_url, [spec])
    (key,) = keys_for(spec, [sid])
    assert is_digest_key(key) and len(key.encode()) <= MAX_KEY_BYTES
    assert parse_document_partition_key(key) == ("docs", key.partition(":")[2])

    result = materialize_document(instance, resources, key)
    assert metadata_of(result, "document_embeddings")[key]["action"] == "added"
    assert check_results(result, "chunk_count_complete")[key].passed
    assert _row(store, sid)[:2] == ("completed", 1)
    again = materialize_document(instance, resources, key)  # resolved from the index row this time
    assert metadata_of(again, "document_markdown")[key]["skip_reason"] == "content unchanged"

    bogus = "docs:%#" + "0" * 64
    result = materialize_document(instance, resources, bogus, raise_on_error=False)
    reason = metadata_of(result, "document_markdown")[bogus]["skip_reason"]
    assert reason == f"partition {bogus[:80]}... names no document of source {LocalFolderSource(root).name}: refused"
    with store.connection() as conn:
        assert conn.execute("SELECT count(*) FROM documents").fetchone()[0] == 1
