"""``retry_failed_documents`` (launched from the UI's Launchpad) and the daily dead-letter schedule."""

import dagster as dg

from rag_pipeline.defs.ingestion.resources import EmbedderResource, SettingsResource, SourcesResource, StoreResource
from rag_pipeline.defs.operations.assets import dead_letter_report
from rag_pipeline.pipeline import operate


class RetryConfig(dg.Config):
    """``source``: the configured source name; ``source_ids``: documents to retry (empty: every
    permanently failed document of the source); ``reason``: why (logged with each document)."""

    source: str
    source_ids: list[str] = []
    reason: str = "retry requested from the Dagster UI"


@dg.op(out=dg.Out(dg.Nothing))
def retry_documents(context: dg.OpExecutionContext, config: RetryConfig, rag_settings: SettingsResource,
                    store: StoreResource, embedder: EmbedderResource, sources: SourcesResource) -> None:
    """Reset the failure count of the chosen documents and queue them again (``pipeline.operate.retry``);
    the source's diff sensor requests their runs on its next tick."""
    settings = rag_settings.settings()
    name = sources.build(config.source).name
    with store.open(settings, embedder.get(settings)).connection() as conn:
        result = operate.retry(conn, name, config.source_ids, reason=config.reason, settings=settings,
                               run_id=f"dagster:{context.run_id}")
    context.add_output_metadata({"requeued": len(result.requeued), "not_found": result.not_found,
                                 "not_failed": result.not_failed,
                                 "documents": [o.source_id for o in result.requeued][:200]})
    if result.not_found:
        raise dg.Failure(description=f"not documents of {config.source}: {', '.join(result.not_found[:20])}",
                         allow_retries=False)


@dg.job(description="Retry permanently failed documents of one source (all, or the ids given) after a fix.")
def retry_failed_documents() -> None:
    retry_documents()


dead_letter_job = dg.define_asset_job("dead_letter_report_job", selection=dg.AssetSelection.assets(dead_letter_report),
                                      description="Refresh the dead-letter report and send it.")

dead_letter_schedule = dg.ScheduleDefinition(name="dead_letter_report_daily", job=dead_letter_job,
                                             cron_schedule="0 8 * * *", default_status=dg.DefaultScheduleStatus.RUNNING)
