"""Documents the deletion guard holds back: hidden from queries, or kept searchable, by source policy.

When a *complete* listing no longer names documents the index holds and the deletion guard refuses to
delete them (too large a fraction, an empty listing), they may be gone at the source, or their sharing may
have been narrowed so that the service account no longer sees them. What queries see then is the source's
``held_documents`` policy:

* ``hide`` (default for every source that carries permissions, i.e. every built-in connector): the
  documents get ``hidden_reason`` and no query (admin included) returns them; their chunks stay;
* ``keep``: they stay searchable until the deletion is confirmed (the default only for a source without
  permission data).

A later listing that names a hidden document again clears ``hidden_reason``: it is searchable at once,
with no re-embedding. A listing that failed or came back incomplete hides nothing (nothing vanished: the
source could not be read) and shows only what it names. A confirmed deletion tombstones them as usual.
"""

from __future__ import annotations

import psycopg

HIDE, KEEP = "hide", "keep"
POLICIES = (HIDE, KEEP)


def held_policy(source) -> str:
    """``source.held_documents`` when set (``hide`` | ``keep``), else ``hide`` for a source with
    permission data and ``keep`` for one without. Raises ``ValueError`` for another value."""
    policy = getattr(source, "held_documents", None) or (
        HIDE if getattr(source, "permissions", None) is not None else KEEP)
    if policy not in POLICIES:
        raise ValueError(f"held_documents must be one of {POLICIES}, not {policy!r}")
    return policy


def apply_guard_visibility(conn: psycopg.Connection, source, diff) -> tuple[int, int]:
    """After ``diff`` (``pipeline.plan.SourceDiff``) was acted on: show listed documents that were hidden,
    and hide (policy ``hide``) the vanished ones the guard held back after a complete listing. Returns
    ``(hidden, shown)`` row counts (one transaction)."""
    with conn.transaction():
        any_hidden = conn.execute("SELECT EXISTS (SELECT 1 FROM documents WHERE source = %s AND hidden_reason IS NOT "
                                  "NULL)", (source.name,)).fetchone()[0]
        listed = sorted({d.source_id for d in diff.documents}) if any_hidden else []  # the usual case: none
        shown = conn.execute(
            "UPDATE documents SET hidden_reason = NULL WHERE source = %s AND source_id = ANY(%s) "
            "AND hidden_reason IS NOT NULL RETURNING id", (source.name, listed)).fetchall() if listed else []
        hidden = []
        if (diff.vanished and not diff.guard.passed and diff.complete and not diff.listing_error
                and held_policy(source) == HIDE):
            reason = f"missing from the listing; deletion held back by the guard: {diff.guard.reason}"[:1000]
            hidden = conn.execute(
                "UPDATE documents SET hidden_reason = %s WHERE id = ANY(%s) AND hidden_reason IS NULL RETURNING id",
                (reason, [i.id for i in diff.vanished])).fetchall()
            # an attachment follows its parent
            conn.execute("UPDATE documents SET hidden_reason = %s WHERE parent_id = ANY(%s) AND hidden_reason IS NULL",
                         (reason, [i.id for i in diff.vanished]))
        if shown:
            conn.execute("UPDATE documents SET hidden_reason = NULL WHERE parent_id = ANY(%s)",
                         ([r[0] for r in shown],))
    return len(hidden), len(shown)
