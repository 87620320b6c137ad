"""The default embedder: offline load, shapes, dedup, and bfloat16 retrieval agreeing with float32."""

from __future__ import annotations

import numpy as np
import pytest

from rag_pipeline.chunking import chunk_for_embedder
from rag_pipeline.embedding import SentenceTransformerEmbedder


def test_shapes_normalised_and_identical_texts_embedded_once(embedder):
    before = embedder.embedded
    vectors = embedder.embed(["alpha beta", "gamma", "alpha beta"])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    assert np.array_equal(vectors[0], vectors[2])
    assert embedder.embedded - before == 2


def test_unknown_model_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="never downloaded"):
        SentenceTransformerEmbedder("sentence-transformers/some-model-we-do-not-have")


@pytest.mark.slow
def test_bf16_retrieval_agrees_with_float32(shared_dir):
    texts = []
    for path in sorted((shared_dir / "bench-corpus" / "synth").glob("*.txt"))[:40]:
        texts.extend(c.text for c in chunk_for_embedder(path.read_text(), SentenceTransformerEmbedder(bf16="off")))
    texts = list(dict.fromkeys(texts))[:160]
    f32 = SentenceTransformerEmbedder(bf16="off").embed(texts)
    b16 = SentenceTransformerEmbedder(bf16="on").embed(texts)
    cos = np.sum(f32 * b16, axis=1) / (np.linalg.norm(f32, axis=1) * np.linalg.norm(b16, axis=1))
    assert cos.min() >= 0.999
    sims32, sims16 = f32 @ f32.T, b16 @ b16.T
    np.fill_diagonal(sims32, -1)
    np.fill_diagonal(sims16, -1)
    top32 = np.argsort(-sims32, axis=1)[:, :5]
    top16 = np.argsort(-sims16, axis=1)[:, :5]
    agreement = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(top32, top16)])
    assert agreement >= 0.95
