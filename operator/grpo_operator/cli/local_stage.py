"""`grpojob run --local` with spec.cache (or --cache-dir): the initializer's very code (`python -m
grpo_trainer.stage`) fills a local cache folder first, then the trainers read it offline, as the pods do
(docs/cache.md). Default folder: $XDG_CACHE_HOME/grpojob/hf-cache (~/.cache/grpojob/hf-cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

from grpo_trainer import contract

from .. import api
from ..lifecycle.staging import progress_message, revisions
from ..render import cache


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "grpojob" / "hf-cache"


def cache_dir_for(job: api.GRPOJob, option: Optional[str]) -> Optional[Path]:
    """The local cache folder: --cache-dir, else the default one when spec.cache is set; None: no staging."""
    if option:
        return Path(option).expanduser().resolve()
    return default_cache_dir() if job.spec.cache is not None else None


def stage(job: api.GRPOJob, config_path: Path, cache_dir: Path) -> tuple[int, dict[str, str]]:
    """Run the stage step into cache_dir (nothing when every reference is a local path); the exit code and the
    environment the trainers then need (the pods' offline layout, and the commits it staged: the trainers load
    those, as the pods do)."""
    env = {"HF_HUB_CACHE": str(cache_dir / "hub"), "HF_DATASETS_CACHE": str(cache_dir / "datasets"),
           **{k: "1" for k in cache.OFFLINE_ENV}}
    if not cache.hub_refs(job):
        return 0, {}
    cache_dir.mkdir(parents=True, exist_ok=True)
    print(f"grpojob: staging {', '.join(cache.hub_refs(job))} into {cache_dir}", file=sys.stderr)
    argv = [sys.executable, "-m", contract.STAGE_MODULE, "--config", str(config_path), "--cache-dir", str(cache_dir)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, errors="replace")
    assert proc.stdout is not None
    for line in proc.stdout:
        if not line.startswith(contract.STAGE_PREFIX):
            continue
        try:
            record = json.loads(line[len(contract.STAGE_PREFIX):])
        except ValueError:
            continue
        event = record.get("event")
        if event == "done":
            pinned = [{"kind": r.kind, "repo": r.repo, "commit": r.commit} for r in revisions(record)]
            env[contract.STAGED_REVISIONS_ENV] = json.dumps(pinned, sort_keys=True)
            print(f"grpojob: staged {len(record.get('staged') or [])}, already cached {len(record.get('cached') or [])}"
                  f" ({record.get('bytes', 0)} bytes in {record.get('seconds', 0)} s)", file=sys.stderr)
        elif event in ("start", "progress", "staged"):
            print(f"grpojob: {progress_message(record)}", file=sys.stderr)
        elif event == "retry":
            print(f"grpojob: retrying {record.get('item')} in {record.get('delaySeconds')} s: {record.get('error')}",
                  file=sys.stderr)
    code = proc.wait()
    if code != 0:
        print(f"grpojob: staging failed with exit code {code} ({contract.exit_reason(code)})", file=sys.stderr)
    return code, env
