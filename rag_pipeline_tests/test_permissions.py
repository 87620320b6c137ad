"""The permission core, source-independent: principals, group closure, the permission sync (fail closed,
apart from content), the pre-filtered query (exactly ``min(k, readable)`` rows on both query paths), the
re-check, the retrieval log and the documents the deletion guard holds back.

The source here is a real local folder whose *permission data* is a table the test controls (``TableAcl``):
the connectors' own permission reads are tested against their fake servers in ``test_permissions_<source>.py``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import pytest

from rag_pipeline.permissions import expand, parse_principal, sync_permissions
from rag_pipeline.permissions.groups import MAX_DEPTH, read_groups
from rag_pipeline.pipeline.sync import sync_source
from rag_pipeline.retrieval import AccessDenied, query, search
from rag_pipeline.sources.base import GroupMembers, Scope, SourceDocument, SourceError
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline_tests.routes import ROUTES, open_route


@pytest.fixture(params=ROUTES)
def route(request):
    """Each caller: ``sync_source`` (the CLI) and the Dagster partition route + ``source_permissions`` asset."""
    with open_route(request.param) as r:
        yield r

TEXTS = {
    "payroll.md": "# Payroll\n\nThe payroll run for March pays every salary on the 25th of the month.\n",
    "roadmap.md": "# Roadmap\n\nThe product roadmap ships the permission-aware index in the spring release.\n",
    "handbook.md": "# Handbook\n\nThe employee handbook explains holidays, sick leave and the office hours.\n",
    "board.md": "# Board minutes\n\nThe board approved the acquisition of the harbour warehouse in April.\n",
}


class TableAcl(LocalFolderSource):
    """A local folder whose permissions come from ``acl`` (source id -> principals) and ``groups`` (group ->
    members); ``failing`` ids and ``failing_groups`` cannot be read; ``reads`` counts permission calls."""

    def __init__(self, root, acl, groups=None):
        super().__init__(root)
        self.acl = acl
        self.groups = groups or {}
        self.failing: set[str] = set()
        self.failing_groups: set[str] = set()
        self.down = False
        self.reads = 0
        self.held_documents = None

    def permissions(self, documents: Sequence[SourceDocument]):
        self.reads += 1
        if self.down:
            raise SourceError("permission service unavailable")
        return {d.source_id: (Scope.unreadable("403 from the permission endpoint") if d.source_id in self.failing
                              else Scope.of(self.acl.get(d.source_id, ()))) for d in documents}

    def group_members(self, groups: Collection[str]):
        return GroupMembers({g: frozenset(self.groups[g]) for g in groups if g in self.groups
                             and g not in self.failing_groups},
                            {g: "group read failed" for g in groups if g in self.failing_groups})


def _folder(tmp_path, names=TEXTS):
    folder = tmp_path / "docs"
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_text(TEXTS[name])
    return folder


def _readable_docs(acl, groups, principal):
    """Ground truth, computed from the test's own tables: the documents ``principal`` may read."""
    mine = {principal, "everyone"}
    if "@" in principal:
        mine.add("domain:" + principal.rsplit("@", 1)[1])
    changed = True
    while changed:
        changed = False
        for g, members in groups.items():
            if g not in mine and mine & set(members):
                mine.add(g)
                changed = True
    return {sid for sid, principals in acl.items() if mine & set(principals)}


def _ask_all(store, embedder, principal):
    """Every chunk ``principal`` gets back for a question about each document (k = all chunks)."""
    out = set()
    for text in TEXTS.values():
        out |= {h.source_id for h in query(store, embedder, text, k=20, principals=[principal])}
    return out


@pytest.mark.parametrize("given, expected", [
    ("ada@Example.com", "user:ada@example.com"),
    ("user:Ada@Example.COM", "user:ada@example.com"),
    ("ada", "user:ada"),
    ("everyone", "everyone"),
    ("domain:Example.com", "domain:example.com"),
    ("group:gdrive:folder/x:Team@Example.com", "group:gdrive:folder/x:team@example.com"),
    ("group:staff", "group:staff"),
])
def test_principals_are_normalised(given, expected):
    assert parse_principal(given) == expected


@pytest.mark.parametrize("bad", ["", "   ", "role:admin", "user:", "domain:not a domain", "a\x00b", "x" * 600])
def test_bad_principals_are_refused(bad):
    with pytest.raises(ValueError):
        parse_principal(bad)


class _Groups:
    def __init__(self, members, errors=()):
        self.members, self.errors, self.asked = members, set(errors), []

    def group_members(self, groups):
        self.asked.append(sorted(groups))
        return GroupMembers({g: frozenset(self.members[g]) for g in groups if g in self.members and g not in self.errors},
                            {g: "denied" for g in groups if g in self.errors})


def test_group_closure_follows_nesting_cuts_loops_and_loses_only_what_failed():
    src = _Groups({"group:a": ["user:ada", "group:b"], "group:b": ["user:bob", "group:c", "group:a"],
                   "group:c": ["user:cy"], "group:d": ["user:dee"]}, errors={"group:c"})
    got = read_groups(src, ["group:a", "group:d"])
    assert got.closure["group:a"] == {"user:ada", "group:b", "user:bob", "group:c"}  # c's members: unreadable
    assert got.closure["group:b"] == {"user:bob", "group:c", "group:a", "user:ada"}
    assert "group:c" not in got.closure and got.errors == {"group:c": "denied"}
    assert got.closure["group:d"] == {"user:dee"}


def test_group_nesting_deeper_than_the_bound_is_unreadable():
    chain = {f"group:g{i}": [f"group:g{i + 1}", f"user:u{i}"] for i in range(MAX_DEPTH + 5)}
    got = read_groups(_Groups(chain), ["group:g0"])
    assert f"group:g{MAX_DEPTH}" in got.errors
    assert f"user:u{MAX_DEPTH - 1}" in got.closure["group:g0"] and f"user:u{MAX_DEPTH}" not in got.closure["group:g0"]


def test_a_query_must_name_its_principal(store, embedder):
    with pytest.raises(AccessDenied):
        query(store, embedder, "anything", k=3)


def test_permission_changes_reach_queries_with_zero_leaks(route, tmp_path, store, embedder, settings, fetches):
    acl = {"payroll.md": {"group:hr"}, "roadmap.md": {"domain:example.com"},
           "handbook.md": {"everyone"}, "board.md": {"user:cho@example.com"}}
    groups = {"group:hr": {"user:ada@example.com", "group:hr-leads"}, "group:hr-leads": {"user:bob@example.com"}}
    src = TableAcl(_folder(tmp_path), acl, groups)
    assert route(src, store, embedder, settings).exit_code == 0
    first = route.sync_permissions(src, store, embedder, settings)
    assert first["check_passed"] and first["unreadable"] == 0 and first["groups"] == 2
    people = ["ada@example.com", "bob@example.com", "cho@example.com", "dan@other.org"]
    leaks = served = 0
    fetched_before = len(fetches)

    def check():
        nonlocal leaks, served
        for person in people:
            allowed = _readable_docs(acl, groups, "user:" + person)
            got = _ask_all(store, embedder, person)
            leaks += len(got - allowed)
            assert got == allowed, (person, got, allowed)  # nothing leaked, nothing lost
            served += len(got)

    check()
    acl["board.md"] = set()                                   # a user removed from a file
    groups["group:hr"] = {"user:ada@example.com"}             # a nested group removed from a group
    acl["roadmap.md"] = {"user:dan@other.org"}                # domain sharing narrowed to one outsider
    perm = route.sync_permissions(src, store, embedder, settings)
    assert perm["updated"] == 2 and perm["mode"] == "full"
    check()
    assert len(fetches) == fetched_before  # permission changes fetch, extract and embed nothing
    assert leaks == 0 and served > 0


def test_unreadable_permissions_fail_closed_and_admins_still_see(route, tmp_path, store, embedder, settings):
    acl = {n: {"everyone"} for n in TEXTS}
    src = TableAcl(_folder(tmp_path), acl, {"group:hr": {"user:ada@example.com"}})
    assert route(src, store, embedder, settings).exit_code == 0
    route.sync_permissions(src, store, embedder, settings)
    src.failing = {"payroll.md"}
    report = route.sync_permissions(src, store, embedder, settings)
    assert report["unreadable"] == 1 and not report["check_passed"]
    with store.connection() as conn:
        row = conn.execute("SELECT principals, permissions_error FROM documents WHERE source_id = 'payroll.md'").fetchone()
    assert row == ([], "403 from the permission endpoint")
    assert "payroll.md" not in _ask_all(store, embedder, "ada@example.com")
    admin = query(store, embedder, TEXTS["payroll.md"], k=1, admin=True)
    assert admin[0].source_id == "payroll.md"

    src.failing, src.down = set(), True  # the whole permission service down: every document unreadable
    assert route.sync_permissions(src, store, embedder, settings)["unreadable"] == len(TEXTS)
    assert _ask_all(store, embedder, "ada@example.com") == set()
    src.down = False
    assert route.sync_permissions(src, store, embedder, settings)["check_passed"]
    assert _ask_all(store, embedder, "ada@example.com") == set(TEXTS)


def test_a_failed_group_read_never_widens_access(route, tmp_path, store, embedder, settings):
    acl = {"payroll.md": {"group:hr"}, "board.md": {"group:board"}, "roadmap.md": set(), "handbook.md": set()}
    groups = {"group:hr": {"user:ada@example.com"}, "group:board": {"user:ada@example.com", "user:bob@example.com"}}
    src = TableAcl(_folder(tmp_path), acl, groups)
    assert route(src, store, embedder, settings).exit_code == 0
    route.sync_permissions(src, store, embedder, settings)
    assert _ask_all(store, embedder, "bob@example.com") == {"board.md"}
    groups["group:board"] = {"user:ada@example.com"}  # bob leaves the board, and the next read of it fails
    src.failing_groups = {"group:board"}
    report = route.sync_permissions(src, store, embedder, settings)
    assert report["group_errors"] == 1 and not report["check_passed"]
    assert _ask_all(store, embedder, "bob@example.com") == set()          # revoked at once
    assert _ask_all(store, embedder, "ada@example.com") == {"payroll.md"}  # the unread group grants nothing
    src.failing_groups = set()
    route.sync_permissions(src, store, embedder, settings)
    assert _ask_all(store, embedder, "ada@example.com") == {"payroll.md", "board.md"}


def test_a_filtered_query_returns_exactly_min_k_readable_rows_on_both_paths(tmp_path, store, embedder, settings):
    acl = {"payroll.md": {"user:ada@example.com"}, "roadmap.md": {"everyone"}, "handbook.md": set(), "board.md": set()}
    src = TableAcl(_folder(tmp_path), acl)
    assert sync_source(src, store, embedder, settings).ok
    vector = embedder.embed([TEXTS["board.md"]])[0]
    with store.connection() as conn:
        readable = sorted(expand(conn, ["user:ada@example.com"]))
        eligible = conn.execute(
            "SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id AND d.version = c.version "
            "WHERE d.principals && %s::text[]", (readable,)).fetchone()[0]
        assert eligible == 2  # one chunk each: payroll.md, roadmap.md
        for exact_below, strategy in ((2000, "exact"), (0, "hnsw")):
            for k in (1, 2, 5):
                result = search(conn, vector, k=k, readable=readable, exact_below=exact_below)
                assert len(result.hits) == min(k, eligible)
                assert {h.source_id for h in result.hits} <= {"payroll.md", "roadmap.md"}
                assert result.strategy in ({strategy} if k <= eligible else {"hnsw+exact", "exact"})
                assert [h.score for h in result.hits] == sorted((h.score for h in result.hits), reverse=True)


def test_recheck_drops_what_the_source_revoked_since_the_last_sync_and_logs_it(tmp_path, store, embedder, settings):
    acl = {n: {"user:ada@example.com"} for n in TEXTS}
    src = TableAcl(_folder(tmp_path), acl)
    assert sync_source(src, store, embedder, settings).ok
    acl["payroll.md"] = set()  # revoked at the source; no permission sync yet
    stale = query(store, embedder, TEXTS["payroll.md"], k=1, principals=["ada@example.com"])
    assert stale[0].source_id == "payroll.md"  # the index has not heard yet: that is what the re-check is for
    fresh = query(store, embedder, TEXTS["payroll.md"], k=4, principals=["ada@example.com"], recheck=True,
                  sources={src.name: src})
    assert "payroll.md" not in {h.source_id for h in fresh} and len(fresh) == 3
    after = query(store, embedder, TEXTS["payroll.md"], k=4, principals=["ada@example.com"])
    assert "payroll.md" not in {h.source_id for h in after}  # the re-check wrote the source's answer back
    nothing = query(store, embedder, TEXTS["roadmap.md"], k=2, principals=["ada@example.com"], recheck=True, sources={})
    assert nothing == []  # a source not configured for the re-check cannot vouch: its hits are dropped
    with store.connection() as conn:
        rows = conn.execute("SELECT principals, admin, filtered_count, recheck_dropped, cardinality(document_ids) "
                            "FROM retrieval_log ORDER BY id").fetchall()
    assert rows[0] == (["user:ada@example.com"], False, 0, None, 1)
    assert rows[1][2:] == (0, 1, 3)        # before the drop the filter removed none; the re-check dropped payroll
    assert rows[2][2:] == (1, None, 3)     # now the filter itself removes payroll's chunk from the top 4
    assert rows[3][3:] == (2, 0)


def test_documents_held_by_the_guard_are_hidden_and_come_back_without_re_embedding(tmp_path, store, embedder, settings):
    acl = {n: {"everyone"} for n in TEXTS}
    folder = _folder(tmp_path)
    src = TableAcl(folder, acl)
    assert sync_source(src, store, embedder, settings).ok
    moved = tmp_path / "board.md"
    (folder / "board.md").rename(moved)  # 1 of 4 gone (25%): over the 20% guard
    report = sync_source(src, store, embedder, settings)
    assert not report.guard.passed and report.held_back == ["board.md"] and report.hidden == 1
    assert "board.md" not in _ask_all(store, embedder, "ada@example.com")
    assert query(store, embedder, TEXTS["board.md"], k=1, admin=True)[0].source_id != "board.md"
    moved.rename(folder / "board.md")
    back = sync_source(src, store, embedder, settings)
    assert back.ok and back.embedded == 0 and back.hidden == 0
    assert "board.md" in _ask_all(store, embedder, "ada@example.com")

    src.held_documents = "keep"  # the per-source policy that keeps them searchable
    (folder / "board.md").rename(moved)
    kept = sync_source(src, store, embedder, settings)
    assert not kept.guard.passed and kept.hidden == 0
    assert "board.md" in _ask_all(store, embedder, "ada@example.com")


def test_a_source_without_permission_data_is_readable_by_nobody_unless_a_default_scope_is_configured(
        tmp_path, store, embedder, settings):
    class Plain(LocalFolderSource):
        permissions = None  # a connector that carries no permission data
        group_members = None

    src = Plain(_folder(tmp_path, ["handbook.md"]))
    report = sync_source(src, store, embedder, settings)
    assert report.ok and "no default scope" in report.permissions.unreadable["handbook.md"]
    assert _ask_all(store, embedder, "ada@example.com") == set()
    src.default_principals = ["domain:example.com"]
    with store.connection() as conn:
        sync_permissions(src, conn, settings)
    assert _ask_all(store, embedder, "ada@example.com") == {"handbook.md"}
    assert _ask_all(store, embedder, "dan@other.org") == set()


def test_the_permission_sensor_requests_one_run_at_a_time():
    import dagster as dg

    from rag_pipeline.defs.permissions.jobs import build_permission_job, build_permission_sensor
    from rag_pipeline.defs.sources.config import spec_from_dict

    assert spec_from_dict({"name": "docs", "kind": "local", "path": "/tmp"}).permission_interval_s == 300  # default
    spec = spec_from_dict({"name": "docs", "kind": "local", "path": "/tmp", "permission_interval_s": 120})
    job = build_permission_job(spec)
    sensor = build_permission_sensor(spec, job)
    assert sensor.minimum_interval_seconds == 120 and sensor.default_status == dg.DefaultSensorStatus.RUNNING
    with dg.instance_for_test() as instance:
        result = sensor(dg.build_sensor_context(instance=instance))
        assert len(result.run_requests) == 1
        instance.add_run(dg.DagsterRun(job_name=job.name, run_id="r1", status=dg.DagsterRunStatus.STARTED))
        assert sensor(dg.build_sensor_context(instance=instance)).skip_reason


def test_a_large_k_stays_within_pgvectors_ef_search_bound(tmp_path, store, embedder, settings):
    src = TableAcl(_folder(tmp_path), {n: {"everyone"} for n in TEXTS})
    assert sync_source(src, store, embedder, settings).ok
    assert len(query(store, embedder, "payroll", k=400, admin=True)) == len(TEXTS)  # 4 * 400 > 1000
    assert len(query(store, embedder, "payroll", k=400, principals=["ada@example.com"])) == len(TEXTS)


def test_build_source_wires_the_acl_file_and_the_held_documents_policy(tmp_path, monkeypatch):
    from rag_pipeline.permissions.visibility import held_policy
    from rag_pipeline.sources import build_source

    folder = _folder(tmp_path, ["handbook.md"])
    acl = tmp_path / "acl.yaml"
    acl.write_text('rules:\n  - path: "**"\n    principals: ["group:staff"]\ngroups:\n  group:staff: ["user:ada"]\n')
    monkeypatch.delenv("RAG_LOCAL_ACL_FILE", raising=False)
    src = build_source("local", path=str(folder), acl_file=str(acl), held_documents="keep")
    (doc,) = src.list_documents().documents
    assert src.permissions([doc])["handbook.md"] == Scope.of({"group:staff"}) and held_policy(src) == "keep"
    monkeypatch.setenv("RAG_LOCAL_ACL_FILE", str(acl))  # the environment variable does the same
    assert build_source("local", path=str(folder)).permissions([doc])["handbook.md"] == Scope.of({"group:staff"})
    assert held_policy(build_source("local", path=str(folder))) == "hide"  # the default for a source with permissions
    with pytest.raises(ValueError, match="held_documents"):
        build_source("local", path=str(folder), held_documents="show")


def test_documented_query_defaults():
    from rag_pipeline import retrieval

    assert retrieval.EXACT_BELOW_DOCUMENTS == 2000  # README: "fewer than 2,000 documents and 10,000 chunks"
    assert retrieval.EXACT_BELOW_CHUNKS == 10_000
    assert retrieval.EF_SEARCH == 400
    assert retrieval.MAX_EF_SEARCH == 1000  # pgvector's bound
