"""A persistent fenced store for file-based targets: one JSON file per resource.

Why the value lives in the same file as the token: the check, the write and the new token
must become durable *together*. Keeping the token in a side file would open a crash window
in either order — token first, and a crash loses the write while a retry of it is then
reported as a duplicate; data first, and a crash leaves a write the store does not know was
fenced by a newer token, so an older holder could overwrite it. One file replaced by an
atomic ``rename`` has no such window.

Per write, with an exclusive ``fcntl.flock`` on ``<name>.lock`` (a separate file, because
the data file's inode changes on every rename and a lock on it would not exclude the next
writer):

1. read ``<name>.json`` (``{"epoch", "generation", "keys", "value"}``) if it exists;
2. apply :func:`joblease.fencing.check.decide`;
3. write a temporary file in the same directory, ``fsync`` it, ``rename`` it over
   ``<name>.json`` and ``fsync`` the directory so the rename itself is durable.

Resource names are percent-encoded into file names, so ``/`` cannot escape the directory.
``flock`` is advisory and local: every writer must go through this class, and the directory
must not be on a network file system whose ``flock`` is not coherent across hosts.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from joblease.domain.token import FencingToken
from joblease.fencing import metrics
from joblease.fencing.check import FenceState, decide
from joblease.fencing.errors import StaleTokenError
from joblease.fencing.result import Decision, Duplicate


class FencedFileStore:
    """Store one JSON value per resource, refusing writes with stale fencing tokens.

    Safe across threads and processes on one host (all synchronization is ``flock``).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._dir = Path(directory)
        self._dir.mkdir(parents=True, exist_ok=True)

    def put(
        self,
        resource: str,
        token: FencingToken,
        idempotency_key: str | None,
        value: Any,
    ) -> Decision:
        """Store ``value`` for ``resource`` if ``token`` is not stale.

        Args:
            resource: The fenced resource (any non-empty string).
            token: The token the write presents.
            idempotency_key: Identifies retries of the same write; ``None`` disables
                duplicate detection.
            value: Any JSON-serializable value; replaces the previous one.

        Returns:
            :class:`Applied` if the value was stored now, :class:`Duplicate` if this
            ``(token, key)`` was stored before (the value is then left as it is).

        Raises:
            StaleTokenError: ``token`` is lower than the highest stored for ``resource``
                (counted in :mod:`joblease.fencing.metrics`, ``helper="filestore"``, like
                every accepted write).

        """
        encoded = json.dumps(value)  # fail on unserializable values before touching disk
        with self._locked(resource):
            stored = self._read(resource)
            state = None if stored is None else stored[0]
            try:
                decision, new_state = decide(state, resource, token, idempotency_key)
            except StaleTokenError:
                metrics.count_refused("filestore")
                raise
            duplicate = isinstance(decision, Duplicate)
            if not duplicate:
                self._write(resource, new_state, encoded)
            metrics.count_accepted("filestore", duplicate=duplicate)
            return decision

    def get(self, resource: str) -> tuple[Any, FencingToken] | None:
        """Return ``(value, highest token)`` for ``resource``, or ``None`` if never written.

        Needs no lock: writers replace the file by ``rename``, so a reader sees either the
        previous or the next complete file, never a partial one.
        """
        stored = self._read(resource)
        return None if stored is None else (stored[1], stored[0].highest)

    def _path(self, resource: str, suffix: str) -> Path:
        if not resource:
            raise ValueError("a fenced resource needs a non-empty name")
        return self._dir / f"{quote(resource, safe='')}{suffix}"

    @contextmanager
    def _locked(self, resource: str) -> Iterator[None]:
        fd = os.open(self._path(resource, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def _read(self, resource: str) -> tuple[FenceState, Any] | None:
        try:
            raw = self._path(resource, ".json").read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        doc = json.loads(raw)
        token = FencingToken(int(doc["epoch"]), int(doc["generation"]))
        return FenceState(token, frozenset(doc["keys"])), doc["value"]

    def _write(self, resource: str, state: FenceState, encoded_value: str) -> None:
        doc = (
            f'{{"epoch": {state.highest.epoch}, "generation": {state.highest.generation}, '
            f'"keys": {json.dumps(sorted(state.keys))}, "value": {encoded_value}}}'
        )
        target = self._path(resource, ".json")
        fd, tmp = tempfile.mkstemp(dir=self._dir, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(doc)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(self._dir)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
