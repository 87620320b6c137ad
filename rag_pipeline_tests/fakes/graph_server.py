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

Permissions (Graph v1.0 ``permission`` resource, shapes from Microsoft's documented examples; the
fixtures in ``../shared/fixtures/msgraph`` hold none, so these bodies are SYNTHETIC):

* ``GET /v1.0/drives/{drive}/items/{id}/permissions``: the item's *effective* permissions: its own, then
  (unless its inheritance is broken, ``break_inheritance``) every ancestor's up to the nearest one with
  unique permissions, each inherited one carrying ``inheritedFrom {driveId, id, path}``
  (``report_inherited_from=False`` drops it, as SharePoint libraries do). Server-driven paging
  (``permissions_page_limit`` per page, ``@odata.nextLink`` with a ``$skiptoken``), ``$select``.
  Errors: 404 ``itemNotFound``, 403 ``accessDenied`` (``deny_permissions``).
* ``GET /v1.0/groups/{id}/transitiveMembers``: the flat list of nested members (users as
  ``#microsoft.graph.user`` with ``mail``/``userPrincipalName``, groups as ``#microsoft.graph.group``,
  devices as ``#microsoft.graph.device``), loops cut; ``$select`` (``@odata.type`` always kept), ``$top``
  (at most 999; a page holds at most ``members_page_limit``), ``@odata.nextLink``. Errors: 404
  ``Request_ResourceNotFound``, 403 ``Authorization_RequestDenied`` (``deny_group``).
* ``GET /v1.0/drives/{drive}/root`` and ``/items/{id}`` (one item, ``$select``).
* Delta with ``Prefer: deltashowsharingchanges`` (which the docs say needs ``deltashowremovedasdeleted``
  and ``deltatraversepermissiongaps`` in the same request; the fake answers 400 without them): every
  item reported because its sharing changed carries ``"@microsoft.graph.sharedChanged": "True"``.
  A folder's sharing change reports the folder and every item below it, or with
  ``Prefer: hierarchicalsharing`` the folder only. Without ``deltashowsharingchanges`` the same items
  are reported without the annotation. Sharing changes touch neither ``eTag`` nor ``cTag``.
* Test helpers: ``add_user``, ``add_group``, ``add_device``, ``add_member``/``remove_member``,
  ``add_site_group``, ``grant`` (a user, an Entra group or a SharePoint site group), ``create_link``
  (``anonymous`` | ``organization`` | ``users``), ``revoke``, ``break_inheritance``,
  ``deny_permissions``/``deny_group``; ``fail_next("permissions" | "members", ...)``. ``may_read`` is
  the ground truth of who may read an item, computed from this fake's own state (not from JSON).

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
SHARED_CHANGED = "@microsoft.graph.sharedChanged"
SHARING_PREFER_NEEDS = frozenset({"deltashowremovedasdeleted", "deltatraversepermissiongaps"})


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
    permissions_page_limit: int = 2
    members_page_limit: int = 2
    report_inherited_from: bool = True
    users: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Directory users by id: ``{id, displayName, mail, userPrincipalName}``."""
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Entra ID groups by id: ``{id, displayName, mail, members: [directory object ids]}``."""
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)
    site_groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    """SharePoint site groups by (site-local) id: ``{id, displayName, members: [user ids]}``."""
    permissions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Each item's own permissions (the ``permission`` JSON without ``inheritedFrom``)."""
    unique: set[str] = field(default_factory=set)
    """Items whose inheritance is broken: they carry their own permissions only."""
    denied_permissions: set[str] = field(default_factory=set)
    denied_groups: set[str] = field(default_factory=set)
    permission_reads: list[str] = field(default_factory=list)
    """Item ids whose permissions were requested (first page of each read)."""
    member_reads: list[str] = field(default_factory=list)
    """Group ids whose transitive members were requested (first page of each read)."""

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._seq = 0
        self._generation = 0
        self._faults: list[_Fault] = []
        self._access_tokens: set[str] = set()
        self.recycle_bin: dict[str, dict[str, Any]] = {}
        self._clock = datetime(2026, 11, 1, 9, 0, tzinfo=timezone.utc)
        self._perm_ids = itertools.count(1)
        self._directory_ids = itertools.count(1)
        self.root_id = self._new_id()
        self.items[self.root_id] = {
            "id": self.root_id, "name": "root", "root": {}, "folder": {"childCount": 0},
            "eTag": '"{root},1"', "cTag": '"c:{root},1"', "lastModifiedDateTime": self._now(),
            "webUrl": "https://contoso.sharepoint.com/sites/fake/Shared%20Documents",
            "parentReference": {"driveId": self.drive_id, "driveType": "documentLibrary"},
        }
        self.unique.add(self.root_id)  # the library: the top of every permission hierarchy

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

    # ---- directory, permissions and sharing -----------------------------------------------------

    def _directory_id(self) -> str:
        n = next(self._directory_ids)
        return f"{n:08x}-0000-4000-8000-{n:012x}"  # Entra object ids are GUIDs

    def add_user(self, email: str, *, display_name: str | None = None, mail: bool = True,
                 upn: str | None = None) -> str:
        """A directory user; ``mail=False``: no ``mail`` (the UPN, default ``email``, identifies it)."""
        with self._lock:
            user_id = self._directory_id()
            self.users[user_id] = {"id": user_id, "displayName": display_name or email.split("@")[0].title(),
                                   "mail": email if mail else None, "userPrincipalName": upn or email}
            return user_id

    def add_group(self, name: str, members: tuple[str, ...] | list[str] = (), *, mail: str | None = None) -> str:
        """An Entra ID (security or Microsoft 365) group whose direct members are directory object ids."""
        with self._lock:
            group_id = self._directory_id()
            self.groups[group_id] = {"id": group_id, "displayName": name, "mail": mail, "members": list(members)}
            return group_id

    def add_device(self, name: str) -> str:
        """A device object (groups may hold devices; they are nobody who reads documents)."""
        with self._lock:
            device_id = self._directory_id()
            self.devices[device_id] = {"id": device_id, "displayName": name}
            return device_id

    def add_member(self, group_id: str, member_id: str) -> None:
        """Add a direct member (user, group or device id) to a group. Not a change of any drive item."""
        with self._lock:
            if member_id not in self.groups[group_id]["members"]:
                self.groups[group_id]["members"].append(member_id)

    def remove_member(self, group_id: str, member_id: str) -> None:
        """Remove a direct member from a group. Not a change of any drive item."""
        with self._lock:
            self.groups[group_id]["members"].remove(member_id)

    def add_site_group(self, name: str, members: tuple[str, ...] | list[str] = ()) -> str:
        """A SharePoint site group (site-local numeric id) of user ids; Graph v1.0 cannot list its members."""
        with self._lock:
            group_id = str(len(self.site_groups) + 3)  # 1..3 are the site's owners/members/visitors
            self.site_groups[group_id] = {"id": group_id, "displayName": name, "members": list(members)}
            return group_id

    def _perm_id(self) -> str:
        return base64.urlsafe_b64encode(f"perm-{next(self._perm_ids)}".encode()).decode().rstrip("=")

    def _user_identity(self, user_id: str, *, email: bool = True) -> dict[str, Any]:
        user = self.users[user_id]
        address = user["mail"] or user["userPrincipalName"]
        identity: dict[str, Any] = {
            "user": {"id": user_id, "displayName": user["displayName"]},
            "siteUser": {"id": str(10 + list(self.users).index(user_id)), "displayName": user["displayName"],
                         "loginName": f"i:0#.f|membership|{user['userPrincipalName']}"},
        }
        if email:
            identity["user"]["email"] = address
            identity["siteUser"]["email"] = address
        return identity

    def grant(self, item_id: str, *, user: str | None = None, group: str | None = None,
              site_group: str | None = None, roles: tuple[str, ...] = ("read",), email: bool = True,
              login_name: bool = True) -> str:
        """Give ``user``, ``group`` (Entra ID) or ``site_group`` (SharePoint) ``roles`` on an item;
        returns the permission id. ``email=False``: the identities carry no e-mail address;
        ``login_name=False`` (with it): no claims login name either (only the object id is known)."""
        with self._lock:
            perm: dict[str, Any] = {"id": self._perm_id(), "roles": list(roles)}
            if user is not None:
                identity = self._user_identity(user, email=email)
                if not login_name:
                    identity.pop("siteUser")
                perm["grantedToV2"] = identity
            elif group is not None:
                g = self.groups[group]
                perm["grantedToV2"] = {
                    "group": {"id": group, "displayName": g["displayName"], **({"email": g["mail"]} if g["mail"] else {})},
                    "siteUser": {"id": str(100 + list(self.groups).index(group)), "displayName": g["displayName"],
                                 "loginName": f"c:0o.c|federateddirectoryclaimprovider|{group}"},
                }
            elif site_group is not None:
                sg = self.site_groups[site_group]
                perm["grantedToV2"] = {"siteGroup": {"id": site_group, "displayName": sg["displayName"],
                                                     "loginName": sg["displayName"]}}
            else:
                raise ValueError("grant needs a user, a group or a site group")
            self.permissions.setdefault(item_id, []).append(perm)
            self._record_sharing(item_id)
            return perm["id"]

    def create_link(self, item_id: str, scope: str, *, type: str = "view", users: tuple[str, ...] | list[str] = (),
                    expires: str | None = None) -> str:
        """A sharing link (``anonymous`` | ``organization`` | ``users``, ``view`` | ``edit``); ``users``:
        the people a ``users`` link was given to (``grantedToIdentitiesV2``). Returns the permission id."""
        with self._lock:
            perm_id = self._perm_id()
            perm: dict[str, Any] = {
                "id": perm_id, "roles": ["write" if type == "edit" else "read"],
                "link": {"scope": scope, "type": type, "preventsDownload": False,
                         "webUrl": f"https://contoso.sharepoint.com/:w:/s/fake/{perm_id}"},
                "grantedToIdentitiesV2": [self._user_identity(u) for u in users],
                "shareId": f"u!{perm_id}", "hasPassword": False,
            }
            if expires:
                perm["expirationDateTime"] = expires
            self.permissions.setdefault(item_id, []).append(perm)
            self._record_sharing(item_id)
            return perm_id

    def revoke(self, item_id: str, perm_id: str) -> None:
        """Delete one of the item's own permissions (an inherited one is revoked on its ancestor)."""
        with self._lock:
            before = len(self.permissions.get(item_id, []))
            self.permissions[item_id] = [p for p in self.permissions.get(item_id, []) if p["id"] != perm_id]
            if len(self.permissions[item_id]) == before:
                raise KeyError(f"item {item_id} has no permission {perm_id}")
            self._record_sharing(item_id)

    def break_inheritance(self, item_id: str, *, copy_permissions: bool = True) -> None:
        """Give an item unique permissions (SharePoint "stop inheriting"): by default a copy of what it
        inherited becomes its own; later changes to ancestors no longer reach it."""
        with self._lock:
            if copy_permissions:
                inherited = [{k: v for k, v in p.items() if k != "inheritedFrom"}
                             for p in self.effective_permissions(item_id) if "inheritedFrom" in p]
                self.permissions.setdefault(item_id, []).extend(copy.deepcopy(inherited))
            self.unique.add(item_id)
            self._record_sharing(item_id)

    def deny_permissions(self, item_id: str, denied: bool = True) -> None:
        """Reading this item's permissions answers 403 ``accessDenied`` (or no longer, ``denied=False``)."""
        with self._lock:
            (self.denied_permissions.add if denied else self.denied_permissions.discard)(item_id)

    def deny_group(self, group_id: str, denied: bool = True) -> None:
        """Reading this group's members answers 403 ``Authorization_RequestDenied`` (or no longer)."""
        with self._lock:
            (self.denied_groups.add if denied else self.denied_groups.discard)(group_id)

    def _record_sharing(self, item_id: str) -> None:
        snapshot = copy.deepcopy(self.items[item_id])
        snapshot[SHARED_CHANGED] = "True"
        self._record_plain(snapshot)

    def effective_permissions(self, item_id: str) -> list[dict[str, Any]]:
        """The item's own permissions, then each ancestor's up to the nearest with unique permissions
        (those carry ``inheritedFrom``)."""
        out = [copy.deepcopy(p) for p in self.permissions.get(item_id, [])]
        current = item_id
        while current not in self.unique:
            parent = (self.items[current].get("parentReference") or {}).get("id")
            if not parent or parent not in self.items:
                break
            path = "/drives/" + self.drive_id + "/root:" + ("" if parent == self.root_id else "/" + self._path_of(parent))
            for p in self.permissions.get(parent, []):
                out.append({**copy.deepcopy(p), "inheritedFrom": {"driveId": self.drive_id, "id": parent, "path": path}})
            current = parent
        return out

    def transitive_members(self, group_id: str) -> list[str]:
        """Every directory object id reachable from the group's members (nested groups included), loops cut."""
        seen: list[str] = []
        stack = list(reversed(self.groups[group_id]["members"]))
        while stack:
            member = stack.pop()
            if member in seen or member == group_id:
                continue
            seen.append(member)
            if member in self.groups:
                stack.extend(reversed(self.groups[member]["members"]))
        return seen

    def may_read(self, email: str, item_id: str, *, org_domain: str | None = None, anyone_links: bool = False,
                 site_groups: bool = False) -> bool:
        """Ground truth from this fake's state: may the user with ``email`` read the item? Roles read,
        write and owner read; a user, a group holding the user (nested), a ``users`` link naming them, an
        ``organization`` link when their address is in ``org_domain``, an ``anonymous`` link with
        ``anyone_links``, a site group holding them with ``site_groups``."""
        with self._lock:
            if item_id not in self.items:
                return False
            email = email.lower()
            mine = {uid for uid, u in self.users.items()
                    if (u["mail"] or u["userPrincipalName"]).lower() == email}
            if not mine:
                return False
            groups = {gid for gid in self.groups if mine & set(self.transitive_members(gid))}
            for perm in self.effective_permissions(item_id):
                if not set(perm.get("roles") or ()) & {"read", "write", "owner"}:
                    continue
                granted = perm.get("grantedToV2") or {}
                if (granted.get("user") or {}).get("id") in mine or (granted.get("group") or {}).get("id") in groups:
                    return True
                site_group = (granted.get("siteGroup") or {}).get("id")
                if site_groups and site_group and mine & set(self.site_groups[site_group]["members"]):
                    return True
                link = perm.get("link")
                if link:
                    if any((i.get("user") or {}).get("id") in mine for i in perm.get("grantedToIdentitiesV2") or []):
                        return True
                    if link.get("scope") == "organization" and org_domain and email.endswith("@" + org_domain):
                        return True
                    if link.get("scope") == "anonymous" and anyone_links:
                        return True
            return False

    # ---- faults --------------------------------------------------------------------------------

    def fail_next(self, kind: str, status: int, *, times: int = 1, retry_after: str | None = None) -> None:
        """The next ``times`` requests of ``kind`` (``"delta"``, ``"content"``, ``"token"``,
        ``"permissions"``, ``"members"``) fail."""
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
            members = re.fullmatch(r"/v1\.0/groups/([^/]+)/transitiveMembers", path)
            if members:
                return self._fault("members") or self._transitive_members(members.group(1), request, query)
            drive_prefix = f"/v1.0/drives/{self.drive_id}"
            if not path.startswith(drive_prefix):
                return _error(404, "itemNotFound", "The resource could not be found.")
            rest = path[len(drive_prefix):]
            if rest == "/root/delta":
                return self._fault("delta") or self._delta(request, query)
            if rest.startswith("/root:/"):
                return self._by_path(urllib.parse.unquote(rest[len("/root:/"):]).rstrip(":"), query)
            if rest == "/root":
                return _json(_apply_select(self.items[self.root_id], query.get("$select")))
            match = re.fullmatch(r"/items/([^/]+)/(children|content|permissions)", rest)
            if match and match.group(2) == "children":
                return self._children(match.group(1), query)
            if match and match.group(2) == "permissions":
                return self._fault("permissions") or self._permissions(match.group(1), request, query)
            if match:
                return self._fault("content") or self._content(match.group(1))
            single = re.fullmatch(r"/items/([^/]+)", rest)
            if single:
                if single.group(1) not in self.items:
                    return _error(404, "itemNotFound", "The resource could not be found.")
                return _json(_apply_select(self.items[single.group(1)], query.get("$select")))
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
        prefer = {p.strip().lower() for h in request.headers.getlist("Prefer") for p in h.split(",") if p.strip()}
        if "deltashowsharingchanges" in prefer and not SHARING_PREFER_NEEDS <= prefer:
            return _error(400, "invalidRequest", "Prefer: deltashowsharingchanges requires deltashowremovedasdeleted "
                                                 "and deltatraversepermissiongaps")
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
            entries = []
            for seq, snap in self.log:
                if not state["since"] < seq <= state["upto"]:
                    continue
                entries.append(snap)
                if snap.get(SHARED_CHANGED) and "folder" in snap and "hierarchicalsharing" not in prefer:
                    # a folder's sharing change changes what every item below it inherits
                    entries.extend({**copy.deepcopy(self.items[i]), SHARED_CHANGED: "True"}
                                   for i in self._descendants(snap["id"]))
        if "deltashowsharingchanges" not in prefer:
            entries = [{k: v for k, v in e.items() if k != SHARED_CHANGED} for e in entries]
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

    def _descendants(self, item_id: str) -> list[str]:
        """Ids of the live items below ``item_id``, parents before children (sorted per level)."""
        out, queue = [], [item_id]
        while queue:
            parent = queue.pop(0)
            kids = sorted(i for i, item in self.items.items() if (item.get("parentReference") or {}).get("id") == parent)
            out.extend(kids)
            queue.extend(k for k in kids if "folder" in self.items[k])
        return out

    # ---- permissions and groups ----------------------------------------------------------------

    def _page_of(self, values: list[dict[str, Any]], request: Request, query: dict[str, str], limit: int,
                 context: str) -> Response:
        """One server-driven page of ``values`` from ``$skiptoken`` (an opaque offset) on."""
        try:
            offset = int(base64.urlsafe_b64decode(query["$skiptoken"].encode()).decode()) if "$skiptoken" in query else 0
        except ValueError:
            return _error(400, "invalidRequest", "Invalid $skiptoken")
        body: dict[str, Any] = {"@odata.context": f"{self.base_url}/v1.0/$metadata#{context}",
                                "value": values[offset:offset + limit]}
        if offset + limit < len(values):
            rest = {k: v for k, v in query.items() if k != "$skiptoken"}
            rest["$skiptoken"] = base64.urlsafe_b64encode(str(offset + limit).encode()).decode()
            body["@odata.nextLink"] = f"{self.base_url}{request.path}?{urllib.parse.urlencode(rest)}"
        return _json(body)

    def _permissions(self, item_id: str, request: Request, query: dict[str, str]) -> Response:
        if item_id not in self.items:
            return _error(404, "itemNotFound", "The resource could not be found.")
        if item_id in self.denied_permissions:
            return _error(403, "accessDenied", "Access denied. You do not have permission to perform this action "
                                               "or access this resource.")
        if "$skiptoken" not in query:
            self.permission_reads.append(item_id)
        values = self.effective_permissions(item_id)
        if not self.report_inherited_from:
            values = [{k: v for k, v in p.items() if k != "inheritedFrom"} for p in values]
        values = [_apply_select(p, query.get("$select")) for p in values]
        return self._page_of(values, request, query, self.permissions_page_limit,
                             f"drives('{self.drive_id}')/items('{item_id}')/permissions")

    def _directory_object(self, object_id: str) -> dict[str, Any]:
        if object_id in self.users:
            return {"@odata.type": "#microsoft.graph.user", **self.users[object_id]}
        if object_id in self.groups:
            g = self.groups[object_id]
            return {"@odata.type": "#microsoft.graph.group", "id": object_id, "displayName": g["displayName"],
                    "mail": g["mail"], "mailEnabled": bool(g["mail"]), "securityEnabled": True}
        return {"@odata.type": "#microsoft.graph.device", **self.devices[object_id]}

    def _transitive_members(self, group_id: str, request: Request, query: dict[str, str]) -> Response:
        if group_id not in self.groups:
            return _error(404, "Request_ResourceNotFound", f"Resource '{group_id}' does not exist or one of its "
                                                          "queried reference-property objects are not present.")
        if group_id in self.denied_groups:
            return _error(403, "Authorization_RequestDenied", "Insufficient privileges to complete the operation.")
        try:
            top = int(query.get("$top", "100"))
        except ValueError:
            return _error(400, "Request_BadRequest", "Invalid value for $top")
        if not 1 <= top <= 999:
            return _error(400, "Request_BadRequest", f"Invalid page size specified: '{top}'. Must be between 1 "
                                                     "and 999 inclusive.")
        if "$skiptoken" not in query:
            self.member_reads.append(group_id)
        select = query.get("$select")
        values = []
        for member in self.transitive_members(group_id):
            obj = self._directory_object(member)
            kept = _apply_select(obj, select)
            kept["@odata.type"] = obj["@odata.type"]
            values.append(kept)
        return self._page_of(values, request, query, min(top, self.members_page_limit), "directoryObjects")

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
    """Graph's ``$select``: only the named properties (and ``id``) survive; instance annotations
    (``@odata.type``, ``@microsoft.graph.sharedChanged``) are not properties and stay."""
    if not select:
        return copy.deepcopy(item)
    wanted = {name.strip() for name in select.split(",")} | {"id"}
    return {k: copy.deepcopy(v) for k, v in item.items() if k in wanted or k.startswith("@")}


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body), status=status, content_type="application/json", headers=headers)


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    """A Graph-style error body (``error.code``, ``error.message``)."""
    return _json({"error": {"code": code, "message": message,
                            "innerError": {"request-id": secrets.token_hex(8), "date": "2026-11-01T09:00:00"}}},
                 status, headers)
