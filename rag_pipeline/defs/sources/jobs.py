"""Per-source jobs: the inventory + guarded purge, and the daily full reconciliation (with its schedule)."""

from typing import Optional

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from rag_pipeline.defs.documents.partitions import document_partition_key, documents
from rag_pipeline.defs.ingestion.resources import (
    EmbedderResource,
    NotifierResource,
    SettingsResource,
    SourcesResource,
    StoreResource,
)
from rag_pipeline.defs.sources.assets import inventory_key, purge_key
from rag_pipeline.defs.sources.config import SourceSpec
from rag_pipeline.pipeline.sync import EXIT_GUARD, sync_source


class ReconcileConfig(dg.Config):
    """``allow_mass_delete``: the explicit, logged override of the deletion fraction; ``confirm_delete``: the
    exact number of deletions expected (also allows an emptied source), as ``rag-pipeline sync --confirm-delete``."""

    allow_mass_delete: bool = False
    confirm_delete: Optional[int] = None


def build_inventory_job(spec: SourceSpec) -> UnresolvedAssetJobDefinition:
    """``<name>_inventory``: list the source, judge the guard, purge what vanished (when it passed)."""
    return dg.define_asset_job(f"{spec.name}_inventory",
                               selection=dg.AssetSelection.assets(inventory_key(spec.name), purge_key(spec.name)),
                               executor_def=dg.in_process_executor,
                               description=f"Inventory of {spec.name!r}, deletion guard, guarded purge.")


def build_reconcile_job(spec: SourceSpec) -> dg.JobDefinition:
    """``<name>_reconcile``: ``pipeline.sync.sync_source(full=True)``, what ``rag-pipeline sync --full`` runs:
    adds, updates, retries, repairs and guarded deletions in one run; fails when the guard trips."""

    @dg.op(name=f"{spec.name}_full_reconciliation", out=dg.Out(dg.Nothing))
    def full_reconciliation(context: dg.OpExecutionContext, config: ReconcileConfig, rag_settings: SettingsResource,
                            store: StoreResource, embedder: EmbedderResource, sources: SourcesResource,
                            notifier: NotifierResource) -> None:
        settings = rag_settings.settings()
        emb = embedder.get(settings)
        source = sources.build(spec.name)
        report = sync_source(source, store.open(settings, emb), emb, settings, full=True,
                             allow_mass_delete=config.allow_mass_delete, confirm_delete=config.confirm_delete,
                             notifier=notifier.get())
        existing = set(context.instance.get_dynamic_partitions(documents.name))
        for key in (document_partition_key(spec.name, sid) for sid in report.deleted):
            if key in existing:
                context.instance.delete_dynamic_partition(documents.name, key)
        context.add_output_metadata({"source": source.name, "listed": report.guard.listed, "lock": report.lock,
                                     "embedded": report.embedded, "guard_passed": report.guard.passed,
                                     "guard_reason": report.guard.reason or "", "deleted": len(report.deleted),
                                     **{f"count_{k}": v for k, v in report.counts().items()}})
        if report.exit_code == EXIT_GUARD:
            raise dg.Failure(description=report.listing_error or f"deletion guard: {report.guard.reason}",
                             allow_retries=False)

    @dg.job(name=f"{spec.name}_reconcile", executor_def=dg.in_process_executor, tags={"rag/reconcile": spec.name},
            description=f"Full reconciliation of {spec.name!r}: the last line of defence, daily.")
    def reconcile_job() -> None:
        full_reconciliation()

    return reconcile_job


def build_reconcile_schedule(spec: SourceSpec, job: dg.JobDefinition) -> dg.ScheduleDefinition:
    """``<name>_daily_reconciliation`` on ``spec.reconcile_cron`` (running by default)."""
    return dg.ScheduleDefinition(name=f"{spec.name}_daily_reconciliation", job=job,
                                 cron_schedule=spec.reconcile_cron, default_status=dg.DefaultScheduleStatus.RUNNING)
