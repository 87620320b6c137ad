"""Tables as GitHub pipe tables: a grid of cell strings in, Markdown lines out.

Merged cells are expanded before rendering: a cell spanning rows or columns repeats its value in
every row and column it covers, so each Markdown row carries a value for every header (the chunker
turns each row into ``header: value; ...`` pairs).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

Grid = list[list[str]]

_WS_RE = re.compile(r"\s+")


def cell_text(value: object) -> str:
    """Render one cell value for a pipe table: ``None`` -> "", whitespace (incl. newlines) collapsed
    to single spaces, ``|`` escaped as ``\\|``."""
    if value is None:
        return ""
    text = _WS_RE.sub(" ", str(value)).strip()
    return text.replace("|", "\\|")


def _drop_empty(grid: Grid) -> Grid:
    rows = [row for row in grid if any(c.strip() for c in row)]
    if not rows:
        return []
    width = max(len(r) for r in rows)
    rows = [r + [""] * (width - len(r)) for r in rows]
    keep = [j for j in range(width) if any(r[j].strip() for r in rows)]
    return [[r[j] for j in keep] for r in rows]


def _dedupe_adjacent_columns(grid: Grid) -> Grid:
    """Drop a column that equals its left neighbour in every row (a colspan artefact of the source,
    e.g. an HTML table whose every row spans the same two columns)."""
    if not grid:
        return grid
    width = len(grid[0])
    keep = [0] if width else []
    for j in range(1, width):
        if all(row[j] == row[keep[-1]] for row in grid):
            continue
        keep.append(j)
    return [[row[j] for j in keep] for row in grid]


def grid_to_markdown(grid: Sequence[Sequence[object]], header: bool = True) -> str:
    """Render ``grid`` (rows of cell values; ragged rows padded) as a pipe table.

    The first row is the header row. With ``header=False`` (no header row is known) a header of
    ``Column 1 .. Column N`` is written so every data row keeps its values. Empty rows and columns
    are dropped; columns that merely repeat their left neighbour in every row (span artefacts) are
    dropped. Returns "" for a grid without any text.
    """
    rows = [[cell_text(c) for c in row] for row in grid]
    rows = _dedupe_adjacent_columns(_drop_empty(rows))
    if not rows:
        return ""
    width = len(rows[0])
    if not header:
        rows = [[f"Column {j + 1}" for j in range(width)], *rows]
    head = [c if c else f"Column {j + 1}" for j, c in enumerate(rows[0])]
    lines = [_row(head), "|" + "|".join(["---"] * width) + "|"]
    lines.extend(_row(row) for row in rows[1:])
    return "\n".join(lines)


def _row(cells: list[str]) -> str:
    return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"


MAX_EXPANDED_CELLS = 1_000_000
"""Most grid positions ``expand_spans`` fills; a table whose declared spans would cover more (e.g. 1,000
cells of ``colspan=1000`` over 1,000 rows: 10^9 positions) is laid out with every cell once, its spans
ignored: no text is lost, only the repeated copies, and memory stays bounded."""


def expand_spans(cells: Sequence[Sequence[tuple[str, int, int]]]) -> Grid:
    """Expand rows of ``(text, rowspan, colspan)`` cells (HTML/DOCX semantics) into a full grid in
    which every covered position repeats the merged cell's text. A rowspan never reaches past the last row
    (so declared spans cannot make a grid taller than the table). Past ``MAX_EXPANDED_CELLS`` positions the
    spans are ignored (each cell once)."""
    covered = sum(min(max(1, rowspan), len(cells) - i) * max(1, colspan)
                  for i, row in enumerate(cells) for _, rowspan, colspan in row)
    if covered > MAX_EXPANDED_CELLS:
        cells = [[(text, 1, 1) for text, _, _ in row] for row in cells]
    grid: dict[tuple[int, int], str] = {}
    width = 0
    for i, row in enumerate(cells):
        j = 0
        for text, rowspan, colspan in row:
            while (i, j) in grid:
                j += 1
            for di in range(min(max(1, rowspan), len(cells) - i)):
                for dj in range(max(1, colspan)):
                    grid[(i + di, j + dj)] = text
            j += max(1, colspan)
            width = max(width, j)
    height = max((i for i, _ in grid), default=-1) + 1
    return [[grid.get((i, j), "") for j in range(width)] for i in range(height)]


def html_table_to_grid(html: str) -> Grid:
    """Parse the first ``<table>`` in ``html`` into a grid with row/col spans expanded. Nested tables
    are flattened into their enclosing cell's text."""
    from lxml import html as lxml_html

    try:
        root = lxml_html.fromstring(html)
    except Exception:  # noqa: BLE001 - malformed fragment: no table
        return []
    tables = [root] if root.tag == "table" else root.xpath("//table")
    if not tables:
        return []
    table = tables[0]
    rows = []
    for tr in table.xpath("./tr|./thead/tr|./tbody/tr|./tfoot/tr"):
        row = []
        for td in tr.xpath("./td|./th"):
            text = " ".join(td.itertext())
            row.append((text, _int(td.get("rowspan")), _int(td.get("colspan"))))
        rows.append(row)
    return expand_spans(rows)


def _int(value: str | None) -> int:
    try:
        return max(1, min(1000, int(value or 1)))
    except ValueError:
        return 1
