"""The real control plane works: kubectl, GC, the status subresource, restarts, RBAC."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.cluster.controlplane import ControlPlane
from tests.support.cluster.kubectl import Kubectl


def wait_for(pred, timeout: float = 60.0, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def pod(name: str, namespace: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "command": ["true"]}]}}


def owned_configmap(name: str, namespace: str, owner: dict) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "ownerReferences": [{
                "apiVersion": owner["apiVersion"], "kind": owner["kind"],
                "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                "controller": True, "blockOwnerDeletion": True}]},
            "data": {"k": "v"}}


WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.infra-test.grpo.dev"},
    "spec": {
        "group": "infra-test.grpo.dev", "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [{
            "name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object",
                         "x-kubernetes-validations": [{"rule": "self.min <= self.max",
                                                       "message": "min must be <= max"}],
                         "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}}},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}},
        }],
    },
}


def test_kubectl_basics(kubectl: Kubectl, k8s_namespace: str) -> None:
    kubectl.apply(pod("p0", k8s_namespace))
    got = kubectl.json("get", "pod", "p0", "-n", k8s_namespace)
    assert got["metadata"]["uid"]
    assert got["status"].get("phase") == "Pending"  # no scheduler, no kubelet
    names = kubectl("get", "namespaces", "-o", "name").stdout.split()
    assert f"namespace/{k8s_namespace}" in names


def test_garbage_collector_removes_dependent(controlplane, kubectl: Kubectl, k8s_namespace: str) -> None:
    if not getattr(controlplane, "controller_manager", None):
        pytest.skip("no kube-controller-manager: no garbage collection")
    kubectl.apply(pod("owner", k8s_namespace))
    owner = kubectl.json("get", "pod", "owner", "-n", k8s_namespace)
    kubectl.apply(owned_configmap("dependent", k8s_namespace, owner))
    assert kubectl.exists("configmap", "dependent", "-n", k8s_namespace)
    # An unscheduled pod (no nodeName) is deleted at once, without a kubelet.
    kubectl("delete", "pod", "owner", "-n", k8s_namespace, "--wait=true", "--timeout=30s")
    wait_for(lambda: not kubectl.exists("configmap", "dependent", "-n", k8s_namespace),
             timeout=60, what="GC of the dependent ConfigMap")


def test_pod_status_subresource_patch(kubectl: Kubectl, k8s_namespace: str) -> None:
    """Tests play the kubelet: `kubectl patch pod … --subresource=status` works against 1.20."""
    kubectl.apply(pod("p1", k8s_namespace))
    status = {"phase": "Running", "podIP": "10.1.2.3",
              "conditions": [{"type": "Ready", "status": "True"}],
              "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0,
                                     "image": "busybox:1.36", "imageID": "",
                                     "state": {"running": {"startedAt": "2024-01-01T00:00:00Z"}}}]}
    kubectl.patch_status("pod", "p1", status, "-n", k8s_namespace)
    got = kubectl.json("get", "pod", "p1", "-n", k8s_namespace)
    assert got["status"]["phase"] == "Running"
    assert got["status"]["containerStatuses"][0]["ready"] is True

    # Terminate it like a kubelet would, with an exit code.
    kubectl.patch_status("pod", "p1", {"phase": "Failed", "containerStatuses": [
        {"name": "main", "ready": False, "restartCount": 0, "image": "busybox:1.36", "imageID": "",
         "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}, "-n", k8s_namespace)
    got = kubectl.json("get", "pod", "p1", "-n", k8s_namespace)
    assert got["status"]["phase"] == "Failed"
    assert got["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137

    # Without --subresource the status part of a patch is ignored by the main resource.
    kubectl("patch", "pod", "p1", "-n", k8s_namespace, "--type=merge",
            "-p", json.dumps({"status": {"phase": "Succeeded"}}))
    assert kubectl.json("get", "pod", "p1", "-n", k8s_namespace)["status"]["phase"] == "Failed"


def test_crd_with_cel_rules_needs_validate_false(controlplane, kubectl: Kubectl,
                                                 k8s_namespace: str) -> None:
    """kubectl 1.37 validates client-side against the 1.20 OpenAPI, which has no
    x-kubernetes-validations: --validate=false is needed; 1.20 then ignores the rules."""
    if getattr(controlplane, "is_external", False):
        pytest.skip("1.20-specific behaviour")
    refused = kubectl.apply(WIDGET_CRD, check=False)
    assert refused.returncode != 0
    assert "x-kubernetes-validations" in refused.stderr
    kubectl.apply(WIDGET_CRD, validate=False)
    kubectl("wait", "--for=condition=Established", f"crd/{WIDGET_CRD['metadata']['name']}",
            "--timeout=30s")
    # The rule is not enforced (no CEL in 1.20) ...
    kubectl.apply({"apiVersion": "infra-test.grpo.dev/v1", "kind": "Widget",
                   "metadata": {"name": "w", "namespace": k8s_namespace},
                   "spec": {"min": 3, "max": 1}})
    widget = kubectl.json("get", "widget", "w", "-n", k8s_namespace)
    assert widget["metadata"]["generation"] == 1
    # ... but the OpenAPI schema is: a wrongly typed field is a 422.
    bad = kubectl.apply({"apiVersion": "infra-test.grpo.dev/v1", "kind": "Widget",
                         "metadata": {"name": "w2", "namespace": k8s_namespace},
                         "spec": {"min": "three"}}, check=False)
    assert bad.returncode != 0 and "spec.min" in bad.stderr

    # A custom resource as owner: the GC follows it too -- once it knows the new kind, which a
    # 1.20 controller-manager learns only at its 30 s discovery resync, or at a restart.
    if getattr(controlplane, "controller_manager", None):
        controlplane.restart_controller_manager()
        kubectl.apply(owned_configmap("widget-owned", k8s_namespace, widget))
        kubectl("delete", "widget", "w", "-n", k8s_namespace)
        wait_for(lambda: not kubectl.exists("configmap", "widget-owned", "-n", k8s_namespace),
                 timeout=90, what="GC of a ConfigMap owned by a custom resource")


def test_rbac_denies_service_account(controlplane, k8s_namespace: str) -> None:
    if getattr(controlplane, "authorization_mode", "") == "AlwaysAllow":
        pytest.skip("session control plane runs with AlwaysAllow")
    token = controlplane.service_account_token(k8s_namespace, "nobody")
    as_sa = controlplane.kubectl_as(token, f"nobody-{k8s_namespace}")
    assert not as_sa.can_i("get", "secrets", "-n", k8s_namespace)
    assert not as_sa.can_i("create", "pods", "-n", k8s_namespace)
    denied = as_sa("get", "secrets", "-n", k8s_namespace, check=False)
    assert denied.returncode != 0 and "Forbidden" in denied.stderr
    assert f"system:serviceaccount:{k8s_namespace}:nobody" in denied.stderr


# --------------------------------------------------------------- a private cluster: restarts, static tokens

@pytest.fixture(scope="module")
def private_cp() -> ControlPlane:
    from tests.support.cluster.fixtures import CONTROLPLANE_BINARIES, skip_unless_binaries

    skip_unless_binaries(CONTROLPLANE_BINARIES[:2])
    with ControlPlane(controller_manager=False, authorization_mode="RBAC",
                      static_service_accounts=[("team-a", "reader")]) as cp:
        yield cp


def test_restart_keeps_data(private_cp: ControlPlane) -> None:
    k = private_cp.kubectl
    k("create", "namespace", "survivor")
    k("create", "configmap", "keep-me", "-n", "survivor", "--from-literal=answer=42")
    port = private_cp.port
    # A crash (SIGKILL of apiserver + etcd) loses nothing that was acknowledged.  (The graceful
    # path, SIGTERM, is exercised by the static-token test's apiserver restart.)
    private_cp.restart(kill=True)
    assert private_cp.port == port
    got = k.json("get", "configmap", "keep-me", "-n", "survivor")
    assert got["data"] == {"answer": "42"}
    k("create", "configmap", "after-restart", "-n", "survivor", "--from-literal=x=y")
    assert k.exists("configmap", "after-restart", "-n", "survivor")


def test_static_service_account_token_rbac(private_cp: ControlPlane) -> None:
    k = private_cp.kubectl
    private_cp.ensure_namespace("team-a")
    token = private_cp.static_service_account_token("team-a", "reader")  # pre-provisioned: no restart
    reader = private_cp.kubectl_as(token, "reader")
    assert not reader.can_i("get", "secrets", "-n", "team-a")
    assert not reader.can_i("list", "configmaps", "-n", "team-a")
    k("create", "role", "cm-reader", "-n", "team-a", "--verb=get,list", "--resource=configmaps")
    # RoleBinding subject ServiceAccount team-a/reader == user system:serviceaccount:team-a:reader
    k("create", "rolebinding", "cm-reader", "-n", "team-a", "--role=cm-reader",
      "--serviceaccount=team-a:reader")
    wait_for(lambda: reader.can_i("list", "configmaps", "-n", "team-a"), timeout=10,
             what="RBAC to see the new RoleBinding")
    assert reader("get", "configmaps", "-n", "team-a").returncode == 0
    assert not reader.can_i("get", "secrets", "-n", "team-a")
    assert not reader.can_i("list", "configmaps", "-n", "default")


def test_static_token_added_later_restarts_apiserver(private_cp: ControlPlane) -> None:
    before = private_cp.apiserver.pid
    token = private_cp.static_service_account_token("team-b", "late")
    assert private_cp.apiserver.pid != before  # the token file is read only at start
    late = private_cp.kubectl_as(token, "late")
    assert not late.can_i("get", "pods", "-n", "team-b")
    r = private_cp.api("GET", "/api/v1/namespaces/team-b/pods", token=token)
    assert r.status == 403 and "system:serviceaccount:team-b:late" in r.message


def test_report_startup_and_rss(controlplane, private_cp: ControlPlane) -> None:
    """Not an assertion of speed: prints what the infrastructure costs (pytest -s to see)."""
    for cp in (controlplane, private_cp):
        if getattr(cp, "is_external", False):
            continue
        rss = {k: f"{(v or 0) / 2**20:.0f}MiB" for k, v in cp.rss().items()}
        timings = {k: f"{v:.2f}s" for k, v in cp.timings.items()}
        print(f"\n{cp!r}\n  startup {timings}\n  rss {rss}")
        assert cp.apiserver.running and cp.etcd.running
