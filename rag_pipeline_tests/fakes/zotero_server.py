"""A stateful fake of the Zotero Web API v3 (read side) on 127.0.0.1, for the real ``pyzotero`` client.

``FakeZoteroLibrary`` is one library's mutable state: items as the API renders them (the 20
top-level items of ``../shared/fixtures/zotero/items_doc.json`` and the child attachment of
``attachments_doc.json``, plus whatever a test adds), attachment files, a library version that
every write raises, and a delete log. Tests change it between "days" with ``add_item``,
``add_attachment``, ``update``, ``set_file``, ``trash`` and ``erase``.

``FakeZoteroServer`` serves it over HTTP (werkzeug, threaded) with what the real API sends:

* ``GET /{users|groups}/{id}/items``, ``/items/top``, ``/items/{key}``, ``/items/{key}/children``:
  ``format=json|keys|versions``, ``limit`` (default 25, at most 100; ``keys``/``versions`` unlimited
  unless asked), ``start``, ``since``, ``itemKey``, ``includeTrashed`` (default 0: trashed items and
  the children of trashed parents are left out, as in the web library). Headers ``Total-Results``,
  ``Last-Modified-Version`` (the library's for multi-object requests, the item's for one item) and
  ``Link`` (``first``/``prev``/``next``/``last``/``alternate``, absolute URLs).
* ``If-Modified-Since-Version`` on multi-object requests: ``304 Not Modified`` when the library has
  not changed since that version.
* ``GET .../items/{key}/file``: ``302`` to a storage URL (the real API redirects to S3), which serves
  the bytes with the attachment's ``contentType``; ``404`` when no file is stored.
* ``GET .../deleted?since=V``: SYNTHETIC. No public recording of this endpoint exists; the body has
  the documented shape ``{"collections":[],"searches":[],"items":[keys],"tags":[],"settings":[]}``
  with ``Last-Modified-Version``. Erasing a parent logs its child items too, as Zotero does.
* Authentication: with ``api_key`` set, ``Zotero-API-Key: <key>`` or ``Authorization: Bearer <key>``
  is required (else ``403 Forbidden``; a key revoked with ``revoke_key()`` gets ``403 Invalid key``).
  ``Zotero-API-Version`` is recorded.
* Key scope, as the dataserver checks it (``Zotero_Permissions::canAccess``): ``GET /keys/current``
  answers the key's JSON (``key``, ``userID``, ``username``, ``displayName``, ``access`` with ``user``
  ``{library, files, notes, write}`` and ``groups`` ``{"<id>"|"all": {library, write}}``; an empty part
  is left out, as the dataserver does); ``403`` without a key; ``GET /keys/<key>`` answers the same for
  the configured key and ``404 Key not found`` otherwise. The library's own requests need that scope:
  a user library is readable with ``access.user.library`` by a key of its owner (or by anyone when
  the server has no ``api_key``: a public library); a group library by a key with
  ``access.groups["<id>"|"all"].library`` whose user is in the group, or by anyone when the group is
  public (``PublicOpen``/``PublicClosed``) with ``libraryReading: all``; else ``403 Forbidden``.
  ``set_key_access(access)`` and ``revoke_key()`` change the key between days.
* Groups (``server.groups``, ``FakeZoteroGroup``): ``GET /groups/{id}`` answers the group as
  ``../shared/fixtures/zotero/groups_doc.json`` shows it (``id``, ``version``, ``links``, ``meta``,
  ``data`` with ``owner``, ``admins``/``members`` user ids (left out when empty), ``type``,
  ``libraryReading``, ...) and ``Last-Modified-Version: <group version>``; ``404 Group not found``;
  ``403 Forbidden`` to a client that may not read the group's library (the same check as above).
  ``add_member``, ``remove_member`` and ``set_type`` change a group (each raises its version). A group
  library's server gets, unless given one, the fixture group under the library's id made
  ``PublicOpen`` with ``libraryReading: all`` (SYNTHETIC: so an anonymous client reads it).
* Faults (``server.faults``, changeable between requests): ``rate_limit(n, ...)`` answers the next
  ``n`` API requests with 429 + ``Retry-After`` (or 503 + ``Backoff`` + ``Retry-After``);
  ``fail_page`` makes listing pages from that page number on fail with a status; ``empty_listings``
  answers every listing with 0 items (``Total-Results: 0``); ``short_total`` announces more results
  than it sends; ``delay_s`` answers slowly; ``backoff_s`` adds ``Backoff`` to successful answers;
  ``after_page`` runs a callback after each listing page (a write in the middle of a listing);
  ``reject_since_below`` answers 400 to ``since`` older than a purge horizon (SYNTHETIC: the real
  server's behaviour for very old versions is not documented).

``server.requests`` records each request (method, path, query, selected headers, status) for
assertions; the API key itself is never recorded.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
FIXTURES = SHARED / "fixtures" / "zotero"
CORPUS = SHARED / "corpus"

_KEY_ALPHABET = "23456789ABCDEFGHIJKLMNPQRSTUVWXYZ"
_EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)


def _now_iso(version: int) -> str:
    """A deterministic 'dateModified' that moves forward with the library version."""
    return (_EPOCH + timedelta(minutes=version)).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class FakeZoteroLibrary:
    """One Zotero library's mutable state (see module docstring). ``items`` maps key -> item JSON
    as the API renders it; ``files`` maps attachment key -> (bytes, content type); ``delete_log``
    maps erased key -> the library version of its erasure."""

    library_type: str = "user"
    library_id: int = 475425
    library_name: str = "Z public library"
    version: int = 0
    items: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    delete_log: dict[str, int] = field(default_factory=dict)
    _rng: random.Random = field(default_factory=lambda: random.Random(7), repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    @property
    def prefix(self) -> str:
        """``users/<id>`` or ``groups/<id>``."""
        return f"{self.library_type}s/{self.library_id}"

    @classmethod
    def from_fixtures(cls, fixtures: Path = FIXTURES, *, library_type: str = "user",
                      library_id: int = 475425) -> FakeZoteroLibrary:
        """The 20 top-level items of ``items_doc.json`` (version 1) and the ``attachments_doc.json``
        child (link mode ``"idk"``, version 2). That attachment's recorded parent (47RUN6RI) is not in
        the fixture, so it is re-parented under NM66T6EF, a fixture webpage item."""
        lib = cls(library_type=library_type, library_id=library_id)
        for item in json.loads((fixtures / "items_doc.json").read_text()):
            lib.items[item["key"]] = lib._normalise(copy.deepcopy(item))
        attachment = json.loads((fixtures / "attachments_doc.json").read_text())
        attachment["data"]["parentItem"] = "NM66T6EF"
        lib.items[attachment["key"]] = lib._normalise(attachment)
        lib.version = max(it["version"] for it in lib.items.values())
        return lib

    def _normalise(self, item: dict[str, Any]) -> dict[str, Any]:
        item["library"] = {"type": self.library_type, "id": self.library_id, "name": self.library_name,
                           "links": {}}
        item["data"]["version"] = item["version"]
        item.setdefault("meta", {})
        return item

    def new_key(self) -> str:
        """A fresh 8-character Zotero item key."""
        while True:
            key = "".join(self._rng.choice(_KEY_ALPHABET) for _ in range(8))
            if key not in self.items and key not in self.delete_log:
                return key

    def _bump(self) -> int:
        self.version += 1
        return self.version

    def _touch(self, key: str, version: int) -> None:
        item = self.items[key]
        item["version"] = item["data"]["version"] = version
        item["data"]["dateModified"] = _now_iso(version)

    # ---- writes (each is one library version) -------------------------------------------------

    def add_item(self, *, title: str, item_type: str = "journalArticle", key: str | None = None,
                 **fields: Any) -> str:
        """Add a top-level item; ``fields`` are extra ``data`` fields (``creators``, ``DOI``, ...)."""
        with self._lock:
            key = key or self.new_key()
            version = self._bump()
            data = {"key": key, "version": version, "itemType": item_type, "title": title, "creators": [],
                    "tags": [], "collections": [], "relations": {}, "dateAdded": _now_iso(version),
                    "dateModified": _now_iso(version), **fields}
            self.items[key] = self._normalise({"key": key, "version": version, "meta": {}, "data": data})
            return key

    def add_attachment(self, parent: str | None, *, link_mode: str, title: str = "Full Text PDF",
                       filename: str | None = None, content: bytes | None = None,
                       content_type: str = "application/pdf", path: str | None = None,
                       url: str | None = None, key: str | None = None) -> str:
        """Add an attachment item (child of ``parent``, or top-level when ``None``); ``content`` is
        stored as its file (``imported_*`` link modes)."""
        with self._lock:
            key = key or self.new_key()
            version = self._bump()
            data: dict[str, Any] = {
                "key": key, "version": version, "itemType": "attachment", "linkMode": link_mode,
                "title": title, "accessDate": "", "url": url or "", "note": "", "contentType": content_type,
                "charset": "", "tags": [], "relations": {}, "dateAdded": _now_iso(version),
                "dateModified": _now_iso(version),
            }
            if parent:
                data["parentItem"] = parent
            if filename is not None:
                data["filename"] = filename
            if path is not None:
                data["path"] = path
            self.items[key] = self._normalise({"key": key, "version": version, "meta": {}, "data": data})
            if content is not None:
                self._store_file(key, content, content_type)
            return key

    def _store_file(self, key: str, content: bytes, content_type: str) -> None:
        data = self.items[key]["data"]
        data["md5"] = hashlib.md5(content).hexdigest()  # noqa: S324 - Zotero's own file checksum
        data["mtime"] = 1_700_000_000_000 + self.version
        data["contentType"] = content_type
        self.files[key] = (content, content_type)

    def update(self, key: str, **fields: Any) -> None:
        """Change ``data`` fields of an item (e.g. ``title``): a new version of that item."""
        with self._lock:
            version = self._bump()
            self.items[key]["data"].update(fields)
            self._touch(key, version)

    def set_file(self, key: str, content: bytes, content_type: str | None = None) -> None:
        """Replace an attachment's file (new md5/mtime): a new version of the attachment item."""
        with self._lock:
            version = self._bump()
            self._store_file(key, content, content_type or self.items[key]["data"].get("contentType") or "")
            self._touch(key, version)

    def trash(self, key: str) -> None:
        """Move an item to the trash (``data.deleted = 1``): a new version of that item."""
        self.update(key, deleted=1)

    def erase(self, key: str) -> list[str]:
        """Delete an item for good, with its child items; all their keys enter the delete log."""
        with self._lock:
            version = self._bump()
            gone = [key] + [k for k, it in self.items.items() if it["data"].get("parentItem") == key]
            for k in gone:
                self.items.pop(k, None)
                self.files.pop(k, None)
                self.delete_log[k] = version
            return gone

    # ---- reads --------------------------------------------------------------------------------

    def children_of(self, key: str) -> list[str]:
        """Keys of the child items of ``key``."""
        return [k for k, it in self.items.items() if it["data"].get("parentItem") == key]

    def visible(self, key: str) -> bool:
        """Not in the trash, and not the child of a trashed parent."""
        data = self.items[key]["data"]
        if data.get("deleted"):
            return False
        parent = data.get("parentItem")
        return not (parent and parent in self.items and self.items[parent]["data"].get("deleted"))

    def render(self, key: str, base_url: str) -> dict[str, Any]:
        """The item as the API sends it, with links and ``meta.numChildren``."""
        item = copy.deepcopy(self.items[key])
        data = item["data"]
        links: dict[str, Any] = {
            "self": {"href": f"{base_url}/{self.prefix}/items/{key}", "type": "application/json"},
            "alternate": {"href": f"https://www.zotero.org/{self.prefix}/items/{key}", "type": "text/html"},
        }
        if data.get("parentItem"):
            links["up"] = {"href": f"{base_url}/{self.prefix}/items/{data['parentItem']}",
                           "type": "application/json"}
        if key in self.files:
            content, ctype = self.files[key]
            links["enclosure"] = {"href": f"{base_url}/{self.prefix}/items/{key}/file/view", "type": ctype,
                                  "title": data.get("filename") or key, "length": len(content)}
        item["links"] = links
        if data.get("itemType") not in ("attachment", "note"):
            item["meta"]["numChildren"] = len(self.children_of(key))
        return item


GROUP_TYPES = ("Private", "PublicClosed", "PublicOpen")
"""The group types the dataserver accepts (``Zotero_Group::__set``)."""


@dataclass
class FakeZoteroGroup:
    """One Zotero group as the dataserver keeps it: ``owner`` (a user id), ``admins`` and ``members``
    (user ids, each role once), ``type`` (``GROUP_TYPES``), ``library_reading`` (``members`` | ``all``),
    ``library_editing``/``file_editing`` (``admins`` | ``members`` | ``none``) and a ``version`` that
    every change raises."""

    id: int
    name: str
    owner: int
    admins: list[int] = field(default_factory=list)
    members: list[int] = field(default_factory=list)
    type: str = "Private"
    library_reading: str = "members"
    library_editing: str = "admins"
    file_editing: str = "admins"
    description: str = ""
    url: str = ""
    version: int = 0
    created: str = "2013-05-22T11:22:46Z"
    last_modified: str = "2013-05-22T11:26:50Z"

    @property
    def public(self) -> bool:
        """``PublicOpen`` or ``PublicClosed`` (``Zotero_Group::isPublic``)."""
        return self.type in ("PublicOpen", "PublicClosed")

    @property
    def readable_by_anyone(self) -> bool:
        """A public group whose library anyone may read (``libraryReading: all``)."""
        return self.public and self.library_reading == "all"

    def users(self) -> set[int]:
        """Every user in the group: owner, admins and members."""
        return {self.owner, *self.admins, *self.members}

    def _bump(self) -> None:
        self.version += 1
        self.last_modified = _now_iso(10_000 + self.version)

    def add_member(self, user_id: int, role: str = "member") -> None:
        """Add ``user_id`` as ``member`` or ``admin`` (``ValueError`` for another role or a user already in it)."""
        if role not in ("member", "admin"):
            raise ValueError(f"Invalid role '{role}'")
        if user_id in self.users():
            raise ValueError(f"user {user_id} is already in group {self.id}")
        (self.admins if role == "admin" else self.members).append(user_id)
        self._bump()

    def remove_member(self, user_id: int) -> None:
        """Remove ``user_id`` (``ValueError`` for the owner or a user not in the group, as the dataserver)."""
        if user_id == self.owner:
            raise ValueError(f"Cannot delete owner of group {self.id}")
        if user_id not in self.users():
            raise ValueError(f"User {user_id} is not a member of group {self.id}")
        self.admins = [u for u in self.admins if u != user_id]
        self.members = [u for u in self.members if u != user_id]
        self._bump()

    def set_type(self, type_: str, *, library_reading: str | None = None) -> None:
        """Change the group's type (and ``libraryReading``): ``Private`` forces ``members`` reading,
        ``PublicOpen`` forces ``fileEditing: none``, as the group settings page does."""
        if type_ not in GROUP_TYPES:
            raise ValueError(f"Invalid group type '{type_}'")
        self.type = type_
        if library_reading is not None:
            if library_reading not in ("members", "all"):
                raise ValueError(f"Invalid libraryReading value '{library_reading}'")
            self.library_reading = library_reading
        if type_ == "Private":
            self.library_reading = "members"
        if type_ == "PublicOpen":
            self.file_editing = "none"
        self._bump()

    def render(self, base_url: str) -> dict[str, Any]:
        """The group as ``GET /groups/<id>`` sends it (``Zotero_Group::toResponseJSON``)."""
        data: dict[str, Any] = {"id": self.id, "version": self.version, "name": self.name, "owner": self.owner,
                                "type": self.type, "description": self.description, "url": self.url,
                                "libraryEditing": self.library_editing, "libraryReading": self.library_reading,
                                "fileEditing": self.file_editing}
        if self.admins:
            data["admins"] = list(self.admins)
        if self.members:
            data["members"] = list(self.members)
        return {
            "id": self.id, "version": self.version,
            "links": {"self": {"href": f"{base_url}/groups/{self.id}", "type": "application/json"},
                      "alternate": {"href": f"https://www.zotero.org/groups/{self.id}", "type": "text/html"}},
            "meta": {"created": self.created, "lastModified": self.last_modified, "numItems": 0},
            "data": data,
        }


def group_from_fixture(fixtures: Path = FIXTURES, *, group_id: int | None = None, **changes: Any) -> FakeZoteroGroup:
    """The group of ``groups_doc.json`` (smart_cities: owner 436, members 1177919 and 1408658, Private),
    under ``group_id`` if given, with ``changes`` (``FakeZoteroGroup`` fields) applied."""
    data = json.loads((fixtures / "groups_doc.json").read_text())[0]["data"]
    group = FakeZoteroGroup(
        id=group_id if group_id is not None else int(data["id"]), name=data["name"], owner=int(data["owner"]),
        admins=[int(u) for u in data.get("admins", [])], members=[int(u) for u in data.get("members", [])],
        type=data["type"], library_reading=data["libraryReading"], library_editing=data["libraryEditing"],
        file_editing=data["fileEditing"], description=data.get("description", ""), url=data.get("url", ""),
        version=int(data.get("version", 0)))
    for name, value in changes.items():
        setattr(group, name, value)
    return group


def full_key_access() -> dict[str, Any]:
    """A key's ``access`` with everything granted: its user's library and all groups."""
    return {"user": {"library": True, "files": True, "notes": True, "write": True},
            "groups": {"all": {"library": True, "write": True}}}


@dataclass
class Faults:
    """Misbehaviour to inject (see module docstring). Change between requests; ``clear()`` resets."""

    rate_limited: int = 0
    rate_limit_status: int = 429
    retry_after: str = "1"
    fail_page: int | None = None
    fail_status: int = 500
    empty_listings: bool = False
    short_total: int = 0
    delay_s: float = 0.0
    backoff_s: str | None = None
    reject_since_below: int | None = None
    after_page: Callable[[int], None] | None = None
    """Called with the page number after each JSON listing page is built (e.g. to write to the
    library mid-listing)."""

    def rate_limit(self, n: int, *, retry_after: str = "1", status: int = 429) -> None:
        """Answer the next ``n`` API requests with ``status`` and ``Retry-After: retry_after``."""
        self.rate_limited, self.retry_after, self.rate_limit_status = n, retry_after, status

    def clear(self) -> None:
        """Back to a well-behaved server."""
        self.__init__()  # type: ignore[misc]


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the fake saw it (never the API key)."""

    method: str
    path: str
    query: dict[str, str]
    if_modified_since_version: str | None
    api_version: str | None
    authenticated: bool
    status: int


class FakeZoteroServer:
    """Serves a ``FakeZoteroLibrary`` on ``http://127.0.0.1:<port>`` (see module docstring).
    Use as a context manager, or ``start()``/``stop()``."""

    def __init__(self, library: FakeZoteroLibrary, *, api_key: str | None = None,
                 groups: Iterable[FakeZoteroGroup] = (), key_user_id: int | None = None,
                 key_access: dict[str, Any] | None = None) -> None:
        self.library = library
        self.api_key = api_key
        self.groups: dict[int, FakeZoteroGroup] = {g.id: g for g in groups}
        if library.library_type == "group" and library.library_id not in self.groups:
            self.groups[library.library_id] = group_from_fixture(
                group_id=library.library_id, type="PublicOpen", library_reading="all", file_editing="none")
        if key_user_id is None:
            key_user_id = (self.groups[library.library_id].owner if library.library_type == "group"
                           else library.library_id)
        self.key_user_id = key_user_id
        """The Zotero user the API key belongs to (``userID`` of ``/keys/current``)."""
        self.key_access: dict[str, Any] = full_key_access() if key_access is None else key_access
        """The key's ``access`` as ``/keys/current`` answers it."""
        self.key_revoked = False
        self.faults = Faults()
        self.requests: list[RecordedRequest] = []
        self._server = make_server("127.0.0.1", 0, self._wsgi, threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321`` (what ``ZOTERO_API_URL`` is set to)."""
        return f"http://127.0.0.1:{self._server.server_port}"

    def start(self) -> FakeZoteroServer:
        """Start serving in a daemon thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeZoteroServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_key_access(self, access: dict[str, Any]) -> None:
        """Replace the key's ``access`` (e.g. ``{"user": {"library": False}}`` revokes the user library)."""
        self.key_access = access

    def revoke_key(self) -> None:
        """Delete the key: every request that presents it is answered ``403 Invalid key``."""
        self.key_revoked = True

    def key_json(self) -> dict[str, Any]:
        """The key as ``GET /keys/current`` answers it (``Zotero_Key::toJSON``: empty parts left out)."""
        access = {part: value for part, value in self.key_access.items() if value}
        return {"key": self.api_key, "userID": self.key_user_id, "username": f"user{self.key_user_id}",
                "displayName": "", **({"access": access} if access else {})}

    def api_requests(self, path_suffix: str = "") -> list[RecordedRequest]:
        """Recorded API requests (storage downloads excluded) whose path ends with ``path_suffix``."""
        return [r for r in self.requests if not r.path.startswith("/_storage/") and r.path.endswith(path_suffix)]

    # ---- WSGI ---------------------------------------------------------------------------------

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        request = Request(environ)
        response = self._dispatch(request)
        self.requests.append(RecordedRequest(
            request.method, request.path, dict(request.args.items()),
            request.headers.get("If-Modified-Since-Version"), request.headers.get("Zotero-API-Version"),
            self._authenticated(request), response.status_code))
        return response(environ, start_response)

    def _authenticated(self, request: Request) -> bool:
        if self.api_key is None:
            return True
        return self._presented_key(request) == self.api_key and not self.key_revoked

    @staticmethod
    def _presented_key(request: Request) -> str | None:
        key = request.headers.get("Zotero-API-Key")
        auth = request.headers.get("Authorization") or ""
        if not key and auth.lower().startswith("bearer "):
            key = auth[7:].strip()
        return key or None

    def _has_key(self, request: Request) -> bool:
        """The request presents the configured (valid) key."""
        return self.api_key is not None and self._authenticated(request)

    def _can_read(self, request: Request, library_type: str, library_id: int) -> bool:
        """``Zotero_Permissions::canAccess(library)`` for this request (see the module docstring)."""
        keyed = self._has_key(request)
        access = self.key_access if keyed else {}
        if library_type == "users":
            if self.api_key is None:
                return True  # no key configured: a public library
            return keyed and self.key_user_id == library_id and bool((access.get("user") or {}).get("library"))
        group = self.groups.get(library_id)
        if group is None:
            return False
        if group.readable_by_anyone:
            return True
        groups = access.get("groups") or {}
        granted = bool((groups.get(str(library_id)) or {}).get("library") or (groups.get("all") or {}).get("library"))
        return keyed and granted and self.key_user_id in group.users()

    def _dispatch(self, request: Request) -> Response:
        faults = self.faults
        if faults.delay_s:
            time.sleep(faults.delay_s)
        if request.path.startswith("/_storage/"):
            return self._storage(request)
        if faults.rate_limited > 0:
            faults.rate_limited -= 1
            headers = {"Retry-After": faults.retry_after}
            if faults.rate_limit_status == 503:
                headers["Backoff"] = faults.retry_after
            return Response("Rate limit exceeded" if faults.rate_limit_status == 429 else "Service unavailable",
                            status=faults.rate_limit_status, headers=headers, content_type="text/plain")
        if self.api_key is not None and self.key_revoked and self._presented_key(request) == self.api_key:
            return Response("Invalid key", status=403, content_type="text/plain")
        parts = request.path.strip("/").split("/")
        if request.method == "GET" and parts[0] in ("keys", "groups") and len(parts) == 2 and (
                self._presented_key(request) is None or self._authenticated(request)):
            # answered to anonymous clients too (the dataserver's own checks, in _key and _group)
            return self._key(request, parts[1]) if parts[0] == "keys" else self._group(request, parts[1])
        if not self._authenticated(request):
            return Response("Forbidden", status=403, content_type="text/plain")
        if request.method != "GET":
            return Response("Method not allowed", status=405, content_type="text/plain")
        lib = self.library
        if len(parts) < 3 or f"{parts[0]}/{parts[1]}" != lib.prefix:
            return Response("Not found", status=404, content_type="text/plain")
        if lib.library_type == "group" and lib.library_id not in self.groups:
            return Response("Not found", status=404, content_type="text/plain")
        if not self._can_read(request, parts[0], lib.library_id):
            return Response("Forbidden", status=403, content_type="text/plain")
        since = request.args.get("since")
        if (since is not None and faults.reject_since_below is not None
                and int(since) < faults.reject_since_below):
            return Response("'since' version is too old", status=400, content_type="text/plain")
        with lib._lock:
            rest = parts[2:]
            if rest == ["deleted"]:
                return self._deleted(request)
            if rest == ["items"]:
                return self._listing(request, list(lib.items))
            if rest == ["items", "top"]:
                return self._listing(request, [k for k, it in lib.items.items() if not it["data"].get("parentItem")])
            if len(rest) == 2 and rest[0] == "items":
                return self._single(request, rest[1])
            if len(rest) == 3 and rest[0] == "items" and rest[2] == "children":
                if rest[1] not in lib.items:
                    return Response("Not found", status=404, content_type="text/plain")
                return self._listing(request, lib.children_of(rest[1]), children_of=rest[1])
            if len(rest) == 3 and rest[0] == "items" and rest[2] == "file":
                return self._file(request, rest[1])
        return Response("Not found", status=404, content_type="text/plain")

    def _key(self, request: Request, which: str) -> Response:
        if which == "current":
            if not self._has_key(request):
                return Response("Forbidden", status=403, content_type="text/plain")
        elif self.api_key is None or which != self.api_key or self.key_revoked:
            return Response("Key not found", status=404, content_type="text/plain")
        return Response(json.dumps(self.key_json()), content_type="application/json", headers=self._headers())

    def _group(self, request: Request, which: str) -> Response:
        group = self.groups.get(int(which)) if which.isdigit() else None
        if group is None:
            return Response("Group not found", status=404, content_type="text/plain")
        if not self._can_read(request, "groups", group.id):
            return Response("Forbidden", status=403, content_type="text/plain")
        return Response(json.dumps(group.render(self.url)), content_type="application/json",
                        headers=self._headers(**{"Last-Modified-Version": str(group.version)}))

    def _headers(self, **extra: str) -> dict[str, str]:
        headers = {"Zotero-API-Version": "3", **extra}
        if self.faults.backoff_s is not None:
            headers["Backoff"] = self.faults.backoff_s
        return headers

    def _listing(self, request: Request, keys: list[str], *, children_of: str | None = None) -> Response:
        lib, args, faults = self.library, request.args, self.faults
        ims = request.headers.get("If-Modified-Since-Version")
        if ims is not None and lib.version <= int(ims):
            return Response(status=304, headers=self._headers(**{"Last-Modified-Version": str(lib.version)}))
        include_trashed = args.get("includeTrashed") == "1"
        selected = [k for k in keys if include_trashed or (lib.visible(k) or (
            children_of is not None and not lib.items[k]["data"].get("deleted")))]
        if args.get("itemKey"):
            wanted = set(args["itemKey"].split(","))
            selected = [k for k in selected if k in wanted]
        if args.get("since") is not None:
            selected = [k for k in selected if lib.items[k]["version"] > int(args["since"])]
        fmt = args.get("format", "json")
        if faults.empty_listings:
            selected = []
        total = len(selected)
        unlimited = fmt in ("keys", "versions") and "limit" not in args
        limit = total if unlimited else min(int(args.get("limit", 25)), 100)
        start = int(args.get("start", 0))
        page = selected[start:start + limit] if limit else []
        page_number = start // limit + 1 if limit else 1
        if faults.fail_page is not None and page_number >= faults.fail_page and fmt == "json":
            return Response("An error occurred", status=faults.fail_status, content_type="text/plain")
        if faults.short_total and fmt == "json":
            page = page[: max(0, len(page) - faults.short_total)]
        headers = self._headers(**{"Total-Results": str(total), "Last-Modified-Version": str(lib.version)})
        links = self._links(request, start, limit, total)
        if links:
            headers["Link"] = links
        if fmt == "versions":
            body = json.dumps({k: lib.items[k]["version"] for k in page})
            return Response(body, headers=headers, content_type="application/json")
        if fmt == "keys":
            return Response("\n".join(page) + "\n", headers=headers, content_type="text/plain")
        body = json.dumps([lib.render(k, self.url) for k in page])
        if faults.after_page is not None:
            faults.after_page(page_number)
        return Response(body, headers=headers, content_type="application/json")

    def _links(self, request: Request, start: int, limit: int, total: int) -> str:
        if not limit:
            return ""
        base = f"{self.url}{request.path}"
        params = {k: v for k, v in request.args.items() if k != "start"}

        def url(at: int) -> str:
            query = urlencode({**params, **({"start": at} if at else {})})
            return f"{base}?{query}" if query else base

        links = []
        if start > 0:
            links.append(f'<{url(0)}>; rel="first"')
            links.append(f'<{url(max(0, start - limit))}>; rel="prev"')
        if start + limit < total:
            links.append(f'<{url(start + limit)}>; rel="next"')
            last = ((total - 1) // limit) * limit
            links.append(f'<{url(last)}>; rel="last"')
        links.append(f'<https://www.zotero.org/{self.library.prefix}/items>; rel="alternate"')
        return ", ".join(links)

    def _single(self, request: Request, key: str) -> Response:
        lib = self.library
        if key not in lib.items:
            return Response("Not found", status=404, content_type="text/plain")
        version = lib.items[key]["version"]
        ims = request.headers.get("If-Modified-Since-Version")
        if ims is not None and version <= int(ims):
            return Response(status=304, headers=self._headers(**{"Last-Modified-Version": str(version)}))
        return Response(json.dumps(lib.render(key, self.url)), content_type="application/json",
                        headers=self._headers(**{"Last-Modified-Version": str(version)}))

    def _file(self, request: Request, key: str) -> Response:
        lib = self.library
        if key not in lib.items or key not in lib.files:
            return Response("Not found", status=404, content_type="text/plain")
        token = lib.items[key]["data"].get("md5", "x")
        return Response("", status=302, headers=self._headers(
            Location=f"{self.url}/_storage/{lib.prefix}/{key}/{token}", **{"Zotero-File-Compressed": "No"}))

    def _storage(self, request: Request) -> Response:
        parts = request.path.strip("/").split("/")  # _storage/users/<id>/<key>/<md5>
        stored = self.library.files.get(parts[3]) if len(parts) == 5 else None
        if stored is None or self.library.items[parts[3]]["data"].get("md5") != parts[4]:
            return Response("NoSuchKey", status=404, content_type="text/plain")
        content, ctype = stored
        return Response(content, content_type=ctype)

    def _deleted(self, request: Request) -> Response:
        # SYNTHETIC: see the module docstring.
        since = request.args.get("since")
        if since is None:
            return Response("'since' parameter must be provided", status=400, content_type="text/plain")
        lib = self.library
        ims = request.headers.get("If-Modified-Since-Version")
        if ims is not None and lib.version <= int(ims):
            return Response(status=304, headers=self._headers(**{"Last-Modified-Version": str(lib.version)}))
        body = {"collections": [], "searches": [], "tags": [], "settings": [],
                "items": sorted(k for k, v in lib.delete_log.items() if v > int(since))}
        return Response(json.dumps(body), content_type="application/json",
                        headers=self._headers(**{"Last-Modified-Version": str(lib.version)}))


@dataclass(frozen=True)
class StandardKeys:
    """Attachment keys of ``standard_library``, by role."""

    memo: str  # imported_file fake-memo.pdf under PQKBRC33 (a journal article with a DOI)
    paper: str  # imported_url a1977-backus-p21.pdf under 33TK9NH9
    strange: str  # imported_file item_file.pdf (text claiming application/pdf) under X42A7DEE
    unknown: str  # the fixture attachment TM8QRS36, link mode "idk", under NM66T6EF
    linked: str  # linked_file C:\\Papers\\fake-memo.pdf under 85MTWF4F (mapped with LINKED_MAP)
    unreachable: str  # linked_file D:\\Elsewhere\\gone.pdf under 85MTWF4F (no mapping)
    weblink: str  # linked_url under Z6TE2UMT
    doomed: str  # imported_file fake-memo-with-duplicate-page.pdf under Z8N84QAJ
    note: str  # a child note of PQKBRC33 (not a document)


def linked_map(corpus: Path = CORPUS) -> dict[str, str]:
    """The ``path_prefix_map`` that makes ``standard_library``'s linked file reachable."""
    return {"C:\\Papers": str(corpus)}


def standard_library(shared: Path = SHARED, **kwargs: Any) -> tuple[FakeZoteroLibrary, StandardKeys]:
    """The fixture library plus one attachment of every kind (see ``StandardKeys``), with real PDFs
    from ``shared/corpus`` as files. ``kwargs`` go to ``FakeZoteroLibrary.from_fixtures``."""
    corpus, fixtures = shared / "corpus", shared / "fixtures" / "zotero"
    lib = FakeZoteroLibrary.from_fixtures(fixtures, **kwargs)
    keys = StandardKeys(
        memo=lib.add_attachment("PQKBRC33", link_mode="imported_file", filename="fake-memo.pdf",
                                content=(corpus / "fake-memo.pdf").read_bytes()),
        paper=lib.add_attachment("33TK9NH9", link_mode="imported_url", title="Snapshot PDF",
                                 filename="backus.pdf", url="https://example.org/backus.pdf",
                                 content=(corpus / "a1977-backus-p21.pdf").read_bytes()),
        strange=lib.add_attachment("X42A7DEE", link_mode="imported_file", filename="item_file.pdf",
                                   content=(fixtures / "item_file.pdf").read_bytes()),
        unknown="TM8QRS36",
        linked=lib.add_attachment("85MTWF4F", link_mode="linked_file", path="C:\\Papers\\fake-memo.pdf"),
        unreachable=lib.add_attachment("85MTWF4F", link_mode="linked_file", path="D:\\Elsewhere\\gone.pdf"),
        weblink=lib.add_attachment("Z6TE2UMT", link_mode="linked_url", title="Publisher page",
                                   content_type="text/html", url="https://example.org/article"),
        doomed=lib.add_attachment("Z8N84QAJ", link_mode="imported_file", filename="memo-2.pdf",
                                  content=(corpus / "fake-memo-with-duplicate-page.pdf").read_bytes()),
        note=lib.add_item(title="", item_type="note", parentItem="PQKBRC33", note="<p>read again</p>"),
    )
    return lib, keys
