"""CPU paths for the bundled all-MiniLM-L6-v2, each against float32 torch, in one run.

Texts: the distinct chunks of ../shared/bench-corpus as the pipeline makes them (``chunk_for_embedder``,
1,000 characters, 150 overlap), a deterministic evenly spaced sample of them. For each path prints speed
(texts/s and the ratio to the float32 floor, timed in the same run, warm: load/export times apart) and
agreement with float32 on the same texts: the minimum cosine between the two vectors of a text, and top-5
neighbour agreement (mean overlap of the 5 nearest sampled chunks under both paths) for short queries (a
chunk's first sentence) and for each chunk as a query (itself excluded).

Paths: float32 torch as sentence-transformers runs it (``encode`` sorts by characters: the floor, what
``bench_sync`` and LangChain's floor measure); float32 in corpus order (what batching by length is worth);
float32 batched by token length; bfloat16 weights (``RAG_EMBEDDING_BF16=on``, today's path where the CPU has
AVX512-BF16); torch dynamic int8 on Linear layers; ONNX float32 and ONNX int8 (dynamic quantisation), both
made here from the bundled model (``RAG_EMBEDDING_BACKEND`` onnx / onnx-int8, exported into a temporary
cache); OpenVINO on that float32 file (float32, and its default precision: bfloat16 where the CPU has it)
when the ``openvino`` package can be imported; with ``--fusions`` also onnxruntime's transformer fusions.
Paths are timed in interleaved rounds (every path on one slice of the texts, then the next slice), so that
the load of a shared machine falls on all of them alike. Nothing is downloaded (``HF_HUB_OFFLINE=1``).

    .venv/bin/python benchmarks/bench_embedding_paths.py [--quick] [--texts N] [--queries Q] [--rounds R]

Default: 256 texts, 80 queries, 4 rounds (~5 minutes on 2 busy cores); ``--quick``: 40 texts, 20 queries,
2 rounds (~1 minute).
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
sys.path.insert(0, str(REPO))


FLOOR = "torch float32 (floor: ST encode, char-sorted)"


def cpu_flags() -> list[str]:
    """The /proc/cpuinfo flags that decide these paths (AVX2, AVX-512 parts, VNNI, AMX)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = set(re.search(r"^flags\s*:(.*)$", text, re.M).group(1).split())
    wanted = ("avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
              "amx_tile", "amx_bf16", "amx_int8")
    return [f for f in wanted if f in flags]


def corpus_texts(embedder) -> list[str]:
    """Distinct chunk texts of the bench corpus in document order (as the pipeline chunks them)."""
    from rag_pipeline.chunking import chunk_for_embedder

    texts: list[str] = []
    for path in sorted((SHARED / "bench-corpus").rglob("*.txt")):
        texts.extend(c.text for c in chunk_for_embedder(path.read_text(errors="replace"), embedder))
    return list(dict.fromkeys(texts))


def first_sentence(text: str) -> str:
    """A short query from a chunk: its first sentence, at most 200 characters."""
    text = " ".join(text.split())
    match = re.search(r"^(.{20,200}?[.!?])(\s|$)", text)
    return match.group(1) if match else text[:200]


def top5_agreement(q_ref, c_ref, q_new, c_new, exclude_self: bool) -> float:
    """Mean |top5_ref ∩ top5_new| / 5 over the queries (rows of ``q_*``) against the chunks ``c_*``."""
    s_ref, s_new = q_ref @ c_ref.T, q_new @ c_new.T
    if exclude_self:
        np.fill_diagonal(s_ref, -np.inf)
        np.fill_diagonal(s_new, -np.inf)
    top_ref = np.argsort(-s_ref, axis=1)[:, :5]
    top_new = np.argsort(-s_new, axis=1)[:, :5]
    return float(np.mean([len(set(a) & set(b)) / 5 for a, b in zip(top_ref, top_new)]))


def token_sorted_batches(lengths: list[int], batch_size: int) -> list[np.ndarray]:
    order = np.argsort(lengths, kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 texts, 20 queries, 2 rounds (about a minute)")
    parser.add_argument("--texts", type=int, default=None, help="sampled chunk texts (default 256)")
    parser.add_argument("--queries", type=int, default=None, help="short queries (default 80)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4, help="interleaved timing rounds (default 4)")
    parser.add_argument("--fusions", action="store_true", help="also onnxruntime's transformer fusions")
    args = parser.parse_args()
    n_texts = args.texts or (40 if args.quick else 256)
    n_queries = args.queries or (20 if args.quick else 80)
    bs = args.batch_size

    import torch

    from rag_pipeline.embedding.sentence_transformers import (
        OnnxEncoder, SentenceTransformerEmbedder, cpu_supports_bf16, ensure_onnx, onnx_cache_dir,
        openvino_available)

    started_run = time.perf_counter()
    print(f"# bench_embedding_paths ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, "
          f"torch {torch.__version__} with {torch.get_num_threads()} threads)")
    print(f"CPU flags: {' '.join(cpu_flags()) or '(none of interest)'}; cpu_supports_bf16() = {cpu_supports_bf16()}")

    ref = SentenceTransformerEmbedder(bf16="off", backend="torch", device="cpu", cache_dir="/nonexistent")
    all_texts = corpus_texts(ref)
    step = max(1, len(all_texts) // n_texts)
    texts = all_texts[::step][:n_texts]
    qstep = max(1, len(all_texts) // n_queries)
    queries = list(dict.fromkeys(first_sentence(t) for t in all_texts[qstep // 2::qstep]))[:n_queries]
    lengths = [n + 2 for n in ref.count_tokens(texts)]
    print(f"texts: {len(texts)} of {len(all_texts)} distinct chunks (every {step}th); tokens per text "
          f"mean {np.mean(lengths):.0f}, max {max(lengths)}; {len(queries)} queries; batch size {bs}")

    cache = Path(tempfile.mkdtemp(prefix="rag-bench-onnx-"))
    model_path = ref.path
    notes: list[str] = []

    def st_model(dtype=None):
        from sentence_transformers import SentenceTransformer

        kwargs = {"torch_dtype": dtype} if dtype is not None else {}
        model = SentenceTransformer(str(model_path), device="cpu", local_files_only=True, model_kwargs=kwargs)
        model.max_seq_length = ref.max_seq_length
        return model

    def st_whole(model):
        return lambda items: model.encode(items, batch_size=bs, convert_to_numpy=True, normalize_embeddings=True,
                                          show_progress_bar=False)

    def st_batches(model, sort: bool):
        def run(items):
            lens = ref.count_tokens(items) if sort else None
            out = np.empty((len(items), ref.dimension), dtype=np.float32)
            batches = token_sorted_batches(lens, bs) if sort else \
                [np.arange(i, min(i + bs, len(items))) for i in range(0, len(items), bs)]
            for idx in batches:  # each encode gets one batch: its own length sort cannot regroup texts
                out[idx] = model.encode([items[i] for i in idx], batch_size=len(idx), convert_to_numpy=True,
                                        normalize_embeddings=True, show_progress_bar=False)
            return out
        return run

    paths: list[dict] = []

    def add(name: str, encode, setup_s: float, note: str = "") -> None:
        encode(texts[:4] + queries[:4])  # warm-up (first-call allocations, oneDNN/ORT kernel choice)
        paths.append({"name": name, "encode": encode, "setup": setup_s, "note": note, "s": 0.0,
                      "v": np.zeros((len(texts), ref.dimension), dtype=np.float32)})
        print(f"  set up {name} ({setup_s:.1f} s)", flush=True)

    # -- float32 floor and the torch paths
    t0 = time.perf_counter()
    f32 = st_model()
    add(FLOOR, st_whole(f32), time.perf_counter() - t0)
    add("torch float32, corpus order", st_batches(f32, sort=False), 0.0)
    add("torch float32, token-length batches", st_batches(f32, sort=True), 0.0)
    t0 = time.perf_counter()
    b16 = st_model(torch.bfloat16)
    add("torch bfloat16 weights (BF16=on)", st_batches(b16, sort=True), time.perf_counter() - t0,
        "native bf16" if cpu_supports_bf16() else "no native bf16 on this CPU: emulated")
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q8 = torch.ao.quantization.quantize_dynamic(copy.deepcopy(f32), {torch.nn.Linear}, dtype=torch.qint8)
    add("torch dynamic int8 (Linear)", st_batches(q8, sort=True), time.perf_counter() - t0)

    # -- ONNX, exported here exactly as the embedder does at first use (into a temporary cache)
    t0 = time.perf_counter()
    fp32_file = ensure_onnx(model_path, cache, "onnx", max_seq_length=ref.max_seq_length)
    export_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    enc = OnnxEncoder(fp32_file, model_path / "tokenizer.json", ref.max_seq_length)
    add("onnx float32 (onnxruntime)", lambda items: enc.encode(items, batch_size=bs),
        export_s + time.perf_counter() - t0, f"export {export_s:.1f} s")
    t0 = time.perf_counter()
    int8_file = ensure_onnx(model_path, cache, "onnx-int8", max_seq_length=ref.max_seq_length)
    quant_s = time.perf_counter() - t0
    enc8 = OnnxEncoder(int8_file, model_path / "tokenizer.json", ref.max_seq_length)
    add("onnx int8 dynamic (per-channel)", lambda items: enc8.encode(items, batch_size=bs), quant_s,
        f"quantise {quant_s:.1f} s")
    if args.fusions:
        try:
            from onnxruntime.transformers.optimizer import optimize_model

            t0 = time.perf_counter()
            fused_file = onnx_cache_dir(model_path, cache) / "model-fused.onnx"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fused = optimize_model(str(fp32_file), model_type="bert", num_heads=12, hidden_size=384)
            fused.save_model_to_file(str(fused_file))
            ops = fused.get_fused_operator_statistics()
            encf = OnnxEncoder(fused_file, model_path / "tokenizer.json", ref.max_seq_length)
            add("onnx float32 + ORT transformer fusions", lambda items: encf.encode(items, batch_size=bs),
                time.perf_counter() - t0, "fused: " + ", ".join(f"{k} {v}" for k, v in ops.items() if v))
        except Exception as exc:  # an optional extra: report and go on
            notes.append(f"ORT transformer fusions not measured: {type(exc).__name__}: {exc}")
    if openvino_available():
        import openvino as ov

        for label, precision in (("f32", "f32"), ("default precision", None)):
            t0 = time.perf_counter()
            ov_enc = OnnxEncoder(fp32_file, model_path / "tokenizer.json", ref.max_seq_length, runtime="openvino",
                                 precision=precision)
            add(f"openvino {label}", lambda items, e=ov_enc: e.encode(items, batch_size=bs),
                time.perf_counter() - t0, f"openvino {ov.__version__.split('-')[0]}, runs {ov_enc.precision}")
    else:
        notes.append("OpenVINO not measured: the openvino package is not installed (not a dependency)")

    # -- timed rounds: every path on each slice in turn, so the machine's load changes hit all paths alike
    rounds = max(1, min(2 if args.quick else args.rounds, len(texts) // bs))
    slices = np.array_split(np.arange(len(texts)), rounds)
    for r, idx in enumerate(slices):
        items = [texts[i] for i in idx]
        order = paths if r % 2 == 0 else paths[::-1]
        for path in order:
            t0 = time.perf_counter()
            path["v"][idx] = np.asarray(path["encode"](items), dtype=np.float32)
            path["s"] += time.perf_counter() - t0
        print(f"  round {r + 1}/{rounds} done", flush=True)
    results = paths
    for path in results:
        path["q"] = np.asarray(path["encode"](queries), dtype=np.float32)
        for key in ("v", "q"):
            path[key] /= np.linalg.norm(path[key], axis=1, keepdims=True)

    # -- table
    base = results[0]
    floor_s = base["s"]
    print(f"\nfloor ({FLOOR}): {len(texts) / floor_s:.1f} texts/s; {rounds} interleaved rounds\n")
    print("| path | texts/s | time vs floor | speed-up | min cosine | top-5 queries | top-5 chunks | set-up s | notes |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        cos = np.sum(r["v"] * base["v"], axis=1)
        qcos = np.sum(r["q"] * base["q"], axis=1)
        agree_q = top5_agreement(base["q"], base["v"], r["q"], r["v"], exclude_self=False)
        agree_c = top5_agreement(base["v"], base["v"], r["v"], r["v"], exclude_self=True)
        r.update(min_cos=float(min(cos.min(), qcos.min())), agree=min(agree_q, agree_c))
        print(f"| {r['name']} | {len(texts) / r['s']:.1f} | {r['s'] / floor_s:.2f}x | {floor_s / r['s']:.2f}x | "
              f"{r['min_cos']:.6f} | {agree_q:.1%} | {agree_c:.1%} | {r['setup']:.1f} | {r['note']} |")
    eligible = [r for r in results[1:] if r["agree"] >= 0.99]
    best = min(eligible, key=lambda r: r["s"]) if eligible else None
    if best:
        print(f"\nfastest with top-5 agreement >= 99% (both measures): {best['name']} "
              f"({floor_s / best['s']:.2f}x the floor's speed)")
    for note in notes:
        print(f"note: {note}")
    print(f"run took {time.perf_counter() - started_run:.0f} s")


if __name__ == "__main__":
    main()
