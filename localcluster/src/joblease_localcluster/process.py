"""One server process of the local control plane: start, wait until healthy, stop.

Guarantees:
    * ``start()`` returns only once the health check has passed; otherwise it raises
      :class:`ComponentStartError` naming the component, why (exited with code N, did
      not become healthy in time, address already in use) and the last lines of its log,
      and the process is stopped. A start-up failure is never a silent hang.
    * ``stop()`` signals only the PID this object started (SIGTERM, wait up to
      ``stop_timeout``, then SIGKILL) and reaps it. :func:`stop_pid` does the same for a
      process started by an earlier command (``joblease-localcluster down``), after
      checking ``/proc/PID/cmdline`` still names the binary we started: a PID the kernel
      has reused for another program is left alone.

Non-guarantees: the health check is the component's own (``/readyz``, ``/health``); what
a component does after it has reported healthy is observable only in its log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

LOG_TAIL_LINES = 40

HealthCheck = Callable[[], bool]


class ComponentStartError(RuntimeError):
    """A component did not become healthy; the message names it and shows its log tail."""

    def __init__(self, component: str, reason: str, log_path: Path | None = None) -> None:
        self.component = component
        self.reason = reason
        self.log_path = log_path
        message = f"{component} failed to start: {reason}"
        if log_path is not None:
            message += (f"\n--- last {LOG_TAIL_LINES} lines of {log_path} ---\n"
                        f"{log_tail(log_path)}")
        super().__init__(message)


class PortInUseError(ComponentStartError):
    """A port we chose was taken before the component could bind it."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (bind to port 0).

    Another process may take it between now and the component's own bind; that race is
    reported by :class:`PortInUseError` rather than hidden.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Return the last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


class ManagedProcess:
    """A server binary we started, with its log file and health check.

    Args:
        name: the component's name, used in every message (``kube-apiserver``).
        argv: the full command line; ``argv[0]`` is the binary's absolute path.
        log_path: stdout and stderr both go here (appended), never to our terminal.
        health: returns True once the component serves; exceptions count as "not yet".
        ports: the ports handed to the component, by flag, so an "address already in use"
            in its log can be reported with the port that collided.
        start_timeout: seconds to wait for ``health`` before giving up.
        stop_timeout: seconds between SIGTERM and SIGKILL.
        detach: start in a new session so the process outlives our own (detached mode)
            and a Ctrl-C in our terminal does not reach it.
        env: extra environment variables.

    """

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, health: HealthCheck,
                 *, ports: Mapping[str, int] | None = None, start_timeout: float = 60.0,
                 stop_timeout: float = 20.0, detach: bool = False,
                 env: Mapping[str, str] | None = None) -> None:
        if not argv:
            raise ValueError(f"{name}: empty argv")
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.health = health
        self.ports = dict(ports or {})
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.detach = detach
        self.env = dict(env or {})
        self.started_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The PID we started, or None before ``start()``."""
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """Its exit status once reaped (negative: the signal that ended it), else None.

        Why: a stop that had to escalate ends in ``-9``; a test can tell a graceful
        stop from one that only looked graceful.
        """
        return self._proc.returncode if self._proc is not None else None

    def running(self) -> bool:
        """Whether the process we started is still alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the process and wait until its health check passes.

        Raises:
            ComponentStartError: the binary could not be executed, exited, or did not
                become healthy within ``start_timeout`` (the process is then stopped).
            PortInUseError: its log says one of its ports was already taken.

        """
        if self._proc is not None:
            raise RuntimeError(f"{self.name} was already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        with self.log_path.open("ab") as log:
            log.write(f"# joblease: starting {' '.join(self.argv)}\n".encode())
            log.flush()
            try:
                self._proc = subprocess.Popen(
                    self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=self.detach, env={**os.environ, **self.env},
                    close_fds=True)
            except OSError as err:
                raise ComponentStartError(self.name, f"cannot execute {self.argv[0]}: {err}"
                                          ) from err
        deadline = began + self.start_timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                self._fail(f"exited with code {code} during start-up")
            if self._healthy():
                self.started_seconds = time.monotonic() - began
                return
            if time.monotonic() > deadline:
                self.stop()
                self._fail(f"not healthy after {self.start_timeout:.0f}s")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        try:
            return self.health()
        except Exception:
            return False

    def _fail(self, reason: str) -> None:
        tail = log_tail(self.log_path).lower()
        if "address already in use" in tail and self.ports:
            used = ", ".join(f"{flag}={port}" for flag, port in self.ports.items())
            raise PortInUseError(
                self.name, f"{reason}: address already in use on 127.0.0.1 (ports {used}); "
                "another process took a port between our choice and its bind — retry",
                self.log_path)
        raise ComponentStartError(self.name, reason, self.log_path)

    def stop(self) -> None:
        """Stop the process: SIGTERM, wait ``stop_timeout``, then SIGKILL; always reaped."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=30)


def pid_matches(pid: int, argv0: str) -> bool:
    """Whether ``pid`` is alive (not a zombie) and runs the binary ``argv0``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    if state in ("Z", "X"):
        return False
    return cmdline.split(b"\0", 1)[0].decode(errors="replace") == argv0


def stop_pid(pid: int, argv0: str, timeout: float = 20.0) -> bool:
    """Stop a process an earlier command started, by PID, if it still runs ``argv0``.

    The process is not our child, so it cannot be reaped here: it counts as gone once
    ``/proc/PID`` disappears or turns into a zombie (its new parent reaps it).

    Returns:
        True when a matching process was found (and is now gone), False when there was
        nothing of ours to stop.

    """
    if not pid_matches(pid, argv0):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_matches(pid, argv0):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
        time.sleep(0.1)
    return True
