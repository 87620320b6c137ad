"""Findings already reported and pinned by a ``xfail(strict=True)`` regression test in
``rag_pipeline_tests/test_fuzz_regressions.py`` (the files are owned elsewhere; the fix is proposed there).

Matched by exception type and file (not line: the owners edit those files). Remove an entry with its fix:
the strict xfail then turns into a failure that says so.
"""

from __future__ import annotations

_R = "rag_pipeline_tests/test_fuzz_regressions.py::"
KNOWN: list[tuple[str, ...]] = [
    # (exception type, file of the innermost rag_pipeline/fuzz frame, regression test[, text in the message
    # [, target]])
]


def match(signature, error: str = "", target: str = "") -> str | None:
    """The regression test of a known finding with this ``(type, "path:line")`` signature and message (found
    by ``target``), else ``None``."""
    kind, where = signature[0], signature[1]
    path = where.rsplit(":", 1)[0]
    for known_kind, known_path, test, *rest in KNOWN:
        text, only = (rest + ["", ""])[:2]
        if kind == known_kind and path == known_path and text in error and (not only or only == target):
            return test
    return None
