r"""Read a pod-delegated lease's token from a downward API volume.

A pod labelled ``joblease.dev/lease=<name>`` gets its token from the operator as annotations
(``joblease.controller.pods``). Mounted with a downward API volume, e.g.::

    volumes:
      - name: joblease
        downwardAPI:
          items:
            - path: annotations
              fieldRef: {fieldPath: metadata.annotations}

the kubelet writes them to ``/etc/joblease/annotations`` in its own format, which this
module reads exactly:

* one ``key="value"`` line per annotation, keys sorted, the value quoted as Go's ``%q``
  does (``strconv.Quote``: ``\"``, ``\\``, ``\n``, ``\t``, ``\xNN``, ``\uNNNN`` …), and no
  newline after the last line;
* the visible file is a symlink through ``..data``, itself a symlink to a timestamped
  folder; an update writes a new folder and renames a new ``..data`` link over the old
  one. So a reader that *re-opens the path on every read* sees either the old or the new
  file, never a mix; one that keeps a file open (or a ``subPath`` mount) never sees an
  update.

Why a file and not environment variables: env from a ``fieldRef`` is fixed at container
start, the file is live. It can still lag (the kubelet refreshes it when it resyncs the
pod: usually seconds, up to about a minute), so a pod may act on a token that was
already superseded. That is exactly why the token goes to the target's fencing check
(``joblease.fencing``): the file tells a worker *which* token to present, the target decides
whether it is still good.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from joblease.domain.errors import JobleaseError
from joblease.domain.token import FencingToken, HeldToken
from joblease.kube.pods import ANNOTATION_PREFIX as PREFIX  # the one definition

DEFAULT_PATH = Path("/etc/joblease/annotations")
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
                   "v": "\v", "\\": "\\", '"': '"', "'": "'"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


class DownwardFormatError(JobleaseError, ValueError):
    """The file is not in the kubelet's ``key="value"`` format.

    A ``JobleaseError`` like every error joblease raises, and still a ``ValueError`` (what
    it was first), so callers that catch a malformed value that way keep working.
    """


@dataclass(frozen=True)
class DelegatedToken:
    """The token the operator holds for this pod, as its annotations last showed it."""

    token: FencingToken
    holder: str
    lease_until: datetime | None

    def __str__(self) -> str:
        return f"{self.token} (holder {self.holder})"


def go_unquote(quoted: str) -> str:
    """Undo Go's ``%q`` (``strconv.Quote``) for one double-quoted string.

    Raises:
        DownwardFormatError: not a complete double-quoted Go string.
    """
    if len(quoted) < 2 or quoted[0] != '"' or quoted[-1] != '"':
        raise DownwardFormatError(f"not a Go-quoted string: {quoted!r}")
    out = bytearray()
    body, i = quoted[1:-1], 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out += char.encode()
            i += 1
            continue
        i = _unescape(body, i + 1, out)
    return out.decode("utf-8", errors="replace")


def _unescape(body: str, i: int, out: bytearray) -> int:
    """Decode the escape starting at ``body[i]`` (after the backslash); return the next index."""
    if i >= len(body):
        raise DownwardFormatError("dangling backslash in a Go-quoted string")
    kind = body[i]
    if kind in _SIMPLE_ESCAPES:
        out += _SIMPLE_ESCAPES[kind].encode()
        return i + 1
    if kind in _HEX_ESCAPES:
        width = _HEX_ESCAPES[kind]
        digits = body[i + 1:i + 1 + width]
        if len(digits) != width:
            raise DownwardFormatError(f"short \\{kind} escape in a Go-quoted string")
        value = int(digits, 16)
        out += bytes([value]) if kind == "x" else chr(value).encode()  # \x is one raw byte
        return i + 1 + width
    if kind in "01234567":  # Go's Unquote accepts \NNN octal; Quote never writes it
        out += bytes([int(body[i:i + 3], 8)])
        return i + 3
    raise DownwardFormatError(f"unknown escape \\{kind} in a Go-quoted string")


def parse_annotations(text: str) -> dict[str, str]:
    """Parse the kubelet's annotations file into a dict.

    Raises:
        DownwardFormatError: a line is not ``key="value"``.
    """
    result: dict[str, str] = {}
    for line in text.split("\n"):
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise DownwardFormatError(f"not a key=\"value\" line: {line!r}")
        result[key] = go_unquote(value)
    return result


def token_from_annotations(annotations: dict[str, str], pod_uid: str | None = None
                           ) -> DelegatedToken | None:
    """The delegated token the annotations carry, or None while the pod holds nothing.

    With ``pod_uid`` a token is returned only if its holder names that uid
    (``pod:<namespace>/<name>/<uid>``): a pod created from the holder's manifest (a copy
    with the same annotations) or a stale file must never present another pod's token.

    Raises:
        DownwardFormatError: a token annotation is malformed (names the annotation).
    """
    holder = annotations.get(PREFIX + "holder", "")
    if pod_uid is not None and holder.rsplit("/", 1)[-1] != pod_uid:
        return None
    try:
        held = HeldToken.from_annotations(annotations, PREFIX)  # the operator's codec
    except ValueError as err:
        raise DownwardFormatError(str(err)) from None
    if held is None:
        return None
    return DelegatedToken(held.token, held.holder, held.lease_until)


class TokenFile:
    """The token in a downward API annotations file, re-read from the path on every call.

    Only a token whose holder names *this* pod's uid is returned: the uid comes from
    ``uid`` or from a downward API file with ``metadata.uid`` (default: ``uid`` beside the
    annotations file), e.g. a second item of the same volume::

            - path: uid
              fieldRef: {fieldPath: metadata.uid}

    Args:
        path: The file (default ``/etc/joblease/annotations``).
        poll: Seconds between reads while waiting (the kubelet's own updates are far
            coarser, so polling costs nothing that matters).
        uid: This pod's uid (default: read from ``uid_path``).
        uid_path: The downward API file with ``metadata.uid``.
        monotonic, sleep: Injected for tests.
    """

    def __init__(self, path: Path | str = DEFAULT_PATH, poll: float = 0.2, *,
                 uid: str | None = None, uid_path: Path | str | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.path, self.poll = Path(path), poll
        self.uid_path = Path(uid_path) if uid_path else self.path.parent / "uid"
        self._uid = uid
        self._monotonic, self._sleep = monotonic, sleep

    def pod_uid(self) -> str:
        """This pod's uid (given, or read once from ``uid_path``).

        Raises:
            DownwardFormatError: neither given nor mounted: without it a copied pod could
                present another pod's token.
        """
        if self._uid is None:
            try:
                self._uid = self.uid_path.read_text(encoding="utf-8").strip()
            except FileNotFoundError:
                raise DownwardFormatError(
                    f"this pod's uid is unknown: mount metadata.uid at {self.uid_path} (a "
                    "downward API item `path: uid, fieldRef: {fieldPath: metadata.uid}`) or "
                    "pass uid=, so that a token meant for another pod is never used") from None
        return self._uid

    def annotations(self) -> dict[str, str]:
        """All annotations now in the file (empty if the volume is not populated yet)."""
        try:
            with self.path.open(encoding="utf-8") as handle:  # re-open: follows ..data
                return parse_annotations(handle.read())
        except FileNotFoundError:
            return {}

    def read(self) -> DelegatedToken | None:
        """The token now in the file, or None if the operator holds nothing for this pod."""
        return token_from_annotations(self.annotations(), self.pod_uid())

    def wait(self, timeout: float) -> DelegatedToken:
        """Wait until a token appears; return it.

        Raises:
            TimeoutError: none appeared within ``timeout`` seconds.
        """
        return self._wait_for(lambda t: t is not None, timeout, "a token to appear")

    def wait_change(self, previous: DelegatedToken | None, timeout: float
                    ) -> DelegatedToken | None:
        """Wait until the token differs from ``previous`` (another one, or none); return it.

        A renewal (only ``lease-until`` moves) is not a change of token and is ignored.

        Raises:
            TimeoutError: it did not change within ``timeout`` seconds.
        """
        before = previous.token if previous else None
        return self._wait_for(lambda t: (t.token if t else None) != before, timeout,
                              f"the token to change from {before}")

    def _wait_for(self, done: Callable[[DelegatedToken | None], bool], timeout: float,
                  what: str) -> DelegatedToken:
        deadline = self._monotonic() + timeout
        while True:
            current = self.read()
            if done(current):
                return current  # type: ignore[return-value]
            if self._monotonic() >= deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what} in "
                                   f"{self.path}")
            self._sleep(self.poll)


__all__ = ["DEFAULT_PATH", "DelegatedToken", "DownwardFormatError", "TokenFile",
           "go_unquote", "parse_annotations", "token_from_annotations"]
