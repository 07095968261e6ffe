"""`python -m bench --quick` still runs end to end (its own control plane; about a minute).

A smoke test, not a measurement: it proves every section, the table and the JSON still
work, so the benchmark cannot rot silently. The numbers are in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.paths import REPO


def test_bench_quick_runs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| measurement | joblease |" in proc.stdout
    assert "load average at start" in proc.stderr and "load average at end" in proc.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    for section in ("latency", "contention", "throughput", "handover", "scale", "cli"):
        assert section in results, section
    assert results["latency"]["floor"]["n"] > 0
    assert results["contention"]["errors"] == 0
    assert results["scale"]["renewals"]["writes_per_renewal"] == 0
    assert results["scale"]["expiry"]["expired"] == results["scale"]["expiry"]["leases"]
    assert results["cli"]["verbs"]["get"]["wall_s"]["n"] == 3
    assert "`joblease claim`" in proc.stdout
    assert (tmp_path / "latest.md").read_text().startswith("| measurement |")
