"""GoogleDriveSource hardening (issue 12): streamed fetch (``fetch_to``) and shape checks on every answer.

The real google-api-python-client and google-auth talk to the fake Drive of ``fakes/gdrive_server.py``
through :class:`RangeDrive`, a subclass adding what these tests need and the stock fake lacks:

* ``Range`` on ``alt=media`` downloads (Drive documents partial downloads for ``get_media``; exports
  only when ``range_exports`` is set, the stock fake's whole-body ``200`` otherwise), answering ``206``
  with ``Content-Range``, or ``416`` for a range past the end (an empty file);
* a log of every media request (its ``Range`` header, the bytes sent), a fault on the n-th one;
* ``mangle``: a rewrite of a method's JSON answer after the ``fields`` mask, to serve shapes Drive never
  sends (a page that is a list, a permission whose role is a list, ...).

Expected values are computed independently: SHA-256 of the bytes put on the fake, ranges from the sizes.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import logging
import random
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from werkzeug.wrappers import Request, Response

from rag_pipeline.extraction.types import DocumentTooLargeError
from rag_pipeline.pipeline.spool import Spool
from rag_pipeline.sources.base import (
    FETCH_PIECE_BYTES,
    ChangeFeedUnavailable,
    DocumentSkipped,
    ListingIncompleteError,
    SourceDocument,
    SourceError,
    fetch_into,
)
from rag_pipeline.sources.gdrive import (
    DIRECTORY_MEMBERS_SCOPE,
    DOCX,
    GoogleDriveSource,
    RetryPolicy,
    _ScopeState,
    load_credentials,
)

from .fakes.gdrive_server import (
    _METHODS,
    DOC,
    DriveEnv,
    FakeDrive,
    ServiceAccountKey,
    _error,
    _json,
    corpus_bytes,
)

FAST_RETRY = RetryPolicy(attempts=3, base_wait_s=0.01, max_wait_s=1.0)
MIB = 1024 * 1024
OWNER = "user:owner@example.com"
ADMIN = "admin@example.com"


def _method(path: str) -> str | None:
    """The Drive method name of a request path, as the stock fake computes it."""
    if not path.startswith("/drive/v3/"):
        return "members.list" if path.startswith("/admin/directory/v1/") else None
    parts = tuple(p for p in path[len("/drive/v3/"):].split("/") if p)
    return _METHODS.get(tuple("*" if i == 1 and parts[0] == "files" else p for i, p in enumerate(parts)))


@dataclass
class RangeDrive(FakeDrive):
    """The fake Drive plus ``Range`` on media downloads, a media request log and answer rewriting."""

    range_exports: bool = False
    """Honour ``Range`` on ``files.export`` too (the stock fake, like a server ignoring it, sends all)."""
    empty_pieces: bool = False
    """Misbehave: answer each ranged request with ``206`` and no bytes."""
    media_requests: list[tuple[str, str | None, int]] = field(default_factory=list)
    """``(method, Range header, bytes sent)`` per media request, in order."""
    fail_media: dict[int, int] = field(default_factory=dict)
    """The n-th media request (1-based) -> the HTTP status it fails with (once)."""
    mangle: dict[str, Callable[[Any, Request], Any]] = field(default_factory=dict)
    """Method -> ``f(json body, request)``: what to send instead of a successful JSON answer."""

    def handle(self, request: Request) -> Response:
        method = _method(request.path)
        media = method == "files.export" or (method == "files.get" and request.args.get("alt") == "media")
        if media:
            with self._lock:
                number = len(self.media_requests) + 1
                status = self.fail_media.pop(number, None)
                if status:
                    self.media_requests.append((method, request.headers.get("Range"), 0))
                    return _error(status, "backendError", "injected media fault")
        response = super().handle(request)
        if media:
            if response.status_code == 200 and (method == "files.get" or self.range_exports):
                response = self._ranged(request.headers.get("Range"), response)
            with self._lock:
                sent = len(response.get_data()) if response.status_code in (200, 206) else 0
                self.media_requests.append((method, request.headers.get("Range"), sent))
        rewrite = self.mangle.get(method or "")
        if rewrite is not None and response.status_code == 200 and response.mimetype == "application/json":
            response = _json(rewrite(json.loads(response.get_data()), request))
        return response

    def _ranged(self, header: str | None, full: Response) -> Response:
        match = re.fullmatch(r"bytes=(\d+)-(\d+)", header or "")
        if match is None:
            return full
        data = full.get_data()
        start, end = int(match.group(1)), int(match.group(2))
        if start >= len(data):
            return Response(b"", status=416, headers={"Content-Range": f"bytes */{len(data)}"})
        end = min(end, len(data) - 1)
        body = b"" if self.empty_pieces else data[start:end + 1]
        return Response(body, status=206, content_type=full.mimetype,
                        headers={"Content-Range": f"bytes {start}-{end}/{len(data)}"})


@contextlib.contextmanager
def range_env(tmp_dir, **options: Any) -> Iterator[DriveEnv]:
    """Like ``fakes.gdrive_server.drive_env``, serving a :class:`RangeDrive`."""
    fake = RangeDrive(**options)
    with fake.serve() as base:
        key = ServiceAccountKey.generate(base + "/token")
        fake.accept_service_account(key.info["client_email"], key.public_key_pem)
        key_file = tmp_dir / "service-account.json"
        key_file.write_text(json.dumps(key.info), encoding="utf-8")
        fake.directory_readers.add(ADMIN)
        yield DriveEnv(fake, base, key, key_file)


@pytest.fixture
def drive(shared_dir, tmp_path):
    with range_env(tmp_path) as env:
        yield env


def _source(drive: DriveEnv, *, directory: bool = False, **scope: Any) -> GoogleDriveSource:
    key = str(drive.key_file)
    extra: dict[str, Any] = {}
    if directory:
        extra = {"directory_credentials": load_credentials(service_account_file=key, scopes=(DIRECTORY_MEMBERS_SCOPE,),
                                                           subject=ADMIN),
                 "directory_api_url": drive.base_url}
    return GoogleDriveSource(credentials=load_credentials(service_account_file=key), api_url=drive.api_url,
                             retry=FAST_RETRY, **scope, **extra)


def _blob(size: int, seed: int = 7) -> bytes:
    return random.Random(seed).randbytes(size)


class Recorder:
    """An ``out`` that keeps every write (as bytes) in order."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: Any) -> int:
        self.writes.append(bytes(data))
        return len(data)


class FailingOut(Recorder):
    """An ``out`` whose write raises ``error`` once more than ``limit`` bytes would have been written."""

    def __init__(self, limit: int, error: BaseException) -> None:
        super().__init__()
        self.limit, self.error = limit, error

    def write(self, data: Any) -> int:
        if sum(map(len, self.writes)) + len(data) > self.limit:
            raise self.error
        return super().write(data)


def _documents(source: GoogleDriveSource) -> dict[str, SourceDocument]:
    return {d.source_id: d for d in source.list_documents().documents}


# ---------------------------------------------------------------------------------------------
# streaming


def test_a_download_of_several_mib_arrives_in_range_pieces(drive):
    size = 3 * MIB + 12345
    content = _blob(size)
    expected_sha = hashlib.sha256(content).hexdigest()
    top = drive.fake.add_folder("Top")
    big = drive.fake.add_file("big.bin", top, content, "application/octet-stream")
    source = _source(drive, folder_id=top)
    doc = _documents(source)[big]
    out = Recorder()
    source.fetch_to(doc, out)
    assert len(out.writes) > 1 and all(len(w) <= FETCH_PIECE_BYTES for w in out.writes)
    assert hashlib.sha256(b"".join(out.writes)).hexdigest() == expected_sha
    # one Range request per MiB piece, nothing asked for twice
    pieces = -(-size // MIB)
    assert [r for _, r, _ in drive.fake.media_requests] == [
        f"bytes={i * MIB}-{(i + 1) * MIB - 1}" for i in range(pieces)]
    assert sum(sent for *_, sent in drive.fake.media_requests) == size
    # fetch() is the same route, into memory
    assert hashlib.sha256(source.fetch(doc)).hexdigest() == expected_sha


@pytest.mark.parametrize("range_exports", [False, True], ids=["export-whole", "export-ranged"])
def test_an_export_streams_through_media_download(drive, range_exports):
    drive.fake.range_exports = range_exports
    rendition = _blob(2 * MIB + 999, seed=11)
    top = drive.fake.add_folder("Top")
    plan = drive.fake.add_native("Plan", top, DOC, DOCX, rendition)
    source = _source(drive, folder_id=top)
    out = Recorder()
    source.fetch_to(_documents(source)[plan], out)
    assert len(out.writes) == 3 and all(len(w) <= FETCH_PIECE_BYTES for w in out.writes)
    assert hashlib.sha256(b"".join(out.writes)).hexdigest() == hashlib.sha256(rendition).hexdigest()
    methods = [m for m, _, _ in drive.fake.media_requests]
    # whole: one 200 with every byte, split into pieces on the way out; ranged: one request per piece
    assert methods == ["files.export"] * (3 if range_exports else 1)
    assert drive.fake.export_calls == [plan] * len(methods) and drive.fake.media_calls == []


def test_the_size_cap_raised_by_write_propagates_unchanged_and_stops_the_download(drive):
    size = 4 * MIB
    top = drive.fake.add_folder("Top")
    big = drive.fake.add_file("big.bin", top, _blob(size), "application/octet-stream")
    source = _source(drive, folder_id=top)
    doc = _documents(source)[big]
    cap = DocumentTooLargeError("too large: at least 2.0 MB")
    out = FailingOut(int(1.5 * MIB), cap)
    with pytest.raises(DocumentTooLargeError) as raised:
        source.fetch_to(doc, out)
    assert raised.value is cap                               # the very object, not wrapped
    assert sum(map(len, out.writes)) == MIB                  # the first piece only
    # the second piece was the last one asked for, once (no retry), and half the file never left the server
    assert [r for _, r, _ in drive.fake.media_requests] == ["bytes=0-1048575", "bytes=1048576-2097151"]
    assert sum(sent for *_, sent in drive.fake.media_requests) == 2 * MIB < size


def test_the_real_spool_cap_stops_a_drive_download(drive):
    top = drive.fake.add_folder("Top")
    big = drive.fake.add_file("big.bin", top, _blob(5 * MIB), "application/octet-stream")
    source = _source(drive, folder_id=top)
    doc = _documents(source)[big]
    with Spool(cap_mb=2) as spool, pytest.raises(DocumentTooLargeError, match="RAG_MAX_DOCUMENT_MB"):
        fetch_into(source, doc, spool)
    assert spool.size == 2 * MIB
    assert len(drive.fake.media_requests) == 3               # the third piece was refused, none after it


def test_a_write_failing_with_an_os_error_is_neither_retried_nor_wrapped(drive):
    top = drive.fake.add_folder("Top")
    big = drive.fake.add_file("big.bin", top, _blob(3 * MIB), "application/octet-stream")
    source = _source(drive, folder_id=top)
    doc = _documents(source)[big]
    full = OSError(errno.ENOSPC, "No space left on device")  # transient for an HTTP call, not for a write
    out = FailingOut(MIB, full)
    with pytest.raises(OSError) as raised:
        source.fetch_to(doc, out)
    assert raised.value is full and not isinstance(raised.value, SourceError)
    assert [r for _, r, _ in drive.fake.media_requests] == ["bytes=0-1048575", "bytes=1048576-2097151"]


def test_a_failed_piece_is_retried_without_writing_anything_twice(drive):
    size = 3 * MIB + 5
    content = _blob(size, seed=3)
    top = drive.fake.add_folder("Top")
    big = drive.fake.add_file("big.bin", top, content, "application/octet-stream")
    source = _source(drive, folder_id=top)
    doc = _documents(source)[big]
    drive.fake.fail_media[2] = 503                            # the second piece fails once
    out = Recorder()
    source.fetch_to(doc, out)
    assert hashlib.sha256(b"".join(out.writes)).hexdigest() == hashlib.sha256(content).hexdigest()
    assert sum(map(len, out.writes)) == size
    ranges = [r for _, r, _ in drive.fake.media_requests]
    assert ranges == ["bytes=0-1048575", "bytes=1048576-2097151", "bytes=1048576-2097151",
                      "bytes=2097152-3145727", "bytes=3145728-4194303"]
    # a piece failing on every try: a transient SourceError naming the status
    drive.fake.fail_media.update({n: 500 for n in range(6, 6 + FAST_RETRY.attempts)})
    with pytest.raises(SourceError, match="HTTP 500") as failed:
        source.fetch_to(doc, Recorder())
    assert failed.value.transient


def test_an_empty_file_downloads_as_no_bytes(drive):
    top = drive.fake.add_folder("Top")
    empty = drive.fake.add_file("empty.txt", top, b"", "text/plain")
    source = _source(drive, folder_id=top)
    out = Recorder()
    source.fetch_to(_documents(source)[empty], out)
    assert b"".join(out.writes) == b""
    assert [r for _, r, _ in drive.fake.media_requests] == ["bytes=0-1048575"]   # answered 416, */0


def test_a_download_that_stops_making_progress_is_an_error_not_a_loop(drive):
    top = drive.fake.add_folder("Top")
    big = drive.fake.add_file("big.bin", top, _blob(2 * MIB), "application/octet-stream")
    source = _source(drive, folder_id=top)
    doc = _documents(source)[big]
    drive.fake.empty_pieces = True
    with pytest.raises(SourceError, match="without bytes"):
        source.fetch_to(doc, Recorder())
    assert len(drive.fake.media_requests) == 1


def test_fetch_errors_keep_their_mapping(drive):
    f = drive.fake
    top = f.add_folder("Top")
    memo = f.add_file("memo.pdf", top, corpus_bytes("fake-memo.pdf"), "application/pdf")
    gone = f.add_file("gone.csv", top, b"a\n", "text/csv")
    plan = f.add_native("Plan", top, DOC, DOCX, corpus_bytes("docx-tables.docx"))
    source = _source(drive, folder_id=top)
    docs = _documents(source)
    f.delete(gone)
    with pytest.raises(SourceError, match="file not found") as missing:
        source.fetch_to(docs[gone], Recorder())
    assert missing.value.transient
    f.fail_next("files.get", 403, "cannotDownloadAbusiveFile")
    with pytest.raises(DocumentSkipped, match="cannotDownloadAbusiveFile"):
        source.fetch_to(docs[memo], Recorder())
    # a native file asked for with get_media (no export format): Drive's fileNotDownloadable is terminal
    as_binary = docs[plan].replace(metadata={**docs[plan].metadata, "export_mime_type": None})
    with pytest.raises(DocumentSkipped, match="fileNotDownloadable"):
        source.fetch_to(as_binary, Recorder())
    f.export_too_large.add(plan)
    with pytest.raises(DocumentSkipped, match="exportSizeLimitExceeded"):
        source.fetch_to(docs[plan], Recorder())
    skipped = docs[plan].replace(skip_reason="Google-native type nobody handles")
    with pytest.raises(DocumentSkipped, match="nobody handles"):
        source.fetch_to(skipped, Recorder())
    assert source.fetch(docs[memo]) == corpus_bytes("fake-memo.pdf")


# ---------------------------------------------------------------------------------------------
# the cursor


def _packed(value: Any) -> str:
    return "gdrive1:" + base64.urlsafe_b64encode(zlib.compress(json.dumps(value).encode())).decode()


@pytest.mark.parametrize("cursor", [
    _packed([1]), _packed(None), _packed("x"), _packed(7),
    _packed({"v": 1, "t": "T", "f": None}), _packed({"v": 1, "t": "T", "f": []}),
    _packed({"v": 1, "t": "T", "f": {"F": "P"}}), _packed({"v": 1, "t": "T", "f": {"F": [1]}}),
    _packed({"v": 1, "t": "T", "s": {"S": 5}}), _packed({"v": 1, "t": "T", "s": []}),
    _packed({"v": 1, "t": 5}), _packed({"v": 1, "t": ""}), _packed({"v": True, "t": "T"}),
    _packed({"v": 1, "t": "T", "f": {"": []}}), _packed({"v": 1, "t": "T", "s": {"S": "\ud800"}}),
    "gdrive1:" + base64.urlsafe_b64encode(zlib.compress(b"[" * 200_000)).decode(),      # nesting
    "gdrive1:" + base64.urlsafe_b64encode(zlib.compress(b"{}")[:-3]).decode(),           # truncated
    "gdrive1:\u00e9", "gdrive1:!!", "nope", None, 12,
], ids=lambda c: None)
def test_a_cursor_of_any_other_shape_raises_only_value_error(cursor):
    with pytest.raises(ValueError):
        _ScopeState.decode(cursor)


def test_a_well_formed_cursor_round_trips_and_a_bad_one_means_full_listing(drive):
    state = _ScopeState(token="42", folders={"F0": [], "F1": ["F0"]}, shortcuts={"S1": "X9"})
    assert _ScopeState.decode(state.encode()) == state
    source = _source(drive, folder_id=drive.fake.add_folder("Top"))
    with pytest.raises(ChangeFeedUnavailable, match="unusable Drive cursor"):
        source.changes(_packed({"v": 1, "t": "T", "f": None}))


# ---------------------------------------------------------------------------------------------
# file resources and pages


def _doc(**item: Any) -> SourceDocument:
    source = GoogleDriveSource(credentials=None, folder_id="F0", api_url="http://127.0.0.1:9/drive/v3/")  # type: ignore[arg-type]
    source._export_formats = {}
    return source._to_document({"id": "P1", **item}, {})


@pytest.mark.parametrize("size, expected", [
    ("12", 12), (12, 12), ("0", 0), ("12 KB", None), ("-1", None), (-1, None), (True, None), (1.5, None),
    ("\u0661\u0662", None), ("9" * 30, None), (2**63, None), ({"n": 1}, None), (None, None),
])
def test_size_is_read_only_from_digits_or_a_plain_int(size, expected):
    assert _doc(name="a.pdf", mimeType="application/pdf", size=size).size == expected


def test_fields_of_the_wrong_type_are_used_as_if_absent():
    doc = _doc(name=["a"], mimeType=5, size="3", md5Checksum={"x": 1}, sha256Checksum="not-a-digest",
               modifiedTime=20240501, version=7.5, headRevisionId=None, parents="F0", driveId=["D"],
               webViewLink=3, trashed="yes")
    assert (doc.source_id, doc.title, doc.mime_type, doc.size) == ("P1", "P1", None, 3)
    assert doc.uri == "https://drive.google.com/file/d/P1/view"
    assert doc.modified_at is None and doc.source_version is None and doc.content_sha256 is None
    assert doc.metadata["parents"] == [] and doc.metadata["drive_id"] is None and doc.metadata["md5"] is None
    surrogate = _doc(name="caf\udce9.pdf", mimeType="application/pdf", parents=["F0", 3, "\ud800"])
    assert surrogate.title == "caf\ufffd.pdf" and surrogate.metadata["parents"] == ["F0"]
    surrogate.title.encode("utf-8")
    native = _doc(name="Notes", mimeType=DOC, size="12", sha256Checksum="a" * 64, modifiedTime="2024-05-02T10:00:00Z")
    assert native.size is None and native.content_sha256 is None and native.title == "Notes.docx"
    assert native.modified_at is not None and native.modified_at.tzinfo is not None


def _files_in(body: Any, extra: list[Any]) -> Any:
    return {**body, "files": body.get("files", []) + extra}


def test_malformed_file_resources_are_skipped_and_the_listing_marked_incomplete(drive, caplog):
    f = drive.fake
    top = f.add_folder("Top")
    good = f.add_file("good.csv", top, b"a,b\n", "text/csv")
    f.mangle["files.list"] = lambda body, r: _files_in(body, [
        "junk", 5, None, {"id": 7, "name": "int id"}, {"id": "", "name": "empty id"}, {"name": "no id"},
        {"id": "bad\ud800", "name": "surrogate id"},
        {"id": "odd1", "name": 9, "mimeType": ["x"], "size": "1 MB", "parents": top, "trashed": "no"}])
    caplog.set_level(logging.WARNING, "rag_pipeline.sources.gdrive")
    inventory = _source(drive, folder_id=top).list_documents()
    docs = {d.source_id: d for d in inventory.documents}
    assert set(docs) == {good, "odd1"}
    assert not inventory.complete and "7 malformed item(s) skipped" in inventory.incomplete_reason
    assert (docs["odd1"].title, docs["odd1"].mime_type, docs["odd1"].size) == ("odd1", None, None)
    assert docs[good].size == 4 and docs[good].title == "good.csv"
    assert sum("skipped" in r.getMessage() for r in caplog.records) == 7
    _ScopeState.decode(inventory.cursor)


@pytest.mark.parametrize("mangle", [
    lambda body, r: [body],
    lambda body, r: "a page",
    lambda body, r: {**body, "files": {"id": "x"}},
    lambda body, r: {**body, "files": None},
    lambda body, r: {**body, "nextPageToken": 12},
    lambda body, r: {**body, "nextPageToken": ["p2"]},
], ids=["list", "string", "files-object", "files-null", "token-int", "token-list"])
def test_a_malformed_files_list_page_makes_the_listing_fail(drive, mangle):
    top = drive.fake.add_folder("Top")
    drive.fake.add_file("a.csv", top, b"a\n", "text/csv")
    drive.fake.mangle["files.list"] = mangle
    with pytest.raises(ListingIncompleteError, match="files.list"):
        _source(drive, folder_id=top).list_documents()


@pytest.mark.parametrize("method, mangle", [
    ("changes.getStartPageToken", lambda body, r: {"startPageToken": 5}),
    ("changes.getStartPageToken", lambda body, r: ["1"]),
    ("files.get", lambda body, r: [body]),
    ("files.get", lambda body, r: {**body, "id": 5}),
], ids=["token-int", "token-list", "root-list", "root-id-int"])
def test_a_malformed_start_token_or_scope_folder_makes_the_listing_fail(drive, method, mangle):
    top = drive.fake.add_folder("Top")
    drive.fake.mangle[method] = mangle
    with pytest.raises(ListingIncompleteError):
        _source(drive, folder_id=top).list_documents()


def test_a_malformed_about_answer_falls_back_to_the_default_export_formats(drive):
    top = drive.fake.add_folder("Top")
    plan = drive.fake.add_native("Plan", top, DOC, DOCX, b"PK")
    drive.fake.mangle["about.get"] = lambda body, r: {"exportFormats": {DOC: "application/pdf", "x": 3}}
    doc = _documents(_source(drive, folder_id=top))[plan]
    assert doc.mime_type == DOCX and doc.skip_reason is None       # the first preference, as documented


# ---------------------------------------------------------------------------------------------
# the change feed


@pytest.mark.parametrize("mangle", [
    lambda body, r: [body],
    lambda body, r: {**body, "changes": {"fileId": "x"}},
    lambda body, r: {**body, "newStartPageToken": 7} if "newStartPageToken" in body else body,
    lambda body, r: {**body, "nextPageToken": {"t": 1}} if "nextPageToken" in body else body,
], ids=["list", "changes-object", "start-token-int", "next-token-object"])
def test_a_malformed_changes_page_makes_the_change_set_fail(drive, mangle):
    f = drive.fake
    top = f.add_folder("Top")
    source = _source(drive, folder_id=top)
    cursor = source.list_documents().cursor
    for n in range(3):
        f.add_file(f"n{n}.csv", top, b"x\n", "text/csv")
    f.mangle["changes.list"] = mangle
    with pytest.raises(ListingIncompleteError, match="changes.list"):
        source.changes(cursor)


def test_malformed_changes_are_skipped_and_the_change_set_marked_incomplete(drive):
    f = drive.fake
    top = f.add_folder("Top")
    source = _source(drive, folder_id=top)
    cursor = source.list_documents().cursor
    new = f.add_file("new.csv", top, b"x\n", "text/csv")
    f.mangle["changes.list"] = lambda body, r: {**body, "changes": body.get("changes", []) + [
        "junk", {"fileId": 5}, {"fileId": "Z1", "removed": "yes"}, {"fileId": "Z2", "file": ["x"]},
        {"fileId": "Z3", "file": {"id": "Z4"}}, {"changeType": "file"}, {"fileId": "Z5", "file": {"name": "no id"}}]}
    changes = source.changes(cursor)
    assert [d.source_id for d in changes.upserts] == [new]
    assert not changes.complete and "malformed item(s) skipped" in changes.incomplete_reason
    assert not {"Z1", "Z2", "Z3", "Z4", "Z5"} & set(changes.deleted_ids)
    f.mangle.clear()
    again = source.changes(cursor)                         # the same changes read again, now complete
    assert [d.source_id for d in again.upserts] == [new] and again.complete


# ---------------------------------------------------------------------------------------------
# permissions and groups


@pytest.fixture
def shared(drive):
    f = drive.fake
    ids = {"top": f.add_folder("Top")}
    ids["memo"] = f.add_file("memo.pdf", ids["top"], b"%PDF-1.4\n", "application/pdf")
    ids["cups"] = f.add_file("cups.csv", ids["top"], b"a,b\n", "text/csv")
    f.share(ids["memo"], "user", email="bob@example.com")
    f.share(ids["cups"], "user", email="carol@example.com")
    return ids


def _indexed(source: GoogleDriveSource) -> list[SourceDocument]:
    return [SourceDocument(source_id=d.source_id, title=d.title, uri=d.uri,
                           metadata=json.loads(json.dumps(dict(d.metadata)))) for d in source.list_documents().documents]


def _spoil_permissions(target: str, spoil: Callable[[list], Any]):
    """A rewrite of ``files.list``/``files.get`` answers replacing ``target``'s permissions by ``spoil(them)``."""
    def one(item: Any) -> Any:
        if isinstance(item, dict) and item.get("id") == target and "permissions" in item:
            return {**item, "permissions": spoil(item["permissions"])}
        return item

    def rewrite(body: Any, request: Request) -> Any:
        if "files" in body:
            return {**body, "files": [one(i) for i in body["files"]]}
        return one(body)
    return rewrite


@pytest.mark.parametrize("spoil", [
    lambda ps: ps + ["a permission"],
    lambda ps: ps + [None],
    lambda ps: [{**p, "role": ["owner"]} for p in ps],
    lambda ps: [{**p, "emailAddress": 5} if p.get("emailAddress") else p for p in ps],
    lambda ps: [{**p, "deleted": "false"} for p in ps],
    lambda ps: ps + [{"type": "anyone", "role": "reader", "allowFileDiscovery": "true"}],
    lambda ps: ps + [{"type": "user", "role": "reader", "emailAddress": "x@example.com", "expirationTime": 1}],
    lambda ps: ps + [{"type": "user", "role": "reader", "emailAddress": "e\ud800@example.com"}],
    lambda ps: ps + [{"type": "user", "role": "reader", "emailAddress": "a" * 600 + "@example.com"}],
    lambda ps: {"not": "a list"},
], ids=["string", "null", "role-list", "email-int", "deleted-string", "discovery-string", "expiry-int",
        "email-surrogate", "email-too-long", "permissions-object"])
def test_a_malformed_permission_makes_only_that_document_unreadable(drive, shared, spoil):
    source = _source(drive, folder_id=shared["top"])
    documents = _indexed(source)
    rewrite = _spoil_permissions(shared["memo"], spoil)
    drive.fake.mangle.update({"files.list": rewrite, "files.get": rewrite})
    scopes = source.permissions(documents)
    assert scopes[shared["memo"]].principals == frozenset()
    assert "Drive permissions could not be read" in scopes[shared["memo"]].error
    assert scopes[shared["cups"]].principals == {OWNER, "user:carol@example.com"}
    assert scopes[shared["cups"]].error is None


@pytest.mark.parametrize("mangle", [
    lambda body, r: [body],
    lambda body, r: {**body, "permissions": {"id": "p"}},
    lambda body, r: {**body, "permissions": [7]},
    lambda body, r: {**body, "nextPageToken": 3},
    lambda body, r: {**body, "permissions": [{"type": "group", "role": "reader", "emailAddress": ["g@x.com"]}]},
], ids=["list", "permissions-object", "permission-int", "token-int", "group-email-list"])
def test_a_malformed_permissions_list_page_makes_that_document_unreadable(drive, mangle):
    f = drive.fake
    team = f.add_shared_drive()
    f.share(team, "user", email="alice@example.com")
    a = f.add_file("a.csv", team, b"a\n", "text/csv")
    b = f.add_file("b.csv", team, b"b\n", "text/csv")
    source = _source(drive, shared_drive_id=team)
    documents = _indexed(source)
    f.mangle["permissions.list"] = lambda body, r: mangle(body, r) if r.path.endswith(f"/files/{a}/permissions") else body
    scopes = source.permissions(documents)
    assert scopes[a].principals == frozenset() and "could not be read" in scopes[a].error
    assert scopes[b].principals == {"user:alice@example.com"} and scopes[b].error is None


def test_a_malformed_metadata_in_the_index_does_not_crash_permissions(drive, shared):
    source = _source(drive, folder_id=shared["top"])
    documents = [d.replace(metadata={"parents": "not-a-list", "drive_id": None}) for d in _indexed(source)]
    scopes = source.permissions(documents)
    assert scopes[shared["memo"]].principals == {OWNER, "user:bob@example.com"}


@pytest.mark.parametrize("mangle", [
    lambda body, r: [body],
    lambda body, r: {**body, "members": {"email": "x@example.com"}},
    lambda body, r: {**body, "members": body.get("members", []) + ["x@example.com"]},
    lambda body, r: {**body, "members": body.get("members", []) + [{"email": 5, "type": "USER"}]},
    lambda body, r: {**body, "members": body.get("members", []) + [{"email": "z@example.com", "type": ["USER"]}]},
    lambda body, r: {**body, "members": body.get("members", []) + [{"email": "z@example.com", "type": "USER",
                                                                     "status": 1}]},
    lambda body, r: {**body, "nextPageToken": 9},
], ids=["list", "members-object", "member-string", "email-int", "type-list", "status-int", "token-int"])
def test_a_malformed_members_page_puts_that_group_in_errors(drive, mangle):
    f = drive.fake
    f.add_group("eng@example.com", "alice@example.com")
    f.add_group("ops@example.com", "carol@example.com")
    top = f.add_folder("Top")
    source = _source(drive, directory=True, folder_id=top)
    g = f"group:{source.name}:"
    f.mangle["members.list"] = lambda body, r: mangle(body, r) if "/groups/eng@example.com/" in r.path else body
    result = source.group_members([g + "eng@example.com", g + "ops@example.com", 5])  # type: ignore[list-item]
    assert result.members == {g + "ops@example.com": {"user:carol@example.com"}}
    assert set(result.errors) == {g + "eng@example.com", 5}
    assert "members.list failed" in result.errors[g + "eng@example.com"]


def test_a_malformed_change_feed_for_permissions_means_read_everything(drive, shared):
    f = drive.fake
    source = _source(drive, folder_id=shared["top"])
    cursor = source.permission_changes(None).next_cursor
    f.share(shared["memo"], "user", email="dan@example.com")
    f.mangle["changes.list"] = lambda body, r: {**body, "changes": body.get("changes", []) + [{"fileId": 3}]}
    changes = source.permission_changes(cursor)
    assert changes.changed_ids is None and changes.next_cursor.startswith("gdriveperm1:")
    f.mangle["changes.list"] = lambda body, r: [body]
    assert source.permission_changes(cursor).changed_ids is None
