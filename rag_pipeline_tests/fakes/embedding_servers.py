"""Fake embedding servers on 127.0.0.1 that speak the real APIs and compute REAL vectors with the bundled model.

``FakeEmbeddingServer(model, api=...)`` serves one API (werkzeug, threaded), for the real ``openai`` and
``ollama`` clients:

* ``api="openai"``: ``POST /v1/embeddings`` (``Authorization: Bearer <key>`` when ``api_key`` is set), body
  ``{"model", "input": str | [str], "encoding_format": "float" | "base64", "dimensions"?}``, answer
  ``{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...]}], "model", "usage"}``.
  ``dimensions`` truncates and re-normalises (what OpenAI does for text-embedding-3); more than ``max_inputs``
  (2048) inputs or an input over ``max_input_tokens`` -> 400 ``invalid_request_error`` as OpenAI words it.
* ``api="azure"``: ``POST /openai/deployments/<deployment>/embeddings?api-version=<v>`` with the ``api-key``
  header; an unknown deployment -> 404 ``DeploymentNotFound``, a missing or other ``api-version`` -> 404
  ``Resource not found``; otherwise as ``openai``.
* ``api="tei"``: TEI's OpenAI-compatible ``POST /v1/embeddings`` (the model name is ignored, as TEI serves one);
  more than ``max_inputs`` (32, TEI's ``--max-client-batch-size``) -> 413 "batch size N > maximum allowed batch
  size 32", an input over ``max_input_tokens`` -> 413 "Input validation error: `inputs` must have less than N
  tokens. Given: M" (``error_type: Validation``); ``dimensions`` -> 422 (TEI has no such parameter).
* ``api="ollama"``: ``POST /api/embed`` ``{"model", "input", "truncate", "options"}`` -> ``{"model",
  "embeddings", "total_duration", "load_duration", "prompt_eval_count"}``; an unknown model -> 404 ``model
  "x" not found, try pulling it first``; an input over the limit with ``truncate: false`` -> 400 ``the input
  length exceeds the context length`` (the limit is ``max_input_tokens``, lowered to ``options.num_ctx`` - 1
  when the request sets a smaller context).

Vectors: ``model.embed(texts)`` of the bundled all-MiniLM-L6-v2 (384 dims, L2-normalised). With
``native_dim > 384`` (a stand-in for qwen3-embedding's 4096) the vector is ``[0.8 * v, 0.6 * u(text)]``, where
``u`` is a unit vector of ``native_dim - 384`` values drawn from a generator seeded with the text's SHA-256:
deterministic, of norm 1, and its first 384 values, re-normalised, are exactly the bundled model's vector
(so client-side truncation to 384 must give the bundled vector back, and only if it re-normalises).
Token counts for the server's own limits come from ``model.count_tokens`` (the bundled tokenizer).
``max_input_tokens`` defaults to 254, the bundled model's limit, so nothing is silently cut by the model.

Faults (``server.faults``, changeable between requests; each applies to embedding requests, ``times=None``
meaning until ``clear()``, ``after`` = that many requests pass untouched first): ``rate_limit`` (429 with
``Retry-After`` and/or ``retry-after-ms``), ``fail`` (any status, e.g. 500/503), ``slow`` (answer after
``delay_s``), ``wrong_dimension`` (every vector one value short), ``nan`` (a NaN in the first vector),
``short_batch`` (the last vector left out), ``too_long`` (the over-the-limit answer of the API, whatever the
input). ``server.requests`` records each request (``RecordedRequest``); the API key is never recorded, only
whether the request carried the right one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

BUNDLED_DIM = 384
APIS = ("openai", "azure", "tei", "ollama")


class _Model(Protocol):
    def embed(self, texts: list[str]) -> np.ndarray: ...

    def count_tokens(self, texts: list[str]) -> list[int]: ...


@dataclass
class Fault:
    """One injected fault (see module docstring)."""

    kind: str
    times: int | None = 1
    after: int = 0
    status: int = 500
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    message: str = "internal server error"


class Faults:
    """The pending faults of a server; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[Fault] = []

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self._pending.append(fault)
        return fault

    def rate_limit(self, times: int | None = 1, *, retry_after: str | None = "1", retry_after_ms: str | None = None,
                   after: int = 0) -> Fault:
        """Answer 429 with ``Retry-After`` (seconds) and/or ``retry-after-ms``."""
        headers = {k: v for k, v in (("Retry-After", retry_after), ("retry-after-ms", retry_after_ms)) if v is not None}
        return self.add(Fault("status", times, after, 429, headers, message="Rate limit reached for requests"))

    def fail(self, times: int | None = 1, *, status: int = 500, after: int = 0,
             message: str = "internal server error") -> Fault:
        return self.add(Fault("status", times, after, status, message=message))

    def slow(self, times: int | None = 1, *, delay_s: float, after: int = 0) -> Fault:
        return self.add(Fault("slow", times, after, delay_s=delay_s))

    def wrong_dimension(self, times: int | None = 1, *, after: int = 0) -> Fault:
        return self.add(Fault("wrong_dimension", times, after))

    def nan(self, times: int | None = 1, *, after: int = 0) -> Fault:
        return self.add(Fault("nan", times, after))

    def short_batch(self, times: int | None = 1, *, after: int = 0) -> Fault:
        return self.add(Fault("short_batch", times, after))

    def too_long(self, times: int | None = 1, *, after: int = 0) -> Fault:
        return self.add(Fault("too_long", times, after))

    def clear(self) -> None:
        with self._lock:
            self._pending.clear()

    def take(self) -> Fault | None:
        """The fault for the request now arriving (consumes one of its ``times``), or None."""
        with self._lock:
            chosen = None
            for f in self._pending:
                if f.after > 0:
                    f.after -= 1
                elif chosen is None:
                    chosen = f
            if chosen is not None and chosen.times is not None:
                chosen.times -= 1
                if chosen.times <= 0:
                    self._pending.remove(chosen)
            return chosen


@dataclass
class RecordedRequest:
    """One request as the server saw it: ``inputs`` (the texts), ``tokens`` (per input, bundled tokenizer),
    ``status`` answered, ``fault`` kind applied (or None), and the request's parameters."""

    api: str
    path: str
    model: str | None
    inputs: list[str]
    tokens: list[int]
    status: int = 200
    fault: str | None = None
    dimensions: int | None = None
    truncate: bool | None = None
    num_ctx: int | None = None
    api_version: str | None = None
    encoding_format: str | None = None
    authorised: bool = True
    at: float = 0.0


def _unit(seed_text: str, n: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(seed_text.encode("utf-8", "surrogatepass")).digest()[:8], "big")
    v = np.random.default_rng(seed).standard_normal(n)
    return v / np.linalg.norm(v)


class FakeEmbeddingServer:
    """Serves one embedding API on ``http://127.0.0.1:<port>`` (see module docstring). Use as a context
    manager, or ``start()``/``stop()``.

    ``model``: has ``embed(texts) -> (n, 384)`` and ``count_tokens(texts)`` (the bundled embedder).
    ``api``: one of ``APIS``. ``model_name``: the model (Ollama) or deployment (Azure) it serves; None =
    any. ``native_dim``: width of its vectors (>= 384). ``api_key``: required when set. ``max_inputs``: per
    request (default per API). ``max_input_tokens``: per input."""

    def __init__(self, model: _Model, *, api: str = "openai", model_name: str | None = None, native_dim: int = BUNDLED_DIM,
                 api_key: str | None = None, api_version: str = "2024-10-21", max_inputs: int | None = None,
                 max_input_tokens: int = 254) -> None:
        if api not in APIS:
            raise ValueError(f"api must be one of {APIS}")
        if native_dim < BUNDLED_DIM:
            raise ValueError(f"native_dim must be at least {BUNDLED_DIM}")
        self.model, self.api, self.model_name, self.native_dim = model, api, model_name, native_dim
        self.api_key, self.api_version = api_key, api_version
        self.max_inputs = max_inputs or {"openai": 2048, "azure": 2048, "tei": 32, "ollama": 100_000}[api]
        self.max_input_tokens = max_input_tokens
        self.faults = Faults()
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._server = make_server("127.0.0.1", 0, self._wsgi, threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    # --- lifecycle ------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (what ``RAG_EMBEDDING_API_URL`` is set to; TEI/OpenAI get ``/v1``
        appended by the client when the URL has no path)."""
        return f"http://127.0.0.1:{self._server.server_port}"

    def start(self) -> FakeEmbeddingServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeEmbeddingServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- vectors --------------------------------------------------------------------------------------------

    def vectors(self, texts: list[str]) -> np.ndarray:
        """The server's native vectors for ``texts`` (float64, unit norm; see module docstring)."""
        base = np.asarray(self.model.embed(texts), dtype=np.float64)
        if self.native_dim == BUNDLED_DIM:
            return base
        tail = np.stack([_unit(t, self.native_dim - BUNDLED_DIM) for t in texts])
        return np.concatenate([0.8 * base, 0.6 * tail], axis=1)

    # --- HTTP -----------------------------------------------------------------------------------------------

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
        return Response(json.dumps(body), status=status, headers=headers or {}, content_type="application/json")

    def _error(self, status: int, message: str, *, code: str | None = None, headers: dict[str, str] | None = None,
               error_type: str | None = None) -> Response:
        if self.api in ("openai", "azure"):
            body: dict[str, Any] = {"error": {"message": message, "type": error_type or "invalid_request_error",
                                              "param": None, "code": code}}
        elif self.api == "tei":
            body = {"error": message, "error_type": error_type or "Backend"}
        else:
            body = {"error": message}
        return self._json(status, body, headers)

    def _wsgi(self, environ, start_response):
        request = Request(environ)
        return self._handle(request)(environ, start_response)

    def _handle(self, request: Request) -> Response:
        path = request.path
        if request.method != "POST":
            return self._error(405, "method not allowed")
        if self.api in ("openai", "tei") and path == "/v1/embeddings":
            return self._openai_like(request, deployment=None)
        if self.api == "azure" and path.startswith("/openai/deployments/") and path.endswith("/embeddings"):
            return self._openai_like(request, deployment=path.split("/")[3])
        if self.api == "ollama" and path == "/api/embed":
            return self._ollama(request)
        return self._error(404, f"no route {path}", code="404")

    def _record(self, rec: RecordedRequest) -> RecordedRequest:
        rec.at = time.monotonic()
        with self._lock:
            self.requests.append(rec)
        return rec

    def _authorised(self, request: Request) -> tuple[bool, str]:
        if not self.api_key:
            return True, ""
        if self.api == "azure":
            given = request.headers.get("api-key", "")
        else:
            auth = request.headers.get("Authorization", "")
            given = auth[7:] if auth.lower().startswith("bearer ") else auth
        return given == self.api_key, given

    def _apply_fault(self, rec: RecordedRequest, fault: Fault | None) -> Response | None:
        """A response for a fault that replaces the answer (status, too_long), or None; sleeps for ``slow``."""
        if fault is None:
            return None
        rec.fault = fault.kind
        if fault.kind == "slow":
            time.sleep(fault.delay_s)
            return None
        if fault.kind == "status":
            rec.status = fault.status
            return self._error(fault.status, fault.message, headers=fault.headers,
                               code="rate_limit_exceeded" if fault.status == 429 else None)
        if fault.kind == "too_long":
            return self._too_long(rec, max(rec.tokens or [self.max_input_tokens + 1]))
        return None

    def _too_long(self, rec: RecordedRequest, given: int, limit: int | None = None) -> Response:
        limit = self.max_input_tokens if limit is None else limit
        if self.api == "tei":
            rec.status = 413
            return self._error(413, f"Input validation error: `inputs` must have less than {limit} tokens. "
                                    f"Given: {given}", error_type="Validation")
        if self.api == "ollama":
            rec.status = 400
            return self._error(400, "the input length exceeds the context length")
        rec.status = 400
        return self._error(400, f"This model's maximum context length is {limit} tokens, however you requested "
                                f"{given} tokens (0 in your prompt; {given} for the completion). Please reduce "
                                "your prompt; or completion length.")

    def _shape(self, fault: Fault | None, vectors: np.ndarray) -> list[list[float]]:
        rows = [list(map(float, v)) for v in vectors]
        kind = fault.kind if fault else None
        if kind == "wrong_dimension":
            rows = [r[:-1] for r in rows]
        elif kind == "nan" and rows:
            rows[0][0] = math.nan
        elif kind == "short_batch" and rows:
            rows = rows[:-1]
        return rows

    def _openai_like(self, request: Request, *, deployment: str | None) -> Response:
        try:
            body = json.loads(request.get_data() or b"{}")
        except ValueError:
            return self._error(400, "We could not parse the JSON body of your request.")
        raw = body.get("input")
        inputs = [raw] if isinstance(raw, str) else list(raw or [])
        ok, given = self._authorised(request)
        rec = self._record(RecordedRequest(
            self.api, request.path, deployment or body.get("model"), inputs if ok else [],
            self.model.count_tokens(inputs) if ok and inputs else [], dimensions=body.get("dimensions"),
            api_version=request.args.get("api-version"), encoding_format=body.get("encoding_format"),
            authorised=ok))
        if not ok:
            rec.status = 401
            if self.api == "azure":
                return self._error(401, "Access denied due to invalid subscription key or wrong API endpoint. Make "
                                        "sure to provide a valid key for an active subscription and use a correct "
                                        "regional API endpoint for your resource.", code="401")
            # the real API shows the key with its middle masked; the fake echoes it whole (worst case)
            return self._error(401, f"Incorrect API key provided: {given}. You can find your API key at "
                                    "https://platform.openai.com/account/api-keys.", code="invalid_api_key")
        if self.api == "azure":
            if self.model_name is not None and deployment != self.model_name:
                rec.status = 404
                return self._error(404, "The API deployment for this resource does not exist.",
                                   code="DeploymentNotFound")
            if request.args.get("api-version") != self.api_version:
                rec.status = 404
                return self._error(404, "Resource not found", code="404")
        if not inputs or any(not isinstance(t, str) or not t for t in inputs):
            rec.status = 400
            return self._error(400, "'$.input' is invalid. Please check the API reference.")
        response = self._apply_fault(rec, self.faults.take())
        if response is not None:
            return response
        if len(inputs) > self.max_inputs:
            rec.status = 413 if self.api == "tei" else 400
            if self.api == "tei":
                return self._error(413, f"batch size {len(inputs)} > maximum allowed batch size {self.max_inputs}",
                                   error_type="Validation")
            return self._error(400, f"'$.input' is invalid: at most {self.max_inputs} inputs")
        longest = max(rec.tokens)
        if longest > self.max_input_tokens:
            return self._too_long(rec, longest)
        dims = body.get("dimensions")
        vectors = self.vectors(inputs)
        if dims is not None:
            if self.api == "tei":
                rec.status = 422
                return self._error(422, "Failed to deserialize the JSON body: unknown field `dimensions`",
                                   error_type="Validation")
            if not isinstance(dims, int) or not 0 < dims <= self.native_dim:
                rec.status = 400
                return self._error(400, f"This model does not support specifying dimensions of {dims}.")
            vectors = vectors[:, :dims]
            vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        rows = self._shape(self._last_shape_fault(rec), vectors)
        fmt = body.get("encoding_format") or "float"
        data = []
        for i, row in enumerate(rows):
            emb: Any = row
            if fmt == "base64":
                emb = base64.b64encode(np.asarray(row, dtype=np.float32).tobytes()).decode()
            data.append({"object": "embedding", "index": i, "embedding": emb})
        n_tokens = sum(rec.tokens)
        return self._json(200, {"object": "list", "data": data, "model": body.get("model") or self.model_name,
                                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})

    def _last_shape_fault(self, rec: RecordedRequest) -> Fault | None:
        return Fault(rec.fault) if rec.fault in ("wrong_dimension", "nan", "short_batch") else None

    def _ollama(self, request: Request) -> Response:
        try:
            body = json.loads(request.get_data() or b"{}")
        except ValueError:
            return self._error(400, "invalid character in JSON body")
        raw = body.get("input")
        inputs = [raw] if isinstance(raw, str) else list(raw or [])
        ok, _ = self._authorised(request)
        options = body.get("options") or {}
        rec = self._record(RecordedRequest(
            "ollama", request.path, body.get("model"), inputs if ok else [],
            self.model.count_tokens(inputs) if ok and inputs else [], truncate=body.get("truncate"),
            num_ctx=options.get("num_ctx"), dimensions=body.get("dimensions"), authorised=ok))
        if not ok:
            rec.status = 401
            return self._error(401, "unauthorized")
        if self.model_name is not None and body.get("model") != self.model_name:
            rec.status = 404
            return self._error(404, f'model "{body.get("model")}" not found, try pulling it first')
        if not inputs:
            rec.status = 400
            return self._error(400, "input is required")
        started = time.perf_counter_ns()
        response = self._apply_fault(rec, self.faults.take())
        if response is not None:
            return response
        limit = self.max_input_tokens
        if rec.num_ctx:
            limit = min(limit, int(rec.num_ctx) - 1)
        if max(rec.tokens) > limit:
            if body.get("truncate") is False:
                return self._too_long(rec, max(rec.tokens), limit)
            # Ollama's default (truncate true) cuts silently; the fake refuses to hide that
            rec.status = 500
            return self._error(500, "fake: this input would have been truncated silently")
        rows = self._shape(self._last_shape_fault(rec), self.vectors(inputs))
        return self._json(200, {"model": body.get("model"), "embeddings": rows,
                                "total_duration": time.perf_counter_ns() - started, "load_duration": 0,
                                "prompt_eval_count": sum(rec.tokens)})


__all__ = ["APIS", "BUNDLED_DIM", "Fault", "Faults", "FakeEmbeddingServer", "RecordedRequest"]
