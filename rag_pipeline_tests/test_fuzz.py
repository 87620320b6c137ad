"""Every fuzz target (``fuzz/``) runs a few seconds under Hypothesis, seeded, on each test run (issue 12,
part 5). Only findings already pinned in ``test_fuzz_regressions.py`` (``fuzz/known.py``) are tolerated;
a new crash or broken property fails with its input. Long runs: ``python -m fuzz.run --seconds 3600``.
"""

from __future__ import annotations

import logging
import os

import pytest

SECONDS = float(os.environ.get("RAG_FUZZ_CI_SECONDS", "3"))
CONNECTORS = {"zotero", "gdrive", "sharepoint"}  # built from ../shared/fixtures


@pytest.mark.slow
@pytest.mark.parametrize("target", ["clean", "chunking", "tables", "partitions", "detect", "zotero", "gdrive",
                                    "sharepoint"])
def test_fuzz_target_for_a_few_seconds(target, request):
    if target in CONNECTORS:
        request.getfixturevalue("shared_dir")
    from fuzz.run import report, run_hypothesis

    package_logger = logging.getLogger("rag_pipeline")
    level = package_logger.level
    try:
        result = run_hypothesis(target, SECONDS, seed=0)
    finally:
        package_logger.setLevel(level)  # the runner quiets the package's logs; later tests read them
    assert result.examples > 0, f"{target}: no example ran in {SECONDS}s"
    new = [f for f in result.findings if not f.known]
    if new:
        import io

        out = io.StringIO()
        report(result, out)
        pytest.fail(out.getvalue() + "\n" + "\n\n".join(f.detail[-1500:] for f in new))
