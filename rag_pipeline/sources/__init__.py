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
                 folder: str = "", shared_drive: str = "", drive: str = "", acl_file: str = "",
                 held_documents: str = "", **_: Any) -> Source:
    """Build a connector. local: ``path`` (+ ``include``/``exclude``, comma-separated globs; ``acl_file``: an
    explicit permission mapping instead of POSIX, default ``RAG_LOCAL_ACL_FILE``); zotero: ``library``
    (``users/<id>`` or ``groups/<id>``); gdrive: ``folder`` or ``shared_drive``; sharepoint: ``drive`` (+ ``path``
    inside it). ``held_documents``: ``hide`` (default) or ``keep``, what queries see of documents the deletion
    guard holds back (``permissions.visibility``). Raises ``ValueError`` for an unknown kind, a missing field or
    a bad policy; connectors raise their own errors for missing credentials."""
    source = _build(kind, path=path, include=include, exclude=exclude, library=library, folder=folder,
                    shared_drive=shared_drive, drive=drive, acl_file=acl_file)
    if held_documents:
        from rag_pipeline.permissions.visibility import POLICIES

        if held_documents not in POLICIES:
            raise ValueError(f"held_documents must be one of {', '.join(POLICIES)}, not {held_documents!r}")
        source.held_documents = held_documents  # type: ignore[attr-defined]
    return source


def _build(kind: str, *, path: str, include: str, exclude: str, library: str, folder: str, shared_drive: str,
           drive: str, acl_file: str) -> Source:
    if kind == "local":
        from rag_pipeline.sources.local import LocalFolderSource

        if not path:
            raise ValueError("a local source needs a path")
        return LocalFolderSource.from_env(
            path,
            include=[p for p in include.split(",") if p] or None,
            exclude=[p for p in exclude.split(",") if p] if exclude else None,
            **({"acl_file": acl_file} if acl_file else {}),
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
