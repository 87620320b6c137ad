"""The shared base of the HTTP embedding providers (``openai_compat``, ``ollama``): one route for all of them.

``RemoteEmbedder.embed(texts)`` does, in this order:

1. **Refuse what the model cannot take.** Identical texts are embedded once; every text is counted with
   ``count_tokens`` and one over ``max_tokens`` (or an empty one) raises ``EmbeddingError`` naming its token
   count, the limit and how it was counted, before any request is sent. Nothing is ever truncated: the
   chunker keeps chunks within ``max_tokens`` (it is given this embedder), Ollama is sent ``truncate: false``,
   and the OpenAI API (and TEI, unless started with ``--auto-truncate``) answers an over-long input with an
   error.
2. **Batch within the provider's limits.** Texts go, in input order, into requests of at most
   ``limits.request_inputs`` texts and ``limits.request_tokens`` tokens summed (greedy: a request is closed when
   the next text would pass either limit).
3. **Retry what is worth retrying.** A 408/409/429/5xx answer, a timeout (``timeout_s`` per request) or a
   connection error is retried (tenacity) up to ``max_retries`` times. The wait is the server's
   ``retry-after-ms`` (OpenAI) or ``Retry-After`` (seconds or an HTTP date), honoured as given, else an
   exponential backoff with jitter (``backoff_s``, doubling, at most ``backoff_max_s``). The waits of one request
   add up to at most ``retry_budget_s``: a wait that would pass it (a ``Retry-After`` of ten minutes) ends the
   request at once. Other answers (400, 401, 403, 404, 413, 422) are not retried. Worst case for one request:
   ``(max_retries + 1) * timeout_s + retry_budget_s`` seconds.
4. **Validate the answer.** Exactly one vector per input, in input order (OpenAI's ``index`` fields are
   checked), each of the expected width (a wrong one is "wrong dimension: expected N, got M"), all values
   finite (NaN/inf refused), none all-zero; then truncated to ``RAG_EMBEDDING_DIMENSIONS`` where the provider
   has no ``dimensions`` parameter (``client_side_truncation``), and L2-normalised as float32.

Every failure is an ``EmbeddingError`` whose message starts with ``"<provider> embedding model '<model>'"``
and never contains the API key: messages are built from status codes and the server's error text with the
key cut out (``_scrub``) and ``rag_pipeline.redact`` applied; exceptions of the client libraries are not
chained (their text may echo request data). The pipeline treats an ``EmbeddingError`` as a transient failure
of the documents of the batch: nothing is written for them and the next sync tries again.

**Token counts.** With a local tokenizer (``RAG_EMBEDDING_TOKENIZER``: a ``tokenizer.json`` or the directory
holding it) counts are exact (content tokens, no special tokens). Without one, ``count_tokens`` is the upper
bound ``len(text.encode("utf-8")) + 1``: byte-level BPE (OpenAI's cl100k/o200k, Qwen3, GPT-2 style) splits the
UTF-8 bytes of the text into tokens of at least one byte each, with no normalisation, so it never has more
tokens than bytes; WordPiece (BERT) splits the normalised text into pieces of at least one character, and its
normalisation (lower-casing, accent stripping) does not grow the byte count except for rare case mappings of
a few letters; SentencePiece with a dummy prefix adds one ``▁`` token at the start (hence the ``+ 1``). The
bound does NOT hold for tokenizers that apply NFKC (T5, XLM-R / multilingual-e5): a compatibility character
such as U+FDFA (3 bytes) expands to a whole phrase. For those, configure their ``tokenizer.json``. The bound
is what the tests check (``test_embedding_remote.py``).

**Dimensions.** ``dimension`` is ``RAG_EMBEDDING_DIMENSIONS`` when set, else the model's native width: known
for OpenAI's models (``NATIVE_DIMENSIONS``), otherwise discovered by embedding ``PROBE_TEXT`` once, on first
use of ``dimension`` or ``model_id``. With client-side truncation the first answer fixes the native width
(it must be at least the requested one) and every later answer must have that width.

``model_id`` = ``"<provider>:<model>@<dimension>"`` (e.g. ``"openai:text-embedding-3-small@256"``), so chunks
embedded by different providers, models or output dimensions are never mixed or served from the cache.
"""

from __future__ import annotations

import email.utils
import logging
import random
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tenacity

from rag_pipeline.embedding.base import EmbeddingError
from rag_pipeline.faults import checkpoint
from rag_pipeline.redact import MASK, redact

log = logging.getLogger(__name__)

REMOTE_PROVIDERS = ("openai", "azure-openai", "ollama", "tei")
#: Content-token limit for a model this module knows nothing about: the 512 positions of the BERT family
#: (the most common open embedding models) minus [CLS] and [SEP].
GENERIC_MAX_TOKENS = 510
#: Native output widths of OpenAI's embedding models (others are probed).
NATIVE_DIMENSIONS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072, "text-embedding-ada-002": 1536}
#: The text embedded once to discover a model's native dimension.
PROBE_TEXT = "dimension probe"
#: HTTP statuses worth another try.
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504}) | frozenset(range(520, 530))


@dataclass(frozen=True)
class Limits:
    """``max_tokens``: content tokens one text may have; ``request_inputs``: texts per request;
    ``request_tokens``: tokens summed over one request."""

    max_tokens: int
    request_inputs: int
    request_tokens: int


def default_limits(provider: str, model: str) -> Limits:
    """The documented per-provider defaults (README, ``RAG_EMBEDDING_MAX_TOKENS``/``_REQUEST_*``):

    * ``openai``: text-embedding-3-* and ada-002 take 8191 tokens (cl100k, no special tokens); other models
      (an OpenAI-compatible vLLM/LiteLLM) ``GENERIC_MAX_TOKENS``; 2048 inputs and 300,000 tokens per request
      (OpenAI's documented request limits).
    * ``azure-openai``: 8191 (every Azure OpenAI embedding model: ada-002, text-embedding-3-*; the model
      name is a deployment name, so it is not consulted); 2048 inputs, 300,000 tokens.
    * ``tei``: ``GENERIC_MAX_TOKENS`` (TEI's limit is the served model's ``max_input_length``: set it);
      32 inputs (TEI's ``--max-client-batch-size`` default), 16,384 tokens (its ``--max-batch-tokens``).
    * ``ollama``: qwen3-embedding* 8192 (the model takes 32K positions; the request sets ``num_ctx`` to
      this limit plus a margin so Ollama's smaller default context does not apply), other models
      ``GENERIC_MAX_TOKENS``; 32 inputs, 65,536 tokens.
    """
    m = model.lower()
    if provider == "openai":
        known = m.startswith("text-embedding-3") or m.startswith("text-embedding-ada-002")
        return Limits(8191 if known else GENERIC_MAX_TOKENS, 2048, 300_000)
    if provider == "azure-openai":
        return Limits(8191, 2048, 300_000)
    if provider == "tei":
        return Limits(GENERIC_MAX_TOKENS, 32, 16_384)
    if provider == "ollama":
        return Limits(8192 if "qwen3-embedding" in m else GENERIC_MAX_TOKENS, 32, 65_536)
    raise ValueError(f"unknown embedding provider {provider!r}")


def utf8_token_bound(text: str) -> int:
    """An upper bound on the tokens of ``text`` for byte-level BPE, WordPiece and SentencePiece tokenizers
    without NFKC: its UTF-8 byte count plus one (see the module docstring for why, and where it fails)."""
    return len(text.encode("utf-8", "surrogatepass")) + 1


def parse_retry_after(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` (milliseconds, OpenAI) or ``Retry-After`` (delta-seconds, a
    decimal accepted, or an HTTP date); ``None`` when neither is there or parseable. Never negative."""
    if not headers:
        return None
    lower = {str(k).lower(): str(v) for k, v in headers.items()}
    ms = lower.get("retry-after-ms")
    if ms:
        try:
            return max(float(ms) / 1000.0, 0.0)
        except ValueError:
            pass
    value = lower.get("retry-after", "").strip()
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


class ProviderFailure(Exception):
    """One failed request, as a provider subclass reports it: ``reason`` (already free of secrets),
    ``retryable``, ``retry_after`` (seconds the server asked for, or None), ``status`` (HTTP, or None)."""

    def __init__(self, reason: str, *, retryable: bool, retry_after: float | None = None,
                 status: int | None = None) -> None:
        super().__init__(reason)
        self.reason, self.retryable, self.retry_after, self.status = reason, retryable, retry_after, status


def status_failure(status: int, message: str, headers: Mapping[str, str] | None) -> ProviderFailure:
    """A ``ProviderFailure`` for an HTTP error answer: retryable per ``RETRYABLE_STATUS``, with the server's
    ``Retry-After``. ``message`` must already be scrubbed."""
    kind = {429: "rate limited", 401: "not authorised (check RAG_EMBEDDING_API_KEY)", 403: "forbidden",
            404: "not found (check RAG_EMBEDDING_MODEL / RAG_EMBEDDING_API_URL)",
            413: "request too large"}.get(status)
    text = f"HTTP {status}" + (f" {kind}" if kind else "") + (f": {message}" if message else "")
    return ProviderFailure(text, retryable=status in RETRYABLE_STATUS, retry_after=parse_retry_after(headers),
                           status=status)


def load_tokenizer(path: str):
    """The ``tokenizers.Tokenizer`` of ``path`` (a ``tokenizer.json`` or a directory holding one), truncation
    and padding off. Raises ``ValueError`` naming ``RAG_EMBEDDING_TOKENIZER`` when there is none."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise ValueError(f"RAG_EMBEDDING_TOKENIZER={path!r}: no tokenizer.json there (a local file; nothing is "
                         "downloaded)")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(p))
    tok.no_truncation()
    tok.no_padding()
    return tok


def plan_requests(counts: Sequence[int], limits: Limits) -> list[range]:
    """Split texts with token ``counts`` (each ``<= limits.max_tokens``) into consecutive index ranges of at
    most ``request_inputs`` texts and ``request_tokens`` tokens (greedy, order kept)."""
    out: list[range] = []
    start, tokens = 0, 0
    for i, n in enumerate(counts):
        if i > start and (i - start >= limits.request_inputs or tokens + n > limits.request_tokens):
            out.append(range(start, i))
            start, tokens = i, 0
        tokens += n
    if counts:
        out.append(range(start, len(counts)))
    return out


class RemoteEmbedder:
    """Base of the HTTP embedders (see module docstring). A subclass sets ``provider`` and
    ``server_side_dimensions`` and implements ``_post(texts) -> Sequence[Sequence[float]]`` (the vectors in
    input order), raising ``ProviderFailure`` for a failed request.

    ``model``: the provider's model (Azure: the deployment). ``dimensions``: requested output width, 0 =
    native. ``native_dimension``: when known without asking. ``limits``: ``Limits``. ``timeout_s``: per request.
    ``max_retries``/``retry_budget_s``/``backoff_s``/``backoff_max_s``: the retry policy. ``tokenizer``: path
    of a local ``tokenizer.json`` (exact counts) or None (the UTF-8 bound). ``api_key``: only used to cut it
    out of error text (subclasses hand it to their client). ``host``: for messages (host and port only).

    ``settings_spec``: the ``RAG_EMBEDDING_*`` settings (``Settings`` field names, never the key) that rebuild
    this embedder, set by ``build_remote_embedder`` (``store.generations`` records it with a generation).

    Counters: ``calls`` successful requests, ``embedded`` distinct texts embedded, ``attempts`` requests sent
    (retries included), ``waits`` the retry waits slept (seconds, most recent last)."""

    provider = "remote"
    server_side_dimensions = False

    def __init__(self, model: str, *, dimensions: int = 0, native_dimension: int | None = None,
                 limits: Limits, timeout_s: float = 60.0, max_retries: int = 6, retry_budget_s: float = 120.0,
                 backoff_s: float = 0.5, backoff_max_s: float = 30.0, tokenizer: str | None = None,
                 api_key: str = "", host: str = "") -> None:
        if not model:
            raise ValueError("RAG_EMBEDDING_MODEL is empty")
        if dimensions < 0:
            raise ValueError(f"RAG_EMBEDDING_DIMENSIONS={dimensions} must be 0 (native) or positive")
        if limits.max_tokens < 1 or limits.request_inputs < 1 or limits.request_tokens < limits.max_tokens:
            raise ValueError(f"embedding limits {limits} are inconsistent: RAG_EMBEDDING_MAX_TOKENS must be "
                             "positive and at most RAG_EMBEDDING_REQUEST_TOKENS, RAG_EMBEDDING_REQUEST_INPUTS >= 1")
        if native_dimension is not None and dimensions > native_dimension:
            raise ValueError(f"RAG_EMBEDDING_DIMENSIONS={dimensions} is larger than the {native_dimension} "
                             f"dimensions of {model!r}")
        self.model = model
        self.requested = int(dimensions)
        self._native = native_dimension
        self.limits = limits
        self.max_tokens = limits.max_tokens
        self.timeout_s = float(timeout_s)
        self.max_retries = max(int(max_retries), 0)
        self.retry_budget_s = max(float(retry_budget_s), 0.0)
        self.backoff_s, self.backoff_max_s = float(backoff_s), float(backoff_max_s)
        self.tokenizer_path = tokenizer or None
        self.tokenizer = load_tokenizer(tokenizer) if tokenizer else None
        self.token_counter = "tokenizer" if self.tokenizer is not None else "UTF-8 bytes + 1 (upper bound)"
        self._secret = api_key or ""
        self.host = host
        self.calls = 0
        self.embedded = 0
        self.attempts = 0
        self.waits: deque[float] = deque(maxlen=1000)
        self._lock = threading.Lock()
        self.settings_spec: dict[str, Any] = {}

    # --- identity -------------------------------------------------------------------------------------------

    @property
    def client_side_truncation(self) -> bool:
        """Whether a requested dimension is cut here (the provider has no ``dimensions`` parameter)."""
        return bool(self.requested) and not self.server_side_dimensions

    @property
    def native_dimension(self) -> int:
        """The model's own output width (probed once when not known)."""
        if self._native is None:
            self._probe()
        assert self._native is not None
        return self._native

    @property
    def dimension(self) -> int:
        """Width of the returned vectors: ``RAG_EMBEDDING_DIMENSIONS``, else the native one."""
        return self.requested or self.native_dimension

    @property
    def model_id(self) -> str:
        """``"<provider>:<model>@<dimension>"``."""
        return f"{self.provider}:{self.model}@{self.dimension}"

    @property
    def label(self) -> str:
        return f"{self.provider} embedding model {self.model!r}"

    def _probe(self) -> None:
        self._request([PROBE_TEXT])  # _check_width records the native width
        log.info("%s: native dimension %s (probed)", self.label, self._native)

    # --- tokens ---------------------------------------------------------------------------------------------

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Content tokens per text: exact with the configured tokenizer, else ``utf8_token_bound``."""
        if not texts:
            return []
        if self.tokenizer is not None:
            return [len(e.ids) for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]
        return [utf8_token_bound(t) for t in texts]

    # --- embed ----------------------------------------------------------------------------------------------

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``: float32 ``(len(texts), dimension)``, L2-normalised, rows in input order. Raises
        ``EmbeddingError`` (provider and model named, no key) for a text over ``max_tokens`` or empty (before
        any request), a request that failed after the retries, or an answer that fails validation."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        unique = list(dict.fromkeys(texts))
        for i, t in enumerate(unique):
            if not isinstance(t, str) or not t:
                raise self._error(f"text {i} is empty or not a string ({type(t).__name__}); refused")
        counts = self.count_tokens(unique)
        over = [(i, n) for i, n in enumerate(counts) if n > self.max_tokens]
        if over:
            i, n = over[0]
            raise self._error(f"text {i} has {n} tokens (counted by {self.token_counter}), over the limit of "
                              f"{self.max_tokens} (RAG_EMBEDDING_MAX_TOKENS); refused, not truncated"
                              + (f"; {len(over)} texts are over it" if len(over) > 1 else ""))
        checkpoint("embed.before")
        parts = [self._request([unique[i] for i in r]) for r in plan_requests(counts, self.limits)]
        vectors = np.concatenate(parts, axis=0)
        with self._lock:
            self.embedded += len(unique)
        index = {t: j for j, t in enumerate(unique)}
        return vectors[[index[t] for t in texts]]

    def _request(self, texts: list[str]) -> np.ndarray:
        """One request (with retries) for ``texts``, validated: float32 ``(len(texts), dimension)``."""
        state: dict[str, Any] = {"why": None}

        def attempt() -> Sequence[Sequence[float]]:
            with self._lock:
                self.attempts += 1
            return self._post(texts)

        def stop(rs: tenacity.RetryCallState) -> bool:
            if rs.attempt_number > self.max_retries:
                state["why"] = f"gave up after {rs.attempt_number} attempts"
                return True
            if rs.idle_for + rs.upcoming_sleep > self.retry_budget_s:
                state["why"] = (f"a further wait of {rs.upcoming_sleep:.1f} s would pass the retry budget of "
                                f"{self.retry_budget_s:g} s (RAG_EMBEDDING_RETRY_BUDGET_S) after "
                                f"{rs.attempt_number} attempt{'s' if rs.attempt_number > 1 else ''}")
                return True
            return False

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, ProviderFailure) and e.retryable),
            wait=self._wait, stop=stop, sleep=self._sleep, reraise=True, before_sleep=self._log_retry)
        failure: ProviderFailure | None = None
        raw: Any = None
        try:
            raw = retrying(attempt)
        except ProviderFailure as exc:
            failure = exc
        except EmbeddingError:
            raise
        except Exception as exc:  # noqa: BLE001  (a client library's own error type: say what, not its text)
            failure = ProviderFailure(f"{type(exc).__name__}: {self._scrub(str(exc))[:300]}", retryable=False)
        if failure is not None:  # raised outside the except blocks: no chained client exception
            suffix = f" ({state['why']})" if failure.retryable and state["why"] else ""
            raise self._error(f"{failure.reason}{suffix}")
        vectors = self._validate(raw, len(texts))
        with self._lock:
            self.calls += 1
        return vectors

    def _wait(self, rs: tenacity.RetryCallState) -> float:
        exc = rs.outcome.exception() if rs.outcome is not None else None
        if isinstance(exc, ProviderFailure) and exc.retry_after is not None:
            return exc.retry_after
        base = min(self.backoff_s * 2 ** (rs.attempt_number - 1), self.backoff_max_s)
        return base / 2 + random.uniform(0, base / 2)

    def _sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        time.sleep(seconds)

    def _log_retry(self, rs: tenacity.RetryCallState) -> None:
        exc = rs.outcome.exception() if rs.outcome is not None else None
        reason = exc.reason if isinstance(exc, ProviderFailure) else type(exc).__name__
        log.warning("%s: %s; retry %d of %d in %.1f s", self.label, reason, rs.attempt_number, self.max_retries,
                    rs.upcoming_sleep)

    # --- validation -----------------------------------------------------------------------------------------

    def _validate(self, raw: Any, n: int) -> np.ndarray:
        try:
            rows = list(raw)
        except TypeError:
            raise self._error(f"malformed answer: no list of vectors ({type(raw).__name__})") from None
        if len(rows) != n:
            raise self._error(f"short batch: {len(rows)} vectors for {n} inputs")
        widths = set()
        for row in rows:
            try:
                widths.add(len(row))
            except TypeError:
                raise self._error(f"malformed answer: a vector is a {type(row).__name__}") from None
        self._check_width(sorted(widths))
        try:
            matrix = np.asarray(rows, dtype=np.float64)
        except (TypeError, ValueError):
            raise self._error("malformed answer: vectors hold values that are not numbers") from None
        bad = np.flatnonzero(~np.isfinite(matrix).all(axis=1))
        if len(bad):
            raise self._error(f"non-finite values (NaN/inf) in {len(bad)} of {n} vectors (first: input {bad[0]})")
        if self.client_side_truncation:
            matrix = matrix[:, :self.requested]
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        if (norms == 0).any():
            raise self._error(f"all-zero vector for {int((norms == 0).sum())} of {n} inputs")
        return (matrix / norms).astype(np.float32)

    def _check_width(self, widths: list[int]) -> int:
        if self.requested and self.server_side_dimensions:
            expected = self.requested
        else:
            with self._lock:
                if self._native is None and len(widths) == 1 and widths[0] >= max(self.requested, 1):
                    self._native = widths[0]
                expected = self._native
        if expected is None:  # first answer, unusable: ragged, or narrower than the requested dimension
            raise self._error(f"wrong dimension: expected at least {self.requested}, got "
                              f"{'/'.join(map(str, widths))}")
        if widths != [expected]:
            got = "/".join(str(w) for w in widths if w != expected)
            raise self._error(f"wrong dimension: expected {expected}, got {got}")
        if self.requested > expected:
            raise self._error(f"RAG_EMBEDDING_DIMENSIONS={self.requested} is larger than the model's native "
                              f"{expected}")
        return expected

    # --- errors ---------------------------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        """``text`` without the API key (cut out literally, then ``redact``)."""
        if self._secret:
            text = text.replace(self._secret, MASK)
            quoted = urllib.parse.quote(self._secret, safe="")
            if quoted != self._secret:
                text = text.replace(quoted, MASK)
        return redact(text)

    def _error(self, what: str) -> EmbeddingError:
        where = f" at {self.host}" if self.host else ""
        return EmbeddingError(self._scrub(f"{self.label}{where}: {what}"))

    def __repr__(self) -> str:
        dim = getattr(self, "requested", 0) or getattr(self, "_native", None) or "?"
        return f"{type(self).__name__}({self.provider}:{getattr(self, 'model', '?')}@{dim})"


def error_message(body: Any, text: str) -> str:
    """The server's error text from a parsed body (OpenAI ``{"error": {"message"}}``, TEI/Ollama
    ``{"error": "..."}``) or the raw ``text``, on one line, at most 300 characters."""
    message = None
    if isinstance(body, str) and body.strip():  # the openai client hands over the "error" value itself
        message = body
    elif isinstance(body, Mapping):
        err = body.get("error", body)
        if isinstance(err, Mapping):
            message = err.get("message") or err.get("error")
        elif isinstance(err, str):
            message = err
        elif "message" in body:
            message = body.get("message")
    if message is None:
        message = text or ""
    return " ".join(str(message).split())[:300]


def build_remote_embedder(settings: Any) -> RemoteEmbedder:
    """The remote embedder ``settings`` describe (``RAG_EMBEDDING_PROVIDER`` one of ``REMOTE_PROVIDERS``).
    Registers the API key (and any secret in the URL) with ``rag_pipeline.redact``. Raises ``ValueError``
    naming the variable for a missing URL or key, a bad value or an inconsistent limit."""
    from rag_pipeline import redact as _redact
    from rag_pipeline.embedding.sentence_transformers import BUNDLED_MODEL

    provider = settings.embedding_provider.strip().lower()
    if provider not in REMOTE_PROVIDERS:
        raise ValueError(f"RAG_EMBEDDING_PROVIDER={settings.embedding_provider!r} is not one of "
                         f"sentence-transformers, {', '.join(REMOTE_PROVIDERS)}")
    model = settings.embedding_model.strip()
    if provider != "tei" and "embedding_model" not in settings.model_fields_set:
        # the default names the bundled model: a remote provider needs its own model named (TEI serves one
        # model whatever the name, so the default is only a label there)
        raise ValueError(f"RAG_EMBEDDING_MODEL is not set: with RAG_EMBEDDING_PROVIDER={provider} it names the "
                         + ("deployment" if provider == "azure-openai" else "model") + " (e.g. "
                         + {"openai": "text-embedding-3-small", "azure-openai": "my-embedding-deployment",
                            "ollama": "qwen3-embedding"}[provider] + f"), not the bundled {BUNDLED_MODEL!r}")
    key_value = settings.embedding_api_key
    key = (key_value.get_secret_value() if hasattr(key_value, "get_secret_value") else str(key_value or "")).strip()
    url = settings.embedding_api_url.strip()
    _redact.register_secret(key)
    if url:
        try:
            parts = urllib.parse.urlsplit(url)
            _redact.register_secret(parts.password)
            for name, value in urllib.parse.parse_qsl(parts.query):
                if _redact._secret_param(name):
                    _redact.register_secret(value)
        except ValueError:
            raise ValueError("RAG_EMBEDDING_API_URL is not a valid URL") from None

    defaults = default_limits(provider, model)
    max_tokens = settings.embedding_max_tokens or defaults.max_tokens
    request_tokens = settings.embedding_request_tokens or max(defaults.request_tokens, max_tokens)
    limits = Limits(max_tokens, settings.embedding_request_inputs or defaults.request_inputs, request_tokens)
    common = dict(dimensions=settings.embedding_dimensions, limits=limits, timeout_s=settings.embedding_timeout_s,
                  max_retries=settings.embedding_max_retries, retry_budget_s=settings.embedding_retry_budget_s,
                  tokenizer=settings.embedding_tokenizer.strip() or None, api_key=key)

    spec = {name: getattr(settings, name) for name in SPEC_SETTINGS}
    if url and _url_has_secret(url):
        del spec["embedding_api_url"]  # recorded without it: a rebuild takes the URL from the environment
    embedder = _build(provider, model, url, key, settings, common)
    embedder.settings_spec = spec
    return embedder


#: The settings that rebuild a remote embedder (``RemoteEmbedder.settings_spec``; the key is never among them).
SPEC_SETTINGS = ("embedding_provider", "embedding_model", "embedding_api_url", "embedding_api_version",
                 "embedding_dimensions", "embedding_max_tokens", "embedding_tokenizer", "embedding_request_inputs",
                 "embedding_request_tokens", "embedding_timeout_s", "embedding_max_retries", "embedding_retry_budget_s")


def _url_has_secret(url: str) -> bool:
    from rag_pipeline import redact as _redact

    try:
        parts = urllib.parse.urlsplit(url)
        return bool(parts.password) or any(_redact._secret_param(n) for n, _ in urllib.parse.parse_qsl(parts.query))
    except ValueError:
        return True


def _build(provider: str, model: str, url: str, key: str, settings: Any, common: dict[str, Any]) -> RemoteEmbedder:
    if provider == "ollama":
        from rag_pipeline.embedding.ollama import DEFAULT_OLLAMA_URL, OllamaEmbedder

        return OllamaEmbedder(model, host_url=url or DEFAULT_OLLAMA_URL, **common)

    from rag_pipeline.embedding.openai_compat import DEFAULT_OPENAI_URL, OpenAICompatEmbedder

    if provider == "azure-openai":
        if not url:
            raise ValueError("RAG_EMBEDDING_API_URL is required for RAG_EMBEDDING_PROVIDER=azure-openai (the "
                             "resource endpoint, e.g. https://NAME.openai.azure.com)")
        if not key:
            raise ValueError("RAG_EMBEDDING_API_KEY is required for RAG_EMBEDDING_PROVIDER=azure-openai")
        if not settings.embedding_api_version.strip():
            raise ValueError("RAG_EMBEDDING_API_VERSION is required for RAG_EMBEDDING_PROVIDER=azure-openai")
    elif provider == "tei" and not url:
        raise ValueError("RAG_EMBEDDING_API_URL is required for RAG_EMBEDDING_PROVIDER=tei (e.g. http://tei:8080)")
    elif provider == "openai":
        url = url or DEFAULT_OPENAI_URL
        if not key and urllib.parse.urlsplit(url).hostname == urllib.parse.urlsplit(DEFAULT_OPENAI_URL).hostname:
            raise ValueError("RAG_EMBEDDING_API_KEY is required for RAG_EMBEDDING_PROVIDER=openai at "
                             f"{DEFAULT_OPENAI_URL}")
    return OpenAICompatEmbedder(provider, model, base_url=url, api_version=settings.embedding_api_version.strip(),
                                **common)


__all__ = ["GENERIC_MAX_TOKENS", "NATIVE_DIMENSIONS", "PROBE_TEXT", "REMOTE_PROVIDERS", "SPEC_SETTINGS", "Limits",
           "ProviderFailure",
           "RemoteEmbedder", "build_remote_embedder", "default_limits", "error_message", "load_tokenizer",
           "parse_retry_after", "plan_requests", "status_failure", "utf8_token_bound"]
