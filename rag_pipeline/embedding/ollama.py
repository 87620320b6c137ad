"""Ollama through the official ``ollama`` client: ``POST /api/embed`` with a batch ``input``.

Each request carries ``truncate: false`` (an over-long input is an error answer, never cut) and
``options.num_ctx = max_tokens + CONTEXT_MARGIN``, so the server's context is the limit the chunker works to and
not Ollama's smaller default (2048 or 4096 tokens depending on the version; the margin covers the special tokens
the model adds, e.g. qwen3-embedding's end-of-text token). A model trained on fewer positions is capped by
Ollama at those, and an over-long input is then refused by the server (an ``EmbeddingError``).

Host: ``RAG_EMBEDDING_API_URL`` (default ``http://127.0.0.1:11434``). A key, when set, goes as
``Authorization: Bearer`` (Ollama behind a proxy, ollama.com). Dimension: ``RAG_EMBEDDING_DIMENSIONS`` when set,
else probed once (``RemoteEmbedder``). A requested dimension below the native one (qwen3-embedding: 4096 ->
1024) is cut client-side and re-normalised; Ollama's own ``dimensions`` field is not sent, because servers
before it existed ignore it and answer the native width (it computes the same truncation). ``Retry-After`` is
read from the response headers (the client's ``ResponseError`` does not carry them).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from rag_pipeline.embedding.remote import ProviderFailure, RemoteEmbedder, status_failure
from rag_pipeline.redact import url_host

DEFAULT_OLLAMA_URL = "http://127.0.0.1:11434"
CONTEXT_MARGIN = 8


class OllamaEmbedder(RemoteEmbedder):
    """``host_url``: the Ollama server. Other arguments: ``RemoteEmbedder``."""

    provider = "ollama"
    server_side_dimensions = False

    def __init__(self, model: str, *, host_url: str = DEFAULT_OLLAMA_URL, api_key: str = "", **kwargs: Any) -> None:
        import httpx
        import ollama

        super().__init__(model, api_key=api_key, host=url_host(host_url), **kwargs)
        self._headers = threading.local()
        headers = {"authorization": f"Bearer {api_key}"} if api_key else None
        self._client = ollama.Client(host=host_url, timeout=httpx.Timeout(self.timeout_s), headers=headers,
                                     event_hooks={"response": [self._remember_headers]})

    def _remember_headers(self, response: Any) -> None:
        self._headers.value = {k: v for k, v in response.headers.items()
                               if k.lower() in ("retry-after", "retry-after-ms")}

    def _post(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
        import httpx
        import ollama

        self._headers.value = {}
        failure: ProviderFailure | None = None
        response = None
        try:
            response = self._client.embed(model=self.model, input=list(texts), truncate=False,
                                          options={"num_ctx": self.max_tokens + CONTEXT_MARGIN})
        except ollama.ResponseError as exc:
            message = " ".join(str(exc.error).split())[:300]
            failure = status_failure(exc.status_code, self._scrub(message), getattr(self._headers, "value", {}))
        except httpx.TimeoutException:
            failure = ProviderFailure(f"no answer within {self.timeout_s:g} s (RAG_EMBEDDING_TIMEOUT_S)",
                                      retryable=True)
        except (ConnectionError, httpx.TransportError) as exc:
            failure = ProviderFailure(f"cannot reach the server ({type(exc).__name__})", retryable=True)
        if failure is not None:  # raised outside the except blocks: the client's exception is not chained
            raise failure
        return list(response.embeddings or [])


__all__ = ["CONTEXT_MARGIN", "DEFAULT_OLLAMA_URL", "OllamaEmbedder"]
