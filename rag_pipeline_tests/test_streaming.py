"""Fetched bytes stream to the extraction worker (issue "Hardening", part 3): the sync process never
holds a whole fetched file.

``pipeline.spool``: the source writes into a private spool file that hashes, counts and caps as the
pieces arrive; the worker reads that file itself. Shown here with the real local source, a real DOCX
carrying a 48 MiB member (Python's own allocations in the sync process stay far below it, measured with
``tracemalloc``), and a streaming source without sizes that is stopped at the piece that passes the cap.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tracemalloc
import zipfile

import pytest

from rag_pipeline.config import Settings
from rag_pipeline.extraction.types import DocumentTooLargeError
from rag_pipeline.pipeline.spool import MIB, Spool
from rag_pipeline.pipeline.sync import sync_source
from rag_pipeline.sources.base import FETCH_PIECE_BYTES, SourceDocument, SourceError, fetch_into
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline_tests.invariant_fakes import MemorySource, count_extractions

NOTE = "# Field notes\n\nThe heron waited at the weir for the morning tide and caught nothing at all.\n"


def _docx_with_a_big_member(text: str, member_bytes: int) -> bytes:
    """A real DOCX (python-docx) with one more zip member of ``member_bytes`` random, stored bytes: a big
    file whose extracted text is one sentence."""
    import docx

    d = docx.Document()
    d.add_paragraph(text)
    buffer = io.BytesIO()
    d.save(buffer)
    with zipfile.ZipFile(buffer, "a", compression=zipfile.ZIP_STORED) as z:
        z.writestr("word/media/blob.bin", os.urandom(member_bytes))
    return buffer.getvalue()


# --- the spool ----------------------------------------------------------------------------------


def test_the_spool_hashes_counts_and_removes_its_private_file():
    pieces = [b"a" * 1000, b"", b"\x00\xff" * 300]
    with Spool(cap_mb=1) as spool:
        for piece in pieces:
            spool.write(piece)
        path = spool.finish()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert path.read_bytes() == b"".join(pieces)
        assert spool.size == 1600 and spool.sha256 == hashlib.sha256(b"".join(pieces)).hexdigest()
    assert not path.exists()


def test_the_spool_refuses_the_piece_that_passes_the_cap_and_keeps_nothing_of_it():
    with Spool(cap_mb=1) as spool:
        spool.write(b"x" * MIB)  # exactly the cap: allowed
        with pytest.raises(DocumentTooLargeError) as info:
            spool.write(b"y" * (MIB // 2))
        assert info.value.reason == "too large: at least 1.5 MB, over the 1 MB cap (RAG_MAX_DOCUMENT_MB)"
        assert spool.size == MIB and spool.finish().stat().st_size == MIB
    with Spool(cap_mb=0) as spool:  # 0: no cap
        spool.write(b"z" * (2 * MIB))
        assert spool.size == 2 * MIB
    assert not spool.path.exists()


def test_the_local_source_writes_in_pieces(tmp_path):
    data = os.urandom(3 * FETCH_PIECE_BYTES + 17)
    (tmp_path / "a.bin").write_bytes(data)
    src = LocalFolderSource(tmp_path)
    doc = next(d for d in src.list_documents().documents if d.source_id == "a.bin")

    class Recorder(io.RawIOBase):
        def __init__(self):
            self.sizes: list[int] = []
            self.buffer = bytearray()

        def write(self, piece):
            self.sizes.append(len(piece))
            self.buffer += piece
            return len(piece)

    out = Recorder()
    fetch_into(src, doc, out)
    assert bytes(out.buffer) == data and src.fetch(doc) == data
    assert len(out.sizes) == 4 and max(out.sizes) <= FETCH_PIECE_BYTES


# --- through a sync ----------------------------------------------------------------------------


def test_a_big_file_never_sits_in_the_sync_process(settings, store, embedder, tmp_path, monkeypatch):
    member = 48 * MIB
    folder = tmp_path / "docs"
    folder.mkdir()
    big = _docx_with_a_big_member("The lighthouse keeper logged every passing ship by lamplight.", member)
    (folder / "big.docx").write_bytes(big)
    (folder / "note.md").write_text(NOTE)
    handed: list[type] = []
    import rag_pipeline.extraction as extraction

    real = extraction.extract
    monkeypatch.setattr(extraction, "extract", lambda data, **kw: handed.append(type(data)) or real(data, **kw))
    src = LocalFolderSource(folder)
    sync_source(src, store, embedder, settings)  # warm: model, worker, imports (their allocations are not the file)

    (folder / "big.docx").write_bytes(_docx_with_a_big_member("The keeper's log ended in the winter of 1911.", member))
    handed.clear()
    tracemalloc.start()
    try:
        report = sync_source(src, store, embedder, settings)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    outcome = {d.source_id: d for d in report.documents}["big.docx"]
    assert outcome.status == "completed" and outcome.action.value in ("updated", "added"), outcome
    with store.connect() as conn:
        text = " ".join(r[0] for r in conn.execute(
            "SELECT c.text FROM chunks c JOIN documents d ON d.id = c.document_id AND d.version = c.version "
            "WHERE d.source_id = 'big.docx'"))
    assert "winter of 1911" in text
    # the worker was handed the spool file, not bytes; this process allocated far less than the file
    assert handed and all(not issubclass(t, (bytes, bytearray)) for t in handed), handed
    assert peak < member / 4, f"peak Python allocation {peak / MIB:.1f} MiB for a {member / MIB:.0f} MiB file"


class StreamingUnsized(MemorySource):
    """A ``MemorySource`` that lists no sizes and streams in ``FETCH_PIECE_BYTES`` pieces, counting the
    pieces it produced (so the test sees where reading stopped)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.pieces: dict[str, int] = {}

    def _listed(self, d) -> SourceDocument:
        return super()._listed(d).replace(size=None)

    def fetch_to(self, document, out):
        data = self.fetch(document)
        for start in range(0, len(data), FETCH_PIECE_BYTES):
            self.pieces[document.source_id] = self.pieces.get(document.source_id, 0) + 1
            out.write(data[start:start + FETCH_PIECE_BYTES])


def test_a_stream_past_the_cap_stops_at_that_piece(database_url, store, embedder):
    settings = Settings(database_url=database_url, retry_backoff_s=0, max_document_mb=2)
    src = StreamingUnsized()
    src.put("big", b"word " * (1024 * 1024), title="big.md")  # 5 MiB in 5 pieces
    src.put("note", NOTE.encode(), title="note.md")
    report = sync_source(src, store, embedder, settings)
    outcomes = {d.source_id: d for d in report.documents}
    reason = "too large: at least 3.0 MB, over the 2 MB cap (RAG_MAX_DOCUMENT_MB)"
    assert (outcomes["big"].status, outcomes["big"].reason) == ("permanently_failed", reason)
    assert outcomes["note"].status == "completed"
    assert src.pieces["big"] == 3  # the third piece passed the cap: the other two were never asked for


def test_a_source_error_mid_stream_is_transient_and_leaves_no_spool_file(database_url, store, embedder, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    settings = Settings(database_url=database_url, retry_backoff_s=0)

    class Breaks(StreamingUnsized):
        def fetch_to(self, document, out):
            out.write(b"# Half\n\nthe first piece arrived")
            raise SourceError("connection reset mid-body", transient=True)

    src = Breaks()
    src.put("half", b"unused", title="half.md")
    extracted = count_extractions(monkeypatch)
    report = sync_source(src, store, embedder, settings)
    (outcome,) = report.documents
    assert (outcome.status, outcome.reason, outcome.transient) == ("failed", "connection reset mid-body", True)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("rag-pipeline-spool-")] == []
    assert extracted == []  # half a file is never extracted
