"""Google Drive source: a folder (recursively) or a shared drive, through the Drive v3 API.

The client is the real ``google-api-python-client``, built offline from the Drive v3 discovery
document packaged inside ``googleapiclient`` (no network for discovery), authorised with
``google-auth`` service-account or OAuth user credentials read from files named by environment
variables (see :meth:`GoogleDriveSource.from_env`).

Inventory
    ``files.list`` with ``trashed = false``, ``supportsAllDrives`` / ``includeItemsFromAllDrives``,
    ``fields`` naming ``nextPageToken`` and every file field used, paged to the end. A folder scope
    is walked breadth-first (``'<folder>' in parents``); a shared-drive scope is one listing with
    ``corpora=drive``. Shortcuts are resolved to their target (``files.get``) and de-duplicated by
    target id; shortcuts to folders are not followed.

Change feed
    ``changes.list`` from a start page token taken *before* the listing it continues, over My Drive
    and all shared drives (``includeItemsFromAllDrives``), filtered to the scope. Removed or trashed
    files become deletions, restored files come back. The cursor (``Inventory.cursor`` /
    ``ChangeSet.next_cursor``) is opaque: the page token plus the scope's folder ids and shortcut
    map, which the feed needs to decide whether a changed file is in scope. A change the feed cannot
    resolve without a full listing (an in-scope folder trashed, deleted or moved) raises
    :class:`ChangeFeedUnavailable`, and the sync falls back to full reconciliation.

Fetch (streamed: :meth:`GoogleDriveSource.fetch_to`)
    Google-native Docs, Sheets, Slides and Drawings are exported (``files.export``) to DOCX, XLSX,
    PPTX and PDF (or the next format ``about.exportFormats`` offers), never downloaded with
    ``get_media``; other native types (Forms, Sites, ...) are listed with a ``skip_reason``. An
    export refused for size (``exportSizeLimitExceeded``) or a file Drive will not serve raises
    :class:`DocumentSkipped` for that document only. Both go through ``MediaIoBaseDownload``: one
    ``Range`` request per ``FETCH_PIECE_BYTES`` (each retried on its own, nothing written twice), so a
    download never holds more than one piece. Drive honours ``Range`` on ``get_media``; an export
    answered in one ``200`` (a server that ignores ``Range``) arrives whole, up to Drive's export
    limit (about 10 MB), and is still written in pieces.

Boundary checks
    Every answer is checked for its shape before use: a page (``files.list``, ``changes.list``,
    ``files.get``, the start token) that is not an object, or whose ``files``/``changes`` is not a
    list, or whose page token is not a string, raises :class:`ListingIncompleteError`. A file resource
    or change that is not an object, or whose id is not a usable string, is skipped with a log line and
    the listing or change set is marked incomplete (``complete=False``: nothing is deleted, the cursor
    is not kept). Other fields are used only with their documented type (else as if absent); ``size``
    only from a string of ASCII digits or a non-negative int. In permission data a field of the wrong
    type makes that document ``Scope.unreadable`` (a group's members: that group in ``errors``).

Permissions (:meth:`GoogleDriveSource.permissions`, fail closed)
    A document's readers are its Drive ``Permission`` resources, inherited ones included (Drive
    shows a folder's or a shared drive's grants on every item under it). They come from the file
    resource's ``permissions`` field (one ``files.list`` per parent folder holding several documents,
    else ``files.get``); Drive leaves that field out for shared-drive items and for files the caller
    may not share, and then ``permissions.list`` (``supportsAllDrives``, paged) is asked. Any failure
    for one file makes that file ``Scope.unreadable`` (readable by nobody). Mapping, per permission:

    * ``user`` -> ``user:<email>``; ``group`` -> ``group:<source name>:<email>``;
    * ``domain`` -> ``domain:<domain>``, also when ``allowFileDiscovery`` is false ("anyone at
      <domain> with the link"): Drive still restricts that to signed-in accounts of the domain, and
      the index cannot tell who holds the link, so the domain is the honest bound;
    * ``anyone`` -> ``everyone`` only when ``allowFileDiscovery`` is true (public on the web,
      findable) or the source is built with ``link_sharing="everyone"``. "Anyone with the link"
      (``allowFileDiscovery`` false) otherwise grants nothing: having the link is not a principal;
    * every role (reader, commenter, writer, fileOrganizer, organizer, owner) reads; an unknown role,
      a permission of an account that was deleted (``deleted: true``), one past its
      ``expirationTime``, one belonging to a view (``view``) or one lacking its e-mail/domain grants
      nothing (dropping a grant can only narrow access).

Groups (:meth:`GoogleDriveSource.group_members`)
    Google groups are expanded with the Admin SDK Directory API (``members.list``,
    ``includeDerivedMembership=true``, paged), which needs its own credentials carrying
    ``admin.directory.group.member.readonly`` (a service account: domain-wide delegation to a
    Workspace admin via ``subject``, or an admin role assigned to it). Without them every group is
    in ``GroupMembers.errors`` and grants nothing. Users -> ``user:<email>`` (active ones only),
    nested groups -> their group principal; ``CUSTOMER`` members (everyone in the Workspace
    account) are not mapped (no domain is named), so they grant nothing.

Permission changes (:meth:`GoogleDriveSource.permission_changes`)
    The Drive change feed again, on its own page token (``gdriveperm1:<token>``, independent of the
    content cursor): a sharing change is a change of the file (Drive reports every item under a
    re-shared folder too; a changed in-scope folder's subtree is also listed, in case it did not).

Stable id = Drive file id (the target's id for a shortcut), so a rename or move is a metadata
update. HTTP errors 429, 5xx and rate-limit 403s are retried with bounded exponential back-off
(``Retry-After`` honoured when sent).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import re
import socket
import zlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace as _replace_fields
from datetime import datetime, timezone
from typing import Any, BinaryIO, TypeVar

import google.auth.credentials
import google.auth.exceptions
import google_auth_httplib2
import httplib2
from googleapiclient import discovery_cache
from googleapiclient.discovery import build_from_document
from googleapiclient.errors import HttpError
from googleapiclient.http import MediaIoBaseDownload
from tenacity import RetryCallState, Retrying, retry_if_exception

from rag_pipeline.permissions import principals as pr
from rag_pipeline.sources.http import parse_retry_after
from rag_pipeline.sources.base import (
    FETCH_PIECE_BYTES,
    ChangeFeedUnavailable,
    ChangeSet,
    DocumentSkipped,
    GroupMembers,
    Inventory,
    ListingIncompleteError,
    PermissionChanges,
    Scope,
    SourceDocument,
    SourceError,
    fetch_via,
)

log = logging.getLogger(__name__)

DRIVE_READONLY_SCOPE = "https://www.googleapis.com/auth/drive.readonly"
DIRECTORY_MEMBERS_SCOPE = "https://www.googleapis.com/auth/admin.directory.group.member.readonly"
"""The Admin SDK Directory scope :meth:`GoogleDriveSource.group_members` needs (read group members)."""
DIRECTORY_API_URL = "https://admin.googleapis.com/"
FOLDER_MIME = "application/vnd.google-apps.folder"
SHORTCUT_MIME = "application/vnd.google-apps.shortcut"
GOOGLE_APPS_PREFIX = "application/vnd.google-apps."

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
PDF = "application/pdf"

EXPORT_PREFERENCES: Mapping[str, tuple[str, ...]] = {
    "application/vnd.google-apps.document": (DOCX, "text/plain", PDF),
    "application/vnd.google-apps.spreadsheet": (XLSX, "text/csv", PDF),
    "application/vnd.google-apps.presentation": (PPTX, "text/plain", PDF),
    "application/vnd.google-apps.drawing": (PDF,),
}
"""Export formats per Google-native type, most preferred first; all handled by the extractor.
The first one that ``about.exportFormats`` offers for the type is used."""

FILE_FIELDS = (
    "id,name,mimeType,size,md5Checksum,sha256Checksum,modifiedTime,version,headRevisionId,"
    "parents,trashed,driveId,webViewLink,shortcutDetails(targetId,targetMimeType)"
)
"""The file fields every ``files.list`` / ``files.get`` / ``changes.list`` call asks for."""

PERMISSION_FIELDS = (
    "id,type,emailAddress,domain,role,allowFileDiscovery,deleted,expirationTime,view,"
    "permissionDetails(permissionType,role,inherited,inheritedFrom)"
)
"""The ``Permission`` fields read (in ``files(permissions(...))`` and ``permissions.list``)."""
READ_ROLES = frozenset({"reader", "commenter", "writer", "fileOrganizer", "organizer", "owner"})
"""Drive roles that may read a file's content (all of them; an unknown role grants nothing)."""
LINK_SHARING = ("none", "everyone")
"""``link_sharing`` values: what an "anyone with the link" permission grants."""

_CURSOR_PREFIX = "gdrive1:"
_PERMISSION_FILE_FIELDS = f"id,driveId,permissions({PERMISSION_FIELDS})"
_PERMISSION_CURSOR_PREFIX = "gdriveperm1:"
_MAX_FOLDER_DEPTH = 64
_TERMINAL_FETCH_REASONS = frozenset(
    {
        "exportSizeLimitExceeded",
        "cannotExportFile",
        "fileNotDownloadable",
        "cannotDownloadAbusiveFile",
        "cannotDownloadFile",
    }
)
_RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "backendError"})
_TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})

ENV_API_URL = "RAG_GDRIVE_API_URL"
ENV_OAUTH_TOKEN_FILE = "RAG_GDRIVE_OAUTH_TOKEN_FILE"
ENV_OAUTH_TOKEN_URI = "RAG_GDRIVE_OAUTH_TOKEN_URI"
ENV_SERVICE_ACCOUNT_FILE = "GOOGLE_APPLICATION_CREDENTIALS"
ENV_LINK_SHARING = "RAG_GDRIVE_LINK_SHARING"
ENV_DIRECTORY = "RAG_GDRIVE_DIRECTORY"
ENV_DIRECTORY_SUBJECT = "RAG_GDRIVE_DIRECTORY_SUBJECT"
ENV_DIRECTORY_API_URL = "RAG_GDRIVE_DIRECTORY_API_URL"


# --------------------------------------------------------------------------------------------
# errors and retries


class _ReadError(Exception):
    """A permission or group read that went wrong without an HTTP error (a page token repeated)."""


def _error_reason(err: HttpError) -> str:
    """The first ``errors[].reason`` of a Drive error body, or ``""``."""
    try:
        body = json.loads(err.content.decode("utf-8"))
        return str(body["error"]["errors"][0]["reason"])
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return ""


def _status(err: HttpError) -> int:
    return int(getattr(err.resp, "status", 0) or 0)


def _describe(err: HttpError) -> str:
    reason = _error_reason(err)
    return f"HTTP {_status(err)}" + (f" {reason}" if reason else "")


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, HttpError):
        status = _status(exc)
        return status in _TRANSIENT_STATUSES or (
            status == 403 and _error_reason(exc) in _RATE_LIMIT_REASONS
        )
    return isinstance(exc, (OSError, socket.timeout, httplib2.HttpLib2Error))


def _retry_after_s(exc: BaseException | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP date), if the error has one."""
    if not isinstance(exc, HttpError):
        return None
    return parse_retry_after(exc.resp.get("retry-after") if hasattr(exc.resp, "get") else None)


# --------------------------------------------------------------------------------------------
# field checks (Drive answers are JSON of any shape until checked)

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_MAX_SIZE_DIGITS = 19
_MAX_CURSOR_BYTES = 256 * 1024 * 1024
"""Most bytes a cursor's compressed JSON may expand to (a larger one is refused as corrupt)."""

T = TypeVar("T")


class _Malformed(Exception):
    """An answer of the wrong shape (``ValueError``-like, raised inside the connector only)."""


def _text(value: Any) -> str | None:
    """``value`` when it is a string (lone surrogates, which UTF-8 cannot encode, as U+FFFD), else ``None``."""
    if not isinstance(value, str):
        return None
    return _LONE_SURROGATE.sub("\ufffd", value)


def _drive_id(value: Any) -> str | None:
    """A usable Drive id (or page token): a non-empty string UTF-8 can encode, without control characters;
    else ``None``."""
    if isinstance(value, str) and value and not _LONE_SURROGATE.search(value) and not _CONTROL.search(value):
        return value
    return None


def _ids(value: Any) -> list[str]:
    """The usable ids in a list (``parents``); anything but a list: ``[]``."""
    if not isinstance(value, list):
        return []
    return [v for v in value if _drive_id(v)]


def _flag(mapping: Mapping[str, Any], key: str) -> bool:
    """Whether ``mapping[key]`` is ``true`` (a JSON boolean; any other value counts as false)."""
    return mapping.get(key) is True


def _object(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else ``{}``."""
    return value if isinstance(value, dict) else {}


def _size(value: Any) -> int | None:
    """A byte count from Drive's ``size`` (an int64 sent as a string of digits, or an int); else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < 2**63 else None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= _MAX_SIZE_DIGITS:
        number = int(value)
        return number if number < 2**63 else None
    return None


def _file(value: Any) -> dict[str, Any] | None:
    """A file resource with a usable ``id``, or ``None`` for anything else."""
    if isinstance(value, dict) and _drive_id(value.get("id")):
        return value
    return None


def _shortcut_target(item: Mapping[str, Any]) -> str | None:
    """The target id of a shortcut resource when usable (``shortcutDetails.targetId`` a string id, the
    target not a folder), else ``None``."""
    details = _object(item.get("shortcutDetails"))
    target = _drive_id(details.get("targetId"))
    return target if target and details.get("targetMimeType") != FOLDER_MIME else None


_PERMISSION_FIELD_TYPES: Mapping[str, type] = {
    "type": str, "role": str, "emailAddress": str, "domain": str, "view": str, "expirationTime": str,
    "deleted": bool, "allowFileDiscovery": bool,
}
"""The ``Permission`` fields :meth:`GoogleDriveSource._principal` reads, with the JSON type each must have."""


def _check_principal(principal: str) -> None:
    """Raise :class:`_Malformed` for a principal the index cannot store or match as it is."""
    if len(principal) > pr.MAX_PRINCIPAL_CHARS or _LONE_SURROGATE.search(principal) or _CONTROL.search(principal):
        raise _Malformed("a grantee that is no storable principal (too long, a control character, a lone surrogate)")


def _page_token(response: Mapping[str, Any], key: str, what: str) -> str | None:
    """``response[key]`` (a page token): a non-empty string, ``None`` when absent or empty; raises
    :class:`_Malformed` for any other type, or a string that cannot go into a URL (a lone surrogate, a
    control character)."""
    token = response.get(key)
    if token is None or token == "":
        return None
    if not _drive_id(token):
        raise _Malformed(f"{what} sent a {key} that is not a usable string")
    return token


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries for transient HTTP failures (429, 5xx, rate-limit 403, socket errors).

    ``attempts``: total tries per request. Waits grow ``base_wait_s * 2**n`` up to ``max_wait_s``;
    a ``Retry-After`` header is honoured, and one longer than ``max_wait_s`` ends the retries at
    once (the failure is reported as transient, the next sync tries again). Seconds throughout.
    """

    attempts: int = 5
    base_wait_s: float = 1.0
    max_wait_s: float = 60.0

    def retrying(self, is_transient: Any, retry_after: Any) -> Retrying:
        """A tenacity ``Retrying`` applying this policy to exceptions ``is_transient`` accepts."""

        def wait(state: RetryCallState) -> float:
            hinted = retry_after(state.outcome.exception() if state.outcome else None)
            if hinted is not None:
                return hinted
            return min(self.max_wait_s, self.base_wait_s * 2 ** (state.attempt_number - 1))

        def stop(state: RetryCallState) -> bool:
            if state.attempt_number >= self.attempts:
                return True
            hinted = retry_after(state.outcome.exception() if state.outcome else None)
            return hinted is not None and hinted > self.max_wait_s

        return Retrying(
            retry=retry_if_exception(is_transient), wait=wait, stop=stop, reraise=True
        )


# --------------------------------------------------------------------------------------------
# cursor (opaque to the sync)


@dataclass
class _ScopeState:
    """What the change feed needs besides the page token: the scope's folders and shortcuts.

    ``folders``: in-scope folder id -> its parent ids (a shared-drive scope stores ``[]``).
    ``shortcuts``: in-scope shortcut id -> target file id.
    """

    token: str
    folders: dict[str, list[str]] = field(default_factory=dict)
    shortcuts: dict[str, str] = field(default_factory=dict)

    def encode(self) -> str:
        """The opaque cursor string (``gdrive1:`` + base64 of zlib-compressed JSON)."""
        raw = json.dumps(
            {"v": 1, "t": self.token, "f": self.folders, "s": self.shortcuts},
            separators=(",", ":"),
            sort_keys=True,
        ).encode("utf-8")
        return _CURSOR_PREFIX + base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode("ascii")

    @classmethod
    def decode(cls, cursor: str) -> _ScopeState:
        """Parse a cursor from :meth:`encode`; raises ``ValueError`` for anything else: not a string, not
        ``gdrive1:``, not base64/zlib/JSON (or expanding past 256 MiB), not an object of version 1 with a
        page token ``t`` (a non-empty string without lone surrogates or control characters), ``f`` an object of folder id -> list of ids, ``s`` an object of
        shortcut id -> target id (each id a non-empty string)."""
        if not isinstance(cursor, str) or not cursor.startswith(_CURSOR_PREFIX):
            raise ValueError("not a gdrive cursor")
        try:
            inflater = zlib.decompressobj()
            raw = inflater.decompress(base64.urlsafe_b64decode(cursor[len(_CURSOR_PREFIX) :]), _MAX_CURSOR_BYTES)
            if inflater.unconsumed_tail or not inflater.eof:
                raise ValueError("truncated or oversized")
            data = json.loads(raw)
        except (binascii.Error, zlib.error, ValueError, RecursionError) as exc:
            raise ValueError("corrupt gdrive cursor") from exc
        if not isinstance(data, dict) or type(data.get("v")) is not int or data["v"] != 1:
            raise ValueError("unknown gdrive cursor version")
        token, folders, shortcuts = data.get("t"), data.get("f", {}), data.get("s", {})
        if not _drive_id(token):
            raise ValueError("gdrive cursor without a usable page token")
        if not isinstance(folders, dict) or not all(
            _drive_id(k) and isinstance(v, list) and all(_drive_id(p) for p in v) for k, v in folders.items()
        ):
            raise ValueError("gdrive cursor with a malformed folder map")
        if not isinstance(shortcuts, dict) or not all(_drive_id(k) and _drive_id(v) for k, v in shortcuts.items()):
            raise ValueError("gdrive cursor with a malformed shortcut map")
        return cls(token=token, folders={k: list(v) for k, v in folders.items()}, shortcuts=dict(shortcuts))


# --------------------------------------------------------------------------------------------
# streaming


class _PieceWriter:
    """The file object ``MediaIoBaseDownload`` writes to: passes what it gets on to ``out`` in pieces of
    at most ``FETCH_PIECE_BYTES`` (a server that ignores ``Range`` sends one large body) and keeps the
    exception ``out.write`` raised in ``error``, so that it is neither retried nor wrapped."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self.error: BaseException | None = None
        self.written = 0

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        try:
            for start in range(0, len(view), FETCH_PIECE_BYTES):
                piece = view[start : start + FETCH_PIECE_BYTES]
                self._out.write(data if len(piece) == len(view) else bytes(piece))
                self.written += len(piece)
        except BaseException as exc:
            self.error = exc
            raise
        return len(view)


def _next_piece(downloader: MediaIoBaseDownload, sink: _PieceWriter) -> Any:
    """One ``next_chunk`` (no retries of its own); a malformed ``Content-Range``/``Content-Length`` (the
    library's ``int()`` of it) raises :class:`_Malformed`, what ``sink`` raised propagates as it is."""
    try:
        return downloader.next_chunk(num_retries=0)
    except (ValueError, KeyError, IndexError) as exc:
        if exc is sink.error:
            raise
        raise _Malformed(f"Drive sent download headers that cannot be parsed ({type(exc).__name__})") from None


# --------------------------------------------------------------------------------------------
# credentials


def load_credentials(
    *,
    service_account_file: str | None = None,
    oauth_token_file: str | None = None,
    oauth_token_uri: str | None = None,
    scopes: tuple[str, ...] = (DRIVE_READONLY_SCOPE,),
    subject: str | None = None,
) -> google.auth.credentials.Credentials:
    """Credentials from a key file: an OAuth user token file wins over a service-account file.

    ``service_account_file``: a Google service-account JSON key (``"type": "service_account"``);
    google-auth posts its JWT grant to the file's ``token_uri``. ``oauth_token_file``: an
    authorized-user JSON (``client_id``, ``client_secret``, ``refresh_token``) as written by
    ``Credentials.to_json()``; google-auth deliberately ignores a ``token_uri`` in such a file and
    refreshes at Google's endpoint, so another endpoint must be named explicitly with
    ``oauth_token_uri``. ``subject``: a Workspace user a service account acts as (domain-wide
    delegation), e.g. an admin for the Directory API; an OAuth user token cannot take one. Raises
    :class:`SourceError` (not transient) when neither file is given, one is unreadable, or a subject
    is asked of user credentials; the message names the file, never its contents.
    """
    from google.oauth2 import credentials as user_credentials
    from google.oauth2 import service_account

    try:
        if subject and (oauth_token_file or (service_account_file and _is_user_file(service_account_file))):
            raise SourceError("a delegated subject needs a service-account key, not OAuth user credentials",
                              transient=False)
        if oauth_token_file:
            user = user_credentials.Credentials.from_authorized_user_file(
                oauth_token_file, scopes=list(scopes)
            )
            return user.with_token_uri(oauth_token_uri) if oauth_token_uri else user
        if service_account_file:
            with open(service_account_file, encoding="utf-8") as handle:
                info = json.load(handle)
            if info.get("type") == "authorized_user":
                return user_credentials.Credentials.from_authorized_user_info(info, scopes=list(scopes))
            account = service_account.Credentials.from_service_account_info(info, scopes=list(scopes))
            return account.with_subject(subject) if subject else account
    except (OSError, ValueError, KeyError) as exc:
        name = oauth_token_file or service_account_file
        raise SourceError(
            f"cannot load Google credentials from {name}: {type(exc).__name__}", transient=False
        ) from None
    raise SourceError(
        f"no Google credentials: set {ENV_SERVICE_ACCOUNT_FILE} (service-account key file) "
        f"or {ENV_OAUTH_TOKEN_FILE} (OAuth token file)",
        transient=False,
    )


def _is_user_file(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle).get("type") == "authorized_user"
    except (OSError, ValueError, AttributeError):
        return False


# --------------------------------------------------------------------------------------------
# the source


class GoogleDriveSource:
    """Documents in a Google Drive folder (recursively) or a whole shared drive.

    Exactly one scope: ``folder_id`` (a folder in My Drive or in a shared drive; add
    ``shared_drive_id`` when it lies in one, so listings use ``corpora=drive``) or
    ``shared_drive_id`` alone (the whole shared drive). ``credentials``: any google-auth
    credentials (see :func:`load_credentials`). ``api_url``: the API base including the service
    path, default ``https://www.googleapis.com/drive/v3/`` (from the discovery document).
    ``name`` defaults to ``gdrive:folder/<id>`` or ``gdrive:drive/<id>``. ``page_size``: items per
    ``files.list`` / ``changes.list`` page (Drive caps it at 1000). ``timeout_s``: per HTTP request.

    Permissions (see the module docstring): ``link_sharing`` is ``"none"`` (default: "anyone with
    the link" grants nothing) or ``"everyone"`` (it grants ``everyone``). ``directory_credentials``:
    google-auth credentials for the Admin SDK Directory API with :data:`DIRECTORY_MEMBERS_SCOPE`
    (e.g. ``load_credentials(..., scopes=(DIRECTORY_MEMBERS_SCOPE,), subject=<admin>)``); ``None``:
    groups cannot be expanded, each lands in ``GroupMembers.errors`` and grants nothing.
    ``directory_api_url``: the Directory API root, default ``https://admin.googleapis.com/``.

    Not thread-safe (one ``httplib2`` connection pool); use one instance per sync.
    """

    def __init__(
        self,
        *,
        credentials: google.auth.credentials.Credentials,
        folder_id: str | None = None,
        shared_drive_id: str | None = None,
        api_url: str | None = None,
        name: str | None = None,
        page_size: int = 1000,
        timeout_s: float = 120.0,
        retry: RetryPolicy | None = None,
        link_sharing: str = "none",
        directory_credentials: google.auth.credentials.Credentials | None = None,
        directory_api_url: str | None = None,
    ) -> None:
        if not folder_id and not shared_drive_id:
            raise ValueError("GoogleDriveSource needs folder_id or shared_drive_id")
        if link_sharing not in LINK_SHARING:
            raise ValueError(f"link_sharing must be one of {LINK_SHARING}, not {link_sharing!r}")
        self.link_sharing = link_sharing
        self.folder_id = folder_id or None
        self.shared_drive_id = shared_drive_id or None
        self.name = name or (
            f"gdrive:folder/{folder_id}" if folder_id else f"gdrive:drive/{shared_drive_id}"
        )
        self._page_size = page_size
        self._retry = retry or RetryPolicy()
        self._export_formats: dict[str, list[str]] | None = None
        self._malformed: list[str] = []
        client_options: dict[str, str] = {}
        if api_url:
            client_options["api_endpoint"] = api_url if api_url.endswith("/") else api_url + "/"
        http = google_auth_httplib2.AuthorizedHttp(credentials, http=httplib2.Http(timeout=timeout_s))
        self._service = build_from_document(
            discovery_cache.get_static_doc("drive", "v3"),
            http=http,
            client_options=client_options or None,
        )
        self._directory = None
        if directory_credentials is not None:
            root = directory_api_url or DIRECTORY_API_URL
            self._directory = build_from_document(
                discovery_cache.get_static_doc("admin", "directory_v1"),
                http=google_auth_httplib2.AuthorizedHttp(
                    directory_credentials, http=httplib2.Http(timeout=timeout_s)
                ),
                client_options={"api_endpoint": root if root.endswith("/") else root + "/"},
            )

    @classmethod
    def from_env(
        cls,
        *,
        folder_id: str | None = None,
        shared_drive_id: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> GoogleDriveSource:
        """Build from environment variables.

        ``RAG_GDRIVE_OAUTH_TOKEN_FILE`` (OAuth authorized-user token file; its refresh endpoint
        ``RAG_GDRIVE_OAUTH_TOKEN_URI``, default Google's) or else ``GOOGLE_APPLICATION_CREDENTIALS``
        (service-account key file, whose ``token_uri`` is used) for credentials;
        ``RAG_GDRIVE_API_URL`` for the API base including ``drive/v3/`` (default: Google's).
        Permissions: ``RAG_GDRIVE_LINK_SHARING`` (``none``, default, or ``everyone``); group
        expansion is on when ``RAG_GDRIVE_DIRECTORY_SUBJECT`` names the Workspace admin a service
        account acts as, or ``RAG_GDRIVE_DIRECTORY=1`` (credentials already allowed to read groups):
        the same key file with :data:`DIRECTORY_MEMBERS_SCOPE`; ``RAG_GDRIVE_DIRECTORY_API_URL``
        for the Directory API root (default Google's). ``env`` defaults to ``os.environ``. Raises
        :class:`SourceError` (not transient) without credentials or with a bad setting.
        """
        env = os.environ if env is None else env
        files = {
            "service_account_file": env.get(ENV_SERVICE_ACCOUNT_FILE) or None,
            "oauth_token_file": env.get(ENV_OAUTH_TOKEN_FILE) or None,
            "oauth_token_uri": env.get(ENV_OAUTH_TOKEN_URI) or None,
        }
        credentials = load_credentials(**files)
        link_sharing = (env.get(ENV_LINK_SHARING) or "none").strip().lower()
        if link_sharing not in LINK_SHARING:
            raise SourceError(f"{ENV_LINK_SHARING} must be one of {', '.join(LINK_SHARING)}", transient=False)
        subject = (env.get(ENV_DIRECTORY_SUBJECT) or "").strip() or None
        directory = None
        if subject or (env.get(ENV_DIRECTORY) or "").strip().lower() in ("1", "true", "yes", "on"):
            directory = load_credentials(**files, scopes=(DIRECTORY_MEMBERS_SCOPE,), subject=subject)
        return cls(
            credentials=credentials,
            folder_id=folder_id,
            shared_drive_id=shared_drive_id,
            api_url=env.get(ENV_API_URL) or None,
            link_sharing=link_sharing,
            directory_credentials=directory,
            directory_api_url=env.get(ENV_DIRECTORY_API_URL) or None,
        )

    # ---- HTTP ---------------------------------------------------------------------------

    def _execute(self, request: Any) -> Any:
        """Run one API request with the retry policy; HttpError / socket errors propagate, a
        failed token grant becomes a transient :class:`SourceError` naming only the OAuth error code."""
        return self._call(lambda: request.execute(num_retries=0))

    def _call(self, call: Callable[[], T], is_transient: Callable[[BaseException], bool] = _is_transient) -> T:
        """``call()`` under the retry policy, retrying the exceptions ``is_transient`` accepts (default: 429,
        5xx, rate-limit 403, socket errors); the last exception propagates, except a failed token grant,
        which becomes a transient :class:`SourceError` naming only the OAuth error code."""
        try:
            for attempt in self._retry.retrying(is_transient, _retry_after_s):
                with attempt:
                    return call()
        except google.auth.exceptions.RefreshError as exc:
            code = str(exc.args[0]).split(":", 1)[0] if exc.args else "unknown"
            raise SourceError(f"Google token request failed: {code}") from None
        except google.auth.exceptions.TransportError as exc:
            raise SourceError(f"Google token endpoint unreachable: {type(exc).__name__}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _list_files(self, q: str, file_fields: str = FILE_FIELDS) -> Iterator[dict[str, Any]]:
        """Every file matching ``q``, all pages; raises ListingIncompleteError on any failure, including a
        page that is not an object, ``files`` that is not a list or a page token that is not a string.
        A file that is not an object or lacks a usable ``id`` is skipped with a log line and noted in
        ``self._malformed`` (the listing then reports itself incomplete)."""
        params: dict[str, Any] = {
            "q": q,
            "fields": f"nextPageToken,incompleteSearch,files({file_fields})",
            "pageSize": self._page_size,
            "spaces": "drive",
            "supportsAllDrives": True,
            "includeItemsFromAllDrives": True,
        }
        if self.shared_drive_id:
            params.update(corpora="drive", driveId=self.shared_drive_id)
        else:
            params["corpora"] = "allDrives"
        seen_tokens: set[str] = set()
        page_token: str | None = None
        while True:
            try:
                response = self._execute(
                    self._service.files().list(**params, **({"pageToken": page_token} if page_token else {}))
                )
            except HttpError as exc:
                raise ListingIncompleteError(f"files.list failed: {_describe(exc)}") from exc
            except (OSError, httplib2.HttpLib2Error) as exc:
                raise ListingIncompleteError(f"files.list failed: {type(exc).__name__}") from exc
            if not isinstance(response, dict):
                raise ListingIncompleteError("files.list returned a page that is not an object")
            if response.get("incompleteSearch"):
                raise ListingIncompleteError("files.list reported incompleteSearch")
            items = response.get("files", [])
            if not isinstance(items, list):
                raise ListingIncompleteError("files.list returned a page whose files is not a list")
            try:
                page_token = _page_token(response, "nextPageToken", "files.list")
            except _Malformed as exc:
                raise ListingIncompleteError(str(exc)) from None
            for item in items:
                if _file(item) is None:
                    self._note_malformed("files.list returned a file resource that is not an object with a string id")
                    continue
                yield item
            if not page_token:
                return
            if page_token in seen_tokens:
                raise ListingIncompleteError("files.list returned a page token it had returned before")
            seen_tokens.add(page_token)

    def _note_malformed(self, what: str) -> None:
        """Log an item skipped for its shape (never its content) and remember it for the listing's verdict."""
        log.warning("gdrive: %s; skipped", what)
        self._malformed.append(what)

    def _get_file(self, file_id: str) -> dict[str, Any] | None:
        """``files.get`` metadata, or ``None`` when the file is gone or not visible (404). Other HTTP errors
        propagate; a socket error or an answer that is not a file resource with a string id raises
        :class:`ListingIncompleteError`."""
        try:
            response = self._execute(
                self._service.files().get(fileId=file_id, fields=FILE_FIELDS, supportsAllDrives=True)
            )
        except HttpError as exc:
            if _status(exc) == 404:
                return None
            raise
        except (OSError, httplib2.HttpLib2Error) as exc:
            raise ListingIncompleteError(f"files.get failed: {type(exc).__name__}") from exc
        item = _file(response)
        if item is None:
            raise ListingIncompleteError("files.get returned something that is not a file resource with a string id")
        return item

    def _start_page_token(self) -> str:
        """``changes.getStartPageToken``; raises :class:`ListingIncompleteError` on a failure or an answer
        without a string ``startPageToken``."""
        try:
            response = self._execute(
                self._service.changes().getStartPageToken(supportsAllDrives=True)
            )
        except HttpError as exc:
            raise ListingIncompleteError(f"changes.getStartPageToken failed: {_describe(exc)}") from exc
        except (OSError, httplib2.HttpLib2Error) as exc:
            raise ListingIncompleteError(f"changes.getStartPageToken failed: {type(exc).__name__}") from exc
        token = _object(response).get("startPageToken")
        if not _drive_id(token):
            raise ListingIncompleteError("changes.getStartPageToken returned no usable startPageToken")
        return token

    # ---- scope --------------------------------------------------------------------------

    def _in_scope(self, item: Mapping[str, Any], folders: Mapping[str, Any]) -> bool:
        """Whether a (non-removed) file or folder lies in the scope, given the in-scope folders."""
        if _flag(item, "trashed"):
            return False
        if self.folder_id:
            if item.get("id") == self.folder_id:
                return True
            return any(parent in folders for parent in _ids(item.get("parents")))
        return item.get("driveId") == self.shared_drive_id

    def _walk(
        self, start: str, folders: dict[str, list[str]], files: dict[str, dict[str, Any]],
        shortcuts: dict[str, str],
    ) -> None:
        """Breadth-first listing of the subtree under folder ``start`` into the three maps."""
        queue = [start]
        while queue:
            parent = queue.pop(0)
            for item in self._list_files(f"'{_quote(parent)}' in parents and trashed = false"):
                self._classify(item, folders, files, shortcuts, queue)

    def _classify(
        self, item: dict[str, Any], folders: dict[str, list[str]], files: dict[str, dict[str, Any]],
        shortcuts: dict[str, str], queue: list[str] | None = None,
    ) -> None:
        mime = item.get("mimeType")
        item_id = _drive_id(item.get("id"))
        if not item_id:
            return
        if mime == FOLDER_MIME:
            if item_id not in folders:
                folders[item_id] = sorted(_ids(item.get("parents"))) if self.folder_id else []
                if queue is not None:
                    queue.append(item_id)
        elif mime == SHORTCUT_MIME:
            target = _shortcut_target(item)
            if target:
                shortcuts[item_id] = target
        else:
            files[item_id] = item

    def _resolve_targets(
        self, files: dict[str, dict[str, Any]], shortcuts: dict[str, str]
    ) -> None:
        """Add each shortcut's target to ``files`` (de-duplicated by target id); drop dangling ones."""
        for shortcut_id, target_id in list(shortcuts.items()):
            if target_id in files:
                continue
            target = self._get_file(target_id)
            if target is None or _flag(target, "trashed") or target.get("mimeType") in (FOLDER_MIME, SHORTCUT_MIME):
                log.info("gdrive: shortcut %s points at nothing usable (%s); ignored", shortcut_id, target_id)
                del shortcuts[shortcut_id]
                continue
            files[target_id] = target

    # ---- Source protocol ----------------------------------------------------------------

    def list_documents(self) -> Inventory:
        """Full listing of the scope, with a change-feed cursor valid as of its start.

        Raises :class:`ListingIncompleteError` when any page fails or is malformed, a page token
        repeats, Drive reports ``incompleteSearch``, or the scope folder is missing or trashed (so
        nothing is ever reconciled against a short list). A file resource skipped for its shape makes
        the inventory ``complete=False`` (its documents are still listed; nothing is deleted).
        """
        self._malformed = []
        try:
            token = self._start_page_token()
            folders: dict[str, list[str]] = {}
            files: dict[str, dict[str, Any]] = {}
            shortcuts: dict[str, str] = {}
            if self.folder_id:
                root = self._get_file(self.folder_id)
                if root is None or _flag(root, "trashed") or root.get("mimeType") != FOLDER_MIME:
                    raise ListingIncompleteError(
                        f"scope folder {self.folder_id} is missing, trashed or not a folder"
                    )
                folders[self.folder_id] = []
                self._walk(self.folder_id, folders, files, shortcuts)
            else:
                for item in self._list_files("trashed = false"):
                    self._classify(item, folders, files, shortcuts)
            self._resolve_targets(files, shortcuts)
        except HttpError as exc:
            raise ListingIncompleteError(f"Drive listing failed: {_describe(exc)}") from exc
        documents = [self._to_document(item, shortcuts) for item in files.values()]
        state = _ScopeState(token=token, folders=folders, shortcuts=shortcuts)
        if self._malformed:
            return Inventory(documents=documents, complete=False, cursor=state.encode(),
                             incomplete_reason=f"{len(self._malformed)} malformed item(s) skipped: {self._malformed[0]}")
        return Inventory(documents=documents, complete=True, cursor=state.encode())

    def changes(self, cursor: str | None) -> ChangeSet:
        """Upserts and deletions in the scope since ``cursor`` (from a previous listing or feed).

        Raises :class:`ChangeFeedUnavailable` when there is no usable cursor, Drive rejects the
        page token, or an in-scope folder was trashed, deleted or moved (full reconciliation is
        then the only correct answer); :class:`ListingIncompleteError` when a page fails part-way.
        Deletions may name files the index never held (files that left the scope or were never
        in it); the sync ignores those. A change or file skipped for its shape makes the change set
        ``complete=False`` (the sync then keeps the old cursor and reads these changes again).
        """
        self._malformed = []
        if not cursor:
            raise ChangeFeedUnavailable("no Drive change cursor stored yet")
        try:
            state = _ScopeState.decode(cursor)
        except ValueError as exc:
            raise ChangeFeedUnavailable(f"unusable Drive cursor: {exc}") from None
        latest, new_token = self._read_changes(state.token)
        try:
            changes = self._apply_changes(state, latest, new_token)
        except HttpError as exc:
            raise ListingIncompleteError(f"Drive change resolution failed: {_describe(exc)}") from exc
        if self._malformed:
            return _replace_fields(
                changes, complete=False,
                incomplete_reason=f"{len(self._malformed)} malformed item(s) skipped: {self._malformed[0]}")
        return changes

    def fetch(self, document: SourceDocument) -> bytes:
        """The document's bytes (:meth:`fetch_to` into memory; the pipeline streams instead)."""
        return fetch_via(self.fetch_to, document)

    def fetch_to(self, document: SourceDocument, out: BinaryIO) -> None:
        """Write the document's bytes to ``out`` in pieces of at most ``FETCH_PIECE_BYTES``, as they arrive:
        ``files.export`` for Google-native types, else ``get_media``, both through ``MediaIoBaseDownload``
        (one ``Range`` request per piece, each under the retry policy; a failed piece is asked for again
        and nothing is written twice).

        Raises :class:`DocumentSkipped` when Drive refuses for good (export too large, not
        exportable, not downloadable, flagged as abusive) and :class:`SourceError` otherwise
        (transient: rate limits, server errors, a file deleted since the listing, a download that
        stops making progress or overruns its announced length). Whatever ``out.write`` raises (the
        size cap's ``DocumentTooLargeError``, a full disk) propagates unchanged and is never retried: no
        further piece is requested.
        """
        if document.skip_reason:
            raise DocumentSkipped(document.skip_reason)
        export_mime = document.metadata.get("export_mime_type")
        files = self._service.files()
        if isinstance(export_mime, str) and export_mime:
            request = files.export_media(fileId=document.source_id, mimeType=export_mime)
            action = "export"
        else:
            request = files.get_media(fileId=document.source_id, supportsAllDrives=True)
            action = "download"
        sink = _PieceWriter(out)
        downloader = MediaIoBaseDownload(sink, request, chunksize=FETCH_PIECE_BYTES)

        def transient(exc: BaseException) -> bool:
            return exc is not sink.error and _is_transient(exc)

        try:
            done, position = False, 0
            while not done:
                status, done = self._call(lambda: _next_piece(downloader, sink), transient)
                total = status.total_size
                if total is not None and status.resumable_progress > total:
                    raise _Malformed(f"Drive sent more than the {total} bytes it announced")
                if not done and status.resumable_progress <= position:
                    raise _Malformed("Drive sent a piece without bytes before the end")
                position = status.resumable_progress
        except HttpError as exc:
            if exc is sink.error:
                raise
            reason = _error_reason(exc)
            if reason in _TERMINAL_FETCH_REASONS:
                raise DocumentSkipped(f"Drive refused {action}: {reason}") from None
            if _status(exc) == 404:
                raise SourceError(f"Drive {action} failed: file not found (deleted since listing?)") from exc
            raise SourceError(f"Drive {action} failed: {_describe(exc)}") from exc
        except (OSError, httplib2.HttpLib2Error) as exc:
            if exc is sink.error:
                raise
            raise SourceError(f"Drive {action} failed: {type(exc).__name__}") from exc
        except _Malformed as exc:
            raise SourceError(f"Drive {action} failed: {exc}") from None

    # ---- PermissionSource protocol ------------------------------------------------------

    def permissions(self, documents: Sequence[SourceDocument]) -> dict[str, Scope]:
        """``{source_id: Scope}`` for each of ``documents`` (mapping: see the module docstring).

        Uses only ``source_id`` and ``metadata["parents"]`` / ``metadata["drive_id"]`` (as the
        listing stored them). Documents sharing a My Drive parent are read with one paged
        ``files.list`` of that parent, the others with ``files.get``; shared-drive items and files
        whose resource carries no ``permissions`` go through ``permissions.list``. Any failure for
        one file (HTTP error after retries, socket error, a page token repeated, an answer or a
        permission of the wrong shape: not an object, a field of the wrong type, a grantee that is no
        storable text) makes it ``Scope.unreadable`` with the reason; raises :class:`SourceError` only
        when the credentials fail (no token: nothing can be read).
        """
        wanted = {d.source_id: d for d in documents}
        resources: dict[str, dict[str, Any]] = {}
        by_parent: dict[str, list[str]] = {}
        for document in wanted.values():
            parents = _ids(document.metadata.get("parents"))
            if parents and not document.metadata.get("drive_id"):
                by_parent.setdefault(parents[0], []).append(document.source_id)
        for parent, ids in by_parent.items():
            if len(ids) < 2:
                continue
            try:
                for item in self._list_files(
                    f"'{_quote(parent)}' in parents and trashed = false", _PERMISSION_FILE_FIELDS
                ):
                    if item.get("id") in wanted:
                        resources[item["id"]] = item
            except ListingIncompleteError as exc:
                log.info("gdrive: listing %s for permissions failed (%s); reading its files one by one", parent, exc)
            except (OSError, httplib2.HttpLib2Error) as exc:
                log.info("gdrive: listing %s for permissions failed (%s); reading its files one by one",
                         parent, type(exc).__name__)
        scopes: dict[str, Scope] = {}
        for source_id, document in wanted.items():
            try:
                scopes[source_id] = self._file_scope(document, resources.get(source_id))
            except HttpError as exc:
                scopes[source_id] = Scope.unreadable(f"Drive permissions could not be read: {_describe(exc)}")
            except (_ReadError, _Malformed) as exc:
                scopes[source_id] = Scope.unreadable(f"Drive permissions could not be read: {exc}")
            except (OSError, httplib2.HttpLib2Error) as exc:
                scopes[source_id] = Scope.unreadable(f"Drive permissions could not be read: {type(exc).__name__}")
        return scopes

    def group_members(self, groups: Collection[str]) -> GroupMembers:
        """Members of Google groups (principals ``group:<self.name>:<email>``) from the Directory API.

        ``members.list`` with ``includeDerivedMembership=true`` (direct and nested members), every
        page. Members: ``USER`` (status active or unset) -> ``user:<email>``, ``GROUP`` -> its group
        principal; others (``CUSTOMER``, suspended users, members without an e-mail) are left out.
        A group that cannot be read (no Directory credentials, 403, 404, timeout, a repeated page
        token, a principal of another source, a page or member of the wrong shape: not an object,
        ``members`` not a list, ``email``/``type``/``status`` not strings) is in ``errors`` with the
        reason; never raises.
        """
        members: dict[str, frozenset[str]] = {}
        errors: dict[str, str] = {}
        prefix = f"group:{self.name}:"
        for principal in dict.fromkeys(groups):
            key = principal[len(prefix):] if isinstance(principal, str) and principal.startswith(prefix) else ""
            if not key:
                errors[principal] = f"not a group principal of {self.name}"
            elif self._directory is None:
                errors[principal] = (
                    "Google group members cannot be read: no Directory API credentials "
                    f"({DIRECTORY_MEMBERS_SCOPE}) configured"
                )
            else:
                try:
                    members[principal] = self._read_group(key) - {principal}
                except HttpError as exc:
                    errors[principal] = f"members.list failed: {_describe(exc)}"
                except (_ReadError, _Malformed, SourceError) as exc:
                    errors[principal] = f"members.list failed: {exc}"
                except (OSError, httplib2.HttpLib2Error) as exc:
                    errors[principal] = f"members.list failed: {type(exc).__name__}"
        return GroupMembers(members=members, errors=errors)

    def permission_changes(self, cursor: str | None) -> PermissionChanges:
        """Files whose sharing may have changed since ``cursor``, from the Drive change feed.

        ``cursor`` is ``gdriveperm1:<page token>`` from a previous call (not the content cursor).
        No cursor, another kind of cursor, a token Drive rejects or a feed that fails part-way:
        ``PermissionChanges(None, <fresh token>)`` (read every document; the token is taken before
        that read, so nothing is missed). Otherwise ``changed_ids``: every changed file (a shared-
        drive scope keeps only that drive's), plus all files under each changed in-scope folder;
        ids may name files outside a folder scope or not indexed (the caller reads only its
        documents). Raises :class:`SourceError` when not even a start token can be had.
        """
        token = cursor[len(_PERMISSION_CURSOR_PREFIX):] if isinstance(cursor, str) else ""
        if isinstance(cursor, str) and cursor.startswith(_PERMISSION_CURSOR_PREFIX) and _drive_id(token):
            self._malformed = []
            try:
                latest, new_token = self._read_changes(token)
                changed = self._permission_changed_ids(latest)
                if self._malformed:
                    raise ChangeFeedUnavailable(f"{len(self._malformed)} malformed item(s) in the feed")
            except ChangeFeedUnavailable as exc:
                log.info("gdrive: permission change feed unusable (%s); reading every document", exc)
            except (ListingIncompleteError, HttpError, OSError, httplib2.HttpLib2Error) as exc:
                log.warning("gdrive: permission change feed failed (%s); reading every document", type(exc).__name__)
            else:
                return PermissionChanges(sorted(changed), _PERMISSION_CURSOR_PREFIX + new_token)
        return PermissionChanges(None, _PERMISSION_CURSOR_PREFIX + self._start_page_token())

    # ---- permission internals -----------------------------------------------------------

    def _file_scope(self, document: SourceDocument, item: Mapping[str, Any] | None) -> Scope:
        """The scope of one file: its resource's ``permissions`` if Drive sent them, else ``permissions.list``."""
        if item is None and not document.metadata.get("drive_id"):
            item = self._execute(
                self._service.files().get(
                    fileId=document.source_id, fields=_PERMISSION_FILE_FIELDS, supportsAllDrives=True
                )
            )
            if not isinstance(item, dict):
                raise _Malformed("files.get returned something that is not a file resource")
        permissions = item.get("permissions") if item is not None else None
        if permissions is not None:
            if not isinstance(permissions, list):
                raise _Malformed("the file's permissions field is not a list")
            return self._scope(permissions)
        return self._scope(self._list_permissions(document.source_id))

    def _list_permissions(self, file_id: str) -> list[dict[str, Any]]:
        """Every permission of ``file_id`` (``permissions.list``, all pages)."""
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        page_token: str | None = None
        while True:
            response = self._execute(
                self._service.permissions().list(
                    fileId=file_id, supportsAllDrives=True, pageSize=100,
                    fields=f"nextPageToken,permissions({PERMISSION_FIELDS})",
                    **({"pageToken": page_token} if page_token else {}),
                )
            )
            if not isinstance(response, dict):
                raise _Malformed("permissions.list returned a page that is not an object")
            permissions = response.get("permissions", [])
            if not isinstance(permissions, list):
                raise _Malformed("permissions.list returned a page whose permissions is not a list")
            out.extend(permissions)
            page_token = _page_token(response, "nextPageToken", "permissions.list")
            if not page_token:
                return out
            if page_token in seen:
                raise _ReadError("permissions.list returned a page token it had returned before")
            seen.add(page_token)

    def _scope(self, permissions: list[Any]) -> Scope:
        """The scope the permissions grant; raises :class:`_Malformed` for a permission of the wrong shape
        (the whole document is then unreadable: dropping only that permission could hide nothing, but a
        feed that sends garbage is not trusted for the rest either)."""
        now = datetime.now(timezone.utc)
        return Scope.of({p for p in (self._principal(perm, now) for perm in permissions) if p})

    def _principal(self, permission: Any, now: datetime) -> str | None:
        """The principal one Drive permission grants reading to, or ``None`` (it grants nothing).

        Raises :class:`_Malformed` when the permission is not an object, a field read is of the wrong
        type (``type``, ``role``, ``emailAddress``, ``domain``, ``view``, ``expirationTime``: strings;
        ``deleted``, ``allowFileDiscovery``: booleans; JSON ``null`` counts as absent), or the principal
        would not be storable text (a lone surrogate, a control character, over ``MAX_PRINCIPAL_CHARS``)."""
        if not isinstance(permission, dict):
            raise _Malformed("a permission that is not an object")
        for key, kind in _PERMISSION_FIELD_TYPES.items():
            value = permission.get(key)
            if value is not None and not isinstance(value, kind):
                raise _Malformed(f"a permission whose {key} is not a {kind.__name__}")
        if permission.get("deleted") or permission.get("view") or permission.get("role") not in READ_ROLES:
            return None
        expiration = permission.get("expirationTime")
        if expiration is not None:
            expires = _parse_time(expiration)
            if expires is None or expires <= now:
                return None
        kind = permission.get("type")
        email = permission.get("emailAddress") or ""
        principal: str | None = None
        try:
            if kind == "user" and email:
                principal = pr.user(email)
            elif kind == "group" and email:
                principal = pr.group(self.name, email)
            elif kind == "domain" and permission.get("domain"):
                principal = pr.domain(permission["domain"])
            elif kind == "anyone" and (permission.get("allowFileDiscovery") or self.link_sharing == "everyone"):
                principal = pr.EVERYONE
        except ValueError:
            log.info("gdrive: a %s permission with an unusable grantee grants nothing", kind)
            return None
        if principal is not None:
            _check_principal(principal)
        return principal

    def _read_group(self, key: str) -> frozenset[str]:
        """Principals of the (direct and derived) members of the group ``key`` (its e-mail)."""
        assert self._directory is not None
        out: set[str] = set()
        seen: set[str] = set()
        page_token: str | None = None
        while True:
            response = self._execute(
                self._directory.members().list(
                    groupKey=key, includeDerivedMembership=True, maxResults=200,
                    fields="nextPageToken,members(email,type,status)",
                    **({"pageToken": page_token} if page_token else {}),
                )
            )
            if not isinstance(response, dict):
                raise _Malformed("members.list returned a page that is not an object")
            members = response.get("members", [])
            if not isinstance(members, list):
                raise _Malformed("members.list returned a page whose members is not a list")
            for member in members:
                if not isinstance(member, dict):
                    raise _Malformed("members.list returned a member that is not an object")
                for field_name in ("email", "type", "status"):
                    if member.get(field_name) is not None and not isinstance(member[field_name], str):
                        raise _Malformed(f"members.list returned a member whose {field_name} is not a string")
                email = member.get("email") or ""
                kind = member.get("type")
                try:
                    if kind == "USER" and email and (member.get("status") or "ACTIVE") == "ACTIVE":
                        principal = pr.user(email)
                    elif kind == "GROUP" and email:
                        principal = pr.group(self.name, email)
                    else:
                        continue
                except ValueError:
                    continue
                _check_principal(principal)
                out.add(principal)
            page_token = _page_token(response, "nextPageToken", "members.list")
            if not page_token:
                return frozenset(out)
            if page_token in seen:
                raise _ReadError("members.list returned a page token it had returned before")
            seen.add(page_token)

    def _permission_changed_ids(self, latest: Mapping[str, Mapping[str, Any]]) -> set[str]:
        changed: set[str] = set()
        folders: list[Mapping[str, Any]] = []
        for file_id, change in latest.items():
            item = change.get("file") or {}
            if self.shared_drive_id and item and item.get("driveId") != self.shared_drive_id:
                continue
            mime = item.get("mimeType")
            if mime == FOLDER_MIME:
                if not _flag(item, "trashed"):
                    folders.append(item)
            elif mime != SHORTCUT_MIME:
                changed.add(file_id)
        in_scope: dict[str, bool] = {}
        for folder in folders:
            if self._folder_in_scope(folder, in_scope):
                changed |= self._files_under(folder["id"])
        return changed

    def _folder_in_scope(self, folder: Mapping[str, Any], cache: dict[str, bool]) -> bool:
        """Whether ``folder`` lies under the scope (its ancestors read with ``files.get``, cached)."""
        if self.shared_drive_id and not self.folder_id:
            return True   # the driveId filter already applied
        chain: list[str] = []
        current: Mapping[str, Any] | None = folder
        result = True     # deeper than _MAX_FOLDER_DEPTH: read it rather than miss it
        for _ in range(_MAX_FOLDER_DEPTH):
            folder_id = current["id"]
            if folder_id == self.folder_id or folder_id in cache:
                result = folder_id == self.folder_id or cache[folder_id]
                break
            chain.append(folder_id)
            parents = _ids(current.get("parents"))
            current = self._get_file(parents[0]) if parents else None
            if current is None:
                result = False
                break
        for folder_id in chain:
            cache[folder_id] = result
        return result

    def _files_under(self, folder_id: str) -> set[str]:
        """Ids of every (non-folder, non-shortcut) file under ``folder_id``, recursively."""
        out: set[str] = set()
        queue, seen = [folder_id], {folder_id}
        while queue:
            parent = queue.pop(0)
            for item in self._list_files(f"'{_quote(parent)}' in parents and trashed = false", "id,mimeType"):
                if item.get("mimeType") == FOLDER_MIME:
                    if item["id"] not in seen:
                        seen.add(item["id"])
                        queue.append(item["id"])
                elif item.get("mimeType") != SHORTCUT_MIME:
                    out.add(item["id"])
        return out

    # ---- change feed internals ----------------------------------------------------------

    def _read_changes(self, token: str) -> tuple[dict[str, dict[str, Any]], str]:
        """All changes since ``token``: the last change per file id (checked, see :meth:`_checked_change`),
        and the new start token. Raises :class:`ChangeFeedUnavailable` when Drive rejects ``token`` or the
        shared drive of the scope went away, :class:`ListingIncompleteError` when a page fails or is not
        an object with a ``changes`` list and string page tokens."""
        latest: dict[str, dict[str, Any]] = {}
        fields = f"nextPageToken,newStartPageToken,changes(changeType,removed,fileId,driveId,file({FILE_FIELDS}))"
        seen: set[str] = set()
        page_token = token
        first = True
        while True:
            request = self._service.changes().list(
                pageToken=page_token,
                pageSize=self._page_size,
                fields=fields,
                includeRemoved=True,
                includeItemsFromAllDrives=True,
                supportsAllDrives=True,
                spaces="drive",
            )
            try:
                response = self._execute(request)
            except HttpError as exc:
                if first and _status(exc) in (400, 404, 410):
                    raise ChangeFeedUnavailable(
                        f"Drive rejected the change token: {_describe(exc)}"
                    ) from exc
                raise ListingIncompleteError(f"changes.list failed: {_describe(exc)}") from exc
            except (OSError, httplib2.HttpLib2Error) as exc:
                raise ListingIncompleteError(f"changes.list failed: {type(exc).__name__}") from exc
            first = False
            if not isinstance(response, dict):
                raise ListingIncompleteError("changes.list returned a page that is not an object")
            changes = response.get("changes", [])
            if not isinstance(changes, list):
                raise ListingIncompleteError("changes.list returned a page whose changes is not a list")
            try:
                new_start = _page_token(response, "newStartPageToken", "changes.list")
                next_token = _page_token(response, "nextPageToken", "changes.list")
            except _Malformed as exc:
                raise ListingIncompleteError(str(exc)) from None
            for change in changes:
                checked = self._checked_change(change)
                if checked is not None:
                    file_id, normal = checked
                    latest.pop(file_id, None)  # keep feed order: the last change wins
                    latest[file_id] = normal
            if new_start:
                return latest, new_start
            page_token = next_token
            if not page_token:
                raise ListingIncompleteError("changes.list page had neither nextPageToken nor newStartPageToken")
            if page_token in seen:
                raise ListingIncompleteError("changes.list returned a page token it had returned before")
            seen.add(page_token)

    def _checked_change(self, change: Any) -> tuple[str, dict[str, Any]] | None:
        """``(file id, {"removed": bool, "file": resource or None, "driveId": ...})`` for a file change;
        ``None`` for a drive change, and for a change of the wrong shape (not an object, ``removed`` not a
        boolean, ``file`` not a resource with a string id, no usable file id, ``fileId`` and ``file.id``
        differing), which is logged and noted (the change set is then incomplete). Raises
        :class:`ChangeFeedUnavailable` when the scope's shared drive was removed."""
        if not isinstance(change, dict):
            self._note_malformed("changes.list returned a change that is not an object")
            return None
        removed = change.get("removed")
        if removed is not None and not isinstance(removed, bool):
            self._note_malformed("changes.list returned a change whose removed is not a boolean")
            return None
        if change.get("changeType", "file") == "drive":
            if self.shared_drive_id and change.get("driveId") == self.shared_drive_id and removed:
                raise ChangeFeedUnavailable("the shared drive itself was removed or became inaccessible")
            return None
        item = change.get("file")
        if item is not None and _file(item) is None:
            self._note_malformed("changes.list returned a file resource that is not an object with a string id")
            return None
        file_id = _drive_id(change.get("fileId"))
        if change.get("fileId") is not None and file_id is None:
            self._note_malformed("changes.list returned a change whose fileId is not a usable id")
            return None
        if item is not None and file_id is not None and item["id"] != file_id:
            self._note_malformed("changes.list returned a change whose fileId and file.id differ")
            return None
        file_id = file_id or (item["id"] if item is not None else None)
        if file_id is None:
            self._note_malformed("changes.list returned a change naming no file")
            return None
        return file_id, {"removed": bool(removed), "file": item, "driveId": change.get("driveId")}

    def _apply_changes(
        self, state: _ScopeState, latest: dict[str, dict[str, Any]], new_token: str
    ) -> ChangeSet:
        old_folders = state.folders
        folders = dict(old_folders)
        shortcuts = dict(state.shortcuts)
        upserts: dict[str, dict[str, Any]] = {}
        deletions: set[str] = set()
        lost_targets: set[str] = set()

        # 1. folders: renames are harmless; leaving the scope needs a full listing; entering it
        #    (new, moved in, restored) adds the subtree.
        entering: list[dict[str, Any]] = []
        for file_id, change in latest.items():
            item = change.get("file") or {}
            if change.get("removed") or not item:
                if file_id in old_folders:
                    raise ChangeFeedUnavailable(f"in-scope folder {file_id} was removed")
                continue
            if item.get("mimeType") != FOLDER_MIME:
                continue
            if file_id in old_folders:
                still = self._in_scope(item, old_folders)
                moved = bool(self.folder_id) and file_id != self.folder_id and (
                    sorted(_ids(item.get("parents"))) != old_folders[file_id]
                )
                if not still or moved:
                    raise ChangeFeedUnavailable(f"in-scope folder {file_id} was trashed or moved")
            else:
                entering.append(item)
        progress = True
        while entering and progress:
            progress = False
            for item in list(entering):
                if item["id"] in folders:
                    entering.remove(item)
                elif self._in_scope(item, folders):
                    entering.remove(item)
                    progress = True
                    folders[item["id"]] = sorted(_ids(item.get("parents"))) if self.folder_id else []
                    sub_files: dict[str, dict[str, Any]] = {}
                    self._walk(item["id"], folders, sub_files, shortcuts)
                    upserts.update(sub_files)

        # 2. shortcuts and removals
        for file_id, change in latest.items():
            item = change.get("file") or {}
            if change.get("removed") or not item:
                if file_id in shortcuts:
                    lost_targets.add(shortcuts.pop(file_id))
                else:
                    deletions.add(file_id)
                continue
            if item.get("mimeType") != SHORTCUT_MIME:
                continue
            target = _shortcut_target(item)
            previous = shortcuts.pop(file_id, None)
            if previous:
                lost_targets.add(previous)
            if target and self._in_scope(item, folders):
                shortcuts[file_id] = target

        # 3. files
        targets = set(shortcuts.values())
        for file_id, change in latest.items():
            item = change.get("file") or {}
            if change.get("removed") or not item or item.get("mimeType") in (FOLDER_MIME, SHORTCUT_MIME):
                continue
            if not _flag(item, "trashed") and (self._in_scope(item, folders) or file_id in targets):
                upserts[file_id] = item
            else:
                deletions.add(file_id)

        # 4. shortcut targets: newly referenced ones are fetched, unreferenced ones re-checked
        new_targets = {t for s, t in shortcuts.items() if state.shortcuts.get(s) != t}
        for target in new_targets - set(upserts) - deletions:
            item = self._get_file(target)
            if item is None or _flag(item, "trashed") or item.get("mimeType") in (FOLDER_MIME, SHORTCUT_MIME):
                deletions.add(target)
            else:
                upserts[target] = item
        for target in lost_targets - targets - set(upserts):
            item = self._get_file(target)
            if item is None or not self._in_scope(item, folders):
                deletions.add(target)
        deletions -= set(upserts)

        documents = [self._to_document(item, shortcuts) for item in upserts.values()]
        next_state = _ScopeState(token=new_token, folders=folders, shortcuts=shortcuts)
        return ChangeSet(upserts=documents, deleted_ids=sorted(deletions), next_cursor=next_state.encode())

    # ---- mapping ------------------------------------------------------------------------

    def _export_mime(self, google_mime: str) -> str | None:
        """The export format for a Google-native type, checked against ``about.exportFormats``."""
        preferences = EXPORT_PREFERENCES.get(google_mime)
        if not preferences:
            return None
        if self._export_formats is None:
            try:
                about = self._execute(self._service.about().get(fields="exportFormats"))
            except (HttpError, OSError, httplib2.HttpLib2Error) as exc:
                log.warning("gdrive: about.get failed (%s); using default export formats", type(exc).__name__)
                about = {}
            formats = _object(about).get("exportFormats")
            if formats is not None and not isinstance(formats, dict):
                log.warning("gdrive: about.exportFormats is not an object; using default export formats")
            self._export_formats = {
                key: [m for m in value if isinstance(m, str)]
                for key, value in _object(formats).items() if isinstance(value, list)
            }
        offered = self._export_formats.get(google_mime)
        if not offered:
            return preferences[0]
        return next((mime for mime in preferences if mime in offered), None)

    def _to_document(self, item: Mapping[str, Any], shortcuts: Mapping[str, str]) -> SourceDocument:
        """Map a Drive file resource (``item["id"]`` a usable id, see :func:`_file`) to a
        :class:`SourceDocument` (id = Drive file id). Each other field is used only with its documented
        type (strings; ``parents`` a list of ids; ``size`` see :func:`_size`; ``sha256Checksum`` 64 hex
        digits), else as if absent; text has lone surrogates replaced (it must be storable)."""
        file_id = item["id"]
        mime = _text(item.get("mimeType")) or None
        native = bool(mime and mime.startswith(GOOGLE_APPS_PREFIX))
        export_mime = self._export_mime(mime) if native and mime else None
        skip_reason = None
        if native and export_mime is None:
            skip_reason = f"Google-native type {mime} has no export format the extractor handles"
        modified = _text(item.get("modifiedTime"))
        md5 = _text(item.get("md5Checksum"))
        drive_version = _text(item.get("version"))
        if native:
            version = f"modified:{modified}"
        else:
            version = md5 or _text(item.get("headRevisionId")) or (
                f"version:{drive_version}" if drive_version else None
            )
        via = sorted(s for s, t in shortcuts.items() if t == file_id)
        metadata: dict[str, Any] = {
            "parents": _ids(item.get("parents")),
            "drive_id": _drive_id(item.get("driveId")),
            "google_mime_type": mime,
            "export_mime_type": export_mime,
            "md5": md5,
            "drive_version": drive_version,
        }
        if via:
            metadata["shortcut_ids"] = via
        name = _text(item.get("name")) or file_id
        metadata["drive_name"] = name
        sha256 = item.get("sha256Checksum")
        return SourceDocument(
            source_id=file_id,
            title=_export_title(name, export_mime),
            uri=_text(item.get("webViewLink")) or f"https://drive.google.com/file/d/{file_id}/view",
            mime_type=export_mime or mime,
            size=None if native else _size(item.get("size")),
            modified_at=_parse_time(modified),
            source_version=version,
            content_sha256=sha256 if not native and isinstance(sha256, str) and _SHA256_HEX.fullmatch(sha256) else None,
            metadata=metadata,
            skip_reason=skip_reason,
        )


_EXPORT_EXTENSIONS = {DOCX: ".docx", XLSX: ".xlsx", PPTX: ".pptx", PDF: ".pdf", "text/plain": ".txt", "text/csv": ".csv"}


def _export_title(name: str, export_mime: str | None) -> str:
    """The title of an exported file: its Drive name plus the export's extension (``Budget`` ->
    ``Budget.xlsx``), so that extraction, which trusts a file name's extension, sees the type it
    gets (a Sheet named ``data.csv`` is exported as XLSX: ``data.csv.xlsx``)."""
    extension = _EXPORT_EXTENSIONS.get(export_mime or "")
    if not extension or name.lower().endswith(extension):
        return name
    return name + extension


def _quote(value: str) -> str:
    """Escape a value for a Drive ``q`` string literal."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _parse_time(value: Any) -> datetime | None:
    """An RFC 3339 time (``Z`` or an offset; naive means UTC), or ``None`` for anything else."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
