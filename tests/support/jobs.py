"""Builders of GRPOJob and Pod bodies for the operator tests."""

from __future__ import annotations

import copy
from typing import Any, Optional

from grpo_operator.render import manifests


def job_spec(*, nodes: int = 1, gpus: int = 4, num_generations: int = 8, per_device: int = 2, grad_accum: int = 1,
             backoff_limit: int = 3, deadline: Optional[int] = None, ttl: Optional[int] = None, suspend: bool = False,
             vllm_server: bool = False, cpu: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "dataset": {"name": "openai/gsm8k", "config": "main", "promptColumn": "question", "answerColumn": "answer"},
        "rewards": [{"name": "accuracy"}],
        "nodes": nodes,
        "training": {"perDeviceTrainBatchSize": per_device, "gradientAccumulationSteps": grad_accum,
                     "numGenerations": num_generations, "maxSteps": 10},
        "output": {"volumeClaimName": "ckpt", "path": "/ckpt"},
        "runPolicy": {"backoffLimit": backoff_limit, "suspend": suspend},
    }
    if cpu:
        spec["vllm"] = {"mode": "none"}
    else:
        spec["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    if vllm_server:
        spec["vllm"] = {"mode": "server", "server": {"resources": {"limits": {"nvidia.com/gpu": 1}}}}
    if deadline is not None:
        spec["runPolicy"]["activeDeadlineSeconds"] = deadline
    if ttl is not None:
        spec["runPolicy"]["ttlSecondsAfterFinished"] = ttl
    return spec


def job_body(name: str, *, namespace: str = "ns", uid: str = "uid-1", generation: int = 1,
             status: Optional[dict[str, Any]] = None, labels: Optional[dict[str, str]] = None,
             **spec_kw: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid, "generation": generation,
                            "resourceVersion": "1"}
    if labels:
        meta["labels"] = labels
    body = {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": meta, "spec": job_spec(**spec_kw)}
    if status is not None:
        body["status"] = copy.deepcopy(status)
    return body


def pod_body(job: str, rank: int, phase: str = "Running", *, attempt: int = 0, uid: str = "uid-1",
             owner_kind: str = "GRPOJob", exit_code: Optional[int] = None, signal: Optional[int] = None,
             container_reason: Optional[str] = None, pod_reason: Optional[str] = None, deleting: bool = False,
             unschedulable: Optional[str] = None, waiting: Optional[str] = None, vllm: bool = False,
             finished_at: Optional[str] = None) -> dict[str, Any]:
    n = manifests.names(job)
    name = n.vllm_pod(0) if vllm else n.pod(rank)
    labels = {manifests.LABEL_JOB: n.base, manifests.LABEL_ROLE: "vllm-server" if vllm else "trainer"}
    if not vllm:
        labels[manifests.LABEL_RANK] = str(rank)
    meta: dict[str, Any] = {
        "name": name, "namespace": "ns", "uid": f"pod-{name}-{attempt}", "labels": labels,
        "annotations": {manifests.ANNOTATION_ATTEMPT: str(attempt), manifests.ANNOTATION_JOB: job},
        "ownerReferences": [{"apiVersion": "grpo.dev/v1alpha1", "kind": owner_kind, "name": job, "uid": uid,
                             "controller": True}],
    }
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T12:00:00Z"
    status: dict[str, Any] = {"phase": phase}
    if pod_reason:
        status["reason"] = pod_reason
    cname = "vllm" if vllm else "trainer"
    if exit_code is not None or signal is not None or container_reason:
        term: dict[str, Any] = {"exitCode": exit_code if exit_code is not None else 137}
        if signal:
            term["signal"] = signal
        if container_reason:
            term["reason"] = container_reason
        if finished_at:
            term["finishedAt"] = finished_at
        status["containerStatuses"] = [{"name": cname, "state": {"terminated": term}}]
    elif waiting:
        status["containerStatuses"] = [{"name": cname, "state": {"waiting": {"reason": waiting, "message": "back-off"}}}]
    elif phase == "Running":
        status["containerStatuses"] = [{"name": cname, "state": {"running": {"startedAt": "2030-01-01T11:00:00Z"}}}]
    if unschedulable:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                 "message": unschedulable}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {}, "status": status}


def manifest(name: str, *, labels: Optional[dict[str, str]] = None, **spec_kw: Any) -> dict[str, Any]:
    """A GRPOJob to apply to a cluster."""
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": meta, "spec": job_spec(**spec_kw)}
