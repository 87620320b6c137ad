"""PDF: encryption check, routing (text / mixed / image-only), the text path, OCR of pages without a
text layer, page furniture removal and assembly into Markdown with page markers.

Text path: pypdfium2 (PDFium) text segments with their boxes, put into reading order by
``pdf_layout`` (columns, paragraphs, tables, rotated margin stamps dropped). Pages with almost no
text are rendered and OCR'd with Tesseract through ``unstructured`` (``ocr.py``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from . import pdf_layout
from .clean import find_page_furniture, is_furniture, is_page_number
from .draft import Draft
from .ocr import check_ocr, ocr_image
from .pdf_fonts import find_repairs
from .quality import text_layer_quality
from .types import PAGE_MARKER, ExtractionError, ExtractionLimitError, NoTextError, PasswordProtectedError

IMAGE_ONLY_CHARS = 300
"""Fewer than this many characters over the first three pages: the PDF is image-only (scanned)."""
PAGE_OCR_CHARS = 20
"""A page of a text PDF with fewer characters than this (and an image on it) is OCR'd on its own."""
OCR_DPI = 300
POOR_LAYER_QUALITY = 0.8
"""A page whose share of clean known words is below this, over a full-page image, has a poor OCR
text layer: it is re-OCR'd and the better text kept."""
MAX_OCR_PAGES = 200
"""More image pages than this in one document are not OCR'd (the rest is flagged low quality)."""
MAX_PDF_PAGES = 20_000
"""A PDF whose page tree declares more pages than this is refused before any page is read, with a
terminal ``ExtractionLimitError`` ("too many pages: N, over the cap of M pages"). A real text page
costs ~10-50 ms, so 20,000 pages already need more than the default time limit; a generated file can
declare a million (empty, shared) pages in 12 KB, which would otherwise be walked one by one until the
time limit kills the worker."""

UNLOADABLE_PAGE = "page cannot be loaded (broken page tree: too deep, cyclic or a missing object)"
"""The page error of a page PDFium cannot load (its own error, "Failed to load page.", says no more)."""

ProgressFn = Callable[[int, int], None]


def open_pdf(data: bytes) -> Any:
    """Open ``data`` with pypdfium2. An empty user password is tried (owner-restricted PDFs open).

    Raises ``PasswordProtectedError("password protected")`` when a user password is needed and
    ``ExtractionError`` for a file PDFium cannot parse at all."""
    import pypdfium2 as pdfium

    try:
        return pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        if "password" in str(exc).lower():
            raise PasswordProtectedError("password protected") from exc
        raise ExtractionError(f"corrupt PDF: {exc}") from exc


def _load_page(pdf: Any, index: int) -> Any:
    """Page ``index`` of ``pdf``, or ``None`` when PDFium cannot load it: a page tree deeper than its
    limit (1,024 levels), a cycle in it, a missing page object. Deterministic for the same bytes."""
    import pypdfium2 as pdfium

    try:
        return pdf[index]
    except pdfium.PdfiumError:
        return None


def _image_on(pdf: Any, index: int) -> bool:
    """Whether page ``index`` (one that loaded before) draws an image; the page is closed again."""
    page = _load_page(pdf, index)
    if page is None:
        return False
    try:
        return _page_has_image(page)
    finally:
        page.close()


def _page_has_image(page: Any) -> bool:
    import pypdfium2.raw as raw

    try:
        for obj in page.get_objects(max_depth=2):
            if obj.type == raw.FPDF_PAGEOBJ_IMAGE:
                return True
    except Exception:  # noqa: BLE001 - a broken object tree: assume there may be an image
        return True
    return False


def classify(chars_per_page: list[int], has_image: list[bool]) -> str:
    """Route a PDF: ``"image"`` (scanned) when the first three pages hold fewer than
    ``IMAGE_ONLY_CHARS`` characters in all and carry images, none of them being a page of text
    without an image (or hold no text at all); ``"mixed"`` when
    some pages have fewer than ``PAGE_OCR_CHARS`` characters and an image; else ``"text"``."""
    first = chars_per_page[:3]
    text_only_page = any(c >= PAGE_OCR_CHARS and not img for c, img in zip(first, has_image))
    if sum(first) < IMAGE_ONLY_CHARS and ((any(has_image[:3]) and not text_only_page) or sum(first) == 0):
        return "image"
    if any(c < PAGE_OCR_CHARS and img for c, img in zip(chars_per_page, has_image)):
        return "mixed"
    return "text"


def extract_pdf(
    data: bytes,
    *,
    ocr_languages: str = "eng+jpn",
    progress: ProgressFn | None = None,
    deadline: float | None = None,
    time_limit_s: float | None = None,
    max_pages: int = MAX_PDF_PAGES,
) -> Draft:
    """Extract a PDF to Markdown with one ``PAGE_MARKER`` per page.

    Routing: the PDF is ``text``, ``mixed`` or ``image`` (see ``classify``). Pages with almost no
    text that carry an image are rendered at ``OCR_DPI`` and OCR'd; so are pages whose text layer is
    garbage (a poor OCR layer, see ``quality.text_layer_quality``) when OCR gives better text.
    ``deadline`` (a ``time.monotonic()`` value): OCR stops before it, so a long scan completes with
    the pages done so far (flagged low quality) instead of being killed by the worker's limit;
    ``time_limit_s`` is the limit it derives from, named in the error when no page fits.
    A page PDFium cannot load (a page tree deeper than its limit, a cycle, a missing object) is a page
    error: the other pages are kept and the document is flagged low quality.
    Raises ``PasswordProtectedError``, ``MissingDependencyError`` (OCR needed but Tesseract or the
    language data is missing), ``NoTextError`` (also when the pages that could be read hold no text:
    "no text: malformed PDF: N of M page(s) cannot be loaded ..."), ``ExtractionLimitError`` (more than ``max_pages`` pages, see ``MAX_PDF_PAGES``; not a
    single page could be OCR'd in time).
    """
    pdf = open_pdf(data)
    try:
        return _extract(pdf, data, ocr_languages, progress, deadline, time_limit_s, max_pages)
    finally:
        pdf.close()


def _extract(
    pdf: Any,
    data: bytes,
    ocr_languages: str,
    progress: ProgressFn | None,
    deadline: float | None,
    time_limit_s: float | None,
    max_pages: int,
) -> Draft:
    n_pages = len(pdf)
    if n_pages == 0:
        raise NoTextError("no text: PDF has no pages")
    if n_pages > max_pages:  # before anything walks the page tree (pypdf's font scan included)
        raise ExtractionLimitError(f"too many pages: {n_pages:,}, over the cap of {max_pages:,} pages")
    # ToUnicode maps that contradict the font encoding ("ﬁinancial", "o↵"): repaired per character
    repairs = find_repairs(data)
    pages: list[pdf_layout.PageText] = []
    removed = 0
    unloadable: set[int] = set()
    for index in range(n_pages):
        page = _load_page(pdf, index)
        if page is None:
            unloadable.add(index)
            page_text = pdf_layout.PageText(blocks=[], lines_top=[], lines_bottom=[], error=UNLOADABLE_PAGE)
        else:
            try:
                page_text = pdf_layout.extract_page(page, repairs)
            except Exception as exc:  # noqa: BLE001 - one broken page must not lose the others
                page_text = pdf_layout.PageText(blocks=[], lines_top=[], lines_bottom=[], error=f"{type(exc).__name__}: {exc}")
            finally:
                page.close()
        removed += page_text.removed_control_chars
        pages.append(page_text)
        if progress is not None and (index % 25 == 24 or index == n_pages - 1):
            progress(index + 1, n_pages)

    chars = [p.char_count for p in pages]
    # image checks are cheap but not free: only pages with little text need them
    has_image = [c < IMAGE_ONLY_CHARS and i not in unloadable and _image_on(pdf, i) for i, c in enumerate(chars)]
    pdf_class = classify(chars, has_image)
    stats: dict[str, Any] = {"pdf_class": pdf_class, "page_errors": sum(1 for p in pages if p.error)}
    if repairs:
        stats["font_repairs"] = repairs.summary()
        stats["font_repaired_control_chars"] = sum(p.extra.get("repaired_control_chars", 0) for p in pages)

    # pages that need OCR: no (or almost no) text and an image on the page
    ocr_candidates = [
        i for i, p in enumerate(pages) if (pdf_class == "image" or p.char_count < PAGE_OCR_CHARS) and has_image[i]
    ]
    # a text layer that is garbage (poor OCR layer): candidates for re-OCR
    # (measured per page only when a sample of the whole text looks poor: it costs ~2 ms a page)
    sample = "\n".join(p.plain_text() for p in pages[:10])
    overall = text_layer_quality(sample)
    layer_quality: list[float | None] = [None] * n_pages
    if overall is not None and overall < POOR_LAYER_QUALITY:
        layer_quality = [text_layer_quality(p.plain_text()) if p.char_count >= PAGE_OCR_CHARS else None for p in pages]
    poor_layer = [
        i for i, q in enumerate(layer_quality) if q is not None and q < POOR_LAYER_QUALITY and _image_on(pdf, i)
    ]
    stats["poor_text_layer_pages"] = [i + 1 for i in poor_layer]

    ocr_pages: list[int] = []
    ocr_text: dict[int, str] = {}
    todo = ocr_candidates + [i for i in poor_layer if i not in ocr_candidates]
    skipped = 0
    if todo:
        languages = check_ocr(ocr_languages)
        slowest = 0.0
        for n, i in enumerate(todo):
            # stop before the worker's time limit would kill the whole document: keep what is done
            if n >= MAX_OCR_PAGES or (deadline is not None and time.monotonic() + max(slowest, 5.0) > deadline):
                skipped = len(todo) - n
                break
            t0 = time.monotonic()
            image = pdf[i].render(scale=OCR_DPI / 72).to_pil()
            markdown, _count = ocr_image(image, languages)
            slowest = max(slowest, time.monotonic() - t0)
            if i in poor_layer:
                new_quality = text_layer_quality(markdown)
                if new_quality is None or new_quality <= (layer_quality[i] or 0) + 0.05:
                    continue  # OCR is no better than the existing layer: keep the layer
            ocr_text[i] = markdown
            ocr_pages.append(i + 1)
    stats["ocr_pages_skipped"] = skipped
    stats["ocr_pages"] = ocr_pages

    # running headers/footers and page numbers
    furniture = find_page_furniture([p.lines_top + p.lines_bottom for p in pages])
    furniture_removed = 0
    parts: list[str] = []
    chars_per_page: list[int] = []
    for i, page_text in enumerate(pages):
        parts.append(PAGE_MARKER.format(n=i + 1))
        if i in ocr_text:
            body = ocr_text[i]
        else:
            blocks, dropped = _drop_furniture(page_text, furniture)
            furniture_removed += dropped
            body = "\n\n".join(blocks)
        chars_per_page.append(len(body))
        if body:
            parts.append(body)
    stats["furniture_lines_removed"] = furniture_removed
    stats["chars_per_page"] = chars_per_page
    stats["tables"] = sum(p.tables for i, p in enumerate(pages) if i not in ocr_text)
    stats["rotated_chars_dropped"] = sum(p.rotated_dropped for p in pages)
    stats["element_counts"] = {
        "blocks": sum(len(p.blocks) for p in pages),
        "ocr_pages": len(ocr_pages),
        "tables": stats["tables"],
    }
    if not any(chars_per_page):
        if skipped:
            limit = f" ({time_limit_s:g} s)" if time_limit_s else ""
            raise ExtractionLimitError(f"time limit exceeded{limit}: OCR of {len(todo)} page(s) does not fit")
        if unloadable:
            raise NoTextError(f"no text: malformed PDF: {len(unloadable):,} of {n_pages:,} page(s) cannot be loaded "
                              "(broken page tree: too deep, cyclic or a missing object)")
        if stats["page_errors"]:
            first = next(p.error for p in pages if p.error)
            raise NoTextError(f"no text: {stats['page_errors']:,} of {n_pages:,} page(s) could not be read ({first})"[:500])
        raise NoTextError("no text: image-only PDF and OCR found no text" if todo else "no text: PDF has no text")
    low_quality_reason = None
    if poor_layer:
        kept = [i + 1 for i in poor_layer if i not in ocr_text]
        redone = [i + 1 for i in poor_layer if i in ocr_text]
        low_quality_reason = "poor OCR text layer (garbled words)"
        if redone:
            low_quality_reason += f"; re-OCR'd pages {redone}"
        if kept:
            low_quality_reason += f"; kept the layer on pages {kept} (OCR was no better)"
    elif stats["page_errors"]:
        low_quality_reason = f"{stats['page_errors']} page(s) could not be read"
    elif skipped:
        low_quality_reason = f"{skipped} image page(s) not OCR'd (OCR page cap or time limit)"
    if low_quality_reason:
        stats["low_quality_hint"] = low_quality_reason
    if chars_per_page:
        stats["median_chars_per_page"] = statistics.median(chars_per_page)
    return Draft(markdown="\n\n".join(parts), page_count=n_pages, stats=stats, removed_control_chars=removed)


def _drop_furniture(page_text: pdf_layout.PageText, furniture: set[str]) -> tuple[list[str], int]:
    """Remove running headers/footers and page numbers from the page's first and last blocks."""
    blocks = list(page_text.blocks)
    dropped = 0
    edge_lines = set(page_text.lines_top) | set(page_text.lines_bottom)
    kept: list[str] = []
    for block in blocks:
        if block in edge_lines and (is_furniture(block, furniture) or is_page_number(block)):
            dropped += 1
            continue
        kept.append(block)
    return kept, dropped
