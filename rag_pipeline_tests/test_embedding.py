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


class _NaNOnce:
    """Wraps a loaded model's ``encode``: the real vectors, with the first ``rows`` rows of the first call set
    to NaN (what bfloat16 inference was seen to return once in the crash tests; it cannot be caused at will)."""

    def __init__(self, model, rows: int = 1, calls: int = 1) -> None:
        self.model, self.rows, self.calls = model, rows, calls
        self.real = model.encode

    def __call__(self, texts, **kw):
        out = np.array(self.real(texts, **kw), dtype=np.float32)
        if self.calls > 0:
            self.calls -= 1
            out[: self.rows] = np.nan
        return out


def test_non_finite_bf16_vectors_are_re_encoded_in_float32():
    emb = SentenceTransformerEmbedder(bf16="on")
    model = emb._load()
    model.encode = _NaNOnce(model)  # the instance attribute shadows the method; float() keeps the instance
    texts = ["the lighthouse keeper logged the storm", "tides follow the moon"]
    vectors = emb.embed(texts)
    assert np.isfinite(vectors).all() and emb.bf16 is False  # the process goes on in float32
    expected = SentenceTransformerEmbedder(bf16="off").embed(texts)
    assert np.min(np.sum(vectors * expected, axis=1)) >= 0.999


def test_vectors_that_stay_non_finite_are_an_embedding_error():
    from rag_pipeline.embedding import EmbeddingError

    emb = SentenceTransformerEmbedder(bf16="off")
    model = emb._load()
    model.encode = _NaNOnce(model, rows=1, calls=10)
    with pytest.raises(EmbeddingError, match="non-finite vectors for 1 of 1 texts"):
        emb.embed(["a text the model turns into NaN"])
    assert emb.calls == 0 and emb.embedded == 0
