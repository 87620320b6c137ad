"""Content type detection from magic bytes, checked against the type a file claims (name, MIME).

``detect(data, filename, declared_mime)`` returns a ``Detected`` or raises ``EmptyDocumentError``,
``TypeMismatchError``, ``PasswordProtectedError`` (encrypted OOXML) or ``UnsupportedFormatError``.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import PurePosixPath

from .types import EmptyDocumentError, PasswordProtectedError, TypeMismatchError, UnsupportedFormatError

MIME_TYPES: dict[str, str] = {
    "pdf": "application/pdf",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "csv": "text/csv",
    "html": "text/html",
    "md": "text/markdown",
    "txt": "text/plain",
    "eml": "message/rfc822",
    "doc": "application/msword",
    "ppt": "application/vnd.ms-powerpoint",
    "xls": "application/vnd.ms-excel",
}
"""doc_type -> canonical MIME type."""

_EXTENSIONS: dict[str, str] = {
    ".pdf": "pdf",
    ".docx": "docx",
    ".docm": "docx",
    ".pptx": "pptx",
    ".pptm": "pptx",
    ".xlsx": "xlsx",
    ".xlsm": "xlsx",
    ".csv": "csv",
    ".tsv": "csv",
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
    ".md": "md",
    ".markdown": "md",
    ".txt": "txt",
    ".text": "txt",
    ".log": "txt",
    ".json": "txt",
    ".eml": "eml",
    ".doc": "doc",
    ".ppt": "ppt",
    ".xls": "xls",
}

_MIME_TO_TYPE: dict[str, str] = {v: k for k, v in MIME_TYPES.items()}
_MIME_TO_TYPE.update(
    {
        "application/x-pdf": "pdf",
        "text/x-markdown": "md",
        "application/xhtml+xml": "html",
        "text/tab-separated-values": "csv",
        "application/json": "txt",
        "application/vnd.ms-excel.sheet.macroenabled.12": "xlsx",
        "application/vnd.ms-word.document.macroenabled.12": "docx",
    }
)

BINARY_TYPES = frozenset({"pdf", "docx", "pptx", "xlsx", "doc", "ppt", "xls"})
TEXT_TYPES = frozenset({"csv", "html", "md", "txt", "eml"})

_DESCRIPTION = {
    "pdf": "PDF",
    "docx": "Word (DOCX)",
    "pptx": "PowerPoint (PPTX)",
    "xlsx": "Excel (XLSX)",
    "doc": "legacy Word (DOC)",
    "ppt": "legacy PowerPoint (PPT)",
    "xls": "legacy Excel (XLS)",
    "csv": "CSV text",
    "html": "HTML",
    "md": "Markdown",
    "txt": "plain text",
    "eml": "e-mail (RFC 822)",
    "json": "JSON text",
    "text": "text",
}


@dataclass(frozen=True)
class Detected:
    """Result of type detection: ``doc_type`` (a key of ``MIME_TYPES``), its ``mime_type``, and
    ``claimed`` (the type the name/declared MIME implied, or ``None``)."""

    doc_type: str
    mime_type: str
    claimed: str | None


def claimed_type(filename: str, declared_mime: str | None) -> str | None:
    """The doc_type implied by the file name's extension, else by the declared MIME type, else None."""
    ext = PurePosixPath(filename.replace("\\", "/")).suffix.lower()
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    if declared_mime:
        return _MIME_TO_TYPE.get(declared_mime.split(";")[0].strip().lower())
    return None


def _sniff_zip(data: bytes) -> str:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            names = set(zf.namelist())
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise UnsupportedFormatError(f"unsupported format: corrupt ZIP container ({exc})") from exc
    if "word/document.xml" in names:
        return "docx"
    if "ppt/presentation.xml" in names:
        return "pptx"
    if "xl/workbook.xml" in names:
        return "xlsx"
    return "zip"


def _sniff_ole(data: bytes) -> str:
    import olefile

    try:
        ole = olefile.OleFileIO(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - olefile raises plain OSError/struct errors
        raise UnsupportedFormatError(f"unsupported format: corrupt OLE container ({exc})") from exc
    try:
        streams = {"/".join(entry) for entry in ole.listdir(streams=True, storages=True)}
    finally:
        ole.close()
    if "EncryptedPackage" in streams or "EncryptionInfo" in streams:
        raise PasswordProtectedError("password protected (encrypted Office document)")
    if "WordDocument" in streams:
        return "doc"
    if "PowerPoint Document" in streams:
        return "ppt"
    if "Workbook" in streams or "Book" in streams:
        return "xls"
    return "ole"


_HTML_RE = re.compile(rb"<(!doctype\s+html|html|head|body|table|div|p)[\s>]", re.IGNORECASE)
_HEADER_LINE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]*:[ \t]?.*$")
_MAIL_HEADERS = {"from", "to", "subject", "date", "mime-version", "message-id", "received", "return-path"}


def _looks_like_mail(text: str) -> bool:
    head = text.lstrip()[:4000].split("\n\n", 1)[0].replace("\r", "")
    names = set()
    for line in head.split("\n"):
        if line[:1] in (" ", "\t"):
            continue
        if not _HEADER_LINE_RE.match(line):
            return False
        names.add(line.split(":", 1)[0].lower())
    return len(names & _MAIL_HEADERS) >= 2


def sniff(data: bytes) -> str:
    """Detect the content kind from bytes: a doc_type, or one of "json", "text", "zip", "ole",
    "binary:<mime>" for content no extractor handles. Raises ``PasswordProtectedError`` for an
    encrypted OOXML container."""
    if b"%PDF-" in data[:1024]:
        return "pdf"
    if data[:4] == b"PK\x03\x04":
        return _sniff_zip(data)
    if data[:8] == b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1":
        return _sniff_ole(data)
    from .text_formats import decode_text, looks_binary

    if looks_binary(data):
        import magic

        return "binary:" + magic.from_buffer(data[:65536], mime=True)
    text = decode_text(data).lstrip("\ufeff \t\r\n")
    if text[:1] in "{[":
        try:
            json.loads(text)
            return "json"
        except (ValueError, RecursionError):  # deeply nested brackets are not JSON we can use
            pass
    if _HTML_RE.search(data[:2048]) or _HTML_RE.search(text[:2048].encode("utf-8", "ignore")):
        return "html"
    if _looks_like_mail(text):
        return "eml"
    return "text"


def detect(data: bytes, filename: str, declared_mime: str | None = None) -> Detected:
    """Detect the type of ``data`` and check it against the claimed type.

    Rules: 0 bytes -> ``EmptyDocumentError("empty")``. A claimed binary type (pdf, docx, ...) must
    match the content (a ``.doc`` holding DOCX, and the like within one family, is accepted by
    content). A claimed text type accepts any text content (JSON is not HTML/e-mail though). No
    claim: the content decides. Content that no extractor handles -> ``UnsupportedFormatError``.
    A mismatch -> ``TypeMismatchError`` whose reason names both types.
    """
    if not data:
        raise EmptyDocumentError("empty")
    claimed = claimed_type(filename, declared_mime)
    kind = sniff(data)

    def mismatch() -> TypeMismatchError:
        got = _DESCRIPTION.get(kind, kind.removeprefix("binary:"))
        want = _DESCRIPTION.get(claimed or "", claimed or "?")
        return TypeMismatchError(
            f"type mismatch: {filename!r} claims {want} but its content is {got} (magic bytes)"
        )

    if kind in BINARY_TYPES:
        if claimed is None or claimed == kind:
            doc_type = kind
        elif {claimed, kind} in ({"doc", "docx"}, {"ppt", "pptx"}, {"xls", "xlsx"}):
            doc_type = kind
        else:
            raise mismatch()
    elif kind in ("json", "text", "html", "eml"):
        if claimed in BINARY_TYPES:
            raise mismatch()
        if claimed in ("html", "eml") and kind == "json":
            raise mismatch()
        if claimed is not None:
            doc_type = claimed
        else:
            doc_type = {"json": "txt", "text": "txt"}.get(kind, kind)
    else:
        if claimed is not None and claimed in BINARY_TYPES | TEXT_TYPES:
            raise mismatch()
        raise UnsupportedFormatError(f"unsupported format: {kind.removeprefix('binary:')} ({filename!r})")
    return Detected(doc_type=doc_type, mime_type=MIME_TYPES[doc_type], claimed=claimed)
