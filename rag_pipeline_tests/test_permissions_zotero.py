"""Who may read a Zotero library's documents: the library is the unit, the key's real scope is checked,
a group's members come from the API; and a day of permission changes end to end.

The fake Zotero Web API (``fakes/zotero_server.py``) serves ``GET /keys/current`` and ``GET /groups/<id>``
as the dataserver does, and enforces the key's scope on the library's own requests; the group is the one
of ``../shared/fixtures/zotero/groups_doc.json``. Expected members are read from that fixture file here,
independently of the fake and of the connector.
"""

from __future__ import annotations

import json

import pytest

from rag_pipeline.permissions.principals import EVERYONE, parse_principal
from rag_pipeline.sources.base import SourceDocument
from rag_pipeline.sources.zotero import ZoteroSource
from rag_pipeline_tests.fakes.zotero_server import (
    FakeZoteroServer,
    group_from_fixture,
    linked_map,
    standard_library,
)

API_KEY = "zk-PERM-7c1e5b2d4f603f9a"
K = 200
"""Hits asked for per query in the end-to-end test (more than the library's chunks; ``hnsw.ef_search`` is
``4 * k`` and pgvector caps it at 1000)."""
USER_LIBRARY = "users/475425"


@pytest.fixture(scope="module")
def fixture_group(shared_dir) -> dict:
    """``data`` of the recorded group (owner, members, id) as the fixture file has it."""
    return json.loads((shared_dir / "fixtures" / "zotero" / "groups_doc.json").read_text())[0]["data"]


def docs(library: str, *ids: str) -> list[SourceDocument]:
    """Documents as the permission sync rebuilds them from index rows (metadata as the listing stored it)."""
    return [SourceDocument(source_id=i, title=i, uri="", metadata={"library": library}) for i in ids]


def source_for(server: FakeZoteroServer, library: str, *, api_key: str | None = API_KEY, **kwargs) -> ZoteroSource:
    return ZoteroSource(library, api_key=api_key, api_url=server.url, max_attempts=2, max_wait_s=0.01, timeout_s=5.0,
                        **kwargs)


@pytest.fixture
def user_server(shared_dir):
    lib, _ = standard_library(shared_dir)
    with FakeZoteroServer(lib, api_key=API_KEY) as srv:
        yield srv


@pytest.fixture
def group_server(shared_dir, fixture_group):
    gid = fixture_group["id"]
    lib, _ = standard_library(shared_dir, library_type="group", library_id=gid)
    group = group_from_fixture(shared_dir / "fixtures" / "zotero")
    with FakeZoteroServer(lib, api_key=API_KEY, groups=[group]) as srv:
        yield srv, group, f"groups/{gid}"


# ------------------------------------------------------------------------------------------ user library


def test_a_user_library_belongs_to_its_owner_with_one_key_check(user_server):
    source = source_for(user_server, USER_LIBRARY)
    scopes = source.permissions(docs(USER_LIBRARY, "AAAA1111", "BBBB2222") + [
        SourceDocument(source_id="CCCC3333", title="c", uri="")])  # a row without metadata.library
    assert {sid: (set(s.principals), s.error) for sid, s in scopes.items()} == {
        sid: ({"user:zotero:475425"}, None) for sid in ("AAAA1111", "BBBB2222", "CCCC3333")}
    assert [(r.path, r.status, r.authenticated) for r in user_server.api_requests()] == [("/keys/current", 200, True)]
    assert source.owner_principal == parse_principal("user:zotero:475425") and source.group_principal is None
    assert source.permissions([]) == {} and len(user_server.api_requests()) == 1  # nothing to read: no request
    answer = source.group_members(["group:zotero:users/475425:groups/1"])  # a user library issues no group
    assert not answer.members and "not a group issued" in answer.errors["group:zotero:users/475425:groups/1"]


def test_a_fresh_answer_from_the_library_stands_in_for_the_key_check_once(user_server):
    source = source_for(user_server, USER_LIBRARY, page_size=100)
    source.list_documents()
    user_server.requests.clear()
    assert source.permissions(docs(USER_LIBRARY, "AAAA1111"))["AAAA1111"].principals == {"user:zotero:475425"}
    assert user_server.api_requests() == []  # the listing just proved the key reads the library
    user_server.revoke_key()
    scope = source.permissions(docs(USER_LIBRARY, "AAAA1111"))["AAAA1111"]  # used up: asked again
    assert not scope.principals and "HTTP 403" in scope.error
    assert [r.path for r in user_server.api_requests()] == ["/keys/current"]
    stale = source_for(user_server, USER_LIBRARY, access_proof_s=0.0)
    user_server.key_revoked = False
    stale.list_documents()
    user_server.requests.clear()
    stale.permissions(docs(USER_LIBRARY, "AAAA1111"))
    assert [r.path for r in user_server.api_requests()] == ["/keys/current"]  # proof turned off


@pytest.mark.parametrize("change, why", [
    (lambda srv: srv.set_key_access({"user": {"library": False, "files": True}}), "no read access"),
    (lambda srv: srv.set_key_access({"groups": {"all": {"library": True, "write": False}}}), "no read access"),
    (lambda srv: setattr(srv, "key_user_id", 12345), "belongs to Zotero user 12345"),
    (lambda srv: srv.revoke_key(), "HTTP 403"),
    (lambda srv: srv.faults.rate_limit(10, retry_after="0", status=503), "HTTP 503"),
])
def test_a_key_that_cannot_read_the_user_library_makes_every_document_unreadable(user_server, change, why):
    source = source_for(user_server, USER_LIBRARY)
    change(user_server)
    scopes = source.permissions(docs(USER_LIBRARY, "AAAA1111", "BBBB2222"))
    for scope in scopes.values():
        assert not scope.principals and why in scope.error and USER_LIBRARY in scope.error
        assert API_KEY not in scope.error


def test_a_document_of_another_library_is_unreadable(user_server):
    scopes = source_for(user_server, USER_LIBRARY).permissions(docs("users/999", "AAAA1111"))
    assert not scopes["AAAA1111"].principals and "users/999" in scopes["AAAA1111"].error


def test_the_local_api_users_0_names_no_owner():
    scope = ZoteroSource("users/0", api_url="http://127.0.0.1:9/api").permissions(docs("users/0", "K"))["K"]
    assert not scope.principals and "does not say which Zotero user" in scope.error


# ------------------------------------------------------------------------------------------ group library


def test_a_private_group_library_belongs_to_its_members(group_server, fixture_group):
    srv, _, library = group_server
    source = source_for(srv, library, name="zotero:lab")
    principal = f"group:zotero:lab:groups/{fixture_group['id']}"
    assert source.group_principal == principal == parse_principal(principal)
    scopes = source.permissions(docs(library, "AAAA1111", "BBBB2222"))
    assert {s.error for s in scopes.values()} == {None}
    assert {frozenset(s.principals) for s in scopes.values()} == {frozenset({principal})}
    assert [r.path for r in srv.api_requests()] == ["/keys/current", f"/groups/{fixture_group['id']}"]
    answer = source.group_members([principal, "group:zotero:lab:groups/1", "group:other:x"])
    expected = {f"user:zotero:{u}" for u in [fixture_group["owner"], *fixture_group.get("admins", []),
                                             *fixture_group["members"]]}
    assert answer.members == {principal: expected}
    assert set(answer.errors) == {"group:zotero:lab:groups/1", "group:other:x"}


@pytest.mark.parametrize("type_, reading, public", [
    ("PublicOpen", "all", True), ("PublicClosed", "all", True), ("PublicClosed", "members", False),
    ("Private", "members", False)])
def test_a_public_group_readable_by_all_is_readable_by_everyone(group_server, type_, reading, public):
    srv, group, library = group_server
    group.set_type(type_, library_reading=reading)
    scope = source_for(srv, library).permissions(docs(library, "AAAA1111"))["AAAA1111"]
    assert scope.error is None
    assert scope.principals == ({f"group:zotero:{library}:{library}"} | ({EVERYONE} if public else set()))


def test_group_changes_show_on_the_next_read(group_server, fixture_group):
    srv, group, library = group_server
    source = source_for(srv, library)
    member = fixture_group["members"][-1]
    group.remove_member(member)
    group.add_member(4242, "admin")
    answer = source.group_members([source.group_principal])
    expected = {f"user:zotero:{u}" for u in [fixture_group["owner"], *fixture_group["members"]] if u != member}
    assert answer.members[source.group_principal] == expected | {"user:zotero:4242"}


@pytest.mark.parametrize("change, why", [
    (lambda srv, group: srv.set_key_access({"user": {"library": True}}), "no read access"),
    (lambda srv, group: srv.set_key_access({"groups": {"1": {"library": True}}}), "no read access"),
    (lambda srv, group: setattr(srv, "key_user_id", 9999), "HTTP 403"),  # 'all', but not a member
    (lambda srv, group: srv.revoke_key(), "HTTP 403"),
    (lambda srv, group: srv.groups.pop(group.id), "HTTP 404"),
    (lambda srv, group: srv.faults.rate_limit(10, retry_after="0", status=503), "HTTP 503"),
])
def test_a_failed_group_or_key_read_makes_every_document_unreadable(group_server, change, why):
    srv, group, library = group_server
    source = source_for(srv, library)
    change(srv, group)
    scopes = source.permissions(docs(library, "AAAA1111", "BBBB2222"))
    for scope in scopes.values():
        assert not scope.principals and why in scope.error and API_KEY not in scope.error


def test_explicit_group_access_is_enough(group_server, fixture_group):
    srv, _, library = group_server
    srv.set_key_access({"groups": {str(fixture_group["id"]): {"library": True, "write": False}}})
    scope = source_for(srv, library).permissions(docs(library, "AAAA1111"))["AAAA1111"]
    assert scope.error is None and scope.principals == {f"group:zotero:{library}:{library}"}


def test_a_failed_member_read_is_an_error_never_a_short_list(group_server):
    srv, _, library = group_server
    source = source_for(srv, library)
    srv.key_user_id = 9999  # no longer in the private group: 403 on /groups/<id>
    answer = source.group_members([source.group_principal])
    assert not answer.members and "HTTP 403" in answer.errors[source.group_principal]


def test_an_anonymous_client_reads_a_public_group_but_not_a_private_one(shared_dir, fixture_group):
    gid = fixture_group["id"]
    lib, _ = standard_library(shared_dir, library_type="group", library_id=gid)
    group = group_from_fixture(shared_dir / "fixtures" / "zotero", type="PublicOpen", library_reading="all")
    with FakeZoteroServer(lib, groups=[group]) as srv:  # no key at all
        source = source_for(srv, f"groups/{gid}", api_key=None)
        scope = source.permissions(docs(f"groups/{gid}", "AAAA1111"))["AAAA1111"]
        assert scope.error is None and EVERYONE in scope.principals
        assert [r.path for r in srv.api_requests()] == [f"/groups/{gid}/items/top", f"/groups/{gid}"]
        group.set_type("Private")
        scope = source.permissions(docs(f"groups/{gid}", "AAAA1111"))["AAAA1111"]
        assert not scope.principals and "HTTP 403" in scope.error


def test_the_fake_key_endpoints_answer_as_the_dataserver(group_server):
    import httpx2

    srv, _, _ = group_server
    with httpx2.Client(base_url=srv.url) as client:
        assert client.get("/keys/current").status_code == 403  # no key
        body = client.get("/keys/current", headers={"Zotero-API-Key": API_KEY}).json()
        assert set(body) == {"key", "userID", "username", "displayName", "access"}
        assert body["access"]["user"]["library"] is True and body["access"]["groups"]["all"]["library"] is True
        assert client.get("/keys/not-a-key").status_code == 404
        assert client.get("/groups/1").status_code == 404
        srv.revoke_key()
        answer = client.get("/keys/current", headers={"Zotero-API-Key": API_KEY})
        assert answer.status_code == 403 and answer.text == "Invalid key"


# ------------------------------------------------------------------------------------------ end to end


@pytest.mark.slow
def test_a_day_of_zotero_permission_changes(shared_dir, fixture_group, store, embedder, settings):
    from rag_pipeline.permissions import sync_permissions
    from rag_pipeline.pipeline.sync import sync_source
    from rag_pipeline.retrieval import query

    gid = fixture_group["id"]
    library = f"groups/{gid}"
    lib, k = standard_library(shared_dir, library_type="group", library_id=gid)
    group = group_from_fixture(shared_dir / "fixtures" / "zotero", type="PublicOpen", library_reading="all",
                               file_editing="none")
    queries = ["memorandum about the fake company", "Backus functional programming style and its algebra",
               "duplicate page in the memo"]
    owner, *members = (f"user:zotero:{u}" for u in [fixture_group["owner"], *fixture_group["members"]])
    leaving = members[-1]
    outsiders = ["user:zotero:999999", "user:ada@example.com"]
    everybody = [owner, *members, *outsiders]

    with FakeZoteroServer(lib, api_key=API_KEY, groups=[group]) as srv:
        source = source_for(srv, library, path_prefix_map=linked_map(shared_dir / "corpus"))
        report = sync_source(source, store, embedder, settings)
        completed = {d.source_id for d in report.documents if d.status == "completed"}
        assert completed == {k.memo, k.paper, k.linked, k.doomed}

        def sync() -> object:
            with store.connection() as conn:
                return sync_permissions(source, conn, settings)

        def check(allowed: dict[str, set[str]], previous: dict[str, set[str]] | None = None) -> int:
            """Leaks over every query as every principal (a hit of a document it may not read now); each
            principal gets back exactly what it may read (k covers every chunk of the library)."""
            leaks = 0
            for principal in everybody:
                for text in queries:
                    got = {h.source_id for h in query(store, embedder, text, k=K, principals=[principal])}
                    leaks += len(got - allowed[principal])
                    assert got == allowed[principal], (principal, text)
                    if previous is not None:
                        assert got <= previous[principal]
            return leaks

        assert sync().unreadable == {}
        with store.connection() as conn:
            (chunks,) = conn.execute("SELECT count(*) FROM chunks").fetchone()
        assert chunks <= K  # every query can return every chunk
        day1 = {p: completed for p in everybody}  # a public group readable by all
        assert check(day1) == 0

        group.set_type("Private")
        group.remove_member(int(leaving.rsplit(":", 1)[1]))
        report = sync()
        assert report.unreadable == {} and report.group_errors == {}
        day2 = {p: (completed if p in (owner, *members) and p != leaving else set()) for p in everybody}
        assert check(day2, previous=day1) == 0

        srv.set_key_access({"user": {"library": True, "files": True, "notes": True, "write": False}})  # no groups
        report = sync()
        assert set(report.unreadable) >= completed
        assert all("no read access" in reason for reason in report.unreadable.values())
        assert check({p: set() for p in everybody}, previous=day2) == 0

        srv.set_key_access({"groups": {str(gid): {"library": True, "write": False}}})  # given back
        assert sync().unreadable == {}
        assert check(day2) == 0
