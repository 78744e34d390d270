"""What the download pod stages and the cache markers that say it is staged (grpo_trainer/stage.py's cache state):
an Item (a repo at a revision, and its marker key), one marker per staged commit and one per requested revision
naming its commit ($HF_HOME/grpo-stage/<key>.json), written atomically under unique temporary names.

Standard library and grpo_trainer.pins only (no Hub client): stage.py imports it, never the other way round.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import pins

MARKER_DIR = "grpo-stage"


@dataclass(frozen=True)
class Item:
    kind: str  # "model" or "dataset"
    repo_id: str
    revision: str = "main"
    trust_remote_code: bool = False
    config: str | None = None  # datasets only
    split: str = "train"

    @property
    def key(self) -> str:
        raw = json.dumps([self.kind, self.repo_id, self.revision, self.trust_remote_code, self.config, self.split])
        return hashlib.sha256(raw.encode()).hexdigest()[:32]

    @property
    def label(self) -> str:
        extra = f" config={self.config} split={self.split}" if self.kind == "dataset" else ""
        return f"{self.kind} {self.repo_id}@{self.revision}{extra}"


def _marker(hf_home: Path, item: Item) -> Path:
    return hf_home / MARKER_DIR / f"{item.key}.json"


def _read_marker(hf_home: Path, item: Item) -> dict[str, Any]:
    try:
        doc = json.loads(_marker(hf_home, item).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def already_staged(hf_home: Path, item: Item) -> bool:
    """The marker exists and every path it lists still exists (a pruned cache stages again)."""
    paths = _read_marker(hf_home, item).get("paths")
    return isinstance(paths, list) and bool(paths) and all(os.path.exists(p) for p in paths)


def at_commit(item: Item, commit: str) -> Item:
    return replace(item, revision=commit)


def known_commit(hf_home: Path, item: Item) -> str | None:
    """The commit `item`'s revision was staged at, without asking the Hub: a commit is its own; a branch or tag, the
    one its marker names (a moving `main` is staged once: later jobs reuse that commit)."""
    if pins.is_commit(item.revision):
        return item.revision
    commit = _read_marker(hf_home, item).get("commit")
    return commit if pins.is_commit(commit) else None


def _write_marker(hf_home: Path, item: Item, doc: dict[str, Any]) -> None:
    """Atomically: a unique temporary file in the same folder, renamed over the marker. (Download pods run python as
    PID 1, so a name made of the PID is the same in every pod: two of them would rename each other's file.)"""
    path = _marker(hf_home, item)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps({"item": item.label, **doc}, sort_keys=True))
        os.replace(tmp, path)  # a concurrent reader sees the old marker or the new one
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
