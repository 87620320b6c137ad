"""The local folder source: a plain listing is stat-only (no file content read), ``verify=True`` hashes
and sniffs, and one bad file never fails the listing while an unlistable directory does.

Real files in temporary folders, no mocks. Expected values are computed independently of the source
(``hashlib`` on the bytes written, ``os.stat`` on the files). "Reads no content" is proven with real
permissions: the files are made unreadable (mode 000) and the listing runs as the unprivileged user
``nobody`` in a forked child (root's own permission checks are bypassed, so root cannot prove it).
The child is forked rather than started with ``subprocess.run(..., user="nobody")`` because the
venv's interpreter may live where ``nobody`` cannot reach it (here: a symlink into ``/root``, mode 700).
"""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import magic  # noqa: F401  (imported before forking, so the child never imports as ``nobody``)
import pytest

from rag_pipeline.sources.base import ListingIncompleteError, SourceDocument, SourceError
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline_tests.asuser import run_as

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + b"\x00" * 64


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(path: Path, data: bytes, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    return path


def expected_version(path: Path) -> str:
    st = os.stat(path)
    return f"{st.st_size}:{st.st_mtime_ns}"


def by_id(docs: list[SourceDocument]) -> dict[str, SourceDocument]:
    return {d.source_id: d for d in docs}


def as_unprivileged(fn: Callable[[], Any], *, timeout_s: float = 60.0) -> Any:
    """Run ``fn()`` in a forked child whose uid and gid are ``nobody``'s (supplementary groups dropped)
    and return its (pickled) result (``asuser.run_as``). Under a non-root user, permissions already apply:
    run in-process."""
    if os.geteuid() != 0:
        return fn()
    return run_as("nobody", fn, timeout_s=timeout_s)


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """``("ok", result)`` or ``("raised", (type name, message, transient))``: picklable either way."""
    try:
        return "ok", call()
    except Exception as err:  # noqa: BLE001 - reported to the parent, which asserts on it
        return "raised", (type(err).__name__, str(err), getattr(err, "transient", None))


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder ``nobody`` can traverse (mode 755, under ``/tmp``): pytest's own ``tmp_path`` may sit
    under a mode-700 ``/tmp/pytest-of-root``. Modes are restored before it is removed."""
    top = Path(tempfile.mkdtemp(prefix="rag-local-", dir="/tmp"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                p = Path(dirpath, name)
                if not p.is_symlink():
                    p.chmod(0o700)
        shutil.rmtree(top)


def test_public_shape() -> None:
    """``list_documents(*, verify=False)`` and ``verifiable = True``, which the core checks for."""
    params = inspect.signature(LocalFolderSource.list_documents).parameters
    assert list(params) == ["self", "verify"]
    assert params["verify"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["verify"].default is False
    assert getattr(LocalFolderSource(Path.cwd()), "verifiable", False) is True


def test_plain_listing_is_stat_only(tmp_path: Path) -> None:
    files = {
        "a.txt": b"hello world\n",
        "sub/b.bin": PNG,
        "sub/deeper/c.md": b"# Title\n\nsome text\n" * 100,
        "sub/empty.txt": b"",
    }
    for rel, data in files.items():
        write(tmp_path / rel, data)
    write(tmp_path / ".hidden", b"x")  # excluded by default
    write(tmp_path / "sub" / "~$lock.docx", b"x")  # Office lock file, excluded by default

    docs = LocalFolderSource(tmp_path).list_documents().documents

    assert [d.source_id for d in docs] == sorted(files)
    for d in docs:
        path = tmp_path / d.source_id
        st = os.stat(path)
        assert d.title == path.name
        assert d.uri == path.resolve().as_uri()
        assert d.size == len(files[d.source_id])
        assert d.modified_at == datetime.fromtimestamp(st.st_mtime, tz=timezone.utc)
        assert d.source_version == expected_version(path)
        assert d.content_sha256 is None
        assert d.mime_type is None


def test_plain_listing_reads_no_content(shared_tmp: Path) -> None:
    """Every file mode 000, folders 755: as ``nobody`` the listing still sees every file, with its size
    and version; fetching one raises ``SourceError`` naming it. Then, with one file made readable,
    ``verify=True`` as ``nobody`` hashes that one and leaves the unreadable ones unhashed."""
    root = shared_tmp / "root"
    files = {"a.txt": b"readable later\n", "docs/b.txt": b"secret b\n", "docs/deep/c.md": b"# secret c\n" * 50}
    for rel, data in files.items():
        write(root / rel, data, mode=0o000)
    for d in (root, root / "docs", root / "docs" / "deep"):
        d.chmod(0o755)
    versions = {rel: expected_version(root / rel) for rel in files}
    source = LocalFolderSource(root)
    secret = SourceDocument(source_id="docs/b.txt", title="b.txt", uri=(root / "docs/b.txt").as_uri())

    def plain() -> dict[str, Any]:
        try:  # the premise: this user really cannot read the files
            (root / "docs/b.txt").read_bytes()
            premise = "readable"
        except PermissionError:
            premise = "denied"
        return {"premise": premise, "listing": outcome(source.list_documents), "fetch": outcome(lambda: source.fetch(secret))}

    seen = as_unprivileged(plain)
    assert seen["premise"] == "denied", "the unprivileged child could read a mode-000 file: the test proves nothing"
    kind, inventory = seen["listing"]
    assert kind == "ok", f"the stat-only listing failed on unreadable files: {inventory}"
    assert inventory.complete
    assert [d.source_id for d in inventory.documents] == sorted(files)
    for d in inventory.documents:
        assert d.size == len(files[d.source_id])
        assert d.source_version == versions[d.source_id]
        assert d.content_sha256 is None and d.mime_type is None
    kind, (err_type, message, transient) = seen["fetch"]
    assert kind == "raised" and err_type == "SourceError", seen["fetch"]
    assert "docs/b.txt" in message
    assert transient is True

    (root / "a.txt").chmod(0o644)
    kind, inventory = as_unprivileged(lambda: outcome(lambda: source.list_documents(verify=True)))
    assert kind == "ok", f"the verification listing failed on unreadable files: {inventory}"
    docs = by_id(inventory.documents)
    assert sorted(docs) == sorted(files)
    assert docs["a.txt"].content_sha256 == sha256(files["a.txt"])
    assert docs["a.txt"].mime_type == "text/plain"
    for rel in ("docs/b.txt", "docs/deep/c.md"):
        assert docs[rel].content_sha256 is None and docs[rel].mime_type is None
        assert docs[rel].size == len(files[rel])
        assert docs[rel].source_version == versions[rel]


def test_plain_listing_leaves_access_times_alone(tmp_path: Path) -> None:
    """Second proof, for a listing that would read and swallow the error: with every atime set far in
    the past (so even ``relatime`` records the next read), a plain listing leaves them all unchanged,
    while a verification listing, which does read, moves them."""
    files = {"a.txt": b"alpha\n", "sub/b.txt": b"beta\n" * 1000}
    for rel, data in files.items():
        write(tmp_path / rel, data)

    def age_atimes() -> dict[str, int]:
        for rel in files:
            st = os.stat(tmp_path / rel)
            os.utime(tmp_path / rel, ns=(1_000_000_000, st.st_mtime_ns))
        return {rel: os.stat(tmp_path / rel).st_atime_ns for rel in files}

    probe = write(tmp_path / ".atime-probe", b"probe")  # hidden: excluded from the listing
    os.utime(probe, ns=(1_000_000_000, os.stat(probe).st_mtime_ns))
    probe.read_bytes()
    if os.stat(probe).st_atime_ns == 1_000_000_000:
        pytest.skip(f"the filesystem of {tmp_path} does not record reads in atime (noatime)")

    source = LocalFolderSource(tmp_path)
    aged = age_atimes()
    assert len(source.list_documents().documents) == len(files)
    assert {rel: os.stat(tmp_path / rel).st_atime_ns for rel in files} == aged

    aged = age_atimes()
    assert len(source.list_documents(verify=True).documents) == len(files)
    assert all(os.stat(tmp_path / rel).st_atime_ns != aged[rel] for rel in files)


def test_verify_hashes_and_sniffs(tmp_path: Path) -> None:
    files = {"notes.txt": b"plain text notes\nsecond line\n", "img/pic.png": PNG, "empty.txt": b"",
             "big.bin": os.urandom(3 * (1 << 20) + 17)}  # more than one read block
    for rel, data in files.items():
        write(tmp_path / rel, data)
    source = LocalFolderSource(tmp_path)

    verified = source.list_documents(verify=True).documents
    plain = source.list_documents().documents

    assert [d.source_id for d in verified] == sorted(files)
    docs = by_id(verified)
    for rel, data in files.items():
        assert docs[rel].content_sha256 == sha256(data)
        assert docs[rel].size == len(data)
        assert docs[rel].source_version == expected_version(tmp_path / rel)
    assert docs["notes.txt"].mime_type == "text/plain"
    assert docs["img/pic.png"].mime_type == "image/png"
    assert docs["empty.txt"].mime_type == "application/x-empty"
    assert docs["big.bin"].mime_type  # libmagic's call for random bytes; set, whatever it is
    # verification adds the hash and the type, and changes nothing else
    assert plain == [d.replace(content_sha256=None, mime_type=None) for d in verified]


def test_fetch_reads_the_file(tmp_path: Path) -> None:
    data = b"fetched bytes\n"
    write(tmp_path / "x" / "f.txt", data)
    source = LocalFolderSource(tmp_path)
    (doc,) = source.list_documents().documents
    assert source.fetch(doc) == data
    (tmp_path / "x" / "f.txt").unlink()
    with pytest.raises(SourceError, match="x/f.txt") as err:
        source.fetch(doc)
    assert err.value.transient is True


def test_unreadable_directory_fails_the_listing(shared_tmp: Path) -> None:
    root = shared_tmp / "root"
    write(root / "ok.txt", b"fine\n")
    write(root / "locked" / "inside.txt", b"unknown to nobody\n")
    root.chmod(0o755)
    (root / "locked").chmod(0o700)  # root's; nobody can neither list nor enter it
    source = LocalFolderSource(root)

    for verify in (False, True):
        kind, (err_type, message, _) = as_unprivileged(lambda: outcome(lambda: source.list_documents(verify=verify)))
        assert (kind, err_type) == ("raised", "ListingIncompleteError"), message
        assert "locked" in message


def test_unstatable_file_is_listed_without_version(shared_tmp: Path) -> None:
    """A folder nobody can list (r) but not enter (no x): its files' names are known, their stat is
    denied. They are listed (no size, no version), so the core fetches them and records the failure."""
    root = shared_tmp / "root"
    write(root / "ok.txt", b"fine\n")
    write(root / "listonly" / "f.txt", b"cannot stat me\n")
    root.chmod(0o755)
    (root / "listonly").chmod(0o744)
    source = LocalFolderSource(root)
    doc = SourceDocument(source_id="listonly/f.txt", title="f.txt", uri="")

    for verify in (False, True):
        listing, fetched = as_unprivileged(
            lambda: (outcome(lambda: source.list_documents(verify=verify)), outcome(lambda: source.fetch(doc))))
        kind, inventory = listing
        assert kind == "ok", inventory
        docs = by_id(inventory.documents)
        assert sorted(docs) == ["listonly/f.txt", "ok.txt"]
        f = docs["listonly/f.txt"]
        assert (f.size, f.modified_at, f.source_version, f.content_sha256, f.mime_type) == (None,) * 5
        assert docs["ok.txt"].source_version == expected_version(root / "ok.txt")
        kind, (err_type, message, _) = fetched
        assert (kind, err_type) == ("raised", "SourceError") and "listonly/f.txt" in message


def test_missing_or_non_directory_root(tmp_path: Path) -> None:
    with pytest.raises(ListingIncompleteError):
        LocalFolderSource(tmp_path / "absent").list_documents()
    with pytest.raises(ListingIncompleteError):
        LocalFolderSource(tmp_path / "absent").list_documents(verify=True)
    write(tmp_path / "a-file", b"x")
    with pytest.raises(ListingIncompleteError):
        LocalFolderSource(tmp_path / "a-file").list_documents()


def test_gone_and_special_entries_are_not_listed(tmp_path: Path) -> None:
    """A dangling symlink is what a file that vanished between the walk and its stat looks like to the
    stat (ENOENT); a FIFO is not a document (and hashing one would block)."""
    write(tmp_path / "real.txt", b"real\n")
    (tmp_path / "dangling.txt").symlink_to(tmp_path / "nowhere.txt")
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "link.txt").symlink_to(tmp_path / "real.txt")
    source = LocalFolderSource(tmp_path)
    for verify in (False, True):
        docs = by_id(source.list_documents(verify=verify).documents)
        assert sorted(docs) == ["link.txt", "real.txt"]
        if verify:
            assert docs["link.txt"].content_sha256 == sha256(b"real\n")


def test_touch_changes_the_version_not_the_content(tmp_path: Path) -> None:
    data = b"same bytes\n"
    path = write(tmp_path / "t.txt", data)
    source = LocalFolderSource(tmp_path)
    (before,) = source.list_documents(verify=True).documents
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # touch: 5 s later, bytes untouched
    (after,) = source.list_documents(verify=True).documents
    (plain_after,) = source.list_documents().documents

    assert path.read_bytes() == data
    assert after.source_version != before.source_version
    assert after.source_version == f"{len(data)}:{st.st_mtime_ns + 5_000_000_000}"
    assert plain_after.source_version == after.source_version
    assert after.size == before.size == len(data)
    assert after.content_sha256 == before.content_sha256 == sha256(data)
    assert stat.S_ISREG(os.stat(path).st_mode)


# --- file names that are not UTF-8 ----------------------------------------------------------------


def _bytes_file(root: Path, name: bytes, data: bytes) -> None:
    with open(os.path.join(os.fsencode(root), name), "wb") as fh:
        fh.write(data)


def test_a_file_name_that_is_not_utf8_gets_a_storable_id_that_reads_it_back(tmp_path: Path) -> None:
    """A Latin-1 name (``b"caf\\xe9.txt"``: ``os.fsdecode`` gives a lone surrogate no database text holds) is
    listed as ``caf\\xe9.txt`` (the byte written ``\\xNN``), and ``lookup``/``fetch`` find the file again from
    that id, also through a directory whose own name is not UTF-8. A file whose real name *is* that text
    keeps it; the undecodable twin whose id would collide with it is not listed."""
    os.mkdir(os.path.join(os.fsencode(tmp_path), b"r\xe9sum\xe9s"))
    _bytes_file(tmp_path, b"caf\xe9.txt", b"latin-1 name")
    _bytes_file(tmp_path, b"r\xe9sum\xe9s/cv.md", b"# CV\n")
    _bytes_file(tmp_path, b"na\xefve.md", b"undecodable twin")
    _bytes_file(tmp_path, b"na\\xefve.md", b"the real name has a backslash")
    src = LocalFolderSource(tmp_path)
    listing = src.list_documents()
    ids = [d.source_id for d in listing.documents]
    assert ids == sorted(["caf\\xe9.txt", "r\\xe9sum\\xe9s/cv.md", "na\\xefve.md"])
    for sid in ids:
        sid.encode("utf-8")  # storable
    by_id = {d.source_id: d for d in listing.documents}
    assert src.fetch(by_id["caf\\xe9.txt"]) == b"latin-1 name"
    assert src.fetch(by_id["r\\xe9sum\\xe9s/cv.md"]) == b"# CV\n"
    assert src.fetch(by_id["na\\xefve.md"]) == b"the real name has a backslash"
    looked = src.lookup("caf\\xe9.txt")
    assert looked is not None and looked.size == len(b"latin-1 name")
    assert src.lookup("caf\\xe8.txt") is None  # another byte: no such file


def test_a_file_name_that_is_not_utf8_is_indexed_beside_the_others(tmp_path: Path, settings, store, embedder) -> None:
    """Before: ``UnicodeEncodeError`` (the id's surrogate) stopped the whole sync. Now the document is indexed
    under its ``\\xNN`` id and the others complete."""
    from rag_pipeline.pipeline.sync import sync_source

    _bytes_file(tmp_path, b"caf\xe9.txt", b"The cafe opened at dawn for the fishermen and closed at noon.")
    _bytes_file(tmp_path, b"ok.txt", b"The harbour master kept a ledger of every boat that came in.")
    report = sync_source(LocalFolderSource(tmp_path), store, embedder, settings)
    assert {d.source_id: d.status for d in report.documents} == {"caf\\xe9.txt": "completed", "ok.txt": "completed"}
    with store.connection() as conn:
        text = conn.execute("SELECT c.text FROM chunks c JOIN documents d ON d.id = c.document_id "
                            "WHERE d.source_id = %s", ("caf\\xe9.txt",)).fetchone()[0]
    assert "fishermen" in text
