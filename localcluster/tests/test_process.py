"""ManagedProcess: clear start-up errors, stop by PID with SIGKILL as the last resort."""

import socket
import sys
import time
from pathlib import Path

import pytest

from joblease_localcluster.process import (
    ComponentStartError,
    ManagedProcess,
    PortInUseError,
    pid_matches,
)


def test_exit_during_start_up_names_component_code_and_log_tail(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('boom: bad flag'); sys.exit(3)"]
    proc = ManagedProcess("fake-apiserver", argv, tmp_path / "x.log", lambda: False)
    with pytest.raises(ComponentStartError) as info:
        proc.start()
    message = str(info.value)
    assert "fake-apiserver failed to start: exited with code 3" in message
    assert "boom: bad flag" in message


def test_port_already_in_use_names_the_port(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
        proc = ManagedProcess("web", argv, tmp_path / "web.log", lambda: False,
                              ports={"port": port}, start_timeout=10)
        with pytest.raises(PortInUseError, match=f"web failed to start.*port={port}"):
            proc.start()


def test_start_timeout_stops_the_process(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    proc = ManagedProcess("sleepy", argv, tmp_path / "s.log", lambda: False,
                          start_timeout=0.5)
    with pytest.raises(ComponentStartError, match="sleepy failed to start: not healthy"):
        proc.start()
    assert not proc.running()


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = ("import signal, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)")
    proc = ManagedProcess("stubborn", [sys.executable, "-c", code], tmp_path / "k.log",
                          ready.exists, stop_timeout=0.5)
    proc.start()
    pid = proc.pid
    assert pid is not None and pid_matches(pid, sys.executable)
    began = time.monotonic()
    proc.stop()
    assert time.monotonic() - began < 10
    assert not proc.running()
    assert not Path(f"/proc/{pid}").exists()
