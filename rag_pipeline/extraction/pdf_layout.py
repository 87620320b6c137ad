"""Reading order for one PDF page from PDFium's text segments: columns, paragraphs, tables, headings.

Why not pdfminer: pure Python, ~6 pages/s. PDFium (pypdfium2) gives the page text in one call and
the boxes of its text runs per line in a few calls, which keeps extraction within a small factor of
the plain page-text floor. The layout logic here works on those runs:

1. *Segments*: PDFium's lines (split at its generated line breaks) with their run rectangles; a line
   whose runs sit apart (a gap wider than ``GAP_EM`` font sizes, or another baseline) is split into
   several segments using per-character boxes (only for those lines). Rotated runs in the page
   margin (arXiv stamps) are dropped.
2. *Regions* by recursive XY-cut: a vertical cut only between *text columns* (both sides hold
   several text lines), then *tables* (a run of at least 3 rows of 2+ cells whose columns line up
   and whose cells are short), then horizontal cuts at paragraph gaps.
3. *Paragraphs* inside a region from line geometry (indent, short last line, bullets, font size);
   line-end hyphens resolved with ``clean.join_lines``; larger fonts and numbered section titles
   become headings.

Coordinates: PDF points, converted to top-down (``top`` < ``bottom``).
"""

from __future__ import annotations

import ctypes
import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from .clean import join_lines, remove_control_chars
from .pdf_fonts import DROPPED, FontRepairs, apply_repairs
from .quality import prefer_joined
from .tables import grid_to_markdown

GAP_EM = 1.2
"""A horizontal gap wider than this many font sizes separates two segments of one line."""
PARA_GAP_EM = 0.8
"""A vertical gap larger than this many font sizes separates paragraphs/regions."""
MAX_TABLE_CELL_CHARS = 30
"""A row set whose cells average more characters than this is text in columns, not a table."""

_BULLET_RE = re.compile(r"^([•◦▪▫●○■□➢►▶∙·\-–—*]|\(?\d{1,3}[.)]|\(?[a-z][.)])\s+")
_SECTION_RE = re.compile(r"^(\d+(\.\d+){0,3}\.?|[IVX]{1,5}\.|[A-Z]\.)\s+[A-Z][^.!?]{0,80}$")


@dataclass
class Segment:
    """A run of text on one line: box in top-down page coordinates, text, font size (points)."""

    x0: float
    top: float
    x1: float
    bottom: float
    text: str
    size: float
    weight: int = 400  # font weight of the line's first character (700 = bold)
    mono: bool = False  # set in a monospaced font (a code line)
    atoms: list[Segment] | None = None  # finer runs (PDFium rectangles), for table cells
    pending: tuple[Any, ...] | None = None  # what is needed to compute ``atoms`` on demand

    @property
    def height(self) -> float:
        return self.bottom - self.top


@dataclass
class PageText:
    """One page's text as Markdown blocks in reading order, plus facts for the document level.

    ``lines_top``/``lines_bottom``: texts of the two top-most/bottom-most lines (candidates for
    running headers/footers). ``char_count``: characters of body text. ``error``: why the page
    could not be read (``blocks`` then empty)."""

    blocks: list[str]
    lines_top: list[str]
    lines_bottom: list[str]
    error: str | None = None
    char_count: int = 0
    removed_control_chars: int = 0
    rotated_dropped: int = 0
    tables: int = 0
    headings: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def plain_text(self) -> str:
        """The page's blocks joined by blank lines."""
        return "\n\n".join(self.blocks)


# --- segments from PDFium ------------------------------------------------------------------------


class _CharBoxes:
    """Per-character boxes from PDFium, fetched lazily (they cost one call per character)."""

    def __init__(self, raw_textpage: Any) -> None:
        import pypdfium2.raw as raw

        self._tp = raw_textpage
        self._get = raw.FPDFText_GetCharBox
        self._l, self._r, self._b, self._t = (ctypes.c_double() for _ in range(4))
        self._refs = tuple(ctypes.byref(v) for v in (self._l, self._r, self._b, self._t))

    def box(self, index: int) -> tuple[float, float, float, float] | None:
        if not self._get(self._tp, index, *self._refs):
            return None
        left, right, bottom, top = self._l.value, self._r.value, self._b.value, self._t.value
        if right - left <= 0 and top - bottom <= 0:
            return None
        return left, bottom, right, top


def _rect_groups(rects: list[tuple[float, float, float, float]], size: float) -> list[list[int]]:
    """Group a line's run rectangles (PDF coords l, b, r, t) into segments: a new group starts at a
    gap wider than ``GAP_EM`` font sizes or where the next run does not share the line's baseline
    band."""
    groups: list[list[int]] = [[0]]
    gap = GAP_EM * size
    for i in range(1, len(rects)):
        prev = rects[groups[-1][-1]]
        cur = rects[i]
        overlap = min(prev[3], cur[3]) - max(prev[1], cur[1])
        smaller = max(1e-3, min(prev[3] - prev[1], cur[3] - cur[1]))
        same_line = overlap >= 0.3 * smaller or (cur[3] - cur[1]) < 0.5 * (prev[3] - prev[1])
        if not same_line or cur[0] - prev[2] > gap or cur[0] < prev[0] - gap:
            groups.append([i])
        else:
            groups[-1].append(i)
    return groups


def _split_by_rects(
    text: str, start: int, rects: list[tuple[float, float, float, float]], boxes: _CharBoxes
) -> list[str]:
    """Assign each character of ``text`` (PDFium char indices ``start..``) to the run rectangle that
    contains its box centre; generated characters (spaces, breaks) stay with the current run."""
    parts = [[] for _ in rects]
    current = 0
    for offset, ch in enumerate(text):
        if ch in " \r\n\t":
            parts[current].append(ch)
            continue
        box = boxes.box(start + offset)
        if box is not None:
            cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
            if not _inside(rects[current], cx, cy):
                for j in list(range(current + 1, len(rects))) + list(range(0, current)):
                    if _inside(rects[j], cx, cy):
                        current = j
                        break
        parts[current].append(ch)
    return ["".join(p) for p in parts]


def _inside(rect: tuple[float, float, float, float], x: float, y: float, tol: float = 1.0) -> bool:
    return rect[0] - tol <= x <= rect[2] + tol and rect[1] - tol <= y <= rect[3] + tol


def _fix_markers(text: str, start: int, textpage: Any) -> str:
    """PDFium writes U+FFFE both for a line-end hyphen and for a glyph mapped to U+0000; tell them
    apart by the character's own code (2 = hyphen -> "\\x02", else "\\x00", removed later)."""
    import pypdfium2.raw as raw

    if "\ufffe" not in text:
        return text
    chars = list(text)
    for i, ch in enumerate(chars):
        if ch == "\ufffe":
            code = raw.FPDFText_GetUnicode(textpage, start + i)
            chars[i] = "\x02" if code == 2 else "\x00"
    return "".join(chars)


def clean_segment_text(text: str) -> tuple[str, int]:
    """Remove control characters from a segment's text but keep PDFium's hyphen marker ``\x02``
    (turned into "-" when lines are joined). Returns ``(text, removed)``."""
    text = text.replace("\x02", "\ue000").replace(DROPPED, "")
    text, removed = remove_control_chars(text)
    return text.replace("\ue000", "\x02"), removed


def page_segments(page: Any, repairs: FontRepairs | None = None) -> tuple[list[Segment], int, int, Any]:
    """Segments of one page: ``(segments, rotated_chars_dropped, repaired_control_chars, textpage)``. The caller closes
    ``textpage`` after it has used the segments (table cells read character boxes lazily).
    ``repairs``: the document's broken ToUnicode entries (``pdf_fonts.find_repairs``)."""
    import pypdfium2.raw as raw

    width, height = page.get_size()
    textpage = page.get_textpage()
    tp = textpage.raw
    n_chars = textpage.count_chars()
    if n_chars <= 0:
        return [], 0, 0, textpage
    text = textpage.get_text_range()
    if len(text) != n_chars:  # astral characters: rebuild index-aligned text char by char
        text = "".join(chr(raw.FPDFText_GetUnicode(tp, i) or 0xFFFE) for i in range(n_chars))
    text = _fix_markers(text, 0, tp)
    boxes = _CharBoxes(tp)
    table: dict[int, str | None] = {}
    repaired_controls = 0
    if repairs:
        before = text
        text, placeholders = apply_repairs(
            text,
            repairs,
            lambda i: _font_name(tp, i),
            lambda start, n: len({boxes.box(start + k) for k in range(n)}) == 1,
        )
        table = {ord(k): v for k, v in placeholders.items()}
        # control characters (U+0000 glyphs) that a repair replaced were removed all the same
        repaired_controls = sum(1 for a, b in zip(before, text) if a != b and a < " " and a not in "\t\n\x02")
    loose = raw.FS_RECTF()
    segments: list[Segment] = []
    rotated: list[tuple[Segment, int]] = []
    pos = 0
    for line in text.split("\r\n"):
        start = pos
        pos += len(line) + 2
        if not line.strip():
            continue
        k = textpage.count_rects(start, len(line))
        if k <= 0:
            continue
        rects = [textpage.get_rect(i) for i in range(k)]
        first = start + next((i for i, ch in enumerate(line) if not ch.isspace()), 0)
        # median of the first, middle and last character: a line may start with a superscript or a brace
        last = start + len(line.rstrip()) - 1
        sizes = sorted(_char_size(tp, i, loose) for i in (first, (first + last) // 2, last))
        size = sizes[1] or sizes[2] or (rects[0][3] - rects[0][1]) or 10.0
        angle = raw.FPDFText_GetCharAngle(tp, first)
        if angle > 0.05 and abs(angle - 2 * math.pi) > 0.05:
            seg = _segment(rects, range(k), line.strip(), size, height)
            rotated.append((seg, len(line.strip()), round(angle / (math.pi / 2)) % 4))
            continue
        weight = raw.FPDFText_GetFontWeight(tp, first)
        # a code line: its middle and last characters are set in a monospaced font
        mono = bool(_MONO_RE.search(_font_name(tp, last))) and bool(_MONO_RE.search(_font_name(tp, (first + last) // 2)))
        groups = _rect_groups(rects, size) if k > 1 else [[0]]
        if len(groups) == 1:
            seg = _segment(rects, groups[0], line, size, height)
            seg.weight = weight
            seg.mono = mono
            if k > 1:
                seg.pending = (start, rects, line, boxes, height)
            segments.append(seg)
            continue
        per_rect = _split_by_rects(line, start, rects, boxes)
        for group in groups:
            seg = _segment(rects, group, "".join(per_rect[i] for i in group), size, height)
            seg.weight = weight
            seg.mono = mono
            seg.atoms = _merge_touching([_segment(rects, [i], per_rect[i], size, height) for i in group if per_rect[i].strip()])
            segments.append(seg)
    if table:
        for seg in segments:
            seg.text = seg.text.translate(table)
            for atom in seg.atoms or []:
                atom.text = atom.text.translate(table)
            if seg.pending is not None:
                seg.pending = (*seg.pending, table)
    segments = [s for s in segments if s.text]
    dropped = 0
    rotated_chars = sum(n for _, n, _ in rotated)
    if rotated_chars > sum(len(s.text) for s in segments):
        # the page's text is rotated (a landscape page printed sideways): read it in its own frame
        counts: dict[int, int] = {}
        for _, n, quarter in rotated:
            counts[quarter] = counts.get(quarter, 0) + n
        main = max(counts, key=counts.__getitem__)
        dropped = sum(len(s.text) for s in segments) + sum(n for _, n, q in rotated if q != main)
        segments = [_to_text_frame(seg, main, width, height) for seg, _, q in rotated if q == main]
        rotated = []
    if rotated:
        xs0 = min((s.x0 for s in segments), default=0.1 * width)
        xs1 = max((s.x1 for s in segments), default=0.9 * width)
        for seg, n, _ in rotated:
            cx = (seg.x0 + seg.x1) / 2
            if cx < xs0 or cx > xs1 or cx < 0.1 * width or cx > 0.9 * width:
                dropped += n  # a rotated stamp in the margin (e.g. arXiv identifier)
            else:
                segments.append(seg)
    return segments, dropped, repaired_controls, textpage


_FONT_BUFFER = ctypes.create_string_buffer(256)
_MONO_RE = re.compile(r"Courier|Mono|CMTT|Consol|Menlo|Inconsolata|Typewriter|SFTT|LMTT|Code", re.IGNORECASE)


def _font_name(tp: Any, index: int) -> str:
    """Base font name of a character as PDFium reports it (no subset prefix)."""
    import pypdfium2.raw as raw

    flags = ctypes.c_int()
    n = raw.FPDFText_GetFontInfo(tp, index, _FONT_BUFFER, 256, ctypes.byref(flags))
    name = _FONT_BUFFER.value.decode("latin-1") if n else ""
    return name.split("+", 1)[1] if "+" in name[:8] else name


def _char_size(tp: Any, index: int, rect: Any) -> float:
    """Effective size of a character: the height of its loose box (font ascent to descent, with the
    text matrix applied; ``FPDFText_GetFontSize`` ignores the matrix and says 1.0 for scaled
    fonts), or 0 when unknown."""
    import pypdfium2.raw as raw

    if raw.FPDFText_GetLooseCharBox(tp, index, rect):
        return max(0.0, rect.top - rect.bottom)
    return 0.0


def _to_text_frame(seg: Segment, quarter: int, width: float, height: float) -> Segment:
    """Map a rotated segment's box into the frame where its text runs left to right and lines
    advance downwards. ``quarter``: PDFium's character angle in quarter turns (3 = reading upwards,
    1 = reading downwards, 2 = upside down)."""
    x0, top, x1, bottom = seg.x0, seg.top, seg.x1, seg.bottom
    if quarter == 3:
        box = (height - bottom, x0, height - top, x1)
    elif quarter == 1:
        box = (top, width - x1, bottom, width - x0)
    else:
        box = (width - x1, height - bottom, width - x0, height - top)
    return Segment(box[0], box[1], box[2], box[3], seg.text, max(1.0, 0.9 * (box[3] - box[1])), seg.weight)


def _segment(rects: list[tuple[float, float, float, float]], indices: Any, text: str, size: float, height: float) -> Segment:
    l_ = min(rects[i][0] for i in indices)
    b_ = min(rects[i][1] for i in indices)
    r_ = max(rects[i][2] for i in indices)
    t_ = max(rects[i][3] for i in indices)
    return Segment(l_, height - t_, r_, height - b_, text.strip(), size)


def _atoms(seg: Segment) -> list[Segment]:
    """The finer runs of a segment (one per PDFium rectangle), for table cells."""
    if seg.atoms is not None:
        return seg.atoms
    if seg.pending is None:
        seg.atoms = [seg]
        return seg.atoms
    start, rects, line, boxes, height, *rest = seg.pending
    texts = _split_by_rects(line, start, rects, boxes)
    if rest:
        texts = [t.translate(rest[0]) for t in texts]
    atoms = []
    for i, text in enumerate(texts):
        text = clean_segment_text(text)[0].strip()
        if text:
            atoms.append(_segment(rects, [i], text, seg.size, height))
    seg.atoms = _merge_touching(atoms) or [seg]
    return seg.atoms


def _merge_touching(atoms: list[Segment]) -> list[Segment]:
    """Merge runs that touch (a superscript, a font change inside a word) into one atom."""
    merged: list[Segment] = []
    for atom in atoms:
        if merged:
            last = merged[-1]
            if atom.x0 - last.x1 < 0.15 * max(last.size, atom.size) and atom.x0 >= last.x0:
                merged[-1] = Segment(
                    last.x0, min(last.top, atom.top), max(last.x1, atom.x1), max(last.bottom, atom.bottom),
                    last.text + atom.text, max(last.size, atom.size),
                )
                continue
        merged.append(atom)
    return merged


# --- rows, regions, tables ------------------------------------------------------------------------


def _rows(segments: list[Segment]) -> list[list[Segment]]:
    """Group segments into visual rows (vertical overlap), top to bottom; each row left to right."""
    rows: list[list[Segment]] = []
    bands: list[tuple[float, float]] = []
    for seg in sorted(segments, key=lambda s: (s.top, s.x0)):
        if rows:
            top, bottom = bands[-1]
            overlap = min(bottom, seg.bottom) - max(top, seg.top)
            if overlap >= 0.4 * max(1e-3, min(bottom - top, seg.height)):
                rows[-1].append(seg)
                bands[-1] = (min(top, seg.top), max(bottom, seg.bottom))
                continue
        rows.append([seg])
        bands.append((seg.top, seg.bottom))
    for row in rows:
        row.sort(key=lambda s: s.x0)
    return rows


def _body_size(segments: list[Segment]) -> float:
    """The size that carries the most characters on the page (rounded to 0.25 pt)."""
    weights: dict[float, int] = {}
    for seg in segments:
        if seg.size > 0:
            key = round(seg.size * 4) / 4
            weights[key] = weights.get(key, 0) + len(seg.text)
    return max(weights, key=weights.__getitem__) if weights else 10.0


def _gaps(intervals: list[tuple[float, float]], min_gap: float) -> list[tuple[float, float]]:
    """Internal gaps (start, end) of at least ``min_gap`` in the union of ``intervals``."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(merged[i][1], merged[i + 1][0]) for i in range(len(merged) - 1) if merged[i + 1][0] - merged[i][1] >= min_gap]


def _text_like(segments: list[Segment]) -> bool:
    if len(segments) < 2:
        return False
    return sum(len(s.text) for s in segments) / len(segments) >= 12


def _vertical_cut(segments: list[Segment], size: float) -> tuple[list[Segment], list[Segment]] | None:
    gaps = _gaps([(s.x0, s.x1) for s in segments], max(3.0, 0.5 * size))
    for start, end in sorted(gaps, key=lambda g: g[1] - g[0], reverse=True):
        left = [s for s in segments if s.x1 <= start + 0.01]
        right = [s for s in segments if s.x0 >= end - 0.01]
        if _text_like(left) and _text_like(right) and len(_rows(left)) >= 2 and len(_rows(right)) >= 2:
            return left, right
    return None


def _horizontal_cut(segments: list[Segment], size: float) -> list[list[Segment]] | None:
    gaps = _gaps([(s.top, s.bottom) for s in segments], PARA_GAP_EM * size)
    if not gaps:
        return None
    bands: list[list[Segment]] = [[] for _ in range(len(gaps) + 1)]
    for seg in segments:
        index = sum(1 for g in gaps if seg.top >= g[1] - 0.01)
        bands[index].append(seg)
    return [b for b in bands if b]


def _table_columns(rows: list[list[Segment]], size: float) -> list[tuple[float, float]]:
    atoms = [a for row in rows for s in row for a in _atoms(s)]
    merged: list[list[float]] = []
    for a, b in sorted((a.x0, a.x1) for a in atoms):
        if merged and a <= merged[-1][1] + 0.5:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _table_grid(rows: list[list[Segment]], columns: list[tuple[float, float]]) -> list[list[str]]:
    grid = []
    for row in rows:
        cells = [[] for _ in columns]
        for seg in row:
            for atom in _atoms(seg):
                cx = (atom.x0 + atom.x1) / 2
                j = next((k for k, (a, b) in enumerate(columns) if a - 0.5 <= cx <= b + 0.5), None)
                if j is None:
                    j = min(range(len(columns)), key=lambda k: abs((columns[k][0] + columns[k][1]) / 2 - cx))
                cells[j].append(atom.text)
        grid.append([" ".join(c) for c in cells])
    return grid


def _numbered_listing(grid: list[list[str]]) -> bool:
    """True when the first column only numbers the lines (a code listing with line numbers)."""
    first = [row[0].strip() for row in grid]
    if not all(c.isdigit() for c in first):
        return False
    numbers = [int(c) for c in first]
    return numbers == list(range(numbers[0], numbers[0] + len(numbers)))


def _find_table(rows: list[list[Segment]], size: float) -> tuple[int, int, list[list[str]], str] | None:
    """First run of >= 3 rows with >= 2 segments each that lines up into >= 2 short-celled columns:
    ``(first_row, end_row, grid, "table")``; a run whose first column numbers the lines is a code
    listing: ``(first_row, end_row, [[line], ...], "code")``."""
    i = 0
    n = len(rows)
    while i < n:
        if len(rows[i]) < 2:
            i += 1
            continue
        j = i
        while j + 1 < n and len(rows[j + 1]) >= 2 and rows[j + 1][0].top - max(s.bottom for s in rows[j]) < 2.5 * size:
            j += 1
        run = rows[i : j + 1]
        segs = [seg for row in run for seg in row]
        # text set in columns has long segments: skip the (costly) cell analysis
        if j - i + 1 >= 3 and sum(len(seg.text) for seg in segs) / len(segs) <= 2 * MAX_TABLE_CELL_CHARS:
            columns = _table_columns(run, size)
            if 2 <= len(columns) <= 30:
                grid = _table_grid(run, columns)
                cells = [c for r in grid for c in r if c]
                filled_rows = sum(1 for r in grid if sum(1 for c in r if c) >= 2)
                if _numbered_listing(grid):
                    return i, j + 1, [[_row_text(r)] for r in run], "code"
                if (
                    cells
                    and sum(len(c) for c in cells) / len(cells) <= MAX_TABLE_CELL_CHARS
                    and filled_rows >= 0.6 * len(grid)
                ):
                    return i, j + 1, grid, "table"
        i = j + 1
    return None


# --- paragraphs ----------------------------------------------------------------------------------


_SPACE_BEFORE_PUNCT_RE = re.compile(r"(?<=\w) +(?=[,.;:!?](?:\s|$))")


def _row_text(row: list[Segment]) -> str:
    text = " ".join(s.text for s in row).replace("\x02", "-")
    # PDF word spacing puts blanks before punctuation ("Zhang 2 , Melissa"): not in the text
    return _SPACE_BEFORE_PUNCT_RE.sub("", text) if " " in text else text


def _split_code(segments: list[Segment]) -> list[tuple[str, Any]]:
    """Split a region into text parts (segment lists) and code blocks: runs of at least two rows set
    entirely in a monospaced font become one fenced block, each row a line, indentation kept."""
    if not any(s.mono for s in segments):
        return [("text", segments)]
    out: list[tuple[str, Any]] = []
    pending: list[Segment] = []
    run: list[list[Segment]] = []

    def flush_run() -> None:
        if len(run) >= 2:
            if pending:
                out.append(("text", list(pending)))
                pending.clear()
            left = min(r[0].x0 for r in run)
            lines = []
            for r in run:
                width = 0.6 * max(1.0, r[0].size)
                lines.append(" " * int(round((r[0].x0 - left) / width)) + " ".join(seg.text for seg in r))
            out.append(("code", "```\n" + "\n".join(lines) + "\n```"))
        else:
            pending.extend(seg for r in run for seg in r)
        run.clear()

    for row in _rows(segments):
        if all(seg.mono for seg in row):
            run.append(row)
        else:
            flush_run()
            pending.extend(row)
    flush_run()
    if pending:
        out.append(("text", pending))
    return out


def _paragraphs(segments: list[Segment], body_size: float) -> list[tuple[str, float, int, bool]]:
    """Paragraphs of one region as ``(text, font_size, rows, first_row_bold)``."""
    rows = _rows(segments)
    if not rows:
        return []
    x0 = min(s.x0 for s in segments)
    x1 = max(s.x1 for s in segments)
    paras: list[tuple[list[str], float, int]] = []
    bolds: list[bool] = []
    row_gaps = [rows[k + 1][0].top - max(s.bottom for s in rows[k]) for k in range(len(rows) - 1)]
    usual_gap = statistics.median(row_gaps) if row_gaps else 0.0
    prev = None
    for row in rows:
        text = _row_text(row)
        size = max(s.size for s in row)
        left, right = row[0].x0, row[-1].x1
        new = prev is None
        if prev is not None:
            p_text, p_size, p_left, p_right, p_bottom = prev
            gap = row[0].top - p_bottom
            short_prev = p_right < x1 - 2 * size
            indented = left > x0 + 0.8 * size and left - p_left > 0.8 * size
            if (
                gap > PARA_GAP_EM * size
                or abs(size - p_size) > 0.15 * max(size, p_size)
                or _BULLET_RE.match(text)
                or (short_prev and (p_text.rstrip().endswith((".", ":", "!", "?")) or indented))
                or (indented and short_prev)
                # a short line followed by more space than between the region's lines: a title
                or (short_prev and gap > max(2 * usual_gap, usual_gap + 0.25 * size))
            ):
                new = True
        if new:
            paras.append(([text], size, 1))
            bolds.append(all(s.weight >= 600 for s in row))
        else:
            lines, s, count = paras[-1]
            lines.append(text)
            paras[-1] = (lines, s, count + 1)
        prev = (text, size, left, right, max(s.bottom for s in row))
    return [(join_lines(lines, prefer_joined), size, count, bold) for (lines, size, count), bold in zip(paras, bolds)]


def _render_paragraph(text: str, size: float, rows: int, body_size: float, bold: bool = False) -> tuple[str, bool]:
    """Markdown for one paragraph; ``(markdown, is_heading)``. Headings: at most two rows set
    clearly larger than the body text (``#`` from 1.5x, ``##`` from 1.3x), or one bold row
    numbered like a section ("3.1 Overview": ``##``/``###`` by depth)."""
    stripped = text.strip()
    if not stripped:
        return "", False
    if rows <= 2 and len(stripped) <= 200 and size >= 1.3 * body_size and not stripped.endswith((".", ",")):
        level = 1 if size >= 1.5 * body_size else 2
        return "#" * level + " " + stripped, True
    if bold and rows == 1 and len(stripped) <= 90 and _SECTION_RE.match(stripped) and len(stripped.split()) <= 10:
        level = 2 if stripped.split()[0].rstrip(".").count(".") == 0 else 3
        return "#" * level + " " + stripped, True
    bullet = _BULLET_RE.match(stripped)
    if bullet and bullet.group(1) in "•◦▪▫●○■□➢►▶∙·*-–—":
        return "- " + stripped[bullet.end() :], False
    if stripped.startswith(("#", ">", "|")):
        stripped = "\\" + stripped
    return stripped, False


def _order(segments: list[Segment], size: float, out: list[tuple[str, Any]]) -> None:
    """Recursive XY-cut; appends ("para", [segments]) and ("table", grid) in reading order."""
    if not segments:
        return
    cut = _vertical_cut(segments, size)
    if cut is not None:
        _order(cut[0], size, out)
        _order(cut[1], size, out)
        return
    rows = _rows(segments)
    if len(rows) >= 3:
        found = _find_table(rows, size)
        if found is not None:
            first, end, grid, kind = found
            _order([s for r in rows[:first] for s in r], size, out)
            out.append((kind, grid))
            _order([s for r in rows[end:] for s in r], size, out)
            return
    bands = _horizontal_cut(segments, size)
    if bands is not None and len(bands) > 1:
        for band in bands:
            _order(band, size, out)
        return
    out.append(("para", segments))


def extract_page(page: Any, repairs: FontRepairs | None = None) -> PageText:
    """Markdown blocks of one page in reading order (see module docstring). ``repairs``: broken
    ligature mappings of the document (``pdf_fonts.ligature_repairs``)."""
    segments, rotated_dropped, repaired_controls, textpage = page_segments(page, repairs)
    try:
        page_text = _layout(segments, rotated_dropped)
        page_text.removed_control_chars += repaired_controls
        page_text.extra["repaired_control_chars"] = repaired_controls
        return page_text
    finally:
        textpage.close()


def _layout(segments: list[Segment], rotated_dropped: int) -> PageText:
    removed = 0
    for seg in segments:
        seg.text, n = clean_segment_text(seg.text)
        removed += n
        for atom in seg.atoms or []:
            atom.text = clean_segment_text(atom.text)[0].strip()
    segments = [s for s in segments if s.text.strip()]
    if not segments:
        return PageText(blocks=[], lines_top=[], lines_bottom=[], removed_control_chars=removed, rotated_dropped=rotated_dropped)
    body_size = _body_size(segments)
    ordered: list[tuple[str, Any]] = []
    _order(segments, body_size, ordered)
    blocks: list[str] = []
    tables = headings = 0
    for kind, payload in ordered:
        if kind == "code":
            blocks.append("```\n" + "\n".join(row[0] for row in payload) + "\n```")
            continue
        if kind == "table":
            table = grid_to_markdown(payload)
            if table:
                blocks.append(table)
                tables += 1
            continue
        for part_kind, part in _split_code(payload):
            if part_kind == "code":
                blocks.append(part)
                continue
            for text, size, nrows, bold in _paragraphs(part, body_size):
                block, is_heading = _render_paragraph(text, size, nrows, body_size, bold)
                if block:
                    blocks.append(block)
                    headings += is_heading
    all_rows = _rows(segments)
    lines_top = [_row_text(r) for r in all_rows[:2]]
    lines_bottom = [_row_text(r) for r in all_rows[-2:]]
    return PageText(
        blocks=blocks,
        lines_top=lines_top,
        lines_bottom=lines_bottom,
        char_count=sum(len(b) for b in blocks),
        removed_control_chars=removed,
        rotated_dropped=rotated_dropped,
        tables=tables,
        headings=headings,
    )
