"""Shared machinery of the fuzz targets: execution counting, finding signatures, JSON mutation.

A target module defines ``TARGET = Target(name, test, about)`` where ``test`` is a Hypothesis ``@given``
function whose body runs inside ``guard(describe)``. ``guard`` counts executions and slow examples, and
swallows an exception whose *signature* (exception type and the innermost ``rag_pipeline``/``fuzz`` frame)
is already in ``IGNORED``: once the runner has reported a finding it keeps exploring past it.
The same ``test`` serves both engines: Hypothesis generates inputs itself (``fuzz/run.py --engine
hypothesis``), atheris feeds coverage-guided bytes to ``test.hypothesis.fuzz_one_input``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import HypothesisException

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures"
#: an example slower than this is reported (``--seconds`` runs have no per-example deadline)
SLOW_S = float(os.environ.get("FUZZ_SLOW_S", "5"))

Signature = tuple[str, str]


@dataclass
class Target:
    name: str
    test: Callable[..., None]
    about: str


@dataclass
class Stats:
    examples: int = 0
    executions: int = 0
    known: Counter = field(default_factory=Counter)
    slow: list[tuple[float, str]] = field(default_factory=list)


STATS = Stats()
IGNORED: set[Signature] = set()


def counted(fn: Callable[..., None]) -> Callable[..., None]:
    """Under ``@given``: count the examples the test function runs."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        STATS.examples += 1
        fn(*args, **kwargs)

    return wrapper


def signature(exc: BaseException) -> Signature:
    """``(exception type, "path:line")`` of the innermost frame in ``rag_pipeline/`` or ``fuzz/``."""
    where = "?"
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename)
        if "rag_pipeline" in path.parts or "fuzz" in path.parts:
            try:
                where = f"{path.resolve().relative_to(REPO)}:{frame.lineno}"
            except ValueError:
                where = f"{frame.filename}:{frame.lineno}"
            break
    return type(exc).__name__, where


@contextmanager
def guard(describe: Callable[[], str] = lambda: "") -> Iterator[None]:
    """Run one example: count it, note it when slow, swallow an already reported finding."""
    STATS.executions += 1
    start = time.monotonic()
    try:
        yield
    except HypothesisException:
        raise
    except Exception as exc:
        sig = signature(exc)
        if sig in IGNORED:
            STATS.known[sig] += 1
            return
        exc.add_note(f"fuzz input: {describe()[:2000]}")
        raise
    finally:
        elapsed = time.monotonic() - start
        if elapsed > SLOW_S and len(STATS.slow) < 20:
            STATS.slow.append((elapsed, describe()[:300]))


def short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


# --- generated values ----------------------------------------------------------------------------

#: strings that have broken parsers before: separators, traversal, controls, surrogates, escapes
NASTY_STRINGS = [
    "", " ", "\x00", "\ud800", "\udcff", "\ufeff", "\u202e", "\u2028", "\r\n", "\t", "é", "\u0301", "ﬁ",
    "日本語", "𝔘𝔫𝔦", "../../etc/passwd", "/etc/passwd", "attachments:../../x", "C:\\Papers\\a.pdf",
    "\\\\nas\\share\\a.pdf", "//nas/share", "%", "%2E%2E", "...", "a,b", "[x]", "|", ":", "null", "NaN",
    "Infinity", "1e309", "-0", "0x10", "2024-13-45T99:99:99Z", "2024-01-01T00:00:00Z", "2024-01-01",
    "9999-12-31T23:59:59.999999+14:00", "0001-01-01T00:00:00-23:59", "Z", "application/vnd.google-apps.document",
    "application/vnd.google-apps.folder", "application/vnd.google-apps.shortcut", "application/pdf",
    "imported_file", "imported_url", "linked_file", "linked_url", "embedded_image", "attachment", "note",
]
NASTY_NUMBERS = [0, -1, 1, 2**31, 2**63, -(2**63), 10**30, 0.5, -0.0, 1e308, math.inf, -math.inf, math.nan, True, False]


def huge_strings() -> st.SearchStrategy[str]:
    return st.builds(lambda piece, n: piece * n, st.sampled_from(["a", "é", "日", "/", ".", "\ud800", "a b"]),
                     st.one_of(st.integers(300, 5_000), st.just(70_000)))


def strings() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(NASTY_STRINGS), st.text(max_size=40), huge_strings(),
                     st.lists(st.sampled_from(NASTY_STRINGS), max_size=5).map("".join))


def json_values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Any value ``json.loads`` can return (NaN and infinities included: Python's json accepts them)."""
    leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.sampled_from(NASTY_NUMBERS),
                       strings())
    return st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(strings(), inner, max_size=4)),
                        max_leaves=max_leaves)


def _keys_of(value: Any, out: set[str]) -> set[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            out.add(k)
            _keys_of(v, out)
    elif isinstance(value, list):
        for v in value:
            _keys_of(v, out)
    return out


@st.composite
def mutated(draw, value: Any, keys: tuple[str, ...] = (), depth: int = 0) -> Any:
    """``value`` (a real API body) with random mutations: types swapped, keys dropped or added,
    strings replaced by huge/unicode/nasty ones, numbers by extreme ones, list items dropped or repeated."""
    roll = draw(st.integers(0, 15))
    if roll == 0:
        return draw(json_values())
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            action = draw(st.integers(0, 9)) if depth < 8 else 9
            if action == 0:
                continue  # key dropped
            out[key] = draw(mutated(item, keys, depth + 1)) if action < 8 else item
        if keys and draw(st.integers(0, 5)) == 0:
            out[draw(st.sampled_from(keys))] = draw(json_values())
        return out
    if isinstance(value, list):
        out = []
        for item in value:
            action = draw(st.integers(0, 9)) if depth < 8 else 9
            if action == 0:
                continue
            out.append(draw(mutated(item, keys, depth + 1)) if action < 8 else item)
            if action == 1:
                out.append(item)  # repeated
        return out
    if roll <= 3:
        if isinstance(value, str):
            return draw(strings())
        if isinstance(value, (int, float)):
            return draw(st.sampled_from(NASTY_NUMBERS))
    return value


def load_json(*parts: str) -> Any:
    return json.loads((FIXTURES.joinpath(*parts)).read_text(encoding="utf-8"))


def fixture_keys(*values: Any) -> tuple[str, ...]:
    out: set[str] = set()
    for value in values:
        _keys_of(value, out)
    return tuple(sorted(out))


def check_documents(documents: Any) -> None:
    """Properties of ``SourceDocument``s a connector returns: the declared field types (the store calls
    ``str`` methods on them), then storability (PostgreSQL TEXT/JSONB take neither lone surrogates nor
    NaN/Infinity)."""
    from datetime import datetime

    from rag_pipeline.store.write import _json_safe

    for doc in documents:
        assert isinstance(doc.source_id, str) and doc.source_id, f"source_id {short(doc.source_id)}"
        assert isinstance(doc.title, str), f"title {short(doc.title)}"
        assert isinstance(doc.uri, str), f"uri {short(doc.uri)}"
        for name in ("mime_type", "source_version", "content_sha256", "skip_reason"):
            value = getattr(doc, name)
            assert value is None or isinstance(value, str), f"{name} {short(value)}"
        assert doc.size is None or (isinstance(doc.size, int) and not isinstance(doc.size, bool)), \
            f"size {short(doc.size)}"
        assert doc.modified_at is None or (isinstance(doc.modified_at, datetime) and doc.modified_at.tzinfo), \
            f"modified_at {short(doc.modified_at)}"
        text = json.dumps(_json_safe(dict(doc.metadata)), allow_nan=False, ensure_ascii=False)  # NaN, Infinity
        for value in (doc.source_id, doc.title, doc.uri, doc.mime_type, doc.source_version, text):
            if value is not None:
                value.encode("utf-8")  # UnicodeEncodeError: a lone surrogate PostgreSQL would refuse
