"""Permission-filtered top-k retrieval on a large index: latency and recall against the exact answer.

Generates N chunks (default 1,000,000: 100,000 documents x 10 chunks) of synthetic 384-dimension unit
vectors (300 gaussian topic centres, each document a point near its topic, each chunk a point near its
document; a shared direction and a decaying noise spectrum give the shape of all-MiniLM-L6-v2 embeddings,
see ``COMMON``) and a realistic permission layout: most documents are shared with one to three groups
(plus their owner), 15% with their owner alone, a few with one external user, 0.02% with ``everyone``;
group membership is expanded (nested groups included) into ``group_members``. Three
principals read, by construction, 50%, 5% and 0.1% of the chunks (readable sets drawn at random over
documents, so uncorrelated with topics). The schema is the product's (``rag_pipeline.store.migrate``)
on the embedded PostgreSQL (or ``--dsn``); documents, chunks and the chunk vectors (into the active
embedding generation's table ``chunk_embeddings_<id>``, ``store.generations``) are bulk-loaded with binary
COPY, the generation's HNSW index is dropped before the load and built after it (timed).

Prints, from one run: CPU and server settings, load and HNSW build times, then per principal (and an
unfiltered admin query): readable fraction, ``SearchResult.strategy`` counts (exact / hnsw /
hnsw+exact), p50/p95 latency of ``rag_pipeline.retrieval.search`` (client wall time, k=10), recall@10
against the exact answer (numpy over every readable vector; ties within 1e-5 count as found; cross-checked
against a sequential-scan SQL query for one query per principal), whether every answer had exactly
``min(k, readable)`` rows, and rows returned that the principal may not read (must be 0). With
``--what-if`` (default) the 0.1% principal is also run with the exact path disabled (``exact_below=0``)
to show what the HNSW path alone would give it, and a caller just under the exact path's threshold
(``dave``: an expanded list of teams reading fewer than ``exact_below`` documents, passed directly) both
ways, to show what the exact path costs at its limit.

    nice -n 10 .venv/bin/python benchmarks/bench_permissions.py [--chunks 1000000] [--queries 100]
        [--keep] [--dsn URL] [--exact-below N] [--ef-search N] [--max-scan-tuples N] [--explain]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

MODEL = "bench/synthetic-384"
SOURCE = "bench"
SCHEMA_VERSION = 2  # of the generated data: bump when the generator changes (a --keep datadir reloads)
COMMON, DOC_SPREAD, CHUNK_SPREAD = 0.7, 0.5, 0.5
"""Weight of the direction all vectors share; noise norm of a document around its topic centre, of a chunk
around its document. Chosen so a 2,100-chunk sample matches all-MiniLM-L6-v2 on shared/bench-corpus
(2,107 chunks: random-pair cosine 0.20 +- 0.17, nearest neighbour 0.85, 10th 0.69, |mean| 0.45,
participation ratio of the covariance spectrum 28.6); ``data shape`` prints the same figures."""
EVERYONE_SHARE, CAROL_SHARE, BOB_SHARE, ALICE_SHARE, OWNER_ONLY_SHARE = 0.0002, 0.001, 0.05, 0.5, 0.15
BATCH_DOCS = 5000


def normalise(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


class VectorGenerator:
    """Deterministic clustered unit vectors. Noise is ``z @ basis``: variance 1/j along the j-th axis of a
    random rotation (total variance 1), so the data has a low intrinsic dimension like real sentence
    embeddings; ``topics`` centres are the shared direction (weight ``COMMON``) plus such noise (uneven
    topic sizes), documents ``DOC_SPREAD`` noise around a centre, chunks ``CHUNK_SPREAD`` around their
    document."""

    def __init__(self, dim: int, topics: int, seed: int) -> None:
        rng = np.random.default_rng([seed, 0])
        self.dim = dim
        q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
        scale = 1.0 / np.sqrt(np.arange(1, dim + 1))
        scale /= np.linalg.norm(scale)
        self.basis = (scale[:, None] * q.T).astype(np.float32)
        common = normalise(rng.standard_normal((1, dim)))
        self.centres = normalise(COMMON * common + self.noise(rng, topics))
        self.weights = rng.dirichlet(np.full(topics, 2.0))

    def noise(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.standard_normal((n, self.dim), dtype=np.float32) @ self.basis

    def documents(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        topics = rng.choice(len(self.centres), n, p=self.weights)
        return topics, normalise(self.centres[topics] + DOC_SPREAD * self.noise(rng, n))

    def chunks(self, rng: np.random.Generator, doc_centres: np.ndarray, per_doc: int) -> np.ndarray:
        base = np.repeat(doc_centres, per_doc, axis=0)
        return normalise(base + CHUNK_SPREAD * self.noise(rng, len(base)))

    def queries(self, seed: int, n: int) -> np.ndarray:
        """``n`` queries: a chunk-like point near a new document of a random topic (not in the data)."""
        rng = np.random.default_rng([seed, 1, n])
        _, centres = self.documents(rng, n)
        return self.chunks(rng, centres, 1)


class Layout:
    """Who may read what: users, groups (direct members, expanded closure), every document's scope."""

    def __init__(self, n_docs: int, seed: int) -> None:
        from rag_pipeline.permissions.principals import EVERYONE, domain, group, user

        rng = np.random.default_rng([seed, 2])
        self.alice, self.bob, self.carol = user("alice@example.com"), user("bob@example.com"), user(
            "carol@partner.example")
        users = [user(f"u{i:05d}@example.com") for i in range(5000)]
        eng, platform, search = group(SOURCE, "engineering"), group(SOURCE, "team-platform"), group(SOURCE, "team-search")
        teams = [group(SOURCE, f"team-{j:03d}") for j in range(300)]  # nobody of alice/bob/carol is in these

        def some(n: int) -> list[str]:
            return [users[i] for i in rng.choice(len(users), n, replace=False)]

        direct: dict[str, set[str]] = {
            platform: {self.alice, *some(30)},
            eng: {platform, *some(400)},  # alice reads engineering's documents through team-platform
            search: {self.bob, self.alice, *some(20)},
        }
        for j, t in enumerate(teams):
            direct[t] = set(some(int(rng.integers(5, 40))))
            if j % 10 == 0 and j:  # some nesting among the other teams too
                direct[t].add(teams[j - 1])
        self.members = {g: self._closure(g, direct) for g in direct}

        n_every = max(1, round(n_docs * EVERYONE_SHARE))
        n_carol = max(1, round(n_docs * CAROL_SHARE) - n_every)
        n_bob = max(1, round(n_docs * BOB_SHARE) - n_every)
        n_alice = max(1, round(n_docs * ALICE_SHARE) - n_every - n_bob)
        n_owner = round(n_docs * OWNER_ONLY_SHARE)
        order = rng.permutation(n_docs)
        owners = rng.integers(0, len(users), n_docs)
        self.scopes: list[frozenset[str]] = [frozenset()] * n_docs
        bounds = np.cumsum([n_every, n_carol, n_bob, n_alice, n_owner])
        for slot, doc in enumerate(order):
            owner = users[owners[doc]]
            extra = [teams[t] for t in rng.choice(len(teams), int(rng.integers(0, 3)), replace=False)]
            if slot < bounds[0]:
                scope = {EVERYONE}
            elif slot < bounds[1]:
                scope = {self.carol, owner}  # shared with one external user
            elif slot < bounds[2]:
                scope = {search, owner, *extra} if rng.random() < 0.95 else {domain("example.com"), owner}
            elif slot < bounds[3]:
                scope = {eng if rng.random() < 0.8 else platform, owner, *extra}
            elif slot < bounds[4]:
                scope = {owner}
            else:
                scope = {owner, *[teams[t] for t in rng.choice(len(teams), int(rng.integers(1, 4)), replace=False)]}
            self.scopes[doc] = frozenset(scope)
        self.by_construction = {self.alice: n_every + n_bob + n_alice, self.bob: n_every + n_bob,
                                self.carol: n_every + n_carol}

    def teams_below(self, limit: int) -> tuple[list[str], int]:
        """An expanded principal list (``everyone`` and some of the other teams) that reads as many documents
        as possible below ``limit``: a caller at the exact path's threshold. Returns (list, documents)."""
        from rag_pipeline.permissions.principals import EVERYONE

        docs: dict[str, set[int]] = {}
        for i, scope in enumerate(self.scopes):
            for p in scope:
                docs.setdefault(p, set()).add(i)
        cover, chosen = set(docs.get(EVERYONE, ())), [EVERYONE]
        for team in sorted((g for g in docs if g.startswith(f"group:{SOURCE}:team-") and g[-3:].isdigit()),
                           key=lambda g: -len(docs[g])):
            if len(cover | docs[team]) < limit:
                cover |= docs[team]
                chosen.append(team)
        return sorted(chosen), len(cover)

    @staticmethod
    def _closure(g: str, direct: dict[str, set[str]]) -> set[str]:
        out, todo = set(), [g]
        while todo:
            for m in direct.get(todo.pop(), ()):
                if m not in out:
                    out.add(m)
                    todo.append(m)
        return out

    def readable_documents(self, readable: set[str]) -> np.ndarray:
        return np.fromiter((bool(s & readable) for s in self.scopes), dtype=bool, count=len(self.scopes))


def cpu_line() -> str:
    model, flags = "?", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    wanted = ["sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx512_bf16", "avx512_fp16", "amx_bf16"]
    return f"cpu: {model}, {os.cpu_count()} CPUs, flags: {' '.join(f for f in wanted if f in flags)}"


def data_shape(x: np.ndarray) -> str:
    """Figures of a sample (unit rows) to compare with real embeddings (see ``COMMON``)."""
    rng = np.random.default_rng(0)
    i, j = rng.integers(0, len(x), 20000), rng.integers(0, len(x), 20000)
    pair = (x[i] * x[j]).sum(1)
    sims = x @ x.T
    np.fill_diagonal(sims, -2)
    top = np.sort(sims, axis=1)
    ev = np.linalg.eigvalsh(np.cov((x - x.mean(0)).T))
    return (f"data shape ({len(x)}-chunk sample): random-pair cosine {pair.mean():.2f} +- {pair.std():.2f}, nearest "
            f"neighbour {top[:, -1].mean():.2f}, 10th {top[:, -10].mean():.2f}, |mean| {np.linalg.norm(x.mean(0)):.2f}, "
            f"participation ratio {ev.sum() ** 2 / (ev ** 2).sum():.1f}")


def chunk_dtype(id_len: int, text_len: int) -> np.dtype:
    """One chunks row of a binary COPY stream (big-endian fields, each preceded by its byte length)."""
    return np.dtype([
        ("nf", ">i2"),
        ("l_id", ">i4"), ("id", f"S{id_len}"),
        ("l_doc", ">i4"), ("doc", ">i8"),
        ("l_ver", ">i4"), ("ver", ">i4"),
        ("l_ord", ">i4"), ("ord", ">i4"),
        ("l_text", ">i4"), ("text", f"S{text_len}"),
        ("l_sha", ">i4"), ("sha", "S64"),
        ("l_tok", ">i4"), ("tok", ">i4"),
    ])


def embedding_dtype(dim: int, id_len: int) -> np.dtype:
    """One ``chunk_embeddings_<id>`` row (``chunk_id`` text, ``embedding`` pgvector ``vector``: int16 dimension,
    int16 unused, ``dim`` float32) of a binary COPY stream (big-endian, each field preceded by its length)."""
    return np.dtype([
        ("nf", ">i2"),
        ("l_id", ">i4"), ("id", f"S{id_len}"),
        ("l_emb", ">i4"), ("dim", ">i2"), ("unused", ">i2"), ("emb", ">f4", (dim,)),
    ])


CHUNK_COLUMNS = "id, document_id, version, ordinal, text, text_sha256, token_count"
EMBEDDING_COLUMNS = "chunk_id, embedding"
COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(4, "big") + (0).to_bytes(4, "big")
COPY_TRAILER = (-1).to_bytes(2, "big", signed=True)


def load(conn, layout: Layout, gen: VectorGenerator, n_docs: int, per_doc: int, seed: int,
         generation) -> tuple[np.ndarray, float]:
    """COPY documents (listing ``generation``, a ``store.generations.Generation`` of ``vector`` storage),
    group_members, chunks, then the chunk vectors into ``generation``'s table; return (all chunk vectors
    (n, dim) float32, seconds)."""
    started = time.perf_counter()
    with conn.cursor() as cur:
        with cur.copy("COPY group_members (source, group_principal, member) FROM STDIN") as cp:
            for g, members in layout.members.items():
                for m in sorted(members):
                    cp.write_row((SOURCE, g, m))
        with cur.copy("COPY documents (id, source, source_id, uri, title, mime_type, content_sha256, version, "
                      "status, chunk_count, expected_chunk_count, modified_at, ingested_at, ready_at, "
                      "generations, principals, permissions_synced_at) FROM STDIN") as cp:
            lines = []
            for i, scope in enumerate(layout.scopes):
                doc_id = i + 1
                lines.append(
                    f"{doc_id}\t{SOURCE}\tdoc-{doc_id:08d}\tfile:///bench/doc-{doc_id:08d}.txt\tDocument {doc_id}\t"
                    f"text/plain\t{hashlib.sha256(b'd%d' % doc_id).hexdigest()}\t1\tcompleted\t{per_doc}\t{per_doc}\t"
                    f"2024-01-01 00:00:00+00\t2024-06-01 00:00:00+00\t2024-06-01 00:00:00+00\t{{{generation.id}}}\t"
                    "{" + ",".join(sorted(scope)) + "}\t2024-06-01 00:00:00+00\n")
                if len(lines) >= 10000:
                    cp.write("".join(lines))
                    lines = []
            cp.write("".join(lines))
        conn.execute("SELECT setval(pg_get_serial_sequence('documents', 'id'), %s)", (n_docs,))

        n = n_docs * per_doc
        vectors = np.empty((n, gen.dim), dtype=np.float32)
        width = max(7, len(str(n_docs)))
        text_of = lambda d, o, t: b"synthetic chunk %0*d.%02d about topic %04d" % (width, d, o, t)
        text_len = len(text_of(1, 0, 0))
        dtype = chunk_dtype(width + 3, text_len)
        with cur.copy(f"COPY chunks ({CHUNK_COLUMNS}) FROM STDIN (FORMAT BINARY)") as cp:
            cp.write(COPY_HEADER)
            for b0 in range(0, n_docs, BATCH_DOCS):
                b1 = min(n_docs, b0 + BATCH_DOCS)
                rng = np.random.default_rng([seed, 3, b0])
                topics, centres = gen.documents(rng, b1 - b0)
                emb = gen.chunks(rng, centres, per_doc)
                vectors[b0 * per_doc:b1 * per_doc] = emb
                docs = np.repeat(np.arange(b0 + 1, b1 + 1), per_doc)
                ords = np.tile(np.arange(per_doc), b1 - b0)
                tops = np.repeat(topics, per_doc)
                texts = [text_of(d, o, t) for d, o, t in zip(docs.tolist(), ords.tolist(), tops.tolist())]
                rows = np.empty(len(docs), dtype=dtype)
                rows["nf"] = 7
                rows["l_id"], rows["id"] = width + 3, [b"%0*d:%02d" % (width, d, o) for d, o in zip(docs.tolist(), ords.tolist())]
                rows["l_doc"], rows["doc"] = 8, docs
                rows["l_ver"], rows["ver"] = 4, 1
                rows["l_ord"], rows["ord"] = 4, ords
                rows["l_text"], rows["text"] = text_len, texts
                rows["l_sha"], rows["sha"] = 64, [hashlib.sha256(t).hexdigest().encode() for t in texts]
                rows["l_tok"], rows["tok"] = 4, 12
                cp.write(rows.tobytes())
            cp.write(COPY_TRAILER)
        # the vectors, in the same order (the generated ids are the chunk ids above)
        edtype = embedding_dtype(gen.dim, width + 3)
        with cur.copy(f"COPY {generation.table} ({EMBEDDING_COLUMNS}) FROM STDIN (FORMAT BINARY)") as cp:
            cp.write(COPY_HEADER)
            for b0 in range(0, n_docs, BATCH_DOCS):
                b1 = min(n_docs, b0 + BATCH_DOCS)
                docs = np.repeat(np.arange(b0 + 1, b1 + 1), per_doc)
                ords = np.tile(np.arange(per_doc), b1 - b0)
                rows = np.empty(len(docs), dtype=edtype)
                rows["nf"] = 2
                rows["l_id"], rows["id"] = width + 3, [b"%0*d:%02d" % (width, d, o) for d, o in zip(docs.tolist(), ords.tolist())]
                rows["l_emb"], rows["dim"], rows["unused"] = 4 + 4 * gen.dim, gen.dim, 0
                rows["emb"] = vectors[b0 * per_doc:b1 * per_doc]
                cp.write(rows.tobytes())
            cp.write(COPY_TRAILER)
    conn.execute("ANALYZE documents")
    conn.execute("ANALYZE chunks")
    conn.execute(f"ANALYZE {generation.table}")
    conn.execute("ANALYZE group_members")
    return vectors, time.perf_counter() - started


def build_hnsw(conn, url: str, indexdef: str, args) -> float:
    """Create the HNSW index from its original definition; prints pgvector's notices and progress."""
    from rag_pipeline.store import Store

    conn.execute(f"SET maintenance_work_mem = '{args.maintenance_work_mem}'")
    conn.execute(f"SET max_parallel_maintenance_workers = {int(args.build_workers)}")
    done = threading.Event()

    def progress() -> None:
        with Store(url).connect() as watcher:
            while not done.wait(60):
                row = watcher.execute("SELECT phase, tuples_done, tuples_total FROM pg_stat_progress_create_index"
                                      ).fetchone()
                if row:
                    print(f"  [build progress {time.strftime('%H:%M:%S')}] {row[0]}: {row[1]} tuples",
                          file=sys.stderr, flush=True)

    watcher = threading.Thread(target=progress, daemon=True)
    watcher.start()
    started = time.perf_counter()
    try:
        conn.execute(indexdef)
    finally:
        done.set()
    return time.perf_counter() - started


def exact_truth(vectors: np.ndarray, mask: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per query the row indexes (best first, -1 padded) and similarities of the top-k readable rows (numpy)."""
    best_i = np.full((len(queries), 0), -1, dtype=np.int64)
    best_s = np.full((len(queries), 0), -np.inf, dtype=np.float32)
    step = 131072
    for r0 in range(0, len(vectors), step):
        sub = mask[r0:r0 + step]
        if not sub.any():
            continue
        rows = np.flatnonzero(sub) + r0
        sims = queries @ vectors[rows].T  # (q, rows)
        take = min(k, sims.shape[1])
        part = np.argpartition(-sims, take - 1, axis=1)[:, :take]
        best_i = np.concatenate([best_i, rows[part]], axis=1)
        best_s = np.concatenate([best_s, np.take_along_axis(sims, part, axis=1)], axis=1)
        keep = np.argsort(-best_s, axis=1)[:, :k]
        best_i, best_s = np.take_along_axis(best_i, keep, axis=1), np.take_along_axis(best_s, keep, axis=1)
    return best_i, best_s


class Recording:
    """A connection stand-in that records what ``search`` executes (for ``--explain``)."""

    def __init__(self, conn) -> None:
        self._conn, self.statements = conn, []

    def execute(self, sql, params=None, **options):
        self.statements.append((sql, params))
        return self._conn.execute(sql, params, **options)

    def transaction(self):
        return self._conn.transaction()


def explain(conn, statements) -> None:
    with conn.transaction():
        for sql, params in statements:
            if sql.lstrip().upper().startswith("SET"):
                conn.execute(sql, params)
                print("    " + sql.strip())
                continue
            print("    -- " + " ".join(sql.split())[:100] + " ...")
            for (line,) in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params).fetchall():
                print("      " + line)


def expander():
    """(function(conn, principal) -> expanded principals, description)."""
    try:
        from rag_pipeline.permissions import expand

        return (lambda conn, p: set(expand(conn, [p]))), "rag_pipeline.permissions.expand"
    except ImportError:
        pass
    from rag_pipeline.permissions.principals import implied

    def fallback(conn, p):
        own = implied([p])
        groups = {r[0] for r in conn.execute("SELECT group_principal FROM group_members WHERE member = ANY(%s)",
                                             (sorted(own),)).fetchall()}
        return own | groups

    return fallback, "the benchmark's own expansion (rag_pipeline.permissions.expand not importable)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--chunks-per-document", type=int, default=10)
    parser.add_argument("--queries", type=int, default=100, help="measured queries per principal")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured queries per principal first")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--topics", type=int, default=300, help="gaussian topic centres")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--dsn", help="use this PostgreSQL (pgvector) instead of the embedded server")
    parser.add_argument("--keep", action="store_true",
                        help="keep the datadir (/tmp/bench-permissions-*) and reuse it when already loaded")
    parser.add_argument("--exact-below", type=int, help="search(exact_below=...); default the module's")
    parser.add_argument("--ef-search", type=int, help="search(ef_search=...); default the module's")
    parser.add_argument("--max-scan-tuples", type=int, help="SET hnsw.max_scan_tuples for the session")
    parser.add_argument("--prepare-threshold", type=int, default=None,
                        help="psycopg prepare_threshold of the query connection (default: never prepare, as "
                             "query()'s connection per call; 5 = psycopg's default on a long-lived connection)")
    parser.add_argument("--maintenance-work-mem", default="4GB")
    parser.add_argument("--build-workers", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                        help="max_parallel_maintenance_workers for the HNSW build")
    parser.add_argument("--what-if", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the 0.1%% principal with the exact path off (exact_below=0)")
    parser.add_argument("--explain", action="store_true", help="EXPLAIN ANALYZE one query per principal")
    args = parser.parse_args()
    per_doc = args.chunks_per_document
    n = (args.chunks // per_doc) * per_doc
    params = {"v": SCHEMA_VERSION, "docs": n // per_doc, "per_doc": per_doc, "seed": args.seed, "topics": args.topics}
    tag = f"c{n}-p{per_doc}-s{args.seed}-t{args.topics}"
    work = Path(tempfile.gettempdir()) / f"bench-permissions-{tag}" if args.keep else Path(
        tempfile.mkdtemp(prefix="bench-permissions-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return run(args, work, tag, params)
    finally:
        if not args.keep:
            cleanup(args, work)


def cleanup(args, work: Path) -> None:
    """Without ``--keep``: empty the benchmark's tables (``--dsn``) or stop the embedded server and remove it."""
    if args.dsn:
        import psycopg

        with psycopg.connect(args.dsn, autocommit=True) as c:
            if c.execute("SELECT to_regclass('index_settings') IS NOT NULL").fetchone()[0] and c.execute(
                    "SELECT 1 FROM index_settings WHERE key = 'bench_permissions'").fetchone():
                c.execute("DELETE FROM index_settings WHERE key = 'bench_permissions'")
                c.execute("TRUNCATE documents, chunks, group_members RESTART IDENTITY CASCADE")
    else:
        from rag_pipeline.store import embedded

        server = embedded._servers.pop((work / "pg").resolve(), None)
        if server is not None:
            server.cleanup()
    shutil.rmtree(work, ignore_errors=True)


def run(args, work: Path, tag: str, params: dict) -> int:
    from rag_pipeline import retrieval
    from rag_pipeline.store import Store, migrate
    from rag_pipeline.store.embedded import start_embedded

    dim, per_doc, k = 384, args.chunks_per_document, args.k
    n_docs = args.chunks // per_doc
    n = n_docs * per_doc
    print(f"# bench_permissions ({time.strftime('%Y-%m-%d %H:%M')}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, nice {os.nice(0)})")
    print(cpu_line())
    url = args.dsn or start_embedded(work / "pg")
    generation = migrate(url, embedding_dimension=dim, embedding_model=MODEL)
    if generation.state != "active" or generation.storage != "vector":
        sys.exit(f"the index's generation of {MODEL} is {generation.state} ({generation.storage}); the benchmark "
                 "needs it active, stored as vector (a database another model's active generation serves?)")
    table = generation.table
    store = Store(url)
    conn = store.connect()
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    conn.execute("SELECT '[1]'::vector")  # loads pgvector, which defines its hnsw.* settings
    pg = conn.execute("SELECT current_setting('server_version'), (SELECT extversion FROM pg_extension WHERE "
                      "extname = 'vector'), current_setting('shared_buffers'), current_setting('work_mem'), "
                      "current_setting('effective_cache_size'), current_setting('hnsw.max_scan_tuples'), "
                      "current_setting('hnsw.scan_mem_multiplier'), current_setting('jit')").fetchone()
    print(f"server: PostgreSQL {pg[0]}, pgvector {pg[1]}, shared_buffers {pg[2]}, work_mem {pg[3]}, "
          f"effective_cache_size {pg[4]}, hnsw.max_scan_tuples {pg[5]}, hnsw.scan_mem_multiplier {pg[6]}, jit {pg[7]}"
          f"{' (--dsn)' if args.dsn else ' (embedded, ' + str(work / 'pg') + ')'}")

    gen = VectorGenerator(dim, args.topics, args.seed)
    t0 = time.perf_counter()
    layout = Layout(n_docs, args.seed)
    print(f"data: {n_docs} documents x {per_doc} chunks = {n} chunks, {dim} dims, {args.topics} topics, "
          f"{sum(len(m) for m in layout.members.values())} group_members rows; layout {time.perf_counter() - t0:.1f} s")

    marker = conn.execute("SELECT value FROM index_settings WHERE key = 'bench_permissions'").fetchone()
    vectors_file = work / "vectors.npy"
    have_docs = conn.execute("SELECT EXISTS (SELECT 1 FROM documents)").fetchone()[0]
    if have_docs and marker is None:
        sys.exit("refusing to load into a database that holds documents not loaded by this benchmark")
    reuse = args.keep and marker is not None and json.loads(marker[0]) == params and vectors_file.exists()
    hnsw_def = conn.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s AND indexdef ILIKE "
                            "'%%USING hnsw%%'", (table,)).fetchone()
    if reuse:
        vectors = np.load(vectors_file, mmap_mode=None)
        print(f"load: reused the loaded database in {work} (--keep)")
    else:
        conn.execute("DELETE FROM index_settings WHERE key = 'bench_permissions'")
        conn.execute("TRUNCATE documents, chunks, group_members, retrieval_log RESTART IDENTITY CASCADE")
        # secondary indexes of chunks and of the generation's table (its HNSW index): dropped for the load
        secondary = conn.execute(
            "SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
            "WHERE x.indrelid IN ('chunks'::regclass, %s::regclass) AND NOT EXISTS (SELECT 1 FROM pg_constraint c "
            "WHERE c.conindid = x.indexrelid)", (table,)).fetchall()
        for name, _ in secondary:
            conn.execute(f'DROP INDEX "{name}"')
        vectors, load_s = load(conn, layout, gen, n_docs, per_doc, args.seed, generation)
        other = [d for _, d in secondary if "USING hnsw" not in d]
        t0 = time.perf_counter()
        for d in other:
            conn.execute(d)
        print(f"load: COPY {n_docs} documents + {n} chunks + {n} vectors ({table}) {load_s:.1f} s (+ ANALYZE), "
              f"{len(other)} other chunk index(es) rebuilt {time.perf_counter() - t0:.1f} s")
        hnsw = [d for _, d in secondary if "USING hnsw" in d]
        hnsw_def = hnsw[0] if hnsw else (hnsw_def[0] if hnsw_def else None)
        if hnsw_def is None:
            sys.exit(f"the migrated schema has no HNSW index on {table}")
        notices.clear()
        build_s = build_hnsw(conn, url, hnsw_def, args)
        print(f"HNSW build: {build_s:.1f} s ({build_s / 60:.1f} min), maintenance_work_mem "
              f"{args.maintenance_work_mem}, max_parallel_maintenance_workers {args.build_workers}: {hnsw_def}")
        for m in notices:
            print(f"  notice: {m}")
        if args.keep:
            np.save(vectors_file, vectors)
        conn.execute("INSERT INTO index_settings (key, value) VALUES ('bench_permissions', %s)", (json.dumps(params),))
    if not conn.execute("SELECT EXISTS (SELECT 1 FROM pg_indexes WHERE tablename = %s AND indexdef ILIKE "
                        "'%%USING hnsw%%')", (table,)).fetchone()[0]:
        build_s = build_hnsw(conn, url, hnsw_def[0], args)
        print(f"HNSW build (index was missing): {build_s:.1f} s")
    print(data_shape(vectors[:2100]))
    sizes = conn.execute("SELECT pg_size_pretty(pg_table_size('chunks')), pg_size_pretty(pg_table_size(%s::regclass)), "
                         "pg_size_pretty(pg_relation_size(i.oid)) "
                         "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_am a ON a.oid = i.relam "
                         "WHERE x.indrelid = %s::regclass AND a.amname = 'hnsw'", (table, table)).fetchone()
    print(f"sizes: chunks table {sizes[0]}, {table} table {sizes[1]}, HNSW index {sizes[2]}")

    conn.prepare_threshold = args.prepare_threshold
    if args.max_scan_tuples is not None:
        conn.execute(f"SET hnsw.max_scan_tuples = {int(args.max_scan_tuples)}")
    expand, how = expander()
    exact_below = retrieval.EXACT_BELOW_DOCUMENTS if args.exact_below is None else args.exact_below
    ef_search = retrieval.EF_SEARCH if args.ef_search is None else args.ef_search
    print(f"query: retrieval.search(k={k}, exact_below={exact_below}, ef_search={ef_search}), prepare_threshold "
          f"{args.prepare_threshold}; "
          f"principals expanded by {how}; {args.queries} queries (+{args.warmup} warm-up) per principal")
    print(f"\n{'principal':<30}{'readable chunks':>20}{'docs':>8}  {'exact/hnsw/hnsw+exact':>21}"
          f"{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}{'recall@10':>11}  {'rows ok':>9}{'leaks':>6}")

    runs = [("alice (50%)", layout.alice, {}, 0), ("bob (5%)", layout.bob, {}, 1),
            ("carol (0.1%)", layout.carol, {}, 2), ("admin (unfiltered)", None, {}, 3)]
    if args.what_if:
        runs.append(("carol (0.1%), exact_below=0", layout.carol, {"exact_below": 0}, 2))
        if exact_below > 1:
            dave, dave_docs = layout.teams_below(exact_below)
            runs.append((f"dave ({dave_docs} docs < {exact_below})", dave, {}, 4))
            runs.append(("dave, exact_below=0", dave, {"exact_below": 0}, 4))
    failures = []
    for label, principal, override, number in runs:
        if principal is None:
            readable, doc_mask = None, np.ones(n_docs, dtype=bool)
            expected_docs = n_docs
        elif isinstance(principal, list):  # an expanded list given directly
            readable = principal
            doc_mask = layout.readable_documents(set(readable))
            expected_docs = int(doc_mask.sum())
        else:
            readable = sorted(expand(conn, principal))
            doc_mask = layout.readable_documents(set(readable))
            expected_docs = layout.by_construction[principal]
        mask = np.repeat(doc_mask, per_doc)
        in_db = n if readable is None else conn.execute(
            "SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id AND d.version = c.version "
            "WHERE d.principals && %s::text[]", (readable,)).fetchone()[0]
        if int(mask.sum()) != in_db or int(doc_mask.sum()) != expected_docs:
            failures.append(f"{label}: readable chunks numpy {int(mask.sum())}, database {in_db}, documents by "
                            f"construction {expected_docs}")
        queries = gen.queries(args.seed * 100 + number, args.warmup + args.queries)
        truth_i, truth_s = exact_truth(vectors, mask, queries[args.warmup:], k)
        want = min(k, int(mask.sum()))
        kw = {"exact_below": exact_below, "ef_search": ef_search, **override}
        for q in queries[:args.warmup]:
            retrieval.search(conn, q, k=k, readable=readable, **kw)
        lat, strategies, recalls, rows_ok, leaks = [], {"exact": 0, "hnsw": 0, "hnsw+exact": 0}, [], 0, 0
        recorded = None
        for j, q in enumerate(queries[args.warmup:]):
            target = Recording(conn) if j == 0 else conn
            started = time.perf_counter()
            result = retrieval.search(target, q, k=k, readable=readable, **kw)
            lat.append((time.perf_counter() - started) * 1000)
            if j == 0:
                recorded = target.statements
            strategies[result.strategy] = strategies.get(result.strategy, 0) + 1
            idx = np.array([(h.document_id - 1) * per_doc + h.ordinal for h in result.hits], dtype=np.int64)
            leaks += int((~mask[idx]).sum()) if len(idx) else 0
            rows_ok += len(result.hits) == want
            truth = set(truth_i[j][truth_i[j] >= 0].tolist())
            kth = truth_s[j][want - 1]
            sims = vectors[idx] @ q if len(idx) else np.zeros(0)
            found = sum(1 for i, s in zip(idx.tolist(), sims.tolist()) if mask[i] and (i in truth or s >= kth - 1e-5))
            recalls.append(min(found, want) / want)
        # cross-check the numpy truth against a sequential-scan SQL answer (first measured query)
        q0 = queries[args.warmup]
        with conn.transaction():
            conn.execute("SET LOCAL enable_indexscan = off")
            conn.execute("SET LOCAL enable_bitmapscan = off")
            sql_rows = conn.execute(
                "SELECT (c.document_id - 1) * %(per)s + c.ordinal, 1 - (e.embedding <=> %(v)s) FROM chunks c "
                f"JOIN {table} e ON e.chunk_id = c.id "
                "JOIN documents d ON d.id = c.document_id AND d.version = c.version "
                "WHERE %(r)s::text[] IS NULL OR d.principals && %(r)s::text[] ORDER BY e.embedding <=> %(v)s LIMIT %(k)s",
                {"per": per_doc, "v": q0, "r": readable, "k": k}).fetchall()
        sql_s = np.array([r[1] for r in sql_rows], dtype=np.float32)
        if len(sql_s) != want or not np.allclose(np.sort(sql_s)[::-1], truth_s[0][:want], atol=1e-5):
            failures.append(f"{label}: numpy truth differs from the sequential-scan answer")
        if leaks:
            failures.append(f"{label}: {leaks} row(s) returned that the principal may not read")
        if rows_ok != len(lat):
            failures.append(f"{label}: {len(lat) - rows_ok} answer(s) without exactly min(k, readable) rows")
        p50, p95 = np.percentile(lat, 50), np.percentile(lat, 95)
        frac = mask.mean()
        strat = f"{strategies['exact']}/{strategies['hnsw']}/{strategies['hnsw+exact']}"
        print(f"{label:<30}{frac * 100:>8.3f}% {int(mask.sum()):>10}{int(doc_mask.sum()):>8}  {strat:>21}"
              f"{p50:>9.1f}{p95:>9.1f}{max(lat):>9.1f}{np.mean(recalls):>11.4f}  "
              f"{rows_ok:>4}/{len(lat):<4}{leaks:>6}   (min recall {min(recalls):.2f}, "
              f"{sum(r < 0.5 for r in recalls)} below 0.5)", flush=True)
        if args.explain and recorded:
            explain(conn, recorded)
    print(f"\nload average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for f in failures:
        print(f"CHECK FAILED: {f}")
    conn.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
