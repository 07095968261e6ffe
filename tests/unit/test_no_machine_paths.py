"""No folder of one developer's machine in what readers are given (issue 31).

``bench/results/latest.md`` named a worktree, ``docs/mutation.md`` a venv under ``/tmp`` and
``docs/benchmarks.md`` temporary folders as where results were: a reader cannot follow
them. Paths inside the product stay (a pod's ``/tmp/heartbeat``, the operator's
``/tmp/joblease-alive``, the local cluster's ``/tmp/joblease-cluster-*``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
MACHINE = re.compile(r"(?<![\w.~-])/(?:tmp|work|root|home|Users)/[^\s`'\")\]]*")
PRODUCT = ("/tmp/heartbeat", "/tmp/joblease-alive", "/tmp/joblease-cluster-")


def documents() -> list[Path]:
    found = [*sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "bench" / "results")
                                                               .rglob("*.md")),
             REPO / "README.md", REPO / "CHANGELOG.md"]
    return [p for p in found if p.is_file()]


def test_the_pattern_sees_machine_paths_and_spares_product_ones() -> None:
    sample = ("see /tmp/h6/after and `/work/wt-x/operator` or /root/.cache, "
              "not /tmp/heartbeat nor a URL https://example.com/tmp/x")
    hits = [m.group(0) for m in MACHINE.finditer(sample)]
    assert [h for h in hits if not h.startswith(PRODUCT)] == [
        "/tmp/h6/after", "/work/wt-x/operator", "/root/.cache,"]


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_document_names_a_folder_of_one_machine(path: Path) -> None:
    text = path.read_text(errors="replace")
    bad = [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in MACHINE.finditer(text)
           if not m.group(0).startswith(PRODUCT)]
    assert bad == [], f"{path.relative_to(REPO)}: machine paths (line, path): {bad}"
