"""The ``joblease`` command (also installed as ``kubectl-joblease``, so ``kubectl joblease …``).

Exit codes (stable, for scripts):
    0  success
    1  unexpected error
    2  usage error
    3  the lease is unavailable: held by someone else, or finished (claim refused)
    4  the lease is lost: stale generation or expired (renew/complete/release refused),
       or, for ``run``, lost while the command ran (the command was stopped)
    5  no such JobLease
    6  the API server refused or could not be reached (RBAC, validation, network)

``work`` (a pool worker) exits 0 when drained cleanly or, with ``--until-empty``, when
nothing unfinished is left; 7 if then some JobLeases of the selector are Failed; 8 if its
drain timed out and running commands were stopped (their leases released); 6 as above.
A job's command failing is not the worker's failure: the job is released as failed and
retried (see docs/pools.md).
"""

# Startup time is most of a CLI call (issue 18): this module imports only the standard
# library at the top. Each verb imports what it uses, the operator's code (kopf,
# prometheus_client) is imported only by `joblease operator`, and `--help`/`completion`
# touch neither the SDK nor the Kubernetes client. tests/unit/test_cli_imports.py keeps it so.

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from joblease.domain.lease import Observed
    from joblease.sdk.client import LeaseClient

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_LOST, EXIT_NOT_FOUND, EXIT_API = range(7)


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every subcommand registered."""
    parser = argparse.ArgumentParser(prog="joblease", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    _register_lease_commands(sub)
    _register_views(sub)
    _register_operator(sub)
    return parser


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG or in-cluster")
    p.add_argument("--context", default=None)
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")


def _held(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="the JobLease (job id)")
    p.add_argument("--holder", required=True, help="identity that holds the lease")
    p.add_argument("--token", type=_token, default=None, metavar="EPOCH/GENERATION",
                   help="the fencing token printed by claim (or give --epoch and --generation)")
    p.add_argument("--epoch", type=int, default=None, help="the token's epoch")
    p.add_argument("--generation", type=int, default=None, help="the token's generation")
    p.add_argument("--claim-id", default=None,
                   help="the claim id printed by claim (recommended: tells apart holders "
                        "that share a name)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                   help="how long to retry an API server that does not answer")


def _token(text: str) -> Any:
    from joblease.domain.token import FencingToken
    try:
        return FencingToken.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _register_lease_commands(sub: Any) -> None:
    claim = sub.add_parser("claim", help="claim a JobLease; prints its token")
    _common(claim)
    claim.add_argument("name")
    claim.add_argument("--holder", default=None,
                       help="default: $JOBLEASE_HOLDER or HOSTNAME-PID; '@identity' = your "
                            "Kubernetes username (needed under the holder-only policy)")
    claim.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                       help="wait up to SECONDS while someone else holds it")
    claim.set_defaults(func=_cmd_claim)
    for verb in ("renew", "complete", "release"):
        p = sub.add_parser(verb, help=f"{verb} a JobLease you hold (needs holder + token)")
        _common(p)
        _held(p)
        if verb == "complete":
            p.add_argument("--result", default="", help="short result to record")
        if verb == "release":
            p.add_argument("--failed", action="store_true", help="count it as a failed attempt")
        p.set_defaults(func=_cmd_held, verb=verb)
    get = sub.add_parser("get", help="show a JobLease's status")
    _common(get)
    get.add_argument("name")
    get.set_defaults(func=_cmd_get)
    run = sub.add_parser("run", help="run a command while holding a lease",
                         description="Claim, run CMD with the token in its environment, renew "
                         "while it runs, stop it if the lease is lost; complete on exit 0.")
    _common(run)
    run.add_argument("--lease", required=True, help="the JobLease (job id)")
    run.add_argument("--holder", default=None, help="as for claim ('@identity' allowed)")
    run.add_argument("--wait", type=float, default=0.0, metavar="SECONDS")
    run.add_argument("--grace", type=float, default=5.0,
                     help="seconds between SIGTERM and SIGKILL when the lease is lost")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS…")
    run.set_defaults(func=_cmd_run)
    _register_work(sub)


def _register_work(sub: Any) -> None:
    work = sub.add_parser(
        "work", help="pool worker: run a command once per claimed job of a selector",
        description="Claim the next job of the selector (priority, then oldest first), run "
        "CMD under its lease exactly as `run` does, K at a time; SIGTERM drains. "
        "See docs/pools.md.")
    _common(work)
    work.add_argument("-l", "--selector", required=True,
                      help="label selector of the pool's JobLeases (e.g. batch=nightly)")
    work.add_argument("-c", "--concurrency", type=_positive_int, default=1, metavar="K",
                      help="commands running at once (default 1)")
    work.add_argument("--until-empty", action="store_true",
                      help="exit once nothing unfinished is left in the selector")
    work.add_argument("--holder", default=None, help="as for claim ('@identity' allowed)")
    work.add_argument("--grace", type=float, default=5.0,
                      help="seconds between SIGTERM and SIGKILL when a command must stop")
    work.add_argument("--drain-timeout", type=float, default=30.0, metavar="SECONDS",
                      help="after SIGTERM/SIGINT, how long running commands may finish "
                           "before they are stopped and their leases released (default 30)")
    work.add_argument("--progress-every", type=float, default=5.0, metavar="SECONDS",
                      help="seconds between progress lines on stderr (also one per job end)")
    work.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS…")
    work.set_defaults(func=_cmd_work)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


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
        _common(p)
        p.add_argument("-l", "--selector", default=None,
                       help="label selector, as for kubectl (e.g. team=batch,tier!=dev)")
        p.add_argument("-A", "--all-namespaces", action="store_true")
        p.add_argument("--top", type=int, default=5, metavar="N",
                       help="how many leases each list shows (counts are always complete)")
        p.set_defaults(func=_cmd_ls)
    describe = sub.add_parser("describe", help="one JobLease in detail, with its last Events")
    _common(describe)
    describe.add_argument("name")
    describe.add_argument("--events", type=int, default=10, metavar="N",
                          help="how many of the latest Events to show")
    describe.set_defaults(func=_cmd_describe)
    completion = sub.add_parser("completion", help="print a shell completion script",
                                description="Print a completion script; e.g. "
                                "`source <(joblease completion bash)`, or for zsh "
                                "`source <(joblease completion zsh)` in ~/.zshrc.")
    completion.add_argument("shell", choices=["bash", "zsh"])
    completion.set_defaults(func=_cmd_completion)


def _client(args: argparse.Namespace, *, calibrate: bool, one_shot: bool = True
            ) -> LeaseClient:
    """A LeaseClient for one verb; ``calibrate`` says whether it needs a tight clock bound.

    ``one_shot`` verbs (all but ``run``) talk through ``joblease.kube.lite`` when the
    kubeconfig holds static credentials: importing the ``kubernetes`` package would cost
    more than the rest of the call. ``run`` holds a lease for long and keeps the full client.

    Calibration narrows the server-clock error from about half a second (one ``Date``
    header of one-second resolution) to milliseconds, at the cost of up to a second of
    polling. Who needs it:

    * ``get``, ``ls``, ``describe`` only display; their clock error is printed.
    * ``claim`` waits until ``leaseUntil + margin`` has *certainly* passed, where the
      margin includes the error bound: a wider bound only makes a takeover of an expired
      lease wait up to about a second longer, never happen early. A fresh lease
      (Available, released) is claimed at once either way.
    * ``renew``, ``complete`` and ``release`` keep it: they are refused once the server
      clock may have reached ``leaseUntil - margin``, and a wide bound would turn a
      late-but-valid completion into a refusal.
    * ``run`` keeps it: its command holds the lease for long, and a wide bound would
      shorten every renewal period (it is one second, once).
    """
    from joblease.sdk.client import LeaseClient
    if one_shot:
        from joblease.kube.lite import connect
        return LeaseClient(args.namespace, api=connect(args.kubeconfig, args.context),
                           calibrate=calibrate)
    return LeaseClient(args.namespace, kubeconfig=args.kubeconfig, context=args.context,
                       calibrate=calibrate)


def _cmd_claim(args: argparse.Namespace) -> int:
    from joblease.domain.errors import format_time
    client = _client(args, calibrate=False)
    lease = client.wait_claim(args.name, args.holder, timeout=args.wait,
                              retry_unavailable=max(args.wait, 10.0))
    _print(args, {"name": lease.name, "namespace": lease.namespace, "holder": lease.holder,
                  "generation": lease.token.generation, "epoch": lease.token.epoch,
                  "token": str(lease.token), "claimId": lease.claim_id,
                  "leaseUntil": format_time(lease.lease_until) if lease.lease_until else None},
           f"claimed {lease.namespace}/{lease.name} for {lease.holder!r}: generation "
           f"{lease.token.generation} (token {lease.token}) until "
           f"{format_time(lease.lease_until) if lease.lease_until else '?'}, claim id "
           f"{lease.claim_id}")
    return EXIT_OK


def _cmd_held(args: argparse.Namespace) -> int:
    from joblease.domain.token import FencingToken
    if args.token is None and (args.epoch is None or args.generation is None):
        print(f"joblease {args.verb}: give the whole token: --token EPOCH/GENERATION (as "
              "printed by claim), or --epoch and --generation; a generation alone could "
              "match another incarnation of the JobLease", file=sys.stderr)
        return EXIT_USAGE
    token = args.token or FencingToken(args.epoch, args.generation)
    client = _client(args, calibrate=True)
    lease = client.resume(args.name, args.holder, token, args.claim_id)
    act = {"renew": lease.renew, "complete": lambda: lease.complete(args.result),
           "release": lambda: lease.release(failed=args.failed)}[args.verb]
    _retry_unavailable(act, args.timeout)
    obs = client.get(args.name)
    _print(args, _status_dict(obs),
           f"{args.verb} of {args.namespace}/{args.name} with token {token}: ok "
           f"(phase {obs.status.phase.value})")
    return EXIT_OK


def _retry_unavailable(action: Any, seconds: float) -> None:
    """Run ``action``, retrying while the API server does not answer.

    Safe: every retry is decided again from a fresh read and recognises its own earlier
    write (a completion whose answer was lost is reported done, not refused).
    """
    import time

    from joblease.kube.api import UnavailableError
    deadline = time.monotonic() + seconds
    while True:
        try:
            action()
            return
        except UnavailableError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


def _cmd_get(args: argparse.Namespace) -> int:
    from joblease.domain.errors import format_time
    obs = _client(args, calibrate=False).get(args.name)
    st = obs.status
    _print(args, _status_dict(obs),
           f"{obs.namespace}/{obs.name}: phase {st.phase.value}, holder {st.holder or '-'}, "
           f"generation {st.generation}, token {st.token()}, leaseUntil "
           f"{format_time(st.lease_until) if st.lease_until else '-'}, attempts {st.attempts}")
    return EXIT_OK


def _command(args: argparse.Namespace, usage: str) -> list[str]:
    """The command after ``--`` (``run`` and ``work``); empty after printing the usage."""
    command: list[str] = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        print(f"joblease {args.command}: no command given (use: {usage})", file=sys.stderr)
    return command


def _cmd_run(args: argparse.Namespace) -> int:
    from joblease.runner import run_under_lease
    command = _command(args, "joblease run --lease NAME -- CMD ARGS…")
    if not command:
        return EXIT_USAGE
    client = _client(args, calibrate=True, one_shot=False)
    lease = client.wait_claim(args.lease, args.holder, timeout=args.wait,
                              retry_unavailable=max(args.wait, 10.0))
    print(f"joblease run: holding {lease.namespace}/{lease.name} as {lease.holder!r} at "
          f"generation {lease.token.generation}", file=sys.stderr, flush=True)
    result = run_under_lease(lease, command, grace=args.grace)
    if result.lost:
        return EXIT_LOST
    return result.child_exit


def _cmd_work(args: argparse.Namespace) -> int:
    import signal

    from joblease.worker_pool import WorkOptions, WorkPool
    command = _command(args, "joblease work -l SELECTOR -- CMD ARGS…")
    if not command:
        return EXIT_USAGE
    client = _client(args, calibrate=True, one_shot=False)
    client.calibrate()  # once, before the first claim, rather than in the first slot's claim
    pool = client.pool(args.selector)
    options = WorkOptions(command, concurrency=args.concurrency, until_empty=args.until_empty,
                          drain_timeout=args.drain_timeout, grace=args.grace,
                          holder=args.holder, progress_every=args.progress_every)

    def count_failed() -> int:
        objects = client.store.list_objects(args.namespace, args.selector)
        return sum(1 for obj in objects if (obj.get("status") or {}).get("phase") == "Failed")

    worker = WorkPool(pool, options, count_failed=count_failed)
    previous = {sig: signal.signal(sig, lambda _s, _f: worker.drain())
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return worker.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        pool.close()
        client.close()


def _cmd_ls(args: argparse.Namespace) -> int:
    from joblease import cli_view
    client = _client(args, calibrate=False)
    namespace = None if args.all_namespaces else args.namespace
    objects = client.store.list_objects(namespace, args.selector)
    data = cli_view.overview(objects, client.api.server_now(), top=args.top,
                             selector=args.selector, namespace=namespace)
    _print(args, data, cli_view.render_overview(data))
    return EXIT_OK


def _cmd_describe(args: argparse.Namespace) -> int:
    from joblease import cli_view
    from joblease.domain.errors import LeaseNotFoundError
    from joblease.domain.lease import Observed
    from joblease.kube.api import NotFoundError
    from joblease.kube.leases import lease_path
    client = _client(args, calibrate=False)
    try:
        raw = client.api.request("GET", lease_path(args.namespace, args.name)).body
    except NotFoundError as err:
        raise LeaseNotFoundError(args.name, args.namespace) from err
    events = client.store.events_for(Observed.from_object(raw))
    data = cli_view.describe(raw, events, client.api.server_now(), last_events=args.events)
    _print(args, data, cli_view.render_describe(data))
    return EXIT_OK


def _cmd_completion(args: argparse.Namespace) -> int:
    from joblease import cli_view
    print(cli_view.completion_script(build_parser(), args.shell), end="")
    return EXIT_OK


def _status_dict(obs: Observed) -> dict[str, Any]:
    return {"name": obs.name, "namespace": obs.namespace, **obs.status.to_dict()}


def _print(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    print(json.dumps(data, indent=2) if args.output == "json" else text, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (see the module doc)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["operator"]:
        from joblease.controller.main import main as operator_main
        return operator_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.func is _cmd_completion:  # needs neither the SDK nor its error classes
        return int(args.func(args))
    from joblease.domain.errors import (
        LeaseError,
        LeaseLostError,
        LeaseNotFoundError,
        LeaseUnavailableError,
    )
    from joblease.kube.api import ApiError
    try:
        code: int = args.func(args)
    except LeaseNotFoundError as err:
        return _fail(err, EXIT_NOT_FOUND)
    except LeaseUnavailableError as err:
        return _fail(err, EXIT_UNAVAILABLE)
    except LeaseLostError as err:
        return _fail(err, EXIT_LOST)
    except LeaseError as err:
        return _fail(err, EXIT_ERROR)
    except ApiError as err:
        return _fail(err, EXIT_API)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `joblease ls | head`: the reader left; say nothing more (as kubectl does), and
        # keep the interpreter from complaining again while it flushes stdout on exit
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    return code


def _fail(err: Exception, code: int) -> int:
    print(f"joblease: {err}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
