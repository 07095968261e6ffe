"""Certificates and keys for a throwaway control plane, made with the ``openssl`` CLI.

Why the CLI and not a Python library: the project adds no dependency for test
infrastructure, and ``openssl`` is on every Debian/Ubuntu runner (``.ci/run`` installs it
when missing). Every key is ECDSA P-256: generating one takes milliseconds, where RSA
keys would add seconds to each cluster start-up.

Everything here is for a cluster that lives for one test session on 127.0.0.1: the CA
key sits unencrypted next to the certificates it signs, and certificates last one year.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

VALID_DAYS = 365


class CertError(RuntimeError):
    """``openssl`` is missing or refused a command; the message carries its output."""


@dataclass(frozen=True)
class KeyPair:
    """A certificate (or public key) and its private key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class ClusterCerts:
    """The material one control plane needs.

    Attributes:
        ca: the cluster CA; it signs the serving and client certificates and is the
            ``--client-ca-file`` of kube-apiserver, so a client certificate it signs is an
            identity (``CN`` = user, each ``O`` = group).
        apiserver: kube-apiserver's serving certificate (SAN IP:127.0.0.1, DNS:localhost).
        service_accounts: the service-account token signing key; ``cert`` is the *public*
            key (kube-apiserver's ``--service-account-key-file``), ``key`` the private one.
        kubelet_client: the certificate kube-apiserver presents to kubelets
            (``system:masters``), used once a real node joins.

    """

    ca: KeyPair
    apiserver: KeyPair
    service_accounts: KeyPair
    kubelet_client: KeyPair


def _openssl(args: Sequence[str], cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise CertError(
            "the `openssl` command is not installed; it makes the local cluster's "
            "certificates (Debian/Ubuntu: apt-get install openssl)"
        )
    result = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise CertError(f"openssl {' '.join(args)} failed:\n{result.stderr[-2000:]}")


def _new_key(path: Path) -> None:
    _openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
              "-out", str(path)], path.parent)
    path.chmod(0o600)


def _subject(cn: str, orgs: Sequence[str] = ()) -> str:
    for part in (cn, *orgs):
        if "/" in part or "=" in part:
            raise CertError(f"subject part {part!r} may not contain '/' or '='")
    return "".join(f"/O={org}" for org in orgs) + f"/CN={cn}"


def make_ca(directory: Path, common_name: str = "joblease-local-ca") -> KeyPair:
    """Create a self-signed CA in ``directory`` (``ca.crt``, ``ca.key``)."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = KeyPair(directory / "ca.crt", directory / "ca.key")
    _new_key(pair.key)
    _openssl(["req", "-x509", "-new", "-key", str(pair.key), "-out", str(pair.cert),
              "-days", str(VALID_DAYS), "-subj", _subject(common_name),
              "-addext", "basicConstraints=critical,CA:TRUE",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"], directory)
    return pair


def _sign(ca: KeyPair, name: str, subject: str, extensions: list[str], directory: Path
          ) -> KeyPair:
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    _new_key(pair.key)
    csr = directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    ext.write_text("[v3]\n" + "\n".join(extensions) + "\n")
    _openssl(["req", "-new", "-key", str(pair.key), "-out", str(csr), "-subj", subject],
             directory)
    _openssl(["x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
              "-set_serial", str(secrets.randbits(63)), "-days", str(VALID_DAYS),
              "-extfile", str(ext), "-extensions", "v3", "-out", str(pair.cert)], directory)
    csr.unlink()
    ext.unlink()
    return pair


def make_serving_cert(ca: KeyPair, directory: Path, name: str,
                      ips: Sequence[str] = ("127.0.0.1",),
                      dns: Sequence[str] = ("localhost",)) -> KeyPair:
    """Create a TLS server certificate signed by ``ca`` for the given addresses.

    Clients verify the API server against ``ca`` and the address they dial, so every
    address a client may use must be a SAN (kube-apiserver's in-cluster Service IP too).
    """
    sans = [f"IP:{ip}" for ip in ips] + [f"DNS:{d}" for d in dns]
    return _sign(ca, name, _subject(name), [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        "extendedKeyUsage=serverAuth",
        "subjectAltName=" + ",".join(sans),
    ], directory)


def make_client_cert(ca: KeyPair, directory: Path, name: str, common_name: str,
                     organizations: Sequence[str] = ()) -> KeyPair:
    """Create a client certificate: to kube-apiserver, ``CN`` is the user, ``O`` the groups.

    A kubelet, for example, needs ``common_name="system:node:localhost"`` and
    ``organizations=["system:nodes"]`` for the Node authorizer to recognise it.
    """
    return _sign(ca, name, _subject(common_name, organizations), [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        "extendedKeyUsage=clientAuth",
    ], directory)


def make_service_account_keys(directory: Path) -> KeyPair:
    """Create the key pair kube-apiserver signs service-account tokens with (ES256)."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    _new_key(pair.key)
    _openssl(["pkey", "-in", str(pair.key), "-pubout", "-out", str(pair.cert)], directory)
    return pair


def make_cluster_certs(directory: Path) -> ClusterCerts:
    """Create every certificate a local control plane needs, in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(directory)
    return ClusterCerts(
        ca=ca,
        # 10.0.0.1 is the `kubernetes` Service IP in --service-cluster-ip-range=10.0.0.0/24.
        apiserver=make_serving_cert(
            ca, directory, "kube-apiserver", ips=("127.0.0.1", "10.0.0.1"),
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")),
        service_accounts=make_service_account_keys(directory),
        kubelet_client=make_client_cert(ca, directory, "kube-apiserver-kubelet-client",
                                        "kube-apiserver-kubelet-client", ["system:masters"]),
    )
