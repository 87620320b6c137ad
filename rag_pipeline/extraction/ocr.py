"""OCR with Tesseract through ``unstructured`` (``partition_image(strategy="ocr_only")``).

Pages are rendered by the caller (pypdfium2) and passed as PIL images. Languages come from
``Settings.ocr_languages`` in Tesseract's ``+`` form (``"eng+jpn"``).
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from functools import lru_cache
from typing import Any

from .types import MissingDependencyError


def tesseract_path() -> str | None:
    """Path of the ``tesseract`` executable found on ``PATH`` (as ``unstructured`` will run it), or
    ``None``."""
    try:
        import unstructured_pytesseract.pytesseract as upt

        cmd = upt.tesseract_cmd or "tesseract"
    except ImportError:  # pragma: no cover - installed with unstructured
        cmd = "tesseract"
    return shutil.which(cmd)


@lru_cache(maxsize=8)
def _installed_languages(path: str) -> frozenset[str]:
    try:
        out = subprocess.run([path, "--list-langs"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    lines = (out.stdout or "").splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("List of"))


def check_ocr(languages: str) -> list[str]:
    """Check that Tesseract and the language data for ``languages`` (``"eng+jpn"``) are installed.

    Returns the language codes as a list. Raises ``MissingDependencyError`` whose reason says that
    no OCR engine is installed, or which language data is missing."""
    path = tesseract_path()
    if path is None:
        raise MissingDependencyError(
            "OCR engine missing: tesseract is not installed (needed for scanned/image-only PDF pages)"
        )
    wanted = [code.strip() for code in languages.replace(",", "+").split("+") if code.strip()] or ["eng"]
    installed = _installed_languages(path)
    missing = [code for code in wanted if installed and code not in installed]
    if missing:
        raise MissingDependencyError(
            f"OCR language data missing: tesseract has no {'+'.join(missing)} (installed: {', '.join(sorted(installed))})"
        )
    return wanted


def ocr_image(image: Any, languages: list[str]) -> tuple[str, int]:
    """OCR one page image (PIL) and return ``(markdown, element_count)``: paragraphs/titles/tables
    as ``unstructured`` classifies them, rendered with ``elements_to_markdown``."""
    from .markdown import elements_to_markdown, setup_unstructured

    setup_unstructured()
    from unstructured.partition.image import partition_image

    buf = io.BytesIO()
    image.save(buf, format="PNG")
    buf.seek(0)
    elements = partition_image(file=buf, strategy="ocr_only", languages=languages)
    markdown, counts, _tables = elements_to_markdown(elements)
    return rejoin_hyphenated(markdown), sum(counts.values())


_SPLIT_WORD_RE = re.compile(r"\b([^\W\d_]{2,})- ([a-z][^\W\d_]*)")


def rejoin_hyphenated(text: str) -> str:
    """Join words that OCR output split at a line end ("mem- bership" -> "membership") when the
    joined word is a known word; otherwise leave the text as it is."""
    from .quality import is_known_word

    def repl(match: re.Match[str]) -> str:
        joined = match.group(1) + match.group(2)
        return joined if is_known_word(joined) else match.group(0)

    return _SPLIT_WORD_RE.sub(repl, text)
