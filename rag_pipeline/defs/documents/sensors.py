"""``document_failure_sensor``: counts failed attempts per document across runs and days.

The steps record their own failures (``pipeline.steps.fail``, attempt key ``dagster:<root run id>``);
this sensor covers the runs that died where no step could record anything (a killed worker, a crash
outside the step, a blocking check). For every failed run that touched ``documents`` partitions it finds
the documents the run could not process (the ``failed_partitions`` metadata of a step's ``dg.Failure``;
otherwise every partition of the run) and records one failed attempt each with the same policy and key
(``store.write.record_failure``), so an attempt the step already counted is not counted again, and a run
and its automatic run retries (``dagster.yaml``: worker crashes only) count once. At ``max_failures``
(default 3) a document becomes ``permanently_failed`` and an alert goes out; the next successful write
resets the count.
"""

import json
from typing import Any

import dagster as dg

from rag_pipeline.defs.documents.partitions import documents, parse_document_partition_key
from rag_pipeline.defs.ingestion.resources import (
    EmbedderResource,
    NotifierResource,
    SettingsResource,
    SourcesResource,
    StoreResource,
)
from rag_pipeline.pipeline.staged import document_for
from rag_pipeline.pipeline.steps import RunContext, finish, notify_permanent
from rag_pipeline.sources.base import SourceError
from rag_pipeline.pipeline.outcome import Action, DocumentOutcome
from rag_pipeline.store import staging
from rag_pipeline.store import write as w
from rag_pipeline.store.index import find_document

DOCUMENT_STEPS = frozenset({"document_markdown", "document_chunks", "document_embeddings"})


def run_partition_keys(run: dg.DagsterRun, instance: dg.DagsterInstance) -> list[str]:
    """The ``documents`` partition keys a run covered: its single partition or its partition range."""
    tags = run.tags
    if "dagster/partition" in tags:
        return [tags["dagster/partition"]]
    start, end = tags.get("dagster/asset_partition_range_start"), tags.get("dagster/asset_partition_range_end")
    if start and end:
        keys = instance.get_dynamic_partitions(documents.name)
        if start in keys and end in keys:
            return keys[keys.index(start): keys.index(end) + 1]
        return [k for k in (start, end) if k]
    return []


def failed_documents(run: dg.DagsterRun, step_failures: list[dg.DagsterEvent], instance: dg.DagsterInstance,
                     run_failure_message: str = "") -> dict[str, str]:
    """``{partition key: reason}`` for the documents a failed run could not process (only keys that parse
    as document partition keys)."""
    out: dict[str, str] = {}
    for event in step_failures:
        if event.step_key not in DOCUMENT_STEPS:
            continue
        data = event.step_failure_data
        user = data.user_failure_data if data else None
        listed = user.metadata.get("failed_partitions") if user else None
        if listed is not None:
            out.update({k: str(v) for k, v in dict(listed.value).items()})
            continue
        reason = (data.error.message.strip() if data and data.error else "") or event.message or "step failed"
        for key in run_partition_keys(run, instance):
            out.setdefault(key, reason[:2000])
    if not step_failures:  # the run died outside any step (e.g. the worker was killed)
        for key in run_partition_keys(run, instance):
            out[key] = f"run failed: {run_failure_message}"[:2000]
    valid = {}
    for key, reason in out.items():
        try:
            parse_document_partition_key(key)
        except ValueError:
            continue
        valid[key] = reason
    return valid


def _listing_of(run: dg.DagsterRun) -> dict[str, Any]:
    config = (run.run_config or {}).get("ops", {}).get("document_markdown", {}).get("config", {})
    try:
        return json.loads(config.get("listing") or "{}")
    except (TypeError, ValueError):
        return {}


@dg.run_failure_sensor(name="document_failure_sensor", default_status=dg.DefaultSensorStatus.RUNNING,
                       minimum_interval_seconds=10)
def document_failure_sensor(context: dg.RunFailureSensorContext, rag_settings: SettingsResource,
                            store: StoreResource, embedder: EmbedderResource, sources: SourcesResource,
                            notifier: NotifierResource) -> dg.SkipReason | None:
    """Record one failed attempt per document of each failed run; alert on newly permanent failures."""
    run = context.dagster_run
    failures = failed_documents(run, context.get_step_failure_events(), context.instance,
                                context.failure_event.message or "")
    if not failures:
        return dg.SkipReason(f"run {run.run_id} touched no document partitions")
    settings = rag_settings.settings()
    index = store.open(settings, embedder.get(settings))
    attempt = f"dagster:{run.tags.get('dagster/root_run_id') or run.run_id}"
    permanent: dict[str, list[DocumentOutcome]] = {}
    listing = _listing_of(run)
    with index.connection() as conn:
        for key, reason in failures.items():
            name, sid = parse_document_partition_key(key)
            try:
                source_name = sources.build(name).name
            except KeyError:
                context.log.warning(f"{key}: source {name!r} is no longer configured; failure not recorded")
                continue
            listed = listing if listing.get("source_id") == sid else {}
            i = find_document(conn, source_name, sid)
            if i is None:  # the run died before the document got its row: only a listed id gets one
                try:
                    doc = document_for(RunContext(conn, source_name, settings, attempt), sources.build(name), sid,
                                       staging.document_from_json(listed) if listed else None)
                except SourceError as exc:
                    context.log.warning(f"{key}: not recorded: {exc}")
                    continue
            document_id = i.id if i else w.ensure_document(conn, source_name, doc)
            result = w.record_failure(
                conn, document_id, attempt_key=attempt, reason=reason, kind="transient",
                max_failures=settings.max_failures, seen_sha256=listed.get("content_sha256"),
                seen_source_version=listed.get("source_version"))
            outcome = DocumentOutcome(sid, None, Action.FAILED, result.status, reason, document_id,
                                      became_permanent=result.became_permanent)
            if result.recorded:
                finish(RunContext(conn, source_name, settings, attempt), outcome)
            context.log.info(f"{key}: status {result.status}, failure_count {result.failure_count}"
                             f"{'' if result.recorded else ' (already counted)'}")
            permanent.setdefault(source_name, []).append(outcome)
    for source_name, outcomes in permanent.items():
        notify_permanent(notifier.get(), source_name, outcomes, max_failures=settings.max_failures)
    return None
