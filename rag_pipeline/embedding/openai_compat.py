"""OpenAI-compatible ``/v1/embeddings`` through the official ``openai`` client: OpenAI, Azure OpenAI, TEI, vLLM, LiteLLM.

* ``openai``: ``openai.OpenAI(base_url=RAG_EMBEDDING_API_URL or https://api.openai.com/v1)``; an OpenAI-compatible
  server (vLLM, LiteLLM) is the same provider with its URL. ``RAG_EMBEDDING_DIMENSIONS`` is sent as the API's
  ``dimensions`` parameter (OpenAI text-embedding-3 and later, vLLM for Matryoshka models, LiteLLM passes it
  on); a server that ignores it and answers another width gets "wrong dimension".
* ``azure-openai``: ``openai.AzureOpenAI(azure_endpoint=RAG_EMBEDDING_API_URL, azure_deployment=RAG_EMBEDDING_MODEL,
  api_version=RAG_EMBEDDING_API_VERSION)``: ``POST {endpoint}/openai/deployments/{deployment}/embeddings
  ?api-version=...`` with the ``api-key`` header; ``dimensions`` as for OpenAI.
* ``tei``: Hugging Face Text Embeddings Inference's OpenAI-compatible route ``POST {url}/v1/embeddings`` (the
  model name is only recorded: TEI serves one model). TEI has no ``dimensions`` parameter: a requested
  dimension is cut client-side and re-normalised (``RemoteEmbedder.client_side_truncation``).

A URL without a path (``http://tei:8080``) gets ``/v1`` appended (not for Azure). The client's own retries are
off (``max_retries=0``): ``RemoteEmbedder`` is the one retry policy. Requests ask for ``encoding_format="float"``.
Without a key (a local TEI/vLLM) the client is given the placeholder ``"unused"``.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from typing import Any

from rag_pipeline.embedding.remote import (
    NATIVE_DIMENSIONS,
    ProviderFailure,
    RemoteEmbedder,
    error_message,
    status_failure,
)
from rag_pipeline.redact import url_host

DEFAULT_OPENAI_URL = "https://api.openai.com/v1"
_NO_KEY = "unused"


def _with_v1(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.path in ("", "/"):
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/v1", parts.query, parts.fragment))
    return url.rstrip("/")


class OpenAICompatEmbedder(RemoteEmbedder):
    """``provider``: ``openai`` | ``azure-openai`` | ``tei``; ``base_url``: see module docstring;
    ``api_version``: Azure's. Other arguments: ``RemoteEmbedder``."""

    def __init__(self, provider: str, model: str, *, base_url: str, api_key: str = "", api_version: str = "",
                 **kwargs: Any) -> None:
        import openai

        if provider not in ("openai", "azure-openai", "tei"):
            raise ValueError(f"OpenAICompatEmbedder does not speak {provider!r}")
        self.provider = provider
        self.server_side_dimensions = provider in ("openai", "azure-openai")
        native = NATIVE_DIMENSIONS.get(model) if provider == "openai" else None
        super().__init__(model, native_dimension=native, api_key=api_key, host=url_host(base_url), **kwargs)
        if provider == "azure-openai":
            self._client = openai.AzureOpenAI(azure_endpoint=base_url.rstrip("/"), azure_deployment=model,
                                              api_version=api_version, api_key=api_key, timeout=self.timeout_s,
                                              max_retries=0)
        else:
            self._client = openai.OpenAI(base_url=_with_v1(base_url), api_key=api_key or _NO_KEY,
                                         timeout=self.timeout_s, max_retries=0)

    def _post(self, texts: Sequence[str]) -> list[Sequence[float]]:
        import openai

        extra: dict[str, Any] = {}
        if self.requested and self.server_side_dimensions:
            extra["dimensions"] = self.requested
        failure: ProviderFailure | None = None
        response = None
        try:
            response = self._client.embeddings.create(model=self.model, input=list(texts), encoding_format="float",
                                                      **extra)
        except openai.APIStatusError as exc:
            failure = status_failure(exc.status_code, self._scrub(error_message(exc.body, exc.response.text)),
                                     exc.response.headers)
        except openai.APITimeoutError:
            failure = ProviderFailure(f"no answer within {self.timeout_s:g} s (RAG_EMBEDDING_TIMEOUT_S)",
                                      retryable=True)
        except openai.APIConnectionError as exc:
            cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else "connection error"
            failure = ProviderFailure(f"cannot reach the server ({cause})", retryable=True)
        if failure is not None:  # raised outside the except blocks: the client's exception is not chained
            raise failure
        data = list(getattr(response, "data", None) or [])
        indices = [getattr(d, "index", None) for d in data]
        if sorted(i for i in indices if isinstance(i, int)) != list(range(len(data))):
            raise ProviderFailure(f"malformed answer: indices {indices[:10]} for {len(texts)} inputs", retryable=False)
        return [d.embedding for d in sorted(data, key=lambda d: d.index)]


__all__ = ["DEFAULT_OPENAI_URL", "OpenAICompatEmbedder"]
