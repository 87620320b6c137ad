"""Sources: local folder, Zotero, Google Drive, SharePoint; the interface is in ``sources.base``.

``build_source`` builds a connector from plain options; the CLI and the Dagster ``SourceResource`` both
call it. Connector modules are imported only for the kind asked for.
"""

from __future__ import annotations

from typing import Any

from rag_pipeline.sources.base import Source

KINDS = ("local", "zotero", "gdrive", "sharepoint")
"""The connector kinds ``build_source`` knows."""


def build_source(kind: str = "local", *, path: str = "", include: str = "", exclude: str = "", library: str = "",
                 folder: str = "", shared_drive: str = "", drive: str = "", **_: Any) -> Source:
    """Build a connector. local: ``path`` (+ ``include``/``exclude``, comma-separated globs); zotero:
    ``library`` (``users/<id>`` or ``groups/<id>``); gdrive: ``folder`` or ``shared_drive``; sharepoint:
    ``drive`` (+ ``path`` inside it). Raises ``ValueError`` for an unknown kind or a missing field;
    connectors raise their own errors for missing credentials."""
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
    raise ValueError(f"unknown source kind {kind!r}: {', '.join(KINDS)}")
