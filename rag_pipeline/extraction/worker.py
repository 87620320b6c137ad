"""Isolation: each extraction runs in a reusable worker process with a time and a memory limit.

Workers are fresh interpreters (``python -m rag_pipeline.extraction.worker``, fork+exec, never a
bare ``fork``: the parent may have torch and its thread pools loaded; and unlike
``multiprocessing``'s spawn they do not re-import the caller's ``__main__``), connected by a socket
pair, and reused across documents; a worker that is killed for exceeding a limit, or
that dies, is replaced on the next call. The parent enforces the limits:

- time: ``Settings.extraction_timeout_s`` seconds of wall-clock time per document;
- memory: ``Settings.extraction_memory_mb`` MiB of resident memory of the worker and its children
  (Tesseract, LibreOffice), polled every ``POLL_S`` seconds; the worker also gets an address-space
  data limit a little above it (``RLIMIT_DATA``) so a sudden allocation fails inside it.

Exceeding either raises ``ExtractionLimitError`` whose reason names the limit; so do a ``MemoryError``
inside the worker (the data limit hit; also when a parser wrapped it in another error) and a worker
killed by SIGKILL (the kernel's OOM killer). A worker that dies from a fatal signal of its own
(SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE: a native parser crashing on the bytes) raises
``ExtractionCrashError``. Both are terminal (``types``): the same bytes under the same limits fail the
same way again. A worker that ends otherwise (an exit code, SIGTERM/SIGINT) raises a plain, transient
``ExtractionError``.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..config import Settings
from . import types as _types
from .types import Extraction, ExtractionCrashError, ExtractionError, ExtractionLimitError

POLL_S = 0.1
_DATA_LIMIT_HEADROOM_MB = 512
_CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE})
"""Signals a process dies from on its own (a crash), as opposed to being stopped from outside."""
_EXIT_WAIT_S = 2.0
"""How long to wait for a worker whose connection closed to report its exit status."""


def _caused_by_memory_error(exc: BaseException) -> bool:
    """``exc`` is a ``MemoryError`` or was raised while handling one (``raise ... from``, or implicitly):
    a parser that catches every ``Exception`` turns the data limit into its own error message."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, MemoryError):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def _rebuild_error(class_name: str, reason: str) -> ExtractionError:
    cls = getattr(_types, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, ExtractionError)):
        cls = ExtractionError
    return cls(reason)


def _worker_main(conn: Any, memory_mb: int) -> None:
    """Worker loop: receive ``("extract", data, filename, mime, settings_dict, want_progress)`` (``data``: the
    bytes, or the path of a file to read them from),
    answer ``("ok", Extraction)`` or ``("error", class_name, reason)``; ``None`` stops it."""
    try:
        import resource

        limit = (memory_mb + _DATA_LIMIT_HEADROOM_MB) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    except (ImportError, ValueError, OSError):  # pragma: no cover - non-Linux or not permitted
        pass
    from .core import extract_in_process

    # import the format modules now, while no document waits (unstructured stays lazy: HTML/OCR only)
    from . import office, pdf, text_formats  # noqa: F401

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        _, data, filename, mime, settings_dict, want_progress = msg
        if isinstance(data, str):  # a file to read here, under this process' limits
            try:
                with open(data, "rb") as fh:
                    data = fh.read()
            except MemoryError:
                conn.send(("error", "ExtractionLimitError", f"memory limit exceeded ({memory_mb} MB)"))
                continue
            except OSError as exc:
                conn.send(("error", "ExtractionError", f"the fetched file could not be read: {exc.strerror or exc}"))
                continue

        def progress(done: int, total: int) -> None:
            conn.send(("progress", done, total))

        memory_reason = f"memory limit exceeded ({memory_mb} MB)"
        try:
            settings = Settings(**settings_dict)
            result = extract_in_process(
                data, filename=filename, declared_mime=mime, settings=settings, progress=progress if want_progress else None
            )
            conn.send(("ok", result))
        except ExtractionError as exc:
            if not exc.terminal and _caused_by_memory_error(exc):  # e.g. "corrupt DOCX: MemoryError"
                conn.send(("error", "ExtractionLimitError", memory_reason))
            else:
                conn.send(("error", type(exc).__name__, exc.reason))
        except MemoryError:
            conn.send(("error", "ExtractionLimitError", memory_reason))
        except BaseException as exc:  # noqa: BLE001 - report, never die silently
            if _caused_by_memory_error(exc):
                conn.send(("error", "ExtractionLimitError", memory_reason))
            else:
                conn.send(("error", "ExtractionError", f"extraction failed: {type(exc).__name__}: {exc}"[:500]))


class Worker:
    """One worker process (started lazily) and the pipe to it. Not thread-safe: the pool hands a
    worker to one caller at a time."""

    def __init__(self, memory_mb: int) -> None:
        self.memory_mb = memory_mb
        self._proc: Any = None
        self._conn: Any = None

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _ensure(self) -> None:
        if self._alive():
            return
        self.close()
        from multiprocessing.connection import Connection

        parent, child = socket.socketpair()
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "rag_pipeline.extraction.worker", str(child.fileno()), str(self.memory_mb)],
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
                env=env,
                close_fds=True,
            )
        finally:
            child.close()
        self._proc, self._conn = proc, Connection(parent.detach())

    @property
    def pid(self) -> int | None:
        """Process id of the running worker, or ``None``."""
        return self._proc.pid if self._alive() else None

    def _rss_mb(self) -> float:
        import psutil

        try:
            proc = psutil.Process(self._proc.pid)
            total = proc.memory_info().rss
            for child in proc.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.Error:
                    pass
            return total / (1024 * 1024)
        except psutil.Error:
            return 0.0

    def kill(self) -> None:
        """Kill the worker (and its children) at once."""
        if self._proc is None:
            return
        try:
            import psutil

            for child in psutil.Process(self._proc.pid).children(recursive=True):
                try:
                    child.kill()
                except psutil.Error:
                    pass
        except Exception:  # noqa: BLE001 - the process may be gone already
            pass
        try:
            self._proc.kill()
            self._proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.close()

    def close(self) -> None:
        """Stop the worker politely if it runs, and forget it."""
        if self._conn is not None:
            try:
                if self._alive():
                    self._conn.send(None)
            except (OSError, ValueError):
                pass
            self._conn.close()
        if self._proc is not None:
            try:
                self._proc.wait(2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(2)
        self._proc = self._conn = None

    def run(
        self,
        data: bytes | os.PathLike[str],
        filename: str,
        declared_mime: str | None,
        settings: Settings,
        progress: Callable[[int, int], None] | None = None,
    ) -> Extraction:
        """Extract in the worker under the settings' limits (see module docstring); ``data``: the bytes, or
        a path the worker reads the bytes from (they then never pass through this process)."""
        timeout = float(settings.extraction_timeout_s)
        limit_mb = float(settings.extraction_memory_mb)
        payload = data if isinstance(data, (bytes, bytearray)) else os.fspath(data)
        request = ("extract", payload, filename, declared_mime, settings.model_dump(), progress is not None)
        for attempt in range(2):
            self._ensure()
            try:
                self._conn.send(request)
                break
            except OSError:  # the idle worker died: start a new one once
                self.kill()
                if attempt:
                    raise ExtractionError("extraction worker could not be started") from None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise ExtractionLimitError(f"time limit exceeded ({timeout:g} s)")
            try:
                ready = self._conn.poll(min(POLL_S, remaining))
            except (EOFError, OSError):
                ready = False
            if ready:
                try:
                    msg = self._conn.recv()
                except (EOFError, OSError):
                    msg = None
                if msg is None:
                    code = self._exit_code()
                    self.kill()
                    raise self._death_error(code, limit_mb)
                if msg[0] == "progress":
                    if progress is not None:
                        progress(msg[1], msg[2])
                    continue
                if msg[0] == "ok":
                    return msg[1]
                raise _rebuild_error(msg[1], msg[2])
            if not self._alive():
                code = self._proc.poll()
                self.kill()
                raise self._death_error(code, limit_mb)
            if self._rss_mb() > limit_mb:
                self.kill()
                raise ExtractionLimitError(f"memory limit exceeded ({limit_mb:g} MB)")

    def _exit_code(self) -> int | None:
        """The worker's exit status once its connection closed: the socket can close a moment before
        the process is reaped, so wait for it briefly (``None`` if it still runs)."""
        if self._proc is None:
            return None
        try:
            return self._proc.wait(_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            return None

    @staticmethod
    def _death_error(exitcode: int | None, limit_mb: float) -> ExtractionError:
        """The error for a worker that died during a document (see the module docstring)."""
        if exitcode is not None and exitcode in (-signal.SIGKILL, 128 + signal.SIGKILL):
            return ExtractionLimitError(f"memory limit exceeded ({limit_mb:g} MB): worker was killed")
        if exitcode is not None and exitcode < 0 and -exitcode in _CRASH_SIGNALS:
            name = signal.Signals(-exitcode).name
            return ExtractionCrashError(f"extraction worker crashed ({name}) on this document")
        return ExtractionError(f"extraction worker died (exit code {exitcode})")


class WorkerPool:
    """Up to ``max_workers`` reusable workers; ``run`` blocks while all are busy."""

    def __init__(self, max_workers: int = 2) -> None:
        self.max_workers = max(1, max_workers)
        self._idle: list[Worker] = []
        self._count = 0
        self._cond = threading.Condition()

    def _acquire(self, memory_mb: int) -> Worker:
        with self._cond:
            while True:
                for i, worker in enumerate(self._idle):
                    if worker.memory_mb == memory_mb:
                        return self._idle.pop(i)
                if self._count < self.max_workers:
                    self._count += 1
                    return Worker(memory_mb)
                if self._idle:  # a worker with another memory limit: replace it
                    self._idle.pop(0).close()
                    return Worker(memory_mb)
                self._cond.wait()

    def _release(self, worker: Worker) -> None:
        with self._cond:
            self._idle.append(worker)
            self._cond.notify()

    def run(
        self,
        data: bytes | os.PathLike[str],
        filename: str,
        declared_mime: str | None,
        settings: Settings,
        progress: Callable[[int, int], None] | None = None,
    ) -> Extraction:
        """Run one extraction on a free worker (see ``Worker.run``)."""
        worker = self._acquire(int(settings.extraction_memory_mb))
        try:
            return worker.run(data, filename, declared_mime, settings, progress)
        finally:
            self._release(worker)

    def worker_pids(self) -> list[int]:
        """Process ids of idle, running workers (for tests and diagnostics)."""
        with self._cond:
            return [w.pid for w in self._idle if w.pid is not None]

    def close(self) -> None:
        """Stop all idle workers."""
        with self._cond:
            for worker in self._idle:
                worker.close()
            self._idle.clear()
            self._count = 0


_pool: WorkerPool | None = None
_pool_lock = threading.Lock()


def default_pool() -> WorkerPool:
    """The process-wide pool (``RAG_EXTRACTION_WORKERS`` workers, default 2), created on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            try:
                n = int(os.environ.get("RAG_EXTRACTION_WORKERS", "2"))
            except ValueError:
                n = 2
            _pool = WorkerPool(n)
            atexit.register(_pool.close)
        return _pool


def _main(argv: list[str]) -> None:
    from multiprocessing.connection import Connection

    fd, memory_mb = int(argv[1]), int(argv[2])
    _worker_main(Connection(fd), memory_mb)


if __name__ == "__main__":
    _main(sys.argv)
