"""The Dagster code location: ``dagster dev -m rag_pipeline.definitions`` (or ``-w workspace.yaml``)."""

from __future__ import annotations

import dagster as dg

from rag_pipeline.defs.ingestion.jobs import sync_job
from rag_pipeline.defs.ingestion.resources import EmbedderResource, SettingsResource, SourceResource, StoreResource

defs = dg.Definitions(
    jobs=[sync_job],
    resources={
        "rag_settings": SettingsResource(),
        "embedder": EmbedderResource(),
        "store": StoreResource(),
        "source": SourceResource(kind=dg.EnvVar("RAG_SOURCE_KIND"), path=dg.EnvVar("RAG_SOURCE_PATH")),
    },
)
