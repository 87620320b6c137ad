"""Embedding providers behind one interface (``Embedder``); sentence-transformers by default."""

from __future__ import annotations

from rag_pipeline.config import Settings
from rag_pipeline.embedding.base import Embedder, EmbeddingError
from rag_pipeline.embedding.sentence_transformers import SentenceTransformerEmbedder


def get_embedder(settings: Settings) -> Embedder:
    """Return the configured embedder (``RAG_EMBEDDING_MODEL``, ``RAG_EMBEDDING_BF16``,
    ``RAG_EMBEDDING_BATCH_SIZE``). The model loads lazily on the first ``embed`` call."""
    return SentenceTransformerEmbedder(
        settings.embedding_model, bf16=settings.embedding_bf16, batch_size=settings.embedding_batch_size
    )


__all__ = ["Embedder", "EmbeddingError", "SentenceTransformerEmbedder", "get_embedder"]
