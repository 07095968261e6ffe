"""The local cluster's own tests (builder, certificates, processes): pure and fast.

Marked by the one rule in ``tests/support/markers.py`` (``pythonpath`` puts ``tests/`` on
``sys.path``), like every other test folder.
"""

pytest_plugins = ["support.markers"]
