"""The test harness that runs every client test against both clients must survive a fork.

``make mutate`` (mutmut) forks a worker per mutant from a process that already imported the
tests. The shared asyncio loop of ``support.clients`` ran in a thread started at import: a
fork copies the loop but not the thread, so every asyncio client test hung in the worker
until mutmut's timeout, and mutmut counts a timeout as a killed mutant — the asyncio
client's mutation score was inflated by tests that never ran (docs/mutation.md).
"""

from __future__ import annotations

import asyncio
import os

import pytest

from support.clients import LOOP

pytestmark = pytest.mark.unit


def test_the_shared_loop_serves_a_forked_child() -> None:
    assert LOOP.run(asyncio.sleep(0, result=1)) == 1  # the parent's loop thread is running
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if its awaitable ran
        try:
            code = 0 if LOOP.run(asyncio.sleep(0, result=7), timeout=5) == 7 else 1
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child's awaitable never ran"
    assert LOOP.run(asyncio.sleep(0, result=2)) == 2  # the parent's loop is unaffected
