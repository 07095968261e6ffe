"""``python -m bench.scale_parts``: a wrong command line is refused before a cluster starts."""

from __future__ import annotations

import pytest
from bench import scale_parts


@pytest.mark.parametrize("argv", [[], ["creation"], ["expiry", "4"], ["creation", "1", "2"]])
def test_a_wrong_command_line_prints_the_usage_and_exits_2(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert scale_parts.main(argv) == 2
    assert "due-at-once W1,W2" in capsys.readouterr().err
