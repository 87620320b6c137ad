"""Embedding generations (issue 13, parts 2 and 3): any dimension, and a model change as a zero-downtime
rollout with rollback.

The "new model" is ``fakes.mapped_embedder.MappedEmbedder``: the real bundled model behind a fixed random
orthogonal map, so its vectors differ from the old model's while its rankings are the bundled model's (the
right answer is known independently); a ``dimension`` over 2,000 is stored as ``halfvec``.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from rag_pipeline.pipeline.rollout import reembed
from rag_pipeline.pipeline.sync import sync_source
from rag_pipeline.retrieval import query
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.store import generations as gens
from rag_pipeline.store.db import IndexConfigurationError, Store, migrate
from rag_pipeline.store.invariants import check_index
from rag_pipeline_tests.fakes.mapped_embedder import MappedEmbedder

TEXTS = {
    "bees.md": "# Bees\n\nHoneybees dance to tell the hive where the flowers are; the waggle points at the sun.",
    "tides.txt": "The moon's pull raises two tidal bulges, so most coasts see two high tides a day.",
    "bread.md": "# Bread\n\nSourdough rises because wild yeast and lactic bacteria ferment the flour slowly.",
    "rail.txt": "The first public steam railway opened between Stockton and Darlington in 1825.",
    "glass.md": "# Glass\n\nGlass is made by melting sand with soda ash and lime, then cooling it quickly.",
    "owls.txt": "Owls hunt at night; their soft feathers muffle the sound of their wings.",
    "ink.md": "# Ink\n\nIron gall ink, made from oak galls and iron salts, darkens as it oxidises on paper.",
    "salt.txt": "Sea salt is gathered by letting sea water evaporate in shallow pans under the sun.",
}
QUESTIONS = ["how do bees find flowers", "why are there two tides", "who opened the first railway",
             "how is glass made", "what makes sourdough rise"]


def _folder(root: Path, texts=TEXTS) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (root / name).write_text(text)
    return root


def _ranked(store, embedder, settings, question, k=3) -> list[str]:
    return [h.source_id for h in query(store, embedder, question, k=k, admin=True, settings=settings)]


def _last_logged_generation(store) -> int:
    with store.connection() as conn:
        return conn.execute("SELECT generation FROM retrieval_log ORDER BY id DESC LIMIT 1").fetchone()[0]


def test_a_model_change_is_a_zero_downtime_rollout(tmp_path, settings, store, embedder):
    root = _folder(tmp_path / "docs")
    src = LocalFolderSource(root)
    sync_source(src, store, embedder, settings)
    truth = {q: _ranked(store, embedder, settings, q) for q in QUESTIONS}  # the whole corpus, old model
    with store.connection() as conn:
        old = gens.active(conn)
    new = MappedEmbedder(embedder)
    settings = settings.model_copy(update={"sync_batch_documents": 2})
    seen_during: list[tuple[int, dict[str, list[str]]]] = []
    changed_mid_rollout = []

    def progress(event, data):
        if event != "document":
            return
        # between batches: every query answers from the whole corpus with the old model, logged as such
        answers = {q: _ranked(store, new, settings, q) for q in QUESTIONS}
        seen_during.append((_last_logged_generation(store), answers))
        if len(seen_during) == 3:  # a change and a new document during the rollout land in both generations
            (root / "bees.md").write_text(TEXTS["bees.md"] + " A colony can hold fifty thousand bees.")
            (root / "moths.txt").write_text("Moths navigate by the moon and are drawn to lamps by mistake.")
            changed_mid_rollout.append(sync_source(src, store, new, settings))

    report = reembed(store, new, settings, progress=progress)
    assert report.activated and report.failed == [] and report.progress.complete
    with store.connection() as conn:
        now_active = gens.active(conn)
    # the sync at the third batch wrote the change to both generations and filled the rest (a sync fills
    # every kept generation), so the rollout completed there and switched; before it every query read the
    # old generation and answered exactly as from the whole corpus; after it, the new one, whole
    assert len(seen_during) >= 4
    assert [g for g, _ in seen_during[:3]] == [old.id] * 3 and all(a == truth for _, a in seen_during[:3])
    assert {g for g, _ in seen_during[3:]} == {now_active.id}
    with store.connection() as conn:
        assert now_active.model == new.model_id and gens.get(conn, old.id).state == "retired"
        both = conn.execute("SELECT source_id, generations FROM documents WHERE source_id IN ('bees.md', 'moths.txt') "
                            "ORDER BY 1").fetchall()
        assert [(sid, sorted(g)) for sid, g in both] == [("bees.md", sorted([old.id, now_active.id])),
                                                          ("moths.txt", sorted([old.id, now_active.id]))]
        assert check_index(conn) == []
    (mid,) = changed_mid_rollout
    assert {d.source_id: d.action.value for d in mid.documents if d.action.value in ("updated", "added")} == {
        "bees.md": "updated", "moths.txt": "added"}
    # after the switch: the whole corpus, new model (its ranking is the bundled model's by construction)
    after = {q: _ranked(store, new, settings, q) for q in QUESTIONS}
    assert _last_logged_generation(store) == now_active.id
    truth_now = {q: _ranked_reference(store, embedder, settings, q, old.id) for q in QUESTIONS}
    assert after == truth_now and all(a == truth_now for _, a in seen_during[3:])
    assert "moths.txt" in _ranked(store, new, settings, "what draws moths to lamps", k=1)

    # rollback: the previous generation is complete (it got every write) and becomes active again
    with store.connection() as conn:
        back = gens.activate(conn, old.id, keep_days=settings.generation_keep_days)
        assert back.state == "active" and gens.get(conn, now_active.id).state == "retired"
    assert {q: _ranked(store, new, settings, q) for q in QUESTIONS} == truth_now  # the old model answers again
    assert _last_logged_generation(store) == old.id
    # a rolled-back-from generation is not re-activated by the next sync on its own
    sync_source(src, store, new, settings)
    with store.connection() as conn:
        assert gens.active(conn).id == old.id


def _ranked_reference(store, embedder, settings, question, generation_id):
    """The old generation's answer (bundled model), read directly: the reference for the new one."""
    from rag_pipeline.retrieval import search

    vector = embedder.embed([question])[0]
    with store.connection() as conn:
        g = gens.get(conn, generation_id)
        return [h.source_id for h in search(conn, vector, k=3, readable=None, generation=g).hits]


def test_a_stopped_rollout_resumes_without_re_embedding_what_was_done(tmp_path, settings, store, embedder):
    sync_source(LocalFolderSource(_folder(tmp_path / "docs")), store, embedder, settings)
    settings = settings.model_copy(update={"sync_batch_documents": 2})
    new = MappedEmbedder(embedder, seed=11)

    class Stop(Exception):
        pass

    done: list[str] = []

    def crash_after_two_batches(event, data):
        if event == "document":
            done.append(data["outcome"].source_id)
            if len(done) == 4:
                raise Stop

    with pytest.raises(Stop):
        reembed(store, new, settings, progress=crash_after_two_batches)
    with store.connection() as conn:
        g = next(g for g in gens.kept(conn) if g.model == new.model_id)
        assert g.state == "building" and gens.progress(conn, g).documents_done == 4
        assert gens.active(conn).model == embedder.model_id  # queries never saw the half-built generation
        assert check_index(conn) == []
    embedded_before = new.embedded
    report = reembed(store, new, settings)
    assert sorted(o.source_id for o in report.outcomes) == sorted(set(TEXTS) - set(done))
    chunks_left = sum(o.chunk_count for o in report.outcomes)
    assert new.embedded - embedded_before == chunks_left  # only the documents not done before
    assert report.activated and report.progress.complete


def test_a_large_dimension_is_stored_as_halfvec_and_answers(tmp_path, settings, store, embedder):
    sync_source(LocalFolderSource(_folder(tmp_path / "docs")), store, embedder, settings)
    wide = MappedEmbedder(embedder, dimension=2560, seed=3)
    report = reembed(store, wide, settings)
    assert report.activated and report.generation.storage == "halfvec" and report.generation.dimension == 2560
    with store.connection() as conn:
        column = conn.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attname = 'embedding'", (report.generation.table,)).fetchone()[0]
        index = conn.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", (report.generation.table,)).fetchall()
    assert column == "halfvec(2560)" and any("hnsw" in r[0] and "halfvec_cosine_ops" in r[0] for r in index)
    for q in QUESTIONS:
        assert _ranked(store, wide, settings, q, k=1)[0] == _ranked_reference(store, embedder, settings, q, 1)[0]


@pytest.mark.parametrize(("dimension", "storage"), [(1, "vector"), (2000, "vector"), (2001, "halfvec"),
                                                    (4000, "halfvec")])
def test_storage_by_dimension(dimension, storage):
    assert gens.storage_for(dimension) == storage
    assert (gens.MAX_VECTOR_DIMENSION, gens.MAX_HALFVEC_DIMENSION) == (2000, 4000)


def test_a_dimension_over_4000_is_refused_before_any_ddl(pg_server, tmp_path):
    """qwen3-embedding's native 4,096: a clear error naming the way out, on a new database and on an
    existing index, and the database is left exactly as it was (no table, no half-applied migration)."""
    from rag_pipeline_tests.conftest import _with_db

    name = "gen_refused_" + tmp_path.name[-8:].replace("-", "_")
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    url = _with_db(pg_server, name)
    with pytest.raises(IndexConfigurationError, match="4,096 is over 4,000.*RAG_EMBEDDING_DIMENSIONS"):
        migrate(url, embedding_dimension=4096, embedding_model="qwen3-embedding")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0] == 0


def test_a_dimension_over_4000_is_refused_on_an_existing_index(settings, store, embedder, tmp_path):
    sync_source(LocalFolderSource(_folder(tmp_path / "docs", {"a.txt": TEXTS["owls.txt"]})), store, embedder, settings)
    with store.connection() as conn:
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0]
    with pytest.raises(IndexConfigurationError, match="over 4,000"):
        Store.open(settings, embedding_dimension=4096, embedding_model="qwen3-embedding")
    with store.connection() as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0] == tables
        assert [g.model for g in gens.kept(conn)] == [embedder.model_id]


def test_an_incomplete_generation_cannot_be_activated(tmp_path, settings, store, embedder):
    sync_source(LocalFolderSource(_folder(tmp_path / "docs")), store, embedder, settings)
    new = MappedEmbedder(embedder, seed=5)
    with store.connection() as conn:
        g = gens.ensure_for(conn, new, settings)
        assert g.state == "building"
        with pytest.raises(gens.GenerationError, match=f"0 of {len(TEXTS)} documents"):
            gens.activate(conn, g.id, keep_days=7)
        assert gens.active(conn).model == embedder.model_id


def test_a_retired_generation_is_dropped_after_its_window(tmp_path, settings, store, embedder):
    root = _folder(tmp_path / "docs")
    sync_source(LocalFolderSource(root), store, embedder, settings)
    new = MappedEmbedder(embedder, seed=9)
    reembed(store, new, settings.model_copy(update={"generation_keep_days": 0}))
    with store.connection() as conn:
        (retired,) = [g for g in gens.kept(conn) if g.state == "retired"]
        assert retired.model == embedder.model_id
    report = reembed(store, new, settings)  # the next run drops what is past its window
    assert [d.id for d in report.dropped] == [retired.id]
    with store.connection() as conn:
        assert gens.get(conn, retired.id).state == "dropped"
        assert conn.execute("SELECT to_regclass(%s)", (retired.table,)).fetchone()[0] is None
        assert conn.execute("SELECT count(*) FROM documents WHERE %s = ANY(generations)", (retired.id,)).fetchone()[0] == 0
        assert check_index(conn) == []
    with store.connection() as conn:
        with pytest.raises(gens.GenerationError, match="dropped"):
            gens.activate(conn, retired.id, keep_days=7)


def test_documented_generation_defaults(monkeypatch):
    from rag_pipeline.config import Settings

    monkeypatch.delenv("RAG_GENERATION_KEEP_DAYS", raising=False)
    assert Settings().generation_keep_days == 7.0


def test_a_generation_never_records_the_api_key():
    from pydantic import SecretStr

    from rag_pipeline.config import Settings

    s = Settings(embedding_provider="openai", embedding_model="text-embedding-3-small",
                 embedding_api_key=SecretStr("sk-test-d41d8cd98f00b204"), embedding_dimensions=256)
    spec = gens.spec_of(s)
    assert "embedding_api_key" not in spec and "sk-test-d41d8cd98f00b204" not in repr(spec)
    assert (spec["embedding_provider"], spec["embedding_model"], spec["embedding_dimensions"]) == (
        "openai", "text-embedding-3-small", 256)
    assert "embedding_max_tokens" in spec  # only secrets are left out


def test_a_rollout_whose_model_cannot_embed_says_so_and_can_be_dropped(tmp_path, settings, store, embedder):
    """The new model's endpoint is down: ``reembed`` names every document it could not embed (the CLI exits 1
    on ``failed``), nothing changes for queries or for the documents' states, a sync reports the documents as
    unchanged with the reason instead of "re-embedded", and ``drop`` removes the abandoned generation."""
    from rag_pipeline.embedding.base import EmbeddingError

    class Down(MappedEmbedder):
        def embed(self, texts):
            raise EmbeddingError("down:8080 refused the connection")

    root = _folder(tmp_path / "docs")
    src = LocalFolderSource(root)
    sync_source(src, store, embedder, settings)
    down = Down(embedder, seed=13)
    report = reembed(store, down, settings)
    assert not report.activated and report.generation.state == "building"
    assert sorted(o.source_id for o in report.failed) == sorted(TEXTS)
    assert all("down:8080 refused the connection" in o.reason for o in report.failed)
    with store.connection() as conn:
        assert gens.active(conn).model == embedder.model_id
        assert {r[0] for r in conn.execute("SELECT status FROM documents")} == {"completed"}
        assert check_index(conn) == []
    again = sync_source(src, store, down, settings)
    assert {d.action.value for d in again.documents} == {"skipped-unchanged"}
    assert all("down:8080" in (d.reason or "") for d in again.documents)
    with store.connection() as conn:
        with pytest.raises(gens.GenerationError, match="active one"):
            gens.drop(conn, gens.active(conn).id)
        dropped = gens.drop(conn, report.generation.id)
        assert dropped.state == "dropped"
        assert conn.execute("SELECT to_regclass(%s)", (dropped.table,)).fetchone()[0] is None
        assert check_index(conn) == []
    assert _ranked(store, embedder, settings, QUESTIONS[0])[0] == "bees.md"
