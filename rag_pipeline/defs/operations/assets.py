"""``dead_letter_report``: every failed document with its reason, attempts and failure window, grouped by
reason (``pipeline.operate.dead_letter_report``); refreshed daily and sent as a notification."""

import dagster as dg

from rag_pipeline.defs.ingestion.resources import EmbedderResource, NotifierResource, SettingsResource, StoreResource
from rag_pipeline.pipeline import operate


@dg.asset(group_name="operations", kinds={"postgres"})
def dead_letter_report(rag_settings: SettingsResource, store: StoreResource, embedder: EmbedderResource,
                       notifier: NotifierResource) -> dg.MaterializeResult:
    """The daily review list: documents ``failed`` or ``permanently_failed``, grouped by reason (retry them
    with the ``retry_failed_documents`` job or ``rag-pipeline retry`` once the cause is fixed)."""
    settings = rag_settings.settings()
    with store.open(settings, embedder.get(settings)).connection() as conn:
        report = operate.dead_letter_report(conn)
    table = operate.dead_letter_markdown(report)
    if not report.empty:
        notifier.get().notify("dead_letter", f"dead-letter report: {len(report.documents)} failed document(s)",
                              {"by_reason": dict(report.by_reason), "report": table})
    return dg.MaterializeResult(metadata={
        "failed_documents": len(report.documents),
        "permanently_failed": sum(d.status == "permanently_failed" for d in report.documents),
        "reasons": len(report.by_reason), "report": dg.MetadataValue.md(table)})
