"""``python -m joblease``: run the operator (same as ``joblease operator``)."""

import sys

from joblease.controller.main import main

sys.exit(main())
