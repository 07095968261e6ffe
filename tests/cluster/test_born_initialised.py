"""Issue 28 on the real kube-apiserver: a JobLease is born initialised by the CRD's default.

Nobody writes a new JobLease's status any more: the CRD's ``status.default`` (Available,
generation 0, attempts 0) is applied whenever the object is read from etcd. These tests
show that GET, LIST, WATCH, the ``status.phase`` field selector and the printer columns
all see it on a never-written object; that every CEL transition rule judges a first write
against it (``oldSelf`` is defaulted too); that an object stored before the default
existed reads the same once the CRD is upgraded; and that a JobLease whose status today's
operator wrote (with an epoch and conditions) keeps working.
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from joblease.domain.lease import Phase
from joblease.kube.api import ApiError, InvalidError, KubeApi, UnavailableError
from joblease.kube.leases import lease_path
from joblease.sdk.client import LeaseClient
from support.paths import CRD
from support.waiting import wait_for

MERGE = "application/merge-patch+json"
DEFAULT = {"phase": "Available", "generation": 0, "attempts": 0}


def _raw(client: LeaseClient, name: str) -> dict[str, Any]:
    body: dict[str, Any] = client.api.request("GET", lease_path(client.namespace, name)).body
    return body


def _write(client: LeaseClient, name: str, status: dict[str, Any]) -> dict[str, Any]:
    """One status merge patch from the current version (a compare-and-swap), as admin."""
    current = _raw(client, name)
    body: dict[str, Any] = client.api.request(
        "PATCH", lease_path(client.namespace, name, "status"),
        {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
         "status": status}, content_type=MERGE).body
    return body


def test_a_new_joblease_reads_as_available_from_get_list_and_watch(leases: LeaseClient
                                                                   ) -> None:
    ns = leases.namespace
    created = leases.store.create(ns, "job", {})
    assert created.has_status and created.status.phase is Phase.AVAILABLE
    raw = _raw(leases, "job")
    assert raw["status"] == DEFAULT and "managedFields" in raw["metadata"]
    assert not any(m.get("subresource") == "status" for m in raw["metadata"]["managedFields"])
    listed = leases.api.request("GET", lease_path(ns)).body["items"]
    assert [item["status"] for item in listed] == [DEFAULT]
    stream = leases.api.watch(lease_path(ns), {"resourceVersion": "0",
                                               "timeoutSeconds": "2"}, timeout=5)
    seen = []
    for event in stream:
        seen.append((event["type"], event["object"]["status"]))
        break
    stream.close()
    assert seen == [("ADDED", DEFAULT)]


def test_the_field_selector_and_printer_columns_see_the_default(
        leases: LeaseClient, cluster: Any) -> None:
    ns = leases.namespace
    leases.store.create(ns, "new", {})
    leases.store.create(ns, "taken", {})
    leases.claim("taken", holder="alice")
    available = leases.api.request("GET", lease_path(ns),
                                   query={"fieldSelector": "status.phase=Available"}).body
    assert [i["metadata"]["name"] for i in available["items"]] == ["new"]
    out = cluster.kubectl("get", "jl", "new", "-n", ns, "-o", "wide", check=True)
    header, row = out.stdout.splitlines()
    columns = {name: row[header.index(name):].split(" ", 1)[0]
               for name in ("GENERATION", "PHASE", "ATTEMPTS")}
    assert columns == {"GENERATION": "0", "PHASE": "Available", "ATTEMPTS": "0"}, out.stdout
    for name, end in (("HOLDER", "EPOCH"), ("EPOCH", "GENERATION")):
        cell = row[header.index(name):header.index(end)].strip()
        assert cell in ("", "<none>"), out.stdout  # no holder, no epoch yet: empty cells
    token = leases.get("taken").status.token()
    out = cluster.kubectl("get", "jl", "taken", "-n", ns, check=True)
    header, row = out.stdout.splitlines()
    shown = "/".join(row[header.index(name):].split(" ", 1)[0] for name in ("EPOCH", "GENERATION"))
    assert shown == str(token), out.stdout  # the two columns read as EPOCH/GENERATION


@pytest.mark.parametrize("status, refusal", [
    ({"phase": "Held", "holder": "x", "generation": 2, "epoch": 1},
     "may rise by at most one per write"),
    ({"generation": 1, "epoch": 1}, "may only rise together with a holder"),
    ({"holder": "x"}, "a new holder requires a claim"),
    ({"phase": "Held", "holder": "x", "generation": 1}, "a claimed lease needs status.epoch"),
    ({"generation": -1}, "should be greater than or equal to 0"),
    ({"phase": "Held", "holder": "x", "generation": 1, "epoch": 1,
      "renewTime": "2026-12-03T10:00:00Z", "leaseUntil": "2026-12-05T10:00:00Z"},
     "status.leaseUntil must lie within 86400s"),
])
def test_a_first_write_meets_every_transition_rule_against_the_default(
        leases: LeaseClient, status: dict[str, Any], refusal: str) -> None:
    """The first-status root rule no longer bites (oldSelf.status exists): these do."""
    leases.store.create(leases.namespace, "job", {})
    with pytest.raises(InvalidError) as refused:
        _write(leases, "job", status)
    assert refusal in refused.value.message
    assert _raw(leases, "job")["status"] == DEFAULT


def test_claim_renew_release_expire_complete_and_lowering_from_a_default(
        leases: LeaseClient, make_client: Callable[..., LeaseClient]) -> None:
    """The SDK's whole cycle on never-written leases, and what the rules still refuse."""
    ns = leases.namespace
    for name in ("a", "b", "c"):
        leases.store.create(ns, name, {"leaseDurationSeconds": 1})
    rv = int(leases.get("a").resource_version)
    lease = leases.claim("a", holder="alice")
    assert (lease.token.epoch, lease.generation) == (rv, 1)  # the first claim's epoch
    lease.renew()
    lease.release()
    again = leases.claim("a", holder="bob")
    assert again.generation == 2 and again.token.epoch == rv
    with pytest.raises(InvalidError, match="may never decrease"):
        _write(leases, "a", {"generation": 1})
    with pytest.raises(InvalidError, match="epoch is immutable"):
        _write(leases, "a", {"epoch": rv + 1})
    again.complete("done")
    with pytest.raises(InvalidError, match="stays Completed"):
        _write(leases, "a", {"phase": "Available"})
    # expire: what the operator writes for a lease that ran out (here by hand, as admin)
    held = leases.claim("b", holder="carol")
    expired = _write(leases, "b", {"phase": "Expired", "attempts": 1})
    assert expired["status"]["generation"] == held.generation == 1
    assert leases.claim("c", holder="dave").generation == 1
    # a foreign holder: the CRD cannot see who writes (the admission policy can,
    # tests/cluster/test_admission.py); a claim naming anyone is accepted here
    taken = _write(leases, "b", {"phase": "Held", "holder": "mallory", "generation": 2,
                                 "epoch": held.token.epoch})
    assert taken["status"]["holder"] == "mallory"


# -- an upgrade: objects stored before the default existed, and statuses written then ------

CRDS_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def _put_crd(api: KubeApi, crd: dict[str, Any]) -> None:
    name = crd["metadata"]["name"]
    try:
        current = api.request("GET", f"{CRDS_PATH}/{name}").body
    except ApiError:
        api.request("POST", CRDS_PATH, crd)
        return
    version = current["metadata"]["resourceVersion"]
    api.request("PUT", f"{CRDS_PATH}/{name}",
                {**crd, "metadata": {**crd["metadata"], "resourceVersion": version}})


@pytest.fixture
def copied_crd(cluster: Any, jl_crd: str) -> Iterator[tuple[KubeApi, str, dict[str, Any]]]:
    """A copy of the JobLease CRD in a group of its own, installed *without* the default.

    The session's CRD cannot be swapped back and forth under other tests; a copy under
    another group behaves the same and is deleted afterwards. Yields the admin API, the
    group and the canonical CRD renamed to it (to upgrade to).
    """
    group = f"u{secrets.token_hex(3)}.joblease.dev"
    crd = yaml.safe_load(CRD.read_text())
    crd["metadata"]["name"] = f"jobleases.{group}"
    crd["spec"]["group"] = group
    old = copy.deepcopy(crd)
    schema = old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    del schema["properties"]["status"]["default"]
    api = KubeApi.from_kubeconfig(str(cluster.kubeconfig_for("admin")))
    _put_crd(api, old)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    f"crd/jobleases.{group}", check=True)
    try:
        yield api, group, crd
    finally:
        api.request("DELETE", f"{CRDS_PATH}/jobleases.{group}")
        api.close()


def test_an_object_stored_before_the_default_reads_defaulted_after_the_upgrade(
        copied_crd: tuple[KubeApi, str, dict[str, Any]], namespace: str) -> None:
    api, group, upgraded = copied_crd
    path = f"/apis/{group}/v1alpha1/namespaces/{namespace}/jobleases"

    def create(name: str) -> None:
        wait_for(lambda: _created(api, path, name), 30, "the copied CRD to serve", poll=0.5)

    create("old")
    assert "status" not in api.request("GET", f"{path}/old").body  # the old CRD: no status
    _put_crd(api, upgraded)
    wait_for(lambda: api.request("GET", f"{path}/old").body.get("status") == DEFAULT, 30,
             "the upgraded CRD's default to be served", poll=0.5)
    # a LIST is served by the watch cache, which re-initialises after the CRD's update and
    # answers 429 meanwhile (CI met it once, right after the GET above saw the default)
    listed = wait_for(lambda: _unless_reinitialising(
        lambda: api.request("GET", path, query={"fieldSelector": "status.phase=Available"})),
        30, "the upgraded CRD's watch cache to serve a list", poll=0.5)
    assert [i["metadata"]["name"] for i in listed.body["items"]] == ["old"]
    stored = api.request("GET", f"{path}/old").body
    rv = stored["metadata"]["resourceVersion"]

    def write(status: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = api.request("PATCH", f"{path}/old/status",
                                           {"metadata": {"resourceVersion": rv},
                                            "status": status}, content_type=MERGE).body
        return body

    with pytest.raises(InvalidError, match="may rise by at most one per write"):
        write({"phase": "Held", "holder": "x", "generation": 5, "epoch": int(rv)})
    claimed = write({"phase": "Held", "holder": "x", "generation": 1, "epoch": int(rv)})
    assert claimed["status"] == {**DEFAULT, "phase": "Held", "holder": "x", "generation": 1,
                                 "epoch": int(rv)}


def _unless_reinitialising(read: Callable[[], Any]) -> Any:
    """``read()``, or ``None`` while the API server answers 429 for a re-initialising store."""
    try:
        return read()
    except UnavailableError as err:
        if err.status == 429:
            return None
        raise


def _created(api: KubeApi, path: str, name: str) -> bool:
    try:
        api.request("POST", path, {"apiVersion": f"{path.split('/')[2]}/v1alpha1",
                                   "kind": "JobLease", "metadata": {"name": name},
                                   "spec": {}})
    except ApiError as err:
        return err.status == 409  # created by an earlier try; anything else: not served yet
    return True


def _initialised_by_an_operator_before_28(leases: LeaseClient, name: str) -> int:
    """Write the status today's operator wrote for a new JobLease: its epoch, conditions."""
    rv = leases.get(name).resource_version
    condition = {"status": "False", "reason": "Created", "message": "created; available to claim",
                 "lastTransitionTime": "2026-12-01T10:00:00.000000Z", "observedGeneration": 1}
    _write(leases, name, {"phase": "Available", "generation": 0, "attempts": 0,
                          "epoch": int(rv), "conditions": [{"type": "Held", **condition},
                                                           {"type": "Finished", **condition}]})
    return int(rv)


def test_leases_initialised_by_the_old_operator_keep_working_with_the_new_one(
        leases: LeaseClient, start_operator: Callable[..., Any]) -> None:
    ns = leases.namespace
    leases.store.create(ns, "used", {"leaseDurationSeconds": 1})
    leases.store.create(ns, "idle", {})
    epoch = _initialised_by_an_operator_before_28(leases, "used")
    _initialised_by_an_operator_before_28(leases, "idle")
    idle_version = leases.get("idle").resource_version
    start_operator(namespaces=[ns])
    lease = leases.claim("used", holder="alice")
    assert (lease.token.epoch, lease.generation) == (epoch, 1)  # the epoch written then
    lease.renew()
    wait_for(lambda: leases.get("used").status.phase is Phase.EXPIRED, 30,
             "the new operator to expire the upgraded lease", poll=0.2)
    status = leases.get("used").status
    assert (status.epoch, status.generation, status.attempts) == (epoch, 1, 1)
    held = {c["type"]: c for c in status.conditions}["Held"]
    assert (held["status"], held["reason"]) == ("False", "Expired")
    assert leases.get("idle").resource_version == idle_version  # nothing written for it


def test_the_new_operator_writes_nothing_for_new_jobleases(
        leases: LeaseClient, start_operator: Callable[..., Any]) -> None:
    """0 writes per creation: the operator sees the leases (it expires one) and leaves the
    others exactly as created."""
    ns = leases.namespace
    start_operator(namespaces=[ns])
    for i in range(20):
        leases.store.create(ns, f"new-{i}", {})
    versions = _versions(leases)
    leases.store.create(ns, "short", {"leaseDurationSeconds": 1})
    leases.claim("short", holder="alice")
    wait_for(lambda: leases.get("short").status.phase is Phase.EXPIRED, 30,
             "the operator to expire a lease (it is watching)", poll=0.2)
    after = _versions(leases)
    del after["short"]
    assert after == versions


def _versions(leases: LeaseClient) -> dict[str, str]:
    items = leases.api.request("GET", lease_path(leases.namespace)).body["items"]
    return {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in items}
