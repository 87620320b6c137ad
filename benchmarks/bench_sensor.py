"""One ``source_diff_sensor`` tick at scale: 10,000 and 100,000 unchanged documents (target: < 10 s at 100,000).

A generated source (``FakeSource``: synthetic ``SourceDocument``s with content hashes, listed from memory so
the figure is the sensor's own cost, not a disk walk) and pre-populated ``documents`` rows (COPY, all
``completed`` at the listed hash) in the embedded PostgreSQL; the Dagster instance is SQLite in a temp
directory, as ``dagster dev`` uses. Measured per size:

* partition bookkeeping: adding N ``documents`` partitions (first tick after a fresh instance), reading
  them back (every tick does), and the sensor tick that re-adds them (rebuild from the index);
* one steady-state tick with nothing to do, and its parts: ``load_diff_state``, the pure diff, reading
  partition keys;
* one tick where 1% of the documents changed (requests capped by ``max_inflight_runs``).

Usage: ``python benchmarks/bench_sensor.py [--sizes 10000 100000] [--repeat 3]``; never run by pytest.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import dagster as dg  # noqa: E402
import psycopg  # noqa: E402

from rag_pipeline.config import Settings  # noqa: E402
from rag_pipeline.defs.documents.jobs import ingest_job  # noqa: E402
from rag_pipeline.defs.documents.partitions import document_partition_key, documents  # noqa: E402
from rag_pipeline.defs.sources.config import spec_from_dict  # noqa: E402
from rag_pipeline.defs.sources.sensors import source_diff_tick  # noqa: E402
from rag_pipeline.pipeline.plan import diff_documents  # noqa: E402
from rag_pipeline.sources.base import ChangeFeedUnavailable, Inventory, SourceDocument  # noqa: E402
from rag_pipeline.store import Store, migrate  # noqa: E402
from rag_pipeline.store.embedded import start_embedded  # noqa: E402
from rag_pipeline.store.index import load_index_state  # noqa: E402

MODIFIED = datetime(2026, 1, 1, tzinfo=timezone.utc)


class FakeSource:
    """A source of ``n`` synthetic documents held in memory (ids ``dept07/report-000123.pdf``)."""

    def __init__(self, name: str, n: int) -> None:
        self.name = name
        self.documents = [self.document(i) for i in range(n)]

    @staticmethod
    def document(i: int, *, edit: int = 0) -> SourceDocument:
        """The ``i``-th document; ``edit`` > 0 gives it other content."""
        sid = f"dept{i % 40:02d}/report-{i:06d}.pdf"
        return SourceDocument(source_id=sid, title=sid.rsplit("/", 1)[1], uri=f"file:///srv/{sid}",
                              mime_type="application/pdf", size=10_000 + i, modified_at=MODIFIED,
                              source_version=f"{10_000 + i}:{edit}",
                              content_sha256=hashlib.sha256(f"{i}:{edit}".encode()).hexdigest())

    def list_documents(self) -> Inventory:
        """The whole listing, complete."""
        return Inventory(documents=list(self.documents), complete=True)

    def changes(self, cursor: str | None):
        """No change feed (like a folder): every tick is a full listing."""
        raise ChangeFeedUnavailable("no feed")

    def fetch(self, document: SourceDocument) -> bytes:
        """Never called by the sensor."""
        raise NotImplementedError


def populate(store: Store, source: FakeSource) -> None:
    """One ``completed`` documents row per listed document, at the listed hash, in the active embedding
    generation (COPY)."""
    from rag_pipeline.store.generations import active

    with store.connection() as conn, conn.cursor() as cur:
        generation = [active(conn).id]
        with cur.copy("COPY documents (source, source_id, uri, title, mime_type, source_version, seen_source_version, "
                      "content_sha256, seen_sha256, version, status, expected_chunk_count, chunk_count, modified_at, "
                      "ingested_at, generations) FROM STDIN") as copy:
            for d in source.documents:
                copy.write_row((source.name, d.source_id, d.uri, d.title, d.mime_type, d.source_version,
                                d.source_version, d.content_sha256, d.content_sha256, 1, "completed", 1, 1,
                                d.modified_at, d.modified_at, generation))


def best(fn, repeat: int) -> tuple[float, object]:
    """Best wall time of ``repeat`` calls of ``fn`` and the last result."""
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times), result


def run_size(pg_url: str, n: int, repeat: int) -> dict[str, float]:
    """All figures for a source of ``n`` documents."""
    dbname = f"bench_sensor_{n}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {dbname}")
        conn.execute(f"CREATE DATABASE {dbname}")
    info = psycopg.conninfo.conninfo_to_dict(pg_url)
    info["dbname"] = dbname
    url = psycopg.conninfo.make_conninfo(**info)
    migrate(url, embedding_dimension=384, embedding_model="all-MiniLM-L6-v2")
    store = Store(url)
    source = FakeSource("bench", n)
    spec = spec_from_dict({"name": "bench", "kind": "zotero", "library": "users/1"})
    settings = Settings(database_url=url)
    out: dict[str, float] = {}
    started = time.perf_counter()
    populate(store, source)
    out["populate_rows_s"] = time.perf_counter() - started

    def tick(instance: dg.DagsterInstance, cursor: str | None = "{}") -> dg.SensorResult:
        context = dg.build_sensor_context(instance=instance, cursor=cursor)
        return source_diff_tick(context, spec, source, store, settings, ingest_job_name=ingest_job.name,
                                inventory_job_name="bench_inventory")

    with dg.instance_for_test(temp_dir=tempfile.mkdtemp(prefix="bench-dagster-")) as instance:
        # a fresh instance: the first tick rebuilds every partition from the index (the truth)
        out["tick_rebuild_partitions_s"], result = best(lambda: tick(instance), 1)
        (add,) = result.dynamic_partitions_requests
        assert len(add.partition_keys) == n and not result.run_requests
        started = time.perf_counter()
        instance.add_dynamic_partitions(documents.name, list(add.partition_keys))
        out["add_partitions_s"] = time.perf_counter() - started
        out["read_partitions_s"], keys = best(lambda: instance.get_dynamic_partitions(documents.name), repeat)
        assert len(keys) == n

        # steady state: nothing changed
        out["tick_unchanged_s"], result = best(lambda: tick(instance), repeat)
        assert not result.run_requests and not result.dynamic_partitions_requests, result
        with store.connection() as conn:
            out["load_diff_state_s"], state = best(lambda: load_index_state(conn, source.name, count_rows=False), repeat)
        out["pure_diff_s"], diff = best(lambda: diff_documents(source.name, source.documents, state, settings), repeat)
        assert diff.unchanged == n
        out["partition_keys_s"], _ = best(lambda: [document_partition_key("bench", d.source_id)
                                                   for d in source.documents], repeat)

        # 1% of the documents changed: all found, requests capped by max_inflight_runs (50)
        changed = range(0, n, 100)
        for i in changed:
            source.documents[i] = FakeSource.document(i, edit=1)
        out["tick_1pct_changed_s"], result = best(lambda: tick(instance), repeat)
        assert len(result.run_requests) == spec.max_inflight_runs
        assert next(r for r in result.run_requests).tags["rag/decision"] == "change"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    pg_url = start_embedded(Path(tempfile.mkdtemp(prefix="bench-pg-")) / "data")
    rows = {n: run_size(pg_url, n, args.repeat) for n in args.sizes}
    names = list(next(iter(rows.values())))
    print(f"{'figure (seconds, best of ' + str(args.repeat) + ')':<34}" + "".join(f"{n:>12,}" for n in rows))
    for name in names:
        print(f"{name:<34}" + "".join(f"{rows[n][name]:>12.3f}" for n in rows))
    worst = rows[max(rows)]["tick_unchanged_s"]
    print(f"\none unchanged tick at {max(rows):,} documents: {worst:.2f} s (target < 10 s): "
          f"{'OK' if worst < 10 else 'OVER TARGET'}")


if __name__ == "__main__":
    main()
