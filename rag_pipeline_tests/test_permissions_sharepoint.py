"""SharePointSource permissions against the fake Graph (HTTPS on 127.0.0.1, real msal and requests).

Each mapping rule of ``permissions()``, inheritance from folders, paging, one failing item, transitive
group membership (with a 403 and a 404), and the permission delta (``Prefer: deltashowsharingchanges``).
Expected principals are written out from what each test granted in the fake, never taken from the code.
"""

from __future__ import annotations

import pytest

from rag_pipeline.sources.base import (
    ListingIncompleteError,
    PermissionSource,
    SourceDocument,
    SourceError,
)
from rag_pipeline.sources.sharepoint import (
    RetryPolicy,
    SharePointSource,
    _PermissionState,
)

from .fakes.graph_server import FakeGraph
from .test_sharepoint import ca, ca_file  # noqa: F401  (a throwaway CA the client trusts)

FAST_RETRY = RetryPolicy(attempts=2, base_wait_s=0.01, max_wait_s=1.0)


@pytest.fixture
def graph(ca):
    fake = FakeGraph()
    with fake.serve(ca):
        yield fake


@pytest.fixture
def tree(graph):
    """root/{Shared/{memo.txt, cups.txt, Sub/{tables.txt}}, Private/{other.txt}} and the people."""
    g = graph
    ids = {"shared": g.add_folder("Shared")}
    ids["sub"] = g.add_folder("Sub", ids["shared"])
    ids["private"] = g.add_folder("Private")
    for key, name, parent in (("memo", "memo.txt", "shared"), ("cups", "cups.txt", "shared"),
                              ("tables", "tables.txt", "sub"), ("other", "other.txt", "private")):
        ids[key] = g.add_file(name, ids[parent], f"{name} body".encode(), "text/plain")
    for person in ("ada", "bob", "cy", "dee"):
        ids[person] = g.add_user(f"{person}@contoso.com")
    return ids


def make_source(graph: FakeGraph, ca_file: str, **kwargs) -> SharePointSource:
    kwargs.setdefault("retry", FAST_RETRY)
    return SharePointSource(drive_id=graph.drive_id, tenant_id=graph.tenant_id, client_id=graph.client_id,
                            client_secret=graph.client_secret, graph_url=graph.base_url + "/v1.0",
                            authority_url=graph.base_url, verify=ca_file, **kwargs)


def scopes_of(source, *item_ids):
    """``source.permissions`` of documents as the index rebuilds them (id, title, uri only)."""
    return source.permissions([SourceDocument(source_id=i, title=i, uri="") for i in item_ids])


def test_the_source_is_a_permission_source(graph, ca_file):
    source = make_source(graph, ca_file)
    assert isinstance(source, PermissionSource) and callable(source.permission_changes)


def test_a_user_grant_is_the_users_lower_cased_address(graph, tree, ca_file):
    upper = graph.add_user("Eve.Nakamura@Contoso.COM")
    graph.grant(tree["memo"], user=tree["ada"], roles=("write",))
    graph.grant(tree["memo"], user=upper)
    scope = scopes_of(make_source(graph, ca_file), tree["memo"])[tree["memo"]]
    assert scope.error is None
    assert scope.principals == {"user:ada@contoso.com", "user:eve.nakamura@contoso.com"}


def test_a_user_without_an_address_falls_back_to_the_login_name_then_the_object_id(graph, tree, ca_file):
    carol = graph.add_user("carol@contoso.com", mail=False, upn="carol.upn@contoso.com")
    graph.grant(tree["memo"], user=carol, email=False)                     # siteUser i:0#.f|membership|<upn>
    graph.grant(tree["cups"], user=tree["bob"], email=False, login_name=False)  # only the Entra object id
    scopes = scopes_of(make_source(graph, ca_file), tree["memo"], tree["cups"])
    assert scopes[tree["memo"]].principals == {"user:carol.upn@contoso.com"}
    assert scopes[tree["cups"]].principals == {f"user:graph:{tree['bob']}"}


def test_groups_and_site_groups(graph, tree, ca_file):
    team = graph.add_group("Team", [tree["bob"]], mail="team@contoso.com")
    visitors = graph.add_site_group("Fake Site Visitors", [tree["cy"]])
    graph.grant(tree["memo"], group=team)
    graph.grant(tree["memo"], site_group=visitors)
    source = make_source(graph, ca_file, name="sharepoint:lib")
    scope = scopes_of(source, tree["memo"])[tree["memo"]]
    site_group = f"group:sharepoint:lib:sitegroup:{visitors}"
    assert scope.principals == {f"group:sharepoint:lib:{team}", site_group}
    answer = source.group_members([f"group:sharepoint:lib:{team}", site_group])
    assert answer.members == {f"group:sharepoint:lib:{team}": frozenset({"user:bob@contoso.com"})}
    assert "cannot list its members" in answer.errors[site_group]   # grants nothing


def test_only_reading_roles_and_unexpired_permissions_grant(graph, tree, ca_file):
    graph.grant(tree["memo"], user=tree["ada"], roles=("owner",))
    graph.grant(tree["memo"], user=tree["bob"], roles=())                          # no role: nothing
    graph.create_link(tree["memo"], "users", users=[tree["cy"]], expires="2020-01-01T00:00:00Z")  # expired
    graph.create_link(tree["memo"], "users", users=[tree["dee"]], expires="0001-01-01T00:00:00Z")  # "never"
    scope = scopes_of(make_source(graph, ca_file), tree["memo"])[tree["memo"]]
    assert scope.principals == {"user:ada@contoso.com", "user:dee@contoso.com"}


@pytest.mark.parametrize(("kwargs", "organization", "anonymous"), [
    ({}, set(), set()),                                                     # neither grants anything
    ({"org_domain": "Contoso.com"}, {"domain:contoso.com"}, set()),
    ({"org_domain": ["contoso.com", "contoso.onmicrosoft.com"], "link_sharing": "everyone"},
     {"domain:contoso.com", "domain:contoso.onmicrosoft.com"}, {"everyone"}),
])
def test_sharing_links(graph, tree, ca_file, kwargs, organization, anonymous):
    graph.create_link(tree["memo"], "users", type="edit", users=[tree["ada"], tree["bob"]])
    graph.create_link(tree["cups"], "organization")
    graph.create_link(tree["other"], "anonymous")
    graph.create_link(tree["tables"], "existingAccess")
    scopes = scopes_of(make_source(graph, ca_file, **kwargs), tree["memo"], tree["cups"], tree["other"],
                       tree["tables"])
    assert scopes[tree["memo"]].principals == {"user:ada@contoso.com", "user:bob@contoso.com"}
    assert scopes[tree["cups"]].principals == organization
    assert scopes[tree["other"]].principals == anonymous
    assert scopes[tree["tables"]].principals == set() and scopes[tree["tables"]].error is None


def test_invalid_link_sharing_or_domain_is_refused(graph, ca_file):
    with pytest.raises(ValueError, match="link_sharing"):
        make_source(graph, ca_file, link_sharing="public")
    with pytest.raises(ValueError, match="domain"):
        make_source(graph, ca_file, org_domain="not a domain")


def test_from_env_reads_the_permission_settings():
    env = {"RAG_MS_TENANT_ID": "t", "RAG_MS_CLIENT_ID": "c", "RAG_MS_CLIENT_SECRET": "s",
           "RAG_MS_ORG_DOMAIN": "contoso.com, fabrikam.com", "RAG_MS_LINK_SHARING": "everyone"}
    source = SharePointSource.from_env(drive_id="b!x", env=env)
    assert source.org_domains == ("domain:contoso.com", "domain:fabrikam.com") and source.link_sharing == "everyone"
    plain = SharePointSource.from_env(drive_id="b!x", env={k: env[k] for k in list(env)[:3]})
    assert plain.org_domains == () and plain.link_sharing == "none"
    with pytest.raises(SourceError, match="RAG_MS_LINK_SHARING"):
        SharePointSource.from_env(drive_id="b!x", env={**env, "RAG_MS_LINK_SHARING": "anyone"})


@pytest.mark.parametrize("inherited_from", [True, False])
def test_permissions_inherited_from_folders(graph, tree, ca_file, inherited_from):
    graph.report_inherited_from = inherited_from       # SharePoint libraries leave inheritedFrom out
    team = graph.add_group("Team")
    graph.grant(tree["shared"], group=team)
    graph.grant(tree["sub"], user=tree["cy"])
    graph.grant(tree["tables"], user=tree["dee"])
    graph.grant(graph.root_id, user=tree["ada"], roles=("owner",))   # the library's owner
    source = make_source(graph, ca_file, name="sp")
    team_p = f"group:sp:{team}"
    scopes = scopes_of(source, tree["tables"], tree["memo"], tree["other"])
    assert scopes[tree["tables"]].principals == {"user:dee@contoso.com", "user:cy@contoso.com", team_p,
                                                 "user:ada@contoso.com"}
    assert scopes[tree["memo"]].principals == {team_p, "user:ada@contoso.com"}
    assert scopes[tree["other"]].principals == {"user:ada@contoso.com"}
    raw = graph.effective_permissions(tree["tables"])
    assert [p.get("inheritedFrom", {}).get("id") for p in raw] == [None, tree["sub"], tree["shared"], graph.root_id]

    graph.break_inheritance(tree["sub"], copy_permissions=False)      # Sub stops inheriting
    scopes = scopes_of(source, tree["tables"])
    assert scopes[tree["tables"]].principals == {"user:dee@contoso.com", "user:cy@contoso.com"}


def test_every_page_of_permissions_is_read(graph, tree, ca_file):
    people = [graph.add_user(f"p{n}@contoso.com") for n in range(7)]
    for person in people:
        graph.grant(tree["memo"], user=person)
    scope = scopes_of(make_source(graph, ca_file), tree["memo"])[tree["memo"]]
    assert scope.principals == {f"user:p{n}@contoso.com" for n in range(7)}
    pages = [q for p, q in graph.requests if p.endswith(f"/items/{tree['memo']}/permissions")]
    assert len(pages) == 4 and sum("$skiptoken" in q for q in pages) == 3     # 7 permissions, 2 a page


def test_one_failing_item_is_unreadable_and_the_others_are_read(graph, tree, ca_file):
    for key in ("memo", "cups", "tables"):
        graph.grant(tree[key], user=tree["ada"])
    graph.deny_permissions(tree["cups"])
    graph.delete(tree["tables"])
    source = make_source(graph, ca_file)
    scopes = scopes_of(source, tree["memo"], tree["cups"], tree["tables"])
    assert scopes[tree["memo"]].principals == {"user:ada@contoso.com"} and scopes[tree["memo"]].error is None
    assert scopes[tree["cups"]].principals == frozenset() and "403 accessDenied" in scopes[tree["cups"]].error
    assert scopes[tree["tables"]].principals == frozenset() and "404 itemNotFound" in scopes[tree["tables"]].error


def test_throttling_is_retried_and_then_the_item_is_unreadable(graph, tree, ca_file):
    graph.grant(tree["memo"], user=tree["ada"])
    source = make_source(graph, ca_file)
    graph.fail_next("permissions", 429, times=1, retry_after="0")
    assert scopes_of(source, tree["memo"])[tree["memo"]].principals == {"user:ada@contoso.com"}
    graph.fail_next("permissions", 503, times=2, retry_after="0")     # both attempts
    scope = scopes_of(source, tree["memo"])[tree["memo"]]
    assert scope.principals == frozenset() and "503" in scope.error


def test_no_token_means_nothing_could_be_read(graph, tree, ca_file):
    source = make_source(graph, ca_file)
    source._client_secret = "wrong"
    with pytest.raises(SourceError, match="invalid_client"):
        scopes_of(source, tree["memo"])
    with pytest.raises(SourceError, match="invalid_client"):
        source.group_members([f"group:{source.name}:x"])


def test_transitive_group_members(graph, tree, ca_file):
    graph.members_page_limit = 2
    printer = graph.add_device("printer-7")
    upn_only = graph.add_user("gus@contoso.com", mail=False, upn="gus@contoso.onmicrosoft.com")
    inner = graph.add_group("Inner", [tree["bob"], tree["cy"], upn_only])
    outer = graph.add_group("Outer", [tree["ada"], inner, printer])
    graph.add_member(inner, outer)                                     # a loop
    denied = graph.add_group("Secret", [tree["dee"]])
    graph.deny_group(denied)
    source = make_source(graph, ca_file, name="sp")
    outer_p, inner_p, denied_p = f"group:sp:{outer}", f"group:sp:{inner}", f"group:sp:{denied}"
    missing_p = "group:sp:00000000-0000-0000-0000-00000000dead"
    answer = source.group_members([outer_p, inner_p, denied_p, missing_p, "group:other-source:x"])
    people = {"user:bob@contoso.com", "user:cy@contoso.com", "user:gus@contoso.onmicrosoft.com"}
    assert answer.members[outer_p] == people | {"user:ada@contoso.com", inner_p}       # the device is nobody
    assert answer.members[inner_p] == people | {"user:ada@contoso.com", outer_p}
    assert set(answer.members) == {outer_p, inner_p}
    assert "403 Authorization_RequestDenied" in answer.errors[denied_p]
    assert "404 Request_ResourceNotFound" in answer.errors[missing_p]
    assert "not a group principal" in answer.errors["group:other-source:x"]
    outer_pages = [q for p, q in graph.requests if p == f"/v1.0/groups/{outer}/transitiveMembers"]
    assert len(outer_pages) == 3 and outer_pages[0]["$top"] == "999"   # 6 members, at most 2 a page


def test_a_failing_member_page_fails_that_group_only(graph, tree, ca_file):
    first = graph.add_group("First", [tree["ada"]])
    second = graph.add_group("Second", [tree["bob"]])
    source = make_source(graph, ca_file, name="sp")
    graph.fail_next("members", 503, times=2, retry_after="0")
    answer = source.group_members([f"group:sp:{first}", f"group:sp:{second}"])
    assert "503" in answer.errors[f"group:sp:{first}"]                  # groups are read in sorted order
    assert answer.members == {f"group:sp:{second}": frozenset({"user:bob@contoso.com"})}


# ---- the permission delta ---------------------------------------------------------------------

def test_no_cursor_reads_everything_and_starts_from_the_latest_token(graph, tree, ca_file):
    source = make_source(graph, ca_file)
    changes = source.permission_changes(None)
    assert changes.changed_ids is None and changes.next_cursor.startswith("graphperm1:")
    deltas = [q for p, q in graph.requests if p.endswith("/root/delta")]
    assert deltas == [{"token": "latest", "$select": "id,name,file,folder,root,deleted,parentReference"}]
    assert source.permission_changes(changes.next_cursor).changed_ids == []        # nothing since


def test_sharing_changes_through_delta(graph, tree, ca_file):
    source = make_source(graph, ca_file, path="Shared")
    cursor = source.permission_changes(None).next_cursor
    team = graph.add_group("Team")
    graph.grant(tree["memo"], user=tree["ada"])          # a file's sharing
    graph.grant(tree["sub"], group=team)                 # a folder's: every file below it
    graph.grant(tree["other"], user=tree["bob"])         # outside the scope
    changes = source.permission_changes(cursor)
    assert sorted(changes.changed_ids) == sorted([tree["memo"], tree["tables"]])
    assert source.permission_changes(changes.next_cursor).changed_ids == []

    deeper = graph.add_folder("Deeper", tree["sub"])     # a new folder in scope, a file in it
    inside = graph.add_file("inside.txt", deeper, b"x", "text/plain")
    graph.move(tree["other"], tree["shared"])            # a file moved in: it inherits from Shared now
    graph.revoke(tree["sub"], graph.permissions[tree["sub"]][0]["id"])
    later = source.permission_changes(changes.next_cursor)
    assert sorted(later.changed_ids) == sorted([inside, tree["other"], tree["tables"]])


def test_the_delta_asks_for_sharing_annotations(graph, tree, ca_file):
    source = make_source(graph, ca_file)
    cursor = source.permission_changes(None).next_cursor
    graph.grant(tree["shared"], user=tree["ada"])
    state = _PermissionState.decode(cursor)
    items, _ = source._delta(state.link, headers={"Prefer": "deltashowremovedasdeleted, deltatraversepermissiongaps, "
                                                            "deltashowsharingchanges, hierarchicalsharing"})
    assert {i for i, item in items.items() if item.get("@microsoft.graph.sharedChanged") == "True"} == {tree["shared"]}
    plain, _ = source._delta(state.link)                  # no Prefer: the same items, no annotation
    flat = source._delta(state.link, headers={"Prefer": "deltashowremovedasdeleted, deltatraversepermissiongaps, "
                                                        "deltashowsharingchanges"})[0]
    assert not any("@microsoft.graph.sharedChanged" in item for item in plain.values())
    below = {tree["shared"], tree["sub"], tree["memo"], tree["cups"], tree["tables"]}
    assert {i for i, item in flat.items() if item.get("@microsoft.graph.sharedChanged") == "True"} == below
    with pytest.raises(ListingIncompleteError, match="400 invalidRequest"):
        source._delta(state.link, headers={"Prefer": "deltashowsharingchanges"})


def test_whole_drive_folder_change_reports_every_file_below_it(graph, tree, ca_file):
    source = make_source(graph, ca_file)
    cursor = source.permission_changes(None).next_cursor
    graph.grant(tree["private"], user=tree["cy"])
    graph.update_content(tree["cups"], b"new body")        # content changes are read again too
    changes = source.permission_changes(cursor)
    assert sorted(changes.changed_ids) == sorted([tree["other"], tree["cups"]])


@pytest.mark.parametrize("where", ["root", "shared"])
def test_a_change_above_the_scope_reads_everything(graph, tree, ca_file, where):
    source = make_source(graph, ca_file, path="Shared/Sub")
    cursor = source.permission_changes(None).next_cursor
    graph.grant(graph.root_id if where == "root" else tree["shared"], user=tree["ada"])
    changes = source.permission_changes(cursor)
    assert changes.changed_ids is None and changes.next_cursor
    assert source.permission_changes(changes.next_cursor).changed_ids == []


def test_an_expired_token_or_a_bad_cursor_reads_everything(graph, tree, ca_file):
    source = make_source(graph, ca_file)
    cursor = source.permission_changes(None).next_cursor
    graph.grant(tree["memo"], user=tree["ada"])
    graph.expire_tokens()                                   # 410 resyncRequired
    changes = source.permission_changes(cursor)
    assert changes.changed_ids is None and changes.next_cursor != cursor
    graph.grant(tree["cups"], user=tree["ada"])
    assert source.permission_changes(changes.next_cursor).changed_ids == [tree["cups"]]
    assert source.permission_changes("graph1:not-mine").changed_ids is None
