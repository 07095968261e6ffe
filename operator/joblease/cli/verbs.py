"""What each ``joblease`` verb does: read its arguments, call the SDK or an engine, print.

The engines live below the CLI, as libraries (``joblease.engines``): ``runner`` (``run``: one
command under one lease) and ``worker_pool`` (``work``: a pool worker). Each verb imports
what it uses when it runs, so ``--help`` and ``completion`` stay cheap.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from joblease.cli.exits import EXIT_LOST, EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from joblease.domain.lease import Observed
    from joblease.sdk.client import LeaseClient


def _client(args: argparse.Namespace, *, calibrate: bool, one_shot: bool = True
            ) -> LeaseClient:
    """A LeaseClient for one verb; ``calibrate`` says whether it needs a tight clock bound.

    ``one_shot`` verbs (all but ``run``) talk through ``joblease.kube.lite`` when the
    kubeconfig holds static credentials: importing the ``kubernetes`` package would cost
    more than the rest of the call. ``work`` does too, for the same reason: a pool's
    workers are started by the dozen, and the import was most of a worker's start-up CPU
    (issue 30). ``run`` holds a lease for long and keeps the full client.

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


def claim(args: argparse.Namespace) -> int:
    """``claim NAME``: claim once (or wait ``--wait``); print the token and claim id."""
    from joblease.engines.runner import held_token
    client = _client(args, calibrate=False)
    lease = client.wait_claim(args.name, args.holder, timeout=args.wait,
                              retry_unavailable=max(args.wait, 10.0))
    fields = held_token(lease).to_json()
    _print(args, fields,
           f"claimed {lease.namespace}/{lease.name} for {lease.holder!r}: token {lease.token} "
           f"(epoch {lease.token.epoch}, generation {lease.token.generation}) until "
           f"{fields['leaseUntil'] or '?'}, claim id {lease.claim_id}")
    return EXIT_OK


def held(args: argparse.Namespace) -> int:
    """``renew``/``complete``/``release NAME``: act on a claim made elsewhere (holder + token)."""
    from joblease.domain.token import FencingToken
    if args.token is None and (args.epoch is None or args.generation is None):
        print(f"joblease {args.verb}: give the whole token: --token EPOCH/GENERATION (as "
              "printed by claim), or --epoch and --generation; a generation alone could "
              "match another incarnation of the JobLease", file=sys.stderr)
        return EXIT_USAGE
    if args.token is not None and (args.epoch is not None or args.generation is not None):
        print(f"joblease {args.verb}: give the token once: --token EPOCH/GENERATION, or "
              "--epoch and --generation, not both", file=sys.stderr)
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


def get(args: argparse.Namespace) -> int:
    """``get NAME``: one JobLease's status."""
    from joblease.domain.time import format_time
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


def run(args: argparse.Namespace) -> int:
    """``run --lease NAME -- CMD``: one command under one lease (``joblease.engines.runner``)."""
    from joblease.engines.runner import run_under_lease
    command = _command(args, "joblease run --lease NAME -- CMD ARGS…")
    if not command:
        return EXIT_USAGE
    client = _client(args, calibrate=True, one_shot=False)
    lease = client.wait_claim(args.lease, args.holder, timeout=args.wait,
                              retry_unavailable=max(args.wait, 10.0))
    print(f"joblease run: holding {lease.namespace}/{lease.name} as {lease.holder!r} with "
          f"token {lease.token}", file=sys.stderr, flush=True)
    result = run_under_lease(lease, command, grace=args.grace)
    if result.lost:
        return EXIT_LOST
    return result.child_exit


def work(args: argparse.Namespace) -> int:
    """``work -l SELECTOR -- CMD``: a pool worker (``joblease.engines.worker_pool``)."""
    import signal

    from joblease.domain.lease import Phase
    from joblease.engines.worker_pool import WorkOptions, WorkPool
    command = _command(args, "joblease work -l SELECTOR -- CMD ARGS…")
    if not command:
        return EXIT_USAGE
    client = _client(args, calibrate=True)  # light: see _client
    client.calibrate()  # once, before the first claim, rather than in the first slot's claim
    pool = client.pool(args.selector, slots=args.concurrency)  # a dispatcher may give work
    options = WorkOptions(command, concurrency=args.concurrency, until_empty=args.until_empty,
                          drain_timeout=args.drain_timeout, grace=args.grace,
                          holder=args.holder, progress_every=args.progress_every)

    def count_failed() -> int:  # the Failed ones only, selected by the server
        return client.count(args.selector, phase=Phase.FAILED)

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


def ls(args: argparse.Namespace) -> int:
    """``ls``/``top``: an overview of the JobLeases of a selector (``view.overview``)."""
    from joblease.cli import view as cli_view
    client = _client(args, calibrate=False)
    objects = client.list_objects(args.selector, all_namespaces=args.all_namespaces)
    data = cli_view.overview(objects, client.server_now(), top=args.top,
                             selector=args.selector,
                             namespace=None if args.all_namespaces else args.namespace)
    _print(args, data, cli_view.render_overview(data))
    return EXIT_OK


def describe(args: argparse.Namespace) -> int:
    """``describe NAME``: one JobLease in detail, with its last Events."""
    from joblease.cli import view as cli_view
    from joblease.domain.lease import Observed
    client = _client(args, calibrate=False)
    raw = client.get_object(args.name)
    events = client.events(Observed.from_object(raw))
    data = cli_view.describe(raw, events, client.server_now(), last_events=args.events)
    _print(args, data, cli_view.render_describe(data))
    return EXIT_OK


def completion(args: argparse.Namespace) -> int:
    """``completion bash|zsh``: print a shell completion script."""
    from joblease.cli.completion import completion_script
    print(completion_script(args.parser(), args.shell), end="")
    return EXIT_OK


def _status_dict(obs: Observed) -> dict[str, Any]:
    return {"name": obs.name, "namespace": obs.namespace, **obs.status.to_dict()}


def _print(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    print(json.dumps(data, indent=2) if args.output == "json" else text, flush=True)


