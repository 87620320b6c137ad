"""Per-document assets: ``document_markdown`` -> ``document_chunks`` -> ``document_embeddings``.

Each body reads its partition keys and calls ``rag_pipeline.pipeline.staged`` (the steps of
``pipeline.steps`` with the work staged in PostgreSQL, never in an IO manager). A run covers one document
(sensor runs) or a batch (backfills, ``BACKFILL_POLICY``); metadata is recorded per document either way.
Failures are recorded by the steps themselves (the run's root id is the attempt key); a transient one
fails the step after the other documents of the batch were processed, naming the failed partitions in
the failure's metadata (``failed_partitions``), so Dagster's retry policy and the UI see it.
"""

import json
import warnings
from collections.abc import Callable, Mapping

import dagster as dg

from rag_pipeline.defs.documents.partitions import documents, parse_document_partition_key, resolve_partitions
from rag_pipeline.defs.ingestion.resources import (
    EmbedderResource,
    NotifierResource,
    SettingsResource,
    SourcesResource,
    StoreResource,
)
from rag_pipeline.pipeline import staged, steps
from rag_pipeline.pipeline.outcome import Action, DocumentOutcome
from rag_pipeline.pipeline.steps import Prepared, RunContext
from rag_pipeline.sources.base import SourceDocument, SourceError
from rag_pipeline.store import checks as check_sql
from rag_pipeline.store.staging import document_from_json

RETRY_POLICY = dg.RetryPolicy(max_retries=2, delay=1.0, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS)
"""Transient errors inside a run: retried after ~1 s and ~2 s (+-jitter); then the run fails and
``document_failure_sensor`` counts one failed attempt per document."""

BACKFILL_POLICY = dg.BackfillPolicy.multi_run(max_partitions_per_run=25)
"""Backfills run 25 documents per run (one model load, one embedding call per batch)."""

GROUP = "documents"

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # per-partition asset checks are a preview feature in Dagster 1.13
    CHUNK_COUNT_COMPLETE = dg.AssetCheckSpec(
        "chunk_count_complete", asset="document_embeddings", blocking=True, partitions_def=documents,
        description="The index holds exactly the expected chunk rows of the document's current version.")


class MarkdownConfig(dg.Config):
    """``listing``: the listed document as JSON (``store.staging.document_to_json``), passed by the sensor
    for one-document runs; empty = rebuild it from the index (UI materializations, backfills)."""

    listing: str = ""


class EmbeddingsConfig(dg.Config):
    """``force``: re-embed completed documents even when their chunks already use the configured model."""

    force: bool = False


def outcome_metadata(o: DocumentOutcome | Prepared) -> dict[str, object]:
    """The metadata every per-document materialization carries (same keys for every step)."""
    if isinstance(o, Prepared):
        x = o.extraction
        tokens = [c.token_count for c in o.chunks or ()]
        o = DocumentOutcome(o.work.doc.source_id, o.work.doc.title, "chunked" if o.chunks else "extracted",
                            o.work.indexed.status if o.work.indexed else "pending", None, o.document_id,
                            chunk_count=len(tokens) if o.chunks else None, char_count=x.char_count,
                            page_count=x.page_count, preview=(o.chunks[0].text if o.chunks else x.markdown)[:600],
                            stats={**x.stats, **({"max_tokens": max(tokens)} if tokens else {})})
    return {
        "action": str(o.action), "status": o.status or "", "skip_reason": o.reason or "",
        "characters": o.char_count, "pages": o.page_count,
        "characters_per_page": round(o.chars_per_page, 1) if o.chars_per_page is not None else None,
        "chunks": o.chunk_count, "model": o.model or "", "version": o.version,
        "embedded": o.embedded, "reused": o.reused, "duration_s": round(o.duration_s, 3),
        "preview": dg.MetadataValue.md(o.preview or "_(no preview)_"),
        **({f"stat_{k}": v for k, v in o.stats.items() if isinstance(v, (int, float, str, bool))}),
    }


def run_context(context: dg.AssetExecutionContext, conn, source: str, settings) -> RunContext:
    """The steps' ``RunContext`` for this Dagster run: its root run id is the attempt key, so a step retried
    inside the run, or the run retried, counts one failed attempt."""
    root = context.run.tags.get("dagster/root_run_id") or context.run.run_id
    return RunContext(conn, source, settings, f"dagster:{root}")


def run_steps(context: dg.AssetExecutionContext, rag_settings: SettingsResource, store: StoreResource,
              embedder: EmbedderResource, sources: SourcesResource, notifier: NotifierResource,
              step: Callable[[RunContext, object, list[str]], Mapping[str, DocumentOutcome | Prepared]], *,
              listing: SourceDocument | None = None) -> None:
    """Run ``step(ctx, source, source_ids)`` per source of this run's partitions (digest keys resolved with
    ``partitions.resolve_partitions``, the run's ``listing`` first), record per-partition metadata, alert on
    newly permanent failures, and fail the step when a document failed transiently."""
    settings = rag_settings.settings()
    index = store.open(settings, embedder.get(settings))
    outcomes: dict[str, DocumentOutcome | Prepared] = {}
    with index.connection() as conn:
        for name, keys in _by_source(context.partition_keys).items():
            source = sources.build(name)
            ids, refused = resolve_partitions(conn, source, keys, listing)
            outcomes.update({key: DocumentOutcome(key, None, Action.FAILED, None, why, transient=why.startswith("cannot"))
                             for key, why in refused.items()})
            done = step(run_context(context, conn, source.name, settings), source, list(dict.fromkeys(ids.values())))
            outcomes.update({key: done[sid] for key, sid in ids.items()})
            steps.notify_permanent(notifier.get(), source.name, [o for o in done.values()
                                                                 if isinstance(o, DocumentOutcome)],
                                   max_failures=settings.max_failures)
    errors = {k: o.reason or "error" for k, o in outcomes.items() if isinstance(o, DocumentOutcome) and o.transient}
    for key, o in outcomes.items():
        if key not in errors:
            context.add_asset_metadata(outcome_metadata(o), partition_key=key)
    if errors:
        first = next(iter(errors.items()))
        raise dg.Failure(description=f"{len(errors)} of {len(outcomes)} document(s) failed; first {first[0]}: {first[1]}",
                         metadata={"failed_partitions": dg.MetadataValue.json(errors)})


def _by_source(keys: list[str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for key in keys:
        grouped.setdefault(parse_document_partition_key(key)[0], []).append(key)
    return grouped


@dg.asset(partitions_def=documents, group_name=GROUP, kinds={"python", "postgres"}, retry_policy=RETRY_POLICY,
          backfill_policy=BACKFILL_POLICY)
def document_markdown(context: dg.AssetExecutionContext, config: MarkdownConfig, rag_settings: SettingsResource,
                      store: StoreResource, embedder: EmbedderResource, sources: SourcesResource,
                      notifier: NotifierResource) -> dg.MaterializeResult:
    """Each document's content as cleaned Markdown (fetched, hashed, extracted; staged in PostgreSQL)."""
    listing = document_from_json(json.loads(config.listing)) if config.listing else None

    def markdown(ctx, source, ids):
        out = {}
        for sid in ids:
            try:  # only an id its source lists (or listed) is worked on: no row for anything else
                doc = staged.document_for(ctx, source, sid, listing)
            except SourceError as exc:
                out[sid] = DocumentOutcome(sid, None, Action.FAILED, None, str(exc), transient=exc.transient)
                continue
            out[sid] = staged.stage_markdown(ctx, source, doc)
        return out

    run_steps(context, rag_settings, store, embedder, sources, notifier, markdown, listing=listing)
    return dg.MaterializeResult()


@dg.asset(partitions_def=documents, group_name=GROUP, kinds={"python", "postgres"}, deps=[document_markdown],
          retry_policy=RETRY_POLICY, backfill_policy=BACKFILL_POLICY)
def document_chunks(context: dg.AssetExecutionContext, rag_settings: SettingsResource, store: StoreResource,
                    embedder: EmbedderResource, sources: SourcesResource,
                    notifier: NotifierResource) -> dg.MaterializeResult:
    """Each document's chunk texts, cut for the embedding model's token limit (staged in PostgreSQL)."""
    emb = embedder.get(rag_settings.settings())
    run_steps(context, rag_settings, store, embedder, sources, notifier,
              lambda ctx, source, ids: {sid: staged.stage_chunks(ctx, sid, emb) for sid in ids})
    return dg.MaterializeResult()


@dg.asset(partitions_def=documents, group_name=GROUP, kinds={"pytorch", "postgres"}, deps=[document_chunks],
          retry_policy=RETRY_POLICY, backfill_policy=BACKFILL_POLICY, check_specs=[CHUNK_COUNT_COMPLETE])
def document_embeddings(context: dg.AssetExecutionContext, config: EmbeddingsConfig, rag_settings: SettingsResource,
                        store: StoreResource, embedder: EmbedderResource, sources: SourcesResource,
                        notifier: NotifierResource) -> dg.MaterializeResult:
    """Each document's searchable version: vectors written with its chunks in one swap transaction
    (re-embeds from stored chunk texts when the configured model changed)."""
    emb = embedder.get(rag_settings.settings())
    written: dict[str, DocumentOutcome] = {}

    def step(ctx, source, ids):
        done = staged.write_embeddings(ctx, ids, emb, force=config.force)
        written.update(done)
        return done

    try:
        run_steps(context, rag_settings, store, embedder, sources, notifier, step)
    finally:
        results = _chunk_checks(store.open(rag_settings.settings(), emb), context.partition_keys, written)
        if len(results) > 1:  # a batch: one evaluation per partition, and a summary for the step
            for key, result in results.items():
                context.log_event(dg.AssetCheckEvaluation(
                    asset_key=CHUNK_COUNT_COMPLETE.asset_key, check_name=CHUNK_COUNT_COMPLETE.name,
                    passed=result.passed, metadata=result.metadata, partition=key))
    if len(results) == 1:
        return dg.MaterializeResult(check_results=list(results.values()))
    failed = sorted(k for k, r in results.items() if not r.passed)
    return dg.MaterializeResult(check_results=[dg.AssetCheckResult(
        passed=not failed, metadata={"documents": len(results), "failed": len(failed),
                                     "failed_partitions": dg.MetadataValue.json(failed[:50])})])


def _chunk_checks(index, keys: list[str], written: Mapping[str, DocumentOutcome]) -> dict[str, dg.AssetCheckResult]:
    with index.connection() as conn:
        counts = check_sql.chunk_counts(conn, [o.document_id for o in written.values() if o.document_id])
    ids = {key: parse_document_partition_key(key)[1] for key in keys}
    return {key: _chunk_check(counts.get(written[sid].document_id or -1) if sid in written else None)
            for key, sid in ids.items()}


def _chunk_check(count: check_sql.ChunkCount | None) -> dg.AssetCheckResult:
    if count is None:
        return dg.AssetCheckResult(passed=True, metadata={"status": "not in the index", "expected": None,
                                                          "stored": 0, "other_versions": 0})
    return dg.AssetCheckResult(
        passed=count.passed,
        metadata={"status": count.status, "version": count.version, "expected": count.expected,
                  "stored": count.stored, "other_versions": count.other_versions},
        description=None if count.passed else (
            f"version {count.version}: {count.stored} chunk rows stored, {count.expected} expected, "
            f"{count.other_versions} of other versions"))
