"""AdmissionReviews as the API server sends them to our webhook, and the costliest GRPOJob the CRD lets through to it
(shared by bench/webhook_bench.py and the webhook load test)."""

from __future__ import annotations

import uuid
from typing import Any

from tests.support.jobs import manifest


def worst_spec(name: str) -> dict[str, Any]:
    """The costliest GRPOJob the CRD admits to the webhook: every preserved object at its maxProperties (unknown
    keys spelt like typos of real fields), free-form maps of nested values just inside the validator's depth bound."""
    from grpo_operator.api import crd

    width = getattr(crd, "MAX_UNKNOWN_PROPERTIES", 64)  # (the same spec against a release without the bound)
    obj = manifest(name, nodes=2)
    spec = obj["spec"]
    deep: object = 1
    for _ in range(24):
        deep = {"a": deep}
    for i in range(width):
        spec["training"][f"learningRat{i:02d}"] = i  # a typo's "did you mean" is the costly answer
        spec[f"node{i:02d}"] = i
    spec["training"]["modelInitKwargs"] = {f"k{i:02d}": deep for i in range(width)}
    spec["training"]["generationKwargs"] = {f"k{i:02d}": deep for i in range(width)}
    return obj


def review_request(obj: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    """A CREATE AdmissionReview of `obj`."""
    gvk = {"group": "grpo.dev", "version": "v1alpha1", "kind": "GRPOJob"}
    gvr = {"group": "grpo.dev", "version": "v1alpha1", "resource": "grpojobs"}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
        "name": obj["metadata"]["name"], "namespace": namespace, "operation": "CREATE",
        "userInfo": {"username": "load"}, "object": obj, "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}}
