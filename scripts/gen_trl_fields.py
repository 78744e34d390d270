"""Regenerate operator/grpo_operator/api/data/grpo_config_fields.json from the installed TRL.

The operator must not import TRL at run time (it drags in torch), so it reads this table instead.
tests/test_trl_fields.py regenerates it and fails when it drifts from the pinned TRL.
Usage: python scripts/gen_trl_fields.py [--check]
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
import types
import typing
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "operator" / "grpo_operator" / "api" / "data" / "grpo_config_fields.json"


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def classify(tp) -> tuple[str, bool, list | None]:
    """(kind, nullable, choices) where kind is bool|int|float|str|list[str]|list[float]|dict|any."""
    nullable = False
    choices: list | None = None
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    parts = []
    for a in args:
        if a is type(None):
            nullable = True
            continue
        if typing.get_origin(a) is typing.Literal:
            lits = [v for v in typing.get_args(a)]
            if lits == [False]:
                parts.append("falselit")
                continue
            parts.append("str")
            continue
        if isinstance(a, type) and issubclass(a, enum.Enum):
            choices = sorted(str(m.value) for m in a)
            parts.append("enum")
            continue
        origin = typing.get_origin(a)
        if a is bool:
            parts.append("bool")
        elif a is int:
            parts.append("int")
        elif a is float:
            parts.append("float")
        elif a is str:
            parts.append("str")
        elif a is dict or origin is dict:
            parts.append("dict")
        elif origin is list:
            inner = typing.get_args(a)
            if inner and inner[0] is str:
                parts.append("list[str]")
            elif inner and inner[0] is float:
                parts.append("list[float]")
            else:
                parts.append("list[any]")
        else:
            parts.append("opaque")
    ps = set(parts)
    if ps == {"enum", "str"} or ps == {"enum"}:
        return "str", nullable, choices
    if len(ps) == 1:
        return ps.pop(), nullable, None
    if ps == {"int", "str"}:
        return "int-or-string", nullable, None
    return "any", nullable, None


def jsonable(v):
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, (bool, int, str)) or v is None:
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else str(v)
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    return repr(v)


def generate() -> dict:
    import trl
    from trl import GRPOConfig

    fields = []
    for f in dataclasses.fields(GRPOConfig):
        if not f.init:
            continue
        kind, nullable, choices = classify(f.type)
        if f.default is not dataclasses.MISSING:
            default = jsonable(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = jsonable(f.default_factory())
        else:
            default = None
        fields.append(
            {
                "name": f.name,
                "camel": camel(f.name),
                "kind": kind,
                "nullable": nullable,
                "choices": choices,
                "default": default,
                "help": " ".join(str(f.metadata.get("help", "")).split()),
            }
        )
    return {"trl": trl.__version__, "class": "GRPOConfig", "fields": fields}


def render() -> str:
    return json.dumps(generate(), indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        sys.exit(0 if OUT.read_text() == text else 1)
    OUT.write_text(text)
    print(f"wrote {OUT}")
