"""Extraction result and errors: the contract between extraction and the rest of the pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PAGE_MARKER = "<!-- page {n} -->"
"""Written on a line of its own before each page's content (1-based). The chunker reads it."""


class ExtractionError(Exception):
    """Extraction failed. ``reason`` is a short stable text stored in ``documents.last_error``.

    ``terminal=True``: a deterministic failure on this content (password, wrong type, unsupported,
    empty, no text, a size/time/memory/page limit exceeded, a crash of the parser): the document
    becomes ``permanently_failed`` at once and is retried only when its content changes or an operator
    runs ``rag-pipeline retry``. ``terminal=False``: counted against ``max_failures`` and retried on a
    later sync.
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
    """A resource limit was exceeded on this content: the worker's time limit
    (``RAG_EXTRACTION_TIMEOUT_S``), its memory limit (``RAG_EXTRACTION_MEMORY_MB``; also a worker
    killed by SIGKILL, the OOM killer's signal, or a ``MemoryError`` inside it), OCR pages that cannot
    fit the time limit. The reason names the limit.

    Terminal: the same bytes under the same limits exceed them again, so retrying three times only
    triples the cost (and a zip bomb would be unpacked three times). The document is tried again when
    its content changes, or after ``rag-pipeline retry`` (e.g. once the limit was raised)."""

    terminal = True


class DocumentTooLargeError(ExtractionLimitError):
    """The document is larger than ``RAG_MAX_DOCUMENT_MB`` (``Settings.max_document_mb``): refused
    before it is read when the listing reports its size, else right after the fetch. The reason
    gives the size and the cap."""

    terminal = True


class ExtractionCrashError(ExtractionError):
    """The worker process died on this document from a fatal signal of its own (SIGSEGV, SIGBUS,
    SIGABRT, SIGILL, SIGFPE: a parser or native library crashing on these bytes). Terminal: a crash on
    the same bytes repeats. A worker that ends any other way (an exit code, SIGTERM/SIGINT from a
    shutdown) stays a plain, transient ``ExtractionError``."""

    terminal = True


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
