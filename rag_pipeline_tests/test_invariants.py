"""The sync invariants (issue 4): identity and change detection, chunk-level embedding reuse, deletion
propagation and the deletion guard, completeness repair.

Every invariant test runs on both callers of the per-document core (fixture ``route``, see
``routes.py``): ``cli`` (``pipeline.sync.sync_source``) and ``dagster`` (the diff sensor's plan, one
in-process run of the three per-document assets per document, the inventory + guarded purge assets).
Outcomes are read back from ``ingest_log`` for both, so both are judged on the same truth.

Real parts throughout: the embedded PostgreSQL, the real all-MiniLM-L6-v2 model (wrapped only to
count the texts it is given), real extraction of generated Markdown files. Sources with stable ids,
paged listings and change feeds are in-memory doubles of external APIs (``invariant_fakes``).
Every test ends with ``check_index`` (the invariant in SQL) finding nothing.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from rag_pipeline.config import Settings
from rag_pipeline.pipeline.sync import EXIT_GUARD, EXIT_OK, sync_source
from rag_pipeline.sources.local import LocalFolderSource
from rag_pipeline.store.invariants import check_against_listing, check_index
from rag_pipeline.store.staging import pending_deletions
from rag_pipeline_tests.invariant_fakes import (
    CountingEmbedder,
    MemorySource,
    PagedSource,
    RecordingNotifier,
    chunks_of,
    count_extractions,
    document,
    ingest_actions,
    marker,
    paragraph,
    run_row,
    sha256,
)
from rag_pipeline_tests.routes import ROUTES, open_route, spec_name


@pytest.fixture(params=ROUTES)
def route(request):
    """The caller under test: ``cli`` or ``dagster`` (a fresh Dagster instance per test)."""
    with open_route(request.param) as r:
        yield r


@pytest.fixture
def counting(embedder) -> CountingEmbedder:
    """The session's real embedder, wrapped to count the texts this test sends it."""
    return CountingEmbedder(embedder)


@pytest.fixture
def extract_calls(monkeypatch) -> list[str]:
    """File names passed to ``rag_pipeline.extraction.extract`` during the test (the real function runs)."""
    return count_extractions(monkeypatch)


def write_folder(root: Path, n: int, rng: random.Random, *, words: int = 40) -> dict[str, bytes]:
    """Write ``n`` small Markdown files ``doc00.md``... (two marked paragraphs each); return their bytes."""
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for i in range(n):
        data = f"{paragraph(marker(rng), rng, words)}\n\n{paragraph(marker(rng), rng, words)}\n".encode()
        (root / f"doc{i:02d}.md").write_bytes(data)
        out[f"doc{i:02d}.md"] = data
    return out


def listing_of(root: Path) -> dict[str, str]:
    """``{relative path: SHA-256}`` of every file under ``root`` (computed here, not by the source)."""
    return {p.relative_to(root).as_posix(): sha256(p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()}


def assert_clean(store, source_name: str, listing: dict[str, str]) -> None:
    """The invariant holds and the index equals ``listing`` exactly."""
    with store.connection() as conn:
        assert check_index(conn) == []
        assert check_against_listing(conn, source_name, listing, converged=True) == []


# --- 1. identity and change detection ----------------------------------------------------------------


@pytest.mark.parametrize("with_sha", [True, False], ids=["listing-has-sha", "listing-has-version-only"])
def test_rename_under_stable_id_updates_metadata_only(with_sha, route, settings, store, counting, extract_calls):
    rng = random.Random(11)
    src = MemorySource(with_sha=with_sha, with_version=True)
    for i in range(3):
        src.put(f"id{i}", f"{paragraph(marker(rng), rng)}\n".encode(), title=f"old{i}.md", uri=f"mem://a/old{i}.md")
    first = route(src, store, counting, settings)
    assert first.exit_code == EXIT_OK and first.actions == {f"id{i}": "added" for i in range(3)}
    assert len(extract_calls) == 3
    with store.connection() as conn:
        before = document(conn, src.name, "id1")
        chunks_before = chunks_of(conn, before["id"])

    src.rename("id1", "new-name.md", "mem://b/new-name.md")  # Drive-like: version bumps, bytes do not change
    texts, calls, fetches, extractions = len(counting.texts), counting.calls, len(src.fetches), len(extract_calls)
    report = route(src, store, counting, settings)

    assert report.actions == {"id1": "metadata-updated"} and report.outcomes["id1"].status == "completed"
    assert (len(counting.texts), counting.calls) == (texts, calls)  # nothing re-embedded
    assert len(extract_calls) == extractions  # nothing re-extracted
    # Without a hash in the listing the sync must read the bytes once to learn that they are the same.
    assert src.fetches[fetches:] == ([] if with_sha else ["id1"])
    with store.connection() as conn:
        after = document(conn, src.name, "id1")
        assert (after["title"], after["uri"], after["source_version"]) == ("new-name.md", "mem://b/new-name.md", "2")
        assert after["version"] == before["version"] == 1 and after["id"] == before["id"]
        assert chunks_of(conn, after["id"])[0][:4] == chunks_before[0][:4]  # same chunk rows, untouched
        assert ingest_actions(conn, src.name, "id1")[-1][0] == "metadata-updated"
    assert_clean(store, src.name, {sid: sha256(d.content) for sid, d in src.docs.items()})


@pytest.mark.parametrize("with_sha", [True, False], ids=["listing-has-sha", "listing-has-version-only"])
def test_content_change_under_stable_id_makes_a_new_version(with_sha, route, settings, store, counting,
                                                            extract_calls):
    rng = random.Random(12)
    src = MemorySource(with_sha=with_sha, with_version=True)
    old_marker, new_marker = marker(rng), marker(rng)
    src.put("k", f"{paragraph(old_marker, rng)}\n".encode())
    route(src, store, counting, settings)
    src.put("k", f"{paragraph(new_marker, rng)}\n".encode())
    report = route(src, store, counting, settings)
    assert report.actions == {"k": "updated"} and report.outcomes["k"].status == "completed"
    assert len(extract_calls) == 2 and len(counting.texts) == 2
    with store.connection() as conn:
        row = document(conn, src.name, "k")
        assert row["version"] == 2 and row["all_chunks"] == row["stored"] == 1
        (_, version, _, text, _), = chunks_of(conn, row["id"])
        assert version == 2 and new_marker in text and old_marker not in text
    assert_clean(store, src.name, {"k": sha256(src.docs["k"].content)})


def test_touched_file_with_same_bytes_is_metadata_only(tmp_path, route, settings, store, counting, extract_calls):
    """A new mtime (the source's own version) with identical bytes: no extraction, no embedding."""
    import os

    root = tmp_path / "docs"
    write_folder(root, 3, random.Random(13))
    src = LocalFolderSource(root)
    route(src, store, counting, settings)
    os.utime(root / "doc01.md", (1_800_000_000, 1_800_000_000))
    extractions, texts = len(extract_calls), len(counting.texts)
    report = route(src, store, counting, settings)
    assert report.actions == {"doc01.md": "metadata-updated"}
    assert len(extract_calls) == extractions and len(counting.texts) == texts
    with store.connection() as conn:
        row = document(conn, src.name, "doc01.md")
        assert row["version"] == 1 and row["modified_at"].timestamp() == 1_800_000_000
        assert row["source_version"].endswith(":1800000000000000000")
    assert_clean(store, src.name, listing_of(root))


def test_local_move_with_same_bytes_reuses_embeddings(tmp_path, route, settings, store, counting):
    root = tmp_path / "docs"
    files = write_folder(root, 6, random.Random(14))
    src = LocalFolderSource(root)
    route(src, store, counting, settings)
    with store.connection() as conn:
        old = document(conn, src.name, "doc03.md")
        old_chunks = chunks_of(conn, old["id"])
    (root / "archive").mkdir()
    (root / "doc03.md").rename(root / "archive" / "moved.md")

    texts, calls = len(counting.texts), counting.calls
    report = route(src, store, counting, settings)

    by_id = report.outcomes
    assert report.actions == {"archive/moved.md": "added", "doc03.md": "deleted"}
    assert (by_id["archive/moved.md"].embedded, by_id["archive/moved.md"].reused) == (0, len(old_chunks))
    assert report.deleted == ["doc03.md"]
    assert (len(counting.texts), counting.calls, report.embedded) == (texts, calls, 0)  # 0 new texts
    with store.connection() as conn:
        new = document(conn, src.name, "archive/moved.md")
        new_chunks = chunks_of(conn, new["id"])
        assert new["status"] == "completed" and new["stored"] == new["expected_chunk_count"] == len(old_chunks) > 0
        assert new["content_sha256"] == sha256(files["doc03.md"])
        for (_, _, _, text_new, vec_new), (_, _, _, text_old, vec_old) in zip(new_chunks, old_chunks):
            assert text_new == text_old and np.array_equal(vec_new, vec_old)
        gone = document(conn, src.name, "doc03.md")
        assert (gone["status"], gone["all_chunks"], gone["deleted_at"] is not None) == ("deleted", 0, True)
    assert_clean(store, src.name, listing_of(root))


def test_local_move_that_trips_the_guard_keeps_both_copies(tmp_path, route, settings, store, counting):
    """Moving 1 of 2 files would delete 50% (> 20%): the new path is indexed (never 0 chunks), the
    old one is kept until an override, and the run says so."""
    root = tmp_path / "docs"
    write_folder(root, 2, random.Random(15))
    src = LocalFolderSource(root)
    route(src, store, counting, settings)
    (root / "sub").mkdir()
    (root / "doc00.md").rename(root / "sub" / "doc00.md")
    report = route(src, store, counting, settings)
    assert report.exit_code == EXIT_GUARD and report.deleted == [] and report.embedded == 0
    assert report.actions == {"sub/doc00.md": "added"}
    with store.connection() as conn:
        moved, old = document(conn, src.name, "sub/doc00.md"), document(conn, src.name, "doc00.md")
        assert moved["status"] == old["status"] == "completed"
        assert moved["stored"] == moved["expected_chunk_count"] == old["stored"] > 0
        assert check_index(conn) == []
    override = route(src, store, counting, settings, allow_mass_delete=True)
    assert override.deleted == ["doc00.md"] and override.exit_code == EXIT_OK
    assert_clean(store, src.name, listing_of(root))


# --- 2. chunk-level embedding reuse ------------------------------------------------------------------


def test_new_version_embeds_only_new_chunk_texts(tmp_path, route, database_url, store, counting):
    settings = Settings(database_url=database_url, chunk_overlap=0)
    rng = random.Random(21)
    root = tmp_path / "docs"
    root.mkdir()
    paras = [paragraph(marker(rng), rng, 110) for _ in range(4)]  # ~800 characters: one chunk each
    (root / "report.md").write_text("\n\n".join(paras) + "\n")
    src = LocalFolderSource(root)
    first = route(src, store, counting, settings)
    assert first.outcomes["report.md"].chunk_count == 4 and len(counting.texts) == 4
    with store.connection() as conn:
        v1 = {text: vec for _, _, _, text, vec in chunks_of(conn, document(conn, src.name, "report.md")["id"])}

    new_marker = marker(rng)
    paras[2] = paragraph(new_marker, rng, 110)  # one paragraph rewritten, three unchanged
    (root / "report.md").write_text("\n\n".join(paras) + "\n")
    (root / "copy.md").write_text(paras[0] + "\n")  # a duplicate paragraph in another document
    before = len(counting.texts)
    report = route(src, store, counting, settings)

    new_texts = counting.texts[before:]
    assert len(new_texts) == 1 and new_marker in new_texts[0]
    by_id = report.outcomes
    assert report.actions == {"copy.md": "added", "report.md": "updated"}
    assert (by_id["report.md"].embedded, by_id["report.md"].reused) == (1, 3)
    assert (by_id["copy.md"].embedded, by_id["copy.md"].reused) == (0, 1)
    with store.connection() as conn:
        rows = chunks_of(conn, document(conn, src.name, "report.md")["id"])
        assert [r[1] for r in rows] == [2, 2, 2, 2]
        reused = [(text, vec) for _, _, _, text, vec in rows if text in v1]
        assert len(reused) == 3 and all(np.array_equal(vec, v1[text]) for text, vec in reused)
        # The one new vector is the model's vector of the new text (computed here, independently).
        fresh = next(vec for _, _, _, text, vec in rows if new_marker in text)
        assert float(fresh @ counting.real.embed([new_texts[0]])[0]) > 0.999
    assert_clean(store, src.name, listing_of(root))


# --- 3. deletion propagation and the guard -----------------------------------------------------------


def test_change_feed_tombstone_deletes_the_document(route, settings, store, counting):
    rng = random.Random(31)
    src = MemorySource(with_feed=True)
    for i in range(10):
        src.put(f"z{i}", f"{paragraph(marker(rng), rng)}\n".encode())
    first = route(src, store, counting, settings)
    assert first.mode == "full" and first.exit_code == EXIT_OK
    src.delete("z4")
    src.put("z7", f"{paragraph(marker(rng), rng)}\n".encode())
    fetched = len(src.fetches)
    report = route(src, store, counting, settings)
    assert report.mode == "changes" and report.deleted == ["z4"] and report.exit_code == EXIT_OK
    assert src.fetches[fetched:] == ["z7"]  # the feed named one upsert: nothing else was read
    assert report.actions == {"z4": "deleted", "z7": "updated"}
    with store.connection() as conn:
        row = document(conn, src.name, "z4")
        assert (row["status"], row["all_chunks"], row["deleted_at"] is not None) == ("deleted", 0, True)
        assert ingest_actions(conn, src.name, "z4")[-1] == ("deleted", "deleted", "gone from the source")
    assert_clean(store, src.name, {sid: sha256(d.content) for sid, d in src.docs.items()})


def _feed_cursor(route, store, src) -> str | None:
    """Where the caller will read the change feed from next: the CLI's ``source_cursors`` row, the
    sensor's cursor (its ``feed``) for the Dagster route."""
    if route.name == "dagster":
        return route.cursors.get(spec_name(src))
    with store.connection() as conn:
        row = conn.execute("SELECT cursor FROM source_cursors WHERE source = %s", (src.name,)).fetchone()
    return row[0] if row else None


def test_change_feed_mass_tombstones_trip_the_guard_and_are_not_lost(route, settings, store, counting):
    """3 tombstones of 10 documents (30% > 20%): nothing deleted, alert, exit 2, and the cursor stays
    where it was, so the next run still sees the tombstones (and alerts again) and the override applies
    them."""
    rng = random.Random(32)
    src = MemorySource(with_feed=True)
    for i in range(10):
        src.put(f"z{i}", f"{paragraph(marker(rng), rng)}\n".encode())
    route(src, store, counting, settings)
    for sid in ("z1", "z2", "z3"):
        src.delete(sid)
    notifier = RecordingNotifier()
    report = route(src, store, counting, settings, notifier=notifier)
    assert report.mode == "changes" and report.exit_code == EXIT_GUARD and report.deleted == []
    assert report.guard.reason == ("would delete 3 of 10 documents (30%), more than the allowed 20%: nothing "
                                   "deleted (if that is right: --confirm-delete 3)")
    assert len(notifier.of("deletion_guard")) == 1
    with store.connection() as conn:
        assert all(document(conn, src.name, s)["status"] == "completed" for s in ("z1", "z2", "z3"))
    assert _feed_cursor(route, store, src) == "10"  # not past the held-back tombstones

    again = route(src, store, counting, settings, notifier=notifier)  # not lost, still guarded
    assert again.exit_code == EXIT_GUARD and again.deleted == [] and len(notifier.of("deletion_guard")) == 2
    override = route(src, store, counting, settings, allow_mass_delete=True, notifier=notifier)
    assert override.exit_code == EXIT_OK and override.deleted == ["z1", "z2", "z3"]
    assert_clean(store, src.name, {sid: sha256(d.content) for sid, d in src.docs.items()})


def test_full_reconciliation_deletes_what_left_the_folder(tmp_path, route, settings, store, counting):
    root = tmp_path / "docs"
    write_folder(root, 6, random.Random(33))
    src = LocalFolderSource(root)
    route(src, store, counting, settings)
    (root / "doc02.md").unlink()
    report = route(src, store, counting, settings)
    assert report.deleted == ["doc02.md"] and report.exit_code == EXIT_OK and report.guard.passed
    assert report.actions == {"doc02.md": "deleted"}
    assert_clean(store, src.name, listing_of(root))


def _assert_guard_tripped(route, store, report, notifier: RecordingNotifier, reason: str, live_before: int) -> None:
    """Nothing deleted; the result, the exit code, the caller's own record (the ``sync_runs`` row; the
    inventory run failed by its blocking ``deletion_guard`` check, no pending deletion recorded) and one
    alert all say why."""
    assert report.deleted == [] and report.exit_code == EXIT_GUARD
    assert not report.guard.passed and report.guard.reason == reason
    assert all(r.action != "deleted" for r in report.rows)
    with store.connection() as conn:
        if route.name == "cli":
            run = run_row(conn, report.report.run_id)
            assert (run["status"], run["guard_passed"], run["guard_reason"]) == ("guard_tripped", False, reason)
        else:
            assert report.runs[-1] == ("inventory", None, False)  # the purge was not selected
            assert pending_deletions(conn, report.source) == []
        live = conn.execute("SELECT count(*) FROM documents WHERE source = %s AND status <> 'deleted'",
                            (report.source,)).fetchone()[0]
        assert live == live_before
        assert check_index(conn) == []
    alerts = notifier.of("deletion_guard")
    assert len(alerts) == 1 and reason in alerts[0][1]


EMPTY_5 = ("empty listing while the index holds 5 documents of this source: nothing deleted (a source really "
           "emptied: --confirm-delete 5, or `rag-pipeline sources retire`)")


def test_guard_empty_listing_deletes_nothing(tmp_path, route, settings, store, counting):
    root = tmp_path / "share"
    write_folder(root, 5, random.Random(34))
    src = LocalFolderSource(root)
    route(src, store, counting, settings)
    for p in list(root.iterdir()):  # an unmounted share shows as an empty directory
        p.unlink()
    notifier = RecordingNotifier()
    report = route(src, store, counting, settings, notifier=notifier)
    _assert_guard_tripped(route, store, report, notifier, EMPTY_5, 5)
    # The override of the fraction guard never overrides an empty listing.
    notifier2 = RecordingNotifier()
    forced = route(src, store, counting, settings, notifier=notifier2, allow_mass_delete=True)
    _assert_guard_tripped(route, store, forced, notifier2, EMPTY_5, 5)


def _listings(route) -> int:
    """Full listings one call makes: the Dagster route's inventory asset lists the source again."""
    return 2 if route.name == "dagster" else 1


@pytest.mark.parametrize("style", ["raise", "flag"])
def test_guard_listing_fails_on_page_2_of_3(style, route, settings, store, counting):
    rng = random.Random(35)
    src = PagedSource(page_size=4)
    for i in range(10):
        src.put(f"p{i:02d}", f"{paragraph(marker(rng), rng)}\n".encode())
    assert route(src, store, counting, settings).exit_code == EXIT_OK
    assert src.pages_requested == [1, 2, 3]  # nothing vanished: the Dagster route ran no inventory
    src.fail_on_page, src.incomplete_style = 2, style
    src.pages_requested.clear()
    notifier = RecordingNotifier()
    report = route(src, store, counting, settings, notifier=notifier)
    assert src.pages_requested == [1, 2] * _listings(route)
    reason = ("listing incomplete (listing failed: listing failed part-way: connection reset while reading page 2): "
              "nothing deleted" if style == "raise" else
              "listing incomplete (listing failed part-way: connection reset while reading page 2): nothing deleted")
    _assert_guard_tripped(route, store, report, notifier, reason, 10)


def test_guard_empty_page_with_next_link_keeps_paging(route, settings, store, counting):
    """Page 2 comes back empty but with a next token: the listing goes on to pages 3 and 4, so the one
    real deletion is applied and the six documents after the empty page are kept."""
    rng = random.Random(36)
    src = PagedSource(page_size=4)
    for i in range(11):
        src.put(f"p{i:02d}", f"{paragraph(marker(rng), rng)}\n".encode())
    route(src, store, counting, settings)
    src.empty_pages = {2}
    src.delete("p00")
    src.pages_requested.clear()
    notifier = RecordingNotifier()
    report = route(src, store, counting, settings, notifier=notifier)
    assert src.pages_requested == [1, 2, 3, 4] * _listings(route)
    assert report.exit_code == EXIT_OK and report.guard.passed and report.deleted == ["p00"]
    assert notifier.events == []
    assert_clean(store, src.name, {sid: sha256(d.content) for sid, d in src.docs.items()})


def test_guard_source_that_stops_at_an_empty_page_is_caught_by_the_total(route, settings, store, counting):
    """A listing that stops early (as a buggy client would at an empty page) comes up short of the
    announced total: incomplete, so nothing is deleted."""
    rng = random.Random(37)
    src = PagedSource(page_size=4)
    for i in range(10):
        src.put(f"p{i:02d}", f"{paragraph(marker(rng), rng)}\n".encode())
    route(src, store, counting, settings)
    real_page = src._api_page

    def stops_at_empty(token):
        items, nxt, total = real_page(token)
        return items, (nxt if items else None), total

    src._api_page = stops_at_empty
    src.empty_pages = {2}
    notifier = RecordingNotifier()
    report = route(src, store, counting, settings, notifier=notifier)
    _assert_guard_tripped(route, store, report, notifier,
                          "listing incomplete (listed 4 of 10 announced): nothing deleted", 10)


def test_guard_drop_of_60_percent(tmp_path, route, settings, store, counting):
    root = tmp_path / "docs"
    write_folder(root, 10, random.Random(38))
    src = LocalFolderSource(root)
    route(src, store, counting, settings)
    for i in range(6):
        (root / f"doc{i:02d}.md").unlink()
    notifier = RecordingNotifier()
    report = route(src, store, counting, settings, notifier=notifier)
    _assert_guard_tripped(route, store, report, notifier,
                          "would delete 6 of 10 documents (60%), more than the allowed 20%: nothing deleted "
                          "(if that is right: --confirm-delete 6)", 10)
    details = notifier.of("deletion_guard")[0][2]
    # the inventory asset's alert also says the listing was complete
    assert details == {"source": src.name, "listed": 4, "indexed": 10, "to_delete": 6,
                       **({"complete": True} if route.name == "dagster" else {})}
    assert (report.guard.listed, report.guard.indexed, report.guard.to_delete) == (4, 10, 6)
    override = route(src, store, counting, settings, allow_mass_delete=True)
    assert override.exit_code == EXIT_OK and len(override.deleted) == 6
    assert_clean(store, src.name, listing_of(root))


# --- 4. completeness repair --------------------------------------------------------------------------


def test_completed_document_with_missing_rows_is_repaired(tmp_path, route, database_url, store, counting):
    settings = Settings(database_url=database_url, chunk_overlap=0)
    rng = random.Random(41)
    root = tmp_path / "docs"
    root.mkdir()
    for name in ("a.md", "b.md", "c.md"):
        (root / name).write_text("\n\n".join(paragraph(marker(rng), rng, 110) for _ in range(3)) + "\n")
    src = LocalFolderSource(root)
    route(src, store, counting, settings)
    with store.connection() as conn:
        a, b = document(conn, src.name, "a.md"), document(conn, src.name, "b.md")
        lost_a = conn.execute("DELETE FROM chunks WHERE document_id = %s AND ordinal = 1 RETURNING text",
                              (a["id"],)).fetchall()
        lost_b = conn.execute("DELETE FROM chunks WHERE document_id = %s RETURNING text", (b["id"],)).fetchall()
        found = check_index(conn)
        assert [(v.kind, v.source_id, v.detail) for v in found] == [
            ("bad_ordinals", "a.md", "ordinals 0..2 for 2 rows"),
            ("incomplete_completed", "a.md", "stored 2 rows, expected_chunk_count 3, chunk_count 3"),
            ("incomplete_completed", "b.md", "stored 0 rows, expected_chunk_count 3, chunk_count 3")]
    before = len(counting.texts)
    report = route(src, store, counting, settings)

    assert report.actions == {"a.md": "repaired", "b.md": "repaired"}  # c.md is left alone
    # Only the texts whose rows were deleted are embedded again; a.md's two surviving chunks are reused.
    assert sorted(counting.texts[before:]) == sorted(t for (t,) in lost_a + lost_b)
    assert (report.outcomes["a.md"].embedded, report.outcomes["b.md"].embedded) == (1, 3)
    with store.connection() as conn:
        for row, old in ((document(conn, src.name, "a.md"), a), (document(conn, src.name, "b.md"), b)):
            assert row["version"] == 2 and row["stored"] == row["expected_chunk_count"] == 3
            assert row["content_sha256"] == old["content_sha256"]
    assert_clean(store, src.name, listing_of(root))


def test_repair_also_runs_in_change_feed_mode(route, settings, store, counting):
    """A change-feed sync only hears about changed documents; an incomplete one is found in the index."""
    rng = random.Random(42)
    src = MemorySource(with_feed=True)
    for i in range(3):
        src.put(f"f{i}", f"{paragraph(marker(rng), rng)}\n".encode())
    route(src, store, counting, settings)
    with store.connection() as conn:
        conn.execute("DELETE FROM chunks WHERE document_id = %s", (document(conn, src.name, "f1")["id"],))
    report = route(src, store, counting, settings)
    assert report.mode == "changes"
    assert report.actions == {"f1": "repaired"}
    assert_clean(store, src.name, {sid: sha256(d.content) for sid, d in src.docs.items()})


# CLI only: this tests the checker itself (the index is broken by hand; the caller only sets it up).
def test_check_index_reports_each_kind_of_violation(tmp_path, settings, store, counting):
    """The checker itself: break the index behind the sync's back, one rule at a time, and see each
    break reported with its kind (a checker that finds nothing would make every other test vacuous)."""
    root = tmp_path / "docs"
    write_folder(root, 5, random.Random(43))
    src = LocalFolderSource(root)
    sync_source(src, store, counting, settings)
    with store.connection() as conn:
        ids = {s: document(conn, src.name, s)["id"] for s in ("doc00.md", "doc01.md", "doc02.md", "doc03.md", "doc04.md")}
        assert check_index(conn) == []
        # doc00: a stray chunk row of another version (mixed + stale)
        conn.execute("INSERT INTO chunks (id, document_id, version, ordinal, text, text_sha256, token_count) "
                     "SELECT 'x', document_id, 7, 0, text, text_sha256, token_count FROM chunks "
                     "WHERE document_id = %s LIMIT 1", (ids["doc00.md"],))
        # doc01: failed, and its previous version's chunks are gone: readers would see neither version
        conn.execute("UPDATE documents SET status = 'failed' WHERE id = %s", (ids["doc01.md"],))
        conn.execute("DELETE FROM chunks WHERE document_id = %s", (ids["doc01.md"],))
        # doc02: tombstoned but still holding chunks (and deleted_at unset)
        conn.execute("UPDATE documents SET status = 'deleted' WHERE id = %s", (ids["doc02.md"],))
        # doc03: ordinals with a gap
        conn.execute("UPDATE chunks SET ordinal = 5 WHERE document_id = %s", (ids["doc03.md"],))
        # doc04: Markdown of another version
        conn.execute("UPDATE document_markdown SET version = 9 WHERE document_id = %s", (ids["doc04.md"],))
        found = {(v.kind, v.source_id) for v in check_index(conn)}
        assert found == {("mixed_versions", "doc00.md"), ("stale_chunks", "doc00.md"),
                         ("lost_previous_version", "doc01.md"), ("deleted_with_chunks", "doc02.md"),
                         ("tombstone_mismatch", "doc02.md"), ("bad_ordinals", "doc03.md"),
                         ("markdown_mismatch", "doc04.md")}
        listing = listing_of(root)
        listing["doc04.md"] = "0" * 64
        listing["new.md"] = "1" * 64
        del listing["doc00.md"]
        assert {(v.kind, v.source_id) for v in check_against_listing(conn, src.name, listing, converged=True)} == {
            ("not_current", "doc04.md"), ("missing", "new.md"), ("not_deleted", "doc00.md"),
            ("not_completed", "doc01.md"), ("not_completed", "doc02.md")}
        assert {(v.kind, v.source_id) for v in check_against_listing(conn, src.name, listing, converged=False)} == {
            ("unknown_content", "doc04.md")}
        assert check_against_listing(conn, src.name, listing, converged=False,
                                     acceptable={"doc04.md": [listing_of(root)["doc04.md"]]}) == []
