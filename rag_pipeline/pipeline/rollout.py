"""Model rollouts: fill the configured model's embedding generation, then make it active (zero downtime).

``reembed(store, embedder, settings)`` is ``rag-pipeline reembed``: it makes sure the configured embedder
has a generation (``store.generations.ensure``: ``building`` beside the active one), then, in batches of
``settings.sync_batch_documents`` documents (oldest id first, under each document's step lock), embeds the
stored chunk texts of every current document whose version lacks a kept generation
(``steps.stored_version`` -> ``steps.embed_and_write``: the fill path, no new version, texts already
embedded in that generation reused by their SHA-256), and finally activates the generation once it is
complete (``generations.activate_if_complete``). Queries read the active generation the whole time, so
they see the whole corpus with the old model until one transaction switches them to the whole corpus with
the new one. A run that stops half-way (crash, Ctrl-C) resumes where it was: finished documents list the
generation and are not embedded again. The Dagster route is a backfill of ``document_embeddings`` over the
``documents`` partitions (``pipeline.staged.write_embeddings``), which ends with the same activation.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rag_pipeline.config import Settings
from rag_pipeline.embedding.base import Embedder
from rag_pipeline.pipeline import steps
from rag_pipeline.pipeline.locks import document_step
from rag_pipeline.pipeline.outcome import DocumentOutcome
from rag_pipeline.pipeline.plan import Decision
from rag_pipeline.pipeline.steps import RunContext, Work
from rag_pipeline.store import generations as gens
from rag_pipeline.store.db import Store
from rag_pipeline.store.generations import Generation, Progress
from rag_pipeline.store.index import document_from_index, find_document


@dataclass
class ReembedReport:
    """One ``reembed`` run: the ``generation`` filled, its ``progress`` at the end, the document
    ``outcomes`` of this run (``re-embedded`` or a failure with its reason), whether it was ``activated``
    (now or already active), the generations dropped past their rollback window, and the duration (s)."""

    generation: Generation
    progress: Progress
    outcomes: list[DocumentOutcome] = field(default_factory=list)
    activated: bool = False
    dropped: list[Generation] = field(default_factory=list)
    duration_s: float = 0.0
    not_filled: list[DocumentOutcome] = field(default_factory=list)
    """Documents this run tried that the generation still lacks (its embedder failed), with the reason."""

    @property
    def failed(self) -> list[DocumentOutcome]:
        """Documents that failed (their state says why) or that the generation still lacks."""
        return [o for o in self.outcomes if o.status != "completed"] + self.not_filled


def _lacking(conn, generation_id: int, after_id: int, limit: int) -> list[tuple[int, str, str, int | None]]:
    rows = conn.execute(
        "SELECT id, source, source_id, parent_id FROM documents WHERE version > 0 AND deleted_at IS NULL "
        "AND status = 'completed' AND NOT %s = ANY(generations) AND id > %s ORDER BY id LIMIT %s",
        (generation_id, after_id, limit)).fetchall()
    return [tuple(r) for r in rows]


def reembed(store: Store, embedder: Embedder, settings: Settings, *, activate: bool = True,
            progress: Callable[[str, dict[str, Any]], None] | None = None) -> ReembedReport:
    """Fill the configured embedder's generation and activate it when complete (module docstring).

    ``activate=False`` fills only. ``progress(event, data)`` gets ``start`` (``total`` documents to fill),
    ``document`` (``outcome``) and ``embedding`` (``count``). Documents that fail (the embedder is down, a
    chunk over the new model's limit cut again and failing) keep their state's reason and their previous
    generations; the generation then stays incomplete and inactive. Raises ``IndexConfigurationError``-like
    ``generations.DimensionError`` / ``GenerationError`` for an embedder the index cannot hold."""
    started = time.perf_counter()

    def emit(event: str, **data: Any) -> None:
        if progress:
            progress(event, data)

    run_id = f"reembed:{uuid.uuid4().hex[:12]}"
    with store.connection() as conn:
        dropped = gens.drop_expired(conn)
        g = gens.ensure_for(conn, embedder, settings)
        before = gens.progress(conn, g)
        emit("start", total=before.documents - before.documents_done, generation=g.id)
        outcomes: list[DocumentOutcome] = []
        not_filled: list[DocumentOutcome] = []
        after = 0
        while True:
            batch = _lacking(conn, g.id, after, settings.sync_batch_documents)  # ids after the last batch
            if not batch:
                break
            after = batch[-1][0]
            by_source: dict[str, list[tuple[int, str, int | None]]] = {}
            for doc_id, source, source_id, parent_id in batch:
                by_source.setdefault(source, []).append((doc_id, source_id, parent_id))
            for source, docs in by_source.items():
                ctx = RunContext(conn, source, settings, run_id)
                with document_step(conn, source, [sid for _, sid, _ in docs]):
                    prepared = []
                    for doc_id, source_id, parent_id in docs:
                        i = _row(conn, doc_id)
                        if i is None or i.status != "completed" or g.id in i.generations:
                            continue  # changed since the batch was read: its own write covered it
                        work = Work(document_from_index(i), i, Decision.REEMBED, parent_id=parent_id)
                        prepared.append(steps.stored_version(ctx, work, time.perf_counter()))
                    written = [o for _, o in steps.embed_and_write(ctx, prepared, embedder, emit=emit)]
                    filled = {r[0] for r in conn.execute(
                        "SELECT id FROM documents WHERE id = ANY(%s) AND %s = ANY(generations)",
                        ([o.document_id for o in written], g.id))}
                    for o in written:  # done only when the generation now holds the document
                        if o.document_id not in filled and o.status == "completed":
                            o.reason = o.reason or f"not written to embedding generation {g.id}"
                            not_filled.append(o)
                outcomes += written
                for outcome in written:  # outside the locks: a callback may run a sync of the source
                    emit("document", outcome=outcome)
        activated = None
        if activate:
            activated = gens.activate_if_complete(conn, g.model, keep_days=settings.generation_keep_days)
        g = gens.get(conn, g.id)
        return ReembedReport(g, gens.progress(conn, g), outcomes, g.state == "active" or activated is not None,
                             dropped, time.perf_counter() - started, not_filled)


def _row(conn, document_id: int):
    """The ``IndexedDocument`` of ``document_id`` (top-level or attachment), with its stored chunk rows."""
    row = conn.execute("SELECT source, source_id, parent_id FROM documents WHERE id = %s", (document_id,)).fetchone()
    if row is None:
        return None
    if row[2] is None:
        return find_document(conn, row[0], row[1])
    from rag_pipeline.store.index import children_of

    return next((c for c in children_of(conn, row[2]) if c.id == document_id), None)
