"""The Dagster code location loads and validates (with and without configured sources), and the pure
helpers behind it: partition keys and the source configuration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from rag_pipeline.definitions import build_definitions
from rag_pipeline.defs.documents.partitions import document_partition_key, parse_document_partition_key
from rag_pipeline.defs.sources.config import load_source_specs

REPO = Path(__file__).resolve().parents[1]
DAGSTER = Path(sys.executable).with_name("dagster")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    return {**env, **extra}


@pytest.mark.parametrize("sources", ["", '[{"name": "docs", "kind": "local", "path": "/tmp"}]'])
def test_dagster_definitions_validate(tmp_path, sources):
    # the same command a developer runs; once with no environment at all, once with one source
    env = _clean_env(DAGSTER_HOME=str(tmp_path), **({"RAG_SOURCES": sources} if sources else {}))
    done = subprocess.run([str(DAGSTER), "definitions", "validate", "-w", "workspace.yaml"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "All code locations passed validation" in done.stdout + done.stderr


def _inventory(defs: dg.Definitions) -> tuple[set[str], set[str], set[str], set[str], set[str]]:
    repo = defs.get_repository_def()
    assets = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    checks = {f"{k.asset_key.to_user_string()}:{k.name}" for k in repo.asset_graph.asset_check_keys}
    return (assets, checks, {s.name for s in repo.sensor_defs}, {s.name for s in repo.schedule_defs},
            {j.name for j in repo.get_all_jobs()} - {"__ASSET_JOB"})


DOCUMENT_CHECKS = {"document_embeddings:chunk_count_complete", "document_embeddings:index_versions_unique",
                   "document_embeddings:no_permanently_failed_documents",
                   "document_embeddings:embedding_generation_progress"}


def test_defs_without_sources(monkeypatch):
    for key in [k for k in os.environ if k.startswith("RAG_")]:
        monkeypatch.delenv(key)
    from rag_pipeline.definitions import defs

    assets, checks, sensors, schedules, jobs = _inventory(defs())
    assert assets == {"document_markdown", "document_chunks", "document_embeddings", "dead_letter_report"}
    assert checks == DOCUMENT_CHECKS
    assert sensors == {"document_failure_sensor"}
    assert schedules == {"index_checks_hourly", "dead_letter_report_daily"}
    assert jobs == {"ingest_documents", "index_checks", "retry_failed_documents", "dead_letter_report_job"}


def test_defs_per_source(tmp_path):
    specs = load_source_specs({"RAG_SOURCES": json.dumps([
        {"name": "docs", "kind": "local", "path": str(tmp_path), "interval_s": 5},
        {"name": "papers", "kind": "zotero", "library": "users/1"}])})
    assets, checks, sensors, schedules, jobs = _inventory(build_definitions(specs))
    assert assets == {"document_markdown", "document_chunks", "document_embeddings", "dead_letter_report",
                      "docs/source_inventory", "docs/purge_deleted_documents", "docs/source_permissions",
                      "papers/source_inventory", "papers/purge_deleted_documents", "papers/source_permissions"}
    assert checks == DOCUMENT_CHECKS | {"docs/source_inventory:deletion_guard", "papers/source_inventory:deletion_guard",
                                        "docs/source_permissions:permissions_readable",
                                        "papers/source_permissions:permissions_readable"}
    assert sensors == {"document_failure_sensor", "docs_source_diff_sensor", "papers_source_diff_sensor",
                       "docs_permission_sensor", "papers_permission_sensor"}
    assert schedules == {"index_checks_hourly", "dead_letter_report_daily", "docs_daily_reconciliation",
                         "papers_daily_reconciliation"}
    assert jobs == {"ingest_documents", "index_checks", "retry_failed_documents", "dead_letter_report_job",
                    "docs_inventory", "docs_reconcile", "papers_inventory", "papers_reconcile",
                    "docs_permission_sync", "papers_permission_sync"}
    repo = build_definitions(specs).get_repository_def()
    sensor = repo.get_sensor_def("docs_source_diff_sensor")
    assert sensor.minimum_interval_seconds == 5
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    permission_sensor = repo.get_sensor_def("docs_permission_sensor")  # permission_interval_s default: 300
    assert permission_sensor.minimum_interval_seconds == 300
    assert permission_sensor.default_status == dg.DefaultSensorStatus.RUNNING
    # the deletion guard blocks the purge; the per-document check blocks nothing downstream but fails the run
    guard = repo.asset_graph.get_check_spec(dg.AssetCheckKey(dg.AssetKey(["docs", "source_inventory"]), "deletion_guard"))
    assert guard.blocking
    # sensor runs carry the per-document check but not the index-wide ones (they have their own job)
    ingest = repo.get_job("ingest_documents")
    assert {k.name for k in ingest.asset_layer.asset_graph.asset_check_keys} == {"chunk_count_complete"}


@pytest.mark.parametrize("source_id, key", [
    ("reports/2024/q1.pdf", "docs:reports/2024/q1.pdf"),  # slashes stay readable
    ("a,b[1]|c%d.txt", "docs:a%2Cb%5B1%5D%7Cc%25d.txt"),  # UI separators and the escape char are escaped
    ("notes...v2.md", "docs:notes.%2E%2Ev2.md"),  # '...' is Dagster's range separator
    ("tab\there\nnewline", "docs:tab%09here%0Anewline"),  # control characters are not allowed in keys
    ("議事録 2024.docx", "docs:議事録 2024.docx"),  # non-ASCII names stay as they are
    ("zotero:ABCD1234", "docs:zotero:ABCD1234"),  # the first ':' separates the source name
])
def test_partition_key_round_trip(source_id, key):
    assert document_partition_key("docs", source_id) == key
    assert parse_document_partition_key(key) == ("docs", source_id)
    assert "..." not in key


@pytest.mark.parametrize("key", ["nocolon", ":a.md", "bad name:a.md", "docs:", "1docs:a.md"])
def test_partition_key_rejects_foreign_keys(key):
    with pytest.raises(ValueError):
        parse_document_partition_key(key)


def test_source_config_precedence_and_defaults(tmp_path):
    # nothing configured: no sources (the location still loads)
    assert load_source_specs({}) == []
    # RAG_SOURCE_PATH alone: one local source named "local"
    (only,) = load_source_specs({"RAG_SOURCE_PATH": str(tmp_path)})
    assert (only.name, only.kind, only.source.path, only.interval_s, only.max_inflight_runs,
            only.reconcile_cron) == ("local", "local", str(tmp_path.resolve()), 60, 50, "0 3 * * *")
    # a YAML file wins over RAG_SOURCE_PATH, RAG_SOURCES wins over the file
    file = tmp_path / "sources.yaml"
    file.write_text("- name: archive\n  kind: local\n  path: /srv/archive\n  include: '*.pdf'\n")
    (from_file,) = load_source_specs({"RAG_SOURCES_FILE": str(file), "RAG_SOURCE_PATH": "/x"})
    assert (from_file.name, from_file.source.include) == ("archive", "*.pdf")
    (from_env,) = load_source_specs({"RAG_SOURCES": '[{"name": "n", "path": "/y"}]', "RAG_SOURCES_FILE": str(file)})
    assert from_env.name == "n"


@pytest.mark.parametrize("value, message", [
    ('{"name": "x"}', "must be a list of objects"),
    ('[{"name": "bad-name", "path": "/x"}]', "must match"),
    ('[{"name": "a", "kind": "ftp"}]', "unknown kind 'ftp'"),
    ('[{"name": "a", "kind": "local"}]', "needs a path"),
    ('[{"name": "a", "path": "/x", "colour": "red"}]', "unknown source field"),
    ('[{"name": "a", "path": "/x"}, {"name": "a", "path": "/y"}]', "duplicate source name"),
    ('[{"name": "a", "path": "/x", "interval_s": 0}]', "must be positive"),
    ("[not json", "not valid JSON"),
])
def test_source_config_errors(value, message):
    with pytest.raises(ValueError, match=message):
        load_source_specs({"RAG_SOURCES": value})


def test_instance_configs_validate_and_docker_storage_is_postgres(tmp_path, pg_server, monkeypatch):
    import psycopg
    import yaml

    # local development: ./dagster.yaml has no storage section, so Dagster keeps SQLite under DAGSTER_HOME
    local_home = tmp_path / "local"
    local_home.mkdir()
    (local_home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    with dg.DagsterInstance.from_config(str(local_home)) as local:
        assert type(local.run_storage).__name__ == "SqliteRunStorage"
        assert local.run_retries_enabled and local.run_retries_max_retries == 1
        assert not local.run_retries_retry_on_asset_or_op_failure

    # docker: docker/dagster.yaml stores runs, events and schedules in PostgreSQL (here: the embedded server)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS dagster_instance_test")
        conn.execute("CREATE DATABASE dagster_instance_test")
    info = psycopg.conninfo.conninfo_to_dict(pg_server)
    monkeypatch.setenv("DAGSTER_PG_HOST", "localhost")
    monkeypatch.setenv("DAGSTER_PG_USER", info.get("user") or "postgres")
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", "unused-with-local-trust")
    monkeypatch.setenv("DAGSTER_PG_DB", "dagster_instance_test")
    docker_home = tmp_path / "docker"
    docker_home.mkdir()
    config = yaml.safe_load((REPO / "docker" / "dagster.yaml").read_text().replace(
        "/opt/dagster/storage", str(tmp_path / "storage")))
    # the embedded server listens on a Unix socket only: libpq's ``host`` parameter points there
    config["storage"]["postgres"]["postgres_db"]["params"] = {"host": info["host"]}
    (docker_home / "dagster.yaml").write_text(yaml.safe_dump(config))
    with dg.DagsterInstance.from_config(str(docker_home)) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        assert not instance.run_retries_retry_on_asset_or_op_failure
        instance.add_dynamic_partitions("documents", ["docs:a.md", "docs:b.md"])
        assert instance.get_dynamic_partitions("documents") == ["docs:a.md", "docs:b.md"]
