"""The ``documents`` dynamic partitions: one partition per document, keyed ``<source name>:<stable id>``.

``<source name>`` is the short name a source is configured under (``defs/sources/config.py``: letters,
digits, ``_``), ``<stable id>`` the source's own id, escaped so the key obeys Dagster's rules and the
UI's partition syntax: ``%``, ``,``, ``[``, ``]``, ``|``, control characters, lone surrogates (an
undecodable file name, as ``os.fsdecode`` gives it) and any ``.`` that follows another ``.`` (``...`` is
Dagster's range separator) become ``%XX``. Everything else (``/``, spaces,
non-ASCII) is kept, so keys stay readable; ``parse_document_partition_key`` reverses the escaping.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

import dagster as dg

documents = dg.DynamicPartitionsDefinition(name="documents")

SOURCE_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_ALWAYS = frozenset("%,[]|")


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


def document_partition_key(source_name: str, source_id: str) -> str:
    """The partition key of (``source_name``, ``source_id``); raises ``ValueError`` for an invalid source
    name or an empty id."""
    if not SOURCE_NAME_RE.match(source_name):
        raise ValueError(f"source name {source_name!r} must match {SOURCE_NAME_RE.pattern}")
    if not source_id:
        raise ValueError("a document needs a non-empty stable id")
    return f"{source_name}:{_escape(source_id)}"


def parse_document_partition_key(key: str) -> tuple[str, str]:
    """``(source_name, source_id)`` of a key made by ``document_partition_key``; raises ``ValueError``
    for anything else."""
    name, sep, escaped = key.partition(":")
    if not sep or not SOURCE_NAME_RE.match(name) or not escaped:
        raise ValueError(f"not a document partition key: {key!r}")
    return name, unquote(escaped, errors="surrogatepass")
