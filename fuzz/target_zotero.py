"""Target: Zotero response parsing (``rag_pipeline/sources/zotero.py``), no network.

Real bodies from ``../shared/fixtures/zotero`` (the items page, an attachment) are mutated (types
swapped, keys dropped or added, huge/unicode/nasty strings, extreme numbers) and fed as listing pages
(with random ``Total-Results``/``Last-Modified-Version`` headers) to ``list_documents`` through a stand-in
for the pyzotero client, as ``/deleted`` answers to ``_deleted_keys``, and as cursors to
``_cursor_version``. Linked-file attachments point into a scratch tree holding a file outside the root
and symlinks out of it and in a loop.

Properties: only ``SourceError`` (and its subclasses) escape; every document has the declared field
types and is storable (``fuzz.common.check_documents``), ids are unique; a linked file is never read from
outside the configured roots (``fetch`` never returns the outside file's bytes; ``resolve`` only returns
regular files under a root); ``_cursor_version`` raises only ``ChangeFeedUnavailable``.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from pathlib import Path

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
from rag_pipeline.sources.base import (
    ChangeFeedUnavailable,
    DocumentSkipped,
    SourceError,
)

SECRET = b"SECRET outside the linked-files root"


@functools.cache
def scratch() -> Path:
    base = Path(tempfile.mkdtemp(prefix="fuzz-zotero-"))
    root = base / "root"
    (root / "sub").mkdir(parents=True)
    (root / "a.pdf").write_bytes(b"INSIDE a")
    (root / "sub" / "b.pdf").write_bytes(b"INSIDE b")
    (base / "outside").mkdir()
    (base / "outside" / "secret.pdf").write_bytes(SECRET)
    os.symlink(base / "outside" / "secret.pdf", root / "link-out.pdf")
    os.symlink(base / "outside", root / "dir-out")
    os.symlink(root / "loop", root / "loop")
    os.symlink(root / "a.pdf", root / "link-in.pdf")
    return base


def recorded_paths() -> st.SearchStrategy[str]:
    base = scratch()
    return st.one_of(strings(), st.sampled_from([
        "attachments:a.pdf", "attachments:sub/b.pdf", "attachments:../outside/secret.pdf", "attachments:link-out.pdf",
        "attachments:dir-out/secret.pdf", "attachments:loop", "attachments:link-in.pdf", "attachments:/etc/passwd",
        "attachments:sub\\..\\..\\outside\\secret.pdf", "C:\\Papers\\a.pdf", "c:/papers/SUB/b.pdf",
        "C:\\Papers\\..\\..\\outside\\secret.pdf", "\\\\nas\\share\\b.pdf", "\\\\NAS\\Share\\..\\secret.pdf",
        str(base / "root" / "a.pdf"), str(base / "outside" / "secret.pdf"), str(base / "root" / "link-out.pdf"),
        str(base / "root" / ".." / "outside" / "secret.pdf"), "/etc/passwd", "attachments:", "attachments:\x00",
        "attachments:" + "a/" * 3000 + "x.pdf"]))


@functools.cache
def source():
    from rag_pipeline.sources.zotero import ZoteroSource

    base = scratch()
    return ZoteroSource("users/436", api_key="fuzz-key", api_url="http://127.0.0.1:9/api-not-used",
                        linked_files_root=base / "root",
                        path_prefix_map={"C:\\Papers": str(base / "root"), "\\\\nas\\share": str(base / "root" / "sub")})


class _Request:
    def __init__(self, headers):
        self.headers = headers
        self.content = b""


class FakeZot:
    """The part of ``pyzotero.Zotero`` that ``ZoteroSource._pages`` and ``_deleted_keys`` use."""

    def __init__(self, pages, headers, deleted=None):
        self._pages, self._headers, self._deleted = list(pages), list(headers), deleted
        self.links = None
        self.request = None

    def _next(self):
        page = self._pages.pop(0) if self._pages else []
        self.request = _Request(self._headers.pop(0) if self._headers else {})
        self.links = {"next": "https://next"} if self._pages else {}
        return page

    def items(self, **_params):
        return self._next()

    def follow(self):
        return self._next()

    def deleted(self, since):
        return self._deleted

    def file(self, key):
        raise AssertionError("fetch must not download in this target")


ITEMS = load_json("zotero", "items_doc.json")
ATTACHMENT = load_json("zotero", "attachments_doc.json")
KEYS = fixture_keys(ITEMS, ATTACHMENT)
MODES = ["imported_file", "imported_url", "linked_file", "linked_url", "embedded_image", "idk", None, 3, ["linked_file"]]


@st.composite
def attachments(draw):
    item = json.loads(json.dumps(ATTACHMENT))
    item["key"] = item["data"]["key"] = draw(st.sampled_from(["ATT1", "ATT2", "ATT3", "TM8QRS36"]))
    item["data"]["linkMode"] = draw(st.sampled_from(MODES))
    item["data"]["path"] = draw(recorded_paths())
    item["data"]["parentItem"] = draw(st.sampled_from([i["key"] for i in ITEMS] + ["", "MISSING", None]))
    return draw(mutated(item, KEYS))


header_values = st.one_of(st.integers(0, 40).map(str), st.sampled_from(["", "x", "-1", "1e3", "99999999999999999999", " 7"]))
headers = st.dictionaries(st.sampled_from(["Total-Results", "Last-Modified-Version"]), header_values)
pages = st.lists(st.one_of(st.lists(st.one_of(st.sampled_from(ITEMS).flatmap(lambda i: mutated(i, KEYS)), attachments()),
                                    max_size=12),
                           json_values()), min_size=1, max_size=4)


@given(pages, st.lists(headers, max_size=4), json_values(), st.one_of(strings(), json_values().map(json.dumps)),
       recorded_paths())
@counted
def test(listing, page_headers, deleted, cursor, recorded) -> None:
    src = source()
    with guard(lambda: short(listing)):
        src._zot = FakeZot(listing, page_headers, deleted)
        try:
            inventory = src.list_documents()
        except SourceError:
            inventory = None
        if inventory is not None:
            check_documents(inventory.documents)
            ids = [d.source_id for d in inventory.documents]
            assert len(ids) == len(set(ids)), "duplicate document ids"
            for doc in inventory.documents:
                if doc.metadata.get("link_mode") == "linked_file" and not doc.skip_reason:
                    try:
                        body = src.fetch(doc)
                    except (DocumentSkipped, SourceError):
                        continue
                    assert body != SECRET, f"read a file outside the root via {short(doc.metadata.get('path'))}"
        try:
            src._deleted_keys(5)
        except SourceError:
            pass
    with guard(lambda: short(cursor)):
        try:
            src._cursor_version(cursor)
        except ChangeFeedUnavailable:
            pass
    with guard(lambda: short(recorded)):
        path, reason = src.resolver.resolve(recorded)
        if path is None:
            assert isinstance(reason, str) and reason.startswith("linked file not reachable")
        else:
            real = Path(os.path.realpath(path))
            roots = [Path(os.path.realpath(scratch() / "root"))]
            assert any(real.is_relative_to(r) for r in roots) and real.is_file(), f"{recorded!r} -> {path}"
            assert real.read_bytes() != SECRET


TARGET = Target("zotero", test, "sources/zotero.py: mutated item pages -> documents, containment, cursors")
