"""``joblease run --lease NAME -- CMD…``: run a command only while holding its lease.

The command gets its token in the environment (``JOBLEASE_NAME``, ``JOBLEASE_NAMESPACE``,
``JOBLEASE_HOLDER``, ``JOBLEASE_GENERATION``, ``JOBLEASE_EPOCH``, ``JOBLEASE_TOKEN`` as
``epoch/generation``, ``JOBLEASE_LEASE_UNTIL``). The lease is renewed while it runs; the
moment the lease is lost the command's process group gets SIGTERM, then SIGKILL after the
grace period. Exit 0 completes the lease; any other exit releases it as failed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from joblease.domain.errors import LeaseError, format_time
from joblease.kube.api import ApiError
from joblease.sdk.client import Lease
from joblease.sdk.hold import Holding

EXIT_LEASE_LOST = 4


@dataclass
class RunResult:
    """How a run ended: the command's exit code and whether the lease was lost."""

    child_exit: int
    lost: bool
    completed: bool


def lease_environment(lease: Lease) -> dict[str, str]:
    """The variables a command run under ``lease`` sees."""
    return {
        "JOBLEASE_NAME": lease.name,
        "JOBLEASE_NAMESPACE": lease.namespace,
        "JOBLEASE_HOLDER": lease.holder,
        "JOBLEASE_GENERATION": str(lease.token.generation),
        "JOBLEASE_EPOCH": str(lease.token.epoch),
        "JOBLEASE_TOKEN": str(lease.token),
        "JOBLEASE_LEASE_UNTIL": format_time(lease.lease_until) if lease.lease_until else "",
    }


class _StopChildOnLoss(Holding):
    def __init__(self, lease: Lease, grace: float) -> None:
        super().__init__(lease)
        self.grace = grace
        self.child: subprocess.Popen[bytes] | None = None

    def on_lost(self) -> None:
        child = self.child
        if child is None or child.poll() is not None:
            return
        print(f"joblease run: lease {self.lease.name!r} lost ({self.error}); stopping the "
              f"command (pid {child.pid})", file=sys.stderr, flush=True)
        _signal_group(child, signal.SIGTERM)
        threading.Thread(target=self._kill_after_grace, args=(child,), daemon=True).start()

    def _kill_after_grace(self, child: subprocess.Popen[bytes]) -> None:
        try:
            child.wait(self.grace)
        except subprocess.TimeoutExpired:
            _signal_group(child, signal.SIGKILL)


def run_under_lease(lease: Lease, command: list[str], grace: float = 5.0) -> RunResult:
    """Run ``command`` while holding ``lease``; complete on exit 0, release otherwise."""
    holding = _StopChildOnLoss(lease, grace)
    env = {**os.environ, **lease_environment(lease)}
    with holding:
        child = subprocess.Popen(command, env=env, start_new_session=True)
        holding.child = child
        forward = _forward_signals(child)
        try:
            code = child.wait()
        finally:
            forward()
        holding.failed = code != 0
        if holding.error is None and code == 0:
            try:
                holding.complete(f"exit 0: {' '.join(command)[:200]}")
            except (LeaseError, ApiError) as err:
                print(f"joblease run: completion refused: {err}", file=sys.stderr)
                return RunResult(code, True, False)
    return RunResult(code, holding.error is not None, holding.completed)


def _signal_group(child: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, sig)


def _forward_signals(child: subprocess.Popen[bytes]) -> Callable[[], None]:
    """Pass SIGINT/SIGTERM on to the command's group; return a function that restores."""
    previous: dict[signal.Signals, Any] = {}

    def forward(signum: int, _frame: object) -> None:
        _signal_group(child, signal.Signals(signum))

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, forward)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
