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
* Sharing: the ``Permission`` resource (``id``, ``type`` user|group|domain|anyone, ``emailAddress``,
  ``domain``, ``role``, ``allowFileDiscovery``, ``deleted``, ``permissionDetails``), ``GET
  /drive/v3/files/{id}/permissions`` (``permissions.list``: paged, ``supportsAllDrives`` required for
  shared-drive items, ``fields`` mask), and the ``permissions`` / ``permissionIds`` fields of file
  resources. A permission on a folder (or a shared drive's membership) applies to everything under it
  and appears on each descendant with ``permissionDetails[].inherited = true`` (``inheritedFrom`` only in
  shared drives, as documented). Like Drive, ``permissions`` is not populated for shared-drive items
  (``permissionIds`` is), nor for files the caller may not share (``cannot_share``: ``permissions.list``
  then answers 403 ``insufficientFilePermissions``). Every permission change is a change of the file,
  and of every descendant for a folder (or of every item for a shared drive), in the change feed.
  Permission ids follow Drive's habits: one id per grantee across files, ``anyone`` (discoverable) /
  ``anyoneWithLink``, a ``k`` suffix for a domain's link-only grant. Each My Drive item has an
  ``owner`` permission for ``owner`` (the account owning the fake's My Drive).
* The Admin SDK Directory API: ``GET /admin/directory/v1/groups/{groupKey}/members`` (``members.list``:
  paged by ``maxResults``, ``includeDerivedMembership`` adds the members of nested groups,
  parameters checked against the ``admin.directory_v1`` discovery document shipped in
  ``googleapiclient``). The caller's token must carry a Directory group scope (else 403
  ``insufficientPermissions``) and its identity (the delegated ``sub`` or the service account) must be in
  ``directory_readers`` (else 403 ``forbidden``, "Not Authorized to access this resource/api"); an unknown
  group is 404 ``notFound``, one in ``hidden_groups`` 403 ``forbidden``.

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
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from google.auth import jwt as google_jwt
from googleapiclient import discovery_cache
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
DIRECTORY_MEMBER_READONLY = "https://www.googleapis.com/auth/admin.directory.group.member.readonly"
DIRECTORY_SCOPES = frozenset({
    "https://www.googleapis.com/auth/admin.directory.group",
    "https://www.googleapis.com/auth/admin.directory.group.member",
    DIRECTORY_MEMBER_READONLY,
    "https://www.googleapis.com/auth/admin.directory.group.readonly",
})
DRIVE_SCOPES = frozenset({"https://www.googleapis.com/auth/drive", "https://www.googleapis.com/auth/drive.readonly"})
ROLE_ORDER = ("reader", "commenter", "writer", "fileOrganizer", "organizer", "owner")
"""Drive roles, weakest first (a grantee with several permissions shows the strongest)."""
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
    ("files", "*", "permissions"): "permissions.list",
}

_DEFAULT_FIELDS = {
    "about.get": "kind",
    "files.list": "kind,nextPageToken,incompleteSearch,files(kind,id,name,mimeType)",
    "files.get": "kind,id,name,mimeType",
    "changes.list": "kind,nextPageToken,newStartPageToken,changes(kind,changeType,time,removed,fileId,file(kind,id,name,mimeType))",
    "changes.getStartPageToken": "kind,startPageToken",
    "permissions.list": "kind,nextPageToken,permissions(kind,id,type,role)",
    "members.list": "kind,etag,nextPageToken,members",
}
"""What each method sends without a ``fields`` mask (``permissions.list``'s default is an assumption: a
grantee's e-mail address or domain must be asked for)."""


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
    ``delete``; for sharing ``share``, ``unshare``, ``set_discoverable``, ``mark_account_deleted``)
    record a change each, as Drive does (sharing: of every item the grant reaches). Groups change
    with ``add_group``, ``add_member``, ``remove_member`` (no Drive change). ``requests`` logs
    ``(method, params)`` of every API call (with ``fileId`` for a method on one file, ``groupKey``
    for ``members.list``), ``export_calls``/``media_calls`` the file ids fetched each way.
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
    owner: str = "owner@example.com"
    """The account whose My Drive this is: every My Drive item gets an ``owner`` permission for it."""
    grants: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Direct permissions per file, folder or shared-drive id (a shared drive's are its members)."""
    cannot_share: set[str] = field(default_factory=set)
    """Files whose permissions the caller may not see (no ``permissions`` field, 403 on ``permissions.list``)."""
    groups: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Google groups: group e-mail -> Directory ``Member`` resources (direct members)."""
    hidden_groups: set[str] = field(default_factory=set)
    """Groups the Directory API refuses to list (403 ``forbidden``, e.g. a group of another customer)."""
    directory_readers: set[str] = field(default_factory=set)
    """Identities (delegated ``sub`` or service-account e-mail) allowed to read group members."""

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._next_change = 1
        self._access_tokens: set[str] = set()
        self._token_info: dict[str, tuple[frozenset[str], str]] = {}
        self._stalls: list[_Fault] = []
        self._faults: list[_Fault] = []
        self._clock = datetime(2026, 11, 1, 9, 0, tzinfo=timezone.utc)
        self.discovery = json.loads((FIXTURES / "drive.v3.json").read_text(encoding="utf-8"))
        self.about = json.loads((FIXTURES / "about.json").read_text(encoding="utf-8"))
        self.directory_discovery = json.loads(discovery_cache.get_static_doc("admin", "directory_v1"))
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
        elif parents:
            self.grants.setdefault(file_id, []).append(self._permission("user", email=self.owner, role="owner"))
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
            own = self.grants.setdefault(file_id, [])
            if drive_id:
                resource["driveId"] = drive_id
                own[:] = [p for p in own if p["role"] != "owner"]   # the shared drive owns it now
            else:
                resource.pop("driveId", None)
                if not any(p["role"] == "owner" for p in own):
                    own.append(self._permission("user", email=self.owner, role="owner"))
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

    # ---- sharing (each change records a change of every item it reaches) -------------------------

    @staticmethod
    def permission_id(kind: str, *, email: str | None = None, domain: str | None = None,
                      allow_discovery: bool = False) -> str:
        """The id Drive gives a grantee: the same on every file (``anyone`` / ``anyoneWithLink`` for the
        public and link-only grants, a ``k`` suffix for a domain's link-only grant)."""
        if kind == "anyone":
            return "anyone" if allow_discovery else "anyoneWithLink"
        key = (email or "").lower() if kind in ("user", "group") else (domain or "").lower()
        number = str(int(hashlib.sha1(f"{kind}:{key}".encode()).hexdigest()[:16], 16)).rjust(20, "0")[:20]
        return number + ("k" if kind == "domain" and not allow_discovery else "")

    def _permission(self, kind: str, *, email: str | None = None, domain: str | None = None,
                    role: str = "reader", allow_discovery: bool = False) -> dict[str, Any]:
        if kind not in ("user", "group", "domain", "anyone") or role not in ROLE_ORDER:
            raise ValueError(f"bad permission {kind}/{role}")
        permission: dict[str, Any] = {"kind": "drive#permission", "type": kind, "role": role,
                                      "id": self.permission_id(kind, email=email, domain=domain,
                                                               allow_discovery=allow_discovery)}
        if kind in ("user", "group"):
            if not email:
                raise ValueError("a user or group permission needs an e-mail address")
            permission.update(emailAddress=email, domain=email.rsplit("@", 1)[1], displayName=email.split("@")[0],
                              deleted=False)
        elif kind == "domain":
            permission.update(domain=domain, displayName=domain, allowFileDiscovery=allow_discovery)
        else:
            permission["allowFileDiscovery"] = allow_discovery
        return permission

    def share(self, item_id: str, kind: str, *, email: str | None = None, domain: str | None = None,
              role: str = "reader", allow_discovery: bool = False) -> str:
        """Add (or replace) a permission on a file, folder or shared drive (``item_id`` a drive id: a
        member of the drive); returns the permission id."""
        with self._lock:
            permission = self._permission(kind, email=email, domain=domain, role=role, allow_discovery=allow_discovery)
            own = self.grants.setdefault(item_id, [])
            own[:] = [p for p in own if p["id"] != permission["id"]] + [permission]
            self._record_tree(item_id)
            return permission["id"]

    def unshare(self, item_id: str, permission_id: str) -> None:
        """Remove a permission from the item it was added to (``KeyError`` when it has none of that id)."""
        with self._lock:
            own = self.grants.get(item_id, [])
            if not any(p["id"] == permission_id for p in own):
                raise KeyError(f"{item_id} has no permission {permission_id}")
            own[:] = [p for p in own if p["id"] != permission_id]
            self._record_tree(item_id)

    def set_discoverable(self, item_id: str, permission_id: str, allow_discovery: bool) -> str:
        """Change an ``anyone``/``domain`` grant between discoverable and link-only (Drive gives it a new
        id: ``anyone`` <-> ``anyoneWithLink``); returns the new id."""
        with self._lock:
            own = self.grants.get(item_id, [])
            old = next(p for p in own if p["id"] == permission_id)
            new = self._permission(old["type"], domain=old.get("domain"), role=old["role"],
                                   allow_discovery=allow_discovery)
            own[:] = [p for p in own if p["id"] != permission_id] + [new]
            self._record_tree(item_id)
            return new["id"]

    def mark_account_deleted(self, email: str) -> None:
        """The user or group account is deleted: its permissions stay, with ``deleted: true``."""
        with self._lock:
            for item_id, own in self.grants.items():
                hit = [p for p in own if (p.get("emailAddress") or "").lower() == email.lower()]
                for permission in hit:
                    permission["deleted"] = True
                if hit:
                    self._record_tree(item_id)

    def _record_tree(self, item_id: str) -> None:
        """Record a change (and bump the version) of ``item_id`` and of everything below it."""
        if item_id in self.shared_drives:
            reached = [i for i, r in self.files.items() if r.get("driveId") == item_id]
        else:
            reached = [i for i, _ in self._with_descendants(item_id) if i in self.files]
        for reached_id in reached:
            if reached_id != self.root_id:
                self._bump(self.files[reached_id])
            self._record(reached_id)

    def _holders(self, file_id: str) -> list[str]:
        """``file_id``, then its ancestors up to My Drive or the shared drive (whose members come last)."""
        out = [file_id]
        current = self.files.get(file_id)
        while current and current.get("parents"):
            parent = current["parents"][0]
            if parent in out:
                break
            out.append(parent)
            if parent in self.shared_drives:
                break
            current = self.files.get(parent)
        return out

    def effective_permissions(self, file_id: str) -> list[dict[str, Any]]:
        """The ``Permission`` resources Drive shows on ``file_id``: its own and every inherited one, one
        entry per grantee (the strongest role) with a ``permissionDetails`` entry per source."""
        in_drive = bool(self.files.get(file_id, {}).get("driveId")) or file_id in self.shared_drives
        merged: dict[str, dict[str, Any]] = {}
        for holder in self._holders(file_id):
            inherited = holder != file_id
            for permission in self.grants.get(holder, []):
                entry = merged.get(permission["id"])
                if entry is None:
                    entry = merged[permission["id"]] = {**permission, "permissionDetails": []}
                elif ROLE_ORDER.index(permission["role"]) > ROLE_ORDER.index(entry["role"]):
                    entry["role"] = permission["role"]
                detail: dict[str, Any] = {
                    "permissionType": "member" if holder in self.shared_drives else "file",
                    "role": permission["role"], "inherited": inherited,
                }
                if in_drive and inherited:
                    detail["inheritedFrom"] = holder
                entry["permissionDetails"].append(detail)
        if not in_drive:
            for entry in merged.values():
                if entry["type"] not in ("user", "group"):
                    entry.pop("deleted", None)
        return sorted(merged.values(), key=lambda p: p["id"])

    def _view(self, resource: dict[str, Any]) -> dict[str, Any]:
        """A file resource as the API sends it: with ``permissionIds`` always, and ``permissions`` only
        for a My Drive item the caller may share."""
        permissions = self.effective_permissions(resource["id"])
        view = {**resource, "permissionIds": [p["id"] for p in permissions]}
        if not resource.get("driveId") and resource["id"] not in self.cannot_share:
            view["permissions"] = permissions
        return view

    # ---- groups (Admin SDK Directory) --------------------------------------------------------

    def add_group(self, email: str, *members: str) -> str:
        """A Google group with these direct members (a member naming a group is added as ``GROUP``)."""
        with self._lock:
            self.groups.setdefault(email.lower(), [])
            for member in members:
                self.add_member(email, member)
            return email.lower()

    def add_member(self, group: str, email: str, *, status: str = "ACTIVE", member_type: str | None = None) -> None:
        """Add ``email`` to ``group`` (type ``GROUP`` when ``email`` is a known group, else ``USER``)."""
        with self._lock:
            kind = member_type or ("GROUP" if email.lower() in self.groups else "USER")
            member: dict[str, Any] = {
                "kind": "admin#directory#member", "etag": secrets.token_hex(6),
                "id": str(int(hashlib.sha1(email.lower().encode()).hexdigest()[:12], 16)),
                "email": email, "role": "MEMBER", "type": kind,
            }
            if kind == "USER":
                member["status"] = status
            if kind == "CUSTOMER":
                member.pop("email")
            listed = self.groups.setdefault(group.lower(), [])
            listed[:] = [m for m in listed if m.get("email", "").lower() != email.lower()] + [member]

    def remove_member(self, group: str, email: str) -> None:
        """Take ``email`` out of ``group`` (``KeyError`` when it is not a direct member)."""
        with self._lock:
            listed = self.groups[group.lower()]
            if not any(m.get("email", "").lower() == email.lower() for m in listed):
                raise KeyError(f"{email} is not a member of {group}")
            listed[:] = [m for m in listed if m.get("email", "").lower() != email.lower()]

    def derived_members(self, group: str) -> list[dict[str, Any]]:
        """Direct members of ``group`` then the members of nested groups, each once (what
        ``includeDerivedMembership=true`` lists)."""
        out: dict[str, dict[str, Any]] = {}
        seen: set[str] = set()
        queue = [group.lower()]
        while queue:
            current = queue.pop(0)
            if current in seen:
                continue
            seen.add(current)
            for member in self.groups.get(current, []):
                out.setdefault(member.get("email", member["id"]).lower(), member)
                if member["type"] == "GROUP":
                    queue.append(member["email"].lower())
        return list(out.values())

    def stall_next(self, method: str, seconds: float, *, times: int = 1) -> None:
        """Make the next ``times`` calls of ``method`` (e.g. ``"members.list"``) answer after ``seconds``
        (a client with a shorter timeout sees a socket timeout)."""
        with self._lock:
            self._stalls.append(_Fault(method, int(seconds * 1000), "", {}, times))

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

    def _stall_for(self, request: Request) -> float:
        """Seconds to wait before answering (an injected stall), matched by method name."""
        with self._lock:
            method = "members.list" if request.path.startswith("/admin/directory/v1/") else None
            if method is None and request.path.startswith("/drive/v3/"):
                parts = tuple(p for p in request.path[len("/drive/v3/"):].split("/") if p)
                method = _METHODS.get(tuple("*" if i == 1 and parts[0] == "files" else p for i, p in enumerate(parts)))
            for stall in self._stalls:
                if stall.method == method and stall.remaining > 0:
                    stall.remaining -= 1
                    return stall.status / 1000
        return 0.0

    def handle(self, request: Request) -> Response:
        """The WSGI-level entry point pytest-httpserver calls for every request."""
        stall = self._stall_for(request)
        if stall:
            time.sleep(stall)   # outside the lock: other requests go on
        with self._lock:
            if request.path == "/token":
                return self._token(request)
            if request.path.startswith("/admin/directory/v1/"):
                return self._directory(request)
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
            if not self._token_info[auth[len("Bearer "):]][0] & DRIVE_SCOPES:
                return _error(403, "insufficientPermissions", "Request had insufficient authentication scopes.")
            params = {k: v for k, v in request.args.items()}
            # methods on one file are logged with their path parameter too
            self.requests.append((method, {**params, "fileId": parts[1]} if "*" in pattern else params))
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
            scopes = frozenset(str(claims.get("scope", "")).split())
            if not scopes or not scopes <= DRIVE_SCOPES | DIRECTORY_SCOPES:
                return _json({"error": "invalid_scope"}, 400)
            identity = str(claims.get("sub") or claims["iss"])
            self.token_grants.append(f"jwt:{claims['iss']}" + (f" as {claims['sub']}" if claims.get("sub") else ""))
        elif grant == "refresh_token":
            client = self.oauth_clients.get(form.get("client_id", ""))
            if client is None or client != (form.get("client_secret"), form.get("refresh_token")):
                return _json({"error": "invalid_grant", "error_description": "Bad Request"}, 400)
            scopes = frozenset((form.get("scope") or DRIVE_READONLY).split())
            identity = str(form.get("client_id"))
            self.token_grants.append(f"refresh:{form.get('client_id')}")
        else:
            return _json({"error": "unsupported_grant_type"}, 400)
        token = "ya29.fake-" + secrets.token_urlsafe(24)
        self._access_tokens.add(token)
        self._token_info[token] = (scopes, identity)
        return _json({"access_token": token, "expires_in": 3599, "token_type": "Bearer", "scope": " ".join(sorted(scopes))})

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
        page = [self._view(r) for r in items[offset:offset + size]]
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
        if isinstance(resource, Response):
            return resource
        if params.get("alt") != "media":
            return self._view(resource)
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
                change["file"] = self._view(resource)
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

    def _permissions_list(self, params: dict[str, str], file_id: str) -> Any:
        if file_id in self.shared_drives:
            if params.get("supportsAllDrives") != "true":
                return _error(404, "notFound", f"File not found: {file_id}.")
            permissions = sorted(({**p, "permissionDetails": [{"permissionType": "member", "role": p["role"],
                                                               "inherited": False}]}
                                  for p in self.grants.get(file_id, [])), key=lambda p: p["id"])
            in_drive = True
        else:
            resource = self._file_or_404(file_id, params)
            if isinstance(resource, Response):
                return resource
            if file_id in self.cannot_share:
                return _error(403, "insufficientFilePermissions",
                              "The user does not have sufficient permissions for this file.")
            permissions = self.effective_permissions(file_id)
            in_drive = bool(resource.get("driveId"))
        offset = _decode_page(params.get("pageToken"), "permissions", file_id)
        if offset is None:
            return _error(400, "invalid", "Invalid Value: pageToken")
        if "pageSize" in params:
            size = min(int(params["pageSize"]), 100, self.page_limit)
        else:   # documented: at most 100 for shared drives, the whole list otherwise
            size = min(100, self.page_limit) if in_drive else len(permissions) or 1
        body: dict[str, Any] = {"kind": "drive#permissionList", "permissions": permissions[offset:offset + size]}
        if offset + size < len(permissions):
            body["nextPageToken"] = _encode_page(offset + size, "permissions", file_id)
        return body

    def _directory(self, request: Request) -> Response:
        """``members.list`` of the Admin SDK Directory API (the only Directory method the fake serves)."""
        match = re.fullmatch(r"/admin/directory/v1/groups/([^/]+)/members", request.path)
        if match is None or request.method != "GET":
            return _error(404, "notFound", f"no such method {request.method} {request.path}")
        auth = request.headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
        if token not in self._access_tokens:
            return _error(401, "authError", "Login Required.")
        params = {k: v for k, v in request.args.items()}
        self.requests.append(("members.list", {**params, "groupKey": match.group(1)}))
        method = self.directory_discovery["resources"]["members"]["methods"]["list"]
        unknown = set(params) - set(self.directory_discovery["parameters"]) - set(method["parameters"])
        if unknown:
            return _error(400, "invalidParameter", f"unknown parameters {sorted(unknown)}")
        scopes, identity = self._token_info[token]
        if not scopes & DIRECTORY_SCOPES:
            return _error(403, "insufficientPermissions", "Request had insufficient authentication scopes.")
        for fault in self._faults:
            if fault.method == "members.list" and fault.remaining > 0:
                fault.remaining -= 1
                return _error(fault.status, fault.reason, "injected fault", fault.headers)
        group = match.group(1).lower()
        if identity not in self.directory_readers or group in self.hidden_groups:
            return _error(403, "forbidden", "Not Authorized to access this resource/api")
        if group not in self.groups:
            return _error(404, "notFound", "Resource Not Found: groupKey")
        members = (self.derived_members(group) if params.get("includeDerivedMembership") == "true"
                   else list(self.groups[group]))
        offset = _decode_page(params.get("pageToken"), "members", group + params.get("includeDerivedMembership", ""))
        if offset is None:
            return _error(400, "invalid", "Invalid Input: pageToken")
        size = min(int(params.get("maxResults", 200)), 200, self.page_limit)
        body: dict[str, Any] = {"kind": "admin#directory#members", "etag": '"fake-etag"'}
        if members[offset:offset + size]:
            body["members"] = members[offset:offset + size]
        if offset + size < len(members):
            body["nextPageToken"] = _encode_page(offset + size, "members", group + params.get("includeDerivedMembership", ""))
        return _json(apply_fields(body, parse_fields(params.get("fields") or _DEFAULT_FIELDS["members.list"])))

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
