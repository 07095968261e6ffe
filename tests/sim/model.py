"""An in-memory model of the API server for JobLeases and pods: the part joblease relies on.

* ``resourceVersion`` compare-and-swap from one cluster-wide revision counter (like etcd),
  so a re-created object's versions — and so its epoch — outrank every earlier one;
* 404 for a missing object, 409 for a stale resourceVersion precondition, 422 for a status
  the CRD's CEL rules refuse (the same rules, written in Python: ``status_violation``) and
  for a pod patch naming another uid (uid is immutable);
* 403 for a write the chart's ValidatingAdmissionPolicies refuse, when ``admission`` is
  on: the holder-only policy on JobLease status (``holder_only_violation``) and the
  operator-pods policy on pod updates (``operator_pod_violation``). The API server checks
  the CRD's rules before admission, so a write both refuse gets 422 here too;
* merge-patch semantics on ``status`` and on pod metadata (``null`` deletes), labels,
  ``creationTimestamp``, and watch events for JobLeases and pods (``events``,
  ``pod_events``).

The differential test (tests/cluster/test_differential.py) holds every rule here to the
real kube-apiserver's answers on random write sequences, with and without the policies.
Time is passed in: the simulator owns the one true timeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from joblease.domain.errors import format_time
from joblease.domain.lease import parse_time

EPOCH_MIN = datetime(1970, 1, 1, tzinfo=UTC)
EPOCH_MAX = datetime(9000, 1, 1, tzinfo=UTC)
TIME_FIELDS = ("acquireTime", "renewTime", "leaseUntil", "finishTime", "notBefore")
_T = TypeVar("_T")
OPERATOR = "operator"  # the operator's username: exempt from the holder-only policy
TOKEN_PREFIX = "joblease.dev/"


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
    """JobLeases and pods of one namespace, with a revision counter and event logs.

    Attributes:
        admission: Whether the chart's admission policies are installed; their rules apply
            to every write that names its ``user``.
        operator: The operator's username: exempt from the holder-only policy, bound by the
            operator-pods policy.
        clock: The server's time now, for ``creationTimestamp`` (``None``: not stamped).
    """

    namespace: str = "sim"
    revision: int = 100
    uid_counter: int = 0
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    pod_events: list[Event] = field(default_factory=list)
    admission: bool = False
    operator: str = OPERATOR
    clock: Callable[[], datetime] | None = None

    def _metadata(self, name: str, labels: dict[str, str] | None) -> dict[str, Any]:
        self.revision += 1
        self.uid_counter += 1
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace,
                                "uid": f"uid-{self.uid_counter}",
                                "resourceVersion": str(self.revision), "labels": labels or {}}
        if self.clock is not None:
            meta["creationTimestamp"] = format_time(self.clock())[:19] + "Z"  # whole seconds
        return meta

    def create(self, name: str, spec: dict[str, Any],
               labels: dict[str, str] | None = None) -> dict[str, Any]:
        if name in self.objects:
            raise ModelError(409, f'jobleases "{name}" already exists')
        obj = {"apiVersion": "joblease.dev/v1alpha1", "kind": "JobLease",
               "metadata": {**self._metadata(name, labels), "generation": 1},
               "spec": {"leaseDurationSeconds": 30, **spec},
               # The CRD's default (issue 28): every read shows it, nobody wrote it.
               "status": clone(DEFAULT_STATUS)}
        self.objects[name] = obj
        self.events.append(Event("ADDED", clone(obj)))
        return clone(obj)

    def get(self, name: str) -> dict[str, Any]:
        try:
            return clone(self.objects[name])
        except KeyError:
            raise ModelError(404, f'jobleases "{name}" not found') from None

    def list(self) -> list[dict[str, Any]]:
        return [clone(o) for o in self.objects.values()]

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
            self.events.append(Event("MODIFIED", clone(obj)))

    def patch_status(self, name: str, patch: dict[str, Any], user: str | None = None
                     ) -> dict[str, Any]:
        """A merge patch of ``status`` by ``user`` (``None``: no admission policy applies)."""
        obj = self.objects.get(name)
        if obj is None:
            raise ModelError(404, f'jobleases "{name}" not found')
        _check_version(obj, patch)
        old = obj.get("status") or {}
        new = merge(clone(old), patch.get("status") or {})
        problem = status_violation(old, new, first="status" not in obj)
        if problem is not None:
            raise ModelError(422, f'JobLease.joblease.dev "{name}" is invalid: {problem}')
        if self.admission and user is not None and user != self.operator:
            problem = holder_only_violation(user, obj, new)
            if problem is not None:
                raise ModelError(403, f"jobleases.joblease.dev \"{name}\" is forbidden: "
                                      f"ValidatingAdmissionPolicy holder-only: {problem}")
        if self.admission and user == self.operator:
            problem = dispatch_violation(user, obj, new)
            if problem is not None:
                raise ModelError(403, f"jobleases.joblease.dev \"{name}\" is forbidden: "
                                      f"ValidatingAdmissionPolicy dispatch: {problem}")
        self.revision += 1
        obj["status"] = new
        obj["metadata"]["resourceVersion"] = str(self.revision)
        self.events.append(Event("MODIFIED", clone(obj)))
        return clone(obj)

    # -- pods ---------------------------------------------------------------------------------
    def create_pod(self, name: str, labels: dict[str, str], service_account: str = "default",
                   ready: bool = False) -> dict[str, Any]:
        """A pod as the kubelet reports it: Running, Ready or not."""
        if name in self.pods:
            raise ModelError(409, f'pods "{name}" already exists')
        obj = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {**self._metadata(name, labels), "annotations": {}},
               "spec": {"serviceAccountName": service_account,
                        "containers": [{"name": "main", "image": "busybox"}]},
               "status": {"phase": "Running", "conditions": [
                   {"type": "Ready", "status": "True" if ready else "False"}]}}
        self.pods[name] = obj
        self.pod_events.append(Event("ADDED", clone(obj)))
        return clone(obj)

    def get_pod(self, name: str) -> dict[str, Any]:
        try:
            return clone(self.pods[name])
        except KeyError:
            raise ModelError(404, f'pods "{name}" not found') from None

    def patch_pod(self, name: str, patch: dict[str, Any], user: str | None = None
                  ) -> dict[str, Any]:
        """A merge patch of a pod's metadata (labels, annotations) or spec by ``user``.

        A ``metadata.uid`` in the patch that is not the pod's is refused as invalid (422:
        uid is immutable), so a patch meant for a predecessor never lands on its namesake.
        The API server validates before admission, so that comes before the policies.
        """
        obj = self.pods.get(name)
        if obj is None:
            raise ModelError(404, f'pods "{name}" not found')
        _check_version(obj, patch)
        uid = (patch.get("metadata") or {}).get("uid")
        if uid is not None and uid != obj["metadata"]["uid"]:
            raise ModelError(422, f'Pod "{name}" is invalid: metadata.uid: Invalid value: '
                                  f'"{uid}": field is immutable')
        new = merge(clone(obj), patch)
        if self.admission and user == self.operator:
            problem = operator_pod_violation(obj, new)
            if problem is not None:
                raise ModelError(403, f'pods "{name}" is forbidden: ValidatingAdmissionPolicy '
                                      f"operator-pods: {problem}")
        return self._store_pod(name, new)

    def set_pod_ready(self, name: str, ready: bool) -> None:
        """The kubelet reports readiness (pods/status: no admission policy matches it)."""
        obj = self.pods.get(name)
        if obj is not None:
            obj["status"]["conditions"] = [{"type": "Ready",
                                            "status": "True" if ready else "False"}]
            self._store_pod(name, obj)

    def start_pod_deletion(self, name: str, when: datetime) -> None:
        """A graceful delete: ``deletionTimestamp`` is set; the object stays for now."""
        obj = self.pods.get(name)
        if obj is not None and "deletionTimestamp" not in obj["metadata"]:
            obj["metadata"]["deletionTimestamp"] = format_time(when)
            self._store_pod(name, obj)

    def remove_pod(self, name: str) -> None:
        """The pod object is gone (its containers stopped, or a forced delete)."""
        obj = self.pods.pop(name, None)
        if obj is not None:
            self.revision += 1
            self.pod_events.append(Event("DELETED", obj))

    def _store_pod(self, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        self.pods[name] = obj
        self.pod_events.append(Event("MODIFIED", clone(obj)))
        return clone(obj)


def _check_version(obj: dict[str, Any], patch: dict[str, Any]) -> None:
    wanted = (patch.get("metadata") or {}).get("resourceVersion")
    if wanted is not None and wanted != obj["metadata"]["resourceVersion"]:
        raise ModelError(409, "the object has been modified; please apply your changes "
                              "to the latest version and try again")


def clone(value: _T) -> _T:
    """A deep copy of JSON-shaped data (dicts, lists, scalars): ``copy.deepcopy``'s result,
    several times faster (the simulator copies every object it serves)."""
    if type(value) is dict:
        return cast(_T, {key: clone(item) for key, item in value.items()})
    if type(value) is list:
        return cast(_T, [clone(item) for item in value])
    return value


def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge patch."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            target[key] = merge(target[key], value)
        else:
            target[key] = clone(value)
    return target


DEFAULT_STATUS: dict[str, Any] = {"phase": "Available", "generation": 0, "attempts": 0}
"""The CRD's ``status.default``: what a JobLease nobody has written reads as."""


def status_violation(old: dict[str, Any], new: dict[str, Any], first: bool = False
                     ) -> str | None:
    """The first CRD rule ``new`` breaks given ``old`` (``None``: accepted).

    One rule per line of the CRD's ``x-kubernetes-validations`` on ``status`` and its
    time fields, in the same order, with the same meaning. A first status (``first``) has
    no old value, so the API server evaluates none of the transition rules on it — only
    the root rule that bounds what a first status may carry, and the rules on ``self``.
    Under the CRD's status default (issue 28) that never happens: every stored object reads
    with a status (``DEFAULT_STATUS``), and a first write meets the transition rules.
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


# -- the chart's admission policies (charts/joblease-operator/templates/admission.yaml) ------

def holder_only_violation(user: str, old_obj: dict[str, Any], new: dict[str, Any]
                          ) -> str | None:
    """The first validation of the holder-only policy that a status write by ``user`` breaks.

    ``old_obj`` is the stored object (its status and resourceVersion), ``new`` the status
    after the merge. One rule per ``validations`` entry, in order, with the policy's
    ``variables``; the operator and exempt identities never reach here (its
    ``matchConditions``).
    """
    old = old_obj.get("status") or {}
    og, ng = old.get("generation", 0), new.get("generation", 0)
    old_holder, new_holder = old.get("holder", ""), new.get("holder", "")
    old_phase = old.get("phase", "Available")
    epoch_is_new = "epoch" in new and "epoch" not in old
    rules: list[tuple[bool, str]] = [
        (ng != og or (old_phase == "Held" and old_holder == user),
         "only the holder may renew, complete or release"),
        (ng in (og, og + 1), "a claim must raise status.generation by exactly one"),
        (ng == og or new_holder == user, "a claim must record the claimer as holder"),
        (not epoch_is_new
         or str(new["epoch"]) == old_obj["metadata"]["resourceVersion"],
         "status.epoch must be the resourceVersion the first claim read"),
        *_dispatch_claim_id_rules(old, new, og, ng),
    ]
    return next((message for ok, message in rules if not ok), None)


def _dispatch_claim_id_rules(old: dict[str, Any], new: dict[str, Any], og: int, ng: int
                             ) -> list[tuple[bool, str]]:
    """Issue 30's three holder-only rules on the claim id (a ``dispatch-`` claim is the
    dispatcher's; an adopted one stays adopted), in the policy's order."""
    old_id, new_id = old.get("claimId", ""), new.get("claimId", "")
    adopted_kept = (
        ng != og or not old_id.startswith("dispatch-")
        or "acquireTime" not in old or "renewTime" not in old
        or _same_instant(old["renewTime"], old["acquireTime"])
        or ("acquireTime" in new and "renewTime" in new
            and _same_instant(new["acquireTime"], old["acquireTime"])
            and not _same_instant(new["renewTime"], new["acquireTime"])))
    return [
        (ng == og or not new_id.startswith("dispatch-"),
         "a claim may not carry a dispatch- claim id: only the pool dispatcher writes those"),
        (ng != og or new_id == old_id, "status.claimId changes only with a claim"),
        (adopted_kept, "an adopted claim's renewTime and acquireTime may not be made equal "
                       "again"),
    ]


def _same_instant(a: Any, b: Any) -> bool:
    """CEL reads ``format: date-time`` fields as timestamps: equal instants are equal."""
    try:
        return parse_time(str(a)) == parse_time(str(b))
    except ValueError:
        return bool(a == b)


def dispatch_violation(user: str, obj: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Whether the dispatch policy refuses the operator's status write (issue 30).

    The operator may claim a JobLease for itself, for a pod (``pod:…``, delegation), or
    for a ServiceAccount the lease's ``spec.dispatch`` opts in and names; no one else.
    """
    old = obj.get("status") or {}
    if new.get("generation", 0) == old.get("generation", 0):
        return None
    holder = new.get("holder", "")
    dispatch = (obj.get("spec") or {}).get("dispatch") or {}
    namespace = obj["metadata"].get("namespace", "")
    named = {f"system:serviceaccount:{namespace}:{n}"
             for n in dispatch.get("serviceAccountNames") or []}
    if holder == user or holder.startswith("pod:") or (
            dispatch.get("enabled") and holder in named):
        return None
    return (f"the dispatcher may claim JobLease {obj['metadata'].get('name')} for {holder} "
            "only if its spec.dispatch is enabled and names that ServiceAccount")


def operator_pod_violation(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Whether the operator-pods policy refuses the operator's update of a pod.

    The operator may change only annotations under ``joblease.dev/``: the spec and the
    labels stay, and every other annotation keeps its value (none added or removed).
    """
    before = old["metadata"].get("annotations") or {}
    after = new["metadata"].get("annotations") or {}
    ok = (new.get("spec") == old.get("spec")
          and (new["metadata"].get("labels") or {}) == (old["metadata"].get("labels") or {})
          and all(k.startswith(TOKEN_PREFIX) or (k in after and after[k] == before[k])
                  for k in before)
          and all(k.startswith(TOKEN_PREFIX) or k in before for k in after))
    return None if ok else "the joblease operator may change only joblease.dev/ annotations"
