"""Run a function as another system user, in a forked child, and bring its (pickled) result back.

Used where the kernel's own answer matters: what an unprivileged process can list or open. The child
drops to the user's uid and primary gid with the given supplementary groups and never returns into
pytest; a child that fails, dies or hangs fails the test with what it said.
"""

from __future__ import annotations

import os
import pickle
import pwd
import select
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import pytest


def run_as(user: str, fn: Callable[[], Any], *, groups: Sequence[int] = (), timeout_s: float = 60.0) -> Any:
    """``fn()`` run by a child process as ``user`` (supplementary ``groups``); its return value (picklable).
    Needs root in the parent."""
    entry = pwd.getpwnam(user)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            os.close(r)
            os.setgroups(list(groups))
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            try:
                payload = ("ok", fn())
            except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test with it
                payload = ("error", traceback.format_exc())
            data = pickle.dumps(payload)
            while data:
                data = data[os.write(w, data):]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    chunks, deadline = [], time.monotonic() + timeout_s
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"the child running as {user} did not finish within {timeout_s}s")
            block = os.read(r, 1 << 16)
            if not block:
                break
            chunks.append(block)
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    if not chunks:
        pytest.fail(f"the child running as {user} died without answering (wait status {status})")
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "error":
        pytest.fail(f"the child running as {user} failed:\n{value}")
    return value
