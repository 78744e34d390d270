"""spec.template's pod surface and the platform's job defaults through the running operator and its webhook, on the
real control plane: the operator started with --job-defaults (what the chart's jobDefaults ConfigMap gives it) admits
the merged spec and creates the pods with the job's envFrom, securityContext.fsGroup and terminationGracePeriodSeconds
next to the platform's toleration and annotation, in the CPU image for a CPU job and the CUDA image for a GPU job;
and a job with sidecars on this Kubernetes 1.20 server (no native sidecars) gets CreateFailed with the reason
instead of pods that would wait in Init forever."""

from __future__ import annotations

import pytest
import yaml

from tests.support.jobs import manifest
from tests.support.operator import OperatorProcess, pods_of, wait_job, wait_pods

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOLERATION = {"key": "example.com/gpu-pool", "operator": "Exists", "effect": "NoSchedule"}
DEFAULTS = {"tolerations": [TOLERATION], "metadata": {"annotations": {"sidecar.istio.io/inject": "false"}},
            "dnsConfig": {"nameservers": ["10.0.0.10"]}}


def _start(crd, tmp_path, ns: str) -> OperatorProcess:
    path = tmp_path / "job-defaults.yaml"
    path.write_text(yaml.safe_dump({"jobDefaults": DEFAULTS}))
    op = OperatorProcess(crd.kubeconfig, tmp_path, "--namespace", ns, "--job-defaults", str(path),
                         "--trainer-image", "cuda:1", "--trainer-cpu-image", "cpu:1", webhook=True)
    return op.start()


def test_pods_carry_the_template_and_the_platform_defaults(crd, kubectl, k8s_namespace, tmp_path) -> None:
    k, ns = kubectl, k8s_namespace
    op = _start(crd, tmp_path, ns)
    try:
        cpu = manifest("tmpl", nodes=2, cpu=True, num_generations=4)
        cpu["spec"]["template"] = {"envFrom": [{"configMapRef": {"name": "nccl-settings", "optional": True}}],
                                   "securityContext": {"fsGroup": 4000},
                                   "terminationGracePeriodSeconds": 1800,
                                   # valid only merged: the nameserver comes from the platform's defaults
                                   "dnsPolicy": "None"}
        gpu = manifest("tmpl-gpu", nodes=1)
        k.apply([cpu, gpu], "-n", ns)
        try:
            pods = wait_pods(k, ns, "tmpl", 2, timeout=60) + wait_pods(k, ns, "tmpl-gpu", 1, timeout=60)
        except AssertionError:
            print(op.log(60))
            raise
        for pod in pods:
            spec, cpu_job = pod["spec"], pod["metadata"]["name"].startswith("tmpl-node")
            assert TOLERATION in spec["tolerations"], spec["tolerations"]
            assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
            assert spec["containers"][0]["image"] == ("cpu:1" if cpu_job else "cuda:1")
            if cpu_job:
                assert spec["containers"][0]["envFrom"] == [{"configMapRef": {"name": "nccl-settings",
                                                                              "optional": True}}]
                assert spec["securityContext"]["fsGroup"] == 4000 and spec["securityContext"]["runAsUser"] == 1000
                assert spec["terminationGracePeriodSeconds"] == 1800
                assert spec["dnsPolicy"] == "None" and spec["dnsConfig"] == {"nameservers": ["10.0.0.10"]}
            else:
                assert spec["terminationGracePeriodSeconds"] == 120 and spec["securityContext"]["fsGroup"] == 1000
    finally:
        op.stop()


def test_the_webhook_refuses_a_capability_off_the_allow_list(crd, kubectl, k8s_namespace, tmp_path) -> None:
    k, ns = kubectl, k8s_namespace
    op = _start(crd, tmp_path, ns)
    try:
        job = manifest("caps", nodes=1, cpu=True, num_generations=2)
        job["spec"]["template"] = {"capabilities": ["NET_ADMIN"]}
        out = k("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(job), check=False)
        assert out.returncode != 0 and "NET_ADMIN" in out.stderr and "IPC_LOCK" in out.stderr, out.stderr
    finally:
        op.stop()


def test_sidecars_on_a_server_without_native_sidecars_are_a_create_failed(crd, kubectl, k8s_namespace,
                                                                          tmp_path) -> None:
    k, ns = kubectl, k8s_namespace
    op = _start(crd, tmp_path, ns)
    try:
        job = manifest("sidecar", nodes=1, cpu=True, num_generations=2)
        job["spec"]["template"] = {"sidecars": [{"name": "logs", "image": "busybox:1.36"}]}
        k.apply([job], "-n", ns)
        try:
            st = wait_job(k, ns, "sidecar", lambda s: any(c.get("type") == "CreateFailed" and c.get("status") == "True"
                                                        for c in s.get("conditions") or []),
                          timeout=60, what="condition CreateFailed")["status"]
        except AssertionError:
            print(op.log(60))
            raise
        c = next(c for c in st["conditions"] if c["type"] == "CreateFailed")
        assert "native sidecar" in c["message"] and "1.20" in c["message"], c
        assert not pods_of(k, ns, "sidecar")
    finally:
        op.stop()
