"""The source interface every connector implements: inventory, change feed, fetch.

A source hides its API behind three calls (see ``../shared/notes/DESIGN.md``):

* ``list_documents()`` -> ``Inventory``: every document with its stable id, plus whether the
  listing is *complete* (every page fetched, totals matched, no error). An incomplete inventory
  never drives deletions.
* ``changes(cursor)`` -> ``ChangeSet``: upserts and explicit deletions since an opaque cursor,
  and the next cursor. Sources without a feed raise ``ChangeFeedUnavailable`` and the sync falls
  back to a full inventory. The cursor is saved by the sync only after it has committed.
* ``fetch(document)`` -> ``bytes``: the document's content (download, export or disk read).
  A connector that can stream also has ``fetch_to(document, out)``: it writes the content to ``out`` in
  pieces as they arrive (``StreamingSource``). The pipeline always reads through ``fetch_into`` below, which
  uses ``fetch_to`` when there is one, so the sync process never holds a whole large file: ``out`` is the
  pipeline's spool file, and its ``write`` raises ``DocumentTooLargeError`` once the size cap is passed
  (connectors let that error through: it is neither an ``OSError`` nor a ``SourceError``).

Who may read each document (``PermissionSource``, see ``rag_pipeline/permissions/``):

* ``permissions(documents)`` -> ``{source_id: Scope}``: the principals allowed to read each document,
  from the source's own permission data, or ``Scope.unreadable(reason)`` when they could not be read
  (the document then becomes readable by nobody: fail closed). A missing key counts as unreadable.
* ``group_members(groups)`` -> ``GroupMembers``: the members (users or groups) of each group principal
  the source issued; a group whose members could not be read is in ``errors`` and grants nothing.
* optional ``permission_changes(cursor)`` -> ``PermissionChanges``: which documents' permissions changed
  since ``cursor`` (``changed_ids=None``: read them all) and the cursor to keep afterwards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, BinaryIO, Protocol, runtime_checkable

FETCH_PIECE_BYTES = 1024 * 1024
"""Size of the pieces a streaming connector reads and writes (bytes; a connector may use less)."""


class SourceError(Exception):
    """A source could not be listed or read. ``transient`` tells the sync whether to retry later."""

    def __init__(self, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


class ListingIncompleteError(SourceError):
    """A listing failed part-way or came up short of the total the source announced."""


class ChangeFeedUnavailable(SourceError):
    """The source has no change feed, or the cursor expired (e.g. HTTP 410): do a full inventory."""


class DocumentSkipped(Exception):
    """This document is deliberately not ingested (e.g. a ``linked_url`` Zotero attachment).

    Terminal for this content: the document row ends ``permanently_failed`` with ``reason``.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class SourceDocument:
    """One document as a source lists it.

    ``source_id`` is the source's stable id (a path relative to the root, a Zotero attachment key,
    a Drive file id, a Graph drive-item id): never derived from a name or from content.
    ``source_version`` is the source's own version/etag/mtime token, ``content_sha256`` the
    hex SHA-256 of the bytes when the source knows it without downloading (``None`` otherwise).
    ``size`` in bytes; ``modified_at`` timezone-aware.
    """

    source_id: str
    title: str
    uri: str
    mime_type: str | None = None
    size: int | None = None
    modified_at: datetime | None = None
    source_version: str | None = None
    content_sha256: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    skip_reason: str | None = None
    """Set when the source already knows this document cannot be ingested (kept in the inventory
    so it is neither deleted nor silently ignored; it ends ``permanently_failed`` with this reason)."""

    def replace(self, **changes: Any) -> SourceDocument:
        """Return a copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Inventory:
    """A full listing: ``documents`` (unique by ``source_id``), whether it is ``complete``, why not,
    and ``expected_total`` when the source announced a count (Zotero ``Total-Results``)."""

    documents: list[SourceDocument]
    complete: bool = True
    incomplete_reason: str | None = None
    expected_total: int | None = None
    cursor: str | None = None
    """A change-feed cursor valid as of this listing (e.g. Drive start page token), if any."""


@dataclass(frozen=True)
class ChangeSet:
    """Changes since a cursor: ``upserts`` (new or changed documents), ``deleted_ids`` (explicit
    tombstones from the feed), ``next_cursor`` to save after commit, and ``complete`` (every page read)."""

    upserts: list[SourceDocument]
    deleted_ids: list[str]
    next_cursor: str
    complete: bool = True
    incomplete_reason: str | None = None


@runtime_checkable
class Source(Protocol):
    """What the sync needs from a connector. ``name`` is unique per configured source, e.g.
    ``local:docs`` or ``zotero:users/123``; it prefixes document identities in the index."""

    name: str

    def list_documents(self) -> Inventory:
        """Return the complete listing; a failure part-way returns ``complete=False`` or raises
        ``ListingIncompleteError``, never a silently short list."""
        ...

    def changes(self, cursor: str | None) -> ChangeSet:
        """Return changes since ``cursor``; raise ``ChangeFeedUnavailable`` when there is no feed or
        the cursor is no longer valid (the sync then does a full inventory and reconciliation)."""
        ...

    def fetch(self, document: SourceDocument) -> bytes:
        """Return the bytes of ``document``; raise ``SourceError`` (transient) or
        ``DocumentSkipped`` (terminal, with a reason)."""
        ...


@runtime_checkable
class StreamingSource(Protocol):
    """A source that can write a document's content in pieces (every built-in connector)."""

    def fetch_to(self, document: SourceDocument, out: BinaryIO) -> None:
        """Write the bytes of ``document`` to ``out`` in pieces of at most ``FETCH_PIECE_BYTES``, as they
        arrive; same errors as ``Source.fetch``. An exception raised by ``out.write`` (the size cap) must
        propagate unchanged: stop reading and let it through."""
        ...


def fetch_into(source: Source, document: SourceDocument, out: BinaryIO) -> None:
    """Write ``document``'s bytes to ``out``: ``source.fetch_to`` when the source streams, else the
    whole of ``source.fetch`` at once (a third-party source without ``fetch_to``; the size cap then
    applies after that read). Raises what the source raises, and what ``out.write`` raises."""
    fetch_to = getattr(source, "fetch_to", None)
    if callable(fetch_to):
        fetch_to(document, out)
    else:
        out.write(source.fetch(document))


def copy_pieces(handle: BinaryIO, out: BinaryIO, failed: Any) -> None:
    """Write an open file's bytes to ``out`` in pieces of ``FETCH_PIECE_BYTES`` (a streaming connector's file
    read: the local folder, a Zotero linked file). A read's ``OSError`` becomes ``failed(error)`` (the
    connector's own ``SourceError``); what ``out.write`` raises passes unchanged."""
    while True:
        try:
            piece = handle.read(FETCH_PIECE_BYTES)
        except OSError as err:
            raise failed(err) from err
        if not piece:
            return
        out.write(piece)


def fetch_via(fetch_to: Any, document: SourceDocument) -> bytes:
    """``Source.fetch`` for a streaming connector: the bytes ``fetch_to(document, buffer)`` writes (for
    callers that want bytes; the pipeline streams)."""
    import io

    buffer = io.BytesIO()
    fetch_to(document, buffer)
    return buffer.getvalue()


@dataclass(frozen=True)
class Scope:
    """Who may read one document: ``principals`` (typed strings, ``rag_pipeline.permissions.principals``:
    ``user:ada@example.com``, ``group:<source>:<id>``, ``domain:example.com``, ``everyone``), or, when the
    source could not tell, ``error`` (the reason) and no principals: readable by nobody but an admin."""

    principals: frozenset[str] = frozenset()
    error: str | None = None

    @classmethod
    def of(cls, principals: Collection[str]) -> Scope:
        """A readable scope of these principals (an empty collection: nobody)."""
        return cls(frozenset(principals))

    @classmethod
    def unreadable(cls, reason: str) -> Scope:
        """The permissions could not be read: nobody may read the document; ``reason`` says why."""
        return cls(frozenset(), reason or "permissions could not be read")


@dataclass(frozen=True)
class GroupMembers:
    """Members of group principals as the source reports them: ``members[group]`` = the principals in it
    (users, or groups that the core expands in turn, nesting resolved transitively with loops cut);
    ``errors[group]`` = why that group's members could not be read. A group in ``errors`` (or asked for
    and absent from both) grants nothing until a later read succeeds: a failed read never widens access."""

    members: Mapping[str, frozenset[str]] = field(default_factory=dict)
    errors: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PermissionChanges:
    """``changed_ids``: source ids whose permissions (or whose ancestors' permissions) changed since the
    cursor, or ``None`` when every document's permissions must be read (no cursor yet, cursor expired);
    ``next_cursor``: the position to keep once those have been read."""

    changed_ids: list[str] | None
    next_cursor: str | None


@runtime_checkable
class PermissionSource(Protocol):
    """A source that knows who may read its documents (every built-in connector)."""

    name: str

    def permissions(self, documents: Sequence[SourceDocument]) -> Mapping[str, Scope]:
        """``{source_id: Scope}`` for each of ``documents``; never raises for one document's failure
        (that document's scope is ``Scope.unreadable``); raises ``SourceError`` only when nothing could be
        read (every document is then treated as unreadable)."""
        ...

    def group_members(self, groups: Collection[str]) -> GroupMembers:
        """Members of each of ``groups`` (principals this source issued); never raises for one group."""
        ...
