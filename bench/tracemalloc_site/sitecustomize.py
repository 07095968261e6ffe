"""Loaded by ``python -m bench.opmem``'s operator (this folder on PYTHONPATH), never shipped.

With ``JOBLEASE_TRACEMALLOC_OUT`` set, starts tracemalloc with
``JOBLEASE_TRACEMALLOC_FRAMES`` frames (opmem asks for all it may need: 64) and writes, on
SIGUSR2, the live allocations as JSON rows ``[allocating file, owner file, owner line,
bytes, blocks]``. The *allocating file* is the innermost frame (what one-frame tracemalloc
reports); the *owner* is the innermost frame outside the standard library and generated code
(``<string>``, ``<frozen ...>``): the code that asked for the memory; ``<imported code>``
when the import machinery did (modules, classes and functions being loaded), not the
``import`` line that triggered it. Why both: with one frame, a dataclass instance made by
kopf is charged to ``dataclasses``/``<string>`` or to whichever helper built it, not to kopf
(issue 28: kopf's ``ResourceMemory`` was undercounted that way).
"""

import json
import os
import signal
import sysconfig
import tracemalloc

_OUT = os.environ.get("JOBLEASE_TRACEMALLOC_OUT")
_STDLIB = sysconfig.get_paths()["stdlib"]


def _generic(filename: str) -> bool:
    if filename.startswith("<"):
        return True
    return filename.startswith(_STDLIB) and "site-packages" not in filename


def _owner(traceback: tracemalloc.Traceback) -> tuple[str, int]:
    frames = list(traceback)  # oldest first: the innermost (allocating) frame is the last
    for frame in reversed(frames):
        if frame.filename.startswith("<frozen importlib"):
            return "<imported code>", 0  # not the ``import`` line that triggered it
        if not _generic(frame.filename):
            return frame.filename, frame.lineno
    return frames[-1].filename, frames[-1].lineno


def _dump(*_: object) -> None:
    grouped: dict[tuple[str, str, int], list[int]] = {}
    for stat in tracemalloc.take_snapshot().statistics("traceback"):
        owner, line = _owner(stat.traceback)
        entry = grouped.setdefault((stat.traceback[-1].filename, owner, line), [0, 0])
        entry[0] += stat.size
        entry[1] += stat.count
    rows = [[inner, owner, line, size, blocks]
            for (inner, owner, line), (size, blocks) in grouped.items()]
    tmp = f"{_OUT}.tmp"
    with open(tmp, "w") as f:
        json.dump(rows, f)
    os.replace(tmp, _OUT)


if _OUT:
    tracemalloc.start(int(os.environ.get("JOBLEASE_TRACEMALLOC_FRAMES", "1")))
    signal.signal(signal.SIGUSR2, _dump)
