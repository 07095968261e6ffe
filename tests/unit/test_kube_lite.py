"""Which kubeconfigs the CLI's light transport serves, and that it falls back for the rest."""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from joblease.kube import lite
from joblease.kube.api import KubeApi, UnavailableError


def write_config(tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None,
                 name: str = "config") -> Path:
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "clusters": [{"name": "k", "cluster": cluster or {
               "server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
           "users": [{"name": "u", "user": user}],
           "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}},
                        {"name": "other", "context": {"cluster": "k", "user": "nobody"}}]}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def test_token_kubeconfig_is_served_light(tmp_path: Path) -> None:
    config = lite.load(str(write_config(tmp_path, {"token": "s3cret"})), environ={})
    assert config.host == "https://127.0.0.1:6443" and config.token == "s3cret"
    client = lite.LiteApiClient(config)
    method, path, headers, body = client.param_serialize(
        "PATCH", "/apis/x", header_params={"Accept": "application/json"}, body={"a": 1},
        auth_settings=["BearerToken"])
    assert (method, path, json.loads(body or b"")) == ("PATCH", "/apis/x", {"a": 1})
    assert headers["Authorization"] == "Bearer s3cret"
    assert headers["Accept"] == "application/json"


def test_token_file_is_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("from-file\n")
    config = lite.load(str(write_config(tmp_path, {"tokenFile": "tok"})), environ={})
    assert config.token == "from-file"


@pytest.mark.parametrize("user", [
    {"exec": {"command": "aws", "apiVersion": "client.authentication.k8s.io/v1"}},
    {"auth-provider": {"name": "oidc"}},
    {"username": "u", "password": "p"},
    {"token": "t", "as": "someone-else"},
    {"client-certificate-data": base64.b64encode(b"cert").decode()},  # no key
])
def test_anything_but_static_credentials_needs_the_full_client(tmp_path: Path,
                                                               user: dict[str, Any]) -> None:
    with pytest.raises(lite.UnsupportedConfigError):
        lite.load(str(write_config(tmp_path, user)), environ={})


def test_proxies_several_files_and_the_switch_need_the_full_client(tmp_path: Path) -> None:
    path = str(write_config(tmp_path, {"token": "t"}))
    for env in ({"HTTPS_PROXY": "http://proxy:3128"},
                {"KUBECONFIG": f"{path}:{path}"},
                {lite.CLIENT_ENV: "kubernetes"}):
        with pytest.raises(lite.UnsupportedConfigError):
            lite.load(None if "KUBECONFIG" in env else path, environ=env)
    assert lite.load(None, environ={"KUBECONFIG": path}).token == "t"


def test_proxy_url_and_unknown_contexts_need_the_full_client(tmp_path: Path) -> None:
    cluster = {"server": "https://10.0.0.1", "proxy-url": "http://p:1"}
    with pytest.raises(lite.UnsupportedConfigError, match="proxy-url"):
        lite.load(str(write_config(tmp_path, {"token": "t"}, cluster)), environ={})
    with pytest.raises(lite.UnsupportedConfigError, match="nobody"):
        lite.load(str(write_config(tmp_path, {"token": "t"})), "other", environ={})


def test_a_missing_kubeconfig_outside_a_pod_falls_back(tmp_path: Path) -> None:
    with pytest.raises(lite.UnsupportedConfigError):
        lite.load(None, environ={"KUBECONFIG": str(tmp_path / "absent")})


def test_a_bad_ca_is_an_error_not_a_silent_insecure_connection(tmp_path: Path) -> None:
    cluster = {"server": "https://127.0.0.1:6443",
               "certificate-authority-data": base64.b64encode(b"not a pem").decode()}
    with pytest.raises(Exception):  # noqa: B017 - ssl raises ssl.SSLError; never "insecure"
        lite.load(str(write_config(tmp_path, {"token": "t"}, cluster)), environ={})


def test_an_unreadable_config_goes_to_the_kubernetes_client(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    path = write_config(tmp_path, {"tokenFile": "missing-token"})
    seen: list[str | None] = []

    def full(cls: Any, p: str | None = None, c: str | None = None) -> str:
        seen.append(p)
        return "full"

    monkeypatch.setattr(KubeApi, "from_kubeconfig", classmethod(full))
    monkeypatch.delenv(lite.CLIENT_ENV, raising=False)
    assert lite.connect(str(path)) == "full"  # type: ignore[comparison-overlap]
    assert seen == [str(path)]


def test_refused_connection_is_unavailable(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"token": "t"}, {"server": "http://127.0.0.1:9"})
    api = KubeApi(lite.LiteApiClient(lite.load(str(path), environ={})))
    with pytest.raises(UnavailableError):
        api.request("GET", "/version", timeout=2)


def test_the_light_path_never_imports_the_kubernetes_package(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"token": "t"})
    probe = ("import sys\nfrom joblease.kube import lite\n"
             f"lite.connect({str(path)!r})\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('kubernetes', 'urllib3', 'kopf', 'asyncio')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_client_certificates_inline_or_relative_files_load(tmp_path: Path) -> None:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-days", "1", "-subj", "/CN=jl",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
                   check=True, capture_output=True, timeout=60)
    cert, key = (tmp_path / "cert.pem").read_bytes(), (tmp_path / "key.pem").read_bytes()
    inline = {"client-certificate-data": base64.b64encode(cert).decode(),
              "client-key-data": base64.b64encode(key).decode()}
    files = {"client-certificate": "cert.pem", "client-key": "key.pem"}
    for user in (inline, files):
        config = lite.load(str(write_config(tmp_path, user)), environ={})
        assert config.ssl_context is not None and config.token is None
    wrong = {"client-certificate": "cert.pem", "client-key": "cert.pem"}  # not a key
    with pytest.raises(ssl.SSLError):
        lite.load(str(write_config(tmp_path, wrong)), environ={})
