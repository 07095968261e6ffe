"""``docs/sdk.md`` is the SDK's reference: it must name everything the SDK exports.

Why a test: a reference written once drifts the first time someone exports a name or adds
a method and forgets the page. This fails then, naming what is missing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import joblease
import joblease.sdk
from joblease.sdk import AsyncHolding, Holding, Lease, LeaseClient, Pool

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "sdk.md"


def _code_words() -> set[str]:
    """Every identifier that appears inside a code span or code block of the reference."""
    text = REFERENCE.read_text(encoding="utf-8")
    code = re.findall(r"```.*?```|`[^`\n]+`", text, flags=re.DOTALL)
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", " ".join(code)))


@pytest.mark.parametrize("module", [joblease, joblease.sdk], ids=lambda m: m.__name__)
def test_every_exported_name_is_in_the_reference(module: object) -> None:
    missing = sorted(set(module.__all__) - _code_words())  # type: ignore[attr-defined]
    assert missing == [], f"docs/sdk.md does not mention {missing}"


@pytest.mark.parametrize("cls", [LeaseClient, Lease, Holding, AsyncHolding, Pool],
                         ids=lambda c: c.__name__)
def test_every_public_method_of_the_main_classes_is_in_the_reference(cls: type) -> None:
    public = {name for name in vars(cls) if not name.startswith("_")}
    assert public, "nothing found: the check would pass vacuously"
    missing = sorted(public - _code_words())
    assert missing == [], f"docs/sdk.md does not mention {cls.__name__}.{missing}"


def test_the_reference_states_guarantees_and_links_the_safety_page() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    assert "**Guarantees:**" in text and "**Not guaranteed:**" in text
    assert "(safety.md)" in text
