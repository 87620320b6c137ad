"""Target: the Markdown block parser and chunker (``rag_pipeline/chunking/markdown.py``), with the real
tokenizer of the bundled model (what ``chunk_for_embedder`` uses), under small random limits.

Properties (the chunker's docstring): nothing raises; ordinals are 0..n-1; every chunk has
``token_count == count_tokens(text) <= max_tokens`` and ``len(text) <= chunk_size + chunk_overlap``;
``kind`` is text/table/code, pages sorted; ``[]`` only for Markdown without text. For prose (no Markdown
syntax, cleaned by ``clean_markdown`` as the pipeline does) text is not lost: with whitespace removed, each chunk is a substring of the input that starts
at or before the end of what the chunks before it covered, and together they cover all of it, in order.
"""

from __future__ import annotations

import functools

from hypothesis import given
from hypothesis import strategies as st

from fuzz.common import Target, counted, guard, short
from rag_pipeline.chunking.markdown import ChunkLimits, chunk_markdown, parse_blocks
from rag_pipeline.extraction.clean import clean_markdown


@functools.cache
def _tokenizer():
    from rag_pipeline.embedding.sentence_transformers import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder().tokenizer  # tokenizer.json only; the model is not loaded


def count_tokens(texts):
    return [len(e.ids) for e in _tokenizer().encode_batch(list(texts), add_special_tokens=False)]


def token_offsets(text):
    return list(_tokenizer().encode(text, add_special_tokens=False).offsets)


WORDS = ["the", "bees", "dance", "Unaffable", "naïve", "ﬁle", "日本語の文章", "한국어", "x" * 40, "supercalifragilistic" * 5,
         "3.14", "e.g.", "U.S.A.", "\ufffd", "\ue000\ue001", "\u200e", "😀", "a-b", "end.", "why?", "stop!", "semi;",
         "colon:", "句。", "？", "！", "\u00a0", "...", "(paren)", "\"quote\"", "CamelCaseWord", "12345678901234567890"]
SEPARATORS = [" ", " ", " ", "\n", "\n\n", "\n\n\n", "\t", ". ", "  ", "\u3000", "\u2028", "\r\n"]
SYNTAX = ["# Heading", "## Sub", "###### six", "#", "# ", "```", "```python", "~~~", "<!-- page 3 -->", "<!-- page 0 -->",
          "| a | b |", "|---|---|", "| --- | :-: |", "| 1 | 2 |", "|  |  |", "| x |", "a | b", "--|--", "\\|", "|"]
PROSE_ALPHABET = st.characters(blacklist_characters="#|`~<", blacklist_categories=("Cs",))

prose = st.lists(st.one_of(st.sampled_from(WORDS), st.sampled_from(SEPARATORS), st.text(PROSE_ALPHABET, max_size=8)),
                 max_size=300).map("".join)
markdown = st.lists(st.one_of(st.sampled_from(WORDS), st.sampled_from(SEPARATORS), st.sampled_from(SYNTAX),
                              st.sampled_from(["\n"] * 3), st.text(max_size=8)), max_size=300).map("".join)


@st.composite
def limits(draw) -> ChunkLimits:
    size = draw(st.integers(8, 400))
    return ChunkLimits(chunk_size=size, chunk_overlap=draw(st.integers(0, size - 1)), max_tokens=draw(st.integers(4, 64)))  # a Hangul syllable is 3 tokens


def _nonspace(text: str) -> str:
    return "".join(text.split())


def check_cover(source: str, chunks) -> None:
    whole = _nonspace(source)
    frontier = 0
    for c in chunks:
        part = _nonspace(c.text)
        best, start = -1, whole.find(part)
        while 0 <= start <= frontier:
            best = start
            start = whole.find(part, start + 1)
        assert best >= 0, f"chunk {c.ordinal} {short(c.text)} is not the next text of the input (covered {frontier})"
        frontier = max(frontier, best + len(part))
    assert frontier == len(whole), f"text lost after {frontier} of {len(whole)} non-space characters"


def check_chunks(text: str, lim: ChunkLimits, chunks) -> None:
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    counts = count_tokens([c.text for c in chunks]) if chunks else []
    for c, n in zip(chunks, counts):
        assert c.token_count == n, f"token_count {c.token_count} but the tokenizer counts {n}"
        assert n <= lim.max_tokens, f"{n} tokens > max_tokens {lim.max_tokens}"
        assert len(c.text) <= lim.chunk_size + lim.chunk_overlap, \
            f"{len(c.text)} characters > {lim.chunk_size} + overlap {lim.chunk_overlap}"
        assert c.metadata.get("kind") in ("text", "table", "code")
        assert list(c.pages) == sorted(set(c.pages)) and all(isinstance(p, int) for p in c.pages)
    has_text = any(u.text.strip() for u in parse_blocks(text))
    assert bool(chunks) == has_text, f"{len(chunks)} chunks for Markdown {'with' if has_text else 'without'} text"


@given(prose, markdown, limits(), st.booleans())
@counted
def test(text: str, md: str, lim: ChunkLimits, exact: bool) -> None:
    offsets = token_offsets if exact else None
    text = clean_markdown(text)[0]  # what the pipeline chunks: cleaned Markdown (controls removed)
    with guard(lambda: short((text, lim))):
        chunks = chunk_markdown(text, lim, count_tokens, offsets)
        check_chunks(text, lim, chunks)
        check_cover(text, chunks)
    with guard(lambda: short((md, lim))):
        check_chunks(md, lim, chunk_markdown(md, lim, count_tokens, offsets))


TARGET = Target("chunking", test, "chunking/markdown.py: chunks within limits, prose never lost")
