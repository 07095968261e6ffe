"""The pure parts of the binary builder: where binaries are found, how progress reads."""

import io
from pathlib import Path

import pytest

from joblease_localcluster import build


def test_kubebuilder_assets_wins_over_the_cache(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assets = tmp_path / "assets"
    assets.mkdir()
    (assets / "kube-apiserver").write_text("#!/bin/sh\n")
    cache = tmp_path / "cache"
    cached = cache / "bin" / f"kubernetes-{build.KUBERNETES_VERSION}" / "kube-apiserver"
    cached.parent.mkdir(parents=True)
    cached.write_text("#!/bin/sh\n")
    monkeypatch.setenv("JOBLEASE_CACHE_DIR", str(cache))

    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    assert build.find_binary("kube-apiserver") == assets / "kube-apiserver"
    # Not in the assets folder: fall back to the cache, then to nothing.
    assert build.find_binary("etcd") is None

    monkeypatch.delenv("KUBEBUILDER_ASSETS")
    assert build.find_binary("kube-apiserver") == cached


def test_cache_dir_is_versioned_per_component(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBLEASE_CACHE_DIR", str(tmp_path))
    assert build.bin_dir_for("etcd") == tmp_path / "bin" / f"etcd-{build.ETCD_VERSION}"
    assert build.bin_dir_for("kubectl").name == f"kubernetes-{build.KUBERNETES_VERSION}"


def test_missing_go_and_no_binaries_is_a_clear_error(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBLEASE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(build.BuildError, match=r"Go is not installed.*KUBEBUILDER_ASSETS"):
        build.ensure_binaries(["etcd"], build.Progress(stream=io.StringIO()))


def test_progress_writes_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    progress = build.Progress(stream=out, interval=0.05)
    with progress.step("building thing"):
        import time
        time.sleep(0.12)
    lines = out.getvalue().splitlines()
    assert lines[0] == "[joblease build] building thing …"
    assert any("still running" in line for line in lines[1:-1])
    assert lines[-1].startswith("[joblease build] building thing: done in ")
    assert "\r" not in out.getvalue()


def test_promtool_has_its_own_versioned_folder(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBLEASE_CACHE_DIR", str(tmp_path))
    assert build.bin_dir_for("promtool") == (
        tmp_path / "bin" / f"promtool-{build.PROMETHEUS_VERSION}")
    # Prometheus 3.MM.P is published as Go module version v0.3MM.P: keep the two in step.
    major, minor, patch = build.PROMETHEUS_RELEASE.split(".")
    assert f"v0.{major}{int(minor):02d}.{patch}" == build.PROMETHEUS_VERSION
