"""What create_job and validate_job accept, turned into a GRPOJob body: a dict (a whole GRPOJob, or a bare spec), a
YAML file (one document; "-": stdin) or an API model."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from . import _contract as c
from .errors import InvalidJob

MAX_FILE_BYTES = 4 * 1024 * 1024
JobInput = Union[Mapping[str, Any], str, os.PathLike, Any]


def body_from(job: JobInput, name: Optional[str]) -> tuple[dict[str, Any], str]:
    """The GRPOJob body from a dict (a whole GRPOJob, or a bare spec with `name`), a YAML file or an API model."""
    if isinstance(job, (str, os.PathLike)):
        path = os.fspath(job)
        return load_file(path), "<stdin>" if path == "-" else path
    dump = getattr(job, "model_dump", None)
    if callable(dump):  # api.GRPOJob or api.GRPOJobSpec
        data = dump(mode="json", exclude_unset=True, by_alias=True)
        if hasattr(job, "spec"):
            data["apiVersion"], data["kind"] = c.API_VERSION, c.KIND
            data.pop("status", None)
            return data, ""
        return {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {}, "spec": data}, ""
    if isinstance(job, Mapping):
        body = json.loads(json.dumps(job, default=str))  # a deep copy that is plain JSON
        if "spec" not in body and "kind" not in body and "model" in body:
            body = {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {}, "spec": body}
        return body, ""
    raise InvalidJob([("", f"create_job takes a dict, a YAML file path or an api model, not {type(job).__name__}")])

def load_file(path: str) -> dict[str, Any]:
    if path == "-":
        return one_document(sys_stdin_text(), "<stdin>")
    p = Path(path)
    try:
        if p.is_dir():
            raise InvalidJob([("", "is a directory, expected a YAML file")], path)
        if p.stat().st_size > MAX_FILE_BYTES:
            raise InvalidJob([("", f"larger than {MAX_FILE_BYTES} bytes")], path)
        text = p.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise InvalidJob([("", f"cannot read: {exc.strerror or exc}")], path) from None
    except UnicodeDecodeError as exc:
        raise InvalidJob([("", f"not UTF-8 text (byte {exc.start})")], path) from None
    return one_document(text, path)

def one_document(text: str, source: str) -> dict[str, Any]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise InvalidJob([("", f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}")], source) from None
    if len(docs) != 1:
        raise InvalidJob([("", f"expected one GRPOJob document, found {len(docs)}")], source)
    if not isinstance(docs[0], dict):
        raise InvalidJob([("", f"expected a GRPOJob mapping, got {type(docs[0]).__name__}")], source)
    return docs[0]


def sys_stdin_text() -> str:
    import sys

    return sys.stdin.read()
