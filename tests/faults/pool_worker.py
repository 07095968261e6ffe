"""``joblease work`` with every lease operation recorded: the pool chaos test's worker process.

Run as ``python -m tests.faults.pool_worker HISTORY_DIR PROCESS -- <joblease work arguments>``.
It is the real CLI (``joblease.cli.main``) in a real process; the only addition is a
recording wrapper around the SDK's four lease operations (``LeaseClient.claim``,
``Lease.renew``, ``Lease.complete``, ``Lease.release``), installed on the classes before the
CLI starts, so whatever calls them — the pool's ``claim_next``, the runner's ``Holding``, the
drain — lands in ``HISTORY_DIR/PROCESS.jsonl`` in the format of ``docs/history-format.md``.

Two outcomes are recorded as what they are rather than as the exception they arrive as:

* ``Lease.release`` raising ``LeaseFinishedError`` means the release *happened* and used the
  last of ``maxAttempts``: recorded ``ok`` with ``phase: Failed``;
* a claim whose decision found the last attempt used up wrote Failed: recorded as a
  refusal with reason ``finished`` (which is how ``LeaseClient.claim`` reports it);
* a claim raising ``LeaseNotReadyError`` (the backoff has not ended) is a
  refusal with reason ``not-ready``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from joblease.domain.errors import LeaseFinishedError, LeaseNotReadyError
from joblease.domain.lease import dispatched_claim
from joblease.kube.api import ConflictError
from joblease.sdk.client import Lease, LeaseClient

from .history import OK, REFUSED, Recorder
from .worker import classify, ms


def _bounds_of(client: LeaseClient) -> Callable[[], tuple[float, float]]:
    def bounds() -> tuple[float, float]:
        now = client.api.server_now()
        return now.earliest.timestamp() * 1000.0, now.latest.timestamp() * 1000.0
    return bounds


def install(rec: Recorder) -> None:
    """Wrap the SDK's lease operations so that each is recorded in ``rec``.

    Claims are recorded at ``LeaseClient.claim``, the one public step that both direct
    claims and the pool's ``claim_next`` go through (``joblease.core.claiming``).
    """
    original_init = LeaseClient.__init__
    original_claim = LeaseClient.claim

    @functools.wraps(original_init)
    def init(self: LeaseClient, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if rec.server_now is None:
            rec.server_now = _bounds_of(self)

    @functools.wraps(original_claim)
    def claim(self: LeaseClient, name: str, holder: str | None = None, **kwargs: Any) -> Lease:
        proposed = dispatched_claim(kwargs.get("claim_id"))  # made on a dispatcher's proposal
        op = rec.invoke("claim", name, holder=self.resolve_holder(holder),
                        **({"proposed": True} if proposed else {}))
        try:
            lease = original_claim(self, name, holder, **kwargs)
        except LeaseNotReadyError as err:
            rec.complete(op, REFUSED, reason="not-ready", error=type(err).__name__)
            raise
        except LeaseFinishedError as err:
            if err.written is not None:  # the expired holder's attempt was the last: Failed
                rec.complete(op, REFUSED, reason="finished", error="LeaseFinishedError",
                             message=str(err)[:300])
            else:
                _record_error(rec, op, err)
            raise
        except ConflictError as err:  # a 409: certainly not applied
            rec.complete(op, REFUSED, reason="contention", error=type(err).__name__)
            raise
        except BaseException as err:
            _record_error(rec, op, err)
            raise
        observed = lease.observed
        assert observed is not None
        st = observed.status
        rec.complete(op, OK, generation=st.generation, epoch=st.epoch,
                     lease_until=ms(st.lease_until), holder=st.holder)
        return lease

    LeaseClient.__init__ = init  # type: ignore[method-assign]
    LeaseClient.claim = claim  # type: ignore[method-assign]
    for verb in ("renew", "complete", "release"):
        setattr(Lease, verb, _recorded(rec, verb, getattr(Lease, verb)))


def _recorded(rec: Recorder, verb: str, action: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(action)
    def wrapper(self: Lease, *args: Any, **kwargs: Any) -> None:
        extra = {"failed": bool(kwargs.get("failed", args[0] if args else False))} \
            if verb == "release" else {}
        op = rec.invoke(verb, self.name, holder=self.holder, generation=self.generation,
                        epoch=self.token.epoch, **extra)
        try:
            action(self, *args, **kwargs)
        except LeaseFinishedError as err:
            if verb == "release":  # the failed release used the last attempt: it happened
                rec.complete(op, OK, generation=self.generation, phase="Failed")
            else:
                _record_error(rec, op, err)
            raise
        except BaseException as err:
            _record_error(rec, op, err)
            raise
        if verb == "release":  # a retried failed release may have ended it Failed, silently
            observed = self.observed
            phase = observed.status.phase.value if observed is not None else "Available"
            rec.complete(op, OK, generation=self.generation, phase=phase)
        else:
            rec.complete(op, OK, generation=self.generation, lease_until=ms(self.lease_until))
    return wrapper


def _record_error(rec: Recorder, op: str, err: BaseException) -> None:
    status, fields = classify(err)
    rec.complete(op, status, **fields)


def main(argv: list[str]) -> int:
    history, process, rest = Path(argv[0]), argv[1], argv[2:]
    rec = Recorder(history / f"{process}.jsonl", process)
    install(rec)
    from joblease.cli import main as cli_main
    return cli_main(rest[1:] if rest[:1] == ["--"] else rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
