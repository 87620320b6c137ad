"""GoogleDriveSource against a fake Drive v3 server on 127.0.0.1 (no database).

The real google-api-python-client (discovery document from the installed package) and google-auth
service-account / OAuth user credentials talk to ``fakes/gdrive_server.py``, which verifies the JWT
grant, checks query parameters against the discovery document, applies ``fields`` masks and pages
by two. Content is real files from ``../shared/corpus``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time

import pytest
from googleapiclient import discovery_cache
from googleapiclient.discovery import build_from_document
from google.oauth2 import service_account

from rag_pipeline.sources.base import (
    ChangeFeedUnavailable,
    DocumentSkipped,
    ListingIncompleteError,
    SourceError,
)
from rag_pipeline.sources.gdrive import DOCX, PPTX, XLSX, GoogleDriveSource, RetryPolicy, load_credentials

from .fakes.gdrive_server import DOC, FORM, SHEET, SLIDES, corpus_bytes, drive_env

FAST_RETRY = RetryPolicy(attempts=3, base_wait_s=0.01, max_wait_s=2.0)


@pytest.fixture
def drive(shared_dir, tmp_path):
    with drive_env(tmp_path) as env:
        yield env


@pytest.fixture
def tree(drive):
    """Top/{memo.pdf, cups.csv, Sub/{tables.docx, Plan (Doc), Budget (Sheet), Deck (Slides), Survey (Form)},
    shortcut -> outside.md, shortcut -> cups.csv}; outside: outside.md, stray.csv; a trashed file in Top."""
    f = drive.fake
    ids = {"top": f.add_folder("Top")}
    ids["sub"] = f.add_folder("Sub", ids["top"])
    ids["memo"] = f.add_file("memo.pdf", ids["top"], corpus_bytes("fake-memo.pdf"), "application/pdf")
    ids["cups"] = f.add_file("cups.csv", ids["top"], corpus_bytes("stanley-cups.csv"), "text/csv")
    ids["tables"] = f.add_file("tables.docx", ids["sub"], corpus_bytes("docx-tables.docx"), DOCX)
    ids["plan"] = f.add_native("Plan", ids["sub"], DOC, DOCX, corpus_bytes("docx-tables.docx"))
    ids["budget"] = f.add_native("Budget", ids["sub"], SHEET, XLSX, corpus_bytes("2023-half-year-analyses-by-segment.xlsx"))
    ids["deck"] = f.add_native("Deck", ids["sub"], SLIDES, PPTX, corpus_bytes("sample-presentation.pptx"))
    ids["survey"] = f.add_native("Survey", ids["sub"], FORM, "application/zip", b"PK")
    ids["outside"] = f.add_file("outside.md", f.root_id, corpus_bytes("simple-table.md"), "text/markdown")
    ids["stray"] = f.add_file("stray.csv", f.root_id, b"a,b\n1,2\n", "text/csv")
    ids["link_out"] = f.add_shortcut("outside (shortcut)", ids["top"], ids["outside"])
    ids["link_in"] = f.add_shortcut("cups (shortcut)", ids["sub"], ids["cups"])
    ids["old"] = f.add_file("old.csv", ids["top"], b"x\n", "text/csv")
    f.trash(ids["old"])
    return ids


def _source(drive, **kwargs) -> GoogleDriveSource:
    return GoogleDriveSource.from_env(env=drive.env, **kwargs)


def test_full_listing_walks_the_folder_tree_page_by_page(drive, tree):
    inventory = _source(drive, folder_id=tree["top"]).list_documents()
    docs = {d.source_id: d for d in inventory.documents}
    # folders, shortcuts, trashed and out-of-scope files are not documents; shortcut targets are
    assert set(docs) == {tree[k] for k in ("memo", "cups", "tables", "plan", "budget", "deck", "survey", "outside")}
    assert inventory.complete and inventory.cursor
    assert len(inventory.documents) == len(docs)  # de-duplicated by target id

    lists = [params for method, params in drive.fake.requests if method == "files.list"]
    assert len(lists) > 2, "two folders with more than two items each need several pages"
    assert any("pageToken" in p for p in lists)
    for params in lists:
        assert "nextPageToken" in params["fields"] and "trashed = false" in params["q"]
        assert params["supportsAllDrives"] == params["includeItemsFromAllDrives"] == "true"

    memo = docs[tree["memo"]]
    assert memo.title == "memo.pdf" and memo.mime_type == "application/pdf"
    assert memo.content_sha256 == hashlib.sha256(corpus_bytes("fake-memo.pdf")).hexdigest()
    assert memo.size == len(corpus_bytes("fake-memo.pdf")) and memo.source_version
    assert memo.modified_at is not None and memo.modified_at.tzinfo is not None


def test_native_files_are_exported_to_office_formats_listed_in_about(drive, tree):
    source = _source(drive, folder_id=tree["top"])
    docs = {d.source_id: d for d in source.list_documents().documents}
    assert (docs[tree["plan"]].title, docs[tree["plan"]].mime_type) == ("Plan.docx", DOCX)
    assert (docs[tree["budget"]].title, docs[tree["budget"]].mime_type) == ("Budget.xlsx", XLSX)
    assert (docs[tree["deck"]].title, docs[tree["deck"]].mime_type) == ("Deck.pptx", PPTX)
    for key in ("plan", "budget", "deck"):
        doc = docs[tree[key]]
        assert doc.content_sha256 is None and doc.size is None and doc.source_version.startswith("modified:")
        assert source.fetch(doc) == drive.fake.renditions[tree[key]][1]
    assert sorted(drive.fake.export_calls) == sorted(tree[k] for k in ("plan", "budget", "deck"))
    assert source.fetch(docs[tree["memo"]]) == corpus_bytes("fake-memo.pdf")
    assert drive.fake.media_calls == [tree["memo"]]  # never get_media on a native file
    assert [m for m, _ in drive.fake.requests].count("about.get") == 1


def test_form_is_listed_with_a_skip_reason_and_never_fetched(drive, tree):
    source = _source(drive, folder_id=tree["top"])
    survey = next(d for d in source.list_documents().documents if d.source_id == tree["survey"])
    assert survey.skip_reason and "form" in survey.skip_reason
    with pytest.raises(DocumentSkipped):
        source.fetch(survey)
    assert tree["survey"] not in drive.fake.export_calls


def test_export_refused_for_size_fails_only_that_document(drive, tree):
    drive.fake.export_too_large.add(tree["budget"])
    source = _source(drive, folder_id=tree["top"])
    docs = {d.source_id: d for d in source.list_documents().documents}
    with pytest.raises(DocumentSkipped) as refused:
        source.fetch(docs[tree["budget"]])
    assert "exportSizeLimitExceeded" in refused.value.reason
    assert source.fetch(docs[tree["deck"]]) == corpus_bytes("sample-presentation.pptx")


def test_shortcuts_resolve_to_their_target_once(drive, tree):
    docs = {d.source_id: d for d in _source(drive, folder_id=tree["top"]).list_documents().documents}
    assert tree["link_out"] not in docs and tree["link_in"] not in docs
    assert docs[tree["outside"]].title == "outside.md"
    assert docs[tree["outside"]].metadata["shortcut_ids"] == [tree["link_out"]]
    assert docs[tree["cups"]].metadata["shortcut_ids"] == [tree["link_in"]]


def test_a_shortcut_target_trashed_and_restored(drive, tree):
    source = _source(drive, folder_id=tree["top"])
    cursor = source.list_documents().cursor
    drive.fake.trash(tree["outside"])                    # the shortcut stays, its target is in the trash
    trashed = source.changes(cursor)
    assert trashed.upserts == [] and trashed.deleted_ids == [tree["outside"]]
    drive.fake.restore(tree["outside"])
    restored = source.changes(trashed.next_cursor)
    assert [d.source_id for d in restored.upserts] == [tree["outside"]] and restored.deleted_ids == []


def test_a_day_of_changes_through_the_change_feed(drive, tree):
    source = _source(drive, folder_id=tree["top"])
    cursor = source.list_documents().cursor
    f = drive.fake
    added = f.add_file("new.txt", tree["sub"], corpus_bytes("fake-text-utf-16.txt"), "text/plain")
    f.update_content(tree["cups"], corpus_bytes("stanley-cups.csv") + b"Team,Location,Stanley Cups\nKings,LA,2\n")
    f.rename(tree["memo"], "memo (final).pdf")
    f.trash(tree["tables"])
    f.restore(tree["old"])
    f.update_content(tree["stray"], b"a,b\n3,4\n")       # outside the scope: not an upsert
    f.move(tree["deck"], f.root_id)                      # moved out of the scope
    f.delete(tree["link_out"])                           # its target leaves with it
    changes = source.changes(cursor)
    upserts = {d.source_id: d for d in changes.upserts}
    assert set(upserts) == {added, tree["cups"], tree["memo"], tree["old"]}
    assert upserts[tree["memo"]].title == "memo (final).pdf"
    assert upserts[tree["memo"]].content_sha256 == hashlib.sha256(corpus_bytes("fake-memo.pdf")).hexdigest()
    assert upserts[tree["cups"]].content_sha256 == hashlib.sha256(f.blobs[tree["cups"]]).hexdigest()
    assert {tree["tables"], tree["deck"], tree["outside"]} <= set(changes.deleted_ids)
    assert not set(upserts) & set(changes.deleted_ids)

    # the next cursor sees nothing new, then only what happens after it
    again = source.changes(changes.next_cursor)
    assert again.upserts == [] and again.deleted_ids == []
    f.restore(tree["tables"])
    back = source.changes(again.next_cursor)
    assert [d.source_id for d in back.upserts] == [tree["tables"]]


def test_a_folder_entering_the_scope_brings_its_files(drive, tree):
    source = _source(drive, folder_id=tree["top"])
    cursor = source.list_documents().cursor
    f = drive.fake
    elsewhere = f.add_folder("Elsewhere")
    inner = f.add_file("inner.csv", elsewhere, b"k,v\n1,2\n", "text/csv")
    fresh = f.add_folder("Fresh", tree["sub"])
    fresh_file = f.add_file("fresh.csv", fresh, b"k,v\n3,4\n", "text/csv")
    f.rename(tree["sub"], "Sub (renamed)")               # a rename of an in-scope folder is harmless
    changes = source.changes(cursor)
    assert {d.source_id for d in changes.upserts} == {fresh_file}
    f.move(elsewhere, tree["top"])                       # moved in: its file was never reported itself
    moved_in = source.changes(changes.next_cursor)
    assert {d.source_id for d in moved_in.upserts} == {inner}


@pytest.mark.parametrize("change", ["trash", "move_out", "delete"])
def test_an_in_scope_folder_leaving_needs_full_reconciliation(drive, tree, change):
    source = _source(drive, folder_id=tree["top"])
    cursor = source.list_documents().cursor
    {"trash": drive.fake.trash, "delete": drive.fake.delete,
     "move_out": lambda i: drive.fake.move(i, drive.fake.root_id)}[change](tree["sub"])
    with pytest.raises(ChangeFeedUnavailable):
        source.changes(cursor)


def test_unusable_cursors_fall_back_to_a_full_listing(drive, tree):
    source = _source(drive, folder_id=tree["top"])
    for cursor in (None, "", "garbage", "gdrive1:!!!"):
        with pytest.raises(ChangeFeedUnavailable):
            source.changes(cursor)
    from rag_pipeline.sources.gdrive import _ScopeState

    expired = _ScopeState(token="999999", folders={tree["top"]: []}).encode()
    with pytest.raises(ChangeFeedUnavailable, match="rejected the change token"):
        source.changes(expired)


def test_shared_drive_scope(drive):
    f = drive.fake
    team = f.add_shared_drive("Team")
    reports = f.add_folder("Reports", team)
    a = f.add_file("a.csv", reports, corpus_bytes("stanley-cups.csv"), "text/csv")
    b = f.add_file("b.md", team, corpus_bytes("simple-table.md"), "text/markdown")
    f.add_file("mine.csv", f.root_id, b"x\n", "text/csv")
    source = _source(drive, shared_drive_id=team)
    inventory = source.list_documents()
    assert {d.source_id for d in inventory.documents} == {a, b}
    assert all(d.metadata["drive_id"] == team for d in inventory.documents)
    lists = [p for m, p in drive.fake.requests if m == "files.list"]
    assert all(p["corpora"] == "drive" and p["driveId"] == team for p in lists)
    assert source.fetch(next(d for d in inventory.documents if d.source_id == a)) == corpus_bytes("stanley-cups.csv")

    f.move(a, f.root_id)                                 # left the shared drive
    c = f.add_file("c.csv", reports, b"y\n", "text/csv")
    changes = source.changes(inventory.cursor)
    assert [d.source_id for d in changes.upserts] == [c] and a in changes.deleted_ids


def test_transient_errors_are_retried_then_reported(drive, tree):
    source = GoogleDriveSource(credentials=_credentials(drive), folder_id=tree["top"], api_url=drive.api_url,
                               retry=FAST_RETRY)
    drive.fake.fail_next("files.list", 503, times=2)
    assert len(source.list_documents().documents) == 8   # two failures, third try succeeds
    drive.fake.fail_next("files.list", 500, times=3)
    with pytest.raises(ListingIncompleteError, match="HTTP 500"):
        source.list_documents()


def test_retry_after_is_honoured_and_bounded(drive, tree):
    source = GoogleDriveSource(credentials=_credentials(drive), folder_id=tree["top"], api_url=drive.api_url,
                               retry=FAST_RETRY)
    drive.fake.fail_next("files.list", 429, "rateLimitExceeded", headers={"Retry-After": "1"})
    started = time.monotonic()
    source.list_documents()
    assert time.monotonic() - started >= 1.0
    drive.fake.fail_next("files.list", 429, "rateLimitExceeded", headers={"Retry-After": "3600"})
    started = time.monotonic()
    with pytest.raises(ListingIncompleteError, match="429"):
        source.list_documents()
    assert time.monotonic() - started < 2.0            # not waiting an hour, not hammering either


def test_oauth_user_token_file(drive, tree, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    drive.fake.accept_oauth_client("client-1.apps.googleusercontent.com", "oauth-secret-xyz", "1//refresh-abc")
    token_file = tmp_path / "token.json"
    token_file.write_text(json.dumps({
        "type": "authorized_user", "client_id": "client-1.apps.googleusercontent.com",
        "client_secret": "oauth-secret-xyz", "refresh_token": "1//refresh-abc",
        "token_uri": "https://attacker.invalid/token"}))   # google-auth ignores a token file's token_uri
    source = GoogleDriveSource.from_env(folder_id=tree["top"], env={
        "RAG_GDRIVE_OAUTH_TOKEN_FILE": str(token_file), "RAG_GDRIVE_OAUTH_TOKEN_URI": drive.base_url + "/token",
        "RAG_GDRIVE_API_URL": drive.api_url})
    assert len(source.list_documents().documents) == 8
    assert drive.fake.token_grants == ["refresh:client-1.apps.googleusercontent.com"]
    assert caplog.records and "oauth-secret-xyz" not in caplog.text and "refresh-abc" not in caplog.text


def test_service_account_grant_is_verified_and_bad_keys_fail_cleanly(drive, tree, tmp_path):
    _source(drive, folder_id=tree["top"]).list_documents()
    assert drive.fake.token_grants == [f"jwt:{drive.key.info['client_email']}"]
    from .fakes.gdrive_server import ServiceAccountKey

    stranger = ServiceAccountKey.generate(drive.base_url + "/token")  # same e-mail, key the server never saw
    bad_file = tmp_path / "bad.json"
    bad_file.write_text(json.dumps(stranger.info))
    bad = GoogleDriveSource.from_env(folder_id=tree["top"], env={**drive.env, "GOOGLE_APPLICATION_CREDENTIALS": str(bad_file)})
    with pytest.raises(SourceError, match="invalid_grant") as failure:
        bad.list_documents()
    assert failure.value.transient


def test_missing_credentials_are_a_configuration_error(tmp_path):
    with pytest.raises(SourceError, match="GOOGLE_APPLICATION_CREDENTIALS") as missing:
        GoogleDriveSource.from_env(folder_id="x", env={})
    assert not missing.value.transient
    with pytest.raises(SourceError, match="cannot load") as unreadable:
        load_credentials(service_account_file=str(tmp_path / "nope.json"))
    assert not unreadable.value.transient
    with pytest.raises(ValueError):
        GoogleDriveSource(credentials=None, folder_id=None)  # type: ignore[arg-type]


def test_secrets_are_never_logged(drive, tree, caplog):
    caplog.set_level(logging.DEBUG)
    source = _source(drive, folder_id=tree["top"])
    drive.fake.export_too_large.add(tree["plan"])
    inventory = source.list_documents()
    errors = []
    for doc in inventory.documents:
        try:
            source.fetch(doc)
        except (DocumentSkipped, SourceError) as exc:
            errors.append(str(exc))
    drive.fake.add_file("late.csv", tree["top"], b"z\n", "text/csv")
    source.changes(inventory.cursor)
    assert caplog.records, "DEBUG logging was captured"
    text = caplog.text + "\n".join(errors)
    key_body = drive.key.info["private_key"].splitlines()[1]
    secrets_seen = [key_body, drive.key.info["private_key_id"], *drive.fake._access_tokens]
    assert drive.fake._access_tokens
    for secret in secrets_seen:
        assert secret not in text


def test_the_fake_applies_fields_masks_like_drive(drive, tree):
    # A client that forgot nextPageToken in `fields` would see one page only: the fake enforces
    # the partial-response rule, so the source's paging above is real.
    service = build_from_document(discovery_cache.get_static_doc("drive", "v3"), credentials=_credentials(drive),
                                  client_options={"api_endpoint": drive.api_url})
    page = service.files().list(q=f"'{tree['sub']}' in parents and trashed = false", fields="files(id)",
                                corpora="allDrives", includeItemsFromAllDrives=True, supportsAllDrives=True).execute()
    assert set(page) == {"files"} and len(page["files"]) == 2 and set(page["files"][0]) == {"id"}


def _credentials(drive):
    return service_account.Credentials.from_service_account_info(
        drive.key.info, scopes=["https://www.googleapis.com/auth/drive.readonly"])
