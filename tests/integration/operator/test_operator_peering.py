"""`--peering NAME` (kopf's HA, kept for compatibility) is the one mode in which kopf, not the operator's own watch
(controller/jobwatch.py), follows the GRPOJobs, because kopf's peering pauses only kopf's own watches: its events feed
the same Controller.job_event. A real API server and kopf's peering CRD: a job gets its pods, and a deleted job's
pods go (no garbage collector runs here: only the operator can have deleted them)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.cluster.util import wait_until
from tests.support.jobs import manifest
from tests.support.operator import OperatorProcess, install_crd, pods_of, wait_job, wait_pods

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def peering_crd() -> dict[str, Any]:
    """kopf's namespaced peering object (kopf.dev/v1 KopfPeering), as kopf's documentation defines it."""
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "kopfpeerings.kopf.dev"},
            "spec": {"scope": "Namespaced", "group": "kopf.dev",
                     "names": {"kind": "KopfPeering", "plural": "kopfpeerings", "singular": "kopfpeering"},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                                                  "x-kubernetes-preserve-unknown-fields": True}}}]}}


def test_with_kopf_peering_kopfs_watch_feeds_the_controller(controlplane_factory, tmp_path) -> None:
    cp = controlplane_factory(authorization_mode="AlwaysAllow", controller_manager=False)
    k = cp.kubectl
    install_crd(k)
    k.apply(peering_crd(), validate=False)
    ns = "peering"
    cp.ensure_namespace(ns)
    wait_until(lambda: k("get", "kopfpeerings", "-n", ns, check=False).returncode == 0, 30, 0.2,
               what="the peering CRD served")
    k.apply({"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "grpo", "namespace": ns}},
            validate=False)
    op = OperatorProcess(cp.kubeconfig, tmp_path, "--namespace", ns, "--peering", "grpo").start(wait=False)
    try:
        k.apply([manifest("peered", nodes=2)], "-n", ns)
        try:
            wait_pods(k, ns, "peered", 2, timeout=60)
        except TimeoutError:
            print(op.log(80))
            raise
        wait_job(k, ns, "peered", lambda s: any(c["type"] == "Created" and c["status"] == "True"
                                                for c in s.get("conditions") or []))
        k("delete", "grpojob", "peered", "-n", ns, "--wait=true", "--timeout=30s")
        wait_until(lambda: not pods_of(k, ns, "peered"), 30, 0.2, what="the deleted job's pods gone")
    finally:
        op.stop()
