"""Local folder source: a directory tree on disk or a mounted NAS share.

Stable id = the path relative to the root, POSIX-style (``reports/2024/q1.pdf``). Each listing reads
every file once: size, modification time, SHA-256 of the content and the MIME type from the content's
magic bytes (libmagic), not from the name. A directory that cannot be read part-way makes the whole
listing fail (``ListingIncompleteError``), never a short inventory. The root must exist and be a
directory; an unmounted share that shows as an empty directory is caught by the deletion guard.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from datetime import datetime, timezone
from pathlib import Path

from rag_pipeline.sources.base import ChangeFeedUnavailable, ChangeSet, Inventory, ListingIncompleteError, SourceDocument, SourceError

DEFAULT_EXCLUDES = (".*", "*/.*", "~$*", "*/~$*", "*.tmp", "Thumbs.db", "*/Thumbs.db")
_READ_BLOCK = 1 << 20


def sniff_mime(head: bytes) -> str:
    """MIME type of content from its first bytes (libmagic via python-magic); ``application/octet-stream``
    when unknown. Pure function of the bytes: the file name never enters."""
    if not head:
        return "application/x-empty"
    import magic

    return magic.from_buffer(head, mime=True) or "application/octet-stream"


def file_digest(path: Path) -> tuple[str, bytes]:
    """Return ``(hex SHA-256 of the file, its first 8 KiB)``; raises ``OSError``."""
    h = hashlib.sha256()
    head = b""
    with path.open("rb") as fh:
        while block := fh.read(_READ_BLOCK):
            if not head:
                head = block[:8192]
            h.update(block)
    return h.hexdigest(), head


class LocalFolderSource:
    """A folder as a source (see module docstring).

    ``root``: the folder. ``include``/``exclude``: glob patterns matched (``fnmatch``) against the
    relative POSIX path; ``*`` crosses directory levels, so ``*.pdf`` means every PDF at any depth.
    ``include`` empty = everything; ``exclude`` defaults to hidden and temporary files. ``name``
    defaults to ``local:<absolute root>``.
    """

    def __init__(self, root: str | os.PathLike, *, include: list[str] | None = None,
                 exclude: list[str] | None = None, name: str | None = None) -> None:
        self.root = Path(root).expanduser().resolve()
        self.include = list(include or [])
        self.exclude = list(DEFAULT_EXCLUDES if exclude is None else exclude)
        self.name = name or f"local:{self.root}"

    def _selected(self, rel: str) -> bool:
        if self.include and not any(fnmatch.fnmatchcase(rel, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(rel, p) for p in self.exclude)

    def _document(self, path: Path, rel: str) -> SourceDocument:
        st = path.stat()
        sha, head = file_digest(path)
        return SourceDocument(
            source_id=rel,
            title=path.name,
            uri=path.as_uri(),
            mime_type=sniff_mime(head),
            size=st.st_size,
            modified_at=datetime.fromtimestamp(st.st_mtime, tz=timezone.utc),
            source_version=f"{st.st_size}:{st.st_mtime_ns}",
            content_sha256=sha,
        )

    def list_documents(self) -> Inventory:
        """Walk the tree; returns a complete ``Inventory`` sorted by id, or raises
        ``ListingIncompleteError`` when the root is missing or any directory/file cannot be read."""
        if not self.root.is_dir():
            raise ListingIncompleteError(f"source folder {self.root} does not exist or is not a directory")

        def fail(err: OSError) -> None:
            raise ListingIncompleteError(f"listing {self.root} failed part-way at {err.filename}: {err.strerror}")

        documents = []
        for dirpath, dirnames, filenames in os.walk(self.root, onerror=fail):
            dirnames.sort()
            base = Path(dirpath)
            for fname in sorted(filenames):
                path = base / fname
                rel = path.relative_to(self.root).as_posix()
                if not self._selected(rel) or not path.is_file():
                    continue
                try:
                    documents.append(self._document(path, rel))
                except OSError as err:
                    raise ListingIncompleteError(f"listing {self.root} failed part-way at {rel}: {err}") from err
        return Inventory(documents=documents, complete=True)

    def changes(self, cursor: str | None) -> ChangeSet:
        """A folder has no change feed: always raises ``ChangeFeedUnavailable`` (full listing instead)."""
        raise ChangeFeedUnavailable("a local folder has no change feed")

    def fetch(self, document: SourceDocument) -> bytes:
        """Read the file's bytes; raises ``SourceError`` (transient) when it vanished or cannot be read."""
        path = self.root / document.source_id
        try:
            return path.read_bytes()
        except OSError as err:
            raise SourceError(f"cannot read {document.source_id}: {err.strerror or err}") from err
