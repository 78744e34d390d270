"""cli/documents.py: the fast YAML constructor builds exactly what PyYAML's safe constructor builds (same loader
settings), for plain and for unusual documents; the size, depth and alias limits hold."""

from __future__ import annotations

import math
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_operator.cli import documents

SCALARS = ["a", "'quoted'", '"dq\\n"', "1", "-7", "0x1F", "0o17", "017", "1_000", "1:30", "+12", "0b101", "3.5",
           "1e3", "1.5e-3", ".inf", "-.Inf", ".nan", "yes", "No", "on", "OFF", "true", "~", "null", "", "2026-11-29",
           "2026-11-29T10:00:00Z", "=", "<<", "!!str 5", "!!int '7'", "!!float 1", "!!binary aGVsbG8=", "|\n  block",
           "é", "'x: y'", "[1, 2]", "{k: v}", "!!set {a, b}", "!!omap [a: 1]"]


def _norm(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, dict):
        return {"__dict__": [(_norm(k), _norm(x)) for k, x in v.items()]}
    if isinstance(v, list):
        return [_norm(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted(map(repr, v))
    return (type(v).__name__, v)


def _both(text: str) -> tuple[Any, Any]:
    def run(loader: Any) -> Any:
        try:
            return "ok", [_norm(d) for d in yaml.load_all(text, Loader=loader)]
        except Exception as exc:
            return "error", type(exc).__name__, str(exc)
    return run(documents._Loader), run(documents._PyYAMLLoader)


@st.composite
def yaml_text(draw: Any, depth: int = 0) -> str:
    kind = draw(st.sampled_from(["scalar", "map", "seq", "flow"] if depth < 4 else ["scalar"]))
    pad = "  " * depth
    if kind == "scalar":
        return draw(st.sampled_from(SCALARS))
    if kind == "flow":
        items = draw(st.lists(st.sampled_from([s for s in SCALARS if "\n" not in s and not s.startswith("!!")]),
                              max_size=4))
        return "[" + ", ".join(i or "''" for i in items) + "]"
    n = draw(st.integers(1, 4))
    lines = []
    for _i in range(n):
        child = draw(yaml_text(depth + 1))
        block = child.startswith("|")
        if kind == "map":
            key = draw(st.sampled_from(["k", "k2", "1", "1.0", "true", "null", "<<", "=", "'q'", "k"]))
            if key == "<<":
                child = "{m: 1}"
            lines.append(f"{pad}{key}: {child}" if not block else f"{pad}{key}: |\n{pad}  block")
        else:
            lines.append(f"{pad}- {child}" if not block else f"{pad}- |\n{pad}  block")
    return "\n" + "\n".join(lines)


@settings(max_examples=400, deadline=None)
@given(yaml_text())
def test_fast_constructor_equals_pyyaml_on_generated_documents(text: str) -> None:
    fast, slow = _both("doc:" + text if text.startswith("\n") else "doc: " + text)
    assert fast == slow, text


@pytest.mark.parametrize("text", [
    "base: &b {a: 1, b: 2}\nderived:\n  <<: *b\n  b: 3\n",  # merge key
    "a: &x [1, 2]\nb: *x\nc: *x\n",  # aliases
    "&a [*a, 1]\n",  # self-reference
    "&a {k: *a}\n",
    "? [1, 2]\n: v\n",  # unhashable key
    "? {a: 1}\n: v\n",
    "a: 1\na: 2\n",  # duplicate keys: the last wins in both
    "1: a\n1.0: b\ntrue: c\n",
    "!!map {a: 1}\n", "!!seq [1]\n", "!custom x\n", "a: !custom {b: 1}\n",
    "--- a\n--- [1]\n---\n...\n", "x: 0b2\n", "x: 1__0\n", "x: 0x_1F\n",
    "[" * 70 + "]" * 70 + "\n",  # deeper than the fast path goes
    "a: &s str\nb: *s\n",
])
def test_fast_constructor_equals_pyyaml_on_unusual_documents(text: str) -> None:
    fast, slow = _both(text)
    assert fast == slow


def test_aliases_stay_shared_and_limits_still_apply() -> None:
    (doc,) = documents.load_text("a: &x {k: [1]}\nb: *x\n")
    assert doc.body["a"] is doc.body["b"]  # as PyYAML builds it: an alias bomb stays small in memory
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdef", "bcdefg", strict=False))
    with pytest.raises(documents.DocumentError, match="alias bomb"):
        documents.load_text(bomb)
    with pytest.raises(documents.DocumentError, match="deeper than 64"):
        documents.load_text("&a [*a]\n")
    with pytest.raises(documents.DocumentError, match="deeper than 64"):
        documents.load_text("[" * 80 + "]" * 80 + "\n")
    with pytest.raises(documents.DocumentError, match="not valid YAML"):
        documents.load_text("a: [1\n")
