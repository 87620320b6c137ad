"""The main job on real documents: ../shared/corpus synced into the embedded PostgreSQL with the real model.

One session-scoped sync (the slow part: OCR, the 619-page PDF); the tests read its outcome from the
report and from SQL. Expected phrases were read from the files with other tools (pdftotext, python-docx,
iconv), not from this pipeline.
"""

from __future__ import annotations

import pytest

from rag_pipeline.config import Settings
from rag_pipeline.retrieval import query
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.store import Store
from rag_pipeline.pipeline.sync import sync_source

from .conftest import new_database

# file -> phrases its chunks must contain (whitespace-normalised comparison)
COMPLETES_WITH = {
    "2023-half-year-analyses-by-segment.xlsx": ["Operating segments"],
    "DA-619p.pdf": ["Arcane Horror"],
    "a1977-backus-p21.pdf": ["functional forms"],
    "codeblock.md": ["This is a simple HTML example."],
    "copy-protected.pdf": ["LayoutParser", "Unified Toolkit"],                       # C10
    "docx-tables.docx": ["Simple uniform table", "Lorem ipsum"],
    "example-10k-1p.html": ["Galaxy Gaming"],
    "fake-email-attachment.eml": ["attachments"],
    "fake-html-cp1252.html": ["Der Preis betrug 15,50 €"],
    "fake-memo.pdf": ["20,000 bottles of water"],
    "fake-memo-with-duplicate-page.pdf": ["20,000 bottles of water"],
    "fake-text-utf-16.txt": ["This is a test document to use for unit tests."],
    "korean-text-with-tables.pdf": ["빅포인트 적립"],
    "layout-parser-paper-fast.pdf": ["Unified Toolkit"],
    "layout-parser-paper-with-empty-pages.pdf": ["Unified Toolkit"],
    "layout-parser-paper-with-table.pdf": ["model zoo"],
    "loremipsum-flat.pdf": ["Lorem ipsum"],                                             # C11 via OCR
    "multi-column-2p.pdf": ["Dense Passage Retrieval"],
    "sample-presentation.pptx": ["first content slide"],
    "simple-table.md": ["Juicy Apples"],
    "stanley-cups.csv": ["Maple Leafs"],
    "zen_of_python_corrupted.pdf": ["Beautiful is better than ugly", "Readability counts"],  # C13
    "MANIFEST.md": ["Corpus: real public documents"],
}
# file -> words its reason must contain (C09, C12)
PERMANENTLY_FAILS_WITH = {
    "password.pdf": "password protected",
    "password_protected.xlsx": "password protected",
}
SKIPPED_WITH = {"empty.txt": "empty"}  # nothing to index: terminal, not a failure (C12)
# may complete (recoverable text) or fail with a reason, but never crash or hang the run (C13)
COMPLETES_OR_FAILS_WITH_REASON = {"issue-1113-evil-xobjects.pdf", "pdf-with-ocr-text.pdf", "single_table.pdf",
                                  "fake.doc"}


def _norm(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="session")
def corpus_index(shared_dir, pg_server, template_db, embedder):
    """Sync the whole corpus once; return (store, settings, first report, second report, calls before 2nd)."""
    url = new_database(pg_server, template_db)
    settings = Settings(database_url=url)
    store = Store(url)
    source = LocalFolderSource(shared_dir / "corpus")
    first = sync_source(source, store, embedder, settings)
    calls, embedded = embedder.calls, embedder.embedded
    with store.connection() as conn:
        max_chunk_created = conn.execute("SELECT max(created_at), count(*) FROM chunks").fetchone()
    second = sync_source(source, store, embedder, settings)
    return {"store": store, "settings": settings, "first": first, "second": second, "calls": calls,
            "embedded": embedded, "chunks_before": max_chunk_created}


def _chunks_of(store: Store, source_id: str) -> str:
    with store.connection() as conn:
        rows = conn.execute(
            "SELECT c.text FROM chunks c JOIN documents d ON d.id = c.document_id AND d.version = c.version "
            "WHERE d.source_id = %s ORDER BY c.ordinal", (source_id,)).fetchall()
    return _norm(" ".join(r[0] for r in rows))


def test_every_corpus_file_ends_in_a_stated_status(corpus_index, shared_dir):
    outcomes = {d.source_id: d for d in corpus_index["first"].documents}
    files = {p.name for p in (shared_dir / "corpus").iterdir() if p.is_file()}
    assert {sid for sid in outcomes if "#attachment/" not in sid} == files
    # the e-mail's text attachment is ingested as a child document of the message
    assert outcomes["fake-email-attachment.eml#attachment/1/fake-attachment.txt"].status == "completed"
    for name, outcome in outcomes.items():
        assert outcome.status in ("completed", "failed", "permanently_failed", "skipped"), name
        if outcome.status != "completed":
            assert outcome.reason, f"{name} ended {outcome.status} without a reason"


@pytest.mark.parametrize("name", sorted(COMPLETES_WITH))
def test_text_bearing_files_complete_with_their_text(corpus_index, name):
    outcome = next(d for d in corpus_index["first"].documents if d.source_id == name)
    assert outcome.status == "completed", f"{name}: {outcome.reason}"
    assert outcome.chunk_count > 0
    text = _chunks_of(corpus_index["store"], name)
    for phrase in COMPLETES_WITH[name]:
        assert _norm(phrase) in text, f"{phrase!r} missing from {name}"


@pytest.mark.parametrize("name", sorted(PERMANENTLY_FAILS_WITH))
def test_content_errors_are_terminal_with_a_reason(corpus_index, name):
    store = corpus_index["store"]
    with store.connection() as conn:
        status, reason, failures, chunks = conn.execute(
            "SELECT d.status, d.last_error, d.failure_count, (SELECT count(*) FROM chunks c WHERE c.document_id = d.id) "
            "FROM documents d WHERE source_id = %s", (name,)).fetchone()
    # one attempt, counted (a terminal error gives up at once, and the count says it failed once)
    assert status == "permanently_failed" and failures == 1 and chunks == 0
    assert PERMANENTLY_FAILS_WITH[name] in reason.lower()


@pytest.mark.parametrize("name", sorted(SKIPPED_WITH))
def test_files_without_content_are_skipped_with_a_reason(corpus_index, name):
    with corpus_index["store"].connection() as conn:
        status, reason, failures, chunks = conn.execute(
            "SELECT d.status, d.last_error, d.failure_count, (SELECT count(*) FROM chunks c WHERE c.document_id = d.id) "
            "FROM documents d WHERE source_id = %s", (name,)).fetchone()
    assert (status, failures, chunks) == ("skipped", 0, 0) and SKIPPED_WITH[name] in reason.lower()


@pytest.mark.parametrize("name", sorted(COMPLETES_OR_FAILS_WITH_REASON))
def test_hard_files_complete_or_fail_with_reason(corpus_index, name):
    outcome = next(d for d in corpus_index["first"].documents if d.source_id == name)
    if outcome.status == "completed":
        assert outcome.chunk_count > 0
    else:
        assert outcome.reason


def test_no_completed_document_without_chunks_and_counts_match(corpus_index):
    with corpus_index["store"].connection() as conn:
        bad = conn.execute(
            """
            SELECT d.source_id, d.expected_chunk_count, count(c.id)
            FROM documents d LEFT JOIN chunks c ON c.document_id = d.id AND c.version = d.version
            WHERE d.status = 'completed' GROUP BY d.id HAVING count(c.id) <> d.expected_chunk_count OR count(c.id) = 0
            """).fetchall()
    assert bad == []


def test_no_chunk_exceeds_the_model_token_limit(corpus_index, embedder):
    with corpus_index["store"].connection() as conn:
        rows = conn.execute("SELECT text, token_count FROM chunks").fetchall()
    assert len(rows) > 100
    counts = embedder.count_tokens([r[0] for r in rows])
    assert max(counts) <= embedder.max_tokens == 254
    assert counts == [r[1] for r in rows]


def test_no_control_characters_stored(corpus_index):
    with corpus_index["store"].connection() as conn:
        n = conn.execute(r"SELECT count(*) FROM chunks WHERE text ~ '[\x01-\x08\x0b\x0c\x0e-\x1f]'").fetchone()[0]
    assert n == 0


def test_noop_resync_extracts_embeds_and_writes_nothing(corpus_index, embedder, shared_dir, monkeypatch):
    store, first, second = corpus_index["store"], corpus_index["first"], corpus_index["second"]
    top_level = {d.source_id for d in first.documents if "#attachment/" not in d.source_id}
    # every listed (top-level) document is reported once, unchanged; none is embedded
    assert sorted(d.source_id for d in second.documents) == sorted(top_level)
    assert {d.action for d in second.documents} == {"skipped-unchanged"}
    assert second.embedded == 0 and second.deleted == [] and second.exit_code == 0
    # one more no-op re-sync, measured here (other tests share the session embedder): zero embedder
    # calls, zero texts embedded, zero fetches, zero extractions
    import rag_pipeline.extraction as extraction

    fetched, extracted = [], []
    real_fetch, real_extract = LocalFolderSource.fetch_to, extraction.extract
    monkeypatch.setattr(LocalFolderSource, "fetch_to",
                        lambda self, doc, out: fetched.append(doc.source_id) or real_fetch(self, doc, out))
    monkeypatch.setattr(extraction, "extract", lambda data, **kw: extracted.append(kw.get("filename")) or real_extract(data, **kw))
    calls, embedded = embedder.calls, embedder.embedded
    third = sync_source(LocalFolderSource(shared_dir / "corpus"), store, embedder, corpus_index["settings"])
    assert (embedder.calls, embedder.embedded) == (calls, embedded)
    assert fetched == [] and extracted == [] and third.embedded == 0
    assert third.counts() == {"skipped-unchanged": len(top_level)}
    with store.connection() as conn:
        after = conn.execute("SELECT max(created_at), count(*) FROM chunks").fetchone()
        # unchanged documents get no ingest_log row: neither no-op run wrote one
        logged = conn.execute("SELECT count(*) FROM ingest_log WHERE run_id = ANY(%s)",
                              ([f"sync:{second.run_id}", f"sync:{third.run_id}"],)).fetchone()[0]
        runs = conn.execute("SELECT status, counts FROM sync_runs WHERE id = ANY(%s) ORDER BY id",
                            ([second.run_id, third.run_id],)).fetchall()
    assert after == corpus_index["chunks_before"]
    assert logged == 0
    for status, counts in runs:
        permissions = counts.pop("permissions")
        assert (status, counts) == ("succeeded", {"skipped-unchanged": len(top_level), "embedded": 0, "held_back": [],
                                                  "hidden": 0})
        # the permission sync read every top-level document again and changed nothing
        assert {k: permissions[k] for k in ("mode", "read", "updated", "unreadable", "group_errors")} == \
            {"mode": "full", "read": len(top_level), "updated": 0, "unreadable": 0, "group_errors": 0}


def test_quality_record_is_stored(corpus_index):
    with corpus_index["store"].connection() as conn:
        pages, chars, stats = conn.execute(
            "SELECT page_count, char_count, extraction_stats FROM documents WHERE source_id = 'DA-619p.pdf'"
        ).fetchone()
    assert pages == 619 and chars > 100_000 and stats


def test_query_finds_the_right_document(corpus_index, embedder):
    hits = query(corpus_index["store"], embedder, "how many bottles of water and blankets were delivered?", k=3, admin=True)
    assert hits[0].source_id in ("fake-memo.pdf", "fake-memo-with-duplicate-page.pdf")
    with corpus_index["store"].connection() as conn:
        logged = conn.execute("SELECT chunk_ids, document_ids FROM retrieval_log ORDER BY id DESC LIMIT 1").fetchone()
    assert logged[0] == [h.chunk_id for h in hits] and logged[1] == [h.document_id for h in hits]
