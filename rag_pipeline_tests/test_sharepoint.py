"""SharePointSource against a fake Graph + Entra ID authority over HTTPS on 127.0.0.1 (no database).

The real msal (client credentials, ``instance_discovery=False``) and requests talk to
``fakes/graph_server.py`` with certificates from a throwaway trustme CA. Delta pages are synthetic
(two items a page) except in the test that replays the documented Graph examples from
``../shared/fixtures/msgraph``. Content is real files from ``../shared/corpus``.
"""

from __future__ import annotations

import hashlib
import logging
import time

import pytest
import requests
import trustme

from rag_pipeline.sources.base import ChangeFeedUnavailable, ListingIncompleteError, SourceError
from rag_pipeline.sources.sharepoint import SharePointSource, RetryPolicy, _DeltaState

from .fakes.graph_server import FakeGraph
from .fakes.gdrive_server import corpus_bytes

FAST_RETRY = RetryPolicy(attempts=3, base_wait_s=0.01, max_wait_s=2.0)
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def ca_file(ca, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture
def graph(shared_dir, ca):
    fake = FakeGraph()
    with fake.serve(ca):
        yield fake


@pytest.fixture
def tree(graph):
    """root/{Shared/{memo.pdf, cups.csv, Sub/{tables.docx, deck.pptx}}, other.md}"""
    g = graph
    ids = {"shared": g.add_folder("Shared")}
    ids["sub"] = g.add_folder("Sub", ids["shared"])
    ids["memo"] = g.add_file("memo.pdf", ids["shared"], corpus_bytes("fake-memo.pdf"), "application/pdf")
    ids["cups"] = g.add_file("cups.csv", ids["shared"], corpus_bytes("stanley-cups.csv"), "text/csv")
    ids["tables"] = g.add_file("tables.docx", ids["sub"], corpus_bytes("docx-tables.docx"), DOCX)
    ids["deck"] = g.add_file("deck.pptx", ids["sub"], corpus_bytes("sample-presentation.pptx"), PPTX)
    ids["other"] = g.add_file("other.md", None, corpus_bytes("simple-table.md"), "text/markdown")
    return ids


def make_source(graph: FakeGraph, ca_file: str, **kwargs) -> SharePointSource:
    kwargs.setdefault("retry", FAST_RETRY)
    return SharePointSource(drive_id=graph.drive_id, tenant_id=graph.tenant_id, client_id=graph.client_id,
                            client_secret=graph.client_secret, graph_url=graph.base_url + "/v1.0",
                            authority_url=graph.base_url, verify=ca_file, **kwargs)


def _delta_requests(graph):
    return [q for p, q in graph.requests if p.endswith("/root/delta")]


def test_full_enumeration_by_delta(graph, tree, ca_file):
    inventory = make_source(graph, ca_file).list_documents()
    docs = {d.source_id: d for d in inventory.documents}
    assert set(docs) == {tree[k] for k in ("memo", "cups", "tables", "deck", "other")}
    assert inventory.complete and inventory.cursor
    first = _delta_requests(graph)[0]
    assert "deleted" in first["$select"].split(",") and "token" not in first
    assert len(_delta_requests(graph)) >= 4          # 8 items, two a page
    memo = docs[tree["memo"]]
    assert memo.title == "memo.pdf" and memo.mime_type == "application/pdf"
    assert memo.content_sha256 == hashlib.sha256(corpus_bytes("fake-memo.pdf")).hexdigest()
    assert memo.source_version == graph.items[tree["memo"]]["cTag"] and memo.size == len(corpus_bytes("fake-memo.pdf"))
    assert memo.modified_at is not None and memo.modified_at.tzinfo is not None


@pytest.mark.parametrize(("path", "expected"), [
    ("Shared", {"memo", "cups", "tables", "deck"}),   # a folder, recursively
    ("/Shared/Sub/", {"tables", "deck"}),             # slashes trimmed
])
def test_a_folder_path_limits_the_scope(graph, tree, ca_file, path, expected):
    inventory = make_source(graph, ca_file, path=path).list_documents()
    assert {d.source_id for d in inventory.documents} == {tree[k] for k in expected}


def test_a_missing_scope_folder_is_an_incomplete_listing(graph, tree, ca_file):
    with pytest.raises(ListingIncompleteError, match="Nope"):
        make_source(graph, ca_file, path="Nope").list_documents()


def test_fetch_follows_the_download_redirect_without_the_token(graph, tree, ca_file):
    source = make_source(graph, ca_file)
    docs = {d.source_id: d for d in source.list_documents().documents}
    assert source.fetch(docs[tree["deck"]]) == corpus_bytes("sample-presentation.pptx")
    assert graph.content_calls == [tree["deck"]] and graph.cdn_auth_headers == 0


def test_a_day_of_changes_through_delta(graph, tree, ca_file):
    source = make_source(graph, ca_file)
    cursor = source.list_documents().cursor
    g = graph
    graph.delete(tree["other"])
    day_before = source.changes(cursor)
    assert day_before.deleted_ids == [tree["other"]] and day_before.upserts == []

    added = g.add_file("new.txt", tree["sub"], corpus_bytes("fake-text-utf-16.txt"), "text/plain")
    g.update_content(tree["cups"], corpus_bytes("stanley-cups.csv") + b"Kings,LA,2\n")
    g.update_content(tree["cups"], corpus_bytes("stanley-cups.csv") + b"Kings,LA,3\n")  # repeated: last wins
    g.rename(tree["memo"], "memo (final).pdf")
    g.delete(tree["tables"])
    g.restore(tree["other"])
    changes = source.changes(day_before.next_cursor)
    upserts = {d.source_id: d for d in changes.upserts}
    assert set(upserts) == {added, tree["cups"], tree["memo"], tree["other"]}
    assert changes.deleted_ids == [tree["tables"]]
    assert upserts[tree["cups"]].content_sha256 == hashlib.sha256(corpus_bytes("stanley-cups.csv") + b"Kings,LA,3\n").hexdigest()
    memo = upserts[tree["memo"]]
    assert memo.title == "memo (final).pdf" and memo.source_version == '"c:{%s},1"' % tree["memo"]  # cTag: content unchanged
    assert tree["tables"] not in graph.content_calls   # a deletion never downloads
    tombstones = [q for q in graph.log if q[1].get("id") == tree["tables"]]
    assert "name" not in tombstones[-1][1]             # the fake's tombstones lack a name, as Graph's may
    again = source.changes(changes.next_cursor)
    assert again.upserts == [] and again.deleted_ids == []


def test_moves_across_a_path_scope(graph, tree, ca_file):
    source = make_source(graph, ca_file, path="Shared")
    cursor = source.list_documents().cursor
    graph.move(tree["deck"], graph.root_id)             # out of the scope
    graph.move(tree["other"], tree["sub"])              # into the scope
    outside = graph.add_file("elsewhere.csv", None, b"a\n", "text/csv")
    fresh = graph.add_folder("Fresh", tree["shared"])   # a new folder and its file
    fresh_file = graph.add_file("fresh.csv", fresh, b"b\n", "text/csv")
    changes = source.changes(cursor)
    assert {d.source_id for d in changes.upserts} == {tree["other"], fresh_file}
    assert tree["deck"] in changes.deleted_ids and outside not in {d.source_id for d in changes.upserts}


def test_the_documented_graph_examples(graph, ca_file):
    # The real bodies of Microsoft's delta examples: a folder, a file, a deleted file, a nextLink;
    # then the folder deleted and the file again, with a deltaLink (links are opaque cursors).
    source = make_source(graph, ca_file)
    cursor = _DeltaState(link=graph.base_url + "/v1.0/me/drive/root/delta?token=fixture-start").encode()
    changes = source.changes(cursor)
    assert [d.source_id for d in changes.upserts] == ["123010204abac"]
    assert changes.upserts[0].title == "file.txt"
    assert changes.deleted_ids == ["2353010204ddgg"]
    assert _DeltaState.decode(changes.next_cursor).link == (
        graph.base_url + "/v1.0/me/drive/root/delta?(token='1230919asd190410jlka')")
    latest = source.changes(changes.next_cursor)          # example 3: nothing new
    assert latest.upserts == [] and latest.deleted_ids == []
    known_folder = _DeltaState(link=cursor and _DeltaState.decode(cursor).link, folders=["0123456789abc"]).encode()
    with pytest.raises(ChangeFeedUnavailable, match="0123456789abc"):
        source.changes(known_folder)                     # a deleted folder we held: resync


def test_410_resync_required_means_full_enumeration(graph, tree, ca_file):
    source = make_source(graph, ca_file)
    cursor = source.list_documents().cursor
    graph.expire_tokens()
    with pytest.raises(ChangeFeedUnavailable, match="410"):
        source.changes(cursor)
    assert len(source.list_documents().documents) == 5


def test_a_repeating_next_link_stops_with_an_error(graph, tree, ca_file):
    source = make_source(graph, ca_file)
    cursor = source.list_documents().cursor
    graph.add_file("late.csv", None, b"x\n", "text/csv")
    graph.repeat_next_link = True
    with pytest.raises(ListingIncompleteError, match="repeated"):
        source.changes(cursor)
    assert len(_delta_requests(graph)) < 10             # stopped, did not loop


def test_empty_pages_with_a_next_link_keep_paging(graph, tree, ca_file):
    graph.empty_pages = 3
    source = make_source(graph, ca_file)
    inventory = source.list_documents()
    assert len(inventory.documents) == 5
    graph.update_content(tree["cups"], b"changed\n")
    assert [d.source_id for d in source.changes(inventory.cursor).upserts] == [tree["cups"]]


def test_a_deleted_folder_in_scope_needs_a_resync(graph, tree, ca_file):
    source = make_source(graph, ca_file)
    cursor = source.list_documents().cursor
    graph.delete(tree["sub"], report_children=False)
    with pytest.raises(ChangeFeedUnavailable, match=tree["sub"]):
        source.changes(cursor)


def test_throttling_honours_retry_after_within_bounds(graph, tree, ca_file):
    source = make_source(graph, ca_file)
    graph.fail_next("delta", 429, retry_after="1")
    started = time.monotonic()
    assert len(source.list_documents().documents) == 5
    assert time.monotonic() - started >= 1.0
    graph.fail_next("delta", 503, times=3)
    with pytest.raises(ListingIncompleteError, match="503"):
        source.list_documents()
    graph.fail_next("delta", 429, retry_after="3600")
    started = time.monotonic()
    with pytest.raises(ListingIncompleteError, match="429"):
        source.list_documents()
    assert time.monotonic() - started < 2.0
    graph.fail_next("content", 503, times=1)
    doc = source.list_documents().documents[0]
    assert source.fetch(doc) == graph.blobs[doc.source_id]


def test_a_wrong_client_secret_is_a_configuration_error(graph, tree, ca_file):
    source = SharePointSource(drive_id=graph.drive_id, tenant_id=graph.tenant_id, client_id=graph.client_id,
                              client_secret="not-the-secret", graph_url=graph.base_url + "/v1.0",
                              authority_url=graph.base_url, verify=ca_file)
    with pytest.raises(SourceError, match="invalid_client") as failure:
        source.list_documents()
    assert not failure.value.transient and "not-the-secret" not in str(failure.value)


def test_links_outside_the_graph_origin_are_refused(graph, tree, ca_file):
    source = make_source(graph, ca_file)
    cursor = _DeltaState(link="https://example.invalid/v1.0/drives/x/root/delta?token=1").encode()
    with pytest.raises(SourceError, match="outside"):
        source.changes(cursor)


def test_from_env(graph, tree, ca_file, monkeypatch):
    env = {"RAG_MS_TENANT_ID": graph.tenant_id, "RAG_MS_CLIENT_ID": graph.client_id,
           "RAG_MS_CLIENT_SECRET": graph.client_secret, "RAG_GRAPH_API_URL": graph.base_url + "/v1.0",
           "RAG_MS_AUTHORITY": graph.base_url}
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", ca_file)   # from_env trusts what requests trusts
    source = SharePointSource.from_env(drive_id=graph.drive_id, path="Shared", env=env)
    assert source.name == f"sharepoint:{graph.drive_id}/Shared"
    assert len(source.list_documents().documents) == 4
    with pytest.raises(SourceError, match="RAG_MS_CLIENT_SECRET") as missing:
        SharePointSource.from_env(drive_id="d", env={k: v for k, v in env.items() if k != "RAG_MS_CLIENT_SECRET"})
    assert not missing.value.transient
    assert graph.client_secret not in repr(source)


def test_secrets_are_never_logged(graph, tree, ca_file, caplog):
    caplog.set_level(logging.DEBUG)
    source = make_source(graph, ca_file)
    inventory = source.list_documents()
    for doc in inventory.documents:
        source.fetch(doc)
    graph.update_content(tree["cups"], b"new\n")
    source.changes(inventory.cursor)
    assert caplog.records and graph._access_tokens
    for secret in [graph.client_secret, *graph._access_tokens]:
        assert secret not in caplog.text


def test_the_fake_applies_select_like_graph(graph, tree, ca_file):
    # A client that left `deleted` out of $select would see tombstones as bare ids: the fake
    # enforces $select (kept in its links), so the source's handling of deletions above is real.
    headers = {"Authorization": f"Bearer {make_source(graph, ca_file)._token()}"}
    url = graph.base_url + f"/v1.0/drives/{graph.drive_id}/root/delta?$select=id,name"
    while True:
        body = requests.get(url, headers=headers, verify=ca_file, timeout=10).json()
        assert all(set(item) <= {"id", "name"} for item in body["value"])
        if "@odata.deltaLink" in body:
            break
        url = body["@odata.nextLink"]
    graph.delete(tree["memo"])
    changes = requests.get(body["@odata.deltaLink"], headers=headers, verify=ca_file, timeout=10).json()
    assert {"id": tree["memo"]} in changes["value"]      # a tombstone without its `deleted` facet
