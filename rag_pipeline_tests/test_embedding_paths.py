"""Embedding paths of the sentence-transformers embedder: device choice, the default CPU path against float32,
the local ONNX export (made once, reused, rebuilt when broken, under a cross-process lock, torch when it
cannot be made) and ``RAG_EMBEDDING_BACKEND=torch`` as the earlier path.

Agreement bounds come from ``benchmarks/bench_embedding_paths.py`` (320 bench-corpus chunks + 80 queries):
float32 ONNX agrees with float32 torch to a minimum cosine of 1.000000 (float rounding, ~1e-7), bfloat16 torch to
0.9999 and OpenVINO's bfloat16 to 0.99996. The default path must therefore reach 0.999 (ten times the worst
measured distance 1 - cos, and still well above int8's 0.97, which fails top-5 agreement); float32 ONNX 0.99999.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from rag_pipeline.chunking import chunk_for_embedder
from rag_pipeline.embedding import SentenceTransformerEmbedder
from rag_pipeline.embedding import sentence_transformers as st_mod

LOGGER = "rag_pipeline.embedding.sentence_transformers"


@pytest.fixture(scope="module")
def float32():
    """Float32 torch on the CPU: the reference every path is compared with."""
    emb = SentenceTransformerEmbedder(bf16="off", backend="torch", device="cpu", cache_dir="/nonexistent")
    return emb


@pytest.fixture(scope="module")
def texts(shared_dir, float32) -> list[str]:
    """Real chunk texts: the pipeline's chunks of three bench-corpus documents (one real, two synthetic)."""
    bench = shared_dir / "bench-corpus"
    files = sorted((bench / "real").glob("*.txt"))[:1] + sorted((bench / "synth").glob("*.txt"))[:2]
    out: list[str] = []
    for path in files:
        out.extend(c.text for c in chunk_for_embedder(path.read_text(errors="replace"), float32))
    out = list(dict.fromkeys(out))[:20]
    assert len(out) >= 8
    return out


@pytest.fixture(scope="module")
def reference(float32, texts) -> np.ndarray:
    return float32.embed(texts)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def first_use(tmp_path_factory, float32, texts):
    """A first ``backend="onnx"`` embedder on an empty cache folder: ``(cache, embedder, log messages,
    os.stat of the exported file right after)``. Tests copy the folder before changing anything in it."""
    root = tmp_path_factory.mktemp("onnx-cache")
    handler = _Records()
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        emb = SentenceTransformerEmbedder(backend="onnx", bf16="auto", cache_dir=root)
        emb.embed(texts[:2])
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    return root, emb, handler.messages, st_mod.onnx_cache_dir(float32.path, root).joinpath("model.onnx").stat()


@pytest.fixture(scope="module")
def onnx_cache(first_use) -> Path:
    """A cache folder holding one float32 ONNX export of the bundled model (made by the code under test)."""
    return first_use[0]


def _onnx_file(root: Path, emb, name: str = "model.onnx") -> Path:
    return st_mod.onnx_cache_dir(emb.path, root) / name


def _min_cos(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float(np.sum(a * b, axis=1).min())


def _copy_cache(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# -- device -----------------------------------------------------------------------------------------------------


def test_auto_device_is_the_cpu_without_a_gpu_and_an_absent_gpu_is_a_configuration_error(monkeypatch):
    import torch

    has_cuda = torch.cuda.is_available()
    assert st_mod.resolve_device("auto") == ("cuda" if has_cuda else "cpu")
    assert st_mod.resolve_device("cpu") == "cpu"
    if has_cuda:  # a machine with a GPU: the explicit setting is honoured
        assert st_mod.resolve_device("cuda") == "cuda"
    else:  # this CI machine: no NVIDIA device nodes and a CPU-only torch build
        with pytest.raises(ValueError, match=r"RAG_EMBEDDING_DEVICE='cuda' but torch .* sees no CUDA GPU"):
            st_mod.resolve_device("cuda")
        monkeypatch.setenv("RAG_EMBEDDING_DEVICE", "cuda:0")
        with pytest.raises(ValueError, match="RAG_EMBEDDING_DEVICE='cuda:0'"):
            SentenceTransformerEmbedder()  # at construction, before any work
    with pytest.raises(ValueError, match="RAG_EMBEDDING_DEVICE='gpu0' is not a device torch knows"):
        st_mod.resolve_device("gpu0")


def test_unknown_or_conflicting_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="RAG_EMBEDDING_BACKEND='tensorrt': expected one of auto, torch"):
        SentenceTransformerEmbedder(backend="tensorrt")
    with pytest.raises(ValueError, match="RAG_EMBEDDING_BF16=on conflicts with RAG_EMBEDDING_BACKEND='onnx'"):
        st_mod.choose_backend("onnx", "on", "cpu")
    with pytest.raises(ValueError, match="runs on the CPU only"):
        st_mod.choose_backend("onnx", "auto", "cuda")
    assert st_mod.choose_backend("auto", "auto", "cuda")[0] == "torch"
    assert st_mod.choose_backend("auto", "off", "cpu")[0] == "torch"  # a pinned precision keeps torch


# -- the default path -------------------------------------------------------------------------------------------


def test_default_path_agrees_with_float32_and_keeps_model_id_and_token_limits(tmp_path, monkeypatch, float32,
                                                                              texts, reference):
    for var in ("RAG_EMBEDDING_BACKEND", "RAG_EMBEDDING_BF16", "RAG_EMBEDDING_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RAG_EMBEDDING_CACHE_DIR", str(tmp_path / "cache"))
    emb = SentenceTransformerEmbedder()
    vectors = emb.embed(texts)
    expected_backend = "openvino" if st_mod.openvino_available() else "torch"
    assert emb.backend == expected_backend and emb.device == "cpu"
    assert emb.model_id == float32.model_id == "all-MiniLM-L6-v2" and emb.dimension == 384
    assert vectors.shape == reference.shape and vectors.dtype == np.float32
    assert _min_cos(vectors, reference) >= 0.999
    assert emb.max_tokens == float32.max_tokens == 254
    assert emb.count_tokens(texts) == float32.count_tokens(texts)


def test_backend_torch_is_the_earlier_path(monkeypatch, reference, texts):
    from sentence_transformers import SentenceTransformer

    monkeypatch.setenv("RAG_EMBEDDING_BACKEND", "torch")
    monkeypatch.delenv("RAG_EMBEDDING_BF16", raising=False)
    emb = SentenceTransformerEmbedder()
    vectors = emb.embed(texts)
    assert emb.backend == "torch" and isinstance(emb._model, SentenceTransformer)
    assert emb.bf16 == st_mod.cpu_supports_bf16()  # bfloat16 where the CPU has it natively, as before
    assert _min_cos(vectors, reference) >= (0.999 if emb.bf16 else 0.99999)


# -- the ONNX export ---------------------------------------------------------------------------------------------


def test_onnx_vectors_token_counts_and_chunks_match_float32(onnx_cache, float32, texts, reference, shared_dir):
    emb = SentenceTransformerEmbedder(backend="onnx", bf16="auto", cache_dir=onnx_cache)
    vectors = emb.embed(texts)
    assert emb.backend == "onnx" and emb.model_id == "all-MiniLM-L6-v2"
    assert _min_cos(vectors, reference) >= 0.99999
    assert emb.max_tokens == float32.max_tokens and emb.count_tokens(texts) == float32.count_tokens(texts)
    doc = sorted((shared_dir / "bench-corpus" / "synth").glob("*.txt"))[5].read_text()
    assert [c.text for c in chunk_for_embedder(doc, emb)] == [c.text for c in chunk_for_embedder(doc, float32)]


def test_export_is_made_once_and_reused(caplog, first_use, float32, texts, reference):
    cache, first, messages, before = first_use
    onnx_file = _onnx_file(cache, first)
    manifest = json.loads(onnx_file.with_name("model.onnx.json").read_text())
    assert manifest["sha256"] == st_mod._sha256(onnx_file) and manifest["recipe"] == st_mod.ONNX_RECIPE
    exports = [m for m in messages if m.startswith("exporting")]
    assert len(exports) == 1 and exports[0].endswith("(first use)") and first.backend == "onnx"
    with caplog.at_level(logging.INFO, logger=LOGGER):
        second = SentenceTransformerEmbedder(backend="onnx", cache_dir=cache)
        vectors = second.embed(texts)
    after = onnx_file.stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)
    assert not [r for r in caplog.records if "exporting" in r.getMessage()]
    assert second.backend == "onnx" and _min_cos(vectors, reference) >= 0.99999


def test_a_damaged_file_is_rebuilt_with_the_reason(tmp_path, caplog, onnx_cache, float32, texts, reference):
    cache = _copy_cache(onnx_cache, tmp_path / "cache")
    onnx_file = _onnx_file(cache, float32)
    onnx_file.write_bytes(onnx_file.read_bytes()[: 1 << 20])  # truncated, as after a full disk
    with caplog.at_level(logging.INFO, logger=LOGGER):
        emb = SentenceTransformerEmbedder(backend="onnx", cache_dir=cache)
        vectors = emb.embed(texts)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("exporting all-MiniLM-L6-v2 as onnx" in m and "does not match its manifest" in m for m in warnings)
    assert emb.backend == "onnx" and _min_cos(vectors, reference) >= 0.99999
    manifest = json.loads(onnx_file.with_name("model.onnx.json").read_text())
    assert manifest["sha256"] == st_mod._sha256(onnx_file) and onnx_file.stat().st_size > 10 << 20


def test_a_file_that_matches_its_manifest_but_does_not_load_is_rebuilt(tmp_path, caplog, onnx_cache, float32,
                                                                      texts, reference):
    cache = _copy_cache(onnx_cache, tmp_path / "cache")
    onnx_file = _onnx_file(cache, float32)
    onnx_file.write_bytes(b"not an onnx model")
    manifest_file = onnx_file.with_name("model.onnx.json")
    manifest = json.loads(manifest_file.read_text())
    manifest_file.write_text(json.dumps({**manifest, "sha256": st_mod._sha256(onnx_file)}))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        emb = SentenceTransformerEmbedder(backend="onnx", cache_dir=cache)
        vectors = emb.embed(texts)
    messages = [r.getMessage() for r in caplog.records]
    assert any("model.onnx failed to load" in m and "rebuilding it" in m for m in messages)
    assert emb.backend == "onnx" and _min_cos(vectors, reference) >= 0.99999


def test_an_export_that_cannot_be_made_falls_back_to_torch_with_the_reason(tmp_path, caplog, texts, reference):
    blocker = tmp_path / "a-file"
    blocker.write_text("the cache folder cannot be created under a file")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        emb = SentenceTransformerEmbedder(backend="onnx", bf16="auto", cache_dir=blocker / "cache")
        vectors = emb.embed(texts)
    assert emb.backend == "torch"
    assert emb.backend_reason.startswith("onnx unavailable (") and "using torch" in emb.backend_reason
    assert any("onnx unavailable" in r.getMessage() for r in caplog.records)
    assert _min_cos(vectors, reference) >= (0.999 if emb.bf16 else 0.99999)


def _lock_holder(tmp_path, float32):
    """``(cache, export folder, process)``: another process holding the export folder's lock until a line
    arrives on its stdin (then it releases it and exits)."""
    cache = tmp_path / "cache"
    folder = st_mod.onnx_cache_dir(float32.path, cache)
    folder.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, filelock\n"
         f"lock = filelock.FileLock({str(folder / '.lock')!r})\nlock.acquire()\nprint('locked', flush=True)\n"
         "sys.stdin.readline()\nlock.release()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return cache, folder, holder


def test_two_processes_do_not_export_at_once(tmp_path, onnx_cache, float32):
    """Another process holds the cache folder's lock: our export waits for it, then finds the export that
    process made (copied in while it held the lock) and does not make its own."""
    cache, folder, holder = _lock_holder(tmp_path, float32)
    try:
        result: dict = {}
        worker = threading.Thread(target=lambda: result.update(path=st_mod.ensure_onnx(
            float32.path, cache, "onnx", max_seq_length=float32.max_seq_length)))
        worker.start()
        worker.join(2.0)
        assert worker.is_alive() and not (folder / "model.onnx").exists()  # blocked on the lock, nothing written
        source = st_mod.onnx_cache_dir(float32.path, onnx_cache)
        for name in ("model.onnx", "model.onnx.json"):  # what the holding process "exported"
            shutil.copy2(source / name, folder / name)
        made = (folder / "model.onnx").stat()
        holder.stdin.write("\n")
        holder.stdin.flush()
        worker.join(120)
        assert not worker.is_alive() and result["path"] == folder / "model.onnx"
        after = (folder / "model.onnx").stat()
        assert (after.st_ino, after.st_mtime_ns) == (made.st_ino, made.st_mtime_ns)  # reused, not re-exported
    finally:
        holder.kill()
        holder.wait()


def test_a_held_lock_times_out_instead_of_waiting_for_ever(tmp_path, float32):
    from filelock import FileLock, Timeout

    cache, folder, holder = _lock_holder(tmp_path, float32)
    try:
        with pytest.raises(Timeout):
            st_mod.ensure_onnx(float32.path, cache, "onnx", max_seq_length=float32.max_seq_length, lock_timeout_s=0.2)
        assert not (folder / "model.onnx").exists()
    finally:
        holder.kill()
        holder.wait()
    with FileLock(str(folder / ".lock"), timeout=5):  # the dead holder's lock is gone with its process
        pass


def test_int8_is_a_separate_opt_in_file_with_lower_agreement(tmp_path, onnx_cache, float32, texts, reference):
    cache = _copy_cache(onnx_cache, tmp_path / "cache")
    emb = SentenceTransformerEmbedder(backend="onnx-int8", cache_dir=cache)
    vectors = emb.embed(texts)
    int8_file = _onnx_file(cache, float32, "model-int8.onnx")
    assert emb.backend == "onnx-int8" and int8_file.exists()
    assert int8_file.stat().st_size < _onnx_file(cache, float32).stat().st_size / 2  # int8 weights
    assert 0.95 <= _min_cos(vectors, reference) < 0.99999  # close, but not float32's vectors


def test_openvino_backend_agrees_or_falls_back_when_the_package_is_absent(tmp_path, onnx_cache, texts, reference):
    cache = _copy_cache(onnx_cache, tmp_path / "cache")
    emb = SentenceTransformerEmbedder(backend="openvino", cache_dir=cache)
    vectors = emb.embed(texts)
    if st_mod.openvino_available():
        assert emb.backend == "openvino" and _min_cos(vectors, reference) >= 0.999
    else:  # not a dependency of this project: the embedder says so and runs torch
        assert emb.backend == "torch" and "No module named 'openvino'" in emb.backend_reason
        assert _min_cos(vectors, reference) >= 0.999


def test_settings_name_the_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("RAG_EMBEDDING_CACHE_DIR", str(tmp_path / "c"))
    assert SentenceTransformerEmbedder().cache_dir == tmp_path / "c"
    monkeypatch.delenv("RAG_EMBEDDING_CACHE_DIR")
    import platformdirs

    assert SentenceTransformerEmbedder().cache_dir == Path(platformdirs.user_cache_dir("rag-pipeline"))
    assert os.path.basename(st_mod.default_cache_dir()) == "rag-pipeline"
