"""The embedders a write needs: one per kept embedding generation (``store.generations``).

``targets(conn, settings, embedder)`` pairs every kept generation with its embedder: the configured one
for the configured model's generation, else one rebuilt from the generation's recorded settings
(``Generation.spec`` over the current ones, so keys still come from the environment), cached per process.
The result, ``WriteTargets``, is itself an ``Embedder`` for chunking: its ``max_tokens`` is the smallest
limit of the generations and ``count_tokens`` the largest count any of their tokenizers gives, so one set of
chunks fits every model it is embedded with. A generation whose embedder cannot be built is left out with
a logged reason (its documents are filled later); the active generation's cannot be left out: that raises
``EmbeddingError``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import psycopg

from rag_pipeline.config import Settings
from rag_pipeline.embedding.base import Embedder, EmbeddingError
from rag_pipeline.store import generations as gen
from rag_pipeline.store.generations import Generation, embedder_for

log = logging.getLogger(__name__)

@dataclass
class Target:
    """One kept generation and the embedder that fills it."""

    generation: Generation
    embedder: Embedder


@dataclass
class WriteTargets:
    """Every kept generation a write goes to, the active one first (see module docstring). Also an
    ``Embedder`` for chunking and token counts (``model_id``/``dimension`` are the active generation's)."""

    targets: list[Target]
    skipped: dict[int, str] = field(default_factory=dict)
    """Kept generations left out (id -> why): their documents lack them until a later write fills them."""

    @property
    def active(self) -> Target:
        return self.targets[0]

    @property
    def model_id(self) -> str:
        return self.active.generation.model

    @property
    def dimension(self) -> int:
        return self.active.generation.dimension

    @property
    def max_tokens(self) -> int:
        return min(t.embedder.max_tokens for t in self.targets)

    @property
    def calls(self) -> int:
        return sum(t.embedder.calls for t in self._distinct())

    @property
    def embedded(self) -> int:
        return sum(t.embedder.embedded for t in self._distinct())

    def _distinct(self) -> list[Target]:
        seen, out = set(), []
        for t in self.targets:
            if id(t.embedder) not in seen:
                seen.add(id(t.embedder))
                out.append(t)
        return out

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        counts = [t.embedder.count_tokens(texts) for t in self._distinct()]
        return [max(column) for column in zip(*counts, strict=True)] if texts else []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """The active generation's vectors (a query's; writes embed per target)."""
        return self.active.embedder.embed(texts)

    @property
    def generation_ids(self) -> list[int]:
        return [t.generation.id for t in self.targets]


def targets(conn: psycopg.Connection, settings: Settings, embedder: Embedder) -> WriteTargets:
    """``WriteTargets`` for the kept generations now (``embedder``: the configured one; an existing
    ``WriteTargets`` is returned as it is). Raises ``EmbeddingError`` when the active generation's embedder
    cannot be built."""
    if isinstance(embedder, WriteTargets):
        return embedder
    try:
        gen.ensure_for(conn, embedder, settings)  # a configured model new to this index: a building generation
    except (gen.GenerationError, gen.DimensionError) as exc:
        raise EmbeddingError(f"{embedder.model_id}: {exc}") from None
    kept = gen.kept(conn)
    ordered = sorted(kept, key=lambda g: (g.state != "active", g.id))
    out: list[Target] = []
    skipped: dict[int, str] = {}
    for g in ordered:
        try:
            out.append(Target(g, embedder_for(g, settings, embedder)))
        except EmbeddingError as exc:
            if g.state == "active":
                raise
            skipped[g.id] = str(exc)
            log.warning("embedding generation %s (%s) is not written: %s", g.id, g.model, exc)
    if not out or out[0].generation.state != "active":
        raise EmbeddingError("the index has no active embedding generation")
    return WriteTargets(out, skipped)
