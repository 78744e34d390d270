"""`helm install` (helm 3.17 and 4.3) of the chart into a real kube-apiserver 1.20.2, the oldest Kubernetes the chart
supports (Chart.yaml kubeVersion), with its controller-manager's clusterrole-aggregation controller: what a platform
team gets with replicaCount > 1 and the default aggregated roles.

Findings this guards: before, a namespace editor (a user bound to the built-in `edit` ClusterRole) could not create a
GRPOJob without RBAC of the team's own; and a policy/v1 PodDisruptionBudget cannot install on 1.20 (v1beta1 there).
The cluster is this module's own: a release that helm adopts the CRD into must not meet the CRD that other tests
apply with kubectl.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.cluster.controlplane import ControlPlane
from tests.support.cluster.fixtures import CONTROLPLANE_BINARIES, skip_unless_binaries
from tests.support.cluster.kubectl import Kubectl
from tests.support.cluster.util import wait_until
from tests.support.helm import CHART, HELMS, NAMESPACE, RELEASE, helm

TEAM, OTHER = "team-a", "team-b"
EDITOR, VIEWER = "alice", "bob"
GRPOJOBS = "grpojobs.grpo.dev"
EDIT_VERBS = ("create", "get", "list", "watch", "patch", "update", "delete")
VALUES = {"replicaCount": 2, "webhook": {"enabled": False}}  # webhook: cert-manager is not installed here


@pytest.fixture(scope="module")
def cluster() -> Iterator[ControlPlane]:
    skip_unless_binaries(CONTROLPLANE_BINARIES)
    cp = ControlPlane(authorization_mode="RBAC")
    try:
        cp.start()
        for ns in (TEAM, OTHER):
            cp.ensure_namespace(ns)
        # the usual way to give people a namespace: RoleBindings to the built-in roles
        cp.kubectl("create", "rolebinding", "editors", "--clusterrole=edit", f"--user={EDITOR}", "-n", TEAM)
        cp.kubectl("create", "rolebinding", "viewers", "--clusterrole=view", f"--user={VIEWER}", "-n", TEAM)
        yield cp
    finally:
        cp.stop()


def grpojob_rules(k: Kubectl, role: str) -> list[dict[str, Any]]:
    rules = k.json("get", "clusterrole", role)["rules"] or []
    return [r for r in rules if "grpo.dev" in r.get("apiGroups", [])]


def can(k: Kubectl, user: str, verb: str, resource: str = GRPOJOBS, ns: str = TEAM, sub: str = "") -> bool:
    return k.can_i(verb, resource, "-n", ns, f"--as={user}", *([f"--subresource={sub}"] if sub else []))


def job(name: str) -> dict[str, Any]:
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": name, "namespace": TEAM},
            "spec": {"model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": {"name": "openai/gsm8k"},
                     "rewards": [{"name": "accuracy"}], "vllm": {"mode": "none"},
                     "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 4, "maxSteps": 2}}}


@pytest.mark.parametrize("helm_bin", HELMS)
def test_helm_install_on_kubernetes_1_20_gives_editors_grpojobs(cluster: ControlPlane, helm_bin: str) -> None:
    k = cluster.kubectl
    kc = ["--kubeconfig", str(cluster.kubeconfig)]
    helm(helm_bin, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace", *kc, values=VALUES)
    try:
        status = json.loads(helm(helm_bin, "status", RELEASE, "--namespace", NAMESPACE, "-o", "json", *kc).stdout)
        assert status["info"]["status"] == "deployed"
        # the replicas' budget, in the API version a 1.20 server has, over the Deployment's pods
        pdb = k.json("get", "poddisruptionbudgets.v1beta1.policy", "-n", NAMESPACE, "-l",
                     f"app.kubernetes.io/instance={RELEASE}")["items"]
        dep = k.json("get", "deployment", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"][0]
        assert [p["spec"]["selector"]["matchLabels"] for p in pdb] == [dep["spec"]["selector"]["matchLabels"]]
        assert "podAntiAffinity" in dep["spec"]["template"]["spec"]["affinity"]

        # the clusterrole-aggregation controller copies the chart's rules into the built-in roles
        wait_until(lambda: grpojob_rules(k, "edit") and grpojob_rules(k, "view") and grpojob_rules(k, "admin"),
                   30, 0.2, what="grpojob rules aggregated into admin, edit and view")
        for verb in EDIT_VERBS:
            assert can(k, EDITOR, verb), f"a namespace editor cannot {verb} grpojobs"
            assert not can(k, EDITOR, verb, ns=OTHER), f"{verb} grpojobs in a namespace the editor has no role in"
        assert not can(k, EDITOR, "deletecollection")
        assert not can(k, EDITOR, "patch", sub="status") and not can(k, EDITOR, "update", sub="status")
        for verb in ("get", "list", "watch"):
            assert can(k, VIEWER, verb), f"a namespace viewer cannot {verb} grpojobs"
        assert can(k, VIEWER, "get", sub="status") and can(k, EDITOR, "get", sub="status")
        for verb in ("create", "patch", "update", "delete", "deletecollection"):
            assert not can(k, VIEWER, verb), f"a namespace viewer may {verb} grpojobs"

        # and for real: the editor creates, changes and deletes a job; the viewer reads it and may not delete it
        as_editor = [f"--as={EDITOR}", "-n", TEAM]
        k("create", "-f", "-", *as_editor, input=json.dumps(job("mine")))
        k("patch", "grpojob", "mine", "--type=merge", "-p", '{"spec": {"suspend": true}}', *as_editor)
        assert k.json("get", "grpojob", "mine", f"--as={VIEWER}", "-n", TEAM)["spec"]["suspend"] is True
        denied = k("delete", "grpojob", "mine", f"--as={VIEWER}", "-n", TEAM, check=False)
        assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr
        k("delete", "grpojob", "mine", *as_editor)
    finally:
        helm(helm_bin, "uninstall", RELEASE, "--namespace", NAMESPACE, *kc)
    # uninstalled: the aggregated rules leave the built-in roles again (the CRD stays: resource-policy keep)
    wait_until(lambda: not grpojob_rules(k, "edit"), 30, 0.2, what="grpojob rules gone from edit")
    assert not can(k, EDITOR, "create")
    assert k.exists("crd", "grpojobs.grpo.dev")
