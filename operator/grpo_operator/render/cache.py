"""spec.cache in the pods (pure): the cache claim's volume, mounts and environment (docs/cache.md).

The initializer (render/initializer.py) mounts the claim read-write at CACHE_DIR and stages into HF_HOME=CACHE_DIR.
Trainer and vLLM pods mount the Hub cache read-only (HF_HUB_CACHE=CACHE_DIR/hub) and the datasets Arrow cache
read-write at DATASETS_DIR: an offline `load_dataset(<hub id>)` takes a lock file in it, and fails on a read-only
folder. Both with HF_HUB_OFFLINE/HF_DATASETS_OFFLINE/TRANSFORMERS_OFFLINE=1, so they never reach the Hub, and without the
job's HF token (only the download pod needs it). Once staged, `pin` gives them the commits the download pod resolved
(status.stagedRevisions): they load those, never a branch such as `main` that another job's staging may move.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from grpo_trainer import contract

from .. import api

CACHE_VOLUME = "hf-cache"
CACHE_DIR = "/hf-cache"
DATASETS_DIR = "/hf-datasets"
OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
# A Hub id: "name" or "namespace/name" (the Hub's own grammar, loosely); anything else is a path in the pod.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.\-]+)?$")


def is_hub_id(ref: str) -> bool:
    """True when the trainer would fetch `ref` from the Hub: not a path (/, ./, ../, ~, or more than one '/')."""
    return not ref.startswith(("/", "./", "../", "~", ".")) and _HUB_ID.match(ref) is not None


def hub_refs(job: api.GRPOJob) -> list[str]:
    """The model, reward models and dataset of the job that come from the Hub (what the initializer stages)."""
    spec = job.spec
    refs = [spec.model] + [m for r in spec.rewards if isinstance(m := getattr(r, "model", None), str)] \
        + [spec.dataset.name]
    return [r for r in refs if is_hub_id(r)]


def needs_initializer(job: api.GRPOJob) -> bool:
    """spec.cache is set and something comes from the Hub; local/PVC paths alone need no download pod."""
    return job.spec.cache is not None and bool(hub_refs(job))


def _sub(cache: api.CacheSpec, tail: str = "") -> dict[str, str]:
    path = "/".join(p for p in (cache.subPath or "", tail) if p)
    return {"subPath": path} if path else {}


def volume(cache: api.CacheSpec) -> dict[str, Any]:
    return {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": cache.volumeClaimName}}


def reader_mounts(cache: api.CacheSpec) -> list[dict[str, Any]]:
    """Trainer and vLLM pods: the Hub cache read-only, the datasets cache writable (its lock files)."""
    return [{"name": CACHE_VOLUME, "mountPath": CACHE_DIR, "readOnly": True, **_sub(cache)},
            {"name": CACHE_VOLUME, "mountPath": DATASETS_DIR, **_sub(cache, "datasets")}]


def writer_mount(cache: api.CacheSpec) -> dict[str, Any]:
    return {"name": CACHE_VOLUME, "mountPath": CACHE_DIR, **_sub(cache)}


def reader_env() -> list[dict[str, Any]]:
    return [{"name": "HF_HUB_CACHE", "value": f"{CACHE_DIR}/hub"},
            {"name": "HF_DATASETS_CACHE", "value": DATASETS_DIR}] + [{"name": k, "value": "1"} for k in OFFLINE_ENV]


def apply_reader(job: api.GRPOJob, volumes: list[dict[str, Any]], mounts: list[dict[str, Any]],
                 env: list[dict[str, Any]]) -> None:
    """With spec.cache: add the cache to a trainer/vLLM pod's volumes, mounts and env (in place); else nothing."""
    cache = job.spec.cache
    if cache is None:
        return
    volumes.append(volume(cache))
    mounts.extend(reader_mounts(cache))
    ours = {e["name"] for e in reader_env()}
    env[:] = [e for e in env if e["name"] not in ours and e != _token_env(job)] + reader_env()


def _token_env(job: api.GRPOJob) -> dict[str, Any] | None:
    """The HF_TOKEN entry spec.hfTokenSecretRef renders (one the user sets in template.env stays theirs)."""
    ref = job.spec.hfTokenSecretRef
    return None if ref is None else {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def pin(job: api.GRPOJob, objs: list[dict[str, Any]], staged: Sequence[api.StagedRevision]) -> None:
    """The staged commits into the trainer and vLLM pods (in place): contract.STAGED_REVISIONS_ENV for the trainer,
    and the policy's commit as the vLLM server's --revision/--tokenizer-revision. Nothing without spec.cache or
    before staging recorded them (a job staged by an older operator keeps loading its revision)."""
    if job.spec.cache is None or not staged:
        return
    value = json.dumps([{"kind": r.kind, "repo": r.repo, "commit": r.commit} for r in staged], sort_keys=True)
    policy = next((r.commit for r in staged if r.kind == "model" and r.repo == job.spec.model), None)
    for obj in objs:
        role = obj["metadata"].get("labels", {}).get(contract.LABEL_ROLE) if obj.get("kind") == "Pod" else None
        if role not in (contract.ROLE_TRAINER, contract.ROLE_VLLM):
            continue
        container = obj["spec"]["containers"][0]
        container["env"] = [e for e in container["env"] if e["name"] != contract.STAGED_REVISIONS_ENV] \
            + [{"name": contract.STAGED_REVISIONS_ENV, "value": value}]
        if role == contract.ROLE_VLLM and policy is not None:
            container["args"] = _with_revision(container["args"], policy)


def _with_revision(args: list[str], commit: str) -> list[str]:
    """vLLM's argv serving `commit`: an existing --revision/--tokenizer-revision value replaced, else both added."""
    out = list(args)
    for flag in ("--revision", "--tokenizer-revision"):
        if flag in out[:-1]:
            out[out.index(flag) + 1] = commit
        else:
            out += [flag, commit]
    return out
