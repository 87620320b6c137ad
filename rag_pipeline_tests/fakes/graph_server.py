"""A stateful fake of Microsoft Graph (drive delta, children, content) and of an Entra ID authority.

Served over HTTPS on 127.0.0.1 with a throwaway CA (``trustme``), because msal refuses ``http://``
authorities. The real ``msal`` and ``requests`` talk to it:

* ``GET /{tenant}/v2.0/.well-known/openid-configuration`` and ``POST /{tenant}/oauth2/v2.0/token``
  (client-credentials grant: client id and secret must match; the scope must end ``/.default``).
* ``GET /v1.0/drives/{drive}/root/delta`` (no token: enumerate; ``token=latest``: empty page and a
  delta link; ``token=<opaque>``: every change since, in order, *not* collapsed, so an item
  changed twice appears twice and the last one wins), ``$select`` applied as Graph does (an item
  is reduced to what was selected: a client that forgets ``deleted`` loses its tombstones).
  A change to an item also reports its ancestor folders, as OneDrive does.
* ``GET /v1.0/drives/{drive}/root:/{path}``, ``/items/{id}/children``, ``/items/{id}/content``
  (302 to a pre-authenticated URL on a *second* server, a "CDN" on another port, which records
  whether an ``Authorization`` header reached it).
* ``GET /v1.0/me/drive/...``: the three real delta bodies in ``../shared/fixtures/msgraph``, served
  as they are except that their ``graph.microsoft.com`` origin is rewritten to this server's.

SYNTHETIC: every delta page for ``/drives/{drive}`` is built by this fake from the shapes of those
fixtures (Microsoft's documented examples); next and delta links carry an opaque base64 token.
Deleted items are reported with ``deleted`` and a ``parentReference`` but without ``name``.
Pages hold ``page_limit`` items (default 2) so paging is always exercised. Faults on demand:
``fail_next`` (429/503 with ``Retry-After``), ``expire_tokens`` (410 ``resyncRequired``),
``repeat_next_link``, ``empty_pages``.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import itertools
import json
import re
import secrets
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import trustme
from pytest_httpserver import HTTPServer
from werkzeug.wrappers import Request, Response

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
FIXTURES = SHARED / "fixtures" / "msgraph"
REAL_ORIGIN = "https://graph.microsoft.com"


@dataclass
class _Fault:
    kind: str
    status: int
    headers: dict[str, str]
    remaining: int


@dataclass
class FakeGraph:
    """In-memory Graph drive with a change log, an Entra ID authority and fault switches.

    ``requests`` logs ``(path, query)`` of every Graph call; ``cdn_auth_headers`` counts
    downloads that arrived at the CDN with an ``Authorization`` header (must stay 0);
    ``content_calls`` lists item ids whose content was requested.
    """

    tenant_id: str = "00000000-aaaa-bbbb-cccc-000000000001"
    client_id: str = "11111111-2222-3333-4444-555555555555"
    client_secret: str = field(default_factory=lambda: "fake-secret-" + secrets.token_urlsafe(16))
    drive_id: str = "b!FakeDrive_0123456789abcdefABCDEF"
    page_limit: int = 2
    items: dict[str, dict[str, Any]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    log: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    content_calls: list[str] = field(default_factory=list)
    token_requests: list[dict[str, str]] = field(default_factory=list)
    cdn_auth_headers: int = 0
    repeat_next_link: bool = False
    empty_pages: int = 0
    hide_items: bool = False
    """A glitch: a fresh delta enumeration returns the drive root only."""
    base_url: str = ""
    cdn_url: str = ""

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._seq = 0
        self._generation = 0
        self._faults: list[_Fault] = []
        self._access_tokens: set[str] = set()
        self.recycle_bin: dict[str, dict[str, Any]] = {}
        self._clock = datetime(2026, 11, 1, 9, 0, tzinfo=timezone.utc)
        self.root_id = self._new_id()
        self.items[self.root_id] = {
            "id": self.root_id, "name": "root", "root": {}, "folder": {"childCount": 0},
            "eTag": '"{root},1"', "cTag": '"c:{root},1"', "lastModifiedDateTime": self._now(),
            "webUrl": "https://contoso.sharepoint.com/sites/fake/Shared%20Documents",
            "parentReference": {"driveId": self.drive_id, "driveType": "documentLibrary"},
        }

    # ---- ids, time, the change log -----------------------------------------------------------

    def _new_id(self) -> str:
        # Graph drive item ids are opaque (e.g. 01BYE5RZ...); same alphabet, shorter.
        return f"01FAKE{next(self._ids):06d}"

    def _now(self) -> str:
        self._clock += timedelta(minutes=1)
        return self._clock.strftime("%Y-%m-%dT%H:%M:%SZ")

    def _ancestors(self, item_id: str) -> list[str]:
        out = []
        parent = (self.items.get(item_id, {}).get("parentReference") or {}).get("id")
        while parent and parent in self.items:
            out.append(parent)
            parent = (self.items[parent].get("parentReference") or {}).get("id")
        return out

    def _touch(self, item: dict[str, Any], *, content: bool) -> None:
        version = int(item["eTag"].rsplit(",", 1)[1].rstrip('"')) + 1
        item["eTag"] = f'"{{{item["id"]}}},{version}"'
        if content:
            item["cTag"] = f'"c:{{{item["id"]}}},{version}"'
        item["lastModifiedDateTime"] = self._now()

    def _record(self, item_id: str, snapshot: dict[str, Any]) -> None:
        self._seq += 1
        self.log.append((self._seq, copy.deepcopy(snapshot)))
        for ancestor in self._ancestors(item_id):
            self._touch(self.items[ancestor], content=False)
            self._seq += 1
            self.log.append((self._seq, copy.deepcopy(self.items[ancestor])))

    def _path_of(self, item_id: str) -> str:
        names = []
        current = item_id
        while current != self.root_id:
            names.append(self.items[current]["name"])
            current = self.items[current]["parentReference"]["id"]
        return "/".join(reversed(names))

    # ---- mutators ------------------------------------------------------------------------------

    def _new_item(self, name: str, parent: str | None) -> dict[str, Any]:
        item_id = self._new_id()
        parent = parent or self.root_id
        return {
            "id": item_id, "name": name, "eTag": f'"{{{item_id}}},1"', "cTag": f'"c:{{{item_id}}},1"',
            "lastModifiedDateTime": self._now(),
            "webUrl": f"https://contoso.sharepoint.com/sites/fake/Shared%20Documents/{urllib.parse.quote(name)}",
            "parentReference": {"driveId": self.drive_id, "driveType": "documentLibrary", "id": parent},
        }

    def add_folder(self, name: str, parent: str | None = None) -> str:
        """A folder under ``parent`` (default: the drive root); returns its id."""
        with self._lock:
            item = self._new_item(name, parent)
            item["folder"] = {"childCount": 0}
            item.pop("cTag")
            self.items[item["id"]] = item
            self._record(item["id"], item)
            return item["id"]

    def add_file(self, name: str, parent: str | None, content: bytes, mime: str) -> str:
        """A file with ``file.hashes`` (sha256Hash upper-case hex, as Graph sends); returns its id."""
        with self._lock:
            item = self._new_item(name, parent)
            self.items[item["id"]] = item
            self._set_content(item, content, mime)
            self._record(item["id"], item)
            return item["id"]

    def _set_content(self, item: dict[str, Any], content: bytes, mime: str | None = None) -> None:
        self.blobs[item["id"]] = content
        item["size"] = len(content)
        item["file"] = {
            "mimeType": mime or item["file"]["mimeType"],
            "hashes": {
                "quickXorHash": base64.b64encode(hashlib.sha1(content).digest()[:20]).decode(),  # noqa: S324 - stand-in
                "sha256Hash": hashlib.sha256(content).hexdigest().upper(),
            },
        }

    def update_content(self, item_id: str, content: bytes) -> None:
        """New content: new hashes, eTag and cTag."""
        with self._lock:
            item = self.items[item_id]
            self._set_content(item, content)
            self._touch(item, content=True)
            self._record(item_id, item)

    def rename(self, item_id: str, name: str) -> None:
        """A metadata change: new name and eTag; cTag stays."""
        with self._lock:
            item = self.items[item_id]
            item["name"] = name
            self._touch(item, content=False)
            self._record(item_id, item)

    def move(self, item_id: str, new_parent: str) -> None:
        """Move under ``new_parent``: new parentReference and eTag."""
        with self._lock:
            item = self.items[item_id]
            item["parentReference"] = {**item["parentReference"], "id": new_parent}
            self._touch(item, content=False)
            self._record(item_id, item)

    def delete(self, item_id: str, *, report_children: bool = True) -> None:
        """Delete an item (to the recycle bin). Its tombstone has no ``name``. With
        ``report_children=False`` a folder's descendants vanish without tombstones of their own."""
        with self._lock:
            descendants = [i for i in self.items if item_id in self._ancestors(i)]
            parent_id = self.items[item_id]["parentReference"]["id"]
            for victim in [item_id, *descendants]:
                item = self.items.pop(victim)
                self.recycle_bin[victim] = item
                if victim == item_id or report_children:
                    tombstone = {"id": victim, "deleted": {"state": "deleted"},
                                 "parentReference": dict(item["parentReference"])}
                    tombstone["folder" if "folder" in item else "file"] = {}
                    self._record_plain(tombstone)
            for ancestor in self._ancestors_from(parent_id):
                self._touch(self.items[ancestor], content=False)
                self._record_plain(self.items[ancestor])

    def _ancestors_from(self, item_id: str | None) -> list[str]:
        out = []
        while item_id and item_id in self.items:
            out.append(item_id)
            item_id = (self.items[item_id].get("parentReference") or {}).get("id")
        return out

    def _record_plain(self, snapshot: dict[str, Any]) -> None:
        self._seq += 1
        self.log.append((self._seq, copy.deepcopy(snapshot)))

    def restore(self, item_id: str) -> None:
        """Bring an item back from the recycle bin with the same id."""
        with self._lock:
            item = self.recycle_bin.pop(item_id)
            self.items[item_id] = item
            self._touch(item, content=False)
            self._record(item_id, item)

    # ---- faults --------------------------------------------------------------------------------

    def fail_next(self, kind: str, status: int, *, times: int = 1, retry_after: str | None = None) -> None:
        """The next ``times`` requests of ``kind`` (``"delta"``, ``"content"``, ``"token"``) fail."""
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        with self._lock:
            self._faults.append(_Fault(kind, status, headers, times))

    def expire_tokens(self) -> None:
        """Every delta token issued so far now answers 410 Gone (``resyncRequired``)."""
        with self._lock:
            self._generation += 1

    # ---- HTTP ----------------------------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        """The entry point pytest-httpserver calls for every request to the Graph/authority server."""
        with self._lock:
            path = request.path
            tenant_prefix = f"/{self.tenant_id}"
            if path == f"{tenant_prefix}/v2.0/.well-known/openid-configuration":
                return self._openid_configuration()
            if path == f"{tenant_prefix}/oauth2/v2.0/token" and request.method == "POST":
                return self._token(request)
            if not path.startswith("/v1.0/"):
                return _error(404, "itemNotFound", f"no route {path}")
            auth = request.headers.get("Authorization", "")
            if not auth.startswith("Bearer ") or auth[len("Bearer "):] not in self._access_tokens:
                return _error(401, "InvalidAuthenticationToken", "Access token is empty or invalid.")
            query = {k: v for k, v in request.args.items()}
            self.requests.append((path, query))
            if path.startswith("/v1.0/me/drive/"):
                return self._fixture_page(request)
            drive_prefix = f"/v1.0/drives/{self.drive_id}"
            if not path.startswith(drive_prefix):
                return _error(404, "itemNotFound", "The resource could not be found.")
            rest = path[len(drive_prefix):]
            if rest == "/root/delta":
                return self._fault("delta") or self._delta(request, query)
            if rest.startswith("/root:/"):
                return self._by_path(urllib.parse.unquote(rest[len("/root:/"):]).rstrip(":"), query)
            match = re.fullmatch(r"/items/([^/]+)/(children|content)", rest)
            if match and match.group(2) == "children":
                return self._children(match.group(1), query)
            if match:
                return self._fault("content") or self._content(match.group(1))
            return _error(404, "itemNotFound", "The resource could not be found.")

    def handle_cdn(self, request: Request) -> Response:
        """The pre-authenticated download host: no bearer token needed (and none should come)."""
        with self._lock:
            if request.headers.get("Authorization"):
                self.cdn_auth_headers += 1
            match = re.fullmatch(r"/download/([^/]+)", request.path)
            item_id = match.group(1) if match else ""
            if request.args.get("sig") != _sig(item_id) or item_id not in self.blobs:
                return Response(status=403)
            return Response(self.blobs[item_id], status=200, content_type="application/octet-stream")

    def _fault(self, kind: str) -> Response | None:
        for fault in self._faults:
            if fault.kind == kind and fault.remaining > 0:
                fault.remaining -= 1
                code = "activityLimitReached" if fault.status == 429 else "serviceNotAvailable"
                return _error(fault.status, code, "injected fault", fault.headers)
        return None

    def _openid_configuration(self) -> Response:
        base = f"{self.base_url}/{self.tenant_id}"
        return _json({
            "token_endpoint": f"{base}/oauth2/v2.0/token",
            "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
            "device_authorization_endpoint": f"{base}/oauth2/v2.0/devicecode",
            "issuer": f"{base}/v2.0",
            "token_endpoint_auth_methods_supported": ["client_secret_post", "private_key_jwt", "client_secret_basic"],
            "response_types_supported": ["code", "id_token", "code id_token", "id_token token"],
            "scopes_supported": ["openid", "profile", "email", "offline_access"],
        })

    def _token(self, request: Request) -> Response:
        form = dict(request.form)
        self.token_requests.append({k: ("<redacted>" if k == "client_secret" else v) for k, v in form.items()})
        fault = self._fault("token")
        if fault is not None:
            return fault
        if form.get("grant_type") != "client_credentials":
            return _json({"error": "unsupported_grant_type"}, 400)
        if form.get("client_id") != self.client_id or form.get("client_secret") != self.client_secret:
            return _json({"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret provided."}, 401)
        if not str(form.get("scope", "")).endswith("/.default"):
            return _json({"error": "invalid_scope"}, 400)
        token = "eyJ0eXAiOiJKV1QifQ.fake." + secrets.token_urlsafe(24)
        self._access_tokens.add(token)
        return _json({"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token})

    # ---- delta ---------------------------------------------------------------------------------

    def _link(self, state: dict[str, Any]) -> str:
        token = base64.urlsafe_b64encode(json.dumps(state, separators=(",", ":")).encode()).decode()
        return f"{self.base_url}/v1.0/drives/{self.drive_id}/root/delta?token={token}"

    def _tree_order(self) -> list[dict[str, Any]]:
        out, queue = [], [self.root_id]
        while queue:
            parent = queue.pop(0)
            out.append(self.items[parent])
            kids = sorted((i for i in self.items.values() if (i.get("parentReference") or {}).get("id") == parent),
                          key=lambda i: i["id"])
            for kid in kids:
                if "folder" in kid:
                    queue.append(kid["id"])
                else:
                    out.append(kid)
        return out

    def _delta(self, request: Request, query: dict[str, str]) -> Response:
        token = query.get("token")
        select = query.get("$select")
        if token == "latest":
            return _json({"value": [], "@odata.deltaLink": self._link({"since": self._seq, "s": select, "g": self._generation})})
        if token is None:
            state = {"since": None, "upto": self._seq, "o": 0, "s": select, "e": self.empty_pages}
        else:
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()))
            except ValueError:
                return _error(400, "invalidRequest", "Invalid token")
            if "upto" not in state:  # a delta link: start a new change range
                if state.get("g") != self._generation:
                    return _error(410, "resyncRequired", "Resync required. Replace any local items with the server's version (including deletes) if you're sure that the service was up to date with your local changes when you last sync'd. Upload any local changes that the server doesn't know about.")
                state = {"since": state["since"], "upto": self._seq, "o": 0, "s": state.get("s"), "e": self.empty_pages}
                if self.repeat_next_link:
                    # the same next link every time: a broken server the client must not loop on
                    return _json({"value": [], "@odata.nextLink": self._link({**state, "o": 0, "e": 0, "r": 1})})
            elif state.get("r"):
                return _json({"value": [], "@odata.nextLink": request.url})
        select = state.get("s")
        if state.get("e"):
            return _json({"value": [], "@odata.nextLink": self._link({**state, "e": state["e"] - 1})})
        if state["since"] is None:
            entries = [copy.deepcopy(i) for i in self._tree_order()][: 1 if self.hide_items else None]
        else:
            entries = [snap for seq, snap in self.log if state["since"] < seq <= state["upto"]]
        offset = state["o"]
        page = [_apply_select(e, select) for e in entries[offset:offset + self.page_limit]]
        body: dict[str, Any] = {"@odata.context": f"{self.base_url}/v1.0/$metadata#Collection(driveItem)", "value": page}
        if offset + self.page_limit < len(entries):
            body["@odata.nextLink"] = self._link({**state, "o": offset + self.page_limit})
        else:
            body["@odata.deltaLink"] = self._link({"since": state["upto"], "s": select, "g": self._generation})
        return _json(body)

    def _fixture_page(self, request: Request) -> Response:
        """The real documented delta bodies, origin rewritten: start -> example1 -> example2;
        following example2's delta link gives example3 (``token=latest``-style empty page)."""
        raw = request.full_path
        if "fixture-start" in raw:
            name = "driveitem_delta.example1-first-page-nextLink.json"
        elif raw.startswith("/v1.0/me/drive/delta(token=1230919asd190410jlka)"):
            name = "driveitem_delta.example2-last-page-deltaLink.json"
        elif raw.startswith("/v1.0/me/drive/root/delta"):
            name = "driveitem_delta.example3-token-latest-empty.json"
        else:
            return _error(404, "itemNotFound", "no fixture for this link")
        text = (FIXTURES / name).read_text(encoding="utf-8").replace(REAL_ORIGIN, self.base_url)
        return Response(text, status=200, content_type="application/json")

    # ---- items ---------------------------------------------------------------------------------

    def _by_path(self, path: str, query: dict[str, str]) -> Response:
        for item_id, item in self.items.items():
            if item_id != self.root_id and self._path_of(item_id) == path.strip("/"):
                return _json(_apply_select(item, query.get("$select")))
        return _error(404, "itemNotFound", "The resource could not be found.")

    def _children(self, item_id: str, query: dict[str, str]) -> Response:
        if item_id not in self.items:
            return _error(404, "itemNotFound", "The resource could not be found.")
        kids = [_apply_select(i, query.get("$select")) for i in self.items.values()
                if (i.get("parentReference") or {}).get("id") == item_id]
        return _json({"value": kids})

    def _content(self, item_id: str) -> Response:
        if item_id not in self.items or item_id not in self.blobs:
            return _error(404, "itemNotFound", "The resource could not be found.")
        self.content_calls.append(item_id)
        return Response(status=302, headers={"Location": f"{self.cdn_url}/download/{item_id}?sig={_sig(item_id)}"})

    # ---- serving -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def serve(self, ca: trustme.CA) -> Iterator[str]:
        """Serve Graph + authority and the download CDN over HTTPS with certificates from ``ca``;
        yields the base URL (``https://127.0.0.1:<port>``)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
        servers = []
        try:
            for handler in (self.handle, self.handle_cdn):
                server = HTTPServer(host="127.0.0.1", port=0, ssl_context=context, threaded=True)
                for method in ("GET", "POST"):
                    server.expect_request(re.compile(".*"), method=method).respond_with_handler(handler)
                server.start()
                servers.append(server)
            self.base_url = servers[0].url_for("").rstrip("/")
            self.cdn_url = servers[1].url_for("").rstrip("/")
            yield self.base_url
            for server in servers:
                server.check_handler_errors()
        finally:
            for server in servers:
                server.clear()
                server.stop()


def _sig(item_id: str) -> str:
    return hashlib.sha256(f"fake-sig:{item_id}".encode()).hexdigest()[:16]


def _apply_select(item: dict[str, Any], select: str | None) -> dict[str, Any]:
    """Graph's ``$select``: only the named properties (and ``id``) survive."""
    if not select:
        return copy.deepcopy(item)
    wanted = {name.strip() for name in select.split(",")} | {"id"}
    return {k: copy.deepcopy(v) for k, v in item.items() if k in wanted}


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body), status=status, content_type="application/json", headers=headers)


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    """A Graph-style error body (``error.code``, ``error.message``)."""
    return _json({"error": {"code": code, "message": message,
                            "innerError": {"request-id": secrets.token_hex(8), "date": "2026-11-01T09:00:00"}}},
                 status, headers)
