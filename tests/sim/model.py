"""An in-memory model of the API server for JobLeases: the part the protocol relies on.

* ``resourceVersion`` compare-and-swap from one cluster-wide revision counter (like etcd),
  so a re-created object's versions — and so its epoch — outrank every earlier one;
* 404 for a missing object, 409 for a stale precondition, 422 for a status the CRD's CEL
  rules refuse (the same rules, written in Python: ``status_violation``; the differential
  test in test_differential.py holds them to the real kube-apiserver's answers);
* merge-patch semantics on ``status`` (``null`` deletes), and watch events.

Time is passed in: the simulator owns the one true timeline.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from joblease.domain.lease import parse_time

EPOCH_MIN = datetime(1970, 1, 1, tzinfo=UTC)
EPOCH_MAX = datetime(9000, 1, 1, tzinfo=UTC)
TIME_FIELDS = ("acquireTime", "renewTime", "leaseUntil", "finishTime", "notBefore")


class ModelError(Exception):
    """An HTTP error the model answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Event:
    """A watch event: the object after the change (or before, for DELETED)."""

    type: str
    obj: dict[str, Any]


@dataclass
class ModelServer:
    """JobLeases of one namespace, with a revision counter and an event log."""

    namespace: str = "sim"
    revision: int = 100
    uid_counter: int = 0
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)

    def create(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        if name in self.objects:
            raise ModelError(409, f'jobleases "{name}" already exists')
        self.revision += 1
        self.uid_counter += 1
        obj = {"apiVersion": "joblease.dev/v1alpha1", "kind": "JobLease",
               "metadata": {"name": name, "namespace": self.namespace,
                            "uid": f"uid-{self.uid_counter}",
                            "resourceVersion": str(self.revision), "generation": 1},
               "spec": {"leaseDurationSeconds": 30, **spec}}
        self.objects[name] = obj
        self.events.append(Event("ADDED", copy.deepcopy(obj)))
        return copy.deepcopy(obj)

    def get(self, name: str) -> dict[str, Any]:
        try:
            return copy.deepcopy(self.objects[name])
        except KeyError:
            raise ModelError(404, f'jobleases "{name}" not found') from None

    def list(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for o in self.objects.values()]

    def delete(self, name: str) -> None:
        obj = self.objects.pop(name, None)
        if obj is None:
            raise ModelError(404, f'jobleases "{name}" not found')
        self.revision += 1
        self.events.append(Event("DELETED", obj))

    def touch_metadata(self, name: str) -> None:
        """Another writer (an annotating controller) bumps the resourceVersion."""
        obj = self.objects.get(name)
        if obj is not None:
            self.revision += 1
            obj["metadata"]["resourceVersion"] = str(self.revision)
            self.events.append(Event("MODIFIED", copy.deepcopy(obj)))

    def patch_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        obj = self.objects.get(name)
        if obj is None:
            raise ModelError(404, f'jobleases "{name}" not found')
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != obj["metadata"]["resourceVersion"]:
            raise ModelError(409, "the object has been modified; please apply your changes "
                                  "to the latest version and try again")
        old = obj.get("status") or {}
        new = merge(copy.deepcopy(old), patch.get("status") or {})
        problem = status_violation(old, new, first="status" not in obj)
        if problem is not None:
            raise ModelError(422, f'JobLease.joblease.dev "{name}" is invalid: {problem}')
        self.revision += 1
        obj["status"] = new
        obj["metadata"]["resourceVersion"] = str(self.revision)
        self.events.append(Event("MODIFIED", copy.deepcopy(obj)))
        return copy.deepcopy(obj)


def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge patch."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            target[key] = merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


def status_violation(old: dict[str, Any], new: dict[str, Any], first: bool = False
                     ) -> str | None:
    """The first CRD rule ``new`` breaks given ``old`` (``None``: accepted).

    One rule per line of the CRD's ``x-kubernetes-validations`` on ``status`` and its
    time fields, in the same order, with the same meaning. A first status (``first``) has
    no old value, so the API server evaluates none of the transition rules on it — only
    the root rule that bounds what a first status may carry, and the rules on ``self``.
    """
    og, ng = old.get("generation", 0), new.get("generation", 0)
    if first:
        if ng > 1:
            return "a first status may carry at most the first claim (status.generation <= 1)"
        if ng != 0 and "epoch" not in new:
            return "a claimed lease needs status.epoch"
        return _time_violation(new)
    rules: list[tuple[bool, str]] = [
        (ng >= og, "status.generation may never decrease"),
        (ng <= og + 1, "status.generation may rise by at most one per write"),
        ("holder" not in new or new["holder"] == old.get("holder", "") or ng == og + 1,
         "a new holder requires a claim"),
        (ng == og or "holder" in new, "status.generation may only rise together with a holder"),
        (old.get("phase", "") != "Completed" or new.get("phase", "") == "Completed",
         "a Completed lease stays Completed"),
        (old.get("phase", "") != "Failed" or new.get("phase", "") == "Failed",
         "a Failed lease stays Failed"),
        ("completion" not in old or new.get("completion") == old["completion"],
         "status.completion is immutable once recorded"),
        ("epoch" not in old or new.get("epoch") == old["epoch"], "status.epoch is immutable"),
        (old.get("phase", "") not in ("Completed", "Failed") or ng == og,
         "a Completed or Failed lease is never claimed again"),
        (ng == 0 or "epoch" in new, "a claimed lease needs status.epoch"),
    ]
    for ok, message in rules:
        if not ok:
            return message
    return _time_violation(new)


def _time_violation(new: dict[str, Any]) -> str | None:
    times: dict[str, datetime] = {}
    for name in TIME_FIELDS:
        if name in new:
            text = new[name]
            if not isinstance(text, str) or "t" in text[10:11] or text.endswith("z"):
                return f"{name}: Invalid date-time formatted string"
            when = parse_time(text)
            if not EPOCH_MIN <= when < EPOCH_MAX:
                return f"{name} must lie between 1970 and 9000"
            times[name] = when
    if "leaseUntil" in times and "renewTime" in times:
        span = (times["leaseUntil"] - times["renewTime"]).total_seconds()
        if not 0 <= span <= 86400:
            return "status.leaseUntil must lie within 86400s after status.renewTime"
    return None
