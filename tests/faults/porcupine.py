"""Build and run the Porcupine checker (``tests/porcupine/``, a small Go module).

Built once per source hash with ``go build`` into the joblease cache, next to the cluster
binaries: ``<cache>/bin/porcupine-checker-<sha256 of the sources, 16 hex>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from joblease_localcluster.build import BuildError, cache_dir

SOURCE = Path(__file__).resolve().parents[1] / "porcupine"
SOURCES = ("go.mod", "go.sum", "main.go")


def binary_path() -> Path:
    """Where the checker for the current sources lives."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode() + b"\0" + (SOURCE / name).read_bytes())
    return cache_dir() / "bin" / f"porcupine-checker-{digest.hexdigest()[:16]}"


def ensure_built() -> Path:
    """Return the checker binary, building it with ``go build`` if missing."""
    target = binary_path()
    if target.is_file():
        return target
    go = shutil.which("go")
    if go is None:
        raise BuildError("the Porcupine checker is built with Go: install Go >= 1.26")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", dir=target.parent)
    os.close(fd)
    try:
        out = subprocess.run([go, "build", "-o", tmp, "."], cwd=SOURCE, capture_output=True,
                             text=True, timeout=600, check=False,
                             env={**os.environ, "CGO_ENABLED": "0"})
        if out.returncode != 0:
            raise BuildError(f"go build of the Porcupine checker failed:\n{out.stderr[-3000:]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@dataclass(frozen=True)
class PorcupineResult:
    """``ok``, ``illegal`` or ``unknown`` (timed out), and the visualization if written."""

    result: str
    operations: int
    html: Path | None
    output: str

    @property
    def violation(self) -> bool:
        """Porcupine found the history not linearizable with respect to the model."""
        return self.result == "illegal"


def check_file(merged: Path, html: Path | None = None, always_html: bool = False,
               timeout: float = 60.0) -> PorcupineResult:
    """Run the checker on a merged history file."""
    argv = [str(ensure_built()), "-history", str(merged), "-timeout", f"{timeout:.0f}s"]
    if html is not None:
        html.parent.mkdir(parents=True, exist_ok=True)
        argv += ["-html", str(html)]
        if always_html:
            argv.append("-always-html")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 60,
                         check=False)
    if out.returncode not in (0, 1, 3):
        raise RuntimeError(f"porcupine-checker failed ({out.returncode}): {out.stderr}")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    written = summary.get("html")
    return PorcupineResult(summary["result"], int(summary["operations"]),
                           Path(written) if written else None, out.stdout + out.stderr)
