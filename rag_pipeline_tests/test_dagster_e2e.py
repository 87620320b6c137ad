"""End to end: ``dagster-webserver`` and ``dagster-daemon`` on 127.0.0.1 with a temporary DAGSTER_HOME
(the repository's dagster.yaml, SQLite storage), the diff sensor finding a folder of corpus files, the
daemon running the document runs, and the asset-check results read back over GraphQL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import requests

from rag_pipeline_tests.test_dagster_helpers import copy_corpus

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FILES = ["simple-table.md", "stanley-cups.csv", "fake-memo.pdf"]

CHECKS_QUERY = """
query Checks($path: [String!]!, $check: String!) {
  assetCheckExecutions(assetKey: {path: $path}, checkName: $check, limit: 20) {
    runId status partition
    evaluation { success description metadataEntries { label ... on IntMetadataEntry { intValue } } }
  }
}
"""
RUNS_QUERY = """
query { runsOrError(limit: 50) { ... on Runs { results { runId jobName status tags { key value } } } } }
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(port: int, query: str, variables: dict | None = None) -> dict:
    response = requests.post(f"http://127.0.0.1:{port}/graphql", json={"query": query, "variables": variables or {}},
                             timeout=30)
    response.raise_for_status()
    body = response.json()
    assert "errors" not in body, body
    return body["data"]


def _wait(what: str, condition, timeout_s: float, logs: list[Path], interval_s: float = 2.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    tails = "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-4000:]}" for p in logs if p.exists())
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}\n{tails}")


def _stop(process: subprocess.Popen) -> None:
    """Stop a process this test started, with the process group it leads (its code servers, run workers)."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=10)


def _checks(port: int, path: list[str], check: str) -> list[dict]:
    return _graphql(port, CHECKS_QUERY, {"path": path, "check": check})["assetCheckExecutions"]


@pytest.mark.slow
def test_webserver_daemon_sensor_runs_and_checks_over_graphql(tmp_path, database_url, shared_dir):
    corpus = copy_corpus(shared_dir, tmp_path / "corpus", FILES)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")  # what local development uses
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAG_", "DAGSTER_"))}
    env.update(DAGSTER_HOME=str(home), RAG_DATABASE_URL=database_url, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONUNBUFFERED="1", RAG_SOURCES=json.dumps([{"name": "corpus", "kind": "local", "path": str(corpus),
                                                               "interval_s": 3}]))
    logs = [tmp_path / "webserver.log", tmp_path / "daemon.log"]
    processes: list[subprocess.Popen] = []
    try:
        def start(command: list[str], log: Path) -> None:
            with log.open("wb") as out:
                processes.append(subprocess.Popen([str(BIN / command[0]), *command[1:]], cwd=REPO, env=env,
                                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

        def server_up() -> bool:
            try:
                return requests.get(f"http://127.0.0.1:{port}/server_info", timeout=5).ok
            except requests.RequestException:
                return False

        # the webserver first: it creates the SQLite storage, which two processes creating at once can race on
        start(["dagster-webserver", "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"], logs[0])
        _wait("the webserver", server_up, 120, logs)
        start(["dagster-daemon", "run", "-w", "workspace.yaml"], logs[1])

        def completed() -> int:
            with psycopg.connect(database_url) as conn:
                return conn.execute("SELECT count(*) FROM documents WHERE status = 'completed'").fetchone()[0]

        def all_runs_done() -> list[dict] | None:
            runs = _graphql(port, RUNS_QUERY)["runsOrError"]["results"]
            busy = [r for r in runs if r["status"] in ("QUEUED", "NOT_STARTED", "STARTING", "STARTED")]
            return runs if runs and not busy and completed() == len(FILES) else None

        runs = _wait("the sensor's runs to finish", all_runs_done, 240, logs)
        by_job = {}
        for r in runs:
            by_job.setdefault(r["jobName"], []).append(r["status"])
        assert by_job["ingest_documents"] == ["SUCCESS"] * len(FILES), runs
        assert by_job["corpus_inventory"] == ["SUCCESS"], runs  # the first listing's inventory

        executions = _checks(port, ["document_embeddings"], "chunk_count_complete")
        assert sorted(e["partition"] for e in executions) == sorted(f"corpus:{f}" for f in FILES)
        for e in executions:
            assert e["status"] == "SUCCEEDED" and e["evaluation"]["success"]
            numbers = {m["label"]: m.get("intValue") for m in e["evaluation"]["metadataEntries"]}
            assert numbers["stored"] == numbers["expected"] >= 1 and numbers["other_versions"] == 0
        (guard,) = _checks(port, ["corpus", "source_inventory"], "deletion_guard")
        assert guard["status"] == "SUCCEEDED" and guard["evaluation"]["success"]

        # one of three files goes (33% > 20%): the next tick's inventory run fails its guard, nothing is deleted
        (corpus / "stanley-cups.csv").unlink()

        def guard_failed() -> dict | None:
            failed = [e for e in _checks(port, ["corpus", "source_inventory"], "deletion_guard")
                      if e["status"] == "FAILED"]
            return failed[0] if failed else None

        tripped = _wait("the deletion guard to fail", guard_failed, 120, logs)
        assert tripped["evaluation"]["description"] == (
            "would delete 1 of 3 documents (33%), more than the allowed 20%: nothing deleted (if that is right: "
            "--confirm-delete 1)")
        assert completed() == len(FILES)
    finally:
        for process in processes:
            _stop(process)
