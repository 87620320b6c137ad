"""A stateful fake of the Google Drive v3 REST API and Google's OAuth token endpoint, on 127.0.0.1.

It speaks the protocol the real client libraries use, so tests drive ``google-api-python-client``
and ``google-auth`` end to end:

* ``POST /token``: the OAuth 2.0 token endpoint. The JWT-bearer grant of a service account is
  verified (RS256 signature against the test key's public half, Google's ``aud``, the Drive scope);
  the refresh-token grant of an OAuth user token file checks client id, secret and refresh token.
  Access tokens are random and must come back as ``Authorization: Bearer`` on every API call.
* ``GET /drive/v3/about``, ``files``, ``files/{id}`` (metadata, or ``alt=media`` bytes),
  ``files/{id}/export``, ``changes/startPageToken``, ``changes``. Query parameters are checked
  against the methods in ``../shared/fixtures/gdrive/drive.v3.json`` (unknown ones: 400), and the
  ``fields`` partial-response mask is applied the way Drive does (what is not asked for is not
  sent: a client that forgets ``nextPageToken`` sees one page).
* Drive rules the client must respect: shared-drive items need ``supportsAllDrives`` and
  ``includeItemsFromAllDrives``; Google-native files cannot be downloaded with ``alt=media``
  (403 ``fileNotDownloadable``) and are exported only to the formats ``about.exportFormats``
  (fixture ``about.json``) lists; an export can be refused with 403 ``exportSizeLimitExceeded``.

SYNTHETIC: no public recordings of ``files.list`` / ``changes.list`` exist, so every list page
this fake sends is synthetic, built from the ``FileList`` / ``ChangeList`` / ``Change`` / ``File``
schemas of the discovery document. Pages are deliberately small (``page_limit``, default 2) so
paging is always exercised. The change log works like Drive's: a page token is a change number,
each file appears once per ``changes.list`` range with its current state, permanently deleted
files appear as ``removed: true`` without a file resource.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import json
import re
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from google.auth import jwt as google_jwt
from pytest_httpserver import HTTPServer
from werkzeug.wrappers import Request, Response

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
FIXTURES = SHARED / "fixtures" / "gdrive"

FOLDER = "application/vnd.google-apps.folder"
SHORTCUT = "application/vnd.google-apps.shortcut"
DOC = "application/vnd.google-apps.document"
SHEET = "application/vnd.google-apps.spreadsheet"
SLIDES = "application/vnd.google-apps.presentation"
FORM = "application/vnd.google-apps.form"

JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
"""The ``aud`` google-auth writes in a service account's JWT grant, whatever ``token_uri`` is."""
DRIVE_READONLY = "https://www.googleapis.com/auth/drive.readonly"

_METHODS = {
    ("about",): "about.get",
    ("files",): "files.list",
    ("files", "*"): "files.get",
    ("files", "*", "export"): "files.export",
    ("changes", "startPageToken"): "changes.getStartPageToken",
    ("changes",): "changes.list",
}

_DEFAULT_FIELDS = {
    "about.get": "kind",
    "files.list": "kind,nextPageToken,incompleteSearch,files(kind,id,name,mimeType)",
    "files.get": "kind,id,name,mimeType",
    "changes.list": "kind,nextPageToken,newStartPageToken,changes(kind,changeType,time,removed,fileId,file(kind,id,name,mimeType))",
    "changes.getStartPageToken": "kind,startPageToken",
}


# ---------------------------------------------------------------------------------------------
# partial responses (the ``fields`` parameter)


def parse_fields(spec: str) -> dict[str, Any]:
    """Parse a Drive ``fields`` mask (``a,b(c,d(e))``) into a nested dict (``None`` = whole value)."""
    mask: dict[str, Any] = {}
    stack = [mask]
    token = ""

    def flush() -> None:
        nonlocal token
        name = token.strip()
        token = ""
        if not name:
            return
        stack[-1].setdefault(name, None)

    for char in spec:
        if char == ",":
            flush()
        elif char == "(":
            name = token.strip()
            token = ""
            child = stack[-1].get(name) or {}
            stack[-1][name] = child
            stack.append(child)
        elif char == ")":
            flush()
            stack.pop()
        else:
            token += char
    flush()
    return mask


def apply_fields(value: Any, mask: dict[str, Any] | None) -> Any:
    """Keep only what ``mask`` names (``None`` or ``*`` = everything below)."""
    if mask is None or "*" in mask:
        return value
    if isinstance(value, list):
        return [apply_fields(item, mask) for item in value]
    if isinstance(value, dict):
        return {key: apply_fields(value[key], sub) for key, sub in mask.items() if key in value}
    return value


# ---------------------------------------------------------------------------------------------
# the fake


@dataclass
class _Fault:
    method: str
    status: int
    reason: str
    headers: dict[str, str]
    remaining: int


@dataclass
class FakeDrive:
    """In-memory Drive: files, content, a change log, credentials it accepts, injected faults.

    Mutators (``add_*``, ``update_content``, ``rename``, ``move``, ``trash``, ``restore``,
    ``delete``) record a change each, as Drive does. ``requests`` logs ``(method, params)`` of
    every API call, ``export_calls``/``media_calls`` the file ids fetched each way.
    """

    page_limit: int = 2
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    renditions: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    export_too_large: set[str] = field(default_factory=set)
    shared_drives: set[str] = field(default_factory=set)
    change_log: list[tuple[int, str, bool]] = field(default_factory=list)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    export_calls: list[str] = field(default_factory=list)
    media_calls: list[str] = field(default_factory=list)
    token_grants: list[str] = field(default_factory=list)
    service_account_keys: dict[str, bytes] = field(default_factory=dict)
    oauth_clients: dict[str, tuple[str, str]] = field(default_factory=dict)
    base_url: str = ""
    hide_listing: bool = False
    """A glitch: ``files.list`` answers with no files (every page complete and empty)."""

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._next_change = 1
        self._access_tokens: set[str] = set()
        self._faults: list[_Fault] = []
        self._clock = datetime(2026, 11, 1, 9, 0, tzinfo=timezone.utc)
        self.discovery = json.loads((FIXTURES / "drive.v3.json").read_text(encoding="utf-8"))
        self.about = json.loads((FIXTURES / "about.json").read_text(encoding="utf-8"))
        self.root_id = self._new_id("root")
        self.files[self.root_id] = self._resource(self.root_id, "My Drive", FOLDER, [], None)

    # ---- ids, time, changes ------------------------------------------------------------------

    def _new_id(self, kind: str = "f") -> str:
        # Drive ids are opaque [A-Za-z0-9_-]{25,44}; these are shorter but of the same alphabet.
        return f"1{kind}{next(self._ids):05d}FAKE"

    def _tick(self) -> str:
        self._clock += timedelta(minutes=1)
        return self._clock.strftime("%Y-%m-%dT%H:%M:%S.000Z")

    def _record(self, file_id: str, removed: bool = False) -> None:
        self.change_log.append((self._next_change, file_id, removed))
        self._next_change += 1

    def _resource(self, file_id: str, name: str, mime: str, parents: list[str], drive_id: str | None) -> dict[str, Any]:
        resource: dict[str, Any] = {
            "kind": "drive#file",
            "id": file_id,
            "name": name,
            "mimeType": mime,
            "parents": parents,
            "trashed": False,
            "explicitlyTrashed": False,
            "version": "1",
            "modifiedTime": self._tick(),
            "webViewLink": f"https://drive.google.com/file/d/{file_id}/view",
        }
        if drive_id:
            resource["driveId"] = drive_id
        return resource

    def _drive_of(self, parent: str) -> str | None:
        if parent in self.shared_drives:
            return parent
        return self.files[parent].get("driveId") if parent in self.files else None

    def _bump(self, resource: dict[str, Any], *, content: bool = False) -> None:
        resource["version"] = str(int(resource["version"]) + 1)
        if content:
            resource["modifiedTime"] = self._tick()

    # ---- mutators (each records a change) ----------------------------------------------------

    def add_shared_drive(self, name: str = "Team") -> str:
        """A shared drive; its id is also the root folder id of its items."""
        with self._lock:
            drive_id = self._new_id("drive")
            self.shared_drives.add(drive_id)
            return drive_id

    def add_folder(self, name: str, parent: str | None = None) -> str:
        """A folder under ``parent`` (default: My Drive); returns its id."""
        with self._lock:
            parent = parent or self.root_id
            folder_id = self._new_id("dir")
            self.files[folder_id] = self._resource(folder_id, name, FOLDER, [parent], self._drive_of(parent))
            self._record(folder_id)
            return folder_id

    def add_file(self, name: str, parent: str, content: bytes, mime: str) -> str:
        """A binary (uploaded) file with md5/sha256 checksums and a head revision."""
        with self._lock:
            file_id = self._new_id()
            resource = self._resource(file_id, name, mime, [parent], self._drive_of(parent))
            self.files[file_id] = resource
            self._set_content(resource, content)
            self._record(file_id)
            return file_id

    def add_native(self, name: str, parent: str, google_mime: str, export_mime: str, rendition: bytes) -> str:
        """A Google-native file; ``rendition`` is what exporting it to ``export_mime`` returns."""
        with self._lock:
            file_id = self._new_id("g")
            self.files[file_id] = self._resource(file_id, name, google_mime, [parent], self._drive_of(parent))
            self.renditions[file_id] = (export_mime, rendition)
            self._record(file_id)
            return file_id

    def add_shortcut(self, name: str, parent: str, target_id: str) -> str:
        """A shortcut to ``target_id`` (``shortcutDetails`` with the target's MIME type); returns its id."""
        with self._lock:
            shortcut_id = self._new_id("s")
            resource = self._resource(shortcut_id, name, SHORTCUT, [parent], self._drive_of(parent))
            resource["shortcutDetails"] = {
                "targetId": target_id,
                "targetMimeType": self.files[target_id]["mimeType"],
            }
            self.files[shortcut_id] = resource
            self._record(shortcut_id)
            return shortcut_id

    def _set_content(self, resource: dict[str, Any], content: bytes) -> None:
        self.blobs[resource["id"]] = content
        resource["size"] = str(len(content))
        resource["md5Checksum"] = hashlib.md5(content).hexdigest()  # noqa: S324 - Drive's own checksum
        resource["sha256Checksum"] = hashlib.sha256(content).hexdigest()
        resource["headRevisionId"] = secrets.token_hex(8)

    def update_content(self, file_id: str, content: bytes) -> None:
        """New content (a new rendition for a native file): new checksums, version, modifiedTime."""
        with self._lock:
            resource = self.files[file_id]
            if resource["mimeType"].startswith("application/vnd.google-apps."):
                mime, _ = self.renditions[file_id]
                self.renditions[file_id] = (mime, content)
            else:
                self._set_content(resource, content)
            self._bump(resource, content=True)
            self._record(file_id)

    def rename(self, file_id: str, name: str) -> None:
        """A metadata change: new name and version; content, checksums and modifiedTime stay."""
        with self._lock:
            self.files[file_id]["name"] = name
            self._bump(self.files[file_id])
            self._record(file_id)

    def move(self, file_id: str, new_parent: str) -> None:
        """Move to ``new_parent`` (possibly into or out of a shared drive)."""
        with self._lock:
            resource = self.files[file_id]
            resource["parents"] = [new_parent]
            drive_id = self._drive_of(new_parent)
            if drive_id:
                resource["driveId"] = drive_id
            else:
                resource.pop("driveId", None)
            self._bump(resource)
            self._record(file_id)

    def trash(self, file_id: str) -> None:
        """Trash a file (a folder's descendants are trashed implicitly and get a change each)."""
        with self._lock:
            for item_id, explicit in self._with_descendants(file_id):
                resource = self.files[item_id]
                if resource["trashed"]:
                    continue
                resource["trashed"] = True
                resource["explicitlyTrashed"] = explicit
                self._bump(resource)
                self._record(item_id)

    def restore(self, file_id: str) -> None:
        """Untrash a file and the descendants that were trashed with it (not those trashed on their own)."""
        with self._lock:
            for item_id, explicit in self._with_descendants(file_id):
                resource = self.files[item_id]
                if not resource["trashed"] or (resource["explicitlyTrashed"] and not explicit):
                    continue
                resource["trashed"] = False
                resource["explicitlyTrashed"] = False
                self._bump(resource)
                self._record(item_id)

    def delete(self, file_id: str) -> None:
        """Permanent deletion: the change feed reports ``removed: true`` without a file."""
        with self._lock:
            for item_id, _ in self._with_descendants(file_id):
                self.files.pop(item_id, None)
                self.blobs.pop(item_id, None)
                self.renditions.pop(item_id, None)
                self._record(item_id, removed=True)

    def _with_descendants(self, file_id: str) -> list[tuple[str, bool]]:
        out = [(file_id, True)]
        frontier = [file_id]
        while frontier:
            parent = frontier.pop()
            for item_id, resource in self.files.items():
                if parent in resource.get("parents", []):
                    out.append((item_id, False))
                    if resource["mimeType"] == FOLDER:
                        frontier.append(item_id)
        return out

    def fail_next(self, method: str, status: int, reason: str = "backendError", *, times: int = 1,
                  headers: dict[str, str] | None = None) -> None:
        """Make the next ``times`` calls of ``method`` (e.g. ``"files.list"``) fail with ``status``."""
        with self._lock:
            self._faults.append(_Fault(method, status, reason, dict(headers or {}), times))

    # ---- credentials it accepts ----------------------------------------------------------------

    def accept_service_account(self, client_email: str, public_key_pem: bytes) -> None:
        """Accept JWT grants from ``client_email`` signed by the private half of ``public_key_pem``."""
        self.service_account_keys[client_email] = public_key_pem

    def accept_oauth_client(self, client_id: str, client_secret: str, refresh_token: str) -> None:
        """Accept refresh-token grants for this OAuth client and refresh token."""
        self.oauth_clients[client_id] = (client_secret, refresh_token)

    # ---- HTTP ----------------------------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        """The WSGI-level entry point pytest-httpserver calls for every request."""
        with self._lock:
            if request.path == "/token":
                return self._token(request)
            if not request.path.startswith("/drive/v3/"):
                return _error(404, "notFound", f"no such path {request.path}")
            parts = tuple(p for p in request.path[len("/drive/v3/"):].split("/") if p)
            pattern = tuple("*" if i == 1 and parts[0] == "files" else p for i, p in enumerate(parts))
            method = _METHODS.get(pattern)
            if method is None or request.method != "GET":
                return _error(404, "notFound", f"no such method {request.method} {request.path}")
            auth = request.headers.get("Authorization", "")
            if not auth.startswith("Bearer ") or auth[len("Bearer "):] not in self._access_tokens:
                return _error(401, "authError", "Request had invalid authentication credentials.")
            params = {k: v for k, v in request.args.items()}
            self.requests.append((method, params))
            known = set(self.discovery["parameters"])
            resource, verb = method.split(".")
            known |= set(self.discovery["resources"][resource]["methods"][verb].get("parameters", {}))
            unknown = set(params) - known
            if unknown:
                return _error(400, "invalidParameter", f"unknown parameters {sorted(unknown)}")
            for fault in self._faults:
                if fault.method == method and fault.remaining > 0:
                    fault.remaining -= 1
                    return _error(fault.status, fault.reason, "injected fault", fault.headers)
            handler = getattr(self, "_" + method.replace(".", "_"))
            result = handler(params, *[p for i, p in enumerate(parts) if pattern[i] == "*"])
            if isinstance(result, Response):
                return result
            mask = parse_fields(params.get("fields") or _DEFAULT_FIELDS[method])
            return _json(apply_fields(result, mask))

    def _token(self, request: Request) -> Response:
        form = request.form
        grant = form.get("grant_type")
        if grant == JWT_GRANT:
            assertion = form.get("assertion", "")
            try:
                unverified = google_jwt.decode(assertion, verify=False)
                key = self.service_account_keys[unverified["iss"]]
                claims = google_jwt.decode(assertion, certs=key, audience=GOOGLE_TOKEN_AUDIENCE)
            except Exception:  # noqa: BLE001 - any bad assertion is an invalid_grant
                return _json({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}, 400)
            if DRIVE_READONLY not in str(claims.get("scope", "")).split():
                return _json({"error": "invalid_scope"}, 400)
            self.token_grants.append(f"jwt:{claims['iss']}")
        elif grant == "refresh_token":
            client = self.oauth_clients.get(form.get("client_id", ""))
            if client is None or client != (form.get("client_secret"), form.get("refresh_token")):
                return _json({"error": "invalid_grant", "error_description": "Bad Request"}, 400)
            self.token_grants.append(f"refresh:{form.get('client_id')}")
        else:
            return _json({"error": "unsupported_grant_type"}, 400)
        token = "ya29.fake-" + secrets.token_urlsafe(24)
        self._access_tokens.add(token)
        return _json({"access_token": token, "expires_in": 3599, "token_type": "Bearer", "scope": DRIVE_READONLY})

    # ---- API methods ---------------------------------------------------------------------------

    def _about_get(self, params: dict[str, str]) -> dict[str, Any]:
        return {"kind": "drive#about", **self.about}

    def _visible(self, resource: dict[str, Any], params: dict[str, str]) -> bool:
        if resource["id"] == self.root_id:
            return False
        return not resource.get("driveId") or params.get("includeItemsFromAllDrives") == "true"

    def _files_list(self, params: dict[str, str]) -> Any:
        corpora = params.get("corpora", "user")
        drive_id = params.get("driveId")
        all_drives = params.get("includeItemsFromAllDrives") == "true"
        if drive_id and corpora != "drive":
            return _error(400, "invalid", "driveId requires corpora=drive")
        if corpora in ("drive", "allDrives") and not (all_drives and params.get("supportsAllDrives") == "true"):
            return _error(400, "invalid", "corpora drive/allDrives requires includeItemsFromAllDrives and supportsAllDrives")
        if corpora == "drive" and drive_id not in self.shared_drives:
            return _error(404, "notFound", f"Shared drive not found: {drive_id}")
        query = params.get("q", "")
        parent = None
        match = re.fullmatch(r"'((?:[^'\\]|\\.)*)' in parents and trashed = false", query)
        if match:
            parent = match.group(1).replace("\\'", "'").replace("\\\\", "\\")
        elif query != "trashed = false":
            return _error(400, "invalidQuery", f"fake cannot evaluate q={query!r}")
        items = [
            r for r in self.files.values()
            if not self.hide_listing and not r["trashed"] and self._visible(r, params)
            and (parent is None or parent in r.get("parents", []))
            and (corpora != "drive" or r.get("driveId") == drive_id)
        ]
        items.sort(key=lambda r: r["id"])
        offset = _decode_page(params.get("pageToken"), "files", query)
        if offset is None:
            return _error(400, "invalid", "Invalid Value: pageToken")
        size = min(int(params.get("pageSize", 100)), self.page_limit)
        page = items[offset:offset + size]
        body: dict[str, Any] = {"kind": "drive#fileList", "incompleteSearch": False, "files": page}
        if offset + size < len(items):
            body["nextPageToken"] = _encode_page(offset + size, "files", query)
        return body

    def _file_or_404(self, file_id: str, params: dict[str, str]) -> dict[str, Any] | Response:
        resource = self.files.get(file_id)
        if resource is None or (resource.get("driveId") and params.get("supportsAllDrives") != "true"):
            return _error(404, "notFound", f"File not found: {file_id}.")
        return resource

    def _files_get(self, params: dict[str, str], file_id: str) -> Any:
        resource = self._file_or_404(file_id, params)
        if isinstance(resource, Response) or params.get("alt") != "media":
            return resource
        if resource["mimeType"].startswith("application/vnd.google-apps."):
            return _error(403, "fileNotDownloadable",
                          "Only files with binary content can be downloaded. Use Export with Docs Editors files.")
        self.media_calls.append(file_id)
        return Response(self.blobs[file_id], status=200, content_type=resource["mimeType"])

    def _files_export(self, params: dict[str, str], file_id: str) -> Any:
        resource = self.files.get(file_id)
        if resource is None:
            return _error(404, "notFound", f"File not found: {file_id}.")
        google_mime = resource["mimeType"]
        wanted = params.get("mimeType", "")
        if wanted not in self.about["exportFormats"].get(google_mime, []):
            return _error(403 if google_mime not in self.about["exportFormats"] else 400,
                          "fileNotExportable" if google_mime not in self.about["exportFormats"] else "badRequest",
                          "Export only supports Docs Editors files." if google_mime not in self.about["exportFormats"]
                          else "The requested conversion is not supported.")
        self.export_calls.append(file_id)
        if file_id in self.export_too_large:
            return _error(403, "exportSizeLimitExceeded", "This file is too large to be exported.")
        mime, rendition = self.renditions[file_id]
        if mime != wanted:
            return _error(400, "badRequest", f"fake holds only a {mime} rendition of {file_id}")
        return Response(rendition, status=200, content_type=wanted)

    def _changes_getStartPageToken(self, params: dict[str, str]) -> dict[str, Any]:  # noqa: N802 - API name
        return {"kind": "drive#startPageToken", "startPageToken": str(self._next_change)}

    def _changes_list(self, params: dict[str, str]) -> Any:
        token = params.get("pageToken", "")
        if not token.isdigit() or not 1 <= int(token) <= self._next_change:
            return _error(400, "invalid", "Invalid Value: pageToken")
        start = int(token)
        latest: dict[str, tuple[int, bool]] = {}
        for number, file_id, removed in self.change_log:
            if number >= start:
                latest.pop(file_id, None)
                latest[file_id] = (number, removed)
        include_removed = params.get("includeRemoved", "true") == "true"
        entries = []
        for file_id, (number, removed) in sorted(latest.items(), key=lambda kv: kv[1][0]):
            resource = self.files.get(file_id)
            if resource is not None and not self._visible(resource, params):
                continue
            if removed and not include_removed:
                continue
            change: dict[str, Any] = {
                "kind": "drive#change", "changeType": "file", "type": "file", "fileId": file_id,
                "time": self._clock.strftime("%Y-%m-%dT%H:%M:%S.000Z"), "removed": resource is None,
            }
            if resource is not None:
                change["file"] = resource
                if resource.get("driveId"):
                    change["driveId"] = resource["driveId"]
            entries.append((number, change))
        size = min(int(params.get("pageSize", 100)), self.page_limit)
        page = entries[:size]
        body: dict[str, Any] = {"kind": "drive#changeList", "changes": [c for _, c in page]}
        if len(entries) > size:
            body["nextPageToken"] = str(entries[size][0])
        else:
            body["newStartPageToken"] = str(self._next_change)
        return body

    # ---- serving -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def serve(self) -> Iterator[str]:
        """Serve on ``http://127.0.0.1:<free port>``; yields the base URL (no trailing slash).

        Fails the test at exit when a handler raised (pytest-httpserver's handler errors).
        """
        server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
        server.expect_request(re.compile(".*"), method="GET").respond_with_handler(self.handle)
        server.expect_request(re.compile(".*"), method="POST").respond_with_handler(self.handle)
        server.start()
        try:
            self.base_url = server.url_for("").rstrip("/")
            yield self.base_url
            server.check_handler_errors()
        finally:
            server.clear()
            server.stop()


def _encode_page(offset: int, kind: str, query: str) -> str:
    raw = json.dumps({"o": offset, "k": kind, "q": hashlib.sha1(query.encode()).hexdigest()[:8]})  # noqa: S324
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _decode_page(token: str | None, kind: str, query: str) -> int | None:
    if not token:
        return 0
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
    except ValueError:
        return None
    if data.get("k") != kind or data.get("q") != hashlib.sha1(query.encode()).hexdigest()[:8]:  # noqa: S324
        return None
    return int(data["o"])


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body), status=status, content_type="application/json; charset=UTF-8",
                    headers=headers)


def _error(status: int, reason: str, message: str, headers: dict[str, str] | None = None) -> Response:
    """A Drive-style error body (``error.errors[].reason``, as the v3 API sends)."""
    body = {"error": {"code": status, "message": message,
                      "errors": [{"domain": "global", "reason": reason, "message": message}]}}
    return _json(body, status, headers)


# ---------------------------------------------------------------------------------------------
# test credentials


@dataclass(frozen=True)
class ServiceAccountKey:
    """A throwaway RSA service-account key: ``info`` is the JSON key file's content."""

    info: dict[str, str]
    public_key_pem: bytes

    @classmethod
    def generate(cls, token_uri: str, client_email: str = "rag-test@fake-project.iam.gserviceaccount.com") -> ServiceAccountKey:
        """A fresh 2048-bit RSA key and a key file naming ``token_uri``."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        private_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        public_pem = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        info = {
            "type": "service_account",
            "project_id": "fake-project",
            "private_key_id": secrets.token_hex(20),
            "private_key": private_pem,
            "client_email": client_email,
            "client_id": "1234567890",
            "auth_uri": token_uri.rsplit("/", 1)[0] + "/auth",
            "token_uri": token_uri,
        }
        return cls(info=info, public_key_pem=public_pem)


# ---------------------------------------------------------------------------------------------
# a running fake with credentials on disk


CORPUS = SHARED / "corpus"


def corpus_bytes(name: str) -> bytes:
    """Bytes of a real file from ``../shared/corpus``."""
    return (CORPUS / name).read_bytes()


@dataclass
class DriveEnv:
    """A served :class:`FakeDrive` plus a service-account key file it accepts.

    ``env`` holds the environment variables ``GoogleDriveSource.from_env`` reads.
    """

    fake: FakeDrive
    base_url: str
    key: ServiceAccountKey
    key_file: Path

    @property
    def api_url(self) -> str:
        """The Drive API base (``.../drive/v3/``) for ``RAG_GDRIVE_API_URL``."""
        return self.base_url + "/drive/v3/"

    @property
    def env(self) -> dict[str, str]:
        """Environment for ``GoogleDriveSource.from_env``."""
        return {"GOOGLE_APPLICATION_CREDENTIALS": str(self.key_file), "RAG_GDRIVE_API_URL": self.api_url}


@contextlib.contextmanager
def drive_env(tmp_dir: Path, *, page_limit: int = 2) -> Iterator[DriveEnv]:
    """Serve a fresh :class:`FakeDrive` and write a service-account key file naming its token URI."""
    fake = FakeDrive(page_limit=page_limit)
    with fake.serve() as base:
        key = ServiceAccountKey.generate(base + "/token")
        fake.accept_service_account(key.info["client_email"], key.public_key_pem)
        key_file = tmp_dir / "service-account.json"
        key_file.write_text(json.dumps(key.info), encoding="utf-8")
        yield DriveEnv(fake, base, key, key_file)
