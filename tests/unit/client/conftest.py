"""Builders of GRPOJob and pod bodies as the API server returns them, for the client's unit tests (fixture `b`)."""

from __future__ import annotations

import types
from typing import Any, Optional

import pytest

from grpo_operator.render import manifests

UID = "job-uid"


def cond(ctype: str, status: str = "True", reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": ctype, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2030-01-01T00:00:00Z"}


def job_body(status: Optional[dict[str, Any]] = None, nodes: int = 2, **meta: Any) -> dict[str, Any]:
    body = {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob",
            "metadata": {"name": "train", "namespace": "ns", "uid": UID, "generation": 1, **meta},
            "spec": {"nodes": nodes, "runPolicy": {"suspend": False}}}
    if status is not None:
        body["status"] = status
    return body


def pod_body(rank: int, attempt: int, phase: str = "Pending", *, owner: str = UID, gated: bool = False,
             started: bool = False, exit_code: Optional[int] = None, deleting: bool = False,
             attempt_as_label: bool = False) -> dict[str, Any]:
    n = manifests.names("train")
    labels = {manifests.LABEL_JOB: n.base, manifests.LABEL_ROLE: "trainer", manifests.LABEL_RANK: str(rank)}
    annotations = {"grpo.dev/attempt": str(attempt)}
    if attempt_as_label:
        labels["grpo.dev/attempt"] = str(attempt)
        annotations = {}
    meta: dict[str, Any] = {"name": n.pod(rank), "namespace": "ns", "uid": f"{n.pod(rank)}-{attempt}",
                            "labels": labels, "annotations": annotations,
                            "creationTimestamp": f"2030-01-01T00:0{attempt}:00Z",
                            "ownerReferences": [{"kind": "GRPOJob", "uid": owner, "controller": True}]}
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:10:00Z"
    spec: dict[str, Any] = {"containers": [{"name": "trainer"}]}
    if gated:
        spec["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    status: dict[str, Any] = {"phase": phase}
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": {"exitCode": exit_code,
                                                                                  "reason": "Error"}}}]
    elif started:
        status["containerStatuses"] = [{"name": "trainer", "state": {"running": {}}}]
    return {"metadata": meta, "spec": spec, "status": status}


@pytest.fixture
def b() -> types.SimpleNamespace:
    return types.SimpleNamespace(job=job_body, pod=pod_body, cond=cond, uid=UID)
