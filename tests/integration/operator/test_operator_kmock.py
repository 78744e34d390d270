"""The real operator (kopf.testing.KopfRunner in a thread, a fresh registry per run) against kmock's emulator,
for faults a real API server cannot produce on cue: a 5xx after the write was stored (ambiguous write → 409
on the retry), 409 conflicts on status writes, 410 Gone / dropped watch streams."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import uuid
from pathlib import Path
from typing import Any

import kmock
import pytest

from grpo_operator import lifecycle
from grpo_operator.controller import handlers, kube, registration
from grpo_operator.controller import metrics as opmetrics
from grpo_operator.controller.settings import Settings
from tests.support.jobs import manifest

pytestmark = [pytest.mark.timeout(120)]

NS = "ns"
_rv = itertools.count(1)


class Emulator(kmock.KubernetesEmulator):
    """kmock + what the operator relies on: uid, resourceVersion, generation, creationTimestamp."""

    async def _handle(self, request: Any) -> Any:
        if request.resource is not None and request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("generation", 1)
            meta.setdefault("creationTimestamp", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            meta["resourceVersion"] = str(next(_rv))
        elif request.resource is not None and request.action == kmock.action.UPDATE and isinstance(request.data, dict):
            request.data.setdefault("metadata", {})["resourceVersion"] = str(next(_rv))
        return await super()._handle(request)


pytestmark.append(pytest.mark.kmock(cls=Emulator))


def declare(k: Any) -> None:
    k.resources["v1/namespaces"] = kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs={"list", "watch", "get"})
    k.resources["v1/pods"] = kmock.ResourceInfo(kind="Pod", namespaced=True,
                                                verbs={"list", "watch", "get", "create", "delete", "patch"},
                                                subresources={"status"})
    k.resources["v1/configmaps"] = kmock.ResourceInfo(kind="ConfigMap", namespaced=True, verbs={"create", "get", "list"})
    k.resources["v1/services"] = kmock.ResourceInfo(kind="Service", namespaced=True, verbs={"create", "get", "list"})
    k.resources["v1/events"] = kmock.ResourceInfo(kind="Event", namespaced=True, verbs={"create"})
    k.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, verbs={"list", "watch"})
    k.resources["grpo.dev/v1alpha1/grpojobs"] = kmock.ResourceInfo(
        kind="GRPOJob", namespaced=True, verbs={"list", "watch", "get", "create", "patch", "delete"},
        subresources={"status"}, shortnames={"gj"})


def write_kubeconfig(path: Path, url: str) -> Path:
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "k",
           "clusters": [{"name": "k", "cluster": {"server": url}}],
           "users": [{"name": "u", "user": {"token": "t"}}],
           "contexts": [{"name": "k", "context": {"cluster": "k", "user": "u"}}]}
    path.write_text(json.dumps(cfg))
    return path


class Harness:
    def __init__(self, k: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        self.k = k
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", str(k.url))))
        cfg = Settings(namespaces=[NS], resync_seconds=1.0, scanning=False,
                              policy=lifecycle.Policy(backoff_base=0.2, backoff_cap=1.0, expectation_ttl=3.0))
        self.registry, self.settings, self.controller = registration.build(cfg)
        self.settings.scanning.disabled = True
        self.settings.watching.reconnect_backoff = 0.1
        from kopf.testing import KopfRunner

        self.runner = KopfRunner(["run", "--standalone", "--namespace", NS], registry=self.registry,
                                 settings=self.settings)

    async def __aenter__(self) -> Harness:
        await asyncio.to_thread(self.runner.__enter__)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await asyncio.to_thread(self.runner.__exit__, None, None, None)

    async def create_job(self, body: dict[str, Any]) -> dict[str, Any]:
        body = {**body, "metadata": {**body["metadata"], "namespace": NS}}
        async with self.k.post(f"/apis/grpo.dev/v1alpha1/namespaces/{NS}/grpojobs", json=body) as r:
            assert r.status < 300, await r.text()
            return await r.json()

    def pods(self) -> list[dict[str, Any]]:
        return [o.raw for key, o in self.k.objects.items() if key[0].plural == "pods" and not o.deleted]

    def job(self, name: str) -> dict[str, Any]:
        for key, o in self.k.objects.items():
            if key[0].plural == "grpojobs" and key[2] == name and not o.deleted:
                return o.raw
        raise KeyError(name)

    async def set_pod_status(self, name: str, status: dict[str, Any]) -> None:
        async with self.k.patch(f"/api/v1/namespaces/{NS}/pods/{name}/status", json={"status": status},
                                headers={"Content-Type": "application/merge-patch+json"}) as r:
            assert r.status < 300, await r.text()

    async def wait(self, pred: Any, timeout: float = 20, what: str = "") -> Any:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            v = pred()
            if v:
                return v
            if loop.time() > end:
                raise AssertionError(f"timed out: {what}; job statuses: "
                                     f"{[o.raw.get('status') for k2, o in self.k.objects.items() if k2[0].plural == 'grpojobs']}")
            await asyncio.sleep(0.05)

    async def wait_pass(self, name: str) -> None:
        """Once a pass of the job that began after this call has completed (OperatorProcess.wait_pass, in process)."""
        def count() -> float:
            return opmetrics.REGISTRY.get_sample_value("grpo_operator_reconcile_passes_total",
                                                       {"namespace": NS, "name": name}) or 0.0

        start = count()
        await self.wait(lambda: count() >= start + 2, what=f"two more passes of {name}")


def meth(r: Any) -> str:
    return str(getattr(r.method, "value", r.method)).upper()


def status_patches(k: Any) -> list[Any]:
    return [r for r in list(k) if meth(r) == "PATCH" and r.url.path.endswith("/status") and "/grpojobs/" in r.url.path]


@pytest.mark.asyncio
async def test_ambiguous_pod_create_5xx_then_409_is_success(kmock: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    declare(kmock)
    kmock["post v1/pods"][:2] << 500  # stored, but answered 500: the retry meets AlreadyExists (409)
    async with Harness(kmock, tmp_path, monkeypatch) as h:
        await h.create_job(manifest("amb", nodes=2))
        await h.wait(lambda: len(h.pods()) == 2 and (h.job("amb").get("status") or {}).get("phase") == "Pending",
                     what="2 pods and Pending")
        await h.wait_pass("amb")  # decided again since: still no duplicate
        assert len(h.pods()) == 2
        st = h.job("amb")["status"]
        assert st["restarts"] == 0 and st["phase"] == "Pending"
        posts = [r for r in list(kmock) if meth(r) == "POST" and r.url.path.endswith("/pods")]
        assert len(posts) >= 2  # both answered 500; the retry finds them (watch or 409 → owned) → no duplicates
        # every status write is a merge patch (a real API server 400s a dict sent as a JSON patch)
        assert status_patches(kmock) and all(r.headers.get("Content-Type") == kube.MERGE_PATCH for r in status_patches(kmock))


@pytest.mark.asyncio
async def test_status_409_conflicts_converge(kmock: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    declare(kmock)
    kmock["patch grpo.dev/v1alpha1/grpojobs"][:3] << 409
    async with Harness(kmock, tmp_path, monkeypatch) as h:
        await h.create_job(manifest("conf", nodes=1))
        await h.wait(lambda: len(h.pods()) == 1, what="pod created")
        await h.wait(lambda: (h.job("conf").get("status") or {}).get("phase") == "Pending", what="status written despite 409s")
        await h.set_pod_status("conf-node-0", {"phase": "Running"})
        await h.wait(lambda: h.job("conf")["status"].get("phase") == "Running", what="Running")


@pytest.mark.asyncio
async def test_dropped_watch_and_410_gone_do_not_lose_pod_failures(kmock: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    declare(kmock)
    async with Harness(kmock, tmp_path, monkeypatch) as h:
        await h.create_job(manifest("w", nodes=2))
        await h.wait(lambda: len(h.pods()) == 2, what="pods")
        for p in ("w-node-0", "w-node-1"):
            await h.set_pod_status(p, {"phase": "Running"})
        await h.wait(lambda: h.job("w")["status"].get("phase") == "Running", what="Running")
        # from now on every pod watch request answers 410 Gone a few times (kopf must re-list), then works
        kmock["watch v1/pods"][:3] << 410
        await h.set_pod_status("w-node-1", {"phase": "Failed", "containerStatuses": [
            {"name": "trainer", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]})
        await h.wait(lambda: h.job("w")["status"].get("restarts") == 1, what="gang restart after 410s")
        await h.wait(lambda: sorted(p["metadata"]["annotations"]["grpo.dev/attempt"] for p in h.pods()) == ["1", "1"],
                     what="pods recreated at attempt 1")
        assert h.job("w")["status"]["lastFailureReason"] == "OOMKilled"


@pytest.mark.asyncio
async def test_create_conflict_owned_by_us_is_success_and_foreign_is_a_conflict(kmock: Any) -> None:
    declare(kmock)
    import kopf

    info = kopf.ConnectionInfo(server=str(kmock.url).rstrip("/"), token="t")
    c = handlers.Controller(Settings(namespaces=[NS]))
    c.writer.kube = kube.Kube(info)
    try:
        ours = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p0", "namespace": NS,
                "ownerReferences": [{"kind": "GRPOJob", "name": "j", "uid": "U", "controller": True}]}}
        theirs = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "j-config", "namespace": NS,
                  "ownerReferences": [{"kind": "Deployment", "name": "x", "uid": "X", "controller": True}]}}
        await c.writer.kube.create(ours)
        await c.writer.kube.create(theirs)
        assert await c.writer.creates.create_one((NS, "j"), "U", ours) is True  # 409 AlreadyExists, owned by this job
        assert await c.writer.creates.create_one((NS, "j"), "U", theirs) is False  # owned by something else
        pods = c.observers.observed_pods((NS, "j"), "U")
        assert [p.name for p in pods] == ["configmap/j-config"] and pods[0].owner_kind == "Deployment"
        posts = [r for r in list(kmock) if meth(r) == "POST"]
        assert len(posts) == 4
    finally:
        await c.writer.kube.close()
