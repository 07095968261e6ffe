"""How much of the sync and the asyncio client is the same code written twice (issue 23).

``python -m bench.twins [ROOT]``: for each pair of twin modules, strip docstrings, comments,
``async``/``await`` and the ``Async``/``a`` prefixes, then count the code lines the two share
(``difflib``'s matching blocks). A high share means one behaviour kept in two copies.
"""

from __future__ import annotations

import ast
import difflib
import re
import sys
from pathlib import Path

PAIRS = [
    ("operator/joblease/sdk/client.py", "operator/joblease/aio/client.py"),
    ("operator/joblease/sdk/hold.py", "operator/joblease/aio/hold.py"),
    ("operator/joblease/sdk/pool.py", "operator/joblease/aio/pool.py"),
    ("operator/joblease/kube/api.py", "operator/joblease/kube/aioapi.py"),
]


def code_lines(path: Path) -> list[str]:
    """The module's code, one normalised line each, without docstrings or comments."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body[0] = ast.Pass()
    lines = []
    for line in ast.unparse(tree).splitlines():
        text = line.strip()
        if not text or text == "pass":
            continue
        text = re.sub(r"\basync\s+|\bawait\s+", "", text)
        text = re.sub(r"\bAsync(?=[A-Z])", "", text)
        text = re.sub(r"\ba(drive|transact|run_steps|iter|next)\b", r"\1", text)
        lines.append(text)
    return lines


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    print("| sync | asyncio | code lines | shared | share |\n|---|---|---|---|---|")
    for left, right in PAIRS:
        a, b = code_lines(root / left), code_lines(root / right)
        matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
        shared = sum(block.size for block in matcher.get_matching_blocks())
        print(f"| {left.split('joblease/')[1]} | {right.split('joblease/')[1]} | "
              f"{len(a)} / {len(b)} | {shared} | {200 * shared / (len(a) + len(b)):.0f} % |")


if __name__ == "__main__":
    main()
