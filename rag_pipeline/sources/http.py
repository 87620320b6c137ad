"""HTTP helpers shared by the connectors (Zotero, Google Drive, SharePoint)."""

from __future__ import annotations

import email.utils
from datetime import datetime, timezone


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` (or Zotero ``Backoff``) header asks the client to wait.

    ``value``: delay-seconds (``"120"``, ``"1.5"``) or an HTTP date (RFC 9110); a date without a time
    zone counts as UTC. Returns ``None`` when absent or unparseable; never negative.
    """
    if value is None:
        return None
    raw = value.strip()
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - (now or datetime.now(timezone.utc))).total_seconds())
