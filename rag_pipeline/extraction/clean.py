"""Text clean-up shared by every format: control characters, Unicode normalisation, whitespace,
line-end de-hyphenation and repeated page furniture (running headers, footers, page numbers).

All functions are pure and work on ``str``; none of them raises on odd input.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence

# --- control characters -------------------------------------------------------------------------

# C0 controls except \t and \n, DEL, C1 controls, the non-characters U+FFFE/U+FFFF (pdfium's marker
# for unmapped glyphs) and lone surrogates (PostgreSQL rejects them in TEXT and JSONB).
_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffe\uffff\ud800-\udfff]")
# Invisible format characters that only break words apart (soft hyphen, zero-width space, BOM).
_INVISIBLE_RE = re.compile("[\u00ad\u200b\u2060\ufeff]")


def remove_control_chars(text: str) -> tuple[str, int]:
    """Return ``(text, removed)``: ``text`` without C0/C1 control characters (tab and newline kept),
    non-characters and lone surrogates; ``removed`` counts the characters deleted.

    Line ends are normalised first (``\\r\\n`` and ``\\r`` become ``\\n``; form feed and vertical tab
    become ``\\n``); those conversions are not counted as removals. Soft hyphens, zero-width spaces
    and stray byte-order marks are dropped too and not counted (they are not controls).
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x0c", "\n").replace("\x0b", "\n")
    text, removed = _CONTROL_RE.subn("", text)
    text = _INVISIBLE_RE.sub("", text)
    return text, removed


# --- Unicode normalisation -----------------------------------------------------------------------

# Ranges left exactly as they are: CJK punctuation, kana, Hangul (incl. compatibility jamo), CJK
# ideographs (incl. compatibility ideographs), enclosed CJK and CJK compatibility blocks, half-width
# kana and Hangul. NFKC would rewrite some of these (e.g. compatibility ideographs, ㈱, ｶ).
_CJK_RANGES = (
    "\u1100-\u11ff"  # Hangul jamo
    "\u2e80-\u2fdf"  # CJK radicals, Kangxi radicals
    "\u3000-\u303f"  # CJK symbols and punctuation
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3100-\u31ff"  # Bopomofo, Hangul compatibility jamo, Kanbun, Katakana ext.
    "\u3200-\u33ff"  # Enclosed CJK letters, CJK compatibility
    "\u3400-\u4dbf"  # CJK ext. A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\ua960-\ua97f"  # Hangul jamo ext. A
    "\uac00-\ud7ff"  # Hangul syllables, jamo ext. B
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\ufe30-\ufe4f"  # CJK compatibility forms
    "\uff61-\uffdc"  # half-width katakana and Hangul
    "\U00020000-\U0003134f"  # CJK ext. B-G
)
_CJK_RUN_RE = re.compile(f"[{_CJK_RANGES}]+")


_STRAY_MARK_RE = re.compile(r"(?<=[\s(\[])[\u0300-\u036f]+|^[\u0300-\u036f]+", re.MULTILINE)


def normalize_unicode(text: str) -> str:
    """NFKC-normalise ``text`` (ligatures such as U+FB01 become "fi", full-width ASCII becomes ASCII,
    non-breaking spaces become spaces) while leaving CJK characters (kana, Hangul, ideographs, CJK
    punctuation and compatibility forms) exactly as they are. Combining accents left stranded after
    a space (a PDF's spacing breve "˘" placed apart from its letter) are dropped."""
    if text.isascii():
        return text
    text = _normalize(text)
    return _STRAY_MARK_RE.sub("", text) if "\u0300" <= max(text) else text


def _normalize(text: str) -> str:
    out: list[str] = []
    pos = 0
    for match in _CJK_RUN_RE.finditer(text):
        if match.start() > pos:
            out.append(unicodedata.normalize("NFKC", text[pos : match.start()]))
        out.append(match.group())
        pos = match.end()
    if pos < len(text):
        out.append(unicodedata.normalize("NFKC", text[pos:]))
    return "".join(out)


# --- whitespace ----------------------------------------------------------------------------------

_FENCE_RE = re.compile(r"^\s{0,3}(```|~~~)")
_SPACES_RE = re.compile(r"[ \t\u00a0\u2000-\u200a\u202f\u205f]+")
_LIST_INDENT_RE = re.compile(r"^([ \t]+)(?:[-*+]|\d{1,3}[.)])(?: |$)")


def normalize_whitespace(markdown: str) -> str:
    """Collapse runs of spaces/tabs inside lines to one space, strip line ends and keep at most one
    blank line between blocks. Lines inside fenced code blocks keep their indentation and tabs;
    nested list items keep their indentation (at most 12 spaces); a ```` ``` ```` line indented 4 or more
    (code, not a fence) keeps 4 spaces, so that tidying never turns it into a fence.
    Leading/trailing blank lines are removed. Idempotent."""
    out: list[str] = []
    in_fence = False
    blank = 0
    for line in markdown.split("\n"):
        if _FENCE_RE.match(line):
            in_fence = not in_fence
            out.append(line.strip())
            blank = 0
            continue
        if in_fence:
            out.append(line.rstrip())
            continue
        indent = _LIST_INDENT_RE.match(line)
        stripped = _SPACES_RE.sub(" ", line).strip()
        if _FENCE_RE.match(stripped):  # indented 4+: not a fence, and stripping it would make it one
            line = "    " + stripped
        else:
            line = stripped
            if indent and line:
                line = " " * min(len(indent.group(1).expandtabs(4)), 12) + line
        if not line:
            blank += 1
            if blank > 1:
                continue
        else:
            blank = 0
        out.append(line)
    while out and not out[0]:
        out.pop(0)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out)


def clean_markdown(markdown: str) -> tuple[str, int]:
    """Full clean-up of finished Markdown: controls removed, Unicode normalised, whitespace tidied.

    Returns ``(markdown, removed_control_chars)``. Idempotent: the Unicode and whitespace passes repeat until
    nothing changes (NFKC can turn a character into a space, e.g. U+00A8 into a space and a combining mark, and
    tidying whitespace can bring characters together that NFKC composes), at most ``_CLEAN_PASSES`` times.
    """
    text, removed = remove_control_chars(markdown)
    for _ in range(_CLEAN_PASSES):
        tidy = normalize_whitespace(normalize_unicode(text))
        if tidy == text:
            break
        text = tidy
    return text, removed


_CLEAN_PASSES = 8
"""Each pass keeps the text or makes it shorter once NFKC has run, so a few passes reach the fixed point."""


# --- de-hyphenation ------------------------------------------------------------------------------

_HYPHENS = "-\u2010\u00ad"
_WORD_END_RE = re.compile(r"([^\W\d_]+)[-\u2010\u00ad]$")
_WORD_START_RE = re.compile(r"^([^\W\d_]+)")


def join_hyphenated(left: str, right: str, decide=None) -> str:
    """Join two lines where ``left`` ends with a hyphen: return the joined text without the line break.

    The hyphen is dropped only when it is clearly a line-break hyphen: the line that follows starts
    with a lower-case letter and ``decide(fragment, continuation)`` says so (a callable returning
    True/False, or None for no verdict, e.g. ``quality.prefer_joined`` which compares word
    frequencies). Without a verdict the fragment must have at least two lower-case letters. When
    unsure the hyphen is kept ("n-" + "tridecanal" -> "n-tridecanal"; "dual-" + "encoder" ->
    "dual-encoder").
    """
    m_left = _WORD_END_RE.search(left)
    m_right = _WORD_START_RE.match(right)
    if m_left is None or m_right is None:
        return left + right
    frag, cont = m_left.group(1), m_right.group(1)
    drop = False
    if cont[:1].islower():
        verdict = decide(frag, cont) if decide is not None else None
        if verdict is None:
            drop = len(frag) >= 2 and frag.islower()
        else:
            drop = verdict
    if drop:
        return left[:-1] + right
    return left + right


def join_lines(lines: Sequence[str], decide=None) -> str:
    """Join the visual lines of one paragraph into one string: a line ending in a hyphen is joined to
    the next without a space (see ``join_hyphenated``), others with one space."""
    text = ""
    for line in lines:
        line = line.strip()
        if not line:
            continue
        if not text:
            text = line
        elif text[-1] in _HYPHENS and len(text) >= 2 and text[-2].isalpha():
            text = join_hyphenated(text, line, decide)
        else:
            text = text + " " + line
    return text


# --- page furniture ------------------------------------------------------------------------------

_DIGITS_RE = re.compile(r"\d+")
_PAGE_NUMBER_RE = re.compile(
    r"^(?:page|p\.|seite|pagina|página)?\s*[-–—(\[]?\s*(?:\d{1,4}|[ivxlcdm]{1,6})\s*[-–—)\]]?"
    r"(?:\s*(?:of|/|von|de)\s*\d{1,4})?$",
    re.IGNORECASE,
)


def _furniture_key(line: str) -> str:
    return _DIGITS_RE.sub("#", line.strip().lower())


def is_page_number(line: str) -> bool:
    """True for a line that is only a page number ("12", "- 12 -", "Page 3 of 9", "iv")."""
    s = line.strip()
    return bool(s) and len(s) <= 20 and bool(_PAGE_NUMBER_RE.match(s))


def find_page_furniture(pages: Sequence[Sequence[str]], edge: int = 3) -> set[str]:
    """Find running headers/footers: keys (digits folded to ``#``, lower case) of lines that appear
    within ``edge`` lines of the top or bottom of at least half of the pages and of at least 3 pages
    (so a 2-page document, or one whose page was duplicated, loses nothing). ``pages`` is a list of
    pages, each a list of lines.
    Returns the set of keys; test a line with ``_furniture_key``/``is_furniture``."""
    n = len(pages)
    if n < 3:
        return set()
    counts: Counter[str] = Counter()
    for lines in pages:
        seen = set()
        nonblank = [ln for ln in lines if ln.strip()]
        for line in list(nonblank[:edge]) + list(nonblank[-edge:]):
            key = _furniture_key(line)
            if key and len(key) <= 200 and key not in seen:
                seen.add(key)
                counts[key] += 1
    need = max(3, (n + 1) // 2)
    return {key for key, c in counts.items() if c >= need}


def is_furniture(line: str, furniture: set[str]) -> bool:
    """True when ``line`` is a running header/footer found by ``find_page_furniture``."""
    return _furniture_key(line) in furniture
