"""The rendered chart on a real kube-apiserver with RBAC authorization (tests/support/cluster, v1.20.2).

`helm template | kubectl apply` as the admin, then the operator runs locally as the chart's ServiceAccount (a
real token from the TokenRequest API for system:serviceaccount:<ns>:<sa>; no kubelet runs the Deployment), with
the environment the chart's Deployment sets. It must admit/refuse jobs through its webhook and take a job
through its whole lifecycle (the test plays the kubelet), with no permission errors; `kubectl auth can-i` as
that account must allow exactly the chart's rules and deny secrets and everything else.
"""

from __future__ import annotations

import json
import re
import secrets
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster.kubectl import Kubectl
from tests.support.cluster.util import ManagedProcess, free_port, wait_until
from tests.support.helm import objects, template

NOW = "2030-01-01T00:00:00Z"


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


class Install:
    """One release of the chart applied to the control plane, and the operator running as its ServiceAccount."""

    def __init__(self, cp: Any, release: str, values: dict[str, Any], workdir: Path):
        self.cp, self.release = cp, release
        self.namespace = f"{release}-system"
        # rendered for the server's version, as `helm install` would (a 1.20 server has policy/v1beta1 PDBs only)
        server = cp.kubectl.json("version")["serverVersion"]["gitVersion"].lstrip("v")
        self.rendered = template("helm3", values, namespace=self.namespace, release=release, kube_version=server)
        self.docs = objects(self.rendered)
        self.admin: Kubectl = cp.kubectl
        self.workdir = workdir
        self.proc: ManagedProcess | None = None
        self.others: list[ManagedProcess] = []  # earlier replicas (HA)
        dep = by_kind(self.docs, "Deployment")[0]
        self.pod_spec = dep["spec"]["template"]["spec"]
        self.sa = self.pod_spec["serviceAccountName"]
        self.vwc_name = next((e["value"] for e in self.pod_spec["containers"][0]["env"]
                              if e["name"] == "GRPO_WEBHOOK_CONFIG_NAME"), None)

    def apply(self) -> None:
        self.cp.ensure_namespace(self.namespace)
        for ns in {d["metadata"].get("namespace") for d in self.docs} - {None, self.namespace}:
            self.cp.ensure_namespace(ns)
        # --validate=false: kubectl 1.37's client-side schema check of a CRD with CEL rules against a 1.20 server
        cp = self.admin("apply", "--validate=false", "-f", "-", input=self.rendered, check=False)
        if cp.returncode != 0 and "no matches for kind" in cp.stderr:  # a CR (KopfPeering) before its new CRD
            time.sleep(1.0)
            cp = self.admin("apply", "--validate=false", "-f", "-", input=self.rendered, check=False)
        assert cp.returncode == 0, cp.stderr

        def established() -> bool:
            c = self.admin.json("get", "crd", "grpojobs.grpo.dev")
            return any(x["type"] == "Established" and x["status"] == "True" for x in c["status"]["conditions"])

        wait_until(established, 30, 0.1, what="CRD Established")

    def token(self) -> str:
        return self.cp.service_account_token(self.namespace, self.sa, create=False)

    def as_sa(self) -> Kubectl:
        return self.cp.kubectl_as(self.token(), f"sa-{self.release}")

    def env(self, webhook_port: int, health_port: int, kubeconfig: Path, replica: int = 0) -> dict[str, str]:
        """The container's environment from the chart, with the addresses a local process can serve."""
        env: dict[str, str] = {}
        for e in self.pod_spec["containers"][0]["env"]:
            if "value" in e:
                env[e["name"]] = e["value"]
            elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                env[e["name"]] = f"{self.release}-operator-{replica}"
        if "GRPO_WEBHOOK_LISTEN" in env:
            env["GRPO_WEBHOOK_LISTEN"] = f"127.0.0.1:{webhook_port}"
            env["GRPO_WEBHOOK_HOST"] = "127.0.0.1"  # in the cluster: the Service's DNS name
            # In the cluster the configuration names the Service; here no kubelet backs it, so dial the URL.
            env.pop("GRPO_WEBHOOK_SERVICE", None)
        env["GRPO_LIVENESS"] = f"http://127.0.0.1:{health_port}/healthz"
        if "GRPO_METRICS_LISTEN" in env:  # several replicas on one machine: a port each
            self.metrics_url = f"http://127.0.0.1:{free_port()}/metrics"
            env["GRPO_METRICS_LISTEN"] = self.metrics_url[len("http://"):-len("/metrics")]
        import os

        # PYTHONPATH: a checkout's own code wins over an editable install of another (shared venvs)
        return {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
                **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}), **env,
                "KUBECONFIG": str(kubeconfig), "GRPO_RESYNC_SECONDS": "5", "GRPO_BACKOFF_BASE_SECONDS": "0.5"}

    def start_operator(self, replica: int = 0) -> None:
        kubeconfig = self.cp.write_kubeconfig(self.workdir / f"kubeconfig-{self.release}", self.token(), self.sa)
        self.webhook_port, self.health_port = free_port(), free_port()
        command = self.pod_spec["containers"][0]["command"]
        assert command == ["grpo-operator"]
        argv = [str(Path(sys.executable).parent / command[0])]  # the console script the image runs
        if self.proc is not None:
            self.others.append(self.proc)
        self.proc = ManagedProcess(f"operator-{self.release}-{replica}", argv,
                                   self.workdir / f"operator-{self.release}-{replica}.log",
                                   env=self.env(self.webhook_port, self.health_port, kubeconfig, replica))
        self.proc.start()

        def healthy() -> bool:
            self.proc.check_alive()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_until(healthy, 60, 0.2, what="operator liveness endpoint")
        if self.vwc_name:
            def webhook_configured() -> bool:
                self.proc.check_alive()
                vwc = self.admin.json("get", "validatingwebhookconfiguration", self.vwc_name, check=False)
                hooks = (vwc or {}).get("webhooks") or []
                return bool(hooks) and f":{self.webhook_port}/" in hooks[0]["clientConfig"].get("url", "")

            wait_until(webhook_configured, 60, 0.2, what="operator-managed ValidatingWebhookConfiguration")

    def log(self) -> str:
        return "".join(p.log_tail(400) for p in [*self.others, self.proc] if p is not None)

    def stop(self) -> None:
        for p in [*self.others, self.proc]:
            if p is not None:
                p.stop()
        if self.vwc_name:  # never leave a failurePolicy=Fail webhook pointing at a stopped process
            for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
                self.admin("delete", kind, self.vwc_name, "--ignore-not-found", check=False)


@pytest.fixture(scope="module")
def rbac_cluster(controlplane: Any) -> Any:
    if getattr(controlplane, "is_external", False) or "RBAC" not in controlplane.authorization_mode:
        pytest.skip("needs the local control plane with --authorization-mode=RBAC")
    return controlplane


def job(name: str, ns: str, nodes: int = 2, **training: Any) -> dict[str, Any]:
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": name, "namespace": ns},
            "spec": {"model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": {"name": "openai/gsm8k"},
                     "rewards": [{"name": "accuracy"}], "nodes": nodes, "nprocPerNode": 1, "vllm": {"mode": "none"},
                     "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 4, "maxSteps": 2, **training}}}


def play_kubelet(k: Kubectl, ns: str, job_name: str, nodes: int) -> None:
    def pods() -> Any:
        items = k.json("get", "pods", "-n", ns, "-l", f"grpo.dev/job-name={job_name}")["items"]
        return items if len(items) == nodes else None

    for pod in wait_until(pods, 30, 0.2, what=f"{nodes} pods of {job_name}"):
        name = pod["metadata"]["name"]
        k.patch_status("pod", name, {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                                     "containerStatuses": [{"name": "trainer", "ready": True, "restartCount": 0,
                                                            "image": "t", "imageID": "",
                                                            "state": {"running": {"startedAt": NOW}}}]}, "-n", ns)
    for pod in pods():
        k.patch_status("pod", pod["metadata"]["name"], {"phase": "Succeeded", "containerStatuses": [
            {"name": "trainer", "ready": False, "restartCount": 0, "image": "t", "imageID": "",
             "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": NOW, "finishedAt": NOW}}}]},
            "-n", ns)


def wait_phase(k: Kubectl, ns: str, name: str, phase: str, timeout: float = 40) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def check() -> Any:
        nonlocal last
        last = k.json("get", "grpojob", name, "-n", ns)
        return last if (last.get("status") or {}).get("phase") == phase else None

    try:
        return wait_until(check, timeout, 0.2, what=f"{name} {phase}")
    except TimeoutError:
        raise AssertionError(f"{name} not {phase}: {json.dumps(last.get('status'), indent=1)}") from None


def lifecycle(inst: Install, ns: str) -> None:
    k = inst.admin
    # the webhook (served by the operator, configured by it or by the chart) refuses a bad batch
    bad = job("bad", ns, nodes=1, numGenerations=3)
    cp = k("create", "-f", "-", "--validate=false", input=json.dumps(bad), check=False)
    assert cp.returncode != 0 and "must be divisible by num_generations" in cp.stderr, cp.stderr
    name = "lifecycle-" + secrets.token_hex(3)
    k("create", "-f", "-", "--validate=false", input=json.dumps(job(name, ns)))
    play_kubelet(k, ns, name, 2)
    done = wait_phase(k, ns, name, "Succeeded")
    conds = {c["type"]: c["status"] for c in done["status"]["conditions"]}
    assert conds.get("Succeeded") == "True", done["status"]
    assert k.exists("service", "-n", ns, "-l", f"grpo.dev/job-name={name}") or \
        k.exists("configmap", "-n", ns, "-l", f"grpo.dev/job-name={name}")
    # networkPolicy.perJob (on by default): the job's NetworkPolicy, created as the chart's ServiceAccount
    [policy] = k.json("get", "networkpolicies", "-n", ns, "-l", f"grpo.dev/job-name={name}")["items"]
    assert policy["metadata"]["ownerReferences"][0]["uid"] == done["metadata"]["uid"]
    assert policy["spec"]["ingress"][1]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": inst.namespace}
    # `kubectl wait`, as docs/gitops.md tells users
    k("wait", f"grpojob/{name}", "-n", ns, "--for=condition=Succeeded", "--timeout=10s")


def assert_no_permission_errors(inst: Install) -> None:
    log = inst.log()
    # A bare "403" would also match timestamps ("14.403") and ports; only a status code counts.
    status_403 = re.search(r"(?<![\w.:-])403(?![\w.])", log)
    assert status_403 is None, f"HTTP 403 in the operator log:\n{log[-4000:]}"
    for bad in ("Forbidden", "forbidden", "Not enough permissions", "Not enough RBAC"):
        assert bad not in log, f"{bad!r} in the operator log:\n{log[-4000:]}"


# (verb, resource, namespace or None for cluster scope) the operator must be allowed (cluster-wide mode);
# namespaced variants are derived below.
ALLOWED_NS = [("list", "grpojobs.grpo.dev"), ("watch", "grpojobs.grpo.dev"), ("delete", "grpojobs.grpo.dev"),
              ("patch", "grpojobs.grpo.dev#status"),
              ("list", "pods"), ("watch", "pods"), ("get", "pods"), ("create", "pods"), ("delete", "pods"),
              ("get", "services"), ("create", "services"), ("get", "configmaps"), ("create", "configmaps"),
              ("create", "events"),
              ("get", "networkpolicies.networking.k8s.io"), ("create", "networkpolicies.networking.k8s.io"),
              ("update", "networkpolicies.networking.k8s.io")]
DENIED_NS = [("get", "secrets"), ("list", "secrets"), ("watch", "secrets"), ("create", "secrets"),
             ("get", "grpojobs.grpo.dev"), ("create", "grpojobs.grpo.dev"), ("update", "grpojobs.grpo.dev"),
             ("patch", "grpojobs.grpo.dev"), ("update", "grpojobs.grpo.dev#status"),
             ("update", "pods"), ("patch", "pods"), ("create", "pods#exec"), ("get", "pods#log"),
             ("create", "pods#eviction"), ("delete", "services"), ("patch", "services"), ("list", "services"),
             ("delete", "configmaps"), ("update", "configmaps"), ("list", "configmaps"),
             ("create", "deployments.apps"), ("create", "jobs.batch"), ("create", "serviceaccounts#token"),
             ("create", "roles.rbac.authorization.k8s.io"), ("create", "rolebindings.rbac.authorization.k8s.io"),
             ("create", "persistentvolumeclaims"), ("patch", "events"), ("delete", "events"),
             ("list", "networkpolicies.networking.k8s.io"), ("patch", "networkpolicies.networking.k8s.io"),
             ("delete", "networkpolicies.networking.k8s.io")]
DENIED_CLUSTER = [("list", "nodes"), ("list", "namespaces"), ("create", "clusterroles.rbac.authorization.k8s.io"),
                  ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
                  ("create", "customresourcedefinitions.apiextensions.k8s.io"),
                  ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
                  ("delete", "validatingwebhookconfigurations.admissionregistration.k8s.io"),
                  ("patch", "mutatingwebhookconfigurations.admissionregistration.k8s.io/someone-elses"),
                  ("impersonate", "users"), ("create", "certificatesigningrequests.certificates.k8s.io"),
                  ("list", "clusterkopfpeerings.kopf.dev")]


def check_can_i(sa: Kubectl, allowed: list[tuple[str, str, list[str]]],
                denied: list[tuple[str, str, list[str]]]) -> None:
    """resource "kind/name" names one object; "kind#sub" is a subresource (kubectl --subresource)."""
    def can(verb: str, res: str, args: list[str]) -> bool:
        if "#" in res:
            res, sub = res.split("#")
            args = [*args, f"--subresource={sub}"]
        return sa.can_i(verb, res, *args)

    from concurrent.futures import ThreadPoolExecutor

    cases = [(True, *c) for c in allowed] + [(False, *c) for c in denied]
    with ThreadPoolExecutor(8) as pool:  # one kubectl process per question
        answers = list(pool.map(lambda c: can(c[1], c[2], c[3]), cases))
    wrong = [f"{'denied but needed' if want else 'allowed but not needed'}: {verb} {res} {' '.join(args)}"
             for (want, verb, res, args), got in zip(cases, answers, strict=False) if got != want]
    assert not wrong, "\n".join(wrong)


@pytest.fixture
def install_factory(rbac_cluster: Any, tmp_path: Path) -> Iterator[Any]:
    made: list[Install] = []

    def make(release: str, values: dict[str, Any]) -> Install:
        inst = Install(rbac_cluster, release, values, tmp_path)
        made.append(inst)
        inst.apply()
        return inst

    try:
        yield make
    finally:
        for inst in made:
            inst.stop()


def test_clusterwide_install_runs_a_job_with_the_charts_rbac(install_factory: Any, rbac_cluster: Any) -> None:
    inst = install_factory("gw", {})
    job_ns = "gw-jobs-" + secrets.token_hex(3)
    rbac_cluster.ensure_namespace(job_ns)
    inst.start_operator()
    try:
        lifecycle(inst, job_ns)
        assert_no_permission_errors(inst)
        # the chart's metrics endpoint: the job is counted, and the operator's own API calls never met a 403
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(inst.metrics_url, timeout=5) as r:
            fams = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
        assert sum(s.value for s in fams["grpo_operator_jobs"].samples if s.labels["namespace"] == job_ns) >= 1
        assert not [s for s in fams["grpo_operator_api_errors"].samples if s.labels.get("code") in ("401", "403")]
    except BaseException:
        print(inst.log())
        raise
    sa = inst.as_sa()
    vwc = "validatingwebhookconfigurations.admissionregistration.k8s.io"
    mwc = "mutatingwebhookconfigurations.admissionregistration.k8s.io"
    allowed = [(v, r, ["-n", job_ns]) for v, r in ALLOWED_NS] + \
              [(v, r, ["--all-namespaces"]) for v, r in ALLOWED_NS if v in ("list", "watch")] + \
              [("list", "customresourcedefinitions.apiextensions.k8s.io", []),
               ("watch", "customresourcedefinitions.apiextensions.k8s.io", []),
               ("patch", f"{vwc}/{inst.vwc_name}", [])]
    denied = [(v, r, ["-n", job_ns]) for v, r in DENIED_NS] + \
             [(v, r, ["-n", inst.namespace]) for v, r in (("get", "secrets"), ("list", "secrets"))] + \
             [("list", "secrets", ["--all-namespaces"]), ("patch", f"{vwc}/someone-elses-webhook", [])] + \
             [("create", vwc, []), ("create", mwc, []), ("patch", f"{mwc}/{inst.vwc_name}", [])] + \
             [(v, r, []) for v, r in DENIED_CLUSTER]
    check_can_i(sa, allowed, denied)


def test_namespaced_install_runs_a_job_and_sees_only_its_namespace(install_factory: Any, rbac_cluster: Any) -> None:
    job_ns = "gn-jobs-" + secrets.token_hex(3)
    inst = install_factory("gn", {"watch": {"namespaces": [job_ns]}})
    inst.start_operator()
    try:
        lifecycle(inst, job_ns)
        assert_no_permission_errors(inst)
    except BaseException:
        print(inst.log())
        raise
    sa = inst.as_sa()
    other = "default"
    allowed = [(v, r, ["-n", job_ns]) for v, r in ALLOWED_NS]
    denied = [(v, r, ["-n", other]) for v, r in ALLOWED_NS] + \
             [(v, r, ["--all-namespaces"]) for v, r in ALLOWED_NS if v in ("list", "watch")] + \
             [(v, r, ["-n", job_ns]) for v, r in DENIED_NS] + \
             [("list", "customresourcedefinitions.apiextensions.k8s.io", [])] + \
             [(v, r, []) for v, r in DENIED_CLUSTER]
    check_can_i(sa, allowed, denied)


def test_rbac_without_webhook_has_no_cluster_scoped_writes(install_factory: Any, rbac_cluster: Any) -> None:
    """webhook.enabled=false, namespaced: no ClusterRole for the operator (the aggregated grpojob-edit/-view roles are
    for people, bound to no one); the SA cannot touch webhook configurations."""
    job_ns = "gx-jobs-" + secrets.token_hex(3)
    inst = install_factory("gx", {"watch": {"namespaces": [job_ns]}, "webhook": {"enabled": False}})
    cluster_roles = [r["metadata"]["name"] for r in by_kind(inst.docs, "ClusterRole")]
    assert cluster_roles == ["gx-grpo-operator-grpojob-edit", "gx-grpo-operator-grpojob-view"], cluster_roles
    assert not by_kind(inst.docs, "ClusterRoleBinding")
    sa = inst.as_sa()
    vwc = "validatingwebhookconfigurations.admissionregistration.k8s.io"
    check_can_i(sa, [("create", "pods", ["-n", job_ns])],
                [("create", vwc, []), ("patch", vwc, []), ("list", "pods", ["--all-namespaces"]),
                 ("create", "mutatingwebhookconfigurations.admissionregistration.k8s.io", [])])


def test_ha_replicas_elect_a_leader_on_the_charts_lease(install_factory: Any, rbac_cluster: Any) -> None:
    """replicaCount > 1: the chart sets GRPO_LEADER_ELECT and grants the Lease. Two replicas with only the chart's
    RBAC: exactly one holds the Lease and handles jobs; a job still runs to Succeeded."""

    job_ns = "gh-jobs-" + secrets.token_hex(3)
    inst = install_factory("gh", {"replicaCount": 2, "watch": {"namespaces": [job_ns]}, "webhook": {"enabled": False}})
    env = {e["name"]: e.get("value") for e in inst.pod_spec["containers"][0]["env"]}
    lease_ns, _, lease = env["GRPO_LEADER_ELECT_LEASE"].partition("/")
    inst.start_operator(0)
    inst.start_operator(1)

    def held() -> bool:
        spec = (inst.admin.json("get", "lease", lease, "-n", lease_ns, check=False) or {}).get("spec") or {}
        return bool(spec.get("holderIdentity"))

    try:
        wait_until(held, 30, 0.3, what="a replica holds the chart's Lease")
        name = "ha-" + secrets.token_hex(3)
        inst.admin("create", "-f", "-", "--validate=false", input=json.dumps(job(name, job_ns)))
        play_kubelet(inst.admin, job_ns, name, 2)
        wait_phase(inst.admin, job_ns, name, "Succeeded")
        assert_no_permission_errors(inst)
    except BaseException:
        print(inst.log())
        raise
