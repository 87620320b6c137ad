"""A SharePoint document library synced into the embedded PostgreSQL with the real model, day by
day, through the fake Graph server (HTTPS, msal). After every day the index must equal the source.
"""

from __future__ import annotations

import pytest
import trustme

from rag_pipeline.sources.sharepoint import RetryPolicy, SharePointSource
from rag_pipeline.store import index as idx_store
from rag_pipeline.pipeline.sync import sync_source

from .fakes.gdrive_server import corpus_bytes
from .fakes.graph_server import FakeGraph
from .test_gdrive_sync import CUPS_V2, PHRASE, assert_index_equals

pytestmark = pytest.mark.slow

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory):
    ca = trustme.CA()
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return ca, str(path)


@pytest.fixture
def graph(shared_dir, ca_file):
    fake = FakeGraph(page_limit=3)
    with fake.serve(ca_file[0]):
        yield fake


def _source(graph, ca_file, path=None):
    return SharePointSource(drive_id=graph.drive_id, tenant_id=graph.tenant_id, client_id=graph.client_id,
                            client_secret=graph.client_secret, path=path, graph_url=graph.base_url + "/v1.0",
                            authority_url=graph.base_url, verify=ca_file[1],
                            retry=RetryPolicy(attempts=2, base_wait_s=0.01))


def _library(graph):
    """root/{Shared/{memo.pdf, cups.csv, table.md, Sub/{tables.docx, deck.pptx, utf16.txt}}, other.md}"""
    g = graph
    ids = {"shared": g.add_folder("Shared")}
    ids["sub"] = g.add_folder("Sub", ids["shared"])
    ids["memo"] = g.add_file("memo.pdf", ids["shared"], corpus_bytes("fake-memo.pdf"), "application/pdf")
    ids["cups"] = g.add_file("cups.csv", ids["shared"], corpus_bytes("stanley-cups.csv"), "text/csv")
    ids["table"] = g.add_file("table.md", ids["shared"], corpus_bytes("simple-table.md"), "text/markdown")
    ids["tables"] = g.add_file("tables.docx", ids["sub"], corpus_bytes("docx-tables.docx"), DOCX)
    ids["deck"] = g.add_file("deck.pptx", ids["sub"], corpus_bytes("sample-presentation.pptx"), PPTX)
    ids["utf16"] = g.add_file("utf16.txt", ids["sub"], corpus_bytes("fake-text-utf-16.txt"), "text/plain")
    ids["other"] = g.add_file("other.md", None, b"# Outside the scope\n\nNot for this index.\n", "text/markdown")
    return ids


def test_sharepoint_sync_day_by_day(graph, ca_file, store, embedder, settings):
    ids = _library(graph)
    source = _source(graph, ca_file, path="Shared")
    expected = {ids["memo"]: (PHRASE["fake-memo.pdf"],), ids["cups"]: (PHRASE["stanley-cups.csv"],),
                ids["table"]: (PHRASE["simple-table.md"],), ids["tables"]: (PHRASE["docx-tables.docx"],),
                ids["deck"]: (PHRASE["sample-presentation.pptx"],), ids["utf16"]: (PHRASE["fake-text-utf-16.txt"],)}

    # day 0: full enumeration of the library, the path scope keeps Shared/ only
    day0 = sync_source(source, store, embedder, settings)
    assert day0.mode == "full" and day0.ok
    assert_index_equals(store, source.name, expected)

    # day 1: an add, a content change (twice: the last one wins), a rename, a delete
    added = graph.add_file("new.md", ids["sub"], corpus_bytes("codeblock.md"), "text/markdown")
    graph.update_content(ids["cups"], corpus_bytes("stanley-cups.csv") + b"Intermediate,Nowhere,9\n")
    graph.update_content(ids["cups"], CUPS_V2)
    graph.rename(ids["memo"], "memo (final).pdf")
    graph.delete(ids["tables"])
    calls_before = len(graph.content_calls)
    day1 = sync_source(source, store, embedder, settings)
    assert day1.mode == "changes" and day1.ok and day1.deleted == [ids["tables"]]
    actions = {d.source_id: d.action for d in day1.documents}
    assert actions[ids["memo"]] == "metadata-updated" and actions[ids["cups"]] == "updated"
    assert sorted(graph.content_calls[calls_before:]) == sorted([added, ids["cups"]])  # no download for a deletion or a rename
    expected = {**{k: v for k, v in expected.items() if k != ids["tables"]},
                added: ("This is a simple HTML example.",), ids["cups"]: ("Seattle Kraken",)}
    snapshot = assert_index_equals(store, source.name, expected, absent={ids["cups"]: ("Intermediate",)})
    assert snapshot[ids["memo"]]["title"] == "memo (final).pdf"

    # day 2: the deleted file is restored; meanwhile the delta token expired (410 resyncRequired)
    graph.restore(ids["tables"])
    graph.delete(ids["deck"])
    graph.expire_tokens()
    day2 = sync_source(source, store, embedder, settings)
    assert day2.mode == "full" and day2.ok and day2.deleted == [ids["deck"]]
    expected = {**{k: v for k, v in expected.items() if k != ids["deck"]},
                ids["tables"]: (PHRASE["docx-tables.docx"],)}
    assert_index_equals(store, source.name, expected)

    # day 3: the server repeats a next link: the run fails, nothing is applied, the cursor stays
    with store.connection() as conn:
        cursor = idx_store.get_cursor(conn, source.name)
    graph.delete(ids["utf16"])
    graph.repeat_next_link = True
    day3 = sync_source(source, store, embedder, settings)
    assert day3.listing_error and "repeated" in day3.listing_error and day3.exit_code == 2
    with store.connection() as conn:
        assert idx_store.get_cursor(conn, source.name) == cursor
    assert_index_equals(store, source.name, expected)
    graph.repeat_next_link = False
    day4 = sync_source(source, store, embedder, settings)
    assert day4.mode == "changes" and day4.ok and day4.deleted == [ids["utf16"]]
    expected = {k: v for k, v in expected.items() if k != ids["utf16"]}
    assert_index_equals(store, source.name, expected)


def test_sharepoint_day_with_an_empty_listing_deletes_nothing(graph, ca_file, store, embedder, settings):
    a = graph.add_file("cups.csv", None, corpus_bytes("stanley-cups.csv"), "text/csv")
    b = graph.add_file("table.md", None, corpus_bytes("simple-table.md"), "text/markdown")
    source = _source(graph, ca_file)
    assert sync_source(source, store, embedder, settings).ok
    expected = {a: (PHRASE["stanley-cups.csv"],), b: (PHRASE["simple-table.md"],)}
    assert_index_equals(store, source.name, expected)

    graph.hide_items = True
    report = sync_source(source, store, embedder, settings, full=True)
    assert not report.guard.passed and "empty listing" in report.guard.reason
    assert report.deleted == [] and report.exit_code == 2
    assert_index_equals(store, source.name, expected)
