"""Command line: ``rag-pipeline sync | retry | status | sources | query | reembed | generations | psql``
(typer + rich).

A thin caller of ``rag_pipeline.pipeline`` (it never imports Dagster). ``sync`` exit codes: 0 every
document attempted in this run ended well; 1 some documents failed in this run; 2 the listing was
incomplete or the deletion guard tripped (nothing was deleted); 3 another sync of the source was running
(with ``--no-wait``); 4 the sync could not start (no such folder, unknown source kind, missing
credentials, database unreachable). Every command exits 4 with one line when the embedded server refuses
its data directory or the database is unreachable (``main``). ``status`` exits 2 while a guard holds deletions back, else 1 while
any document is failed, else 0. Every name printed is plain text, never Rich markup.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

EXIT_CANNOT_RUN = 4

# Plain tracebacks for genuine bugs; expected errors are caught and printed as one line.
app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n\n")[0],
                  pretty_exceptions_enable=False)
sources_app = typer.Typer(no_args_is_help=True, help="The sources the index holds: list, retire.")
app.add_typer(sources_app, name="sources")
console = Console(width=None if os.isatty(1) else 160, highlight=False, soft_wrap=True)


@app.callback()
def _main() -> None:
    """Keep secrets out of every log record of this process (``rag_pipeline.redact``)."""
    from rag_pipeline import redact

    redact.install()


def _fail(message: str, code: int = EXIT_CANNOT_RUN) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(message)}")
    return typer.Exit(code)


def _settings():
    from rag_pipeline.config import get_settings

    return get_settings()


def _open_index(settings):
    """``(embedder, store)`` for ``settings``: the embedder (model loaded lazily) and the migrated store."""
    from rag_pipeline.embedding import get_embedder
    from rag_pipeline.store import Store

    from rag_pipeline.store.generations import embedder_spec

    embedder = get_embedder(settings)
    return embedder, Store.open(settings, embedding_dimension=embedder.dimension, embedding_model=embedder.model_id,
                                embedding_spec=embedder_spec(embedder, settings))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


class _Progress:
    """A bar on a terminal; a line every ``every`` documents otherwise (logs, CI, cron)."""

    def __init__(self, every: int) -> None:
        self.every, self.bar, self.task, self.done = every, None, None, 0

    def __enter__(self) -> _Progress:
        if console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("{task.fields[current]}"), console=console,
                                transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task("listing", total=None, current="")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        if event == "plan":
            if self.bar is not None:
                self.bar.update(self.task, description="syncing", total=data["work"] or 1, completed=0)
            elif data["work"]:
                console.print(f"listed {data['listed']}: {data['work']} to process, {data['delete']} to delete")
        elif event == "start" and self.bar is not None:
            self.bar.update(self.task, current=escape(data["source_id"][-50:]), total=max(data["total"], 1))
        elif event == "document" and data["outcome"].action.value not in ("deleted", "skipped-unchanged"):
            self.done += 1
            if self.bar is not None:
                self.bar.advance(self.task)
            elif self.every and self.done % self.every == 0:
                console.print(f"… {_plural(self.done, 'document')} processed")
        elif event == "embedding" and self.bar is not None:
            self.bar.update(self.task, current=f"embedding {data['count']} chunks")


@app.command()
def sync(
    path: Annotated[Optional[str], typer.Argument(help="folder to sync (local source)")] = None,
    source: Annotated[str, typer.Option(help="local | zotero | gdrive | sharepoint")] = "local",
    include: Annotated[str, typer.Option(help="local: comma-separated globs to include")] = "",
    exclude: Annotated[str, typer.Option(help="local: comma-separated globs to exclude (default: hidden files)")] = "",
    library: Annotated[str, typer.Option(help="zotero: users/<id> or groups/<id>")] = "",
    folder: Annotated[str, typer.Option(help="gdrive: folder id")] = "",
    shared_drive: Annotated[str, typer.Option("--shared-drive", help="gdrive: shared drive id")] = "",
    drive: Annotated[str, typer.Option(help="sharepoint: drive id")] = "",
    drive_path: Annotated[str, typer.Option("--path", help="sharepoint: folder path in the drive")] = "",
    full: Annotated[bool, typer.Option(help="ignore the stored cursor: full listing and reconciliation")] = False,
    allow_mass_delete: Annotated[bool, typer.Option(help="lift the deletion guard's fraction (logged)")] = False,
    confirm_delete: Annotated[Optional[int], typer.Option(
        "--confirm-delete", help="delete exactly this many documents gone from the source, even beyond the "
                                 "guard's fraction or from an empty listing (logged)")] = None,
    wait: Annotated[bool, typer.Option(help="wait for a concurrent sync of the same source, else skip")] = True,
    progress_every: Annotated[int, typer.Option(help="when not on a terminal: a progress line every N documents")] = 25,
) -> None:
    """Sync a source into the index and print what changed."""
    from rag_pipeline.pipeline.sync import sync_source
    from rag_pipeline.sources import build_source

    if source == "local" and not path:
        raise _fail("give the folder to sync: rag-pipeline sync PATH")
    if source == "local" and not os.path.isdir(path):
        raise _fail(f"{path} is not a folder (nothing was synced or deleted)")
    try:
        src = build_source(source, path=os.path.abspath(path) if source == "local" else drive_path, include=include,
                           exclude=exclude, library=library, folder=folder, shared_drive=shared_drive, drive=drive)
        settings = _settings()
        embedder, store = _open_index(settings)
        with _Progress(progress_every) as progress:
            report = sync_source(src, store, embedder, settings, full=full, allow_mass_delete=allow_mass_delete,
                                 confirm_delete=confirm_delete, wait_for_lock=wait, progress=progress)
    except Exception as exc:  # noqa: BLE001 - every error that stops the start becomes one line and exit 4
        raise _fail(f"the sync could not run: {type(exc).__name__}: {exc}") from None
    _print_report(report)
    raise typer.Exit(report.exit_code)


def _print_report(report) -> None:
    if report.lock == "skipped":
        console.print(f"another sync of {escape(report.source)} is running: skipped (--no-wait)")
        return
    shown = [d for d in report.documents if d.action.value != "skipped-unchanged"]
    if shown:
        table = Table(title=escape(f"sync of {report.source} ({report.mode})"))
        for col in ("document", "action", "status", "chunks", "chars/page", "reason"):
            table.add_column(col, overflow="fold")
        for d in sorted(shown, key=lambda d: d.source_id):
            cpp = f"{d.chars_per_page:,.0f}" if d.chars_per_page is not None else ""
            style = {"completed": "", "deleted": "dim", "skipped": "yellow"}.get(d.status or "", "red")
            table.add_row(escape(d.source_id), d.action.value, d.status or "",
                          "" if d.chunk_count is None else str(d.chunk_count), cpp, escape(d.reason or ""), style=style)
        console.print(table)
    unchanged = sum(1 for d in report.documents if d.action.value == "skipped-unchanged")
    counts = ", ".join(f"{v} {k}" for k, v in sorted(report.counts().items()) if k != "skipped-unchanged")
    console.print(f"{escape(report.source)}: {report.listed} listed; {unchanged} unchanged"
                  f"{'; ' + counts if counts else ''}; {_plural(report.embedded, 'chunk text')} embedded; "
                  f"{report.duration_s:.1f}s; lock {report.lock}")
    if report.listing_error:
        console.print(f"[red]listing error:[/red] {escape(report.listing_error)}")
    if not report.guard.passed:
        console.print(f"[red]deletion guard:[/red] {escape(report.guard.reason or '')}")
        if report.held_back:
            names = ", ".join(report.held_back[:10]) + (" …" if len(report.held_back) > 10 else "")
            console.print(f"kept (gone from the listing): {escape(names)}")
    elif report.deleted:
        console.print(f"deleted {_plural(len(report.deleted), 'document')} gone from the source")
    if report.hidden:
        console.print(f"hidden from queries until listed again or deleted: {_plural(report.hidden, 'document')}")
    p = report.permissions
    if p is not None and p.mode != "skipped":
        console.print(f"permissions ({p.mode}): {p.read} read, {p.updated} changed, {len(p.unreadable)} unreadable "
                      f"(readable by nobody), {_plural(p.groups, 'group')} expanded"
                      + (f", [red]{len(p.group_errors)} group(s) unreadable[/red]" if p.group_errors else ""))


def _resolve_source(conn, given: str | None) -> str:
    """The index's source name for ``given``: an exact name (``local:/srv/docs``), ``KIND/NAME``
    (``local//srv/docs``, ``zotero/users/1``), or a folder path; None when the index holds one source."""
    known = [r[0] for r in conn.execute("SELECT DISTINCT source FROM documents ORDER BY 1").fetchall()]
    candidates = []
    if given is None:
        candidates = known if len(known) == 1 else []
    else:
        kind, sep, rest = given.partition("/")
        candidates = [given, f"{kind}:{rest}" if sep else given]
        if os.path.isdir(given):
            candidates.append(f"local:{os.path.realpath(given)}")
        if sep and kind == "local" and os.path.isdir(rest):
            candidates.append(f"local:{os.path.realpath(rest)}")
    for name in candidates:
        if name in known:
            return name
    hint = "; ".join(known) or "none yet"
    raise _fail(("name the source with --source" if given is None else f"no source {given!r} in the index")
                + f" (known: {hint})")


@app.command()
def retry(
    source_ids: Annotated[Optional[list[str]], typer.Argument(help="documents to retry (default: every "
                                                                   "permanently failed one of the source)")] = None,
    source: Annotated[Optional[str], typer.Option("--source", help="the source: its name (e.g. local:/srv/docs), "
                                                  "KIND/NAME, or a folder; optional when the index holds one")] = None,
    reason: Annotated[str, typer.Option(help="why (logged with each document)")] = "retry requested from the CLI",
) -> None:
    """Reset the failure count of failed documents and queue them for the next sync (their previous
    version stays searchable meanwhile)."""
    from rag_pipeline.pipeline import operate

    settings = _settings()
    _, store = _open_index(settings)
    with store.connection() as conn:
        name = _resolve_source(conn, source)
        result = operate.retry(conn, name, source_ids or [], reason=reason, settings=settings, run_id=f"cli:retry:{uuid.uuid4().hex[:12]}")
    for o in result.requeued:
        console.print(f"queued {escape(o.source_id)} ({escape(o.reason or '')})")
    for sid in result.not_failed:
        console.print(f"left alone {escape(sid)}: not failed")
    for sid in result.not_found:
        console.print(f"[red]not found:[/red] {escape(sid)}")
    console.print(f"{_plural(len(result.requeued), 'document')} queued for the next sync of {escape(name)}")
    raise typer.Exit(1 if result.not_found else 0)


@app.command()
def status(
    failed: Annotated[bool, typer.Option("--failed", help="print the dead-letter table (every failed document "
                                                          "with attempts and reason, grouped by reason)")] = False,
) -> None:
    """Documents by status and source, deletions the guard holds back (and how many are hidden), documents whose
    permissions could not be read, failed and skipped documents. Exit code 2 while a guard holds deletions
    back, else 1 while any document is failed, else 0."""
    from rag_pipeline.pipeline import operate
    from rag_pipeline.store.db import Store
    from rag_pipeline.store.embedded import resolve_database_url

    store = Store(resolve_database_url(_settings().database_url))
    with store.connection() as conn:
        if not conn.execute("SELECT to_regclass('documents') IS NOT NULL").fetchone()[0]:
            console.print("the index is empty: run `rag-pipeline sync PATH` first")
            return
        rows = conn.execute("SELECT source, status, count(*) FROM documents GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
        holds = operate.guard_holds(conn)
        report = operate.dead_letter_report(conn)
        skipped = conn.execute("SELECT source, source_id, last_error FROM documents WHERE status = 'skipped' "
                               "ORDER BY source, source_id").fetchall()
        unreadable = conn.execute("SELECT source, source_id, permissions_error FROM documents WHERE status <> 'deleted' "
                                  "AND permissions_error IS NOT NULL ORDER BY source, source_id").fetchall()
        hidden = conn.execute("SELECT count(*) FROM documents WHERE status <> 'deleted' AND hidden_reason IS NOT NULL"
                              ).fetchone()[0]
    table = Table(title="documents by status")
    for col in ("source", "status", "documents"):
        table.add_column(col)
    for r in rows:
        table.add_row(escape(r[0]), r[1], str(r[2]))
    console.print(table)
    for h in holds:
        kept = ", ".join(h.held_back[:10]) + (" …" if len(h.held_back) > 10 else "")
        console.print(f"[red]deletion guard holding since {h.since:%Y-%m-%d %H:%M}:[/red] {escape(h.source)}: "
                      f"{escape(h.reason or '')}" + (f"; kept: {escape(kept)}" if kept else ""))
    if unreadable:
        console.print(f"[yellow]{_plural(len(unreadable), 'document')} readable by nobody (permissions could not be "
                      "read):[/yellow] " + escape(", ".join(f"{r[1]} ({r[2]})" for r in unreadable[:5]))
                      + (" …" if len(unreadable) > 5 else ""))
    if hidden:
        console.print(f"{_plural(hidden, 'document')} hidden from queries while the deletion guard holds them back")
    if skipped and not failed:
        console.print(f"{_plural(len(skipped), 'document')} skipped (nothing to index, not failures): " +
                      escape(", ".join(f"{r[1]} ({r[2]})" for r in skipped[:10])) + (" …" if len(skipped) > 10 else ""))
    if report.documents:
        ft = Table(title="dead letters: failed documents" if failed else "failed documents")
        cols = ("source id", "status", "attempts", "reason", "first failure", "last failure") if failed else \
            ("source", "document", "status", "failures", "reason")
        for col in cols:
            ft.add_column(col, overflow="fold")
        for reason, _n in report.by_reason:
            for d in report.documents:
                if (d.reason or "(no reason)") != reason:
                    continue
                if failed:
                    ft.add_row(escape(d.source_id), d.status, str(d.attempts), escape(d.reason or ""),
                               f"{d.first_failed:%Y-%m-%d %H:%M}" if d.first_failed else "",
                               f"{d.last_failed:%Y-%m-%d %H:%M}" if d.last_failed else "")
                else:
                    ft.add_row(escape(d.source), escape(d.source_id), d.status, str(d.attempts), escape(d.reason or ""))
        console.print(ft)
        if failed:
            console.print("by reason: " + escape("; ".join(f"{n} × {r}" for r, n in report.by_reason)))
    elif failed:
        console.print("no failed documents")
    raise typer.Exit(2 if holds else 1 if report.documents else 0)


@sources_app.command("list")
def sources_list() -> None:
    """Every source in the index with its documents by status."""
    from rag_pipeline.store.db import Store
    from rag_pipeline.store.embedded import resolve_database_url

    with Store(resolve_database_url(_settings().database_url)).connection() as conn:
        rows = conn.execute("SELECT source, count(*) FILTER (WHERE status <> 'deleted'), count(*) FROM documents "
                            "GROUP BY 1 ORDER BY 1").fetchall()
    for name, live, total in rows:
        console.print(f"{escape(name)}: {live} live, {total - live} tombstones")


@sources_app.command("retire")
def sources_retire(
    name: Annotated[str, typer.Argument(help="the source: its name, KIND/NAME, or a folder")],
    yes: Annotated[bool, typer.Option("--yes", help="do it (without it: say what would be deleted)")] = False,
) -> None:
    """Remove a source that was really emptied or retired: every document of it is deleted from the index
    (chunks at once, rows kept as tombstones) and its cursor forgotten. The deletion guard does not apply."""
    from rag_pipeline.pipeline import operate
    from rag_pipeline.store.index import load_index_state

    settings = _settings()
    _, store = _open_index(settings)
    with store.connection() as conn:
        source = _resolve_source(conn, name)
        live = [i for i in load_index_state(conn, source, count_rows=False).values() if i.live]
        if not yes:
            console.print(f"would delete {_plural(len(live), 'document')} of {escape(source)}; run again with --yes")
            raise typer.Exit(1)
        deleted = operate.retire(conn, source, run_id=f"cli:retire:{uuid.uuid4().hex[:12]}", settings=settings)
    console.print(f"retired {escape(source)}: {_plural(len(deleted), 'document')} deleted")


@app.command("query")
def query_cmd(
    text: Annotated[str, typer.Argument(help="the question")],
    k: Annotated[int, typer.Option("-k", help="how many chunks")] = 5,
    as_: Annotated[Optional[list[str]], typer.Option(
        "--as", help="the principal the query runs as (repeatable): a bare name or e-mail means user:<it>; "
                     "or user:..., group:<source>:<id>, domain:..., everyone")] = None,
    admin: Annotated[bool, typer.Option(help="an unfiltered query (every document, whoever may read it)")] = False,
    recheck: Annotated[bool, typer.Option(
        help="ask each hit's source (RAG_SOURCES) whether the principal may still read it; drop those it may not")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Return the k best chunks the principal may read (title, uri, version, score); the query, the
    principal and what the permission filter removed are logged in retrieval_log."""
    from rag_pipeline.permissions import parse_principal
    from rag_pipeline.retrieval import query

    if k < 1:
        raise typer.BadParameter("-k must be at least 1")
    if not text.strip():
        raise typer.BadParameter("the question is empty")
    if not as_ and not admin:
        raise _fail("say who asks: --as PRINCIPAL (e.g. --as ada@example.com), or --admin for an unfiltered query", 2)
    try:
        principals = [parse_principal(p) for p in as_ or []]
    except ValueError as exc:
        raise typer.BadParameter(f"--as: {exc}") from None
    sources = _configured_sources() if recheck else None
    settings = _settings()
    embedder, store = _open_index(settings)
    hits = query(store, embedder, text, k=k, principals=principals, admin=admin, recheck=recheck, sources=sources,
                 settings=settings)
    if as_json:
        sys.stdout.write(json.dumps([{"score": h.score, "title": h.title, "uri": h.uri, "version": h.version,
                                      "source": h.source, "source_id": h.source_id, "pages": h.pages,
                                      "text": h.text} for h in hits], indent=2) + "\n")
        return
    if not hits:
        console.print("no results (nothing this principal may read matches; is the index empty? "
                      "run `rag-pipeline sync PATH` first)")
        raise typer.Exit(1)
    for rank, h in enumerate(hits, 1):
        pages = f" p.{','.join(map(str, h.pages))}" if h.pages else ""
        console.rule(escape(f"#{rank} score {h.score:.3f} · {h.title} (v{h.version}){pages}"))
        console.print(f"[dim]{escape(h.uri or '')}[/dim]")
        console.print(h.text[:600] + ("…" if len(h.text) > 600 else ""), markup=False)


def _configured_sources() -> dict[str, Any]:
    """The connectors of ``RAG_SOURCES`` by their index name (for ``--recheck``; read with the Dagster code
    location's own configuration loader, imported only here)."""
    from rag_pipeline.defs.sources.config import load_source_specs

    try:
        built = [spec.source.build() for spec in load_source_specs()]
    except (ValueError, KeyError) as exc:
        raise _fail(f"--recheck needs the sources (RAG_SOURCES): {exc}") from None
    return {src.name: src for src in built}


@app.command()
def reembed(
    activate: Annotated[bool, typer.Option(help="make the generation active once it is complete")] = True,
) -> None:
    """Build the embedding generation of the configured model (RAG_EMBEDDING_*) from the stored chunk texts,
    beside the active one, and make it active when every current document is in it: queries keep the whole
    corpus with the old model until then (zero downtime). Resumes where a stopped run was. Exit 1 when some
    documents failed or could not be embedded with the new model (the generation then stays inactive), 4 when
    it cannot start (a dimension the index cannot hold, a provider that cannot be reached)."""
    from rag_pipeline.pipeline.rollout import reembed as run_reembed

    settings = _settings()
    try:
        embedder, store = _open_index(settings)
    except Exception as exc:  # noqa: BLE001 - a dimension the index cannot hold, an unknown provider: one line
        raise _fail(f"reembed could not start: {type(exc).__name__}: {exc}") from None
    with _Progress(100) as bar:
        def progress(event: str, data: dict[str, Any]) -> None:
            if event != "start":
                bar(event, data)
            elif bar.bar is not None:
                bar("plan", {"work": data["total"], "delete": 0, "listed": data["total"]})
            else:
                console.print(f"generation {data['generation']}: {_plural(data['total'], 'document')} to embed")

        report = run_reembed(store, embedder, settings, activate=activate, progress=progress)
    g, p = report.generation, report.progress
    console.print(f"generation {g.id} ({escape(g.model)}, {g.dimension} dimensions, {g.storage}): "
                  f"{p.documents_done:,} of {p.documents:,} documents, {p.chunks_done:,} of {p.chunks:,} chunks; "
                  f"{_plural(len(report.outcomes) - len(report.failed), 'document')} embedded in this run, "
                  f"{len(report.failed)} failed; "
                  f"{'active' if report.activated else g.state}; {report.duration_s:.1f}s")
    for o in report.failed[:20]:
        console.print(f"  not embedded: {escape(o.source_id)}: {escape(o.reason or '')}")
    for d in report.dropped:
        console.print(f"dropped generation {d.id} ({escape(d.model)}): past its rollback window")
    raise typer.Exit(1 if report.failed else 0)


generations_app = typer.Typer(help="Embedding generations: list them, activate one (rollback), drop one.",
                              invoke_without_command=True)
app.add_typer(generations_app, name="generations")


@generations_app.callback()
def generations_list(ctx: typer.Context) -> None:
    """List the embedding generations: id, model, dimension, storage, state, documents and chunks embedded."""
    if ctx.invoked_subcommand is not None:
        return
    from rag_pipeline.store import generations as gens
    from rag_pipeline.store.db import Store
    from rag_pipeline.store.embedded import resolve_database_url

    store = Store(resolve_database_url(_settings().database_url))
    table = Table("id", "model", "dimension", "storage", "state", "documents", "chunks", "since")
    with store.connection() as conn:
        for g in gens.all_generations(conn):
            p = gens.progress(conn, g) if g.state in gens.KEPT else None
            since = g.activated_at if g.state == "active" else g.retired_at if g.state == "retired" else g.created_at
            table.add_row(str(g.id), escape(g.model), str(g.dimension), g.storage,
                          g.state + (f" (dropped after {g.drop_after:%Y-%m-%d %H:%M})" if g.drop_after else ""),
                          f"{p.documents_done:,} / {p.documents:,}" if p else "", f"{p.chunks_done:,} / {p.chunks:,}" if p else "",
                          f"{since:%Y-%m-%d %H:%M}" if since else "")
    console.print(table)


@generations_app.command("activate")
def generations_activate(generation_id: Annotated[int, typer.Argument(help="the generation id (see the list)")]) -> None:
    """Make generation ID the one queries read (e.g. roll back to the previous model): it must be complete;
    the active one becomes the rollback target, kept RAG_GENERATION_KEEP_DAYS days."""
    from rag_pipeline.store import generations as gens
    from rag_pipeline.store.db import Store
    from rag_pipeline.store.embedded import resolve_database_url

    settings = _settings()
    store = Store(resolve_database_url(settings.database_url))
    with store.connection() as conn:
        try:
            g = gens.activate(conn, generation_id, keep_days=settings.generation_keep_days)
        except gens.GenerationError as exc:
            raise _fail(str(exc), 1) from None
    console.print(f"generation {g.id} ({escape(g.model)}) is active")


@generations_app.command("drop")
def generations_drop(generation_id: Annotated[int, typer.Argument(help="the generation id (see the list)")]) -> None:
    """Drop generation ID now (not the active one): a rollout you abandon, or a rollback target before its
    time. The configured model's generation is made again by the next sync or reembed: point RAG_EMBEDDING_*
    back at the active model first."""
    from rag_pipeline.store import generations as gens
    from rag_pipeline.store.db import Store
    from rag_pipeline.store.embedded import resolve_database_url

    store = Store(resolve_database_url(_settings().database_url))
    with store.connection() as conn:
        try:
            g = gens.drop(conn, generation_id)
        except gens.GenerationError as exc:
            raise _fail(str(exc), 1) from None
    console.print(f"generation {g.id} ({escape(g.model)}) is dropped")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def psql(ctx: typer.Context) -> None:
    """Open psql on the index, e.g. `rag-pipeline psql -c "SELECT status, count(*) FROM documents GROUP BY 1"`
    (the embedded server is started and kept up while psql runs; extra arguments go to psql)."""
    import subprocess

    from rag_pipeline.store.embedded import psql_invocation, resolve_database_url

    # the password goes to psql as PGPASSWORD, not in argv (which every user on the machine can read)
    argv, env = psql_invocation(resolve_database_url(_settings().database_url), ctx.args)
    raise typer.Exit(subprocess.call(argv, env=env))


def main() -> None:
    """The ``rag-pipeline`` console script: ``app``, with the failures that stop any command before it can
    start (the embedded server refusing its data directory, the database unreachable) printed as one line
    (secrets redacted) and exit code 4, instead of a traceback."""
    import psycopg

    from rag_pipeline.redact import redact
    from rag_pipeline.store.embedded import EmbeddedServerError

    try:
        app()
    except (EmbeddedServerError, psycopg.OperationalError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        console.print(f"[red]error:[/red] {escape(redact(f'{type(exc).__name__}: {first}'))}")
        sys.exit(EXIT_CANNOT_RUN)


if __name__ == "__main__":
    main()
