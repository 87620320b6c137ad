"""``<name>_source_diff_sensor``: list the source, diff against ``documents``, request the work.

Each tick (every ``interval_s``):

1. list the source (or read its change feed from the cursor; the cursor is only an optimisation: the
   diff is always against the ``documents`` table, so a lost cursor costs one full listing);
2. add ``documents`` partitions for listed documents that lack one (and, after a complete listing, drop
   partitions of documents neither listed nor live in the index);
3. request one ``ingest_documents`` run per new, changed, retry-due or unfinished document, at most
   ``max_inflight_runs`` in flight per source; the run key changes with the content, the listing, the
   index version and the failure count, so each attempt is requested once;
4. when documents vanished or the guard fails, request the ``<name>_inventory`` run: its blocking
   ``deletion_guard`` check decides; the purge is requested only when the guard passes here too.
   Once per situation and day, so a tripped guard alerts daily, not every tick.
"""

import hashlib
import json
import time
from datetime import date

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from rag_pipeline.config import Settings
from rag_pipeline.defs.documents.partitions import document_partition_key, documents
from rag_pipeline.defs.ingestion.resources import EmbedderResource, SettingsResource, SourcesResource, StoreResource
from rag_pipeline.defs.sources.assets import inventory_key, purge_key
from rag_pipeline.defs.sources.config import SourceSpec
from rag_pipeline.pipeline.inventory import cursor_after, list_and_diff
from rag_pipeline.pipeline.plan import Decision, PlannedDocument
from rag_pipeline.sources.base import Source
from rag_pipeline.store import Store
from rag_pipeline.store.staging import document_to_json

IN_FLIGHT = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
             dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
SOURCE_TAG = "rag/source"


def in_flight_partitions(instance: dg.DagsterInstance, name: str) -> set[str]:
    """Partition keys of this source's document runs that are queued or running."""
    runs = instance.get_runs(filters=dg.RunsFilter(tags={SOURCE_TAG: name}, statuses=IN_FLIGHT))
    return {r.tags["dagster/partition"] for r in runs if "dagster/partition" in r.tags}


def _ordered(work: list[PlannedDocument]) -> list[PlannedDocument]:
    return [p for p in work if p.decision != Decision.RETRY] + [p for p in work if p.decision == Decision.RETRY]


def build_source_diff_sensor(spec: SourceSpec, ingest_job: UnresolvedAssetJobDefinition,
                             inventory_job: UnresolvedAssetJobDefinition) -> dg.SensorDefinition:
    """The diff sensor of one configured source (running by default)."""

    @dg.sensor(name=f"{spec.name}_source_diff_sensor", minimum_interval_seconds=spec.interval_s,
               jobs=[ingest_job, inventory_job], default_status=dg.DefaultSensorStatus.RUNNING,
               description=f"Lists {spec.name!r}, diffs it against the index and requests the document runs.")
    def source_diff_sensor(context: dg.SensorEvaluationContext, rag_settings: SettingsResource, store: StoreResource,
                           embedder: EmbedderResource, sources: SourcesResource) -> dg.SensorResult:
        settings = rag_settings.settings()
        emb = embedder.get(settings)
        return source_diff_tick(context, spec, sources.build(spec.name), store.open(settings, emb), settings,
                                ingest_job_name=ingest_job.name, inventory_job_name=inventory_job.name)

    return source_diff_sensor


def source_diff_tick(context: dg.SensorEvaluationContext, spec: SourceSpec, source: Source, index: Store,
                     settings: Settings, *, ingest_job_name: str, inventory_job_name: str) -> dg.SensorResult:
    """One evaluation of the diff sensor for ``source`` (see module docstring); the sensor's whole work
    after its resources are built (benchmarks call it with a generated source)."""
    started = time.perf_counter()
    cursor = json.loads(context.cursor) if context.cursor else {}
    with index.connection() as conn:
        diff = list_and_diff(source, conn, settings, cursor=cursor.get("feed"), count_rows=False)
    listed_at = time.perf_counter()

    prefix = f"{spec.name}:"
    mine = {k for k in context.instance.get_dynamic_partitions(documents.name) if k.startswith(prefix)}
    listed = {document_partition_key(spec.name, d.source_id) for d in diff.documents}
    to_add = sorted(listed - mine)
    to_drop: list[str] = []
    if diff.mode == "full" and diff.complete:
        keep = listed | {document_partition_key(spec.name, i.source_id) for i in diff.vanished}
        to_drop = sorted(mine - keep)

    in_flight = in_flight_partitions(context.instance, spec.name)
    budget = max(spec.max_inflight_runs - len(in_flight), 0)
    requests: list[dg.RunRequest] = []
    waiting = 0
    for p in _ordered(diff.work):
        key = document_partition_key(spec.name, p.doc.source_id)
        if key in in_flight:
            continue
        if len(requests) >= budget:
            waiting += 1
            continue
        requests.append(dg.RunRequest(
            run_key=f"{key}|{p.attempt_token}", partition_key=key, job_name=ingest_job_name,
            run_config={"ops": {"document_markdown": {"config": {"listing": json.dumps(document_to_json(p.doc))}}}},
            tags={SOURCE_TAG: spec.name, "rag/decision": p.decision.value}))

    why = None
    if diff.vanished or not diff.guard.passed:
        why = "guard" if not diff.guard.passed else "deletions"
    elif not context.cursor:
        why = "first listing"
    if why:
        situation = json.dumps([diff.guard.passed, diff.guard.reason, sorted(i.source_id for i in diff.vanished),
                                date.today().isoformat()])
        selection = [inventory_key(spec.name)] + ([purge_key(spec.name)] if diff.guard.passed else [])
        requests.append(dg.RunRequest(
            run_key=f"inventory|{hashlib.sha1(situation.encode()).hexdigest()[:16]}", job_name=inventory_job_name,
            asset_selection=selection,
            tags={SOURCE_TAG: spec.name, "rag/reason": why,
                  **({"rag/guard": str(diff.guard.reason)[:250]} if not diff.guard.passed else {})}))

    partition_requests = []
    if to_add:
        partition_requests.append(documents.build_add_request(to_add))
    if to_drop:
        partition_requests.append(documents.build_delete_request(to_drop))
    summary = diff.summary()
    context.log.info(
        f"{source.name}: {diff.mode} listing of {diff.listed} ({'complete' if diff.complete else 'INCOMPLETE'}), "
        f"{summary}, guard {'passed' if diff.guard.passed else 'FAILED: ' + str(diff.guard.reason)}; "
        f"{len(requests)} run(s) requested, {len(in_flight)} in flight, {waiting} waiting; "
        f"partitions +{len(to_add)} -{len(to_drop)}; listing+diff {listed_at - started:.2f}s, "
        f"tick {time.perf_counter() - started:.2f}s")
    # Documents still waiting for a run slot are not in the next feed page: keep reading from the old
    # position (or keep doing full listings) until every listed document has been requested.
    feed = cursor.get("feed") if waiting else cursor_after(diff, cursor.get("feed"))
    new_cursor = json.dumps({"feed": feed, "listed": diff.listed, "waiting": waiting, "at": round(time.time(), 3)})
    if not requests and not partition_requests:
        return dg.SensorResult(skip_reason=f"{diff.listed} listed, nothing to do", cursor=new_cursor)
    return dg.SensorResult(run_requests=requests, dynamic_partitions_requests=partition_requests,
                           cursor=new_cursor)

