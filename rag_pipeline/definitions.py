"""The Dagster code location: ``dagster dev -w workspace.yaml`` (or ``-m rag_pipeline.definitions``).

``defs`` is loaded lazily (``@dg.definitions``): the configured sources are read from the environment
when Dagster loads the code location, never at import (``defs/sources/config.py``). With no source
configured the location still loads: per-document assets, index checks, the failure sensor, the retry
job and the dead-letter report. Tests call ``build_definitions(specs)`` directly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from rag_pipeline.defs.documents.assets import document_chunks, document_embeddings, document_markdown
from rag_pipeline.defs.documents.checks import INDEX_CHECKS
from rag_pipeline.defs.documents.jobs import index_checks_job, index_checks_schedule, ingest_job
from rag_pipeline.defs.documents.sensors import document_failure_sensor
from rag_pipeline.defs.ingestion.resources import (
    EmbedderResource,
    NotifierResource,
    SettingsResource,
    SourcesResource,
    StoreResource,
)
from rag_pipeline.defs.operations.assets import dead_letter_report
from rag_pipeline.defs.operations.jobs import dead_letter_job, dead_letter_schedule, retry_failed_documents
from rag_pipeline.defs.permissions.assets import build_permission_assets
from rag_pipeline.defs.permissions.jobs import build_permission_job, build_permission_sensor
from rag_pipeline.defs.sources.assets import build_source_assets
from rag_pipeline.defs.sources.config import SourceSpec, load_source_specs
from rag_pipeline.defs.sources.jobs import build_inventory_job, build_reconcile_job, build_reconcile_schedule
from rag_pipeline.defs.sources.sensors import build_source_diff_sensor


SECRET_VARIABLES = ("RAG_DATABASE_URL", "RAG_SLACK_WEBHOOK_URL", "RAG_TEAMS_WEBHOOK_URL", "RAG_ALERT_WEBHOOK_URL")
"""Environment variables whose values are secrets: resource fields name them (``dg.EnvVar``), never hold them."""


def secret_field(name: str) -> Any:
    """``dg.EnvVar(name)`` when ``name`` is set (Dagster resolves it at run time and shows only the variable's
    name in the UI and in run configuration), else ``""`` (the resource's own fallback applies)."""
    return dg.EnvVar(name) if os.environ.get(name, "").strip() else ""


def build_definitions(specs: Sequence[SourceSpec] = (), *, resources: Mapping[str, Any] | None = None) -> dg.Definitions:
    """All definitions for ``specs``: shared per-document assets and checks, then per source its inventory
    and purge assets, inventory and reconcile jobs, diff sensor and daily schedule, and its permission-sync
    asset, job and sensor. ``resources`` override
    the defaults (tests point ``rag_settings``/``store`` at their database, ``notifier`` at a fake server)."""
    assets: list[Any] = [document_markdown, document_chunks, document_embeddings, dead_letter_report]
    jobs: list[Any] = [ingest_job, index_checks_job, retry_failed_documents, dead_letter_job]
    sensors: list[Any] = [document_failure_sensor]
    schedules: list[Any] = [index_checks_schedule, dead_letter_schedule]
    for spec in specs:
        assets.extend(build_source_assets(spec) + build_permission_assets(spec))
        inventory_job = build_inventory_job(spec)
        reconcile_job = build_reconcile_job(spec)
        permission_job = build_permission_job(spec)
        jobs.extend([inventory_job, reconcile_job, permission_job])
        sensors.append(build_source_diff_sensor(spec, ingest_job, inventory_job))
        sensors.append(build_permission_sensor(spec, permission_job))
        schedules.append(build_reconcile_schedule(spec, reconcile_job))
    default_resources: dict[str, Any] = {
        "rag_settings": SettingsResource(),
        "embedder": EmbedderResource(),
        "store": StoreResource(database_url=secret_field("RAG_DATABASE_URL")),
        "notifier": NotifierResource(slack_webhook_url=secret_field("RAG_SLACK_WEBHOOK_URL"),
                                     teams_webhook_url=secret_field("RAG_TEAMS_WEBHOOK_URL"),
                                     webhook_url=secret_field("RAG_ALERT_WEBHOOK_URL")),
        "sources": SourcesResource(sources_json=json.dumps({s.name: s.source.model_dump() for s in specs})),
    }
    return dg.Definitions(assets=assets, asset_checks=INDEX_CHECKS, jobs=jobs, sensors=sensors, schedules=schedules,
                          resources={**default_resources, **(resources or {})}, executor=dg.in_process_executor)


@dg.definitions
def defs() -> dg.Definitions:
    """The code location, for the sources configured in the environment (secrets kept out of every log
    record of the code server and its run workers: ``rag_pipeline.redact``)."""
    from rag_pipeline import redact

    redact.install()
    return build_definitions(load_source_specs())
