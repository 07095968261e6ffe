"""``python -m joblease_localcluster``: the same as the ``joblease-localcluster`` command."""

import sys

from joblease_localcluster.cli import main

sys.exit(main())
