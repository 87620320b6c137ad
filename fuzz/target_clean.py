"""Target: text clean-up (``rag_pipeline/extraction/clean.py``).

Properties: nothing raises (the module documents "none of them raises on odd input");
``clean_markdown`` leaves no control character but tab/newline, no ``\\r``, no lone surrogate, reports a
non-negative count, and is idempotent (``clean(clean(x)) == clean(x)``); ``normalize_unicode`` and
``normalize_whitespace`` are idempotent on their own; ``join_lines`` keeps every non-whitespace character
but the line-break hyphens it drops, in order; ``find_page_furniture``/``is_page_number`` return their types.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fuzz.common import Target, counted, guard, short
from rag_pipeline.extraction import clean

PIECES = ["\r\n", "\r", "\n", "\n\n\n", "\x0c", "\x0b", "\x00", "\x85", "\u2028", "\u00ad", "\u200b", "\ufeff",
          "\ufffe", "\ud800", "ﬁ", "ﬂ", "\u00a0", "\u2003", "\u3000", "\t", "  ", "```", "~~~", "   ```", "    ```",
          "- ", "  - ", "\t* ", "  1. ", "12) ", "\u0301", "\u0306", " \u0301", "(\u0300", "¨", "㈱", "ｶ", "ｶﾞ", "Ａ",
          "\uf900", "\U0001f200", "か\u3099", "ef-", "ﬁ-", "efﬁ-\ncient", "-\n", "‐", "Page 3 of 9", "- 12 -", "iv",
          "# Title", "| a | b |", "|---|---|", "<!-- page 2 -->", "word", "Word", "日本語", "한국어", "x"]

texts = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=12)), max_size=40).map("".join)


def _nonspace(text: str) -> str:
    return "".join(text.split())


@given(texts, st.lists(texts, max_size=8), st.lists(st.lists(texts, max_size=8), max_size=8))
@counted
def test(text: str, lines: list[str], pages: list[list[str]]) -> None:
    with guard(lambda: short(text)):
        out, removed = clean.clean_markdown(text)
        assert isinstance(out, str) and isinstance(removed, int) and removed >= 0
        assert not clean._CONTROL_RE.search(out), f"control character left in {short(out)}"
        assert "\r" not in out
        again, removed_again = clean.clean_markdown(out)
        assert again == out, f"clean_markdown not idempotent: {short(out)} -> {short(again)}"
        assert removed_again == 0
        stripped, _ = clean.remove_control_chars(text)
        uni = clean.normalize_unicode(stripped)
        assert clean.normalize_unicode(uni) == uni, f"normalize_unicode not idempotent on {short(stripped)}"
        ws = clean.normalize_whitespace(stripped)
        assert clean.normalize_whitespace(ws) == ws, f"normalize_whitespace not idempotent on {short(stripped)}"

        joined = clean.join_lines(lines)
        assert isinstance(joined, str)
        hyphens = str.maketrans("", "", clean._HYPHENS)
        assert _nonspace(joined).translate(hyphens) == _nonspace("".join(lines)).translate(hyphens), \
            f"join_lines lost text: {short(lines)} -> {short(joined)}"
        furniture = clean.find_page_furniture(pages)
        assert isinstance(furniture, set) and all(isinstance(k, str) for k in furniture)
        for line in lines:
            assert isinstance(clean.is_page_number(line), bool)
            assert isinstance(clean.is_furniture(line, furniture), bool)


TARGET = Target("clean", test, "extraction/clean.py: no exception, no controls left, idempotent clean-up")
