"""The short version of ``benchmarks/bench_permissions.py`` (the 1,000,000-chunk run is a script people run):
20,000 generated chunks on a fresh embedded server, every principal's filtered top-10 through
``retrieval.search``: the script exits non-zero when a query returns a row its principal may not read,
does not return exactly ``min(k, readable)`` rows, or when its numpy truth disagrees with a sequential scan
(over the active embedding generation's ``chunk_embeddings_<id>`` table, where the vectors are loaded).
Latency and recall are printed, not asserted (no wall-clock asserts)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

from rag_pipeline_tests.conftest import REPO


def test_permission_benchmark_short_run_has_no_leak_and_full_answers():
    with tempfile.TemporaryDirectory(prefix="bp-", dir="/tmp") as short:  # the server's socket path stays short
        run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_permissions.py"), "--chunks", "20000",
                              "--queries", "10"], capture_output=True, text=True, timeout=900,
                             env={**os.environ, "TMPDIR": short})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [line for line in run.stdout.splitlines() if "%" in line and "/" in line and "(min recall" in line]
    assert len(rows) >= 4, run.stdout  # alice, bob, carol, admin (+ the what-if rows)
    assert "CHECK FAILED" not in run.stdout
    # the vectors were loaded into the active generation's table and its HNSW index built there (schema 0005)
    load = next(line for line in run.stdout.splitlines() if line.startswith("load: COPY"))
    assert "2000 documents + 20000 chunks + 20000 vectors (chunk_embeddings_" in load, load
    build = next(line for line in run.stdout.splitlines() if line.startswith("HNSW build:"))
    assert re.search(r"CREATE INDEX (chunk_embeddings_\d+)_hnsw ON \S*\1 USING hnsw", build), build
