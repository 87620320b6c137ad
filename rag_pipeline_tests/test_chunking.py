"""Chunking rules, table-driven, with the real model's tokenizer."""

from __future__ import annotations

import pytest

from rag_pipeline.chunking import ChunkLimits, chunk_for_embedder, chunk_markdown, parse_blocks, table_rows_as_text
from rag_pipeline.chunking.markdown import split_sentences

PROSE = " ".join(f"Sentence {i} talks about topic {i % 7} in plain words." for i in range(120))
TABLE = "\n".join(
    ["| Item | Q1 | Q2 |", "|---|---|---|"] + [f"| Row{i} | {i * 10} | {i * 11} |" for i in range(200)])


def test_paragraph_boundaries_are_kept_when_they_fit(embedder):
    paras = [f"Paragraph {i}. " + "word " * 40 for i in range(6)]
    chunks = chunk_for_embedder("\n\n".join(paras), embedder, chunk_size=1000, chunk_overlap=0)
    # every paragraph lies whole inside exactly one chunk
    for p in paras:
        assert sum(p.strip() in c.text for c in chunks) == 1


@pytest.mark.parametrize("text", [
    PROSE,                                    # long English paragraph: sentence splits
    "日本語の文章です。" * 400,                 # 3,600 Japanese characters: several times the token limit per 1,000 chars
    "x" * 5000 + " " + "y" * 3000,            # unbreakable words: hard split
    "\n".join(f"- item {i} " + "z" * 30 for i in range(200)),  # a long list: line splits
])
def test_no_chunk_exceeds_the_token_limit(embedder, text):
    chunks = chunk_for_embedder(text, embedder)
    assert chunks
    counted = embedder.count_tokens([c.text for c in chunks])
    assert max(counted) <= embedder.max_tokens
    assert [c.token_count for c in chunks] == counted
    assert all(len(c.text) <= 1000 for c in chunks)


def test_japanese_text_is_not_changed_by_splitting(embedder):
    text = "日本語の文章です。" * 400
    chunks = chunk_for_embedder(text, embedder, chunk_overlap=0)
    assert "".join(c.text for c in chunks) == text  # no spaces inserted, nothing lost


def test_overlap_between_prose_chunks(embedder):
    chunks = chunk_for_embedder(PROSE, embedder, chunk_size=600, chunk_overlap=100)
    assert len(chunks) > 3
    for a, b in zip(chunks, chunks[1:]):
        head = b.text[:40]
        assert head in a.text  # the next chunk starts with text from the end of the previous one


def test_table_rows_never_split_and_carry_their_header(embedder):
    chunks = chunk_for_embedder("# Budget\n\n" + TABLE, embedder)
    table_chunks = [c for c in chunks if c.metadata["kind"] == "table"]
    assert len(table_chunks) > 1
    rows = [line for c in table_chunks for line in c.text.splitlines() if line.startswith("Item:")]
    assert rows == [f"Item: Row{i}; Q1: {i * 10}; Q2: {i * 11}" for i in range(200)]  # each row whole, once, in order
    assert all(c.heading_path == ("Budget",) for c in table_chunks)


def test_merged_cells_pair_each_value_with_its_own_header():
    blocks = parse_blocks("| Region | Q1 | Q2 |\n|---|---|---|\n| EMEA | 10 | 11 |\n| EMEA | 20 | 21 |\n")
    assert [b.text for b in blocks] == ["Region: EMEA; Q1: 10; Q2: 11", "Region: EMEA; Q1: 20; Q2: 21"]


@pytest.mark.parametrize("header,rows,expected", [
    (["a", "b"], [["1", "2"]], ["a: 1; b: 2"]),
    (["a", ""], [["1", "2"]], ["a: 1; column 2: 2"]),     # unnamed column
    (["a", "b"], [["", ""]], []),                          # empty row dropped
    (["a"], [["1", "extra"]], ["a: 1; column 2: extra"]),  # more cells than headers
])
def test_table_rows_as_text(header, rows, expected):
    assert table_rows_as_text(header, rows) == expected


def test_pages_and_heading_paths():
    md = "<!-- page 1 -->\n# A\n\nalpha text\n\n<!-- page 2 -->\n## B\n\nbeta text\n"
    chunks = chunk_markdown(md, ChunkLimits(chunk_size=30, chunk_overlap=0, max_tokens=100),
                            lambda ts: [len(t.split()) for t in ts])
    by_text = {c.text: c for c in chunks}
    alpha = next(c for t, c in by_text.items() if "alpha" in t)
    beta = next(c for t, c in by_text.items() if "beta" in t)
    assert alpha.pages == (1,) and alpha.heading_path == ("A",)
    assert beta.pages == (2,) and beta.heading_path == ("A", "B")
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))


def test_code_fences_stay_whole():
    md = "text before\n\n```python\ndef f():\n\n    return 1\n```\n\ntext after"
    blocks = parse_blocks(md)
    assert [b.kind for b in blocks] == ["text", "code", "text"]
    assert blocks[1].text == "```python\ndef f():\n\n    return 1\n```"


def test_split_sentences_round_trips():
    text = "One. Two! Three? 四。五！ six"
    parts = split_sentences(text)
    assert "".join(parts) == text and len(parts) == 6


def test_limits_validate():
    with pytest.raises(ValueError):
        ChunkLimits(chunk_size=100, chunk_overlap=100)
