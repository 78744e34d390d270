"""How the validator words an error (pure): FieldError (a field's path and its message), pydantic's errors in a user's
terms (the path as written, "did you mean", a pattern's meaning, the choices of a Literal), a user's value as written
(short) and the cap on errors per object. Imports only api (the models and their patterns); rules/validation.py uses it.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from .. import api

MAX_ERRORS = 20  # reported per object: a denial stays short (400 bad env names made a ~460 KB one)


@dataclass
class FieldError:
    field: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message}


def _sub_models(tp: Any) -> list[type[BaseModel]]:
    import typing

    out = []
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        out.append(tp)
    for arg in typing.get_args(tp):
        out += _sub_models(arg)
    return out


def _siblings(parent_loc: tuple[Any, ...]) -> list[str]:
    """Field names of the model at parent_loc (for 'did you mean')."""
    model: Any = api.GRPOJobSpec
    for part in parent_loc:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part) if model else None
        subs = _sub_models(info.annotation) if info else []
        model = subs[0] if subs else None
        if model is None:
            return []
    return [info.alias or name for name, info in model.model_fields.items()] if model else []

_UNION_TAGS = re.compile(
    r"^(int|str|float|bool|none|literal\[.*\]|list\[.*\]|dict\[.*\]|function-.*|constrained-.*|[a-z_]+\[.*\])$")


_PATTERN_TEXT = {
    api.REF_PATTERN: "must be a Hub id or a path without whitespace or control characters",
    api.FUNCTION_PATTERN: "must be 'module.path:function' (Python identifiers, e.g. my_rewards:score)",
    api.IMAGE_PATTERN: "must be an image reference like registry/name:tag",
    api.ABS_PATH_PATTERN: "must be an absolute path of letters, digits, '.', '_', '-' and '/'",
    api.ENV_NAME: "must be a valid environment variable name",
    api.MODULE_NAME: "must be a module name of letters, digits, '_', '.' and '-' (e.g. q_proj)",
}


def _path(loc: tuple[Any, ...], prefix: str = "spec") -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and _UNION_TAGS.match(part):
            continue
        elif isinstance(part, str) and ("." in part or "/" in part or not part.isidentifier()):
            out += f"[{part}]"
        else:
            out += f".{part}"
    return out


def short(value: Any) -> str:
    """A user's value as they wrote it (JSON, which YAML reads too: null, "text", {"a": 1}), never a Python repr."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):  # a key JSON cannot write (a YAML list as a key)
        text = str(value)
    return text if len(text) <= 60 else text[:57] + "…"


_PY_TYPE = re.compile(r" or instance of [A-Za-z]+")
_QUOTED = re.compile(r"'([^']*)'")


def _choice_message(err: Any) -> str:
    """An enum-like (Literal) field: the choices, and the closest one to what was written."""
    choices = _QUOTED.findall(str((err.get("ctx") or {}).get("expected", "")))
    got = err.get("input")
    hint = difflib.get_close_matches(got, choices, n=1, cutoff=0.6) if isinstance(got, str) else []
    did = f"; did you mean '{hint[0]}'?" if hint else ""
    return f"{short(got)} is not one of {', '.join(choices)}{did}"


def pydantic_errors(exc: ValidationError, prefix: str = "spec") -> list[FieldError]:
    out: dict[str, FieldError] = {}
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        path = _path(loc, prefix)
        kind = err["type"]
        msg = err["msg"]
        if kind == "missing":
            msg = "required field is missing"
        elif kind == "extra_forbidden":
            name = str(loc[-1]) if loc else "?"
            # a flood of unknown keys: only the errors reported (capped) get a fuzzy match, computed once each
            hint = difflib.get_close_matches(name, _siblings(loc[:-1]), n=1, cutoff=0.6) \
                if len(out) < MAX_ERRORS and len(name) <= 64 else []
            msg = f"unknown field '{short(name)[1:-1]}'" + (f"; did you mean '{hint[0]}'?" if hint else "")
        elif kind == "string_pattern_mismatch":
            pattern = str((err.get("ctx") or {}).get("pattern"))
            msg = f"{_PATTERN_TEXT.get(pattern, 'has an invalid format')} (got {short(err.get('input'))})"
        elif kind == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif kind == "literal_error":
            msg = _choice_message(err)
        else:
            msg = f"{_PY_TYPE.sub('', msg)} (got {short(err.get('input'))})"
        if "\n" in msg:  # a validator's several findings for one field: an error each
            for i, line in enumerate(msg.splitlines()):
                out.setdefault(f"{path}\n{i}", FieldError(path, line))
            continue
        if path in out:
            if msg not in out[path].message:
                out[path].message += f"; or {msg}"
        else:
            out[path] = FieldError(path, msg)
    return list(out.values())


def capped(errors: list[FieldError], limit: int = MAX_ERRORS) -> list[FieldError]:
    """At most `limit` errors, the rest summed up in one more."""
    if len(errors) <= limit:
        return errors
    return errors[:limit] + [FieldError("spec", f"…and {len(errors) - limit} more errors (fix these first)")]
