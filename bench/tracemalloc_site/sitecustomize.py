"""Loaded by ``python -m bench.opmem``'s operator (this folder on PYTHONPATH), never shipped.

With ``JOBLEASE_TRACEMALLOC_OUT`` set, starts tracemalloc and writes, on SIGUSR2, the live
allocations grouped by source file (JSON: ``[[file, bytes, blocks], ...]``), so that the
operator's memory can be attributed to modules while it holds N JobLeases.
"""

import json
import os
import signal
import tracemalloc

_OUT = os.environ.get("JOBLEASE_TRACEMALLOC_OUT")

if _OUT:
    tracemalloc.start(int(os.environ.get("JOBLEASE_TRACEMALLOC_FRAMES", "1")))

    def _dump(*_: object) -> None:
        stats = tracemalloc.take_snapshot().statistics("filename")
        rows = [[s.traceback[0].filename, s.size, s.count] for s in stats]
        tmp = f"{_OUT}.tmp"
        with open(tmp, "w") as f:
            json.dump(rows, f)
        os.replace(tmp, _OUT)

    signal.signal(signal.SIGUSR2, _dump)
