"""A day of Drive permission changes, end to end: the fake Drive + Directory server, the real connector,
the embedded PostgreSQL, the real model, ``sync_source`` / ``sync_permissions`` and permission-filtered
``query``.

After every change the permission sync runs and every affected person queries the index. Who may read
what is computed here, independently, from the fake's raw state (its grants on each file and folder and
its group memberships, not through the API or the connector). Every returned chunk of a document the
person may not read is a leak: there must be none, over every query. Everyone who still may read a
document must still get it.
"""

from __future__ import annotations

import pytest

from rag_pipeline.permissions import sync_permissions
from rag_pipeline.pipeline.sync import sync_source
from rag_pipeline.retrieval import query
from rag_pipeline.sources.gdrive import DOCX, GoogleDriveSource

from .fakes.gdrive_server import DOC, FakeDrive, corpus_bytes, drive_env

pytestmark = pytest.mark.slow

ADMIN = "admin@example.com"
PEOPLE = ["owner@example.com", "ada@example.com", "bob@example.com", "alice@example.com", "dave@example.com",
          "hank@example.com", "frank@example.com", "erin@example.com", "ivy@example.com", "yuri@example.org",
          "zed@elsewhere.org"]


# ---- the oracle: who may read a file, from the fake's own state ------------------------------------------

def _group_users(fake: FakeDrive, group: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """Active users in ``group``, directly or through nested groups."""
    out: set[str] = set()
    for member in fake.groups.get(group.lower(), []):
        email = member.get("email", "").lower()
        if member["type"] == "USER" and member.get("status") == "ACTIVE":
            out.add(email)
        elif member["type"] == "GROUP" and email not in seen:
            out |= _group_users(fake, email, seen | {group.lower()})
    return out


def may_read(fake: FakeDrive, file_id: str, email: str) -> bool:
    """Whether ``email`` may read ``file_id``: a live grant on the file or a folder above it names the user,
    a group holding them, their domain, or anyone findable on the web."""
    holders, current = [file_id], fake.files[file_id]
    while current.get("parents") and current["parents"][0] in fake.files:
        holders.append(current["parents"][0])
        current = fake.files[current["parents"][0]]
    for holder in holders:
        for grant in fake.grants.get(holder, []):
            if grant.get("deleted"):
                continue
            kind = grant["type"]
            if (kind == "user" and grant["emailAddress"].lower() == email
                    or kind == "group" and email in _group_users(fake, grant["emailAddress"])
                    or kind == "domain" and email.endswith("@" + grant["domain"])
                    or kind == "anyone" and grant["allowFileDiscovery"]):
                return True
    return False


# ---- queries -----------------------------------------------------------------------------------------------

class Audit:
    """Queries the index as each person and counts leaks against the oracle, over the whole day."""

    def __init__(self, store, embedder, fake: FakeDrive, documents: dict[str, str], source: str) -> None:
        self.store, self.embedder, self.fake, self.documents, self.source = store, embedder, fake, documents, source
        self.queries = 0
        self.leaks: list[tuple[str, str, str]] = []

    def chunk_count(self) -> int:
        with self.store.connection() as conn:
            return conn.execute(
                "SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id AND c.version = d.version "
                "WHERE d.source = %s AND d.status <> 'deleted'", (self.source,)).fetchone()[0]

    def visible(self, email: str) -> set[str]:
        """Source ids of every document ``email`` gets back (``k`` = every chunk of the source)."""
        self.queries += 1
        hits = query(self.store, self.embedder, "bottles of water, hockey cups, tables and slides",
                     k=self.chunk_count(), principals=[email])
        return {h.source_id for h in hits}

    def check(self, step: str, people=PEOPLE) -> dict[str, set[str]]:
        """Query as each of ``people``: no leak, and every document they may read comes back."""
        seen = {}
        for email in people:
            got = self.visible(email)
            allowed = {i for i in self.documents.values() if may_read(self.fake, i, email)}
            self.leaks += [(step, email, i) for i in got - allowed]
            assert allowed <= got, (step, email, "lost", allowed - got)
            seen[email] = got
        assert self.leaks == [], self.leaks
        return seen


@pytest.fixture
def drive(shared_dir, tmp_path):
    with drive_env(tmp_path, page_limit=3) as env:
        env.fake.directory_readers.add(ADMIN)
        yield env


def _permission_sync(store, source, settings):
    with store.connection() as conn:
        return sync_permissions(source, conn, settings)


def test_a_day_of_permission_changes(drive, store, embedder, settings):
    f = drive.fake
    top = f.add_folder("Top")
    sub = f.add_folder("Sub", top)
    deep = f.add_folder("Deep", sub)
    docs = {
        "memo": f.add_file("memo.pdf", top, corpus_bytes("fake-memo.pdf"), "application/pdf"),
        "cups": f.add_file("cups.csv", top, corpus_bytes("stanley-cups.csv"), "text/csv"),
        "table": f.add_file("table.md", top, corpus_bytes("simple-table.md"), "text/markdown"),
        "plan": f.add_native("Plan", sub, DOC, DOCX, corpus_bytes("docx-tables.docx")),
        "notes": f.add_file("notes.txt", deep, corpus_bytes("fake-text-utf-16.txt"), "text/plain"),
    }
    f.add_group("ops@example.com", "dave@example.com", "hank@example.com")
    f.add_group("eng@example.com", "alice@example.com", "ops@example.com")       # ops nested in eng
    f.share(docs["memo"], "user", email="ada@example.com")
    bob = f.share(docs["memo"], "user", email="bob@example.com", role="commenter")
    eng = f.share(docs["cups"], "group", email="eng@example.com")
    public = f.share(docs["table"], "anyone", allow_discovery=True)               # published on the web
    f.share(sub, "group", email="ops@example.com", role="writer")                  # Sub and Deep below it
    frank = f.share(sub, "user", email="frank@example.com")
    source = GoogleDriveSource.from_env(folder_id=top, env={
        **drive.env, "RAG_GDRIVE_DIRECTORY_SUBJECT": ADMIN, "RAG_GDRIVE_DIRECTORY_API_URL": drive.base_url + "/"})
    audit = Audit(store, embedder, f, docs, source.name)

    # morning: content and permissions synced together
    day = sync_source(source, store, embedder, settings)
    assert day.ok and len(day.documents) == 5, day
    assert day.permissions.mode == "full" and day.permissions.unreadable == {} and day.permissions.group_errors == {}
    seen = audit.check("morning")
    assert seen["bob@example.com"] == {docs["memo"], docs["table"]}
    assert seen["hank@example.com"] == {docs["cups"], docs["table"], docs["plan"], docs["notes"]}
    assert seen["zed@elsewhere.org"] == {docs["table"]}

    # 1. a user removed from a file
    f.unshare(docs["memo"], bob)
    report = _permission_sync(store, source, settings)
    assert report.mode == "changes" and report.unreadable == {}
    assert docs["memo"] not in audit.check("bob removed")["bob@example.com"]

    # 2. a group removed from a file: its members, nested ones too, lose it
    f.unshare(docs["cups"], eng)
    assert _permission_sync(store, source, settings).mode == "changes"
    seen = audit.check("eng removed")
    assert all(docs["cups"] not in seen[p] for p in ("alice@example.com", "dave@example.com", "hank@example.com"))

    # 3. a sharing link narrowed: published on the web -> anyone with the link (grants nothing)
    f.set_discoverable(docs["table"], public, False)
    _permission_sync(store, source, settings)
    seen = audit.check("link narrowed")
    assert seen["zed@elsewhere.org"] == set() and docs["table"] in seen["owner@example.com"]

    # 4. a user removed from a group (no Drive change at all: the groups are read again)
    f.remove_member("ops@example.com", "dave@example.com")
    report = _permission_sync(store, source, settings)
    assert report.group_errors == {}
    seen = audit.check("dave left ops")
    assert seen["dave@example.com"] == set()
    assert seen["hank@example.com"] == {docs["plan"], docs["notes"]}

    # 5. a folder's permissions change and are inherited below it (through a content sync this time)
    f.unshare(sub, frank)
    f.share(sub, "user", email="erin@example.com")
    f.share(top, "domain", domain="example.org")                    # anyone at example.org with the link
    day = sync_source(source, store, embedder, settings)
    assert day.ok and day.permissions.mode == "changes"
    seen = audit.check("folders re-shared")
    assert seen["frank@example.com"] == set()
    assert seen["erin@example.com"] == {docs["plan"], docs["notes"]}
    assert seen["yuri@example.org"] == set(docs.values())

    # 6. reads that fail leave nothing more visible than before
    before = seen
    f.cannot_share.add(docs["memo"])                                # memo's permissions can no longer be read
    f.share(docs["memo"], "user", email="ivy@example.com")          # ... while it is shared anew
    f.hidden_groups.add("ops@example.com")                          # and ops can no longer be listed
    report = _permission_sync(store, source, settings)
    assert set(report.unreadable) == {docs["memo"]} and "insufficientFilePermissions" in report.unreadable[docs["memo"]]
    assert set(report.group_errors) == {f"group:{source.name}:ops@example.com"}
    for email in PEOPLE:
        now = audit.visible(email)
        assert now <= before[email], (email, now - before[email])
        assert docs["memo"] not in now                              # readable by nobody: fail closed
    assert docs["plan"] not in audit.visible("hank@example.com")    # ops grants nothing while unread

    # evening: the reads work again and the index catches up with Drive
    f.cannot_share.discard(docs["memo"])
    f.hidden_groups.discard("ops@example.com")
    report = _permission_sync(store, source, settings)
    assert report.unreadable == {} and report.group_errors == {}
    seen = audit.check("evening")
    assert docs["memo"] in seen["ivy@example.com"] and docs["memo"] in seen["ada@example.com"]
    assert audit.queries >= 8 * len(PEOPLE) and audit.leaks == []
