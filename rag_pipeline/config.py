"""Settings, read from environment variables (prefix ``RAG_``) by pydantic-settings.

Every setting has a documented default here and in README.md; tests in
``rag_pipeline_tests/test_config.py`` pin the defaults so the docs cannot drift.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Runtime configuration.

    Units: sizes in characters unless named ``*_tokens`` or ``*_mb``; times in seconds.
    ``database_url`` empty means: start the embedded PostgreSQL (see ``store.embedded``).
    """

    model_config = SettingsConfigDict(env_prefix="RAG_", extra="ignore")

    database_url: str = Field(default="", description="PostgreSQL URL; empty = embedded server")
    embedded_pg_dir: str = Field(default="", description="data directory of the embedded server")

    embedding_model: str = Field(default="all-MiniLM-L6-v2", description="bundled model id or a local path")
    embedding_bf16: str = Field(default="auto", description="auto | on | off: bfloat16 inference on CPU")
    embedding_batch_size: int = 32

    chunk_size: int = 1000
    chunk_overlap: int = 150

    max_failures: int = 3
    deletion_max_fraction: float = 0.2

    extraction_timeout_s: float = 300.0
    extraction_memory_mb: int = 4096
    ocr_languages: str = "eng+jpn"

    max_document_mb: int = 200
    """Per-document size cap in MiB (``RAG_MAX_DOCUMENT_MB``). A document larger than this ends
    ``permanently_failed`` with its size and the cap in the reason, without being read when the listing
    reports its size (else the download stops at the piece that passes the cap: "at least N MB"); it is
    tried again when its content changes or after ``rag-pipeline retry``. 0 = no cap."""

    max_pdf_pages: int = 20_000
    """Most pages a PDF may declare (``RAG_MAX_PDF_PAGES``, default ``extraction.pdf.MAX_PDF_PAGES``); a PDF
    with more is refused before any page is read: ``permanently_failed``, "too many pages: N, over the cap
    of M pages"."""

    expiry_days: dict[str, int] = Field(default_factory=dict)
    """Per document type, days after ``modified_at`` when a document counts as expired and queries skip
    it, e.g. ``RAG_EXPIRY_DAYS='{"html": 30, "*": 365}'`` (``*`` = any other type). Empty = never."""

    retry_backoff_s: float = 3600.0
    """A ``failed`` document is retried on a later sync once ``retry_backoff_s * 2**(failure_count-1)``
    seconds have passed since its last attempt: with the default (1 h) and ``max_failures`` 3 the attempts
    come at 0 h, 1 h and 3 h, so a service outage of minutes (a 403/429 storm, a NAS blip) does not use up a
    document's budget. 0 = retry on the next sync or sensor tick."""

    local_verify_interval_s: float = 7 * 24 * 3600.0
    """Local folders list with stat calls only (size + mtime decide what to re-read); a full listing that
    hashes every file runs when the last one is older than this many seconds (default 7 days; 0 = never)."""

    sync_batch_documents: int = 16
    """Documents extracted before one embedding call (chunks are embedded across documents)."""


def get_settings() -> Settings:
    """Return a fresh ``Settings`` read from the current environment (never cached at import)."""
    return Settings()
