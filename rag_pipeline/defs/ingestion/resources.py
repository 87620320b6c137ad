"""Dagster resources wrapping the plain-Python core: the index store, the embedder and the sources."""

from __future__ import annotations

import json
from typing import Any

import dagster as dg

from rag_pipeline.config import Settings, get_settings
from rag_pipeline.embedding import Embedder, get_embedder
from rag_pipeline.sources.base import Source
from rag_pipeline.store import Store


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

    _cache: dict[str, Embedder] = {}

    def get(self, settings: Settings) -> Embedder:
        """Return the (process-wide, lazily loaded) embedder."""
        model = self.model or settings.embedding_model
        key = f"{model}|{settings.embedding_bf16}|{settings.embedding_batch_size}"
        if key not in EmbedderResource._cache:
            EmbedderResource._cache[key] = get_embedder(settings.model_copy(update={"embedding_model": model}))
        return EmbedderResource._cache[key]


class StoreResource(dg.ConfigurableResource):
    """The index database; ``database_url`` empty = ``RAG_DATABASE_URL``, or the embedded server when unset."""

    database_url: str = ""

    def open(self, settings: Settings, embedder: Embedder) -> Store:
        """Open (and migrate) the store for ``embedder``'s dimension."""
        s = settings.model_copy(update={"database_url": self.database_url or settings.database_url})
        return Store.open(s, embedding_dimension=embedder.dimension, embedding_model=embedder.model_id)


class SourceResource(dg.ConfigurableResource):
    """One configured source. ``kind``: local | zotero | gdrive | sharepoint.
    local: ``path`` (+ ``include``/``exclude`` globs, comma separated). zotero: ``library``
    (``users/<id>`` or ``groups/<id>``). gdrive: ``folder`` or ``shared_drive``. sharepoint: ``drive``
    (+ ``path``). Credentials come from the environment variables each connector documents."""

    kind: str = "local"
    path: str = ""
    include: str = ""
    exclude: str = ""
    library: str = ""
    folder: str = ""
    shared_drive: str = ""
    drive: str = ""

    def build(self) -> Source:
        """Return the connector object; raises ``ValueError`` for a missing required field."""
        return build_source(**self.model_dump())


def build_source(kind: str = "local", *, path: str = "", include: str = "", exclude: str = "", library: str = "",
                 folder: str = "", shared_drive: str = "", drive: str = "", **_: Any) -> Source:
    """Build a connector from plain options (shared by the CLI and ``SourceResource``)."""
    if kind == "local":
        from rag_pipeline.sources.local import LocalFolderSource

        if not path:
            raise ValueError("a local source needs a path")
        return LocalFolderSource(
            path,
            include=[p for p in include.split(",") if p] or None,
            exclude=[p for p in exclude.split(",") if p] if exclude else None,
        )
    if kind == "zotero":
        from rag_pipeline.sources.zotero import ZoteroSource

        if not library:
            raise ValueError("a zotero source needs --library users/<id> or groups/<id>")
        return ZoteroSource.from_env(library)
    if kind == "gdrive":
        from rag_pipeline.sources.gdrive import GoogleDriveSource

        if not (folder or shared_drive):
            raise ValueError("a gdrive source needs --folder <id> or --shared-drive <id>")
        return GoogleDriveSource.from_env(folder_id=folder or None, shared_drive_id=shared_drive or None)
    if kind == "sharepoint":
        from rag_pipeline.sources.sharepoint import SharePointSource

        if not drive:
            raise ValueError("a sharepoint source needs --drive <id>")
        return SharePointSource.from_env(drive_id=drive, path=path or None)
    raise ValueError(f"unknown source kind {kind!r}: local, zotero, gdrive or sharepoint")
