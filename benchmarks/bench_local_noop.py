"""No-op re-sync of a large local folder: what a listing reads from disk, and how long it takes.

Generates N small text files (default 10,000), syncs them once, then measures in one run:
- the no-op re-sync (``sync_source``): wall time, files of the folder opened (a ``sys.addaudithook`` on
  ``open``) and the bytes those files hold, documents fetched;
- a verifying listing (``list_documents(verify=True)``, what the periodic full verification does): the same
  figures, so the ratio shows what the stat-only listing saves;
- a no-op re-sync after touching 1% of the files (each is re-read once to compare its hash).
The first sync uses a hashing embedder (deterministic 384-dimension vectors from the text's SHA-256): the
model's speed is not what this measures (``bench_sync.py`` measures it). Uses a fresh embedded PostgreSQL
in a temporary directory.

    .venv/bin/python benchmarks/bench_local_noop.py [--files 10000]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


class HashingEmbedder:
    """Deterministic unit vectors from each text's SHA-256 (no model): the Embedder interface, fast."""

    model_id, dimension, max_tokens = "bench-hashing", 384, 254

    def __init__(self) -> None:
        self.calls = self.embedded = 0

    def count_tokens(self, texts):
        return [len(t.split()) for t in texts]

    def embed(self, texts):
        self.calls += 1
        self.embedded += len(texts)
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for i, t in enumerate(texts):
            seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "big")
            v = np.random.default_rng(seed).normal(size=self.dimension).astype(np.float32)
            out[i] = v / np.linalg.norm(v)
        return out


class OpenCounter:
    """Counts ``open`` audit events on paths under ``root`` while ``active``."""

    def __init__(self, root: Path) -> None:
        self.root, self.active, self.paths = str(root) + os.sep, False, []
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args) -> None:
        if self.active and event == "open" and isinstance(args[0], (str, os.PathLike)):
            path = os.fspath(args[0])
            if path.startswith(self.root):
                self.paths.append(path)

    def measure(self, fn):
        self.paths = []
        self.active = True
        started = time.perf_counter()
        try:
            value = fn()
        finally:
            self.active = False
        elapsed = time.perf_counter() - started
        files = set(self.paths)
        return elapsed, len(files), sum(os.path.getsize(p) for p in files if os.path.exists(p)), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rag_pipeline.config import Settings
    from rag_pipeline.pipeline.sync import sync_source
    from rag_pipeline.sources.local import LocalFolderSource
    from rag_pipeline.store import Store
    from rag_pipeline.store.embedded import start_embedded

    work = Path(tempfile.mkdtemp(prefix="rag-bench-noop-"))
    root = work / "folder"
    for i in range(args.files):
        d = root / f"d{i // 500:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"note{i:05d}.txt").write_text(f"Note {i}: the lighthouse at pier {i % 97} was painted in {1900 + i % 120}.\n")
    total_bytes = sum(p.stat().st_size for p in root.rglob("*.txt"))
    url = start_embedded(work / "pg")
    embedder = HashingEmbedder()
    settings = Settings(database_url=url, sync_batch_documents=64)
    store = Store.open(settings, embedding_dimension=embedder.dimension, embedding_model=embedder.model_id)
    source = LocalFolderSource(root)
    counter = OpenCounter(root)
    print(f"# bench_local_noop ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs): {args.files} files, "
          f"{total_bytes:,} bytes")

    first_s, first_files, _, first = counter.measure(lambda: sync_source(source, store, embedder, settings))
    print(f"first sync: {first_s:.1f}s, {first_files} files opened, exit {first.exit_code}")
    noop_s, noop_files, noop_bytes, noop = counter.measure(lambda: sync_source(source, store, embedder, settings))
    actions = noop.counts()
    print(f"no-op re-sync: {noop_s:.2f}s, {noop_files} files opened ({noop_bytes:,} bytes), actions {actions}")
    verify_s, verify_files, verify_bytes, _ = counter.measure(lambda: source.list_documents(verify=True))
    list_s, list_files, list_bytes, _ = counter.measure(source.list_documents)
    print(f"listing: stat-only {list_s:.2f}s, {list_files} files opened ({list_bytes:,} bytes); verifying "
          f"{verify_s:.2f}s, {verify_files} files opened ({verify_bytes:,} bytes); ratio {list_s / verify_s:.2f}x")
    touched = sorted(root.rglob("*.txt"))[:: 100]
    for p in touched:
        st = p.stat()
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    touch_s, touch_files, touch_bytes, touch = counter.measure(lambda: sync_source(source, store, embedder, settings))
    print(f"re-sync after touching {len(touched)} files: {touch_s:.2f}s, {touch_files} files opened "
          f"({touch_bytes:,} bytes), actions {touch.counts()}")
    print(f"ratios to the no-op re-sync: touched 1% {touch_s / noop_s:.2f}x; verifying listing alone "
          f"{verify_s / noop_s:.2f}x")


if __name__ == "__main__":
    main()
