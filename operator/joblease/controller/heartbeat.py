"""A liveness file for exec probes, for replicas that cannot each own a port.

Why: kopf's liveness endpoint is an HTTP port, and on a node without a pod network (host
networking) every replica of the Deployment would want the same port on the same host, so
a second replica can never be scheduled there. With ``--health-file`` the operator instead
touches a file after every successful reconcile pass (about once a second, see
``runtime._loop``), and the chart's exec probes check its age with a one-line Python
command (``PROBE_SOURCE``) that imports nothing of joblease, so a probe costs ~20 ms rather
than the package's import time.

The file's age is judged on the container's own wall clock, which is fine here: the writer
and the reader share it, and it decides only whether the kubelet restarts a pod, never
anything about a lease.
"""

from __future__ import annotations

from pathlib import Path

from joblease.controller import metrics

# What the chart's exec probes run: ``python -I -c PROBE_SOURCE PATH MAX_AGE``. Exit 0 when
# the file was touched within MAX_AGE seconds; otherwise a message naming the age (or the
# missing file) and exit 1.
PROBE_SOURCE = (
    "import os,sys,time\n"
    "try: age=time.time()-os.stat(sys.argv[1]).st_mtime\n"
    "except OSError as e: sys.exit(f'no heartbeat: {e}')\n"
    "sys.exit(f'heartbeat {age:.1f}s old (max {sys.argv[2]}s)' if age>float(sys.argv[2]) else 0)"
)


class Heartbeat:
    """Touches one file; does nothing when no path is configured."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def beat(self) -> None:
        """Mark the operator alive now (creates the file on the first beat).

        Also sets ``joblease_operator_last_pass_timestamp_seconds``, the same fact for
        Prometheus (the ``JobleaseOperatorNotReconciling`` alert), with or without a file.
        """
        metrics.LAST_PASS.set_to_current_time()
        if self.path is None:
            return
        self.path.touch(exist_ok=True)  # sets the mtime of an existing file too
