"""ZoteroSource hardening: streaming downloads (``fetch_to``) and answers of the wrong shape.

Against the fake Zotero Web API of ``fakes/zotero_server.py`` through the real pyzotero/httpx2 clients,
extended here (``HardenedFakeServer``, a subclass; the fake itself is untouched) with what these tests
need: a storage answer served from a generator in slices that counts what it handed to the socket, or
that breaks off early; a redirect to another origin (``localhost`` instead of ``127.0.0.1``) with an S3-like
signature in the query; storage refusals; listing items and pages rewritten into malformed JSON; and
``/keys/current`` / ``/groups/<id>`` bodies of the wrong shape. Expected values are computed here from the
served bytes (``hashlib``) or the fake library's own data, not from the connector.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import socketserver
import threading
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from werkzeug.wrappers import Response

from rag_pipeline.extraction.types import DocumentTooLargeError
from rag_pipeline.sources.base import (
    FETCH_PIECE_BYTES,
    DocumentSkipped,
    ListingIncompleteError,
    SourceDocument,
    SourceError,
    StreamingSource,
)
from rag_pipeline.sources.zotero import ZoteroSource
from rag_pipeline_tests.fakes.zotero_server import FakeZoteroServer, group_from_fixture, standard_library
from rag_pipeline_tests.test_zotero_source import API_KEY, LIBRARY, make_source

MIB = 1024 * 1024
SIGNATURE = "sig-SECRET-0b1f2e"


class HardenedFakeServer(FakeZoteroServer):
    """``FakeZoteroServer`` plus test-controlled misbehaviour (see the module docstring).

    ``storage_host``: host put in the ``/file`` redirect (another origin than the API's). ``signature``:
    added to the redirect as ``?X-Amz-Signature=``. ``storage_status``: the storage answers this status.
    ``slice_bytes``: the storage serves the file from a generator in slices of this size (with the full
    ``Content-Length``), adding each slice to ``sent`` before handing it over (so ``sent`` bounds what went
    out from above) and setting ``finished`` when the generator ends or is closed. ``break_after``: that
    generator stops after this many bytes (the connection closes short of ``Content-Length``).
    ``mangle``: item key -> function of the rendered item giving what the listing sends instead.
    ``wrong_page``: ``(page number, body)`` sent instead of that JSON listing page. ``key_body`` /
    ``group_body``: function of the well-formed ``/keys/current`` / ``/groups/<id>`` JSON giving the text
    to answer instead."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.storage_host: str | None = None
        self.signature: str | None = None
        self.storage_status: int | None = None
        self.slice_bytes: int | None = None
        self.break_after: int | None = None
        self.sent = 0
        self.finished = threading.Event()
        self.mangle: dict[str, Callable[[dict], Any]] = {}
        self.wrong_page: tuple[int, Any] | None = None
        self.key_body: Callable[[dict], str] | None = None
        self.group_body: Callable[[dict], str] | None = None

    def storage_requests(self):
        return [r for r in self.requests if r.path.startswith("/_storage/")]

    def _file(self, request, key):
        response = super()._file(request, key)
        if response.status_code == 302:
            location = response.headers["Location"]
            if self.storage_host:
                location = location.replace("//127.0.0.1:", f"//{self.storage_host}:", 1)
            if self.signature:
                location += f"?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature={self.signature}"
            response.headers["Location"] = location
        return response

    def _storage(self, request):
        if self.storage_status is not None:
            return Response("<Error><Code>AccessDenied</Code></Error>", status=self.storage_status,
                            content_type="application/xml")
        if self.slice_bytes is None:
            return super()._storage(request)
        content, ctype = self.library.files[request.path.strip("/").split("/")[3]]
        step, stop = self.slice_bytes, len(content) if self.break_after is None else self.break_after

        def body():
            try:
                for start in range(0, stop, step):
                    piece = content[start:min(start + step, stop)]
                    self.sent += len(piece)
                    yield piece
            finally:
                self.finished.set()

        return Response(body(), content_type=ctype, headers={"Content-Length": str(len(content))})

    def _listing(self, request, keys, *, children_of=None):
        response = super()._listing(request, keys, children_of=children_of)
        if response.status_code != 200 or request.args.get("format", "json") != "json":
            return response
        body = json.loads(response.get_data())
        limit = min(int(request.args.get("limit", 25)), 100)
        page_number = int(request.args.get("start", 0)) // limit + 1
        if self.wrong_page is not None and self.wrong_page[0] == page_number:
            body = self.wrong_page[1]
        else:
            body = [self.mangle[item["key"]](item) if item["key"] in self.mangle else item for item in body]
        response.set_data(json.dumps(body))
        return response

    def _key(self, request, which):
        response = super()._key(request, which)
        if self.key_body is not None and response.status_code == 200:
            response.set_data(self.key_body(json.loads(response.get_data())))
        return response

    def _group(self, request, which):
        response = super()._group(request, which)
        if self.group_body is not None and response.status_code == 200:
            response.set_data(self.group_body(json.loads(response.get_data())))
        return response


class Recorder:
    """An ``out`` that keeps only the sizes of the writes and a running SHA-256 (never the bytes)."""

    def __init__(self, cap: int | None = None) -> None:
        self.sizes: list[int] = []
        self.sha = hashlib.sha256()
        self.cap = cap
        self.error = DocumentTooLargeError(f"larger than the cap of {cap} bytes")

    @property
    def written(self) -> int:
        return sum(self.sizes)

    def write(self, data: bytes) -> int:
        if self.cap is not None and self.written + len(data) > self.cap:
            raise self.error
        self.sizes.append(len(data))
        self.sha.update(data)
        return len(data)


class MemoryProbe(Recorder):
    """A ``Recorder`` that notes, at each write, the bytes traced by ``tracemalloc`` outside the fake
    server's threads (whose allocations, e.g. werkzeug's 10 MB drain buffer, are not the client's)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[int] = []

    def write(self, data: bytes) -> int:
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, socketserver.__file__, all_frames=True)])
        self.held.append(sum(stat.size for stat in snapshot.statistics("filename")))
        return super().write(data)


@pytest.fixture
def lib_keys(shared_dir):
    return standard_library(shared_dir)


@pytest.fixture
def server(lib_keys):
    lib, _ = lib_keys
    with HardenedFakeServer(lib, api_key=API_KEY) as srv:
        yield srv


def _big(lib, key: str, size: int) -> bytes:
    content = random.Random(size).randbytes(size)
    lib.set_file(key, content)
    return content


def _imported(key: str) -> SourceDocument:
    """The document as the listing gives it (what fetch_to reads: the key and the link mode)."""
    return SourceDocument(source_id=key, title=key, uri="", metadata={"link_mode": "imported_file"})


# ------------------------------------------------------------------------------------------ streaming


def test_a_large_download_arrives_in_pieces_and_is_never_held_whole(server, lib_keys, shared_dir):
    lib, k = lib_keys
    content = _big(lib, k.memo, 6 * MIB + 12345)
    server.slice_bytes = 256 * 1024
    source = make_source(server, shared_dir)
    assert isinstance(source, StreamingSource)
    document = next(d for d in source.list_documents().documents if d.source_id == k.memo)
    out = MemoryProbe()

    tracemalloc.start(30)
    try:
        source.fetch_to(document, out)
    finally:
        tracemalloc.stop()

    assert out.sha.hexdigest() == hashlib.sha256(content).hexdigest()
    assert len(out.sizes) > 1 and max(out.sizes) <= FETCH_PIECE_BYTES
    # at every write, what this side holds (the pieces in flight) is far from the 6 MiB body
    assert len(out.held) == len(out.sizes) and max(out.held) < 3 * MIB  # ~1.1 MiB measured: one piece
    assert [r.status for r in server.api_requests(f"/items/{k.memo}/file")] == [302]
    assert [r.status for r in server.storage_requests()] == [200]
    assert source.fetch(document) == content  # fetch is fetch_to into memory


def test_the_size_cap_propagates_and_stops_the_transfer(server, lib_keys, shared_dir):
    lib, k = lib_keys
    content = _big(lib, k.memo, 64 * MIB)
    server.slice_bytes = 64 * 1024
    source = make_source(server, shared_dir)
    out = Recorder(cap=2 * MIB + 1)

    with pytest.raises(DocumentTooLargeError) as info:
        source.fetch_to(_imported(k.memo), out)

    assert info.value is out.error  # unchanged, not wrapped into a SourceError
    assert out.written == 2 * MIB  # the two whole pieces before the one that passed the cap
    assert server.finished.wait(10)  # the server's writes failed: the client closed the connection
    assert server.sent < len(content) // 2
    assert len(server.storage_requests()) == 1  # not retried


def test_a_transfer_broken_after_bytes_were_written_is_not_retried(server, lib_keys, shared_dir):
    lib, k = lib_keys
    content = _big(lib, k.memo, 4 * MIB)
    server.slice_bytes, server.break_after = 256 * 1024, 3 * MIB // 2
    source = make_source(server, shared_dir)
    out = Recorder()

    with pytest.raises(SourceError) as info:
        source.fetch_to(_imported(k.memo), out)

    assert info.value.transient
    # the whole pieces before the break arrived (the half piece after them was still being gathered)
    assert out.sizes == [MIB]
    assert out.sha.hexdigest() == hashlib.sha256(content[:MIB]).hexdigest()
    assert len(server.storage_requests()) == 1 and len(server.api_requests(f"/items/{k.memo}/file")) == 1


def test_a_refusal_before_any_byte_is_retried(server, lib_keys, shared_dir):
    lib, k = lib_keys
    content = _big(lib, k.memo, 3 * MIB)
    server.faults.rate_limit(2, retry_after="0")
    out = Recorder()

    make_source(server, shared_dir).fetch_to(_imported(k.memo), out)

    assert out.sha.hexdigest() == hashlib.sha256(content).hexdigest()
    assert [r.status for r in server.api_requests(f"/items/{k.memo}/file")] == [429, 429, 302]


def test_the_key_goes_to_the_api_host_only_and_no_signature_reaches_a_message(server, lib_keys, shared_dir,
                                                                              caplog):
    lib, k = lib_keys
    content = _big(lib, k.memo, 2 * MIB + 7)
    server.storage_host, server.signature = "localhost", SIGNATURE
    source = make_source(server, shared_dir, max_attempts=2)
    caplog.set_level(logging.DEBUG, logger="rag_pipeline")
    out = Recorder()

    source.fetch_to(_imported(k.memo), out)
    assert out.sha.hexdigest() == hashlib.sha256(content).hexdigest()
    assert [r.authenticated for r in server.api_requests(f"/items/{k.memo}/file")] == [True]
    assert [(r.status, r.authenticated) for r in server.storage_requests()] == [(200, False)]

    errors = []
    for status, transient in ((403, False), (500, True)):
        server.storage_status = status
        with pytest.raises(SourceError) as info:
            source.fetch_to(_imported(k.memo), Recorder())
        assert info.value.transient is transient and str(status) in str(info.value)
        errors.append(info.value)
    server.storage_status = 404  # S3's NoSuchKey: the file is not there
    with pytest.raises(DocumentSkipped, match="no file"):
        source.fetch_to(_imported(k.memo), Recorder())
    assert all(not r.authenticated for r in server.storage_requests())
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("rag_pipeline")]  # not the fake's access log
    assert any("HTTP 500" in text for text in ours)  # the retry was logged
    for text in [str(e) for e in errors] + ours:
        assert SIGNATURE not in text and API_KEY not in text


def test_redirects_that_are_not_followed(server, lib_keys, shared_dir, monkeypatch):
    lib, k = lib_keys
    source = make_source(server, shared_dir)
    original = HardenedFakeServer._file

    def redirect_to(location: str | None):
        def _file(self, request, key):
            response = original(self, request, key)
            if location is None:
                del response.headers["Location"]
            else:
                response.headers["Location"] = location
            return response
        monkeypatch.setattr(HardenedFakeServer, "_file", _file)

    redirect_to("ftp://127.0.0.1/file.pdf")
    with pytest.raises(SourceError, match="redirected to a ftp URL") as info:
        source.fetch_to(_imported(k.memo), Recorder())
    assert not info.value.transient
    redirect_to(f"{server.url}/users/475425/items/{k.memo}/file")  # a loop to itself
    with pytest.raises(SourceError, match="more than 5 redirects"):
        source.fetch_to(_imported(k.memo), Recorder())
    assert len(server.api_requests(f"/items/{k.memo}/file")) == 1 + 6
    redirect_to(None)
    with pytest.raises(SourceError):  # a 302 without a Location
        source.fetch_to(_imported(k.memo), Recorder())
    assert not server.storage_requests()


def test_a_linked_file_is_read_in_pieces_and_the_cap_propagates(tmp_path):
    content = random.Random(3).randbytes(3 * MIB + 5)
    (tmp_path / "big.bin").write_bytes(content)
    source = ZoteroSource(LIBRARY, api_url="http://127.0.0.1:9/api", linked_files_root=tmp_path)
    document = SourceDocument(source_id="LINK0001", title="big", uri="",
                              metadata={"link_mode": "linked_file", "path": "attachments:big.bin"})
    out = Recorder()
    source.fetch_to(document, out)
    assert out.sha.hexdigest() == hashlib.sha256(content).hexdigest()
    assert out.sizes == [FETCH_PIECE_BYTES] * 3 + [5]

    capped = Recorder(cap=MIB + 1)
    with pytest.raises(DocumentTooLargeError) as info:
        source.fetch_to(document, capped)
    assert info.value is capped.error and capped.written == MIB
    (tmp_path / "big.bin").unlink()
    with pytest.raises(DocumentSkipped, match="linked file not reachable"):
        source.fetch_to(document, Recorder())


# ------------------------------------------------------------------------------------------ items of the wrong shape


def _data_with(**fields):
    return lambda item: {**item, "data": {**item["data"], **fields}}


# (where, mangle, check(doc, lib, k)): the attachment (or its parent) is kept, the bad field ignored
FIELD_CASES = {
    "linkMode-list": ("memo", _data_with(linkMode=["imported_file"]),
                      lambda d, lib, k: d.skip_reason.startswith("unknown Zotero attachment link mode")
                      and d.metadata["link_mode"] is None),
    "version-inf": ("memo", lambda it: {**it, "version": math.inf},
                    lambda d, lib, k: d.source_version == "0" and d.metadata["attachment_version"] == 0),
    "version-nan": ("memo", lambda it: {**it, "version": math.nan}, lambda d, lib, k: d.source_version == "0"),
    "version-bool": ("memo", lambda it: {**it, "version": True}, lambda d, lib, k: d.source_version == "0"),
    "version-word": ("memo", lambda it: {**it, "version": "seven"}, lambda d, lib, k: d.source_version == "0"),
    "title-number": ("memo", _data_with(title=5, filename=["x"]),
                     lambda d, lib, k: d.metadata["attachment_title"] is None and d.metadata["filename"] is None
                     and d.title == lib.items["PQKBRC33"]["data"]["title"]),
    "contentType-md5-objects": ("memo", _data_with(contentType={"a": 1}, md5=7, url=[1]),
                                lambda d, lib, k: d.mime_type is None and d.metadata["md5"] is None
                                and d.metadata["url"] == lib.items["PQKBRC33"]["data"]["url"]),  # the parent's
    "tags-number": ("memo", _data_with(tags=5), lambda d, lib, k: d.metadata["tags"] == []),
    "tags-string": ("memo", _data_with(tags="abc"), lambda d, lib, k: d.metadata["tags"] == []),
    "tags-members": ("memo", _data_with(tags=[{"tag": 5}, 7, {"tag": "kept"}, "also kept"]),
                     lambda d, lib, k: d.metadata["tags"] == ["kept", "also kept"]),
    "parent-creators-number": ("PQKBRC33", _data_with(creators=5), lambda d, lib, k: d.metadata["creators"] == []),
    "parent-creators-members": ("PQKBRC33", _data_with(creators=["Buck", {"name": ["x"]}, {"lastName": "Buck",
                                                                                          "firstName": 1}]),
                                lambda d, lib, k: d.metadata["creators"] == [{"type": "", "name": "Buck"}]),
    "parent-collections-number": ("PQKBRC33", _data_with(collections=5),
                                  lambda d, lib, k: d.metadata["collections"] == []),
    "parent-title-list": ("PQKBRC33", _data_with(title=["t"]),
                          lambda d, lib, k: d.metadata["title"] is None and d.title == "Full Text PDF"),
    "parent-title-lone-surrogate": ("PQKBRC33", _data_with(title="Caf\ud800 \x00notes"),
                                    lambda d, lib, k: d.title == "Caf\ufffd notes"),
    "contentType-not-a-media-type": ("memo", _data_with(contentType="application/pdf\ud800"),
                                     lambda d, lib, k: d.mime_type is None and d.metadata["content_type"] is None),
    "enclosure-length-bool": ("memo", lambda it: {**it, "links": {**it["links"], "enclosure": {
                              **it["links"]["enclosure"], "length": True}}}, lambda d, lib, k: d.size is None),
}


QUIET_CASES = {"tags-members", "parent-creators-members", "enclosure-length-bool", "parent-title-lone-surrogate",
               "contentType-not-a-media-type"}
"""Members of the wrong type inside a list, a link's length, and strings cleaned or refused for what they
hold (not their type) go without a log line."""


@pytest.mark.parametrize("case", list(FIELD_CASES))
def test_fields_of_the_wrong_type_are_ignored_and_the_item_kept(server, lib_keys, shared_dir, caplog, case):
    lib, k = lib_keys
    where, mangle, check = FIELD_CASES[case]
    server.mangle[k.memo if where == "memo" else where] = mangle
    caplog.set_level(logging.WARNING, logger="rag_pipeline.sources.zotero")

    inventory = make_source(server, shared_dir).list_documents()

    assert inventory.complete, inventory.incomplete_reason
    docs = {d.source_id: d for d in inventory.documents}
    assert len(docs) == 8  # every attachment of the standard library, as without the bad field
    assert check(docs[k.memo], lib, k)
    assert all(json.loads(json.dumps(d.metadata)) == d.metadata for d in docs.values())
    for d in docs.values():  # storable as they are: PostgreSQL TEXT takes no lone surrogate and no NUL
        for text in (d.title, d.mime_type or ""):
            assert "\x00" not in text.encode("utf-8").decode("utf-8")
    if case not in QUIET_CASES:  # a field of the wrong type is logged, naming the attachment
        assert any(k.memo in r.getMessage() and "wrong type" in r.getMessage() for r in caplog.records)


STRUCTURE_CASES = {
    "data-string": lambda it: {**it, "data": "oops"},
    "item-list": lambda it: [it],
    "key-number": lambda it: {**it, "key": 12345678, "data": {**it["data"], "key": 12345678}},
    "key-with-slash": lambda it: {**it, "key": "AB/../CD", "data": {**it["data"], "key": "AB/../CD"}},
    "itemType-list": _data_with(itemType=["attachment"]),
    "parentItem-list": _data_with(parentItem=["PQKBRC33"]),
    "deleted-word": _data_with(deleted="yes"),
}


@pytest.mark.parametrize("case", list(STRUCTURE_CASES))
def test_a_malformed_item_is_skipped_with_a_log_line_and_the_listing_is_incomplete(server, lib_keys, shared_dir,
                                                                                  caplog, case):
    lib, k = lib_keys
    server.mangle[k.memo] = STRUCTURE_CASES[case]
    caplog.set_level(logging.WARNING, logger="rag_pipeline.sources.zotero")

    inventory = make_source(server, shared_dir).list_documents()

    assert not inventory.complete and "malformed" in inventory.incomplete_reason
    assert inventory.cursor is None  # an incomplete listing gives no watermark either
    ids = {d.source_id for d in inventory.documents}
    assert k.memo not in ids and {k.paper, k.strange, k.linked} <= ids
    skipped = [r.getMessage() for r in caplog.records if "skipped a malformed item" in r.getMessage()]
    assert len(skipped) == 1
    if case in ("data-string", "itemType-list", "parentItem-list", "deleted-word"):
        assert k.memo in skipped[0]


def test_a_page_of_the_wrong_shape(server, lib_keys, shared_dir):
    server.wrong_page = (1, {"not": "a list"})
    with pytest.raises(ListingIncompleteError, match="page 1 .* not a JSON list"):
        make_source(server, shared_dir).list_documents()

    server.wrong_page = (6, "a string")  # the last page (5 items a page)
    inventory = make_source(server, shared_dir).list_documents()
    assert not inventory.complete and "page 6" in inventory.incomplete_reason
    items = lib_keys[0].items
    before = [key for key in list(items)[:25] if items[key]["data"]["itemType"] == "attachment"]
    assert len(before) == 5 and {d.source_id for d in inventory.documents} == set(before)


def test_malformed_changed_items_make_the_change_set_incomplete_and_delete_nothing(server, lib_keys, shared_dir):
    lib, k = lib_keys
    source = make_source(server, shared_dir)
    cursor = source.list_documents().cursor
    lib.update(k.paper, title="renamed snapshot")
    lib.update(k.memo, title="renamed memo")  # its parent turns out malformed
    lib.update(k.strange, title="renamed strange")  # itself malformed
    server.mangle = {"PQKBRC33": _data_with(parentItem=7), k.strange: lambda it: {**it, "data": None}}

    changes = source.changes(cursor)

    assert not changes.complete and "2 malformed Zotero item(s) skipped" in changes.incomplete_reason
    assert [d.source_id for d in changes.upserts] == [k.paper]
    assert changes.upserts[0].metadata["attachment_title"] == "renamed snapshot"
    assert k.memo not in changes.deleted_ids and k.strange not in changes.deleted_ids


def test_malformed_tombstones_and_versions(server, lib_keys, shared_dir, monkeypatch):
    lib, k = lib_keys
    source = make_source(server, shared_dir)
    cursor = source.list_documents().cursor
    lib.erase("Z8N84QAJ")  # the parent of k.doomed: both keys enter the delete log
    original = HardenedFakeServer._deleted

    def _deleted(self, request):
        response = original(self, request)
        body = json.loads(response.get_data())
        body["items"] += [5, None, {"key": "X"}]
        response.set_data(json.dumps(body))
        return response

    monkeypatch.setattr(HardenedFakeServer, "_deleted", _deleted)
    assert source.changes(cursor).deleted_ids == sorted(["Z8N84QAJ", k.doomed])

    original_listing = HardenedFakeServer._listing

    def _listing(self, request, keys, *, children_of=None):
        response = original_listing(self, request, keys, children_of=children_of)
        if request.args.get("format") == "versions":
            response.set_data('{"ABCD2345": 1e999}')
        return response

    monkeypatch.setattr(HardenedFakeServer, "_listing", _listing)
    lib.update(k.paper, title="again")
    with pytest.raises(SourceError, match="malformed Zotero changed-versions answer"):
        source.changes(cursor)


# ------------------------------------------------------------------------------------------ permissions


def _source_for(server, library: str) -> ZoteroSource:
    return ZoteroSource(library, api_key=API_KEY, api_url=server.url, max_attempts=2, max_wait_s=0.01,
                        timeout_s=5.0)


def _docs(library: str) -> list[SourceDocument]:
    return [SourceDocument(source_id=i, title=i, uri="", metadata={"library": library}) for i in ("AAAA1111", "BB22")]


def _with(path: tuple[str, ...], value: Any) -> Callable[[dict], str]:
    """A body mangler: ``value`` put at ``path`` of the JSON (created as needed)."""
    def mangle(body: dict) -> str:
        node = body
        for name in path[:-1]:
            if not isinstance(node.get(name), dict):
                node[name] = {}
            node = node[name]
        node[path[-1]] = value
        return json.dumps(body)
    return mangle


KEY_CASES = {
    "userID-string": _with(("userID",), "475425"),
    "userID-bool": _with(("userID",), True),
    "userID-list": _with(("userID",), [475425]),
    "access-list": _with(("access",), [{"user": {"library": True}}]),
    "user-library-truthy-string": _with(("access", "user", "library"), "true"),
    "user-library-one": _with(("access", "user", "library"), 1),
    "body-list": lambda body: json.dumps([body]),
    "body-deeply-nested": lambda body: "[" * 100_000 + "]" * 100_000,
    "body-not-json": lambda body: "{'userID': 475425",
}


@pytest.mark.parametrize("case", list(KEY_CASES))
def test_a_malformed_key_answer_makes_the_user_library_unreadable(shared_dir, case):
    lib, _ = standard_library(shared_dir)
    with HardenedFakeServer(lib, api_key=API_KEY) as server:
        source = _source_for(server, LIBRARY)
        assert {s.principals for s in source.permissions(_docs(LIBRARY)).values()} == {
            frozenset({"user:zotero:475425"})}  # well-formed: the owner
        server.key_body = KEY_CASES[case]
        scopes = source.permissions(_docs(LIBRARY))
    assert set(scopes) == {"AAAA1111", "BB22"}
    for scope in scopes.values():
        assert scope.principals == frozenset() and scope.error and API_KEY not in scope.error


def _group_server(shared_dir):
    group = group_from_fixture(shared_dir / "fixtures" / "zotero")
    lib, _ = standard_library(shared_dir, library_type="group", library_id=group.id)
    return HardenedFakeServer(lib, api_key=API_KEY, groups=[group]), group, f"groups/{group.id}"


GROUP_KEY_CASES = {
    "groups-list": _with(("access", "groups"), [{"library": True}]),
    "group-entry-truthy": _with(("access", "groups"), {"all": {"library": "yes"}}),
    "group-entry-list": _with(("access", "groups"), {"all": [True]}),
}
GROUP_SCOPE_CASES = {  # /groups/<id> bodies that leave the library unreadable
    "owner-string": lambda b: json.dumps({**b, "data": {**b["data"], "owner": "436"}}),
    "owner-bool": lambda b: json.dumps({**b, "data": {**b["data"], "owner": True}}),
    "type-list": lambda b: json.dumps({**b, "data": {**b["data"], "type": ["PublicOpen"]}}),
    "data-list": lambda b: json.dumps({**b, "data": [b["data"]]}),
    "other-id": lambda b: json.dumps({**b, "data": {**b["data"], "id": [b["data"]["id"]]}}),
}
GROUP_MEMBER_CASES = {  # /groups/<id> bodies whose members cannot be read (the scope itself is fine)
    "admins-dict": lambda b: json.dumps({**b, "data": {**b["data"], "admins": {"1": 1177919}}}),
    "members-string": lambda b: json.dumps({**b, "data": {**b["data"], "members": "1177919"}}),
    "members-bools": lambda b: json.dumps({**b, "data": {**b["data"], "members": [True, 1177919]}}),
    "members-floats": lambda b: json.dumps({**b, "data": {**b["data"], "members": [1177919.0]}}),
}


@pytest.mark.parametrize("case", list(GROUP_KEY_CASES) + list(GROUP_SCOPE_CASES))
def test_a_malformed_group_or_key_answer_makes_the_group_library_unreadable(shared_dir, case):
    server, group, library = _group_server(shared_dir)
    with server:
        source = _source_for(server, library)
        principal = source.group_principal
        assert {s.principals for s in source.permissions(_docs(library)).values()} == {frozenset({principal})}
        if case in GROUP_KEY_CASES:
            server.key_body = GROUP_KEY_CASES[case]
        else:
            server.group_body = GROUP_SCOPE_CASES[case]
        scopes = source.permissions(_docs(library))
        answer = source.group_members([principal])
    assert all(s.principals == frozenset() and s.error for s in scopes.values())
    if case in GROUP_SCOPE_CASES:
        assert not answer.members and principal in answer.errors


@pytest.mark.parametrize("case", list(GROUP_MEMBER_CASES))
def test_malformed_group_members_grant_nothing(shared_dir, fixture_group_users, case):
    server, group, library = _group_server(shared_dir)
    with server:
        source = _source_for(server, library)
        principal = source.group_principal
        assert source.group_members([principal]).members[principal] == fixture_group_users
        server.group_body = GROUP_MEMBER_CASES[case]
        answer = source.group_members([principal])
    assert answer.members == {}
    assert "user ids" in answer.errors[principal] or "not lists" in answer.errors[principal]


@pytest.fixture
def fixture_group_users(shared_dir) -> frozenset[str]:
    """The fixture group's owner, admins and members as principals, read from the fixture file."""
    data = json.loads((shared_dir / "fixtures" / "zotero" / "groups_doc.json").read_text())[0]["data"]
    ids = [data["owner"], *data.get("admins", []), *data.get("members", [])]
    return frozenset(f"user:zotero:{int(i)}" for i in ids)


# ------------------------------------------------------------------------------------------ the pinned fuzz finding


@pytest.mark.parametrize("bad", [{"linkMode": ["imported_file"]}, {"tags": 5}, {"creators": 5}, {"collections": 5},
                                 {"version": float("inf")}, {"version": float("nan")}, {"version": True},
                                 {"parentItem": None, "title": 5, "md5": [1], "path": 3, "contentType": {}}])
def test_the_fuzz_finding_items_with_fields_of_the_wrong_type(bad):
    base = {"key": "A1", "itemType": "attachment", "linkMode": "imported_file", "title": "t"}
    item = {"key": "A1", "version": bad.get("version", 1), "data": {**base, **{k: v for k, v in bad.items()
                                                                              if k != "version"}}}
    documents, gone = ZoteroSource("users/1", api_url="http://127.0.0.1:9/api")._documents({"A1": item}, {"A1": item})
    assert [d.source_id for d in documents] == ["A1"] and gone == []
    assert json.loads(json.dumps(documents[0].metadata, allow_nan=False)) == documents[0].metadata
