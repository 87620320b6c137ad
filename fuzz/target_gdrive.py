"""Target: Google Drive response parsing (``rag_pipeline/sources/gdrive.py``), no network.

A real ``GoogleDriveSource`` (built offline from the packaged discovery document, anonymous
credentials) gets every API answer from a stand-in for ``_execute``: ``files.list`` and
``changes.list`` pages, ``files.get`` resources, the start page token and ``about.exportFormats``.
No public recordings of Drive list pages exist (``../shared/fixtures/gdrive/README``), so the bodies are
synthetic, built from the ``File``/``FileList``/``ChangeList`` schemas of ``drive.v3.json`` (a scope
folder, a sub-folder, a PDF, a Google Doc, a shortcut, a trashed file, changes of each kind) plus the
real ``about.json``, then mutated (types swapped, keys dropped, huge/unicode strings, extreme numbers).
``list_documents()`` and ``changes(cursor)`` run for real on them; cursors are also fuzzed directly.

Properties: only ``SourceError`` (``ListingIncompleteError``, ``ChangeFeedUnavailable``) escapes; every
document has the declared field types and is storable (``fuzz.common.check_documents``); a listing's
cursor decodes again; ``_ScopeState.decode`` raises only ``ValueError`` (its documented error).
"""

from __future__ import annotations

import functools
import json
import urllib.parse

from hypothesis import given
from hypothesis import strategies as st

from fuzz.common import (
    Target,
    check_documents,
    counted,
    fixture_keys,
    guard,
    json_values,
    load_json,
    mutated,
    short,
    strings,
)
from rag_pipeline.sources.base import SourceError

FOLDER = "application/vnd.google-apps.folder"
BASE_FILES = [
    {"id": "F0", "name": "scope", "mimeType": FOLDER, "parents": ["ROOT"], "trashed": False},
    {"id": "F1", "name": "sub", "mimeType": FOLDER, "parents": ["F0"], "trashed": False},
    {"id": "P1", "name": "report.pdf", "mimeType": "application/pdf", "size": "1234", "md5Checksum": "0" * 32,
     "sha256Checksum": "a" * 64, "modifiedTime": "2024-05-01T10:00:00.000Z", "version": "7", "headRevisionId": "r1",
     "parents": ["F0"], "trashed": False, "webViewLink": "https://drive.google.com/file/d/P1/view"},
    {"id": "G1", "name": "Notes", "mimeType": "application/vnd.google-apps.document", "modifiedTime": "2024-05-02T10:00:00Z",
     "version": "3", "parents": ["F1"], "trashed": False},
    {"id": "S1", "name": "shortcut", "mimeType": "application/vnd.google-apps.shortcut", "parents": ["F0"],
     "shortcutDetails": {"targetId": "X9", "targetMimeType": "application/pdf"}},
    {"id": "T1", "name": "old.txt", "mimeType": "text/plain", "size": "1", "parents": ["F0"], "trashed": True},
]
TARGETS = {"X9": {"id": "X9", "name": "target.pdf", "mimeType": "application/pdf", "size": "9", "parents": ["ELSEWHERE"]}}
CHANGES = [
    {"changeType": "file", "fileId": "P1", "removed": False, "file": BASE_FILES[2]},
    {"changeType": "file", "fileId": "G1", "removed": False, "file": BASE_FILES[3]},
    {"changeType": "file", "fileId": "T1", "removed": True},
    {"changeType": "file", "fileId": "F2", "removed": False,
     "file": {"id": "F2", "name": "new", "mimeType": FOLDER, "parents": ["F0"]}},
    {"changeType": "file", "fileId": "S1", "removed": False, "file": BASE_FILES[4]},
    {"changeType": "drive", "driveId": "D1", "removed": True},
]
ABOUT = load_json("gdrive", "about.json")
KEYS = fixture_keys(BASE_FILES, CHANGES) + ("nextPageToken", "incompleteSearch", "newStartPageToken", "files", "changes")


class _NotFound(Exception):
    pass


@functools.cache
def source():
    import google.auth.credentials

    from rag_pipeline.sources.gdrive import GoogleDriveSource

    return GoogleDriveSource(credentials=google.auth.credentials.AnonymousCredentials(), folder_id="F0",
                             api_url="http://127.0.0.1:9/drive/v3/", page_size=2)


def _http_404():
    import httplib2
    from googleapiclient.errors import HttpError

    return HttpError(httplib2.Response({"status": 404}), b'{"error": {"code": 404, "errors": [{"reason": "notFound"}]}}')


def _as_pages(value) -> list:
    return list(value) if isinstance(value, list) else [value]


class FakeDrive:
    """Answers ``_execute(request)`` from the generated bodies, by the request's method id."""

    def __init__(self, list_pages, change_pages, by_id, token, about):
        self.list_pages, self.change_pages = _as_pages(list_pages), _as_pages(change_pages)
        self.by_id = by_id if isinstance(by_id, dict) else {}
        self.token, self.about = token, about

    def __call__(self, request):
        method = request.methodId
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.uri).query)
        if method == "drive.files.list":
            first = "pageToken" not in query and "'F0' in parents" in " ".join(query.get("q", []))
            if first or "pageToken" in query:
                return self.list_pages.pop(0) if self.list_pages else {"files": []}
            return {"files": []}
        if method == "drive.files.get":
            file_id = urllib.parse.unquote(urllib.parse.urlsplit(request.uri).path.rsplit("/", 1)[-1])
            if file_id in self.by_id:
                return self.by_id[file_id]
            raise _http_404()
        if method == "drive.changes.getStartPageToken":
            return self.token
        if method == "drive.changes.list":
            return self.change_pages.pop(0) if self.change_pages else {"newStartPageToken": "T-end"}
        if method == "drive.about.get":
            return self.about
        raise AssertionError(f"unexpected request {method}")


def _page(items, token):
    page = {"files": items}
    if token:
        page["nextPageToken"] = token
    return page


file_lists = st.lists(st.lists(st.sampled_from(BASE_FILES + list(TARGETS.values())), max_size=6), min_size=1, max_size=3)
list_pages = st.builds(lambda lists, tokens: [_page(items, tok) for items, tok in zip(lists, tokens + [None] * 3)],
                       file_lists, st.lists(st.sampled_from(["p2", "p3", "p2", ""]), max_size=3)).flatmap(
    lambda pages: mutated(pages, KEYS))
change_pages = st.lists(st.sampled_from(CHANGES), max_size=8).map(
    lambda cs: [{"changes": cs, "newStartPageToken": "T2"}]).flatmap(lambda pages: mutated(pages, KEYS))
by_id = mutated({"F0": BASE_FILES[0], **TARGETS}, KEYS)
tokens = st.one_of(st.just({"startPageToken": "T1"}), json_values())
cursor_states = st.builds(lambda folders, shortcuts: {"v": 1, "t": "T1", "f": folders, "s": shortcuts},
                          st.just({"F0": [], "F1": ["F0"]}), st.just({"S1": "X9"})).flatmap(lambda s: mutated(s, KEYS))


def _encode(state) -> str:
    import base64
    import zlib

    raw = json.dumps(state, allow_nan=True).encode("utf-8", "surrogatepass")
    return "gdrive1:" + base64.urlsafe_b64encode(zlib.compress(raw)).decode("ascii")


@given(list_pages, change_pages, by_id, tokens, st.one_of(st.just(ABOUT), mutated(ABOUT, ("exportFormats",))),
       cursor_states, strings())
@counted
def test(lpages, cpages, files_by_id, token, about, state, raw_cursor) -> None:
    from rag_pipeline.sources.gdrive import _ScopeState

    src = source()
    with guard(lambda: short((lpages, files_by_id))):
        src._export_formats = None
        src._execute = FakeDrive(lpages, cpages, files_by_id, token, about)
        try:
            inventory = src.list_documents()
        except SourceError:
            inventory = None
        if inventory is not None:
            check_documents(inventory.documents)
            _ScopeState.decode(inventory.cursor)
    with guard(lambda: short((state, cpages))):
        src._execute = FakeDrive([], cpages, files_by_id, token, about)
        try:
            changes = src.changes(_encode(state))
        except SourceError:
            changes = None
        if changes is not None:
            check_documents(changes.upserts)
            assert all(isinstance(i, str) for i in changes.deleted_ids), short(changes.deleted_ids)
    with guard(lambda: short(raw_cursor)):
        for cursor in (raw_cursor, "gdrive1:" + raw_cursor, _encode(state)):
            try:
                _ScopeState.decode(cursor)
            except ValueError:
                pass


TARGET = Target("gdrive", test, "sources/gdrive.py: synthetic Drive pages (schema-shaped), mutated -> documents")
