"""Command line: ``rag-pipeline sync | query | status`` (typer + rich).

``sync`` executes the Dagster ``sync_job`` in-process (the same code path as the Dagster UI) and
prints a per-document table. Exit codes: 0 every document attempted in this run ended well; 1 some
documents failed in this run; 2 the listing was incomplete or the deletion guard tripped (nothing was
deleted); 3 another sync of the source was running (with ``--no-wait``); 4 the sync could not start
(no such folder, unknown source kind, missing credentials, database unreachable).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

EXIT_CANNOT_RUN = 4

# Plain tracebacks for genuine bugs: rich's pretty tracebacks render every local variable, which for a
# failed Dagster run took minutes and gigabytes. Expected errors are caught and printed as one line.
app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n\n")[0],
                  pretty_exceptions_enable=False)
console = Console(width=None if os.isatty(1) else 160)


def _fail(message: str, code: int = EXIT_CANNOT_RUN) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}", markup=True, highlight=False)
    return typer.Exit(code)


def _root_cause(exc: BaseException) -> BaseException:
    """The user-code exception inside a Dagster execution error (or ``exc`` itself)."""
    seen = exc
    for _ in range(5):
        inner = getattr(seen, "user_exception", None) or seen.__cause__
        if inner is None:
            break
        seen = inner
    return seen


def _settings():
    from rag_pipeline.config import get_settings

    return get_settings()


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
    allow_mass_delete: Annotated[bool, typer.Option(help="override the deletion fraction guard (logged)")] = False,
    wait: Annotated[bool, typer.Option(help="wait for a concurrent sync of the same source, else skip")] = True,
) -> None:
    """Sync a source into the index and print a per-document report."""
    from rag_pipeline.defs.ingestion.jobs import run_sync_in_process
    from rag_pipeline.defs.ingestion.resources import EmbedderResource, SettingsResource, SourceResource, StoreResource

    if source == "local" and not path:
        raise _fail("give the folder to sync: rag-pipeline sync PATH")
    if source == "local" and not os.path.isdir(path):
        raise _fail(f"{path} is not a folder (nothing was synced or deleted)")
    src_path = os.path.abspath(path) if (source == "local" and path) else drive_path
    source_res = SourceResource(kind=source, path=src_path, include=include, exclude=exclude, library=library,
                                folder=folder, shared_drive=shared_drive, drive=drive)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[current]}"), console=console,
                  transient=True) as bar:
        task = bar.add_task("listing", total=None, current="")

        def progress(event: str, data: dict[str, Any]) -> None:
            if event == "plan":
                bar.update(task, description="syncing", total=data["work"] or 1, completed=0)
            elif event == "start":
                bar.update(task, current=data["source_id"][-50:], total=max(data["total"], 1))
            elif event == "document" and data["outcome"].action not in ("deleted",):
                if data["outcome"].action != "skipped-unchanged":
                    bar.advance(task)
            elif event == "embedding":
                bar.update(task, current=f"embedding {data['count']} chunks")

        logging.getLogger("dagster").setLevel(logging.WARNING)
        try:
            source_res.build()  # configuration errors (kind, credentials) before anything runs
            report = run_sync_in_process(
                resources={"rag_settings": SettingsResource(), "embedder": EmbedderResource(),
                           "store": StoreResource(), "source": source_res, "progress": progress},
                config={"full": full, "allow_mass_delete": allow_mass_delete, "wait_for_lock": wait},
            )
        except Exception as exc:  # noqa: BLE001 - every error becomes one clear line and exit code 4
            cause = _root_cause(exc)
            raise _fail(f"the sync could not run: {type(cause).__name__}: {cause}") from None
    _print_report(report)
    raise typer.Exit(report.exit_code)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _print_report(report) -> None:
    if report.lock == "skipped":
        console.print(f"another sync of {report.source} is running: skipped (--no-wait)")
        return
    table = Table(title=f"sync of {report.source} ({report.mode})", show_lines=False)
    for col in ("document", "action", "status", "chunks", "chars/page", "reason"):
        table.add_column(col, overflow="fold")
    for d in sorted(report.documents, key=lambda d: d.source_id):
        cpp = f"{d.chars_per_page:,.0f}" if d.chars_per_page is not None else ""
        style = {"completed": "", "deleted": "dim"}.get(d.status, "red")
        table.add_row(d.source_id, d.action, d.status, str(d.chunk_count), cpp, d.reason or "", style=style)
    console.print(table)
    counts = ", ".join(f"{v} {k}" for k, v in sorted(report.counts().items())) or "nothing to do"
    console.print(f"{counts}; {_plural(report.embedded, 'chunk text')} embedded; {report.duration_s:.1f}s; "
                  f"lock {report.lock}", highlight=False)
    if report.listing_error:
        console.print(f"[red]listing error:[/red] {report.listing_error}")
    if not report.guard.passed:
        console.print(f"[red]deletion guard:[/red] {report.guard.reason}")
        if report.held_back:
            shown = ", ".join(report.held_back[:10]) + (" …" if len(report.held_back) > 10 else "")
            console.print(f"kept (gone from the listing): {shown}; if that is right, run again with "
                          "--allow-mass-delete", highlight=False)
    elif report.deleted:
        console.print(f"deleted {_plural(len(report.deleted), 'document')} gone from the source")


@app.command("query")
def query_cmd(
    text: Annotated[str, typer.Argument(help="the question")],
    k: Annotated[int, typer.Option("-k", help="how many chunks")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Return the k best chunks (title, uri, version, score); the query is logged in retrieval_log."""
    from rag_pipeline.embedding import get_embedder
    from rag_pipeline.retrieval import query
    from rag_pipeline.store import Store

    if k < 1:
        raise typer.BadParameter("-k must be at least 1")
    if not text.strip():
        raise typer.BadParameter("the question is empty")
    settings = _settings()
    embedder = get_embedder(settings)
    store = Store.open(settings, embedding_dimension=embedder.dimension, embedding_model=embedder.model_id)
    hits = query(store, embedder, text, k=k)
    if as_json:
        console.print_json(json.dumps([{"score": h.score, "title": h.title, "uri": h.uri, "version": h.version,
                                        "pages": h.pages, "text": h.text} for h in hits]))
        return
    if not hits:
        console.print("no results (is the index empty? run `rag-pipeline sync PATH` first)")
        raise typer.Exit(1)
    for rank, h in enumerate(hits, 1):
        pages = f" p.{','.join(map(str, h.pages))}" if h.pages else ""
        console.rule(f"#{rank} score {h.score:.3f} · {h.title} (v{h.version}){pages}")
        console.print(f"[dim]{h.uri}[/dim]")
        console.print(h.text[:600] + ("…" if len(h.text) > 600 else ""), markup=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def psql(ctx: typer.Context) -> None:
    """Open psql on the index, e.g. `rag-pipeline psql -c "SELECT status, count(*) FROM documents GROUP BY 1"`
    (the embedded server is started and kept up while psql runs; extra arguments go to psql)."""
    import subprocess

    from rag_pipeline.store.embedded import psql_command, resolve_database_url

    url = resolve_database_url(_settings().database_url)
    raise typer.Exit(subprocess.call([psql_command(), url, *ctx.args]))


@app.command()
def status() -> None:
    """Documents by status and source, and every failed document with its reason.
    Exit code 1 when any document is failed or permanently_failed."""
    from rag_pipeline.store.db import Store
    from rag_pipeline.store.embedded import resolve_database_url

    settings = _settings()
    store = Store(resolve_database_url(settings.database_url))
    with store.connection() as conn:
        exists = conn.execute("SELECT to_regclass('documents') IS NOT NULL").fetchone()[0]
        if not exists:
            console.print("the index is empty: run `rag-pipeline sync PATH` first")
            return
        rows = conn.execute("SELECT source, status, count(*) FROM documents GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
        failed = conn.execute(
            "SELECT source, source_id, status, failure_count, last_error FROM documents "
            "WHERE status IN ('failed', 'permanently_failed') ORDER BY source, source_id").fetchall()
    table = Table(title="documents by status")
    for col in ("source", "status", "documents"):
        table.add_column(col)
    for r in rows:
        table.add_row(r[0], r[1], str(r[2]))
    console.print(table)
    if failed:
        ft = Table(title="failed documents")
        for col in ("source", "document", "status", "failures", "reason"):
            ft.add_column(col, overflow="fold")
        for r in failed:
            ft.add_row(r[0], r[1], r[2], str(r[3]), r[4] or "")
        console.print(ft)
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
