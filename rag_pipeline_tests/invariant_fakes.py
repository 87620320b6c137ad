"""Test doubles for the invariant, state and crash tests: sources with stable ids, a paged listing
API with faults, a recording notifier, an embedder wrapper that counts (and can fail), and text
generators whose every paragraph carries a unique marker word.

These stand in for *external systems* only (a source API, an alert channel, a provider failing
mid-batch). Extraction, chunking, the model and PostgreSQL are always the real ones.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rag_pipeline.embedding.base import EmbeddingError
from rag_pipeline.sources.base import (
    ChangeFeedUnavailable,
    ChangeSet,
    Inventory,
    ListingIncompleteError,
    SourceDocument,
    SourceError,
)

WORDS = ("river stone lantern orchard harbor meadow copper violin garden pepper falcon marble canyon "
         "ribbon pillow tunnel glacier compass anchor saddle thunder cactus walnut beacon prairie "
         "lighthouse kettle granite willow summit").split()


def sha256(data: bytes) -> str:
    """Hex SHA-256 of ``data`` (computed here, independently of the pipeline)."""
    return hashlib.sha256(data).hexdigest()


def paragraph(marker: str, rng: random.Random, words: int = 40) -> str:
    """One English-looking paragraph of ``words`` words that contains ``marker`` exactly once
    (markers are made of letters only, e.g. ``mkaqbrc``, so tokenizers and cleaners keep them whole)."""
    body = [rng.choice(WORDS) for _ in range(words)]
    body.insert(rng.randrange(1, words), marker)
    return " ".join(body).capitalize() + "."


def marker(rng: random.Random) -> str:
    """A fresh marker word: ``mk`` + 8 random lowercase letters."""
    return "mk" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8))


# --- sources ---------------------------------------------------------------------------------------


@dataclass
class MemoryDocument:
    """One document held by a ``MemorySource``: ``version`` increases on every change, metadata too
    (as Drive's ``version`` does)."""

    source_id: str
    title: str
    uri: str
    content: bytes
    version: int = 1


class MemorySource:
    """A source with stable ids kept in memory (a Drive/Zotero-like API without the HTTP).

    ``with_sha``: listings carry ``content_sha256`` (the sync needs no fetch to see a change);
    ``with_version``: listings carry ``source_version``. ``with_feed``: ``changes(cursor)`` returns
    upserts and tombstones since the cursor (a sequence number); otherwise it raises
    ``ChangeFeedUnavailable``. ``fetches`` lists fetched ids; ``fetch_errors[id]`` is raised by
    ``fetch`` for that id (a transient outage or a terminal refusal).
    """

    def __init__(self, name: str = "memory:test", *, with_sha: bool = True, with_version: bool = True,
                 with_feed: bool = False) -> None:
        self.name = name
        self.with_sha, self.with_version, self.with_feed = with_sha, with_version, with_feed
        self.docs: dict[str, MemoryDocument] = {}
        self.log: list[tuple[int, str, bool]] = []  # (sequence, source_id, deleted)
        self.seq = 0
        self.fetches: list[str] = []
        self.fetch_errors: dict[str, Exception] = {}

    # -- mutations (what people do in the source between syncs) --
    def _event(self, sid: str, deleted: bool = False) -> None:
        self.seq += 1
        self.log.append((self.seq, sid, deleted))

    def put(self, sid: str, content: bytes, *, title: str | None = None, uri: str | None = None) -> None:
        """Create or change a document's content (its version increases)."""
        old = self.docs.get(sid)
        self.docs[sid] = MemoryDocument(sid, title or (old.title if old else f"{sid}.md"),
                                        uri or (old.uri if old else f"mem://{sid}"), content,
                                        (old.version + 1) if old else 1)
        self._event(sid)

    def rename(self, sid: str, title: str, uri: str) -> None:
        """Rename/move under the same stable id: metadata changes, content does not (version increases)."""
        d = self.docs[sid]
        self.docs[sid] = MemoryDocument(sid, title, uri, d.content, d.version + 1)
        self._event(sid)

    def delete(self, sid: str) -> None:
        """Remove a document (the feed reports a tombstone)."""
        del self.docs[sid]
        self._event(sid, deleted=True)

    # -- the Source interface --
    def _listed(self, d: MemoryDocument) -> SourceDocument:
        return SourceDocument(
            source_id=d.source_id, title=d.title, uri=d.uri, mime_type="text/markdown", size=len(d.content),
            source_version=str(d.version) if self.with_version else None,
            content_sha256=sha256(d.content) if self.with_sha else None,
        )

    def list_documents(self) -> Inventory:
        """Every document, complete, with a cursor valid as of this listing."""
        return Inventory([self._listed(d) for d in sorted(self.docs.values(), key=lambda d: d.source_id)],
                         complete=True, cursor=str(self.seq))

    def changes(self, cursor: str | None) -> ChangeSet:
        """Upserts and tombstones after ``cursor`` (the last event per id wins)."""
        if not self.with_feed or cursor is None:
            raise ChangeFeedUnavailable("no change feed")
        last: dict[str, bool] = {}
        for seq, sid, deleted in self.log:
            if seq > int(cursor):
                last[sid] = deleted
        upserts = [self._listed(self.docs[sid]) for sid, deleted in last.items() if not deleted and sid in self.docs]
        return ChangeSet(upserts, [sid for sid, deleted in last.items() if deleted], str(self.seq))

    def fetch(self, document: SourceDocument) -> bytes:
        """The current bytes; raises ``fetch_errors[id]`` when set, ``SourceError`` when gone."""
        self.fetches.append(document.source_id)
        if document.source_id in self.fetch_errors:
            raise self.fetch_errors[document.source_id]
        d = self.docs.get(document.source_id)
        if d is None:
            raise SourceError(f"{document.source_id} is gone", transient=True)
        return d.content


class PagedSource(MemorySource):
    """A ``MemorySource`` whose listing comes from a paged API (``page_size`` items per page, a
    next-page token, an announced total), with faults:

    * ``fail_on_page = n``: requesting page ``n`` (1-based) raises ``ConnectionError``;
    * ``empty_pages = {n, ...}``: page ``n`` comes back with zero items *and* a next token (APIs do
      this, e.g. Drive when filtering server-side): the listing must keep paging;
    * ``incomplete_style``: ``"raise"`` turns a page failure into ``ListingIncompleteError``;
      ``"flag"`` returns what was read with ``complete=False``.

    ``pages_requested`` records the page numbers asked for.
    """

    def __init__(self, name: str = "paged:test", *, page_size: int = 4, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.page_size = page_size
        self.fail_on_page: int | None = None
        self.empty_pages: set[int] = set()
        self.incomplete_style = "raise"
        self.pages_requested: list[int] = []

    def _api_page(self, token: int) -> tuple[list[SourceDocument], int | None, int]:
        """The fake API: (items, next token or None, total). Token = 1-based page number."""
        self.pages_requested.append(token)
        if self.fail_on_page == token:
            raise ConnectionError(f"connection reset while reading page {token}")
        docs = [self._listed(d) for d in sorted(self.docs.values(), key=lambda d: d.source_id)]
        pages: list[list[SourceDocument]] = [docs[i:i + self.page_size] for i in range(0, len(docs), self.page_size)]
        for n in sorted(self.empty_pages):
            pages.insert(n - 1, [])
        pages = pages or [[]]
        items = pages[token - 1]
        return items, (token + 1 if token < len(pages) else None), len(docs)

    def list_documents(self) -> Inventory:
        """Follow next tokens until there is none; never stop at an empty page; a failure part-way
        raises ``ListingIncompleteError`` or flags the inventory incomplete (``incomplete_style``)."""
        out: list[SourceDocument] = []
        token: int | None = 1
        total = None
        while token is not None:
            try:
                items, token, total = self._api_page(token)
            except ConnectionError as exc:
                reason = f"listing failed part-way: {exc}"
                if self.incomplete_style == "raise":
                    raise ListingIncompleteError(reason) from exc
                return Inventory(out, complete=False, incomplete_reason=reason)
            out.extend(items)
        if total is not None and len(out) != total:
            return Inventory(out, complete=False, incomplete_reason=f"listed {len(out)} of {total} announced",
                             expected_total=total)
        return Inventory(out, complete=True, expected_total=total, cursor=str(self.seq))


# --- notifier and embedder wrapper -------------------------------------------------------------------


@dataclass
class RecordingNotifier:
    """A ``Notifier`` that keeps every alert: ``events`` holds ``(event, message, details)``."""

    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def notify(self, event: str, message: str, details: dict[str, Any]) -> None:
        self.events.append((event, message, details))

    def of(self, event: str) -> list[tuple[str, str, dict[str, Any]]]:
        """The alerts of one kind."""
        return [e for e in self.events if e[0] == event]


class CountingEmbedder:
    """Wraps a real ``Embedder``: counts calls and texts itself (``calls``, ``embedded``, ``texts``),
    and, when ``fail_on_call = n``, makes call ``n`` fail *in the middle of its batch*: the first half
    of the texts is really embedded, then ``error()`` is raised (default ``EmbeddingError``), as a
    provider that times out part-way would. Everything else is delegated to the real embedder."""

    def __init__(self, real: Any, *, fail_on_call: int | None = None,
                 error: Callable[[], Exception] | None = None) -> None:
        self.real = real
        self.model_id, self.dimension, self.max_tokens = real.model_id, real.dimension, real.max_tokens
        self.fail_on_call = fail_on_call
        self.error = error or (lambda: EmbeddingError("provider timed out in the middle of the batch"))
        self.calls = 0
        self.embedded = 0
        self.texts: list[str] = []

    @property
    def tokenizer(self) -> Any:
        return self.real.tokenizer

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self.real.count_tokens(texts)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        if self.fail_on_call == self.calls:
            self.real.embed(list(texts)[: max(1, len(texts) // 2)])
            raise self.error()
        out = self.real.embed(texts)
        self.embedded += len(texts)
        self.texts.extend(texts)
        return out


def count_extractions(monkeypatch) -> list[str]:
    """Wrap ``rag_pipeline.extraction.extract`` (the real function still runs) so that the test sees
    the file name of every extraction; returns the list the names are appended to."""
    import rag_pipeline.extraction as extraction

    real = extraction.extract
    calls: list[str] = []

    def counted(data, **kwargs):
        calls.append(kwargs.get("filename") or "")
        return real(data, **kwargs)

    monkeypatch.setattr(extraction, "extract", counted)
    return calls


# --- reading the index (plain SQL, so assertions do not go through the code under test) -------------


def document(conn: Any, source: str, source_id: str) -> dict[str, Any] | None:
    """The ``documents`` row of (source, source_id) as a dict, plus ``stored`` (chunk rows of its
    current version) and ``all_chunks`` (chunk rows of any version); ``None`` when absent."""
    cur = conn.execute(
        """
        SELECT d.*, (SELECT count(*) FROM chunks c WHERE c.document_id = d.id AND c.version = d.version) AS stored,
               (SELECT count(*) FROM chunks c WHERE c.document_id = d.id) AS all_chunks
        FROM documents d WHERE d.source = %s AND d.source_id = %s
        """,
        (source, source_id),
    )
    row = cur.fetchone()
    if row is None:
        return None
    return dict(zip([c.name for c in cur.description], row))


def chunks_of(conn: Any, document_id: int) -> list[tuple[str, int, int, str, np.ndarray]]:
    """``(chunk id, version, ordinal, text, embedding)`` of every chunk row of a document, by ordinal; the
    embedding is the active generation's vector (``store.generations``)."""
    from rag_pipeline.store.generations import active

    rows = conn.execute(
        f"SELECT c.id, c.version, c.ordinal, c.text, e.embedding FROM chunks c JOIN {active(conn).table} e "
        "ON e.chunk_id = c.id WHERE c.document_id = %s ORDER BY c.version, c.ordinal",
        (document_id,),
    ).fetchall()
    return [(r[0], r[1], r[2], r[3], np.asarray(r[4].to_numpy(), dtype=np.float32)) for r in rows]


def run_row(conn: Any, run_id: int) -> dict[str, Any]:
    """The ``sync_runs`` row of ``run_id`` as a dict."""
    cur = conn.execute("SELECT * FROM sync_runs WHERE id = %s", (run_id,))
    row = cur.fetchone()
    assert row is not None, f"no sync_runs row {run_id}"
    return dict(zip([c.name for c in cur.description], row))


def ingest_actions(conn: Any, source: str, source_id: str) -> list[tuple[str, str | None, str | None]]:
    """``(action, status, reason)`` of every ``ingest_log`` row of a document, oldest first."""
    return [tuple(r) for r in conn.execute(
        "SELECT action, status, reason FROM ingest_log WHERE source = %s AND source_id = %s ORDER BY id",
        (source, source_id)).fetchall()]
