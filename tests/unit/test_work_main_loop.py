"""``joblease work``'s main loop looks when something is due or news comes, not on a timer.

It used to look every 0.2 s: 0.8 ms of CPU a second for an idle worker, about 0.3 ms per
job in the pool bench's drain (docs/benchmarks.md). What each test breaks: an idle loop that
spins (it looks more than once a second), an ``--until-empty`` worker that no longer notices
the pool empty at once (it waits for the next progress line), a drain whose end or deadline
is noticed late. A fake claim source stands in for the pool: no lease is ever claimed, so
no command runs; what is tested is the loop.
"""

from __future__ import annotations

import io
import threading
import time

import pytest

from joblease.engines.worker_pool import EXIT_OK, MAX_LOOK, WorkOptions, WorkPool


class FakePool:
    """A pool with ``left`` unfinished jobs, none claimable; ``empty()`` finishes them."""

    def __init__(self, left: int) -> None:
        self.left = left
        self._changed = threading.Condition()

    def claim_next(self, holder: str | None = None, *, timeout: float | None = None,
                   until_empty: bool = False) -> None:
        with self._changed:  # as the pool does: an empty pool answers at once
            if not (until_empty and self.left == 0):
                self._changed.wait(timeout)
        return None

    def unfinished(self, timeout: float = 0.0) -> int:
        return self.left

    def empty(self) -> None:
        with self._changed:
            self.left = 0
            self._changed.notify_all()


class CountingPool(WorkPool):
    """A ``WorkPool`` that counts its main loop's looks."""

    looks = 0

    def _supervise(self) -> None:
        self.looks += 1
        super()._supervise()


def run_in_thread(pool: WorkPool) -> tuple[threading.Thread, list[int]]:
    code: list[int] = []
    thread = threading.Thread(target=lambda: code.append(pool.run()), daemon=True)
    thread.start()
    return thread, code


def test_an_idle_worker_looks_about_once_a_second_not_five_times() -> None:
    worker = CountingPool(FakePool(left=3), WorkOptions(["true"], poll=0.5),
                          out=io.StringIO())
    thread, code = run_in_thread(worker)
    time.sleep(2.2)
    looks = worker.looks
    worker.drain()
    thread.join(5)
    assert code == [EXIT_OK]
    assert 2 <= looks <= 2.2 / MAX_LOOK + 2, f"{looks} looks in 2.2 s"  # at 0.2 s: 11


@pytest.mark.parametrize("concurrency", [1, 3])
def test_until_empty_exits_as_soon_as_the_pool_empties(concurrency: int) -> None:
    fake = FakePool(left=2)
    worker = CountingPool(fake, WorkOptions(["true"], concurrency=concurrency,
                                            until_empty=True, poll=5.0, progress_every=60),
                          out=io.StringIO())
    thread, code = run_in_thread(worker)
    time.sleep(1.3)
    assert thread.is_alive(), "exited while jobs were unfinished"
    emptied = time.monotonic()
    fake.empty()
    thread.join(5)
    assert code == [EXIT_OK]
    assert time.monotonic() - emptied < 0.5, "the empty pool was noticed late"


def test_a_drain_ends_the_worker_at_once_and_not_at_the_next_progress_line() -> None:
    worker = CountingPool(FakePool(left=3), WorkOptions(["true"], concurrency=2, poll=0.2,
                                                        progress_every=60),
                          out=io.StringIO())
    thread, code = run_in_thread(worker)
    time.sleep(0.5)
    asked = time.monotonic()
    worker.drain()
    thread.join(5)
    assert code == [EXIT_OK]
    assert time.monotonic() - asked < 0.6  # a slot's poll (0.2 s) and a little


def test_the_progress_line_still_comes_every_progress_every() -> None:
    out = io.StringIO()
    worker = CountingPool(FakePool(left=3), WorkOptions(["true"], poll=0.5,
                                                        progress_every=0.3), out=out)
    thread, _ = run_in_thread(worker)
    time.sleep(1.65)
    worker.drain()
    thread.join(5)
    lines = [line for line in out.getvalue().splitlines() if "remaining=3" in line]
    assert 5 <= len(lines) <= 8, out.getvalue()  # at 0.3 s over 1.65 s, and the last one
