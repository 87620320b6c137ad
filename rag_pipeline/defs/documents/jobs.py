"""Jobs over the per-document assets, and the schedule of the index-wide checks."""

from __future__ import annotations

import dagster as dg

from rag_pipeline.defs.documents.assets import document_chunks, document_embeddings, document_markdown
from rag_pipeline.defs.documents.checks import INDEX_CHECKS

ingest_job = dg.define_asset_job(
    "ingest_documents",
    selection=dg.AssetSelection.assets(document_markdown, document_chunks, document_embeddings)
    - dg.AssetSelection.checks(*INDEX_CHECKS),
    executor_def=dg.in_process_executor,
    description="Markdown -> chunks -> embeddings for one document (sensor runs) or a batch (backfills).",
)

index_checks_job = dg.define_asset_job(
    "index_checks",
    selection=dg.AssetSelection.checks(*INDEX_CHECKS),
    executor_def=dg.in_process_executor,
    description="Index-wide checks: one version per document, permanently failed documents, embedding model.",
)

index_checks_schedule = dg.ScheduleDefinition(
    name="index_checks_hourly", job=index_checks_job, cron_schedule="17 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
