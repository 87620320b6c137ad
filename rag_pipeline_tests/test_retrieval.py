"""Retrieval: freshness (per-type expiry), current versions only, and the retrieval log."""

from __future__ import annotations

import os
import time

import pytest

from rag_pipeline.retrieval import query
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.pipeline.sync import sync_source


def test_expired_documents_are_excluded(tmp_path, settings, store, embedder):
    old, new = tmp_path / "old-rates.md", tmp_path / "rates.txt"
    old.write_text("The interest rate on savings accounts is four percent.\n")
    new.write_text("The interest rate on savings accounts is two percent.\n")
    year_ago = time.time() - 400 * 86400
    os.utime(old, (year_ago, year_ago))
    settings = settings.model_copy(update={"expiry_days": {"md": 30}})  # Markdown expires after 30 days
    assert sync_source(LocalFolderSource(tmp_path), store, embedder, settings).ok
    hits = query(store, embedder, "savings account interest rate", k=5, admin=True)
    assert [h.source_id for h in hits] == ["rates.txt"]
    with store.connection() as conn:
        expires = conn.execute("SELECT source_id, expires_at IS NOT NULL FROM documents ORDER BY 1").fetchall()
    assert expires == [("old-rates.md", True), ("rates.txt", False)]


def test_every_query_is_logged_with_versions_and_ages(tmp_path, settings, store, embedder):
    doc = tmp_path / "a.md"
    doc.write_text("Penguins live in the southern hemisphere.\n")
    source = LocalFolderSource(tmp_path)
    sync_source(source, store, embedder, settings)
    doc.write_text("Penguins live in the southern hemisphere, mostly in Antarctica.\n")
    sync_source(source, store, embedder, settings)
    hits = query(store, embedder, "where do penguins live?", k=3, admin=True)
    assert len(hits) == 1 and hits[0].version == 2 and "Antarctica" in hits[0].text  # never the old version
    with store.connection() as conn:
        row = conn.execute("SELECT query, k, chunk_ids, scores, document_ids, versions, document_ages_s "
                           "FROM retrieval_log").fetchall()
    assert len(row) == 1
    q, k, chunk_ids, scores, doc_ids, versions, ages = row[0]
    assert (q, k, chunk_ids, versions) == ("where do penguins live?", 3, [hits[0].chunk_id], [2])
    assert scores == pytest.approx([hits[0].score]) and doc_ids == [hits[0].document_id] and ages[0] >= 0


def test_bad_queries_are_clear_errors(store, embedder):
    with pytest.raises(ValueError, match="k must be"):
        query(store, embedder, "x", k=0, admin=True)
    with pytest.raises(ValueError, match="empty"):
        query(store, embedder, "   ", admin=True)
