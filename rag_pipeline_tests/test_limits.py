"""Size and resource limits (issue "Hardening", part 3) with generated hostile files.

Every hostile file is made here, in ``tmp_path``, never downloaded: a 2 GiB sparse file (``truncate``:
no disk used), zip bombs (a valid DOCX and a valid XLSX whose one XML part inflates to 1 GiB of
repeated elements from ~3 MB), an XLSX whose ``<dimension ref>`` declares ``A1:XFD1048576`` over 3 real
rows, and an XLSX with one formatted empty cell at XFD1048576 (issue 17). Each runs through
``sync_source`` beside normal documents: the hostile one ends in a state with a reason, within the limits
set for the test, a limit exceeded is terminal (not retried on the next sync), and the normal documents
of the same run complete.
"""

from __future__ import annotations

import io
import os
import re
import signal
import threading
import time
import zipfile

import pytest

from rag_pipeline.config import Settings
from rag_pipeline.extraction import worker as worker_mod
from rag_pipeline.extraction.types import (
    DocumentTooLargeError,
    ExtractionCrashError,
    ExtractionError,
    ExtractionLimitError,
)
from rag_pipeline.extraction.worker import Worker, WorkerPool
from rag_pipeline.pipeline import steps
from rag_pipeline.pipeline.sync import EXIT_DOCUMENT_FAILURES, sync_source
from rag_pipeline.sources.base import SourceDocument
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.store.invariants import check_index
from rag_pipeline_tests.invariant_fakes import MemorySource, count_extractions, document

MB = 1024 * 1024
GB = 1024 * MB
BOMB_BYTES = 1 * GB
"""What a bomb's XML part inflates to."""
BOMB_MEMORY_MB = 512
"""Above a normal document's peak in the worker (~350 MB once the word lists of `quality` are loaded)."""
BOMB_TIMEOUT_S = 30.0

W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
S_NS = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
NOTE = "# Field notes\n\nThe heron waited at the weir for the morning tide and caught nothing at all.\n"


# --- generated files --------------------------------------------------------------------------


def _docx(paragraphs: list[str]) -> bytes:
    import docx

    d = docx.Document()
    for text in paragraphs:
        d.add_paragraph(text)
    buf = io.BytesIO()
    d.save(buf)
    return buf.getvalue()


def _xlsx(rows: list[list[object]], *, formatted_corner: bool = False) -> bytes:
    import openpyxl
    from openpyxl.styles import Font

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Data"
    for row in rows:
        ws.append(row)
    if formatted_corner:  # one formatted, empty cell at the last row and column (issue 17)
        ws["XFD1048576"].font = Font(bold=True)
    buf = io.BytesIO()
    wb.save(buf)
    return buf.getvalue()


FRUIT = [["fruit", "crates"], ["quince", 3], ["medlar", 5]]


def _replace_part(template: bytes, part: str, write) -> bytes:
    """``template`` (an OOXML zip) with ``part`` rewritten by ``write(file)`` (streamed, compressed)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(template)) as zin, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for item in zin.infolist():
            if item.filename == part:
                with zout.open(part, "w", force_zip64=True) as f:
                    write(f)
            else:
                zout.writestr(item, zin.read(item.filename))
    return out.getvalue()


def _bomb(template: bytes, part: str, head: bytes, unit: bytes, tail: bytes, total: int = BOMB_BYTES) -> bytes:
    """A valid OOXML file whose ``part`` is ``head`` + ``unit`` repeated to ``total`` bytes + ``tail``."""
    block = unit * ((1 << 20) // len(unit))

    def write(f) -> None:
        f.write(head)
        written = len(head)
        while written < total:
            f.write(block)
            written += len(block)
        f.write(tail)

    return _replace_part(template, part, write)


def docx_bomb() -> bytes:
    """A DOCX whose ``word/document.xml`` inflates to 1 GiB of paragraphs."""
    return _bomb(_docx(["x"]), "word/document.xml",
                 f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="{W_NS}"><w:body>'.encode(),
                 b"<w:p><w:r><w:t>bomb</w:t></w:r></w:p>", b"</w:body></w:document>")


def xlsx_bomb() -> bytes:
    """An XLSX whose first sheet inflates to 1 GiB of rows (~22 million cells)."""
    return _bomb(_xlsx([["x"]]), "xl/worksheets/sheet1.xml",
                 f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><worksheet xmlns="{S_NS}"><sheetData>'.encode(),
                 b'<row><c t="inlineStr"><is><t>bomb</t></is></c></row>', b"</sheetData></worksheet>")


def xlsx_declaring(ref: str) -> bytes:
    """The 3 ``FRUIT`` rows with the sheet's ``<dimension ref>`` patched to ``ref``."""
    template = _xlsx(FRUIT)
    with zipfile.ZipFile(io.BytesIO(template)) as z:
        sheet = z.read("xl/worksheets/sheet1.xml")
    patched, n = re.subn(rb'<dimension ref="[^"]*"\s*/>', f'<dimension ref="{ref}"/>'.encode(), sheet)
    assert n == 1
    return _replace_part(template, "xl/worksheets/sheet1.xml", lambda f: f.write(patched))


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    """The two zip bombs, made once for the module (~3 s each to compress)."""
    made = {"bomb.docx": docx_bomb(), "bomb.xlsx": xlsx_bomb()}
    for name, data in made.items():
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            inflated = sum(i.file_size for i in z.infolist())
        assert len(data) < 8 * MB and inflated > BOMB_BYTES, (name, len(data), inflated)
    return made


# --- helpers ----------------------------------------------------------------------------------


def rows(store, source: str, *ids: str) -> dict[str, tuple[str, int, str | None]]:
    """``(status, failure_count, last_error)`` per id, after checking the index invariant."""
    with store.connection() as conn:
        assert check_index(conn) == []
        out = {}
        for sid in ids:
            row = document(conn, source, sid)
            out[sid] = (row["status"], row["failure_count"], row["last_error"])
    return out


def chunk_text(store, source: str, sid: str) -> str:
    with store.connection() as conn:
        got = conn.execute("SELECT string_agg(c.text, ' ') FROM chunks c JOIN documents d ON d.id = c.document_id "
                           "WHERE d.source = %s AND d.source_id = %s AND c.version = d.version",
                           (source, sid)).fetchone()
    return got[0] or ""


def by_id(report) -> dict[str, tuple[str, str]]:
    return {d.source_id: (d.action.value, d.status) for d in report.documents}


# --- the size cap -----------------------------------------------------------------------------


def test_a_2gb_sparse_file_is_refused_unread_and_the_others_complete(settings, store, embedder, tmp_path,
                                                                     fetches, monkeypatch):
    assert settings.max_document_mb == 200
    folder = tmp_path / "docs"
    folder.mkdir()
    with open(folder / "huge.pdf", "wb") as f:
        f.truncate(2 * GB)  # sparse: 2 GiB listed, no block written
    (folder / "note.md").write_text(NOTE)
    (folder / "small.docx").write_bytes(_docx(["The barge carried forty sacks of rye down the canal."]))
    extracted = count_extractions(monkeypatch)
    src = LocalFolderSource(folder)

    started = time.monotonic()
    report = sync_source(src, store, embedder, settings)
    assert time.monotonic() - started < 60
    reason = "too large: 2,048.0 MB, over the 200 MB cap (RAG_MAX_DOCUMENT_MB)"
    assert rows(store, src.name, "huge.pdf", "note.md", "small.docx") == {
        "huge.pdf": ("permanently_failed", 1, reason),
        "note.md": ("completed", 0, None),
        "small.docx": ("completed", 0, None),
    }
    assert report.exit_code == EXIT_DOCUMENT_FAILURES
    huge = next(d for d in report.documents if d.source_id == "huge.pdf")
    assert huge.reason == reason and huge.became_permanent and not huge.transient
    # never read: a stat-only listing (no verification, which would hash it), not fetched, never seen by
    # the extraction worker
    assert report.mode == "full" and sorted(fetches) == ["note.md", "small.docx"]
    assert "huge.pdf" not in extracted and sorted(extracted) == ["note.md", "small.docx"]
    assert "heron" in chunk_text(store, src.name, "note.md") and "barge" in chunk_text(store, src.name, "small.docx")

    # the next sync leaves it alone (same size and mtime): still not read, not counted again
    fetches.clear()
    report = sync_source(src, store, embedder, settings)
    assert by_id(report)["huge.pdf"] == ("skipped-unchanged", "permanently_failed")
    assert fetches == [] and rows(store, src.name, "huge.pdf")["huge.pdf"] == ("permanently_failed", 1, reason)


class UnsizedSource(MemorySource):
    """A source whose listing reports no size (as some APIs do for exports)."""

    def _listed(self, d) -> SourceDocument:
        return super()._listed(d).replace(size=None)


def test_a_source_without_sizes_is_checked_after_the_fetch(database_url, store, embedder, monkeypatch):
    settings = Settings(database_url=database_url, retry_backoff_s=0, max_document_mb=1)
    src = UnsizedSource()
    src.put("big", b"word " * (300 * 1024), title="big.md")  # 1.5 MiB
    src.put("note", NOTE.encode(), title="note.md")
    extracted = count_extractions(monkeypatch)

    sync_source(src, store, embedder, settings)
    reason = "too large: at least 1.5 MB, over the 1 MB cap (RAG_MAX_DOCUMENT_MB)"  # one piece: fetch, not fetch_to
    assert rows(store, src.name, "big", "note") == {"big": ("permanently_failed", 1, reason),
                                                    "note": ("completed", 0, None)}
    assert sorted(src.fetches) == ["big", "note"] and extracted == ["note.md"]  # fetched, never extracted
    report = sync_source(src, store, embedder, settings)
    assert by_id(report)["big"] == ("skipped-unchanged", "permanently_failed")
    assert sorted(src.fetches) == ["big", "note"]


def test_the_size_error_is_terminal():
    exc = DocumentTooLargeError("too large: 300.0 MB, over the 200 MB cap (RAG_MAX_DOCUMENT_MB)")
    assert isinstance(exc, ExtractionLimitError)
    assert steps.classify(exc) == (exc.reason, "terminal")


# --- resource limits: terminal, the worker's death classified -----------------------------------


def test_limits_and_crashes_are_terminal_other_deaths_transient():
    assert steps.classify(ExtractionLimitError("time limit exceeded (1 s)"))[1] == "terminal"
    killed = Worker._death_error(-signal.SIGKILL, 256)
    assert type(killed) is ExtractionLimitError and killed.reason.startswith("memory limit exceeded (256 MB)")
    crashed = Worker._death_error(-signal.SIGSEGV, 256)
    assert type(crashed) is ExtractionCrashError and "SIGSEGV" in crashed.reason and crashed.terminal
    for code in (-signal.SIGTERM, 1, None):
        other = Worker._death_error(code, 256)
        assert type(other) is ExtractionError and steps.classify(other)[1] == "transient"


def test_a_memory_error_wrapped_by_a_parser_still_counts_as_the_memory_limit():
    try:
        try:
            raise MemoryError
        except Exception as exc:  # what extract_docx does with anything python-docx raises
            raise ExtractionError(f"corrupt DOCX: {type(exc).__name__}: {exc}") from exc
    except ExtractionError as wrapped:
        assert worker_mod._caused_by_memory_error(wrapped)
    assert not worker_mod._caused_by_memory_error(ExtractionError("corrupt DOCX: KeyError"))


@pytest.mark.parametrize("sig, expected", [(signal.SIGSEGV, ExtractionCrashError), (signal.SIGTERM, ExtractionError)])
def test_a_worker_dying_mid_document(bombs, sig, expected):
    """A worker that crashes on a document (SIGSEGV: terminal) or is stopped from outside (SIGTERM:
    transient); the pool then serves the next document with a fresh worker."""
    pool = WorkerPool(max_workers=1)
    settings = Settings(extraction_memory_mb=2048, extraction_timeout_s=60)
    try:
        pool.run(NOTE.encode(), "note.md", None, settings)
        (pid,) = pool.worker_pids()
        killer = threading.Timer(1.0, os.kill, (pid, sig))
        killer.start()
        with pytest.raises(ExtractionError) as info:
            pool.run(bombs["bomb.xlsx"], "bomb.xlsx", None, settings)  # busy for several seconds
        killer.join()
        assert type(info.value) is expected
        assert info.value.terminal is (expected is ExtractionCrashError)
        assert "heron" in pool.run(NOTE.encode(), "note.md", None, settings).markdown
    finally:
        pool.close()


def test_zip_bombs_end_terminal_within_the_limits_and_the_others_complete(database_url, store, embedder, tmp_path,
                                                                          bombs, monkeypatch):
    settings = Settings(database_url=database_url, retry_backoff_s=0, extraction_memory_mb=BOMB_MEMORY_MB,
                        extraction_timeout_s=BOMB_TIMEOUT_S)
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, data in bombs.items():
        (folder / name).write_bytes(data)
    (folder / "note.md").write_text(NOTE)
    (folder / "small.docx").write_bytes(_docx(["The barge carried forty sacks of rye down the canal."]))
    (folder / "small.xlsx").write_bytes(_xlsx(FRUIT))
    extracted = count_extractions(monkeypatch)
    src = LocalFolderSource(folder)

    started = time.monotonic()
    report = sync_source(src, store, embedder, settings)
    # each bomb stops at a limit: the whole run stays within two time limits
    assert time.monotonic() - started < 2 * BOMB_TIMEOUT_S
    state = rows(store, src.name, "bomb.docx", "bomb.xlsx", "note.md", "small.docx", "small.xlsx")
    for name in bombs:
        status, count, reason = state[name]
        assert (status, count) == ("permanently_failed", 1), state[name]
        assert reason.startswith((f"memory limit exceeded ({BOMB_MEMORY_MB} MB)",
                                  f"time limit exceeded ({BOMB_TIMEOUT_S:g} s)")), reason
    assert {k: v for k, v in state.items() if k not in bombs} == {
        "note.md": ("completed", 0, None), "small.docx": ("completed", 0, None), "small.xlsx": ("completed", 0, None)}
    assert "quince" in chunk_text(store, src.name, "small.xlsx")
    assert {d.source_id for d in report.documents if d.became_permanent} == set(bombs)

    # terminal: the next sync (retry_backoff_s=0 would retry a transient failure at once) does not try again
    assert sorted(extracted) == sorted([*bombs, "note.md", "small.docx", "small.xlsx"])
    report = sync_source(src, store, embedder, settings)
    assert {by_id(report)[name] for name in bombs} == {("skipped-unchanged", "permanently_failed")}
    assert len(extracted) == 5
    assert rows(store, src.name, *bombs) == {name: state[name] for name in bombs}


# --- the spreadsheet reader sizes tables from the cells that exist ------------------------------


def test_xlsx_grid_follows_the_cells_not_the_declared_dimension():
    import openpyxl

    from rag_pipeline.extraction.office import _sheet_grid

    data = xlsx_declaring("A1:XFD1048576")
    wb = openpyxl.load_workbook(io.BytesIO(data))
    wb_values = openpyxl.load_workbook(io.BytesIO(data), data_only=True)
    started = time.perf_counter()
    grid = _sheet_grid(wb["Data"], wb_values["Data"])
    assert time.perf_counter() - started < 0.5
    assert grid == [["fruit", "crates"], ["quince", "3"], ["medlar", "5"]]


def test_huge_declared_dimension_and_a_formatted_far_cell_complete(database_url, store, embedder, tmp_path):
    # limits the old reader could not meet on the formatted far cell (it allocated 2^20 x 2^14 cells)
    settings = Settings(database_url=database_url, retry_backoff_s=0, extraction_memory_mb=512,
                        extraction_timeout_s=20)
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "declared.xlsx").write_bytes(xlsx_declaring("A1:XFD1048576"))
    (folder / "far-cell.xlsx").write_bytes(_xlsx(FRUIT, formatted_corner=True))
    (folder / "note.md").write_text(NOTE)
    src = LocalFolderSource(folder)

    started = time.monotonic()
    report = sync_source(src, store, embedder, settings)
    assert time.monotonic() - started < 30
    assert rows(store, src.name, "declared.xlsx", "far-cell.xlsx", "note.md") == {
        sid: ("completed", 0, None) for sid in ("declared.xlsx", "far-cell.xlsx", "note.md")}
    for sid in ("declared.xlsx", "far-cell.xlsx"):
        text = chunk_text(store, src.name, sid)
        assert all(word in text for word in ("fruit", "crates", "quince", "3", "medlar", "5")), text
    assert report.exit_code == 0
