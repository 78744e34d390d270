"""A pod-policy admission webhook for tests: what a policy engine (PodSecurity, Kyverno, Gatekeeper) does to the
operator's pods on a real cluster, served over real HTTPS on loopback and registered with the real API server as a
ValidatingWebhookConfiguration for pods. It refuses a pod with a hostPath volume in PodSecurity's own words
(`violates PodSecurity "restricted:latest": hostPath volumes (volume "x")`). Only the namespace it is given is
affected (a namespaceSelector on a label it sets): the control plane is shared by the whole test session."""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.cluster.kubectl import Kubectl
from tests.support.cluster.util import make_pki, wait_until

POLICY = 'PodSecurity "restricted:latest"'


def violations(pod: dict[str, Any]) -> list[str]:
    """The restricted profile's hostPath check, worded as the PodSecurity admission plugin words it."""
    host = [v["name"] for v in (pod.get("spec") or {}).get("volumes") or [] if "hostPath" in v]
    if not host:
        return []
    names = ", ".join(f'"{n}"' for n in host)
    return [f"hostPath volumes (volume{'s' if len(host) > 1 else ''} {names})"]


class PolicyWebhook:
    """`with PolicyWebhook(kubectl, namespace, tmp_path) as hook:` pods with a hostPath volume created in `namespace`
    are refused by the API server; `hook.reviews` counts the pod reviews it answered."""

    def __init__(self, kubectl: Kubectl, namespace: str, workdir: Path):
        self.kubectl, self.namespace = kubectl, namespace
        self.name = f"pod-policy-{secrets.token_hex(3)}.test.grpo.dev"
        self.label = f"test.grpo.dev/pod-policy-{secrets.token_hex(3)}"
        self.reviews = 0
        self.pki = make_pki(workdir / "policy-pki")
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                request = review["request"]
                found = violations(request.get("object") or {})
                hook.reviews += 1
                response: dict[str, Any] = {"uid": request["uid"], "allowed": not found}
                if found:
                    response["status"] = {"code": 403, "reason": "Forbidden",
                                          "message": f"violates {POLICY}: {'; '.join(found)}"}
                body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": response}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.pki.serving_cert, self.pki.serving_key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def configuration(self) -> dict[str, Any]:
        port = self.server.server_address[1]
        return {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": self.name},
            "webhooks": [{
                "name": self.name,
                "clientConfig": {"url": f"https://127.0.0.1:{port}/validate",
                                 "caBundle": base64.b64encode(self.pki.ca_cert.read_bytes()).decode()},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["pods"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": {self.label: "on"}},
                "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
            }],
        }

    def __enter__(self) -> PolicyWebhook:
        self.thread.start()
        self.kubectl("label", "namespace", self.namespace, f"{self.label}=on")
        self.kubectl.apply([self.configuration()])
        self._wait_enforced()
        return self

    def _wait_enforced(self) -> None:
        """The API server picks the configuration up asynchronously: a server-side dry run of a hostPath pod shows
        when it refuses (a dry run calls webhooks with sideEffects None, and stores nothing)."""
        probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "policy-probe"},
                 "spec": {"containers": [{"name": "c", "image": "busybox"}],
                          "volumes": [{"name": "probe", "hostPath": {"path": "/"}}]}}

        def refused() -> bool:
            r = self.kubectl.create(probe, "-n", self.namespace, "--dry-run=server", check=False)
            return r.returncode != 0 and POLICY in r.stderr

        wait_until(refused, 30, 0.2, what="the pod-policy webhook to be enforced")

    def __exit__(self, *exc: Any) -> None:
        self.kubectl("delete", "validatingwebhookconfiguration", self.name, "--ignore-not-found", check=False)
        self.server.shutdown()
        self.server.server_close()
