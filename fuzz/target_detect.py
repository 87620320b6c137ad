"""Target: content type detection (``rag_pipeline/extraction/detect.py``).

Properties: on any bytes, name and declared MIME type, ``detect`` returns a ``Detected`` whose
``doc_type`` is a key of ``MIME_TYPES`` with the matching ``mime_type`` and a ``claimed`` that is ``None`` or
a key of ``MIME_TYPES``, or raises one of the documented errors (``EmptyDocumentError`` exactly for 0
bytes, ``TypeMismatchError``, ``PasswordProtectedError``, ``UnsupportedFormatError``); ``sniff`` returns a
doc type, ``json``/``text``/``zip``/``ole`` or ``binary:<mime>``; the answer is deterministic; a
claimed binary type is only ever accepted for content of its family.
"""

from __future__ import annotations

import io
import zipfile

from hypothesis import given
from hypothesis import strategies as st

from fuzz.common import Target, counted, guard, short
from rag_pipeline.extraction import detect as d
from rag_pipeline.extraction.types import (
    EmptyDocumentError,
    PasswordProtectedError,
    TypeMismatchError,
    UnsupportedFormatError,
)

DOCUMENTED = (EmptyDocumentError, TypeMismatchError, PasswordProtectedError, UnsupportedFormatError)
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
CHARSETS = ["utf-8", "latin-1", "shift_jis", "utf-16", "utf-7", "idna", "punycode", "undefined", "rot13", "hex", "base64",
            "zlib", "unicode_escape", "raw_unicode_escape", "uu", "bz2", "mbcs", "cp65001", "x-unknown", "koi8-r"]


def _zip(names: list[str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in names:
            zf.writestr(name or "x", b"<x/>")
    return buf.getvalue()


def _ole(streams: list[str]) -> bytes:
    return OLE_MAGIC + b"\x00" * 504  # a header only: olefile must refuse it cleanly


prefixes = st.sampled_from([b"", b"%PDF-1.7\n", b"PK\x03\x04", OLE_MAGIC, b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff",
                            b"\xff\xfe\x00\x00", b"{", b"[", b"[" * 5000, b"{\"a\":" * 3000, b"<!DOCTYPE html>", b"<html>",
                            b"<table>", b"From: a@b\nTo: c@d\nSubject: x\n\n", b"Received: x\nDate: y\n\n", b"\x00",
                            b"\x1b[0m", b"\x89PNG\r\n\x1a\n", b"GIF89a", b"\x1f\x8b"])
bodies = st.one_of(st.binary(max_size=300), st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass")),
                   st.lists(st.sampled_from(["word", "a", "b", "c"]), max_size=5).map(_zip),
                   st.sampled_from(["word/document.xml", "ppt/presentation.xml", "xl/workbook.xml", "mimetype",
                                    "../x", "ü.xml", ""]).map(lambda n: _zip([n])),
                   st.lists(st.text(max_size=5)).map(_ole),
                   st.sampled_from(CHARSETS).map(lambda c: f'<meta charset="{c}">'.encode() + b"\xff\xfe\xfd caf\xe9"),
                   st.integers(0, 200_000).map(lambda n: b"[" * n))
datas = st.builds(lambda p, b, cut: (p + b)[: cut if cut else None], prefixes, bodies, st.integers(0, 400))
names = st.one_of(st.sampled_from(["a.pdf", "a.docx", "a.doc", "a.xlsx", "a.xls", "a.pptx", "a.ppt", "a.csv", "a.tsv",
                                   "a.html", "a.md", "a.txt", "a.json", "a.eml", "a", ".pdf", "a.PDF", "a.tar.gz",
                                   "C:\\x\\a.docx", "a.pdf/", "\x00.pdf", "a.\ud800"]), st.text(max_size=20))
mimes = st.one_of(st.none(), st.sampled_from(list(d.MIME_TYPES.values()) + ["text/html; charset=utf-8", "APPLICATION/PDF",
                                                                           "", ";", "application/octet-stream"]),
                  st.text(max_size=20))
KINDS = set(d.MIME_TYPES) | {"json", "text", "zip", "ole"}


@given(datas, names, mimes)
@counted
def test(data: bytes, filename: str, mime: str | None) -> None:
    with guard(lambda: short((data[:200], filename, mime))):
        try:
            kind = d.sniff(data)
        except (PasswordProtectedError, UnsupportedFormatError):  # encrypted OOXML; a corrupt ZIP/OLE container
            kind = None
        assert kind is None or kind in KINDS or kind.startswith("binary:"), f"sniff gave {kind!r}"
        try:
            found = d.detect(data, filename, mime)
        except DOCUMENTED as exc:
            assert isinstance(exc, EmptyDocumentError) == (not data), f"{type(exc).__name__} for {len(data)} bytes"
            assert isinstance(exc.reason, str) and exc.reason
            return
        assert data, "0 bytes accepted"
        assert found.doc_type in d.MIME_TYPES and found.mime_type == d.MIME_TYPES[found.doc_type], found
        assert found.claimed is None or found.claimed in d.MIME_TYPES, found
        if found.claimed in d.BINARY_TYPES:
            families = ({"doc", "docx"}, {"ppt", "pptx"}, {"xls", "xlsx"}, {"pdf"})
            assert any({found.claimed, found.doc_type} <= f for f in families), found
        assert d.detect(data, filename, mime) == found, "not deterministic"


TARGET = Target("detect", test, "extraction/detect.py: documented types or documented errors on any bytes")
