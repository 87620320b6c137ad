"""Principals: the typed strings that say who may read a document, and their parsing.

A principal is one of

* ``user:<id>``: a person; an e-mail address (lower-cased) for Drive, Graph and most mapping files, a
  login name for local folders (``user:ada``), ``user:zotero:<userID>`` for a Zotero account;
* ``group:<source>:<id>``: a group as its source names it (a Google group's e-mail, an Entra ID group id,
  ``zotero:groups/<id>``); local folders use ``group:<group name>`` (the system's group database);
* ``domain:<domain>``: everyone whose e-mail address is in that domain (Drive domain sharing, an
  organisation-wide Graph sharing link once the tenant's domain is configured);
* ``everyone``: anyone at all (a world-readable file, a Drive file published on the web).

A document's scope is a set of principals; a caller reads it when the caller's *expanded* principals
(itself, ``everyone``, its e-mail domain, every group that contains it, transitively) meet that set.
An empty scope is readable by nobody (only an ``--admin`` query sees it).

Errors: ``parse_principal`` raises ``ValueError`` for an empty, over-long (``MAX_PRINCIPAL_CHARS``),
control-character or unknown-kind principal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

EVERYONE = "everyone"
KINDS = ("user", "group", "domain")
MAX_PRINCIPAL_CHARS = 512
"""Longest principal accepted (characters); a longer one is refused, never cut."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DOMAIN = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?)+$")


def user(identity: str) -> str:
    """``user:<identity>`` with an e-mail address lower-cased (a login name is kept as it is)."""
    identity = identity.strip()
    if not identity:
        raise ValueError("empty user identity")
    return "user:" + (identity.lower() if "@" in identity else identity)


def group(source: str, group_id: str) -> str:
    """``group:<source>:<group_id>``: a group named by its source (an id or an e-mail, lower-cased)."""
    group_id = group_id.strip()
    if not source or not group_id:
        raise ValueError("a group principal needs a source and an id")
    return f"group:{source}:{group_id.lower() if '@' in group_id else group_id}"


def domain(name: str) -> str:
    """``domain:<name>`` lower-cased; raises ``ValueError`` for something that is not a domain name."""
    name = name.strip().lower().rstrip(".")
    if not _DOMAIN.match(name):
        raise ValueError(f"not a domain name: {name!r}")
    return f"domain:{name}"


def parse_principal(text: str) -> str:
    """Normalise one principal given by a person (CLI ``--as``, a mapping file, an API caller).

    ``everyone``, ``user:…``, ``group:…`` and ``domain:…`` are checked and normalised; a bare name or
    e-mail address means ``user:<it>``. Raises ``ValueError`` (see module docstring)."""
    text = (text or "").strip()
    if not text:
        raise ValueError("empty principal")
    if len(text) > MAX_PRINCIPAL_CHARS:
        raise ValueError(f"principal longer than {MAX_PRINCIPAL_CHARS} characters")
    if _CONTROL.search(text):
        raise ValueError("principal contains a control character")
    if text == EVERYONE:
        return EVERYONE
    kind, sep, rest = text.partition(":")
    if not sep or kind not in KINDS:
        if ":" in text and "@" not in text.split(":", 1)[0]:
            raise ValueError(f"unknown principal kind {kind!r}: user, group, domain or everyone")
        return user(text)
    if not rest.strip():
        raise ValueError(f"principal {text!r} names no {kind}")
    if kind == "user":
        return user(rest)
    if kind == "domain":
        return domain(rest)
    source, sep, gid = rest.rpartition(":")
    return f"group:{rest}" if not sep else group(source, gid)


def email_domain(principal: str) -> str | None:
    """``domain:<d>`` for a ``user:`` principal that is an e-mail address, else ``None``."""
    if principal.startswith("user:") and "@" in principal:
        try:
            return domain(principal.rsplit("@", 1)[1])
        except ValueError:
            return None
    return None


def implied(principals: Iterable[str]) -> set[str]:
    """The principals themselves plus ``everyone`` and the e-mail domain of each user (groups come from
    the index: ``rag_pipeline.permissions.groups.expand``)."""
    out = {EVERYONE}
    for p in principals:
        out.add(p)
        d = email_domain(p)
        if d:
            out.add(d)
    return out
