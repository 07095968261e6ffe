"""``python -m bench.scale_parts``: a wrong command line is refused before a cluster starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.paths import REPO


@pytest.mark.parametrize("argv", [[], ["creation"], ["expiry", "4"], ["creation", "1", "2"]])
def test_a_wrong_command_line_prints_the_usage_and_exits_2(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.scale_parts", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "due-at-once W1,W2" in done.stderr
