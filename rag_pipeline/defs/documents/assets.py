"""Per-document assets: ``document_markdown`` -> ``document_chunks`` -> ``document_embeddings``.

Each body reads its partition keys and calls ``rag_pipeline.ingest``; the data (Markdown, chunk texts,
vectors) lives in PostgreSQL, never in an IO manager. A run covers one document (sensor runs) or a batch
of them (backfills, ``BACKFILL_POLICY``); metadata is recorded per document either way. Transient
failures fail the step after the other documents of the batch were processed, naming the failed
partitions in the failure's metadata (``failed_partitions``) for ``document_failure_sensor``.
"""

import json
import warnings
from collections.abc import Mapping

import dagster as dg

from rag_pipeline import ingest
from rag_pipeline.defs.documents.partitions import documents, parse_document_partition_key
from rag_pipeline.defs.ingestion.resources import (
    EmbedderResource,
    NotifierResource,
    SettingsResource,
    SourcesResource,
    StoreResource,
)
from rag_pipeline.ingest import StepOutcome
from rag_pipeline.sources.base import SourceDocument
from rag_pipeline.store import checks as check_sql
from rag_pipeline.store import staging
from rag_pipeline.store.index import document_from_index

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


def outcome_metadata(o: StepOutcome) -> dict[str, object]:
    """The metadata every per-document materialization carries (same keys for every step)."""
    return {
        "action": o.action, "status": o.status or "", "skip_reason": o.reason or "",
        "characters": o.char_count, "pages": o.page_count,
        "characters_per_page": round(o.chars_per_page, 1) if o.chars_per_page is not None else None,
        "chunks": o.chunk_count, "model": o.model or "", "version": o.version,
        "embedded": o.embedded, "reused": o.reused, "duration_s": round(o.duration_s, 3),
        "preview": dg.MetadataValue.md(o.preview or "_(no preview)_"),
        **({f"stat_{k}": v for k, v in o.stats.items() if isinstance(v, (int, float, str, bool))}),
    }


def _record(context: dg.AssetExecutionContext, outcomes: Mapping[str, StepOutcome], notifier: NotifierResource,
            source_names: Mapping[str, str]) -> None:
    """Attach per-partition metadata, alert on newly permanent failures, fail on transient errors."""
    for key, o in outcomes.items():
        if not o.is_error:
            context.add_asset_metadata(outcome_metadata(o), partition_key=key)
    permanent = [(k, o) for k, o in outcomes.items() if o.became_permanent]
    if permanent:
        alert = notifier.get()
        for key, o in permanent:
            name = parse_document_partition_key(key)[0]
            alert.notify("permanently_failed", f"{source_names[name]}: {o.source_id} became permanently_failed: {o.reason}",
                         {"source": source_names[name], "documents": [{"source_id": o.source_id, "reason": o.reason}]})
    errors = {k: o.reason or "error" for k, o in outcomes.items() if o.is_error}
    if errors:
        first = next(iter(errors.items()))
        raise dg.Failure(description=f"{len(errors)} of {len(outcomes)} document(s) failed; first {first[0]}: {first[1]}",
                         metadata={"failed_partitions": dg.MetadataValue.json(errors)})


def _listed_or_indexed(conn, source_name: str, sid: str, listing: SourceDocument | None) -> SourceDocument | None:
    """The listing passed with the run, else the document as the index knows it, else None."""
    if listing is not None and listing.source_id == sid:
        return listing
    i = staging.find_document(conn, source_name, sid)
    return document_from_index(i) if i else None


def _by_source(keys: list[str]) -> dict[str, list[tuple[str, str]]]:
    grouped: dict[str, list[tuple[str, str]]] = {}
    for key in keys:
        name, sid = parse_document_partition_key(key)
        grouped.setdefault(name, []).append((key, sid))
    return grouped


@dg.asset(partitions_def=documents, group_name=GROUP, kinds={"python", "postgres"}, retry_policy=RETRY_POLICY,
          backfill_policy=BACKFILL_POLICY)
def document_markdown(context: dg.AssetExecutionContext, config: MarkdownConfig, rag_settings: SettingsResource,
                      store: StoreResource, embedder: EmbedderResource, sources: SourcesResource,
                      notifier: NotifierResource) -> dg.MaterializeResult:
    """Each document's content as cleaned Markdown (fetched, hashed, extracted; staged in PostgreSQL)."""
    settings = rag_settings.settings()
    index = store.open(settings, embedder.get(settings))
    listing = staging.document_from_json(json.loads(config.listing)) if config.listing else None
    outcomes: dict[str, StepOutcome] = {}
    names: dict[str, str] = {}
    with index.connection() as conn:
        for name, items in _by_source(context.partition_keys).items():
            source = sources.build(name)
            names[name] = source.name
            docs = {sid: _listed_or_indexed(conn, source.name, sid, listing) for _, sid in items}
            if any(d is None for d in docs.values()):  # never indexed and no listing given: list once
                docs.update(ingest.listed_documents(source, [sid for sid, d in docs.items() if d is None]))
            for key, sid in items:
                outcomes[key] = ingest.stage_markdown(conn, source, docs[sid], settings)
    _record(context, outcomes, notifier, names)
    return dg.MaterializeResult()


@dg.asset(partitions_def=documents, group_name=GROUP, kinds={"python", "postgres"}, deps=[document_markdown],
          retry_policy=RETRY_POLICY, backfill_policy=BACKFILL_POLICY)
def document_chunks(context: dg.AssetExecutionContext, rag_settings: SettingsResource, store: StoreResource,
                    embedder: EmbedderResource, sources: SourcesResource,
                    notifier: NotifierResource) -> dg.MaterializeResult:
    """Each document's chunk texts, cut for the embedding model's token limit (staged in PostgreSQL)."""
    settings = rag_settings.settings()
    emb = embedder.get(settings)
    index = store.open(settings, emb)
    outcomes: dict[str, StepOutcome] = {}
    names: dict[str, str] = {}
    with index.connection() as conn:
        for name, items in _by_source(context.partition_keys).items():
            names[name] = sources.build(name).name
            for key, sid in items:
                outcomes[key] = ingest.stage_chunks(conn, names[name], sid, emb, settings)
    _record(context, outcomes, notifier, names)
    return dg.MaterializeResult()


@dg.asset(partitions_def=documents, group_name=GROUP, kinds={"pytorch", "postgres"}, deps=[document_chunks],
          retry_policy=RETRY_POLICY, backfill_policy=BACKFILL_POLICY, check_specs=[CHUNK_COUNT_COMPLETE])
def document_embeddings(context: dg.AssetExecutionContext, config: EmbeddingsConfig, rag_settings: SettingsResource,
                        store: StoreResource, embedder: EmbedderResource, sources: SourcesResource,
                        notifier: NotifierResource) -> dg.MaterializeResult:
    """Each document's searchable version: vectors written with its chunks in one swap transaction
    (re-embeds from stored chunk texts when the configured model changed)."""
    settings = rag_settings.settings()
    emb = embedder.get(settings)
    index = store.open(settings, emb)
    outcomes: dict[str, StepOutcome] = {}
    names: dict[str, str] = {}
    with index.connection() as conn:
        for name, items in _by_source(context.partition_keys).items():
            names[name] = sources.build(name).name
            written = ingest.write_embeddings(conn, names[name], [sid for _, sid in items], emb, settings,
                                              force=config.force)
            outcomes.update({key: o for (key, _), o in zip(items, written, strict=True)})
        counts = check_sql.chunk_counts(conn, [o.document_id for o in outcomes.values() if o.document_id])
    results = {key: _chunk_check(o, counts.get(o.document_id or -1)) for key, o in outcomes.items()}
    try:
        _record(context, outcomes, notifier, names)
    finally:
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


def _chunk_check(o: StepOutcome, count: check_sql.ChunkCount | None) -> dg.AssetCheckResult:
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
