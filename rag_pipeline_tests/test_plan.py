"""``pipeline.plan`` as tables: ``plan_document`` (every index status x every kind of listing change),
``retry_wait_s``, ``evaluate_guard`` (every verdict) and ``diff_documents`` (a whole listing or a change
feed's page against the index state). Pure functions: no database, no clock (``now=`` is passed), no sleep.

Expected values come from the docstrings of ``Decision``, ``plan_document``, ``evaluate_guard`` and
``diff_documents``; where a combination is not spelled out there, the case's comment states the reading.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

from rag_pipeline.config import Settings
from rag_pipeline.pipeline.plan import Decision, diff_documents, evaluate_guard, plan_document, retry_wait_s
from rag_pipeline.sources.base import SourceDocument
from rag_pipeline.store.index import IndexedDocument

D = Decision
NOW = datetime(2024, 6, 1, 12, 0, tzinfo=timezone.utc)
SHA_A, SHA_B = "a" * 64, "b" * 64
MODEL, OTHER_MODEL = (1,), (1, 2)
"""Kept embedding generations: the active one only; the active one and a new model's, being built."""
REASON = "Zotero linked_url attachment: a link to a web page, no file is stored"


def listed(sid: str = "report.pdf", **changes) -> SourceDocument:
    """A listed document: content hash A, version v1, title/uri/metadata as the index row below has them."""
    doc = SourceDocument(source_id=sid, title=f"Title of {sid}", uri=f"file:///{sid}", mime_type="application/pdf",
                         size=1234, source_version="v1", content_sha256=SHA_A, metadata={"author": "Ada"})
    return doc.replace(**changes)


def indexed(sid: str = "report.pdf", status: str = "completed", **changes) -> IndexedDocument:
    """An index row for ``listed(sid)``: same content, version, title, uri, metadata; 3 of 3 chunks stored
    by ``MODEL``; last touched 30 minutes before ``NOW``."""
    row = IndexedDocument(id=abs(hash(sid)) % 100_000 + 1, source_id=sid, status=status, version=1,
                          content_sha256=SHA_A, seen_sha256=SHA_A, source_version="v1", seen_source_version="v1",
                          failure_count=0, last_error=None, expected_chunk_count=3, stored_chunks=3,
                          title=f"Title of {sid}", uri=f"file:///{sid}", mime_type="application/pdf",
                          metadata={"author": "Ada"}, modified_at=None, updated_at=NOW - timedelta(minutes=30),
                          doc_type="pdf", generations=(1,))
    return dataclasses.replace(row, **changes)


# --- plan_document: every status x every kind of change ------------------------------------------------

# index status -> the row's fields (None: never indexed)
STATUSES: dict[str, dict | None] = {
    "new": None,
    "deleted": dict(status="deleted", stored_chunks=0),
    "pending": dict(status="pending"),
    "completed": {},
    "completed-incomplete": dict(stored_chunks=2),  # 2 of the 3 expected chunk rows
    "failed-due": dict(status="failed", failure_count=1, last_error="timeout",
                       updated_at=NOW - timedelta(hours=2)),  # waited 2 h, 1 h needed
    "failed-waiting": dict(status="failed", failure_count=1, last_error="timeout",
                           updated_at=NOW - timedelta(minutes=30)),  # waited 30 min, 1 h needed
    "permanently_failed": dict(status="permanently_failed", failure_count=1, last_error="password protected",
                               expected_chunk_count=None, stored_chunks=0),
    "skipped": dict(status="skipped", last_error="no text extracted", expected_chunk_count=None, stored_chunks=0),
}

# kind of change -> (listing fields, row fields, configured model)
CHANGES: dict[str, tuple[dict, dict, str | None]] = {
    "same": ({}, {}, MODEL),
    "hash-differs": (dict(content_sha256=SHA_B), {}, MODEL),
    "hash-same-version-differs": (dict(source_version="v2"), {}, MODEL),
    "no-hash-version-same": (dict(content_sha256=None), {}, MODEL),
    "no-hash-version-differs": (dict(content_sha256=None, source_version="v2"), {}, MODEL),
    "no-hash-no-version": (dict(content_sha256=None, source_version=None), {}, MODEL),
    "skip-reason-as-stored": (dict(skip_reason=REASON), dict(last_error=REASON), MODEL),
    "skip-reason-new": (dict(skip_reason=REASON), {}, MODEL),  # the row's last_error is another text (or none)
    "title": (dict(title="Renamed report"), {}, MODEL),
    "uri": (dict(uri="file:///archive/report.pdf"), {}, MODEL),
    "metadata": (dict(metadata={"author": "Ada", "year": 2024}), {}, MODEL),
    "model-differs": ({}, {}, OTHER_MODEL),
}


def case(status: str, change: str, expected: Decision):
    return pytest.param(status, change, expected, id=f"{status}/{change}")


MATRIX = [
    # never indexed: whatever the listing says, the document is added (a skip_reason is recorded by the
    # ADD attempt itself: steps raise DocumentSkipped -> permanently_failed; SKIP is for known rows)
    case("new", "same", D.ADD),  # not in the index: add
    case("new", "hash-differs", D.ADD),  # no row to compare with: add
    case("new", "hash-same-version-differs", D.ADD),  # no row to compare with: add
    case("new", "no-hash-version-same", D.ADD),  # no hash needed to add
    case("new", "no-hash-version-differs", D.ADD),  # no row to compare with: add
    case("new", "no-hash-no-version", D.ADD),  # nothing to compare: add, not CHECK
    case("new", "skip-reason-as-stored", D.ADD),  # reading: ADD comes first; the attempt records the skip
    case("new", "skip-reason-new", D.ADD),  # reading: ADD comes first; the attempt records the skip
    case("new", "title", D.ADD),  # add carries the listed title
    case("new", "uri", D.ADD),  # add carries the listed uri
    case("new", "metadata", D.ADD),  # add carries the listed metadata
    case("new", "model-differs", D.ADD),  # add embeds with the configured model
    # a tombstone listed again is added, whatever it held before ("a tombstone listed again")
    case("deleted", "same", D.ADD),  # same bytes as before deletion: still ADD (revived)
    case("deleted", "hash-differs", D.ADD),  # tombstone back with other bytes: ADD
    case("deleted", "hash-same-version-differs", D.ADD),  # tombstone back: ADD
    case("deleted", "no-hash-version-same", D.ADD),  # tombstone back: ADD
    case("deleted", "no-hash-version-differs", D.ADD),  # tombstone back: ADD
    case("deleted", "no-hash-no-version", D.ADD),  # tombstone back: ADD, not CHECK
    case("deleted", "skip-reason-as-stored", D.ADD),  # tombstone check precedes the skip check
    case("deleted", "skip-reason-new", D.ADD),  # tombstone check precedes the skip check
    case("deleted", "title", D.ADD),  # tombstone back renamed: ADD
    case("deleted", "uri", D.ADD),  # tombstone back moved: ADD
    case("deleted", "metadata", D.ADD),  # tombstone back with new metadata: ADD
    case("deleted", "model-differs", D.ADD),  # a tombstone has no chunks to re-embed: ADD
    # pending (interrupted, or an operator's retry): the attempt is redone whatever the listing says,
    # except a source skip_reason, which wins over everything but ADD
    case("pending", "same", D.PENDING),  # interrupted attempt: redo it
    case("pending", "hash-differs", D.PENDING),  # reading: the redo fetches the new bytes anyway
    case("pending", "hash-same-version-differs", D.PENDING),  # redo
    case("pending", "no-hash-version-same", D.PENDING),  # redo
    case("pending", "no-hash-version-differs", D.PENDING),  # redo fetches anyway
    case("pending", "no-hash-no-version", D.PENDING),  # redo, not CHECK
    case("pending", "skip-reason-as-stored", D.SKIP),  # same last_error but status not terminal: SKIP
    case("pending", "skip-reason-new", D.SKIP),  # the source refuses it now: SKIP
    case("pending", "title", D.PENDING),  # the redo writes the new title
    case("pending", "uri", D.PENDING),  # the redo writes the new uri
    case("pending", "metadata", D.PENDING),  # the redo writes the new metadata
    case("pending", "model-differs", D.PENDING),  # the redo embeds with the configured model
    # completed and complete: content first, then rows, then model, then metadata
    case("completed", "same", D.UNCHANGED),  # nothing moved: nothing to do
    case("completed", "hash-differs", D.CHANGE),  # new bytes: re-ingest
    case("completed", "hash-same-version-differs", D.METADATA),  # hash decides content; the version is metadata
    case("completed", "no-hash-version-same", D.UNCHANGED),  # version compared when there is no hash: same
    case("completed", "no-hash-version-differs", D.CHANGE),  # version compared when there is no hash: changed
    case("completed", "no-hash-no-version", D.CHECK),  # nothing to compare: fetch and hash
    case("completed", "skip-reason-as-stored", D.SKIP),  # a completed row is not terminal: record the skip
    case("completed", "skip-reason-new", D.SKIP),  # the source now refuses a completed document: SKIP
    case("completed", "title", D.METADATA),  # rename: update the row only
    case("completed", "uri", D.METADATA),  # move: update the row only
    case("completed", "metadata", D.METADATA),  # metadata: update the row only
    case("completed", "model-differs", D.REEMBED),  # chunks from another model: new vectors
    # completed with rows missing: REPAIR outranks REEMBED and METADATA, not a content change or CHECK
    case("completed-incomplete", "same", D.REPAIR),  # 2 of 3 rows: repair
    case("completed-incomplete", "hash-differs", D.CHANGE),  # new bytes: re-ingest (repairs too)
    case("completed-incomplete", "hash-same-version-differs", D.REPAIR),  # same content, rows missing
    case("completed-incomplete", "no-hash-version-same", D.REPAIR),  # same version, rows missing
    case("completed-incomplete", "no-hash-version-differs", D.CHANGE),  # new version: re-ingest
    case("completed-incomplete", "no-hash-no-version", D.CHECK),  # reading: fetch first (steps re-ingest)
    case("completed-incomplete", "skip-reason-as-stored", D.SKIP),  # skip wins over repair
    case("completed-incomplete", "skip-reason-new", D.SKIP),  # skip wins over repair
    case("completed-incomplete", "title", D.REPAIR),  # reading: repair first, metadata on a later plan
    case("completed-incomplete", "uri", D.REPAIR),  # reading: repair first
    case("completed-incomplete", "metadata", D.REPAIR),  # reading: repair first
    case("completed-incomplete", "model-differs", D.REPAIR),  # repair outranks re-embedding
    # failed within the limit, backoff passed: RETRY unless the content changed (CHANGE) or a skip
    case("failed-due", "same", D.RETRY),  # same content, backoff passed: retry
    case("failed-due", "hash-differs", D.CHANGE),  # new bytes: a fresh attempt, not a retry
    case("failed-due", "hash-same-version-differs", D.RETRY),  # the hash decides: same content
    case("failed-due", "no-hash-version-same", D.RETRY),  # same version: retry
    case("failed-due", "no-hash-version-differs", D.CHANGE),  # new version: fresh attempt
    case("failed-due", "no-hash-no-version", D.RETRY),  # reading: no CHECK for failed, the retry fetches
    case("failed-due", "skip-reason-as-stored", D.SKIP),  # failed is not terminal: record the skip
    case("failed-due", "skip-reason-new", D.SKIP),  # the source refuses it: SKIP
    case("failed-due", "title", D.RETRY),  # reading: metadata rides on the retry
    case("failed-due", "uri", D.RETRY),  # reading: metadata rides on the retry
    case("failed-due", "metadata", D.RETRY),  # reading: metadata rides on the retry
    case("failed-due", "model-differs", D.RETRY),  # no current chunks of its own to re-embed: retry
    # failed within the limit, backoff not passed: BACKOFF, but new content does not wait
    case("failed-waiting", "same", D.BACKOFF),  # 30 min of 1 h: wait
    case("failed-waiting", "hash-differs", D.CHANGE),  # new bytes do not wait for the backoff
    case("failed-waiting", "hash-same-version-differs", D.BACKOFF),  # same content: wait
    case("failed-waiting", "no-hash-version-same", D.BACKOFF),  # same version: wait
    case("failed-waiting", "no-hash-version-differs", D.CHANGE),  # new version does not wait
    case("failed-waiting", "no-hash-no-version", D.BACKOFF),  # unknown content: wait (no CHECK)
    case("failed-waiting", "skip-reason-as-stored", D.SKIP),  # a skip does not wait
    case("failed-waiting", "skip-reason-new", D.SKIP),  # a skip does not wait
    case("failed-waiting", "title", D.BACKOFF),  # reading: a rename does not shorten the backoff
    case("failed-waiting", "uri", D.BACKOFF),  # reading: a move does not shorten the backoff
    case("failed-waiting", "metadata", D.BACKOFF),  # reading: metadata does not shorten the backoff
    case("failed-waiting", "model-differs", D.BACKOFF),  # the model does not shorten the backoff
    # permanently_failed: back only with new content; CHECK when content cannot be compared
    case("permanently_failed", "same", D.UNCHANGED),  # given up on this content
    case("permanently_failed", "hash-differs", D.CHANGE),  # new bytes: try again
    case("permanently_failed", "hash-same-version-differs", D.UNCHANGED),  # reading: same content, version not written
    case("permanently_failed", "no-hash-version-same", D.UNCHANGED),  # same version: given up
    case("permanently_failed", "no-hash-version-differs", D.CHANGE),  # new version: try again
    case("permanently_failed", "no-hash-no-version", D.CHECK),  # cannot compare: fetch and hash
    case("permanently_failed", "skip-reason-as-stored", D.UNCHANGED),  # already terminal for this reason
    case("permanently_failed", "skip-reason-new", D.SKIP),  # terminal for another reason: record this one
    case("permanently_failed", "title", D.UNCHANGED),  # reading: no METADATA for a terminal row
    case("permanently_failed", "uri", D.UNCHANGED),  # reading: no METADATA for a terminal row
    case("permanently_failed", "metadata", D.UNCHANGED),  # reading: no METADATA for a terminal row
    case("permanently_failed", "model-differs", D.UNCHANGED),  # no chunks to re-embed
    # skipped (no text): planned like permanently_failed
    case("skipped", "same", D.UNCHANGED),  # same content had no text
    case("skipped", "hash-differs", D.CHANGE),  # new bytes may have text
    case("skipped", "hash-same-version-differs", D.UNCHANGED),  # same content
    case("skipped", "no-hash-version-same", D.UNCHANGED),  # same version
    case("skipped", "no-hash-version-differs", D.CHANGE),  # new version may have text
    case("skipped", "no-hash-no-version", D.CHECK),  # cannot compare: fetch and hash
    case("skipped", "skip-reason-as-stored", D.UNCHANGED),  # already skipped for this reason
    case("skipped", "skip-reason-new", D.SKIP),  # skipped for another reason: record the source's
    case("skipped", "title", D.UNCHANGED),  # reading: no METADATA for a terminal row
    case("skipped", "uri", D.UNCHANGED),  # reading: no METADATA for a terminal row
    case("skipped", "metadata", D.UNCHANGED),  # reading: no METADATA for a terminal row
    case("skipped", "model-differs", D.UNCHANGED),  # no chunks to re-embed
]


def test_matrix_covers_every_status_and_change():
    assert {p.values[:2] for p in MATRIX} == {(s, c) for s in STATUSES for c in CHANGES}
    assert len(MATRIX) == len(STATUSES) * len(CHANGES)


@pytest.mark.parametrize(("status", "change", "expected"), MATRIX)
def test_plan_document_matrix(status, change, expected):
    doc_changes, row_changes, model = CHANGES[change]
    row_fields = STATUSES[status]
    row = None if row_fields is None else indexed(**{**row_fields, **row_changes})
    assert plan_document(listed(**doc_changes), row, Settings(), generations=model, now=NOW) == expected


EDGES = [
    # backoff boundaries: wait = retry_backoff_s * 2**(failure_count-1), due when waited >= wait
    pytest.param(listed(), indexed(status="failed", failure_count=1, updated_at=NOW - timedelta(hours=1)),
                 {}, MODEL, D.RETRY, id="failed-1-exactly-1h"),  # exactly the wait: due (>=)
    pytest.param(listed(), indexed(status="failed", failure_count=1,
                                   updated_at=NOW - timedelta(hours=1) + timedelta(seconds=1)),
                 {}, MODEL, D.BACKOFF, id="failed-1-1h-minus-1s"),  # one second short: wait
    pytest.param(listed(), indexed(status="failed", failure_count=2, updated_at=NOW - timedelta(hours=1, minutes=59)),
                 {}, MODEL, D.BACKOFF, id="failed-2-1h59"),  # second failure waits 2 h, not 1 h
    pytest.param(listed(), indexed(status="failed", failure_count=2, updated_at=NOW - timedelta(hours=2)),
                 {}, MODEL, D.RETRY, id="failed-2-exactly-2h"),  # second failure: due at 2 h
    pytest.param(listed(), indexed(status="failed", failure_count=1, updated_at=NOW),
                 {"retry_backoff_s": 0}, MODEL, D.RETRY, id="backoff-0-retries-at-once"),  # 0 = next sync
    pytest.param(listed(), indexed(status="failed", failure_count=4, updated_at=NOW - timedelta(hours=8)),
                 {"max_failures": 5}, MODEL, D.RETRY, id="max-failures-5-fourth-due"),  # 4 < 5, 8 h >= 8 h
    # a failed row at (or past) the limit is planned as given up (no retry, not even when due)
    pytest.param(listed(), indexed(status="failed", failure_count=3, updated_at=NOW - timedelta(days=1)),
                 {}, MODEL, D.UNCHANGED, id="failed-at-limit-same"),  # 3 of 3: no retry
    pytest.param(listed(content_sha256=SHA_B), indexed(status="failed", failure_count=3),
                 {}, MODEL, D.CHANGE, id="failed-at-limit-new-content"),  # new content still comes back
    pytest.param(listed(content_sha256=None, source_version=None), indexed(status="failed", failure_count=3),
                 {}, MODEL, D.UNCHANGED, id="failed-at-limit-no-hash-no-version"),  # reading: not CHECK (only
    # permanently_failed/skipped get CHECK); see the report: differs from permanently_failed
    # the content the last attempt saw (seen_*) is what the listing is compared with
    pytest.param(listed(content_sha256=SHA_B),
                 indexed(status="failed", failure_count=1, seen_sha256=SHA_B, updated_at=NOW - timedelta(hours=2)),
                 {}, MODEL, D.RETRY, id="failed-on-new-content-seen"),  # B failed, B listed: retry B
    pytest.param(listed(), indexed(status="failed", failure_count=1, seen_sha256=SHA_B),
                 {}, MODEL, D.CHANGE, id="failed-on-new-content-reverted"),  # B failed, A listed again: changed
    pytest.param(listed(content_sha256=None, source_version="v2"),
                 indexed(status="failed", failure_count=1, seen_source_version="v2",
                         updated_at=NOW - timedelta(minutes=5)),
                 {}, MODEL, D.BACKOFF, id="failed-seen-version"),  # v2 failed, v2 listed: wait
    pytest.param(listed(), indexed(content_sha256=None, seen_sha256=None), {}, MODEL, D.CHANGE,
                 id="row-without-hash"),  # a listed hash the row never saw: changed
    pytest.param(listed(content_sha256=None), indexed(source_version=None, seen_source_version=None), {}, MODEL,
                 D.CHANGE, id="row-without-version"),  # a listed version the row never saw: changed
    # precedence among the completed outcomes
    pytest.param(listed(content_sha256=SHA_B), indexed(stored_chunks=2), {}, OTHER_MODEL, D.CHANGE,
                 id="change-outranks-repair-and-reembed"),  # new content re-ingests everything
    pytest.param(listed(title="New title"), indexed(), {}, OTHER_MODEL, D.REEMBED,
                 id="reembed-outranks-metadata"),  # reading: vectors first, the rename on a later plan
    pytest.param(listed(), indexed(expected_chunk_count=None, stored_chunks=0), {}, MODEL, D.REPAIR,
                 id="completed-without-expectation"),  # complete needs an expected count
    pytest.param(listed(), indexed(expected_chunk_count=0, stored_chunks=0), {}, MODEL, D.REPAIR,
                 id="completed-zero-chunks"),  # complete needs at least one row
    pytest.param(listed(), indexed(stored_chunks=4), {}, MODEL, D.REPAIR,
                 id="completed-extra-rows"),  # more rows than expected: not complete either
    # the model: only a known, different model triggers REEMBED
    pytest.param(listed(), indexed(generations=()), {}, MODEL, D.REEMBED,
                 id="row-in-no-generation"),  # vectors lost (an index upgraded mid re-embed): filled
    pytest.param(listed(), indexed(), {}, None, D.UNCHANGED, id="no-model-configured"),  # model=None: no check
    # metadata comparison details
    pytest.param(listed(source_version=None), indexed(), {}, MODEL, D.UNCHANGED,
                 id="listing-without-version-keeps-stored"),  # an absent version is not a change
    pytest.param(listed(metadata={}), indexed(metadata=None), {}, MODEL, D.UNCHANGED,
                 id="metadata-none-equals-empty"),  # NULL metadata reads as {}
    pytest.param(listed(metadata={"author": "Bob"}), indexed(), {}, MODEL, D.METADATA,
                 id="metadata-value-differs"),  # a value change is a metadata change
    # skip_reason outranks content changes
    pytest.param(listed(content_sha256=SHA_B, skip_reason=REASON), indexed(status="permanently_failed",
                                                                          last_error=REASON),
                 {}, MODEL, D.UNCHANGED, id="skip-as-stored-new-hash"),  # reading: still refused: nothing to do
    pytest.param(listed(content_sha256=SHA_B, skip_reason=REASON), indexed(), {}, MODEL, D.SKIP,
                 id="skip-outranks-change"),  # refused now: SKIP, not CHANGE
]


@pytest.mark.parametrize(("doc", "row", "settings", "model", "expected"), EDGES)
def test_plan_document_edges(doc, row, settings, model, expected):
    assert plan_document(doc, row, Settings(**settings), generations=model, now=NOW) == expected


@pytest.mark.parametrize(("failure_count", "settings", "expected_s"), [
    pytest.param(1, {}, 3600, id="first-failure-1h"),  # default backoff: 1 h after the 1st failure
    pytest.param(2, {}, 7200, id="second-failure-2h"),  # then 2 h (attempts at 0 h, 1 h, 3 h)
    pytest.param(3, {}, 14400, id="third-failure-4h"),  # doubling continues
    pytest.param(0, {}, 3600, id="zero-failures-clamped"),  # never less than the base wait
    pytest.param(2, {"retry_backoff_s": 60}, 120, id="custom-base"),  # base * 2**(n-1)
    pytest.param(5, {"retry_backoff_s": 0}, 0, id="zero-base"),  # 0 = retry on the next sync
])
def test_retry_wait_s(failure_count, settings, expected_s):
    assert retry_wait_s(failure_count, Settings(**settings)) == expected_s


def test_defaults_the_tables_rely_on():
    s = Settings()
    assert (s.max_failures, s.retry_backoff_s, s.deletion_max_fraction) == (3, 3600.0, 0.2)


# --- evaluate_guard: every verdict ---------------------------------------------------------------------

def g(complete=True, full_listing=True, listed=10, indexed=10, to_delete=0, **kw):
    return dict(complete=complete, incomplete_reason=kw.pop("incomplete_reason", None), full_listing=full_listing,
                listed=listed, indexed=indexed, to_delete=to_delete, max_fraction=kw.pop("max_fraction", 0.2), **kw)


GUARD = [
    # an incomplete listing: refused, whatever the overrides
    pytest.param(g(complete=False, incomplete_reason="page 3 of 7 failed", listed=4, to_delete=6), False,
                 ["listing incomplete (page 3 of 7 failed)", "nothing deleted"], id="incomplete"),
    pytest.param(g(complete=False, incomplete_reason="page 3 of 7 failed", listed=4, to_delete=6,
                   allow_mass_delete=True, confirm_delete=6), False,
                 ["listing incomplete (page 3 of 7 failed)"], id="incomplete-overrides-ignored"),  # nothing overrides
    pytest.param(g(complete=False, listed=10, to_delete=0), False, ["listing incomplete (unknown reason)"],
                 id="incomplete-nothing-to-delete"),  # refused even with nothing to delete; reason defaulted
    # an empty full listing while the index holds documents (an unmounted share)
    pytest.param(g(listed=0, indexed=10, to_delete=10), False,
                 ["empty listing while the index holds 10 documents", "--confirm-delete 10"], id="empty-listing"),
    pytest.param(g(listed=0, indexed=10, to_delete=10, confirm_delete=10), True, [],
                 id="empty-listing-confirmed"),  # the exact count lifts the empty rule (and the fraction)
    pytest.param(g(listed=0, indexed=10, to_delete=10, confirm_delete=9), False,
                 ["empty listing while the index holds 10 documents"], id="empty-listing-confirm-wrong"),
    pytest.param(g(listed=0, indexed=10, to_delete=10, allow_mass_delete=True), False,
                 ["empty listing while the index holds 10 documents"],
                 id="empty-listing-allow-mass-delete"),  # allow_mass_delete lifts the fraction only
    # a change feed's empty page is not an empty source
    pytest.param(g(full_listing=False, listed=0, indexed=10, to_delete=0), True, [], id="empty-feed-page"),
    pytest.param(g(full_listing=False, listed=0, indexed=10, to_delete=2), True, [],
                 id="feed-deletions-at-limit"),  # 2 of 10 from a feed: within the fraction
    pytest.param(g(full_listing=False, listed=0, indexed=10, to_delete=3), False, ["would delete 3 of 10"],
                 id="feed-deletions-over"),  # the fraction applies to a feed's tombstones too
    # the fraction
    pytest.param(g(listed=8, to_delete=2), True, [], id="at-limit"),  # 2/10 = 20%: not more than 20%
    pytest.param(g(listed=4, indexed=5, to_delete=1), True, [], id="at-limit-1-of-5"),  # 1/5 = 20% exactly
    pytest.param(g(listed=7, to_delete=3), False,
                 ["would delete 3 of 10 documents (30%)", "more than the allowed 20%", "--confirm-delete 3"],
                 id="over-limit"),
    pytest.param(g(listed=79, indexed=100, to_delete=21), False, ["would delete 21 of 100 documents (21%)"],
                 id="just-over-limit"),  # 21% > 20%
    pytest.param(g(listed=7, to_delete=3, allow_mass_delete=True), True, [], id="over-allow-mass-delete"),
    pytest.param(g(listed=7, to_delete=3, confirm_delete=3), True, [], id="over-confirmed"),  # exact count
    pytest.param(g(listed=7, to_delete=3, confirm_delete=4), False, ["would delete 3 of 10"],
                 id="over-confirm-wrong"),  # a different count does not confirm
    pytest.param(g(listed=9, to_delete=3, max_fraction=0.5), True, [], id="other-fraction"),  # 30% <= 50%
    # nothing to judge
    pytest.param(g(listed=10, to_delete=0), True, [], id="nothing-to-delete"),
    pytest.param(g(listed=0, indexed=0, to_delete=0), True, [], id="empty-index-empty-listing"),  # first run
    pytest.param(g(listed=5, indexed=0, to_delete=0), True, [], id="empty-index"),  # first listing
]


@pytest.mark.parametrize(("kwargs", "passed", "reason_has"), GUARD)
def test_evaluate_guard(kwargs, passed, reason_has):
    result = evaluate_guard(**kwargs)
    assert result.passed is passed
    if passed:
        assert result.reason is None
    else:
        assert result.reason and all(part in result.reason for part in reason_has), result.reason
    # the numbers judged are returned as given
    assert (result.complete, result.listed, result.indexed, result.to_delete, result.max_fraction) == (
        kwargs["complete"], kwargs["listed"], kwargs["indexed"], kwargs["to_delete"], kwargs["max_fraction"])


# --- diff_documents ------------------------------------------------------------------------------------

FAILED_DUE = dict(status="failed", failure_count=1, last_error="timeout", updated_at=NOW - timedelta(hours=2))
FAILED_WAITING = dict(status="failed", failure_count=1, last_error="timeout", updated_at=NOW - timedelta(minutes=5))


def state_of(**rows: dict) -> dict[str, IndexedDocument]:
    return {sid.replace("_", "-"): indexed(sid.replace("_", "-"), **fields) for sid, fields in rows.items()}


ZERO = {"added": 0, "changed": 0, "deleted": 0, "unchanged": 0, "retry": 0, "backoff": 0, "repair": 0,
        "pending": 0, "check": 0, "reembed": 0, "skip": 0}

DIFFS = [
    # a full listing: one vanished document, a tombstone not vanishing twice, a tombstone listed again, a
    # duplicated id (the first wins), work and idle lists, summary counts; 1 of 6 live = 17%: guard passes
    pytest.param(
        [listed("keep"), listed("keep", content_sha256=SHA_B), listed("edited", content_sha256=SHA_B),
         listed("renamed", title="New name"), listed("back"), listed("flaky"), listed("waiting"), listed("new")],
        state_of(keep={}, edited={}, renamed={}, gone={}, tomb=dict(status="deleted"), back=dict(status="deleted"),
                 flaky=FAILED_DUE, waiting=FAILED_WAITING),
        {},
        [("edited", D.CHANGE), ("renamed", D.METADATA), ("back", D.ADD), ("flaky", D.RETRY), ("new", D.ADD)],
        [("keep", D.UNCHANGED), ("waiting", D.BACKOFF)], ["gone"],
        {**ZERO, "added": 2, "changed": 2, "deleted": 1, "unchanged": 2, "retry": 1, "backoff": 1}, True,
        id="full-listing"),
    # a full listing losing 2 of 5: vanished still reported, the guard refuses
    pytest.param(
        [listed("a"), listed("b"), listed("c")], state_of(a={}, b={}, c={}, d={}, e={}), {}, [],
        [("a", D.UNCHANGED), ("b", D.UNCHANGED), ("c", D.UNCHANGED)], ["d", "e"],
        {**ZERO, "deleted": 2, "unchanged": 3}, False, id="full-listing-guard-trips"),
    # an incomplete listing: planned as usual, vanished computed, the guard refuses
    pytest.param(
        [listed("a", content_sha256=SHA_B)], state_of(a={}, b={}), dict(complete=False, incomplete_reason="timeout"),
        [("a", D.CHANGE)], [], ["b"], {**ZERO, "changed": 1, "deleted": 1}, False, id="full-listing-incomplete"),
    # a change feed's page: only its tombstones vanish (once, live ones only; an id both upserted and
    # deleted stays); unmentioned live documents stay put
    pytest.param(
        [listed("a", content_sha256=SHA_B)], state_of(a={}, b={}, c={}, d={}, e={}, tomb=dict(status="deleted")),
        dict(full_listing=False, deleted_ids=["b", "b", "tomb", "unknown", "a"]),
        [("a", D.CHANGE)], [], ["b"], {**ZERO, "changed": 1, "deleted": 1}, True, id="feed-page"),
    # a change feed with index_retries: the index adds its due retries, pending and incomplete documents
    # (not BACKOFF, not given-up, not complete, not vanished, not those the page already planned)
    pytest.param(
        [listed("mentioned")],
        state_of(ok={}, mentioned=FAILED_DUE, flaky=FAILED_DUE, waiting=FAILED_WAITING,
                 interrupted=dict(status="pending"), holes=dict(stored_chunks=1),
                 dead=dict(status="permanently_failed", failure_count=3),
                 exhausted=dict(status="failed", failure_count=3, updated_at=NOW - timedelta(days=2)),
                 doomed=FAILED_DUE, tomb=dict(status="deleted", stored_chunks=0)),
        dict(full_listing=False, deleted_ids=["doomed"], index_retries=True),
        [("mentioned", D.RETRY), ("flaky", D.RETRY), ("interrupted", D.PENDING), ("holes", D.REPAIR)], [],
        ["doomed"], {**ZERO, "deleted": 1, "retry": 2, "pending": 1, "repair": 1}, True, id="feed-index-retries"),
    # the same page without index_retries: only what the feed mentions
    pytest.param(
        [listed("mentioned")],
        state_of(ok={}, mentioned=FAILED_DUE, flaky=FAILED_DUE, interrupted=dict(status="pending"),
                 holes=dict(stored_chunks=1)),
        dict(full_listing=False), [("mentioned", D.RETRY)], [], [], {**ZERO, "retry": 1}, True,
        id="feed-without-index-retries"),
    # an empty feed page: nothing to do, nothing vanishes, the guard passes
    pytest.param([], state_of(a={}, b={}), dict(full_listing=False), [], [], [], ZERO, True, id="feed-empty-page"),
    # the configured model reaches plan_document
    pytest.param([listed("a"), listed("b")], state_of(a={}, b=dict(generations=())), dict(generations=MODEL),
                 [("b", D.REEMBED)], [("a", D.UNCHANGED)], [], {**ZERO, "unchanged": 1, "reembed": 1}, True,
                 id="model-reaches-plan"),
]


@pytest.mark.parametrize(("docs", "state", "kwargs", "work", "idle", "vanished", "summary", "guard_passed"), DIFFS)
def test_diff_documents(docs, state, kwargs, work, idle, vanished, summary, guard_passed):
    diff = diff_documents("src", docs, state, Settings(), now=NOW, **kwargs)
    assert [(p.doc.source_id, p.decision) for p in diff.work] == work
    assert [(p.doc.source_id, p.decision) for p in diff.idle] == idle
    assert [i.source_id for i in diff.vanished] == vanished
    assert diff.summary() == summary
    assert diff.unchanged == len(idle)
    assert diff.guard.passed is guard_passed
    assert diff.mode == ("changes" if kwargs.get("full_listing") is False else "full")
    assert diff.indexed == sum(1 for i in state.values() if i.live) == diff.guard.indexed
    assert diff.guard.to_delete == len(vanished)
    # every planned document carries its index row (None only when new)
    for p in diff.work + diff.idle:
        assert p.indexed is state.get(p.doc.source_id)


def test_duplicates_in_the_listing_first_wins():
    diff = diff_documents("src", [listed("x"), listed("x", content_sha256=SHA_B, title="Second"), listed("y")],
                          state_of(x={}, y={}), Settings(), now=NOW)
    assert [d.source_id for d in diff.documents] == ["x", "y"] and diff.listed == 2 == diff.guard.listed
    assert diff.documents[0].content_sha256 == SHA_A and diff.documents[0].title == "Title of x"
    assert not diff.work and diff.decisions == {"unchanged": 2}


def test_index_retries_plan_from_the_index_row():
    """A retry the feed did not mention is planned from the row: the content it last saw, its title/uri."""
    state = state_of(flaky=dict(FAILED_DUE, seen_sha256=SHA_B))
    diff = diff_documents("src", [], state, Settings(), full_listing=False, index_retries=True, now=NOW)
    (p,) = diff.work
    assert (p.decision, p.doc.content_sha256, p.doc.title, p.doc.uri) == (D.RETRY, SHA_B, "Title of flaky",
                                                                         "file:///flaky")
    assert p.indexed is state["flaky"] and diff.listed == 0 and diff.decisions == {"retry": 1}
