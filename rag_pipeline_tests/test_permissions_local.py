"""Who may read a local folder's documents: the POSIX mapping, the ACL file, containment, and a day of
permission changes end to end.

Real files in temporary folders, ``chmod``/``chown``-ed to the system's own accounts (``root``,
``daemon``, ``bin``, ``nobody``, groups ``root``, ``daemon``, ``staff``, ``nogroup``): no account is created.
Expected scopes are written out by hand from the modes set here; the POSIX mapping is also checked against
the kernel itself: a forked child running as each account opens every file, and the scope must grant
exactly the accounts that could (``kernel_readers``). The tests run as root (to ``chown`` and fork).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag_pipeline.permissions.principals import EVERYONE
from rag_pipeline_tests.asuser import run_as
from rag_pipeline.sources.base import Scope, SourceDocument
from rag_pipeline.sources.local import (
    ACL_FILE_ENV,
    LocalFolderSource,
    _Accounts,
    _intersect,
    load_acl_file,
)

UID = {name: pwd.getpwnam(name).pw_uid for name in ("root", "daemon", "bin", "nobody")}
GID = {name: grp.getgrnam(name).gr_gid for name in ("root", "daemon", "staff", "nogroup")}


def free_id(taken: set[int], start: int = 54321) -> int:
    """An id with no entry in ``taken`` (a uid or gid the system has no name for)."""
    while start in taken:
        start += 1
    return start


UNNAMED_UID = free_id({p.pw_uid for p in pwd.getpwall()})
UNNAMED_GID = free_id({g.gr_gid for g in grp.getgrall()} | {p.pw_gid for p in pwd.getpwall()})


@pytest.fixture
def root() -> Iterator[Path]:
    """A source folder every account can reach (mode 755 under ``/tmp``; pytest's ``tmp_path`` sits under
    a mode-700 folder, which would keep the kernel check's children out)."""
    base = Path(tempfile.mkdtemp(prefix="rag-perm-"))
    base.chmod(0o755)
    folder = base / "docs"
    folder.mkdir()
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        for path, dirs, _ in os.walk(base):
            for d in dirs:
                os.chmod(os.path.join(path, d), 0o755, follow_symlinks=False)
        shutil.rmtree(base)


def put(path: Path, text: str, mode: int, owner: str | int = "root", group: str | int = "root") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chown(path, UID[owner] if isinstance(owner, str) else owner, GID[group] if isinstance(group, str) else group)
    path.chmod(mode)
    return path


def folder(path: Path, mode: int, owner: str = "root", group: str = "root") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, UID[owner], GID[group])
    path.chmod(mode)
    return path


def docs(*ids: str) -> list[SourceDocument]:
    """Documents as the permission sync rebuilds them from index rows (id, title, uri only)."""
    return [SourceDocument(source_id=i, title=i, uri="") for i in ids]


def principals(scopes, sid: str) -> set[str]:
    scope = scopes[sid]
    assert scope.error is None, scope.error
    return set(scope.principals)


def _openable(paths: list[Path]) -> list[str]:
    readable = []
    for p in paths:
        try:
            os.close(os.open(p, os.O_RDONLY | os.O_NONBLOCK))
            readable.append(str(p))
        except OSError:
            pass
    return readable


def kernel_readers(paths: list[Path], accounts: list[str]) -> dict[str, set[Path]]:
    """For each account, the ``paths`` a process running as it (uid, primary gid, its supplementary groups
    from the group database) can open for reading: the kernel's own answer, from a forked child."""
    found = {}
    for name in accounts:
        entry = pwd.getpwnam(name)
        supplementary = sorted({g.gr_gid for g in grp.getgrall() if name in g.gr_mem} | {entry.pw_gid})
        value = run_as(name, lambda: _openable(paths), groups=supplementary, timeout_s=30)
        found[name] = {Path(p) for p in value}
    return found


def grants(scope: Scope, account: str, source: LocalFolderSource) -> bool:
    """Whether ``scope`` lets ``account`` read: its user principal, ``everyone`` or a group that has it as
    a member (members from the source's own ``group_members``)."""
    me = f"user:{account}"
    if me in scope.principals or EVERYONE in scope.principals:
        return True
    groups = [p for p in scope.principals if p.startswith("group:")]
    answer = source.group_members(groups)
    return any(me in answer.members.get(g, ()) for g in groups)


# ------------------------------------------------------------------------------------------ POSIX mapping


def test_each_read_bit_maps_to_its_principal_and_only_read_bits_count(root):
    put(root / "all.md", "a", 0o644, "daemon", "nogroup")
    put(root / "owner.md", "o", 0o600, "daemon", "nogroup")
    put(root / "group.md", "g", 0o040, "daemon", "nogroup")
    put(root / "other.md", "t", 0o004, "daemon", "nogroup")
    put(root / "none.md", "n", 0o000, "daemon", "nogroup")
    put(root / "write-exec.md", "w", 0o333, "daemon", "nogroup")
    put(root / "everything.md", "e", 0o777, "bin", "staff")
    put(root / "unnamed.md", "u", 0o444, UNNAMED_UID, UNNAMED_GID)
    scopes = LocalFolderSource(root).permissions(docs(
        "all.md", "owner.md", "group.md", "other.md", "none.md", "write-exec.md", "everything.md", "unnamed.md"))
    assert principals(scopes, "all.md") == {"user:daemon", "group:nogroup", "everyone"}
    assert principals(scopes, "owner.md") == {"user:daemon"}
    assert principals(scopes, "group.md") == {"group:nogroup"}
    assert principals(scopes, "other.md") == {"everyone"}
    assert principals(scopes, "none.md") == set()  # readable by nobody, and no error: it was read
    assert principals(scopes, "write-exec.md") == set()
    assert principals(scopes, "everything.md") == {"user:bin", "group:staff", "everyone"}
    assert principals(scopes, "unnamed.md") == {f"user:uid:{UNNAMED_UID}", f"group:gid:{UNNAMED_GID}", "everyone"}


def test_every_folder_on_the_way_must_grant_search(root):
    folder(root / "team", 0o750, "root", "nogroup")
    put(root / "team" / "open.md", "x", 0o644, "daemon", "root")  # world-readable, in a folder of nogroup
    folder(root / "locked", 0o700, "daemon", "daemon")
    put(root / "locked" / "inside.md", "x", 0o644, "daemon", "daemon")
    folder(root / "passage", 0o711, "root", "root")
    put(root / "passage" / "through.md", "x", 0o644, "bin", "staff")
    folder(root / "a", 0o755)
    folder(root / "a" / "b", 0o750, "root", "staff")
    put(root / "a" / "b" / "deep.md", "x", 0o640, "daemon", "nogroup")
    scopes = LocalFolderSource(root).permissions(docs("team/open.md", "locked/inside.md", "passage/through.md",
                                                      "a/b/deep.md"))
    assert principals(scopes, "team/open.md") == {"user:root", "group:nogroup"}
    assert principals(scopes, "locked/inside.md") == {"user:daemon"}
    assert principals(scopes, "passage/through.md") == {"user:bin", "group:staff", "everyone"}
    # file: daemon or nogroup; folder b: root or staff. daemon is in neither staff nor is root, and staff and
    # nogroup share no member here: nobody at all.
    assert principals(scopes, "a/b/deep.md") == set()


def test_the_root_folder_itself_must_be_searchable(root):
    put(root / "f.md", "x", 0o644, "daemon", "daemon")
    root.chmod(0o700)  # owned by root
    assert principals(LocalFolderSource(root).permissions(docs("f.md")), "f.md") == {"user:root"}
    root.chmod(0o755)
    assert principals(LocalFolderSource(root).permissions(docs("f.md")), "f.md") == {
        "user:daemon", "group:daemon", "everyone"}


def test_the_mapping_agrees_with_the_kernel(root):
    """For every file and account, the scope grants the account exactly when the kernel lets it open the file
    (files whose owner is shut out by its own bits while others are let in, e.g. 0044, are left out: an
    allow-list cannot exclude; the module docstring says so)."""
    files = [
        put(root / "a.md", "x", 0o644, "daemon", "daemon"),
        put(root / "b.md", "x", 0o640, "root", "nogroup"),
        put(root / "c.md", "x", 0o600, "nobody", "nogroup"),
        put(root / "d.md", "x", 0o040, "root", "daemon"),
        put(root / "e.md", "x", 0o000, "daemon", "daemon"),
    ]
    folder(root / "g", 0o750, "root", "nogroup")
    files += [put(root / "g" / "f.md", "x", 0o644, "bin", "staff"), put(root / "g" / "h.md", "x", 0o604, "daemon", "root")]
    folder(root / "g" / "i", 0o710, "daemon", "daemon")
    files.append(put(root / "g" / "i" / "j.md", "x", 0o444, "daemon", "daemon"))
    folder(root / "k", 0o701, "bin", "root")
    files.append(put(root / "k" / "l.md", "x", 0o604, "bin", "staff"))
    source = LocalFolderSource(root)
    ids = [p.relative_to(root).as_posix() for p in files]
    scopes = source.permissions(docs(*ids))
    accounts = ["daemon", "bin", "nobody"]
    kernel = kernel_readers(files, accounts)
    for account in accounts:
        for path, sid in zip(files, ids):
            assert grants(scopes[sid], account, source) == (path in kernel[account]), (account, sid, scopes[sid])


def test_group_members_come_from_the_system_group_database(root):
    source = LocalFolderSource(root)
    unused_gid = free_id({g.gr_gid for g in grp.getgrall()} | {p.pw_gid for p in pwd.getpwall()})
    answer = source.group_members(["group:nogroup", "group:root", "group:staff", f"group:gid:{unused_gid}",
                                   "group:no-such-group-here", "group:gdrive:team@example.com", "user:bin"])
    expected_nogroup = {f"user:{p.pw_name}" for p in pwd.getpwall() if p.pw_gid == GID["nogroup"]}
    expected_nogroup |= {f"user:{m}" for m in grp.getgrnam("nogroup").gr_mem}
    assert "user:nobody" in expected_nogroup  # nobody's primary group is nogroup
    assert answer.members["group:nogroup"] == expected_nogroup
    assert "user:root" in answer.members["group:root"]
    assert answer.members["group:staff"] == {f"user:{m}" for m in grp.getgrnam("staff").gr_mem} | {
        f"user:{p.pw_name}" for p in pwd.getpwall() if p.pw_gid == GID["staff"]}
    assert answer.members[f"group:gid:{unused_gid}"] == set()
    assert set(answer.errors) == {"group:no-such-group-here", "group:gdrive:team@example.com", "user:bin"}
    assert "no such group" in answer.errors["group:no-such-group-here"]


def test_intersection_of_two_groups_is_written_out_as_their_common_users():
    accounts = _Accounts(user_names={1: "ada", 2: "bob", 3: "cy"}, group_names={10: "hr", 20: "it"},
                         group_gids={"hr": 10, "it": 20},
                         listed={10: frozenset({"user:bob"}), 20: frozenset({"user:bob", "user:cy"})},
                         primary={10: frozenset({"user:ada"}), 20: frozenset()})
    both = _intersect(frozenset({"group:hr"}), frozenset({"group:it"}), accounts)
    assert both == {"user:bob"}
    assert _intersect(frozenset({"user:ada", "group:it"}), frozenset({"group:hr"}), accounts) == {"user:ada", "user:bob"}
    assert _intersect(frozenset({EVERYONE}), frozenset({"user:cy"}), accounts) == {"user:cy"}
    assert _intersect(frozenset({"user:ada"}), frozenset({"user:cy", "group:it"}), accounts) == set()


# ------------------------------------------------------------------------------------------ containment


def test_permissions_refuse_what_fetch_refuses(root):
    put(root / "ok.md", "x", 0o644)
    put(root / ".hidden.md", "x", 0o644)
    outside = root.parent / "outside.md"
    put(outside, "secret", 0o644)
    folder(root / "pub", 0o755)
    folder(root / "hr", 0o750, "root", "staff")
    put(root / "hr" / "pay.md", "x", 0o640, "root", "staff")
    (root / "pub" / "out.md").symlink_to(outside)
    (root / "pub" / "pay.md").symlink_to(Path("..") / "hr" / "pay.md")
    (root / "loop.md").symlink_to("loop.md")
    folder(root / "dir.md", 0o755)
    os.mkfifo(root / "fifo.md")
    source = LocalFolderSource(root)
    ids = ["ok.md", ".hidden.md", "pub/out.md", "pub/pay.md", "loop.md", "dir.md", "fifo.md", "gone.md",
           "../outside.md", "/etc/passwd", "pub/../ok.md", "pub//ok.md"]
    scopes = source.permissions(docs(*ids))
    assert set(scopes) == set(ids)
    assert principals(scopes, "ok.md") == {"user:root", "group:root", "everyone"}
    # a symlink inside the root gets its target's scope (the target's folders included), never the link's
    assert principals(scopes, "pub/pay.md") == {"user:root", "group:staff"}
    reasons = {sid: scopes[sid].error for sid in ids if sid not in ("ok.md", "pub/pay.md")}
    assert all(reason and not scopes[sid].principals for sid, reason in reasons.items())
    assert "excluded" in reasons[".hidden.md"]
    assert "leaves the source folder" in reasons["pub/out.md"] and "secret" not in reasons["pub/out.md"]
    assert "symlink loop" in reasons["loop.md"]
    assert "not a regular file" in reasons["dir.md"] and "not a regular file" in reasons["fifo.md"]
    assert "No such file" in reasons["gone.md"]
    assert "'..'" in reasons["../outside.md"] and "absolute" in reasons["/etc/passwd"]
    assert "normalised" in reasons["pub//ok.md"] and "'..'" in reasons["pub/../ok.md"]


def test_a_missing_root_makes_every_document_unreadable(root):
    put(root / "a.md", "x", 0o644)
    source = LocalFolderSource(root)
    root.rename(root.parent / "unmounted")
    scopes = source.permissions(docs("a.md"))
    assert scopes["a.md"].error and not scopes["a.md"].principals
    assert source.permissions([]) == {}


# ------------------------------------------------------------------------------------------ ACL file

ACL = """
rules:            # the last rule whose glob matches a document's path wins
  - path: "**"
    principals: ["group:staff"]
  - path: "hr/**"
    principals: ["group:hr", "ADA@Example.com"]
  - path: "hr/public/*.md"
    principals: ["everyone"]
  - path: "**/*.draft"
    principals: []
groups:           # group principal -> members (users or groups; nesting allowed)
  group:hr: ["user:bob@example.com", "group:hr-leads"]
  group:hr-leads: ["carol@example.com"]
  group:staff: ["user:ada@example.com", "user:bob@example.com", "user:dave@example.com"]
"""


def test_acl_rules_the_last_match_wins_and_posix_is_ignored(root, tmp_path):
    acl = tmp_path / "acl.yaml"
    acl.write_text(ACL)
    put(root / "handbook.md", "x", 0o600, "daemon")  # POSIX would say daemon only
    put(root / "hr" / "pay.md", "x", 0o644)
    put(root / "hr" / "public" / "jobs.md", "x", 0o600)
    put(root / "hr" / "public" / "deep" / "old.md", "x", 0o644)  # '*' stays within one segment
    put(root / "notes" / "plan.draft", "x", 0o644)
    folder(root / "pub", 0o755)
    (root / "pub" / "pay.md").symlink_to(Path("..") / "hr" / "pay.md")
    source = LocalFolderSource(root, acl_file=acl)
    scopes = source.permissions(docs("handbook.md", "hr/pay.md", "hr/public/jobs.md", "hr/public/deep/old.md",
                                     "notes/plan.draft", "pub/pay.md"))
    assert principals(scopes, "handbook.md") == {"group:staff"}
    assert principals(scopes, "hr/pay.md") == {"group:hr", "user:ada@example.com"}
    assert principals(scopes, "hr/public/jobs.md") == {"everyone"}
    assert principals(scopes, "hr/public/deep/old.md") == {"group:hr", "user:ada@example.com"}
    assert principals(scopes, "notes/plan.draft") == set()
    assert principals(scopes, "pub/pay.md") == {"group:hr", "user:ada@example.com"}  # the target's rules
    answer = source.group_members(["group:hr", "group:hr-leads", "group:staff", "group:it"])
    assert answer.members == {"group:hr": {"user:bob@example.com", "group:hr-leads"},
                              "group:hr-leads": {"user:carol@example.com"},
                              "group:staff": {"user:ada@example.com", "user:bob@example.com", "user:dave@example.com"}}
    assert set(answer.errors) == {"group:it"} and "not defined" in answer.errors["group:it"]


def test_acl_a_path_no_rule_matches_is_readable_by_nobody_and_json_works(root, tmp_path):
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"rules": [{"path": "public/**", "principals": ["everyone"]}]}))
    put(root / "public" / "a.md", "x", 0o644)
    put(root / "private" / "b.md", "x", 0o644)
    scopes = LocalFolderSource(root, acl_file=acl).permissions(docs("public/a.md", "private/b.md", "../x.md"))
    assert principals(scopes, "public/a.md") == {"everyone"}
    assert not scopes["private/b.md"].principals and "no rule" in scopes["private/b.md"].error
    assert "private/b.md" in scopes["private/b.md"].error
    assert not scopes["../x.md"].principals and "'..'" in scopes["../x.md"].error  # containment still first


@pytest.mark.parametrize("text, problem", [
    (None, "cannot read"),
    ("rules: [path: '**'\n", "not valid YAML"),
    ("- path: '**'\n  principals: [everyone]\n", "expected a mapping"),
    ("rule:\n  - path: '**'\n    principals: [everyone]\n", "unknown top-level key"),
    ("rules:\n  - path: '**'\n", "exactly the keys"),
    ("rules:\n  - path: '**'\n    principals: everyone\n", "list of principals"),
    ("rules:\n  - path: '**'\n    principals: ['weird:thing']\n", "invalid principal"),
    ("rules:\n  - path: '**'\n    principals: [42]\n", "not a string"),
    ("rules:\n  - path: 'hr/**.md'\n    principals: [everyone]\n", "whole path segment"),
    ("rules:\n  - path: '/hr/**'\n    principals: [everyone]\n", "no leading '/'"),
    ("rules:\n  - path: 'hr/[ab'\n    principals: [everyone]\n", "unclosed"),
    ("rules: []\ngroups:\n  user:ada: [user:bob]\n", "not a group principal"),
    ("rules: []\ngroups: [group:hr]\n", "'groups' must map"),
])
def test_an_invalid_acl_file_makes_every_document_unreadable_with_the_reason(root, tmp_path, text, problem):
    acl = tmp_path / "acl.yaml"
    if text is not None:
        acl.write_text(text)
    put(root / "a.md", "x", 0o644)
    put(root / "hr" / "b.md", "x", 0o644)
    source = LocalFolderSource(root, acl_file=acl)
    scopes = source.permissions(docs("a.md", "hr/b.md"))
    for sid in ("a.md", "hr/b.md"):
        assert not scopes[sid].principals and problem in scopes[sid].error and str(acl) in scopes[sid].error
    answer = source.group_members(["group:hr"])
    assert not answer.members and problem in answer.errors["group:hr"]
    with pytest.raises(ValueError, match=problem):
        load_acl_file(acl)


def test_acl_file_is_read_again_and_from_env_reads_it(root, tmp_path):
    acl = tmp_path / "acl.yaml"
    acl.write_text("rules:\n  - path: '**'\n    principals: [everyone]\n")
    put(root / "a.md", "x", 0o644)
    source = LocalFolderSource.from_env(root, environ={ACL_FILE_ENV: str(acl)})
    assert source.acl_file == acl
    assert principals(source.permissions(docs("a.md")), "a.md") == {"everyone"}
    acl.write_text("rules:\n  - path: '**'\n    principals: [user:ada@example.com]\n")
    assert principals(source.permissions(docs("a.md")), "a.md") == {"user:ada@example.com"}
    assert LocalFolderSource.from_env(root, environ={}).acl_file is None
    assert LocalFolderSource.from_env(root, environ={ACL_FILE_ENV: ""}).acl_file is None
    other = tmp_path / "other.yaml"
    assert LocalFolderSource.from_env(root, environ={ACL_FILE_ENV: str(acl)}, acl_file=other).acl_file == other


# ------------------------------------------------------------------------------------------ end to end

TEXTS = {
    "public.md": "# Opening hours\n\nThe library opens at nine in the morning and closes at six in the evening.\n",
    "team/plan.md": "# Team plan\n\nThe lighthouse keepers will repaint the lamp room before the winter storms.\n",
    "private.md": "# Salary review\n\nThe quarterly bonus for the night shift rises by four percent next year.\n",
    "handbook.md": "# Staff handbook\n\nEvery employee may borrow two umbrellas from the front desk on rainy days.\n",
    "hr/salaries.md": "# Salaries\n\nThe head gardener earns more than the chief accountant since the last review.\n",
}


def visible(store, embedder, principal: str, k: int = 50) -> dict[str, set[str]]:
    """For each text of ``TEXTS`` used as a query, the source ids of the chunks ``principal`` gets back."""
    from rag_pipeline.retrieval import query

    return {sid: {h.source_id for h in query(store, embedder, text, k=k, principals=[principal])}
            for sid, text in TEXTS.items()}


def check_day(store, embedder, expected: dict[str, set[str]], previous: dict[str, set[str]] | None = None) -> int:
    """Query as every principal of ``expected`` (principal -> the documents it may read now, written out by
    the test) with every text; return the number of leaks (a returned chunk of a document the principal may
    not read), and assert that each principal gets back exactly what it may read (k covers every chunk) and,
    with ``previous``, nothing it could not read before."""
    leaks = 0
    for principal, allowed in expected.items():
        got = visible(store, embedder, principal)
        for text_id, returned in got.items():
            leaks += len(returned - allowed)
            assert returned == allowed, (principal, text_id, returned, allowed)
            if previous is not None:
                assert returned <= previous[principal], (principal, returned, previous[principal])
    return leaks


def permission_sync(source, store, settings):
    from rag_pipeline.permissions import sync_permissions

    with store.connection() as conn:
        return sync_permissions(source, conn, settings)


@pytest.mark.slow
def test_a_day_of_posix_permission_changes(root, store, embedder, settings):
    from rag_pipeline.pipeline.sync import sync_source

    put(root / "public.md", TEXTS["public.md"], 0o644)
    folder(root / "team", 0o750, "root", "nogroup")
    put(root / "team" / "plan.md", TEXTS["team/plan.md"], 0o640, "root", "nogroup")
    put(root / "private.md", TEXTS["private.md"], 0o600, "daemon", "daemon")
    source = LocalFolderSource(root, include=["public.md", "team/plan.md", "private.md"])
    report = sync_source(source, store, embedder, settings)
    assert {d.source_id for d in report.documents} == {"public.md", "team/plan.md", "private.md"}
    assert permission_sync(source, store, settings).unreadable == {}
    # who may read what, from the modes above: nobody and sync have nogroup as primary group
    day1 = {"user:root": {"public.md", "team/plan.md"}, "user:daemon": {"public.md", "private.md"},
            "user:nobody": {"public.md", "team/plan.md"}, "user:sync": {"public.md", "team/plan.md"},
            "user:bin": {"public.md"}}
    assert check_day(store, embedder, day1) == 0

    (root / "public.md").chmod(0o640)  # o-r: root and group root only
    os.chown(root / "private.md", UID["nobody"], GID["daemon"])  # now nobody's
    (root / "team").chmod(0o700)  # the team folder closed to its group
    report = permission_sync(source, store, settings)
    assert report.unreadable == {} and report.updated == 3
    day2 = {"user:root": {"public.md", "team/plan.md"}, "user:daemon": set(), "user:nobody": {"private.md"},
            "user:sync": set(), "user:bin": set()}
    assert check_day(store, embedder, day2) == 0

    moved = root.parent / "unmounted"
    root.rename(moved)  # the share is gone: no permission can be read
    report = permission_sync(source, store, settings)
    assert set(report.unreadable) == {"public.md", "team/plan.md", "private.md"}
    assert check_day(store, embedder, {p: set() for p in day2}, previous=day2) == 0
    moved.rename(root)
    assert permission_sync(source, store, settings).unreadable == {}
    assert check_day(store, embedder, day2) == 0


@pytest.mark.slow
def test_a_day_of_acl_file_changes(root, tmp_path, store, embedder, settings):
    from rag_pipeline.pipeline.sync import sync_source

    acl = tmp_path / "acl.yaml"
    acl.write_text(ACL)
    put(root / "handbook.md", TEXTS["handbook.md"], 0o600)
    put(root / "hr" / "salaries.md", TEXTS["hr/salaries.md"], 0o600)
    source = LocalFolderSource(root, acl_file=acl, include=["handbook.md", "hr/*"])
    sync_source(source, store, embedder, settings)
    assert permission_sync(source, store, settings).unreadable == {}
    ada, bob, carol, dave, eve = (f"user:{n}@example.com" for n in ("ada", "bob", "carol", "dave", "eve"))
    both = {"handbook.md", "hr/salaries.md"}
    # staff = ada, bob, dave; hr = bob + hr-leads (carol); hr/** also names ada
    day1 = {ada: both, bob: both, carol: {"hr/salaries.md"}, dave: {"handbook.md"}, eve: set()}
    assert check_day(store, embedder, day1) == 0

    acl.write_text("""
rules:
  - path: "**"
    principals: ["group:staff"]
  - path: "hr/**"
    principals: ["group:hr"]
groups:
  group:hr: ["group:hr-leads"]
  group:hr-leads: ["user:carol@example.com", "group:hr"]
  group:staff: ["user:ada@example.com", "user:bob@example.com"]
""")  # ada loses hr, bob leaves hr, dave leaves staff (and a loop hr <-> hr-leads)
    report = permission_sync(source, store, settings)
    assert report.unreadable == {} and report.group_errors == {}
    day2 = {ada: {"handbook.md"}, bob: {"handbook.md"}, carol: {"hr/salaries.md"}, dave: set(), eve: set()}
    assert check_day(store, embedder, day2) == 0

    acl.write_text("rules:\n  - path: '**'\n    principals: [everyone, 'bad principal:x']\n")  # invalid
    report = permission_sync(source, store, settings)
    assert set(report.unreadable) == both and all(str(acl) in r for r in report.unreadable.values())
    assert check_day(store, embedder, {p: set() for p in day2}, previous=day2) == 0
