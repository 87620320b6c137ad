"""Settings, read from environment variables (prefix ``RAG_``) by pydantic-settings.

Every setting has a documented default here and in README.md; tests in
``rag_pipeline_tests/test_config.py`` pin the defaults so the docs cannot drift.
"""

from __future__ import annotations

from pydantic import Field, SecretStr
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

    # --- remote embedding providers (rag_pipeline.embedding.remote / openai_compat / ollama) ---
    embedding_provider: str = "sentence-transformers"
    """``sentence-transformers`` (the bundled model, in process) | ``openai`` (OpenAI or any OpenAI-compatible
    ``/v1/embeddings``: vLLM, LiteLLM) | ``azure-openai`` (``RAG_EMBEDDING_MODEL`` = the deployment name) |
    ``ollama`` | ``tei`` (Hugging Face Text Embeddings Inference, its OpenAI-compatible route)."""
    embedding_api_url: str = ""
    """Base URL: ``openai`` default ``https://api.openai.com/v1``; ``azure-openai`` the resource endpoint
    (``https://NAME.openai.azure.com``, required); ``tei`` required (``/v1`` appended when the URL has no path);
    ``ollama`` default ``http://127.0.0.1:11434``."""
    embedding_api_key: SecretStr = SecretStr("")
    """API key (required for ``openai`` at api.openai.com and for ``azure-openai``). A secret: registered with
    ``rag_pipeline.redact`` when the embedder is built, never logged, never in an error message."""
    embedding_api_version: str = "2024-10-21"
    """Azure OpenAI data-plane API version (``?api-version=``)."""
    embedding_dimensions: int = 0
    """Output dimension; 0 = the model's native one. ``openai``/``azure-openai`` send it as the API's
    ``dimensions`` parameter (text-embedding-3 and later); ``tei``/``ollama`` truncate client-side and
    re-normalise (for models trained for it: Matryoshka, e.g. qwen3-embedding 4096 -> 1024)."""
    embedding_max_tokens: int = 0
    """Content tokens one text may have; 0 = the provider's default (``embedding.remote.default_limits``:
    8191 for OpenAI/Azure, 8192 for qwen3-embedding on Ollama, else 510). Longer texts are refused, never
    truncated."""
    embedding_tokenizer: str = ""
    """Local path of the remote model's ``tokenizer.json`` for exact token counts; empty = a safe upper bound
    (UTF-8 bytes + 1 per text)."""
    embedding_request_inputs: int = 0
    """Most texts in one request; 0 = the provider's default (OpenAI/Azure 2048, TEI 32, Ollama 32)."""
    embedding_request_tokens: int = 0
    """Most tokens summed over one request; 0 = the provider's default (OpenAI/Azure 300000, TEI 16384,
    Ollama 65536)."""
    embedding_timeout_s: float = 60.0
    """Per-request timeout of a remote provider, seconds."""
    embedding_max_retries: int = 6
    """Retries of one request after a 408/409/429/5xx answer, a timeout or a connection error."""
    embedding_retry_budget_s: float = 120.0
    """Most seconds one request may spend waiting between retries (``Retry-After`` included): a wait that
    would pass it ends the request with an ``EmbeddingError`` at once."""

    embedding_backend: str = Field(default="auto", description="auto | torch | openvino | onnx | onnx-int8")
    """How sentence-transformers runs on the CPU (``RAG_EMBEDDING_BACKEND``): ``auto`` = OpenVINO on a local
    ONNX export when the ``openvino`` package is installed (bfloat16 where the CPU has it), else torch; torch
    on a GPU or when ``RAG_EMBEDDING_BF16`` is ``on``/``off``. ``torch`` = the PyTorch path; ``onnx`` = the
    float32 export on onnxruntime; ``onnx-int8`` = int8 weights (opt-in: lower agreement); ``openvino``.
    See ``embedding.sentence_transformers``."""
    embedding_device: str = Field(default="auto", description="auto | cpu | cuda | cuda:N | mps")
    """Torch device of the sentence-transformers model (``RAG_EMBEDDING_DEVICE``): ``auto`` = the GPU when
    torch sees one, else the CPU; an explicit GPU torch cannot see is a configuration error."""
    embedding_cache_dir: str = Field(default="", description="folder for local ONNX exports; empty = user cache")
    """Where ONNX exports of the model are written (``RAG_EMBEDDING_CACHE_DIR``); empty = ``<user cache
    dir>/rag-pipeline`` (``~/.cache/rag-pipeline`` on Linux)."""

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

    generation_keep_days: float = 7.0
    """Days a retired embedding generation (the model before a rollout) is kept as the rollback target
    (``RAG_GENERATION_KEEP_DAYS``), then dropped by the next sync or ``reembed``; 0 = dropped at once."""

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
