"""Certificates made with the openssl CLI verify against their CA and carry the right names."""

import subprocess
from pathlib import Path

from joblease_localcluster import certs


def _text(cert: Path) -> str:
    return subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-text"],
                          capture_output=True, text=True, check=True).stdout


def test_cluster_certs_verify_and_name_localhost(tmp_path: Path) -> None:
    made = certs.make_cluster_certs(tmp_path)
    for pair in (made.apiserver, made.kubelet_client):
        subprocess.run(["openssl", "verify", "-CAfile", str(made.ca.cert), str(pair.cert)],
                       check=True, capture_output=True)
    server = _text(made.apiserver.cert)
    assert "IP Address:127.0.0.1" in server and "DNS:localhost" in server
    assert "TLS Web Server Authentication" in server
    assert "BEGIN PUBLIC KEY" in made.service_accounts.cert.read_text()
    assert oct(made.ca.key.stat().st_mode & 0o777) == "0o600"


def test_client_cert_subject_is_the_identity(tmp_path: Path) -> None:
    ca = certs.make_ca(tmp_path)
    node = certs.make_client_cert(ca, tmp_path, "kubelet", "system:node:localhost",
                                  ["system:nodes"])
    text = _text(node.cert)
    assert "O = system:nodes, CN = system:node:localhost" in text
    assert "TLS Web Client Authentication" in text
