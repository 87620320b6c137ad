"""ZoteroSource against a fake Zotero Web API on 127.0.0.1, through the real pyzotero client.

No database here: inventory, change feed, fetch, linked files, pagination, 304, rate limits,
timeouts and API-key hygiene. The sync-level scenarios are in ``test_zotero_sync.py``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import pytest

from rag_pipeline.sources.base import ChangeFeedUnavailable, DocumentSkipped, Source, SourceError
from rag_pipeline.sources.zotero import (
    DEFAULT_API_URL,
    LINKED_NOT_REACHABLE,
    LinkedFileResolver,
    ZoteroSource,
    parse_path_prefix_map,
    server_delay_s,
)
from rag_pipeline_tests.fakes.zotero_server import (
    FakeZoteroLibrary,
    FakeZoteroServer,
    linked_map,
    standard_library,
)

API_KEY = "zk-TEST-3f9a7c1e5b2d4f60"
LIBRARY = "users/475425"


@pytest.fixture
def lib_keys(shared_dir):
    return standard_library(shared_dir)


@pytest.fixture
def server(lib_keys):
    lib, _ = lib_keys
    with FakeZoteroServer(lib, api_key=API_KEY) as srv:
        yield srv


def make_source(server: FakeZoteroServer, shared: Path, **kwargs) -> ZoteroSource:
    options = dict(api_key=API_KEY, api_url=server.url, path_prefix_map=linked_map(shared / "corpus"),
                   page_size=5, max_wait_s=0.05, timeout_s=5.0)
    options.update(kwargs)
    return ZoteroSource(LIBRARY, **options)


# ------------------------------------------------------------------------------------------ inventory


def test_inventory_reads_every_page_and_gives_one_document_per_attachment(server, lib_keys, shared_dir):
    lib, k = lib_keys
    source = make_source(server, shared_dir)
    assert isinstance(source, Source)
    inventory = source.list_documents()

    assert inventory.complete and inventory.incomplete_reason is None
    # 20 fixture items + the fixture attachment + 7 attachments + 1 note, 5 per page -> 6 pages
    assert inventory.expected_total == len(lib.items) == 29
    pages = server.api_requests("/items")
    assert [r.query.get("start", "0") for r in pages] == ["0", "5", "10", "15", "20", "25"]
    assert all(r.query["limit"] == "5" for r in pages)
    attachments = {k.memo, k.paper, k.strange, k.unknown, k.linked, k.unreachable, k.weblink, k.doomed}
    assert [d.source_id for d in inventory.documents] == sorted(attachments)  # notes are not documents
    assert json.loads(inventory.cursor)["version"] == lib.version

    memo = next(d for d in inventory.documents if d.source_id == k.memo)
    assert memo.title == "Sherlock Holmes in Babylon"
    assert memo.uri == f"zotero://select/library/items/{k.memo}"
    assert memo.mime_type == "application/pdf"
    assert memo.size == (shared_dir / "corpus" / "fake-memo.pdf").stat().st_size
    assert memo.source_version == str(lib.items[k.memo]["version"])
    assert memo.modified_at is not None and memo.modified_at.tzinfo is not None
    assert memo.skip_reason is None
    meta = memo.metadata
    assert meta["item_key"] == "PQKBRC33" and meta["item_type"] == "journalArticle"
    assert meta["doi"] == "10.2307/2321200"
    assert meta["year"] == 1980
    assert meta["creators"] == [{"type": "author", "name": "R. Creighton Buck"}]
    assert meta["collections"] == ["9KH9TNSJ"]
    assert meta["link_mode"] == "imported_file" and meta["filename"] == "fake-memo.pdf"
    assert meta["md5"] == lib.items[k.memo]["data"]["md5"]
    # X42A7DEE carries tags and two collections in the fixture
    strange = next(d for d in inventory.documents if d.source_id == k.strange)
    assert strange.metadata["tags"] == ["Analysis", "Congresses", "Electron microscopy", "Materials", "Microscopy"]
    assert strange.metadata["collections"] == ["BX9965IJ", "9KH9TNSJ"]
    assert strange.metadata["year"] == 1993
    for doc in inventory.documents:  # JSON-safe, round trip unchanged
        assert json.loads(json.dumps(doc.metadata)) == doc.metadata


def test_every_link_mode_gets_a_document_or_a_reason(server, lib_keys, shared_dir):
    _, k = lib_keys
    docs = {d.source_id: d for d in make_source(server, shared_dir).list_documents().documents}

    assert docs[k.unknown].skip_reason == "unknown Zotero attachment link mode 'idk': not ingested"
    assert docs[k.unknown].metadata["item_key"] == "NM66T6EF"
    assert "linked_url" in docs[k.weblink].skip_reason
    assert docs[k.unreachable].skip_reason.startswith(LINKED_NOT_REACHABLE)
    assert "D:\\Elsewhere\\gone.pdf" in docs[k.unreachable].skip_reason
    assert docs[k.unreachable].source_version.endswith(":unreachable")
    linked = docs[k.linked]
    assert linked.skip_reason is None
    corpus_memo = shared_dir / "corpus" / "fake-memo.pdf"
    assert linked.size == corpus_memo.stat().st_size
    assert linked.source_version.endswith(f":{corpus_memo.stat().st_mtime_ns}:{corpus_memo.stat().st_size}")
    for key in (k.memo, k.paper, k.strange):
        assert docs[key].skip_reason is None


def test_fetch_downloads_imported_files_and_reads_linked_files(server, lib_keys, shared_dir):
    lib, k = lib_keys
    source = make_source(server, shared_dir)
    docs = {d.source_id: d for d in source.list_documents().documents}
    corpus = shared_dir / "corpus"

    assert source.fetch(docs[k.memo]) == (corpus / "fake-memo.pdf").read_bytes()
    assert source.fetch(docs[k.paper]) == (corpus / "a1977-backus-p21.pdf").read_bytes()
    # the source hands over the bytes as stored; judging them (text, not a PDF) is extraction's job
    assert source.fetch(docs[k.strange]) == (shared_dir / "fixtures" / "zotero" / "item_file.pdf").read_bytes()
    assert source.fetch(docs[k.linked]) == (corpus / "fake-memo.pdf").read_bytes()
    assert len(server.api_requests(f"/items/{k.memo}/file")) == 1
    assert any(r.path.startswith("/_storage/") for r in server.requests)  # followed the redirect
    for key, reason in ((k.unknown, "'idk'"), (k.weblink, "linked_url"), (k.unreachable, LINKED_NOT_REACHABLE)):
        with pytest.raises(DocumentSkipped, match=reason):
            source.fetch(docs[key])
    del lib.files[k.memo]  # the attachment exists, its file was never uploaded
    with pytest.raises(DocumentSkipped, match="no file"):
        source.fetch(docs[k.memo])


# ------------------------------------------------------------------------------------------ linked files


@pytest.mark.parametrize(("text", "expected"), [
    ("", {}),  # unset
    ("C:\\Papers=/mnt/nas/papers", {"C:\\Papers": "/mnt/nas/papers"}),
    # two entries, blanks and spaces ignored
    (" C:\\Papers=/mnt/nas/papers ; ;D:\\X=/mnt/x", {"C:\\Papers": "/mnt/nas/papers", "D:\\X": "/mnt/x"}),
    # a UNC share; split at the last '='
    ("\\\\nas\\share=/mnt/share", {"\\\\nas\\share": "/mnt/share"}),
])
def test_parse_path_prefix_map(text, expected):
    assert parse_path_prefix_map(text) == expected


@pytest.mark.parametrize("text", ["C:\\Papers", "=/mnt/x", "C:\\Papers="])
def test_parse_path_prefix_map_rejects_bad_entries(text):
    with pytest.raises(ValueError, match="RAG_ZOTERO_PATH_MAP entry"):
        parse_path_prefix_map(text)


def test_linked_file_resolution(tmp_path):
    nas = tmp_path / "nas"
    (nas / "papers" / "sub").mkdir(parents=True)
    (nas / "papers" / "sub" / "a.pdf").write_bytes(b"%PDF-1.4 a")
    (nas / "base" / "x").mkdir(parents=True)
    (nas / "base" / "x" / "b.pdf").write_bytes(b"%PDF-1.4 b")
    (tmp_path / "secret.txt").write_text("not for the index")
    (nas / "papers" / "escape.pdf").symlink_to(tmp_path / "secret.txt")
    resolver = LinkedFileResolver(root=nas / "base", prefix_map={
        "C:\\Papers": str(nas / "papers"), "C:\\Papers\\sub": str(nas / "papers" / "sub"),
        "/Users/ann/Papers": str(nas / "papers")})

    def ok(recorded):
        path, reason = resolver.resolve(recorded)
        assert reason is None, reason
        return path

    def unreachable(recorded):
        path, reason = resolver.resolve(recorded)
        assert path is None and reason.startswith(LINKED_NOT_REACHABLE)
        return reason

    # a Windows drive path, matched case-insensitively, longest prefix first
    assert ok("c:\\papers\\SUB\\a.pdf").read_bytes() == b"%PDF-1.4 a"
    assert ok("C:/Papers/sub/a.pdf") == (nas / "papers" / "sub" / "a.pdf").resolve()
    # Zotero's base-directory form is relative to the root
    assert ok("attachments:x/b.pdf").read_bytes() == b"%PDF-1.4 b"
    # a macOS path recorded on another machine, mapped (POSIX prefixes are case-sensitive)
    assert ok("/Users/ann/Papers/sub/a.pdf").read_bytes() == b"%PDF-1.4 a"
    assert "outside the configured roots" in unreachable("/users/ann/papers/sub/a.pdf")
    # an absolute POSIX path already under the root
    assert ok(str(nas / "base" / "x" / "b.pdf")).read_bytes() == b"%PDF-1.4 b"
    # no mapping for this drive
    assert "no path mapping" in unreachable("D:\\Papers\\a.pdf")
    # a missing file
    assert "does not exist" in unreachable("C:\\Papers\\nothing.pdf")
    # escapes: '..', a symlink out of the mount, an arbitrary absolute path
    assert "outside the configured roots" in unreachable("C:\\Papers\\..\\..\\secret.txt")
    assert "outside the configured roots" in unreachable("C:\\Papers\\escape.pdf")
    assert "outside the configured roots" in unreachable("/etc/passwd")
    # nothing configured: nothing is read
    assert "no RAG_ZOTERO_LINKED_ROOT" in LinkedFileResolver().resolve(str(nas / "base" / "x" / "b.pdf"))[1]


# ------------------------------------------------------------------------------------------ change feed


def test_304_means_nothing_changed_not_empty(server, lib_keys, shared_dir):
    source = make_source(server, shared_dir)
    cursor = source.list_documents().cursor
    server.requests.clear()

    changes = source.changes(cursor)

    assert changes.upserts == [] and changes.deleted_ids == [] and changes.complete
    assert changes.next_cursor == cursor
    (probe,) = server.api_requests()  # one conditional request, nothing else
    assert probe.status == 304
    assert probe.if_modified_since_version == str(json.loads(cursor)["version"])
    assert probe.query["since"] == probe.if_modified_since_version and probe.query["includeTrashed"] == "1"


def test_changes_report_additions_modifications_and_deletions(server, lib_keys, shared_dir):
    lib, k = lib_keys
    corpus = shared_dir / "corpus"
    source = make_source(server, shared_dir)
    inventory = source.list_documents()
    before, cursor = {d.source_id: d for d in inventory.documents}, inventory.cursor

    new_item = lib.add_item(title="Fresh results", DOI="https://doi.org/10.1000/XYZ.1", date="2024-03-01",
                            creators=[{"creatorType": "author", "firstName": "Ada", "lastName": "Lovelace"}],
                            tags=[{"tag": "fresh"}])
    new_attachment = lib.add_attachment(new_item, link_mode="imported_file", filename="new.pdf",
                                        content=(corpus / "fake-memo.pdf").read_bytes())
    lib.set_file(k.memo, (corpus / "fake-memo-with-duplicate-page.pdf").read_bytes())  # new bytes
    lib.update("85MTWF4F", title="Plasma recovery, revised")  # parent of linked + unreachable
    lib.erase("Z8N84QAJ")  # parent of doomed: erased with its attachment
    lib.trash("33TK9NH9")  # parent of paper: to the trash
    lib.trash(k.weblink)  # an attachment to the trash
    lib.update("6XDC27WD", title="A film item without attachments")  # touches no document

    changes = source.changes(cursor)

    upserts = {d.source_id: d for d in changes.upserts}
    assert set(upserts) == {new_attachment, k.memo, k.linked, k.unreachable}
    assert upserts[new_attachment].metadata["doi"] == "10.1000/XYZ.1"
    assert upserts[new_attachment].metadata["creators"] == [{"type": "author", "name": "Lovelace, Ada"}]
    assert upserts[new_attachment].metadata["tags"] == ["fresh"] and upserts[new_attachment].metadata["year"] == 2024
    assert upserts[k.memo].source_version != before[k.memo].source_version
    assert upserts[k.memo].metadata["md5"] != before[k.memo].metadata["md5"]
    assert upserts[k.linked].title == upserts[k.linked].metadata["title"] == "Plasma recovery, revised"
    assert upserts[k.linked].source_version == before[k.linked].source_version  # only metadata changed
    assert upserts[k.linked].metadata["item_version"] > before[k.linked].metadata["item_version"]
    assert {k.doomed, k.paper, k.weblink} <= set(changes.deleted_ids)
    assert not set(changes.deleted_ids) & set(upserts)
    assert json.loads(changes.next_cursor)["version"] == lib.version
    assert [r.query["since"] for r in server.api_requests("/deleted")] == [str(json.loads(cursor)["version"])]

    # the next day starts from the new watermark: nothing more
    again = source.changes(changes.next_cursor)
    assert again.upserts == [] and again.deleted_ids == []

    # restoring the parent from the trash brings its attachment back
    lib.update("33TK9NH9", deleted=0)
    restored = source.changes(changes.next_cursor)
    assert [d.source_id for d in restored.upserts] == [k.paper] and restored.deleted_ids == []


def test_change_feed_unavailable_means_full_listing(server, lib_keys, shared_dir):
    lib, _ = lib_keys
    source = make_source(server, shared_dir)
    cursor = source.list_documents().cursor

    with pytest.raises(ChangeFeedUnavailable, match="no Zotero version watermark"):
        source.changes(None)
    with pytest.raises(ChangeFeedUnavailable, match="unreadable"):
        source.changes("12")
    other = make_source(server, shared_dir, api_url=server.url + "/")  # same server: same cursor
    assert other.changes(cursor).next_cursor == cursor
    with pytest.raises(ChangeFeedUnavailable, match="another Zotero library"):
        ZoteroSource("groups/475425", api_url=server.url).changes(cursor)
    # the server's delete log no longer reaches back that far (synthetic purge horizon)
    lib.update("PQKBRC33", title="x")
    server.faults.reject_since_below = lib.version
    with pytest.raises(ChangeFeedUnavailable, match="rejected since="):
        source.changes(cursor)
    server.faults.clear()
    # the library was reset: its version is lower than the watermark
    newer = json.dumps({**json.loads(cursor), "version": lib.version + 50}, sort_keys=True, separators=(",", ":"))
    lib.update("PQKBRC33", title="y")
    with pytest.raises(ChangeFeedUnavailable, match="went back"):
        source.changes(newer)


# ------------------------------------------------------------------------------------------ incomplete listings


def test_a_listing_failing_on_the_second_page_is_incomplete(server, lib_keys, shared_dir):
    source = make_source(server, shared_dir)
    server.faults.fail_page = 2

    inventory = source.list_documents()

    assert not inventory.complete and inventory.cursor is None
    assert "page 2" in inventory.incomplete_reason and "500" in inventory.incomplete_reason
    assert len(server.api_requests("/items")) == 1 + 5  # page 1, then page 2 tried max_attempts times


def test_a_short_listing_is_incomplete(server, lib_keys, shared_dir):
    server.faults.short_total = 1  # every page one item short of what Total-Results promises
    inventory = make_source(server, shared_dir).list_documents()
    assert not inventory.complete
    assert inventory.incomplete_reason == "listing came up short: 23 of 29 items (Total-Results)"


def test_an_empty_answer_is_a_complete_empty_listing_for_the_guard(server, lib_keys, shared_dir):
    server.faults.empty_listings = True  # Total-Results: 0, no items
    inventory = make_source(server, shared_dir).list_documents()
    assert inventory.documents == [] and inventory.complete and inventory.expected_total == 0


def test_a_library_changing_during_the_listing_is_incomplete(server, lib_keys, shared_dir):
    lib, _ = lib_keys
    server.faults.after_page = lambda n: lib.update("PQKBRC33", title="edited meanwhile") if n == 2 else None
    inventory = make_source(server, shared_dir).list_documents()
    assert not inventory.complete and "changed during the listing" in inventory.incomplete_reason


def test_a_failure_on_the_first_page_raises(server, lib_keys, shared_dir):
    server.faults.fail_page, server.faults.fail_status = 1, 502
    with pytest.raises(SourceError) as info:
        make_source(server, shared_dir, max_attempts=2).list_documents()
    assert info.value.transient and "502" in str(info.value)


# ------------------------------------------------------------------------------------------ rate limits, timeouts


def test_a_short_429_storm_is_ridden_out_with_capped_waits(server, lib_keys, shared_dir, caplog):
    server.faults.rate_limit(3, retry_after="1")
    source = make_source(server, shared_dir, max_attempts=5, max_wait_s=0.05)
    caplog.set_level(logging.WARNING, logger="rag_pipeline.sources.zotero")

    started = time.monotonic()
    inventory = source.list_documents()
    elapsed = time.monotonic() - started

    assert inventory.complete and len(inventory.documents) == 8
    assert [r.status for r in server.api_requests()][:4] == [429, 429, 429, 200]
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(retries) == 3 and all("server asked to wait 1 s" in m and "in 0.05 s" in m for m in retries)
    assert elapsed < 1.0  # the 1 s Retry-After was capped at max_wait_s, and pyzotero never slept on it


def test_a_long_429_storm_fails_after_a_bounded_number_of_attempts(server, lib_keys, shared_dir):
    source = make_source(server, shared_dir, max_attempts=4)
    cursor = source.list_documents().cursor
    server.requests.clear()
    server.faults.rate_limit(1000)

    with pytest.raises(SourceError) as info:
        source.list_documents()
    assert info.value.transient and "429" in str(info.value) and "after 4 attempts" in str(info.value)
    assert len(server.api_requests()) == 4
    with pytest.raises(SourceError) as info:
        source.changes(cursor)
    assert info.value.transient and not isinstance(info.value, ChangeFeedUnavailable)


def test_503_with_backoff_is_retried(server, lib_keys, shared_dir):
    server.faults.rate_limit(2, retry_after="2", status=503)
    inventory = make_source(server, shared_dir).list_documents()
    assert inventory.complete and [r.status for r in server.api_requests()][:3] == [503, 503, 200]


def test_backoff_on_a_success_delays_the_next_request(server, lib_keys, shared_dir, monkeypatch):
    server.faults.backoff_s = "5"
    real_sleep, sleeps = time.sleep, []

    def recording_sleep(seconds: float) -> None:  # which module asked to wait, and for how long
        sleeps.append((sys._getframe(1).f_globals.get("__name__", ""), seconds))
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", recording_sleep)
    inventory = make_source(server, shared_dir, max_wait_s=0.1).list_documents()
    assert inventory.complete
    # 6 pages: before each of the 5 later requests one wait of at most min(5, 0.1) s
    ours = [sec for module, sec in sleeps if module == "rag_pipeline.sources.zotero"]
    assert len(ours) == 5 and all(0 < sec <= 0.1 for sec in ours), sleeps
    assert not [m for m, _ in sleeps if m.startswith("pyzotero")]  # pyzotero's own (5 s, uncapped) wait never ran


def test_server_delay_parsing():
    assert server_delay_s({"retry-after": "3"}) == 3.0
    assert server_delay_s({"backoff": "10", "retry-after": "3"}) == 10.0
    assert server_delay_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # a date in the past
    assert server_delay_s({"retry-after": "soon"}) is None
    assert server_delay_s({}) is None


def test_every_request_has_a_timeout(server, lib_keys, shared_dir):
    server.faults.delay_s = 0.5
    source = make_source(server, shared_dir, timeout_s=0.1, max_attempts=2)
    started = time.monotonic()
    with pytest.raises(SourceError) as info:
        source.list_documents()
    assert info.value.transient and "Timeout" in str(info.value)
    assert time.monotonic() - started < 2.0


# ------------------------------------------------------------------------------------------ keys, configuration


def test_the_api_key_is_sent_but_never_logged(server, lib_keys, shared_dir, caplog):
    lib, k = lib_keys
    caplog.set_level(logging.DEBUG)  # every logger, httpx2 and pyzotero included
    source = make_source(server, shared_dir, max_attempts=2)
    errors: list[BaseException] = []

    inventory = source.list_documents()
    docs = {d.source_id: d for d in inventory.documents}
    source.fetch(docs[k.memo])
    source.changes(inventory.cursor)
    lib.update("PQKBRC33", title="changed")
    source.changes(inventory.cursor)
    server.faults.rate_limit(1000)
    for call in (source.list_documents, lambda: source.changes(inventory.cursor), lambda: source.fetch(docs[k.memo])):
        with pytest.raises(SourceError) as info:
            call()
        errors.append(info.value)
    server.faults.clear()
    with pytest.raises(SourceError) as info:
        make_source(server, shared_dir, api_key="wrong-key").list_documents()
    errors.append(info.value)

    assert all(r.authenticated for r in server.api_requests() if r.status != 403)
    assert not info.value.transient and "403" in str(info.value)
    assert caplog.records  # something was logged at all
    assert API_KEY not in caplog.text
    assert all(API_KEY not in str(e) and API_KEY not in repr(e) for e in errors)
    assert API_KEY not in repr(source) and API_KEY not in str(source.__dict__.get("resolver"))


def test_constructor_and_from_env(tmp_path):
    source = ZoteroSource.from_env("users/123", environ={
        "ZOTERO_API_KEY": "k", "ZOTERO_API_URL": "http://127.0.0.1:9/",
        "RAG_ZOTERO_LINKED_ROOT": str(tmp_path), "RAG_ZOTERO_PATH_MAP": "C:\\Papers=/mnt/nas/papers;D:\\X=/mnt/x"})
    assert source.name == "zotero:users/123" and source.library == "users/123"
    assert source.api_url == "http://127.0.0.1:9"
    assert source.resolver.root == tmp_path
    assert dict(source.resolver.prefix_map) == {"C:\\Papers": "/mnt/nas/papers", "D:\\X": "/mnt/x"}
    default = ZoteroSource.from_env("groups/456", environ={}, name="zotero:lab")
    assert default.api_url == DEFAULT_API_URL == "https://api.zotero.org"
    assert default.name == "zotero:lab" and default.library_type == "group"
    assert default.resolver.root is None and not default.resolver.prefix_map
    assert not default.local_api and ZoteroSource("users/0", api_url="http://127.0.0.1:23119/api").local_api
    for bad in ("123", "users/abc", "people/1", ""):
        with pytest.raises(ValueError, match="users/<id>"):
            ZoteroSource(bad)
    with pytest.raises(ValueError, match="http"):
        ZoteroSource("users/1", api_url="ftp://example.org")


def test_a_group_library(shared_dir):
    lib, k = standard_library(shared_dir, library_type="group", library_id=456)
    with FakeZoteroServer(lib) as srv:  # a public group: no key
        source = ZoteroSource("groups/456", api_url=srv.url, path_prefix_map=linked_map(shared_dir / "corpus"))
        inventory = source.list_documents()
        memo = next(d for d in inventory.documents if d.source_id == k.memo)
        assert inventory.complete and len(inventory.documents) == 8
        assert memo.uri == f"zotero://select/groups/456/items/{k.memo}" and memo.metadata["library"] == "groups/456"
        assert source.fetch(memo) == (shared_dir / "corpus" / "fake-memo.pdf").read_bytes()
        assert {r.path.split("/")[1] for r in srv.api_requests()} == {"groups"}


def test_a_standalone_attachment_is_its_own_parent(shared_dir):
    lib = FakeZoteroLibrary.from_fixtures(shared_dir / "fixtures" / "zotero")
    key = lib.add_attachment(None, link_mode="imported_file", title="Loose scan", filename="scan.pdf",
                             content=b"%PDF-1.4 tiny")
    with FakeZoteroServer(lib) as srv:
        docs = {d.source_id: d for d in ZoteroSource(LIBRARY, api_url=srv.url).list_documents().documents}
    assert docs[key].title == "Loose scan" and docs[key].metadata["item_key"] == key
