"""A delayed target write is refused; a deliberately broken client is caught by both checkers."""

from __future__ import annotations

import random

from .harness import ARTIFACTS, FaultEnv, run_delayed_write, run_pause


def test_delayed_write_after_next_holder_is_refused(fault_env: FaultEnv) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    report = run_delayed_write(fault_env, random.Random(seed), seed)
    print(report.line())
    writes = [(o.process, o.status, o.result.get("reason"))
              for o in _ops(report) if o.op == "write"]
    assert ("b", "ok", None) in writes, writes
    a_writes = [w for w in writes if w[0] == "a"]
    assert a_writes and all(w[1:] == ("refused", "stale") for w in a_writes), writes
    assert report.ours == [] and report.porcupine.result == "ok", report.porcupine.output


def test_broken_client_is_caught_by_both_checkers(fault_env: FaultEnv) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    report = run_pause(fault_env, random.Random(seed), seed, broken="skip-generation-check",
                       kind="broken")
    print(report.line())
    assert report.notes["probe"]["complete"] is True  # the raw write got through the API
    assert "stale-accepted" in {v.kind for v in report.ours}, report.ours
    assert report.porcupine.violation, report.porcupine.output
    html = report.porcupine.html
    assert html is not None and html.is_file() and html.is_relative_to(ARTIFACTS / "porcupine")
    print(f"porcupine visualization: {html}")


def _ops(report):  # type: ignore[no-untyped-def]
    from .history import load
    return load(report.run_dir / "history")
