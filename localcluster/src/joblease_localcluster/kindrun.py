"""``make e2e-kind``: kind on this machine, offline, as far as it gets (issue 32, docs/kind.md).

The steps, each reported with a progress line and each failing with the name of what is
missing (never a silent pass):

1. build kind from its module (``joblease-localcluster build kind``);
2. make the node image from its parts (:mod:`joblease_localcluster.kindnode`);
3. start Debian's dockerd as our process (:mod:`joblease_localcluster.dockerd`) and load
   the image;
4. ``kind create cluster`` through the docker shim (:mod:`joblease_localcluster.dockershim`)
   with a config that keeps cgroup v1 (``failCgroupV1: false``) and the bridge pod network;
5. what issue 32 asks next (the operator image, the chart with its defaults, the cluster
   tests, the journeys) is not done yet: the run says so and fails (exit 3);
6. delete the cluster, stop dockerd (by its PID).

``python -m joblease_localcluster.kindrun [--keep]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from joblease_localcluster import build, dockerd, dockershim, kindnode

CLUSTER = "joblease-e2e"
NOT_DONE = ("the operator image loaded into kind, the chart installed with its defaults, the "
            "cluster tests on JOBLEASE_E2E_KUBECONFIG and the pod-network journeys "
            "(issue 32 items 1-2): not built yet")


def kind_config() -> dict[str, object]:
    """The kind cluster: one node, cgroup v1 kept, kind's CNI off (the image has bridge)."""
    kubelet = {"kind": "KubeletConfiguration", "apiVersion": "kubelet.config.k8s.io/v1beta1",
               "failCgroupV1": False}
    # The etcd release the local control plane runs (kubeadm's default is newer).
    cluster = {"kind": "ClusterConfiguration",
               "etcd": {"local": {"imageTag": kindnode.ETCD_TAG}}}
    return {"kind": "Cluster", "apiVersion": "kind.x-k8s.io/v1alpha4",
            "networking": {"disableDefaultCNI": True, "podSubnet": kindnode.POD_SUBNET},
            "nodes": [{"role": "control-plane"}],
            "kubeadmConfigPatches": [yaml.safe_dump(kubelet), yaml.safe_dump(cluster)]}


def _kind_env(engine: dockerd.DockerEngine, shim_dir: Path) -> dict[str, str]:
    return {**os.environ, **engine.env(), dockershim.REAL_DOCKER_ENV: str(dockerd.DOCKER),
            "KIND_EXPERIMENTAL_PROVIDER": "docker",
            "PATH": f"{shim_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


def _fail(step: str, detail: str) -> int:
    print(f"e2e-kind: stopped at {step}: {detail}", file=sys.stderr)
    return 3


def run(keep: bool = False) -> int:
    """Run the steps; return 0 only when all of issue 32's steps passed (not yet)."""
    progress = build.Progress()
    started = time.monotonic()
    try:
        kind = build.ensure_binaries(["kind"], progress)["kind"]
        image = kindnode.node_image(progress)
    except (build.BuildError, kindnode.PartMissing) as err:
        return _fail("the node image's parts", str(err))
    progress.line(f"node image {image.name} ready ({image.archive.stat().st_size >> 20} MiB)")
    engine = dockerd.DockerEngine()
    try:
        engine.start()
    except Exception as err:  # noqa: BLE001 - the failure is the report
        return _fail("dockerd", str(err))
    try:
        return _with_engine(engine, kind, image, progress, keep, started)
    finally:
        engine.stop()


def _with_engine(engine: dockerd.DockerEngine, kind: Path, image: kindnode.NodeImage,
                 progress: build.Progress, keep: bool, started: float) -> int:
    with progress.step(f"docker load {image.name}"):
        loaded = engine.docker("load", "-i", str(image.archive), timeout=1200)
    if loaded.returncode != 0:
        return _fail("docker load", loaded.stderr[-2000:])
    shim_dir = kindnode.kind_dir() / "shim"
    dockershim.write_shim(shim_dir)
    config = kindnode.kind_dir() / "cluster.yaml"
    config.write_text(yaml.safe_dump(kind_config()))
    env = _kind_env(engine, shim_dir)
    with progress.step(f"kind create cluster --name {CLUSTER}"):
        created = subprocess.run([str(kind), "create", "cluster", "--name", CLUSTER, "--image",
                                  image.name, "--config", str(config), "--wait", "180s",
                                  "--retain", "-v", "1"], env=env, capture_output=True,
                                 text=True, check=False, timeout=900)
    print(created.stdout[-3000:], created.stderr[-6000:], sep="\n", file=sys.stderr)
    try:
        if created.returncode != 0:
            return _fail("kind create cluster", f"exit {created.returncode} (output above)")
        progress.line(f"kind cluster {CLUSTER} up after {time.monotonic() - started:.0f}s")
        return _fail("after the cluster", NOT_DONE)
    finally:
        if not keep:
            subprocess.run([str(kind), "delete", "cluster", "--name", CLUSTER], env=env,
                           capture_output=True, check=False, timeout=300)


def main(argv: list[str] | None = None) -> int:
    """Parse ``--keep`` and run."""
    parser = argparse.ArgumentParser(prog="python -m joblease_localcluster.kindrun")
    parser.add_argument("--keep", action="store_true",
                        help="keep the kind cluster (dockerd is stopped all the same)")
    args = parser.parse_args(argv)
    return run(keep=args.keep)


if __name__ == "__main__":
    sys.exit(main())
