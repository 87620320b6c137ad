"""Word-level quality measures: is a token a known word, how much of a text layer is garbage.

Known words come from ``wordfreq`` (bundled frequency lists, no downloads); English is checked
first, then a few other Latin-script languages so that German/French/Spanish text is not taken for
OCR garbage.
"""

from __future__ import annotations

import re
from functools import lru_cache

_LANGS = ("en", "de", "fr", "es", "it", "nl", "pt", "sv")
_TOKEN_RE = re.compile(r"\S+")
_LATIN_WORD_RE = re.compile(r"^[A-Za-zÀ-ɏ]+(?:['’][A-Za-zÀ-ɏ]+)?$")
_STRIP = "\"'“”‘’()[]{}<>.,;:!?*«»"


@lru_cache(maxsize=200_000)
def word_frequency(word: str) -> float:
    """Highest Zipf frequency (0 = unknown, ~7 = "the") of ``word`` over the checked languages."""
    from wordfreq import zipf_frequency

    best = 0.0
    for lang in _LANGS:
        best = max(best, zipf_frequency(word, lang))
        if best >= 3.0:
            break
    return best


def is_known_word(word: str) -> bool | None:
    """True/False whether ``word`` is a known word; ``None`` when the word is not Latin-script
    letters (no verdict)."""
    if not _LATIN_WORD_RE.match(word):
        return None
    return word_frequency(word.lower()) > 0.0


def _sample(text: str, max_chars: int) -> str:
    """Up to ``max_chars`` of ``text``: the whole text, or 8 evenly spaced slices of it."""
    if len(text) <= max_chars:
        return text
    step = len(text) // 8
    width = max_chars // 8
    return " ".join(text[i * step : i * step + width] for i in range(8))


def prefer_joined(fragment: str, continuation: str) -> bool | None:
    """Whether a line-end hyphen between ``fragment`` and ``continuation`` is only a line break:
    True when the joined word is known and at least as frequent as the hyphenated form
    ("capabili-ties" -> True; "well-known", "fine-tuned", "n-tridecanal" -> False). ``None`` for
    non-Latin script (no verdict)."""
    joined = fragment + continuation
    if not _LATIN_WORD_RE.match(joined):
        return None
    j = word_frequency(joined.lower())
    return j > 0.0 and j >= word_frequency(f"{fragment}-{continuation}".lower())


def text_layer_quality(text: str, max_chars: int = 12_000) -> float | None:
    """Share (0..1, weighted by token length up to 12) of the Latin-letter tokens of ``text`` that are
    clean known words; tokens that mix letters with digits or symbols ("3E*»CM", "fc-ugsx") count as
    garbage. Long texts are measured
    on an evenly spread sample of ``max_chars`` characters. ``None`` when the text has fewer than
    20 letter-bearing tokens (no verdict, e.g. CJK text or a short page)."""
    good = total = count = 0
    for raw in _TOKEN_RE.findall(_sample(text, max_chars)):
        token = raw.strip(_STRIP)
        if not token or not any(ch.isalpha() for ch in token):
            continue
        if not any("a" <= ch.lower() <= "z" for ch in token):
            continue  # non-Latin script: no verdict
        count += 1
        weight = min(len(token), 12)
        total += weight
        if _LATIN_WORD_RE.match(token):
            if len(token) == 1 or word_frequency(token.lower()) > 0.0:
                good += weight
        elif re.fullmatch(r"[A-Za-z]+(?:-[A-Za-z]+)+", token) and all(
            word_frequency(part.lower()) > 0 for part in token.split("-")
        ):
            good += weight
    if count < 20:
        return None
    return good / total
