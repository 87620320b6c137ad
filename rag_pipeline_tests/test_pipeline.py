"""The one per-document core through its main caller (``pipeline.sync.sync_source``): a metadata-only update
keeps the per-type expiry, a local folder is re-read only where size or mtime changed (plus the periodic
verification), an unreadable file fails alone, and a same-dimension model change re-embeds without
re-extracting."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path


from rag_pipeline.pipeline.sync import EXIT_DOCUMENT_FAILURES, EXIT_OK, sync_source
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.store import generations as gens
from rag_pipeline.store.invariants import check_index

TEXTS = {
    "prices.md": "# Price list\n\nA service visit costs 120 euros; each additional hour costs 80 euros.\n",
    "adr.md": "# Decision\n\nWe store every document's chunks in PostgreSQL with the pgvector extension.\n",
    "notes.txt": "Meeting notes: the lighthouse keeper asked for a second lamp before the winter storms.\n",
}


def _folder(root: Path) -> Path:
    root.mkdir()
    for name, text in TEXTS.items():
        (root / name).write_text(text)
    return root


def _row(store, source: str, sid: str):
    with store.connection() as conn:
        return conn.execute("SELECT status, version, modified_at, expires_at, last_error, seen_source_version "
                            "FROM documents WHERE source = %s AND source_id = %s", (source, sid)).fetchone()


def test_metadata_only_update_keeps_the_per_type_expiry(tmp_path, settings, store, embedder, fetches):
    root = _folder(tmp_path / "docs")
    settings = settings.model_copy(update={"expiry_days": {"md": 90}})
    src = LocalFolderSource(root)
    assert sync_source(src, store, embedder, settings).exit_code == EXIT_OK
    status, _, modified, expires, _, _ = _row(store, src.name, "prices.md")
    assert status == "completed" and expires == modified + timedelta(days=90)
    assert _row(store, src.name, "notes.txt")[3] is None  # txt has no expiry configured

    stat = (root / "prices.md").stat()
    os.utime(root / "prices.md", ns=(stat.st_atime_ns, stat.st_mtime_ns + 86_400 * 10**9))  # touched a day later
    fetches.clear()
    report = sync_source(src, store, embedder, settings)
    assert {d.source_id: d.action.value for d in report.documents}["prices.md"] == "metadata-updated"
    assert fetches == ["prices.md"]  # re-read only the file whose mtime changed, to compare its hash
    status, version, modified2, expires2, _, seen = _row(store, src.name, "prices.md")
    assert (status, version) == ("completed", 1) and modified2 == modified + timedelta(days=1)
    assert expires2 == modified2 + timedelta(days=90)  # the type's expiry, moved with the new date
    assert seen == f"{stat.st_size}:{stat.st_mtime_ns + 86_400 * 10**9}"


def test_a_no_op_resync_reads_no_file_and_verification_hashes_when_due(tmp_path, settings, store, embedder, fetches):
    root = _folder(tmp_path / "docs")
    src = LocalFolderSource(root)
    sync_source(src, store, embedder, settings)
    fetches.clear()
    again = sync_source(src, store, embedder, settings)
    assert again.mode == "full" and fetches == []
    assert {d.action.value for d in again.documents} == {"skipped-unchanged"}

    # same size and mtime, other bytes (a tool that restores mtimes): invisible to stat, found by verification
    path = root / "adr.md"
    stat = path.stat()
    path.write_text(TEXTS["adr.md"].replace("PostgreSQL", "PostgreQL!"))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert sync_source(src, store, embedder, settings).documents[0].action.value == "skipped-unchanged"
    with store.connection() as conn:  # the last verification (here: the first sync) is 8 days old
        conn.execute("UPDATE documents SET created_at = created_at - interval '8 days'")
        conn.execute("UPDATE sync_runs SET started_at = started_at - interval '8 days'")
    verified = sync_source(src, store, embedder, settings)
    assert verified.mode == "full+verify"
    assert {d.source_id: d.action.value for d in verified.documents}["adr.md"] == "updated"
    assert sync_source(src, store, embedder, settings).mode == "full"  # verified just now: not due again


def test_an_unreadable_file_fails_alone(tmp_path, settings, store, embedder, monkeypatch):
    """Root can read any file, so the permission error is injected at the one read of one path (the
    listing-as-``nobody`` half is in ``test_local_source.py``): that document fails with the reason, the
    others complete, the listing stays complete and nothing is deleted."""
    from rag_pipeline.sources import local

    root = _folder(tmp_path / "docs")
    real = local._open_inside

    def open_inside(root_path, resolved, source_id):  # the one read of the file, as root cannot be refused
        if source_id == "notes.txt":
            raise PermissionError(13, "Permission denied", str(resolved))
        return real(root_path, resolved, source_id)

    monkeypatch.setattr(local, "_open_inside", open_inside)
    src = LocalFolderSource(root)
    report = sync_source(src, store, embedder, settings)
    assert report.exit_code == EXIT_DOCUMENT_FAILURES and report.guard.passed and not report.listing_error
    by_id = {d.source_id: (d.action.value, d.status, d.reason) for d in report.documents}
    assert by_id["notes.txt"] == ("failed", "failed", "cannot read notes.txt: Permission denied")
    assert by_id["prices.md"][:2] == by_id["adr.md"][:2] == ("added", "completed")
    with store.connection() as conn:
        assert check_index(conn) == []


def test_a_same_dimension_model_change_re_embeds_without_extracting(tmp_path, settings, store, embedder, fetches):
    from rag_pipeline.embedding import SentenceTransformerEmbedder

    root = _folder(tmp_path / "docs")
    src = LocalFolderSource(root)
    sync_source(src, store, embedder, settings)
    other_dir = tmp_path / "minilm-copy"
    other_dir.symlink_to(embedder.path, target_is_directory=True)  # the same weights under another model id
    other = SentenceTransformerEmbedder(str(other_dir))
    assert other.model_id != embedder.model_id and other.dimension == embedder.dimension
    fetches.clear()
    with store.connection() as conn:
        before = conn.execute("SELECT source_id, version FROM documents ORDER BY 1").fetchall()
    report = sync_source(src, store, other, settings)
    assert {d.action.value for d in report.documents} == {"re-embedded"} and fetches == []
    with store.connection() as conn:
        # a new generation filled from the stored chunk texts (no new version), complete, hence active now
        (g,) = [g for g in gens.kept(conn) if g.model == other.model_id]
        assert g.state == "active" and gens.progress(conn, g).complete
        assert conn.execute("SELECT source_id, version FROM documents ORDER BY 1").fetchall() == before
        assert {r[0] for r in conn.execute("SELECT model FROM embedding_generations WHERE state = 'retired'")} == {
            embedder.model_id}
        assert check_index(conn) == []
    assert {d.action.value for d in sync_source(src, store, other, settings).documents} == {"skipped-unchanged"}
