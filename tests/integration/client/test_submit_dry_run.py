"""`kubectl grpo submit --dry-run=server` and GRPOClient.dry_run_job on the real control plane (issue 26 item 7):
the job and every object `grpojob render` gives for it are sent with dryRun=All, so what only the cluster knows is
answered before any pod exists. Before, a job whose pods a ResourceQuota forbids, or whose priorityClassName names
no PriorityClass, was created and admitted, and only its pods were refused, by the operator, later."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_operator.client import GRPOClient, JobNotFound
from tests.support.cluster.controlplane import DEFAULT_CONTROLLERS
from tests.support.cluster.kubectl import kubectl_path
from tests.support.cluster.util import wait_until
from tests.support.operator import install_crd

from .test_client_cluster import manifest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _grpo(crd: Any, plugin_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": str(crd.kubeconfig),
           "PATH": f"{plugin_path}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([str(kubectl_path()), "grpo", *args], env=env, capture_output=True, text=True, timeout=60)


def _nothing_created(crd: Any, ns: str, name: str) -> None:
    with GRPOClient(namespace=ns, config_file=str(crd.kubeconfig)) as c, pytest.raises(JobNotFound):
        c.get_job(name)
    left = crd.kubectl.json("get", "pods,services,configmaps,networkpolicies", "-n", ns, "-l",
                            f"grpo.dev/job-name={name}")
    assert left["items"] == []


@pytest.fixture
def crd(controlplane_factory: Any) -> Any:
    """A control plane of its own whose controller-manager runs the resourcequota controller: a quota the controller
    never counted (empty status) is not enforced by 1.20's admission, and the shared control plane runs none."""
    cp = controlplane_factory(authorization_mode="AlwaysAllow", controllers=(*DEFAULT_CONTROLLERS, "resourcequota"))
    install_crd(cp.kubectl)
    return cp


def test_server_dry_run_answers_quota_and_priority_class_before_any_pod(crd: Any, plugin_path: Path,
                                                                         tmp_path: Path) -> None:
    ns, name = "dry-run", "dry"
    crd.kubectl("create", "namespace", ns)
    job = manifest(name, nodes=2)
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(job))

    ok = _grpo(crd, plugin_path, "submit", "-f", str(f), "-n", ns, "--dry-run=server")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = ok.stdout.strip().splitlines()
    assert lines[0] == f"grpojob.grpo.dev/{name} created (server dry run)"
    assert {f"pod/{name}-node-0 created (server dry run)", f"pod/{name}-node-1 created (server dry run)"} <= set(lines)
    assert any(line.startswith("networkpolicy/") for line in lines) and any(line.startswith("configmap/")
                                                                            for line in lines)
    _nothing_created(crd, ns, name)

    # the namespace allows no pod: the quota admission refuses each trainer pod
    crd.kubectl.apply({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods", "namespace": ns},
                       "spec": {"hard": {"pods": "0"}}})
    wait_until(lambda: (crd.kubectl.json("get", "resourcequota", "no-pods", "-n", ns).get("status") or {}).get("hard"),
               60, 0.2, what="the resourcequota controller to count the quota")
    _refused(crd, plugin_path, f, ns, name, "quota", "no-pods")
    with GRPOClient(namespace=ns, config_file=str(crd.kubeconfig)) as c:  # the client's equivalent, as data
        report = c.dry_run_job(job)
    assert report.job.name == name
    assert {o.name for o in report.refused} == {f"{name}-node-0", f"{name}-node-1"}
    assert all(o.ok for o in report.objects if o.kind != "Pod")
    assert all("no-pods" in o.error for o in report.refused)
    _nothing_created(crd, ns, name)
    crd.kubectl("delete", "resourcequota", "no-pods", "-n", ns)

    # a PriorityClass the cluster lacks: the Priority admission plugin refuses the pods
    job["spec"]["template"] = {"priorityClassName": "gpu-high"}
    f.write_text(yaml.safe_dump(job))
    _refused(crd, plugin_path, f, ns, name, "no PriorityClass with name gpu-high was found")


def _refused(crd: Any, plugin_path: Path, f: Path, ns: str, name: str, *needles: str) -> None:
    bad = _grpo(crd, plugin_path, "submit", "-f", str(f), "-n", ns, "--dry-run=server")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
    refused = [line for line in bad.stderr.splitlines() if line.startswith("kubectl-grpo: error: pod/")]
    assert len(refused) == 2, bad.stderr  # both trainer pods, one line each
    assert all(n in line for line in refused for n in needles), bad.stderr
    _nothing_created(crd, ns, name)
