"""A CEL-capable CRD server: etcd + apiextensions-apiserver 1.36 (built by scripts/build-kube-binaries.sh).

kube-apiserver 1.20 silently drops ``x-kubernetes-validations``; this server enforces them exactly
like a current cluster: rule messages, transition rules (``oldSelf``), and it REJECTS at CRD
creation a CRD whose rules do not compile or exceed the CEL cost budget.  It serves only CRDs and
custom resources (no core API; kubectl discovery fails): talk HTTP/JSON through the helpers.

    with CelServer() as cel:
        assert cel.create_crd(crd).ok                         # waits until Established + served
        r = cel.create(crd, {"apiVersion": ..., "kind": ..., "metadata": {"name": "x"}, "spec": {...}})
        assert r.status == 422 and "my rule message" in r.message
        r = cel.update(crd, changed_obj)                       # PUT (transition rules fire here)
        r = cel.patch(crd, "x", {"spec": {...}})               # merge-patch

Delegated authn/authz goes to a kmock KubernetesScaffold stub (``_authstub.py``, its own process)
that answers TokenReview and SubjectAccessReview with allowed=true.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import ssl
import sys
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .util import HTTPResult, ManagedProcess, find_binary, free_port, http_request, make_pki, make_workdir, wait_until

_LIVE: weakref.WeakSet[CelServer] = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    for s in list(_LIVE):
        try:
            s.stop()
        except Exception:
            pass


def crd_resource_path(crd: Mapping[str, Any], namespace: str | None = None,
                      version: str | None = None) -> str:
    """The collection path of a CRD's objects: /apis/<group>/<version>[/namespaces/<ns>]/<plural>."""
    spec = crd["spec"]
    if version is None:
        versions = spec["versions"]
        version = next((v["name"] for v in versions if v.get("storage")), versions[0]["name"])
    base = f"/apis/{spec['group']}/{version}"
    if spec.get("scope", "Namespaced") == "Namespaced":
        base += f"/namespaces/{namespace or 'default'}"
    return f"{base}/{spec['names']['plural']}"


class CelServer:
    def __init__(self, workdir: str | os.PathLike[str] | None = None, *,
                 startup_timeout: float = 60.0, keep_workdir: bool | None = None,
                 verbosity: int = 1):
        self.startup_timeout = startup_timeout
        self.verbosity = verbosity
        self.workdir, self._own_workdir, self.keep_workdir = make_workdir(workdir, "grpo-cel-", keep_workdir)
        self.logdir = self.workdir / "logs"
        self.etcd_bin = find_binary("etcd")
        self.server_bin = find_binary("apiextensions-apiserver")
        self.etcd_port, self.etcd_peer_port, self.port = free_port(), free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self.url = f"https://127.0.0.1:{self.port}"
        self.pki = make_pki(self.workdir / "pki")
        self._ssl = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        self.token = secrets.token_hex(16)  # any token: the stub authenticates everyone as admin
        self.stub_port_file = self.workdir / "authstub.port"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        self.etcd = ManagedProcess("etcd", [
            str(self.etcd_bin), "--name=default", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}", "--heartbeat-interval=25", "--election-timeout=250",
            "--logger=zap", "--log-level=warn",
        ], self.logdir / "etcd.log")
        self.authstub = ManagedProcess("authstub", [
            sys.executable, str(Path(__file__).with_name("_authstub.py")), str(self.stub_port_file),
        ], self.logdir / "authstub.log")
        self.server: ManagedProcess | None = None
        self.timings: dict[str, float] = {}
        _LIVE.add(self)

    def __enter__(self) -> CelServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> CelServer:
        t0 = time.monotonic()
        self.etcd.start()
        self.authstub.start()

        def etcd_ok() -> bool:
            body = http_request(self.etcd_url + "/health", timeout=2).body
            return isinstance(body, dict) and body.get("health") == "true"

        wait_until(etcd_ok, self.startup_timeout, what="etcd /health", check=self.etcd.check_alive)
        wait_until(self.stub_port_file.exists, self.startup_timeout, what="kmock auth stub",
                   check=self.authstub.check_alive)
        self.timings["etcd+authstub"] = time.monotonic() - t0
        stub_kubeconfig = self.workdir / "stub.kubeconfig"
        stub_kubeconfig.write_text(
            '{"apiVersion": "v1", "kind": "Config", "current-context": "stub",'
            f' "clusters": [{{"name": "stub", "cluster": {{"server": "http://127.0.0.1:{self.stub_port_file.read_text().strip()}"}}}}],'
            ' "users": [{"name": "stub", "user": {}}],'
            ' "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "stub"}}]}')
        kc = str(stub_kubeconfig)
        self.server = ManagedProcess("apiextensions-apiserver", [
            str(self.server_bin),
            f"--etcd-servers={self.etcd_url}", "--etcd-prefix=/registry-ext",
            "--bind-address=127.0.0.1", f"--secure-port={self.port}",
            f"--cert-dir={self.workdir / 'certs'}",
            f"--tls-cert-file={self.pki.serving_cert}", f"--tls-private-key-file={self.pki.serving_key}",
            f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--authentication-skip-lookup", "--enable-priority-and-fairness=false",
            "--disable-admission-plugins=NamespaceLifecycle,MutatingAdmissionWebhook,"
            "ValidatingAdmissionWebhook,MutatingAdmissionPolicy,ValidatingAdmissionPolicy",
            f"--v={self.verbosity}",
        ], self.logdir / "apiextensions-apiserver.log")
        t1 = time.monotonic()
        self.server.start()
        # The standalone server never starts its v1.Service informer (it has no core API to
        # watch), so the informer-sync readiness check stays red forever: exclude it.
        wait_until(lambda: self.request("GET", "/readyz?exclude=informer-sync", timeout=5).status == 200,
                   self.startup_timeout, interval=0.05, what="apiextensions-apiserver /readyz",
                   check=self._check_alive)
        self.timings["apiextensions-apiserver"] = time.monotonic() - t1
        return self

    def _check_alive(self) -> None:
        self.etcd.check_alive()
        self.authstub.check_alive()
        if self.server is not None:
            self.server.check_alive()

    def stop(self) -> None:
        graceful = self.keep_workdir or not self._own_workdir
        for p in (self.server, self.authstub, self.etcd):
            if p is not None:
                p.stop() if graceful else p.kill()
        _LIVE.discard(self)
        if self._own_workdir and not self.keep_workdir and self.workdir.exists():
            shutil.rmtree(self.workdir, ignore_errors=True)

    def rss(self) -> dict[str, int | None]:
        return {p.name: p.rss() for p in (self.etcd, self.authstub, self.server) if p is not None}

    def logs(self, lines: int = 60) -> str:
        return self.server.log_tail(lines) if self.server else ""

    # ------------------------------------------------------------------ HTTP helpers
    def request(self, method: str, path: str, body: Any = None, *,
                content_type: str = "application/json", timeout: float = 30.0) -> HTTPResult:
        return http_request(self.url + path, method, body, token=self.token,
                            content_type=content_type, ssl_context=self._ssl, timeout=timeout)

    def create_crd(self, crd: Mapping[str, Any], *, wait: bool = True,
                   timeout: float = 30.0) -> HTTPResult:
        """POST the CRD.  A CRD with uncompilable or over-budget rules answers 422 here.
        With ``wait``, a created CRD is awaited until Established and its resource is served."""
        r = self.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", dict(crd))
        if r.ok and wait:
            name = crd["metadata"]["name"]

            def established() -> bool:
                got = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conds = (got.body or {}).get("status", {}).get("conditions", []) if got.ok else []
                return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

            wait_until(established, timeout, what=f"CRD {name} Established")
            wait_until(lambda: self.request("GET", crd_resource_path(crd)).ok, timeout,
                       what=f"CRD {name} served")
        return r

    def delete_crd(self, name: str, *, wait: bool = True, timeout: float = 30.0) -> HTTPResult:
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        r = self.request("DELETE", path)
        if r.ok and wait:
            wait_until(lambda: self.request("GET", path).status == 404, timeout,
                       what=f"CRD {name} deleted")
        return r

    def apply_crd(self, crd: Mapping[str, Any], **kw: Any) -> HTTPResult:
        """Create, or replace (PUT with the current resourceVersion) when it exists."""
        r = self.create_crd(crd, **kw)
        if r.status != 409:
            return r
        name = crd["metadata"]["name"]
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        cur = self.request("GET", path)
        body = {**crd, "metadata": {**crd["metadata"],
                                    "resourceVersion": cur.body["metadata"]["resourceVersion"]}}
        return self.request("PUT", path, body)

    def _ns(self, obj: Mapping[str, Any] | None, namespace: str | None) -> str | None:
        if namespace is not None:
            return namespace
        return ((obj or {}).get("metadata") or {}).get("namespace")

    def create(self, crd: Mapping[str, Any], obj: Mapping[str, Any], *,
               namespace: str | None = None) -> HTTPResult:
        return self.request("POST", crd_resource_path(crd, self._ns(obj, namespace)), dict(obj))

    def get(self, crd: Mapping[str, Any], name: str, *, namespace: str | None = None) -> HTTPResult:
        return self.request("GET", f"{crd_resource_path(crd, namespace)}/{name}")

    def update(self, crd: Mapping[str, Any], obj: Mapping[str, Any], *,
               namespace: str | None = None) -> HTTPResult:
        """PUT ``obj``; fills in metadata.resourceVersion from the live object when missing."""
        ns = self._ns(obj, namespace)
        name = obj["metadata"]["name"]
        obj = dict(obj)
        if "resourceVersion" not in obj["metadata"]:
            cur = self.get(crd, name, namespace=ns)
            if not cur.ok:
                return cur
            obj["metadata"] = {**obj["metadata"], "resourceVersion": cur.body["metadata"]["resourceVersion"]}
        return self.request("PUT", f"{crd_resource_path(crd, ns)}/{name}", obj)

    def patch(self, crd: Mapping[str, Any], name: str, patch: Any, *, namespace: str | None = None,
              patch_type: str = "merge", subresource: str | None = None) -> HTTPResult:
        ctype = {"merge": "application/merge-patch+json", "json": "application/json-patch+json"}[patch_type]
        path = f"{crd_resource_path(crd, namespace)}/{name}" + (f"/{subresource}" if subresource else "")
        return self.request("PATCH", path, patch, content_type=ctype)

    def delete(self, crd: Mapping[str, Any], name: str, *, namespace: str | None = None) -> HTTPResult:
        return self.request("DELETE", f"{crd_resource_path(crd, namespace)}/{name}")
