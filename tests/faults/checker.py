"""Our own checker of a run's history (pure: operations in, violations out).

Properties, per JobLease (``docs/history-format.md`` gives the record they read):

* ``token-order``: tokens strictly increase per job: no two acknowledged claims share a
  token, and a claim that started after another one returned got a higher token.
* ``overlap``: no two holders' validity windows overlap on the server's clock: a claim of
  generation g+1 that was not preceded by the release/completion of g must have happened,
  on the server's clock, at or after the end of g's window (the largest ``leaseUntil``
  acknowledged to g's holder before the claim returned). A claim a dispatcher made *for*
  g's holder (issue 30; ``args.assign``) acknowledges no window to it: its window starts
  with its adoption (its first acknowledged renew), so a dispatcher taking back an
  assignment never adopted (it never ran) overlaps nothing.
* ``used-past-expiry``: no renew/complete/release is acknowledged to a holder whose window
  had ended, on the server's clock, before the operation started.
* ``target-order``: the fenced target never accepts a token lower than one it has accepted.
* ``stale-accepted``: no renew, complete or release is acknowledged for a generation after a
  higher generation's claim had returned.
* ``reopened``: no claim is acknowledged after an acknowledged completion, or after a
  release acknowledged as having ended the lease Failed (``maxAttempts`` used up).
* ``completion-lost``: the final state read from the API server shows every acknowledged
  completion (same generation and holder) and a generation at least as high as every
  acknowledged claim.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from .history import Op

KINDS = ("token-order", "overlap", "used-past-expiry", "target-order", "stale-accepted",
         "reopened", "completion-lost")


@dataclass(frozen=True)
class Violation:
    """One broken property, with the operations that show it."""

    kind: str
    lease: str
    message: str
    ops: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"[{self.kind}] {self.lease}: {self.message} ({', '.join(self.ops)})"


def before(a: Op, b: Op) -> bool:
    """``a`` returned before ``b`` was invoked (real time, one machine's monotonic clock)."""
    return a.ret_ns is not None and a.ret_ns < b.call_ns


def token_of(op: Op) -> tuple[int, int]:
    """The token an operation acted with or obtained: ``(epoch, generation)``."""
    if op.op == "write":
        e, g = op.args["token"]
        return int(e), int(g)
    if op.op == "claim":
        return int(op.result.get("epoch") or 0), int(op.result["generation"])
    return int(op.args.get("epoch") or 0), int(op.args["generation"])


def check(ops: Iterable[Op]) -> list[Violation]:
    """Return every violation found in the history (empty: all properties hold)."""
    by_lease: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        by_lease[op.lease].append(op)
    found: list[Violation] = []
    for lease, lease_ops in sorted(by_lease.items()):
        lease_ops.sort(key=lambda o: (o.call_ns, o.id))
        found += _check_lease(lease, lease_ops)
    return found


def _check_lease(lease: str, ops: list[Op]) -> list[Violation]:
    out: list[Violation] = []
    claims = [o for o in ops if o.op == "claim" and o.ok]
    held_ops = [o for o in ops if o.op in ("renew", "complete", "release")]
    writes = [o for o in ops if o.op == "write" and o.ok]
    completes = [o for o in ops if o.op == "complete" and o.ok]
    failed_releases = [o for o in ops if o.op == "release" and o.ok
                       and o.result.get("phase") == "Failed"]

    # token-order
    seen: dict[tuple[int, int], Op] = {}
    for c in claims:
        tok = token_of(c)
        if tok in seen:
            out.append(Violation("token-order", lease, f"token {tok} handed out twice",
                                 (seen[tok].id, c.id)))
        seen.setdefault(tok, c)
    for a in claims:
        for b in claims:
            if before(a, b) and token_of(b) <= token_of(a):
                out.append(Violation("token-order", lease, f"claim returned {token_of(b)} "
                                     f"after a claim had returned {token_of(a)}", (a.id, b.id)))

    # overlap and used-past-expiry
    by_gen: dict[tuple[int, int], list[Op]] = defaultdict(list)
    for o in held_ops:
        by_gen[token_of(o)].append(o)
    claim_of = {token_of(c): c for c in claims}
    for c in claims:
        epoch, gen = token_of(c)
        prev_claim = claim_of.get((epoch, gen - 1))
        if prev_claim is None:
            continue
        prev_ops = by_gen.get((epoch, gen - 1), [])
        ended = any(o.op in ("release", "complete") and o.ok and o.call_ns < (c.ret_ns or 0)
                    for o in prev_ops)
        if ended:
            continue
        given = [] if prev_claim.args.get("assign") else [prev_claim]  # the holder's window
        until = [float(o.result["lease_until"]) for o in [*given, *prev_ops]
                 if o.ok and o.op in ("claim", "renew") and o.result.get("lease_until")
                 and o.call_ns < (c.ret_ns or 0)]
        if until and c.server_hi is not None and c.server_hi < max(until):
            out.append(Violation(
                "overlap", lease, f"generation {gen} claimed by {c.args.get('holder')!r} "
                f"by server time {c.server_hi:.0f} ms, before generation {gen - 1}'s window "
                f"ended at {max(until):.0f} ms", (prev_claim.id, c.id)))
    for tok, gen_ops in by_gen.items():
        start = claim_of.get(tok)
        if start is None:
            continue
        windows = [start, *[o for o in gen_ops if o.op == "renew" and o.ok]]
        for o in gen_ops:
            if not o.ok or o.server_lo is None:
                continue
            known = [float(w.result["lease_until"]) for w in windows
                     if w is not o and before(w, o) and w.result.get("lease_until")]
            if known and o.server_lo >= max(known):
                out.append(Violation(
                    "used-past-expiry", lease, f"{o.op} of generation {tok[1]} acknowledged "
                    f"although it started at server time >= {o.server_lo:.0f} ms, after the "
                    f"window's end {max(known):.0f} ms", (o.id,)))

    # stale-accepted
    for o in held_ops:
        if not o.ok:
            continue
        newer = [c for c in claims if token_of(c) > token_of(o) and before(c, o)]
        if newer:
            out.append(Violation(
                "stale-accepted", lease, f"{o.op} by {o.args.get('holder')!r} at generation "
                f"{token_of(o)[1]} acknowledged after generation {token_of(newer[0])[1]} was "
                "claimed", (newer[0].id, o.id)))

    # reopened
    for done in [*completes, *failed_releases]:
        how = "completion" if done.op == "complete" else "failed release"
        for c in claims:
            if before(done, c):
                out.append(Violation("reopened", lease, f"claim of generation "
                                     f"{token_of(c)[1]} after {how} of generation "
                                     f"{token_of(done)[1]}", (done.id, c.id)))

    # target-order
    for a in writes:
        for b in writes:
            if before(a, b) and token_of(b) < token_of(a):
                out.append(Violation("target-order", lease, f"target accepted {token_of(b)} "
                                     f"after it had accepted {token_of(a)}", (a.id, b.id)))

    # completion-lost (against the final read from the API server)
    reads = [o for o in ops if o.op == "read" and o.ok]
    if reads:
        final = max(reads, key=lambda o: o.call_ns)
        st = final.result
        record = st.get("completion") or {}
        for done in completes:
            if not before(done, final):
                continue
            if st.get("phase") != "Completed" or (
                    int(record.get("generation", -1)) != token_of(done)[1]
                    or record.get("holder") != done.args.get("holder")):
                out.append(Violation(
                    "completion-lost", lease, f"completion of generation {token_of(done)[1]} "
                    f"by {done.args.get('holder')!r} was acknowledged, but the final state is "
                    f"{st.get('phase')} with completion {record or None}", (done.id, final.id)))
        top = max((token_of(c)[1] for c in claims if before(c, final)), default=0)
        if int(st.get("generation", 0)) < top:
            out.append(Violation("completion-lost", lease, f"final generation "
                                 f"{st.get('generation')} is below acknowledged claim {top}",
                                 (final.id,)))
    return out


def count_by_kind(violations: Iterable[Violation]) -> dict[str, int]:
    """How many violations of each kind."""
    counts: dict[str, int] = defaultdict(int)
    for v in violations:
        counts[v.kind] += 1
    return dict(counts)
