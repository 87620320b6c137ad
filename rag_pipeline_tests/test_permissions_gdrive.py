"""GoogleDriveSource's permission side against the fake Drive v3 + Admin SDK Directory server (no database).

The real google-api-python-client (Drive v3 and admin directory_v1 discovery documents from the installed
package) and google-auth service-account credentials talk to ``fakes/gdrive_server.py``, which computes each
file's permissions from the grants on it and on its folders (and its shared drive's members), pages every
list by two and applies ``fields`` masks. Expected principals are written out by hand from the grants each
test makes.
"""

from __future__ import annotations

import json

import pytest

from rag_pipeline.sources.base import PermissionSource, SourceDocument, SourceError
from rag_pipeline.sources.gdrive import (
    DIRECTORY_MEMBERS_SCOPE,
    GoogleDriveSource,
    RetryPolicy,
    load_credentials,
)

from .fakes.gdrive_server import DOC, corpus_bytes, drive_env

FAST_RETRY = RetryPolicy(attempts=2, base_wait_s=0.01, max_wait_s=1.0)
OWNER = "user:owner@example.com"          # the fake's My Drive owner: on every My Drive item
ADMIN = "admin@example.com"               # the Workspace admin the service account acts as


@pytest.fixture
def drive(shared_dir, tmp_path):
    with drive_env(tmp_path) as env:
        env.fake.directory_readers.add(ADMIN)
        yield env


@pytest.fixture
def tree(drive):
    """Top/{memo.pdf, cups.csv, Sub/{plan (Doc), Deep/{table.md}}}."""
    f = drive.fake
    ids = {"top": f.add_folder("Top")}
    ids["sub"] = f.add_folder("Sub", ids["top"])
    ids["deep"] = f.add_folder("Deep", ids["sub"])
    ids["memo"] = f.add_file("memo.pdf", ids["top"], corpus_bytes("fake-memo.pdf"), "application/pdf")
    ids["cups"] = f.add_file("cups.csv", ids["top"], corpus_bytes("stanley-cups.csv"), "text/csv")
    ids["plan"] = f.add_native("Plan", ids["sub"], DOC, "application/vnd.openxmlformats-officedocument."
                               "wordprocessingml.document", corpus_bytes("docx-tables.docx"))
    ids["table"] = f.add_file("table.md", ids["deep"], corpus_bytes("simple-table.md"), "text/markdown")
    return ids


def _source(drive, *, directory: bool = False, **kwargs) -> GoogleDriveSource:
    env = dict(drive.env)
    if directory:
        env.update(RAG_GDRIVE_DIRECTORY_SUBJECT=ADMIN, RAG_GDRIVE_DIRECTORY_API_URL=drive.base_url + "/")
    env.update(kwargs.pop("env", {}))
    return GoogleDriveSource.from_env(env=env, **kwargs)


def _as_indexed(documents) -> list[SourceDocument]:
    """What the permission sync hands over: documents rebuilt from index rows (JSON metadata)."""
    return [SourceDocument(source_id=d.source_id, title=d.title, uri=d.uri, mime_type=d.mime_type,
                           metadata=json.loads(json.dumps(dict(d.metadata)))) for d in documents]


def _scopes(source: GoogleDriveSource) -> dict:
    return source.permissions(_as_indexed(source.list_documents().documents))


def test_the_source_is_a_permission_source(drive, tree):
    assert isinstance(_source(drive, folder_id=tree["top"]), PermissionSource)


@pytest.mark.parametrize("grant, link_sharing, expected", [
    # a user, whatever the case of the address Drive shows
    ({"kind": "user", "email": "Ada@Example.com"}, "none", {"user:ada@example.com"}),
    # a Google group: named by this source and the group's address
    ({"kind": "group", "email": "team@example.com"}, "none", {"group:{name}:team@example.com"}),
    # a domain, discoverable by search
    ({"kind": "domain", "domain": "example.com", "allow_discovery": True}, "none", {"domain:example.com"}),
    # "anyone at example.com with the link": still only signed-in domain users
    ({"kind": "domain", "domain": "example.com"}, "none", {"domain:example.com"}),
    # public on the web (findable): everyone
    ({"kind": "anyone", "allow_discovery": True}, "none", {"everyone"}),
    # anyone with the link: having the link is not a principal
    ({"kind": "anyone"}, "none", set()),
    # ... unless the deployment says a link-shared file is for everyone
    ({"kind": "anyone"}, "everyone", {"everyone"}),
])
def test_each_kind_of_permission_maps_to_its_principal(drive, tree, grant, link_sharing, expected):
    drive.fake.share(tree["memo"], **grant)
    source = _source(drive, folder_id=tree["top"], env={"RAG_GDRIVE_LINK_SHARING": link_sharing})
    scopes = _scopes(source)
    expected = {p.format(name=source.name) for p in expected}
    assert scopes[tree["memo"]].principals == frozenset({OWNER} | expected)
    assert scopes[tree["memo"]].error is None
    assert scopes[tree["cups"]].principals == frozenset({OWNER})     # untouched file: its owner only


@pytest.mark.parametrize("role", ["reader", "commenter", "writer", "fileOrganizer", "organizer", "owner"])
def test_every_role_can_read(drive, tree, role):
    drive.fake.share(tree["cups"], "user", email="bob@example.com", role=role)
    scopes = _scopes(_source(drive, folder_id=tree["top"]))
    assert scopes[tree["cups"]].principals == {OWNER, "user:bob@example.com"}


def test_a_deleted_account_grants_nothing(drive, tree):
    f = drive.fake
    f.share(tree["memo"], "user", email="gone@example.com")
    f.share(tree["memo"], "group", email="old-team@example.com")
    f.share(tree["memo"], "user", email="stays@example.com")
    f.mark_account_deleted("gone@example.com")
    f.mark_account_deleted("old-team@example.com")
    scopes = _scopes(_source(drive, folder_id=tree["top"]))
    assert scopes[tree["memo"]].principals == {OWNER, "user:stays@example.com"}


def test_a_folder_permission_is_inherited_by_everything_under_it(drive, tree):
    f = drive.fake
    f.share(tree["sub"], "user", email="bob@example.com", role="writer")
    f.share(tree["top"], "domain", domain="example.org")
    source = _source(drive, folder_id=tree["top"])
    scopes = _scopes(source)
    top_only = {OWNER, "domain:example.org"}
    assert scopes[tree["memo"]].principals == scopes[tree["cups"]].principals == top_only
    assert scopes[tree["plan"]].principals == scopes[tree["table"]].principals == top_only | {"user:bob@example.com"}
    # My Drive items carry their permissions on the file resource: no permissions.list was needed
    assert "permissions.list" not in [m for m, _ in f.requests]


def test_shared_drive_permissions_come_from_permissions_list(drive):
    f = drive.fake
    team = f.add_shared_drive("Team")
    f.share(team, "user", email="alice@example.com", role="organizer")
    f.share(team, "group", email="staff@example.com", role="reader")
    f.share(team, "user", email="carl@example.com", role="commenter")
    legal = f.add_folder("Legal", team)
    f.share(legal, "user", email="lawyer@example.com")
    contract = f.add_file("contract.md", legal, corpus_bytes("simple-table.md"), "text/markdown")
    notes = f.add_file("notes.csv", team, corpus_bytes("stanley-cups.csv"), "text/csv")
    source = _source(drive, shared_drive_id=team)
    before = len(f.requests)
    scopes = _scopes(source)
    members = {"user:alice@example.com", f"group:{source.name}:staff@example.com", "user:carl@example.com"}
    assert scopes[notes].principals == members
    assert scopes[contract].principals == members | {"user:lawyer@example.com"}
    calls = [p for m, p in f.requests[before:] if m == "permissions.list"]
    assert {p["fileId"] for p in calls} == {notes, contract}
    assert all(p["supportsAllDrives"] == "true" for p in calls)
    assert any("pageToken" in p for p in calls), "three or four permissions at two a page need several pages"


def test_a_permission_read_failing_for_one_file_makes_only_that_file_unreadable(drive, tree):
    f = drive.fake
    f.share(tree["memo"], "user", email="bob@example.com")
    f.cannot_share.add(tree["cups"])                # the caller may not see who else has cups.csv
    source = GoogleDriveSource(credentials=load_credentials(service_account_file=str(drive.key_file)),
                               folder_id=tree["top"], api_url=drive.api_url, retry=FAST_RETRY)
    documents = _as_indexed(source.list_documents().documents)
    f.delete(tree["table"])                         # gone since it was indexed
    scopes = source.permissions(documents)
    assert set(scopes) == {tree[k] for k in ("memo", "cups", "plan", "table")}
    assert scopes[tree["cups"]].principals == frozenset()
    assert "insufficientFilePermissions" in scopes[tree["cups"]].error
    assert scopes[tree["table"]].principals == frozenset() and "404" in scopes[tree["table"]].error
    assert scopes[tree["memo"]].principals == {OWNER, "user:bob@example.com"}
    assert scopes[tree["plan"]].principals == {OWNER} and scopes[tree["plan"]].error is None

    # a server error that outlasts the retries on one shared-drive file: that file only
    team = f.add_shared_drive()
    f.share(team, "user", email="alice@example.com")
    a = f.add_file("a.csv", team, b"a\n", "text/csv")
    b = f.add_file("b.csv", team, b"b\n", "text/csv")
    in_drive = GoogleDriveSource(credentials=load_credentials(service_account_file=str(drive.key_file)),
                                 shared_drive_id=team, api_url=drive.api_url, retry=FAST_RETRY)
    documents = sorted(_as_indexed(in_drive.list_documents().documents), key=lambda d: d.source_id)
    f.fail_next("permissions.list", 500, times=FAST_RETRY.attempts)
    scopes = in_drive.permissions(documents)
    assert [d.source_id for d in documents] == [a, b]
    assert scopes[a].principals == frozenset() and "HTTP 500" in scopes[a].error
    assert scopes[b].principals == {"user:alice@example.com"} and scopes[b].error is None


def test_a_failed_folder_listing_falls_back_to_reading_each_file(drive, tree):
    f = drive.fake
    f.share(tree["cups"], "user", email="bob@example.com")
    source = GoogleDriveSource(credentials=load_credentials(service_account_file=str(drive.key_file)),
                               folder_id=tree["top"], api_url=drive.api_url, retry=FAST_RETRY)
    documents = _as_indexed(source.list_documents().documents)
    before = len(f.requests)
    f.fail_next("files.list", 503, times=FAST_RETRY.attempts)   # the one listing of Top (memo and cups)
    scopes = source.permissions(documents)
    assert scopes[tree["cups"]].principals == {OWNER, "user:bob@example.com"}
    assert scopes[tree["memo"]].principals == {OWNER}
    gets = [p["fileId"] for m, p in f.requests[before:] if m == "files.get"]
    assert {tree["memo"], tree["cups"]} <= set(gets)


def test_groups_are_expanded_with_the_directory_api(drive, tree):
    f = drive.fake
    f.add_group("ops@example.com", "carol@example.com")
    f.add_member("ops@example.com", "dave@example.com", status="SUSPENDED")
    f.add_group("eng@example.com", "alice@example.com", "Bob@Example.com", "ops@example.com")
    f.add_member("eng@example.com", "C01abc", member_type="CUSTOMER")
    f.add_group("secret@example.com", "spy@example.com")
    f.hidden_groups.add("secret@example.com")
    source = _source(drive, folder_id=tree["top"], directory=True)
    g = f"group:{source.name}:"
    result = source.group_members([g + "eng@example.com", g + "ops@example.com", g + "secret@example.com",
                                   g + "missing@example.com", "group:gdrive:folder/other:eng@example.com"])
    assert result.members == {
        # direct and derived (through ops) members; the nested group itself; not the suspended user,
        # not the whole-customer member (no domain named)
        g + "eng@example.com": {"user:alice@example.com", "user:bob@example.com", "user:carol@example.com",
                                g + "ops@example.com"},
        g + "ops@example.com": {"user:carol@example.com"},
    }
    assert set(result.errors) == {g + "secret@example.com", g + "missing@example.com",
                                  "group:gdrive:folder/other:eng@example.com"}
    assert "403 forbidden" in result.errors[g + "secret@example.com"]
    assert "404 notFound" in result.errors[g + "missing@example.com"]
    calls = [p for m, p in f.requests if m == "members.list"]
    assert all(p["includeDerivedMembership"] == "true" for p in calls)
    assert any("pageToken" in p for p in calls), "eng's five derived members at two a page need pages"
    assert f"jwt:{drive.key.info['client_email']} as {ADMIN}" in f.token_grants


def test_without_directory_access_groups_grant_nothing(drive, tree):
    f = drive.fake
    f.add_group("eng@example.com", "alice@example.com")
    plain = _source(drive, folder_id=tree["top"])                       # no Directory credentials
    g = f"group:{plain.name}:eng@example.com"
    result = plain.group_members([g])
    assert result.members == {} and "no Directory API credentials" in result.errors[g]
    # credentials for the Directory scope, but the service account is no admin and acts as nobody
    undelegated = _source(drive, folder_id=tree["top"], env={"RAG_GDRIVE_DIRECTORY": "1",
                                                             "RAG_GDRIVE_DIRECTORY_API_URL": drive.base_url})
    result = undelegated.group_members([g])
    assert result.members == {} and "403 forbidden" in result.errors[g]
    # a Drive token is no Directory token
    drive_only = GoogleDriveSource(credentials=load_credentials(service_account_file=str(drive.key_file)),
                                   folder_id=tree["top"], api_url=drive.api_url,
                                   directory_credentials=load_credentials(service_account_file=str(drive.key_file),
                                                                          subject=ADMIN),
                                   directory_api_url=drive.base_url)
    result = drive_only.group_members([g])
    assert result.members == {} and "403 insufficientPermissions" in result.errors[g]


def test_a_group_read_timing_out_is_an_error_for_that_group_only(drive, tree):
    f = drive.fake
    f.add_group("slow@example.com", "alice@example.com")
    f.add_group("fast@example.com", "bob@example.com")
    key = str(drive.key_file)
    source = GoogleDriveSource(
        credentials=load_credentials(service_account_file=key), folder_id=tree["top"], api_url=drive.api_url,
        directory_credentials=load_credentials(service_account_file=key, scopes=(DIRECTORY_MEMBERS_SCOPE,),
                                               subject=ADMIN),
        directory_api_url=drive.base_url, timeout_s=0.5, retry=FAST_RETRY)
    g = f"group:{source.name}:"
    f.stall_next("members.list", 2.0, times=FAST_RETRY.attempts)
    result = source.group_members([g + "slow@example.com", g + "fast@example.com"])
    assert result.members == {g + "fast@example.com": {"user:bob@example.com"}}
    assert "Timeout" in result.errors[g + "slow@example.com"]


def test_the_change_feed_reports_permission_changes(drive, tree):
    f = drive.fake
    source = _source(drive, folder_id=tree["top"])
    first = source.permission_changes(None)
    assert first.changed_ids is None and first.next_cursor

    f.share(tree["memo"], "user", email="bob@example.com")
    second = source.permission_changes(first.next_cursor)
    assert second.changed_ids == [tree["memo"]] and second.next_cursor != first.next_cursor

    quiet = source.permission_changes(second.next_cursor)
    assert quiet.changed_ids == [] and quiet.next_cursor == second.next_cursor

    f.unshare(tree["memo"], f.permission_id("user", email="bob@example.com"))
    f.share(tree["sub"], "group", email="team@example.com")           # reaches plan and Deep/table
    third = source.permission_changes(quiet.next_cursor)
    assert sorted(third.changed_ids) == sorted([tree["memo"], tree["plan"], tree["table"]])

    # were Drive to report only the folder, its subtree is listed
    f._record(tree["sub"])
    fourth = source.permission_changes(third.next_cursor)
    assert sorted(fourth.changed_ids) == sorted([tree["plan"], tree["table"]])

    # a folder outside the scope changing is not walked
    elsewhere = f.add_folder("Elsewhere")
    f.add_file("x.csv", elsewhere, b"x\n", "text/csv")
    cursor = source.permission_changes(fourth.next_cursor).next_cursor
    before = len(f.requests)
    f._record(elsewhere)
    assert source.permission_changes(cursor).changed_ids == []
    assert not [p for m, p in f.requests[before:] if m == "files.list" and elsewhere in p.get("q", "")]


@pytest.mark.parametrize("cursor", ["gdriveperm1:999999", "gdriveperm1:", "gdrive1:abc", "garbage"])
def test_an_unusable_permission_cursor_means_read_everything(drive, tree, cursor):
    source = _source(drive, folder_id=tree["top"])
    result = source.permission_changes(cursor)
    assert result.changed_ids is None
    fresh = source.permission_changes(result.next_cursor)
    assert fresh.changed_ids == []          # the fresh token is current


def test_a_failing_feed_means_read_everything(drive, tree):
    source = GoogleDriveSource(credentials=load_credentials(service_account_file=str(drive.key_file)),
                               folder_id=tree["top"], api_url=drive.api_url, retry=FAST_RETRY)
    cursor = source.permission_changes(None).next_cursor
    drive.fake.share(tree["memo"], "user", email="bob@example.com")
    drive.fake.fail_next("changes.list", 503, times=FAST_RETRY.attempts)
    result = source.permission_changes(cursor)
    assert result.changed_ids is None and result.next_cursor


def test_settings_default_to_the_narrow_choice_and_are_checked(drive, tree, tmp_path):
    plain = _source(drive, folder_id=tree["top"])
    assert plain.link_sharing == "none"                       # "anyone with the link" grants nothing
    with pytest.raises(ValueError, match="link_sharing"):
        GoogleDriveSource(credentials=load_credentials(service_account_file=str(drive.key_file)),
                          folder_id=tree["top"], link_sharing="anyone")
    with pytest.raises(SourceError, match="RAG_GDRIVE_LINK_SHARING") as bad:
        _source(drive, folder_id=tree["top"], env={"RAG_GDRIVE_LINK_SHARING": "public"})
    assert not bad.value.transient
    token_file = tmp_path / "token.json"
    token_file.write_text(json.dumps({"type": "authorized_user", "client_id": "c", "client_secret": "s",
                                      "refresh_token": "r"}))
    with pytest.raises(SourceError, match="service-account key") as user_subject:
        load_credentials(oauth_token_file=str(token_file), subject=ADMIN)   # user tokens cannot delegate
    assert not user_subject.value.transient


def test_the_fake_leaves_permissions_out_where_drive_does(drive, tree):
    # Drive documents `permissions` as "not populated for items in shared drives" (permissionIds is),
    # and absent for files the caller may not share: the connector must fall back to permissions.list.
    from google.oauth2 import service_account
    from googleapiclient import discovery_cache
    from googleapiclient.discovery import build_from_document
    from googleapiclient.errors import HttpError

    f = drive.fake
    team = f.add_shared_drive()
    f.share(team, "user", email="alice@example.com")
    in_drive = f.add_file("a.csv", team, b"a\n", "text/csv")
    f.cannot_share.add(tree["cups"])
    service = build_from_document(
        discovery_cache.get_static_doc("drive", "v3"), client_options={"api_endpoint": drive.api_url},
        credentials=service_account.Credentials.from_service_account_info(
            drive.key.info, scopes=["https://www.googleapis.com/auth/drive.readonly"]))
    fields = "id,permissionIds,permissions(id,type,emailAddress,permissionDetails)"
    shared = service.files().get(fileId=in_drive, fields=fields, supportsAllDrives=True).execute()
    assert "permissions" not in shared and shared["permissionIds"] == [f.permission_id("user", email="alice@example.com")]
    hidden = service.files().get(fileId=tree["cups"], fields=fields).execute()
    assert "permissions" not in hidden and hidden["permissionIds"]
    mine = service.files().get(fileId=tree["table"], fields=fields).execute()
    assert {p["emailAddress"] for p in mine["permissions"]} == {"owner@example.com"}
    # a folder's grant shows on the file below it as inherited
    f.share(tree["sub"], "user", email="bob@example.com")
    mine = service.files().get(fileId=tree["table"], fields=fields).execute()
    bob = next(p for p in mine["permissions"] if p["emailAddress"] == "bob@example.com")
    assert bob["permissionDetails"] == [{"permissionType": "file", "role": "reader", "inherited": True}]
    listed = service.permissions().list(fileId=in_drive, supportsAllDrives=True,
                                        fields="permissions(emailAddress,permissionDetails)").execute()
    assert listed["permissions"] == [{"emailAddress": "alice@example.com", "permissionDetails": [
        {"permissionType": "member", "role": "reader", "inherited": True, "inheritedFrom": team}]}]
    with pytest.raises(HttpError, match="404"):
        service.permissions().list(fileId=in_drive).execute()       # shared-drive item without supportsAllDrives
