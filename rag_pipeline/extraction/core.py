"""In-process extraction: detect the type, run the format's extractor, clean up, measure quality.

``extract_in_process`` is what the isolated worker runs; call it directly for debugging. It raises
only ``ExtractionError`` subclasses: anything else a parser throws is wrapped with its type and
message (not terminal, so a transient fault is retried).
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from typing import Any

from ..config import Settings
from .clean import clean_markdown
from .detect import detect
from .draft import Draft
from .quality import text_layer_quality
from .types import PAGE_MARKER, Extraction, ExtractionError, NoTextError, UnsupportedFormatError

ProgressFn = Callable[[int, int], None]

OCR_TIME_SHARE = 0.85
"""OCR of a PDF's pages stops once this share of ``extraction_timeout_s`` has passed."""
LOW_CHARS_PER_PAGE_FACTOR = 0.1
"""A paged document whose median characters per page is below this share of the type's typical
value is flagged ``low_quality``."""
TYPICAL_CHARS_PER_PAGE = {"pdf": 2000, "pptx": 300}
LOW_WORD_QUALITY = 0.6
"""Share of known words below which Latin-script text is flagged ``low_quality`` (garbled text)."""

_MARKER_RE = re.compile(r"^<!-- page \d+ -->$", re.MULTILINE)
_FENCED_RE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _run_format(doc_type: str, data: bytes, filename: str, settings: Settings, progress: ProgressFn | None) -> Draft:
    if doc_type == "pdf":
        from .pdf import extract_pdf

        # OCR stops at 85% of the time limit so the worker is not killed with the work done so far
        deadline = time.monotonic() + OCR_TIME_SHARE * float(settings.extraction_timeout_s)
        return extract_pdf(
            data,
            ocr_languages=settings.ocr_languages,
            progress=progress,
            deadline=deadline,
            time_limit_s=float(settings.extraction_timeout_s),
            max_pages=settings.max_pdf_pages,
        )
    if doc_type in ("docx", "pptx", "xlsx", "doc", "ppt", "xls"):
        from . import office

        if doc_type in ("doc", "ppt", "xls"):
            converted = office.convert_legacy(data, doc_type, timeout_s=settings.extraction_timeout_s)
            draft = _run_format({"doc": "docx", "ppt": "pptx", "xls": "xlsx"}[doc_type], converted, filename, settings, progress)
            draft.stats["converted_with"] = "libreoffice"
            return draft
        return {"docx": office.extract_docx, "pptx": office.extract_pptx, "xlsx": office.extract_xlsx}[doc_type](data)
    from . import text_formats

    if doc_type == "txt":
        return text_formats.extract_txt(data)
    if doc_type == "md":
        return text_formats.extract_md(data)
    if doc_type == "csv":
        return text_formats.extract_csv(data, filename)
    if doc_type == "html":
        return text_formats.extract_html(data)
    if doc_type == "eml":
        return text_formats.extract_eml(data)
    raise UnsupportedFormatError(f"unsupported format: {doc_type}")


def _body_text(markdown: str) -> str:
    return _MARKER_RE.sub("", markdown).strip()


def extract_in_process(
    data: bytes,
    *,
    filename: str,
    declared_mime: str | None = None,
    settings: Settings | None = None,
    progress: ProgressFn | None = None,
) -> Extraction:
    """Extract ``data`` in this process (no time/memory limit). See ``rag_pipeline.extraction.extract``
    for the contract; ``progress(done_pages, total_pages)`` is called for long PDFs."""
    settings = settings or Settings()
    started = time.perf_counter()
    detected = detect(data, filename, declared_mime)
    try:
        draft = _run_format(detected.doc_type, data, filename, settings, progress)
    except ExtractionError:
        raise
    except MemoryError:
        raise
    except RecursionError as exc:
        raise ExtractionError(f"{detected.doc_type} parser failed: recursion too deep (malformed document)") from exc
    except Exception as exc:  # noqa: BLE001 - any parser fault becomes a stable, non-terminal reason
        raise ExtractionError(f"{detected.doc_type} parser failed: {type(exc).__name__}: {exc}"[:500]) from exc
    return finalize(draft, detected.doc_type, detected.mime_type, started)


def finalize(draft: Draft, doc_type: str, mime_type: str, started: float | None = None) -> Extraction:
    """Clean ``draft``'s Markdown, compute the quality record and build the ``Extraction``.

    Raises ``NoTextError`` when no text is left (a non-empty file never completes with nothing)."""
    markdown, removed = clean_markdown(draft.markdown)
    body = _body_text(markdown)
    if not body:
        raise NoTextError(f"no text: the {doc_type} file yielded no text")
    stats: dict[str, Any] = dict(draft.stats)
    stats["removed_control_chars"] = draft.removed_control_chars + removed
    stats.setdefault("ocr_pages", [])
    stats.setdefault("tables", 0)
    stats.setdefault("element_counts", {})
    stats["pages"] = draft.page_count
    if draft.page_count and "chars_per_page" not in stats:
        if PAGE_MARKER.format(n=1) in markdown:
            pieces = _MARKER_RE.split(markdown)[1:]
            stats["chars_per_page"] = [len(p.strip()) for p in pieces]
    stats.setdefault("chars_per_page", [])
    stats.setdefault("pdf_class", None)
    reasons: list[str] = []
    hint = stats.pop("low_quality_hint", None)
    if hint:
        reasons.append(hint)
    typical = TYPICAL_CHARS_PER_PAGE.get(doc_type)
    cpp = stats["chars_per_page"]
    if typical and cpp and len(cpp) >= 2:
        median = statistics.median(cpp)
        if median < LOW_CHARS_PER_PAGE_FACTOR * typical:
            reasons.append(f"{median:.0f} characters per page, far below the {doc_type} median of ~{typical}")
    word_quality = text_layer_quality(_FENCED_RE.sub("", body))
    stats["word_quality"] = None if word_quality is None else round(word_quality, 3)
    if word_quality is not None and word_quality < LOW_WORD_QUALITY:
        reasons.append(f"high share of non-words ({1 - word_quality:.0%} of words unknown or garbled)")
    stats["low_quality"] = bool(reasons)
    stats["low_quality_reason"] = "; ".join(reasons) if reasons else None
    if started is not None:
        stats["duration_s"] = round(time.perf_counter() - started, 3)
    return Extraction(
        markdown=markdown,
        mime_type=mime_type,
        doc_type=doc_type,
        page_count=draft.page_count,
        char_count=len(markdown),
        stats=stats,
        children=list(draft.children),
    )
