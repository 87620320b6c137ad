"""Target: Microsoft Graph response parsing (``rag_pipeline/sources/sharepoint.py``), no network.

The real delta and children pages of ``../shared/fixtures/msgraph`` (a folder, files, a deleted item
without a name, ``@odata.nextLink``/``@odata.deltaLink``, items without ids or facets) are mutated (types
swapped, keys dropped or added, huge/unicode strings, extreme numbers) and served by a stand-in for
``SharePointSource._get_json`` (which only ever returns a JSON object) to ``list_documents()`` and
``changes(cursor)``; cursors are also fuzzed directly.

Properties: only ``SourceError`` (``ListingIncompleteError``, ``ChangeFeedUnavailable``) escapes; every
document has the declared field types and is storable (``fuzz.common.check_documents``); deleted ids are
strings; ``_DeltaState.decode`` raises only ``ValueError`` (its documented error).
"""

from __future__ import annotations

import base64
import functools
import json
import zlib

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

DELTA1 = load_json("msgraph", "driveitem_delta.example1-first-page-nextLink.json")
DELTA2 = load_json("msgraph", "driveitem_delta.example2-last-page-deltaLink.json")
DELTA3 = load_json("msgraph", "driveitem_delta.example3-token-latest-empty.json")
CHILDREN = load_json("msgraph", "driveitem_list_children.example-nextLink.json")
RICH = {"value": [
    {"id": "R1", "name": "report.pdf", "size": 1234, "cTag": "c1", "eTag": "e1", "webUrl": "https://contoso/r.pdf",
     "lastModifiedDateTime": "2024-05-01T10:00:00Z", "parentReference": {"id": "0123456789abc"},
     "file": {"mimeType": "application/pdf", "hashes": {"sha256Hash": "AB" * 32, "quickXorHash": "x", "sha1Hash": "y"}}},
    {"id": "0123456789abc", "name": "folder2", "folder": {"childCount": 1}, "parentReference": {"id": "ROOT"}},
    {"id": "ROOT", "root": {}, "folder": {}}], "@odata.deltaLink": "https://graph.microsoft.com/v1.0/drives/b/root/delta?token=2"}
KEYS = fixture_keys(DELTA1, DELTA2, DELTA3, CHILDREN, RICH)
GRAPH = "https://graph.microsoft.com/v1.0"


@functools.cache
def source():
    from rag_pipeline.sources.sharepoint import SharePointSource

    return SharePointSource(drive_id="b!fuzz", tenant_id="t", client_id="c", client_secret="fuzz-secret")


class FakeGraph:
    """Answers ``_get_json(url, what)`` with the next generated page (children listings separately)."""

    def __init__(self, delta_pages, children_pages):
        self.delta_pages, self.children_pages = list(delta_pages), list(children_pages)

    def __call__(self, url, what, *_args, **_kwargs):
        pages = self.children_pages if "/children" in url else self.delta_pages
        if pages:
            return pages.pop(0)
        return {"value": []} if "/children" in url else {"value": [], "@odata.deltaLink": f"{GRAPH}/end"}


def _object(value):
    return value if isinstance(value, dict) else {"value": value}


delta_pages = st.lists(st.sampled_from([DELTA1, DELTA2, DELTA3, RICH]).flatmap(lambda p: mutated(p, KEYS)).map(_object),
                       min_size=1, max_size=4)
children_pages = st.lists(st.sampled_from([CHILDREN, RICH]).flatmap(lambda p: mutated(p, KEYS)).map(_object), max_size=3)
states = st.fixed_dictionaries({"v": st.just(1), "l": st.just(f"{GRAPH}/drives/b/root/delta?token=1"),
                                "p": st.sampled_from([None, "0123456789abc", "ROOT"]),
                                "f": st.just(["0123456789abc", "ROOT"])}).flatmap(lambda s: mutated(s, KEYS))


def _encode(state) -> str:
    raw = json.dumps(state, allow_nan=True).encode("utf-8")
    return "graph1:" + base64.urlsafe_b64encode(zlib.compress(raw)).decode("ascii")


@given(delta_pages, children_pages, states, strings(), json_values())
@counted
def test(dpages, cpages, state, raw_cursor, raw_state) -> None:
    from rag_pipeline.sources.sharepoint import _DeltaState

    src = source()
    with guard(lambda: short(dpages)):
        src._get_json = FakeGraph(dpages, cpages)
        try:
            inventory = src.list_documents()
        except SourceError:
            inventory = None
        if inventory is not None:
            check_documents(inventory.documents)
            _DeltaState.decode(inventory.cursor)
    with guard(lambda: short((state, dpages, cpages))):
        src._get_json = FakeGraph(dpages, cpages)
        try:
            changes = src.changes(_encode(state))
        except SourceError:
            changes = None
        if changes is not None:
            check_documents(changes.upserts)
            assert all(isinstance(i, str) for i in changes.deleted_ids), short(changes.deleted_ids)
    with guard(lambda: short((raw_cursor, raw_state))):
        for cursor in (raw_cursor, "graph1:" + raw_cursor, _encode(raw_state)):
            try:
                _DeltaState.decode(cursor)
            except ValueError:
                pass


TARGET = Target("sharepoint", test, "sources/sharepoint.py: mutated Graph delta/children pages -> documents")
