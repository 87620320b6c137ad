"""A day of permission changes in a SharePoint library, end to end: content synced with ``sync_source``
through the fake Graph (HTTPS, msal) into the embedded PostgreSQL with the real model, then after each
change ``sync_permissions`` and queries as every person involved.

After every step each person's visible documents (a broad query whose ``k`` exceeds every chunk, plus
one query per document's phrase) are compared with who may read what, computed by the fake from its own
state (``FakeGraph.may_read``: grants, nested groups, links, folder inheritance, with this source's
policy: ``org_domain="contoso.com"``, anonymous links and site groups grant nothing). A *leak* is a
returned chunk of a document the person may not read: zero over every query. Everyone who may still read
a document gets it, except where the source could not be read, and then nothing is more visible than
before.
"""

from __future__ import annotations

import pytest

from rag_pipeline.permissions import sync_permissions
from rag_pipeline.pipeline.sync import sync_source
from rag_pipeline.retrieval import query
from rag_pipeline.sources.sharepoint import RetryPolicy, SharePointSource

from .fakes.gdrive_server import corpus_bytes
from .fakes.graph_server import FakeGraph
from .test_gdrive_sync import PHRASE, assert_index_equals
from .test_sharepoint_sync import ca_file, graph  # noqa: F401  (the fake Graph server behind a throwaway CA)

pytestmark = pytest.mark.slow

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
ORG = "contoso.com"
PEOPLE = ("ada", "bob", "cy", "dee", "eve", "frank", "gail")
EMAIL = {p: f"{p}@{'partner.example' if p == 'dee' else ORG}" for p in PEOPLE}   # dee is a guest
FILES = {"memo": ("memo.pdf", "fake-memo.pdf", "application/pdf"),
         "cups": ("cups.csv", "stanley-cups.csv", "text/csv"),
         "table": ("table.md", "simple-table.md", "text/markdown"),
         "tables": ("tables.docx", "docx-tables.docx", DOCX),
         "utf16": ("utf16.txt", "fake-text-utf-16.txt", "text/plain")}
BROAD_K = 250




def _library(g: FakeGraph) -> dict[str, str]:
    """root (site group "Members": frank) / {Team (group Team) / {memo.pdf (+ada), cups.csv (+group Fin),
    table.md (+organization link), Sub (+eve) / {tables.docx}}, Private (unique: ada) / {utf16.txt}}"""
    ids = {p: g.add_user(EMAIL[p]) for p in PEOPLE}
    ids["g_nested"] = g.add_group("Nested", [ids["cy"]])
    ids["g_team"] = g.add_group("Team", [ids["bob"], ids["g_nested"]], mail="team@contoso.com")
    ids["g_fin"] = g.add_group("Finance", [ids["dee"]])
    ids["sg_members"] = g.add_site_group("Fake Site Members", [ids["frank"]])
    g.grant(g.root_id, site_group=ids["sg_members"])
    ids["team"] = g.add_folder("Team")
    ids["sub"] = g.add_folder("Sub", ids["team"])
    ids["private"] = g.add_folder("Private")
    parents = {"memo": "team", "cups": "team", "table": "team", "tables": "sub", "utf16": "private"}
    for key, (name, corpus, mime) in FILES.items():
        ids[key] = g.add_file(name, ids[parents[key]], corpus_bytes(corpus), mime)
    ids["p_team"] = g.grant(ids["team"], group=ids["g_team"])
    ids["p_memo_ada"] = g.grant(ids["memo"], user=ids["ada"], roles=("write",))
    ids["p_cups_fin"] = g.grant(ids["cups"], group=ids["g_fin"])
    ids["p_table_org"] = g.create_link(ids["table"], "organization")
    g.grant(ids["sub"], user=ids["eve"])
    g.break_inheritance(ids["private"], copy_permissions=False)
    g.grant(ids["private"], user=ids["ada"])
    return ids


def _source(graph, ca_file) -> SharePointSource:
    return SharePointSource(drive_id=graph.drive_id, tenant_id=graph.tenant_id, client_id=graph.client_id,
                            client_secret=graph.client_secret, graph_url=graph.base_url + "/v1.0",
                            authority_url=graph.base_url, verify=ca_file[1], org_domain=ORG,
                            retry=RetryPolicy(attempts=2, base_wait_s=0.01))


class Audit:
    """Runs every person's queries and counts leaks against the fake's ground truth."""

    def __init__(self, graph, ids, store, embedder, source):
        self.graph, self.ids, self.store, self.embedder, self.source = graph, ids, store, embedder, source
        self.queries = 0
        self.leaks: list[tuple[str, str, str]] = []

    def truth(self, person: str) -> set[str]:
        """The documents ``person`` may read now (the fake's own state, this source's policy)."""
        return {key for key in FILES if self.graph.may_read(EMAIL[person], self.ids[key], org_domain=ORG)}

    def visible(self, person: str, step: str) -> set[str]:
        """The documents ``person``'s queries return; every returned chunk is checked for a leak."""
        by_id = {self.ids[key]: key for key in FILES}
        allowed = self.truth(person)
        seen: set[str] = set()
        texts = [("broad", "document", BROAD_K)] + [(key, PHRASE[FILES[key][1]], 3) for key in FILES]
        for label, text, k in texts:
            hits = query(self.store, self.embedder, text, k=k, principals=[EMAIL[person]])
            self.queries += 1
            for hit in hits:
                assert hit.source == self.source.name
                key = by_id[hit.source_id]
                if key not in allowed:
                    self.leaks.append((step, person, key))
                if label == "broad":
                    seen.add(key)
        return seen

    def everyone(self, step: str) -> dict[str, set[str]]:
        return {p: self.visible(p, step) for p in PEOPLE}


def _sync(source, store, settings, **kwargs):
    with store.connection() as conn:
        return sync_permissions(source, conn, settings, **kwargs)


def _chunks(store) -> int:
    with store.connection() as conn:
        return conn.execute("SELECT count(*) FROM chunks").fetchone()[0]


def test_a_day_of_permission_changes(graph, ca_file, store, embedder, settings):
    g = graph
    ids = _library(g)
    source = _source(graph, ca_file)
    audit = Audit(graph, ids, store, embedder, source)

    # morning: the content (and with it the first permission read) through the content sync
    day = sync_source(source, store, embedder, settings)
    assert day.ok and day.mode == "full"
    assert_index_equals(store, source.name, {ids[k]: (PHRASE[FILES[k][1]],) for k in FILES})
    assert _chunks(store) < BROAD_K                        # the broad query can return every readable chunk
    assert day.permissions is not None and day.permissions.unreadable == {}
    # the site group cannot be expanded through Graph: it is reported and grants nothing
    assert list(day.permissions.group_errors) == [f"group:{source.name}:sitegroup:{ids['sg_members']}"]
    seen = audit.everyone("morning")
    expected_morning = {"ada": {"memo", "table", "utf16"}, "bob": {"memo", "cups", "table", "tables"},
                        "cy": {"memo", "cups", "table", "tables"}, "dee": {"cups"},
                        "eve": {"table", "tables"}, "frank": {"table"}, "gail": {"table"}}
    assert seen == expected_morning == {p: audit.truth(p) for p in PEOPLE}

    def step(name: str, *, full: bool = False, mode: str = "changes"):
        report = _sync(source, store, settings, full=full)
        assert report.mode == mode, (name, report)
        visible = audit.everyone(name)
        truth = {p: audit.truth(p) for p in PEOPLE}
        assert visible == truth, name                  # nobody more, nobody less than the source says
        return report, visible

    # 1. a user removed from a file
    g.revoke(ids["memo"], ids["p_memo_ada"])
    report, seen = step("user removed from memo")
    assert "memo" not in seen["ada"] and seen["ada"] == {"table", "utf16"}
    assert report.read < len(FILES)                    # only what changed (and nothing unread) was read

    # 2. a group removed from a file
    g.revoke(ids["cups"], ids["p_cups_fin"])
    _, seen = step("group removed from cups")
    assert seen["dee"] == set() and "cups" in seen["bob"]

    # 3. a sharing link narrowed: organization -> specific people (eve)
    g.revoke(ids["table"], ids["p_table_org"])
    g.create_link(ids["table"], "users", users=[ids["eve"]])
    _, seen = step("link narrowed on table")
    assert "table" not in seen["frank"] | seen["gail"] | seen["ada"]
    assert "table" in seen["eve"] and "table" in seen["bob"]

    # 4. a user removed from a (nested) group: no drive item changes, the group is read again
    g.remove_member(ids["g_nested"], ids["cy"])
    _, seen = step("cy removed from Nested")
    assert seen["cy"] == set() and seen["bob"] == {"memo", "cups", "table", "tables"}

    # 5. a folder's permission changed, inherited by everything below it (Sub's tables.docx too)
    g.revoke(ids["team"], ids["p_team"])
    g.grant(ids["team"], group=ids["g_fin"])
    g.grant(ids["team"], user=ids["gail"])
    _, seen = step("Team folder regranted")
    assert seen["bob"] == set()
    assert seen["dee"] == seen["gail"] == {"memo", "cups", "table", "tables"}
    assert seen["eve"] == {"table", "tables"}

    # 6. reads that fail: one item's permissions (403) and one group's members (403). While they fail,
    #    the changes behind them must not show: nothing is more visible than before.
    before = seen
    g.grant(ids["memo"], user=ids["bob"])
    g.deny_permissions(ids["memo"])
    g.add_member(ids["g_fin"], ids["frank"])
    g.deny_group(ids["g_fin"])
    report = _sync(source, store, settings)
    assert "403 accessDenied" in report.unreadable[ids["memo"]]
    assert "403 Authorization_RequestDenied" in report.group_errors[f"group:{source.name}:{ids['g_fin']}"]
    during = audit.everyone("reads failing")
    for person in PEOPLE:
        assert during[person] <= before[person], person
        assert during[person] <= audit.truth(person), person
    assert not any("memo" in v for v in during.values())          # unreadable: nobody
    assert during["dee"] == set() and during["frank"] == set()    # Finance grants nothing while unread
    assert during["gail"] == {"cups", "table", "tables"}

    # 7. the reads work again, and meanwhile the delta token expired (410): everything is read again
    g.deny_permissions(ids["memo"], False)
    g.deny_group(ids["g_fin"], False)
    g.expire_tokens()
    report, seen = step("recovered after 410", mode="full")
    assert report.unreadable == {} and report.group_errors.keys() == {
        f"group:{source.name}:sitegroup:{ids['sg_members']}"}
    assert seen["bob"] == {"memo"} and seen["frank"] == {"memo", "cups", "table", "tables"}

    # evening: a content sync changes nothing about who reads what
    g.update_content(ids["cups"], corpus_bytes("stanley-cups.csv") + b"Seattle Kraken,Seattle,0\n")
    evening = sync_source(source, store, embedder, settings)
    assert evening.ok and evening.permissions is not None
    assert audit.everyone("evening") == {p: audit.truth(p) for p in PEOPLE}

    assert audit.leaks == [] and audit.queries == 9 * len(PEOPLE) * (1 + len(FILES))
