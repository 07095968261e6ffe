"""The downward API token reader, on files laid out exactly as the kubelet lays them out.

The kubelet's AtomicWriter: the payload goes into a fresh ``..<UTC timestamp>.<random>``
folder, a ``..data_tmp`` symlink to it is renamed over ``..data``, each visible file is a
relative symlink ``name -> ..data/name``, and the old folder is removed. The annotations
file (``fieldpath.FormatMap``) is ``key="value"`` lines, keys sorted, values in Go ``%q``,
no trailing newline.
"""

from __future__ import annotations

import os
import secrets
import shutil
import threading
import time
from pathlib import Path

import pytest

from joblease.domain.token import FencingToken
from joblease.fencing import StaleTokenError, TokenGate
from joblease.pod.downward import (
    DownwardFormatError,
    TokenFile,
    go_unquote,
    parse_annotations,
)


def go_quote(value: str) -> str:
    """Go's strconv.Quote for the characters these tests use (printable runes kept)."""
    escapes = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    out = "".join(escapes.get(c, c if c.isprintable() else f"\\u{ord(c):04x}") for c in value)
    return f'"{out}"'


def format_map(annotations: dict[str, str]) -> str:
    return "\n".join(f"{k}={go_quote(annotations[k])}" for k in sorted(annotations))


def kubelet_write(volume: Path, annotations: dict[str, str]) -> None:
    """Publish a new payload the way the kubelet's AtomicWriter does."""
    stamp = time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime())
    new = volume / f"..{stamp}.{secrets.randbelow(10**9)}"
    new.mkdir()
    (new / "annotations").write_text(format_map(annotations))
    data = volume / "..data"
    old = data.resolve() if data.is_symlink() else None
    tmp = volume / "..data_tmp"
    os.symlink(new.name, tmp)
    os.rename(tmp, data)  # the atomic swap
    if not (volume / "annotations").is_symlink():
        os.symlink("..data/annotations", volume / "annotations")
    if old is not None:
        shutil.rmtree(old)


def token_annotations(epoch: int, generation: int, until: str) -> dict[str, str]:
    return {"joblease.dev/epoch": str(epoch), "joblease.dev/generation": str(generation),
            "joblease.dev/holder": "pod:ns/worker-0/0d9c", "joblease.dev/lease-until": until,
            "kubernetes.io/config.seen": "2026-12-02T18:00:00Z"}


def test_go_quoting_round_trips() -> None:
    for value in ['plain', 'with "quotes"', "back\\slash", "multi\nline\ttab", "é ü 日本",
                  "ctl\x01", ""]:
        assert go_unquote(go_quote(value)) == value
    assert go_unquote('"\\x41\\u00e9\\U0001F600\\101"') == "Aé😀A"
    with pytest.raises(DownwardFormatError):
        go_unquote('"dangling\\"')


def test_parse_is_exactly_the_kubelet_format() -> None:
    text = 'a.io/x="1"\nb="say \\"hi\\"\\nbye"\nc=""'  # no trailing newline
    assert parse_annotations(text) == {"a.io/x": "1", "b": 'say "hi"\nbye', "c": ""}
    with pytest.raises(DownwardFormatError):
        parse_annotations("no-equals-sign")


def test_reads_through_the_data_symlink_and_sees_swaps(tmp_path: Path) -> None:
    file = TokenFile(tmp_path / "annotations", uid="0d9c")
    assert file.read() is None  # volume not populated yet
    kubelet_write(tmp_path, {"other": "x"})
    assert file.read() is None  # populated, but the operator holds nothing for this pod
    kubelet_write(tmp_path, token_annotations(4711, 1, "2026-12-02T18:00:30.000Z"))
    first = file.read()
    assert first is not None and first.token == FencingToken(4711, 1)
    assert first.holder == "pod:ns/worker-0/0d9c"
    assert (tmp_path / "annotations").is_symlink() and (tmp_path / "..data").is_symlink()
    kubelet_write(tmp_path, token_annotations(4711, 2, "2026-12-02T18:01:00.000Z"))
    assert file.read().token == FencingToken(4711, 2)  # type: ignore[union-attr]
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("..2")]) == 1


def test_wait_for_the_token_to_appear(tmp_path: Path) -> None:
    file = TokenFile(tmp_path / "annotations", poll=0.02, uid="0d9c")
    writer = threading.Timer(0.2, kubelet_write,
                             (tmp_path, token_annotations(9, 3, "2026-12-02T18:00:30.000Z")))
    writer.start()
    try:
        assert file.wait(timeout=5).token == FencingToken(9, 3)
    finally:
        writer.cancel()
    with pytest.raises(TimeoutError, match="waiting for a token"):
        TokenFile(tmp_path / "missing", poll=0.01, uid="0d9c").wait(timeout=0.05)


def test_a_renewal_is_not_a_change_but_a_takeover_is(tmp_path: Path) -> None:
    file = TokenFile(tmp_path / "annotations", poll=0.02, uid="0d9c")
    kubelet_write(tmp_path, token_annotations(9, 3, "2026-12-02T18:00:30.000Z"))
    held = file.read()
    kubelet_write(tmp_path, token_annotations(9, 3, "2026-12-02T18:00:40.000Z"))  # renewed
    with pytest.raises(TimeoutError):
        file.wait_change(held, timeout=0.1)
    kubelet_write(tmp_path, {"other": "x"})  # the operator took the token away
    assert file.wait_change(held, timeout=1) is None


def test_the_token_goes_to_the_fencing_gate(tmp_path: Path) -> None:
    gate = TokenGate()
    kubelet_write(tmp_path, token_annotations(9, 4, "2026-12-02T18:00:30.000Z"))
    newer = TokenFile(tmp_path / "annotations", uid="0d9c").read()
    assert newer is not None
    gate.accept("report", newer.token)
    with pytest.raises(StaleTokenError):
        gate.accept("report", FencingToken(9, 3))  # a paused predecessor's late write


def test_a_copied_pod_never_reads_another_pods_token(tmp_path: Path) -> None:
    """Issue 14 item 8: a pod created from the holder's manifest carries the holder's
    annotations; its reader must see no token, because the holder names another uid."""
    kubelet_write(tmp_path, token_annotations(9, 4, "2026-12-02T18:00:30.000Z"))
    assert TokenFile(tmp_path / "annotations", uid="0d9c").read() is not None
    assert TokenFile(tmp_path / "annotations", uid="c10e").read() is None
    (tmp_path / "uid").write_text("c10e")  # the downward API file of the copy
    assert TokenFile(tmp_path / "annotations").read() is None


def test_without_its_uid_a_reader_refuses_to_guess(tmp_path: Path) -> None:
    kubelet_write(tmp_path, token_annotations(9, 4, "2026-12-02T18:00:30.000Z"))
    with pytest.raises(DownwardFormatError, match=r"mount metadata\.uid"):
        TokenFile(tmp_path / "annotations").read()


def test_malformed_token_annotations_name_the_problem(tmp_path: Path) -> None:
    bad = {**token_annotations(9, 4, "2026-12-02T18:00:30.000Z"), "joblease.dev/epoch": "x9"}
    kubelet_write(tmp_path, bad)
    with pytest.raises(DownwardFormatError, match=r"joblease.dev/epoch=.x9."):
        TokenFile(tmp_path / "annotations", uid="0d9c").read()
