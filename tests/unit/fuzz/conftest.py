"""Hypothesis profiles for the property tests.

``default``: Hypothesis's own defaults (each test bounds itself with ``max_examples`` and
``deadline``). ``mutate`` (``make mutate`` sets ``HYPOTHESIS_PROFILE=mutate``): derandomized
and without the example database, so every mutant meets the same examples and a kill or
a survival does not depend on luck or on what an earlier run stored.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("mutate", derandomize=True, database=None, print_blob=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
