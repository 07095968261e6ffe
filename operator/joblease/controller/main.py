"""Start the operator: settings from flags and environment, metrics, then kopf.

Standalone (no peering), cluster-wide unless ``--namespace`` is given. Every flag and
variable is parsed once, here, into an ``OperatorSettings`` (``controller.settings``); a
bad one stops the process with exit code 2 and a message naming it, before anything runs.
"""

from __future__ import annotations

import argparse
import logging
import sys

from prometheus_client import start_http_server

from joblease.controller import handlers
from joblease.controller import settings as settings_module
from joblease.controller.runtime import Operator
from joblease.controller.settings import OperatorSettings, SettingsError

EXIT_USAGE = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``joblease operator`` / ``python -m joblease``."""
    settings_module.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run until interrupted; return the exit code (2 for an invalid setting)."""
    try:
        settings = OperatorSettings.from_args(args)
    except SettingsError as err:
        print(f"joblease operator: invalid setting: {err}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=settings.logging_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("kopf", "aiohttp"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, settings.logging_level))
    if settings.metrics_port:
        start_http_server(settings.metrics_port, addr=settings.metrics_addr)
    handlers.run(Operator(settings))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m joblease``."""
    parser = argparse.ArgumentParser(prog="joblease-operator")
    add_arguments(parser)
    return run(parser.parse_args(argv))
