"""A deleted job's pods go at once, running or finished: the operator deletes them itself when it sees the job
deleted, instead of leaving them to the garbage collector (issue 22 item 6). On a control plane without the
kube-controller-manager (no garbage collector), so only the operator can have deleted them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.cluster.util import wait_until
from tests.support.jobs import manifest
from tests.support.operator import OperatorProcess, install_crd, pod_exit, pod_running, pods_of, wait_job, wait_pods

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _no_pods(k: Any, ns: str, job: str) -> Callable[[], bool]:
    return lambda: not pods_of(k, ns, job)


def test_a_deleted_jobs_pods_are_deleted_by_the_operator_running_or_finished(controlplane_factory,
                                                                            tmp_path) -> None:
    cp = controlplane_factory(authorization_mode="AlwaysAllow", controller_manager=False)
    k = cp.kubectl
    install_crd(k)
    ns = "deletion"
    cp.ensure_namespace(ns)
    op = OperatorProcess(cp.kubeconfig, tmp_path, "--namespace", ns).start(wait=False)
    try:
        k.apply([manifest("done", nodes=2), manifest("run", nodes=2)], "-n", ns)
        for job in ("done", "run"):
            for p in wait_pods(k, ns, job, 2, timeout=60):
                pod_running(k, ns, p["metadata"]["name"])
            wait_job(k, ns, job, lambda s: s.get("phase") == "Running")
        for p in pods_of(k, ns, "done"):
            pod_exit(k, ns, p["metadata"]["name"], 0)
        wait_job(k, ns, "done", lambda s: s.get("phase") == "Succeeded")
        for job in ("done", "run"):
            t0 = time.monotonic()
            k("delete", "grpojob", job, "-n", ns, "--wait=true", "--timeout=30s")
            try:
                wait_until(_no_pods(k, ns, job), 30, 0.2, what=f"the pods of deleted job {job} gone")
            except TimeoutError:
                print(op.log(60))
                raise
            assert time.monotonic() - t0 < 30  # seconds, not the 120 s grace period or the collector's lag
        # the ConfigMap and Service stay for the garbage collector (none runs here): only the pods were ours to hurry
        assert k.exists("configmap", "run-config", "-n", ns)
    finally:
        op.stop()
