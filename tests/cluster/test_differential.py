"""The simulator's model API server against the real kube-apiserver: same writes, same answers.

Randomized (seeded) sequences of status writes — claims, renewals, completions, releases,
and hostile ones: lowered or skipped generations, a holder change without a claim, a
changed epoch, reopened or re-claimed finished leases, an altered completion, time fields
out of range or in lowercase — go to both, each as a compare-and-swap merge patch from the
current version. Every write must be accepted by both or refused by both: the simulator's
rules (tests/sim/model.py) are the CRD's rules, or the simulator proves nothing.
"""

from __future__ import annotations

import random
from typing import Any

from joblease.kube.api import InvalidError
from joblease.kube.leases import lease_path
from joblease.sdk.client import LeaseClient
from sim.model import ModelError, ModelServer

MERGE = "application/merge-patch+json"
WRITES_PER_OBJECT = 60
OBJECTS = 5


def _time(rng: random.Random) -> str:
    year = rng.choice([2026, 2026, 2026, 1969, 9001, 2100])
    text = f"{year}-12-03T10:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.000Z"
    return text.lower() if rng.random() < 0.1 else text


def _patch(rng: random.Random, status: dict[str, Any]) -> dict[str, Any]:
    """One status change, ordinary or hostile, from the current status."""
    gen = int(status.get("generation", 0))
    kind = rng.choice(["claim", "claim", "renew", "complete", "release", "lower", "skip",
                       "holder", "epoch", "reopen", "completion", "times", "expire"])
    renew, until = _time(rng), _time(rng)
    if kind == "claim":
        return {"phase": "Held", "holder": f"w{rng.randint(0, 3)}", "generation": gen + 1,
                "epoch": status.get("epoch", 7), "renewTime": renew, "leaseUntil": renew}
    if kind == "renew":
        return {"renewTime": renew, "leaseUntil": until}
    if kind == "complete":
        return {"phase": "Completed", "completion": {
            "generation": gen, "holder": status.get("holder") or "w0",
            "time": "2026-12-03T10:00:00.000Z", "result": "ok"}}
    if kind == "release":
        return {"phase": "Available", "holder": None}
    if kind == "lower":
        return {"generation": max(0, gen - 1)}
    if kind == "skip":
        return {"generation": gen + 2, "holder": "w9"}
    if kind == "holder":
        return {"holder": f"w{rng.randint(4, 6)}"}
    if kind == "epoch":
        return {"epoch": int(status.get("epoch", 7)) + rng.choice([-1, 1])}
    if kind == "reopen":
        return {"phase": rng.choice(["Available", "Held"])}
    if kind == "completion":
        return {"completion": {"generation": gen, "holder": "forged",
                               "time": "2026-12-03T10:00:00.000Z"}}
    if kind == "times":
        return {rng.choice(["acquireTime", "renewTime", "leaseUntil", "finishTime"]): _time(rng)}
    return {"phase": "Expired"}


def test_model_and_real_api_server_accept_and_refuse_the_same_writes(
        leases: LeaseClient) -> None:
    rng = random.Random(20261203)
    model = ModelServer(namespace=leases.namespace)
    compared, refused, disagreements = 0, 0, []
    for index in range(OBJECTS):
        name = f"diff-{index}"
        leases.store.create(leases.namespace, name, {"leaseDurationSeconds": 30})
        model.create(name, {"leaseDurationSeconds": 30})
        for _ in range(WRITES_PER_OBJECT):
            real = leases.api.request("GET", lease_path(leases.namespace, name)).body
            status = real.get("status") or {}
            patch = _patch(rng, status)
            if "status" in real:  # both decide from the same state
                model.objects[name]["status"] = dict(status)
            else:
                model.objects[name].pop("status", None)
            try:
                leases.api.request("PATCH", lease_path(leases.namespace, name, "status"),
                                   {"metadata": {"resourceVersion":
                                                 real["metadata"]["resourceVersion"]},
                                    "status": patch}, content_type=MERGE)
                real_ok, real_why = True, ""
            except InvalidError as err:
                real_ok, real_why = False, err.message
            try:
                model.patch_status(name, {"status": patch})
                model_ok, model_why = True, ""
            except ModelError as err:
                model_ok, model_why = False, err.message
            compared += 1
            refused += not real_ok
            if real_ok != model_ok:
                disagreements.append((status, patch, real_why[:300], model_why))
    print(f"\ndifferential: {compared} writes compared, {refused} refused by the API server, "
          f"{len(disagreements)} disagreements")
    assert not disagreements, disagreements[:3]
    assert 0.2 < refused / compared < 0.9  # both kinds were exercised
