"""The spool: where a fetched document's bytes go between the source and the extraction worker.

The sync process never holds a whole fetched file (issue 12): ``fetch_and_extract`` opens a ``Spool``,
the source writes the content into it in pieces (``sources.base.fetch_into``), the spool hashes and
counts as the pieces arrive and refuses the piece that takes it past the size cap, and the extraction
worker reads the file from the spool's path itself, under its memory limit.

A spool file is created with ``tempfile`` in ``$TMPDIR`` (else ``/tmp``), readable by the owner only
(mode 0600), and removed when the ``with`` block ends, whatever happens in it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from types import TracebackType

from rag_pipeline.extraction.types import DocumentTooLargeError

MIB = 1024 * 1024


def too_large(size: int, cap_mb: int, *, at_least: bool = False) -> DocumentTooLargeError:
    """The size-cap error for ``size`` bytes over a ``cap_mb`` MiB cap (``at_least``: reading stopped there,
    the whole file may be larger). The reason gives both figures and the variable that sets the cap."""
    return DocumentTooLargeError(f"too large: {'at least ' if at_least else ''}{size / MIB:,.1f} MB, over the "
                                 f"{cap_mb:,} MB cap (RAG_MAX_DOCUMENT_MB)")


def check_size(size: int | None, cap_mb: int) -> None:
    """Raise ``DocumentTooLargeError`` when ``size`` (bytes; ``None``: unknown) exceeds ``cap_mb`` MiB
    (0: no cap)."""
    if size is not None and cap_mb > 0 and size > cap_mb * MIB:
        raise too_large(size, cap_mb)


class Spool:
    """A private temporary file that counts, hashes and caps what is written to it.

    ``cap_mb``: the size cap in MiB (0: none). ``write(piece)`` raises ``DocumentTooLargeError`` ("too
    large: at least N MB, over the C MB cap") for the piece that would take the file past the cap, and
    writes nothing of it. After the source is done: ``size`` (bytes), ``sha256`` (hex of everything
    written), ``path`` (for the extraction worker). Use as a context manager: the file is removed on exit.
    """

    def __init__(self, cap_mb: int) -> None:
        self.cap_mb = cap_mb
        self.size = 0
        self._hash = hashlib.sha256()
        fd, name = tempfile.mkstemp(prefix="rag-pipeline-spool-")  # O_EXCL, mode 0600
        self.path = Path(name)
        self._file = os.fdopen(fd, "wb")

    def write(self, piece: bytes | bytearray | memoryview) -> int:
        """Append ``piece``; returns its length. Raises ``DocumentTooLargeError`` past the cap."""
        n = len(piece)
        if self.cap_mb > 0 and self.size + n > self.cap_mb * MIB:
            raise too_large(self.size + n, self.cap_mb, at_least=True)
        self._file.write(piece)
        self._hash.update(piece)
        self.size += n
        return n

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self._file.flush()

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of the bytes written so far."""
        return self._hash.hexdigest()

    def finish(self) -> Path:
        """Close the file for writing (the data is on disk for the worker); returns ``path``."""
        if not self._file.closed:
            self._file.close()
        return self.path

    def close(self) -> None:
        """Close and remove the file (idempotent)."""
        if not self._file.closed:
            self._file.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
