"""The ``joblease`` command line: every verb's arguments, and which function runs it.

Only the standard library at import time (start-up is most of a CLI call, issue 18); the
verbs (:mod:`joblease.cli.verbs`) import what they use when they run.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from joblease.cli import checks, exits, verbs

USAGE = ("The joblease command (also kubectl-joblease): claim, renew, complete and release "
         "JobLeases, run a command under one, work a pool, and look at them.\n\n"
         + (exits.__doc__ or "").split("\n\n", 1)[1])

class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line: the verb, the reason, exit 2.

    Why: argparse prints the whole usage (six lines for ``work``) before the reason, so the
    reason — the one line a user or a script's log needs — came last and was easy to miss.
    ``--help`` still shows the usage.
    """

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: MESSAGE (see PROG --help)`` on stderr and exit with 2."""
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(exits.EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every subcommand registered."""
    parser = OneLineParser(prog="joblease", description=USAGE,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    _register_lease_commands(sub)
    _register_views(sub)
    _register_operator(sub)
    return parser


def common(p: argparse.ArgumentParser) -> None:
    """The options every verb that talks to the API server takes."""
    p.add_argument("-n", "--namespace", type=checks.namespace, default="default")
    p.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG or in-cluster")
    p.add_argument("--context", default=None)
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")


def _held(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", type=checks.lease_name, help="the JobLease (job id)")
    p.add_argument("--holder", type=checks.holder, required=True,
                   help="identity that holds the lease")
    p.add_argument("--token", type=checks.token, default=None, metavar="EPOCH/GENERATION",
                   help="the fencing token printed by claim (or give --epoch and --generation)")
    p.add_argument("--epoch", type=checks.count, default=None, help="the token's epoch")
    p.add_argument("--generation", type=checks.count, default=None,
                   help="the token's generation")
    p.add_argument("--claim-id", type=checks.claim_id, default=None,
                   help="the claim id printed by claim (recommended: tells apart holders "
                        "that share a name)")
    p.add_argument("--timeout", type=checks.seconds, default=10.0, metavar="SECONDS",
                   help="how long to retry an API server that does not answer")


def _register_lease_commands(sub: Any) -> None:
    claim = sub.add_parser("claim", help="claim a JobLease; prints its token")
    common(claim)
    claim.add_argument("name", type=checks.lease_name)
    claim.add_argument("--holder", type=checks.holder, default=None,
                       help="default: $JOBLEASE_HOLDER or HOSTNAME-PID; '@identity' = your "
                            "Kubernetes username (needed under the holder-only policy)")
    claim.add_argument("--wait", type=checks.seconds, default=0.0, metavar="SECONDS",
                       help="wait up to SECONDS while someone else holds it")
    claim.set_defaults(func=verbs.claim)
    for verb in ("renew", "complete", "release"):
        p = sub.add_parser(verb, help=f"{verb} a JobLease you hold (needs holder + token)")
        common(p)
        _held(p)
        if verb == "complete":
            p.add_argument("--result", type=checks.result, default="",
                           help="short result to record (at most 1,024 characters)")
        if verb == "release":
            p.add_argument("--failed", action="store_true", help="count it as a failed attempt")
        p.set_defaults(func=verbs.held, verb=verb)
    get = sub.add_parser("get", help="show a JobLease's status")
    common(get)
    get.add_argument("name", type=checks.lease_name)
    get.set_defaults(func=verbs.get)
    run = sub.add_parser("run", help="run a command while holding a lease",
                         description="Claim, run CMD with the token in its environment, renew "
                         "while it runs, stop it if the lease is lost; complete on exit 0.")
    common(run)
    run.add_argument("--lease", type=checks.lease_name, required=True,
                     help="the JobLease (job id)")
    run.add_argument("--holder", type=checks.holder, default=None,
                     help="as for claim ('@identity' allowed)")
    run.add_argument("--wait", type=checks.seconds, default=0.0, metavar="SECONDS")
    run.add_argument("--grace", type=checks.seconds, default=5.0,
                     help="seconds between SIGTERM and SIGKILL when the lease is lost")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS…")
    run.set_defaults(func=verbs.run)
    _register_work(sub)


def _register_work(sub: Any) -> None:
    work = sub.add_parser(
        "work", help="pool worker: run a command once per claimed job of a selector",
        description="Claim the next job of the selector (priority, then oldest first), run "
        "CMD under its lease exactly as `run` does, K at a time; SIGTERM drains. "
        "See docs/pools.md.")
    common(work)
    work.add_argument("-l", "--selector", type=checks.selector, required=True,
                      help="label selector of the pool's JobLeases (e.g. batch=nightly)")
    work.add_argument("-c", "--concurrency", type=checks.positive_count, default=1,
                      metavar="K",
                      help="commands running at once (default 1)")
    work.add_argument("--until-empty", action="store_true",
                      help="exit once nothing unfinished is left in the selector")
    work.add_argument("--holder", type=checks.holder, default=None,
                      help="as for claim ('@identity' allowed)")
    work.add_argument("--grace", type=checks.seconds, default=5.0,
                      help="seconds between SIGTERM and SIGKILL when a command must stop")
    work.add_argument("--drain-timeout", type=checks.seconds, default=30.0, metavar="SECONDS",
                      help="after SIGTERM/SIGINT, how long running commands may finish "
                           "before they are stopped and their leases released (default 30)")
    work.add_argument("--progress-every", type=checks.positive_seconds, default=5.0,
                      metavar="SECONDS",
                      help="seconds between progress lines on stderr (also one per job end)")
    work.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS…")
    work.set_defaults(func=verbs.work)


def _register_operator(sub: Any) -> None:
    # Listed for --help and completion only: main() hands `operator ARGS…` to the
    # controller's own parser before this one runs, so kopf is imported by that verb alone.
    sub.add_parser("operator", add_help=False,
                   help="run the operator (same as python -m joblease; "
                        "`joblease operator --help` for its options)")


def _register_views(sub: Any) -> None:
    for verb in ("ls", "top"):
        p = sub.add_parser(verb, help="overview: counts by phase, oldest held, past their "
                           "end, recent Failed" + (" (same as ls)" if verb == "top" else ""))
        common(p)
        p.add_argument("-l", "--selector", type=checks.selector, default=None,
                       help="label selector, as for kubectl (e.g. team=batch,tier!=dev)")
        p.add_argument("-A", "--all-namespaces", action="store_true")
        p.add_argument("--top", type=checks.count, default=5, metavar="N",
                       help="how many leases each list shows (counts are always complete)")
        p.set_defaults(func=verbs.ls)
    describe = sub.add_parser("describe", help="one JobLease in detail, with its last Events")
    common(describe)
    describe.add_argument("name", type=checks.lease_name)
    describe.add_argument("--events", type=checks.count, default=10, metavar="N",
                          help="how many of the latest Events to show")
    describe.set_defaults(func=verbs.describe)
    completion = sub.add_parser("completion", help="print a shell completion script",
                                description="Print a completion script; e.g. "
                                "`source <(joblease completion bash)`, or for zsh "
                                "`source <(joblease completion zsh)` in ~/.zshrc.")
    completion.add_argument("shell", choices=["bash", "zsh"])
    completion.set_defaults(func=verbs.completion, parser=build_parser)  # no import back


