"""Office formats: DOCX (python-docx + its XML), PPTX (python-pptx), XLSX (openpyxl) and the legacy
binary formats (.doc/.ppt/.xls) converted with LibreOffice first.

DOCX: tracked changes are accepted (insertions and move-targets kept, deletions and move-sources
dropped); headings from paragraph styles; tables with ``gridSpan``/``vMerge`` expanded.
PPTX: ``## Slide N: title`` per slide, shapes in reading order, tables, speaker notes under
``### Notes (slide N)``. XLSX: ``## Sheet: <name>`` per sheet, cached formula values or the formula
text when no value is cached; vertically merged cells repeated in every row, a merge within one row
kept once.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from .draft import Draft
from .tables import cell_text, grid_to_markdown
from .types import PAGE_MARKER, ExtractionError, MissingDependencyError, PasswordProtectedError

W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
MC_NS = "http://schemas.openxmlformats.org/markup-compatibility/2006"
W = "{%s}" % W_NS

# --- DOCX ----------------------------------------------------------------------------------------

_SKIP_TAGS = {
    W + "del",
    W + "moveFrom",
    W + "pPr",
    W + "rPr",
    W + "instrText",
    W + "delInstrText",
    W + "fldChar",
    "{%s}Fallback" % MC_NS,
}


def _docx_inline_text(element: Any) -> str:
    """Text of a paragraph-level element with tracked changes accepted."""
    parts: list[str] = []

    def walk(node: Any) -> None:
        for child in node:
            tag = child.tag
            if not isinstance(tag, str) or tag in _SKIP_TAGS:
                continue
            if tag == W + "t":
                parts.append(child.text or "")
            elif tag == W + "tab":
                parts.append("\t")
            elif tag in (W + "br", W + "cr"):
                parts.append("\n")
            elif tag == W + "noBreakHyphen":
                parts.append("-")
            elif tag == W + "p":
                # a paragraph nested in a text box: its own line
                parts.append("\n")
                walk(child)
                parts.append("\n")
            else:
                walk(child)

    walk(element)
    return "".join(parts)


def _docx_cell_text(tc: Any) -> str:
    texts = []
    for child in tc:
        if child.tag == W + "p":
            texts.append(_docx_inline_text(child))
        elif child.tag == W + "tbl":
            for row in _docx_table_grid(child):
                texts.append(" ".join(c for c in row if c))
        elif child.tag == W + "sdt":
            texts.append(_docx_cell_text(child.find(W + "sdtContent") if child.find(W + "sdtContent") is not None else child))
    return " ".join(t.strip() for t in texts if t.strip())


def _docx_table_grid(tbl: Any) -> list[list[str]]:
    """Grid of a ``w:tbl`` with ``gridSpan`` repeated across columns and ``vMerge`` continuations
    filled with the value of the cell where the merge starts."""
    grid: list[list[str]] = []
    for tr in tbl.iter(W + "tr"):
        if tr.getparent() is not tbl and tr.getparent().tag != W + "sdtContent":
            continue
        row: list[str] = []
        grid_before = tr.find(f"{W}trPr/{W}gridBefore")
        if grid_before is not None:
            row.extend([""] * int(grid_before.get(W + "val", "0") or 0))
        cells = [c for c in tr if c.tag == W + "tc"]
        for sdt in (c for c in tr if c.tag == W + "sdt"):
            content = sdt.find(W + "sdtContent")
            if content is not None:
                cells.extend(c for c in content if c.tag == W + "tc")
        for tc in cells:
            tcpr = tc.find(W + "tcPr")
            span = 1
            vmerge = None
            if tcpr is not None:
                gs = tcpr.find(W + "gridSpan")
                if gs is not None:
                    try:
                        span = max(1, int(gs.get(W + "val", "1")))
                    except ValueError:
                        span = 1
                vm = tcpr.find(W + "vMerge")
                if vm is not None:
                    vmerge = vm.get(W + "val", "continue")
            col = len(row)
            if vmerge == "continue" and grid and col < len(grid[-1]):
                text = grid[-1][col]
            else:
                text = _docx_cell_text(tc)
            row.extend([text] * span)
        grid.append(row)
    return grid


def _heading_level(style_name: str) -> int | None:
    name = style_name.lower()
    if name == "title":
        return 1
    if name.startswith("heading"):
        digits = "".join(ch for ch in name if ch.isdigit())
        return min(6, int(digits)) if digits else 1
    return None


def extract_docx(data: bytes) -> Draft:
    """DOCX body in document order: paragraphs (headings by style, list paragraphs as ``- ``),
    tables as pipe tables; tracked changes accepted. Headers/footers are not body text and are left
    out."""
    import docx

    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - python-docx raises KeyError/ValueError on broken parts
        raise ExtractionError(f"corrupt DOCX: {type(exc).__name__}: {exc}") from exc
    styles = {}
    try:
        for style in document.styles:
            styles[style.style_id] = style.name or ""
    except Exception:  # noqa: BLE001 - a broken styles part only loses heading levels
        pass
    blocks: list[str] = []
    counts = {"paragraphs": 0, "headings": 0, "list_items": 0, "tables": 0}

    def handle(container: Any) -> None:
        for child in container:
            tag = child.tag
            if tag == W + "p":
                text = _docx_inline_text(child).strip()
                if not text:
                    continue
                ppr = child.find(W + "pPr")
                style_name = ""
                is_list = False
                if ppr is not None:
                    pstyle = ppr.find(W + "pStyle")
                    if pstyle is not None:
                        style_name = styles.get(pstyle.get(W + "val"), pstyle.get(W + "val") or "")
                    is_list = ppr.find(W + "numPr") is not None
                level = _heading_level(style_name)
                if level is not None and "\n" not in text:
                    blocks.append("#" * level + " " + text)
                    counts["headings"] += 1
                elif is_list or style_name.lower().startswith("list"):
                    blocks.append("- " + text.replace("\n", " "))
                    counts["list_items"] += 1
                else:
                    blocks.append(text)
                    counts["paragraphs"] += 1
            elif tag == W + "tbl":
                table = grid_to_markdown(_docx_table_grid(child))
                if table:
                    blocks.append(table)
                    counts["tables"] += 1
            elif tag in (W + "sdt", W + "sdtContent", W + "ins", W + "moveTo", W + "customXml"):
                handle(child)

    handle(document.element.body)
    # Keep list items together (one block per list) so the chunker sees a list, not paragraphs.
    merged: list[str] = []
    for block in blocks:
        if merged and block.startswith("- ") and merged[-1].startswith("- "):
            merged[-1] += "\n" + block
        else:
            merged.append(block)
    return Draft(markdown="\n\n".join(merged), stats={"element_counts": counts, "tables": counts["tables"]})


# --- PPTX ----------------------------------------------------------------------------------------


def _shape_blocks(shape: Any, title_shape_id: int | None, counts: dict[str, int]) -> list[str]:
    from pptx.enum.shapes import MSO_SHAPE_TYPE

    blocks: list[str] = []
    if shape.shape_type == MSO_SHAPE_TYPE.GROUP:
        for sub in _reading_order(shape.shapes):
            blocks.extend(_shape_blocks(sub, title_shape_id, counts))
        return blocks
    if getattr(shape, "has_table", False) and shape.has_table:
        grid = []
        for row in shape.table.rows:
            grid.append([cell.text for cell in row.cells])
        # python-pptx reports a merged cell's text in its origin only: fill spanned cells.
        for i, row in enumerate(shape.table.rows):
            for j, cell in enumerate(row.cells):
                if cell.is_spanned:
                    origin = _span_origin(shape.table, i, j)
                    if origin is not None:
                        grid[i][j] = grid[origin[0]][origin[1]]
        table = grid_to_markdown(grid)
        if table:
            blocks.append(table)
            counts["tables"] += 1
        return blocks
    if getattr(shape, "has_text_frame", False) and shape.has_text_frame and shape.shape_id != title_shape_id:
        lines = []
        for paragraph in shape.text_frame.paragraphs:
            text = "".join(run.text for run in paragraph.runs) or paragraph.text
            text = text.strip()
            if not text:
                continue
            if paragraph.level > 0 or _is_bullet(shape):
                lines.append("  " * max(0, paragraph.level) + "- " + text)
                counts["list_items"] += 1
            else:
                lines.append(text)
                counts["paragraphs"] += 1
        if lines:
            blocks.append("\n".join(lines))
    return blocks


def _span_origin(table: Any, i: int, j: int) -> tuple[int, int] | None:
    for oi in range(i, -1, -1):
        for oj in range(j, -1, -1):
            cell = table.cell(oi, oj)
            if cell.is_merge_origin and oi + cell.span_height > i and oj + cell.span_width > j:
                return oi, oj
    return None


def _is_bullet(shape: Any) -> bool:
    try:
        from pptx.enum.shapes import PP_PLACEHOLDER

        return shape.is_placeholder and shape.placeholder_format.type in (PP_PLACEHOLDER.BODY, PP_PLACEHOLDER.OBJECT)
    except Exception:  # noqa: BLE001 - shapes without placeholder format
        return False


def _reading_order(shapes: Any) -> list[Any]:
    def key(shape: Any) -> tuple[int, int]:
        return (int(shape.top or 0) // 100000, int(shape.left or 0))

    return sorted(shapes, key=key)


def extract_pptx(data: bytes) -> Draft:
    """PPTX: a ``PAGE_MARKER`` and ``## Slide N: title`` per slide, its shapes in reading order
    (top-to-bottom, left-to-right; bullets as ``- ``, tables as pipe tables), and non-empty speaker
    notes under ``### Notes (slide N)``."""
    from pptx import Presentation

    try:
        prs = Presentation(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - python-pptx raises KeyError/ValueError on broken parts
        raise ExtractionError(f"corrupt PPTX: {type(exc).__name__}: {exc}") from exc
    parts: list[str] = []
    counts = {"slides": 0, "paragraphs": 0, "list_items": 0, "tables": 0, "notes": 0}
    for number, slide in enumerate(prs.slides, start=1):
        counts["slides"] += 1
        title_shape = slide.shapes.title
        title = " ".join((title_shape.text_frame.text if title_shape is not None else "").split())
        parts.append(PAGE_MARKER.format(n=number))
        parts.append(f"## Slide {number}: {title}" if title else f"## Slide {number}")
        title_id = title_shape.shape_id if title_shape is not None else None
        for shape in _reading_order(slide.shapes):
            parts.extend(_shape_blocks(shape, title_id, counts))
        if slide.has_notes_slide:
            notes_frame = slide.notes_slide.notes_text_frame
            notes = notes_frame.text.strip() if notes_frame is not None else ""
            if notes:
                parts.append(f"### Notes (slide {number})")
                parts.append(notes)
                counts["notes"] += 1
    return Draft(
        markdown="\n\n".join(parts),
        page_count=counts["slides"],
        stats={"element_counts": counts, "tables": counts["tables"]},
    )


# --- XLSX ----------------------------------------------------------------------------------------


def _xlsx_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.15g}"
    if isinstance(value, dt.datetime):
        if value.time() == dt.time(0, 0):
            return value.date().isoformat()
        return value.isoformat(sep=" ")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    return str(value)


def _stored_cells(ws: Any) -> dict[tuple[int, int], Any]:
    """The cells the worksheet's XML holds, keyed ``(row, column)`` (openpyxl's own store, which its
    ``max_row``/``max_column`` read too). Never ``ws.iter_rows()`` / ``ws.cell()`` over the sheet's
    extent: that creates every cell of the rectangle, and one formatted empty cell at XFD1048576 makes
    the rectangle 17 billion cells."""
    return ws._cells  # private, but no public API lists only the cells that exist


def _cell_texts(ws: Any, ws_values: Any) -> dict[tuple[int, int], str]:
    """Text of every cell that holds a value (cached value, else formula text), with merges over several
    rows repeated in every covered position; blank texts left out."""
    cached_cells = _stored_cells(ws_values)
    texts: dict[tuple[int, int], str] = {}
    for (r, c), cell in _stored_cells(ws).items():
        if cell.value is None:
            continue
        cached_cell = cached_cells.get((r, c))
        cached = cached_cell.value if cached_cell is not None else None
        value = cached if cached is not None else cell.value
        if isinstance(value, str) or cached is not None:
            text = _xlsx_value(value)
        elif hasattr(value, "text"):  # ArrayFormula / DataTableFormula
            text = "=" + str(getattr(value, "text", "")).lstrip("=")
        else:
            text = _xlsx_value(value)
        if text.strip():
            texts[(r, c)] = text
    for merged in ws.merged_cells.ranges:
        top = texts.get((merged.min_row, merged.min_col), "")
        if merged.max_row > merged.min_row and top:
            # merge over several rows: every covered position carries the value
            for r in range(merged.min_row, merged.max_row + 1):
                for c in range(merged.min_col, merged.max_col + 1):
                    texts[(r, c)] = top
        # a merge within one row (a title or footnote across columns) is kept once
    return texts


def _sheet_grid(ws: Any, ws_values: Any) -> list[list[str]]:
    """Grid of one worksheet: cached values, else formula text; merges applied.

    Sized from the cells that hold text, not from the declared ``<dimension ref>`` nor from formatted
    empty cells: only the rows and columns with some text are in it (rows and columns without any are
    dropped by the table rendering anyway), so a sheet declaring ``A1:XFD1048576`` with 3 rows of data
    gives a 3-row grid."""
    texts = _cell_texts(ws, ws_values)
    rows = sorted({r for r, _ in texts})
    cols = sorted({c for _, c in texts})
    return [[texts.get((r, c), "") for c in cols] for r in rows]


def _filled(row: list[str]) -> int:
    return sum(1 for c in row if c.strip())


def _split_titles(grid: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """Leading rows holding a single non-empty cell (sheet titles) become paragraphs; so does a
    sparse caption row above the real header ("In millions of CHF ... January-June 2023" above
    the column names): the header is the first of the leading rows filled to at least 60% of the
    widest row."""
    titles: list[str] = []
    rows = [r for r in grid if any(c.strip() for c in r)]
    while rows and _filled(rows[0]) == 1 and len(rows) > 1:
        titles.append(next(c for c in rows[0] if c.strip()).strip())
        rows.pop(0)
    widest = max((_filled(r) for r in rows), default=0)
    for _ in range(3):
        if len(rows) > 2 and _filled(rows[0]) < 0.6 * widest and _filled(rows[1]) >= 0.6 * widest:
            titles.append(" ".join(cell_text(c) for c in rows[0] if c.strip()))
            rows.pop(0)
        else:
            break
    return titles, rows


def extract_xlsx(data: bytes) -> Draft:
    """XLSX: every worksheet as ``## Sheet: <name>``, its leading title rows as paragraphs and the
    rest as one pipe table whose first row is the header. Work and memory follow the cells the sheet
    holds, never its declared dimension (see ``_sheet_grid``)."""
    import zipfile

    import openpyxl

    try:
        wb = openpyxl.load_workbook(io.BytesIO(data), data_only=False)
        wb_values = openpyxl.load_workbook(io.BytesIO(data), data_only=True)
    except zipfile.BadZipFile as exc:
        raise PasswordProtectedError("password protected (encrypted workbook)") from exc
    except Exception as exc:  # noqa: BLE001 - openpyxl raises many kinds on broken parts
        raise ExtractionError(f"corrupt XLSX: {type(exc).__name__}: {exc}") from exc
    parts: list[str] = []
    tables = 0
    sheets = 0
    formulas_without_value = 0
    for ws in wb.worksheets:
        sheets += 1
        ws_values = wb_values[ws.title]
        parts.append(f"## Sheet: {cell_text(ws.title)}")
        cached_cells = _stored_cells(ws_values)
        for key, cell in _stored_cells(ws).items():
            if cell.data_type == "f" and getattr(cached_cells.get(key), "value", None) is None:
                formulas_without_value += 1
        titles, rows = _split_titles(_sheet_grid(ws, ws_values))
        parts.extend(titles)
        if len(rows) == 1:
            parts.append(" | ".join(c for c in rows[0] if c.strip()))
        elif rows:
            table = grid_to_markdown(rows)
            if table:
                parts.append(table)
                tables += 1
    return Draft(
        markdown="\n\n".join(parts),
        page_count=sheets,
        stats={"tables": tables, "sheets": sheets, "formulas_without_cached_value": formulas_without_value},
    )


# --- legacy binary formats -----------------------------------------------------------------------

_CONVERT_TARGET = {"doc": "docx", "ppt": "pptx", "xls": "xlsx"}


def find_soffice() -> str | None:
    """Path of LibreOffice's ``soffice`` (or ``libreoffice``) on ``PATH``, or ``None``."""
    return shutil.which("soffice") or shutil.which("libreoffice")


def convert_legacy(data: bytes, doc_type: str, timeout_s: float) -> bytes:
    """Convert a legacy ``doc``/``ppt``/``xls`` file to its OOXML successor with LibreOffice
    (``soffice --headless --convert-to``), in a private profile and temporary directory.

    Raises ``MissingDependencyError`` naming LibreOffice when ``soffice`` is not installed and
    ``ExtractionError`` when the conversion fails or times out (``timeout_s`` seconds)."""
    target = _CONVERT_TARGET[doc_type]
    soffice = find_soffice()
    if soffice is None:
        raise MissingDependencyError(
            f"converter missing: LibreOffice (soffice) is not installed; cannot convert legacy .{doc_type} to .{target}"
        )
    with tempfile.TemporaryDirectory(prefix="rag-soffice-") as tmp:
        src = Path(tmp) / f"input.{doc_type}"
        src.write_bytes(data)
        profile = Path(tmp) / "profile"
        cmd = [
            soffice,
            f"-env:UserInstallation={profile.as_uri()}",
            "--headless",
            "--norestore",
            "--convert-to",
            target,
            "--outdir",
            tmp,
            str(src),
        ]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, timeout=timeout_s, check=False, env={**os.environ, "HOME": tmp}
            )
        except subprocess.TimeoutExpired as exc:
            raise ExtractionError(f"LibreOffice conversion of .{doc_type} timed out after {timeout_s:.0f} s") from exc
        out = Path(tmp) / f"input.{target}"
        if proc.returncode != 0 or not out.exists():
            detail = (proc.stderr or proc.stdout or b"").decode("utf-8", "replace").strip()[-300:]
            raise ExtractionError(f"LibreOffice could not convert .{doc_type} (exit {proc.returncode}): {detail}")
        return out.read_bytes()
