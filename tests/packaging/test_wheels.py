"""The product's wheel holds the product only; the local cluster ships its CRD; both build clean.

The local cluster (builder, runner, HA load balancer, Date-skew proxy, real node, BuildKit,
demo) is the ``joblease-localcluster`` distribution: it must never be in ``joblease``'s
wheel, nor in what the Dockerfile copies and installs into the operator image.
"""

from __future__ import annotations

import email
import re
import shlex
import shutil
import zipfile
from pathlib import Path

from packaging_support import Wheels, copy_tree, pip_wheel

from support.paths import CRD, REPO

# What marks the cluster builder's code, whatever a module is called.
CLUSTER_BUILDER_SIGNS = ("joblease_localcluster", "localcluster", "def ensure_binaries",
                         "class LocalCluster", "class RealNode", "class BuildKit")


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(zf.read(name))


def _cluster_builder_files(wheel: Path) -> list[str]:
    found = []
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if "localcluster" in name:
                found.append(name)
            elif name.endswith(".py"):
                text = zf.read(name).decode()
                found += [f"{name}: {sign!r}" for sign in CLUSTER_BUILDER_SIGNS if sign in text]
    return found


def test_the_product_wheel_has_no_cluster_builder_module(wheels: Wheels) -> None:
    names = _names(wheels.product)
    assert "joblease/sdk/client.py" in names and "joblease/cli/__init__.py" in names  # the product
    assert _cluster_builder_files(wheels.product) == []
    modules = {Path(n).stem for n in _names(wheels.localcluster) if n.endswith(".py")}
    # every cluster module name, wherever it might have been put in the product's package
    clashes = [n for n in names if n.endswith(".py")
               and Path(n).stem in modules - {"__init__", "__main__", "cli"}]
    assert clashes == []


def test_the_product_wheel_declares_only_what_it_imports(wheels: Wheels) -> None:
    meta = _metadata(wheels.product)
    runtime = sorted(r.split("==")[0].lower() for r in meta.get_all("Requires-Dist") or []
                     if "extra ==" not in r)
    assert runtime == ["aiohttp", "kopf", "kubernetes", "prometheus-client", "pyyaml", "urllib3"]
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert "LICENSE" in "".join(n for n in _names(wheels.product) if "licenses" in n)


def _backend_warnings(output: str) -> list[str]:
    """setuptools' warnings (the old ``license`` table, a missing README or LICENSE …)."""
    lines = output.splitlines()
    return [" ".join(lines[i:i + 6]) for i, line in enumerate(lines)
            if "BuildBackendWarning" in line or "SetuptoolsDeprecationWarning" in line]


def test_the_builds_raise_no_setuptools_warning(wheels: Wheels) -> None:
    assert _backend_warnings(wheels.output) == []


def test_the_localcluster_wheel_ships_the_canonical_crd_and_its_command(wheels: Wheels) -> None:
    with zipfile.ZipFile(wheels.localcluster) as zf:
        crd = zf.read("joblease_localcluster/data/joblease.dev_jobleases.yaml")
        entry_points = zf.read(next(n for n in zf.namelist()
                                    if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert crd == CRD.read_bytes()
    assert "joblease-localcluster = joblease_localcluster.cli:main" in entry_points
    meta = _metadata(wheels.localcluster)
    assert meta["Name"] == "joblease-localcluster"
    assert meta["License-Expression"] == "Apache-2.0"


# -- the operator image ------------------------------------------------------------------

def _dockerfile_copies() -> list[str]:
    """The build-context sources of the Dockerfile's ``COPY`` lines (not ``--from``)."""
    sources = []
    for line in (REPO / "Dockerfile").read_text().splitlines():
        words = shlex.split(line) if line.startswith("COPY ") else []
        if words and not any(w.startswith("--from") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


def _pip_installs() -> list[list[str]]:
    """The arguments of every ``pip install`` the Dockerfile runs (continuations joined)."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    found = []
    for match in re.finditer(r"pip install ([^&\n]*)", text):
        found.append([w for w in shlex.split(match.group(1)) if not w.startswith("-")])
    return found


def test_the_image_copies_and_installs_only_the_product(tmp_path: Path) -> None:
    sources = _dockerfile_copies()
    assert sources, "no COPY lines found in the Dockerfile"
    assert not [s for s in sources if "localcluster" in s or s in (".", "./")], sources
    installs = _pip_installs()
    assert installs, "no pip install found in the Dockerfile"
    targets = {w for words in installs for w in words}
    # pinned build tools, the constraints file, and the product ('.', '.[postgres]')
    assert targets - {"setuptools==80.9.0", "wheel==0.45.1", "constraints.txt", ".",
                      ".[postgres]"} == set(), targets
    # Build the wheel from exactly what the Dockerfile copies: what the image installs.
    tree = copy_tree(tmp_path / "tree")
    context = tmp_path / "context"
    context.mkdir()
    for source in sources:
        src = tree / source.rstrip("/")
        dst = context / source.rstrip("/")
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            dst.write_bytes(src.read_bytes())
    wheel, output = pip_wheel(context, tmp_path / "out")
    assert _backend_warnings(output) == []  # e.g. a LICENSE the Dockerfile does not copy
    assert _cluster_builder_files(wheel) == []
    requires = " ".join(_metadata(wheel).get_all("Requires-Dist") or [])
    assert "localcluster" not in requires
