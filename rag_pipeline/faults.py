"""Named fault-injection checkpoints, used by the crash-safety tests (and nothing else).

``checkpoint("write.after_insert")`` does nothing unless ``RAG_FAULT_INJECT`` names that point, as
``<point>[@<n>]:<action>`` (several separated by commas), where ``n`` is the 1-based occurrence in this
process (default 1) and ``action`` is ``kill`` (SIGKILL this process: a crash with no clean-up) or
``raise`` (raise ``InjectedFault``). Reading one environment variable per call keeps it cheap.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

_hits: Counter[str] = Counter()


class InjectedFault(RuntimeError):
    """Raised at a checkpoint configured with action ``raise``."""


def checkpoint(name: str) -> None:
    """Crash or raise here when ``RAG_FAULT_INJECT`` asks for it (see module docstring)."""
    spec = os.environ.get("RAG_FAULT_INJECT")
    if not spec:
        return
    _hits[name] += 1
    for item in spec.split(","):
        point, _, action = item.strip().partition(":")
        point, _, nth = point.partition("@")
        if point != name or _hits[name] != int(nth or 1):
            continue
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise InjectedFault(f"injected fault at {name} (occurrence {_hits[name]})")
