"""What an operator does and reads: retry failed documents, retire a source, the dead-letter report, the
deletion guard's holds. Plain functions over the index; the CLI (``retry``, ``sources retire``,
``status --failed``) and Dagster (``retry_failed_documents`` job, ``dead_letter_report`` asset) call them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import psycopg

from rag_pipeline.config import Settings
from rag_pipeline.permissions.sync import permission_cursor_key
from rag_pipeline.pipeline import steps
from rag_pipeline.pipeline.outcome import Action, DocumentOutcome
from rag_pipeline.pipeline.steps import RunContext
from rag_pipeline.store import write as w
from rag_pipeline.store.index import load_index_state


@dataclass(frozen=True)
class RetryResult:
    """``requeued``: the documents reset to ``pending`` (logged ``retry-requested``); ``not_found``: named
    ids the source does not hold; ``not_failed``: named ids that are not failed, permanently failed or
    skipped (left alone)."""

    requeued: list[DocumentOutcome]
    not_found: list[str]
    not_failed: list[str]


def retry(conn: psycopg.Connection, source: str, source_ids: Sequence[str] = (), *, reason: str,
          run_id: str, settings: Settings) -> RetryResult:
    """Reset the failure count of documents of ``source`` and queue them again (``pending``; the next sync,
    sensor tick or reconciliation processes them, fetching their content again). ``source_ids`` empty:
    every ``permanently_failed`` document of the source; else the named ones when ``failed``,
    ``permanently_failed`` or ``skipped``. Previous complete versions stay searchable meanwhile.
    ``reason`` (who and why) goes into each ``ingest_log`` row."""
    state = load_index_state(conn, source, count_rows=False)
    if source_ids:
        chosen = [state[s] for s in dict.fromkeys(source_ids) if s in state]
        not_found = [s for s in dict.fromkeys(source_ids) if s not in state]
    else:
        chosen = [i for i in state.values() if i.status == "permanently_failed"]
        not_found = []
    retryable = [i for i in chosen if i.status in ("failed", "permanently_failed", "skipped")]
    not_failed = [i.source_id for i in chosen if i not in retryable]
    ctx = RunContext(conn, source, settings, run_id)
    with conn.transaction():
        w.reset_failures(conn, [i.id for i in retryable])
        outcomes = [steps.finish(ctx, DocumentOutcome(i.source_id, i.title, Action.RETRY_REQUESTED, "pending",
                                                      f"{reason} (was {i.status}: {i.last_error})", i.id))
                    for i in retryable]
    return RetryResult(outcomes, not_found, not_failed)


def retire(conn: psycopg.Connection, source: str, *, run_id: str, settings: Settings) -> list[DocumentOutcome]:
    """Remove a source deliberately: tombstone every live document of ``source`` (chunks removed at once,
    logged ``deleted`` with reason ``source retired``) and forget its cursors and group memberships. The deletion guard does not
    apply: this is the explicit act it asks for."""
    state = load_index_state(conn, source, count_rows=False)
    ctx = RunContext(conn, source, settings, run_id)
    outcomes = steps.delete(ctx, [i for i in state.values() if i.live], reason="source retired")
    conn.execute("DELETE FROM source_cursors WHERE source = ANY(%s)", ([source, permission_cursor_key(source)],))
    conn.execute("DELETE FROM pending_deletions WHERE source = %s", (source,))
    conn.execute("DELETE FROM group_members WHERE source = %s", (source,))
    return outcomes


@dataclass(frozen=True)
class DeadLetter:
    """One failed document: ``attempts`` is its failure count on the current content; ``first_failed`` /
    ``last_failed`` frame those failures (timezone-aware, None when unknown)."""

    source: str
    source_id: str
    status: str
    attempts: int
    reason: str | None
    first_failed: datetime | None
    last_failed: datetime | None


@dataclass(frozen=True)
class DeadLetterReport:
    """Every ``failed``/``permanently_failed`` document (``documents``, ordered by source and id) and the
    count per reason (``by_reason``, most frequent first)."""

    documents: list[DeadLetter] = field(default_factory=list)
    by_reason: list[tuple[str, int]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """No failed document."""
        return not self.documents


def dead_letter_report(conn: psycopg.Connection, source: str | None = None) -> DeadLetterReport:
    """The dead-letter report: failed and permanently failed documents of ``source`` (None: every source)
    with reason, attempts and failure window, grouped by reason. Skipped documents are not failures and
    are not in it."""
    rows = conn.execute(
        """
        SELECT source, source_id, status, failure_count, last_error, first_failed_at, last_failed_at
        FROM documents WHERE status IN ('failed', 'permanently_failed') AND (%(s)s::text IS NULL OR source = %(s)s)
        ORDER BY source, source_id
        """, {"s": source}).fetchall()
    docs = [DeadLetter(*r) for r in rows]
    counts: dict[str, int] = {}
    for d in docs:
        counts[d.reason or "(no reason)"] = counts.get(d.reason or "(no reason)", 0) + 1
    return DeadLetterReport(docs, sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def dead_letter_markdown(report: DeadLetterReport, *, limit: int = 200) -> str:
    """The report as a Markdown table grouped by reason (at most ``limit`` document rows)."""
    if report.empty:
        return "No failed documents."
    lines = []
    shown = 0
    for reason, n in report.by_reason:
        lines += [f"### {reason} ({n})", "", "| source | document | status | attempts | first failure | last failure |",
                  "|---|---|---|---|---|---|"]
        for d in report.documents:
            if (d.reason or "(no reason)") == reason and shown < limit:
                shown += 1
                lines.append(f"| {d.source} | {d.source_id.replace('|', '/')} | {d.status} | {d.attempts} | "
                             f"{_when(d.first_failed)} | {_when(d.last_failed)} |")
        lines.append("")
    if shown < len(report.documents):
        lines.append(f"… and {len(report.documents) - shown} more")
    return "\n".join(lines)


def _when(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M") if t else ""


@dataclass(frozen=True)
class GuardHold:
    """A source whose latest sync tripped the deletion guard: since when (the first of the consecutive
    tripped runs), why, and the documents kept (``held_back``, as recorded by the last run)."""

    source: str
    since: datetime
    reason: str | None
    held_back: list[str]


def guard_holds(conn: psycopg.Connection) -> list[GuardHold]:
    """Sources whose most recent finished sync (``sync_runs``) tripped the deletion guard."""
    rows = conn.execute(
        """
        WITH finished AS (
          SELECT source, started_at, status, guard_reason, counts,
                 row_number() OVER (PARTITION BY source ORDER BY started_at DESC, id DESC) AS n
          FROM sync_runs WHERE status NOT IN ('running', 'interrupted')
        ), streak AS (
          SELECT f.source, min(f.started_at) AS since FROM finished f
          WHERE f.status = 'guard_tripped' AND NOT EXISTS (
            SELECT 1 FROM finished g WHERE g.source = f.source AND g.n < f.n AND g.status <> 'guard_tripped')
          GROUP BY f.source
        )
        SELECT f.source, s.since, f.guard_reason, f.counts FROM finished f JOIN streak s ON s.source = f.source
        WHERE f.n = 1 AND f.status = 'guard_tripped' ORDER BY f.source
        """).fetchall()
    return [GuardHold(r[0], r[1], r[2], list((r[3] or {}).get("held_back", []))) for r in rows]
