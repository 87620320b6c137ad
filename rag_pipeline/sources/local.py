"""Local folder source: a directory tree on disk or a mounted NAS share.

Stable id = the path relative to the root, POSIX-style (``reports/2024/q1.pdf``).

A normal listing (``list_documents()``) reads no file content: it walks the directories and costs
one ``stat`` per file. Each document carries its size (bytes), its modification time and
``source_version = "<size in bytes>:<mtime in ns>"``; ``content_sha256`` and ``mime_type`` are
``None``. Content is read at fetch time (``fetch``): the core re-fetches, hashes and sniffs a file
only when its size or mtime changed, plus a periodic full verification, ``list_documents(verify=True)``,
which reads every file once for its SHA-256 and its MIME type from the content's magic bytes
(libmagic), not from the name. The core picks the verification interval (its setting
``RAG_LOCAL_VERIFY_INTERVAL_S``); the class attribute ``verifiable = True`` tells it that this
source's listing accepts ``verify=``.

Containment: an id names a file inside the root, never anything else. ``check_id`` accepts only
normalised relative POSIX paths (no leading ``/``, no empty, ``.`` or ``..`` segment, no NUL; on
Windows no backslash); ``resolve_inside`` then follows symlinks and refuses a path that ends up outside
the (resolved) root. ``fetch`` refuses, with ``SourceError(transient=False)`` (the core records the
document ``permanently_failed`` with the reason), an id that fails either check, one excluded by the
include/exclude patterns and anything but a regular file; it opens the resolved path one component at a
time with ``O_NOFOLLOW`` from the root, so a symlink swapped in after the check is not followed either.

Symlinks in the listing: a symlink whose fully resolved target is a regular file inside the root is
listed under the link's own path; a symlinked directory inside the root is descended under the link's
path, once: a directory already on the current path (a loop), or already entered through another link,
is not entered again (tracked by ``(st_dev, st_ino)``). A symlink that leaves the root is not listed,
and is logged once per process at WARNING (``<link> -> (outside)``: the target is not named): to the core
it looks like a file that was deleted, so a file indexed before it became such a link is removed by
the reconciliation, under the deletion guard. Dangling and self-looping links are not listed.

Permissions (``permissions(documents)``, ``group_members(groups)``). Each document is first checked as
``fetch`` checks it (``check_id``, the include/exclude patterns, ``resolve_inside``: a symlink is never
followed out of the root, a regular file only); a refused or unresolvable id is ``Scope.unreadable``
with the reason. Then one of two mappings, chosen by ``acl_file`` (``RAG_LOCAL_ACL_FILE``):

* POSIX (no ``acl_file``): from the resolved file's mode, only its *read* bits: owner ``r`` ->
  ``user:<login name>`` (``pwd``), group ``r`` -> ``group:<group name>`` (``grp``), other ``r`` ->
  ``everyone``; a bit that is off gives nothing. A uid or gid with no name in the system's databases
  gives ``user:uid:<n>`` / ``group:gid:<n>`` (kept, so the scope still says who owns the file; a query
  can name them). Reaching the file needs *search* (``x``) on every directory from the root (included)
  down to the file's folder, so the scope is intersected with each directory's ``x`` classes mapped the
  same way (a ``0750`` ``hr`` folder of group ``hr`` keeps a ``0644`` file inside it from ``everyone``:
  what remains is ``group:hr`` and the file's principals that are in it). An intersection of two
  different groups is written out as the users in both (from the group database at that time). An
  allow-list cannot *exclude*: a ``0044`` file is read by its owner too, through ``everyone`` (the
  owner may ``chmod`` it anyway). ``group_members``: ``group:<name>`` -> ``user:<login>`` of the
  group's listed members plus every user whose primary gid it is; ``group:gid:<n>`` -> the users whose
  primary gid is ``n``; a group unknown to the database is in ``errors``. Remote shares mounted
  without POSIX ownership (CIFS ``uid=``/``file_mode=``) show one owner and mode for every file: use
  an ACL file there.
* ACL file (YAML or JSON, read again on every call, ``load_acl_file``) overrides POSIX entirely::

      rules:            # the last rule whose glob matches a document's path wins
        - path: "**"
          principals: ["group:staff"]
        - path: "hr/**"
          principals: ["group:hr", "user:ada@example.com"]
      groups:           # group principal -> members (users or groups; nesting allowed)
        group:hr: ["user:bob@example.com", "group:hr-leads"]

  Globs are matched against the *resolved* path relative to the root (a symlink gets the rules of
  the file it points to), case-sensitively: ``*`` and ``?`` stay inside one path segment, ``[...]`` is
  a character class, a ``**`` segment matches any number of segments (``hr/**``: everything under
  ``hr``; ``**/*.pdf``: every PDF). A path no rule matches is readable by nobody (``Scope.unreadable``,
  naming the file). An empty ``principals`` list is a readable scope of nobody. Principals are checked
  with ``parse_principal``. ``group_members`` answers from ``groups`` only; a group not defined there is
  in ``errors``. An ACL file that cannot be read or is invalid (YAML syntax, unknown keys, a rule
  without ``path``/``principals``, a malformed glob, an invalid principal) makes every document
  unreadable and every group an error, with the reason; it never raises.

Errors. A directory that cannot be read part-way (or a root that is missing or not a directory)
makes the whole listing fail with ``ListingIncompleteError``, never a short inventory: we do not
know what is in a directory we cannot list, so the deletion guard must hold deletions back. A single
*file* never fails the listing: a file that vanished between the walk and its ``stat`` is simply
not listed; a file that cannot be ``stat``-ed (e.g. no search permission on its folder) is listed
without size, mtime or version; a file that cannot be read is listed normally (with
``verify=True``: without hash or MIME type), and its ``fetch`` raises ``SourceError``, which the
core records as that document's own failure. An unmounted share that shows as an empty directory
is caught by the deletion guard.
"""

from __future__ import annotations

import errno
import fnmatch
import grp
import hashlib
import logging
import os
import pwd
import re
import stat
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO

from rag_pipeline.permissions.principals import EVERYONE, parse_principal
from rag_pipeline.sources.base import (
    ChangeFeedUnavailable,
    ChangeSet,
    GroupMembers,
    Inventory,
    ListingIncompleteError,
    Scope,
    SourceDocument,
    SourceError,
    copy_pieces,
    fetch_via,
)

log = logging.getLogger(__name__)

DEFAULT_EXCLUDES = (".*", "*/.*", "~$*", "*/~$*", "*.tmp", "Thumbs.db", "*/Thumbs.db")
_READ_BLOCK = 1 << 20
# stat/open errors meaning "there is no regular file here (any more)": the entry is not listed.
_GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_SECURE_OPEN = hasattr(os, "O_NOFOLLOW") and hasattr(os, "O_DIRECTORY") and os.open in os.supports_dir_fd


class IdRefused(SourceError):
    """A document id this source will never read: ``why`` says which rule it breaks (absolute path,
    ``..``, NUL, not normalised, leaves the folder through a symlink, excluded, not a regular file).
    Never transient: the core records the document ``permanently_failed`` with the message."""

    def __init__(self, source_id: str, why: str) -> None:
        super().__init__(f"{source_id!r} refused: {why}", transient=False)
        self.source_id = source_id
        self.why = why


def sniff_mime(head: bytes) -> str:
    """MIME type of content from its first bytes (libmagic via python-magic); ``application/octet-stream``
    when unknown. Pure function of the bytes: the file name never enters."""
    if not head:
        return "application/x-empty"
    import magic

    return magic.from_buffer(head, mime=True) or "application/octet-stream"


def _digest(fh) -> tuple[str, bytes]:
    h = hashlib.sha256()
    head = b""
    while block := fh.read(_READ_BLOCK):
        if not head:
            head = block[:8192]
        h.update(block)
    return h.hexdigest(), head


def file_digest(path: Path) -> tuple[str, bytes]:
    """Return ``(hex SHA-256 of the file, its first 8 KiB)``; raises ``OSError``."""
    with path.open("rb") as fh:
        return _digest(fh)


def check_id(source_id: str) -> list[str]:
    """The path segments of a well-formed id (pure: no file system access). Raises ``IdRefused`` for an
    empty id, NUL, an absolute path, a backslash where it is a separator (Windows), an empty or ``.``
    segment (not normalised) and a ``..`` segment (leaves the source folder). On POSIX a backslash is an
    ordinary file-name character, as the listing reports it."""
    if not isinstance(source_id, str) or not source_id:
        raise IdRefused(str(source_id), "empty id")
    if "\x00" in source_id:
        raise IdRefused(source_id, "NUL in id")
    if source_id.startswith("/") or (os.sep == "\\" and (source_id[1:3] == ":\\" or source_id[1:2] == ":")):
        raise IdRefused(source_id, "absolute path")
    if "\\" in source_id and (os.sep == "\\" or os.altsep):
        raise IdRefused(source_id, "backslash in id")
    parts = source_id.split("/")
    if ".." in parts:
        raise IdRefused(source_id, "id leaves the source folder ('..')")
    if any(p in ("", ".") for p in parts):
        raise IdRefused(source_id, "not a normalised relative path")
    return parts


_UNDECODABLE_RE = re.compile(r"\\x([89a-f][0-9a-f])")
"""``\\xNN`` in an id: a byte of a file name that is not UTF-8 (``display_name``)."""


def display_name(name: str) -> str:
    """A file name as it appears in ids: ``name`` (from ``os.fsdecode``), with each byte that is not UTF-8
    (a lone surrogate ``\\udcNN``, which no database text can hold) written ``\\xNN``, e.g. Latin-1
    ``caf\\xe9.txt``. ``fs_name`` turns it back."""
    if not any("\udc80" <= c <= "\udcff" for c in name):
        return name
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def fs_name(directory: Path, segment: str) -> str:
    """The file name in ``directory`` an id segment stands for: the segment itself when it has no
    ``\\xNN`` or a file of that very name exists, else the name with those bytes (``display_name``
    reversed). Reads only ``lstat``."""
    if "\\x" not in segment or os.path.lexists(directory / segment):
        return segment
    return _UNDECODABLE_RE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), segment)


def fs_parts(root: Path, parts: Sequence[str]) -> list[str]:
    """``fs_name`` of each segment of a ``check_id``-ed id, walking from ``root``."""
    out: list[str] = []
    here = root
    for segment in parts:
        name = fs_name(here, segment)
        out.append(name)
        here = here / name
    return out


def _inside(path: Path, root: Path) -> bool:
    return path != root and path.is_relative_to(root)


def resolve_inside(root: Path, source_id: str) -> Path:
    """The file ``source_id`` names under ``root`` (an absolute, resolved directory), symlinks followed:
    ``check_id``, then the fully resolved path, which must lie inside ``root``. Raises ``IdRefused``
    (a malformed id, a symlink loop, a path that leaves ``root``) or ``OSError`` when the path cannot
    be resolved (missing, permission denied). Reads no content."""
    parts = check_id(source_id)
    try:
        real = Path(os.path.realpath(root.joinpath(*fs_parts(root, parts)), strict=True))
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise IdRefused(source_id, "symlink loop") from None
        raise
    if not _inside(real, root):
        raise IdRefused(source_id, "id leaves the source folder (through a symlink)")
    return real


def _open_inside(root: Path, real: Path, source_id: str) -> int:
    """An fd of the regular file ``real`` (inside ``root``, no symlink in it), opened component by component
    from ``root`` with ``O_NOFOLLOW``: a symlink swapped in since ``resolve_inside`` fails with ``ELOOP``
    instead of being followed. Never blocks on a FIFO. Raises ``IdRefused`` (not a regular file) or
    ``OSError``."""
    if not _SECURE_OPEN:  # no dir_fd / O_NOFOLLOW (Windows): the resolved path, checked just before
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    else:
        parts = real.relative_to(root).parts
        dirfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
        try:
            for part in parts[:-1]:
                sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC, dir_fd=dirfd)
                os.close(dirfd)
                dirfd = sub
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _O_CLOEXEC, dir_fd=dirfd)
        finally:
            os.close(dirfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IdRefused(source_id, "not a regular file")
        if _SECURE_OPEN:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


ACL_FILE_ENV = "RAG_LOCAL_ACL_FILE"
"""Environment variable ``LocalFolderSource.from_env`` reads: the path of the ACL file (module docstring)."""


# --------------------------------------------------------------------------------------------------
# Permissions: POSIX accounts
# --------------------------------------------------------------------------------------------------


def _user_principal(login: str) -> str:
    return "user:" + (login.lower() if "@" in login else login)


@dataclass(frozen=True)
class _Accounts:
    """One snapshot of the system's user and group databases (``pwd``/``grp``)."""

    user_names: Mapping[int, str]
    group_names: Mapping[int, str]
    group_gids: Mapping[str, int]
    listed: Mapping[int, frozenset[str]]  # gid -> user principals listed as its members
    primary: Mapping[int, frozenset[str]]  # gid -> user principals whose primary group it is

    @classmethod
    def read(cls) -> _Accounts:
        user_names: dict[int, str] = {}
        primary: dict[int, set[str]] = {}
        for entry in pwd.getpwall():
            user_names.setdefault(entry.pw_uid, entry.pw_name)
            primary.setdefault(entry.pw_gid, set()).add(_user_principal(entry.pw_name))
        group_names: dict[int, str] = {}
        group_gids: dict[str, int] = {}
        listed: dict[int, set[str]] = {}
        for entry in grp.getgrall():
            group_names.setdefault(entry.gr_gid, entry.gr_name)
            group_gids.setdefault(entry.gr_name, entry.gr_gid)
            listed.setdefault(entry.gr_gid, set()).update(_user_principal(m) for m in entry.gr_mem if m)
        return cls(user_names, group_names, group_gids, {g: frozenset(m) for g, m in listed.items()},
                   {g: frozenset(m) for g, m in primary.items()})

    def user(self, uid: int) -> str:
        """``user:<login>`` of ``uid``, ``user:uid:<n>`` when it has no name."""
        name = self.user_names.get(uid)
        return _user_principal(name) if name else f"user:uid:{uid}"

    def group(self, gid: int) -> str:
        """``group:<name>`` of ``gid``, ``group:gid:<n>`` when it has no name."""
        name = self.group_names.get(gid)
        return f"group:{name}" if name else f"group:gid:{gid}"

    def gid_of(self, group_principal: str) -> int | None:
        """The gid a group principal this source issues names, or ``None`` (not such a principal)."""
        if not group_principal.startswith("group:"):
            return None
        rest = group_principal[len("group:"):]
        if rest.startswith("gid:") and rest[4:].isdigit():
            return int(rest[4:])
        if not rest or ":" in rest:
            return None
        return self.group_gids.get(rest)

    def members(self, group_principal: str) -> frozenset[str] | None:
        """User principals in the group (listed members and primary-gid users), ``None`` if unknown."""
        gid = self.gid_of(group_principal)
        if gid is None:
            return None
        return self.listed.get(gid, frozenset()) | self.primary.get(gid, frozenset())


def _classes(st: os.stat_result, bits: tuple[int, int, int], accounts: _Accounts) -> frozenset[str]:
    """The principals the (owner, group, other) ``bits`` of ``st`` grant."""
    owner, group, other = bits
    found = set()
    if st.st_mode & owner:
        found.add(accounts.user(st.st_uid))
    if st.st_mode & group:
        found.add(accounts.group(st.st_gid))
    if st.st_mode & other:
        found.add(EVERYONE)
    return frozenset(found)


def _intersect(a: frozenset[str], b: frozenset[str], accounts: _Accounts) -> frozenset[str]:
    """Principals for the people in both ``a`` and ``b`` (each read as a union of principals)."""
    if EVERYONE in b:
        return a
    if EVERYONE in a:
        return b
    out: set[str] = set()
    for x in a:
        for y in b:
            if x == y:
                out.add(x)
            elif x.startswith("user:") and y.startswith("group:"):
                if x in (accounts.members(y) or ()):
                    out.add(x)
            elif x.startswith("group:") and y.startswith("user:"):
                if y in (accounts.members(x) or ()):
                    out.add(y)
            elif x.startswith("group:") and y.startswith("group:"):
                out |= (accounts.members(x) or frozenset()) & (accounts.members(y) or frozenset())
    return frozenset(out)


_READ_BITS = (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH)
_SEARCH_BITS = (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)


# --------------------------------------------------------------------------------------------------
# Permissions: the ACL file
# --------------------------------------------------------------------------------------------------


class AclFileError(ValueError):
    """The ACL file cannot be read or is invalid; the message says which file and what is wrong."""


def _segment_regex(segment: str, pattern: str) -> str:
    out, i = [], 0
    while i < len(segment):
        c = segment[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = segment.find("]", i + 2 if segment[i + 1:i + 2] in ("!", "]") else i + 1)
            if end < 0:
                raise AclFileError(f"glob {pattern!r}: unclosed '['")
            body = segment[i + 1:end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            if body.startswith("^"):
                body = "\\" + body  # a literal '^' in a glob class
            out.append("(?:(?!/)[" + ("^" if negate else "") + body.replace("\\", "\\\\") + "])")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def compile_glob(pattern: str) -> re.Pattern[str]:
    """A regex matching relative POSIX paths against ``pattern`` (module docstring: ACL globs).
    Raises ``AclFileError`` for an empty pattern, a leading ``/``, an empty or ``..`` segment, ``**``
    inside a segment or an unclosed ``[``."""
    if not isinstance(pattern, str) or not pattern:
        raise AclFileError("a rule's path must be a non-empty glob")
    if pattern.startswith("/"):
        raise AclFileError(f"glob {pattern!r}: paths are relative to the folder (no leading '/')")
    segments = pattern.split("/")
    out = []
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment in ("", ".", ".."):
            raise AclFileError(f"glob {pattern!r}: empty, '.' or '..' segment")
        if segment == "**":
            out.append(".+" if last else "(?:[^/]+/)*")
        elif "**" in segment:
            raise AclFileError(f"glob {pattern!r}: '**' must be a whole path segment")
        else:
            out.append(_segment_regex(segment, pattern) + ("" if last else "/"))
    try:
        return re.compile("".join(out) + r"\Z")
    except re.error as err:
        raise AclFileError(f"glob {pattern!r}: {err}") from None


@dataclass(frozen=True)
class AclRule:
    """One rule: ``path`` (the glob as written), its compiled ``regex``, the normalised ``principals``."""

    path: str
    regex: re.Pattern[str]
    principals: frozenset[str]


@dataclass(frozen=True)
class AclFile:
    """A parsed ACL file: ``rules`` in file order (the last match wins), ``groups``: group -> members."""

    source: Path
    rules: tuple[AclRule, ...]
    groups: Mapping[str, frozenset[str]]

    def rule_for(self, rel: str) -> AclRule | None:
        """The last rule whose glob matches ``rel`` (a relative POSIX path), or ``None``."""
        for rule in reversed(self.rules):
            if rule.regex.match(rel):
                return rule
        return None


def _principals(values: object, where: str) -> frozenset[str]:
    if not isinstance(values, list):
        raise AclFileError(f"{where}: expected a list of principals")
    found = set()
    for value in values:
        if not isinstance(value, str):
            raise AclFileError(f"{where}: principal {value!r} is not a string")
        try:
            found.add(parse_principal(value))
        except ValueError as err:
            raise AclFileError(f"{where}: invalid principal {value[:80]!r}: {err}") from None
    return frozenset(found)


def load_acl_file(path: str | os.PathLike) -> AclFile:
    """Read and check the ACL file at ``path`` (YAML, or JSON, which YAML reads too; shape in the module
    docstring). Raises ``AclFileError`` naming the file and the problem."""
    import yaml

    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise AclFileError(f"cannot read ACL file {source}: {getattr(err, 'strerror', None) or err}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise AclFileError(f"ACL file {source} is not valid YAML/JSON{where}: "
                           f"{getattr(err, 'problem', None) or err.__class__.__name__}") from None
    try:
        if not isinstance(data, dict):
            raise AclFileError("expected a mapping with 'rules' (and optionally 'groups')")
        unknown = sorted(str(k) for k in data if k not in ("rules", "groups"))
        if unknown:
            raise AclFileError(f"unknown top-level key(s) {', '.join(unknown)}: only 'rules' and 'groups'")
        if not isinstance(data.get("rules"), list):
            raise AclFileError("'rules' must be a list of {path, principals}")
        rules = []
        for n, rule in enumerate(data["rules"], 1):
            if not isinstance(rule, dict) or set(rule) != {"path", "principals"}:
                raise AclFileError(f"rule {n}: expected exactly the keys 'path' and 'principals'")
            rules.append(AclRule(str(rule["path"]), compile_glob(rule["path"]),
                                 _principals(rule["principals"], f"rule {n} ({rule['path']!r})")))
        groups_data = data.get("groups") or {}
        if not isinstance(groups_data, dict):
            raise AclFileError("'groups' must map group principals to lists of members")
        groups: dict[str, frozenset[str]] = {}
        for name, members in groups_data.items():
            try:
                key = parse_principal(str(name))
            except ValueError as err:
                raise AclFileError(f"groups: invalid group {str(name)[:80]!r}: {err}") from None
            if not key.startswith("group:"):
                raise AclFileError(f"groups: {key!r} is not a group principal (group:<name>)")
            groups[key] = groups.get(key, frozenset()) | _principals(members, f"groups[{key!r}]")
    except AclFileError as err:
        raise AclFileError(f"ACL file {source} is invalid: {err}") from None
    return AclFile(source, tuple(rules), groups)


class LocalFolderSource:
    """A folder as a source (see module docstring).

    ``root``: the folder. ``include``/``exclude``: glob patterns matched (``fnmatch``) against the
    relative POSIX path; ``*`` crosses directory levels, so ``*.pdf`` means every PDF at any depth.
    ``include`` empty = everything; ``exclude`` defaults to hidden and temporary files. ``name``
    defaults to ``local:<absolute root>``. ``acl_file``: an ACL file that replaces the POSIX mapping of
    permissions (module docstring; ``RAG_LOCAL_ACL_FILE`` through ``from_env``), made absolute here and
    read again on every permission read. Keep it outside the folder or hidden (``.acl.yaml``, excluded by
    default), or it is indexed as a document.
    """

    verifiable = True
    """``list_documents`` accepts ``verify=``: a plain listing is stat-only, ``verify=True`` hashes."""

    def __init__(self, root: str | os.PathLike, *, include: list[str] | None = None,
                 exclude: list[str] | None = None, name: str | None = None,
                 acl_file: str | os.PathLike | None = None) -> None:
        self.root = Path(root).expanduser().resolve()
        self.include = list(include or [])
        self.exclude = list(DEFAULT_EXCLUDES if exclude is None else exclude)
        self.name = name or f"local:{self.root}"
        self.acl_file = Path(acl_file).expanduser().absolute() if acl_file else None
        self._warned: set[str] = set()

    @classmethod
    def from_env(cls, root: str | os.PathLike, *, environ: Mapping[str, str] | None = None,
                 **options) -> LocalFolderSource:
        """Build from the environment: ``RAG_LOCAL_ACL_FILE`` (the ACL file; unset or empty: POSIX mapping).
        ``environ`` defaults to ``os.environ``; ``options`` go to the constructor and win over it."""
        env = os.environ if environ is None else environ
        options.setdefault("acl_file", env.get(ACL_FILE_ENV) or None)
        return cls(root, **options)

    def _selected(self, rel: str) -> bool:
        if self.include and not any(fnmatch.fnmatchcase(rel, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(rel, p) for p in self.exclude)

    def _read_fd(self, source_id: str) -> int:
        """``resolve_inside`` + ``_open_inside``; raises ``IdRefused`` or ``OSError``."""
        return _open_inside(self.root, resolve_inside(self.root, source_id), source_id)

    def _document(self, path: Path, rel: str, real: Path, *, verify: bool) -> SourceDocument | None:
        """The listing entry for one walked file (``path``: where the walk found it, ``real``: the file, with
        no symlink in its path), or ``None`` when it is not (or no longer) a regular file inside the root.
        Never raises ``OSError``: what cannot be known is left ``None`` (see module docstring)."""
        doc = SourceDocument(source_id=rel, title=path.name, uri=path.as_uri())
        try:
            st = os.stat(real, follow_symlinks=False)
        except OSError as err:
            if err.errno in _GONE:
                return None  # vanished since the walk, or a dangling / looping symlink
            return doc  # exists but cannot be stat-ed: listed with nothing known; fetch tells why
        if not stat.S_ISREG(st.st_mode):
            return None  # FIFO, socket, device (opening a FIFO would block), or replaced by a symlink
        doc = doc.replace(
            size=st.st_size,
            modified_at=datetime.fromtimestamp(st.st_mtime, tz=timezone.utc),
            source_version=f"{st.st_size}:{st.st_mtime_ns}",
        )
        if not verify:
            return doc
        try:
            with os.fdopen(_open_inside(self.root, real, rel), "rb") as fh:
                sha, head = _digest(fh)
        except IdRefused:
            return None  # no longer a regular file
        except OSError as err:
            if err.errno in _GONE:
                return None  # vanished between stat and open, or became a symlink
            return doc  # unreadable: no hash, no MIME type; the core fetches it and records the error
        return doc.replace(content_sha256=sha, mime_type=sniff_mime(head))

    def _outside(self, rel: str, *, directory: bool) -> None:
        if directory and any(fnmatch.fnmatchcase(rel, p) for p in self.exclude):
            return  # an excluded (e.g. hidden) folder link: nothing under it would be listed anyway
        if not directory and not self._selected(rel):
            return
        if rel not in self._warned:
            self._warned.add(rel)
            log.warning("%s: symlink leaves the source folder, not listed: %s -> (outside)", self.name, rel)

    def _walk(self):
        """Yield ``(path, rel, real)`` for every regular file, and ``(path, rel, None)`` for a symlink whose
        target cannot be resolved (permission denied), in id order within each directory (module docstring:
        symlinks). Raises ``ListingIncompleteError`` when a directory cannot be listed."""
        root = self.root
        st = os.stat(root)
        followed: set[tuple[int, int]] = set()
        stack = [(root, "", "", frozenset({(st.st_dev, st.st_ino)}))]
        while stack:
            real_dir, prefix, fs_prefix, chain = stack.pop()
            try:
                with os.scandir(real_dir) as it:
                    entries = sorted(it, key=lambda e: display_name(e.name))
            except OSError as err:
                raise ListingIncompleteError(
                    f"listing {self.root} failed part-way at {err.filename or real_dir}: {err.strerror}") from err
            names = {e.name for e in entries}
            subdirs = []
            for entry in entries:
                shown = display_name(entry.name)
                if shown != entry.name and shown in names:  # its id would name the other file
                    log.warning("%s: file name not UTF-8 and its id %r is another file's name: not listed",
                                self.name, prefix + shown)
                    continue
                rel = prefix + shown
                path = root / (fs_prefix + entry.name)
                try:
                    is_link = entry.is_symlink()
                except OSError:
                    is_link = False
                if not is_link:
                    try:
                        is_dir = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        is_dir = False
                    if not is_dir:
                        yield path, rel, Path(entry.path)
                        continue
                    try:
                        est = entry.stat(follow_symlinks=False)
                        key = (est.st_dev, est.st_ino)
                    except OSError:
                        key = None  # scandir of it fails and says why
                    if key not in chain:  # (a directory on its own path: only a bind-mount loop)
                        subdirs.append((Path(entry.path), rel + "/", fs_prefix + entry.name + "/",
                                        chain | {key} if key else chain))
                    continue
                try:
                    target = Path(os.path.realpath(entry.path, strict=True))
                    tst = os.stat(target)
                except OSError as err:
                    if err.errno not in _GONE:  # cannot tell where it points: fetch checks again, and says why
                        yield path, rel, None
                    continue  # dangling or looping: not listed
                directory = stat.S_ISDIR(tst.st_mode)
                if not _inside(target, root) and not (directory and target == root):
                    self._outside(rel, directory=directory)
                    continue
                if not directory:
                    yield path, rel, target
                    continue
                key = (tst.st_dev, tst.st_ino)
                if key in chain:
                    log.debug("%s: %s is a symlink loop: not followed", self.name, rel)
                elif key in followed:
                    log.debug("%s: %s: directory already followed through another link", self.name, rel)
                else:
                    followed.add(key)
                    subdirs.append((target, rel + "/", fs_prefix + entry.name + "/", chain | {key}))
            stack.extend(reversed(subdirs))

    def _require_root(self) -> None:
        """Raise ``ListingIncompleteError`` unless the root is an existing directory (an unmounted share)."""
        try:
            root_is_dir = stat.S_ISDIR(os.stat(self.root).st_mode)
        except OSError:
            root_is_dir = False
        if not root_is_dir:
            raise ListingIncompleteError(f"source folder {self.root} does not exist or is not a directory")

    def list_documents(self, *, verify: bool = False) -> Inventory:
        """Walk the tree; return a complete ``Inventory`` of the selected regular files, sorted by id.

        ``verify=False`` (default): one ``stat`` per file, no content read. Each ``SourceDocument``
        has ``source_id`` (relative POSIX path), ``title`` (file name), ``uri`` (``file://``),
        ``size`` (bytes), ``modified_at`` (timezone-aware UTC) and ``source_version``
        (``"<size>:<st_mtime_ns>"``); ``content_sha256`` and ``mime_type`` are ``None``.
        ``verify=True``: additionally reads every file once and sets ``content_sha256`` (hex SHA-256)
        and ``mime_type`` (sniffed from the first 8 KiB); a file that cannot be read keeps both ``None``.
        Symlinks: see the module docstring (inside the root followed once; leaving it: not listed).

        A single file never fails the listing (see module docstring). Raises ``ListingIncompleteError``
        when the root is missing or not a directory, or any directory under it cannot be listed."""
        self._require_root()
        documents = []
        for path, rel, real in self._walk():
            if not self._selected(rel):
                continue
            if real is None:
                documents.append(SourceDocument(source_id=rel, title=path.name, uri=path.as_uri()))
                continue
            doc = self._document(path, rel, real, verify=verify)
            if doc is not None:
                documents.append(doc)
        documents.sort(key=lambda d: d.source_id)
        return Inventory(documents=documents, complete=True)

    def lookup(self, source_id: str) -> SourceDocument | None:
        """The entry ``list_documents()`` gives for ``source_id`` (stat-only), without walking the tree;
        ``None`` when the listing does not list it (no such file now, excluded, a directory, ...).

        Raises ``IdRefused`` for an id the listing can never give (``check_id``; a path that leaves the
        root through a symlink), ``ListingIncompleteError`` when the root is missing or not a directory,
        or when a directory on the way cannot be read. A path through a symlinked directory, or one that
        cannot be stat-ed, is looked up in a full listing, so the answer is the listing's."""
        parts = check_id(source_id)
        self._require_root()
        if not self._selected(source_id):
            return None
        here = self.root
        for part in parts[:-1]:
            here = here / fs_name(here, part)
            try:
                st = os.lstat(here)
            except OSError as err:
                if err.errno in (errno.ENOENT, errno.ENOTDIR):
                    return None
                return self._listed(source_id)
            if stat.S_ISLNK(st.st_mode):
                try:
                    resolve_inside(self.root, source_id)  # a path that leaves the root: refused
                except IdRefused as refused:
                    if refused.why == "symlink loop":
                        return None
                    raise
                except OSError:
                    pass  # nothing there (or unreadable): the listing's answer
                return self._listed(source_id)
            if not stat.S_ISDIR(st.st_mode):
                return None
        path = here / fs_name(here, parts[-1])
        try:
            st = os.lstat(path)
        except OSError as err:
            if err.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            return self._listed(source_id)
        real = path
        if stat.S_ISLNK(st.st_mode):
            try:
                real = resolve_inside(self.root, source_id)
                st = os.stat(real)
            except IdRefused as refused:
                if refused.why == "symlink loop":
                    return None  # not listed, like a dangling link: nothing there to refuse
                raise
            except OSError as err:
                if err.errno in _GONE:
                    return None
                return self._listed(source_id)
        if not stat.S_ISREG(st.st_mode):
            return None
        return self._document(path, source_id, real, verify=False)

    def _listed(self, source_id: str) -> SourceDocument | None:
        return next((d for d in self.list_documents().documents if d.source_id == source_id), None)

    def changes(self, cursor: str | None) -> ChangeSet:
        """A folder has no change feed: always raises ``ChangeFeedUnavailable`` (full listing instead)."""
        raise ChangeFeedUnavailable("a local folder has no change feed")

    def fetch(self, document: SourceDocument) -> bytes:
        """The file's bytes (``fetch_to`` into memory; the pipeline streams instead)."""
        return fetch_via(self.fetch_to, document)

    def fetch_to(self, document: SourceDocument, out: BinaryIO) -> None:
        """Write the file's bytes to ``out`` in pieces of ``FETCH_PIECE_BYTES``: ``source_id`` resolved
        inside the root (module docstring: containment).

        Raises ``IdRefused`` (a ``SourceError``, not transient) naming the id and the reason for an id that
        is malformed, excluded by the patterns, leaves the root (``..``, a symlink) or is not a regular
        file; ``SourceError`` (transient) naming the file and the OS reason when it vanished or cannot be
        read; whatever ``out.write`` raises (the size cap), unchanged. Nothing outside the root is opened."""
        sid = document.source_id
        check_id(sid)
        if not self._selected(sid):
            raise IdRefused(sid, "excluded by the source's include/exclude patterns")
        def failed(err: OSError) -> SourceError:
            return SourceError(f"cannot read {sid}: {err.strerror or err}")

        try:
            fh = os.fdopen(self._read_fd(sid), "rb")
        except OSError as err:
            raise failed(err) from err
        with fh:
            copy_pieces(fh, out, failed)

    # ---------------------------------------------------------------- permissions

    def _contained(self, source_id: str) -> tuple[Path | None, str | None]:
        """``(resolved regular file, None)`` for an id ``fetch`` would read, else ``(None, reason)``."""
        try:
            check_id(source_id)
            if not self._selected(source_id):
                raise IdRefused(source_id, "excluded by the source's include/exclude patterns")
            real = resolve_inside(self.root, source_id)
            if not stat.S_ISREG(os.stat(real).st_mode):
                raise IdRefused(source_id, "not a regular file")
        except IdRefused as refused:
            return None, f"permissions not read: {refused}"
        except OSError as err:
            return None, f"permissions not read: cannot resolve {source_id!r}: {err.strerror or err}"
        return real, None

    def _posix_scope(self, real: Path, accounts: _Accounts, dirs: dict[Path, frozenset[str]]) -> Scope:
        scope = _classes(os.stat(real), _READ_BITS, accounts)
        folder = real.parent
        chain = [folder, *[p for p in folder.parents if p == self.root or p.is_relative_to(self.root)]]
        for directory in chain:
            if directory not in dirs:
                dirs[directory] = _classes(os.stat(directory), _SEARCH_BITS, accounts)
            scope = _intersect(scope, dirs[directory], accounts)
        return Scope.of(scope)

    def permissions(self, documents: Sequence[SourceDocument]) -> dict[str, Scope]:
        """``{source_id: Scope}`` for ``documents`` (module docstring: Permissions): the POSIX mapping, or
        the ACL file's rules when ``acl_file`` is set. Never raises: a refused id, a file that cannot be
        resolved or ``stat``-ed, a path no rule matches and an invalid ACL file give ``Scope.unreadable``
        with the reason."""
        documents = list(documents)
        if not documents:
            return {}
        acl: AclFile | None = None
        accounts: _Accounts | None = None
        if self.acl_file is not None:
            try:
                acl = load_acl_file(self.acl_file)
            except AclFileError as err:
                log.warning("%s: %s: every document unreadable", self.name, err)
                return {d.source_id: Scope.unreadable(str(err)) for d in documents}
        else:
            accounts = _Accounts.read()
        dirs: dict[Path, frozenset[str]] = {}
        result: dict[str, Scope] = {}
        for document in documents:
            sid = document.source_id
            real, reason = self._contained(sid)
            if real is None:
                result[sid] = Scope.unreadable(reason or "refused")
                continue
            rel = "/".join(display_name(part) for part in real.relative_to(self.root).parts)
            if acl is not None:
                rule = acl.rule_for(rel)
                result[sid] = (Scope.of(rule.principals) if rule is not None else Scope.unreadable(
                    f"no rule of ACL file {acl.source} matches {rel!r}: readable by nobody"))
                continue
            try:
                result[sid] = self._posix_scope(real, accounts, dirs)
            except OSError as err:
                result[sid] = Scope.unreadable(f"permissions not read: cannot stat {rel!r}: {err.strerror or err}")
        return result

    def group_members(self, groups: Collection[str]) -> GroupMembers:
        """Members of ``groups``: from the ACL file's ``groups`` when ``acl_file`` is set, else from the
        system's group database (module docstring). A group that is not known there, or every group when
        the ACL file is invalid, is in ``errors`` with the reason. Never raises."""
        members: dict[str, frozenset[str]] = {}
        errors: dict[str, str] = {}
        if self.acl_file is not None:
            try:
                acl = load_acl_file(self.acl_file)
            except AclFileError as err:
                return GroupMembers(errors={g: str(err) for g in groups})
            for group in groups:
                if group in acl.groups:
                    members[group] = acl.groups[group]
                else:
                    errors[group] = f"{group} is not defined under 'groups' in ACL file {acl.source}"
            return GroupMembers(members=members, errors=errors)
        accounts = _Accounts.read()
        for group in groups:
            found = accounts.members(group)
            rest = group[len("group:"):] if group.startswith("group:") else ""
            if found is None and (not rest or (":" in rest and not rest.startswith("gid:"))):
                errors[group] = f"{group}: not a group principal of local source {self.name} (group:<name>)"
            elif found is None:
                errors[group] = f"{group}: no such group in the system's group database"
            else:
                members[group] = found
        return GroupMembers(members=members, errors=errors)

