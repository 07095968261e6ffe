"""The rules of `joblease ls` and `describe` (pure: objects and a server-time interval in)."""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from joblease.cli import build_parser
from joblease.cli import view as cli_view
from joblease.cli.completion import completion_script
from joblease.domain.clock import ServerNow
from joblease.domain.time import format_time

T0 = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)


def obj(name: str, phase: str | None, *, holder: str | None = None, acquired: int = 0,
        until: float | None = None, finished: int | None = None, attempts: int = 0,
        labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "7",
            "generation": 1, "labels": labels or {}}
    body: dict[str, Any] = {"apiVersion": "joblease.dev/v1alpha1", "kind": "JobLease",
                            "metadata": meta, "spec": {"leaseDurationSeconds": 30,
                                                       "maxAttempts": 3}}
    if phase is None:
        return body
    status: dict[str, Any] = {"phase": phase, "generation": 2 if holder else 0, "epoch": 11,
                              "attempts": attempts}
    if holder:
        status |= {"holder": holder, "claimId": "c0ffee",
                   "acquireTime": format_time(T0 + timedelta(seconds=acquired)),
                   "renewTime": format_time(T0 + timedelta(seconds=acquired))}
    if until is not None:
        status["leaseUntil"] = format_time(T0 + timedelta(seconds=until))
    if finished is not None:
        status["finishTime"] = format_time(T0 + timedelta(seconds=finished))
    body["status"] = status
    return body


def now_at(seconds: float, error: float = 0.5) -> ServerNow:
    mid = T0 + timedelta(seconds=seconds)
    return ServerNow(mid - timedelta(seconds=error), mid + timedelta(seconds=error))


def test_counts_every_phase_and_the_uninitialized() -> None:
    objects = [obj("a", "Available"), obj("b", "Held", holder="w", until=100),
               obj("c", "Held", holder="w", until=100), obj("d", "Failed", finished=5),
               obj("e", None)]
    data = cli_view.overview(objects, now_at(50))
    assert data["total"] == 5
    assert data["byPhase"] == {"Available": 1, "Held": 2, "Expired": 0, "Completed": 0,
                               "Failed": 1, "New": 1}
    assert "1 without status" in cli_view.render_overview(data)


def test_oldest_held_first_and_top_limits_the_lists_not_the_counts() -> None:
    objects = [obj(f"h{i}", "Held", holder=f"w{i}", acquired=i * 10, until=1000)
               for i in (3, 1, 2, 0)]
    data = cli_view.overview(objects, now_at(100), top=2)
    assert [r["name"] for r in data["oldestHeld"]] == ["h0", "h1"]
    assert data["byPhase"]["Held"] == 4
    assert data["oldestHeld"][0]["heldSeconds"] == pytest.approx(100)


def test_past_end_only_when_certainly_past_on_the_server_clock() -> None:
    objects = [obj("ended", "Held", holder="a", until=10),
               obj("maybe", "Held", holder="b", until=99.8),  # within the error bound
               obj("running", "Held", holder="c", until=200)]
    data = cli_view.overview(objects, now_at(100, error=0.5))
    assert [r["name"] for r in data["pastEnd"]] == ["ended"]
    assert data["pastEndCount"] == 1
    assert data["pastEnd"][0]["secondsLeft"] == pytest.approx(-90)
    # with a tight bound the borderline one is certainly past too
    tight = cli_view.overview(objects, now_at(100, error=0.01))
    assert [r["name"] for r in tight["pastEnd"]] == ["ended", "maybe"]


def test_recent_failed_newest_first() -> None:
    objects = [obj("old", "Failed", finished=1, attempts=3),
               obj("new", "Failed", finished=30, attempts=3),
               obj("done", "Completed", finished=40)]
    data = cli_view.overview(objects, now_at(100))
    assert [r["name"] for r in data["recentFailed"]] == ["new", "old"]
    text = cli_view.render_overview(data)
    assert "recent Failed:" in text and "oldest held: none" in text


def test_all_namespaces_text_names_the_namespace() -> None:
    data = cli_view.overview([obj("x", "Held", holder="w", until=500)], now_at(0),
                             namespace=None)
    assert "ns/x" in cli_view.render_overview(data)


def test_describe_shows_token_holder_claim_and_time_left() -> None:
    raw = obj("job", "Held", holder="worker-a", acquired=0, until=30, attempts=1)
    events = [{"type": "Normal", "reason": f"R{i}", "message": f"m{i}", "count": 1,
               "lastTimestamp": format_time(T0 + timedelta(seconds=i))} for i in range(15)]
    data = cli_view.describe(raw, events, now_at(20, error=0.25), last_events=10)
    assert (data["epoch"], data["generation"], data["token"]) == (11, 2, "11/2")
    assert data["holder"] == "worker-a" and data["claimId"] == "c0ffee"
    assert data["secondsLeft"] == pytest.approx(10)
    assert not data["certainlyPastEnd"]
    assert [e["reason"] for e in data["events"]] == [f"R{i}" for i in range(5, 15)]
    text = cli_view.render_describe(data)
    assert "11/2 (epoch 11, generation 2)" in text
    assert "10s (±0.25s, server clock)" in text
    assert "last 10 of 15" in text and "Attempts:       1 of 3" in text


def test_describe_says_when_the_end_has_certainly_passed() -> None:
    data = cli_view.describe(obj("job", "Held", holder="a", until=30), [], now_at(95))
    assert data["certainlyPastEnd"]
    assert "ended 1m5s ago" in cli_view.render_describe(data)
    assert "Events:         <none>" in cli_view.render_describe(data)


@pytest.mark.parametrize(("seconds", "text"), [(None, "-"), (4.25, "4.2s"), (45, "45s"),
                                               (192, "3m12s"), (7500, "2h5m"),
                                               (-90, "-1m30s"), (3 * 86400 + 7200, "3d2h")])
def test_human_seconds(seconds: float | None, text: str) -> None:
    assert cli_view.human_seconds(seconds) == text


def test_completion_offers_every_verb_and_option_of_the_parser() -> None:
    parser = build_parser()
    script = completion_script(parser, "bash")
    for verb in ("claim", "renew", "complete", "release", "get", "run", "ls", "top",
                 "describe", "completion", "operator"):
        assert verb in script
    assert "--selector" in script and "--claim-id" in script and "--wait" in script
    assert script.rstrip().endswith("complete -F _joblease joblease kubectl-joblease")
    assert "bashcompinit" in completion_script(parser, "zsh")
    with pytest.raises(ValueError):
        completion_script(parser, "fish")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completion_script_completes_verbs_and_options() -> None:
    script = completion_script(build_parser(), "bash")

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in words)
        prog = (f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}\n"
                "_joblease; printf '%s\\n' \"${COMPREPLY[@]}\"")
        out = subprocess.run(["bash", "-c", prog], capture_output=True, text=True,
                             check=True, timeout=30)
        return out.stdout.split()

    assert complete("joblease", "de") == ["describe"]
    assert set(complete("joblease", "ls", "--sel")) == {"--selector"}
    assert complete("joblease", "get", "-o", "j") == ["json"]
    assert complete("joblease", "completion", "z") == ["zsh"]
