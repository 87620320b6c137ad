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

Fetch
    Google-native Docs, Sheets, Slides and Drawings are exported (``files.export``) to DOCX, XLSX,
    PPTX and PDF (or the next format ``about.exportFormats`` offers), never downloaded with
    ``get_media``; other native types (Forms, Sites, ...) are listed with a ``skip_reason``. An
    export refused for size (``exportSizeLimitExceeded``) or a file Drive will not serve raises
    :class:`DocumentSkipped` for that document only.

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
import socket
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import google.auth.credentials
import google.auth.exceptions
import google_auth_httplib2
import httplib2
from googleapiclient import discovery_cache
from googleapiclient.discovery import build_from_document
from googleapiclient.errors import HttpError
from tenacity import RetryCallState, Retrying, retry_if_exception

from rag_pipeline.sources.http import parse_retry_after
from rag_pipeline.sources.base import (
    ChangeFeedUnavailable,
    ChangeSet,
    DocumentSkipped,
    Inventory,
    ListingIncompleteError,
    SourceDocument,
    SourceError,
)

log = logging.getLogger(__name__)

DRIVE_READONLY_SCOPE = "https://www.googleapis.com/auth/drive.readonly"
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

_CURSOR_PREFIX = "gdrive1:"
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


# --------------------------------------------------------------------------------------------
# errors and retries


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
        """Parse a cursor from :meth:`encode`; raises ``ValueError`` for anything else."""
        if not cursor.startswith(_CURSOR_PREFIX):
            raise ValueError("not a gdrive cursor")
        try:
            raw = zlib.decompress(base64.urlsafe_b64decode(cursor[len(_CURSOR_PREFIX) :]))
            data = json.loads(raw)
        except (binascii.Error, zlib.error, ValueError) as exc:
            raise ValueError("corrupt gdrive cursor") from exc
        if data.get("v") != 1 or not isinstance(data.get("t"), str):
            raise ValueError("unknown gdrive cursor version")
        return cls(token=data["t"], folders=dict(data.get("f", {})), shortcuts=dict(data.get("s", {})))


# --------------------------------------------------------------------------------------------
# credentials


def load_credentials(
    *,
    service_account_file: str | None = None,
    oauth_token_file: str | None = None,
    oauth_token_uri: str | None = None,
    scopes: tuple[str, ...] = (DRIVE_READONLY_SCOPE,),
) -> google.auth.credentials.Credentials:
    """Credentials from a key file: an OAuth user token file wins over a service-account file.

    ``service_account_file``: a Google service-account JSON key (``"type": "service_account"``);
    google-auth posts its JWT grant to the file's ``token_uri``. ``oauth_token_file``: an
    authorized-user JSON (``client_id``, ``client_secret``, ``refresh_token``) as written by
    ``Credentials.to_json()``; google-auth deliberately ignores a ``token_uri`` in such a file and
    refreshes at Google's endpoint, so another endpoint must be named explicitly with
    ``oauth_token_uri``. Raises :class:`SourceError` (not transient) when neither file is given or
    one is unreadable; the message names the file, never its contents.
    """
    from google.oauth2 import credentials as user_credentials
    from google.oauth2 import service_account

    try:
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
            return service_account.Credentials.from_service_account_info(info, scopes=list(scopes))
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
    ) -> None:
        if not folder_id and not shared_drive_id:
            raise ValueError("GoogleDriveSource needs folder_id or shared_drive_id")
        self.folder_id = folder_id or None
        self.shared_drive_id = shared_drive_id or None
        self.name = name or (
            f"gdrive:folder/{folder_id}" if folder_id else f"gdrive:drive/{shared_drive_id}"
        )
        self._page_size = page_size
        self._retry = retry or RetryPolicy()
        self._export_formats: dict[str, list[str]] | None = None
        client_options: dict[str, str] = {}
        if api_url:
            client_options["api_endpoint"] = api_url if api_url.endswith("/") else api_url + "/"
        http = google_auth_httplib2.AuthorizedHttp(credentials, http=httplib2.Http(timeout=timeout_s))
        self._service = build_from_document(
            discovery_cache.get_static_doc("drive", "v3"),
            http=http,
            client_options=client_options or None,
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
        ``env`` defaults to ``os.environ``. Raises :class:`SourceError` (not transient) without
        credentials.
        """
        env = os.environ if env is None else env
        credentials = load_credentials(
            service_account_file=env.get(ENV_SERVICE_ACCOUNT_FILE) or None,
            oauth_token_file=env.get(ENV_OAUTH_TOKEN_FILE) or None,
            oauth_token_uri=env.get(ENV_OAUTH_TOKEN_URI) or None,
        )
        return cls(
            credentials=credentials,
            folder_id=folder_id,
            shared_drive_id=shared_drive_id,
            api_url=env.get(ENV_API_URL) or None,
        )

    # ---- HTTP ---------------------------------------------------------------------------

    def _execute(self, request: Any) -> Any:
        """Run one API request with the retry policy; HttpError / socket errors propagate, a
        failed token grant becomes a transient :class:`SourceError` naming only the OAuth error code."""
        try:
            for attempt in self._retry.retrying(_is_transient, _retry_after_s):
                with attempt:
                    return request.execute(num_retries=0)
        except google.auth.exceptions.RefreshError as exc:
            code = str(exc.args[0]).split(":", 1)[0] if exc.args else "unknown"
            raise SourceError(f"Google token request failed: {code}") from None
        except google.auth.exceptions.TransportError as exc:
            raise SourceError(f"Google token endpoint unreachable: {type(exc).__name__}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _list_files(self, q: str) -> Iterator[dict[str, Any]]:
        """Every file matching ``q``, all pages; raises ListingIncompleteError on any failure."""
        params: dict[str, Any] = {
            "q": q,
            "fields": f"nextPageToken,incompleteSearch,files({FILE_FIELDS})",
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
            if response.get("incompleteSearch"):
                raise ListingIncompleteError("files.list reported incompleteSearch")
            yield from response.get("files", [])
            page_token = response.get("nextPageToken")
            if not page_token:
                return
            if page_token in seen_tokens:
                raise ListingIncompleteError("files.list returned a page token it had returned before")
            seen_tokens.add(page_token)

    def _get_file(self, file_id: str) -> dict[str, Any] | None:
        """``files.get`` metadata, or ``None`` when the file is gone or not visible (404)."""
        try:
            return self._execute(
                self._service.files().get(fileId=file_id, fields=FILE_FIELDS, supportsAllDrives=True)
            )
        except HttpError as exc:
            if _status(exc) == 404:
                return None
            raise

    def _start_page_token(self) -> str:
        try:
            response = self._execute(
                self._service.changes().getStartPageToken(supportsAllDrives=True)
            )
        except HttpError as exc:
            raise ListingIncompleteError(f"changes.getStartPageToken failed: {_describe(exc)}") from exc
        return str(response["startPageToken"])

    # ---- scope --------------------------------------------------------------------------

    def _in_scope(self, item: Mapping[str, Any], folders: Mapping[str, Any]) -> bool:
        """Whether a (non-removed) file or folder lies in the scope, given the in-scope folders."""
        if item.get("trashed"):
            return False
        if self.folder_id:
            if item.get("id") == self.folder_id:
                return True
            return any(parent in folders for parent in item.get("parents", []))
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
        mime = item.get("mimeType", "")
        item_id = item.get("id")
        if not item_id:
            return
        if mime == FOLDER_MIME:
            if item_id not in folders:
                folders[item_id] = sorted(item.get("parents", [])) if self.folder_id else []
                if queue is not None:
                    queue.append(item_id)
        elif mime == SHORTCUT_MIME:
            details = item.get("shortcutDetails") or {}
            if details.get("targetId") and details.get("targetMimeType") != FOLDER_MIME:
                shortcuts[item_id] = details["targetId"]
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
            if target is None or target.get("trashed") or target.get("mimeType") in (FOLDER_MIME, SHORTCUT_MIME):
                log.info("gdrive: shortcut %s points at nothing usable (%s); ignored", shortcut_id, target_id)
                del shortcuts[shortcut_id]
                continue
            files[target_id] = target

    # ---- Source protocol ----------------------------------------------------------------

    def list_documents(self) -> Inventory:
        """Full listing of the scope, with a change-feed cursor valid as of its start.

        Raises :class:`ListingIncompleteError` when any page fails, a page token repeats, Drive
        reports ``incompleteSearch``, or the scope folder is missing or trashed (so nothing is
        ever reconciled against a short list).
        """
        try:
            token = self._start_page_token()
            folders: dict[str, list[str]] = {}
            files: dict[str, dict[str, Any]] = {}
            shortcuts: dict[str, str] = {}
            if self.folder_id:
                root = self._get_file(self.folder_id)
                if root is None or root.get("trashed") or root.get("mimeType") != FOLDER_MIME:
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
        return Inventory(documents=documents, complete=True, cursor=state.encode())

    def changes(self, cursor: str | None) -> ChangeSet:
        """Upserts and deletions in the scope since ``cursor`` (from a previous listing or feed).

        Raises :class:`ChangeFeedUnavailable` when there is no usable cursor, Drive rejects the
        page token, or an in-scope folder was trashed, deleted or moved (full reconciliation is
        then the only correct answer); :class:`ListingIncompleteError` when a page fails part-way.
        Deletions may name files the index never held (files that left the scope or were never
        in it); the sync ignores those.
        """
        if not cursor:
            raise ChangeFeedUnavailable("no Drive change cursor stored yet")
        try:
            state = _ScopeState.decode(cursor)
        except ValueError as exc:
            raise ChangeFeedUnavailable(f"unusable Drive cursor: {exc}") from None
        latest, new_token = self._read_changes(state.token)
        try:
            return self._apply_changes(state, latest, new_token)
        except HttpError as exc:
            raise ListingIncompleteError(f"Drive change resolution failed: {_describe(exc)}") from exc

    def fetch(self, document: SourceDocument) -> bytes:
        """The document's bytes: ``files.export`` for Google-native types, else ``get_media``.

        Raises :class:`DocumentSkipped` when Drive refuses for good (export too large, not
        exportable, not downloadable, flagged as abusive) and :class:`SourceError` otherwise
        (transient: rate limits, server errors, a file deleted since the listing).
        """
        if document.skip_reason:
            raise DocumentSkipped(document.skip_reason)
        export_mime = document.metadata.get("export_mime_type")
        files = self._service.files()
        if export_mime:
            request = files.export(fileId=document.source_id, mimeType=export_mime)
        else:
            request = files.get_media(fileId=document.source_id, supportsAllDrives=True)
        action = "export" if export_mime else "download"
        try:
            data = self._execute(request)
        except HttpError as exc:
            reason = _error_reason(exc)
            if reason in _TERMINAL_FETCH_REASONS:
                raise DocumentSkipped(f"Drive refused {action}: {reason}") from None
            if _status(exc) == 404:
                raise SourceError(f"Drive {action} failed: file not found (deleted since listing?)") from exc
            raise SourceError(f"Drive {action} failed: {_describe(exc)}") from exc
        except (OSError, httplib2.HttpLib2Error) as exc:
            raise SourceError(f"Drive {action} failed: {type(exc).__name__}") from exc
        return bytes(data)

    # ---- change feed internals ----------------------------------------------------------

    def _read_changes(self, token: str) -> tuple[dict[str, dict[str, Any]], str]:
        """All changes since ``token``: the last change per file id, and the new start token."""
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
            for change in response.get("changes", []):
                if change.get("changeType", "file") == "drive":
                    if self.shared_drive_id and change.get("driveId") == self.shared_drive_id and change.get("removed"):
                        raise ChangeFeedUnavailable("the shared drive itself was removed or became inaccessible")
                    continue
                file_id = change.get("fileId") or (change.get("file") or {}).get("id")
                if file_id:
                    latest.pop(file_id, None)  # keep feed order: the last change wins
                    latest[file_id] = change
            if response.get("newStartPageToken"):
                return latest, str(response["newStartPageToken"])
            page_token = response.get("nextPageToken")
            if not page_token:
                raise ListingIncompleteError("changes.list page had neither nextPageToken nor newStartPageToken")
            if page_token in seen:
                raise ListingIncompleteError("changes.list returned a page token it had returned before")
            seen.add(page_token)

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
                    sorted(item.get("parents", [])) != old_folders[file_id]
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
                    folders[item["id"]] = sorted(item.get("parents", [])) if self.folder_id else []
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
            details = item.get("shortcutDetails") or {}
            target = details.get("targetId")
            previous = shortcuts.pop(file_id, None)
            if previous:
                lost_targets.add(previous)
            if target and details.get("targetMimeType") != FOLDER_MIME and self._in_scope(item, folders):
                shortcuts[file_id] = target

        # 3. files
        targets = set(shortcuts.values())
        for file_id, change in latest.items():
            item = change.get("file") or {}
            if change.get("removed") or not item or item.get("mimeType") in (FOLDER_MIME, SHORTCUT_MIME):
                continue
            if not item.get("trashed") and (self._in_scope(item, folders) or file_id in targets):
                upserts[file_id] = item
            else:
                deletions.add(file_id)

        # 4. shortcut targets: newly referenced ones are fetched, unreferenced ones re-checked
        new_targets = {t for s, t in shortcuts.items() if state.shortcuts.get(s) != t}
        for target in new_targets - set(upserts) - deletions:
            item = self._get_file(target)
            if item is None or item.get("trashed") or item.get("mimeType") in (FOLDER_MIME, SHORTCUT_MIME):
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
                self._export_formats = dict(about.get("exportFormats", {}))
            except (HttpError, OSError, httplib2.HttpLib2Error) as exc:
                log.warning("gdrive: about.get failed (%s); using default export formats", type(exc).__name__)
                self._export_formats = {}
        offered = self._export_formats.get(google_mime)
        if not offered:
            return preferences[0]
        return next((mime for mime in preferences if mime in offered), None)

    def _to_document(self, item: Mapping[str, Any], shortcuts: Mapping[str, str]) -> SourceDocument:
        """Map a Drive file resource to a :class:`SourceDocument` (id = Drive file id)."""
        mime = item.get("mimeType") or None
        native = bool(mime and mime.startswith(GOOGLE_APPS_PREFIX))
        export_mime = self._export_mime(mime) if native and mime else None
        skip_reason = None
        if native and export_mime is None:
            skip_reason = f"Google-native type {mime} has no export format the extractor handles"
        if native:
            version = f"modified:{item.get('modifiedTime')}"
        else:
            version = item.get("md5Checksum") or item.get("headRevisionId") or (
                f"version:{item['version']}" if item.get("version") else None
            )
        modified = item.get("modifiedTime")
        via = sorted(s for s, t in shortcuts.items() if t == item["id"])
        metadata: dict[str, Any] = {
            "parents": list(item.get("parents", [])),
            "drive_id": item.get("driveId"),
            "google_mime_type": mime,
            "export_mime_type": export_mime,
            "md5": item.get("md5Checksum"),
            "drive_version": item.get("version"),
        }
        if via:
            metadata["shortcut_ids"] = via
        size = item.get("size")
        name = item.get("name") or item["id"]
        metadata["drive_name"] = name
        return SourceDocument(
            source_id=item["id"],
            title=_export_title(name, export_mime),
            uri=item.get("webViewLink") or f"https://drive.google.com/file/d/{item['id']}/view",
            mime_type=export_mime or mime,
            size=int(size) if size is not None and not native else None,
            modified_at=_parse_time(modified),
            source_version=version,
            content_sha256=(item.get("sha256Checksum") or None) if not native else None,
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


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
