"""A pod create the API server refuses is reported: a FailedCreate Warning Event with the server's message
(controller/refused.py), on the real control plane. (ResourceQuota is not enforced on this control plane: it runs
no quota controller.)"""

from __future__ import annotations

import json

import pytest

from tests.support.cluster.util import wait_until
from tests.support.jobs import manifest
from tests.support.operator import OperatorProcess, pods_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_refused_pod_create_becomes_a_failed_create_event(crd, kubectl, k8s_namespace, tmp_path) -> None:
    k, ns = kubectl, k8s_namespace
    op = OperatorProcess(crd.kubeconfig, tmp_path, "--namespace", ns)
    op.start(wait=False)
    try:
        # a volume name the API server refuses (422 Invalid; volumes are free-form Kubernetes objects in the spec)
        job = manifest("refused", nodes=2)
        job["spec"]["template"] = {"volumes": [{"name": "Not_A_DNS_Label", "emptyDir": {}}]}
        k.apply([job], "-n", ns)

        def failed_create() -> list:
            items = k.json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=refused")["items"]
            return [e for e in items if e.get("reason") == "FailedCreate"]

        try:
            events = wait_until(failed_create, 60, 0.3, what="a FailedCreate event")
        except TimeoutError:
            print(op.log(60))
            raise
        ev = events[0]
        assert ev["type"] == "Warning" and ev["involvedObject"]["kind"] == "GRPOJob"
        assert "422" in ev["message"] and "Not_A_DNS_Label" in ev["message"] and "refused-node-" in ev["message"], \
            json.dumps(ev)
        assert not pods_of(k, ns, "refused")
    finally:
        op.stop()
