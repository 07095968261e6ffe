"""``python -m joblease.cli``: the ``joblease`` command."""

import sys

from joblease.cli import main

if __name__ == "__main__":
    sys.exit(main())
