"""A ``docker`` in front of ``docker``: ``--privileged`` becomes an explicit capability set.

Why: kind starts every node with ``docker run --privileged``. On this machine (and CI's)
root holds every capability but ``CAP_SYS_RESOURCE``; a privileged container asks runc
for all of them and fails with "unable to apply caps: operation not permitted" (issue 32,
docs/kind.md). A container given ``--cap-add ALL --cap-drop SYS_RESOURCE`` and no seccomp,
AppArmor or masked paths runs and can mount, which is what a kind node needs. kind calls
the ``docker`` command it finds on ``PATH``, so a folder holding this shim put first on
``PATH`` changes kind's containers and nothing else.

Only the options of ``docker run`` / ``docker create`` (and their ``docker container``
forms) are rewritten, and ``docker exec --privileged`` (kind's every command in a node)
loses the flag, which asks runc for the same missing capability; only before the image
or container name: an argument of the container's own
command that happens to read ``--privileged`` is passed through untouched. Everything
else is handed to the real ``docker`` unchanged (``exec``: same PID, same exit code).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

# What --privileged is replaced with. systempaths=unconfined: no masked /proc paths and a
# writable /proc/sys, as --privileged gives (the kubelet and kube-proxy write sysctls).
# /dev/kmsg: --privileged passes every host device; the kubelet refuses to start without
# this one ("failed to create kubelet: open /dev/kmsg: no such file or directory").
# The device rule: a privileged pod in the node (kube-proxy) asks its cgroup v1 devices
# controller for every device, which a parent without "a *:* rwm" refuses ("failed to
# write "a *:* rwm": ... devices.allow: operation not permitted").
PRIVILEGED_REPLACEMENT = (
    "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
    "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
    "--security-opt", "systempaths=unconfined", "--device", "/dev/kmsg",
    "--device-cgroup-rule", "a *:* rwm",
)
# Options of `docker run`/`create` that take no value: every other `--name` without `=`
# (and every other short option) consumes the next argument.
BOOLEAN_LONG = frozenset({
    "--detach", "--interactive", "--tty", "--rm", "--privileged", "--init", "--read-only",
    "--publish-all", "--no-healthcheck", "--oom-kill-disable", "--sig-proxy",
    "--disable-content-trust", "--quiet", "--help", "--use-api-socket",
})
BOOLEAN_SHORT = frozenset("ditPq")
# Global options of `docker` itself that take a value (before the subcommand).
GLOBAL_WITH_VALUE = frozenset({"--config", "-c", "--context", "--host", "-H", "--log-level",
                               "-l", "--tlscacert", "--tlscert", "--tlskey"})
REAL_DOCKER_ENV = "JOBLEASE_REAL_DOCKER"
# The shim script's own path: PATH's search must skip it, or the shim would exec itself.
SHIM_ENV = "JOBLEASE_DOCKER_SHIM"


def _is_privileged(arg: str) -> bool | None:
    """Whether ``arg`` is ``--privileged[=true|false]``; ``None`` when it is another arg."""
    if arg == "--privileged":
        return True
    if arg.startswith("--privileged="):
        return arg.split("=", 1)[1].lower() in ("true", "1")
    return None


def _takes_value(arg: str) -> bool:
    """Whether a ``docker run`` option consumes the following argument."""
    if arg.startswith("--"):
        return "=" not in arg and arg not in BOOLEAN_LONG
    letters = arg[1:]
    # -dit: all boolean; -e KEY / -v a:b: the last letter takes the next arg unless inline.
    if len(letters) == 1:
        return letters not in BOOLEAN_SHORT
    return all(c in BOOLEAN_SHORT for c in letters[:-1]) and letters[-1] not in BOOLEAN_SHORT


def _subcommand_index(argv: Sequence[str]) -> int:
    """Index of the first argument after docker's global options (its subcommand)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in GLOBAL_WITH_VALUE else 1
    return i


def rewrite(argv: Sequence[str]) -> list[str]:
    """Return ``argv`` (docker's arguments, without ``docker``) with ``--privileged`` replaced.

    Only in ``run``/``create`` options before the image (``exec``: dropped, before the
    container's name); ``--privileged=false`` is dropped.
    """
    args = list(argv)
    i = _subcommand_index(args)
    if i < len(args) and args[i] == "container":
        i += 1
    if i >= len(args) or args[i] not in ("run", "create", "exec"):
        return args
    # `exec` cannot take capabilities: without --privileged it gets the container's own
    # set (here ALL but SYS_RESOURCE), which is what kind's `exec --privileged` wants.
    replacement = () if args[i] == "exec" else PRIVILEGED_REPLACEMENT
    out, i = args[:i + 1], i + 1
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            return out + args[i:]  # the image and the container's command: untouched
        privileged = _is_privileged(arg)
        if privileged is not None:
            out += replacement if privileged else ()
            i += 1
            continue
        if _takes_value(arg) and i + 1 < len(args):
            out += [arg, args[i + 1]]
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def real_docker(shim: Path) -> str:
    """Return the ``docker`` to exec: ``$JOBLEASE_REAL_DOCKER``, else the next on PATH.

    Raises:
        FileNotFoundError: no other ``docker`` is on PATH (the message says which PATH).

    """
    configured = os.environ.get(REAL_DOCKER_ENV)
    if configured:
        return configured
    for folder in os.get_exec_path():
        candidate = Path(folder) / "docker"
        if candidate.is_file() and os.access(candidate, os.X_OK) and \
                candidate.resolve() != shim.resolve():
            return str(candidate)
    raise FileNotFoundError(f"no docker on PATH besides the shim {shim}")


def write_shim(folder: Path, python: str | None = None, real: str | None = None) -> Path:
    """Write ``folder/docker``, a script running this file with ``python``; return it.

    The script is generated (never committed): it names this machine's interpreter and
    this file (standard library only, so no PYTHONPATH is needed).
    """
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "docker"
    env = f'export {REAL_DOCKER_ENV}="${{{REAL_DOCKER_ENV}:-{real}}}"\n' if real else ""
    script.write_text("#!/bin/sh\n# Written by joblease_localcluster.dockershim (docs/kind.md).\n"
                      f'{env}export {SHIM_ENV}="$0"\n'
                      f'exec {python or sys.executable} {Path(__file__).resolve()} "$@"\n')
    script.chmod(0o755)
    return script


def main() -> None:
    """Exec the real docker with the rewritten arguments."""
    target = real_docker(Path(os.environ.get(SHIM_ENV, sys.argv[0])))
    args = rewrite(sys.argv[1:])
    os.execv(target, [target, *args])


if __name__ == "__main__":
    main()
