"""Start the operator: kopf in standalone, cluster-wide mode, plus a metrics endpoint."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import kopf
from prometheus_client import start_http_server

from joblease.controller import handlers  # (importing it registers the handlers)
from joblease.controller.heartbeat import Heartbeat


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``joblease operator`` / ``python -m joblease``."""
    parser.add_argument("--metrics-addr", default="127.0.0.1",
                        help="address for /metrics (0.0.0.0 in a pod)")
    parser.add_argument("--metrics-port", type=int, default=8080,
                        help="port for Prometheus /metrics (0 disables)")
    parser.add_argument("--health-addr", default="127.0.0.1:8081",
                        help="host:port of the kopf liveness endpoint /healthz "
                             "('' turns it off)")
    parser.add_argument("--health-file", type=Path, default=None,
                        help="touch this file after every reconcile pass, for exec probes "
                             "(replicas sharing one host network cannot each own a port)")
    parser.add_argument("--namespace", action="append", default=[],
                        help="watch only these namespaces (default: all)")
    parser.add_argument("--verbose", action="store_true")


def run(args: argparse.Namespace) -> int:
    """Run until interrupted; return the exit code."""
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("kopf", "aiohttp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_addr)
    handlers.HEARTBEAT = Heartbeat(args.health_file)
    kopf.run(standalone=True, clusterwide=not args.namespace, namespaces=args.namespace,
             liveness_endpoint=f"http://{args.health_addr}/healthz" if args.health_addr
             else None)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m joblease``."""
    parser = argparse.ArgumentParser(prog="joblease-operator")
    add_arguments(parser)
    return run(parser.parse_args(argv))
