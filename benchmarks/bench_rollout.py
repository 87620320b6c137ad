"""Model rollout benchmark (issue 13, part 3): build a new embedding generation beside the live one while
queries run, and count the queries that saw a partial corpus.

One run, a fresh embedded PostgreSQL in a temporary directory: sync ``../shared/bench-corpus`` (300 text
documents) with the bundled model; then "another model" (``rag_pipeline_tests/fakes/mapped_embedder.py``: the
bundled model behind a fixed random orthogonal map, another model id: its vectors differ, its rankings are the
bundled model's, so each query's right answer is known) is rolled out with ``pipeline.rollout.reembed`` while a second thread queries without pause. Every
query's hits are compared with the whole-corpus answer of the generation it read (``retrieval_log.generation``),
computed before the rollout (old) and after it (new): a mismatch is a query that saw a partial corpus (target
0). Prints the build time, the query latency p50/p95 before, during and after, and the mismatch count.

    .venv/bin/python benchmarks/bench_rollout.py [--documents N] [--queries-per-phase N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
QUESTIONS = ["how are interest rates set", "what causes inflation", "who won the election", "how do vaccines work",
             "what is the capital of the country", "how does the engine work", "what did the report find",
             "why did prices rise", "what is the population", "how was the bridge built"]


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=300, help="bench-corpus documents to use (default all 300)")
    parser.add_argument("--queries-per-phase", type=int, default=50, help="queries before and after (default 50)")
    parser.add_argument("-k", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rag_pipeline.config import Settings
    from rag_pipeline.embedding import SentenceTransformerEmbedder
    from rag_pipeline.pipeline.rollout import reembed
    from rag_pipeline.pipeline.sync import sync_source
    from rag_pipeline.retrieval import query
    from rag_pipeline.sources.local import LocalFolderSource
    from rag_pipeline.store import Store
    from rag_pipeline.store.embedded import start_embedded
    from rag_pipeline_tests.fakes.mapped_embedder import MappedEmbedder

    work = Path(tempfile.mkdtemp(prefix="rag-bench-rollout-"))
    try:
        url = start_embedded(work / "pg")
        folder = work / "bench"
        folder.mkdir()
        for path in sorted((SHARED / "bench-corpus").rglob("*.txt"))[:args.documents]:
            shutil.copy(path, folder / path.name)
        settings = Settings(database_url=url)
        base = SentenceTransformerEmbedder()
        store = Store.open(settings, embedding_dimension=base.dimension, embedding_model=base.model_id)
        print(f"# bench_rollout ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())})")
        started = time.perf_counter()
        report = sync_source(LocalFolderSource(folder), store, base, settings)
        print(f"initial sync                          {time.perf_counter() - started:8.1f} s, "
              f"{len(report.documents)} documents, {report.embedded} chunk texts embedded")
        new = MappedEmbedder(base, name='mapped-minilm-7')

        def ask(question: str) -> tuple[float, int, list[str]]:
            t = time.perf_counter()
            hits = query(store, new, question, k=args.k, admin=True, settings=settings)
            elapsed = (time.perf_counter() - t) * 1000
            with store.connection() as conn:
                gen = conn.execute("SELECT generation FROM retrieval_log ORDER BY id DESC LIMIT 1").fetchone()[0]
            return elapsed, gen, [h.chunk_id for h in hits]

        before = [ask(QUESTIONS[i % len(QUESTIONS)]) for i in range(args.queries_per_phase)]
        old_gen = before[0][1]
        reference = {old_gen: {q: ask(q)[2] for q in QUESTIONS}}
        during: list[tuple[str, float, int, list[str]]] = []
        stop = threading.Event()

        def querying() -> None:
            i = 0
            while not stop.is_set():
                q = QUESTIONS[i % len(QUESTIONS)]
                during.append((q, *ask(q)))
                i += 1

        thread = threading.Thread(target=querying, daemon=True)
        thread.start()
        t = time.perf_counter()
        rollout = reembed(store, new, settings)
        build_s = time.perf_counter() - t
        stop.set()
        thread.join()
        new_gen = rollout.generation.id
        reference[new_gen] = {q: ask(q)[2] for q in QUESTIONS}
        after = [ask(QUESTIONS[i % len(QUESTIONS)]) for i in range(args.queries_per_phase)]
        partial = sum(1 for q, _, gen, ids in during if reference.get(gen, {}).get(q) != ids)
        by_gen = {g: sum(1 for _, _, gg, _ in during if gg == g) for g in (old_gen, new_gen)}
        print(f"new generation built and activated    {build_s:8.1f} s ({rollout.progress.documents} documents, "
              f"{rollout.progress.chunks} chunks, {new.embedded} texts embedded; activated: {rollout.activated})")
        for name, lat in (("before", [x[0] for x in before]), ("during", [x[1] for x in during]),
                          ("after", [x[0] for x in after])):
            print(f"query latency {name:7s} p50 {pct(lat, 50):7.1f} ms  p95 {pct(lat, 95):7.1f} ms  "
                  f"({len(lat)} queries)")
        med_before = statistics.median(x[0] for x in before)
        print(f"during / before p50                   {pct([x[1] for x in during], 50) / med_before:8.2f}x")
        print(f"queries during the rollout: {len(during)} ({by_gen[old_gen]} read generation {old_gen}, "
              f"{by_gen[new_gen]} read generation {new_gen}); saw a partial corpus: {partial} (target 0)")
        sys.exit(1 if partial else 0)
    finally:
        from rag_pipeline.store import embedded

        server = embedded._servers.pop((work / "pg").resolve(), None)
        if server is not None:
            server.cleanup()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
