"""``MappedEmbedder``: "another model" for rollout tests and ``benchmarks/bench_rollout.py``.

The real bundled model behind a fixed random matrix with orthonormal columns, under its own model id: its
vectors differ from the bundled model's (a query embedded with one and searched in the other's vectors ranks
by noise), while among its own vectors every cosine is the bundled model's, so the right answer of any
query is known independently: the bundled model's ranking. ``dimension`` over the base's (e.g. 2,560) makes
the map an isometric embedding into more dimensions (stored as ``halfvec`` above 2,000).
"""

from __future__ import annotations

import numpy as np


class MappedEmbedder:
    """``base``'s vectors times a fixed (``seed``) random ``dimension x base.dimension`` matrix with
    orthonormal columns, re-normalised; an ``Embedder`` (counts ``calls`` and ``embedded``)."""

    def __init__(self, base, *, dimension: int | None = None, seed: int = 7, name: str | None = None):
        self.base = base
        self.dimension = dimension or base.dimension
        q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((self.dimension, base.dimension)))
        self.matrix = q.astype(np.float32)
        self.model_id = name or f"mapped-minilm-{seed}@{self.dimension}"
        self.max_tokens = base.max_tokens
        self.calls = self.embedded = 0
        self.settings_spec = {"embedding_model": self.model_id}  # not rebuildable: only this object embeds it

    def count_tokens(self, texts):
        return self.base.count_tokens(texts)

    def embed(self, texts):
        self.calls += 1
        self.embedded += len(texts)
        v = self.base.embed(list(texts)) @ self.matrix.T
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)
