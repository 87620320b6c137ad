"""Extraction: document bytes -> cleaned Markdown plus a quality record (``Extraction``).

``extract(data, filename=..., declared_mime=..., settings=...)`` detects the real type from magic
bytes, runs the format's extractor in an isolated worker process under the time and memory limits
of ``settings`` and returns an ``Extraction``; failures raise ``ExtractionError`` subclasses (see
``types``). ``extract_in_process`` does the same work in the calling process (debugging, and the
worker itself).

Formats: PDF (PDFium text with reading-order/table logic; OCR of image pages with Tesseract through
``unstructured``), DOCX, PPTX, XLSX (python-docx / python-pptx / openpyxl), legacy DOC/PPT/XLS
(converted with LibreOffice), CSV, HTML (``unstructured``), Markdown, plain text, e-mail.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ..config import Settings
from .core import extract_in_process
from .types import (
    PAGE_MARKER,
    EmptyDocumentError,
    Extraction,
    ExtractionError,
    ExtractionLimitError,
    MissingDependencyError,
    NoTextError,
    PasswordProtectedError,
    TypeMismatchError,
    UnsupportedFormatError,
)

__all__ = [
    "PAGE_MARKER",
    "EmptyDocumentError",
    "Extraction",
    "ExtractionError",
    "ExtractionLimitError",
    "MissingDependencyError",
    "NoTextError",
    "PasswordProtectedError",
    "TypeMismatchError",
    "UnsupportedFormatError",
    "extract",
    "extract_in_process",
]


def extract(
    data: bytes | os.PathLike[str],
    *,
    filename: str,
    declared_mime: str | None = None,
    settings: Settings | None = None,
    progress: Callable[[int, int], None] | None = None,
    isolated: bool = True,
) -> Extraction:
    """Extract one document's text as Markdown.

    ``data``: the file's bytes, or the path of a file holding them (the worker reads it itself, so the
    caller never holds a large document in memory; the pipeline passes its spool file). ``filename``: its name (the extension is the claimed type).
    ``declared_mime``: the MIME type the source reported, if any. ``settings``: limits
    (``extraction_timeout_s`` seconds, ``extraction_memory_mb`` MiB) and ``ocr_languages``; default
    ``Settings()``. ``progress(done_pages, total_pages)``: called as long PDFs advance.
    ``isolated=False`` runs in this process without limits.

    Returns an ``Extraction`` (Markdown per the chunker contract: ``#`` headings, blank-line
    paragraphs, pipe tables, ``PAGE_MARKER`` lines, NFKC-normalised, no control characters).

    Raises: ``EmptyDocumentError`` (0 bytes), ``TypeMismatchError`` (content is not what the name
    claims), ``PasswordProtectedError``, ``UnsupportedFormatError``, ``NoTextError`` (nothing
    extractable), ``MissingDependencyError`` (no Tesseract / LibreOffice), ``ExtractionLimitError``
    (time or memory limit; the reason names it), ``ExtractionError`` (a parser failed).
    """
    settings = settings or Settings()
    if not isolated:
        if not isinstance(data, (bytes, bytearray)):
            data = Path(data).read_bytes()
        return extract_in_process(data, filename=filename, declared_mime=declared_mime, settings=settings, progress=progress)
    from .worker import default_pool

    return default_pool().run(data, filename, declared_mime, settings, progress)
