"""Recording and reading operation histories (format: ``docs/history-format.md``).

Each process appends its own JSON Lines file (one line per event, flushed at once, so a
process killed with SIGKILL leaves every event it had recorded); :func:`load` merges the
files of one run into operations. Times are ``time.monotonic_ns()``: CLOCK_MONOTONIC is one
clock for every process of the machine (libfaketime leaves it alone with
``DONT_FAKE_MONOTONIC=1``), so invocations and completions of different processes compare.
Server-time bounds are Unix milliseconds on the API server's clock, from the SDK's
estimate: ``server_lo`` is the earliest the server's clock can have read at the
invocation, ``server_hi`` the latest it can read at the completion.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OPS = ("claim", "renew", "complete", "release", "write", "expire", "read")
OK, REFUSED, UNKNOWN = "ok", "refused", "unknown"
FORMAT_VERSION = 1


@dataclass
class Op:
    """One operation: invocation plus completion (``ret_ns`` None: never completed)."""

    id: str
    process: str
    op: str
    lease: str
    args: dict[str, Any]
    call_ns: int
    server_lo: float | None = None
    ret_ns: int | None = None
    server_hi: float | None = None
    result: dict[str, Any] = field(default_factory=lambda: {"status": UNKNOWN})

    @property
    def status(self) -> str:
        """``ok``, ``refused`` or ``unknown``."""
        return str(self.result.get("status", UNKNOWN))

    @property
    def ok(self) -> bool:
        """Whether the operation was acknowledged as applied."""
        return self.status == OK

    def to_json(self) -> dict[str, Any]:
        """The operation as one merged JSON object (what the Go checker reads)."""
        return {"id": self.id, "process": self.process, "op": self.op, "lease": self.lease,
                "args": self.args, "call_ns": self.call_ns, "ret_ns": self.ret_ns,
                "server_lo": self.server_lo, "server_hi": self.server_hi,
                "result": self.result}


class Recorder:
    """Appends one process's events to its own history file.

    Args:
        path: The file (created; appended to).
        process: This process's id in the history (unique per run).
        server_now: Returns ``(earliest, latest)`` server time in Unix ms, or raises.
    """

    def __init__(self, path: Path, process: str,
                 server_now: Any = None) -> None:
        self.path = path
        self.process = process
        self.server_now = server_now
        self._seq = itertools.count(1)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _bounds(self) -> tuple[float, float] | None:
        if self.server_now is None:
            return None
        try:
            lo, hi = self.server_now()
            return float(lo), float(hi)
        except Exception:
            return None

    def _emit(self, event: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())

    def invoke(self, op: str, lease: str, **args: Any) -> str:
        """Record an invocation; return its id for :meth:`complete`."""
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}")
        op_id = f"{self.process}:{next(self._seq)}"
        bounds = self._bounds()
        self._emit({"v": FORMAT_VERSION, "type": "invoke", "id": op_id,
                    "process": self.process, "op": op, "lease": lease, "args": args,
                    "mono_ns": time.monotonic_ns(),
                    "server_lo": bounds[0] if bounds else None})
        return op_id

    def complete(self, op_id: str, status: str, **result: Any) -> None:
        """Record the completion of ``op_id`` (``ok``, ``refused`` or ``unknown``)."""
        mono = time.monotonic_ns()
        bounds = self._bounds()
        self._emit({"v": FORMAT_VERSION, "type": "complete", "id": op_id,
                    "process": self.process, "mono_ns": mono,
                    "server_hi": bounds[1] if bounds else None,
                    "result": {"status": status, **result}})

    @contextmanager
    def operation(self, op: str, lease: str, **args: Any) -> Iterator[dict[str, Any]]:
        """Record ``op`` around a block; the block fills the yielded dict with the result.

        If the block leaves ``status`` unset and raises, the completion is ``unknown``.
        """
        op_id = self.invoke(op, lease, **args)
        result: dict[str, Any] = {}
        try:
            yield result
        except BaseException as err:
            if "status" not in result:
                result.update(status=UNKNOWN, error=type(err).__name__)
            raise
        finally:
            status = result.pop("status", UNKNOWN)
            self.complete(op_id, status, **result)

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)


def read_events(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every event of the files (a torn last line of a killed process is skipped)."""
    events: list[dict[str, Any]] = []
    for path in paths:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def merge(events: Iterable[dict[str, Any]]) -> list[Op]:
    """Pair invocations with completions; operations sorted by invocation time."""
    ops: dict[str, Op] = {}
    completions: dict[str, dict[str, Any]] = {}
    for ev in events:
        if ev["type"] == "invoke":
            ops[ev["id"]] = Op(ev["id"], str(ev["process"]), ev["op"], ev["lease"],
                               dict(ev.get("args") or {}), int(ev["mono_ns"]),
                               ev.get("server_lo"))
        elif ev["type"] == "complete":
            completions[ev["id"]] = ev
    for op_id, ev in completions.items():
        op = ops.get(op_id)
        if op is None:
            raise ValueError(f"completion of unknown operation {op_id}")
        op.ret_ns = int(ev["mono_ns"])
        op.server_hi = ev.get("server_hi")
        op.result = dict(ev.get("result") or {"status": UNKNOWN})
    return sorted(ops.values(), key=lambda o: (o.call_ns, o.id))


def load(folder_or_files: Path | Iterable[Path]) -> list[Op]:
    """Load a run: every ``*.jsonl`` in a folder, or the given files."""
    if isinstance(folder_or_files, Path):
        paths: Iterable[Path] = sorted(folder_or_files.glob("*.jsonl"))
    else:
        paths = folder_or_files
    return merge(read_events(paths))


def write_merged(ops: Iterable[Op], path: Path) -> Path:
    """Write merged operations as JSON Lines (one operation per line) for the Go checker."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for op in ops:
            out.write(json.dumps(op.to_json(), separators=(",", ":")) + "\n")
    return path


def events_of(ops: Iterable[Op]) -> list[dict[str, Any]]:
    """Turn operations back into events (hand-made histories in tests)."""
    events: list[dict[str, Any]] = []
    for op in ops:
        events.append({"type": "invoke", "id": op.id, "process": op.process, "op": op.op,
                       "lease": op.lease, "args": op.args, "mono_ns": op.call_ns,
                       "server_lo": op.server_lo})
        if op.ret_ns is not None:
            events.append({"type": "complete", "id": op.id, "process": op.process,
                           "mono_ns": op.ret_ns, "server_hi": op.server_hi,
                           "result": op.result})
    return events
