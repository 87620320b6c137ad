"""The documented defaults (README's configuration table) are the code's defaults."""

from rag_pipeline.config import Settings


def test_documented_defaults(monkeypatch):
    for var in list(__import__("os").environ):
        if var.startswith("RAG_"):
            monkeypatch.delenv(var)
    s = Settings()
    assert (s.database_url, s.embedding_model, s.embedding_bf16, s.embedding_batch_size) == (
        "", "all-MiniLM-L6-v2", "auto", 32)
    assert (s.chunk_size, s.chunk_overlap, s.max_failures, s.deletion_max_fraction) == (1000, 150, 3, 0.2)
    assert (s.extraction_timeout_s, s.extraction_memory_mb, s.ocr_languages) == (300.0, 4096, "eng+jpn")
    assert (s.expiry_days, s.retry_backoff_s, s.sync_batch_documents) == ({}, 3600.0, 16)
    assert s.local_verify_interval_s == 7 * 24 * 3600.0
    assert s.max_document_mb == 200
    from rag_pipeline.extraction.pdf import MAX_PDF_PAGES

    assert s.max_pdf_pages == MAX_PDF_PAGES == 20_000
    assert (s.embedding_provider, s.embedding_api_url, s.embedding_api_key.get_secret_value(),
            s.embedding_api_version, s.embedding_dimensions) == ("sentence-transformers", "", "", "2024-10-21", 0)
    assert (s.embedding_max_tokens, s.embedding_tokenizer, s.embedding_request_inputs,
            s.embedding_request_tokens) == (0, "", 0, 0)
    assert (s.embedding_timeout_s, s.embedding_max_retries, s.embedding_retry_budget_s) == (60.0, 6, 120.0)


def test_environment_overrides(monkeypatch):
    monkeypatch.setenv("RAG_EXPIRY_DAYS", '{"html": 30}')
    monkeypatch.setenv("RAG_DELETION_MAX_FRACTION", "0.5")
    s = Settings()
    assert s.expiry_days == {"html": 30} and s.deletion_max_fraction == 0.5


def test_embedding_path_defaults(monkeypatch):
    """RAG_EMBEDDING_BACKEND / _DEVICE / _CACHE_DIR as README's table documents them."""
    for var in list(__import__("os").environ):
        if var.startswith("RAG_"):
            monkeypatch.delenv(var)
    s = Settings()
    assert (s.embedding_backend, s.embedding_device, s.embedding_cache_dir) == ("auto", "auto", "")
    monkeypatch.setenv("RAG_EMBEDDING_BACKEND", "torch")
    monkeypatch.setenv("RAG_EMBEDDING_DEVICE", "cpu")
    monkeypatch.setenv("RAG_EMBEDDING_CACHE_DIR", "/var/cache/rag")
    s = Settings()
    assert (s.embedding_backend, s.embedding_device, s.embedding_cache_dir) == ("torch", "cpu", "/var/cache/rag")
