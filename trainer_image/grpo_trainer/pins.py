"""spec.cache's pinned commits: the commit the job's staging resolved for each Hub repo (contract.STAGED_REVISIONS_ENV),
which the trainer loads instead of the revision the config names (a moving ref such as `main`, which another job's
staging may point elsewhere in the shared cache). No pin (no spec.cache, or a job staged by an older operator): the
config's revision, as before."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from .contract import DATASET_COMMITS_DIR, STAGED_REVISIONS_ENV

COMMIT = re.compile(r"^[0-9a-f]{40}$")
Pins = dict[tuple[str, str], str]  # (kind, repo) → commit


def is_commit(revision: str | None) -> bool:
    return bool(revision) and COMMIT.match(str(revision)) is not None


def parse(text: str | None) -> Pins:
    """The env value → {(kind, repo): commit}; entries that are not {kind, repo, commit: 40 hex} are ignored."""
    try:
        doc = json.loads(text or "[]")
    except ValueError:
        return {}
    out: Pins = {}
    for entry in doc if isinstance(doc, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("repo"), str) and is_commit(entry.get("commit")) \
                and entry.get("kind") in ("model", "dataset"):
            out[(entry["kind"], entry["repo"])] = entry["commit"]
    return out


def from_env(env: Mapping[str, str] | None = None) -> Pins:
    return parse((os.environ if env is None else env).get(STAGED_REVISIONS_ENV))


def model_revision(pins: Pins, repo: str, revision: Any = None) -> Any:
    """The commit staged for model `repo`, else `revision` (the config's)."""
    return pins.get(("model", repo), revision)


def dataset_cache_dir(pins: Pins, repo: str) -> str | None:
    """The datasets cache that holds the staged commit of dataset `repo` (None: not pinned, the default cache)."""
    commit = pins.get(("dataset", repo))
    return commit_cache_dir(commit) if commit else None


def commit_cache_dir(commit: str) -> str:
    import datasets

    return os.path.join(str(datasets.config.HF_DATASETS_CACHE), DATASET_COMMITS_DIR, commit)


def pin_trl_config(model: str, commit: str) -> None:
    """TRL 1.16's create_model_from_path reads the policy's config for its architecture without the revision
    (`AutoConfig.from_pretrained(model_id)`: refs/main, which a cache staged by commit does not have, or another
    commit): make that read, for `model`, use the staged commit. Only TRL's own module name is replaced."""
    from transformers import AutoConfig
    from trl.trainer import utils as trl_utils

    class _PinnedAutoConfig:
        @staticmethod
        def from_pretrained(model_id: Any, *args: Any, **kwargs: Any) -> Any:
            if model_id == model:
                kwargs.setdefault("revision", commit)
            return AutoConfig.from_pretrained(model_id, *args, **kwargs)

    trl_utils.AutoConfig = _PinnedAutoConfig
