"""Target: the ``documents`` partition-key codec (``rag_pipeline/defs/documents/partitions.py``).

Properties: for a valid source name and a non-empty id, ``document_partition_key`` either raises the
documented ``ValueError`` or returns a key that Dagster accepts (none of its invalid substrings:
``...`` and control characters), that has none of the UI's syntax characters ``,[]|`` outside escapes,
that PostgreSQL (Dagster's storage in the docker deployment) can store and index (valid UTF-8, at most
``partitions.MAX_KEY_BYTES``: a btree index entry holds about 2,700 bytes) and that
``parse_document_partition_key`` turns back into exactly ``(name, id)`` (a digest key, for an id too long to
spell: ``resolve_digest_key`` finds the id among candidates, and only it). ``parse_document_partition_key`` on any string raises only
``ValueError``, and what it accepts re-encodes to an equivalent key.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fuzz.common import Target, counted, guard, short, strings
from rag_pipeline.defs.documents import partitions

MAX_KEY_BYTES = partitions.MAX_KEY_BYTES  # well under PostgreSQL's btree limit (about 2,704 bytes) for Dagster's index
INVALID = ["...", "\a", "\b", "\f", "\n", "\r", "\t", "\v", "\0"]

names = st.one_of(st.from_regex(partitions.SOURCE_NAME_RE, fullmatch=True), st.sampled_from(["docs", "zotero_1", "a"]),
                  st.text(max_size=10))
ids = st.one_of(strings(), st.text(), st.lists(st.sampled_from([".", "%", ",", "[", "]", "|", ":", "/", "%2E", "\x7f",
                                                               "\x1f", "\ud800", "é", "a"]), max_size=30).map("".join),
                st.builds(lambda part, n: "/".join([part] * n), st.sampled_from(["dir", "répertoire", "%", ".."]),
                          st.integers(100, 1500)))


@given(names, ids, st.text())
@counted
def test(name: str, source_id: str, raw_key: str) -> None:
    with guard(lambda: short((name, source_id))):
        try:
            key = partitions.document_partition_key(name, source_id)
        except ValueError:  # documented: an invalid name, an empty id
            assert not partitions.SOURCE_NAME_RE.match(name) or not source_id, \
                f"ValueError for a valid name and id {short(source_id)}"
        else:
            assert not any(bad in key for bad in INVALID), f"Dagster refuses {short(key)}"
            escaped = key.partition(":")[2]
            assert not any(c in escaped for c in ",[]|"), f"UI syntax character in {short(key)}"
            encoded = key.encode("utf-8")  # UnicodeEncodeError: Dagster's storage cannot hold the key
            assert len(encoded) <= MAX_KEY_BYTES, f"key of {len(encoded)} bytes (id of {len(source_id)} chars)"
            if partitions.is_digest_key(key):
                assert partitions.parse_document_partition_key(key) == (name, escaped), f"digest key {short(key)}"
                assert partitions.resolve_digest_key(key, ["x", source_id + "x", source_id]) == source_id
            else:
                assert partitions.parse_document_partition_key(key) == (name, source_id), f"no round trip: {short(key)}"
        try:
            parsed = partitions.parse_document_partition_key(raw_key)
        except ValueError:
            return
        assert partitions.parse_document_partition_key(partitions.document_partition_key(*parsed)) == parsed


TARGET = Target("partitions", test, "defs/documents/partitions.py: keys valid for Dagster, bounded, round-trip")
