"""Pod delegation in the simulator: pods that come and go, and oracle k.

The operator's real ``Delegator`` (``joblease.controller.pods``) runs in the simulated
operator over a ``PodView`` fed by the model's pod events (with a lag and the operator's
watch gaps), reading pods live through the real ``PodStore`` on a ``SimApi``. Here live
the pods' churn — created Ready or not, turning unready and Ready again, losing their
label, deleted gracefully (``deletionTimestamp`` first, the object gone a little later) or
at once, re-created under the same name with a new uid — and oracle k:

  k. the operator holds a lease for a pod only as the JobLease allows and only while the pod
     qualifies: every claim or renewal it writes for holder ``pod:<ns>/<name>/<uid>`` is for
     a JobLease with ``spec.podDelegation.enabled``, for a pod of the allowed
     ServiceAccount that carries the lease's label; a renewal only while that very pod
     (uid) exists, is Ready and not being deleted (the operator reads it live first), a
     claim only if it qualified within the operator's pod-watch lag. So once a pod stops
     qualifying, its lease is renewed no more: it ends within one lease duration. And a
     pod's ``joblease.dev/holder`` annotation only ever names that pod itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from joblease.kube.pods import LEASE_LABEL

if TYPE_CHECKING:
    from .sim import Simulation

OPTED_IN, NOT_OPTED_IN = "dlg-0", "dlg-1"
POD_NAMES = ("pod-a", "pod-b", "pod-c")
ACCOUNTS = ("worker", "default")


def delegated_jobs(rng: Any) -> list[tuple[str, dict[str, Any]]]:
    """One JobLease that opted in (perhaps only for one ServiceAccount), one that did not."""
    delegation: dict[str, Any] = {"enabled": True}
    if rng.random() < 0.5:
        delegation["serviceAccountName"] = "worker"
    return [(OPTED_IN, {"leaseDurationSeconds": rng.choice([2, 3, 5]),
                        "podDelegation": delegation}),
            (NOT_OPTED_IN, {"leaseDurationSeconds": 3})]


def qualifies(pod: dict[str, Any], lease: str) -> bool:
    """Ready, not being deleted, labelled for ``lease`` (the ServiceAccount is checked apart)."""
    meta = pod["metadata"]
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in pod["status"].get("conditions") or [])
    return (ready and "deletionTimestamp" not in meta
            and (meta.get("labels") or {}).get(LEASE_LABEL) == lease)


@dataclass
class PodChurn:
    """The kubelet and the users: pods of the delegated leases change at random times."""

    sim: Simulation
    last_qualified: dict[tuple[str, str], float] = field(default_factory=dict)  # (uid, lease)
    accounts: dict[str, str] = field(default_factory=dict)  # uid → serviceAccountName
    actions: int = 0

    def start(self) -> None:
        self.sim.world.after(self.sim.world.rng.uniform(0.0, 0.5), self.step, "kubelet")

    def step(self) -> None:
        sim, rng = self.sim, self.sim.world.rng
        self.note_qualified()
        name = rng.choice(POD_NAMES)
        pod = sim.server.pods.get(name)
        if pod is None:
            self.create(name)
        else:
            self.change(name, pod)
        self.actions += 1
        self.note_qualified()
        sim.world.after(rng.uniform(0.1, 2.0), self.step, "kubelet")

    def create(self, name: str) -> None:
        rng = self.sim.world.rng
        lease = rng.choice([OPTED_IN, OPTED_IN, NOT_OPTED_IN])
        account = rng.choice(ACCOUNTS)
        pod = self.sim.server.create_pod(name, {LEASE_LABEL: lease, "app": "sim"}, account,
                                         ready=rng.random() < 0.7)
        self.accounts[pod["metadata"]["uid"]] = account

    def change(self, name: str, pod: dict[str, Any]) -> None:
        sim, rng = self.sim, self.sim.world.rng
        if "deletionTimestamp" in pod["metadata"]:
            sim.server.remove_pod(name)  # its containers stopped: the object goes
            return
        action = rng.choice(["ready", "unready", "unready", "unlabel", "delete", "remove"])
        if action in ("ready", "unready"):
            sim.server.set_pod_ready(name, action == "ready")
        elif action == "unlabel":
            sim.server.patch_pod(name, {"metadata": {"labels": {LEASE_LABEL: None}}})
        elif action == "delete":
            sim.server.start_pod_deletion(name, sim.world.server_time())
        else:
            sim.server.remove_pod(name)  # a forced delete, or the node's eviction

    def note_qualified(self) -> None:
        """Record that each qualifying pod qualifies now (for claims decided from a lag)."""
        now = self.sim.world.now
        for pod in self.sim.server.pods.values():
            lease = (pod["metadata"].get("labels") or {}).get(LEASE_LABEL)
            if lease and qualifies(pod, lease):
                self.last_qualified[(pod["metadata"]["uid"], lease)] = now


def pod_of(holder: str) -> tuple[str, str] | None:
    """``(name, uid)`` of a ``pod:<namespace>/<name>/<uid>`` holder."""
    if not holder.startswith("pod:"):
        return None
    parts = holder.removeprefix("pod:").split("/")
    return (parts[1], parts[2]) if len(parts) == 3 else None


def delegation_violation(sim: Simulation, name: str, before: dict[str, Any],
                         after: dict[str, Any], allowance: float) -> str | None:
    """Oracle k for one accepted write of the operator (``None``: fine)."""
    held = pod_of(after.get("holder") or "")
    if held is None or after.get("phase") != "Held":
        return None
    claim = after.get("generation", 0) > before.get("generation", 0)
    renewal = not claim and after.get("renewTime") != before.get("renewTime")
    if not (claim or renewal):
        return None
    pod_name, uid = held
    spec = sim.server.objects[name]["spec"]
    delegation = spec.get("podDelegation") or {}
    if not delegation.get("enabled"):
        return f"{name} does not opt in, yet the operator holds it for {pod_name}"
    pod = sim.server.pods.get(pod_name)
    account = sim.pods.accounts.get(uid)
    wanted = delegation.get("serviceAccountName")
    if wanted is not None and account != wanted:
        return f"{name} allows only {wanted}, yet the operator holds it for {pod_name} ({account})"
    current = pod is not None and pod["metadata"]["uid"] == uid and qualifies(pod, name)
    if renewal and not current:
        return f"the operator renewed {name} for {pod_name} ({uid}), which does not qualify"
    if current:
        return None
    last = sim.pods.last_qualified.get((uid, name))
    if last is None or sim.world.now - last > allowance:
        return (f"the operator claimed {name} for {pod_name} ({uid}), which last qualified "
                f"{'never' if last is None else f'{sim.world.now - last:.3f}s ago'}")
    return None


def annotation_violation(pod: dict[str, Any]) -> str | None:
    """A pod's ``joblease.dev/holder`` annotation names the pod itself, or is absent."""
    meta = pod["metadata"]
    named = (meta.get("annotations") or {}).get("joblease.dev/holder")
    if named is None or pod_of(named) == (meta["name"], meta["uid"]):
        return None
    return f"pod {meta['name']} ({meta['uid']}) carries the token of {named}"
