"""The ``documents`` dynamic partitions: one partition per document, keyed ``<source name>:<stable id>``.

``<source name>`` is the short name a source is configured under (``defs/sources/config.py``: letters,
digits, ``_``), ``<stable id>`` the source's own id, escaped so the key obeys Dagster's rules and the
UI's partition syntax: ``%``, ``,``, ``[``, ``]``, ``|``, control characters, lone surrogates (an
undecodable file name, as ``os.fsdecode`` gives it) and any ``.`` that follows another ``.`` (``...`` is
Dagster's range separator) become ``%XX``. Everything else (``/``, spaces,
non-ASCII) is kept, so keys stay readable; ``parse_document_partition_key`` reverses the escaping.

A key is at most ``MAX_KEY_BYTES`` (1,000) bytes of UTF-8: Dagster's PostgreSQL storage keeps partition
keys in a btree index whose entries hold ~2,700 bytes, and a deep NAS path escaped can be longer. An id
whose escaped key would be longer gets a *digest key* ``<source name>:%#<hex SHA-256 of the id>`` instead
(``%#`` never occurs in an escaped id: every ``%`` there starts ``%XX``); it names the document without
spelling it, and ``resolve_digest_key`` finds the id among candidates (the run's listing, the index, the
source's listing).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from urllib.parse import unquote

import dagster as dg

documents = dg.DynamicPartitionsDefinition(name="documents")

SOURCE_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_ALWAYS = frozenset("%,[]|")
MAX_KEY_BYTES = 1000
"""Longest partition key, in bytes of UTF-8; a longer one becomes a digest key (module docstring)."""
DIGEST_MARK = "%#"


def _escape(source_id: str) -> str:
    out = []
    previous = ""
    for ch in source_id:
        if (ch in _ALWAYS or ord(ch) < 32 or ord(ch) == 127 or (ch == "." and previous == ".")
                or 0xD800 <= ord(ch) <= 0xDFFF):
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass")))
        else:
            out.append(ch)
        previous = ch
    return "".join(out)


def _digest(source_id: str) -> str:
    return hashlib.sha256(source_id.encode("utf-8", "surrogatepass")).hexdigest()


def document_partition_key(source_name: str, source_id: str) -> str:
    """The partition key of (``source_name``, ``source_id``): the escaped id, or a digest key when that is
    over ``MAX_KEY_BYTES``; raises ``ValueError`` for an invalid source name or an empty id."""
    if not SOURCE_NAME_RE.match(source_name):
        raise ValueError(f"source name {source_name!r} must match {SOURCE_NAME_RE.pattern}")
    if not source_id:
        raise ValueError("a document needs a non-empty stable id")
    key = f"{source_name}:{_escape(source_id)}"
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        return f"{source_name}:{DIGEST_MARK}{_digest(source_id)}"
    return key


def is_digest_key(key: str) -> bool:
    """``key`` is a digest key (module docstring): its id must be found with ``resolve_digest_key``."""
    return key.partition(":")[2].startswith(DIGEST_MARK)


def parse_document_partition_key(key: str) -> tuple[str, str]:
    """``(source_name, source_id)`` of a key made by ``document_partition_key``; for a digest key the second
    item is the key's ``%#<hex>`` part, not an id (``is_digest_key``, ``resolve_digest_key``). Raises
    ``ValueError`` for anything else (a key over ``MAX_KEY_BYTES``, a malformed digest)."""
    name, sep, escaped = key.partition(":")
    if not sep or not SOURCE_NAME_RE.match(name) or not escaped or len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise ValueError(f"not a document partition key: {key[:200]!r}")
    if escaped.startswith(DIGEST_MARK):
        if not re.fullmatch(r"[0-9a-f]{64}", escaped[len(DIGEST_MARK):]):
            raise ValueError(f"not a document partition key (malformed digest): {key[:200]!r}")
        return name, escaped
    return name, unquote(escaped, errors="surrogatepass")


def resolve_digest_key(key: str, candidates: Iterable[str]) -> str | None:
    """The id among ``candidates`` whose partition key is ``key`` (a digest key), or ``None``."""
    name, _, _ = key.partition(":")
    for source_id in candidates:
        if source_id and document_partition_key(name, source_id) == key:
            return source_id
    return None


LONG_ID_BYTES = 300
"""An id shorter than this (bytes of UTF-8) never gets a digest key: its escaped key (at most 3 characters
per byte, plus ``<source name>:``) fits in ``MAX_KEY_BYTES``."""


def resolve_partitions(conn, source, keys: Iterable[str], listing=None) -> tuple[dict[str, str], dict[str, str]]:
    """``({key: source_id}, {key: reason})`` for this run's partition ``keys`` of ``source`` (one source).

    A plain key names its id; a digest key is resolved against, in order, the run's ``listing`` (a
    ``SourceDocument``), the index rows of the source with ids of at least ``LONG_ID_BYTES`` bytes, and one
    full listing of the source. A digest key none of these names gets a reason (nothing is fetched for it:
    refused like an id the source does not list); a listing that fails leaves it unresolved with that
    reason."""
    resolved: dict[str, str] = {}
    open_keys: list[str] = []
    for key in keys:
        _, sid = parse_document_partition_key(key)
        (open_keys.append(key) if is_digest_key(key) else resolved.__setitem__(key, sid))
    if not open_keys:
        return resolved, {}

    def pass_over(candidates: list[str]) -> None:
        for key in list(open_keys):
            sid = resolve_digest_key(key, candidates)
            if sid is not None:
                resolved[key] = sid
                open_keys.remove(key)

    pass_over([listing.source_id] if listing is not None else [])
    if open_keys:
        pass_over([r[0] for r in conn.execute(
            "SELECT source_id FROM documents WHERE source = %s AND octet_length(source_id) >= %s",
            (source.name, LONG_ID_BYTES))])
    failed: dict[str, str] = {}
    if open_keys:
        try:
            inventory = source.list_documents()
        except Exception as exc:  # noqa: BLE001 - the connector's failure, whatever its type: retried later
            return resolved, {k: f"cannot resolve partition {k[:80]}...: listing {source.name} failed: "
                                 f"{type(exc).__name__}" for k in open_keys}
        pass_over([d.source_id for d in inventory.documents])
        failed = {k: f"partition {k[:80]}... names no document of source {source.name}: refused" for k in open_keys}
    return resolved, failed
