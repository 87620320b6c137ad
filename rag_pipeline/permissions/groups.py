"""Group membership: expanding a source's groups (nested, loops cut) into ``group_members``, and a caller's
principals into everything they may read as.

``group_members`` holds, per source, one row for every (group, member) pair where ``member`` is in
``group`` directly or through nested groups: expanding a caller is one indexed lookup. A source replaces
its rows in one transaction after each read; a group whose members could not be read keeps no rows at all
(it grants nothing until a later read succeeds), so a failed read never widens anyone's access.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

import psycopg

from rag_pipeline.permissions.principals import implied
from rag_pipeline.sources.base import GroupMembers, SourceError

log = logging.getLogger(__name__)

MAX_GROUPS = 20_000
"""Most groups one source's expansion reads; the rest count as unreadable (they grant nothing)."""
MAX_DEPTH = 32
"""Deepest nesting followed; deeper groups count as unreadable."""


@dataclass
class Expansion:
    """``closure[group]`` = every member reachable from ``group`` (users and groups); ``errors[group]`` =
    why ``group`` (or a group nested in it) could not be read; ``reads`` = ``group_members`` calls made."""

    closure: dict[str, set[str]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    reads: int = 0


def is_group(principal: str) -> bool:
    """Whether ``principal`` is a ``group:`` principal."""
    return principal.startswith("group:")


def read_groups(source, groups: Collection[str], *, batch: int = 100) -> Expansion:
    """Read ``groups`` and every group nested in them from ``source.group_members``, and close them
    transitively. A group the source reports in ``errors``, leaves out, or cannot reach (``SourceError``,
    ``MAX_GROUPS``, ``MAX_DEPTH``) gets no closure and an ``errors`` entry. A nested group's failure only
    loses the members reached through it: the parent group keeps what was read."""
    out = Expansion()
    direct: dict[str, frozenset[str]] = {}
    frontier = sorted(set(groups))
    depth = 0
    while frontier:
        if depth >= MAX_DEPTH:
            for g in frontier:
                out.errors[g] = f"nested deeper than {MAX_DEPTH} groups"
            break
        if len(direct) + len(frontier) > MAX_GROUPS:
            for g in frontier[MAX_GROUPS - len(direct):]:
                out.errors[g] = f"more than {MAX_GROUPS} groups to expand"
            frontier = frontier[:MAX_GROUPS - len(direct)]
        for start in range(0, len(frontier), batch):
            part = frontier[start:start + batch]
            out.reads += 1
            try:
                answer: GroupMembers = source.group_members(part)
            except SourceError as exc:
                answer = GroupMembers({}, {g: f"group read failed: {exc}" for g in part})
            for g in part:
                if g in answer.errors:
                    out.errors[g] = str(answer.errors[g])
                elif g in answer.members:
                    direct[g] = frozenset(m for m in answer.members[g] if isinstance(m, str) and m)
                else:
                    out.errors[g] = "the source returned no members list for this group"
        seen = set(direct) | set(out.errors)
        frontier = sorted({m for g in frontier if g in direct for m in direct[g] if is_group(m)} - seen)
        depth += 1
    for g in direct:
        reached: set[str] = set()
        stack = [g]
        while stack:
            for m in direct.get(stack.pop(), ()):
                if m not in reached and m != g:
                    reached.add(m)
                    if m in direct:
                        stack.append(m)
        out.closure[g] = reached
    return out


def store_groups(conn: psycopg.Connection, source: str, expansion: Expansion,
                 only: Collection[str] | None = None) -> int:
    """Replace ``source``'s rows of ``group_members`` with ``expansion.closure`` (one transaction); groups in
    ``expansion.errors`` keep no rows. ``only``: replace just these groups' rows (a re-check's fresh read),
    else every row of the source. Returns the number of rows written."""
    rows = [(source, g, m) for g, members in expansion.closure.items() if g not in expansion.errors
            and (only is None or g in only) for m in sorted(members)]
    with conn.transaction():
        if only is None:
            conn.execute("DELETE FROM group_members WHERE source = %s", (source,))
        else:
            conn.execute("DELETE FROM group_members WHERE source = %s AND group_principal = ANY(%s)",
                         (source, sorted(only)))
        with conn.cursor() as cur:
            with cur.copy("COPY group_members (source, group_principal, member) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
    return len(rows)


def expand(conn: psycopg.Connection, principals: Iterable[str]) -> set[str]:
    """Everything a caller with ``principals`` may read as: themselves, ``everyone``, the e-mail domain of
    each user, and every group containing any of them (directly or nested, any source)."""
    mine = implied(principals)
    rows = conn.execute("SELECT DISTINCT group_principal FROM group_members WHERE member = ANY(%s)",
                        (sorted(mine),)).fetchall()
    return mine | {r[0] for r in rows}


def groups_in(scopes: Mapping[str, Iterable[str]]) -> set[str]:
    """The group principals named by any scope in ``scopes``."""
    return {p for principals in scopes.values() for p in principals if is_group(p)}
