"""The ``Embedder`` interface every embedding provider implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


class EmbeddingError(RuntimeError):
    """The provider failed to embed a batch (transient from the sync's point of view)."""


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors.

    ``model_id``: stored with every chunk. ``dimension``: vector length. ``max_tokens``: the most
    tokens of *content* one text may have (the model's limit minus special tokens); the chunker keeps
    every chunk within it, counted by ``count_tokens`` (the model's own tokenizer). ``embed`` returns a
    ``float32`` array of shape ``(len(texts), dimension)``, L2-normalised, rows in input order; raises
    ``EmbeddingError``. ``calls``/``embedded`` count provider calls and texts embedded (tests, benchmarks).
    """

    model_id: str
    dimension: int
    max_tokens: int
    calls: int
    embedded: int

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Content tokens per text (no special tokens, no truncation)."""
        ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``; shape ``(n, dimension)``, float32, normalised."""
        ...
