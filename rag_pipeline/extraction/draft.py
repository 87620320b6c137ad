"""The intermediate result every format extractor returns before the shared clean-up."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Draft:
    """Markdown as a format extractor produced it (not yet NFKC-normalised or whitespace-tidied).

    ``page_count``: pages/slides/sheets or ``None``. ``stats``: format-specific quality facts merged
    into ``Extraction.stats``. ``children``: ``(filename, bytes)`` attachments.
    ``removed_control_chars``: control characters the extractor already removed itself.
    """

    markdown: str
    page_count: int | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    children: list[tuple[str, bytes]] = field(default_factory=list)
    removed_control_chars: int = 0
