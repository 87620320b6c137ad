"""SharePoint document library / OneDrive source: Microsoft Graph delta over HTTP, msal for tokens.

Authentication
    ``msal.ConfidentialClientApplication`` with client credentials (tenant id, client id, client
    secret), authority ``<RAG_MS_AUTHORITY>/<tenant>`` (default ``https://login.microsoftonline.com``),
    ``instance_discovery=False`` so a national cloud or a test authority is used as given. The
    token's scope is ``<Graph origin>/.default``. msal creates its application (and fetches the
    authority's openid-configuration) on the first request, not in the constructor.

Inventory
    A delta query on the drive root without a token enumerates the whole drive
    (``/drives/{id}/root/delta``, ``$select`` including ``deleted``), following ``@odata.nextLink``
    to the ``@odata.deltaLink``, which becomes ``Inventory.cursor``. With ``path``, only files under
    that folder count (Graph supports delta on the root only for SharePoint and OneDrive for
    Business, so the scope is computed from ``parentReference.id`` and the folder tree).

Change feed
    The stored cursor's delta link, followed to the next delta link (returned as
    ``ChangeSet.next_cursor``; the sync stores it only after it has committed). Deleted items
    (which may lack a name) become deletions without any download; an item repeated across pages:
    the last one wins; a page with zero items and a next link: paging goes on; a next link seen
    before: :class:`ListingIncompleteError` (the cursor is not advanced). 410 Gone
    (``resyncRequired``) raises :class:`ChangeFeedUnavailable`: the sync re-enumerates and
    reconciles under the deletion guard. So does a deleted or moved folder that was in scope
    (its files are not always reported one by one).

Permissions (``PermissionSource``)
    ``permissions(documents)``: one ``GET /drives/{drive}/items/{id}/permissions`` per item (every
    ``@odata.nextLink`` followed). That list is the item's *effective* permissions (its own and those
    inherited from its ancestors; ``inheritedFrom`` is not needed, and SharePoint libraries do not send
    it). Only roles ``read``, ``write`` and ``owner`` grant reading; a permission whose
    ``expirationDateTime`` has passed grants nothing. Mapping of each identity
    (``grantedToV2`` and ``grantedToIdentitiesV2``, or the deprecated ``grantedTo``/``grantedToIdentities``
    when a response has no V2 form):

    * a user -> ``user:<e-mail>`` from ``user.email``, else ``siteUser.email``, else the UPN in a
      ``i:0#.f|membership|<upn>`` claims login name; with none of these ``user:graph:<object id>`` (a
      principal no e-mail caller matches: that person reads the document only when a caller is named by
      that object id, so an unknown address never widens access);
    * an Entra ID group -> ``group:<self.name>:<group id>``, expanded by ``group_members``;
    * a SharePoint site group (``siteGroup``; ``sharePointGroup``) -> ``group:<self.name>:sitegroup:<id>``
      (``spgroup:<id>``). Graph v1.0 cannot list a site group's members (that needs the SharePoint REST
      API), so ``group_members`` reports it in ``errors``: **it grants nobody anything**; only the users
      and Entra groups the item names directly are readers;
    * the claims login ``c:0-.f|rolemanager|spo-grid-all-users/...`` ("Everyone except external users")
      -> ``domain:<org domain>`` for each configured ``org_domain``, else nothing; other claims, an
      application or a device -> nothing;
    * a sharing link: the people in ``grantedToIdentitiesV2`` (a ``users`` link; those who redeemed an
      ``organization`` link); scope ``organization`` adds ``domain:<d>`` for each configured ``org_domain``
      and otherwise **grants nothing more** (who holds the link is unknowable); ``anonymous`` adds
      ``everyone`` only with ``link_sharing="everyone"``, otherwise nothing; ``existingAccess`` and
      unknown scopes add nothing. An invitation not yet redeemed (``invitation`` and no identity)
      grants nothing.

    One item failing (403 ``accessDenied``, 404 ``itemNotFound``, throttling after retries, a body that
    is not a permission collection, a permission with a field of the wrong type: not an object, roles
    not a list of strings, an identity, ``link`` or id that is not what Graph documents) makes that item
    ``Scope.unreadable`` with the reason (fail closed: nothing is guessed); a token failure raises
    :class:`SourceError` (nothing could be read). An identity whose principal would be malformed (a
    well-typed but unusable id) is left out (it grants nothing).

    ``group_members(groups)``: ``GET /groups/{id}/transitiveMembers?$select=id,mail,userPrincipalName``
    (``$top=999``, every next link): the flat nested membership. ``#microsoft.graph.user`` ->
    ``user:<mail or userPrincipalName>`` (``user:graph:<id>`` with neither), ``#microsoft.graph.group`` ->
    that group's principal; devices, contacts and service principals are nobody who reads. A group that
    fails (403 ``Authorization_RequestDenied``, 404 ``Request_ResourceNotFound``, a member with a field of
    the wrong type, ...) goes to ``errors``.

    ``permission_changes(cursor)``: a delta query of its own (independent of the content cursor) with
    ``Prefer: deltashowremovedasdeleted, deltatraversepermissiongaps, deltashowsharingchanges,
    hierarchicalsharing``. No cursor, an unusable one or 410 Gone -> ``PermissionChanges(None, fresh)``
    where ``fresh`` wraps a ``?token=latest`` delta link (nothing is enumerated). Otherwise the changed
    ids are: every in-scope *file* the feed reports (with or without ``@microsoft.graph.sharedChanged``: a
    moved file inherits other permissions, and Graph need not flag that), and every file below an in-scope
    folder flagged ``sharedChanged`` (listed through ``children``, since ``hierarchicalsharing`` reports
    the folder only) or newly entering the scope. A flagged drive root, scope folder or ancestor of the
    scope folder, or a scope folder that was deleted, means every document: ``changed_ids=None``.
    Known gap: a folder moved *within* the scope between parents with different permissions is caught
    only if Graph flags it ``sharedChanged``, otherwise by the next full permission sync. The cursor is
    ``graphperm1:`` + compressed JSON (delta link, scope folder, its ancestors, in-scope folders).

Malformed data
    A page that is not ``{"value": [...]}`` (or whose next/delta link is not a string) raises
    :class:`ListingIncompleteError`. A driveItem with a field of the wrong type (not an object, an id
    that is not a non-empty string, ``name``/``cTag``/``eTag``/``webUrl`` not strings, a facet such as
    ``file``/``folder``/``parentReference`` not an object, a ``size`` that is not a non-negative whole
    number; null counts as absent) is skipped with a log line naming its id and the field; the
    inventory or change set is then ``complete=False`` (nothing deleted, cursor kept) and the
    permission feed answers "read every document". Lone surrogates in names and tags become U+FFFD.

The cursor is opaque: ``graph1:`` + compressed JSON of the delta link, the scope folder id and the
in-scope folder ids. Change detection: ``cTag`` (content tag; ``eTag`` when absent) as
``source_version``, ``file.hashes.sha256Hash`` as ``content_sha256`` where Graph gives one. Stable
id = drive item id. 429/503 (and other 5xx) responses are retried with bounded back-off,
honouring ``Retry-After``. Links that leave the configured Graph origin are refused, so the
bearer token is never sent elsewhere; the client secret and tokens are never logged.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import logging
import math
import os
import re
import urllib.parse
import zlib
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, BinaryIO

import msal
import requests
import urllib3
from tenacity import RetryCallState, Retrying, retry_if_exception

from rag_pipeline.permissions.principals import EVERYONE, domain, parse_principal
from rag_pipeline.permissions.principals import group as group_principal
from rag_pipeline.permissions.principals import user as user_principal
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
from rag_pipeline.sources.http import parse_retry_after

log = logging.getLogger(__name__)

DEFAULT_GRAPH_URL = "https://graph.microsoft.com/v1.0"
DEFAULT_AUTHORITY = "https://login.microsoftonline.com"
DELTA_SELECT = (
    "id,name,size,file,folder,package,root,deleted,parentReference,cTag,eTag,"
    "lastModifiedDateTime,webUrl"
)
"""``$select`` for delta and children queries; ``deleted`` must be in it or tombstones vanish."""

ENV_GRAPH_URL = "RAG_GRAPH_API_URL"
ENV_AUTHORITY = "RAG_MS_AUTHORITY"
ENV_TENANT = "RAG_MS_TENANT_ID"
ENV_CLIENT_ID = "RAG_MS_CLIENT_ID"
ENV_CLIENT_SECRET = "RAG_MS_CLIENT_SECRET"
ENV_ORG_DOMAIN = "RAG_MS_ORG_DOMAIN"
"""The tenant's e-mail domain(s), comma-separated: what an ``organization`` sharing link grants."""
ENV_LINK_SHARING = "RAG_MS_LINK_SHARING"
"""``none`` (default) or ``everyone``: whether an ``anonymous`` sharing link makes a document public."""

READ_ROLES = frozenset({"read", "write", "owner"})
"""Permission roles that include reading the item."""
LINK_SHARING = ("none", "everyone")
SHARING_PREFER = ("deltashowremovedasdeleted, deltatraversepermissiongaps, deltashowsharingchanges, "
                  "hierarchicalsharing")
"""``Prefer`` of the permission delta (``deltashowsharingchanges`` needs the first two)."""
PERMISSION_DELTA_SELECT = "id,name,file,folder,root,deleted,parentReference"
MEMBER_SELECT = "id,mail,userPrincipalName"
SHARED_CHANGED = "@microsoft.graph.sharedChanged"
_PERM_CURSOR_PREFIX = "graphperm1:"
_MEMBERSHIP_CLAIM = "i:0#.f|membership|"
_ALL_USERS_CLAIM = "c:0-.f|rolemanager|spo-grid-all-users"
_NO_EXPIRY = "0001-01-01"

_CURSOR_PREFIX = "graph1:"
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class _RetryableResponse(Exception):
    """An HTTP response worth retrying (429, 5xx); carries its ``Retry-After`` in seconds."""

    def __init__(self, response: requests.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.status = response.status_code
        self.retry_after_s = parse_retry_after(response.headers.get("Retry-After"))


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, (_RetryableResponse, requests.ConnectionError, requests.Timeout))


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries for 429, 5xx and connection failures.

    ``attempts``: total tries per request. Waits grow ``base_wait_s * 2**n`` up to ``max_wait_s``
    seconds; a ``Retry-After`` header is honoured exactly, and one longer than ``max_wait_s`` ends
    the retries at once (reported as a transient :class:`SourceError`; the next sync tries again).
    """

    attempts: int = 5
    base_wait_s: float = 1.0
    max_wait_s: float = 60.0

    def retrying(self) -> Retrying:
        """A tenacity ``Retrying`` that applies this policy."""

        def hinted(state: RetryCallState) -> float | None:
            exc = state.outcome.exception() if state.outcome else None
            return exc.retry_after_s if isinstance(exc, _RetryableResponse) else None

        def wait(state: RetryCallState) -> float:
            seconds = hinted(state)
            if seconds is not None:
                return seconds
            return min(self.max_wait_s, self.base_wait_s * 2 ** (state.attempt_number - 1))

        def stop(state: RetryCallState) -> bool:
            seconds = hinted(state)
            return state.attempt_number >= self.attempts or (
                seconds is not None and seconds > self.max_wait_s
            )

        return Retrying(retry=retry_if_exception(_is_transient), wait=wait, stop=stop, reraise=True)


class _VerifyingSession(requests.Session):
    """A ``requests.Session`` whose ``verify`` setting wins over ``REQUESTS_CA_BUNDLE``.

    Plain requests lets the environment's CA bundle override ``Session.verify`` when a call does
    not pass ``verify=`` itself (msal's calls do not), so a configured CA file would be ignored.
    """

    def merge_environment_settings(self, url, proxies, stream, verify, cert):  # type: ignore[override]
        """requests' merge, then this session's ``verify`` restored when the call named none."""
        settings = super().merge_environment_settings(url, proxies, stream, verify, cert)
        if verify is None and self.verify is not True:
            settings["verify"] = self.verify
        return settings


@dataclass
class _DeltaState:
    """The opaque cursor: delta link, scope folder id (``None`` = drive root), in-scope folders."""

    link: str
    scope_id: str | None = None
    folders: list[str] = field(default_factory=list)

    def encode(self) -> str:
        """The opaque cursor string (``graph1:`` + base64 of zlib-compressed JSON)."""
        raw = json.dumps(
            {"v": 1, "l": self.link, "p": self.scope_id, "f": sorted(self.folders)}, separators=(",", ":")
        ).encode("utf-8")
        return _CURSOR_PREFIX + base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode("ascii")

    @classmethod
    def decode(cls, cursor: str) -> _DeltaState:
        """Parse a cursor from :meth:`encode`; raises ``ValueError`` (only) for anything else: not a
        ``graph1:`` string, not base64/zlib/JSON, not an object of version 1 with a str ``l``, a ``p``
        that is neither null nor a str, an ``f`` that is not a list of str."""
        data = _unpack_cursor(cursor, _CURSOR_PREFIX, "graph cursor")
        if not isinstance(data, dict) or data.get("v") != 1 or not isinstance(data.get("l"), str):
            raise ValueError("unknown graph cursor version")
        scope_id, folders = data.get("p"), data.get("f", [])
        if scope_id is not None and not isinstance(scope_id, str):
            raise ValueError("malformed graph cursor: scope folder id is not a string")
        if not _str_list(folders):
            raise ValueError("malformed graph cursor: folders are not a list of strings")
        return cls(link=data["l"], scope_id=scope_id, folders=list(folders))


class _Gone(Exception):
    """HTTP 410 from a delta link (``resyncRequired``)."""


class _TokenError(SourceError):
    """No access token: nothing can be read."""


@dataclass
class _PermissionState:
    """The permission cursor: delta link, scope folder (``None`` = drive root), the scope folder's
    ancestors (root first) and the in-scope folders (path scope only)."""

    link: str
    scope_id: str | None = None
    ancestors: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)

    def encode(self) -> str:
        """``graphperm1:`` + base64 of zlib-compressed JSON."""
        raw = json.dumps({"v": 1, "l": self.link, "p": self.scope_id, "a": self.ancestors,
                          "f": sorted(self.folders)}, separators=(",", ":")).encode("utf-8")
        return _PERM_CURSOR_PREFIX + base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode("ascii")

    @classmethod
    def decode(cls, cursor: str) -> _PermissionState:
        """Parse :meth:`encode`'s output; raises ``ValueError`` (only) for anything else (as
        :meth:`_DeltaState.decode`; ``a`` and ``f``: null or a list of str)."""
        data = _unpack_cursor(cursor, _PERM_CURSOR_PREFIX, "graph permission cursor")
        if not isinstance(data, dict) or data.get("v") != 1 or not isinstance(data.get("l"), str):
            raise ValueError("unknown graph permission cursor version")
        scope_id, ancestors, folders = data.get("p"), data.get("a") or [], data.get("f") or []
        if scope_id is not None and not isinstance(scope_id, str):
            raise ValueError("malformed graph permission cursor: scope folder id is not a string")
        if not _str_list(ancestors) or not _str_list(folders):
            raise ValueError("malformed graph permission cursor: folders are not a list of strings")
        return cls(link=data["l"], scope_id=scope_id, ancestors=list(ancestors), folders=list(folders))


def _unpack_cursor(cursor: Any, prefix: str, what: str) -> Any:
    """The JSON value inside ``prefix`` + base64(zlib(JSON)); ``ValueError`` for anything else."""
    if not isinstance(cursor, str) or not cursor.startswith(prefix):
        raise ValueError(f"not a {what}")
    try:
        return json.loads(zlib.decompress(base64.urlsafe_b64decode(cursor[len(prefix):])))
    except (binascii.Error, zlib.error, ValueError, RecursionError) as exc:
        raise ValueError(f"corrupt {what}") from exc


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


class SharePointSource:
    """Files of one SharePoint document library or OneDrive (a Graph drive), optionally one folder.

    ``drive_id``: the Graph drive id (``b!...`` for SharePoint libraries). ``path``: a folder path
    inside the drive (``"Shared/Reports"``), or ``None`` for the whole drive. ``graph_url``: Graph
    base including the version (default ``https://graph.microsoft.com/v1.0``); ``authority_url``:
    the Entra ID host (default ``https://login.microsoftonline.com``). ``verify``: ``True``, or a
    CA bundle path for TLS (applies to Graph and to msal). ``scope`` defaults to
    ``<graph origin>/.default``. ``timeout_s``: per HTTP request.
    ``name`` defaults to ``sharepoint:<drive_id>`` or ``sharepoint:<drive_id>/<path>``.
    ``org_domain``: the tenant's e-mail domain (or several): an ``organization`` sharing link grants
    ``domain:<each>``; ``None`` (default): such a link grants nothing beyond the people it names.
    ``link_sharing``: ``"none"`` (default: an ``anonymous`` link grants nothing) or ``"everyone"`` (it
    makes the document readable by everyone). Raises ``ValueError`` for an invalid domain or mode.
    """

    def __init__(
        self,
        *,
        drive_id: str,
        tenant_id: str,
        client_id: str,
        client_secret: str,
        path: str | None = None,
        graph_url: str = DEFAULT_GRAPH_URL,
        authority_url: str = DEFAULT_AUTHORITY,
        scope: str | None = None,
        verify: bool | str = True,
        name: str | None = None,
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
        org_domain: str | Collection[str] | None = None,
        link_sharing: str = "none",
    ) -> None:
        if not drive_id:
            raise ValueError("SharePointSource needs a drive_id")
        if link_sharing not in LINK_SHARING:
            raise ValueError(f"link_sharing must be one of {', '.join(LINK_SHARING)}, not {link_sharing!r}")
        domains = [org_domain] if isinstance(org_domain, str) else list(org_domain or [])
        self.org_domains = tuple(sorted({domain(d) for d in domains if d and d.strip()}))
        """``domain:`` principals an ``organization`` link (and "Everyone except external users") grants."""
        self.link_sharing = link_sharing
        self.drive_id = drive_id
        self.path = path.strip("/") if path else None
        self.name = name or (f"sharepoint:{drive_id}" + (f"/{self.path}" if self.path else ""))
        self._graph = graph_url.rstrip("/")
        parsed = urllib.parse.urlsplit(self._graph)
        self._origin = f"{parsed.scheme}://{parsed.netloc}"
        self._scope = scope or f"{self._origin}/.default"
        self._authority = f"{authority_url.rstrip('/')}/{tenant_id}"
        self._client_id = client_id
        self._client_secret = client_secret
        self._timeout = timeout_s
        self._retry = retry or RetryPolicy()
        self._session = _VerifyingSession()
        self._session.verify = verify
        self._app: msal.ConfidentialClientApplication | None = None

    def __repr__(self) -> str:
        return f"SharePointSource(name={self.name!r}, graph={self._graph!r})"

    @classmethod
    def from_env(
        cls, *, drive_id: str, path: str | None = None, env: Mapping[str, str] | None = None,
        org_domain: str | Collection[str] | None = None, link_sharing: str | None = None,
    ) -> SharePointSource:
        """Build from ``RAG_MS_TENANT_ID``, ``RAG_MS_CLIENT_ID``, ``RAG_MS_CLIENT_SECRET`` (required),
        ``RAG_GRAPH_API_URL``, ``RAG_MS_AUTHORITY``, ``RAG_MS_ORG_DOMAIN`` (comma-separated domains) and
        ``RAG_MS_LINK_SHARING`` (``none`` | ``everyone``) (optional; ``org_domain``/``link_sharing``
        given here win). TLS trust follows requests' defaults (``REQUESTS_CA_BUNDLE``). ``env``
        defaults to ``os.environ``. Raises :class:`SourceError` (not transient) naming the missing or
        invalid variables, never their values.
        """
        env = os.environ if env is None else env
        missing = [k for k in (ENV_TENANT, ENV_CLIENT_ID, ENV_CLIENT_SECRET) if not env.get(k)]
        if missing:
            raise SourceError(f"SharePoint source needs {', '.join(missing)}", transient=False)
        if org_domain is None:
            org_domain = [d.strip() for d in (env.get(ENV_ORG_DOMAIN) or "").split(",") if d.strip()]
        if link_sharing is None:
            link_sharing = (env.get(ENV_LINK_SHARING) or "none").strip().lower()
        if link_sharing not in LINK_SHARING:
            raise SourceError(f"{ENV_LINK_SHARING} must be one of {', '.join(LINK_SHARING)}", transient=False)
        try:
            for d in [org_domain] if isinstance(org_domain, str) else org_domain:
                domain(d)
        except ValueError:
            raise SourceError(f"{ENV_ORG_DOMAIN} holds something that is not a domain name", transient=False) from None
        return cls(
            org_domain=org_domain,
            link_sharing=link_sharing,
            drive_id=drive_id,
            path=path,
            tenant_id=env[ENV_TENANT],
            client_id=env[ENV_CLIENT_ID],
            client_secret=env[ENV_CLIENT_SECRET],
            graph_url=env.get(ENV_GRAPH_URL) or DEFAULT_GRAPH_URL,
            authority_url=env.get(ENV_AUTHORITY) or DEFAULT_AUTHORITY,
        )

    # ---- HTTP ---------------------------------------------------------------------------

    def _token(self) -> str:
        if self._app is None:
            try:
                self._app = msal.ConfidentialClientApplication(
                    self._client_id,
                    client_credential=self._client_secret,
                    authority=self._authority,
                    instance_discovery=False,
                    http_client=self._session,
                    timeout=self._timeout,
                )
            except (ValueError, requests.RequestException) as exc:
                raise _TokenError(f"Entra ID authority {self._authority} unusable: {type(exc).__name__}") from None
        result = self._app.acquire_token_for_client(scopes=[self._scope])
        token = result.get("access_token") if isinstance(result, dict) else None
        if not token:
            error = result.get("error", "unknown") if isinstance(result, dict) else "unknown"
            transient = error not in ("invalid_client", "unauthorized_client", "invalid_scope", "invalid_request")
            raise _TokenError(f"Entra ID token request failed: {error}", transient=transient)
        return str(token)

    def _get(self, url: str, *, stream: bool = False, headers: Mapping[str, str] | None = None) -> requests.Response:
        """GET a Graph URL with a bearer token (and ``headers``) under the retry policy; 2xx/3xx-followed
        responses or 4xx are returned, retryable failures raise after the policy gives up."""
        if not url.startswith(self._origin + "/"):
            raise SourceError(f"refusing to follow a link outside {self._origin}")
        for attempt in self._retry.retrying():
            with attempt:
                response = self._session.get(
                    url,
                    headers={**(headers or {}), "Authorization": f"Bearer {self._token()}",
                             "Accept": "application/json"},
                    timeout=self._timeout,
                    stream=stream,
                )
                if response.status_code in _RETRY_STATUSES:
                    response.close()
                    raise _RetryableResponse(response)
                return response
        raise AssertionError("unreachable")  # pragma: no cover

    def _get_json(self, url: str, what: str, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        try:
            response = self._get(url, headers=headers)
        except _RetryableResponse as exc:
            raise ListingIncompleteError(f"{what} failed: HTTP {exc.status} after retries") from None
        except requests.RequestException as exc:
            raise ListingIncompleteError(f"{what} failed: {type(exc).__name__}") from None
        if response.status_code == 410:
            raise _Gone(_graph_error_code(response))
        if response.status_code != 200:
            raise ListingIncompleteError(f"{what} failed: HTTP {response.status_code} {_graph_error_code(response)}")
        try:
            body = response.json()
        except (ValueError, RecursionError):
            raise ListingIncompleteError(f"{what} returned a body that is not JSON") from None
        if not isinstance(body, dict):
            raise ListingIncompleteError(f"{what} returned a body that is not a JSON object")
        return body

    def _pages(self, url: str, what: str, headers: Mapping[str, str] | None = None) -> Iterator[dict[str, Any]]:
        """Follow ``@odata.nextLink`` from ``url``; yields each page body (a JSON object). The last page
        yielded has a delta link (delta queries) or no next link (children listings). Raises
        :class:`ListingIncompleteError` for a failed page, a repeated next link or one that is not a
        non-empty string."""
        seen: set[str] = set()
        while True:
            if url in seen:
                raise ListingIncompleteError(f"{what}: a next link repeated; stopped")
            seen.add(url)
            body = self._get_json(url, what, headers)
            yield body
            next_link = body.get("@odata.nextLink")
            if next_link is None:
                return
            if not isinstance(next_link, str) or not next_link:
                raise ListingIncompleteError(f"{what}: a page whose @odata.nextLink is not a link")
            url = next_link

    def _delta(self, url: str, headers: Mapping[str, str] | None = None, malformed: list[str] | None = None,
               ) -> tuple[dict[str, dict[str, Any]], str]:
        """All well-formed items from a delta URL (last occurrence of an id wins) and the final delta
        link; each malformed item skipped (``_page_items``: logged) adds a note to ``malformed``. With
        ``headers`` (the permission delta) an item flagged ``sharedChanged`` on any of its occurrences
        keeps the flag.
        Raises :class:`ListingIncompleteError` for a page that is not ``{"value": [...]}``, a failed
        page, or no (or a non-string) delta link at the end; ``_Gone`` for 410."""
        items: dict[str, dict[str, Any]] = {}
        notes: list[str] = [] if malformed is None else malformed
        delta_link = None
        for body in self._pages(url, "Graph delta", headers):
            for item in _page_items(body, "Graph delta", notes):
                item_id = item["id"]
                previous = items.pop(item_id, None)
                if previous is not None and _shared_changed(previous) and not _shared_changed(item):
                    item = {**item, SHARED_CHANGED: "True"}
                items[item_id] = item
            delta_link = body.get("@odata.deltaLink")
        if not delta_link:
            raise ListingIncompleteError("Graph delta ended without @odata.deltaLink")
        if not isinstance(delta_link, str):
            raise ListingIncompleteError("Graph delta ended with an @odata.deltaLink that is not a link")
        return items, delta_link

    def _drive_url(self, suffix: str) -> str:
        return f"{self._graph}/drives/{urllib.parse.quote(self.drive_id, safe='')}{suffix}"

    def _select(self) -> str:
        return "?" + urllib.parse.urlencode({"$select": DELTA_SELECT}, safe="$,")

    def _resolve_scope(self) -> str | None:
        if not self.path:
            return None
        url = self._drive_url(f"/root:/{urllib.parse.quote(self.path)}") + "?$select=id,name,folder,deleted"
        try:
            item = self._get_json(url, f"folder {self.path!r}")
        except _Gone:
            raise ListingIncompleteError(f"folder {self.path!r}: HTTP 410") from None
        except ListingIncompleteError as exc:
            raise ListingIncompleteError(f"scope folder {self.path!r} not usable: {exc}") from None
        if not isinstance(item.get("folder"), dict) or not isinstance(item.get("id"), str) or not item["id"]:
            raise ListingIncompleteError(f"scope path {self.path!r} is not a folder")
        return item["id"]

    def _children(self, folder_id: str, malformed: list[str] | None = None) -> Iterator[dict[str, Any]]:
        """Every well-formed item below ``folder_id`` (recursive children listing); a malformed item is
        skipped, logged and noted in ``malformed`` (``_page_items``). Raises
        :class:`ListingIncompleteError` for a failed page or one that is not ``{"value": [...]}``."""
        queue = [folder_id]
        notes: list[str] = [] if malformed is None else malformed
        while queue:
            parent = queue.pop(0)
            url = self._drive_url(f"/items/{urllib.parse.quote(parent, safe='')}/children") + self._select()
            for body in self._pages(url, "Graph children"):
                for item in _page_items(body, "Graph children", notes):
                    yield item
                    if "folder" in item:
                        queue.append(item["id"])

    # ---- Source protocol ----------------------------------------------------------------

    def list_documents(self) -> Inventory:
        """Enumerate the drive with a fresh delta query and keep the files in scope.

        Returns the inventory and the delta link as ``cursor``; ``complete=False`` (with the reason) when
        a malformed driveItem was skipped (a field of the wrong type, see ``_item_problem``; each one is
        logged with its id and field), so nothing is deleted on that listing. Raises
        :class:`ListingIncompleteError` when a page fails or is not ``{"value": [...]}``, a next link
        repeats, the enumeration ends without a delta link, or the scope folder is missing.
        """
        scope_id = self._resolve_scope()
        malformed: list[str] = []
        try:
            items, delta_link = self._delta(self._drive_url("/root/delta") + self._select(), malformed=malformed)
        except _Gone:
            raise ListingIncompleteError("Graph delta enumeration answered 410 Gone") from None
        live = {i: item for i, item in items.items() if "deleted" not in item}
        children: dict[str, list[str]] = {}
        for item_id, item in live.items():
            parent = (item.get("parentReference") or {}).get("id")
            if parent:
                children.setdefault(parent, []).append(item_id)
        if scope_id is None:
            folders = {i for i, item in live.items() if "folder" in item or "root" in item}
            in_scope = set(live)
        else:
            folders, in_scope = {scope_id}, set()
            queue = [scope_id]
            while queue:
                for child in children.get(queue.pop(0), []):
                    in_scope.add(child)
                    if "folder" in live[child]:
                        folders.add(child)
                        queue.append(child)
        documents = [self._to_document(live[i]) for i in in_scope if "file" in live[i]]
        state = _DeltaState(link=delta_link, scope_id=scope_id, folders=sorted(folders))
        return Inventory(documents=documents, complete=not malformed, incomplete_reason=_malformed_reason(malformed),
                         cursor=state.encode())

    def changes(self, cursor: str | None) -> ChangeSet:
        """Follow the stored delta link to the next one; upserts and deletions in scope.

        Raises :class:`ChangeFeedUnavailable` without a usable cursor, on 410 Gone, or when a
        folder in scope was deleted or moved out of it; :class:`ListingIncompleteError` on a
        repeating next link or a failed or malformed page (the cursor is then not advanced). A malformed
        driveItem (delta or children) is skipped and logged, and the change set is ``complete=False``
        (the sync then keeps the old cursor and deletes nothing).
        """
        if not cursor:
            raise ChangeFeedUnavailable("no Graph delta link stored yet")
        try:
            state = _DeltaState.decode(cursor)
        except ValueError as exc:
            raise ChangeFeedUnavailable(f"unusable Graph cursor: {exc}") from None
        malformed: list[str] = []
        try:
            items, delta_link = self._delta(state.link, malformed=malformed)
        except _Gone as exc:
            raise ChangeFeedUnavailable(f"Graph delta link expired (410 {exc}); full resync needed") from None
        old_folders = set(state.folders)
        folders = set(old_folders)
        whole_drive = state.scope_id is None

        def in_scope(item: Mapping[str, Any]) -> bool:
            if item.get("id") == state.scope_id:
                return True
            parent = (item.get("parentReference") or {}).get("id")
            return whole_drive or parent in folders

        upserts: dict[str, dict[str, Any]] = {}
        deletions: set[str] = set()
        entering: list[dict[str, Any]] = []
        for item_id, item in items.items():
            is_folder = "folder" in item or "root" in item or item_id in old_folders
            if not is_folder:
                continue
            if "deleted" in item:
                if item_id in old_folders:
                    raise ChangeFeedUnavailable(f"folder {item_id} in scope was deleted; full resync needed")
                continue
            if item_id in old_folders:
                if not in_scope(item):
                    raise ChangeFeedUnavailable(f"folder {item_id} moved out of scope; full resync needed")
            else:
                entering.append(item)
        progress = True
        while entering and progress:
            progress = False
            for item in list(entering):
                if in_scope(item):
                    entering.remove(item)
                    progress = True
                    folders.add(item["id"])
                    for child in self._children(item["id"], malformed):
                        if "folder" in child:
                            folders.add(child["id"])
                        elif "file" in child and "deleted" not in child:
                            upserts[child["id"]] = child
        for item_id, item in items.items():
            if "folder" in item or "root" in item or item_id in folders:
                continue
            if "deleted" in item:
                deletions.add(item_id)
                upserts.pop(item_id, None)
            elif "file" in item:
                if in_scope(item):
                    upserts[item_id] = item
                else:
                    deletions.add(item_id)
        deletions -= set(upserts)
        next_state = _DeltaState(link=delta_link, scope_id=state.scope_id, folders=sorted(folders))
        return ChangeSet(
            upserts=[self._to_document(item) for item in upserts.values()],
            deleted_ids=sorted(deletions),
            next_cursor=next_state.encode(),
            complete=not malformed,
            incomplete_reason=_malformed_reason(malformed),
        )

    def fetch(self, document: SourceDocument) -> bytes:
        """The bytes of ``document`` (``fetch_to`` into memory; the pipeline streams instead). Same
        errors as :meth:`fetch_to`."""
        return fetch_via(self.fetch_to, document)

    def fetch_to(self, document: SourceDocument, out: BinaryIO) -> None:
        """Download ``/drives/{drive}/items/{id}/content`` into ``out`` in pieces of at most
        ``FETCH_PIECE_BYTES`` as they arrive (Graph answers with a redirect to a pre-authenticated URL;
        requests drops the bearer token if that URL is on another host).

        Raises :class:`DocumentSkipped` for a skipped document, :class:`SourceError` otherwise
        (transient: throttling after retries, server errors, an item deleted since the listing, a
        transfer that broke off part-way). Retries (429, 5xx, connection failures) happen only before
        the body is read: once a byte was written to ``out`` nothing is retried (nor written twice).
        Whatever ``out.write`` raises (the pipeline's size cap, ``DocumentTooLargeError``) propagates
        unchanged. The response is closed on every exit, so a refused download stops reading.
        """
        if document.skip_reason:
            raise DocumentSkipped(document.skip_reason)
        url = self._drive_url(f"/items/{urllib.parse.quote(document.source_id, safe='')}/content")
        try:
            response = self._get(url, stream=True)
        except _RetryableResponse as exc:
            raise SourceError(f"Graph download failed: HTTP {exc.status} after retries") from None
        except requests.RequestException as exc:
            raise SourceError(f"Graph download failed: {type(exc).__name__}") from None
        with response:
            if response.status_code == 404:
                raise SourceError("Graph download failed: item not found (deleted since listing?)")
            if response.status_code != 200:
                raise SourceError(f"Graph download failed: HTTP {response.status_code} {_graph_error_code(response)}")
            _copy_body(response, out)

    # ---- PermissionSource protocol ------------------------------------------------------

    def permissions(self, documents: Sequence[SourceDocument]) -> Mapping[str, Scope]:
        """``{source_id: Scope}`` from each item's effective Graph permissions (module docstring).

        Never raises for one item (its scope is ``Scope.unreadable`` with the reason); raises
        :class:`SourceError` when no token can be had (nothing could be read)."""
        out: dict[str, Scope] = {}
        for document in documents:
            item_id = document.source_id
            if item_id in out:
                continue
            try:
                perms = self._item_permissions(item_id)
                principals: set[str] = set()
                for perm in perms:
                    principals |= self._grants(perm)
            except _TokenError:
                raise
            except (SourceError, _Gone, _Malformed) as exc:
                reason = "HTTP 410" if isinstance(exc, _Gone) else str(exc)
                out[item_id] = Scope.unreadable(f"Graph permissions of item {item_id}: {reason}")
                continue
            out[item_id] = Scope.of(principals)
        return out

    def _item_permissions(self, item_id: str) -> list[dict[str, Any]]:
        """Every page of ``/items/{id}/permissions``; raises ``ListingIncompleteError`` on a failure
        or a body that is not a permission collection."""
        url = self._drive_url(f"/items/{urllib.parse.quote(item_id, safe='')}/permissions")
        perms: list[Any] = []
        for body in self._pages(url, "Graph permissions"):
            value = body.get("value")
            if not isinstance(value, list):
                raise ListingIncompleteError("Graph permissions: a page without a value list")
            perms.extend(value)  # a permission that is not an object: _grants raises _Malformed
        return perms

    def _grants(self, perm: Any) -> set[str]:
        """The principals one ``permission`` lets read the item (empty: it grants no reading).

        Raises ``_Malformed`` (naming the field) when a field it reads has the wrong type: ``roles`` not
        a list of str, ``expirationDateTime`` not a str, an identity (set) or ``link`` not an object,
        ``grantedToIdentities(V2)`` not a list, an id/e-mail/login name not a str. The caller makes the
        item unreadable: a permission that cannot be read must not be guessed at."""
        if not isinstance(perm, dict):
            raise _Malformed("a permission that is not an object")
        roles = _typed(perm, "roles", list, "roles") or []
        if not all(isinstance(r, str) for r in roles):
            raise _Malformed("a permission whose roles are not strings")
        if not {r.lower() for r in roles} & READ_ROLES:
            return set()
        if _expired(_typed(perm, "expirationDateTime", str, "expirationDateTime")):
            return set()
        key = "grantedToV2" if "grantedToV2" in perm else "grantedTo"
        identities: list[tuple[str, Any]] = [(key, _typed(perm, key, dict, key))]
        key = "grantedToIdentitiesV2" if "grantedToIdentitiesV2" in perm else "grantedToIdentities"
        identities.extend((f"{key}[]", i) for i in _typed(perm, key, list, key) or [])
        out: set[str] = set()
        for where, identity in identities:
            if identity is None:
                continue
            if not isinstance(identity, dict):
                raise _Malformed(f"a permission whose {where} is not an object")
            out |= self._identity_principals(identity, where)
        link = _typed(perm, "link", dict, "link")
        if link is not None:
            scope = (_typed(link, "scope", str, "link.scope") or "").lower()
            if scope == "organization":
                out.update(self.org_domains)
            elif scope == "anonymous" and self.link_sharing == "everyone":
                out.add(EVERYONE)
        return {p for p in out if _valid(p)}

    def _identity_principals(self, identity: Mapping[str, Any], where: str = "identity") -> set[str]:
        """Principals of one ``sharePointIdentitySet`` (module docstring); empty when it names nobody
        this index can represent (an application, a device, an unknown claim, an id that makes no
        principal). Raises ``_Malformed`` for a field of the wrong type (``where`` names the identity)."""
        group = _typed(identity, "group", dict, f"{where}.group") or {}
        group_id = _typed(group, "id", str, f"{where}.group.id")
        if group_id:
            return _principal_or_nothing(lambda: group_principal(self.name, group_id))
        for key, kind in (("sharePointGroup", "spgroup"), ("siteGroup", "sitegroup")):
            site_group = _typed(identity, key, dict, f"{where}.{key}") or {}
            site_group_id = _typed(site_group, "id", (str, int), f"{where}.{key}.id")
            if site_group_id not in (None, ""):
                return _principal_or_nothing(lambda: group_principal(self.name, f"{kind}:{site_group_id}"))
        user = _typed(identity, "user", dict, f"{where}.user") or {}
        site_user = _typed(identity, "siteUser", dict, f"{where}.siteUser") or {}
        login = _typed(site_user, "loginName", str, f"{where}.siteUser.loginName") or ""
        if login.lower().startswith(_ALL_USERS_CLAIM):
            return set(self.org_domains)
        for candidate in (_typed(user, "email", str, f"{where}.user.email"),
                          _typed(site_user, "email", str, f"{where}.siteUser.email"),
                          login[len(_MEMBERSHIP_CLAIM):] if login.lower().startswith(_MEMBERSHIP_CLAIM) else None):
            if candidate and "@" in candidate:
                return _principal_or_nothing(lambda: user_principal(candidate))
        user_id = _typed(user, "id", str, f"{where}.user.id")
        if user_id:
            return _principal_or_nothing(lambda: user_principal(f"graph:{user_id}"))
        return set()

    def group_members(self, groups: Collection[str]) -> GroupMembers:
        """Transitive members of each Entra ID group principal this source issued (module docstring).

        A group of another source, a SharePoint site group (not readable through Graph) or a failed read
        goes to ``errors`` (it grants nothing). Raises :class:`SourceError` only when no token can be had."""
        members: dict[str, frozenset[str]] = {}
        errors: dict[str, str] = {}
        prefix = f"group:{self.name}:"
        for principal in sorted(set(groups)):
            group_id = principal[len(prefix):] if principal.startswith(prefix) else ""
            if not group_id:
                errors[principal] = f"not a group principal of {self.name}"
                continue
            if group_id.startswith(("sitegroup:", "spgroup:")):
                errors[principal] = ("a SharePoint site group: Microsoft Graph v1.0 cannot list its members, "
                                     "so it grants nothing")
                continue
            query = urllib.parse.urlencode({"$select": MEMBER_SELECT, "$top": "999"}, safe="$,")
            url = f"{self._graph}/groups/{urllib.parse.quote(group_id, safe='')}/transitiveMembers?{query}"
            found: set[str] = set()
            try:
                for body in self._pages(url, "Graph transitiveMembers"):
                    value = body.get("value")
                    if not isinstance(value, list):
                        raise ListingIncompleteError("Graph transitiveMembers: a page without a value list")
                    for member in value:
                        principal_of = self._member_principal(member)
                        if principal_of and _valid(principal_of):
                            found.add(principal_of)
            except _TokenError:
                raise
            except (SourceError, _Gone, _Malformed) as exc:
                errors[principal] = f"members of group {group_id}: {'HTTP 410' if isinstance(exc, _Gone) else exc}"
                continue
            members[principal] = frozenset(found)
        return GroupMembers(members=members, errors=errors)

    def _member_principal(self, member: Any) -> str | None:
        """The principal of one ``directoryObject`` (``None``: nobody who reads, or an id that makes no
        principal); raises ``_Malformed`` for a member that is not an object or a field of the wrong
        type (the whole group then grants nothing: a member list that cannot be read is not guessed at)."""
        if not isinstance(member, dict):
            raise _Malformed("a member that is not an object")
        kind = (_typed(member, "@odata.type", str, "member @odata.type") or "").lower()
        member_id = _typed(member, "id", str, "member id")
        mail = _typed(member, "mail", str, "member mail")
        upn = _typed(member, "userPrincipalName", str, "member userPrincipalName")
        if kind == "#microsoft.graph.group" and member_id:
            return next(iter(_principal_or_nothing(lambda: group_principal(self.name, member_id))), None)
        if kind != "#microsoft.graph.user":
            return None  # devices, contacts, service principals: nobody who reads documents
        for candidate in (mail, upn):
            if candidate and "@" in candidate:
                return next(iter(_principal_or_nothing(lambda: user_principal(candidate))), None)
        return user_principal(f"graph:{member_id}") if member_id else None

    def permission_changes(self, cursor: str | None) -> PermissionChanges:
        """Items whose permissions may have changed since ``cursor`` (module docstring).

        Returns ``PermissionChanges(None, fresh)`` without a usable cursor, on 410 Gone, or when a
        malformed driveItem was skipped (its permissions might have changed unseen: read them all);
        raises :class:`ListingIncompleteError` when a page or a folder listing fails or is malformed (the
        cursor is then not advanced) and :class:`SourceError` when no token can be had."""
        if not cursor:
            return PermissionChanges(None, self._fresh_permission_cursor())
        try:
            state = _PermissionState.decode(cursor)
        except ValueError as exc:
            log.warning("sharepoint: %s; reading every document's permissions", exc)
            return PermissionChanges(None, self._fresh_permission_cursor())
        malformed: list[str] = []
        try:
            items, delta_link = self._delta(state.link, headers={"Prefer": SHARING_PREFER}, malformed=malformed)
        except _Gone:
            return PermissionChanges(None, self._fresh_permission_cursor())
        if malformed:
            log.warning("sharepoint: permission delta: %s; reading every document's permissions",
                        _malformed_reason(malformed))
            return PermissionChanges(None, self._fresh_permission_cursor())
        whole_drive = state.scope_id is None
        folders = set(state.folders)
        above = set(state.ancestors) | ({state.scope_id} if state.scope_id else set())
        read_all = False
        expand: list[str] = []
        changed: set[str] = set()

        def is_folder(item: Mapping[str, Any]) -> bool:
            return "folder" in item or "root" in item

        def parent_of(item: Mapping[str, Any]) -> str | None:
            return (item.get("parentReference") or {}).get("id")

        for item_id, item in items.items():
            if not is_folder(item):
                continue
            if item_id in above or "root" in item:
                if _shared_changed(item) or ("deleted" in item and item_id == state.scope_id):
                    read_all = True
                continue
            if whole_drive:
                if _shared_changed(item) and "deleted" not in item:
                    expand.append(item_id)
            elif "deleted" in item:
                folders.discard(item_id)
        if not whole_drive:
            # folders entering the scope (new, or moved in): their files now inherit from it
            progress = True
            while progress:
                progress = False
                for item_id, item in items.items():
                    if is_folder(item) and "deleted" not in item and item_id not in folders \
                            and item_id not in above and parent_of(item) in folders:
                        folders.add(item_id)
                        expand.append(item_id)
                        progress = True
            for item_id, item in items.items():
                if not is_folder(item) or "deleted" in item or item_id in above:
                    continue
                if item_id in folders and parent_of(item) not in folders:
                    folders.discard(item_id)  # moved out: its files leave the content scope too
                elif item_id in folders and _shared_changed(item):
                    expand.append(item_id)
        next_state = _PermissionState(link=delta_link, scope_id=state.scope_id, ancestors=state.ancestors,
                                      folders=sorted(folders))
        if read_all:
            return PermissionChanges(None, next_state.encode())
        for item_id, item in items.items():
            if not is_folder(item) and (whole_drive or parent_of(item) in folders):
                changed.add(item_id)
        walked: set[str] = set()
        for folder_id in expand:
            if folder_id in walked:
                continue
            walked.add(folder_id)
            for child in self._children(folder_id, malformed):
                if "folder" in child:
                    walked.add(child["id"])
                    if not whole_drive:
                        folders.add(child["id"])
                elif "file" in child:
                    changed.add(child["id"])
        if malformed:
            log.warning("sharepoint: permission delta: %s; reading every document's permissions",
                        _malformed_reason(malformed))
            return PermissionChanges(None, self._fresh_permission_cursor())
        next_state.folders = sorted(folders)
        return PermissionChanges(sorted(changed), next_state.encode())

    def _fresh_permission_cursor(self) -> str:
        """A permission cursor as of now: a ``?token=latest`` delta link, nothing enumerated (a path
        scope lists its folders, to tell later which items are in it). Raises
        :class:`ListingIncompleteError` when that fails, or when the scope's listing holds a malformed
        item (it might be a folder whose files' permission changes would then go unseen)."""
        scope_id = self._resolve_scope()
        # the link first: a folder made while the scope is listed below is then in the next delta
        url = self._drive_url("/root/delta") + "?" + urllib.parse.urlencode(
            {"token": "latest", "$select": PERMISSION_DELTA_SELECT}, safe="$,")
        try:
            _, link = self._delta(url, headers={"Prefer": SHARING_PREFER})
        except _Gone:
            raise ListingIncompleteError("Graph delta ?token=latest answered 410 Gone") from None
        ancestors: list[str] = []
        folders: list[str] = []
        if scope_id is not None:
            root = self._get_json(self._drive_url("/root") + "?$select=id", "drive root")
            if root.get("id"):
                ancestors.append(_str_id(root.get("id"), "drive root"))
            parts = (self.path or "").split("/")
            for depth in range(1, len(parts)):
                prefix = urllib.parse.quote("/".join(parts[:depth]))
                folder = self._get_json(self._drive_url(f"/root:/{prefix}") + "?$select=id", "scope ancestor")
                if folder.get("id"):
                    ancestors.append(_str_id(folder.get("id"), "scope ancestor"))
            malformed: list[str] = []
            folders = [scope_id] + [c["id"] for c in self._children(scope_id, malformed) if "folder" in c]
            if malformed:
                raise ListingIncompleteError(f"Graph children of the scope folder: {_malformed_reason(malformed)}")
        return _PermissionState(link=link, scope_id=scope_id, ancestors=ancestors, folders=folders).encode()

    # ---- mapping ------------------------------------------------------------------------

    def _to_document(self, item: Mapping[str, Any]) -> SourceDocument:
        """Map a Graph driveItem (file) to a :class:`SourceDocument` (id = drive item id).

        Total for any object with an ``id``: a field of the wrong type counts as absent (the boundary,
        ``_page_items``, has already skipped such items; this keeps the mapping safe on its own); lone
        surrogates in text fields become U+FFFD (the id is kept as Graph gave it)."""
        item_id = str(item["id"])
        file_facet = _mapping(item.get("file"))
        hashes = _mapping(file_facet.get("hashes"))
        sha256 = _text(hashes.get("sha256Hash"))
        metadata = {
            "drive_id": self.drive_id,
            "parent_id": _text(_mapping(item.get("parentReference")).get("id")),
            "etag": _text(item.get("eTag")),
            "ctag": _text(item.get("cTag")),
            "quick_xor_hash": _text(hashes.get("quickXorHash")),
            "sha1": _text(hashes.get("sha1Hash")),
        }
        return SourceDocument(
            source_id=item_id,
            title=_text(item.get("name")) or _text(item_id) or "",
            uri=_text(item.get("webUrl")) or _text(self._drive_url(f"/items/{item_id}")) or "",
            mime_type=_text(file_facet.get("mimeType")),
            size=_size(item.get("size")),
            modified_at=_parse_time(item.get("lastModifiedDateTime")),
            source_version=_text(item.get("cTag")) or _text(item.get("eTag")),
            content_sha256=sha256.lower() if sha256 and _SHA256.fullmatch(sha256) else None,
            metadata=metadata,
        )


def _shared_changed(item: Mapping[str, Any]) -> bool:
    return str(item.get(SHARED_CHANGED, "")).lower() == "true"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


_SURROGATE = re.compile("[\ud800-\udfff]")
_SHA256 = re.compile("[0-9A-Fa-f]{64}")
_ITEM_TEXT = ("name", "cTag", "eTag", "webUrl")
"""driveItem fields that must be strings (when present and not null)."""
_ITEM_FACETS = ("file", "folder", "package", "root", "deleted", "parentReference")
"""driveItem facets that must be objects (when present and not null); their presence is what counts."""
_FILE_TEXT = ("mimeType",)
_HASH_TEXT = ("sha256Hash", "quickXorHash", "sha1Hash")
_MAX_NOTES = 20
"""Malformed items named in an incomplete listing's reason (all are logged)."""


def _text(value: Any) -> str | None:
    """``value`` when it is a non-empty string (lone surrogates as U+FFFD: UTF-8 and PostgreSQL refuse
    them), else ``None``."""
    if not isinstance(value, str) or not value:
        return None
    return _SURROGATE.sub("\ufffd", value)


def _size(value: Any) -> int | None:
    """A byte count: a non-negative int (not a bool), or a finite integral float; else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and math.isfinite(value) and value >= 0 and value.is_integer():
        return int(value)
    return None


def _item_problem(item: dict[str, Any]) -> str | None:
    """The first field of a driveItem (nulls already dropped) that has the wrong type, or ``None``:
    ``id`` a non-empty str (no lone surrogates), ``name``/``cTag``/``eTag``/``webUrl`` str, the facets
    objects, ``size`` a byte count (``_size``), ``file.mimeType`` and ``file.hashes.*`` str,
    ``parentReference.id`` a non-empty str. ``lastModifiedDateTime`` is not checked: one that cannot be
    parsed is no modification time."""
    item_id = item.get("id")
    if not isinstance(item_id, str) or not item_id or _SURROGATE.search(item_id):
        return "id"
    for key in _ITEM_TEXT:
        if key in item and not isinstance(item[key], str):
            return key
    for key in _ITEM_FACETS:
        if key in item and not isinstance(item[key], dict):
            return key
    if "size" in item and _size(item["size"]) is None:
        return "size"
    file_facet = item.get("file") or {}
    for key in _FILE_TEXT:
        if file_facet.get(key) is not None and not isinstance(file_facet[key], str):
            return f"file.{key}"
    hashes = file_facet.get("hashes")
    if hashes is not None:
        if not isinstance(hashes, dict):
            return "file.hashes"
        for key in _HASH_TEXT:
            if hashes.get(key) is not None and not isinstance(hashes[key], str):
                return f"file.hashes.{key}"
    parent_id = (item.get("parentReference") or {}).get("id")
    if parent_id is not None and (not isinstance(parent_id, str) or not parent_id):
        return "parentReference.id"
    return None


def _page_items(body: Mapping[str, Any], what: str, malformed: list[str]) -> Iterator[dict[str, Any]]:
    """The well-formed driveItems of one delta/children page, each a copy without its null fields.

    A malformed one (``_item_problem``) is skipped: logged with its id (when a string) and the field,
    and a note appended to ``malformed``. Raises :class:`ListingIncompleteError` when the page's
    ``value`` is not a list."""
    value = body.get("value")
    if not isinstance(value, list):
        raise ListingIncompleteError(f"{what}: a page without a value list")
    for raw in value:
        if not isinstance(raw, dict):
            problem, item = "not an object", None
        else:
            item = {k: v for k, v in raw.items() if v is not None}
            problem = _item_problem(item)
        if problem is None and item is not None:
            yield item
            continue
        raw_id = raw.get("id") if isinstance(raw, dict) else None
        shown = ascii(raw_id[:200]) if isinstance(raw_id, str) else "(no usable id)"
        log.warning("sharepoint: %s: driveItem %s skipped: malformed %s", what, shown, problem)
        malformed.append(f"{shown}: {problem}")


def _malformed_reason(malformed: Sequence[str]) -> str | None:
    """The ``incomplete_reason`` for skipped malformed items (``None`` when there were none)."""
    if not malformed:
        return None
    named = "; ".join(malformed[:_MAX_NOTES]) + ("; ..." if len(malformed) > _MAX_NOTES else "")
    return f"{len(malformed)} malformed driveItem(s) skipped ({named})"


def _str_id(value: Any, what: str) -> str:
    """``value`` when it is a non-empty str id; else :class:`ListingIncompleteError`."""
    if not isinstance(value, str) or not value:
        raise ListingIncompleteError(f"Graph {what}: an id that is not a string")
    return value


class _Malformed(ValueError):
    """A permission or group member with a field of the wrong type; the message names it."""


def _typed(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``obj[key]`` when it is an instance of ``kind`` (a bool is no int), ``None`` when absent or null;
    raises ``_Malformed`` naming ``where`` otherwise."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _Malformed(f"a malformed field {where} ({type(value).__name__})")
    return value


def _principal_or_nothing(make: Any) -> set[str]:
    """``{make()}``, or nothing when the id makes no principal (``ValueError``: it grants nothing)."""
    try:
        return {make()}
    except ValueError:
        log.warning("sharepoint: an identity whose principal would be malformed left out (it grants nothing)")
        return set()


def _valid(principal: str) -> bool:
    """Whether ``principal`` survives ``parse_principal`` unchanged (a malformed one grants nothing)."""
    try:
        return parse_principal(principal) == principal
    except ValueError:
        log.warning("sharepoint: a malformed principal from Graph left out (it grants nothing)")
        return False


def _expired(value: Any) -> bool:
    """Whether a permission's ``expirationDateTime`` has passed (``0001-01-01...`` or absent: never;
    one that cannot be parsed counts as passed)."""
    if not isinstance(value, str) or not value or value.startswith(_NO_EXPIRY):
        return False
    when = _parse_time(value)
    return when is None or when <= datetime.now(timezone.utc)  # unparsable: grants nothing


_BROKEN_TRANSFER = (requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException, OSError)
"""What reading a streamed body raises when the transfer breaks (never ``out.write``'s errors)."""


def _copy_body(response: requests.Response, out: BinaryIO) -> None:
    """Write a streamed response's body to ``out`` in pieces of at most ``FETCH_PIECE_BYTES``. A read
    that fails (connection reset, a body shorter than its ``Content-Length``, a timeout) raises a
    transient :class:`SourceError` saying how many bytes had arrived; ``out.write``'s own errors pass
    unchanged (the write is outside the ``try``)."""
    pieces = response.iter_content(FETCH_PIECE_BYTES)
    written = 0
    while True:
        try:
            piece = next(pieces, None)
        except _BROKEN_TRANSFER as exc:
            raise SourceError(f"Graph download broke off after {written} bytes: {type(exc).__name__}") from None
        if piece is None:
            return
        for start in range(0, len(piece), FETCH_PIECE_BYTES):
            out.write(piece[start:start + FETCH_PIECE_BYTES])
        written += len(piece)


def _graph_error_code(response: requests.Response) -> str:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError, RecursionError, requests.RequestException):
        return ""


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
