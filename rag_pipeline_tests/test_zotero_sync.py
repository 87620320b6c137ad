"""Zotero libraries synced into the embedded PostgreSQL with the real model, day after day.

The fake Zotero Web API (``fakes/zotero_server.py``) serves the fixture library with real PDFs from
``../shared/corpus`` as attachment files; the real pyzotero client talks to it on 127.0.0.1. Each test
mutates the library between "days" and checks the index and the sync report.
"""

from __future__ import annotations

import json

import pytest

from rag_pipeline.sources.zotero import ZoteroSource
from rag_pipeline.store import index as idx_store
from rag_pipeline.pipeline.sync import sync_source
from rag_pipeline_tests.fakes.zotero_server import FakeZoteroServer, linked_map, standard_library

API_KEY = "zk-SYNC-9d8c7b6a5f4e3d2c"
LIBRARY = "users/475425"
NAME = f"zotero:{LIBRARY}"


@pytest.fixture
def zotero(shared_dir):
    lib, keys = standard_library(shared_dir)
    with FakeZoteroServer(lib, api_key=API_KEY) as srv:
        source = ZoteroSource(LIBRARY, api_key=API_KEY, api_url=srv.url, page_size=5, max_attempts=3,
                              max_wait_s=0.05, path_prefix_map=linked_map(shared_dir / "corpus"))
        yield lib, keys, srv, source


def rows(store) -> dict[str, dict]:
    """source_id -> document row (status, last_error, version, title, metadata, live chunk count)."""
    with store.connection() as conn:
        found = conn.execute(
            """SELECT d.source_id, d.status, d.last_error, d.version, d.title, d.metadata,
                      (SELECT count(*) FROM chunks c WHERE c.document_id = d.id)
               FROM documents d WHERE d.source = %s""", (NAME,)).fetchall()
    return {r[0]: {"status": r[1], "reason": r[2], "version": r[3], "title": r[4], "metadata": r[5],
                   "chunks": r[6]} for r in found}


def chunks(store, source_id: str) -> list[tuple[int, str, list[int]]]:
    """(version, text, pages) of every chunk row of one document."""
    with store.connection() as conn:
        return [tuple(r) for r in conn.execute(
            """SELECT c.version, c.text, c.pages FROM chunks c JOIN documents d ON d.id = c.document_id
               WHERE d.source = %s AND d.source_id = %s ORDER BY c.version, c.ordinal""", (NAME, source_id))]


def all_chunk_text(store) -> str:
    with store.connection() as conn:
        return "\n".join(r[0] for r in conn.execute("SELECT text FROM chunks"))


def cursor_version(store) -> int | None:
    with store.connection() as conn:
        cursor = idx_store.get_cursor(conn, NAME)
    return json.loads(cursor)["version"] if cursor else None


def first_day(zotero, store, embedder, settings) -> dict[str, dict]:
    """The first sync: a full listing of the library. Returns the document rows afterwards."""
    lib, k, _, source = zotero
    report = sync_source(source, store, embedder, settings)
    assert report.mode == "full" and report.guard.passed and report.listing_error is None
    state = rows(store)
    assert {sid: r["status"] for sid, r in state.items()} == {
        k.memo: "completed", k.paper: "completed", k.linked: "completed", k.doomed: "completed",
        k.strange: "permanently_failed", k.unknown: "permanently_failed",
        k.unreachable: "permanently_failed", k.weblink: "permanently_failed"}
    assert cursor_version(store) == lib.version
    return state


def test_full_sync_then_a_day_of_additions_modifications_and_deletions(zotero, store, embedder, settings):
    lib, k, srv, source = zotero
    corpus = source.resolver.prefix_map["C:\\Papers"]

    # day 1: everything, from a full listing
    state = first_day(zotero, store, embedder, settings)
    assert any("20,000 bottles of water" in text for _, text, _ in chunks(store, k.memo))
    assert any("functional forms" in text for _, text, _ in chunks(store, k.paper))
    assert any("20,000 bottles of water" in text for _, text, _ in chunks(store, k.linked))  # from the mount
    # item_file.pdf is text, not a PDF: a terminal type mismatch, with its reason
    assert "type mismatch" in state[k.strange]["reason"] and "pdf" in state[k.strange]["reason"].lower()
    assert state[k.unknown]["reason"] == "unknown Zotero attachment link mode 'idk': not ingested"
    assert state[k.unreachable]["reason"].startswith("linked file not reachable")
    assert "linked_url" in state[k.weblink]["reason"]
    meta = state[k.memo]["metadata"]
    assert (state[k.memo]["title"], meta["doi"], meta["year"], meta["collections"]) == (
        "Sherlock Holmes in Babylon", "10.2307/2321200", 1980, ["9KH9TNSJ"])
    assert all(r["chunks"] == 0 for sid, r in state.items() if r["status"] != "completed")

    # day 2: nothing happened in Zotero; a 304 answers the whole question
    srv.requests.clear()
    quiet = sync_source(source, store, embedder, settings)
    assert quiet.mode == "changes" and quiet.embedded == 0 and quiet.deleted == [] and quiet.documents == []
    assert [r.status for r in srv.api_requests()] == [304]
    assert rows(store) == state

    # day 3: an addition, new file bytes for two attachments, a renamed parent, an erased parent
    new_item = lib.add_item(title="Relief logistics", date="2023-05-05", DOI="10.5555/relief.1")
    new_attachment = lib.add_attachment(new_item, link_mode="imported_file", filename="relief.pdf",
                                        content=open(f"{corpus}/fake-memo.pdf", "rb").read())
    lib.set_file(k.paper, open(f"{corpus}/layout-parser-paper-fast.pdf", "rb").read())
    lib.set_file(k.memo, open(f"{corpus}/fake-memo-with-duplicate-page.pdf", "rb").read())
    lib.update("85MTWF4F", title="Plasma recovery, revised")  # parent of the linked file
    lib.erase("Z8N84QAJ")  # the parent of `doomed`, with it

    report = sync_source(source, store, embedder, settings)

    assert report.mode == "changes" and report.guard.passed and report.listing_error is None
    assert not [d for d in report.documents if d.action == "failed"], report.documents
    actions = {d.source_id: d.action for d in report.documents}
    assert actions[new_attachment] == "added"
    assert actions[k.paper] == actions[k.memo] == "updated"
    assert actions[k.linked] == "metadata-updated"  # same file, new parent title: no re-embedding
    assert actions[k.doomed] == "deleted" and report.deleted == [k.doomed]
    after = rows(store)
    # exactly the new versions: chunk text from the new file, none from the old
    paper = chunks(store, k.paper)
    assert {v for v, _, _ in paper} == {after[k.paper]["version"]} and after[k.paper]["version"] > state[k.paper]["version"]
    assert any("LayoutParser" in text for _, text, _ in paper)
    assert "functional forms" not in all_chunk_text(store)  # the old paper is nowhere in the index
    memo = chunks(store, k.memo)
    assert {v for v, _, _ in memo} == {after[k.memo]["version"]}
    assert any(2 in pages for _, _, pages in memo)  # the new file has the duplicated second page
    assert after[k.linked]["title"] == after[k.linked]["metadata"]["title"] == "Plasma recovery, revised"
    assert after[k.linked]["version"] == state[k.linked]["version"]
    assert after[new_attachment]["status"] == "completed" and after[new_attachment]["metadata"]["doi"] == "10.5555/relief.1"
    assert after[k.doomed]["status"] == "deleted" and after[k.doomed]["chunks"] == 0
    assert cursor_version(store) == lib.version


def test_bad_days_delete_nothing_and_say_why(zotero, store, embedder, settings):
    lib, k, srv, source = zotero
    state = first_day(zotero, store, embedder, settings)
    day1_cursor = cursor_version(store)
    live = {sid for sid, r in state.items() if r["status"] != "deleted"}

    def unchanged() -> None:
        now = rows(store)
        assert {sid for sid, r in now.items() if r["status"] != "deleted"} == live
        assert {sid: r["chunks"] for sid, r in now.items()} == {sid: r["chunks"] for sid, r in state.items()}
        assert cursor_version(store) == day1_cursor

    # an empty day: the server answers every listing with 0 items
    srv.faults.empty_listings = True
    empty = sync_source(source, store, embedder, settings, full=True)
    assert not empty.guard.passed and "empty listing" in empty.guard.reason
    assert empty.deleted == [] and empty.exit_code == 2
    unchanged()
    srv.faults.clear()

    # a failing day: an item really was erased, but the listing breaks on its second page
    lib.erase("Z8N84QAJ")
    srv.faults.fail_page = 2
    failing = sync_source(source, store, embedder, settings, full=True)
    assert not failing.guard.passed and failing.guard.reason.startswith("listing incomplete")
    assert "page 2" in failing.guard.reason and "500" in failing.guard.reason
    assert failing.deleted == [] and failing.exit_code == 2
    unchanged()
    srv.faults.clear()

    # a 429 storm longer than the retry budget: the change feed cannot be read
    srv.faults.rate_limit(1000)
    storm = sync_source(source, store, embedder, settings)
    assert not storm.guard.passed and "429" in storm.listing_error and storm.deleted == []
    assert storm.exit_code == 2
    unchanged()

    # the next day the storm is short (2 x 429), and the erasure is applied from /deleted
    srv.faults.rate_limit(2)
    recovered = sync_source(source, store, embedder, settings)
    assert recovered.mode == "changes" and recovered.guard.passed and recovered.deleted == [k.doomed]
    assert rows(store)[k.doomed]["status"] == "deleted"
    assert cursor_version(store) == lib.version
