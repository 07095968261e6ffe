"""The pure core of joblease: lease state, the transition rules, the server-clock estimate.

Nothing here performs I/O, imports a Kubernetes client or framework, or reads a clock:
callers pass the time in. That keeps every rule testable in microseconds and makes the
one adapter that writes to the API server (``joblease.kube``) the only place where the
outside world is touched (an import-linter contract in ``pyproject.toml`` enforces it).
"""
