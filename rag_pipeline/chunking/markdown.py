"""Markdown -> chunks: paragraphs first, then lines, sentences, a hard split; tables row by row.

Rules (each a case in ``rag_pipeline_tests/test_chunking.py``):

* The Markdown is read as blocks: headings (they set the heading path), paragraphs, fenced code,
  pipe tables, and ``<!-- page N -->`` markers (they set the page of what follows).
* A table becomes one unit per data row, written ``header: value; header: value`` so that every
  chunk holding rows repeats the header with each value; a row is never split unless it alone is
  over the token limit. Table chunks get no overlap.
* Prose units are packed up to ``chunk_size`` characters; an oversized paragraph is split at line
  breaks, then at sentence ends (Latin and CJK punctuation), then hard at the token limit using the
  tokenizer's offsets. Consecutive prose chunks overlap by up to ``chunk_overlap`` characters, cut
  at a word boundary.
* No chunk has more than ``max_tokens`` tokens by ``count_tokens`` (the embedding model's own
  tokenizer): every chunk is counted at the end and split again if needed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

PAGE_RE = re.compile(r"^<!--\s*page\s+(\d+)\s*-->$")
HEADING_RE = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE_RE = re.compile(r"^(```|~~~)")
TABLE_SEP_RE = re.compile(r"^\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")
SENTENCE_END_RE = re.compile(r"[.!?;:](?=\s)\s*|[。！？]\s*")


def split_sentences(text: str) -> list[str]:
    """Split ``text`` after sentence-ending punctuation (Latin followed by whitespace, or CJK), keeping
    each sentence's trailing whitespace so that ``"".join(result) == text``."""
    out, start = [], 0
    for m in SENTENCE_END_RE.finditer(text):
        out.append(text[start:m.end()])
        start = m.end()
    if start < len(text):
        out.append(text[start:])
    return out


@dataclass(frozen=True)
class ChunkLimits:
    """``chunk_size`` and ``chunk_overlap`` in characters; ``max_tokens`` in the model's tokens (content only)."""

    chunk_size: int = 1000
    chunk_overlap: int = 150
    max_tokens: int = 254

    def __post_init__(self) -> None:
        if self.chunk_size <= 0 or self.max_tokens <= 0:
            raise ValueError("chunk_size and max_tokens must be positive")
        if not 0 <= self.chunk_overlap < self.chunk_size:
            raise ValueError("chunk_overlap must be >= 0 and smaller than chunk_size")


@dataclass(frozen=True)
class Chunk:
    """One chunk: ``text``; ``ordinal`` (0-based, in document order); ``pages`` (1-based, sorted);
    ``heading_path`` (outermost first); ``token_count`` (model tokens, <= ``max_tokens``);
    ``metadata`` with ``kind`` = ``text`` | ``table`` | ``code``."""

    text: str
    ordinal: int
    pages: tuple[int, ...]
    heading_path: tuple[str, ...]
    token_count: int
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Unit:
    text: str
    kind: str  # text | table | code | heading
    page: int | None
    headings: tuple[str, ...]


def _split_row(line: str) -> list[str]:
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    cells = re.split(r"(?<!\\)\|", s)
    return [c.strip().replace("\\|", "|") for c in cells]


def table_rows_as_text(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Render each data row as ``"header: value; ..."`` (empty cells skipped; unnamed columns as
    ``column N``). Returns one string per row that has any value."""
    names = [h if h else f"column {i + 1}" for i, h in enumerate(header)]
    out = []
    for row in rows:
        pairs = []
        for i, value in enumerate(row):
            if not value:
                continue
            name = names[i] if i < len(names) else f"column {i + 1}"
            pairs.append(f"{name}: {value}")
        if pairs:
            out.append("; ".join(pairs))
    return out


def parse_blocks(markdown: str) -> list[_Unit]:
    """Read ``markdown`` into units (see module docstring); table rows become one unit each."""
    lines = markdown.splitlines()
    units: list[_Unit] = []
    page: int | None = None
    headings: list[tuple[int, str]] = []
    para: list[str] = []

    def path() -> tuple[str, ...]:
        return tuple(h for _, h in headings)

    def flush_para() -> None:
        if para:
            text = "\n".join(para).strip()
            if text:
                units.append(_Unit(text, "text", page, path()))
            para.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        m = PAGE_RE.match(stripped)
        if m:
            flush_para()
            page = int(m.group(1))
            i += 1
            continue
        if not stripped:
            flush_para()
            i += 1
            continue
        m = HEADING_RE.match(stripped)
        if m:
            flush_para()
            level, title = len(m.group(1)), m.group(2).strip()
            while headings and headings[-1][0] >= level:
                headings.pop()
            if title:
                headings.append((level, title))
                units.append(_Unit(title, "heading", page, path()))
            i += 1
            continue
        if FENCE_RE.match(stripped):
            flush_para()
            fence = stripped[:3]
            block = [line]
            i += 1
            while i < len(lines):
                block.append(lines[i])
                i += 1
                if lines[i - 1].strip().startswith(fence):
                    break
            units.append(_Unit("\n".join(block), "code", page, path()))
            continue
        if "|" in stripped and i + 1 < len(lines) and TABLE_SEP_RE.match(lines[i + 1].strip()):
            flush_para()
            header = _split_row(stripped)
            i += 2
            rows = []
            while i < len(lines) and "|" in lines[i] and lines[i].strip():
                rows.append(_split_row(lines[i]))
                i += 1
            for text in table_rows_as_text(header, rows):
                units.append(_Unit(text, "table", page, path()))
            continue
        para.append(line.rstrip())
        i += 1
    flush_para()
    return units


class _Splitter:
    def __init__(self, limits: ChunkLimits, count_tokens: Callable[[Sequence[str]], list[int]],
                 token_offsets: Callable[[str], list[tuple[int, int]]] | None) -> None:
        self.limits = limits
        self.count_tokens = count_tokens
        self.token_offsets = token_offsets

    def tokens(self, text: str) -> int:
        return self.count_tokens([text])[0]

    def fits(self, text: str, size: int | None = None) -> bool:
        return len(text) <= (size or self.limits.chunk_size) and self.tokens(text) <= self.limits.max_tokens

    def hard_split(self, text: str) -> list[str]:
        """Split at the token limit using tokenizer offsets (exact), else by characters."""
        max_tokens = self.limits.max_tokens
        if self.token_offsets is not None:
            offsets = self.token_offsets(text)
            pieces, start_tok = [], 0
            while start_tok < len(offsets):
                end_tok = min(start_tok + max_tokens, len(offsets))
                start = offsets[start_tok][0] if start_tok else 0
                end = offsets[end_tok][0] if end_tok < len(offsets) else len(text)
                piece = text[start:end]
                # Prefer a whitespace cut inside the last 20% of the piece.
                if end_tok < len(offsets):
                    cut = piece.rfind(" ", int(len(piece) * 0.8))
                    if cut > 0:
                        piece = piece[:cut]
                        end = start + cut
                        while end_tok > start_tok + 1 and offsets[end_tok - 1][0] >= end:
                            end_tok -= 1
                piece = piece.strip()
                if piece:
                    pieces.append(piece)
                start_tok = end_tok
            out: list[str] = []
            for p in pieces:  # character limit too
                out.extend(self._char_split(p))
            return out
        return self._char_split(text)

    def _char_split(self, text: str) -> list[str]:
        size = self.limits.chunk_size
        out, rest = [], text
        while rest:
            if len(rest) <= size and self.tokens(rest) <= self.limits.max_tokens:
                out.append(rest)
                break
            n = min(size, len(rest))
            while n > 1 and self.tokens(rest[:n]) > self.limits.max_tokens:
                n = max(1, int(n * 0.8))
            cut = rest.rfind(" ", int(n * 0.8), n)
            n = cut if cut > 0 else n
            out.append(rest[:n].strip())
            rest = rest[n:].strip()
        return [o for o in out if o]

    def split_unit(self, text: str) -> list[str]:
        """Pieces of an oversized unit: lines, then sentences, then the hard split. Pieces aim at
        ``chunk_size - chunk_overlap`` characters so that the overlap still fits in front of them."""
        if self.fits(text):
            return [text]
        target = self.limits.chunk_size - self.limits.chunk_overlap
        for parts, sep in ((text.split("\n"), "\n"), (split_sentences(text), "")):
            parts = [p for p in parts if p.strip()]
            if len(parts) > 1:
                out: list[str] = []
                for part in self.pack(parts, sep=sep, size=target):
                    part = part.strip()
                    out.extend(self.split_unit(part) if not self.fits(part) else [part])
                return out
        return self.hard_split(text)

    def pack(self, parts: Sequence[str], sep: str, size: int) -> list[str]:
        """Greedy packing under ``size`` characters and the token limit; token counts of parts are
        summed (exact for whitespace-joined WordPiece text; the final pass re-counts every chunk)."""
        counts = self.count_tokens(list(parts))
        out, current, current_tokens = [], "", 0
        for part, n in zip(parts, counts):
            candidate = f"{current}{sep}{part}" if current else part
            if current and (len(candidate.strip()) > size or current_tokens + n > self.limits.max_tokens):
                out.append(current)
                current, current_tokens = part, n
            else:
                current, current_tokens = candidate, current_tokens + n
        if current:
            out.append(current)
        return out


def _overlap_tail(text: str, overlap: int) -> str:
    if overlap <= 0 or len(text) <= overlap:
        return "" if overlap <= 0 else text
    tail = text[-overlap:]
    space = tail.find(" ")
    return tail[space + 1:] if 0 <= space < len(tail) - 1 else tail


def chunk_markdown(
    markdown: str,
    limits: ChunkLimits,
    count_tokens: Callable[[Sequence[str]], list[int]],
    token_offsets: Callable[[str], list[tuple[int, int]]] | None = None,
) -> list[Chunk]:
    """Split ``markdown`` into ``list[Chunk]`` (ordinals 0..n-1) under ``limits``.

    ``count_tokens(texts) -> list[int]`` counts content tokens with the embedding model's tokenizer;
    ``token_offsets(text) -> [(start, end), ...]`` (character offsets per token) makes hard splits exact.
    Every returned chunk has ``token_count <= limits.max_tokens`` and ``len(text) <= limits.chunk_size``
    (plus overlap). Returns ``[]`` only for Markdown without text.
    """
    splitter = _Splitter(limits, count_tokens, token_offsets)
    units = parse_blocks(markdown)
    pieces: list[_Unit] = []
    for u in units:
        for piece in splitter.split_unit(u.text):
            pieces.append(_Unit(piece, u.kind, u.page, u.headings))

    piece_tokens = count_tokens([p.text for p in pieces]) if pieces else []
    drafts: list[tuple[str, list[_Unit]]] = []
    current: list[_Unit] = []
    current_text, current_tokens = "", 0
    for u, n in zip(pieces, piece_tokens):
        sep = "\n" if (current and current[-1].kind == "table" and u.kind == "table") else "\n\n"
        starts_section = u.kind == "heading" and len(current_text) >= limits.chunk_size // 4
        kind_change = bool(current) and (current[-1].kind == "table") != (u.kind == "table") \
            and "heading" not in (u.kind, current[-1].kind)
        candidate = f"{current_text}{sep}{u.text}" if current_text else u.text
        too_big = len(candidate) > limits.chunk_size or current_tokens + n > limits.max_tokens
        if current and (starts_section or kind_change or too_big):
            drafts.append((current_text, current))
            carry = _overlap_tail(current_text, limits.chunk_overlap) if (
                current[-1].kind == "text" and u.kind == "text") else ""
            current, current_text, current_tokens = [], u.text, n
            if carry:
                carry_tokens = count_tokens([carry])[0]
                if len(carry) + 1 + len(u.text) <= limits.chunk_size and carry_tokens + n <= limits.max_tokens:
                    current_text, current_tokens = f"{carry} {u.text}", carry_tokens + n
        else:
            current_text, current_tokens = candidate, current_tokens + n
        current.append(u)
    if current:
        drafts.append((current_text, current))

    texts = [t for t, _ in drafts]
    counts = count_tokens(texts) if texts else []
    chunks: list[Chunk] = []
    for (text, members), n_tokens in zip(drafts, counts):
        parts = [text] if n_tokens <= limits.max_tokens else splitter.hard_split(text)
        part_counts = [n_tokens] if len(parts) == 1 else count_tokens(parts)
        kinds = {m.kind for m in members} - {"heading"}
        kind = "table" if kinds == {"table"} else "code" if kinds == {"code"} else "text"
        pages = tuple(sorted({m.page for m in members if m.page is not None}))
        for part, count in zip(parts, part_counts):
            chunks.append(Chunk(part, len(chunks), pages, members[0].headings, count, {"kind": kind}))
    return chunks
