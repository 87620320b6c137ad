"""Retry-After / Backoff parsing shared by the connectors."""

from datetime import datetime, timezone

import pytest

from rag_pipeline.sources.http import parse_retry_after

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("value,expected", [
    ("120", 120.0),                              # delay-seconds
    (" 1.5 ", 1.5),                              # Zotero Backoff may be fractional; whitespace ignored
    ("-3", 0.0),                                 # never negative
    ("Sun, 29 Nov 2026 12:00:30 GMT", 30.0),     # HTTP date, 30 s ahead
    ("Sun, 29 Nov 2026 11:59:00 GMT", 0.0),      # a date in the past: no wait
    ("soon", None),                              # unparseable
    ("", None),
    (None, None),
])
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value, now=NOW) == expected
