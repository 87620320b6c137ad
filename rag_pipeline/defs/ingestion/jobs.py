"""The sync job: one op that runs ``rag_pipeline.sync.sync_source`` with the configured resources.

The CLI's ``rag-pipeline sync`` executes this same job in-process, so there is one code path.
"""

# No ``from __future__ import annotations`` here: Dagster reads the op's config/resource annotations.
from typing import Any

import dagster as dg

from rag_pipeline.defs.ingestion.resources import EmbedderResource, SettingsResource, SourceResource, StoreResource
from rag_pipeline.sync import SyncReport, sync_source


class SyncConfig(dg.Config):
    """Run options: ``full`` listing + reconciliation; ``allow_mass_delete`` override; ``wait_for_lock``."""

    full: bool = False
    allow_mass_delete: bool = False
    wait_for_lock: bool = True


@dg.op(out=dg.Out(dg.Nothing))
def sync_source_op(context: dg.OpExecutionContext, config: SyncConfig, rag_settings: SettingsResource,
                   embedder: EmbedderResource, store: StoreResource, source: SourceResource) -> None:
    """Sync the configured source into the index; fails the run when the deletion guard trips."""
    settings = rag_settings.settings()
    emb = embedder.get(settings)
    index = store.open(settings, emb)
    src = source.build()
    progress = getattr(context.resources, "progress", None)
    report = sync_source(src, index, emb, settings, full=config.full, allow_mass_delete=config.allow_mass_delete,
                         wait_for_lock=config.wait_for_lock, progress=progress if callable(progress) else None)
    _REPORTS[context.run_id] = report
    context.add_output_metadata({
        "source": src.name, "mode": report.mode, "lock": report.lock, "embedded": report.embedded,
        "guard_passed": report.guard.passed, "guard_reason": report.guard.reason or "",
        **{f"count_{k}": v for k, v in report.counts().items()},
    })
    if report.lock == "skipped":
        context.log.warning("another sync of %s is running: skipped" % src.name)
    if not report.guard.passed:
        context.log.error(f"deletion guard: {report.guard.reason}")
    if report.listing_error:
        context.log.error(report.listing_error)


_REPORTS: dict[str, SyncReport] = {}


def report_for_run(run_id: str) -> SyncReport | None:
    """The ``SyncReport`` of an in-process run (used by the CLI to print its table)."""
    return _REPORTS.pop(run_id, None)


@dg.job(description="Sync one source into the PostgreSQL/pgvector index (listing -> diff -> guard -> write).")
def sync_job() -> None:
    sync_source_op()


def run_sync_in_process(resources: dict[str, Any], config: dict[str, Any]) -> SyncReport:
    """Execute ``sync_job`` in this process with ``resources`` and op ``config``; return its report.
    Raises the op's exception when the run fails."""
    result = sync_job.execute_in_process(
        resources=resources, raise_on_error=True,
        run_config={"ops": {"sync_source_op": {"config": config}},
                    "loggers": {"console": {"config": {"log_level": "WARNING"}}}})
    report = report_for_run(result.run_id)
    assert report is not None
    return report
