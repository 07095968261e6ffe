"""Helpers shared by every test suite (and ``bench``): one of each, nowhere else.

* ``paths``: ``REPO``, ``CRD`` and the other repository paths the suites use.
* ``waiting``: ``wait_for`` (poll until truthy) and ``retry`` (call until it does not raise).
* ``operator_process``: ``OperatorProcess``, the operator (``python -m joblease``) as a
  real process, and ``free_port`` (the local cluster's own, re-exported).
* ``postgres``: ``PostgresServer``, a throwaway real PostgreSQL.

Import them as ``support.…`` (pytest puts ``tests/`` on ``sys.path``; the soak entry points
do the same) or as ``tests.support.…`` from the repository root (``python -m bench``).
Their own tests live beside them (``tests/support/test_*.py``).
"""
