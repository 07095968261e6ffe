"""The ``joblease-localcluster`` command: ``build``, ``up|down|env`` and ``demo``.

Also ``python -m joblease_localcluster``. It is the local cluster's own command, apart from
the product's ``joblease`` command, which never imports this package.

The detached cluster exists for humans (a demo, poking with kubectl): ``up`` starts the
processes in their own sessions so they outlive the command, and records their PIDs and
binaries in ``<cache>/clusters/<name>/state.json``; ``down`` stops exactly those PIDs
(after checking ``/proc/PID/cmdline``) and removes the cluster's folder. Tests do not use
this: they hold a :class:`LocalCluster` for the session and stop it themselves.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from joblease_localcluster import build
from joblease_localcluster.certs import CertError
from joblease_localcluster.cluster import CONTEXT, LocalCluster, stop_detached
from joblease_localcluster.process import ComponentStartError, pid_matches

DEFAULT_NAME = "local"


def state_dir(name: str) -> Path:
    """Return the folder where a detached cluster's ``state.json`` lives."""
    return build.cache_dir() / "clusters" / name


def _context_for(name: str) -> str:
    return CONTEXT if name == DEFAULT_NAME else f"{CONTEXT}-{name}"


def _read_state(name: str) -> dict[str, Any] | None:
    path = state_dir(name) / "state.json"
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _alive(state: dict[str, Any]) -> list[str]:
    return [p["name"] for p in state.get("processes", [])
            if isinstance(p.get("pid"), int) and pid_matches(p["pid"], str(p.get("argv0")))]


PROG = "joblease-localcluster"


def _err(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 1


def cmd_build(args: argparse.Namespace) -> int:
    """Build (or find in the cache) the named components."""
    return build.main(list(args.components))


def cmd_up(args: argparse.Namespace) -> int:
    """Start a detached local cluster and record it."""
    name: str = args.name
    state = _read_state(name)
    if state is not None:
        if _alive(state):
            return _err(f"cluster {name!r} is already up ({', '.join(_alive(state))}); "
                        f"run `{PROG} down --name {name}` first")
        _stop_everything(state)  # stale: processes gone (e.g. reboot); clear its folder
        shutil.rmtree(state_dir(name), ignore_errors=True)
    cluster: LocalCluster
    if args.apiservers > 1 or args.etcd_members > 1:
        from joblease_localcluster.ha import HACluster

        cluster = HACluster(apiservers=args.apiservers, etcd_members=args.etcd_members,
                            kwok=args.kwok, name=_context_for(name), detach=True)
    else:
        cluster = LocalCluster(kwok=args.kwok, name=_context_for(name), detach=True)
    try:
        cluster.start()
    except (build.BuildError, CertError, ComponentStartError) as err:
        return _err(str(err))
    state = cluster.state()
    node = None
    if args.node:
        from joblease_localcluster import images
        from joblease_localcluster.node import NodeUnavailableError, RealNode

        node = RealNode(cluster)
        try:
            node.start()  # on failure it has already torn itself down
            node.import_image(images.base_archive())
        except (build.BuildError, ComponentStartError, NodeUnavailableError,
                images.ImageError) as err:
            node.stop()
            cluster.stop()
            return _err(str(err))
        state["node"] = node.state()
    folder = state_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "state.json").write_text(json.dumps(state, indent=2) + "\n")
    print(f"local cluster {name!r} is up: {cluster.server} "
          f"(/readyz after {cluster.ready_seconds or 0:.1f}s)")
    for proc in [*cluster.processes, *(node.processes if node else [])]:
        print(f"  {proc.name:<24} pid {proc.pid:<8} log {proc.log_path}")
    if node is not None:
        from joblease_localcluster import images
        from joblease_localcluster.node import NODE_NAME

        print(f"node {NODE_NAME!r} is Ready (kubelet + containerd; pods need "
              f"hostNetwork: true and imagePullPolicy: Never; image {images.BASE_IMAGE})")
    print(f"contexts: {_context_for(name)} (admin), "
          f"{_context_for(name)}-alice, {_context_for(name)}-bob")
    print(f"export KUBECONFIG={shlex.quote(str(cluster.kubeconfig))}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    """Stop a detached local cluster by its recorded PIDs and remove its files."""
    name: str = args.name
    state = _read_state(name)
    if state is None:
        return _err(f"no local cluster {name!r} is recorded (nothing to stop)")
    stopped, left = _stop_everything(state)
    for what in stopped:
        print(f"stopped {what}")
    shutil.rmtree(state_dir(name), ignore_errors=True)
    if left:
        return _err(f"local cluster {name!r} is down, but these are left: {', '.join(left)}")
    print(f"local cluster {name!r} is down")
    return 0


def _stop_everything(state: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Stop the node (if any) first: its mounts live in the cluster's folder."""
    stopped: list[str] = []
    left: list[str] = []
    if state.get("node"):
        from joblease_localcluster.node import stop_detached_node

        stopped, left = stop_detached_node(state["node"])
    return [*stopped, *stop_detached(state)], left


def cmd_env(args: argparse.Namespace) -> int:
    """Print the shell line that points kubectl at a detached local cluster."""
    state = _read_state(args.name)
    if state is None:
        return _err(f"no local cluster {args.name!r}; run `{PROG} up`")
    print(f"export KUBECONFIG={shlex.quote(str(state['kubeconfig']))}")
    return 0


def _name(value: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?", value):
        raise argparse.ArgumentTypeError("use lowercase letters, digits and '-'")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``build``, ``up``, ``down``, ``env`` and ``demo``."""
    p_build = subparsers.add_parser(
        "build", help="build (or reuse) the cluster binaries",
        description="Build etcd, Kubernetes components, kwok or helm from their Go modules "
                    f"into {build.cache_dir() / 'bin'} (KUBEBUILDER_ASSETS wins when set).")
    p_build.add_argument("components", nargs="*",
                         help=f"default: {' '.join(build.CONTROL_PLANE)}")
    p_build.set_defaults(func=cmd_build)

    for verb, func, text in (("up", cmd_up, "start a detached local cluster (processes "
                                            "outlive this command)"),
                             ("down", cmd_down, "stop it and remove its files"),
                             ("env", cmd_env, "print `export KUBECONFIG=…`")):
        sub = subparsers.add_parser(verb, help=text)
        sub.add_argument("--name", type=_name, default=DEFAULT_NAME,
                         help="which local cluster (default: %(default)s)")
        if verb == "up":
            sub.add_argument("--kwok", action="store_true",
                             help="also start kwok (simulated nodes and pods)")
            sub.add_argument("--apiservers", type=int, default=1,
                             help="kube-apiservers behind a loopback load balancer (HA mode)")
            sub.add_argument("--etcd-members", type=int, default=1,
                             help="etcd members in one raft cluster (odd; HA mode)")
            sub.add_argument("--node", action="store_true",
                             help="also join a real node (kubelet + containerd + runc, as "
                                  "root; `down` removes its processes, mounts and cgroups)")
        sub.set_defaults(func=func)

    p_demo = subparsers.add_parser(
        "demo", help="the A/B fencing demo on a local control plane (needs joblease)")
    p_demo.add_argument("--keep", action="store_true",
                        help="keep the cluster folder (logs) after the demo")
    p_demo.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from joblease_localcluster import demo  # imports joblease: only this command needs it

    return demo.run(args)


def build_parser() -> argparse.ArgumentParser:
    """Return the ``joblease-localcluster`` parser."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``joblease-localcluster`` and return its exit code."""
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
