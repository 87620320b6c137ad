"""The operator's Dagster definitions: the ``retry_failed_documents`` job launched as from the UI, and the
``dead_letter_report`` asset with its notification."""

from __future__ import annotations

import json

import dagster as dg

from rag_pipeline.defs.operations.assets import dead_letter_report
from rag_pipeline.defs.operations.jobs import retry_failed_documents
from rag_pipeline_tests.test_dagster_helpers import (  # noqa: F401  (fixtures)
    DOCUMENT_ASSETS,
    copy_corpus,
    instance,
    keys_for,
    materialize_document,
    resources_for,
    spec_for,
    write_folder,
)


def test_dead_letter_report_and_retry_from_dagster(instance, tmp_path, database_url, store, shared_dir, httpserver):
    httpserver.expect_request("/hook").respond_with_data("ok")
    folder = write_folder(tmp_path / "docs", ["bees.md"])
    copy_corpus(shared_dir, folder, ["password.pdf"])
    spec = spec_for(folder)
    resources = resources_for(database_url, [spec], webhook_url=httpserver.url_for("/hook"))
    for key in keys_for(spec, ["bees.md", "password.pdf"]):
        materialize_document(instance, resources, key)  # a terminal failure fails no run: it is the document's state

    result = dg.materialize([dead_letter_report], resources=resources, instance=instance)
    (m,) = result.asset_materializations_for_node("dead_letter_report")
    meta = {k: v.value for k, v in m.metadata.items()}
    assert (meta["failed_documents"], meta["permanently_failed"], meta["reasons"]) == (1, 1, 1)
    assert "### password protected (1)" in meta["report"] and "| password.pdf | permanently_failed | 1 |" in meta["report"]
    alerts = [json.loads(r.get_data()) for r, _ in httpserver.log]
    dead = [a for a in alerts if a.get("event") == "dead_letter"]
    assert len(dead) == 1 and dead[0]["details"]["by_reason"] == {"password protected": 1}

    job = dg.Definitions(jobs=[retry_failed_documents], resources=resources).resolve_job_def("retry_failed_documents")
    run = job.execute_in_process(instance=instance, run_config={"ops": {"retry_documents": {"config": {
        "source": "docs", "reason": "the owner removed the password"}}}})
    assert run.success
    with store.connection() as conn:
        assert conn.execute("SELECT status, failure_count FROM documents WHERE source_id = 'password.pdf'").fetchone() \
            == ("pending", 0)
        (action, reason, run_id) = conn.execute(
            "SELECT action, reason, run_id FROM ingest_log WHERE source_id = 'password.pdf' ORDER BY id DESC LIMIT 1"
        ).fetchone()
    assert action == "retry-requested" and reason.startswith("the owner removed the password")
    assert run_id == f"dagster:{run.run_id}"
    # unknown ids fail the run and change nothing
    bad = job.execute_in_process(instance=instance, raise_on_error=False, run_config={"ops": {"retry_documents": {
        "config": {"source": "docs", "source_ids": ["nope.pdf"]}}}})
    assert not bad.success
