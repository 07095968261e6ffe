"""Bad configuration is a clear error naming the problem, never a traceback.

``kubernetes_configuration`` (the one loader of both clients) turns the Kubernetes client's
``ConfigException`` into ``ConfigError`` naming the path or what was tried; the CLI exits 6
with that message.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from joblease.kube.api import ConfigError, kubernetes_configuration


def test_a_missing_kubeconfig_is_a_config_error_naming_it(tmp_path: object) -> None:
    with pytest.raises(ConfigError) as err:
        kubernetes_configuration("/nonexistent/kubeconfig")
    assert "/nonexistent/kubeconfig" in str(err.value)


def test_a_kubeconfig_without_the_context_is_a_config_error_naming_it(tmp_path: object
                                                                     ) -> None:
    path = os.path.join(str(tmp_path), "config")
    with open(path, "w") as out:
        out.write("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    with pytest.raises(ConfigError) as err:
        kubernetes_configuration(path, "nowhere")
    assert "nowhere" in str(err.value) and path in str(err.value)


@pytest.mark.parametrize("verb", [["get", "job"], ["ls"], ["claim", "job", "--holder", "a"]])
def test_the_cli_exits_6_with_one_line_and_no_traceback(verb: list[str],
                                                        tmp_path: object) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("KUBECONFIG", None)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    done = subprocess.run([sys.executable, "-m", "joblease.cli", *verb], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 6, done.stderr
    assert done.stderr.startswith("joblease: no Kubernetes configuration")
    assert "Traceback" not in done.stderr
