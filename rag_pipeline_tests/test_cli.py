"""The `rag-pipeline` command as a user runs it: a real process, the report, exit codes, and the operator's
commands (status, status --failed, retry, sources retire, the guard's override)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys


def _cli(*args: str, database_url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAG_DATABASE_URL": database_url, "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "rag_pipeline.cli", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def _sql(database_url: str, query: str, *params):
    import psycopg

    with psycopg.connect(database_url) as conn:
        return conn.execute(query, params).fetchall()


def test_sync_query_status_and_exit_codes(tmp_path, database_url):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "bees.md").write_text("# Bees\n\nHoney bees communicate the direction of flowers with a waggle dance.\n")
    (folder / "tides.txt").write_text("Tides are caused by the gravitational pull of the moon on the oceans.\n")
    (folder / "empty.txt").write_bytes(b"")

    first = _cli("sync", str(folder), database_url=database_url)
    assert first.returncode == 0, first.stdout + first.stderr  # an empty file is skipped, not a failure
    out = first.stdout
    assert "bees.md" in out and "tides.txt" in out and "empty.txt" in out
    assert "skipped" in out and "empty" in out and "permanently_failed" not in out
    assert "2 added" in out and "1 skipped" in out and "3 listed" in out

    # nothing changed: one summary line, no per-document rows
    again = _cli("sync", str(folder), database_url=database_url)
    assert again.returncode == 0, again.stdout
    assert "3 listed; 3 unchanged; 0 chunk texts embedded" in again.stdout
    assert "bees.md" not in again.stdout

    refused = _cli("query", "why do bees dance?", "-k", "1", database_url=database_url)
    assert refused.returncode == 2 and "--as PRINCIPAL" in refused.stdout + refused.stderr  # nobody named: refused
    # the files belong to this process's user (POSIX owner -> user:<login name>)
    owner = pwd.getpwuid(os.getuid()).pw_name
    answer = _cli("query", "why do bees dance?", "-k", "1", "--as", owner, database_url=database_url)
    assert answer.returncode == 0, answer.stderr
    assert "bees.md" in answer.stdout and "waggle dance" in answer.stdout
    stranger = _cli("query", "why do bees dance?", "-k", "1", "--as", "user:no-such-login-here",
                    "--json", database_url=database_url)
    (bees,) = [f for f in folder.iterdir() if f.name == "bees.md"]
    world_readable = bool(bees.stat().st_mode & 0o004)
    assert ("bees.md" in stranger.stdout) == world_readable, stranger.stdout  # only via `everyone`

    status = _cli("status", database_url=database_url)
    assert status.returncode == 0, status.stdout  # skipped documents are listed, not counted as failures
    assert "completed" in status.stdout and "1 document skipped" in status.stdout and "empty.txt (empty)" in status.stdout

    audit = _cli("psql", "-A", "-t", "-c", "SELECT count(*) FROM documents WHERE status = 'completed'",
                 database_url=database_url)
    assert audit.returncode == 0 and audit.stdout.strip() == "2"

    (folder / "empty.txt").unlink()
    second = _cli("sync", str(folder), database_url=database_url)
    # 1 of 3 documents gone is 33%, over the 20% guard: nothing deleted, exit code 2, the reason printed once
    assert second.returncode == 2, second.stdout
    assert second.stdout.count("would delete 1 of 3") == 1 and "--confirm-delete 1" in second.stdout
    assert "kept (gone from the listing): empty.txt" in second.stdout
    held = _cli("status", database_url=database_url)
    assert held.returncode == 2 and "deletion guard holding since" in held.stdout and "kept: empty.txt" in held.stdout
    wrong = _cli("sync", str(folder), "--confirm-delete", "2", database_url=database_url)
    assert wrong.returncode == 2 and "nothing deleted" in wrong.stdout  # the stated count must match
    third = _cli("sync", str(folder), "--confirm-delete", "1", database_url=database_url)
    assert third.returncode == 0, third.stdout
    assert "1 deleted" in third.stdout
    assert _cli("status", database_url=database_url).returncode == 0  # the hold is over


def test_progress_lines_when_not_a_terminal(tmp_path, database_url):
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(5):
        (folder / f"n{i}.txt").write_text(f"Note number {i} is about the colour of lighthouse number {i}.\n")
    run = _cli("sync", str(folder), "--progress-every", "2", database_url=database_url)
    assert run.returncode == 0, run.stdout
    assert "listed 5: 5 to process, 0 to delete" in run.stdout
    assert [line for line in run.stdout.splitlines() if line.startswith("… ")] == [
        "… 2 documents processed", "… 4 documents processed"]


def test_failed_documents_dead_letters_and_retry(tmp_path, database_url, shared_dir):
    """A permanently failed document reads truthfully (failure count 1 on its first, terminal attempt), is in
    `status --failed`, and `retry` re-queues it with a logged reason; the next sync tries it again."""
    folder = tmp_path / "papers"
    folder.mkdir()
    shutil.copy(shared_dir / "corpus" / "password.pdf", folder / "locked.pdf")
    (folder / "ok.md").write_text("# Fine\n\nThis document has text that can be indexed without trouble.\n")
    first = _cli("sync", str(folder), database_url=database_url)
    assert first.returncode == 1, first.stdout  # one document failed in this run
    assert _sql(database_url, "SELECT status, failure_count, last_error FROM documents WHERE source_id = 'locked.pdf'") \
        == [("permanently_failed", 1, "password protected")]

    failed = _cli("status", "--failed", database_url=database_url)
    assert failed.returncode == 1
    assert "dead letters" in failed.stdout and "locked.pdf" in failed.stdout and "password protected" in failed.stdout
    assert "by reason: 1 × password protected" in failed.stdout

    unknown = _cli("retry", "--source", str(folder), "nope.pdf", database_url=database_url)
    assert unknown.returncode == 1 and "not found: nope.pdf" in unknown.stdout
    retry = _cli("retry", "--source", str(folder), "--reason", "password removed", database_url=database_url)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    assert "queued locked.pdf" in retry.stdout and "1 document queued" in retry.stdout
    assert _sql(database_url, "SELECT status, failure_count FROM documents WHERE source_id = 'locked.pdf'") \
        == [("pending", 0)]
    logged = _sql(database_url, "SELECT action, reason FROM ingest_log WHERE source_id = 'locked.pdf' ORDER BY id")
    assert logged[-1][0] == "retry-requested" and logged[-1][1].startswith("password removed")

    again = _cli("sync", str(folder), database_url=database_url)  # still locked: tried again, failed again
    assert again.returncode == 1 and "password protected" in again.stdout
    assert [a for a, _ in _sql(database_url, "SELECT action, status FROM ingest_log WHERE source_id = 'locked.pdf' "
                                             "ORDER BY id")] == ["failed", "retry-requested", "failed"]


def test_a_retired_source_is_removed_deliberately(tmp_path, database_url):
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "a.md").write_text("# Archive\n\nThe archive of the old project lives here until it is retired.\n")
    assert _cli("sync", str(folder), database_url=database_url).returncode == 0
    (folder / "a.md").unlink()
    emptied = _cli("sync", str(folder), database_url=database_url)
    assert emptied.returncode == 2 and "empty listing" in emptied.stdout  # the guard holds
    dry = _cli("sources", "retire", str(folder), database_url=database_url)
    assert dry.returncode == 1 and "would delete 1 document" in dry.stdout
    done = _cli("sources", "retire", str(folder), "--yes", database_url=database_url)
    assert done.returncode == 0 and "1 document deleted" in done.stdout
    assert _sql(database_url, "SELECT status FROM documents") == [("deleted",)]
    assert _sql(database_url, "SELECT count(*) FROM chunks") == [(0,)]


def test_a_sync_that_cannot_start_says_why_with_exit_code_4(tmp_path, database_url):
    missing = _cli("sync", str(tmp_path / "no-such-folder"), database_url=database_url)
    assert missing.returncode == 4 and "is not a folder" in missing.stdout
    unknown = _cli("sync", "--source", "dropbox", database_url=database_url)
    assert unknown.returncode == 4 and "unknown source kind 'dropbox'" in unknown.stdout
    assert "Traceback" not in missing.stdout + missing.stderr + unknown.stdout + unknown.stderr


def test_the_cli_does_not_import_dagster():
    probe = subprocess.run([sys.executable, "-c", "import sys, rag_pipeline.cli, rag_pipeline.pipeline.sync, "
                            "rag_pipeline.pipeline.operate; print('dagster' in sys.modules)"],
                           capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "False", probe.stderr


def test_query_as_a_principal_with_an_acl_file_and_the_recheck(tmp_path, database_url):
    import json

    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "salaries.md").write_text("# Salaries\n\nThe salary bands for engineers were raised by four percent.\n")
    (folder / "menu.md").write_text("# Canteen\n\nThe canteen serves lentil soup every Tuesday.\n")
    acl = tmp_path / "acl.yaml"
    acl.write_text('rules:\n  - path: "**"\n    principals: [everyone]\n'
                   '  - path: "salaries.md"\n    principals: ["group:hr"]\n'
                   'groups:\n  group:hr: ["user:ada@example.com"]\n')
    env = {"RAG_LOCAL_ACL_FILE": str(acl)}
    os.environ.update(env)
    try:
        sync = _cli("sync", str(folder), database_url=database_url)
        assert sync.returncode == 0, sync.stdout + sync.stderr
        assert "permissions (full): 2 read" in sync.stdout and "1 group expanded" in sync.stdout

        def ask(*who: str) -> set[str]:
            run = _cli("query", "how much were salaries raised?", "-k", "5", "--json", *who, database_url=database_url)
            assert run.returncode == 0, run.stderr
            return {h["source_id"] for h in json.loads(run.stdout)}

        assert ask("--as", "ada@example.com") == {"salaries.md", "menu.md"}
        assert ask("--as", "bob@example.com") == {"menu.md"}
        assert ask("--admin") == {"salaries.md", "menu.md"}
        bad = _cli("query", "x", "--as", "role:boss", database_url=database_url)
        assert bad.returncode == 2 and "unknown principal kind" in bad.stdout + bad.stderr

        # ada leaves HR at the source; before any permission sync, --recheck asks the source itself
        acl.write_text(acl.read_text().replace('["user:ada@example.com"]', "[]"))
        os.environ["RAG_SOURCES"] = json.dumps([{"name": "shared", "kind": "local", "path": str(folder)}])
        assert ask("--as", "ada@example.com", "--recheck") == {"menu.md"}
        assert ask("--as", "ada@example.com") == {"menu.md"}  # and the index learnt it
        logged = _sql(database_url, "SELECT recheck_dropped FROM retrieval_log WHERE recheck_dropped IS NOT NULL")
        assert logged == [(1,)]

        acl.write_text("rules: [not a rule]\n")  # an invalid ACL file: every document readable by nobody
        again = _cli("sync", str(folder), database_url=database_url)
        assert again.returncode == 0 and "2 unreadable (readable by nobody)" in again.stdout, again.stdout
        assert ask("--as", "bob@example.com") == set()
        status = _cli("status", database_url=database_url)
        assert "2 documents readable by nobody (permissions could not be read)" in status.stdout, status.stdout
    finally:
        for key in (*env, "RAG_SOURCES"):
            os.environ.pop(key, None)


def test_reembed_generations_and_rollback_from_the_command_line(tmp_path, database_url, embedder):
    """A model change from the shell: another model directory (the bundled weights under another path, so
    another model id) -> ``reembed`` builds and activates its generation; ``generations`` lists both;
    ``generations activate 1`` rolls back, and queries read generation 1 again."""
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "bees.md").write_text("# Bees\n\nHoney bees communicate the direction of flowers with a waggle dance.\n")
    (folder / "tides.txt").write_text("Tides are caused by the gravitational pull of the moon on the oceans.\n")
    assert _cli("sync", str(folder), database_url=database_url).returncode == 0
    other = tmp_path / "minilm-copy"
    other.symlink_to(embedder.path, target_is_directory=True)

    def cli(*args):
        env = {**os.environ, "RAG_DATABASE_URL": database_url, "COLUMNS": "250", "HF_HUB_OFFLINE": "1",
               "RAG_EMBEDDING_MODEL": str(other)}
        return subprocess.run([sys.executable, "-m", "rag_pipeline.cli", *args], env=env, capture_output=True,
                              text=True, timeout=300)

    run = cli("reembed")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "generation 2" in run.stdout and "2 of 2 documents" in run.stdout and "active" in run.stdout
    assert _sql(database_url, "SELECT id, state FROM embedding_generations ORDER BY id") == [(1, "retired"), (2, "active")]
    listing = cli("generations")
    assert listing.returncode == 0 and "retired" in listing.stdout and "active" in listing.stdout
    assert "all-MiniLM-L6-v2" in listing.stdout and "2 / 2" in listing.stdout  # documents embedded in each
    owner = pwd.getpwuid(os.getuid()).pw_name
    answer = cli("query", "why do bees dance?", "-k", "1", "--as", owner)
    assert answer.returncode == 0 and "bees.md" in answer.stdout, answer.stdout + answer.stderr
    assert _sql(database_url, "SELECT generation FROM retrieval_log ORDER BY id DESC LIMIT 1") == [(2,)]

    back = cli("generations", "activate", "1")
    assert back.returncode == 0 and "generation 1" in back.stdout, back.stdout + back.stderr
    answer = cli("query", "why do bees dance?", "-k", "1", "--as", owner)
    assert answer.returncode == 0 and "bees.md" in answer.stdout
    assert _sql(database_url, "SELECT generation FROM retrieval_log ORDER BY id DESC LIMIT 1") == [(1,)]
    missing = cli("generations", "activate", "9")
    assert missing.returncode == 1 and "no embedding generation 9" in missing.stdout
    refused = cli("generations", "drop", "1")  # the active one
    assert refused.returncode == 1 and "is the active one" in refused.stdout
    dropped = cli("generations", "drop", "2")
    assert dropped.returncode == 0 and "generation 2" in dropped.stdout and "dropped" in dropped.stdout
    assert _sql(database_url, "SELECT id, state FROM embedding_generations ORDER BY id") == [(1, "active"), (2, "dropped")]
