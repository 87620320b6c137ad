"""Every non-PDF format on real corpus files, and type detection against claimed types."""

from __future__ import annotations

import io
import zipfile
from email.message import EmailMessage

import pytest

from rag_pipeline.extraction import (
    NoTextError,
    TypeMismatchError,
    UnsupportedFormatError,
    extract_in_process,
)
from rag_pipeline.extraction.detect import detect


def _extract(path, **kwargs):
    return extract_in_process(path.read_bytes(), filename=path.name, **kwargs)


@pytest.fixture(scope="module")
def corpus(shared_dir):
    return shared_dir / "corpus"


def test_docx_tables_simple_nested_and_merged(corpus):
    result = _extract(corpus / "docx-tables.docx")
    md = result.markdown
    assert result.doc_type == "docx" and result.stats["tables"] == 3
    assert "| Header Col 1 | Header Col 2 |\n|---|---|\n| Lorem ipsum | A link example |" in md
    # the nested table's text stays in its cell
    assert "| d | e f g&t h | i |" in md
    # merged cells repeat their value in every covered position
    assert "| a | b | b |\n|---|---|---|\n| a | c | d |\n| e | e | d |" in md


def test_pptx_slides_bullets_table_and_empty_notes(corpus):
    result = _extract(corpus / "sample-presentation.pptx")
    md = result.markdown
    assert result.page_count == 4
    for n in range(1, 5):
        assert f"<!-- page {n} -->\n\n## Slide {n}: " in md
    assert "## Slide 4: This is kinda backwards, huh?" in md
    assert "| Table | A | B | C |\n|---|---|---|---|\n| 1 | A1 | B1 | C1 |" in md
    assert "- Topic 1\n  - Subtopic 1\n  - Subtopic 2\n    - Subtopic 1 of subtopic 2" in md
    assert "### Notes" not in md  # every notes part is empty
    assert result.stats["element_counts"]["notes"] == 0


def test_xlsx_every_sheet_named_with_titles_and_cached_totals(corpus):
    result = _extract(corpus / "2023-half-year-analyses-by-segment.xlsx")
    md = result.markdown
    assert result.page_count == 5 and md.count("## Sheet: ") == 5
    assert "## Sheet: Reconciliation 30 06 2023" in md
    assert "3.1 Operating segments" in md
    assert "| Zone NA | 12553 | 2713 | 2632 | -81 | -29 | -44 | -337 |" in md
    # formula cells with cached values give the value (=SUM(B9:B17) -> 46293)
    assert "| Total | 46293 | 7904 | 7351 |" in md
    assert "=SUM(" not in md


def test_csv_title_row_then_header(corpus):
    result = _extract(corpus / "stanley-cups.csv")
    assert result.markdown == (
        "# Stanley Cups\n\n| Team | Location | Stanley Cups |\n|---|---|---|\n"
        "| Blues | STL | 1 |\n| Flyers | PHI | 2 |\n| Maple Leafs | TOR | 13 |"
    )


def test_html_without_charset_is_read_as_windows_1252(corpus):
    result = _extract(corpus / "fake-html-cp1252.html")
    assert result.stats["encoding"] == "cp1252"
    md = result.markdown
    assert "Der Preis betrug 15,50 €." in md
    assert "L'été était très chaud" in md and "El niño comió paella con ñoquis." in md
    assert "# My First Heading" in md


def test_html_filing_tables(corpus):
    result = _extract(corpus / "example-10k-1p.html")
    assert result.stats["tables"] == 4
    assert "| Title of each class | Trading symbol | Name of exchange on which registered |" in result.markdown
    assert "| Common stock | GLXZ | OTCQB marketplace |" in result.markdown


def test_markdown_keeps_fenced_code_and_tables(corpus):
    code = _extract(corpus / "codeblock.md")
    source = (corpus / "codeblock.md").read_text()
    blocks = source.split("```")[1::2]
    assert len(blocks) >= 2
    for block in blocks:  # each fenced block (language line and body) comes through unchanged
        assert "```" + block.rstrip("\n") + "\n```" in code.markdown
    table = _extract(corpus / "simple-table.md")
    assert table.stats["tables"] == 1 and "Item | Price" in table.markdown


def test_utf16_text_with_bom(corpus):
    result = _extract(corpus / "fake-text-utf-16.txt")
    assert result.stats["encoding"] == "utf-16-le"
    assert "Doylestown, PA 18901" in result.markdown and "\ufeff" not in result.markdown


def test_email_body_and_attachment_as_child(corpus):
    result = _extract(corpus / "fake-email-attachment.eml")
    md = result.markdown
    assert md.startswith("# Fake email with attachment")
    assert "From: Mallori Harrell <mallori@unstructured.io>" in md
    assert "Here's the attachments!" in md
    assert "Hey this is a fake attachment!" not in md  # the attachment is its own document
    assert result.children == [("fake-attachment.txt", b"Hey this is a fake attachment!")]


def test_email_bodies_decoded_by_their_charset():
    msg = EmailMessage()
    msg["Subject"] = "Grüße aus Zürich"
    msg["From"] = "a@example.org"
    msg["To"] = "b@example.org"
    msg.set_content("Schöne Grüße, das Büro kostet 15 €.", charset="iso-8859-15", cte="quoted-printable")
    msg.add_alternative("<p>Schöne Grüße <b>HTML</b></p>", subtype="html", charset="utf-8")
    msg.add_attachment(b"%PDF-1.4 fake", maintype="application", subtype="pdf", filename="scan.pdf")
    raw = msg.as_bytes()
    assert b"Sch=F6ne Gr=FC=DFe" in raw  # the body really is Latin-9 quoted-printable
    result = extract_in_process(raw, filename="mail.eml")
    assert "# Grüße aus Zürich" in result.markdown
    assert "Schöne Grüße, das Büro kostet 15 €." in result.markdown  # text/plain preferred
    assert "HTML" not in result.markdown
    assert result.children == [("scan.pdf", b"%PDF-1.4 fake")]


# --- type detection --------------------------------------------------------------------------------


def test_detection_by_content_and_claims(corpus):
    pdf = (corpus / "fake-memo.pdf").read_bytes()
    docx = (corpus / "docx-tables.docx").read_bytes()
    # no extension: the declared MIME type, then the content decides
    assert detect(pdf, "download", "application/pdf").doc_type == "pdf"
    assert detect(pdf, "download", None).doc_type == "pdf"
    assert detect(docx, "blob", None).doc_type == "docx"
    # a text file with an unknown extension is plain text
    assert detect(b"just some words\n", "notes.xyz", None).doc_type == "txt"


@pytest.mark.parametrize(
    ("source", "claimed_name", "names"),
    [
        ("docx-tables.docx", "report.pdf", ("PDF", "Word (DOCX)")),  # DOCX bytes named .pdf
        ("fake-memo.pdf", "report.docx", ("Word (DOCX)", "PDF")),  # PDF bytes named .docx
        ("fake-memo.pdf", "page.html", ("HTML", "PDF")),  # binary where text is claimed
    ],
)
def test_type_mismatch_names_both_types(corpus, source, claimed_name, names):
    with pytest.raises(TypeMismatchError) as info:
        extract_in_process((corpus / source).read_bytes(), filename=claimed_name)
    for name in names:
        assert name in info.value.reason


def test_unsupported_binary_and_corrupt_container(corpus):
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument((corpus / "fake-memo.pdf").read_bytes())
    buf = io.BytesIO()
    pdf[0].render(scale=0.5).to_pil().save(buf, format="PNG")
    with pytest.raises(UnsupportedFormatError) as info:
        extract_in_process(buf.getvalue(), filename="scan.png")
    assert "image/png" in info.value.reason
    # a ZIP that is no Office document
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("readme.txt", "hello")
    with pytest.raises(TypeMismatchError):
        extract_in_process(archive.getvalue(), filename="book.xlsx")
    # a truncated DOCX
    truncated = (corpus / "docx-tables.docx").read_bytes()[:3000]
    with pytest.raises(UnsupportedFormatError) as info:
        extract_in_process(truncated, filename="cut.docx")
    assert "corrupt" in info.value.reason


def test_non_empty_file_without_text_is_no_text():
    with pytest.raises(NoTextError) as info:
        extract_in_process(b" \n\t\n \r\n", filename="blank.txt")
    assert info.value.terminal is True and info.value.reason.startswith("no text")
