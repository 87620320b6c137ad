"""Crashes and broken properties the fuzz targets (``fuzz/``) found, one minimal input each.

Fixed ones are plain regression tests (clean-up idempotence on an empty list item, deeply nested JSON in
type detection, a hostile ``<meta charset>``, rowspans past the last row, lone surrogates in stored text).
The ones not fixed yet are pinned ``xfail(strict=True)`` with the proposed fix in the reason: the fix turns
it into a pass, which fails the strict xfail until the marker (and the entry in ``fuzz/known.py``) is removed.
"""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path

import pytest


def _xfail(reason: str):
    return pytest.mark.xfail(strict=True, reason=reason)


# --- extraction/clean.py -------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["  - ", "  1. ", "\t* "])
def test_clean_markdown_is_idempotent_on_an_empty_list_item(text):
    from rag_pipeline.extraction.clean import clean_markdown

    once = clean_markdown(text)[0]
    assert clean_markdown(once)[0] == once


@pytest.mark.parametrize("text", [
    "\n    ```\u00a8\n   ```\u00a8\n\n\n\u00a8",  # a 4-space indented ``` line: stripping it made it a fence
    "\u00a8" * 6 + "   ```\x0c\x0c\x0c\u0301   ```" + "\u00a8" * 4 + "   ```\x0c\x0c\x0c\u0301   ```\r\n",  # NFKC spaces
], ids=["indented-fence", "nfkc-space"])
def test_clean_up_is_idempotent_around_code_fences(text):
    """atheris (1 h, ``clean``): ``normalize_whitespace`` stripped the indentation that kept a line from being a
    fence, and NFKC (U+00A8 -> space + combining mark) left whitespace that one more pass tidied."""
    from rag_pipeline.extraction.clean import clean_markdown, normalize_whitespace

    once = normalize_whitespace(text)
    assert normalize_whitespace(once) == once
    cleaned = clean_markdown(text)[0]
    assert clean_markdown(cleaned)[0] == cleaned


# --- extraction/detect.py, extraction/text_formats.py ----------------------------------------------


def test_detect_deeply_nested_json_text():
    from rag_pipeline.extraction.detect import detect

    assert detect(b"[" * 100_000, "a.txt").doc_type == "txt"


def test_detect_html_with_a_hostile_meta_charset():
    charset = "undefined"
    from rag_pipeline.extraction.detect import detect
    from rag_pipeline.extraction.text_formats import decode_text

    data = f'<meta charset="{charset}">'.encode() + b"\xff\xfe caf\xe9 \\x"
    assert detect(data, "a.html").doc_type == "html"
    assert "caf" in decode_text(data)


# --- extraction/tables.py ------------------------------------------------------------------------


def test_html_rowspan_is_clipped_at_the_end_of_the_table():
    from rag_pipeline.extraction.tables import expand_spans, html_table_to_grid

    assert len(expand_spans([[("a", 5, 1)], [("b", 1, 1)]])) == 2
    grid = html_table_to_grid('<table><tr><td rowspan="1000" colspan="3">x</td></tr></table>')
    assert len(grid) == 1


# --- defs/documents/partitions.py ----------------------------------------------------------------


def test_partition_key_length_is_bounded():
    from rag_pipeline.defs.documents.partitions import MAX_KEY_BYTES, document_partition_key, resolve_digest_key

    source_id = "/".join(["répertoire"] * 300)
    key = document_partition_key("docs", source_id)  # a digest key (``partitions`` module docstring)
    assert len(key.encode("utf-8")) <= MAX_KEY_BYTES == 1000
    assert resolve_digest_key(key, ["a", source_id + "x", source_id]) == source_id


def test_partition_key_of_an_undecodable_file_name():
    from rag_pipeline.defs.documents.partitions import (
        document_partition_key,
        parse_document_partition_key,
    )

    key = document_partition_key("docs", "caf\udce9.txt")
    key.encode("utf-8")
    assert parse_document_partition_key(key) == ("docs", "caf\udce9.txt")


# --- sources/zotero.py ---------------------------------------------------------------------------


def _zotero():
    from rag_pipeline.sources.zotero import ZoteroSource

    return ZoteroSource("users/1", api_url="http://127.0.0.1:9/api")


def _attachment(**data):
    base = {"key": "A1", "itemType": "attachment", "linkMode": "imported_file", "title": "t"}
    return {"key": "A1", "version": 1, "data": {**base, **data}}


@pytest.mark.parametrize("bad", [{"linkMode": ["imported_file"]}, {"tags": 5}, {"creators": 5}, {"collections": 5},
                                 {"version": float("inf")}], ids=["linkMode", "tags", "creators", "collections",
                                                                  "version"])
def test_zotero_item_with_fields_of_the_wrong_type(bad):
    item = _attachment(**{k: v for k, v in bad.items() if k != "version"})
    if "version" in bad:
        item["version"] = bad["version"]
    documents, _gone = _zotero()._documents({"A1": item}, {"A1": item})
    assert [d.source_id for d in documents] == ["A1"]


@pytest.mark.parametrize("recorded", ["attachments:a\x00b.pdf", "attachments:" + "a" * 300 + ".pdf"],
                         ids=["nul", "long"])
def test_zotero_linked_file_path_that_the_os_refuses(tmp_path, recorded):
    from rag_pipeline.sources.zotero import LinkedFileResolver

    path, reason = LinkedFileResolver(root=tmp_path).resolve(recorded)
    assert path is None and reason.startswith("linked file not reachable")


def test_zotero_cursor_with_an_infinite_version():
    from rag_pipeline.sources.base import ChangeFeedUnavailable

    src = _zotero()
    cursor = json.dumps({"format": 1, "library": "users/1", "api": src.api_url, "version": 1e999})
    with pytest.raises(ChangeFeedUnavailable):
        src._cursor_version(cursor)


# --- store: lone surrogates ----------------------------------------------------------------------


def test_store_text_with_a_lone_surrogate_is_storable():
    from rag_pipeline.store.write import _clean, _json_safe

    _clean("caf\udce9.txt").encode("utf-8")
    json.dumps(_json_safe({"title": "\ud800"}), ensure_ascii=False).encode("utf-8")


# --- sources/gdrive.py ---------------------------------------------------------------------------


def _gdrive():
    import google.auth.credentials

    from rag_pipeline.sources.gdrive import GoogleDriveSource

    return GoogleDriveSource(credentials=google.auth.credentials.AnonymousCredentials(), folder_id="F0",
                             api_url="http://127.0.0.1:9/drive/v3/")


def _packed(prefix: str, value) -> str:
    return prefix + base64.urlsafe_b64encode(zlib.compress(json.dumps(value).encode())).decode()


def test_gdrive_file_resource_with_a_malformed_size():
    from rag_pipeline.sources.base import SourceError

    src = _gdrive()
    src._export_formats = {}
    try:
        doc = src._to_document({"id": "P1", "name": "a.pdf", "mimeType": "application/pdf", "size": "12 KB"}, {})
    except SourceError:
        return
    assert doc.size is None


@pytest.mark.parametrize("value", [[1], {"v": 1, "t": "T", "f": None}], ids=["list", "f-null"])
def test_gdrive_cursor_of_the_wrong_shape(value):
    from rag_pipeline.sources.gdrive import _ScopeState

    with pytest.raises(ValueError):
        _ScopeState.decode(_packed("gdrive1:", value))


# --- sources/sharepoint.py -----------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, {"v": 1, "l": "", "f": None}], ids=["null", "f-null"])
def test_sharepoint_cursor_of_the_wrong_shape(value):
    from rag_pipeline.sources.sharepoint import _DeltaState

    with pytest.raises(ValueError):
        _DeltaState.decode(_packed("graph1:", value))


@pytest.mark.parametrize("item", [{"id": "R1", "name": {"x": 1}, "cTag": ["c"], "file": {}},
                                  {"id": "R1", "file": {}, "size": float("inf")},
                                  {"id": "R1", "file": "x"}, {"id": "R1", "file": {}, "parentReference": "p"}],
                         ids=["name-object", "size-inf", "file-string", "parent-string"])
def test_sharepoint_item_with_fields_of_the_wrong_type(item):
    from rag_pipeline.sources.sharepoint import SharePointSource

    src = SharePointSource(drive_id="b", tenant_id="t", client_id="c", client_secret="s")
    doc = src._to_document(item)
    assert isinstance(doc.title, str) and (doc.source_version is None or isinstance(doc.source_version, str))


def test_regressions_are_listed_in_fuzz_known():
    """The findings ``fuzz/known.py`` lists (reported as known, not new, by ``fuzz/run.py`` and
    ``test_fuzz.py``) are exactly pinned ones here: a fixed finding is no longer listed there."""
    import re

    known = (Path(__file__).resolve().parents[1] / "fuzz" / "known.py").read_text()
    listed = set(re.findall(r'_R \+ "(test_\w+)"', known))
    tests = {name: fn for name, fn in globals().items() if name.startswith("test_") and callable(fn)}
    pinned = {name for name, fn in tests.items() if any(m.name == "xfail" for m in getattr(fn, "pytestmark", []))}
    assert listed == pinned, (listed - pinned, pinned - listed)


# --- extraction/tables.py ------------------------------------------------------------------------


def test_declared_spans_cannot_blow_up_a_table():
    """atheris (1 h, ``tables``) spent its slowest inputs on ``<td rowspan=1000 colspan=1000>``: spans that
    would cover 10^8 positions are ignored (each cell once), so the grid stays small and no text is lost."""
    from rag_pipeline.extraction.tables import MAX_EXPANDED_CELLS, expand_spans, html_table_to_grid

    rows = "".join("<tr>" + "".join(f'<td rowspan="1000" colspan="1000">r{i}c{j}</td>' for j in range(100)) + "</tr>"
                   for i in range(100))
    grid = html_table_to_grid(f"<table>{rows}</table>")
    assert len(grid) * len(grid[0]) <= MAX_EXPANDED_CELLS == 1_000_000
    assert {c for row in grid for c in row if c} == {f"r{i}c{j}" for i in range(100) for j in range(100)}
    small = expand_spans([[("a", 2, 2), ("b", 1, 1)], [("c", 1, 1)]])  # within the bound: spans expanded
    assert small == [["a", "a", "b"], ["a", "a", "c"]]
