"""Fixtures and helpers of the operator tests: the CRD on the real control plane (tests/support/cluster), the operator
as a child process, and a tiny kubelet played through the pods' status subresource. Registered as a pytest plugin
by tests/conftest.py."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import pytest
from prometheus_client.parser import text_string_to_metric_families

from grpo_operator.api import crd as crdgen
from tests.support.cluster.kubectl import Kubectl
from tests.support.cluster.util import ManagedProcess, free_port, wait_until
from tests.support.jobs import manifest

REPO = Path(__file__).resolve().parents[2]

def install_crd(k: Kubectl) -> None:
    """The CRD the chart installs on this server's version (`grpojob crd --kube-version`): on 1.20, the one without
    int-or-string (api/crd.py), so that the tests meet what users of that server get."""
    version = k.json("version")["serverVersion"]
    kube = crdgen.parse_kube_version(f"{version['major']}.{version['minor']}")
    k("apply", "--validate=false", "-f", "-", input=crdgen.crd_yaml(kube))

    def established() -> bool:
        c = k.json("get", "crd", "grpojobs.grpo.dev")
        return any(x.get("type") == "Established" and x.get("status") == "True"
                   for x in (c.get("status") or {}).get("conditions") or [])

    wait_until(established, 30, 0.1, what="CRD Established")


@pytest.fixture(scope="session")
def crd(controlplane: Any) -> Any:
    install_crd(controlplane.kubectl)
    return controlplane


class OperatorProcess:
    """`grpo-operator` as a real child process (so tests can SIGKILL it)."""

    def __init__(self, kubeconfig: Path, logdir: Path, *args: str, env: Optional[dict[str, str]] = None,
                 webhook: bool = False):
        self.webhook_port = free_port() if webhook else None
        self.args = args
        argv = [sys.executable, "-m", "grpo_operator.cli.grpo_operator", *args]
        if "--metrics-listen" in args:  # a test that reads the operator's metrics itself
            self.metrics_port = int(args[args.index("--metrics-listen") + 1].rpartition(":")[2])
        else:  # its /metrics: the per-job pass counts wait_pass() reads
            self.metrics_port = free_port()
            argv += ["--metrics-listen", f"127.0.0.1:{self.metrics_port}"]
        if webhook:
            host = os.environ.get("GRPO_TEST_WEBHOOK_HOST", "127.0.0.1")
            listen = "0.0.0.0" if host != "127.0.0.1" else "127.0.0.1"
            argv += ["--webhook-listen", f"{listen}:{self.webhook_port}",
                     "--webhook-host", host, "--webhook-manage"]
        full_env = {**os.environ, "KUBECONFIG": str(kubeconfig), "GRPO_BACKOFF_BASE_SECONDS": "0.5",
                    "GRPO_RESYNC_SECONDS": "5", "PYTHONUNBUFFERED": "1", **(env or {})}
        logdir.mkdir(parents=True, exist_ok=True)
        self.proc = ManagedProcess("grpo-operator", argv, logdir / "operator.log", env=full_env, cwd=REPO)
        self.kubectl = Kubectl(kubeconfig)
        self.webhook = webhook

    def start(self, wait: bool = True) -> OperatorProcess:
        self.proc.start()
        if wait and self.webhook:
            def ready() -> bool:
                self.proc.check_alive()
                vwc = self.kubectl.json("get", "validatingwebhookconfiguration", "grpo-operator.grpo.dev",
                                        check=False)
                hooks = (vwc or {}).get("webhooks") or []
                return bool(hooks) and str(self.webhook_port) in hooks[0]["clientConfig"].get("url", "")
            wait_until(ready, 60, 0.2, what="operator webhook configuration")
            wait_until(self._webhook_denies, 60, 0.2, what="the API server calling the operator's webhook")
        return self

    def _webhook_denies(self) -> bool:
        """A server-side dry run of a job the rules refuse is denied: the API server calls this webhook now (it
        reads a new webhook configuration a moment after it is written)."""
        ns = self.args[self.args.index("--namespace") + 1] if "--namespace" in self.args else "default"
        bad = manifest("webhook-ready", gpus=3, per_device=1, num_generations=8)
        r = self.kubectl.create(bad, "-n", ns, "--dry-run=server", check=False)
        return "denied the request" in r.stderr and "numGenerations" in r.stderr

    def stop(self) -> None:
        self.proc.stop()
        if self.webhook:  # the operator keeps its webhook when it stops (failurePolicy Fail): never leave one behind
            self.kubectl("delete", "validatingwebhookconfiguration", "grpo-operator.grpo.dev", "--ignore-not-found",
                         check=False)

    def kill(self) -> None:
        self.proc.kill()

    def log(self, lines: int = 80) -> str:
        return self.proc.log_tail(lines)

    def passes(self, ns: str, job: str) -> int:
        """Reconcile passes of the job this process has completed (grpo_operator_reconcile_passes_total); 0 before
        its first one, or while /metrics is not served yet."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            self.proc.check_alive()
            return 0
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "grpo_operator_reconcile_passes_total" and s.labels == {"namespace": ns, "name": job}:
                    return int(s.value)
        return 0

    def wait_pass(self, ns: str, job: str, timeout: float = 60) -> None:
        """Return once a pass of the job that began after this call has completed: whatever the test changed and saw
        before the call has been decided on, so "nothing changed" means the operator chose nothing. The count now may
        include a pass still running, which may have read the job before the change: so one more after it."""
        start = self.passes(ns, job)
        wait_until(lambda: self.passes(ns, job) >= start + 2, timeout, 0.2, what=f"two more passes of {ns}/{job}")


@pytest.fixture(scope="module")
def operator_process(crd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    live = free_port()
    op = OperatorProcess(crd.kubeconfig, tmp_path_factory.mktemp("operator"), "--all-namespaces", "--json-logs",
                         "--liveness", f"http://127.0.0.1:{live}/healthz", webhook=True,
                         env={"GRPO_FORCE_DELETE_AFTER_SECONDS": "2"})
    op.liveness_url = f"http://127.0.0.1:{live}/healthz"
    op.start()
    try:
        yield op
    finally:
        op.stop()


# ------------------------------------------------------------------------------------------ kubelet
def _cstatus(name: str, state: dict[str, Any], ready: bool = False) -> dict[str, Any]:
    return {"name": name, "ready": ready, "restartCount": 0, "image": "grpo-trainer", "imageID": "", "state": state}


NOW = "2030-01-01T00:00:00Z"


def pod_running(k: Kubectl, ns: str, pod: str) -> None:
    k.patch_status("pod", pod, {"phase": "Running", "conditions": [
        {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
        "containerStatuses": [_cstatus("trainer", {"running": {"startedAt": NOW}}, True)]}, "-n", ns)


def pod_exit(k: Kubectl, ns: str, pod: str, code: int, reason: Optional[str] = None,
             message: Optional[str] = None) -> None:
    term = {"exitCode": code, "reason": reason or ("Completed" if code == 0 else "Error"), "startedAt": NOW,
            "finishedAt": NOW}
    if message:  # what the kubelet copies from /dev/termination-log
        term["message"] = message
    k.patch_status("pod", pod, {"phase": "Succeeded" if code == 0 else "Failed",
                                "containerStatuses": [_cstatus("trainer", {"terminated": term})]}, "-n", ns)


def pod_unschedulable(k: Kubectl, ns: str, pod: str, message: str) -> None:
    k.patch_status("pod", pod, {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                "message": message}]}, "-n", ns)


def get_job(k: Kubectl, ns: str, name: str) -> dict[str, Any]:
    return k.json("get", "grpojob", name, "-n", ns)


def wait_job(k: Kubectl, ns: str, name: str, pred: Callable[[dict[str, Any]], Any], timeout: float = 30,
             what: str = "job state") -> dict[str, Any]:
    last: dict[str, Any] = {}

    def check() -> Any:
        nonlocal last
        last = get_job(k, ns, name)
        return last if pred(last.get("status") or {}) else None

    try:
        return wait_until(check, timeout, 0.2, what=what)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; status now: {json.dumps(last.get('status'), indent=1)}") from None


def pods_of(k: Kubectl, ns: str, job: str) -> list[dict[str, Any]]:
    from grpo_operator.render import manifests

    items = k.json("get", "pods", "-n", ns, "-l", f"{manifests.LABEL_JOB}={manifests.names(job).base}")["items"]
    return sorted(items, key=lambda p: p["metadata"]["name"])


def wait_pods(k: Kubectl, ns: str, job: str, n: int, attempt: int = 0, timeout: float = 30) -> list[dict[str, Any]]:
    def check() -> Any:
        items = [p for p in pods_of(k, ns, job) if not p["metadata"].get("deletionTimestamp")]
        ok = len(items) == n and all(p["metadata"]["annotations"].get("grpo.dev/attempt") == str(attempt) for p in items)
        return items if ok else None

    return wait_until(check, timeout, 0.2, what=f"{n} pods of {job} at attempt {attempt}")
