"""Text formats: plain text, Markdown, CSV, HTML and e-mail (RFC 822 / MIME).

Each ``extract_*`` takes the raw bytes and returns a ``Draft``; decoding follows byte-order marks,
then strict UTF-8, then a declared HTML charset, then statistical detection (charset-normalizer,
with Windows-1252 preferred among Western single-byte candidates).
"""

from __future__ import annotations

import codecs
import csv
import email
import email.policy
import io
import re
from email.message import EmailMessage

from .draft import Draft
from .tables import grid_to_markdown

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_WESTERN_SINGLE_BYTE = re.compile(r"^(cp125\d|windows-125\d|iso8859_\d+|latin_?1|mac_roman|cp850|cp437|ascii)$")
_META_CHARSET_RE = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)


def _bom_encoding(data: bytes) -> tuple[str, int] | None:
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return encoding, len(bom)
    return None


def looks_binary(data: bytes) -> bool:
    """True when ``data`` is not text: it has NUL bytes (and no UTF-16/32 byte-order mark) or many
    non-text control bytes in its first 8 KiB."""
    if _bom_encoding(data):
        return False
    head = data[:8192]
    if b"\x00" in head:
        return True
    controls = sum(1 for b in head if b < 32 and b not in (9, 10, 12, 13, 27))
    return controls > max(4, len(head) // 50)


def detect_encoding(data: bytes) -> str:
    """Name of the encoding ``data`` is most likely in (see module docstring for the order)."""
    bom = _bom_encoding(data)
    if bom:
        return bom[0]
    try:
        data.decode("utf-8")
        return "utf-8"
    except UnicodeDecodeError:
        pass
    meta = _META_CHARSET_RE.search(data[:4096])
    if meta:
        name = meta.group(1).decode("ascii", "ignore")
        try:
            if getattr(codecs.lookup(name), "_is_text_encoding", True):  # not rot13, zlib, "undefined"...
                data.decode(name)
                return name
        except (LookupError, UnicodeError):
            pass
    from charset_normalizer import from_bytes

    best = from_bytes(data).best()
    guess = best.encoding if best is not None else "cp1252"
    if _WESTERN_SINGLE_BYTE.match(guess.lower()):
        try:
            data.decode("cp1252")
            return "cp1252"
        except UnicodeDecodeError:
            pass
    return guess


def decode_text(data: bytes) -> str:
    """Decode ``data`` to ``str`` with ``detect_encoding`` (undecodable bytes become U+FFFD; a BOM is
    dropped)."""
    bom = _bom_encoding(data)
    if bom:
        return data[bom[1] :].decode(bom[0], errors="replace")
    return data.decode(detect_encoding(data), errors="replace")


# --- plain text and Markdown ---------------------------------------------------------------------


def extract_txt(data: bytes) -> Draft:
    """Plain text: decoded, paragraphs kept as they are (blank lines separate them)."""
    text = decode_text(data)
    return Draft(markdown=text, stats={"encoding": detect_encoding(data)})


def extract_md(data: bytes) -> Draft:
    """Markdown: decoded and passed through (headings, tables, fenced code stay as written)."""
    text = decode_text(data)
    return Draft(markdown=text, stats={"encoding": detect_encoding(data), "tables": _count_md_tables(text)})


_MD_TABLE_SEP_RE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")


def _count_md_tables(text: str) -> int:
    return sum(1 for line in text.split("\n") if _MD_TABLE_SEP_RE.match(line) and "-" in line)


# --- CSV -----------------------------------------------------------------------------------------


def extract_csv(data: bytes, filename: str = "") -> Draft:
    """CSV/TSV as one pipe table. The delimiter is sniffed (``,`` ``;`` tab ``|``). Leading rows with
    a single non-empty cell before a wider row (a title such as "Stanley Cups,,") become a heading
    instead of the header row."""
    text = decode_text(data).replace("\r\n", "\n").replace("\r", "\n")
    sample = text[:20000]
    delimiter = "\t" if filename.lower().endswith(".tsv") else ","
    try:
        delimiter = csv.Sniffer().sniff(sample, delimiters=",;\t|").delimiter
    except csv.Error:
        pass
    rows = [row for row in csv.reader(io.StringIO(text), delimiter=delimiter)]
    rows = [row for row in rows if any(c.strip() for c in row)]
    titles: list[str] = []
    while len(rows) > 1:
        filled = [c for c in rows[0] if c.strip()]
        wider = sum(1 for c in rows[1] if c.strip())
        if len(filled) == 1 and wider > 1:
            titles.append(filled[0].strip())
            rows.pop(0)
        else:
            break
    parts = [f"# {t}" for t in titles]
    table = grid_to_markdown(rows)
    if table:
        parts.append(table)
    return Draft(markdown="\n\n".join(parts), stats={"tables": 1 if table else 0, "rows": max(0, len(rows) - 1)})


# --- HTML ----------------------------------------------------------------------------------------


def html_to_markdown(html: str) -> tuple[str, dict[str, int], int]:
    """HTML text -> ``(markdown, element_counts, tables)`` through ``unstructured.partition_html``
    (scripts/styles dropped, headings as ``#``, tables as pipe tables with spans expanded)."""
    from .markdown import elements_to_markdown, setup_unstructured

    setup_unstructured()
    from unstructured.partition.html import partition_html

    elements = partition_html(text=html)
    return elements_to_markdown(elements)


def extract_html(data: bytes) -> Draft:
    """HTML document (charset from BOM, UTF-8, ``<meta charset>`` or detection)."""
    encoding = detect_encoding(data)
    markdown, counts, tables = html_to_markdown(decode_text(data))
    return Draft(markdown=markdown, stats={"encoding": encoding, "element_counts": counts, "tables": tables})


# --- e-mail --------------------------------------------------------------------------------------


def _part_text(part: EmailMessage) -> str:
    payload = part.get_payload(decode=True) or b""
    charset = part.get_content_charset()
    if charset:
        try:
            return payload.decode(charset, errors="replace")
        except LookupError:
            pass
    return decode_text(payload) if payload else ""


def extract_eml(data: bytes) -> Draft:
    """E-mail: subject as heading, From/To/Cc/Date lines, the body (text/plain preferred over
    text/html within multipart/alternative, each decoded by its own charset) and attachments
    returned as ``children`` ``(filename, bytes)`` (attached messages as ``.eml``)."""
    msg = email.message_from_bytes(data, policy=email.policy.default)
    lines: list[str] = []
    subject = str(msg.get("Subject", "") or "").strip()
    if subject:
        lines.append(f"# {subject}")
    header_lines = [f"{name}: {msg[name]}" for name in ("From", "To", "Cc", "Date") if msg.get(name)]
    if header_lines:
        lines.append("\n".join(header_lines))

    children: list[tuple[str, bytes]] = []
    bodies: list[str] = []
    counts = {"body_parts": 0, "attachments": 0}
    tables = 0

    def walk(part: EmailMessage) -> None:
        nonlocal tables
        disposition = part.get_content_disposition()
        filename = part.get_filename()
        ctype = part.get_content_type()
        if disposition == "attachment" or (filename and disposition != "inline" and not part.is_multipart()):
            if ctype == "message/rfc822":
                inner = part.get_payload()
                raw = inner[0].as_bytes() if isinstance(inner, list) and inner else part.get_payload(decode=True)
                children.append((filename or f"attachment-{len(children) + 1}.eml", raw or b""))
            else:
                children.append((filename or f"attachment-{len(children) + 1}", part.get_payload(decode=True) or b""))
            counts["attachments"] += 1
            return
        if part.is_multipart():
            subparts = list(part.iter_parts())
            if ctype == "multipart/alternative":
                plain = [p for p in subparts if p.get_content_type() == "text/plain"]
                html = [p for p in subparts if p.get_content_type() == "text/html"]
                chosen = plain[:1] or html[:1] or subparts[-1:]
                for p in chosen:
                    walk(p)
                return
            for p in subparts:
                walk(p)
            return
        if ctype == "text/plain":
            bodies.append(_part_text(part).strip())
            counts["body_parts"] += 1
        elif ctype == "text/html":
            md, _, t = html_to_markdown(_part_text(part))
            tables += t
            bodies.append(md)
            counts["body_parts"] += 1

    walk(msg)
    lines.extend(b for b in bodies if b)
    return Draft(
        markdown="\n\n".join(lines),
        children=[(name, payload) for name, payload in children if payload],
        stats={"element_counts": counts, "tables": tables},
    )
