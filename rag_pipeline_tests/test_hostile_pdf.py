"""Hostile PDFs (issue "Hardening", part 3): a million empty pages, a page tree 100,000 levels deep,
objects and content streams nested 100,000 deep, a million nested ``q``, form XObjects that draw each
other in a loop, and forms that fan out to 10^29 draws.

Every file is written here as plain PDF syntax (``build_pdf``: objects numbered from 1, a classic
``xref`` table with the real byte offsets, so no parser needs its repair mode to open them) and stays
small on disk: the million pages share one page object, referenced 1,000 times from one shared
``/Pages`` node that the root references 1,000 times (12 KB). They run through ``sync_source`` (the real
embedded PostgreSQL, the real model, the isolated extraction worker) beside a real text file and a real
PDF of the corpus, under small limits: each hostile file ends in a state whose reason names what
happened (the page cap, the memory or time limit, a malformed page tree), or completes with the text it
really holds; a limit exceeded is terminal (not tried again by the next sync); the two normal documents
complete with their chunks.
"""

from __future__ import annotations

import io

import pytest

from rag_pipeline.config import Settings
from rag_pipeline.extraction import (
    ExtractionLimitError,
    NoTextError,
    extract_in_process,
)
from rag_pipeline.extraction.pdf import MAX_PDF_PAGES
from rag_pipeline.pipeline import steps
from rag_pipeline.pipeline.sync import EXIT_DOCUMENT_FAILURES, sync_source
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.store.invariants import check_index
from rag_pipeline_tests.invariant_fakes import count_extractions, document

TIMEOUT_S = 20.0
MEMORY_MB = 1024
SENTENCE = b"The lantern on the quay burned until the fog lifted at dawn."
"""The one line of real text the nested files carry (Helvetica, WinAnsi: PDFium returns it as is)."""

# --- the generator ------------------------------------------------------------------------------


def build_pdf(objects: dict[int, bytes]) -> bytes:
    """A PDF 1.7 file of ``objects`` (object number -> the bytes between ``obj`` and ``endobj``),
    catalog at object 1, with a correct classic cross-reference table (numbers missing from
    ``objects`` are free entries)."""
    out = io.BytesIO()
    out.write(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    size = max(objects) + 1
    offsets: dict[int, int] = {}
    for num in sorted(objects):
        offsets[num] = out.tell()
        out.write(b"%d 0 obj\n%s\nendobj\n" % (num, objects[num]))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f\r\n" % size)
    for num in range(1, size):
        out.write(b"%010d 00000 n\r\n" % offsets[num] if num in offsets else b"0000000000 00000 f\r\n")
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (size, xref))
    return out.getvalue()


def _stream(data: bytes, entries: bytes = b"") -> bytes:
    return b"<< /Length %d %s>>\nstream\n%s\nendstream" % (len(data), entries, data)


CATALOG = b"<< /Type /Catalog /Pages 2 0 R >>"
FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"
TEXT = b"BT /F1 14 Tf 72 700 Td (" + SENTENCE + b") Tj ET\n"


def _form(content: bytes, resources: bytes) -> bytes:
    return _stream(content, b"/Type /XObject /Subtype /Form /BBox [0 0 612 792] /Resources " + resources + b" ")


def one_page(content: bytes, resources: bytes = b"<< /Font << /F1 9 0 R >> >>", page_entries: bytes = b"",
             more: dict[int, bytes] | None = None) -> bytes:
    """One page (object 3) drawing ``content`` (object 4); object 9 is Helvetica."""
    objects = {1: CATALOG, 2: b"<< /Type /Pages /Count 1 /Kids [3 0 R] >>",
               3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources %s /Contents 4 0 R %s>>"
                  % (resources, page_entries),
               4: _stream(content), 9: FONT}
    objects.update(more or {})
    return build_pdf(objects)


def many_empty_pages(fan: int, levels: int = 2) -> bytes:
    """``fan ** levels`` empty pages: one page object, and one ``/Pages`` node per level whose ``/Kids``
    holds the node below ``fan`` times (a balanced tree whose nodes are shared: a few KB on disk)."""
    nodes = list(range(2, 2 + levels))
    page = nodes[-1] + 1
    objects = {1: CATALOG, page: b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] >>" % nodes[-1]}
    for depth, num in enumerate(nodes):
        child = nodes[depth + 1] if depth + 1 < levels else page
        parent = b"/Parent %d 0 R " % nodes[depth - 1] if depth else b""
        objects[num] = (b"<< /Type /Pages %s/Count %d /Kids [" % (parent, fan ** (levels - depth))
                        + b" ".join([b"%d 0 R" % child] * fan) + b"] >>")
    return build_pdf(objects)


def deep_page_tree(depth: int = 100_000, text_page: bool = False) -> bytes:
    """A page at the bottom of ``depth`` nested ``/Pages`` nodes, each with one kid (10 MB). With
    ``text_page`` the root's first kid is a normal page of ``SENTENCE`` and the deep chain its second."""
    first = 10
    objects = {1: CATALOG, 9: FONT}
    for i in range(depth):
        num = first + i
        objects[num] = b"<< /Type /Pages /Parent %d 0 R /Count 1 /Kids [%d 0 R] >>" % (num - 1 if i else 2, num + 1)
    leaf = first + depth
    objects[leaf] = b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] >>" % (leaf - 1)
    if text_page:
        objects[2] = b"<< /Type /Pages /Count 2 /Kids [3 0 R %d 0 R] >>" % first
        objects[3] = (b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 9 0 R >> >> "
                      b"/Contents 4 0 R >>")
        objects[4] = _stream(TEXT)
    else:
        objects[2] = b"<< /Type /Pages /Count 1 /Kids [%d 0 R] >>" % first
    return build_pdf(objects)


def deep_objects(depth: int = 100_000) -> bytes:
    """``SENTENCE``, then an operand of ``depth`` nested arrays in the content stream; the page's
    dictionary holds ``depth`` nested arrays and ``depth`` nested dictionaries (1 MB)."""
    arrays = b"[" * depth + b"]" * depth
    dicts = b"<< /A " * depth + b"0" + b" >>" * depth
    return one_page(TEXT + arrays + b" pop\n", page_entries=b"/DeepArray " + arrays + b" /DeepDict " + dicts + b" ")


def deep_graphics_state(depth: int = 1_000_000) -> bytes:
    """``SENTENCE`` inside ``depth`` nested ``q`` ... ``Q`` (4 MB)."""
    return one_page(b"q\n" * depth + TEXT + b"Q\n" * depth)


def form_loop() -> bytes:
    """Form 5 shows ``SENTENCE`` and draws form 6, which draws form 5: a cycle."""
    resources = b"<< /Font << /F1 9 0 R >> /XObject << /X %d 0 R >> >>"
    return one_page(b"/X Do", resources % 5, more={5: _form(TEXT + b"/X Do", resources % 6),
                                                   6: _form(b"/X Do", resources % 5)})


def form_fanout(levels: int = 30, fan: int = 10) -> bytes:
    """Forms 10.. each draw the next one ``fan`` times, the last shows ``SENTENCE``: no cycle, no depth
    over ``levels``, but ``fan ** (levels - 1)`` (10^29) draws of the last one."""
    objects: dict[int, bytes] = {}
    for k in range(levels):
        num = 10 + k
        if k == levels - 1:
            objects[num] = _form(TEXT, b"<< /Font << /F1 9 0 R >> >>")
        else:
            objects[num] = _form(b" ".join([b"/X Do"] * fan), b"<< /XObject << /X %d 0 R >> >>" % (num + 1))
    return one_page(b"/X Do", b"<< /XObject << /X 10 0 R >> >>", more=objects)


# --- extraction in process ----------------------------------------------------------------------


def test_generated_files_are_well_formed():
    """The xref offsets point at their objects, and PDFium reads the declared page counts."""
    import re

    import pypdfium2 as pdfium

    for data in (many_empty_pages(3), deep_page_tree(50), one_page(TEXT)):
        xref = int(re.search(rb"startxref\n(\d+)", data).group(1))
        assert data[xref:xref + 4] == b"xref"
        entries = re.findall(rb"(\d{10}) \d{5} ([nf])\r\n", data[xref:])
        assert len(entries) == int(re.search(rb"/Size (\d+)", data).group(1))
        for num, (offset, kind) in enumerate(entries):
            if kind == b"n":
                assert data[int(offset):].startswith(b"%d 0 obj\n" % num)
    assert len(pdfium.PdfDocument(many_empty_pages(1000))) == 1_000_000
    assert len(many_empty_pages(1000)) < 20_000


def test_the_default_page_cap_is_20000_pages():
    assert MAX_PDF_PAGES == 20_000
    over = many_empty_pages(MAX_PDF_PAGES + 1, levels=1)
    with pytest.raises(ExtractionLimitError) as info:
        extract_in_process(over, filename="over.pdf")
    assert info.value.reason == "too many pages: 20,001, over the cap of 20,000 pages"
    assert steps.classify(info.value) == (info.value.reason, "terminal")
    # at the cap the pages are read (and found empty): the cap is not what stops it
    with pytest.raises(NoTextError) as info:
        extract_in_process(many_empty_pages(MAX_PDF_PAGES, levels=1), filename="at.pdf")
    assert info.value.reason == "no text: PDF has no text"


def test_a_page_the_tree_cannot_reach_is_a_page_error_and_the_others_are_kept():
    result = extract_in_process(deep_page_tree(2000, text_page=True), filename="half.pdf")
    assert result.markdown == "<!-- page 1 -->\n\n" + SENTENCE.decode() + "\n\n<!-- page 2 -->"
    assert result.stats["page_errors"] == 1 and result.stats["chars_per_page"] == [len(SENTENCE), 0]
    assert result.stats["low_quality"] and result.stats["low_quality_reason"].startswith("1 page(s) could not be read")


# --- through a sync, beside normal documents ----------------------------------------------------

HOSTILE = {
    "million-pages.pdf": lambda: many_empty_pages(1000),
    "deep-page-tree.pdf": deep_page_tree,
    "deep-objects.pdf": deep_objects,
    "deep-q.pdf": deep_graphics_state,
    "form-loop.pdf": form_loop,
    "form-fanout.pdf": form_fanout,
}
NORMAL = ("fake-text-utf-16.txt", "fake-memo.pdf")
UNLOADABLE_REASON = ("no text: malformed PDF: 1 of 1 page(s) cannot be loaded "
                     "(broken page tree: too deep, cyclic or a missing object)")


def _rows(store, source: str, ids) -> dict[str, tuple[str, int, str | None]]:
    with store.connection() as conn:
        assert check_index(conn) == []
        return {sid: (row["status"], row["failure_count"], row["last_error"])
                for sid in ids for row in [document(conn, source, sid)]}


def _chunk_text(store, source: str, sid: str) -> str:
    with store.connection() as conn:
        got = conn.execute("SELECT string_agg(c.text, ' ' ORDER BY c.ordinal) FROM chunks c "
                           "JOIN documents d ON d.id = c.document_id "
                           "WHERE d.source = %s AND d.source_id = %s AND c.version = d.version", (source, sid)).fetchone()
    return got[0] or ""


def test_hostile_pdfs_end_in_a_state_with_a_reason_and_the_others_complete(database_url, store, embedder, tmp_path,
                                                                          shared_dir, monkeypatch):
    settings = Settings(database_url=database_url, retry_backoff_s=0, extraction_timeout_s=TIMEOUT_S,
                        extraction_memory_mb=MEMORY_MB)
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, make in HOSTILE.items():
        (folder / name).write_bytes(make())
    for name in NORMAL:
        (folder / name).write_bytes((shared_dir / "corpus" / name).read_bytes())
    extracted = count_extractions(monkeypatch)
    src = LocalFolderSource(folder)

    report = sync_source(src, store, embedder, settings)
    state = _rows(store, src.name, [*HOSTILE, *NORMAL])
    sentence = SENTENCE.decode()
    fanout = state.pop("form-fanout.pdf")
    assert state == {
        "million-pages.pdf": ("permanently_failed", 1, "too many pages: 1,000,000, over the cap of 20,000 pages"),
        "deep-page-tree.pdf": ("skipped", 0, UNLOADABLE_REASON),
        "deep-objects.pdf": ("completed", 0, None),
        "deep-q.pdf": ("completed", 0, None),
        "form-loop.pdf": ("completed", 0, None),
        "fake-text-utf-16.txt": ("completed", 0, None),
        "fake-memo.pdf": ("completed", 0, None),
    }
    # PDFium draws 10^29 forms in native code, keeping every text object it makes: whichever limit comes
    # first (memory on the machines measured) stops it
    assert fanout[:2] == ("permanently_failed", 1)
    assert fanout[2] in (f"memory limit exceeded ({MEMORY_MB} MB)", f"memory limit exceeded ({MEMORY_MB} MB): worker was killed",
                         f"time limit exceeded ({TIMEOUT_S:g} s)"), fanout
    state["form-fanout.pdf"] = fanout
    assert report.exit_code == EXIT_DOCUMENT_FAILURES
    assert {d.source_id for d in report.documents if d.became_permanent} == {"million-pages.pdf", "form-fanout.pdf"}

    for name in ("deep-objects.pdf", "deep-q.pdf", "form-loop.pdf"):
        text = _chunk_text(store, src.name, name)
        assert sentence in text, (name, text[:200])
    assert _chunk_text(store, src.name, "deep-objects.pdf") == sentence
    assert _chunk_text(store, src.name, "deep-q.pdf") == sentence
    # PDFium stops the cycle at its form nesting limit: the sentence once per level drawn, a bounded number
    loop_text = _chunk_text(store, src.name, "form-loop.pdf")
    assert 1 <= loop_text.count(sentence) <= 64 and len(loop_text) < 64 * (len(sentence) + 1)
    assert "Hamburgers are delicious" in _chunk_text(store, src.name, "fake-text-utf-16.txt")
    assert "20,000 bottles of water" in _chunk_text(store, src.name, "fake-memo.pdf")
    assert sorted(extracted) == sorted([*HOSTILE, *NORMAL])

    # terminal or skipped: the next sync (retry_backoff_s=0 would retry a transient failure at once) leaves
    # every document alone, the hostile ones included
    report = sync_source(src, store, embedder, settings)
    again = {d.source_id: (d.action.value, d.status) for d in report.documents}
    assert {name: again.get(name) for name in HOSTILE} == {name: ("skipped-unchanged", state[name][0]) for name in HOSTILE}
    assert len(extracted) == len(HOSTILE) + len(NORMAL)
    assert _rows(store, src.name, [*HOSTILE, *NORMAL]) == state
