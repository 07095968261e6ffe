"""The JobLease CRD, shipped in this package so the demo runs from an installed wheel.

``data/`` holds a mechanical copy of the canonical ``crds/*.yaml`` (``make sync-crds``
copies it; ``tests/unit/test_crd_drift.py`` fails on any drift).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

CRD_FILE = "joblease.dev_jobleases.yaml"
CRD_NAME = "jobleases.joblease.dev"


def crd_path() -> Path:
    """Return the path of the packaged JobLease CRD (a real file: kubectl reads it).

    Raises:
        FileNotFoundError: the package was installed without its data (a packaging bug).
    """
    path = Path(str(resources.files(__package__ or "joblease_localcluster") / "data" / CRD_FILE))
    if not path.is_file():
        raise FileNotFoundError(f"the JobLease CRD is not in the installed package: {path}")
    return path
