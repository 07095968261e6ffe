"""parse_time refuses a date the API server's schema refuses: non-ASCII digits in the date.

Found by mutation testing (issue 15, item 6): ``_DATE`` in ``joblease.domain.lease`` is
compiled without ``re.ASCII`` (``_TIME`` has it), so ``\\d`` matches any Unicode digit and
``"٢٠٢٦-12-02T12:00:00Z"`` (Arabic-Indic digits) is read as 2026-12-02. kube-openapi's
``date-time`` check (Go regexp: ``\\d`` is ASCII) refuses it, so the server never stores
one; the deviation matters only where ``parse_time`` reads text a user typed, and it breaks
the function's documented contract ("Raises ValueError: text is not a date-time the schema
accepts at all"). Fixed on main in 56fc293 (``_DATE`` with ``re.ASCII``); this test fails
on a branch without that commit.
"""

from __future__ import annotations

import pytest

from joblease.domain.time import parse_time


@pytest.mark.parametrize("text", [
    "\u0662\u0660\u0662\u0666-12-02T12:00:00Z",  # Arabic-Indic year
    "2026-\uff11\uff12-02T12:00:00Z",  # full-width month
])
def test_parse_time_refuses_non_ascii_digits_in_the_date(text: str) -> None:
    with pytest.raises(ValueError, match=r"^not an RFC 3339 timestamp: "):
        parse_time(text)
