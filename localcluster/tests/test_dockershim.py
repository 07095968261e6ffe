"""The docker shim kind runs through: ``--privileged`` becomes the capability set, nothing else.

Each test tries to make the shim rewrite the wrong thing (a container argument, another
subcommand, an option's value) or miss the right one (global options first, the
``container run`` form, ``--privileged=true``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from joblease_localcluster import dockershim
from joblease_localcluster.dockershim import PRIVILEGED_REPLACEMENT, rewrite

# What kind v0.33.0 passes for a control-plane node (pkg/cluster/internal/providers/docker).
KIND_RUN = ["run", "--name", "kind-control-plane", "--hostname", "kind-control-plane",
            "--label", "io.x-k8s.kind.role=control-plane", "--privileged",
            "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
            "--tmpfs", "/tmp", "--tmpfs", "/run", "--volume", "/var",
            "--volume", "/lib/modules:/lib/modules:ro", "-e", "KIND_EXPERIMENTAL_X",
            "--detach", "--tty", "--net", "kind", "--restart=on-failure:1", "--init=false",
            "--cgroupns=private", "--publish=127.0.0.1:40000:6443/TCP",
            "kindest/node:local"]


def test_kinds_node_run_gets_the_capability_set_instead_of_privileged() -> None:
    out = rewrite(KIND_RUN)
    assert "--privileged" not in out
    at = KIND_RUN.index("--privileged")
    assert out[at:at + len(PRIVILEGED_REPLACEMENT)] == list(PRIVILEGED_REPLACEMENT)
    # Everything else is kept, in order, and the image is still last.
    rest = out[:at] + out[at + len(PRIVILEGED_REPLACEMENT):]
    assert rest == [a for a in KIND_RUN if a != "--privileged"]
    assert out[-1] == "kindest/node:local"


def test_the_capability_set_drops_only_sys_resource() -> None:
    pairs = dict(zip(PRIVILEGED_REPLACEMENT[::2], PRIVILEGED_REPLACEMENT[1::2], strict=True))
    assert pairs["--cap-add"] == "ALL"
    assert pairs["--cap-drop"] == "SYS_RESOURCE"
    assert "seccomp=unconfined" in PRIVILEGED_REPLACEMENT


def test_arguments_of_the_containers_command_are_not_rewritten() -> None:
    argv = ["run", "--rm", "-it", "busybox", "sh", "-c", "echo", "--privileged"]
    assert rewrite(argv) == argv


def test_an_options_value_that_reads_privileged_is_not_rewritten() -> None:
    argv = ["run", "--label", "--privileged", "-e", "--privileged", "img"]
    assert rewrite(argv) == argv


def test_exec_loses_privileged_and_keeps_the_command() -> None:
    # kind runs every command in a node as `docker exec --privileged`; runc would ask for
    # CAP_SYS_RESOURCE again. The command's own arguments stay as they are.
    argv = ["exec", "--privileged", "-i", "-e", "A=B", "node", "sh", "-c", "x", "--privileged"]
    assert rewrite(argv) == ["exec", "-i", "-e", "A=B", "node", "sh", "-c", "x", "--privileged"]


def test_other_subcommands_pass_through_untouched() -> None:
    for argv in (["inspect", "--privileged"],
                 ["ps", "-a"], [], ["--version"]):
        assert rewrite(argv) == argv


def test_global_options_and_the_container_form_are_understood() -> None:
    out = rewrite(["--host", "unix:///x.sock", "container", "create", "--privileged", "img"])
    assert out == ["--host", "unix:///x.sock", "container", "create",
                   *PRIVILEGED_REPLACEMENT, "img"]


def test_privileged_true_is_replaced_and_privileged_false_is_dropped() -> None:
    assert rewrite(["run", "--privileged=true", "img"]) == ["run", *PRIVILEGED_REPLACEMENT, "img"]
    assert rewrite(["run", "--privileged=false", "img"]) == ["run", "img"]


def test_short_options_with_and_without_values() -> None:
    # -e takes the next argument (which reads like an option); -dit does not; -eK=V is inline.
    argv = ["run", "-dit", "-e", "--privileged", "-eK=V", "--privileged", "img", "--privileged"]
    out = rewrite(argv)
    assert out == ["run", "-dit", "-e", "--privileged", "-eK=V", *PRIVILEGED_REPLACEMENT,
                   "img", "--privileged"]


def test_the_written_shim_execs_the_real_docker_with_rewritten_arguments(tmp_path: Path) -> None:
    # A fake "real docker" records its arguments; the shim is first on PATH and must not
    # find itself as the real one.
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    record = tmp_path / "args"
    fake = real_dir / "docker"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\nexit 7\n')
    fake.chmod(0o755)
    shim = dockershim.write_shim(tmp_path / "shim")
    env = {"PATH": f"{shim.parent}:{real_dir}:/usr/bin:/bin"}
    result = subprocess.run(["docker", "run", "--privileged", "img", "--privileged"], env=env,
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 7, result.stderr  # the real docker's exit code, via exec
    assert record.read_text().splitlines() == ["run", *PRIVILEGED_REPLACEMENT, "img",
                                               "--privileged"]
