"""Google Drive synced into the embedded PostgreSQL with the real model, day by day, through the fake
Drive server. After every day the index must equal the source: the set of non-deleted documents is
what Drive holds in the scope, and each completed document's chunks come from its current content.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from rag_pipeline.sources.gdrive import DOCX, PPTX, XLSX, GoogleDriveSource, RetryPolicy, load_credentials
from rag_pipeline.store import Store
from rag_pipeline.store import index as idx_store
from rag_pipeline.pipeline.sync import sync_source

from .fakes.gdrive_server import DOC, SHEET, SLIDES, corpus_bytes, drive_env

pytestmark = pytest.mark.slow

# corpus file -> a phrase its text holds (read from the files with other tools)
PHRASE = {
    "fake-memo.pdf": "20,000 bottles of water",
    "stanley-cups.csv": "Maple Leafs",
    "docx-tables.docx": "Simple uniform table",
    "sample-presentation.pptx": "first content slide",
    "simple-table.md": "Juicy Apples",
    "fake-text-utf-16.txt": "This is a test document to use for unit tests.",
}
CUPS_V2 = corpus_bytes("stanley-cups.csv").rstrip(b"\r\n") + b"\nSeattle Kraken,Seattle,0\n"


def _norm(text: str) -> str:
    return " ".join(text.split())


def index_snapshot(store: Store, source: str) -> dict[str, dict]:
    """Non-deleted documents of ``source``: status, title, and the text of their current chunks."""
    with store.connection() as conn:
        rows = conn.execute(
            """
            SELECT d.source_id, d.status, d.title, d.last_error,
                   COALESCE(string_agg(c.text, ' ' ORDER BY c.ordinal), '')
            FROM documents d LEFT JOIN chunks c ON c.document_id = d.id AND c.version = d.version
            WHERE d.source = %s AND d.status <> 'deleted' AND d.parent_id IS NULL
            GROUP BY d.id
            """, (source,)).fetchall()
        stray = conn.execute(
            """
            SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id
            WHERE d.source = %s AND (d.status = 'deleted' OR c.version <> d.version)
            """, (source,)).fetchone()[0]
    assert stray == 0, "chunks of deleted documents or of old versions are still stored"
    return {r[0]: {"status": r[1], "title": r[2], "error": r[3], "text": _norm(r[4])} for r in rows}


def assert_index_equals(store: Store, source: str, expected: Mapping[str, tuple[str, ...]],
                        *, absent: Mapping[str, tuple[str, ...]] = {}, failed: Mapping[str, str] = {}) -> dict:
    """The index holds exactly ``expected`` (completed, chunks containing each phrase and none of
    ``absent``'s) plus ``failed`` (permanently_failed with that reason fragment, no chunks)."""
    snapshot = index_snapshot(store, source)
    assert set(snapshot) == set(expected) | set(failed)
    for source_id, phrases in expected.items():
        row = snapshot[source_id]
        assert row["status"] == "completed", (source_id, row["error"])
        for phrase in phrases:
            assert _norm(phrase) in row["text"], (source_id, phrase)
        for phrase in absent.get(source_id, ()):
            assert _norm(phrase) not in row["text"], (source_id, phrase)
    for source_id, reason in failed.items():
        row = snapshot[source_id]
        assert row["status"] == "permanently_failed" and reason in row["error"] and row["text"] == ""
    return snapshot


@pytest.fixture
def drive(shared_dir, tmp_path):
    with drive_env(tmp_path, page_limit=3) as env:
        yield env


def test_drive_sync_day_by_day(drive, store, embedder, settings):
    f = drive.fake
    top = f.add_folder("Top")
    sub = f.add_folder("Sub", top)
    memo = f.add_file("memo.pdf", top, corpus_bytes("fake-memo.pdf"), "application/pdf")
    cups = f.add_file("cups.csv", top, corpus_bytes("stanley-cups.csv"), "text/csv")
    plan = f.add_native("Plan", sub, DOC, DOCX, corpus_bytes("docx-tables.docx"))
    deck = f.add_native("Deck", sub, SLIDES, PPTX, corpus_bytes("sample-presentation.pptx"))
    huge = f.add_native("Huge", sub, SHEET, XLSX, b"never exported")
    f.export_too_large.add(huge)
    outside = f.add_file("outside.md", f.root_id, corpus_bytes("simple-table.md"), "text/markdown")
    link = f.add_shortcut("outside (shortcut)", sub, outside)
    f.add_shortcut("cups again", sub, cups)                      # a second path to cups: one document
    source = GoogleDriveSource.from_env(folder_id=top, env=drive.env)

    expected = {memo: (PHRASE["fake-memo.pdf"],), cups: (PHRASE["stanley-cups.csv"],),
                plan: (PHRASE["docx-tables.docx"],), deck: (PHRASE["sample-presentation.pptx"],),
                outside: (PHRASE["simple-table.md"],)}
    too_large = {huge: "exportSizeLimitExceeded"}

    # day 0: full listing; natives exported, the shortcut's target indexed once, one export refused
    day0 = sync_source(source, store, embedder, settings)
    assert day0.mode == "full" and day0.guard.passed
    assert [d.source_id for d in day0.failed] == [huge]
    assert_index_equals(store, source.name, expected, failed=too_large)
    assert f.media_calls.count(plan) == 0 and {plan, deck} <= set(f.export_calls)

    # day 1: an add, a content change, a rename, a trash; an unrelated file outside changes too
    added = f.add_file("new.txt", sub, corpus_bytes("fake-text-utf-16.txt"), "text/plain")
    f.update_content(cups, CUPS_V2)
    f.rename(memo, "memo (final).pdf")
    f.trash(deck)
    f.update_content(f.add_file("stray.csv", f.root_id, b"a\n", "text/csv"), b"b\n")
    day1 = sync_source(source, store, embedder, settings)
    assert day1.mode == "changes" and day1.guard.passed and day1.deleted == [deck]
    actions = {d.source_id: d.action for d in day1.documents}
    assert actions[memo] == "metadata-updated" and actions[cups] == "updated" and actions[added] == "added"
    expected = {**{k: v for k, v in expected.items() if k != deck},
                added: (PHRASE["fake-text-utf-16.txt"],), cups: ("Seattle Kraken", PHRASE["stanley-cups.csv"])}
    snapshot = assert_index_equals(store, source.name, expected, failed=too_large)
    assert snapshot[memo]["title"] == "memo (final).pdf"

    # day 2: the trashed Slides come back; the shortcut is deleted, so its target leaves the scope
    f.restore(deck)
    f.delete(link)
    day2 = sync_source(source, store, embedder, settings)
    assert day2.mode == "changes" and day2.deleted == [outside]
    expected = {**{k: v for k, v in expected.items() if k != outside}, deck: (PHRASE["sample-presentation.pptx"],)}
    assert_index_equals(store, source.name, expected, failed=too_large)

    # day 3: an in-scope folder is trashed: the feed cannot tell what left, so a full reconciliation runs
    f.trash(sub)
    day3 = sync_source(source, store, embedder, settings)
    assert day3.mode == "full" and day3.guard.passed is False            # 4 of 7 documents: too many
    assert_index_equals(store, source.name, expected, failed=too_large)  # nothing deleted
    f.restore(sub)
    day4 = sync_source(source, store, embedder, settings)
    assert day4.guard.passed and day4.deleted == []
    assert_index_equals(store, source.name, expected, failed=too_large)


def test_drive_day_with_an_empty_listing_deletes_nothing(drive, store, embedder, settings):
    f = drive.fake
    top = f.add_folder("Top")
    a = f.add_file("cups.csv", top, corpus_bytes("stanley-cups.csv"), "text/csv")
    b = f.add_file("table.md", top, corpus_bytes("simple-table.md"), "text/markdown")
    source = GoogleDriveSource.from_env(folder_id=top, env=drive.env)
    assert sync_source(source, store, embedder, settings).ok
    expected = {a: (PHRASE["stanley-cups.csv"],), b: (PHRASE["simple-table.md"],)}
    assert_index_equals(store, source.name, expected)

    f.hide_listing = True
    report = sync_source(source, store, embedder, settings, full=True)
    assert not report.guard.passed and "empty listing" in report.guard.reason
    assert report.deleted == [] and report.exit_code == 2
    assert_index_equals(store, source.name, expected)


def test_drive_cursor_advances_only_after_a_complete_feed(drive, store, embedder, settings):
    f = drive.fake
    top = f.add_folder("Top")
    a = f.add_file("cups.csv", top, corpus_bytes("stanley-cups.csv"), "text/csv")
    credentials = load_credentials(service_account_file=str(drive.key_file))
    source = GoogleDriveSource(credentials=credentials, folder_id=top, api_url=drive.api_url,
                               retry=RetryPolicy(attempts=2, base_wait_s=0.01))
    sync_source(source, store, embedder, settings)
    with store.connection() as conn:
        before = idx_store.get_cursor(conn, source.name)
    b = f.add_file("table.md", top, corpus_bytes("simple-table.md"), "text/markdown")
    f.fail_next("changes.list", 503, times=2)                  # the feed fails after its retries
    report = sync_source(source, store, embedder, settings)
    assert report.listing_error and report.exit_code == 2
    with store.connection() as conn:
        assert idx_store.get_cursor(conn, source.name) == before
    after = sync_source(source, store, embedder, settings)
    assert after.mode == "changes" and after.ok
    assert [d.source_id for d in after.documents if d.action == "added"] == [b]
    assert_index_equals(store, source.name, {a: (PHRASE["stanley-cups.csv"],), b: (PHRASE["simple-table.md"],)})
