"""Target: tables (``rag_pipeline/extraction/tables.py``) and their round trip through the chunker's
block parser (``parse_blocks`` in ``rag_pipeline/chunking/markdown.py``).

Properties: nothing raises; ``grid_to_markdown`` writes a header line, a separator and one line per
non-empty data row, all pipe rows, and ``parse_blocks`` reads back exactly one table unit per data row
holding every non-empty cell value (``|`` unescaped); ``expand_spans`` is rectangular, keeps every cell
text and is not taller than the rows it was given (HTML clips a rowspan at the end of the table);
``html_table_to_grid`` on any string returns a rectangular grid no taller than its ``<tr>`` count, within
``SLOW_S``.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fuzz.common import Target, counted, guard, short
from rag_pipeline.chunking.markdown import parse_blocks
from rag_pipeline.extraction import tables

CELLS = ["", " ", "a", "b", "a|b", "|", "\\", "\\|", "x\\", "---", ":-:", "# h", "<!-- page 2 -->", "```", "1", "é", "日本",
         "a\nb", "\u2028", "\x1c", "\t", "None", "  padded  ", "-", "||", "\\\\|"]
cell = st.one_of(st.sampled_from(CELLS), st.text(max_size=6), st.none(), st.integers(-5, 5))
grids = st.lists(st.lists(cell, max_size=6), max_size=8)
span_rows = st.lists(st.lists(st.tuples(st.sampled_from(CELLS[:6]), st.integers(-2, 6), st.integers(-2, 6)), max_size=4),
                     max_size=5)


def _html(rows) -> str:
    out = ["<table>"]
    for row in rows:
        out.append("<tr>" + "".join(f'<td rowspan="{r}" colspan="{c}">{t}</td>' for t, r, c in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


HTML_PIECES = ["<table>", "</table>", "<tr>", "</tr>", "<td>", "</td>", "<th>", "<thead>", "<tbody>", "x", "|",
               '<td rowspan="1000" colspan="1000">', '<td colspan="1000">', '<td rowspan="99999999999">', "<td rowspan=-1>",
               '<td colspan="abc">', "<table><tr><td>", "&amp;", "<!--", "<![CDATA[", "\x00", "<p>", "</html>"]
html = st.one_of(st.text(max_size=50), st.lists(st.sampled_from(HTML_PIECES), max_size=30).map("".join),
                 span_rows.map(_html))


@given(grids, st.booleans(), span_rows, html)
@counted
def test(grid, header: bool, rows, fragment: str) -> None:
    with guard(lambda: short((grid, header))):
        md = tables.grid_to_markdown(grid, header=header)
        rendered = [[tables.cell_text(c) for c in r] for r in grid]
        data = [r for r in rendered if any(c.strip() for c in r)]
        if not md:
            assert not data, f"{short(grid)} has text but rendered nothing"
        else:
            lines = md.split("\n")
            assert all(line.startswith("|") and line.endswith("|") for line in lines), short(md)
            body = data[1:] if header else data
            assert len(lines) == 2 + len(body), f"{len(lines)} lines for {len(body)} data rows"
            units = [u for u in parse_blocks(md) if u.kind == "table"]
            with_values = [r for r in body if any(c for c in r)]
            assert len(units) == len(with_values), f"{len(units)} table units for {len(with_values)} rows: {short(md)}"
            for unit, row in zip(units, with_values):
                for value in row:
                    if value:
                        assert value.replace("\\|", "|") in unit.text, f"{short(value)} lost from {short(unit.text)}"
    with guard(lambda: short(rows)):
        expanded = tables.expand_spans(rows)
        width = len(expanded[0]) if expanded else 0
        assert all(len(r) == width for r in expanded)
        assert len(expanded) <= len(rows), f"{len(expanded)} rows from {len(rows)} (rowspan not clipped)"
        for row in rows:
            for text, _r, _c in row:
                assert any(text in r for r in expanded) or not expanded
    with guard(lambda: short(fragment)):
        grid2 = tables.html_table_to_grid(fragment)
        width = len(grid2[0]) if grid2 else 0
        assert all(len(r) == width for r in grid2)
        assert len(grid2) <= max(1, fragment.lower().count("<tr")), f"{len(grid2)} rows from {short(fragment)}"
        tables.grid_to_markdown(grid2)


TARGET = Target("tables", test, "extraction/tables.py + parse_blocks: rows survive, spans bounded")
