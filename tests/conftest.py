"""Test infrastructure: a real control plane per session, a fresh namespace per test.

* ``cluster`` (session): by default a :class:`joblease_localcluster.LocalCluster` started
  from the cached binaries (built when missing: a build failure is a test *error*, never
  a skip). With ``JOBLEASE_E2E_KUBECONFIG`` set, an existing cluster instead (kind, see
  ``e2e/README.md``), after checking its context against an allow-list.
* ``namespace`` (function): a fresh namespace with a random suffix, deleted afterwards.
* ``kube`` (session): a pykube-ng client for the admin. pykube-ng is deliberately the
  tests' client, independent of the ``kubernetes`` client the product uses, so a bug in
  how the product talks HTTP is not mirrored by the tests.
"""

from __future__ import annotations

import fnmatch
import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykube
import pytest
import yaml

from joblease_localcluster import build
from joblease_localcluster.cluster import ClusterHandle, LocalCluster
from joblease_localcluster.process import log_tail

E2E_ENV = "JOBLEASE_E2E_KUBECONFIG"
# Contexts the suite may create and delete namespaces, CRDs and RBAC in.
E2E_CONTEXT_ALLOW = ("kind-*", "joblease-local*")
E2E_IDENTITY_NAMESPACE = "joblease-e2e-identities"
# Every test is marked by one rule, by folder and by the servers it requests.
pytest_plugins = ["support.markers"]

_CLUSTER_KEY = pytest.StashKey["ClusterHandle"]()
_BUILD_ERROR_KEY = pytest.StashKey[Exception | None]()
_PROMTOOL_ERROR_KEY = pytest.StashKey[Exception | None]()


class ExternalCluster:
    """An existing cluster (kind) named by ``JOBLEASE_E2E_KUBECONFIG``.

    ``alice`` and ``bob`` are ServiceAccounts in ``joblease-e2e-identities`` with tokens
    from the TokenRequest API: like the local cluster's static users they belong to no
    group RBAC grants anything to.
    """

    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.logs: dict[str, Path] = {}  # the components' logs are kind's business
        self._kubectl = build.find_binary("kubectl") or Path("kubectl")
        config = yaml.safe_load(kubeconfig.read_text())
        context = str(config.get("current-context", ""))
        if not any(fnmatch.fnmatch(context, pattern) for pattern in E2E_CONTEXT_ALLOW):
            raise pytest.UsageError(
                f"{E2E_ENV}={kubeconfig} has current context {context!r}; the suite creates "
                f"and deletes namespaces, CRDs and RBAC, so it only runs against contexts "
                f"matching {', '.join(E2E_CONTEXT_ALLOW)}"
            )
        self._users: dict[str, Path] = {"admin": kubeconfig}  # before the first kubectl call
        raw = json.loads(self.kubectl("config", "view", "--raw", "--minify", "-o", "json",
                                      check=True).stdout)
        self._cluster = raw["clusters"][0]["cluster"]
        self.server = str(self._cluster["server"])

    def username(self, user: str) -> str:
        return user if user == "admin" else \
            f"system:serviceaccount:{E2E_IDENTITY_NAMESPACE}:{user}"

    def rbac_subject(self, user: str) -> dict[str, str]:
        return {"kind": "ServiceAccount", "name": user, "namespace": E2E_IDENTITY_NAMESPACE}

    def kubectl(self, *args: str, user: str = "admin", check: bool = False,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self._kubectl), "--kubeconfig",
                               str(self.kubeconfig_for(user)), *args],
                              capture_output=True, text=True, check=check, timeout=timeout)

    def kubeconfig_for(self, user: str) -> Path:
        if user in self._users:
            return self._users[user]
        self.kubectl("create", "namespace", E2E_IDENTITY_NAMESPACE)  # may already exist
        self.kubectl("-n", E2E_IDENTITY_NAMESPACE, "create", "serviceaccount", user)
        token = self.kubectl("-n", E2E_IDENTITY_NAMESPACE, "create", "token", user,
                             "--duration=2h", check=True).stdout.strip()
        config = {"apiVersion": "v1", "kind": "Config",
                  "clusters": [{"name": "e2e", "cluster": self._cluster}],
                  "users": [{"name": user, "user": {"token": token}}],
                  "contexts": [{"name": user, "context": {"cluster": "e2e", "user": user}}],
                  "current-context": user}
        path = self.workdir / f"kubeconfig-{user}"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        self._users[user] = path
        return path


# -- collection --------------------------------------------------------------------------

def pytest_collection_finish(session: pytest.Session) -> None:
    """Build missing binaries once, before any test runs (outside per-test timeouts).

    A cold build takes many minutes; inside a fixture it would hit pytest-timeout. A
    failure is kept and raised by the ``cluster`` fixture, so every cluster test errors
    with the build's message rather than being skipped.
    """
    session.config.stash[_BUILD_ERROR_KEY] = None
    session.config.stash[_PROMTOOL_ERROR_KEY] = None
    needs_promtool = any("promtool" in getattr(item, "fixturenames", ())
                         for item in session.items)
    if needs_promtool and not session.config.option.collectonly:
        try:
            build.ensure_binaries(["promtool"])
        except build.BuildError as err:
            session.config.stash[_PROMTOOL_ERROR_KEY] = err
    needs_cluster = any(item.get_closest_marker("cluster") for item in session.items)
    if not needs_cluster or os.environ.get(E2E_ENV) or session.config.option.collectonly:
        return
    try:
        build.ensure_binaries(list(build.CONTROL_PLANE))
    except build.BuildError as err:
        session.config.stash[_BUILD_ERROR_KEY] = err


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Say loudly that "no tests collected" (exit status 5) is a failure, not a pass."""
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("joblease: no tests were collected: this is a FAILURE "
                                "(exit status 5), check the paths and -m expression",
                                red=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[Any]:
    """Attach the tail of each component's log to a failing ``cluster`` test's report."""
    report: pytest.TestReport = yield
    if report.failed and item.get_closest_marker("cluster"):
        handle = item.config.stash.get(_CLUSTER_KEY, None)
        if handle is not None:
            for name, path in handle.logs.items():
                report.sections.append((f"{name} log (tail, {path})", log_tail(path)))
    return report


# -- fixtures ----------------------------------------------------------------------------

@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[ClusterHandle]:
    """The cluster every ``cluster`` test talks to, for the whole session."""
    external = os.environ.get(E2E_ENV)
    handle: ClusterHandle
    if external:
        handle = ExternalCluster(Path(external), tmp_path_factory.mktemp("e2e"))
        request.config.stash[_CLUSTER_KEY] = handle
        yield handle
        return
    error = request.config.stash.get(_BUILD_ERROR_KEY, None)
    if error is not None:
        raise error
    local = LocalCluster()
    local.start()
    request.config.stash[_CLUSTER_KEY] = local
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture(scope="session")
def promtool(request: pytest.FixtureRequest) -> Path:
    """promtool (``joblease build promtool``), built before the first test if missing.

    A failed build is raised, so every test that needs promtool errors, never skips.
    """
    error = request.config.stash.get(_PROMTOOL_ERROR_KEY, None)
    if error is not None:
        raise error
    return build.ensure_binaries(["promtool"])["promtool"]


@pytest.fixture(scope="session")
def cluster_binaries(request: pytest.FixtureRequest) -> None:
    """For tests that start their own control plane: its binaries, built before the session.

    Requesting it marks the test ``cluster`` (``tests/support/markers.py``), so the build
    runs once in ``pytest_collection_finish``; a failed build is this test's error.
    """
    error = request.config.stash.get(_BUILD_ERROR_KEY, None)
    if error is not None:
        raise error


@pytest.fixture(scope="session")
def kube(cluster: ClusterHandle) -> pykube.HTTPClient:
    """A pykube-ng client authenticated as the cluster admin."""
    return pykube.HTTPClient(pykube.KubeConfig.from_file(str(cluster.kubeconfig)))


@pytest.fixture
def namespace(kube: pykube.HTTPClient) -> Iterator[str]:
    """A fresh namespace for one test; deleted afterwards without waiting for finalizers."""
    name = f"t-{secrets.token_hex(4)}"
    pykube.Namespace(kube, {"metadata": {"name": name,
                                         "labels": {"joblease.dev/test": "true"}}}).create()
    yield name
    kube.delete(url=f"namespaces/{name}")
