"""GRPOClient and `kubectl grpo` against the real control plane (kube-apiserver 1.20.2 + controller-manager), the
real operator process and the real kubectl, which finds the plugin on PATH as users' kubectl does. The kubelet is
played through pods/status, so pod logs cannot be read here (tests/support/client_logs.py reads real ones in the
real-node tier)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_operator.client import GRPOClient, InvalidJob, JobFailed, JobNotFound, UnreachableStatus, WaitTimeout
from tests.support.cluster.kubectl import kubectl_path
from tests.support.cluster.util import wait_until
from tests.support.operator import pod_exit, pod_running

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def manifest(name: str, nodes: int = 1, num_generations: int = 8, backoff_limit: int = 3) -> dict[str, Any]:
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": name},
            "spec": {"model": "Qwen/Qwen2.5-0.5B-Instruct",
                     "dataset": {"name": "openai/gsm8k", "config": "main", "promptColumn": "question"},
                     "rewards": [{"name": "accuracy"}], "nodes": nodes,
                     "resources": {"limits": {"nvidia.com/gpu": 4}},
                     "training": {"perDeviceTrainBatchSize": 2, "numGenerations": num_generations, "maxSteps": 10},
                     "output": {"volumeClaimName": "ckpt"}, "runPolicy": {"backoffLimit": backoff_limit}}}


@pytest.fixture
def env(operator_process: Any, crd: Any, plugin_path: Path) -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": str(crd.kubeconfig),
            "PATH": f"{plugin_path}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.fixture
def client(crd: Any, k8s_namespace: str) -> Any:
    with GRPOClient(namespace=k8s_namespace, config_file=str(crd.kubeconfig)) as c:
        yield c


def grpo(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`kubectl grpo ARGS` through the real kubectl's plugin mechanism."""
    return subprocess.run([str(kubectl_path()), "grpo", *args], env=env, capture_output=True, text=True,
                           timeout=timeout)


def grpo_bg(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([str(kubectl_path()), "grpo", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def one_line_error(r: Any) -> str:
    """The one error line (submit prints the validator's warnings before it, as `Warning: …` lines)."""
    err = "\n".join(line for line in r.stderr.strip().splitlines() if not line.startswith("Warning: "))
    assert "Traceback" not in err and len(err.splitlines()) == 1, r.stderr
    return err


def wait_pods(client: Any, name: str, n: int, attempt: int = 0) -> list[Any]:
    def ready() -> Any:
        job = client.get_job(name)
        pods = [p for p in job.pods_of_attempt(attempt) if not p.deleting]
        return pods if len(pods) == n and job.attempt == attempt else None

    return wait_until(ready, 60, 0.1, what=f"{n} pods of {name} at attempt {attempt}")


def test_submit_list_describe(env: dict[str, str], client: Any, k8s_namespace: str, tmp_path: Path) -> None:
    ns = k8s_namespace
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(manifest("sub", nodes=2)))
    r = grpo(env, "submit", "-f", str(f), "-n", ns)
    assert r.returncode == 0 and r.stdout.strip() == "grpojob.grpo.dev/sub created", r.stdout + r.stderr
    r = grpo(env, "submit", "-f", str(f), "-n", ns)
    assert r.returncode == 1 and "already exists" in one_line_error(r)

    pods = wait_pods(client, "sub", 2)
    assert [(p.rank, p.name, p.phase, p.started) for p in pods] == [(0, "sub-node-0", "Pending", False),
                                                                    (1, "sub-node-1", "Pending", False)]
    client.wait_for_job_status("sub", "Pending", timeout=60)

    r = grpo(env, "list", "-n", ns)
    assert r.returncode == 0, r.stderr
    head, row = r.stdout.splitlines()
    assert head.split() == ["NAME", "PHASE", "ATTEMPT", "NODES", "STEP", "REWARD", "AGE"]
    assert row.split()[:4] == ["sub", "Pending", "0", "2"]
    r = grpo(env, "list", "-A", "-o", "wide")
    assert r.returncode == 0 and any(ln.split()[:3] == [ns, "sub", "Pending"] for ln in r.stdout.splitlines())
    assert "TOPOLOGY" in r.stdout and "2x4" in r.stdout
    listed = json.loads(grpo(env, "list", "-n", ns, "-o", "json").stdout)
    assert [(j["name"], j["phase"], j["nodes"], j["topology"]) for j in listed] == [("sub", "Pending", 2, "2x4")]

    r = grpo(env, "describe", "sub", "-n", ns)
    assert r.returncode == 0, r.stderr
    for text in ("Phase:        Pending", "Attempt:      0", "sub-node-0", "sub-node-1", "Created", "PodsCreated"):
        assert text in r.stdout, r.stdout
    described = yaml.safe_load(grpo(env, "describe", "sub", "-n", ns, "-o", "yaml").stdout)
    assert described["phase"] == "Pending" and len(described["pods"]) == 2
    assert client.get_job_progress("sub") is None

    r = grpo(env, "logs", "sub", "-n", ns)  # a Pending pod has no log yet: said in one line
    assert r.returncode == 1 and "sub-node-0" in one_line_error(r) and "no log yet" in r.stderr
    r = grpo(env, "describe", "nope", "-n", ns)
    assert r.returncode == 1 and one_line_error(r) == f"kubectl-grpo: error: grpojob {ns}/nope not found"


def test_invalid_spec_is_refused_locally(env: dict[str, str], client: Any, crd: Any, k8s_namespace: str,
                                         tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(manifest("bad", num_generations=7)))
    # A kube-config whose server does not exist: the refusal can only have come from the local validator.
    cfg = json.loads(Path(crd.kubeconfig).read_text()) if str(crd.kubeconfig).endswith(".json") \
        else yaml.safe_load(Path(crd.kubeconfig).read_text())
    for cluster in cfg["clusters"]:
        cluster["cluster"]["server"] = "https://127.0.0.1:1"
    nowhere = tmp_path / "nowhere.kubeconfig"
    nowhere.write_text(json.dumps(cfg))
    for kubeconfig in (str(nowhere), str(crd.kubeconfig)):
        r = grpo(env, "submit", "-f", str(bad), "-n", k8s_namespace, "--kubeconfig", kubeconfig)
        err = one_line_error(r)
        assert r.returncode == 1 and "spec.training.numGenerations" in err and "numGenerations 7 →" in err, err
    with pytest.raises(JobNotFound):
        client.get_job("bad")
    with pytest.raises(InvalidJob) as info:
        client.create_job(manifest("bad", num_generations=7))
    assert info.value.errors[0][0] == "spec.training.numGenerations" and not info.value.server
    # a reachable-but-wrong server is an API error in one line, not a traceback
    r = grpo(env, "list", "--kubeconfig", str(nowhere))
    assert r.returncode == 1 and "cannot reach the API server" in one_line_error(r)


def test_wait_on_every_outcome(env: dict[str, str], client: Any, crd: Any, k8s_namespace: str) -> None:
    k, ns = crd.kubectl, k8s_namespace
    for name in ("ok", "bad", "slow", "gone"):
        client.create_job(manifest(name))
    seen: list[str] = []
    ok = grpo_bg(env, "wait", "ok", "--for", "Succeeded", "-n", ns, "--timeout", "120s")
    bad = grpo_bg(env, "wait", "bad", "--for", "Succeeded,Running", "-n", ns)
    gone = grpo_bg(env, "wait", "gone", "--for", "Running", "-n", ns)
    for name in ("ok", "bad", "gone"):
        wait_pods(client, name, 1)
    client.wait_for_job_status("ok", "Pending", timeout=60)

    r = grpo(env, "wait", "slow", "--for", "Running", "-n", ns, "--timeout", "1s")  # nothing plays its pod
    assert r.returncode == 2 and "timed out" in one_line_error(r) and "Pending" in r.stderr
    with pytest.raises(WaitTimeout):
        client.wait_for_job_status("slow", "Running", timeout=0.5)

    pod_running(k, ns, "ok-node-0")
    job = client.wait_for_job_status("ok", {"Running"}, timeout=60, callbacks=lambda j: seen.append(j.phase))
    assert job.phase == "Running" and seen[-1] == "Running"
    pod_exit(k, ns, "ok-node-0", 0)
    out, err = ok.communicate(timeout=150)
    assert ok.returncode == 0 and out.strip() == "grpojob.grpo.dev/ok Succeeded", out + err

    pod_exit(k, ns, "bad-node-0", 2, "DatasetError: no such split")  # permanent: no restart
    out, err = bad.communicate(timeout=150)
    assert bad.returncode == 1 and "bad Failed" in err and "Traceback" not in err, out + err
    with pytest.raises(JobFailed) as failed:
        client.wait_for_job_status("bad", "Succeeded", timeout=10)
    assert isinstance(failed.value, RuntimeError) and failed.value.job.phase == "Failed"
    assert client.wait_for_job_status("bad", ["Failed"], timeout=10).phase == "Failed"

    r = grpo(env, "wait", "ok", "--for", "Running", "-n", ns)  # ended in another terminal phase
    assert r.returncode == 1 and "ended Succeeded" in one_line_error(r)
    with pytest.raises(UnreachableStatus):
        client.wait_for_job_status("ok", "Running", timeout=10)

    client.delete_job("gone")
    out, err = gone.communicate(timeout=150)
    assert gone.returncode == 1 and "deleted" in err, out + err
    r = grpo(env, "wait", "gone", "--for", "Running", "-n", ns)
    assert r.returncode == 1 and "not found" in one_line_error(r)
    r = grpo(env, "wait", "ok", "--for", "Done", "-n", ns)
    assert r.returncode == 1 and "phases are Pending, Running" in one_line_error(r)
    with pytest.raises(ValueError):
        client.wait_for_job_status("ok", "Done")


def test_gang_restart_is_seen_as_a_new_attempt(env: dict[str, str], client: Any, crd: Any,
                                               k8s_namespace: str) -> None:
    k, ns = crd.kubectl, k8s_namespace
    client.create_job(manifest("gang", nodes=2))
    for p in wait_pods(client, "gang", 2):
        pod_running(k, ns, p.name)
    client.wait_for_job_status("gang", "Running", timeout=60)
    pod_exit(k, ns, "gang-node-1", 137)  # retryable: a gang restart to attempt 1
    new = wait_pods(client, "gang", 2, attempt=1)
    assert {p.name for p in new} == {"gang-node-0", "gang-node-1"} and all(not p.started for p in new)
    selected = k.json("get", "pods", "-n", ns, "-l", "grpo.dev/job-name=gang,grpo.dev/attempt=1")["items"]
    assert len(selected) == 2  # the attempt is a label: one attempt's pods can be selected
    client.wait_for_job_status("gang", {"Pending"}, timeout=60)
    job = client.get_job("gang")
    assert job.attempt == 1 and job.last_failure_reason and job.pod_for_rank(1).attempt == 1
    r = grpo(env, "describe", "gang", "-n", ns)
    assert "Attempt:      1" in r.stdout and "Last failure:" in r.stdout, r.stdout
    reasons = {e.reason for e in client.get_job_events("gang")}
    assert "Restarting" in reasons, reasons
    r = grpo(env, "logs", "gang", "-n", ns, "--attempt", "0")
    assert r.returncode == 1 and "no pod of attempt 0 any more" in one_line_error(r)


def test_suspend_resume(env: dict[str, str], client: Any, crd: Any, k8s_namespace: str) -> None:
    ns = k8s_namespace
    client.create_job(manifest("pause", nodes=2))
    wait_pods(client, "pause", 2)
    r = grpo(env, "suspend", "pause", "-n", ns)
    assert r.returncode == 0 and r.stdout.strip() == "grpojob.grpo.dev/pause suspended", r.stderr
    r = grpo(env, "wait", "pause", "--for", "Suspended", "-n", ns, "--timeout", "90s")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: not client.get_job("pause").pods, 60, 0.1, what="pods deleted on suspend")
    job = client.get_job("pause")
    assert job.suspended and job.condition("Suspended").status == "True"
    r = grpo(env, "resume", "pause", "-n", ns)
    assert r.returncode == 0 and r.stdout.strip() == "grpojob.grpo.dev/pause resumed", r.stderr
    job = client.wait_for_job_status("pause", "Pending", timeout=60)
    assert not job.suspended and job.condition("Suspended").status == "False"
    assert len(wait_pods(client, "pause", 2)) == 2
    r = grpo(env, "suspend", "nope", "-n", ns)
    assert r.returncode == 1 and "not found" in one_line_error(r)


def test_delete_wait(env: dict[str, str], client: Any, crd: Any, k8s_namespace: str) -> None:
    ns = k8s_namespace
    client.create_job(manifest("del", nodes=2))
    wait_pods(client, "del", 2)
    # a follower waiting on a pod that never starts (real pod watches on the real API server) ends with the job
    got: list[Any] = []
    follower = threading.Thread(target=lambda: got.extend(client.follow_job_logs("del", 1, follow=True)), daemon=True)
    follower.start()
    r = grpo(env, "delete", "del", "--wait", "-n", ns, timeout=200)  # the GC takes 20-40 s here, more when loaded
    assert r.returncode == 0 and r.stdout.strip() == "grpojob.grpo.dev/del deleted", r.stderr
    # --wait returned only once the job and every pod it owned are gone (the controller-manager's GC)
    assert not crd.kubectl.exists("grpojob", "del", "-n", ns)
    pods = crd.kubectl.json("get", "pods", "-n", ns, "-l", "grpo.dev/job-name=del")["items"]
    assert pods == [], [p["metadata"]["name"] for p in pods]
    follower.join(30)
    assert not follower.is_alive() and got == []
    r = grpo(env, "delete", "del", "-n", ns)
    assert r.returncode == 1 and "not found" in one_line_error(r)


def test_rbac_refusals_are_one_line(env: dict[str, str], client: Any, crd: Any, k8s_namespace: str,
                                    tmp_path: Path) -> None:
    """A user who may read GRPOJobs but not pods or events still gets a describe; one who may not even list jobs
    gets the server's refusal in one line."""
    ns = k8s_namespace
    client.create_job(manifest("rbac"))
    crd.kubectl.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                       "metadata": {"name": "grpojob-reader", "namespace": ns},
                       "rules": [{"apiGroups": ["grpo.dev"], "resources": ["grpojobs"], "verbs": ["get", "list"]}]})
    crd.kubectl.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                       "metadata": {"name": "reader", "namespace": ns},
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "grpojob-reader"},
                       "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}]})
    # the authorizer learns of a new RoleBinding through its informer: wait until it grants it
    wait_until(lambda: crd.kubectl.can_i("get", "grpojobs.grpo.dev", "-n", ns,
                                         f"--as=system:serviceaccount:{ns}:reader"), 30, 0.2, what="the RoleBinding")
    reader = crd.write_kubeconfig(tmp_path / "reader", crd.service_account_token(ns, "reader"), namespace=ns)
    nobody = crd.write_kubeconfig(tmp_path / "nobody", crd.service_account_token(ns, "nobody"), namespace=ns)
    r = grpo(env, "describe", "rbac", "--kubeconfig", str(reader))
    assert r.returncode == 0, r.stderr
    assert "Phase:" in r.stdout and re.search(r"Pods: +<list pods of .*forbidden.*\(HTTP 403\)>", r.stdout), r.stdout
    r = grpo(env, "list", "--kubeconfig", str(nobody))
    assert r.returncode == 1 and "forbidden" in one_line_error(r) and "(HTTP 403)" in r.stderr
