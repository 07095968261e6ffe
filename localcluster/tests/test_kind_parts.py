"""The pure parts of the kind path (issue 32): names, archives, dockerd's flags, kind's config."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import yaml

from joblease_localcluster import build, dockerd, kindnode, kindrun

KUBEADM_LIST = [
    "registry.k8s.io/kube-apiserver:v1.37.2", "registry.k8s.io/kube-proxy:v1.37.2",
    "registry.k8s.io/coredns/coredns:v1.12.4", "registry.k8s.io/pause:3.10.1",
    "registry.k8s.io/etcd:3.6.16-0",
]


def test_image_for_matches_the_last_path_segment_only() -> None:
    assert kindnode.image_for(KUBEADM_LIST, "coredns") == "registry.k8s.io/coredns/coredns:v1.12.4"
    assert kindnode.image_for(KUBEADM_LIST, "kube-proxy") == "registry.k8s.io/kube-proxy:v1.37.2"
    with pytest.raises(kindnode.PartMissing, match="kube-scheduler"):
        kindnode.image_for(KUBEADM_LIST, "kube-scheduler")
    # "proxy" is not "kube-proxy": no suffix matching.
    with pytest.raises(kindnode.PartMissing):
        kindnode.image_for(KUBEADM_LIST, "proxy")


def test_binary_image_is_a_docker_archive_under_kubeadms_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBLEASE_CACHE_DIR", str(tmp_path / "cache"))
    binary = tmp_path / "kube-scheduler"
    binary.write_bytes(b"\x7fELF fake")
    binary.chmod(0o755)
    name = "registry.k8s.io/kube-scheduler:v1.37.2"
    archive = kindnode.binary_image(name, {"usr/local/bin/kube-scheduler": binary}, {})
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        config = json.load(tar.extractfile("config.json"))  # type: ignore[arg-type]
        layer = tar.extractfile(manifest[0]["Layers"][0])
        assert layer is not None
        with tarfile.open(fileobj=layer) as inner:
            members = {m.name: m for m in inner.getmembers()}
    assert manifest[0]["RepoTags"] == [name]
    assert len(config["rootfs"]["diff_ids"]) == 1
    assert members["usr/local/bin/kube-scheduler"].mode & 0o111
    assert members["tmp"].isdir()
    assert {m.uid for m in members.values()} == {0}
    # Made once: the same inputs give the same file, not a second build.
    assert kindnode.binary_image(name, {"usr/local/bin/kube-scheduler": binary}, {}) == archive


def test_dockerd_keeps_off_the_hosts_network_and_paths(tmp_path: Path) -> None:
    argv = dockerd.dockerd_argv(tmp_path)
    for flag in ("--iptables=false", "--ip-masq=false", "--ip-forward=false", "--bridge=none"):
        assert flag in argv
    values = [argv[i + 1] for i, a in enumerate(argv) if a in (
        "--host", "--data-root", "--exec-root", "--pidfile", "--config-file")]
    assert len(values) == 5
    assert all(str(tmp_path) in v for v in values), values


def test_kind_config_keeps_cgroup_v1_and_disables_kinds_cni() -> None:
    config = kindrun.kind_config()
    patches = [yaml.safe_load(p) for p in config["kubeadmConfigPatches"]]  # type: ignore[attr-defined]
    kubelet = [p for p in patches if p["kind"] == "KubeletConfiguration"]
    assert kubelet and kubelet[0]["failCgroupV1"] is False
    assert config["networking"] == {"disableDefaultCNI": True,  # type: ignore[comparison-overlap]
                                    "podSubnet": kindnode.POD_SUBNET}


def test_the_kind_parts_have_their_own_cache_folders() -> None:
    folders = {build.bin_dir_for(c).name for c in ("kind", "crictl", "bridge", "host-local")}
    assert folders == {f"kind-{build.KIND_VERSION}", f"cri-tools-{build.CRI_TOOLS_VERSION}",
                       f"cni-plugins-{build.CNI_PLUGINS_VERSION}"}
    # kubeadm and kube-proxy come from the same Kubernetes release as the control plane.
    assert build.bin_dir_for("kubeadm") == build.bin_dir_for("kube-apiserver")


def test_kind_config_runs_the_local_control_planes_etcd() -> None:
    patches = [yaml.safe_load(p) for p in kindrun.kind_config()["kubeadmConfigPatches"]]  # type: ignore[attr-defined]
    cluster = [p for p in patches if p["kind"] == "ClusterConfiguration"]
    assert cluster[0]["etcd"]["local"]["imageTag"] == build.ETCD_VERSION.lstrip("v") + "-0"


KIND_CONTAINERD = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
[plugins."io.containerd.grpc.v1.cri"]
  # use fixed sandbox image
  sandbox_image = "registry.k8s.io/pause:3.10"
  tolerate_missing_hugepages_controller = true
  restrict_oom_score_adj = false
"""


def test_containerd_config_gets_our_pause_and_restricted_oom_scores() -> None:
    out = kindnode.containerd_config(KIND_CONTAINERD, "registry.k8s.io/pause:3.10.2")
    assert '  sandbox_image = "registry.k8s.io/pause:3.10.2"' in out.splitlines()
    assert "  restrict_oom_score_adj = true" in out.splitlines()
    assert "restrict_oom_score_adj = false" not in out
    assert "# use fixed sandbox image" in out  # everything else kept
    assert out.count("\n") == KIND_CONTAINERD.count("\n")


def test_kindrun_finds_the_repositorys_dockerfile_and_chart() -> None:
    # The operator image and the chart come from the checkout that holds this package.
    assert (kindrun.REPO / "Dockerfile").is_file()
    assert (kindrun.REPO / "charts" / "joblease-operator" / "Chart.yaml").is_file()

