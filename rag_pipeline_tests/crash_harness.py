"""Crash-safety harness: run one pass of a caller (a *route*, ``routes.py``) in another process, SIGKILL it
at a chosen point, and keep a folder of tiny documents changing between runs (with the history of every
content each path ever had).

Routes: ``cli`` (``pipeline.sync.sync_source``) and ``dagster`` (the diff sensor's plan and one in-process
run of the per-document assets per document, then the inventory + guarded purge; its Dagster instance is
a SQLite directory the parent and every child share, one after another, as the processes of a
deployment share one instance).

Two ways to run one pass in its own process, both killed the same way (``RAG_FAULT_INJECT=<point>@<n>:kill``
makes the process SIGKILL itself at that checkpoint: no clean-up, no rollback from the client, an
open transaction left to PostgreSQL; for the Dagster route also a run left ``STARTED``):

* ``run_sync_subprocess``: a fresh interpreter, either the real CLI (``python -m rag_pipeline.cli
  sync FOLDER``) or this module as a script (``python -m rag_pipeline_tests.crash_harness FOLDER --name
  NAME [--route dagster --instance DIR]``: ``Settings()`` from the environment, ``Store``, the default
  embedder, ``LocalFolderSource``, the route; exit code = the route's). Each pays ~5-8 s of imports and
  model loading on 2 cores.
* ``Zygote``: one interpreter imports the pipeline, Dagster, torch and sentence-transformers once, then
  forks a child per run (fork happens before any model is loaded, any tensor computed or any Dagster
  instance opened, so no thread pools or connections are inherited); the child sets the run's
  environment, loads the model if the run gets as far as embedding, and runs the same ``main``. A kill
  then costs ~1-2 s instead of ~8 s.

Kill points are ``rag_pipeline.faults`` checkpoints, grouped by the phase they interrupt (``PHASES``);
``points_for(route)`` are those a route passes through (the ``sync.*`` points are ``sync_source``'s
own, so they apply to the CLI route only). ``fault_at`` makes a ``RAG_FAULT_INJECT`` value for one point
with an occurrence number within the work the run has to do (seeded), so kills land in the middle of a
run, not only at its first document; ``choose_fault`` picks the point too.
"""

from __future__ import annotations

import json
import math
import os
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKER_RE = re.compile(r"\bmk[a-z]{8}\b")

#: checkpoint name -> phase. ``per_document`` points are hit once per document written or read,
#: ``per_batch`` once per embedding batch, ``once`` once per run, ``deletions`` only when the run
#: deletes something.
PHASES: dict[str, list[tuple[str, str]]] = {
    "listing": [("sync.after_start", "once"), ("sync.after_listing", "once")],
    "extraction": [("pipeline.after_fetch", "per_document"), ("pipeline.after_extract", "per_document")],
    "embedding": [("embed.before", "per_batch"), ("pipeline.after_embed", "per_batch")],
    "write": [("write.after_delete", "per_document"), ("write.after_insert", "per_document")],
    "commit": [("write.before_commit", "per_document"), ("write.tombstone_before_commit", "deletions"),
               ("pipeline.before_delete", "deletions"), ("sync.before_cursor", "once")],
}

#: checkpoints only ``sync_source`` passes through (the Dagster route never calls it).
CLI_ONLY = frozenset({"sync.after_start", "sync.after_listing", "sync.before_cursor"})

ROUTE_NAMES = ("cli", "dagster")


def points_for(route: str) -> list[str]:
    """The kill points ``route`` passes through, in ``PHASES`` order."""
    if route not in ROUTE_NAMES:
        raise ValueError(f"unknown route {route!r}")
    return [p for phase in PHASES.values() for p, _ in phase if route == "cli" or p not in CLI_ONLY]


def point_kind(point: str) -> str:
    """How often ``point`` is hit: ``once`` | ``per_document`` | ``per_batch`` | ``deletions``."""
    return next(kind for phase in PHASES.values() for p, kind in phase if p == point)


def point_phase(point: str) -> str:
    """The ``PHASES`` key of ``point``."""
    return next(name for name, phase in PHASES.items() if any(p == point for p, _ in phase))


#: settings of every run (subprocess and in-process alike): small chunks so tiny files still have
#: several, small batches so a run commits some documents before it is killed, and failed documents
#: retried on the next run (no backoff: the tests converge in one more run).
RUN_SETTINGS = {"chunk_size": 300, "chunk_overlap": 50, "sync_batch_documents": 3, "retry_backoff_s": 0}


@dataclass(frozen=True)
class RunResult:
    """One subprocess run: ``returncode`` (``-9`` when SIGKILLed), ``killed``, ``seconds``, output."""

    fault: str | None
    returncode: int
    seconds: float
    stdout: str
    stderr: str

    @property
    def killed(self) -> bool:
        return self.returncode == -9


def run_env(database_url: str, fault: str | None) -> dict[str, str]:
    """The ``RAG_*`` environment of one run: the database, ``RUN_SETTINGS`` and the fault, if any."""
    env = {"RAG_DATABASE_URL": database_url, **{f"RAG_{k.upper()}": str(v) for k, v in RUN_SETTINGS.items()}}
    if fault:
        env["RAG_FAULT_INJECT"] = fault
    return env


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update({"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    return env


def _argv(folder: Path | str, source_name: str, route: str, instance_dir: str | None) -> list[str]:
    argv = [str(folder), "--name", source_name, "--route", route]
    if route == "dagster":
        if not instance_dir:
            raise ValueError("the Dagster route needs the instance directory")
        argv += ["--instance", str(instance_dir)]
    return argv


def run_sync_subprocess(folder: Path, database_url: str, source_name: str, fault: str | None, *,
                        cli: bool = False, route: str = "cli", instance_dir: str | None = None,
                        timeout_s: float = 300.0) -> RunResult:
    """Run one pass of ``route`` over ``folder`` in a fresh interpreter with ``RAG_FAULT_INJECT=fault``
    (``None``: no fault). ``cli=True`` runs ``python -m rag_pipeline.cli sync FOLDER`` (whose source
    name is ``local:<absolute folder>``; ``source_name`` must be that). The Dagster route needs
    ``instance_dir``. Raises ``subprocess.TimeoutExpired`` after ``timeout_s`` (the child is killed)."""
    env = {**_base_env(), **run_env(database_url, fault)}
    if cli:
        assert route == "cli", "the real CLI is the CLI route"
        assert source_name == f"local:{Path(folder).resolve()}", "the CLI names a folder source local:<path>"
        argv = [sys.executable, "-m", "rag_pipeline.cli", "sync", str(folder)]
    else:
        argv = [sys.executable, "-m", "rag_pipeline_tests.crash_harness",
                *_argv(folder, source_name, route, instance_dir)]
    started = time.perf_counter()
    proc = subprocess.run(argv, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    return RunResult(fault, proc.returncode, time.perf_counter() - started, proc.stdout, proc.stderr)


class Zygote:
    """A pre-imported interpreter that forks one child per sync run (see module docstring).

    ``run(...)`` has the signature and result of ``run_sync_subprocess`` (the child's stdout and
    stderr come back together in ``stderr``). ``close()`` ends the zygote. Raises ``TimeoutError``
    (after SIGKILLing the child) when a run exceeds ``timeout_s``, ``RuntimeError`` when the zygote
    itself dies.
    """

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rag_pipeline_tests.crash_harness", "--zygote"], cwd=REPO, env=_base_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._expect("ready", 300.0)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _expect(self, key: str, timeout_s: float) -> dict:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"zygote: no {key!r} within {timeout_s}s") from None
        if line is None:
            raise RuntimeError(f"zygote exited (rc {self.proc.wait()}) while waiting for {key!r}")
        msg = json.loads(line)
        assert key in msg, (key, msg)
        return msg

    def run(self, folder: Path, database_url: str, source_name: str, fault: str | None, *,
            route: str = "cli", instance_dir: str | None = None, timeout_s: float = 300.0) -> RunResult:
        with tempfile.NamedTemporaryFile("r", suffix=".log") as log:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"argv": _argv(folder, source_name, route, instance_dir),
                                              "log": log.name, "env": run_env(database_url, fault)}) + "\n")
            self.proc.stdin.flush()
            started = time.perf_counter()
            pid = self._expect("pid", 30.0)["pid"]
            try:
                rc = self._expect("returncode", timeout_s)["returncode"]
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                raise
            return RunResult(fault, rc, time.perf_counter() - started, "", log.read())

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _zygote_main() -> int:
    """The zygote's loop: import once, then per request line fork a child that runs ``main``."""
    import sentence_transformers  # noqa: F401 - the bulk of the start-up cost; no model is loaded here
    import torch  # noqa: F401

    import rag_pipeline.extraction  # imported once, shared by every child
    import rag_pipeline.pipeline.sync  # noqa: F401
    import rag_pipeline_tests.routes  # noqa: F401 - Dagster and the asset definitions; no instance opened
    from rag_pipeline.embedding import get_embedder  # noqa: F401

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:  # child: its own environment, output file, database connection and model
            code = 70
            try:
                fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.environ.update(req["env"])
                code = main(req["argv"])
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(json.dumps({"returncode": rc}), flush=True)
    return 0


def fault_at(rng: random.Random, point: str, *, documents: int, route: str = "cli") -> str:
    """A ``RAG_FAULT_INJECT`` value that SIGKILLs the run at ``point``, at an occurrence within the run's
    work (``documents`` to process: one per document, or per embedding batch, which is
    ``RUN_SETTINGS["sync_batch_documents"]`` documents for the CLI route and one document, its own run,
    for the Dagster route)."""
    size = RUN_SETTINGS["sync_batch_documents"] if route == "cli" else 1
    batches = max(1, math.ceil(documents / size))
    kind = point_kind(point)
    n = {"per_document": rng.randint(1, max(1, documents)), "per_batch": rng.randint(1, batches)}.get(kind, 1)
    return f"{point}@{n}:kill"


def choose_fault(rng: random.Random, phase: str, *, documents: int, deletions: bool, route: str = "cli") -> str:
    """``fault_at`` for a point of ``phase`` that ``route`` passes through (deletion points only when the
    run has ``deletions`` to make), chosen with ``rng``."""
    allowed = set(points_for(route))
    options = [p for p, kind in PHASES[phase] if p in allowed and (kind != "deletions" or deletions)]
    return fault_at(rng, rng.choice(options), documents=documents, route=route)


class FolderModel:
    """A folder of tiny Markdown documents that people keep changing, and what it ever held.

    Each document has 2-3 paragraphs of ~30 words, each with a unique marker word, so the content
    of the index can be compared with the folder without going through the pipeline.
    ``history[path]`` holds every SHA-256 the path ever had (a crash may leave any of them indexed);
    ``versions[path]`` every content it had, for reverts.
    """

    def __init__(self, root: Path, rng: random.Random, documents: int) -> None:
        from rag_pipeline_tests.invariant_fakes import marker, paragraph, sha256

        self._marker, self._paragraph, self._sha256 = marker, paragraph, sha256
        self.root, self.rng = root, rng
        self.history: dict[str, set[str]] = defaultdict(set)
        self.versions: dict[str, list[bytes]] = defaultdict(list)
        root.mkdir(parents=True, exist_ok=True)
        for i in range(documents):
            self.write(f"d{i:02d}.md", self.new_paragraphs(self.rng.randint(2, 3)))

    def new_paragraphs(self, n: int) -> list[str]:
        """``n`` fresh paragraphs (~30 words, one new marker word each)."""
        return [self._paragraph(self._marker(self.rng), self.rng, 30) for _ in range(n)]

    def write(self, rel: str, paragraphs: list[str]) -> None:
        """Write ``paragraphs`` to ``rel`` (blank-line separated) and record the content."""
        data = ("\n\n".join(paragraphs) + "\n").encode()
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.history[rel].add(self._sha256(data))
        self.versions[rel].append(data)

    def paths(self) -> list[str]:
        """Relative paths present now, sorted."""
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file())

    def paragraphs_of(self, rel: str) -> list[str]:
        return [p for p in (self.root / rel).read_text().split("\n\n") if p.strip()]

    def mutate(self, *, allow_removal: bool, force_removal: bool = False) -> list[str]:
        """Change the folder as people do between two syncs; return what was done (for the log):
        2-4 documents changed (one paragraph rewritten, one appended, paragraphs swapped, or a revert
        to an earlier content), maybe one added, and when ``allow_removal`` maybe one deleted and/or
        one moved (identical bytes under a new path); ``force_removal`` (with ``allow_removal``): one
        deleted for certain."""
        done = []
        for rel in self.rng.sample(self.paths(), k=min(len(self.paths()), self.rng.randint(2, 4))):
            paras = [p.strip() for p in self.paragraphs_of(rel)]
            how = self.rng.choice(["rewrite", "append", "swap", "revert"])
            if how == "revert" and len(set(self.versions[rel])) > 1:
                current = (self.root / rel).read_bytes()
                older = [v for v in self.versions[rel] if v != current]
                data = self.rng.choice(older)
                (self.root / rel).write_bytes(data)
                self.versions[rel].append(data)
            else:
                if how == "rewrite" or how == "revert":
                    paras[self.rng.randrange(len(paras))] = self.new_paragraphs(1)[0]
                elif how == "append" and len(paras) < 4:
                    paras += self.new_paragraphs(1)
                else:
                    paras = paras[1:] + paras[:1] if len(paras) > 1 else self.new_paragraphs(2)
                self.write(rel, paras)
            done.append(f"{how} {rel}")
        if self.rng.random() < 0.5:
            rel = f"new{len(self.history):03d}.md"
            self.write(rel, self.new_paragraphs(self.rng.randint(2, 3)))
            done.append(f"add {rel}")
        if allow_removal:
            paths = self.paths()
            if force_removal or self.rng.random() < 0.5:
                rel = self.rng.choice(paths)
                (self.root / rel).unlink()
                paths.remove(rel)
                done.append(f"delete {rel}")
            if self.rng.random() < 0.5:
                rel = self.rng.choice(paths)
                new = f"moved/{len(self.history):03d}-{Path(rel).name}"
                data = (self.root / rel).read_bytes()
                (self.root / new).parent.mkdir(parents=True, exist_ok=True)
                (self.root / rel).rename(self.root / new)
                self.history[new].add(self._sha256(data))
                self.versions[new].append(data)
                done.append(f"move {rel} -> {new}")
        return done

    def listing(self) -> dict[str, str]:
        """``{path: SHA-256}`` of what the folder holds now (read from disk here)."""
        return {rel: self._sha256((self.root / rel).read_bytes()) for rel in self.paths()}

    def markers(self) -> dict[str, set[str]]:
        """``{path: marker words in its current content}``."""
        return {rel: set(MARKER_RE.findall((self.root / rel).read_text())) for rel in self.paths()}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the subprocess: one pass of the route over the folder; exit code = the route's
    (``RouteResult.exit_code``, ``SyncReport.exit_code`` for the CLI route)."""
    import argparse

    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--zygote"]:
        return _zygote_main()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--name", required=True)
    parser.add_argument("--route", choices=ROUTE_NAMES, default="cli")
    parser.add_argument("--instance", default=None, help="the Dagster instance directory (Dagster route)")
    args = parser.parse_args(argv)

    from rag_pipeline.config import Settings
    from rag_pipeline.embedding import get_embedder
    from rag_pipeline.sources.local import LocalFolderSource
    from rag_pipeline.store.db import Store
    from rag_pipeline_tests.routes import open_route

    settings = Settings()
    with open_route(args.route, instance_dir=args.instance) as route:
        result = route(LocalFolderSource(args.folder, name=args.name), Store(settings.database_url),
                       get_embedder(settings), settings)
    print(json.dumps({"route": args.route, "exit_code": result.exit_code, "actions": result.actions,
                      "embedded": result.embedded}))
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
