"""Helpers of the packaging tests: copy the tree cleanly, build a wheel the way a user does.

The copy holds only the files git tracks or would track (so a stale ``build/`` or
``*.egg-info`` in the working tree cannot leak into a wheel), and the wheels are built the
way a user builds them: ``pip wheel --no-deps``, with build isolation.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from support.paths import REPO


@dataclass(frozen=True)
class Wheels:
    """The two wheels and the build's output (warnings included)."""

    product: Path
    localcluster: Path
    output: str


def copy_tree(destination: Path) -> Path:
    """Copy the files git tracks (or would track) in the working tree to ``destination``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True, check=True)
    for name in listed.stdout.decode().split("\0"):
        source = REPO / name
        if name and source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def pip_wheel(project: Path, out: Path) -> tuple[Path, str]:
    """``pip wheel --no-deps`` ``project`` into ``out``; return the wheel and pip's output."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v",
                           "--wheel-dir", str(out), str(project)],
                          capture_output=True, text=True, timeout=600, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    wheels = sorted(out.glob("*.whl"), key=lambda p: p.stat().st_mtime)
    assert wheels, output[-4000:]
    return wheels[-1], output
