"""Walking an OpenAPI v3 schema (the CRD's) node by node, for tests that check every property."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def walk(node: Any, path: str = "$") -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, node) for the node and every property, array item and map value below it."""
    if not isinstance(node, dict):
        return
    yield path, node
    for key, sub in (node.get("properties") or {}).items():
        yield from walk(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")
