"""Containment: a document id names only something its source lists.

Local folder: ids are normalised relative paths inside the root; absolute paths, ``..``, NUL, empty or
``.`` segments and symlinks that leave the root are refused with a reason and nothing is read. Symlinks
inside the root are followed once (a loop neither hangs nor lists twice); a symlink leaving the root is
not listed (logged once at WARNING, its target not named). Through the CLI core
(``pipeline.sync.sync_source``) and the ``rag-pipeline`` process, no chunk ever holds the content of a file
outside the folder; through the Dagster partition route (the three per-document assets), partitions for ids
the source does not list (``docs:/etc/passwd``, ``docs:../outside.txt``, the absolute path of a real file
outside, a link inside that leads outside, with or without a Launchpad-style ``listing`` in the run config)
index nothing and create no ``documents`` row, while a listed id in the same test is indexed.

Real files, real symlinks, the embedded PostgreSQL and the real model; no mocks. "Nothing read" is proven
by access times (set far in the past, so even ``relatime`` records the next read) where the filesystem
records them.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from dagster._core.events import DagsterEventType

from rag_pipeline.defs.documents.partitions import document_partition_key, parse_document_partition_key
from rag_pipeline.pipeline.sync import sync_source
from rag_pipeline.sources.base import SourceDocument, SourceError
from rag_pipeline.sources.local import IdRefused, LocalFolderSource, check_id, resolve_inside
from rag_pipeline_tests.test_dagster_helpers import (  # noqa: F401  (fixtures)
    TEXTS,
    instance,
    materialize_document,
    metadata_of,
    resources_for,
    spec_for,
    write_folder,
)

MARKER = "Quokka-Zeppelin-4417 is the launch code kept outside the synced folder"
"""Written only into files outside the source folder: no chunk may ever contain it."""
OLD_ATIME_NS = 1_000_000_000


class Layout:
    """``tmp/docs`` (the source root) and ``tmp/outside.txt`` + ``tmp/outside/secret.txt`` (outside it, both
    holding ``MARKER``). Inside: ``bees.md``, ``sub/tides.txt``; links ``link.md -> bees.md`` (file, inside),
    ``alias -> sub`` (directory, inside), ``alias2 -> sub`` (a second link to it), ``sub/back -> ..`` (a
    loop to the root), ``self -> self`` (a self-loop), ``leak.txt -> ../outside.txt`` (file, outside),
    ``escape -> ../outside`` (directory, outside), ``abs.txt -> /abs/path/of/outside/secret.txt``."""

    def __init__(self, tmp: Path) -> None:
        self.root = write_folder(tmp / "docs", ["bees.md"])
        (self.root / "sub").mkdir()
        (self.root / "sub" / "tides.txt").write_text(TEXTS["tides.txt"])
        self.outside_file = tmp / "outside.txt"
        self.outside_file.write_text(f"# Outside\n\n{MARKER}.\n")
        (tmp / "outside").mkdir()
        self.secret = tmp / "outside" / "secret.txt"
        self.secret.write_text(f"Secret notes. {MARKER}.\n")
        (self.root / "link.md").symlink_to("bees.md")
        (self.root / "alias").symlink_to("sub", target_is_directory=True)
        (self.root / "alias2").symlink_to("sub", target_is_directory=True)
        (self.root / "sub" / "back").symlink_to("..", target_is_directory=True)
        (self.root / "self").symlink_to("self")
        (self.root / "leak.txt").symlink_to("../outside.txt")
        (self.root / "escape").symlink_to("../outside", target_is_directory=True)
        (self.root / "abs.txt").symlink_to(self.secret)
        self.listed = ["alias/tides.txt", "bees.md", "link.md", "sub/tides.txt"]

    def age(self) -> bool:
        """Set the outside files' atimes far in the past; True when this filesystem records reads."""
        probe = self.secret.parent / "probe"
        probe.write_text("probe")
        for p in (self.outside_file, self.secret, probe):
            os.utime(p, ns=(OLD_ATIME_NS, os.stat(p).st_mtime_ns))
        probe.read_bytes()
        records = os.stat(probe).st_atime_ns != OLD_ATIME_NS
        probe.unlink()
        return records

    def untouched(self) -> bool:
        return all(os.stat(p).st_atime_ns == OLD_ATIME_NS for p in (self.outside_file, self.secret))


@pytest.fixture
def layout(tmp_path) -> Layout:
    return Layout(tmp_path)


def _doc(source_id: str) -> SourceDocument:
    return SourceDocument(source_id=source_id, title="x", uri="")


# --------------------------------------------------------------------------------------------------
# (a) fetch: refused with the reason, nothing read
# --------------------------------------------------------------------------------------------------

REFUSED = [
    ("/etc/passwd", "absolute path"),
    ("{secret}", "absolute path"),
    ("../outside.txt", "id leaves the source folder ('..')"),
    ("a/../../outside.txt", "id leaves the source folder ('..')"),
    ("sub/../../outside.txt", "id leaves the source folder ('..')"),
    ("..", "id leaves the source folder ('..')"),
    ("bees.md\x00../../outside.txt", "NUL in id"),
    ("sub//tides.txt", "not a normalised relative path"),
    ("./bees.md", "not a normalised relative path"),
    ("sub/./tides.txt", "not a normalised relative path"),
    ("sub/", "not a normalised relative path"),
    ("", "empty id"),
    ("escape/secret.txt", "id leaves the source folder (through a symlink)"),
    ("leak.txt", "id leaves the source folder (through a symlink)"),
    ("abs.txt", "id leaves the source folder (through a symlink)"),
    ("alias/back/escape/secret.txt", "id leaves the source folder (through a symlink)"),
    ("self", "symlink loop"),
    (".hidden-inside", "excluded by the source's include/exclude patterns"),
    ("sub", "not a regular file"),
    ("pipe", "not a regular file"),
]


@pytest.mark.parametrize("source_id, why", REFUSED, ids=[r[1] + ":" + repr(r[0]) for r in REFUSED])
def test_fetch_refuses_ids_outside_the_folder(layout, source_id, why):
    (layout.root / ".hidden-inside").write_text("hidden, excluded by default")
    os.mkfifo(layout.root / "pipe")  # would block a plain open: refused without blocking
    source_id = source_id.format(secret=layout.secret)
    source = LocalFolderSource(layout.root)
    records = layout.age()

    with pytest.raises(IdRefused) as err:
        source.fetch(_doc(source_id))
    assert isinstance(err.value, SourceError) and err.value.transient is False  # the core: permanently_failed
    assert err.value.why == why and why in str(err.value)
    if records:
        assert layout.untouched(), "a refused fetch read a file outside the folder"


def test_fetch_inside_and_the_core_of_the_checks(layout):
    source = LocalFolderSource(layout.root)
    bees = TEXTS["bees.md"].encode()
    for sid in ("bees.md", "link.md", "sub/back/bees.md"):
        assert source.fetch(_doc(sid)) == bees  # links inside the root are followed
    assert source.fetch(_doc("alias/tides.txt")) == TEXTS["tides.txt"].encode()
    # on POSIX a backslash is a file-name character: no traversal, just a name that is not there
    records = layout.age()
    with pytest.raises(SourceError, match="cannot read") as err:
        source.fetch(_doc("a\\..\\..\\outside.txt"))
    assert err.value.transient is True and not isinstance(err.value, IdRefused)
    (layout.root / "a\\..\\..\\outside.txt").write_text("a file literally named a\\..\\..\\outside.txt")
    assert source.fetch(_doc("a\\..\\..\\outside.txt")) == b"a file literally named a\\..\\..\\outside.txt"
    if records:
        assert layout.untouched()
    # the pure check and the resolution, as the pipeline's other callers can use them
    assert check_id("a/b c/d.txt") == ["a", "b c", "d.txt"]
    assert resolve_inside(layout.root, "alias/tides.txt") == layout.root / "sub" / "tides.txt"
    with pytest.raises(IdRefused, match="through a symlink"):
        resolve_inside(layout.root, "escape/secret.txt")
    # include patterns confine fetch as they confine the listing
    only_md = LocalFolderSource(layout.root, include=["*.md"])
    assert only_md.fetch(_doc("bees.md")) == bees
    with pytest.raises(IdRefused, match="excluded"):
        only_md.fetch(_doc("sub/tides.txt"))


# --------------------------------------------------------------------------------------------------
# (b) the listing: inside links followed once, loops, outside links not listed
# --------------------------------------------------------------------------------------------------

def _list(source: LocalFolderSource, *, verify: bool):
    """The listing in a thread with a deadline: a symlink loop must not hang it."""
    out: dict[str, object] = {}
    t = threading.Thread(target=lambda: out.setdefault("inv", source.list_documents(verify=verify)), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the listing did not finish: a symlink loop was followed"
    return out["inv"]


def test_listing_follows_inside_symlinks_once_and_leaves_outside_ones_out(layout, caplog):
    source = LocalFolderSource(layout.root)
    records = layout.age()
    with caplog.at_level(logging.WARNING, logger="rag_pipeline.sources.local"):
        plain = _list(source, verify=False)
        verified = _list(source, verify=True)
        _list(source, verify=False)
    for inv in (plain, verified):
        assert inv.complete
        assert [d.source_id for d in inv.documents] == layout.listed  # each once; nothing from outside
    docs = {d.source_id: d for d in verified.documents}
    assert docs["link.md"].content_sha256 == docs["bees.md"].content_sha256
    assert docs["alias/tides.txt"].content_sha256 == docs["sub/tides.txt"].content_sha256
    assert docs["link.md"].uri == (layout.root / "link.md").as_uri()  # listed under the link's own path
    if records:
        assert layout.untouched(), "the listing (even verify=True) read a file outside the folder"

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sorted(w.split("not listed: ")[1] for w in warnings) == [
        "abs.txt -> (outside)", "escape -> (outside)", "leak.txt -> (outside)"]  # once each, three listings
    assert not any(str(layout.secret.parent) in w or "outside.txt" in w for w in warnings)  # target not named

    # the per-id lookup gives the listing's answer without walking the tree
    for sid, doc in {d.source_id: d for d in plain.documents}.items():
        assert source.lookup(sid) == doc
    for sid in ("sub/back/bees.md", "alias2/tides.txt", "alias/back/bees.md", "self", "nope.txt", "sub",
                "sub/nope/x.txt", ".hidden"):
        assert source.lookup(sid) is None, sid
    for sid in ("/etc/passwd", "../outside.txt", "leak.txt", "escape/secret.txt", "abs.txt", "a\x00b"):
        with pytest.raises(IdRefused):
            source.lookup(sid)


def test_links_to_the_root_and_to_ancestors_are_loops(tmp_path):
    """``again -> .`` (the root) and ``deep/er/round -> ../../deep`` (an ancestor) are loops: not entered;
    ``deep/up -> er`` (a sibling directory) is walked once under its own path."""
    root = write_folder(tmp_path / "docs", ["bees.md"])
    (root / "again").symlink_to(".", target_is_directory=True)
    (root / "deep" / "er").mkdir(parents=True)
    (root / "deep" / "er" / "t.txt").write_text("deep text\n")
    (root / "deep" / "up").symlink_to("er", target_is_directory=True)
    (root / "deep" / "er" / "round").symlink_to("../../deep", target_is_directory=True)
    source = LocalFolderSource(root)
    ids = [d.source_id for d in _list(source, verify=False).documents]
    assert ids == ["bees.md", "deep/er/t.txt", "deep/up/t.txt"]
    assert source.lookup("deep/up/t.txt").source_id == "deep/up/t.txt"
    assert source.lookup("again/bees.md") is None and source.lookup("deep/er/round/er/t.txt") is None
    assert source.fetch(_doc("again/again/bees.md")) == TEXTS["bees.md"].encode()  # inside: readable, never listed


# --------------------------------------------------------------------------------------------------
# (c) through the CLI core and the CLI process
# --------------------------------------------------------------------------------------------------

def _marker_chunks(store) -> int:
    with store.connection() as conn:
        return conn.execute("SELECT count(*) FROM chunks WHERE text LIKE %s", (f"%{MARKER[:20]}%",)).fetchone()[0]


def _rows(store, source: str) -> dict[str, str]:
    with store.connection() as conn:
        return dict(conn.execute("SELECT source_id, status FROM documents WHERE source = %s", (source,)).fetchall())


def test_sync_never_indexes_outside_content(layout, tmp_path, settings, store, embedder):
    for name in ("volcano.md", "glaciers.txt", "comets.md"):  # enough documents for one deletion within the guard
        (layout.root / name).write_text(TEXTS[name])
    (layout.root / "report.txt").write_text("The quarterly report: sales of umbrellas doubled in the rainy season.\n")
    source = LocalFolderSource(layout.root)
    records = layout.age()

    report = sync_source(source, store, embedder, settings)
    assert report.ok, report
    expected = sorted(layout.listed + ["comets.md", "glaciers.txt", "report.txt", "volcano.md"])
    assert sorted(_rows(store, source.name)) == expected
    assert set(_rows(store, source.name).values()) == {"completed"}
    assert _marker_chunks(store) == 0
    if records:
        assert layout.untouched()

    # a file indexed before becomes a link leaving the folder: it is gone from the listing, so the
    # reconciliation removes it (1 of 8: within the guard); its new target's content is never read
    (layout.root / "report.txt").unlink()
    (layout.root / "report.txt").symlink_to(layout.secret)
    again = sync_source(source, store, embedder, settings, full=True)
    assert again.deleted == ["report.txt"], again
    assert _rows(store, source.name)["report.txt"] == "deleted"
    assert _marker_chunks(store) == 0
    if records:
        assert layout.untouched()

    # the CLI process itself on the same folder, into a fresh source name (its own path): same result
    env = {**os.environ, "RAG_DATABASE_URL": settings.database_url, "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    copy = tmp_path / "docs-cli"
    copy.mkdir()
    (copy / "bees.md").write_text(TEXTS["bees.md"])
    (copy / "leak.txt").symlink_to(layout.outside_file)
    (copy / "escape").symlink_to(layout.secret.parent, target_is_directory=True)
    done = subprocess.run([sys.executable, "-m", "rag_pipeline.cli", "sync", str(copy)], env=env, check=False,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(_rows(store, LocalFolderSource(copy).name)) == ["bees.md"]
    assert "leak.txt -> (outside)" in done.stdout + done.stderr
    assert _marker_chunks(store) == 0


# --------------------------------------------------------------------------------------------------
# (d) through the Dagster partition route
# --------------------------------------------------------------------------------------------------

def _refusal(result, key: str) -> str:
    """Why the run refused ``key``: the step failed with the refusal, or (when the asset turns a refusal
    into the partition's outcome) the markdown step's ``skip_reason``."""
    if result.success:
        return str(metadata_of(result, "document_markdown").get(key, {}).get("skip_reason", ""))
    return " | ".join(e.step_failure_data.error.to_string() for e in result.all_events
                      if e.event_type == DagsterEventType.STEP_FAILURE)


def test_partition_runs_refuse_ids_the_source_does_not_list(instance, layout, database_url, store):
    spec = spec_for(layout.root)
    resources = resources_for(database_url, [spec])
    source_name = LocalFolderSource(layout.root).name
    records = layout.age()

    attacks = {
        "docs:/etc/passwd": None,
        "docs:../outside.txt": None,  # as typed in the UI: a real file beside the folder
        document_partition_key("docs", "../outside.txt"): None,  # the escaped form of the same id
        document_partition_key("docs", str(layout.outside_file)): None,  # the absolute path of a real file outside
        "docs:leak.txt": None,  # a link inside that leads outside
        "docs:escape/secret.txt": None,  # through a directory link that leads outside
        "docs:nothing-here.txt": None,  # a well-formed id the source does not list
        # a Launchpad run with a listing of its own for an id the source would not list
        document_partition_key("docs", str(layout.secret)): {
            "source_id": str(layout.secret), "title": "secret.txt", "uri": layout.secret.as_uri()},
        "docs:abs.txt": {"source_id": "abs.txt", "title": "abs.txt", "uri": ""},
    }
    refused_ids = set()
    for key, listing in attacks.items():
        run_config = None if listing is None else {
            "ops": {"document_markdown": {"config": {"listing": json.dumps(listing)}}}}
        result = materialize_document(instance, resources, key, run_config=run_config, raise_on_error=False)
        sid = parse_document_partition_key(key)[1]
        refused_ids.add(sid)
        why = _refusal(result, key)
        assert f"{sid!r} is not listed by source {source_name}: refused" in why, (key, why)
        if records:
            assert layout.untouched(), f"{key}: a file outside the folder was read"

    with store.connection() as conn:
        rows = conn.execute("SELECT source_id FROM documents WHERE source_id = ANY(%s)",
                            (sorted(refused_ids),)).fetchall()
        logged = conn.execute("SELECT source_id FROM ingest_log WHERE source_id = ANY(%s)",
                              (sorted(refused_ids),)).fetchall()
    assert rows == [] and logged == []  # no row, no log line for an id that was never listed
    assert _marker_chunks(store) == 0

    # an honest id, in the same instance and database, still goes all the way
    honest = materialize_document(instance, resources, "docs:alias/tides.txt")
    assert honest.success
    assert metadata_of(honest, "document_embeddings")["docs:alias/tides.txt"]["action"] == "added"
    assert _rows(store, source_name) == {"alias/tides.txt": "completed"}
    with store.connection() as conn:
        texts = [r[0] for r in conn.execute("SELECT text FROM chunks").fetchall()]
    assert texts and all("moon" in t for t in texts) and _marker_chunks(store) == 0
