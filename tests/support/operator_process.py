"""The operator (``python -m joblease``) as a real process: start, health, metrics, stop.

The one wrapper every suite (and ``bench``) uses; it only ever signals its own PID.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from joblease_localcluster.process import free_port

from .waiting import wait_for

__all__ = ["OperatorProcess", "free_port"]


# An HTTP 403 in a log: the status code standing alone ('" 403 None"', "(403)", "403
# Forbidden") or kopf's and the API's "Forbidden" — not the digits 403 inside a timestamp's
# milliseconds ("07:12:36,403"), a duration, a port, a name or an id, which a plain substring
# test matched.
FORBIDDEN = re.compile(r"(?:^|(?<=[\s\"(=]))403(?=$|[\s)\":,])|Forbidden")


def forbidden_lines(log: str) -> list[str]:
    """The lines of ``log`` that show a request refused with 403 (empty: none)."""
    return [line for line in log.splitlines() if FORBIDDEN.search(line)]


class OperatorProcess:
    """``python -m joblease`` against ``kubeconfig``, logging to ``log``.

    Args:
        namespaces: watch only these (default: cluster-wide, like the chart).
        extra_env: added to the environment (e.g. libfaketime for a skewed clock).
        extra_args: more operator flags (e.g. ``--verbose``).
        cwd: the working directory (default: this process's).
    """

    def __init__(self, kubeconfig: Path | str, log: Path, *, namespaces: Sequence[str] = (),
                 extra_env: dict[str, str] | None = None, extra_args: Sequence[str] = (),
                 cwd: Path | None = None) -> None:
        self.kubeconfig, self.log = Path(kubeconfig), log
        self.namespaces, self.extra_args, self.cwd = list(namespaces), list(extra_args), cwd
        self.extra_env = dict(extra_env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = self.health_port = 0

    def start(self, wait: bool = True, timeout: float = 45) -> OperatorProcess:
        """Start it (new ports each time); with ``wait``, until its /healthz answers."""
        self.metrics_port, self.health_port = free_port(), free_port()
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.extra_env}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "joblease", "--metrics-port", str(self.metrics_port),
                 "--health-addr", f"127.0.0.1:{self.health_port}",
                 *(f"--namespace={ns}" for ns in self.namespaces), *self.extra_args],
                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.cwd)
        if wait:
            self.wait_healthy(timeout)
        return self

    @property
    def pid(self) -> int:
        """The process's PID (it must have been started)."""
        assert self.proc is not None, "the operator was not started"
        return self.proc.pid

    def healthy(self) -> bool:
        """Whether kopf's /healthz answers; raises if the process has exited."""
        assert self.proc is not None, "the operator was not started"
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.output()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz",
                                        timeout=1):
                return True
        except OSError:
            return False

    def wait_healthy(self, timeout: float = 45) -> None:
        """Wait until /healthz answers (the operator is watching)."""
        wait_for(self.healthy, timeout, f"the operator's /healthz (log {self.log})", poll=0.2)

    def metrics(self) -> dict[str, float]:
        """Scrape /metrics into ``{'name{labels}': value}``."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                values[key] = float(value)
        return values

    def output(self, chars: int = 6000) -> str:
        """The end of its log."""
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def kill9(self) -> None:
        """SIGKILL (a crash), then reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)

    def restart(self, extra_env: dict[str, str] | None = None, wait: bool = True) -> None:
        """Stop, replace the extra environment if given, start again."""
        self.stop()
        if extra_env is not None:
            self.extra_env = dict(extra_env)
        self.start(wait=wait)
