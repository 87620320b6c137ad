"""Repair of broken ToUnicode maps: a font whose ToUnicode CMap contradicts its own encoding.

Two kinds, both common in real PDFs (TeX fonts, hand-made generators):

- a plain letter's code mapped to a ligature code point (the "f" glyph to U+FB01, so "financial"
  reads "ﬁinancial");
- a ligature glyph's code mapped to something else (TeX's ``/ffi`` glyph to U+0000, ``/ff`` to
  U+21B5 "↵", so "difficulties" reads "diculties" and "off" reads "o↵").

A mapping is broken when the font's encoding (``/Differences`` glyph names, or the base encoding)
names the code as a letter or a ligature (``f``, ``ff``, ``ffi`` ...) and ToUnicode says another
text. The repairs are found once per document from the fonts of its pages (pypdf; deduplicated
font objects, ~0.2 ms a page) and applied to PDFium's page text: per character, checked against
the character's font name, so correct uses of the same code points elsewhere stay untouched.
"""

from __future__ import annotations

import io
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

LIGATURES = "\ufb00\ufb01\ufb02\ufb03\ufb04\ufb05\ufb06"
EXPANSIONS = {lig: unicodedata.normalize("NFKC", lig) for lig in LIGATURES}
"""How PDFium writes each ligature code point in page text ("ﬁ" -> "fi")."""
DROPPED = "\ue001"
"""Placeholder for a character removed by a repair (keeps PDFium's character indices aligned)."""
_PLACEHOLDER_BASE = 0xE100
"""Private-use characters U+E100.. stand for multi-letter replacements until segments are cut."""

_LIGATURE_GLYPHS = {
    "ff": "ff", "fi": "fi", "fl": "fl", "ffi": "ffi", "ffl": "ffl",
    "f_f": "ff", "f_i": "fi", "f_l": "fl", "f_f_i": "ffi", "f_f_l": "ffl",
    "uniFB00": "ff", "uniFB01": "fi", "uniFB02": "fl", "uniFB03": "ffi", "uniFB04": "ffl",
}  # fmt: skip
_BFCHAR_RE = re.compile(rb"beginbfchar(.*?)endbfchar", re.DOTALL)
_BFRANGE_RE = re.compile(rb"beginbfrange(.*?)endbfrange", re.DOTALL)
_PAIR_RE = re.compile(rb"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]*)>")
_RANGE_RE = re.compile(rb"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>")
_BASE_CODECS = {"/WinAnsiEncoding": "cp1252", "/MacRomanEncoding": "mac_roman"}


@dataclass
class FontRepairs:
    """Repairs for one document.

    ``ligatures``: ligature code point -> the letter its glyph really is (``{"ﬁ": "f"}``), for
    ligatures that no font maps legitimately. ``per_font``: ``(font name, character)`` -> the
    text the glyph really is (``{("CMR10", "\\x00"): "ffi"}``); the font name is the base font
    without its subset prefix, as PDFium reports it."""

    ligatures: dict[str, str] = field(default_factory=dict)
    per_font: dict[tuple[str, str], str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.ligatures or self.per_font)

    def summary(self) -> dict[str, str]:
        """JSON-safe description for the quality record."""
        out = {f"U+{ord(k):04X}": v for k, v in self.ligatures.items()}
        out.update({f"{font}:U+{ord(ch):04X}": v for (font, ch), v in self.per_font.items()})
        return out


def _utf16(hex_bytes: bytes) -> str | None:
    if not hex_bytes or len(hex_bytes) % 4:
        return "" if not hex_bytes else None
    try:
        return bytes.fromhex(hex_bytes.decode("ascii")).decode("utf-16-be")
    except (ValueError, UnicodeDecodeError):
        return None


def parse_cmap(cmap: bytes) -> dict[int, str]:
    """One-byte codes of a ToUnicode CMap and their text (``bfchar`` and simple ``bfrange``)."""
    mapping: dict[int, str] = {}
    for block in _BFCHAR_RE.findall(cmap):
        for src, dst in _PAIR_RE.findall(block):
            if len(src) <= 2:
                text = _utf16(dst)
                if text is not None:
                    mapping[int(src, 16)] = text
    for block in _BFRANGE_RE.findall(cmap):
        for lo, hi, dst in _RANGE_RE.findall(block):
            if len(lo) <= 2 and len(dst) == 4:
                start = int(dst, 16)
                for offset, code in enumerate(range(int(lo, 16), min(int(hi, 16), 255) + 1)):
                    mapping[code] = chr(start + offset)
    return mapping


def _encoding_names(font: Any) -> tuple[dict[int, str], str | None]:
    """``(differences, base_encoding)``: glyph names by code from ``/Differences`` and the name of
    the base encoding (``None`` when the font has no ``/Encoding``)."""
    encoding = font.get("/Encoding")
    if encoding is None:
        return {}, None
    encoding = encoding.get_object()
    if not hasattr(encoding, "keys"):
        return {}, str(encoding)
    names: dict[int, str] = {}
    differences = encoding.get("/Differences")
    if differences is not None:
        current = None
        for item in differences.get_object():
            item = item.get_object() if hasattr(item, "get_object") else item
            if isinstance(item, int):
                current = int(item)
            elif current is not None:
                names[current] = str(item).lstrip("/")
                current += 1
    base = encoding.get("/BaseEncoding")
    return names, str(base) if base is not None else "/StandardEncoding"


def _glyph_text(code: int, names: dict[int, str], base: str | None) -> str | None:
    """What the font's encoding says ``code`` is: a letter or a ligature's letters, else ``None``."""
    name = names.get(code)
    if name is not None:
        if len(name) == 1 and name.isascii() and name.isalpha():
            return name
        return _LIGATURE_GLYPHS.get(name)
    if base is None:
        return None
    codec = _BASE_CODECS.get(base)
    if codec is not None:
        ch = bytes([code]).decode(codec, errors="replace")
    elif base == "/StandardEncoding" and 0x20 < code < 0x7F:
        ch = chr(code)
    else:
        return None
    return ch if ch.isascii() and ch.isalpha() else None


def _font_name(font: Any) -> str:
    name = str(font.get("/BaseFont", "")).lstrip("/")
    return name.split("+", 1)[1] if "+" in name[:8] else name


def find_repairs(data: bytes, max_pages: int = 5000) -> FontRepairs:
    """Broken ToUnicode entries of the document's simple fonts (see module docstring). Returns an
    empty ``FontRepairs`` when nothing is broken or the fonts cannot be read."""
    repairs = FontRepairs()
    try:
        from pypdf import PdfReader

        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            reader.decrypt("")
        good: set[str] = set()
        seen: set[Any] = set()
        for index, page in enumerate(reader.pages):
            if index >= max_pages:
                break
            resources = page.get("/Resources")
            fonts = resources.get_object().get("/Font") if resources is not None else None
            if fonts is None:
                continue
            for ref in fonts.get_object().values():
                key = getattr(ref, "idnum", None) or id(ref)
                if key in seen:
                    continue
                seen.add(key)
                font = ref.get_object()
                to_unicode = font.get("/ToUnicode")
                if to_unicode is None or font.get("/Subtype") == "/Type0":
                    continue
                mapping = parse_cmap(to_unicode.get_object().get_data())
                names, base = _encoding_names(font)
                fname = _font_name(font)
                for code, text in mapping.items():
                    expected = _glyph_text(code, names, base)
                    if text in LIGATURES and expected is not None and expected == EXPANSIONS[text]:
                        good.add(text)
                    if expected is None or len(text) != 1 or unicodedata.normalize("NFKC", text) == expected:
                        continue
                    if text in LIGATURES and len(expected) == 1:
                        repairs.ligatures[text] = expected
                    elif text not in LIGATURES:
                        repairs.per_font[(fname, text)] = expected
        for ligature in good:
            repairs.ligatures.pop(ligature, None)
    except Exception:  # noqa: BLE001 - unreadable fonts: no repair, the text stays as extracted
        return FontRepairs()
    return repairs


def apply_repairs(text: str, repairs: FontRepairs, font_at: Any, same_glyph: Any) -> tuple[str, dict[str, str]]:
    """Repair PDFium page text (one character per PDFium index; U+0000 glyphs already "\\x00").

    ``font_at(index) -> str`` gives a character's font name; ``same_glyph(start, n) -> bool`` tells
    whether ``n`` characters from ``start`` come from one glyph. Returns ``(text, placeholders)``:
    the text stays index-aligned, multi-letter replacements are private-use placeholders listed in
    ``placeholders`` (placeholder -> text) and ``DROPPED`` marks characters to remove."""
    chars = list(text)
    placeholders: dict[str, str] = {}
    codes: dict[str, str] = {}
    targets = {ch for _, ch in repairs.per_font}
    if targets:
        for i, ch in enumerate(text):
            if ch in targets:
                replacement = repairs.per_font.get((font_at(i), ch))
                if replacement is None:
                    continue
                if len(replacement) == 1:
                    chars[i] = replacement
                else:
                    if replacement not in codes:
                        codes[replacement] = chr(_PLACEHOLDER_BASE + len(codes))
                        placeholders[codes[replacement]] = replacement
                    chars[i] = codes[replacement]
    for ligature, letter in repairs.ligatures.items():
        expansion = EXPANSIONS[ligature]
        start = text.find(expansion)
        while start >= 0:
            if same_glyph(start, len(expansion)):
                chars[start] = letter
                for k in range(1, len(expansion)):
                    chars[start + k] = DROPPED
            start = text.find(expansion, start + len(expansion))
    return "".join(chars), placeholders
