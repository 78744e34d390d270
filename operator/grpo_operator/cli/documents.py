"""Reads YAML documents from files safely: size, alias-bomb and depth limits, Kubernetes' string timestamps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_NODES = 200_000  # after expanding aliases; a normal GRPOJob has ~100
MAX_DEPTH = 64

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _PyYAMLLoader(_Base):  # type: ignore[misc, valid-type]
    """Safe loader whose timestamps stay strings (as kubectl's YAML → JSON keeps them)."""


_PyYAMLLoader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}

_TAG = "tag:yaml.org,2002:"
_STR, _MAP, _SEQ, _MERGE = _TAG + "str", _TAG + "map", _TAG + "seq", _TAG + "merge"
_SCALARS = {t: _PyYAMLLoader.yaml_constructors[t] for t in (_TAG + "int", _TAG + "float", _TAG + "bool", _TAG + "null")}


class _Unusual(Exception):
    """A node the fast path leaves to PyYAML (a merge key, another tag, a cycle, deep nesting)."""


class _Loader(_PyYAMLLoader):
    """Builds the same data as _PyYAMLLoader, ~2× faster for plain documents (maps, lists, str/int/float/bool/null).

    libyaml parses in C, but PyYAML's constructor is Python with per-node generic machinery; it was half of
    `grpojob check`'s time. Scalars still go through PyYAML's own constructors (YAML 1.1 ints, floats and bools), and
    anything else (merge keys, explicit tags, self-reference, nesting deeper than MAX_DEPTH) falls back to PyYAML for
    the whole document, so the result is PyYAML's in every case (tests/core/test_documents.py compares them).
    """

    def construct_document(self, node: Any) -> Any:
        try:
            return self._plain(node, 0, {}, set())
        except _Unusual:
            return super().construct_document(node)

    def _plain(self, node: Any, depth: int, memo: dict[int, Any], active: set[int]) -> Any:
        cls = node.__class__
        if cls is yaml.ScalarNode:
            if node.tag == _STR:
                return node.value
            ctor = _SCALARS.get(node.tag)
            if ctor is None:
                raise _Unusual
            return ctor(self, node)
        key = id(node)
        if key in memo:  # an alias: the same object, as PyYAML shares it
            return memo[key]
        if key in active or depth >= MAX_DEPTH:
            raise _Unusual
        active.add(key)
        out: Any
        if cls is yaml.MappingNode and node.tag == _MAP:
            out = {}
            for k, v in node.value:
                if k.tag == _MERGE:
                    raise _Unusual
                name = self._plain(k, depth + 1, memo, active)
                try:
                    out[name] = self._plain(v, depth + 1, memo, active)
                except TypeError:  # an unhashable key: PyYAML's error message
                    raise _Unusual from None
        elif cls is yaml.SequenceNode and node.tag == _SEQ:
            out = [self._plain(c, depth + 1, memo, active) for c in node.value]
        else:
            raise _Unusual
        active.discard(key)
        memo[key] = out
        return out


class DocumentError(Exception):
    """The file cannot be read as YAML documents (check exits 2)."""


@dataclass
class Document:
    file: str
    index: int  # 0-based position in the file
    body: Any


def _check_size(value: Any) -> None:
    """Counts nodes as a consumer would see them (aliases expanded) without expanding them."""
    budget = MAX_NODES
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        budget -= 1
        if budget < 0:
            raise DocumentError(f"document expands to more than {MAX_NODES} values (a YAML alias bomb?)")
        if depth > MAX_DEPTH:
            raise DocumentError(f"document nests deeper than {MAX_DEPTH} levels (or refers to itself)")
        if isinstance(node, dict):
            for v in node.values():
                stack.append((v, depth + 1))
        elif isinstance(node, list):
            for v in node:
                stack.append((v, depth + 1))


def _problem_text(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"not valid YAML{where}: {problem}"


def load_text(text: str, file: str = "<stdin>") -> list[Document]:
    try:
        bodies = list(yaml.load_all(text, Loader=_Loader))
    except yaml.YAMLError as exc:
        raise DocumentError(_problem_text(exc)) from None
    except (RecursionError, MemoryError, ValueError, TypeError, OverflowError) as exc:
        raise DocumentError(f"not valid YAML: {type(exc).__name__}") from None
    out = []
    for i, body in enumerate(bodies):
        if body is None:  # an empty document (a stray '---')
            continue
        _check_size(body)
        out.append(Document(file, i, body))
    return out


STDIN = "-"  # the FILE argument that means standard input (what a pipeline pipes)


def display_name(path: str) -> str:
    """How messages name the file: stdin as <stdin>."""
    return "<stdin>" if path == STDIN else path


def _read_stdin() -> bytes:
    import sys

    raw = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise DocumentError(f"standard input is more than the {MAX_FILE_BYTES} bytes a manifest may have")
    return raw


def load_file(path: str) -> list[Document]:
    """The documents of a file, or of standard input for "-"."""
    p = Path(path)
    try:
        if path == STDIN:
            return _decode(_read_stdin(), display_name(path))
        if p.is_dir():
            raise DocumentError("is a directory, expected a YAML file")
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise DocumentError(f"file is {size} bytes, more than the {MAX_FILE_BYTES} a manifest may have")
        raw = p.read_bytes()
    except OSError as exc:
        raise DocumentError(f"cannot read file: {exc.strerror or exc}") from None
    return _decode(raw, path)


def _decode(raw: bytes, file: str) -> list[Document]:
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"not UTF-8 text (byte {exc.start})") from None
    return load_text(text, file)


def name_of(body: Any) -> str:
    meta = body.get("metadata") if isinstance(body, dict) else None
    name: Optional[Any] = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""
