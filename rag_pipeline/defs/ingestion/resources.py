"""Dagster resources wrapping the plain-Python core: the index store, the embedder, the sources, alerts."""

from __future__ import annotations

import json
import os
import threading

import dagster as dg

from rag_pipeline.config import Settings, get_settings
from rag_pipeline.embedding import Embedder, get_embedder
from rag_pipeline.sources import build_source
from rag_pipeline.sources.base import Source
from rag_pipeline.store import Store
from rag_pipeline.store.generations import embedder_spec, spec_of
from rag_pipeline.pipeline.steps import Notifier

# Process-wide caches (module level: pydantic turns underscore class attributes of a resource into
# per-instance private attributes, so they cannot be shared through the class).
_EMBEDDERS: dict[str, Embedder] = {}
_STORES: dict[tuple[str, int, str], Store] = {}
_SOURCES: dict[tuple[str, str], Source] = {}
_LOCK = threading.Lock()


class SettingsResource(dg.ConfigurableResource):
    """Pipeline settings: every ``RAG_*`` environment variable (see ``rag_pipeline.config``), with
    ``overrides`` (a JSON object of setting -> value) on top."""

    overrides: str = "{}"

    def settings(self) -> Settings:
        """Return ``Settings`` from the environment plus ``overrides``."""
        base = get_settings()
        return base.model_copy(update=json.loads(self.overrides or "{}"))


class EmbedderResource(dg.ConfigurableResource):
    """The embedding model; ``model`` empty = ``RAG_EMBEDDING_MODEL`` (default: the bundled all-MiniLM-L6-v2).
    One embedder per process: the model loads once, on the first embed."""

    model: str = ""

    def get(self, settings: Settings) -> Embedder:
        """Return the (process-wide, lazily loaded) embedder."""
        configured = settings.model_copy(update={"embedding_model": self.model or settings.embedding_model})
        key = json.dumps(spec_of(configured), sort_keys=True, default=str)  # provider, model, URL, dimensions, ...
        with _LOCK:
            if key not in _EMBEDDERS:
                _EMBEDDERS[key] = get_embedder(configured)
            return _EMBEDDERS[key]


class StoreResource(dg.ConfigurableResource):
    """The index database; ``database_url`` empty = ``RAG_DATABASE_URL``, or the embedded server when unset.
    The schema is migrated once per process and URL (sensors open the store on every tick)."""

    database_url: str = ""

    def open(self, settings: Settings, embedder: Embedder) -> Store:
        """Open (and, the first time in this process, migrate) the store for ``embedder``'s dimension."""
        from rag_pipeline.store.embedded import resolve_database_url

        with _LOCK:
            url = resolve_database_url(self.database_url or settings.database_url)
            key = (url, embedder.dimension, embedder.model_id)
            if key not in _STORES:
                s = settings.model_copy(update={"database_url": url})
                _STORES[key] = Store.open(s, embedding_dimension=embedder.dimension, embedding_model=embedder.model_id,
                                          embedding_spec=embedder_spec(embedder, s))
            return _STORES[key]


class SourceResource(dg.ConfigurableResource):
    """One configured source. ``kind``: local | zotero | gdrive | sharepoint.
    local: ``path`` (+ ``include``/``exclude`` globs, comma separated). zotero: ``library``
    (``users/<id>`` or ``groups/<id>``). gdrive: ``folder`` or ``shared_drive``. sharepoint: ``drive``
    (+ ``path``). Credentials come from the environment variables each connector documents.
    ``acl_file`` (local): an explicit permission mapping instead of POSIX. ``held_documents``: ``hide``
    (default) or ``keep``: what queries see of documents the deletion guard holds back."""

    kind: str = "local"
    path: str = ""
    include: str = ""
    exclude: str = ""
    library: str = ""
    folder: str = ""
    shared_drive: str = ""
    drive: str = ""
    acl_file: str = ""
    held_documents: str = ""

    def build(self) -> Source:
        """Return the connector object; raises ``ValueError`` for a missing required field."""
        return build_source(**self.model_dump())


class SourcesResource(dg.ConfigurableResource):
    """Every configured source by its short name (``defs/sources/config.py``): ``sources_json`` is a JSON
    object ``{name: {SourceResource fields}}``. Connectors are built once per process."""

    sources_json: str = "{}"

    def specs(self) -> dict[str, SourceResource]:
        """``{name: SourceResource}``."""
        return {name: SourceResource(**fields) for name, fields in json.loads(self.sources_json or "{}").items()}

    def names(self) -> list[str]:
        """The configured short names."""
        return list(json.loads(self.sources_json or "{}"))

    def build(self, name: str) -> Source:
        """The connector of source ``name``; raises ``KeyError`` for an unknown name."""
        fields = json.loads(self.sources_json or "{}")
        if name not in fields:
            raise KeyError(f"no source named {name!r} is configured (known: {', '.join(fields) or 'none'})")
        key = (name, json.dumps(fields[name], sort_keys=True))
        with _LOCK:
            if key not in _SOURCES:
                _SOURCES[key] = SourceResource(**fields[name]).build()
            return _SOURCES[key]


class NotifierResource(dg.ConfigurableResource):
    """Alerts (``rag_pipeline.notify``): Slack, Teams (Workflows) and generic JSON webhook URLs; an empty
    field falls back to ``RAG_SLACK_WEBHOOK_URL`` / ``RAG_TEAMS_WEBHOOK_URL`` / ``RAG_ALERT_WEBHOOK_URL``;
    with none set, alerts are logged."""

    slack_webhook_url: str = ""
    teams_webhook_url: str = ""
    webhook_url: str = ""
    timeout_s: float = 10.0
    retries: int = 2

    def get(self) -> Notifier:
        """The notifier (a ``rag_pipeline.pipeline.steps.Notifier``)."""
        from rag_pipeline.notify import build_notifier

        env = os.environ
        return build_notifier(
            slack_webhook_url=self.slack_webhook_url or env.get("RAG_SLACK_WEBHOOK_URL", "").strip(),
            teams_webhook_url=self.teams_webhook_url or env.get("RAG_TEAMS_WEBHOOK_URL", "").strip(),
            webhook_url=self.webhook_url or env.get("RAG_ALERT_WEBHOOK_URL", "").strip(),
            timeout_s=self.timeout_s, retries=self.retries)
