"""SharePointSource hardening (issue 12): streamed downloads and malformed Graph data at the boundary.

Against the fake Graph of ``fakes/graph_server.py`` (HTTPS on 127.0.0.1, the real msal and requests).
``HostileGraph`` below is that fake with two additions of this file's own: a hook that rewrites the JSON
body of a Graph answer before it is sent (to serve fields of the wrong type, which the fake itself never
produces), and download-CDN items whose body is generated piece by piece, counting what the server
handed to the socket and noting when the server stopped sending (to observe a download that stops early).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from werkzeug.wrappers import Request, Response

from rag_pipeline.extraction.types import DocumentTooLargeError
from rag_pipeline.pipeline.spool import MIB, Spool
from rag_pipeline.sources.base import (
    FETCH_PIECE_BYTES,
    DocumentSkipped,
    ListingIncompleteError,
    SourceDocument,
    SourceError,
    fetch_into,
)
from rag_pipeline.sources.sharepoint import SharePointSource, _DeltaState, _PermissionState

from .fakes.graph_server import FakeGraph, _sig
from .test_sharepoint import FAST_RETRY, ca, ca_file  # noqa: F401  (the throwaway CA the client trusts)


@dataclass
class _Streamed:
    total: int
    """Bytes announced (``Content-Length``) and, unless ``stop_after``, sent."""
    stop_after: int | None = None
    """Stop sending after this many bytes (the connection then closes short of ``total``)."""
    sent: int = 0
    """Bytes handed to the server's socket so far."""
    ended: threading.Event = field(default_factory=threading.Event)
    """Set when the server stopped sending (finished, or the client went away)."""


STREAM_PIECE = 256 * 1024


def streamed_piece(index: int) -> bytes:
    """The ``index``-th 256 KiB piece a streamed CDN item serves (each piece one repeated byte)."""
    return bytes([index % 251]) * STREAM_PIECE


@dataclass
class HostileGraph(FakeGraph):
    """``FakeGraph`` plus ``rewrite[kind](body) -> body`` for 200 answers of ``kind`` (``delta``,
    ``children``, ``permissions``, ``members``) and ``streamed`` CDN items (``stream_item``)."""

    rewrite: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    streamed: dict[str, _Streamed] = field(default_factory=dict)

    def handle(self, request: Request) -> Response:
        response = super().handle(request)
        path = request.path
        kind = ("delta" if path.endswith("/root/delta") else "children" if path.endswith("/children")
                else "permissions" if path.endswith("/permissions")
                else "members" if path.endswith("/transitiveMembers") else None)
        rewrite = self.rewrite.get(kind) if kind else None
        if rewrite is None or response.status_code != 200:
            return response
        body = rewrite(json.loads(response.get_data()))
        return Response(json.dumps(body), status=200, content_type="application/json")

    def stream_item(self, name: str, total: int, *, stop_after: int | None = None) -> tuple[str, _Streamed]:
        """A file whose download is generated in ``STREAM_PIECE`` pieces (``streamed_piece``)."""
        item_id = self.add_file(name, None, b"placeholder", "application/octet-stream")
        self.streamed[item_id] = _Streamed(total, stop_after)
        return item_id, self.streamed[item_id]

    def handle_cdn(self, request: Request) -> Response:
        item_id = request.path.rsplit("/", 1)[-1]
        stream = self.streamed.get(item_id)
        if stream is None or request.args.get("sig") != _sig(item_id):
            return super().handle_cdn(request)

        def body():
            try:
                index = 0
                limit = stream.total if stream.stop_after is None else stream.stop_after
                while stream.sent < limit:
                    piece = streamed_piece(index)[: limit - stream.sent]
                    stream.sent += len(piece)
                    index += 1
                    yield piece
            finally:
                stream.ended.set()

        return Response(body(), status=200, direct_passthrough=True,
                        headers={"Content-Length": str(stream.total), "Content-Type": "application/octet-stream"})


@pytest.fixture
def graph(ca):
    fake = HostileGraph()
    with fake.serve(ca):
        yield fake


def make_source(graph: FakeGraph, ca_file: str, **kwargs) -> SharePointSource:
    kwargs.setdefault("retry", FAST_RETRY)
    return SharePointSource(drive_id=graph.drive_id, tenant_id=graph.tenant_id, client_id=graph.client_id,
                            client_secret=graph.client_secret, graph_url=graph.base_url + "/v1.0",
                            authority_url=graph.base_url, verify=ca_file, **kwargs)


class Recorder(io.BytesIO):
    """An ``out`` that keeps what is written and the length of each write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[int] = []

    def write(self, piece) -> int:  # type: ignore[override]
        self.writes.append(len(piece))
        return super().write(piece)


class CappedSpool:
    """The pipeline's real ``Spool`` (size cap in MiB), recording the length of each write it was offered."""

    def __init__(self, spool: Spool) -> None:
        self.spool, self.writes = spool, []

    def write(self, piece) -> int:
        self.writes.append(len(piece))
        return self.spool.write(piece)


def content_requests(graph: FakeGraph) -> list[str]:
    return [p for p, _ in graph.requests if p.endswith("/content")]


def doc_of(source: SharePointSource, item_id: str) -> SourceDocument:
    return {d.source_id: d for d in source.list_documents().documents}[item_id]


# --- streaming ----------------------------------------------------------------------------------


def test_a_large_download_arrives_in_pieces(graph, ca_file):
    blob = os.urandom(5 * MIB + 12345)
    expected = hashlib.sha256(blob).hexdigest()
    item = graph.add_file("big.bin", None, blob, "application/octet-stream")
    source = make_source(graph, ca_file)
    out = Recorder()
    source.fetch_to(doc_of(source, item), out)
    assert len(out.writes) > 1 and max(out.writes) <= FETCH_PIECE_BYTES
    assert sum(out.writes) == len(blob) and hashlib.sha256(out.getvalue()).hexdigest() == expected
    assert graph.cdn_auth_headers == 0                    # the redirect still drops the bearer token
    assert hashlib.sha256(source.fetch(doc_of(source, item))).hexdigest() == expected   # fetch = fetch_to
    with Spool(cap_mb=0) as spool:                        # the pipeline's route
        fetch_into(source, doc_of(source, item), spool)
        assert spool.size == len(blob) and spool.sha256 == expected


def test_the_size_cap_raised_by_out_stops_the_download(graph, ca_file):
    total = 64 * MIB
    item, stream = graph.stream_item("huge.bin", total)
    source = make_source(graph, ca_file)
    document = doc_of(source, item)
    with Spool(cap_mb=2) as spool:
        out = CappedSpool(spool)
        with pytest.raises(DocumentTooLargeError, match="over the 2 MB cap"):
            source.fetch_to(document, out)
        assert spool.size <= 2 * MIB and max(out.writes) <= FETCH_PIECE_BYTES
        assert sum(out.writes[:-1]) == spool.size        # the refused piece was the last one offered
        with open(spool.path, "rb") as fh:
            received = fh.read()
    expected = b"".join(streamed_piece(i) for i in range(len(received) // STREAM_PIECE + 1))[: len(received)]
    assert received == expected
    assert stream.ended.wait(30)                          # the server stopped sending: the client hung up
    assert stream.sent < total // 2                       # far short of the body (socket buffers aside)
    assert content_requests(graph) == [f"/v1.0/drives/{graph.drive_id}/items/{item}/content"]   # no retry


def test_a_transfer_broken_mid_body_is_transient_and_not_retried(graph, ca_file):
    total = 3 * MIB
    item, stream = graph.stream_item("cut.bin", total, stop_after=MIB + STREAM_PIECE)
    source = make_source(graph, ca_file)
    out = Recorder()
    with pytest.raises(SourceError, match="broke off") as failure:
        source.fetch_to(doc_of(source, item), out)
    assert failure.value.transient
    served = b"".join(streamed_piece(i) for i in range(5))           # the 1.25 MiB the server sent
    got = out.getvalue()
    # mid-body: at least one whole piece was written, each byte once, in order (nothing re-fetched or
    # repeated; urllib3 may drop the last partial piece it buffered when the connection ended)
    assert len(got) >= FETCH_PIECE_BYTES and got == served[: len(got)] and sum(out.writes) == len(got)
    assert f"after {len(got)} bytes" in str(failure.value)
    assert len(content_requests(graph)) == 1


def test_errors_before_the_body_keep_their_mapping(graph, ca_file):
    blob = os.urandom(2 * MIB + 1)
    item = graph.add_file("retry.bin", None, blob, "application/octet-stream")
    source = make_source(graph, ca_file)
    document = doc_of(source, item)

    graph.fail_next("content", 503, times=1)              # retried before any byte: written once
    out = Recorder()
    source.fetch_to(document, out)
    assert out.getvalue() == blob and len(content_requests(graph)) == 2

    graph.fail_next("content", 503, times=3)              # FAST_RETRY gives up after 3 tries
    out = Recorder()
    with pytest.raises(SourceError, match="HTTP 503 after retries") as failure:
        source.fetch_to(document, out)
    assert failure.value.transient and out.writes == []

    graph.delete(item)
    with pytest.raises(SourceError, match="item not found"):
        source.fetch_to(document, Recorder())
    with pytest.raises(DocumentSkipped, match="nope"):
        source.fetch_to(document.replace(skip_reason="nope"), Recorder())


# --- cursors ------------------------------------------------------------------------------------


def _packed(prefix: str, value: Any) -> str:
    return prefix + base64.urlsafe_b64encode(zlib.compress(json.dumps(value).encode())).decode()


WRONG_ANY = [None, [], 1, "x", {"v": 1}, {"v": 2, "l": "L"}, {"v": 1, "l": 5}, {"v": 1, "l": "L", "f": [1]},
             {"v": 1, "l": "L", "f": "abc"}, {"v": 1, "l": "L", "f": {"a": 1}}, {"v": 1, "l": "L", "p": ["x"]},
             {"v": 1, "l": "L", "p": 3}]
WRONG_CURSORS = ([(_DeltaState, "graph1:", v) for v in [*WRONG_ANY, {"v": 1, "l": "L", "f": None}]]
                 + [(_PermissionState, "graphperm1:", v) for v in [*WRONG_ANY, {"v": 1, "l": "L", "a": "abc"},
                                                                   {"v": 1, "l": "L", "a": [{}]}]])


@pytest.mark.parametrize(("state", "prefix", "value"), WRONG_CURSORS,
                         ids=[f"{s.__name__}-{json.dumps(v)}" for s, _, v in WRONG_CURSORS])
def test_a_cursor_of_the_wrong_shape_raises_value_error(state, prefix, value):
    with pytest.raises(ValueError):
        state.decode(_packed(prefix, value))


@pytest.mark.parametrize("cursor", ["graph1:", "graph1:!!!", "graph1:" + base64.urlsafe_b64encode(b"xx").decode(),
                                    "graph1:" + base64.urlsafe_b64encode(zlib.compress(b"[" * 100_000)).decode(),
                                    "graph1:" + base64.urlsafe_b64encode(zlib.compress(b"\xff\xfe")).decode(),
                                    "other:abc"])
def test_a_corrupt_cursor_raises_value_error(cursor):
    with pytest.raises(ValueError):
        _DeltaState.decode(cursor)
    with pytest.raises(ValueError):
        _PermissionState.decode(cursor.replace("graph1:", "graphperm1:"))


def test_well_formed_cursors_still_round_trip():
    state = _DeltaState(link="https://graph/x", scope_id="S", folders=["b", "a"])
    assert _DeltaState.decode(state.encode()) == _DeltaState(link="https://graph/x", scope_id="S", folders=["a", "b"])
    perm = _PermissionState(link="L", scope_id=None, ancestors=["r"], folders=[])
    assert _PermissionState.decode(perm.encode()) == perm
    assert _DeltaState.decode(_packed("graph1:", {"v": 1, "l": "L"})) == _DeltaState(link="L")


# --- drive items --------------------------------------------------------------------------------


@pytest.fixture
def tree(graph):
    """root/{Shared/{memo.txt, cups.txt}, other.txt}"""
    ids = {"shared": graph.add_folder("Shared")}
    for key, name, parent in (("memo", "memo.txt", ids["shared"]), ("cups", "cups.txt", ids["shared"]),
                              ("other", "other.txt", None)):
        ids[key] = graph.add_file(name, parent, f"{name} body".encode(), "text/plain")
    return ids


def inject_once(graph: HostileGraph, kind: str, *items: Any) -> None:
    """Append ``items`` to the ``value`` of the next ``kind`` page (of a delta: the last page)."""

    def rewrite(body):
        if kind == "delta" and "@odata.deltaLink" not in body:
            return body
        del graph.rewrite[kind]
        return {**body, "value": body["value"] + list(items)}

    graph.rewrite[kind] = rewrite


MALFORMED_ITEMS = [
    ({"id": "BAD-name", "name": {"x": 1}, "file": {}}, "'BAD-name': name"),
    ({"id": "BAD-ctag", "name": "c.txt", "cTag": ["c"], "file": {}}, "'BAD-ctag': cTag"),
    ({"id": "BAD-weburl", "name": "w.txt", "webUrl": 5, "file": {}}, "'BAD-weburl': webUrl"),
    ({"id": "BAD-inf", "name": "i.txt", "file": {}, "size": float("inf")}, "'BAD-inf': size"),
    ({"id": "BAD-bool", "name": "b.txt", "file": {}, "size": True}, "'BAD-bool': size"),
    ({"id": "BAD-neg", "name": "n.txt", "file": {}, "size": -1}, "'BAD-neg': size"),
    ({"id": "BAD-half", "name": "h.txt", "file": {}, "size": 1.5}, "'BAD-half': size"),
    ({"id": "BAD-file", "name": "f.txt", "file": "x"}, "'BAD-file': file"),
    ({"id": "BAD-folder", "name": "F", "folder": []}, "'BAD-folder': folder"),
    ({"id": "BAD-parent", "name": "p.txt", "file": {}, "parentReference": "p"}, "'BAD-parent': parentReference"),
    ({"id": "BAD-pid", "name": "p.txt", "file": {}, "parentReference": {"id": 7}}, "'BAD-pid': parentReference.id"),
    ({"id": "BAD-hashes", "name": "h.txt", "file": {"hashes": "h"}}, "'BAD-hashes': file.hashes"),
    ({"id": "BAD-sha", "name": "h.txt", "file": {"hashes": {"sha256Hash": 1}}}, "'BAD-sha': file.hashes.sha256Hash"),
    ({"id": "BAD-mime", "name": "m.txt", "file": {"mimeType": {}}}, "'BAD-mime': file.mimeType"),
    ({"id": ["a"], "name": "l.txt", "file": {}}, "(no usable id): id"),
    ({"id": "", "name": "e.txt", "file": {}}, "'': id"),
    ("just a string", "(no usable id): not an object"),
]


@pytest.mark.parametrize(("item", "note"), MALFORMED_ITEMS, ids=[n for _, n in MALFORMED_ITEMS])
def test_a_malformed_item_in_the_inventory_is_skipped_and_the_listing_incomplete(graph, tree, ca_file, caplog,
                                                                                  item, note):
    source = make_source(graph, ca_file)
    if isinstance(item, dict) and "file" in item:
        item = {**item, "parentReference": item.get("parentReference", {"id": graph.root_id})}
    inject_once(graph, "delta", item)
    with caplog.at_level(logging.WARNING, "rag_pipeline.sources.sharepoint"):
        inventory = source.list_documents()
    assert {d.source_id for d in inventory.documents} == {tree["memo"], tree["cups"], tree["other"]}
    assert not inventory.complete and note in inventory.incomplete_reason
    assert note.split(": ")[0] in caplog.text and f"malformed {note.split(': ')[1]}" in caplog.text
    again = source.list_documents()                       # the same Graph without the bad item: complete
    assert again.complete and again.incomplete_reason is None


def test_null_fields_count_as_absent_and_names_are_storable(graph, tree, ca_file):
    source = make_source(graph, ca_file)
    inject_once(graph, "delta",
                {"id": "NULLS", "name": "nulls.txt", "file": {"mimeType": None, "hashes": None}, "webUrl": None,
                 "size": None, "cTag": None, "eTag": "e1", "parentReference": {"id": graph.root_id}},
                {"id": "SURR", "name": "half \ud800 pair.txt", "cTag": "c\udcff", "file": {},
                 "parentReference": {"id": graph.root_id}})
    inventory = source.list_documents()
    assert inventory.complete
    docs = {d.source_id: d for d in inventory.documents}
    nulls, surrogate = docs["NULLS"], docs["SURR"]
    assert nulls.title == "nulls.txt" and nulls.size is None and nulls.mime_type is None
    assert nulls.source_version == "e1" and nulls.uri.endswith("/items/NULLS")
    assert surrogate.title == "half \ufffd pair.txt" and surrogate.source_version == "c\ufffd"
    surrogate.title.encode("utf-8")


@pytest.mark.parametrize("page", [[1, 2], "text", {"value": 5}, {"value": {"id": "x"}}, {"no": "value"},
                                  {"value": [], "@odata.nextLink": 5}, {"value": [], "@odata.deltaLink": ["x"]}],
                         ids=["list", "string", "value-int", "value-object", "no-value", "next-int", "delta-list"])
def test_a_malformed_page_is_an_incomplete_listing(graph, tree, ca_file, page):
    source = make_source(graph, ca_file)
    graph.rewrite["delta"] = lambda body: page
    with pytest.raises(ListingIncompleteError):
        source.list_documents()


def test_a_malformed_item_in_the_change_feed_keeps_the_rest_and_marks_it_incomplete(graph, tree, ca_file, caplog):
    source = make_source(graph, ca_file)
    cursor = source.list_documents().cursor
    graph.update_content(tree["cups"], b"cups v2")
    inject_once(graph, "delta", {"id": "BAD-change", "name": ["x"], "file": {}, "parentReference": {"id": tree["shared"]}})
    changes = source.changes(cursor)
    assert [d.source_id for d in changes.upserts] == [tree["cups"]] and changes.deleted_ids == []
    assert not changes.complete and "'BAD-change': name" in changes.incomplete_reason
    assert "BAD-change" in caplog.text


def test_a_malformed_child_of_a_folder_entering_the_scope_marks_the_changes_incomplete(graph, tree, ca_file):
    source = make_source(graph, ca_file, path="Shared")
    cursor = source.list_documents().cursor
    fresh = graph.add_folder("Fresh", tree["shared"])
    inside = graph.add_file("inside.txt", fresh, b"x", "text/plain")
    inject_once(graph, "children", {"id": "BAD-child", "file": {}, "size": "12"})
    changes = source.changes(cursor)
    assert inside in {d.source_id for d in changes.upserts}
    assert not changes.complete and "'BAD-child': size" in changes.incomplete_reason


def test_a_malformed_item_in_the_permission_feed_reads_every_document(graph, tree, ca_file):
    source = make_source(graph, ca_file)
    cursor = source.permission_changes(None).next_cursor
    ada = graph.add_user("ada@contoso.com")
    graph.grant(tree["memo"], user=ada)
    inject_once(graph, "delta", {"id": "BAD-perm", "folder": "x"})
    changes = source.permission_changes(cursor)
    assert changes.changed_ids is None and changes.next_cursor
    graph.grant(tree["cups"], user=ada)                   # the fresh cursor works
    assert source.permission_changes(changes.next_cursor).changed_ids == [tree["cups"]]


def test_pinned_mapping_of_wrong_typed_items_stays_total():
    # the items of test_fuzz_regressions' pinned case, mapped directly: a document of declared types
    source = SharePointSource(drive_id="b", tenant_id="t", client_id="c", client_secret="s")
    for item in ({"id": "R1", "name": {"x": 1}, "cTag": ["c"], "file": {}}, {"id": "R1", "file": {}, "size": 1e999},
                 {"id": "R1", "file": "x"}, {"id": "R1", "file": {}, "parentReference": "p"}):
        doc = source._to_document(item)
        assert (doc.title, doc.source_version, doc.size, doc.mime_type) == ("R1", None, None, None)
        assert doc.metadata["parent_id"] is None


# --- permissions and groups ---------------------------------------------------------------------


def _docs(*item_ids: str) -> list[SourceDocument]:
    return [SourceDocument(source_id=i, title=i, uri=i) for i in item_ids]


def replace_permissions(graph: HostileGraph, item_id: str, permissions: list[Any]) -> None:
    """Serve ``permissions`` (as they are) for ``item_id`` only."""
    def rewrite(body):
        return {**body, "value": permissions} if item_id in graph.permission_reads[-1:] else body
    graph.rewrite["permissions"] = rewrite


USER = {"user": {"id": "u1", "email": "ada@contoso.com"}}
MALFORMED_PERMISSIONS = [
    ("not-object", "read", "a permission that is not an object"),
    ("roles-string", {"roles": "read", "grantedToV2": USER}, "roles"),
    ("roles-object", {"roles": {"read": True}, "grantedToV2": USER}, "roles"),
    ("roles-ints", {"roles": [1], "grantedToV2": USER}, "roles are not strings"),
    ("expiry-number", {"roles": ["read"], "expirationDateTime": 4102444800, "grantedToV2": USER}, "expirationDateTime"),
    ("granted-string", {"roles": ["read"], "grantedToV2": "ada"}, "grantedToV2"),
    ("user-string", {"roles": ["read"], "grantedToV2": {"user": "ada"}}, "grantedToV2.user"),
    ("email-number", {"roles": ["read"], "grantedToV2": {"user": {"email": 5}}}, "grantedToV2.user.email"),
    ("group-id-object", {"roles": ["read"], "grantedToV2": {"group": {"id": {"x": 1}}}}, "grantedToV2.group.id"),
    ("login-list", {"roles": ["read"], "grantedToV2": {"siteUser": {"loginName": ["c:0-.f|rolemanager|spo-grid-all-users/x"]}}},
     "grantedToV2.siteUser.loginName"),
    ("identities-object", {"roles": ["read"], "grantedToIdentitiesV2": {"user": USER["user"]}}, "grantedToIdentitiesV2"),
    ("identity-string", {"roles": ["read"], "grantedToIdentitiesV2": ["ada"]}, "grantedToIdentitiesV2[]"),
    ("link-string", {"roles": ["read"], "link": "anonymous"}, "link"),
    ("link-scope-list", {"roles": ["read"], "link": {"scope": ["organization"]}}, "link.scope"),
]


@pytest.mark.parametrize(("perm", "field_name"), [(p, f) for _, p, f in MALFORMED_PERMISSIONS],
                         ids=[i for i, _, _ in MALFORMED_PERMISSIONS])
def test_a_malformed_permission_makes_only_its_document_unreadable(graph, tree, ca_file, perm, field_name):
    source = make_source(graph, ca_file, org_domain="contoso.com", link_sharing="everyone")
    ada = graph.add_user("ada@contoso.com")
    graph.grant(tree["memo"], user=ada)
    graph.grant(tree["cups"], user=ada)
    good = {"roles": ["read"], "grantedToV2": {"user": {"id": "u2", "email": "bob@contoso.com"}}}
    replace_permissions(graph, tree["memo"], [good, perm])
    scopes = source.permissions(_docs(tree["memo"], tree["cups"]))
    memo = scopes[tree["memo"]]
    assert memo.principals == frozenset() and memo.error and field_name in memo.error
    assert scopes[tree["cups"]].error is None and scopes[tree["cups"]].principals == {"user:ada@contoso.com"}


def test_a_well_typed_but_unusable_id_is_left_out(graph, tree, ca_file):
    source = make_source(graph, ca_file)
    replace_permissions(graph, tree["memo"], [
        {"roles": ["read"], "grantedToV2": {"group": {"id": "   "}}},
        {"roles": ["read"], "grantedToV2": {"user": {"id": "u2", "email": "bob@contoso.com"}}},
        {"roles": ["owner"], "grantedToV2": {"user": {"id": "u3", "email": " \t "}}},
    ])
    scope = source.permissions(_docs(tree["memo"]))[tree["memo"]]
    assert scope.error is None and scope.principals == {"user:bob@contoso.com", "user:graph:u3"}


@pytest.mark.parametrize("member", ["ada", {"@odata.type": 5, "id": "x"}, {"@odata.type": "#microsoft.graph.user",
                                                                           "id": ["x"]},
                                    {"@odata.type": "#microsoft.graph.user", "id": "x", "mail": {"a": 1}}],
                         ids=["string", "type-number", "id-list", "mail-object"])
def test_a_malformed_member_makes_its_group_grant_nothing(graph, tree, ca_file, member):
    source = make_source(graph, ca_file)
    ada, bob = graph.add_user("ada@contoso.com"), graph.add_user("bob@contoso.com")
    team, crew = graph.add_group("Team", [ada]), graph.add_group("Crew", [bob])

    def rewrite(body):
        return {**body, "value": body["value"] + [member]} if graph.member_reads[-1:] == [team] else body
    graph.rewrite["members"] = rewrite
    team_p, crew_p = f"group:{source.name}:{team}", f"group:{source.name}:{crew}"
    result = source.group_members([team_p, crew_p])
    assert team_p in result.errors and "member" in result.errors[team_p] and team_p not in result.members
    assert result.members[crew_p] == {"user:bob@contoso.com"}
