"""The ``joblease`` command (also installed as ``kubectl-joblease``, so ``kubectl joblease …``).

:func:`main` parses the arguments (:mod:`joblease.cli.parser`), runs the verb
(:mod:`joblease.cli.verbs`) and turns joblease's errors into the stable exit codes of
:mod:`joblease.cli.exits` (0 ok, 2 usage, 3 unavailable, 4 lost, 5 not found, 6 API; ``work``
also 7 and 8). A job's command failing is not the worker's failure: the job is released as
failed and retried (see docs/pools.md).
"""

# Startup time is most of a CLI call (issue 18): this package imports only the standard
# library at the top. Each verb imports what it uses, the operator's code (kopf,
# prometheus_client) is imported only by `joblease operator`, and `--help`/`completion`
# touch neither the SDK nor the Kubernetes client. tests/unit/test_cli_imports.py keeps it so.
#
# The package: parser (the verbs' arguments), verbs (what each does), exits (the exit
# codes, once), view (what ls/describe show, pure), completion (shell scripts).

from __future__ import annotations

import sys

from joblease.cli.exits import EXIT_ERROR, EXIT_INTERRUPTED, exit_code_for
from joblease.cli.parser import build_parser

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (see the module doc)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["operator"]:
        from joblease.controller.main import main as operator_main
        return operator_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `joblease ls | head`: the reader left; say nothing more (as kubectl does), and
        # keep the interpreter from complaining again while it flushes stdout on exit
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    except Exception as err:
        known = exit_code_for(err)
        if known is None:
            raise
        print(f"joblease: {err}", file=sys.stderr)
        return known
    return code
