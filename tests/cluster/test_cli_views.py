"""`joblease ls` / `describe` and the light transport, as processes on the real API server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from joblease.domain.errors import LeaseFinishedError
from joblease.sdk.client import LeaseClient

JOBLEASE = [sys.executable, "-m", "joblease.cli"]


def cli(cluster: Any, namespace: str, *args: str, extra_env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig_for("admin"))}
    env.pop("JOBLEASE_KUBE_CLIENT", None)
    env.update(extra_env or {})
    return subprocess.run([*JOBLEASE, args[0], "-n", namespace, *args[1:]], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_ls_counts_by_phase_and_lists_what_needs_a_look(cluster: Any, leases: LeaseClient
                                                        ) -> None:
    ns, store = leases.namespace, leases.store
    team = {"team": "batch"}
    for name in ("idle", "old", "young"):
        store.create(ns, name, {"leaseDurationSeconds": 600}, labels=team)
    store.create(ns, "gone", {"leaseDurationSeconds": 1}, labels=team)
    store.create(ns, "broken", {"leaseDurationSeconds": 600, "maxAttempts": 1}, labels=team)
    store.create(ns, "elsewhere", {}, labels={"team": "web"})
    leases.claim("old", "w-old")
    time.sleep(0.05)
    leases.claim("young", "w-young")
    leases.claim("gone", "w-gone")  # 1 s lease, no operator: stays Held past its end
    with pytest.raises(LeaseFinishedError):  # maxAttempts 1: the failed release ends it
        leases.claim("broken", "w-broken").release(failed=True)
    leases.claim("idle", "w-idle").release()
    time.sleep(2.5)  # "gone" is now certainly past its end, even uncalibrated (±~0.5 s)

    result = cli(cluster, ns, "ls", "-l", "team=batch", "-o", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["total"] == 5  # the selector kept "elsewhere" out
    assert data["byPhase"]["Held"] == 3 and data["byPhase"]["Failed"] == 1
    assert data["byPhase"]["Available"] == 1
    assert [r["name"] for r in data["oldestHeld"]] == ["old", "young", "gone"]
    assert [r["name"] for r in data["pastEnd"]] == ["gone"]
    assert data["pastEnd"][0]["secondsLeft"] < -1
    assert [r["name"] for r in data["recentFailed"]] == ["broken"]

    text = cli(cluster, ns, "top", "--selector", "team=batch")
    assert text.returncode == 0, text.stderr
    assert "5 JobLeases in" in text.stdout and "Held 3" in text.stdout
    assert "past their end, not yet marked Expired (1)" in text.stdout
    assert "w-gone" in text.stdout
    everything = json.loads(cli(cluster, ns, "ls", "-o", "json").stdout)
    assert everything["total"] == 6


def test_describe_shows_the_claim_time_left_and_only_this_objects_events(
        cluster: Any, leases: LeaseClient) -> None:
    ns, store = leases.namespace, leases.store
    store.create(ns, "job", {"leaseDurationSeconds": 120, "maxAttempts": 4})
    first = store.get(ns, "job")
    store.post_event(first, "Warning", "OldIncarnation", "from the deleted object")
    store.delete_if_unchanged(first)
    store.create(ns, "job", {"leaseDurationSeconds": 120, "maxAttempts": 4})
    lease = leases.claim("job", "worker-a")
    store.post_event(store.get(ns, "job"), "Normal", "Claimed", "claimed by worker-a")

    result = cli(cluster, ns, "describe", "job", "-o", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["holder"] == "worker-a" and data["claimId"] == lease.claim_id
    assert (data["epoch"], data["generation"]) == (lease.token.epoch, lease.token.generation)
    assert data["token"] == str(lease.token)
    assert 100 < data["secondsLeft"] <= 121
    assert [e["reason"] for e in data["events"]] == ["Claimed"]  # not the old incarnation's

    text = cli(cluster, ns, "describe", "job").stdout
    assert f"{lease.token} (epoch {lease.token.epoch}, generation 1)" in text
    assert "Attempts:       0 of 4" in text
    assert "server clock" in text and "claimed by worker-a" in text
    missing = cli(cluster, ns, "describe", "nope")
    assert missing.returncode == 5 and "nope" in missing.stderr


def test_light_and_full_transports_agree_and_the_light_one_skips_kubernetes(
        cluster: Any, leases: LeaseClient) -> None:
    ns = leases.namespace
    leases.store.create(ns, "job", {})
    leases.claim("job", "w")
    light = cli(cluster, ns, "get", "job", "-o", "json")
    full = cli(cluster, ns, "get", "job", "-o", "json",
               extra_env={"JOBLEASE_KUBE_CLIENT": "kubernetes"})
    assert light.returncode == full.returncode == 0, light.stderr + full.stderr
    assert json.loads(light.stdout) == json.loads(full.stdout)
    probe = ("import sys\nfrom joblease import cli\n"
             f"code = cli.main(['get', 'job', '-n', {ns!r}])\n"
             "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
             "('kubernetes', 'urllib3', 'kopf', 'prometheus_client', 'asyncio'))\n"
             "print(code, loaded)")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig_for("admin"))}
    env.pop("JOBLEASE_KUBE_CLIENT", None)
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.strip().splitlines()[-1] == "0 []"
