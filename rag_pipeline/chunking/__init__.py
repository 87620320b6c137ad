"""Chunking: Markdown -> ``list[Chunk]`` within the embedding model's token limit."""

from __future__ import annotations

from rag_pipeline.chunking.markdown import Chunk, ChunkLimits, chunk_markdown, parse_blocks, table_rows_as_text


def chunk_for_embedder(markdown: str, embedder, *, chunk_size: int = 1000, chunk_overlap: int = 150) -> list[Chunk]:
    """Chunk ``markdown`` for ``embedder`` (an ``Embedder``): token limit and counts from its tokenizer.

    Returns ``list[Chunk]``; every chunk has ``token_count <= embedder.max_tokens``.
    """
    limits = ChunkLimits(chunk_size=chunk_size, chunk_overlap=chunk_overlap, max_tokens=embedder.max_tokens)
    tokenizer = getattr(embedder, "tokenizer", None)

    def offsets(text: str) -> list[tuple[int, int]]:
        return list(tokenizer.encode(text, add_special_tokens=False).offsets)

    usable = tokenizer is not None and hasattr(tokenizer, "encode")
    return chunk_markdown(markdown, limits, embedder.count_tokens, offsets if usable else None)


__all__ = ["Chunk", "ChunkLimits", "chunk_for_embedder", "chunk_markdown", "parse_blocks", "table_rows_as_text"]
