"""What the controller's pod index keeps of a pod: its job's key, the lifecycle's summary and, for a trainer or the
download pod, where it serves its metrics or progress."""

from __future__ import annotations

from typing import Any, Optional

from .. import api, lifecycle
from ..lifecycle import progress as progress_mod
from ..render import manifests
from .workqueue import Key

__all__ = ["endpoint_of_pod", "job_key_of_pod", "pod_entry"]


def endpoint_of_pod(meta: Any, spec: Any, status: Any,
                    role: str = lifecycle.ROLE_TRAINER) -> progress_mod.Endpoint:
    """Where a trainer pod serves its metrics (the download pod its progress): status.podIP and the container port
    named `metrics`."""
    port = None
    for c in (spec or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == manifests.METRICS_PORT_NAME and isinstance(p.get("containerPort"), int):
                port = p["containerPort"]
    ann = meta.get("annotations") or {}
    return progress_mod.Endpoint(
        pod=meta.get("name", ""), ip=(status or {}).get("podIP") or None, port=port,
        attempt=lifecycle.as_int(ann.get(manifests.ANNOTATION_ATTEMPT), 0),
        running=(status or {}).get("phase") == lifecycle.PodPhase.RUNNING and not meta.get("deletionTimestamp"),
        role=role)


def pod_entry(pod: dict[str, Any]) -> Optional[tuple[Key, tuple[lifecycle.PodInfo, Optional[progress_mod.Endpoint]]]]:
    """What the pod index keeps of a pod, under its job's key; None for a pod of no job."""
    meta = pod.get("metadata") or {}
    job = job_key_of_pod(meta)
    if not job:
        return None
    role = (meta.get("labels") or {}).get(manifests.LABEL_ROLE, lifecycle.ROLE_TRAINER)
    scraped = role in (lifecycle.ROLE_TRAINER, lifecycle.ROLE_INITIALIZER)  # /metrics, the download's /progress
    endpoint = endpoint_of_pod(meta, pod.get("spec"), pod.get("status"), role) if scraped else None
    return (meta.get("namespace", ""), job), (lifecycle.summarize_pod(pod), endpoint)


def job_key_of_pod(meta: Any) -> Optional[str]:
    ann = meta.get("annotations") or {}
    name = ann.get(manifests.ANNOTATION_JOB)
    if name:
        return name
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == api.KIND:
            return ref.get("name")
    return (meta.get("labels") or {}).get(manifests.LABEL_JOB)
