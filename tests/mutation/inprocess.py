"""``mutate --recheck … --in-process``: recheck many mutants in one interpreter.

Why: ``--recheck`` starts one pytest per mutant, which costs a whole interpreter start and
the imports of every test module each time (30 to 90 s per mutant on the loaded shared
machine of 2026-12-06). mutmut's trampolines read ``MUTANT_UNDER_TEST`` at every call, so
one process can run the tests once per mutant with only that variable changed: the imports
are paid once. The price is isolation: a test that leaves a thread or a module-level change
behind carries it into the next mutant's run; a kill found this way can be confirmed on
its own with ``--recheck`` (one process per mutant) and ``--only`` its name.

Run by ``mutate.py`` with the staged mutants first on ``PYTHONPATH``; argv: a file of mutant
names (one a line), then the pytest arguments. Prints ``killed NAME`` / ``survives NAME``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


def main(argv: list[str]) -> int:
    """Run the tests ``argv[1:]`` once per mutant named in the file ``argv[0]``."""
    names = [line.strip() for line in Path(argv[0]).read_text().splitlines() if line.strip()]
    for name in names:
        os.environ["MUTANT_UNDER_TEST"] = name
        code = pytest.main(["-x", "-q", "--no-header", "-p", "no:cacheprovider", *argv[1:]])
        print(f"{'survives' if code == 0 else 'killed'} {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
