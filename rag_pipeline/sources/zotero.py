"""Zotero source: a user or group library read through the Zotero Web API v3 with ``pyzotero``.

**Documents.** One document per attachment *file*: ``source_id`` is the attachment's item key.
Regular (top-level) items are not documents themselves; their title, creators, year, DOI, tags and
collections become the ``metadata`` of each of their attachments. Notes and annotations are not
ingested. A top-level attachment without a parent is its own parent.

**Link modes.** ``imported_file`` and ``imported_url`` are downloaded through
``GET <library>/items/<key>/file``, streamed (``fetch_to``: pieces of at most ``FETCH_PIECE_BYTES``) and
following its redirect to the storage server (S3 on zotero.org) without the API key, which goes to the
API's own origin only. ``linked_file`` is read from disk, in pieces too: the path Zotero recorded is
mapped with ``path_prefix_map`` (a Windows drive path to a POSIX mount, longest prefix first, case-
insensitive for Windows paths), ``attachments:<relative>`` paths are taken relative to
``linked_files_root``, and the result must lie under ``linked_files_root`` or one of the mapping
targets (a library entry must not make the pipeline read ``/etc/passwd``); otherwise the document
carries ``skip_reason`` ``"linked file not reachable: ..."``. ``linked_url``, ``embedded_image`` and
any unknown link mode are listed with a ``skip_reason`` too, never dropped and never a crash.
Whether the bytes really are what ``contentType`` claims is for the extraction layer to check.

**Inventory.** ``GET <library>/items`` paged at ``page_size`` (max 100) until ``Total-Results`` is
reached; a page that fails, a listing that comes up short of ``Total-Results`` or a library whose
``Last-Modified-Version`` moves between pages gives ``Inventory(complete=False)``, which never drives
deletions. ``Inventory.cursor`` is the watermark the listing was read at; ``expected_total`` counts
API items (notes and parents included), not documents. A page that is not a JSON list raises
``ListingIncompleteError`` (the first page) or ends the listing incomplete. An item that cannot be used
at all (not an object, ``data`` not an object, no usable key, ``itemType``/``parentItem``/``deleted`` of
the wrong type) is left out with a log line naming it, and the listing (or change set) is incomplete;
a metadata field of the wrong type is ignored and the item kept (``_to_document`` says how).

**Change feed.** The cursor is the library's ``Last-Modified-Version`` (with the library and API URL,
so a cursor from another library or server is never reused). ``changes(cursor)`` sends
``If-Modified-Since-Version`` (pyzotero cannot send that header, so this one request goes straight
through the same HTTP client): ``304`` means *nothing changed*. Otherwise it reads the changed item
keys (``since=``, ``format=versions``, ``includeTrashed=1``), ``/deleted?since=``, the changed items
themselves, the children of changed parents (a renamed parent re-issues its attachments with new
metadata; a trashed parent deletes them) and the parents of changed attachments. Every item key in
``/deleted`` is returned in ``deleted_ids``: Zotero logs an erased parent's child items there too, and
keys that are not documents match nothing. A missing, foreign or unparsable cursor, a server that
rejects ``since`` (4xx) or a library version lower than the cursor's (a reset library) raises
``ChangeFeedUnavailable``, so the sync does a full listing and reconciliation.

**Versions.** ``source_version`` is the attachment item's version (it changes when the file is
replaced), plus ``":<mtime_ns>:<size>"`` or ``":unreachable"`` for linked files, so a linked file that
appears on the mount or is edited there is processed again. A parent's change (title, tags, ...)
changes only ``metadata`` (``item_version`` in it), which the sync applies without re-embedding. A
linked file edited on disk changes no Zotero version: the change feed does not see it, a full
listing does.

**Permissions.** The library is the unit: every document of a library has the same scope.

* A user library (``users/<id>``) is readable by its owner, ``user:zotero:<id>``.
* A group library (``groups/<id>``) by its members, the group principal
  ``group:<self.name>:groups/<id>`` (``group_members`` expands it to ``user:zotero:<userID>`` of the
  group's ``owner``, ``admins`` and ``members``, read from ``GET /groups/<id>``), plus ``everyone`` when
  the group is public (``type`` ``PublicOpen`` or ``PublicClosed``) with ``libraryReading: all``. A
  private group, or a public one whose library only members read, gives no ``everyone``.
* The key's real scope is checked first (``GET /keys/current``, the key in the header, never in the
  URL): its ``userID`` must be the user library's owner with ``access.user.library``, or for a group
  ``access.groups["<id>"]`` (or ``"all"``) must grant ``library``. Without a key (a public library) or on
  the local API (which has no keys) the check is a read of one key of the library
  (``GET <library>/items/top?limit=1&format=keys``). The library's own answer is proof too: when one
  of its requests (a listing page, the change probe's ``304``, a download) got 200/304 within
  ``access_proof_s`` (default 120 s) before a permission read, that read uses it instead of a request,
  once (the next read asks again), so a quiet content sync still costs one request for a user library.
  The local API's ``users/0`` names no owner.
* ``permissions(documents)`` does one library-level read (key check, and for a group ``/groups/<id>``)
  and gives every document that scope; any failure (HTTP 403/404/5xx after retries, a transport error,
  an answer of the wrong shape, a key that cannot read the library) makes every document
  ``Scope.unreadable`` with the reason (fail closed). A document whose ``metadata.library`` names
  another library is unreadable too. Reasons never contain the key or a response body (the
  ``/keys/current`` body carries the key).
* Not done: mapping a Zotero user id to an e-mail address (``user:zotero:436`` stays as it is; a query
  must name that principal), and ``permission_changes`` (every permission sync reads the library's
  scope: one or two requests).

**HTTP.** Every request has a timeout (``timeout_s``). ``429``, ``500``, ``502``, ``503``, ``504`` and
transport errors (timeouts, refused connections) are retried with tenacity up to ``max_attempts``
times, waiting what ``Retry-After``/``Backoff`` ask for (or exponentially without them), each wait
capped at ``max_wait_s``; a ``Backoff`` header on a successful answer delays the next request the
same way. The API key goes in the ``Authorization`` header only and is never logged or put in an
error message or ``repr``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO
from urllib.parse import quote, urlsplit

import httpx2
import pyzotero
import tenacity

from rag_pipeline.permissions.principals import EVERYONE
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
    Scope,
    SourceDocument,
    SourceError,
    copy_pieces,
    fetch_via,
)
from rag_pipeline.sources.http import parse_retry_after

log = logging.getLogger(__name__)

DEFAULT_API_URL = "https://api.zotero.org"
"""The public Zotero Web API; ``ZOTERO_API_URL`` or ``api_url`` replace it (self-hosted, local API, tests)."""

LINKED_NOT_REACHABLE = "linked file not reachable"
"""Prefix of the ``skip_reason`` of a ``linked_file`` attachment that cannot be read."""

FETCHED_LINK_MODES = frozenset({"imported_file", "imported_url"})
"""Link modes whose file is stored by Zotero and downloaded through ``/items/<key>/file``."""

_LIBRARY_RE = re.compile(r"^(users|groups)/(\d+)$")
_CURSOR_FORMAT = 1
_KEY_BATCH = 50  # the API's limit for itemKey=
_MAX_REDIRECTS = 5  # hops followed by a download (the API answers one, to the storage server)
_MAX_PAGE = 100  # the API's limit for limit=
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_SKIPPED_ITEM_TYPES = frozenset({"note", "annotation"})
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_YEAR_RE = re.compile(r"\b(\d{4})\b")
_DOI_EXTRA_RE = re.compile(r"^\s*DOI:\s*(\S+)", re.IGNORECASE | re.MULTILINE)
_WINDOWS_PATH_RE = re.compile(r"^(?:[A-Za-z]:[\\/]|\\\\|//)")
PUBLIC_GROUP_TYPES = frozenset({"PublicOpen", "PublicClosed"})
"""Group types whose library may be readable by anyone (with ``libraryReading: all``)."""



# --------------------------------------------------------------------------------------------------
# HTTP: timeouts, bounded retries and Backoff/Retry-After, below pyzotero
# --------------------------------------------------------------------------------------------------


class _RetryableStatus(Exception):
    """An answer worth retrying (429/5xx). ``delay_s`` is what the server asked for, if anything."""

    def __init__(self, status: int, delay_s: float | None, path: str) -> None:
        super().__init__(status, delay_s, path)
        self.status = status
        self.delay_s = delay_s
        self.path = path
        self.attempts: int | None = None  # set when the retries are used up

    def __str__(self) -> str:
        asked = f"; server asked to wait {self.delay_s:g} s" if self.delay_s is not None else ""
        tries = f" after {self.attempts} attempts" if self.attempts else ""
        return f"HTTP {self.status} for {self.path}{tries}{asked}"


def server_delay_s(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """Seconds the server asks the client to wait: the larger of ``Backoff`` and ``Retry-After``.

    ``Retry-After`` may be delay-seconds or an HTTP date (RFC 9110); ``Backoff`` is seconds (Zotero).
    Returns ``None`` when neither header is present or parseable; never negative.
    """
    delays: list[float] = []
    for name in ("backoff", "retry-after"):
        delay = parse_retry_after(headers.get(name), now=now)
        if delay is not None:
            delays.append(delay)
    return max(delays) if delays else None


class _RetryingTransport(httpx2.BaseTransport):
    """An httpx2 transport that adds a timeout to every request and retries, with tenacity, answers
    in ``_RETRY_STATUSES`` and transport errors, honouring ``Retry-After``/``Backoff`` (capped at
    ``max_wait_s``). After ``max_attempts`` it raises the last error, which pyzotero does not catch,
    so pyzotero's own uncapped rate-limit sleeping never runs; the headers it would act on are removed
    from answers this transport has already honoured."""

    def __init__(self, inner: httpx2.BaseTransport, *, timeout_s: float, max_attempts: int,
                 max_wait_s: float) -> None:
        self._inner = inner
        self._timeout = httpx2.Timeout(timeout_s).as_dict()
        self._max_attempts = max_attempts
        self._max_wait_s = max_wait_s
        self._not_before = 0.0  # monotonic time before which no request is sent (Backoff on a 2xx)
        self.library_path: str | None = None
        """URL path prefix of the library's own requests (``/users/123/``), set by ``ZoteroSource``."""
        self.library_ok_at: float | None = None
        """Monotonic time of the last 200/304 answer to one of the library's own requests."""

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        request.extensions = {**request.extensions, "timeout": self._timeout}
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self._max_attempts),
            wait=self._wait_s,
            retry=tenacity.retry_if_exception_type((_RetryableStatus, httpx2.TransportError)),
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            return retrying(self._send_once, request)
        except _RetryableStatus as exc:
            exc.attempts = self._max_attempts
            raise

    def _send_once(self, request: httpx2.Request) -> httpx2.Response:
        pause = self._not_before - time.monotonic()
        if pause > 0:
            log.info("Zotero API asked for backoff: waiting %.2f s before %s", pause, request.url.path)
            time.sleep(pause)
        response = self._inner.handle_request(request)
        delay = server_delay_s(response.headers)
        if response.status_code in _RETRY_STATUSES:
            response.read()
            response.close()
            raise _RetryableStatus(response.status_code, delay, request.url.path)
        if delay is not None:
            self._not_before = time.monotonic() + min(delay, self._max_wait_s)
        if (self.library_path and response.status_code in (200, 304)
                and request.url.path.startswith(self.library_path)):
            self.library_ok_at = time.monotonic()
        for name in ("Backoff", "Retry-After"):  # honoured here; pyzotero would wait again, uncapped
            if name in response.headers:
                del response.headers[name]
        return response

    def _wait_s(self, state: tenacity.RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome else None
        if isinstance(error, _RetryableStatus) and error.delay_s is not None:
            return min(error.delay_s, self._max_wait_s)
        return min(0.5 * 2 ** (state.attempt_number - 1), self._max_wait_s)

    def _log_retry(self, state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        log.warning("Zotero API: %s; attempt %d of %d, retrying in %.2f s", error,
                    state.attempt_number, self._max_attempts, state.upcoming_sleep)

    def close(self) -> None:
        self._inner.close()


# --------------------------------------------------------------------------------------------------
# Linked files
# --------------------------------------------------------------------------------------------------


def parse_path_prefix_map(text: str | None) -> dict[str, str]:
    """Parse ``RAG_ZOTERO_PATH_MAP``: ``"C:\\Papers=/mnt/nas/papers;D:\\X=/mnt/x"`` ->
    ``{"C:\\Papers": "/mnt/nas/papers", "D:\\X": "/mnt/x"}``.

    Entries are separated by ``;`` and split at the *last* ``=`` (so ``\\\\nas\\share=/mnt/share``
    works); blank entries are ignored. Raises ``ValueError`` naming an entry without ``=`` or with an
    empty side.
    """
    result: dict[str, str] = {}
    for entry in (text or "").split(";"):
        entry = entry.strip()
        if not entry:
            continue
        prefix, sep, target = entry.rpartition("=")
        if not sep or not prefix.strip() or not target.strip():
            raise ValueError(f"RAG_ZOTERO_PATH_MAP entry {entry!r} is not '<recorded prefix>=<local path>'")
        result[prefix.strip()] = target.strip()
    return result


def _split_recorded(path: str) -> list[str]:
    """Components of a path recorded on any OS (``\\`` and ``/`` both separate)."""
    return [part for part in re.split(r"[\\/]+", path) if part]


@dataclass(frozen=True)
class LinkedFileResolver:
    """Maps a ``linked_file`` path recorded by Zotero (possibly on another machine) to a local file.

    ``root``: the configured mount (``RAG_ZOTERO_LINKED_ROOT``), also the base of Zotero's
    ``attachments:<relative path>`` form. ``prefix_map``: recorded prefix -> local directory.
    A resolved file must lie, after following symlinks, under ``root`` or a mapping target.
    """

    root: Path | None = None
    prefix_map: Mapping[str, str] = field(default_factory=dict)

    def resolve(self, recorded: str) -> tuple[Path | None, str | None]:
        """Return ``(path, None)`` for a readable regular file, else ``(None, reason)`` where reason
        starts with ``"linked file not reachable"``."""
        allowed = [Path(p).resolve() for p in ([self.root] if self.root else [])]
        allowed += [Path(t).resolve() for t in self.prefix_map.values()]
        if not allowed:
            return None, f"{LINKED_NOT_REACHABLE}: no RAG_ZOTERO_LINKED_ROOT or RAG_ZOTERO_PATH_MAP configured"
        candidate = self._map(recorded)
        if candidate is None:
            return None, f"{LINKED_NOT_REACHABLE}: no path mapping for {recorded}"
        try:
            real = candidate.resolve()
            if not any(real == base or real.is_relative_to(base) for base in allowed):
                return None, f"{LINKED_NOT_REACHABLE}: {candidate} is outside the configured roots"
            if not real.is_file() or not os.access(real, os.R_OK):
                return None, f"{LINKED_NOT_REACHABLE}: {candidate} does not exist or cannot be read"
        except (OSError, ValueError, RuntimeError) as exc:  # NUL in the path, a name over NAME_MAX, a loop
            return None, f"{LINKED_NOT_REACHABLE}: {candidate!r} ({exc.__class__.__name__})"
        return real, None

    def _map(self, recorded: str) -> Path | None:
        recorded = recorded.strip()
        if recorded.startswith("attachments:"):
            if self.root is None:
                return None
            return self.root.joinpath(*_split_recorded(recorded[len("attachments:"):]))
        parts = _split_recorded(recorded)
        windows = bool(_WINDOWS_PATH_RE.match(recorded))
        best: tuple[int, str] | None = None
        for prefix, target in self.prefix_map.items():
            pparts = _split_recorded(prefix)
            if not pparts or len(pparts) > len(parts):
                continue
            head = parts[: len(pparts)]
            same = ([a.casefold() for a in head] == [b.casefold() for b in pparts]) if (
                windows or _WINDOWS_PATH_RE.match(prefix)) else head == pparts
            if same and (best is None or len(pparts) > best[0]):
                best = (len(pparts), target)
        if best is not None:
            return Path(best[1]).joinpath(*parts[best[0]:])
        if not windows and PurePosixPath(recorded).is_absolute():
            return Path(recorded)
        return None


# --------------------------------------------------------------------------------------------------
# Item JSON -> document
# --------------------------------------------------------------------------------------------------


_ITEM_KEY_RE = re.compile(r"^[A-Za-z0-9]{1,32}$")
_MAX_VERSION = 2**63 - 1
_TEXT_FIELDS = ("linkMode", "title", "filename", "path", "contentType", "md5", "url", "dateModified", "DOI",
                "extra", "date")
_LIST_FIELDS = ("tags", "creators", "collections")


def _data(item: Any) -> dict[str, Any]:
    """``item["data"]`` when ``item`` is a dict whose ``data`` is a dict, else ``{}``."""
    data = item.get("data") if isinstance(item, Mapping) else None
    return data if isinstance(data, dict) else {}


def _key(item: Any) -> str | None:
    """The item key (``key``, else ``data.key``) when it is a string, else ``None``."""
    key = item.get("key") if isinstance(item, Mapping) else None
    key = key or _data(item).get("key")
    return key if isinstance(key, str) and key else None


def _malformed(item: Any) -> str | None:
    """Why ``item`` cannot be used at all, or ``None``: not a JSON object, ``data`` not an object, no
    usable key (1-32 ASCII letters/digits), ``itemType`` not a string, ``parentItem`` not a key, or
    ``deleted`` not a boolean/0/1. Such an item is skipped and the listing it came in marked incomplete
    (its kind, parent or trash state is unknown, so neither keeping nor deleting it is safe). Fields that
    only feed metadata are checked where they are read and ignored when of the wrong type."""
    if not isinstance(item, dict):
        return f"not a JSON object ({type(item).__name__})"
    data = item.get("data")
    if not isinstance(data, dict):
        return f"'data' is not a JSON object ({type(data).__name__})"
    key = _key(item)
    if key is None or not _ITEM_KEY_RE.match(key):
        return "no usable item key"
    if not isinstance(data.get("itemType"), str) or not data["itemType"]:
        return f"'itemType' is not a string ({type(data.get('itemType')).__name__})"
    parent = data.get("parentItem")
    if parent not in (None, False, "") and not (isinstance(parent, str) and _ITEM_KEY_RE.match(parent)):
        return "'parentItem' is not an item key"
    if data.get("deleted") not in (None, False, True, 0, 1) or isinstance(data.get("deleted"), float):
        return "'deleted' is not a boolean"
    return None


def _label(item: Any, index: int) -> str:
    """How a log line names a (possibly malformed) item: its key, shortened, or its place on the page."""
    key = item.get("key") if isinstance(item, Mapping) else None
    return repr(key)[:40] if isinstance(key, str) else f"#{index} of the page"


def _version_value(value: Any) -> int | None:
    """A Zotero version (a non-negative integer below 2**63, or such a string of digits), else ``None``."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_VERSION:
        return value
    return None


def _version(item: Any) -> int:
    """The item's ``version`` (else ``data.version``); 0 when absent or of the wrong type (inf, NaN, a
    bool, a float, a word, a list: ignored, never an error)."""
    if not isinstance(item, Mapping):
        return 0
    raw = item.get("version", _data(item).get("version", 0))
    version = _version_value(raw)
    return version if version is not None else 0


def _trashed(item: Mapping[str, Any]) -> bool:
    return _data(item).get("deleted") in (True, 1)


def _item_type(item: Mapping[str, Any]) -> str:
    value = _data(item).get("itemType")
    return value if isinstance(value, str) else ""


def _wrong_typed(item: Mapping[str, Any]) -> list[str]:
    """Names of fields of ``item`` that are present but of the wrong type (they are ignored)."""
    data = _data(item)
    wrong = [name for name in _TEXT_FIELDS if data.get(name) is not None and not isinstance(data[name], str)]
    wrong += [name for name in _LIST_FIELDS if data.get(name) is not None and not isinstance(data[name], list)]
    raw = item.get("version", data.get("version")) if isinstance(item, Mapping) else None
    if raw is not None and _version_value(raw) is None:
        wrong.append("version")
    return wrong


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _year(item: Mapping[str, Any]) -> int | None:
    meta = item.get("meta") if isinstance(item.get("meta"), dict) else {}
    for text in (meta.get("parsedDate"), _data(item).get("date")):
        if isinstance(text, str) and (match := _YEAR_RE.search(text)) and int(match[1]) > 0:
            return int(match[1])
    return None


def _doi(data: Mapping[str, Any]) -> str | None:
    raw = data.get("DOI")
    if not (isinstance(raw, str) and raw.strip()):
        match = _DOI_EXTRA_RE.search(data.get("extra") or "") if isinstance(data.get("extra"), str) else None
        raw = match[1] if match else None
    if not raw:
        return None
    doi = re.sub(r"^(?:https?://(?:dx\.)?doi\.org/|doi:\s*)", "", raw.strip(), flags=re.IGNORECASE)
    return doi or None


def _list(data: Mapping[str, Any], name: str) -> list[Any]:
    """``data[name]`` when it is a list, else ``[]`` (absent, or of the wrong type: ignored)."""
    value = data.get(name)
    return value if isinstance(value, list) else []


def _creators(data: Mapping[str, Any]) -> list[dict[str, str]]:
    """``[{"type", "name"}]`` from ``data.creators``: members that are not objects, and name parts that are
    not strings, are ignored."""
    result = []
    for creator in _list(data, "creators"):
        if not isinstance(creator, dict):
            continue
        name = _text(creator.get("name")) or ", ".join(
            p for p in (_text(creator.get("lastName")), _text(creator.get("firstName"))) if p)
        if name:
            result.append({"type": _text(creator.get("creatorType")) or "", "name": name})
    return result


def _tags(*datas: Mapping[str, Any]) -> list[str]:
    """Tag names from each ``data.tags`` (objects with a string ``tag``, or strings), first seen first;
    anything else is ignored."""
    seen: dict[str, None] = {}
    for data in datas:
        for tag in _list(data, "tags"):
            text = tag.get("tag") if isinstance(tag, dict) else tag
            if isinstance(text, str) and text:
                seen.setdefault(text, None)
    return list(seen)


def _text(value: Any) -> str | None:
    """``value`` when it is a non-empty string, else ``None`` (a number, list or object is ignored)."""
    return value if isinstance(value, str) and value else None


_LONE_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def _storable(text: str | None) -> str | None:
    """``text`` without U+0000 and with lone surrogates (a JSON ``\\ud800`` escape) as U+FFFD: what a
    PostgreSQL TEXT column takes. For display fields only (titles), never for a path or a key."""
    return None if text is None else _LONE_SURROGATE_RE.sub("\ufffd", text.replace("\x00", ""))


def _content_type(value: Any) -> str | None:
    """A ``contentType`` that looks like a media type (printable ASCII, at most 255 characters), else ``None``."""
    text = _text(value)
    return text if text and len(text) <= 255 and text.isascii() and text.isprintable() else None


def _is_user_id(value: Any) -> bool:
    """A Zotero user id as the API sends it: a JSON integer (not a bool), non-negative."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_VERSION


# --------------------------------------------------------------------------------------------------
# The source
# --------------------------------------------------------------------------------------------------


@dataclass
class _Pages:
    """What a paged listing returned: items by key (last wins), the announced total, the library
    versions seen, how many pages were read and the error that stopped it, if any."""

    items: dict[str, dict[str, Any]] = field(default_factory=dict)
    received: int = 0
    total: int | None = None
    versions: list[int] = field(default_factory=list)
    pages: int = 0
    failure: SourceError | None = None
    skipped: list[tuple[str | None, str]] = field(default_factory=list)
    """Malformed items left out, ``(key or None, "<label>: <why>")``: the listing is then not complete."""

    @property
    def error(self) -> str | None:
        """The failure's message, if the listing stopped early."""
        return str(self.failure) if self.failure else None

    def problem(self) -> str | None:
        """Why this listing cannot be trusted as complete, or ``None``."""
        if self.error:
            return f"listing incomplete: {self.error}"
        if self.total is None:
            return "the server sent no Total-Results header"
        if self.received < self.total:
            return f"listing came up short: {self.received} of {self.total} items (Total-Results)"
        if len(set(self.versions)) > 1:
            return (f"the library changed during the listing (Last-Modified-Version "
                    f"{self.versions[0]} -> {self.versions[-1]})")
        if self.skipped:
            return _skipped_reason(self.skipped)
        return None


def _skipped_reason(skipped: Sequence[tuple[str | None, str]]) -> str:
    """``"2 malformed Zotero item(s) skipped (first: 'AB': 'data' is not a JSON object)"``."""
    return f"{len(skipped)} malformed Zotero item(s) skipped (first: {skipped[0][1]})"


class ZoteroSource:
    """A Zotero user or group library as a ``Source`` (see the module docstring for the rules).

    ``library``: ``"users/<id>"`` or ``"groups/<id>"`` (``ValueError`` otherwise). ``api_key``: the
    Zotero API key (``None`` for public libraries and the local API). ``api_url``: the API base URL,
    default ``https://api.zotero.org``; ``http://127.0.0.1:23119/api`` selects Zotero 7's local API.
    ``linked_files_root``: the mount holding ``linked_file`` attachments. ``path_prefix_map``:
    recorded path prefix -> local directory. ``name``: defaults to ``"zotero:<library>"``.
    ``timeout_s``: per request (seconds). ``max_attempts``: tries per request (>= 1) for 429/5xx and
    transport errors. ``max_wait_s``: cap on each wait between tries (seconds). ``page_size``: items
    per listing page (1-100). ``access_proof_s``: how recent (seconds) an answer to one of the library's
    own requests must be to stand in for the key check of the next permission read (module docstring);
    0 turns that off.

    Not safe for concurrent use from several threads without its internal lock: every API call holds
    it, so calls are serialised.
    """

    def __init__(self, library: str, *, api_key: str | None = None, api_url: str | None = None,
                 linked_files_root: str | os.PathLike[str] | None = None,
                 path_prefix_map: Mapping[str, str | os.PathLike[str]] | None = None,
                 name: str | None = None, timeout_s: float = 30.0, max_attempts: int = 5,
                 max_wait_s: float = 60.0, page_size: int = _MAX_PAGE, access_proof_s: float = 120.0) -> None:
        match = _LIBRARY_RE.match((library or "").strip().strip("/"))
        if not match:
            raise ValueError(f"Zotero library must look like 'users/<id>' or 'groups/<id>', got {library!r}")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not 1 <= page_size <= _MAX_PAGE:
            raise ValueError(f"page_size must be between 1 and {_MAX_PAGE}")
        self.library = f"{match[1]}/{match[2]}"
        self.library_type = "user" if match[1] == "users" else "group"
        self.library_id = match[2]
        self.name = name or f"zotero:{self.library}"
        self.api_url = (api_url or DEFAULT_API_URL).strip().rstrip("/")
        parts = urlsplit(self.api_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"Zotero API URL must be an http(s) URL, got {self.api_url!r}")
        loopback = parts.hostname in _LOOPBACK_HOSTS
        self.local_api = loopback and parts.path.rstrip("/") == "/api"
        self.page_size = page_size
        self.resolver = LinkedFileResolver(
            root=Path(linked_files_root).expanduser() if linked_files_root else None,
            prefix_map={str(k): str(v) for k, v in (path_prefix_map or {}).items()},
        )
        self._lock = threading.RLock()
        transport = _RetryingTransport(httpx2.HTTPTransport(trust_env=not loopback), timeout_s=timeout_s,
                                       max_attempts=max_attempts, max_wait_s=max_wait_s)
        transport.library_path = f"{parts.path.rstrip('/')}/{self.library}/"
        self._transport = transport
        self.access_proof_s = access_proof_s
        self._client = httpx2.Client(transport=transport, follow_redirects=True, timeout=timeout_s,
                                     trust_env=not loopback)
        self._zot = pyzotero.Zotero(self.library_id, self.library_type, api_key, client=self._client,
                                  local=self.local_api)
        self._zot.endpoint = self.api_url
        self._has_key = bool(api_key)

    @classmethod
    def from_env(cls, library: str, *, name: str | None = None,
                 environ: Mapping[str, str] | None = None, **options: Any) -> ZoteroSource:
        """Build from the environment: ``ZOTERO_API_KEY``, ``ZOTERO_API_URL`` (default the public API),
        ``RAG_ZOTERO_LINKED_ROOT`` and ``RAG_ZOTERO_PATH_MAP`` (see ``parse_path_prefix_map``).
        ``environ`` defaults to ``os.environ``; ``options`` go to the constructor (``timeout_s``, ...)."""
        env = os.environ if environ is None else environ
        return cls(
            library,
            api_key=env.get("ZOTERO_API_KEY") or None,
            api_url=env.get("ZOTERO_API_URL") or None,
            linked_files_root=env.get("RAG_ZOTERO_LINKED_ROOT") or None,
            path_prefix_map=parse_path_prefix_map(env.get("RAG_ZOTERO_PATH_MAP")),
            name=name,
            **options,
        )

    def __repr__(self) -> str:
        return f"ZoteroSource(name={self.name!r}, api_url={self.api_url!r})"

    def close(self) -> None:
        """Close the HTTP connections."""
        self._client.close()

    # ---------------------------------------------------------------- cursor

    def _cursor(self, version: int) -> str:
        return json.dumps({"format": _CURSOR_FORMAT, "library": self.library, "api": self.api_url,
                           "version": version}, sort_keys=True, separators=(",", ":"))

    def _cursor_version(self, cursor: str | None) -> int:
        if not cursor:
            raise ChangeFeedUnavailable("no Zotero version watermark stored yet: full listing needed")
        try:
            parsed = json.loads(cursor)
            version = int(parsed["version"])
            ok = (parsed.get("format") == _CURSOR_FORMAT and parsed.get("library") == self.library
                  and parsed.get("api") == self.api_url and version >= 0)
        except (ValueError, TypeError, KeyError, OverflowError):
            raise ChangeFeedUnavailable("unreadable Zotero cursor: full listing needed") from None
        if not ok:
            raise ChangeFeedUnavailable("the cursor belongs to another Zotero library or API URL: full listing needed")
        return version

    # ---------------------------------------------------------------- HTTP plumbing

    def _error(self, what: str, exc: BaseException) -> SourceError:
        """A ``SourceError`` for a failed call; never carries request headers (the key)."""
        transient = not isinstance(exc, (pyzotero.UserNotAuthorisedError, pyzotero.ResourceNotFoundError,
                                         pyzotero.UnsupportedParamsError))
        if isinstance(exc, pyzotero.PyZoteroError):
            detail = " ".join(str(exc).split())  # pyzotero: code, URL, method, body (no headers)
        else:
            detail = f"{exc.__class__.__name__}: {exc}"
        return SourceError(f"Zotero {what} failed: {detail[:400]}", transient=transient)

    def _last_header_int(self, name: str) -> int | None:
        value = self._zot.request.headers.get(name) if self._zot.request is not None else None
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None

    def _pages(self, first: Callable[[], Any]) -> _Pages:
        """Read a paged pyzotero listing to the end (following ``Link: rel="next"``). A page that is not a
        JSON list stops it with ``ListingIncompleteError``; a malformed item (``_malformed``) is left out with
        a log line naming it and recorded in ``skipped``."""
        result = _Pages()
        try:
            page = first()
            while True:
                if not isinstance(page, list):
                    raise ListingIncompleteError(f"Zotero page {result.pages + 1} of the listing is not a JSON "
                                                 f"list ({type(page).__name__})")
                result.pages += 1
                if result.total is None:
                    result.total = self._last_header_int("Total-Results")
                version = self._last_header_int("Last-Modified-Version")
                if version is not None:
                    result.versions.append(version)
                for index, item in enumerate(page):
                    result.received += 1
                    problem = _malformed(item)
                    if problem is not None:
                        label = _label(item, index)
                        log.warning("Zotero %s: skipped a malformed item %s: %s", self.name, label, problem)
                        result.skipped.append((_key(item), f"{label}: {problem}"))
                        continue
                    result.items[_key(item)] = item
                if not (self._zot.links and self._zot.links.get("next")):
                    break
                page = self._zot.follow()
        except ListingIncompleteError as exc:
            result.failure = exc
        except (pyzotero.PyZoteroError, httpx2.HTTPError, _RetryableStatus, SourceError, ValueError,
                RecursionError) as exc:
            result.failure = self._error(f"page {result.pages + 1} of the listing", exc)
        return result

    def _items_by_key(self, keys: Iterable[str], skipped: list[tuple[str | None, str]] | None = None) -> dict[str, dict[str, Any]]:
        """Fetch items (trashed ones included) by key, 50 per request; absent keys are left out, malformed
        ones too (added to ``skipped``). Raises ``ListingIncompleteError``."""
        found: dict[str, dict[str, Any]] = {}
        ordered = sorted(set(keys))
        for start in range(0, len(ordered), _KEY_BATCH):
            batch = ordered[start:start + _KEY_BATCH]
            pages = self._pages(lambda b=batch: self._zot.items(
                itemKey=",".join(b), includeTrashed=1, limit=_KEY_BATCH))
            if pages.error or (pages.total is not None and pages.received < pages.total):
                raise ListingIncompleteError(f"fetching changed Zotero items: {pages.problem()}")
            found.update(pages.items)
            if skipped is not None:
                skipped.extend(pages.skipped)
        return found

    def _children(self, key: str, skipped: list[tuple[str | None, str]] | None = None) -> dict[str, dict[str, Any]]:
        """The child items of ``key`` (trashed ones included); malformed ones are added to ``skipped``.
        Raises ``ListingIncompleteError``."""
        pages = self._pages(lambda: self._zot.children(key, includeTrashed=1, limit=self.page_size))
        if pages.error or (pages.total is not None and pages.received < pages.total):
            raise ListingIncompleteError(f"listing the children of Zotero item {key}: {pages.problem()}")
        if skipped is not None:
            skipped.extend(pages.skipped)
        return pages.items

    # ---------------------------------------------------------------- documents

    def _uri(self, key: str) -> str:
        if self.library_type == "user":
            return f"zotero://select/library/items/{key}"
        return f"zotero://select/groups/{self.library_id}/items/{key}"

    def _to_document(self, attachment: Mapping[str, Any], parent: Mapping[str, Any]) -> SourceDocument:
        """The document for one attachment item, with its parent item's bibliographic metadata.

        Fields of the wrong JSON type are ignored (logged once per item, naming it and the fields): a
        ``linkMode`` that is not a string is an unknown link mode (``skip_reason``); text fields (title,
        filename, path, contentType, md5, url, dateModified) that are not strings are ``None``; ``tags``,
        ``creators``, ``collections`` that are not lists are empty, and their members of the wrong type are
        dropped; a ``version`` that is not a non-negative integer counts as 0; an enclosure ``length`` that
        is not a non-negative integer gives ``size=None``."""
        data, pdata = _data(attachment), _data(parent)
        key = _key(attachment) or ""
        wrong = _wrong_typed(attachment) + [f"parent {name}" for name in _wrong_typed(parent)
                                            if parent is not attachment]
        if wrong:
            log.warning("Zotero %s: item %r: ignored field(s) of the wrong type: %s", self.name, key[:40],
                        ", ".join(wrong))
        raw_mode = data.get("linkMode")
        mode = raw_mode if isinstance(raw_mode, str) else None
        version = str(_version(attachment))
        size = None
        links = attachment.get("links")
        enclosure = links.get("enclosure") if isinstance(links, dict) else None
        length = enclosure.get("length") if isinstance(enclosure, dict) else None
        if isinstance(length, int) and not isinstance(length, bool) and 0 <= length <= _MAX_VERSION:
            size = length
        modified_at = _parse_time(data.get("dateModified"))
        recorded_path = _text(data.get("path"))
        skip_reason = None
        if mode in FETCHED_LINK_MODES:
            pass
        elif mode == "linked_file":
            path, skip_reason = self.resolver.resolve(recorded_path or "")
            stat = None
            if path is not None:
                try:
                    stat = path.stat()
                    stat_time = datetime.fromtimestamp(stat.st_mtime, tz=timezone.utc)
                except (OSError, OverflowError, ValueError) as exc:  # gone since resolve(); a wild mtime
                    stat, skip_reason = None, f"{LINKED_NOT_REACHABLE}: {path} ({exc.__class__.__name__})"
            if stat is not None:
                size, version = stat.st_size, f"{version}:{stat.st_mtime_ns}:{stat.st_size}"
                modified_at = stat_time
            else:
                version = f"{version}:unreachable"
        elif mode == "linked_url":
            skip_reason = "Zotero linked_url attachment: a link to a web page, no file is stored"
        elif mode == "embedded_image":
            skip_reason = "Zotero embedded_image attachment: an image inside a note, not a document"
        else:
            skip_reason = f"unknown Zotero attachment link mode {repr(raw_mode)[:60]}: not ingested"
        parent_title = _text(pdata.get("title"))
        metadata: dict[str, Any] = {
            "library": self.library,
            "item_key": _key(parent),
            "item_type": _text(pdata.get("itemType")),
            "title": parent_title,
            "creators": _creators(pdata),
            "year": _year(parent),
            "doi": _doi(pdata),
            "tags": _tags(pdata, data) if parent is not attachment else _tags(data),
            "collections": [c for c in _list(pdata, "collections") if isinstance(c, str)],
            "attachment_title": _text(data.get("title")),
            "filename": _text(data.get("filename")),
            "link_mode": mode,
            "content_type": _content_type(data.get("contentType")),
            "md5": _text(data.get("md5")),
            "url": _text(data.get("url")) or _text(pdata.get("url")),
            "path": recorded_path if mode == "linked_file" else None,
            "attachment_version": _version(attachment),
            "item_version": _version(parent),
        }
        return SourceDocument(
            source_id=key,
            title=_storable(parent_title or _text(data.get("title")) or _text(data.get("filename")) or key),
            uri=self._uri(key),
            mime_type=_content_type(data.get("contentType")),
            size=size,
            modified_at=modified_at,
            source_version=version,
            content_sha256=None,
            metadata=metadata,
            skip_reason=skip_reason,
        )

    def _documents(self, items: Mapping[str, dict[str, Any]],
                   parents: Mapping[str, dict[str, Any]]) -> tuple[list[SourceDocument], list[str]]:
        """Documents for the attachments among ``items`` whose parent (looked up in ``parents``) is
        present and not trashed; also the keys of attachments that are gone (trashed themselves, or
        their parent trashed or missing). A malformed item (``_malformed``; ``_pages`` already leaves
        those out) is neither: it is skipped with a log line."""
        documents, gone = [], []
        for key, item in items.items():
            if (problem := _malformed(item)) is not None:
                log.warning("Zotero %s: skipped a malformed item %r: %s", self.name, str(key)[:40], problem)
                continue
            if _item_type(item) != "attachment":
                continue
            parent_key = _data(item).get("parentItem")
            parent = item if not parent_key else parents.get(parent_key)
            if parent is not None and _malformed(parent) is not None:
                log.warning("Zotero %s: skipped attachment %r: its parent is malformed", self.name, key[:40])
                continue
            if _trashed(item) or parent is None or _trashed(parent):
                gone.append(key)
                continue
            documents.append(self._to_document(item, parent))
        return documents, gone

    # ---------------------------------------------------------------- Source protocol

    def list_documents(self) -> Inventory:
        """Every attachment of the library (trash excluded) as a document; see the module docstring.

        Raises ``SourceError`` when not even the first page could be read (``transient`` False for a
        rejected key or an unknown library); later failures give ``complete=False`` with the reason.
        """
        with self._lock:
            pages = self._pages(lambda: self._zot.items(limit=self.page_size))
        if pages.pages == 0 and pages.failure is not None:
            raise pages.failure
        problem = pages.problem()
        live = {k: v for k, v in pages.items.items() if not _trashed(v)}
        documents, _ = self._documents(live, live)
        documents.sort(key=lambda d: d.source_id)
        if problem:
            log.warning("Zotero %s: incomplete listing: %s", self.name, problem)
        return Inventory(
            documents=documents,
            complete=problem is None,
            incomplete_reason=problem,
            expected_total=pages.total,
            cursor=self._cursor(pages.versions[0]) if problem is None and pages.versions else None,
        )

    def changes(self, cursor: str | None) -> ChangeSet:
        """Upserts and deletions since ``cursor`` (see the module docstring).

        Raises ``ChangeFeedUnavailable`` (do a full listing), ``ListingIncompleteError`` when part of
        the change set could not be read (nothing of it should be applied), ``SourceError`` otherwise.
        Malformed items (``_malformed``, or a changed key that is not an item key) are left out with a log
        line and give ``complete=False`` with the reason: the rest is applied, nothing is deleted and the
        cursor stays where it was.
        """
        since = self._cursor_version(cursor)
        skipped: list[tuple[str | None, str]] = []
        with self._lock:
            probe = self._changed_versions(since)
            if probe is None:
                log.info("Zotero %s: not modified since version %d", self.name, since)
                return ChangeSet(upserts=[], deleted_ids=[], next_cursor=self._cursor(since))
            changed, library_version = probe
            for key in [k for k in changed if not _ITEM_KEY_RE.match(k)]:
                log.warning("Zotero %s: skipped a changed item with a malformed key %r", self.name, key[:40])
                skipped.append((None, f"{key[:40]!r}: no usable item key"))
                del changed[key]
            deleted = self._deleted_keys(since)
            items = self._items_by_key(changed, skipped)
            changed_parents = {k: v for k, v in items.items()
                               if _item_type(v) not in _SKIPPED_ITEM_TYPES and _item_type(v) != "attachment"}
            candidates = {k: v for k, v in items.items() if _item_type(v) == "attachment"}
            for parent_key in changed_parents:
                for key, child in self._children(parent_key, skipped).items():
                    if _item_type(child) == "attachment" and _version(child) >= _version(candidates.get(key, {})):
                        candidates[key] = child
            wanted = {_data(a)["parentItem"] for a in candidates.values() if _data(a).get("parentItem")}
            parents = dict(changed_parents)
            parents.update(self._items_by_key(wanted - parents.keys(), skipped))
            upserts, gone = self._documents(candidates, parents)
            # an attachment whose parent was malformed is not known to be gone: not a deletion
            malformed_keys = {key for key, _ in skipped if key}
            gone = [key for key in gone if _data(candidates[key]).get("parentItem") not in malformed_keys]
        upserted = {d.source_id for d in upserts}
        deleted_ids = sorted((set(deleted) | set(gone)) - upserted)
        log.info("Zotero %s: %d changed items since version %d -> %d: %d upserts, %d deletions",
                 self.name, len(changed), since, library_version, len(upserts), len(deleted_ids))
        reason = _skipped_reason(skipped) if skipped else None
        if reason:
            log.warning("Zotero %s: incomplete change set: %s", self.name, reason)
        return ChangeSet(upserts=sorted(upserts, key=lambda d: d.source_id), deleted_ids=deleted_ids,
                         next_cursor=self._cursor(library_version), complete=reason is None,
                         incomplete_reason=reason)

    def _changed_versions(self, since: int) -> tuple[dict[str, int], int] | None:
        """``GET <library>/items?since=V&format=versions&includeTrashed=1`` with
        ``If-Modified-Since-Version: V``: ``None`` on 304, else (key -> version, library version)."""
        url = f"{self.api_url}/{self.library}/items"
        headers = {**self._zot.default_headers(), "If-Modified-Since-Version": str(since)}
        params = {"since": str(since), "format": "versions", "includeTrashed": "1"}
        try:
            response = self._client.get(url, params=params, headers=headers)
        except (httpx2.HTTPError, _RetryableStatus) as exc:
            raise self._error("reading changed item versions", exc) from exc
        if response.status_code == 304:
            # a library reset below the watermark also answers 304; its version header tells
            current = response.headers.get("Last-Modified-Version", "")
            if current.isdigit() and int(current) < since:
                raise ChangeFeedUnavailable(
                    f"the Zotero library version went back from {since} to {current} (library reset?): "
                    "full listing needed")
            return None
        if response.status_code in (400, 404, 410, 412):
            raise ChangeFeedUnavailable(
                f"the Zotero API rejected since={since} (HTTP {response.status_code}): full listing needed")
        if response.status_code != 200:
            raise SourceError(f"Zotero changed-versions request answered HTTP {response.status_code}",
                              transient=response.status_code not in (401, 403))
        try:
            library_version = int(response.headers["Last-Modified-Version"])
            versions = response.json()
            changed = {str(k): int(v) for k, v in versions.items()}
        except (KeyError, ValueError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
            raise SourceError(f"malformed Zotero changed-versions answer: {exc!r}") from exc
        if library_version < since:
            raise ChangeFeedUnavailable(
                f"the Zotero library version went back from {since} to {library_version} (library reset?): "
                "full listing needed")
        return changed, library_version

    def _deleted_keys(self, since: int) -> list[str]:
        """Item keys in ``GET <library>/deleted?since=V``."""
        try:
            deleted = self._zot.deleted(since=since)
        except (pyzotero.UnsupportedParamsError, pyzotero.ResourceNotFoundError, pyzotero.PreConditionFailedError) as exc:
            raise ChangeFeedUnavailable(f"the Zotero API rejected /deleted?since={since}: full listing needed") from exc
        except (pyzotero.PyZoteroError, httpx2.HTTPError, _RetryableStatus, ValueError, RecursionError) as exc:
            raise self._error("reading deletions", exc) from exc
        items = deleted.get("items") if isinstance(deleted, dict) else None
        if not isinstance(items, list):
            raise SourceError("malformed Zotero /deleted answer: no 'items' list")
        keys = [k for k in items if isinstance(k, str)]
        if len(keys) < len(items):  # a tombstone that is not a string names no document: nothing to delete
            log.warning("Zotero %s: ignored %d entries of /deleted that are not item keys", self.name,
                        len(items) - len(keys))
        return keys

    def fetch(self, document: SourceDocument) -> bytes:
        """The attachment's bytes (``fetch_to`` into memory; the pipeline streams). Same errors as ``fetch_to``."""
        return fetch_via(self.fetch_to, document)

    def fetch_to(self, document: SourceDocument, out: BinaryIO) -> None:
        """Write the attachment's bytes to ``out`` in pieces of at most ``FETCH_PIECE_BYTES`` as they arrive:
        streamed from ``GET <library>/items/<key>/file`` (``imported_*``, following its redirect to the
        storage server, see ``_download``) or read from the mount (``linked_file``).

        Raises ``DocumentSkipped`` for documents with a ``skip_reason``, a linked file that is gone and
        a file the Zotero server does not have (404); ``SourceError`` for everything else (transient
        unless the key was refused or the request rejected). What ``out.write`` raises (the size cap)
        propagates unchanged and stops the read; nothing is retried once a byte was written.
        """
        if document.skip_reason:
            raise DocumentSkipped(document.skip_reason)
        metadata = document.metadata or {}
        mode = metadata.get("link_mode")
        if mode == "linked_file":
            self._read_linked(_text(metadata.get("path")) or "", out)
            return
        if not (isinstance(mode, str) and mode in FETCHED_LINK_MODES):
            raise DocumentSkipped(f"unknown Zotero attachment link mode {repr(mode)[:60]}: not ingested")
        with self._lock:
            self._download(document.source_id, out)

    def _read_linked(self, recorded: str, out: BinaryIO) -> None:
        """Copy the linked file ``recorded`` (resolved and contained by ``self.resolver``) to ``out`` in pieces.
        ``DocumentSkipped`` when it cannot be reached or is gone; ``SourceError`` for another ``OSError``."""
        path, reason = self.resolver.resolve(recorded)
        if path is None:
            raise DocumentSkipped(reason or LINKED_NOT_REACHABLE)

        def failed(exc: OSError) -> SourceError:
            return SourceError(f"reading linked file {path} failed: {exc.__class__.__name__}")

        try:
            # O_NOFOLLOW: the resolved path has no symlink left; one swapped in since is refused
            handle = os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)), "rb")
        except FileNotFoundError:
            raise DocumentSkipped(f"{LINKED_NOT_REACHABLE}: {path} disappeared") from None
        except OSError as exc:
            raise failed(exc) from exc
        with handle:
            copy_pieces(handle, out, failed)

    def _download(self, key: str, out: BinaryIO) -> None:
        """Stream ``GET <api>/<library>/items/<key>/file`` to ``out`` (see ``fetch_to``).

        The request goes through the retrying client (429/5xx and transport errors before the body are
        retried by ``_RetryingTransport``; an error while the body arrives is not, as bytes may already be
        written). Redirects (the API answers ``302`` to the storage server, S3 on zotero.org) are followed
        here, at most ``_MAX_REDIRECTS``: the ``Authorization`` header (the key) goes only to the API's own
        origin (scheme, host, port); a redirect from https to http, or to another scheme, is refused.
        Status mapping: 404 -> ``DocumentSkipped``; 400/401/403 -> ``SourceError(transient=False)``; any
        other non-200 -> transient ``SourceError``. Messages name the attachment, status or error class,
        never the key, a URL query (S3 signatures) or a body."""
        what = f"download of attachment {key}"
        url = httpx2.URL(f"{self.api_url}/{self.library}/items/{quote(key, safe='')}/file")
        api_origin = (url.scheme, url.host, url.port)
        api_headers = self._zot.default_headers()
        foreign_headers = {k: v for k, v in api_headers.items() if k.lower() not in ("authorization", "zotero-api-key")}
        for _hop in range(_MAX_REDIRECTS + 1):
            headers = api_headers if (url.scheme, url.host, url.port) == api_origin else foreign_headers
            try:
                with self._client.stream("GET", url, headers=headers, follow_redirects=False) as response:
                    if response.is_redirect:
                        url = self._redirect_target(url, response.headers.get("Location", ""), what)
                        continue
                    if response.status_code == 404:
                        raise DocumentSkipped("the Zotero server has no file for this attachment (HTTP 404)")
                    if response.status_code != 200:
                        hint = {401: " (the API key was refused)", 403: " (the API key was refused or cannot "
                                "read it)"}.get(response.status_code, "")
                        raise SourceError(f"Zotero {what} failed: HTTP {response.status_code}{hint}",
                                          transient=response.status_code not in (400, 401, 403))
                    pieces = response.iter_bytes(FETCH_PIECE_BYTES)
                    while (piece := next(pieces, None)) is not None:
                        out.write(piece)  # the size cap raises here: it passes, and the with closes the stream
                    return
            except (httpx2.HTTPError, _RetryableStatus) as exc:
                detail = f"{exc.__class__.__name__}: {exc}"
                detail = re.sub(r"\?\S*", "", detail)  # an S3 signature must not reach a message or log
                raise SourceError(f"Zotero {what} failed: {detail[:300]}") from None
        raise SourceError(f"Zotero {what} failed: more than {_MAX_REDIRECTS} redirects")

    @staticmethod
    def _redirect_target(current: httpx2.URL, location: str, what: str) -> httpx2.URL:
        """The URL a redirect from ``current`` points to; ``SourceError`` for none, an invalid one, another
        scheme than http(s), or https -> http (the URL is never put in the message: it may carry a signature)."""
        if not location:
            raise SourceError(f"Zotero {what} failed: a redirect without a Location")
        try:
            target = current.join(location)
        except (httpx2.InvalidURL, ValueError):
            raise SourceError(f"Zotero {what} failed: redirected to an invalid URL", transient=False) from None
        if target.scheme not in ("http", "https") or not target.host:
            raise SourceError(f"Zotero {what} failed: redirected to a {target.scheme or 'relative'!s:.10} URL",
                              transient=False)
        if current.scheme == "https" and target.scheme == "http":
            raise SourceError(f"Zotero {what} failed: redirected from https to plain http", transient=False)
        return target

    # ---------------------------------------------------------------- permissions

    @property
    def owner_principal(self) -> str | None:
        """``user:zotero:<id>`` of a user library's owner; ``None`` for a group library."""
        return user_principal(f"zotero:{self.library_id}") if self.library_type == "user" else None

    @property
    def group_principal(self) -> str | None:
        """``group:<self.name>:groups/<id>`` of a group library; ``None`` for a user library."""
        return group_principal(self.name, self.library) if self.library_type == "group" else None

    def _get_json(self, path: str, what: str, params: Mapping[str, str] | None = None) -> Any:
        """``GET <api>/<path>`` through the retrying client, the key in the header; the parsed JSON.

        Raises ``SourceError`` whose message names ``what`` and the status (never the key or the body)."""
        try:
            response = self._client.get(f"{self.api_url}/{path}", params=dict(params or {}),
                                        headers=self._zot.default_headers())
        except (httpx2.HTTPError, _RetryableStatus) as exc:
            detail = str(exc) if isinstance(exc, _RetryableStatus) else exc.__class__.__name__
            raise SourceError(f"{what} failed: {detail}") from None
        if response.status_code != 200:
            meaning = {403: " (the API key was refused or cannot read it)", 404: " (not found)"}
            raise SourceError(f"{what} answered HTTP {response.status_code}{meaning.get(response.status_code, '')}",
                              transient=response.status_code not in (403, 404))
        if (params or {}).get("format") == "keys":
            return response.text
        try:
            return response.json()
        except (ValueError, RecursionError):  # not JSON, or nested too deep to parse
            raise SourceError(f"{what} answered something that is not JSON") from None

    def _access_problem(self) -> str | None:
        """Why this source's key (or, without one, this client) cannot read the library; ``None`` if it can.
        A 200/304 from the library's own requests within ``access_proof_s`` answers it without a request,
        once (module docstring)."""
        proof, self._transport.library_ok_at = self._transport.library_ok_at, None
        if proof is not None and self.access_proof_s > 0 and time.monotonic() - proof <= self.access_proof_s:
            return None
        if not self._has_key or self.local_api:
            self._get_json(f"{self.library}/items/top", f"reading {self.library}",
                           {"limit": "1", "format": "keys"})
            return None
        key = self._get_json("keys/current", "the API key check (GET /keys/current)")
        if not isinstance(key, Mapping):
            return "the API key check (GET /keys/current) answered no JSON object"
        access = key.get("access") if isinstance(key.get("access"), Mapping) else {}
        if self.library_type == "user":
            user_id = key.get("userID")
            if not (_is_user_id(user_id) and str(user_id) == self.library_id):
                shown = str(user_id)[:20] if _is_user_id(user_id) else f"of type {type(user_id).__name__}"
                return f"the API key belongs to Zotero user {shown}, not to the owner of {self.library}"
            user_access = access.get("user") if isinstance(access.get("user"), Mapping) else {}
            if user_access.get("library") is not True:
                return f"the API key has no read access to {self.library} (access.user.library is not granted)"
            return None
        groups = access.get("groups") if isinstance(access.get("groups"), Mapping) else {}
        entry = groups.get(self.library_id)
        entry = entry if isinstance(entry, Mapping) else groups.get("all")
        if not (isinstance(entry, Mapping) and entry.get("library") is True):
            return (f"the API key has no read access to {self.library} (neither access.groups[{self.library_id}] "
                    "nor access.groups.all grants library)")
        return None

    def _group_data(self) -> Mapping[str, Any]:
        """``data`` of ``GET /groups/<id>``, checked: it names this group and has its owner and type.
        Raises ``SourceError``."""
        what = f"reading group {self.library_id} (GET /groups/{self.library_id})"
        body = self._get_json(f"groups/{self.library_id}", what)
        data = body.get("data") if isinstance(body, Mapping) else None
        if not isinstance(data, Mapping):
            raise SourceError(f"{what} answered no 'data' object")
        if str(data.get("id", body.get("id"))) != self.library_id:
            raise SourceError(f"{what} answered another group ({str(data.get('id'))[:20]})")
        if not isinstance(data.get("type"), str) or not _is_user_id(data.get("owner")):
            raise SourceError(f"{what} answered a group without 'type' or 'owner'")
        return data

    def library_scope(self) -> Scope:
        """Who may read this library's documents (see the module docstring); ``Scope.unreadable`` with
        the reason when that cannot be read. One key check, plus ``/groups/<id>`` for a group."""
        if self.local_api and self.library_type == "user" and self.library_id == "0":
            return Scope.unreadable(f"Zotero {self.library} on the local API does not say which Zotero user owns "
                                    "the library: configure users/<your userID>")
        with self._lock:
            try:
                problem = self._access_problem()
                if problem is None and self.library_type == "group":
                    data = self._group_data()
            except SourceError as exc:
                problem = str(exc)
            except (TypeError, ValueError, KeyError, AttributeError) as exc:  # an answer of a shape not foreseen
                problem = f"the permission answer could not be read ({exc.__class__.__name__})"
        if problem is not None:
            log.warning("Zotero %s: permissions unreadable: %s", self.name, problem)
            return Scope.unreadable(f"Zotero {self.library}: {problem}")
        if self.library_type == "user":
            return Scope.of({self.owner_principal})
        principals = {self.group_principal}
        if data.get("type") in PUBLIC_GROUP_TYPES and data.get("libraryReading") == "all":
            principals.add(EVERYONE)
        return Scope.of(principals)

    def permissions(self, documents: Sequence[SourceDocument]) -> dict[str, Scope]:
        """``{source_id: Scope}``: the library's scope (``library_scope``) for every document, or every
        document unreadable with the reason when it cannot be read; a document whose ``metadata.library``
        names another library is unreadable. Never raises; no request when ``documents`` is empty."""
        documents = list(documents)
        if not documents:
            return {}
        scope = self.library_scope()
        result: dict[str, Scope] = {}
        for document in documents:
            library = (document.metadata or {}).get("library")
            if library is not None and library != self.library:
                result[document.source_id] = Scope.unreadable(
                    f"the document belongs to Zotero library {str(library)[:40]}, not to {self.library}")
            else:
                result[document.source_id] = scope
        return result

    def group_members(self, groups: Collection[str]) -> GroupMembers:
        """Members of the group principals asked for: this group library's own principal expands to
        ``user:zotero:<id>`` of its owner, admins and members (``GET /groups/<id>``); a failed read puts it
        in ``errors`` with the reason; any other group (this source issues no other) is in ``errors``.
        Never raises."""
        members: dict[str, frozenset[str]] = {}
        errors: dict[str, str] = {}
        own = self.group_principal
        for group in groups:
            if group != own:
                errors[group] = f"not a group issued by Zotero source {self.name}"
        if own is None or own not in groups:
            return GroupMembers(members=members, errors=errors)
        try:
            with self._lock:
                data = self._group_data()
            admins, others = data.get("admins", []), data.get("members", [])
            if not (isinstance(admins, list) and isinstance(others, list)):
                raise SourceError("the group's admins/members are not lists")
            ids = [data["owner"], *admins, *others]
            if not all(_is_user_id(i) for i in ids):
                raise SourceError("the group's owner/admins/members are not all user ids")
            members[own] = frozenset(user_principal(f"zotero:{i}") for i in ids)
        except (SourceError, TypeError, ValueError, KeyError) as exc:
            log.warning("Zotero %s: group members unreadable: %s", self.name, exc)
            errors[own] = f"Zotero {self.library}: {exc}"
        return GroupMembers(members=members, errors=errors)

