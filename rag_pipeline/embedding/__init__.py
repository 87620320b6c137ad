"""Embedding providers behind one interface (``Embedder``); sentence-transformers by default."""

from __future__ import annotations

from rag_pipeline.config import Settings
from rag_pipeline.embedding.base import Embedder, EmbeddingError
from rag_pipeline.embedding.sentence_transformers import SentenceTransformerEmbedder


def get_embedder(settings: Settings) -> Embedder:
    """Return the embedder ``RAG_EMBEDDING_PROVIDER`` names.

    ``sentence-transformers`` (the default): ``RAG_EMBEDDING_MODEL``, ``RAG_EMBEDDING_BF16``,
    ``RAG_EMBEDDING_BATCH_SIZE``, ``RAG_EMBEDDING_BACKEND``, ``RAG_EMBEDDING_DEVICE``, ``RAG_EMBEDDING_CACHE_DIR``; the model loads lazily on the first ``embed`` call. ``openai`` |
    ``azure-openai`` | ``tei`` | ``ollama``: an HTTP client (``embedding.remote.build_remote_embedder``; no
    request is sent until the first ``embed``, or ``dimension``/``model_id`` when the dimension must be probed).
    Raises ``ValueError`` naming the variable for an unknown provider, a missing URL or key."""
    provider = (settings.embedding_provider or "").strip().lower()
    if provider in ("", "sentence-transformers", "sentence_transformers"):
        return SentenceTransformerEmbedder(
            settings.embedding_model, bf16=settings.embedding_bf16, batch_size=settings.embedding_batch_size,
            backend=settings.embedding_backend, device=settings.embedding_device,
            cache_dir=settings.embedding_cache_dir,
        )
    from rag_pipeline.embedding.remote import build_remote_embedder

    return build_remote_embedder(settings)


__all__ = ["Embedder", "EmbeddingError", "SentenceTransformerEmbedder", "get_embedder"]
