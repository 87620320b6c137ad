"""The `rag-pipeline` command as a user runs it: a real process, the per-document report, exit codes."""

from __future__ import annotations

import os
import subprocess
import sys


def _cli(*args: str, database_url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAG_DATABASE_URL": database_url, "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "rag_pipeline.cli", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_sync_query_status_and_exit_codes(tmp_path, database_url):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "bees.md").write_text("# Bees\n\nHoney bees communicate the direction of flowers with a waggle dance.\n")
    (folder / "tides.txt").write_text("Tides are caused by the gravitational pull of the moon on the oceans.\n")
    (folder / "empty.txt").write_bytes(b"")

    first = _cli("sync", str(folder), database_url=database_url)
    assert first.returncode == 1, first.stdout + first.stderr  # one document did not end well
    out = first.stdout
    assert "bees.md" in out and "tides.txt" in out and "empty.txt" in out
    assert "permanently_failed" in out and "empty" in out
    assert "2 added" in out

    # nothing changed: the permanently failed file is left alone, and this run had no failure
    again = _cli("sync", str(folder), database_url=database_url)
    assert again.returncode == 0, again.stdout
    assert "3 skipped-unchanged" in again.stdout and "0 chunk texts embedded" in again.stdout

    answer = _cli("query", "why do bees dance?", "-k", "1", database_url=database_url)
    assert answer.returncode == 0, answer.stderr
    assert "bees.md" in answer.stdout and "waggle dance" in answer.stdout

    status = _cli("status", database_url=database_url)
    assert status.returncode == 1  # a document is permanently_failed
    assert "completed" in status.stdout and "empty.txt" in status.stdout

    audit = _cli("psql", "-A", "-t", "-c", "SELECT count(*) FROM documents WHERE status = 'completed'",
                 database_url=database_url)
    assert audit.returncode == 0 and audit.stdout.strip() == "2"

    (folder / "empty.txt").unlink()
    second = _cli("sync", str(folder), database_url=database_url)
    # 1 of 3 documents gone is 33%, over the 20% guard: nothing deleted, exit code 2, the reason printed
    assert second.returncode == 2, second.stdout
    assert "deletion guard" in second.stdout and "would delete 1 of 3" in second.stdout
    assert "kept (gone from the listing): empty.txt" in second.stdout
    third = _cli("sync", str(folder), "--allow-mass-delete", database_url=database_url)
    assert third.returncode == 0, third.stdout
    assert "1 deleted" in third.stdout


def test_a_sync_that_cannot_start_says_why_with_exit_code_4(tmp_path, database_url):
    missing = _cli("sync", str(tmp_path / "no-such-folder"), database_url=database_url)
    assert missing.returncode == 4 and "is not a folder" in missing.stdout
    unknown = _cli("sync", "--source", "dropbox", database_url=database_url)
    assert unknown.returncode == 4 and "unknown source kind 'dropbox'" in unknown.stdout
    assert "Traceback" not in missing.stdout + missing.stderr + unknown.stdout + unknown.stderr
