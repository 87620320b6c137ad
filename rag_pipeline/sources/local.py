"""Local folder source: a directory tree on disk or a mounted NAS share.

Stable id = the path relative to the root, POSIX-style (``reports/2024/q1.pdf``).

A normal listing (``list_documents()``) reads no file content: it walks the directories and costs
one ``stat`` per file. Each document carries its size (bytes), its modification time and
``source_version = "<size in bytes>:<mtime in ns>"``; ``content_sha256`` and ``mime_type`` are
``None``. Content is read at fetch time (``fetch``): the core re-fetches, hashes and sniffs a file
only when its size or mtime changed, plus a periodic full verification, ``list_documents(verify=True)``,
which reads every file once for its SHA-256 and its MIME type from the content's magic bytes
(libmagic), not from the name. The core picks the verification interval (its setting
``RAG_LOCAL_VERIFY_INTERVAL_S``); the class attribute ``verifiable = True`` tells it that this
source's listing accepts ``verify=``.

Errors. A directory that cannot be read part-way (or a root that is missing or not a directory)
makes the whole listing fail with ``ListingIncompleteError``, never a short inventory: we do not
know what is in a directory we cannot list, so the deletion guard must hold deletions back. A single
*file* never fails the listing: a file that vanished between the walk and its ``stat`` is simply
not listed; a file that cannot be ``stat``-ed (e.g. no search permission on its folder) is listed
without size, mtime or version; a file that cannot be read is listed normally (with
``verify=True``: without hash or MIME type), and its ``fetch`` raises ``SourceError``, which the
core records as that document's own failure. An unmounted share that shows as an empty directory
is caught by the deletion guard.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import os
import stat
from datetime import datetime, timezone
from pathlib import Path

from rag_pipeline.sources.base import ChangeFeedUnavailable, ChangeSet, Inventory, ListingIncompleteError, SourceDocument, SourceError

DEFAULT_EXCLUDES = (".*", "*/.*", "~$*", "*/~$*", "*.tmp", "Thumbs.db", "*/Thumbs.db")
_READ_BLOCK = 1 << 20
# stat/open errors meaning "there is no regular file here (any more)": the entry is not listed.
_GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


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

    verifiable = True
    """``list_documents`` accepts ``verify=``: a plain listing is stat-only, ``verify=True`` hashes."""

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

    def _document(self, path: Path, rel: str, *, verify: bool) -> SourceDocument | None:
        """The listing entry for one walked file, or ``None`` when it is not (or no longer) a regular
        file. Never raises ``OSError``: what cannot be known is left ``None`` (see module docstring)."""
        doc = SourceDocument(source_id=rel, title=path.name, uri=path.as_uri())
        try:
            st = os.stat(path)
        except OSError as err:
            if err.errno in _GONE:
                return None  # vanished since the walk, or a dangling / looping symlink
            return doc  # exists but cannot be stat-ed: listed with nothing known; fetch tells why
        if not stat.S_ISREG(st.st_mode):
            return None  # FIFO, socket, device: not a document (and opening a FIFO would block)
        doc = doc.replace(
            size=st.st_size,
            modified_at=datetime.fromtimestamp(st.st_mtime, tz=timezone.utc),
            source_version=f"{st.st_size}:{st.st_mtime_ns}",
        )
        if not verify:
            return doc
        try:
            sha, head = file_digest(path)
        except OSError as err:
            if err.errno in _GONE:
                return None  # vanished between stat and open
            return doc  # unreadable: no hash, no MIME type; the core fetches it and records the error
        return doc.replace(content_sha256=sha, mime_type=sniff_mime(head))

    def list_documents(self, *, verify: bool = False) -> Inventory:
        """Walk the tree; return a complete ``Inventory`` of the selected regular files, sorted by id.

        ``verify=False`` (default): one ``stat`` per file, no content read. Each ``SourceDocument``
        has ``source_id`` (relative POSIX path), ``title`` (file name), ``uri`` (``file://``),
        ``size`` (bytes), ``modified_at`` (timezone-aware UTC) and ``source_version``
        (``"<size>:<st_mtime_ns>"``); ``content_sha256`` and ``mime_type`` are ``None``.
        ``verify=True``: additionally reads every file once and sets ``content_sha256`` (hex SHA-256)
        and ``mime_type`` (sniffed from the first 8 KiB); a file that cannot be read keeps both ``None``.

        A single file never fails the listing (see module docstring). Raises ``ListingIncompleteError``
        when the root is missing or not a directory, or any directory under it cannot be listed."""
        try:
            root_is_dir = stat.S_ISDIR(os.stat(self.root).st_mode)
        except OSError:
            root_is_dir = False
        if not root_is_dir:
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
                if not self._selected(rel):
                    continue
                doc = self._document(path, rel, verify=verify)
                if doc is not None:
                    documents.append(doc)
        documents.sort(key=lambda d: d.source_id)
        return Inventory(documents=documents, complete=True)

    def changes(self, cursor: str | None) -> ChangeSet:
        """A folder has no change feed: always raises ``ChangeFeedUnavailable`` (full listing instead)."""
        raise ChangeFeedUnavailable("a local folder has no change feed")

    def fetch(self, document: SourceDocument) -> bytes:
        """Read the file's bytes (``root / source_id``); raises ``SourceError`` (transient) naming the
        file and the OS reason when it vanished or cannot be read."""
        path = self.root / document.source_id
        try:
            return path.read_bytes()
        except OSError as err:
            raise SourceError(f"cannot read {document.source_id}: {err.strerror or err}") from err
