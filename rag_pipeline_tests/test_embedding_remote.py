"""The HTTP embedders (OpenAI, Azure OpenAI, TEI, Ollama) through the real client libraries against local fake
servers (``fakes/embedding_servers.py``) that compute real vectors with the bundled model.

Each backend returns the bundled model's vectors; batching stays within the limits (counted at the server);
every injected fault (429 storms with Retry-After, 500s, slow answers, a wrong dimension, NaN, a short batch,
an over-long input, a refused connection) ends as documented: retried then answered, or an ``EmbeddingError``
naming provider and model; the API key is in no exception text and no log record; a sync with a fault in the
middle leaves the affected documents failed with the reason, nothing half-written, and completes them on the
next sync; retrieval through a backend finds the right document.
"""

from __future__ import annotations

import logging
import shutil
import socket
import traceback
import uuid

import numpy as np
import pytest

from rag_pipeline import redact as r
from rag_pipeline.config import Settings
from rag_pipeline.embedding import EmbeddingError, SentenceTransformerEmbedder, get_embedder
from rag_pipeline.embedding.remote import (
    GENERIC_MAX_TOKENS,
    PROBE_TEXT,
    Limits,
    parse_retry_after,
    plan_requests,
    utf8_token_bound,
)
from rag_pipeline_tests.fakes.embedding_servers import FakeEmbeddingServer

PROVIDER = {"openai": "openai", "azure": "azure-openai", "tei": "tei", "ollama": "ollama"}
MODEL = {"openai": "minilm-compat", "azure": "minilm-deployment", "tei": "all-MiniLM-L6-v2", "ollama": "all-minilm"}
APIS = list(PROVIDER)
#: "The same vector": cosine above this (a server embeds its batch, the reference another batch: padding and
#: batch composition move float32 results by ~1e-5)
SAME = 0.9999
TEXTS = ["the lighthouse keeper logged the storm", "tides follow the moon", "the lighthouse keeper logged the storm",
         "東京は日本の首都で、人口が最も多い都市です。", "Die schöne Frau hat einen Kaffee getrunken."]


@pytest.fixture
def servers(embedder):
    """Factory: ``servers(api, **kw)`` starts a ``FakeEmbeddingServer`` for ``api`` (stopped afterwards)."""
    started: list[FakeEmbeddingServer] = []

    def start(api: str, **kw) -> FakeEmbeddingServer:
        kw.setdefault("model_name", MODEL[api] if api in ("azure", "ollama") else None)
        server = FakeEmbeddingServer(embedder, api=api, **kw).start()
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def clean_env(monkeypatch):
    for var in list(__import__("os").environ):
        if var.startswith("RAG_"):
            monkeypatch.delenv(var)


def settings_for(api: str, url: str, embedder, **overrides) -> Settings:
    """Settings for ``api`` at ``url``: the bundled tokenizer and its 254-token limit (so a remote model
    serving all-MiniLM chunks exactly as the bundled one), fast retries."""
    values = dict(embedding_provider=PROVIDER[api], embedding_api_url=url, embedding_model=MODEL[api],
                  embedding_tokenizer=str(embedder.path / "tokenizer.json"), embedding_max_tokens=254,
                  embedding_api_key="sk-test-key-0001" if api == "azure" else "", embedding_timeout_s=10.0,
                  embedding_max_retries=3, embedding_retry_budget_s=10.0)
    values.update(overrides)
    return Settings(**values)


def build(api: str, server: FakeEmbeddingServer, embedder, **overrides):
    emb = get_embedder(settings_for(api, server.url, embedder, **overrides))
    emb.backoff_s, emb.backoff_max_s = 0.01, 0.05  # the exponential backoff, kept short for tests
    return emb


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.sum(a64 * b64, axis=1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))


# --- same vectors as the bundled model ----------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_each_backend_returns_the_bundled_models_vectors(api, servers, embedder):
    server = servers(api)
    emb = build(api, server, embedder)
    vectors = emb.embed(TEXTS)
    expected = embedder.embed(TEXTS)
    assert vectors.shape == (len(TEXTS), 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert cosines(vectors, expected).min() > SAME
    assert emb.model_id == f"{PROVIDER[api]}:{MODEL[api]}@384" and emb.dimension == 384
    # one request, identical texts sent once, counters as the Embedder interface defines them
    (req,) = server.requests
    assert req.inputs == list(dict.fromkeys(TEXTS)) and req.authorised
    assert (emb.calls, emb.embedded) == (1, len(set(TEXTS)))
    if api in ("openai", "azure", "tei"):
        assert req.encoding_format == "float" and req.dimensions is None
    if api == "azure":
        assert req.path == f"/openai/deployments/{MODEL[api]}/embeddings" and req.api_version == "2024-10-21"
    if api == "ollama":
        assert req.truncate is False and req.num_ctx == 254 + 8 and req.model == "all-minilm"


def test_the_default_stays_the_bundled_model(clean_env):
    emb = get_embedder(Settings())
    assert isinstance(emb, SentenceTransformerEmbedder) and emb.model_id == "all-MiniLM-L6-v2"


# --- dimensions ---------------------------------------------------------------------------------------------


def test_a_4096_dim_model_is_truncated_client_side_and_renormalised(servers, embedder):
    server = servers("ollama", model_name="qwen3-embedding", native_dim=4096)
    texts = TEXTS[:2] + TEXTS[3:]
    native = server.vectors(texts)  # [0.8 v, 0.6 u]: see the fake's docstring
    emb = build("ollama", server, embedder, embedding_model="qwen3-embedding", embedding_dimensions=384)
    assert emb.model_id == "ollama:qwen3-embedding@384" and server.requests == []  # no probe needed
    v384 = emb.embed(texts)
    assert cosines(v384, embedder.embed(texts)).min() > SAME  # truncation + renormalisation = the bundled vector
    assert np.allclose(np.linalg.norm(v384, axis=1), 1.0, atol=1e-5)
    assert server.requests[-1].dimensions is None  # Ollama's own ``dimensions`` is not relied on

    emb1024 = build("ollama", server, embedder, embedding_model="qwen3-embedding", embedding_dimensions=1024)
    cut = native[:, :1024] / np.linalg.norm(native[:, :1024], axis=1, keepdims=True)
    assert cosines(emb1024.embed(texts), cut).min() > SAME

    native_emb = build("ollama", server, embedder, embedding_model="qwen3-embedding")
    before = len(server.requests)
    assert native_emb.model_id == "ollama:qwen3-embedding@4096"  # probed once
    assert [q.inputs for q in server.requests[before:]] == [[PROBE_TEXT]]
    assert native_emb.dimension == 4096 and len(server.requests) == before + 1  # not again
    assert cosines(native_emb.embed(texts), native).min() > SAME

    too_wide = build("ollama", server, embedder, embedding_model="qwen3-embedding", embedding_dimensions=5000)
    with pytest.raises(EmbeddingError, match=r"wrong dimension: expected at least 5000, got 4096"):
        too_wide.embed(["x marks the spot"])


def test_openai_gets_the_dimensions_parameter(servers, embedder):
    server = servers("openai")
    emb = build("openai", server, embedder, embedding_dimensions=256)
    vectors = emb.embed(TEXTS[:2])
    assert server.requests[-1].dimensions == 256 and emb.model_id == "openai:minilm-compat@256"
    full = embedder.embed(TEXTS[:2])[:, :256]
    assert cosines(vectors, full).min() > SAME and vectors.shape == (2, 256)


def test_a_known_native_dimension_is_checked_without_probing(servers, embedder):
    """text-embedding-3-small is 1536-dimensional: a server answering 384 is a wrong dimension, not a probe."""
    server = servers("openai")
    emb = build("openai", server, embedder, embedding_model="text-embedding-3-small")
    assert emb.dimension == 1536 and emb.max_tokens == 254 and server.requests == []
    with pytest.raises(EmbeddingError) as err:
        emb.embed(["a query"])
    assert "openai embedding model 'text-embedding-3-small'" in str(err.value)
    assert "wrong dimension: expected 1536, got 384" in str(err.value)


# --- token limits and batching ------------------------------------------------------------------------------


def _texts_of(embedder, tokens: int, n: int) -> list[str]:
    words = ["apple", "river", "stone", "cloud", "tiger", "music", "paper", "green", "house", "light", "water"]
    out = []
    for i in range(n):
        text = " ".join(words[(i + j) % len(words)] for j in range(tokens - 1)) + f" {i}"
        out.append(text)
    assert embedder.count_tokens(out) == [tokens] * n  # each exactly ``tokens`` tokens, counted here
    return out


def test_batching_respects_input_and_token_limits(servers, embedder):
    server = servers("tei")
    texts = _texts_of(embedder, 10, 7)
    emb = build("tei", server, embedder, embedding_request_inputs=3, embedding_request_tokens=25,
                embedding_max_tokens=20)
    vectors = emb.embed(texts)
    assert [len(q.inputs) for q in server.requests] == [2, 2, 2, 1]  # 2 x 10 <= 25 < 3 x 10
    assert [sum(q.tokens) for q in server.requests] == [20, 20, 20, 10]
    assert [t for q in server.requests for t in q.inputs] == texts and emb.calls == 4
    assert cosines(vectors, embedder.embed(texts)).min() > SAME

    server.requests.clear()
    build("tei", server, embedder, embedding_request_inputs=3, embedding_request_tokens=1000).embed(texts)
    assert [len(q.inputs) for q in server.requests] == [3, 3, 1]

    # TEI's defaults (32 inputs per request) keep a large batch within the server's own limit (no 413)
    server.requests.clear()
    many = _texts_of(embedder, 5, 70)
    assert build("tei", server, embedder).embed(many).shape == (70, 384)
    assert [len(q.inputs) for q in server.requests] == [32, 32, 6]
    assert {q.status for q in server.requests} == {200}


def test_plan_requests_never_exceeds_either_limit():
    counts = [5, 9, 1, 9, 9, 2, 2, 2, 2, 10]
    plan = plan_requests(counts, Limits(max_tokens=10, request_inputs=3, request_tokens=12))
    assert [list(x) for x in plan] == [[0], [1, 2], [3], [4, 5], [6, 7, 8], [9]]


@pytest.mark.parametrize("api", ["tei", "ollama"])
def test_a_text_over_the_limit_is_refused_before_any_request(api, servers, embedder):
    server = servers(api)
    emb = build(api, server, embedder)
    long_text = _texts_of(embedder, 300, 1)[0]
    with pytest.raises(EmbeddingError) as err:
        emb.embed(["short", long_text])
    message = str(err.value)
    assert message.startswith(f"{PROVIDER[api]} embedding model '{MODEL[api]}'")
    assert "text 1 has 300 tokens (counted by tokenizer), over the limit of 254" in message
    assert "not truncated" in message and server.requests == []

    bound = build(api, server, embedder, embedding_tokenizer="", embedding_max_tokens=100)  # no tokenizer
    text = "é" * 60  # 120 bytes
    with pytest.raises(EmbeddingError, match=r"has 121 tokens \(counted by UTF-8 bytes \+ 1 \(upper bound\)\), "
                                             r"over the limit of 100"):
        bound.embed([text])
    assert server.requests == []


@pytest.mark.parametrize("api", APIS)
def test_an_input_the_server_finds_too_long_is_an_error_not_retried(api, servers, embedder):
    server = servers(api)
    server.faults.too_long()
    emb = build(api, server, embedder)
    with pytest.raises(EmbeddingError) as err:
        emb.embed(["fine by our count"])
    expected = {"openai": "HTTP 400: This model's maximum context length is 254 tokens",
                "azure": "HTTP 400: This model's maximum context length is 254 tokens",
                "tei": "HTTP 413 request too large: Input validation error: `inputs` must have less than 254 tokens",
                "ollama": "HTTP 400: the input length exceeds the context length"}[api]
    assert expected in str(err.value) and len(server.requests) == 1


def _train(kind: str, corpus: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    if kind == "byte-level-bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
    else:  # SentencePiece-style: Metaspace with a dummy prefix, byte fallback for what the vocabulary lacks
        tok = Tokenizer(models.BPE(byte_fallback=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
        trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=[f"<0x{i:02X}>" for i in range(256)],
                                      show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return tok


def test_the_utf8_bound_is_an_upper_bound_and_the_plus_one_is_needed(embedder, shared_dir):
    corpus = [p.read_text(errors="replace") for p in sorted((shared_dir / "corpus").glob("*.md"))]
    corpus += [(shared_dir / "corpus" / "fake-text-utf-16.txt").read_text(encoding="utf-16")]
    hostile = ["😀", "a 😀 b", "İstanbul ΐ Ǆ ﬃ", "東京は日本の首都", "한국어 텍스트", "e\u0301\u0301\u0301", " ", "\t\n",
               "x" * 50, "ab" * 7 + "🎉" * 5, "Ⅻ ㍻ ﷺ", "\u200b\u200d", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇"]
    texts = corpus + hostile + [line for doc in corpus for line in doc.splitlines() if line.strip()]
    bound = [utf8_token_bound(t) for t in texts]
    wordpiece = embedder.count_tokens(texts)  # the bundled BERT WordPiece tokenizer
    assert all(n <= b for n, b in zip(wordpiece, bound))
    for kind in ("byte-level-bpe", "sentencepiece"):
        tok = _train(kind, corpus * 3)
        counts = [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]
        assert all(n <= b for n, b in zip(counts, bound)), kind
        if kind == "byte-level-bpe":  # never more tokens than bytes
            assert all(n <= b - 1 for n, b in zip(counts, bound))
    # the dummy prefix: "▁" then 4 byte-fallback tokens for one 4-byte emoji: bytes + 1, the bound exactly
    assert len(tok.encode("😀", add_special_tokens=False).ids) == utf8_token_bound("😀") == 5


def test_retry_after_parsing():
    assert parse_retry_after({"Retry-After": "3"}) == 3.0
    assert parse_retry_after({"retry-after-ms": "250", "Retry-After": "3"}) == 0.25
    assert parse_retry_after({"Retry-After": "Wed, 01 Dec 2027 00:00:10 GMT"},
                             now=__import__("email.utils").utils.parsedate_to_datetime(
                                 "Wed, 01 Dec 2027 00:00:00 GMT").timestamp()) == 10.0
    assert parse_retry_after({"Retry-After": "soon"}) is None and parse_retry_after({}) is None


# --- faults ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_a_429_storm_is_waited_out_as_retry_after_says(api, servers, embedder, caplog):
    server = servers(api)
    server.faults.rate_limit(2, retry_after="1")
    emb = build(api, server, embedder)
    with caplog.at_level(logging.WARNING, logger="rag_pipeline.embedding.remote"):
        vectors = emb.embed(TEXTS[:2])
    assert [q.status for q in server.requests] == [429, 429, 200]
    assert list(emb.waits) == [1.0, 1.0]  # the server's Retry-After, not our backoff
    assert cosines(vectors, embedder.embed(TEXTS[:2])).min() > SAME
    retries = [rec.getMessage() for rec in caplog.records if "retry" in rec.getMessage()]
    assert len(retries) == 2 and "HTTP 429 rate limited" in retries[0] and f"'{MODEL[api]}'" in retries[0]


def test_retry_after_ms_is_honoured(servers, embedder):
    server = servers("openai")
    server.faults.rate_limit(1, retry_after="5", retry_after_ms="150")
    emb = build("openai", server, embedder)
    emb.embed(["one"])
    assert list(emb.waits) == [0.15] and len(server.requests) == 2


@pytest.mark.parametrize("api", ["openai", "ollama"])
def test_a_retry_after_past_the_budget_ends_at_once(api, servers, embedder):
    server = servers(api)
    server.faults.rate_limit(None, retry_after="30")
    emb = build(api, server, embedder, embedding_retry_budget_s=5)
    with pytest.raises(EmbeddingError) as err:
        emb.embed(["one"])
    assert len(server.requests) == 1 and list(emb.waits) == []
    assert f"{PROVIDER[api]} embedding model '{MODEL[api]}' at 127.0.0.1:" in str(err.value)
    assert "HTTP 429 rate limited" in str(err.value)
    assert "a further wait of 30.0 s would pass the retry budget of 5 s" in str(err.value)


@pytest.mark.parametrize("api", APIS)
def test_500s_are_retried_then_reported(api, servers, embedder):
    server = servers(api)
    server.faults.fail(2, status=503)
    emb = build(api, server, embedder)
    assert emb.embed(["recovers"]).shape == (1, 384)
    assert [q.status for q in server.requests] == [503, 503, 200] and len(emb.waits) == 2

    server.requests.clear()
    server.faults.fail(None, status=500)
    with pytest.raises(EmbeddingError) as err:
        emb.embed(["never"])
    assert len(server.requests) == 4  # 1 + RAG_EMBEDDING_MAX_RETRIES (3)
    assert str(err.value).startswith(f"{PROVIDER[api]} embedding model '{MODEL[api]}'")
    assert "HTTP 500: internal server error (gave up after 4 attempts)" in str(err.value)


@pytest.mark.parametrize("api", APIS)
def test_a_slow_answer_times_out_and_is_retried(api, servers, embedder):
    server = servers(api)
    server.faults.slow(1, delay_s=2.0)
    emb = build(api, server, embedder, embedding_timeout_s=0.5)
    assert cosines(emb.embed(["patience"]), embedder.embed(["patience"])).min() > SAME
    assert len(server.requests) == 2 and server.requests[0].fault == "slow"

    server.faults.slow(None, delay_s=2.0)
    emb = build(api, server, embedder, embedding_timeout_s=0.5, embedding_max_retries=1)
    with pytest.raises(EmbeddingError, match=r"no answer within 0.5 s \(RAG_EMBEDDING_TIMEOUT_S\) "
                                             r"\(gave up after 2 attempts\)"):
        emb.embed(["still waiting"])
    server.faults.clear()


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("fault, message", [
    ("wrong_dimension", "wrong dimension: expected 384, got 383"),
    ("nan", "non-finite values (NaN/inf) in 1 of 3 vectors (first: input 0)"),
    ("short_batch", "short batch: 2 vectors for 3 inputs"),
])
def test_a_bad_answer_is_an_error_naming_what_was_wrong(api, fault, message, servers, embedder):
    server = servers(api)
    emb = build(api, server, embedder)
    assert emb.dimension == 384  # the first answer fixed nothing: the probe ran before the fault
    server.requests.clear()
    getattr(server.faults, fault)()
    with pytest.raises(EmbeddingError) as err:
        emb.embed(TEXTS[:2] + TEXTS[3:4])
    assert str(err.value).startswith(f"{PROVIDER[api]} embedding model '{MODEL[api]}'") and message in str(err.value)
    assert len(server.requests) == 1 and emb.calls == 1  # the probe; the bad answer counts no call
    assert emb.embed(TEXTS[:2]).shape == (2, 384)  # the next request is fine again


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("api", APIS)
def test_a_refused_connection_is_retried_then_reported(api, embedder):
    url = f"http://127.0.0.1:{_closed_port()}"
    emb = get_embedder(settings_for(api, url, embedder, embedding_max_retries=2, embedding_dimensions=384))
    emb.backoff_s = 0.01
    with pytest.raises(EmbeddingError) as err:
        emb.embed(["anyone there?"])
    assert emb.attempts == 3 and len(emb.waits) == 2
    assert f"{PROVIDER[api]} embedding model '{MODEL[api]}' at 127.0.0.1:" in str(err.value)
    assert "cannot reach the server" in str(err.value) and "gave up after 3 attempts" in str(err.value)


# --- the key --------------------------------------------------------------------------------------------------


@pytest.fixture
def registry():
    """The redaction registry is restored afterwards (this test empties it to prove it is not needed)."""
    saved = set(r._secrets)
    yield
    r.forget_secrets()
    for s in saved:
        r.register_secret(s)


@pytest.mark.parametrize("api", APIS)
def test_the_api_key_is_in_no_error_and_no_log_record(api, servers, embedder, registry):
    marker = f"sk-KEYMARKER-{uuid.uuid4().hex}"
    server = servers(api, api_key=marker)
    emb = build(api, server, embedder, embedding_api_key=marker, embedding_dimensions=384, embedding_max_retries=1)
    assert r.redact(f"key={marker} and {marker}").count("***") == 2  # get_embedder registered it
    r.forget_secrets()  # ...but the messages must be clean without the safety net

    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
            if record.exc_info:
                records.append("".join(traceback.format_exception(*record.exc_info)))

    handler = Collect(level=logging.DEBUG)
    names = ["", "openai", "httpx", "httpcore", "httpx2", "httpcore2", "ollama", "rag_pipeline", "werkzeug"]
    levels = {n: logging.getLogger(n).level for n in names}
    root = logging.getLogger()
    root.addHandler(handler)
    for n in names:
        logging.getLogger(n).setLevel(logging.DEBUG)
    errors: list[BaseException] = []
    try:
        assert emb.embed(["with the right key"]).shape == (1, 384)
        for fault in ("fail", "short_batch", "too_long"):
            getattr(server.faults, fault)(**({"times": None} if fault == "fail" else {}))
            with pytest.raises(EmbeddingError) as err:
                emb.embed(["a fault"])
            errors.append(err.value)
            server.faults.clear()
        wrong = build(api, server, embedder, embedding_api_key=marker + "-wrong", embedding_dimensions=384)
        r.forget_secrets()
        with pytest.raises(EmbeddingError) as err:
            wrong.embed(["with a wrong key"])  # the OpenAI fake echoes the whole key given in its 401 body
        errors.append(err.value)
        assert "HTTP 401 not authorised (check RAG_EMBEDDING_API_KEY)" in str(err.value)
        closed = get_embedder(settings_for(api, f"http://127.0.0.1:{_closed_port()}", embedder, embedding_api_key=marker,
                                           embedding_dimensions=384, embedding_max_retries=0))
        r.forget_secrets()
        with pytest.raises(EmbeddingError) as err:
            closed.embed(["nobody home"])
        errors.append(err.value)
    finally:
        root.removeHandler(handler)
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)
    texts = records + [str(emb), repr(emb), emb.model_id, repr(settings_for(api, server.url, embedder,
                                                                            embedding_api_key=marker))]
    for e in errors:
        texts.append("".join(traceback.format_exception(e)))
        chained: BaseException | None = e
        while chained is not None:  # the whole chain, suppressed context included
            texts += [str(chained), repr(chained)]
            chained = chained.__cause__ or chained.__context__
    assert len(errors) == 5 and any("HTTP" in t for t in records)  # the client libraries did log
    assert not [t for t in texts if marker in t]


# --- configuration ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values, variable", [
    ({"embedding_provider": "cohere"}, "RAG_EMBEDDING_PROVIDER='cohere' is not one of"),
    ({"embedding_provider": "azure-openai", "embedding_model": "dep", "embedding_api_key": "k" * 10},
     "RAG_EMBEDDING_API_URL is required for RAG_EMBEDDING_PROVIDER=azure-openai"),
    ({"embedding_provider": "azure-openai", "embedding_model": "dep", "embedding_api_url": "https://x.example"},
     "RAG_EMBEDDING_API_KEY is required for RAG_EMBEDDING_PROVIDER=azure-openai"),
    ({"embedding_provider": "tei"}, "RAG_EMBEDDING_API_URL is required for RAG_EMBEDDING_PROVIDER=tei"),
    ({"embedding_provider": "openai", "embedding_model": "text-embedding-3-small"},
     "RAG_EMBEDDING_API_KEY is required for RAG_EMBEDDING_PROVIDER=openai"),
    ({"embedding_provider": "ollama"}, "RAG_EMBEDDING_MODEL is not set"),
    ({"embedding_provider": "ollama", "embedding_model": "qwen3-embedding", "embedding_tokenizer": "/nonexistent/tok"},
     "RAG_EMBEDDING_TOKENIZER='/nonexistent/tok': no tokenizer.json there"),
    ({"embedding_provider": "tei", "embedding_api_url": "http://tei:8080", "embedding_max_tokens": 512,
      "embedding_request_tokens": 100}, "RAG_EMBEDDING_MAX_TOKENS must be positive and at most"),
])
def test_a_bad_configuration_is_a_value_error_naming_the_variable(values, variable, clean_env):
    with pytest.raises(ValueError) as err:
        get_embedder(Settings(**values))
    assert variable in str(err.value)


def test_provider_defaults(clean_env):
    qwen = get_embedder(Settings(embedding_provider="ollama", embedding_model="qwen3-embedding:8b",
                                 embedding_dimensions=1024))
    assert (qwen.max_tokens, qwen.limits.request_inputs, qwen.model_id) == (8192, 32, "ollama:qwen3-embedding:8b@1024")
    assert qwen.host == "127.0.0.1:11434" and qwen.tokenizer is None and qwen.count_tokens(["ab"]) == [3]
    oai = get_embedder(Settings(embedding_provider="openai", embedding_model="text-embedding-3-large",
                                embedding_api_key="sk-" + "x" * 20))
    assert (oai.max_tokens, oai.dimension, oai.limits.request_tokens) == (8191, 3072, 300_000)
    assert oai.model_id == "openai:text-embedding-3-large@3072"  # known: no request
    tei = get_embedder(Settings(embedding_provider="tei", embedding_api_url="http://tei:8080", embedding_dimensions=384))
    assert (tei.max_tokens, tei.limits.request_inputs, tei.limits.request_tokens) == (GENERIC_MAX_TOKENS, 32, 16_384)
    assert str(tei._client.base_url).rstrip("/") == "http://tei:8080/v1"


# --- through the pipeline -----------------------------------------------------------------------------------

FILES = ["codeblock.md", "simple-table.md", "stanley-cups.csv", "fake-text-utf-16.txt", "fake-html-cp1252.html",
         "fake-memo.pdf"]


def _database_for(pg_server: str, emb) -> str:
    """A new database whose index is created for ``emb`` (its model is the active one, so the sync and the
    query use ``emb`` itself, not the bundled model of the shared template)."""
    import psycopg

    from rag_pipeline.store import migrate

    name = f"remote_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    conninfo = psycopg.conninfo.conninfo_to_dict(pg_server)
    conninfo["dbname"] = name
    url = psycopg.conninfo.make_conninfo(**conninfo)
    migrate(url, embedding_dimension=emb.dimension, embedding_model=emb.model_id)
    return url


def test_a_sync_with_a_fault_mid_run_fails_the_affected_documents_and_completes_them_next_time(
        tmp_path, servers, embedder, pg_server, shared_dir):
    from rag_pipeline.pipeline.sync import EXIT_DOCUMENT_FAILURES, EXIT_OK, sync_source
    from rag_pipeline.retrieval import query
    from rag_pipeline.sources.local import LocalFolderSource
    from rag_pipeline.store import Store
    from rag_pipeline.store.invariants import check_index

    root = tmp_path / "docs"
    root.mkdir()
    for name in FILES:
        shutil.copy(shared_dir / "corpus" / name, root / name)
    server = servers("tei")
    emb = build("tei", server, embedder, embedding_max_retries=1)
    url = _database_for(pg_server, emb)
    store = Store(url)
    settings = settings_for("tei", server.url, embedder, embedding_max_retries=1, database_url=url, retry_backoff_s=0,
                            sync_batch_documents=1)  # one embedding call per document
    server.requests.clear()
    server.faults.fail(None, status=500, after=2)  # two requests answered, then the server breaks
    src = LocalFolderSource(root)

    first = sync_source(src, store, emb, settings)
    assert first.exit_code == EXIT_DOCUMENT_FAILURES
    by_id = {d.source_id: d for d in first.documents}
    failed = sorted(s for s, d in by_id.items() if d.action.value == "failed")
    done = sorted(s for s, d in by_id.items() if d.status == "completed")
    assert len(done) == 2 and len(failed) == len(FILES) - 2 and sorted(done + failed) == sorted(FILES)
    for sid in failed:
        assert by_id[sid].status == "failed"
        assert by_id[sid].reason.startswith("tei embedding model 'all-MiniLM-L6-v2' at 127.0.0.1:")
        assert "HTTP 500" in by_id[sid].reason and "gave up after 2 attempts" in by_id[sid].reason
    with store.connection() as conn:
        assert check_index(conn) == []
        rows = dict(conn.execute("SELECT d.source_id, count(c.id) FROM documents d LEFT JOIN chunks c "
                                 "ON c.document_id = d.id GROUP BY d.source_id").fetchall())
        errors = dict(conn.execute("SELECT source_id, last_error FROM documents WHERE status = 'failed'").fetchall())
    assert all(rows[s] == 0 for s in failed) and all(rows[s] > 0 for s in done)  # nothing half-written
    assert sorted(errors) == failed and all("HTTP 500" in e for e in errors.values())

    server.faults.clear()
    second = sync_source(src, store, emb, settings)
    assert second.exit_code == EXIT_OK
    assert {d.source_id: d.status for d in second.documents} == {s: "completed" for s in FILES}
    assert {d.source_id: d.action.value for d in second.documents} == {
        **{s: "added" for s in failed}, **{s: "skipped-unchanged" for s in done}}  # only the failed ones again
    with store.connection() as conn:
        assert check_index(conn) == []
    # the vectors stored are the bundled model's: each hit's score is the cosine of the two texts' vectors
    before = len(server.requests)
    question = "Which team from Toronto won 13 Stanley Cups?"
    hits = query(store, emb, question, k=3, admin=True)
    assert hits[0].source_id == "stanley-cups.csv" and len(server.requests) == before + 1
    q, texts = embedder.embed([question]), embedder.embed([h.text for h in hits])
    assert np.allclose([h.score for h in hits], (texts @ q.T).ravel(), atol=1e-3)
    hits = query(store, emb, "hamburgers are delicious and dogs are the best", k=3, admin=True)
    assert hits[0].source_id == "fake-text-utf-16.txt"
