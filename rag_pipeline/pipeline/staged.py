"""The per-document steps run one at a time, with the work staged in PostgreSQL between them.

This is how the Dagster assets ``document_markdown`` -> ``document_chunks`` -> ``document_embeddings`` run
``pipeline.steps`` (plain Python: tests call it without Dagster). Each function holds the locks of a
per-document step (``pipeline.locks.document_step``), calls the same step function the in-memory route
calls, and moves its result through ``store.staging``. Outcomes are ``DocumentOutcome`` (the document
ended in this step) or ``Prepared`` (handed to the next step).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from rag_pipeline.embedding.base import Embedder
from rag_pipeline.pipeline import steps
from rag_pipeline.pipeline.locks import document_step
from rag_pipeline.pipeline.outcome import Action, DocumentOutcome
from rag_pipeline.pipeline.plan import IDLE, Decision, plan_document
from rag_pipeline.pipeline.steps import Prepared, RunContext, Work
from rag_pipeline.sources.base import Inventory, Source, SourceDocument, SourceError
from rag_pipeline.store import staging
from rag_pipeline.store.generations import activate_if_complete, active, kept
from rag_pipeline.store.index import IndexedDocument, document_from_index, find_document


def work_for(ctx: RunContext, doc: SourceDocument) -> Work:
    """The work for one document asked for by id (a sensor's run, a UI materialization, a backfill): the
    plan's decision against its row, where "nothing to do" becomes ``CHECK`` (someone asked: fetch and
    compare)."""
    i = find_document(ctx.conn, ctx.source, doc.source_id)
    decision = plan_document(doc, i, ctx.settings, generations=[g.id for g in kept(ctx.conn)])
    return Work(doc, i, Decision.CHECK if decision in IDLE else decision)


_LISTING_TTL_S = 60.0
_fresh: dict[tuple[str, str], tuple[float, Inventory]] = {}
"""The last full listing taken by ``document_for`` (key: run id, source), reused for the other ids of the
same run's batch for ``_LISTING_TTL_S`` seconds."""


def _full_listing(ctx: RunContext, source: Source) -> Inventory:
    key = (ctx.run_id, ctx.source)
    hit = _fresh.get(key)
    if hit is not None and time.monotonic() - hit[0] < _LISTING_TTL_S:
        return hit[1]
    inventory = source.list_documents()
    _fresh.clear()
    _fresh[key] = (time.monotonic(), inventory)
    return inventory


def _refused(ctx: RunContext, source_id: str, why: str | None = None) -> SourceError:
    return SourceError(f"{source_id!r} is not listed by source {ctx.source}: refused" + (f" ({why})" if why else ""),
                       transient=False)


def _ask_source(ctx: RunContext, source_id: str, ask: Callable[[], SourceDocument | None]) -> SourceDocument | None:
    """``ask()`` (the source's lookup or its listing) with its errors as ``SourceError``: a source's refusal
    of the id stays terminal, anything else is transient (the id could not be checked)."""
    try:
        return ask()
    except SourceError as exc:
        if not exc.transient:
            raise _refused(ctx, source_id, str(getattr(exc, "why", None) or exc)) from exc
        raise SourceError(f"cannot check that source {ctx.source} lists {source_id!r}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - a connector's failure, whatever its type: retried later
        raise SourceError(f"cannot check that source {ctx.source} lists {source_id!r}: "
                          f"{type(exc).__name__}: {exc}") from exc


def document_for(ctx: RunContext, source: Source, source_id: str, listing: SourceDocument | None) -> SourceDocument:
    """The document a per-document run works on; only an id its source lists (or listed) is ever worked on.

    In order: a live index row (a document already known: the ``listing`` passed with the run when it names
    this id, else the row's own view); else the source vouches for the id: a source with a per-id
    ``lookup(source_id)`` (the local folder) is asked, a source without one gets one full listing (reused
    for the other ids of the run for ``_LISTING_TTL_S``). A run's ``listing`` (the sensor passes one;
    anyone can pass one from the Launchpad) for an id the index does not know is used only when the
    source's ``lookup`` does not refuse the id (it may name a file that vanished since the sensor listed
    it: the fetch then reports it); for a source without ``lookup`` it is trusted, the fetch being
    confined by the connector itself (credentials, configured roots).

    Raises ``SourceError(transient=False)`` ``"'<id>' is not listed by source <name>: refused[ (<why>)]"``
    for an id none of these gives (nothing is fetched, and the caller must create no ``documents`` row for
    it), and a transient ``SourceError`` when the source could not be asked (listing failed or incomplete).
    """
    passed = listing if listing is not None and listing.source_id == source_id else None
    i = find_document(ctx.conn, ctx.source, source_id)
    if i is not None and i.status != "deleted":
        return passed or document_from_index(i)
    lookup = getattr(source, "lookup", None)
    if callable(lookup):
        found = _ask_source(ctx, source_id, lambda: lookup(source_id))
        if found is not None or passed is not None:
            return passed or found
        raise _refused(ctx, source_id)
    if passed is not None:
        return passed
    inventory = _ask_source(ctx, source_id, lambda: _full_listing(ctx, source))
    found = next((d for d in inventory.documents if d.source_id == source_id), None)
    if found is not None:
        return found
    if not inventory.complete:
        raise SourceError(f"cannot check that source {ctx.source} lists {source_id!r}: listing incomplete "
                          f"({inventory.incomplete_reason or 'unknown reason'})")
    raise _refused(ctx, source_id)


def stage_markdown(ctx: RunContext, source: Source, doc: SourceDocument) -> Prepared | DocumentOutcome:
    """``document_markdown``: fetch, hash, extract (``steps.fetch_and_extract``); stage the Markdown.
    Extraction is reused from a stage of the same content."""
    with document_step(ctx.conn, ctx.source, [doc.source_id]):
        work = work_for(ctx, doc)

        def staged(sha: str):
            s = staging.load_stage(ctx.conn, work.indexed.id) if work.indexed else None
            return s.extraction if s is not None and s.content_sha256 == sha else None

        result = steps.fetch_and_extract(ctx, source, work, reuse=staged)
        if isinstance(result, Prepared) and not result.reembed:
            staging.save_stage(ctx.conn, result.document_id, content_sha256=result.sha, listing=result.work.doc,
                               extraction=result.extraction)
        elif isinstance(result, DocumentOutcome) and result.document_id is not None:
            staging.clear_stage(ctx.conn, [result.document_id])
        return result


def _prepared(ctx: RunContext, source_id: str) -> tuple[IndexedDocument | None, Prepared | None, DocumentOutcome | None]:
    """The document's row, and its staged work as ``Prepared`` or the outcome saying why there is none."""
    i = find_document(ctx.conn, ctx.source, source_id)
    if i is None or i.status == "deleted":
        return i, None, DocumentOutcome(source_id, None, Action.UNCHANGED, i.status if i else None,
                                        "not in the index", i.id if i else None)
    staged = staging.load_stage(ctx.conn, i.id)
    if staged is None:
        return i, None, DocumentOutcome(source_id, i.title, Action.UNCHANGED, i.status,
                                        "nothing staged: no new content", i.id, i.version,
                                        chunk_count=i.stored_chunks if i.status == "completed" else None)
    work = Work(staged.listing, i, Decision.REPAIR if i.status == "completed" and staged.content_sha256 ==
                i.content_sha256 else Decision.CHANGE)
    return i, Prepared(work, i.id, staged.content_sha256, staged.extraction, time.perf_counter(), staged.chunks), None


def stage_chunks(ctx: RunContext, source_id: str, embedder: Embedder) -> Prepared | DocumentOutcome:
    """``document_chunks``: chunk the staged Markdown (``steps.chunk``) and stage the chunks."""
    with document_step(ctx.conn, ctx.source, [source_id]):
        _, p, done = _prepared(ctx, source_id)
        if p is None:
            return done
        result = steps.chunk(ctx, replace(p, chunks=None), embedder)
        if isinstance(result, Prepared):
            staging.save_stage_chunks(ctx.conn, result.document_id, result.chunks or [])
        else:
            staging.clear_stage(ctx.conn, [p.document_id])
        return result


def write_embeddings(ctx: RunContext, source_ids: Sequence[str], embedder: Embedder, *,
                     force: bool = False) -> dict[str, DocumentOutcome]:
    """``document_embeddings``: embed and swap (``steps.embed_and_write``) every staged document of
    ``source_ids``, re-embed completed ones whose current version lacks a kept embedding generation (or all
    with ``force``) from their stored chunk texts, then ingest the written documents' attachments
    (``steps.process``), and activate the configured model's generation once it is complete. One outcome per
    id; attachments' outcomes are logged, not returned."""
    ids = list(dict.fromkeys(source_ids))
    out: dict[str, DocumentOutcome] = {}
    kept_ids = {g.id for g in kept(ctx.conn)}
    with document_step(ctx.conn, ctx.source, ids):
        ready: list[Prepared] = []
        for sid in ids:
            i, p, done = _prepared(ctx, sid)
            if p is not None and p.chunks is not None:
                ready.append(p)
                continue
            if i is not None and i.status == "completed" and i.version > 0 and (
                    force or not kept_ids <= set(i.generations)):
                ready.append(steps.stored_version(ctx, Work(document_from_index(i), i, Decision.REEMBED),
                                                  time.perf_counter()))
            elif p is not None:  # Markdown staged but never chunked: the chunks step did not run
                out[sid] = DocumentOutcome(sid, p.work.doc.title, Action.UNCHANGED, i.status if i else None,
                                           "Markdown staged but not chunked yet", p.document_id)
            else:
                out[sid] = done or DocumentOutcome(sid, None, Action.UNCHANGED, None, "not in the index")
                if i is not None and i.status == "completed":
                    out[sid].reason, out[sid].model = "embeddings up to date", active(ctx.conn).model
        children: list[Work] = []
        for p, outcome in steps.embed_and_write(ctx, ready, embedder):
            out[p.work.doc.source_id] = outcome
            if outcome.status == "completed":
                staging.clear_stage(ctx.conn, [p.document_id])
                children += steps.attachments(ctx, p)
        if children:
            steps.process(ctx, None, children, embedder)
    # a backfill of this asset over every partition is the Dagster route of a model rollout (``pipeline.rollout``)
    activate_if_complete(ctx.conn, embedder.model_id, keep_days=ctx.settings.generation_keep_days)
    return {sid: out[sid] for sid in ids}


def purge_deletions(ctx: RunContext) -> list[DocumentOutcome]:
    """``purge_deleted_documents``: tombstone the source's pending deletions that are still valid
    (``store.staging.claim_pending_deletions``) with ``steps.delete``, under the documents' locks."""
    claimed = staging.claim_pending_deletions(ctx.conn, ctx.source)
    with document_step(ctx.conn, ctx.source, [i.source_id for i in claimed]):
        return steps.delete(ctx, claimed)
