"""Throughput of each remote embedding backend against its fake server, as a ratio of calling the model directly.

Texts: the distinct chunks of the first files of ../shared/bench-corpus/synth as the pipeline cuts them for the
bundled model (``chunk_for_embedder``), the first ``--texts`` of them. Paths, timed in the same run, warm (one
untimed call first), in interleaved rounds (every path once per round) so the load of a shared machine falls
on all alike:

* ``direct``: ``SentenceTransformerEmbedder.embed`` on all texts, in a worker thread as the fake server runs it
  (the floor);
* ``openai``, ``azure-openai``, ``tei``, ``ollama``: ``get_embedder`` for that provider against its
  ``FakeEmbeddingServer`` (rag_pipeline_tests/fakes/embedding_servers.py) on 127.0.0.1, which embeds with the
  same model object in this process: what the ratio shows is the cost of the HTTP path (request batching by
  the provider's default limits, JSON encoding of the vectors, the client library, validation), not a
  network or another machine's model;
* ``ollama-4096->1024``: the Ollama fake answering 4096-dimensional vectors (the qwen3-embedding width),
  truncated to 1024 client-side: the cost of moving 4096 floats per text as JSON.

Prints texts/s per path and the ratio to ``direct`` (1.00 = as fast; < 1 slower), and the time of each run
spent outside the model's ``embed`` (the fake's model is wrapped to add up its own time): the HTTP path's cost,
far less sensitive to the machine's load than the ratio. Nothing is downloaded.

    .venv/bin/python benchmarks/bench_embedders.py [--texts N] [--rounds R]

Default: 64 texts, 3 rounds (under a minute on 2 idle cores; about two on a loaded one).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SYNTH = REPO.parent / "shared" / "bench-corpus" / "synth"

PATHS = {  # name -> (fake api, provider, model, native dim, RAG_EMBEDDING_DIMENSIONS)
    "openai": ("openai", "openai", "minilm-compat", 384, 0),
    "azure-openai": ("azure", "azure-openai", "minilm-deployment", 384, 0),
    "tei": ("tei", "tei", "all-MiniLM-L6-v2", 384, 0),
    "ollama": ("ollama", "ollama", "all-minilm", 384, 0),
    "ollama-4096->1024": ("ollama", "ollama", "qwen3-embedding", 4096, 1024),
}


def corpus_texts(model, n: int) -> list[str]:
    from rag_pipeline.chunking import chunk_for_embedder

    texts: list[str] = []
    for path in sorted(SYNTH.glob("*.txt")):
        texts.extend(c.text for c in chunk_for_embedder(path.read_text(), model))
        texts = list(dict.fromkeys(texts))
        if len(texts) >= n:
            break
    return texts[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    import numpy as np

    from rag_pipeline.config import Settings
    from rag_pipeline.embedding import SentenceTransformerEmbedder, get_embedder
    from rag_pipeline_tests.fakes.embedding_servers import FakeEmbeddingServer

    if not SYNTH.is_dir():
        sys.exit(f"{SYNTH} is missing (../shared beside the clone)")
    model = SentenceTransformerEmbedder()
    texts = corpus_texts(model, args.texts)
    tokenizer = str(model.path / "tokenizer.json")
    print(f"{len(texts)} texts, {sum(model.count_tokens(texts))} tokens, {args.rounds} rounds; model bf16={model.bf16}")

    class Timed:
        """The model as a fake server uses it, adding up the seconds spent in ``embed``."""

        def __init__(self) -> None:
            self.seconds = 0.0

        def embed(self, batch):
            started = time.perf_counter()
            try:
                return model.embed(batch)
            finally:
                self.seconds += time.perf_counter() - started

        def count_tokens(self, batch):
            return model.count_tokens(batch)

    servers, embedders, timed = [], {}, {}
    for name, (api, provider, model_name, native, dims) in PATHS.items():
        timed[name] = Timed()
        server = FakeEmbeddingServer(timed[name], api=api, native_dim=native, api_key="sk-bench-key-0001",
                                     model_name=model_name if api in ("azure", "ollama") else None).start()
        servers.append(server)
        embedders[name] = get_embedder(Settings(
            embedding_provider=provider, embedding_api_url=server.url, embedding_model=model_name,
            embedding_api_key="sk-bench-key-0001", embedding_tokenizer=tokenizer, embedding_max_tokens=254,
            embedding_dimensions=dims))

    def run_direct():
        # in a thread of its own, as the fake server's handler thread runs the model: torch's intra-op
        # parallelism differs between the main thread and others (on a loaded 2-core machine the main thread's
        # 2-thread pool was 2-3x slower than a worker thread's), which would otherwise be measured as HTTP cost
        box: list = []
        worker = threading.Thread(target=lambda: box.append(model.embed(texts)))
        worker.start()
        worker.join()
        return box[0]

    runs = {"direct": run_direct, **{name: (lambda e=e: e.embed(texts)) for name, e in embedders.items()}}
    reference = run_direct()  # warm-up of the model
    for name, fn in runs.items():  # warm-up of each path, and a check that it returns the model's vectors
        vectors = fn()
        if vectors.shape[1] == reference.shape[1]:
            assert np.min(np.sum(vectors * reference, axis=1)) > 0.999, name
    timings: dict[str, list[float]] = {name: [] for name in runs}
    outside: dict[str, list[float]] = {name: [] for name in runs}  # seconds of a run not spent in the model
    names = list(runs)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:  # each round starts with another path
            fn = runs[name]
            in_model = timed[name].seconds if name in timed else 0.0
            started = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - started
            timings[name].append(elapsed)
            if name in timed:
                outside[name].append(elapsed - (timed[name].seconds - in_model))
    for server in servers:
        server.stop()

    floor = statistics.median(timings["direct"])
    print(f"{'path':<20}{'texts/s':>10}{'ratio':>8}{'requests':>10}{'HTTP path ms/text':>19}{'share':>7}")
    for name in runs:
        t = statistics.median(timings[name])
        calls = embedders[name].calls // (args.rounds + 1) if name in embedders else 1
        extra = statistics.median(outside[name]) if outside[name] else 0.0
        print(f"{name:<20}{len(texts) / t:>10.1f}{floor / t:>8.2f}{calls:>10}{1000 * extra / len(texts):>19.2f}"
              f"{extra / t:>7.1%}")
    print("ratio: the path's texts/s over direct's (same run, medians); HTTP path: the time of a run not spent in "
          "the model's embed (client, HTTP, JSON, validation), per text and as a share of the run")


if __name__ == "__main__":
    main()
