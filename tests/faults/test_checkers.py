"""Both checkers on hand-made histories: good ones pass, each kind of broken one fails.

Our checker is pure (marked unit); Porcupine runs its real Go binary on the same histories
(built once, seconds), so the two are shown to agree on every case.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from . import porcupine
from .checker import check
from .history import Op, Recorder, load, merge, write_merged

E = 77  # epoch of the hand-made lease
L = "job"


class H:
    """A hand-made history with a shared fake monotonic clock (1 tick = 1 ms)."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._ids = itertools.count(1)

    def op(self, proc: str, op: str, call: int, ret: int | None, status: str = "ok",
           lo: float | None = None, hi: float | None = None, args: dict[str, Any] | None = None,
           **kw: Any) -> Op:
        args = args or {"holder": proc}
        result = {"status": status, **kw}
        o = Op(f"{proc}:{next(self._ids)}", proc, op, L, args, call * 1_000_000,
               lo, None if ret is None else ret * 1_000_000, hi, result)
        self.ops.append(o)
        return o

    def claim(self, who: str, call: int, ret: int, gen: int, until: float, hi: float,
              **kw: Any) -> Op:
        return self.op(who, "claim", call, ret, generation=gen, epoch=E,
                       lease_until=until, lo=hi - 5, hi=hi, **kw)

    def held(self, who: str, op: str, call: int, ret: int, gen: int, lo: float,
             status: str = "ok", **kw: Any) -> Op:
        return self.op(who, op, call, ret, status, lo=lo, hi=lo + 5,
                       args={"holder": who, "generation": gen, "epoch": E}, **kw)

    def write(self, who: str, call: int, ret: int, gen: int, status: str = "ok",
              **kw: Any) -> Op:
        return self.op(who, "write", call, ret, status, args={"holder": who, "token": [E, gen]},
                       **kw)

    def read(self, call: int, phase: str, gen: int, comp: tuple[int, str] | None = None,
             holder: str | None = None) -> Op:
        completion = {"generation": comp[0], "holder": comp[1]} if comp else None
        return self.op("harness", "read", call, call + 1, args={}, phase=phase, generation=gen,
                       holder=holder, completion=completion, epoch=E)


def good_complete() -> H:
    h = H()
    h.claim("a", 0, 10, 1, until=10_000, hi=1_000)
    h.held("a", "renew", 20, 30, 1, lo=2_000, lease_until=12_000)
    h.write("a", 40, 50, 1)
    h.held("a", "complete", 60, 70, 1, lo=3_000)
    h.op("b", "claim", 80, 90, "refused", reason="finished")
    h.read(100, "Completed", 1, (1, "a"), "a")
    return h


def good_takeover() -> H:
    h = H()
    h.claim("a", 0, 10, 1, until=10_000, hi=1_000)
    h.write("a", 20, 30, 1)
    h.op("b", "claim", 40, 50, "refused", reason="held")
    h.claim("b", 60, 70, 2, until=21_000, hi=10_600)  # after a's window on the server clock
    h.write("b", 80, 90, 2)
    h.held("a", "renew", 100, 110, 1, status="refused", lo=10_700, reason="stale")
    h.write("a", 120, 130, 1, status="refused", reason="stale")
    h.held("a", "complete", 140, 150, 1, status="refused", lo=10_800, reason="stale")
    h.held("b", "complete", 160, 170, 2, lo=11_000)
    h.read(180, "Completed", 2, (2, "b"), "b")
    return h


def good_unknown() -> H:
    """A claim whose answer never came (the process was killed): either outcome is fine."""
    h = H()
    h.claim("a", 0, 10, 1, until=10_000, hi=1_000)
    h.held("a", "release", 20, 30, 1, lo=1_500)
    h.op("c", "claim", 35, None, "unknown")
    h.claim("b", 40, 50, 3, until=22_000, hi=12_000)
    h.held("b", "complete", 60, 70, 3, lo=12_500)
    h.read(80, "Completed", 3, (3, "b"), "b")
    return h


def good_failed() -> H:
    """A pool job: a failed release uses the last attempt; later claims are refused."""
    h = H()
    h.claim("a", 0, 10, 1, until=10_000, hi=1_000)
    h.write("a", 20, 30, 1)
    h.held("a", "release", 40, 50, 1, lo=2_000, phase="Failed")
    h.op("b", "claim", 60, 70, "refused", reason="finished")
    h.read(80, "Failed", 1, None, None)
    return h


def good_expired_failed() -> H:
    """A killed holder's expired attempt was the last: the next claim is refused, Failed."""
    h = H()
    h.claim("a", 0, 10, 1, until=10_000, hi=1_000)
    h.op("a", "renew", 20, None, "unknown", args={"holder": "a", "generation": 1, "epoch": E})
    h.op("b", "claim", 60, 70, "refused", reason="finished")
    h.op("b", "claim", 80, 90, "refused", reason="finished")
    h.read(100, "Failed", 1, None, "a")
    return h


def good_expired_refused() -> H:
    """A paused holder resumes after the operator marked its lease Expired; nobody claimed.

    Its release (and a renewal) is refused as stale — the lease is not Held any more —
    although holder and generation are still its own: the operator's expiry write has no
    record of its own. CI seed 307198405 (docs/safety.md #23).
    """
    h = H()
    h.claim("a", 0, 10, 1, until=10_000, hi=1_000)
    h.write("a", 20, 30, 1)
    h.held("a", "renew", 100, 110, 1, status="refused", lo=10_700, reason="stale")
    h.held("a", "release", 120, 130, 1, status="refused", lo=10_800, reason="stale")
    h.read(140, "Expired", 1, None, "a")
    h.claim("b", 160, 170, 2, until=21_000, hi=11_000)
    h.held("b", "complete", 180, 190, 2, lo=11_100)
    h.read(200, "Completed", 2, (2, "b"), "b")
    return h


def good_unknown_first_claim() -> H:
    """The first claim's answer never came (its worker was killed); it took effect.

    The next claim is generation 2 and is the first to show the epoch. Porcupine's model
    had kept epoch 0 from the unknown claim and called the epoch a mismatch (CI seeds
    307198405 and 155378718; docs/safety.md #23).
    """
    h = H()
    h.op("c", "claim", 0, None, "unknown")
    h.claim("a", 10, 20, 2, until=10_000, hi=1_000)
    h.claim("b", 30, 40, 3, until=21_000, hi=10_600)
    h.write("b", 50, 60, 3)
    h.held("b", "complete", 70, 80, 3, lo=11_000)
    h.read(90, "Completed", 3, (3, "b"), "b")
    return h


def good_assignment_taken_back() -> H:
    """Issue 30: a dispatcher's claim for ``a``, never adopted (a's presence lapsed), taken
    back for ``b`` before its window ended: ``a`` never ran, so nothing overlaps."""
    h = H()
    h.op("dispatcher", "claim", 0, 10, args={"holder": "a", "assign": True}, generation=1,
         epoch=E, lease_until=10_000, lo=995, hi=1_000, holder="a")
    h.op("dispatcher", "claim", 20, 30, args={"holder": "b", "assign": True}, generation=2,
         epoch=E, lease_until=13_000, lo=2_995, hi=3_000, holder="b")
    h.held("b", "renew", 40, 50, 2, lo=3_100, lease_until=13_100)  # b adopts
    h.held("a", "renew", 60, 70, 1, status="refused", lo=3_200, reason="stale")  # a, too late
    h.held("b", "complete", 80, 90, 2, lo=3_300)
    h.read(100, "Completed", 2, (2, "b"), "b")
    return h


def broken(kind: str) -> H:
    h = H()
    if kind == "overlap-adopted":  # a adopted its assignment: taking it back is an overlap
        h.op("dispatcher", "claim", 0, 10, args={"holder": "a", "assign": True}, generation=1,
             epoch=E, lease_until=10_000, lo=995, hi=1_000, holder="a")
        h.held("a", "renew", 12, 18, 1, lo=1_100, lease_until=10_100)
        h.op("dispatcher", "claim", 20, 30, args={"holder": "b", "assign": True},
             generation=2, epoch=E, lease_until=13_000, lo=2_995, hi=3_000, holder="b")
        return h
    h.claim("a", 0, 10, 1, until=10_000, hi=1_000)
    if kind == "overlap":
        h.claim("b", 20, 30, 2, until=19_000, hi=9_000)  # before a's window ended
    elif kind == "stale-accepted":
        h.claim("b", 20, 30, 2, until=21_000, hi=10_600)
        h.held("a", "complete", 40, 50, 1, lo=10_700)  # the broken client's raw write
    elif kind == "target-order":
        h.claim("b", 20, 30, 2, until=21_000, hi=10_600)
        h.write("b", 40, 50, 2)
        h.write("a", 60, 70, 1)  # accepted after 2 was accepted
    elif kind == "token-order":
        h.claim("b", 20, 30, 1, until=21_000, hi=10_600)  # generation 1 again
    elif kind == "completion-lost":
        h.held("a", "complete", 20, 30, 1, lo=2_000)
        h.read(40, "Held", 1, None, "a")
    elif kind == "reopened":
        h.held("a", "complete", 20, 30, 1, lo=2_000)
        h.claim("b", 40, 50, 2, until=21_000, hi=10_600)
    elif kind == "reopened-failed":
        h.held("a", "release", 20, 30, 1, lo=2_000, phase="Failed")
        h.claim("b", 40, 50, 2, until=21_000, hi=10_600)
    elif kind == "epoch-changed":
        h.op("b", "claim", 20, 30, generation=2, epoch=E + 1, lease_until=21_000,
             lo=10_595, hi=10_600)
    elif kind == "stale-refused-early":
        # the holder's renewal refused as stale while its window was certainly still open
        h.held("a", "renew", 20, 30, 1, status="refused", lo=2_000, reason="stale")
    elif kind == "used-past-expiry":
        h.held("a", "renew", 20, 30, 1, lo=10_200, lease_until=20_000)  # started after 10 000
    return h


BROKEN = ("overlap", "stale-accepted", "target-order", "token-order", "completion-lost",
          "reopened", "reopened-failed", "used-past-expiry", "overlap-adopted")
# what only Porcupine's exact state catches (our checker looks at acknowledged effects)
BROKEN_EXACT = ("stale-refused-early", "epoch-changed")
GOOD = [good_complete, good_takeover, good_unknown, good_failed, good_expired_failed,
        good_expired_refused, good_unknown_first_claim, good_assignment_taken_back]


@pytest.mark.unit
@pytest.mark.parametrize("make", GOOD)
def test_ours_accepts_good(make: Any) -> None:
    assert check(make().ops) == []


@pytest.mark.unit
@pytest.mark.parametrize("kind", BROKEN)
def test_ours_finds_each_violation(kind: str) -> None:
    found = check(broken(kind).ops)
    assert kind.removesuffix("-failed").removesuffix("-adopted") in {v.kind for v in found}, found


@pytest.mark.unit
def test_recorder_roundtrip(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "p1.jsonl", "p1", server_now=lambda: (1000.0, 1010.0))
    with rec.operation("claim", L, holder="p1") as res:
        res.update(status="ok", generation=1, epoch=E, lease_until=2000.0)
    with pytest.raises(TimeoutError), rec.operation("renew", L, holder="p1", generation=1):
        raise TimeoutError
    rec.invoke("complete", L, holder="p1", generation=1)  # killed before it returned
    rec.close()
    with (tmp_path / "p1.jsonl").open("a") as f:
        f.write('{"type": "inv')  # a torn last line
    ops = load(tmp_path)
    assert [(o.op, o.status) for o in ops] == [("claim", "ok"), ("renew", "unknown"),
                                               ("complete", "unknown")]
    assert ops[0].server_lo == 1000.0 and ops[0].server_hi == 1010.0
    assert ops[2].ret_ns is None


def _porcupine(h: H, tmp_path: Path, name: str) -> porcupine.PorcupineResult:
    from .history import events_of
    merged = write_merged(merge(events_of(h.ops)), tmp_path / f"{name}.jsonl")
    return porcupine.check_file(merged, tmp_path / f"{name}.html")


@pytest.mark.faults
@pytest.mark.parametrize("make", GOOD)
def test_porcupine_accepts_good(make: Any, tmp_path: Path) -> None:
    assert _porcupine(make(), tmp_path, make.__name__).result == "ok"


@pytest.mark.faults
@pytest.mark.parametrize("kind", BROKEN + BROKEN_EXACT)
def test_porcupine_finds_each_violation(kind: str, tmp_path: Path) -> None:
    result = _porcupine(broken(kind), tmp_path, kind)
    assert result.violation, result.output
    assert result.html is not None and result.html.stat().st_size > 1000
