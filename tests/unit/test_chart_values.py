"""Every value of the chart is described in values.yaml and known to values.schema.json.

values.yaml is the chart's reference documentation, and the schema refuses unknown keys; a
value without a comment is undocumented, one without a schema entry fails ``helm install``.
A value counts as commented when a comment line sits directly above its key, or above the
key of a free-form map it is part of (a map the schema gives no ``properties``, such as
``podSecurityContext`` or a labels map: there the comment describes the map's contents). A
comment over a group of options (``serviceMonitor:``) does not document each option.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

CHART = Path(__file__).resolve().parents[2] / "charts" / "joblease-operator"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.-]*):(\s|$)")


def commented_paths(text: str) -> set[tuple[str, ...]]:
    """Key paths of values.yaml whose key line has a comment line directly above it."""
    found: set[tuple[str, ...]] = set()
    stack: list[tuple[int, str]] = []
    previous = ""
    for line in text.splitlines():
        match = KEY.match(line)
        if match:
            indent = len(match["indent"])
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, match["key"]))
            if previous.lstrip().startswith("#"):
                found.add(tuple(k for _, k in stack))
        if line.strip():
            previous = line
    return found


def leaf_paths(values: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths of every value that is not a non-empty map."""
    if isinstance(values, dict) and values:
        return [p for k, v in values.items() for p in leaf_paths(v, (*prefix, str(k)))]
    return [prefix]


def schema_for(schema: dict[str, Any], root: dict[str, Any], path: tuple[str, ...]
               ) -> dict[str, Any] | None:
    """The schema node describing ``path``; None if the schema does not allow it."""
    node = schema
    for key in path:
        while "$ref" in node:
            node = root["definitions"][node["$ref"].split("/")[-1]]
        props = node.get("properties")
        if props is None:
            # A free-form map (stringMap, podSecurityContext...): it describes its contents.
            return node if node.get("type") == "object" else None
        if key not in props:
            return None
        node = props[key]
    return node


def free_form(schema: dict[str, Any], path: tuple[str, ...]) -> bool:
    node = schema_for(schema, schema, path)
    while node is not None and "$ref" in node:
        node = schema["definitions"][node["$ref"].split("/")[-1]]
    return node is not None and "properties" not in node


def test_every_value_has_a_comment() -> None:
    text = (CHART / "values.yaml").read_text()
    schema = json.loads((CHART / "values.schema.json").read_text())
    commented = commented_paths(text)
    missing = [".".join(p) for p in leaf_paths(yaml.safe_load(text))
               if p not in commented and not any(
                   p[:i] in commented and free_form(schema, p[:i]) for i in range(1, len(p)))]
    assert not missing, f"values without a comment in values.yaml: {missing}"


def test_every_value_has_a_schema_entry() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [".".join(p) for p in leaf_paths(values) if schema_for(schema, schema, p) is None]
    assert not missing, f"values without an entry in values.schema.json: {missing}"


def test_the_checks_catch_an_uncommented_or_unknown_value() -> None:
    text = "# described\na: 1\nb:\n  c: 2\n"
    commented = commented_paths(text)
    assert ("a",) in commented and ("b",) not in commented and ("b", "c") not in commented
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert schema_for(schema, schema, ("a",)) is not None
    assert schema_for(schema, schema, ("b", "c")) is None
