"""Bounded waiting: ``wait_for`` polls a check, ``retry`` repeats a call that raises."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float, what: str, poll: float = 0.1) -> T:
    """Call ``check`` until it returns something truthy and return that.

    Raises:
        AssertionError: nothing truthy within ``timeout`` seconds (``what`` names it).
    """
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


def retry(fn: Callable[[], T], seconds: float = 60.0, pause: float = 0.5) -> T:
    """Call ``fn`` until it does not raise, for at most ``seconds`` (servers restarting).

    The last exception propagates once ``seconds`` have passed.
    """
    deadline = time.monotonic() + seconds
    while True:
        try:
            return fn()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(pause)
