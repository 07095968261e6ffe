"""Lines written by several threads at once stay whole (docs/safety.md #47).

``joblease work`` runs its slots in threads, and each says what it did on standard error. With
``print`` (the text, then the newline, in two writes) two slots finishing together printed
``a: completedjoblease work: b: completed`` on one line, and the real-node test that counts
completions in the log saw 4 of 5.
"""

from __future__ import annotations

import functools
import io
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from joblease.engines import runner, worker_pool

THREADS, LINES = 8, 40


class SlowStream(io.StringIO):
    """A stream whose every write lets the other threads run in the middle of it."""

    def write(self, text: str) -> int:
        half = len(text) // 2
        written = super().write(text[:half])
        time.sleep(0.0002)
        return written + super().write(text[half:])


def hammer(say_one: Callable[[str], None]) -> None:
    def slot(i: int) -> None:
        for n in range(LINES):
            say_one(f"slot {i}: line {n} completed")

    threads = [threading.Thread(target=slot, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()



@pytest.mark.parametrize("via", ["runner.say", "the pool's _say"])
def test_every_line_of_every_thread_arrives_whole(via: str) -> None:
    stream = SlowStream()
    if via == "runner.say":
        hammer(lambda text: runner.say(text, stream))
    else:
        pool = SimpleNamespace(out=stream)
        hammer(lambda text: worker_pool.WorkPool._say(pool, text))  # type: ignore[arg-type]
    lines = stream.getvalue().splitlines()
    prefix = "" if via == "runner.say" else "joblease work: "
    expected = {f"{prefix}slot {i}: line {n} completed"
                for i in range(THREADS) for n in range(LINES)}
    assert len(lines) == THREADS * LINES and set(lines) == expected


def _print_to(stream: io.StringIO, text: str) -> None:
    print(text, file=stream, flush=True)


def test_print_would_have_torn_them() -> None:
    """The stream above does tear ``print``'s lines (so the test above can fail); tearing
    needs the threads to interleave, so up to three tries."""
    for _ in range(3):
        stream = SlowStream()
        hammer(functools.partial(_print_to, stream))
        lines = stream.getvalue().splitlines()
        if len(lines) != THREADS * LINES or any(
                not line.startswith("slot ") or not line.endswith("completed") for line in lines):
            return
    raise AssertionError("print never tore a line: SlowStream no longer tests anything")
