"""The pure clean-up helpers: controls, Unicode, whitespace, de-hyphenation, page furniture, tables.

Table-driven, one line of comment per case; no documents needed.
"""

from __future__ import annotations

import pytest

from rag_pipeline.extraction.clean import (
    clean_markdown,
    find_page_furniture,
    is_furniture,
    is_page_number,
    join_hyphenated,
    join_lines,
    normalize_unicode,
    normalize_whitespace,
    remove_control_chars,
)
from rag_pipeline.extraction.quality import prefer_joined, text_layer_quality
from rag_pipeline.extraction.tables import expand_spans, grid_to_markdown, html_table_to_grid


@pytest.mark.parametrize(
    ("raw", "clean", "removed"),
    [
        ("a\x00b", "ab", 1),  # NUL (C01)
        ("tab\tand\nnewline", "tab\tand\nnewline", 0),  # tab and newline stay
        ("crlf\r\nline", "crlf\nline", 0),  # line ends normalised, not counted
        ("bell\x07 esc\x1b del\x7f c1\x85", "bell esc del c1", 4),  # C0, DEL, C1
        ("pdfium\ufffemarker", "pdfiummarker", 1),  # non-character U+FFFE
        ("lone\ud800surrogate", "lonesurrogate", 1),  # invalid in PostgreSQL text
        ("soft\u00adhyphen zero\u200bwidth", "softhyphen zerowidth", 0),  # invisible, not controls
    ],
)
def test_remove_control_chars(raw, clean, removed):
    assert remove_control_chars(raw) == (clean, removed)


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("The \ufb01nancial o\ufb03ce", "The financial office"),  # ligatures (C02)
        ("\uff21\uff22\uff23\uff11\uff12\uff13", "ABC123"),  # full-width ASCII
        ("non\u00a0breaking", "non breaking"),  # NBSP
        ("日本語のテキスト、カタカナ", "日本語のテキスト、カタカナ"),  # CJK untouched
        ("ｶﾀｶﾅ ㈱ 神", "ｶﾀｶﾅ ㈱ 神"),  # half-width kana, enclosed CJK, compatibility ideograph untouched
        ("한국어 ㄱ", "한국어 ㄱ"),  # Hangul and compatibility jamo untouched
        ("Ｗｏｒｄ 漢字", "Word 漢字"),  # mixed: ASCII folded, CJK kept
        ("Oguz \u02d8 next", "Oguz   next"),  # a spacing breve stranded after a space is dropped
    ],
)
def test_normalize_unicode(raw, normalised):
    assert normalize_unicode(raw) == normalised


def test_normalize_whitespace_keeps_code_and_list_indentation():
    md = "Title   with  spaces  \n\n\n\nPara\n\n```\n  code\tindent\n```\n\n- a\n  - nested\n"
    assert normalize_whitespace(md) == "Title with spaces\n\nPara\n\n```\n  code\tindent\n```\n\n- a\n  - nested"


def test_clean_markdown_counts_and_normalises():
    assert clean_markdown("A\x00B  \ufb01\n\n\n\nC") == ("AB fi\n\nC", 1)


@pytest.mark.parametrize(
    ("left", "right", "joined"),
    [
        ("powerful capabili-", "ties of retrieval", "powerful capabilities of retrieval"),  # C03
        ("for n-", "tridecanal detection.", "for n-tridecanal detection."),  # C03: real hyphen kept
        ("a simple dual-", "encoder framework", "a simple dual-encoder framework"),  # both parts words
        ("Con-", "versely, the", "Conversely, the"),  # capitalised fragment, known word
        ("the well-", "known result", "the well-known result"),  # the hyphenated form is far more common
        ("models are fine-", "tuned on", "models are fine-tuned on"),  # likewise
        ("em-", "beddings are", "embeddings are"),  # joined word more common than the parts
        ("Smith-", "Jones said", "Smith-Jones said"),  # next line capitalised: keep
        ("value x-", "y plane", "value x-y plane"),  # one-letter fragment, unknown joined word
    ],
)
def test_join_hyphenated_with_dictionary(left, right, joined):
    assert join_hyphenated(left, right, prefer_joined) == joined


def test_join_hyphenated_without_dictionary_is_conservative():
    assert join_hyphenated("capabili-", "ties", None) == "capabilities"
    assert join_hyphenated("n-", "tridecanal", None) == "n-tridecanal"


def test_join_lines_spaces_and_hyphens():
    assert join_lines(["The model shows powerful capabili-", "ties of retrieval for n-", "tridecanal detection."], prefer_joined) == (
        "The model shows powerful capabilities of retrieval for n-tridecanal detection."
    )


@pytest.mark.parametrize(
    ("line", "expected"),
    [("12", True), ("- 12 -", True), ("Page 3 of 9", True), ("iv", True), ("2023.", False), ("12 apples", False)],
)
def test_is_page_number(line, expected):
    assert is_page_number(line) is expected


def test_find_page_furniture_needs_repetition_on_most_pages():
    words = "alpha bravo charlie delta echo foxtrot golf hotel".split()
    pages = [
        [f"ACME Annual Report {2020 + i % 2}", *(f"{w} {words[i]} paragraph" for w in words), f"Page {i + 1}"]
        for i in range(6)
    ]
    furniture = find_page_furniture(pages)
    assert is_furniture("ACME Annual Report 2021", furniture)
    assert is_furniture("Page 7", furniture)
    assert not is_furniture("alpha delta paragraph", furniture)
    # two pages (or a duplicated page) are never enough to call a line furniture
    assert find_page_furniture(pages[:2]) == set()


def test_text_layer_quality_separates_garbage_from_words():
    clean = "Desiring to keep you posted on the progress of the Foundation you will be interested " * 3
    garbage = "«POAH «3E*»CM tanntxim. n»Bfl. iseorty ttsrootj saifii s*r;tiiR» FRG&t USSSOBS Eeairing " * 3
    assert text_layer_quality(clean) > 0.95
    assert text_layer_quality(garbage) < 0.3
    assert text_layer_quality("日本語の文章です。" * 20) is None  # no verdict for non-Latin script


def test_expand_spans_repeats_merged_cells():
    # C07 shape: first column merged over two rows
    cells = [[("Region", 1, 1), ("Q1", 1, 1), ("Q2", 1, 1)], [("EMEA", 2, 1), ("10", 1, 1), ("11", 1, 1)], [("20", 1, 1), ("21", 1, 1)]]
    assert expand_spans(cells) == [["Region", "Q1", "Q2"], ["EMEA", "10", "11"], ["EMEA", "20", "21"]]


def test_html_table_with_row_and_col_spans():
    html = '<table><tr><td rowspan="2">a</td><td colspan="2">b</td></tr><tr><td>c</td><td rowspan="2">d</td></tr><tr><td colspan="2">e</td></tr></table>'
    assert html_table_to_grid(html) == [["a", "b", "b"], ["a", "c", "d"], ["e", "e", "d"]]


def test_grid_to_markdown_pads_escapes_and_names_missing_headers():
    md = grid_to_markdown([["Item", "", "Note"], ["a|b", "1", "line\nbreak"], ["c"]])
    assert md.split("\n") == [
        "| Item | Column 2 | Note |",
        "|---|---|---|",
        "| a\\|b | 1 | line break |",
        "| c | | |",
    ]
    assert grid_to_markdown([["", ""], [" ", None]]) == ""
