"""Extraction result and errors: the contract between extraction and the rest of the pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PAGE_MARKER = "<!-- page {n} -->"
"""Written on a line of its own before each page's content (1-based). The chunker reads it."""


class ExtractionError(Exception):
    """Extraction failed. ``reason`` is a short stable text stored in ``documents.last_error``.

    ``terminal=True``: a deterministic content error (password, wrong type, unsupported, empty,
    no text): the document becomes ``permanently_failed`` at once and is retried only when its
    content changes. ``terminal=False``: counted against ``max_failures`` and retried on a later sync.
    """

    terminal: bool = False
    skip: bool = False
    """``True``: there is nothing to index (empty, no text): the document ends ``skipped``, not failed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PasswordProtectedError(ExtractionError):
    """The document needs a password to open (PDF user password, encrypted OOXML)."""

    terminal = True


class TypeMismatchError(ExtractionError):
    """The content's magic bytes do not match its claimed type (e.g. JSON saved as ``.pdf``)."""

    terminal = True


class UnsupportedFormatError(ExtractionError):
    """No extractor handles this content type."""

    terminal = True


class EmptyDocumentError(ExtractionError):
    """The file has 0 bytes (reason ``"empty"``): ``skipped``."""

    terminal = True
    skip = True


class NoTextError(ExtractionError):
    """A non-empty file yielded no text (never a completed document with 0 chunks): ``skipped``."""

    terminal = True
    skip = True


class MissingDependencyError(ExtractionError):
    """A needed external tool is absent (no OCR engine, no LibreOffice): ``failed``, not terminal,
    so installing the tool and re-syncing fixes it."""

    terminal = False


class ExtractionLimitError(ExtractionError):
    """The worker exceeded the time or memory limit; the reason names the limit."""

    terminal = False


@dataclass(frozen=True)
class Extraction:
    """One document's extracted content.

    ``markdown``: cleaned, NFKC-normalised Markdown (headings, lists, pipe tables, fenced code),
    with ``PAGE_MARKER`` lines where the format has pages; never empty.
    ``mime_type`` / ``doc_type``: detected from content (``doc_type`` one of pdf, docx, pptx, xlsx,
    csv, html, md, txt, eml, doc, ppt). ``page_count``: pages (PDF), slides (PPTX), sheets (XLSX) or
    ``None``. ``char_count``: characters of ``markdown``. ``stats``: JSON-safe quality record
    (``chars_per_page``, ``element_counts``, ``ocr_pages``, ``removed_control_chars``, ``tables``,
    ``low_quality``, ``low_quality_reason``, ``duration_s``, ...).
    ``children``: attachments to ingest as child documents, as ``(filename, bytes)`` pairs.
    """

    markdown: str
    mime_type: str
    doc_type: str
    page_count: int | None
    char_count: int
    stats: dict[str, Any] = field(default_factory=dict)
    children: list[tuple[str, bytes]] = field(default_factory=list)
