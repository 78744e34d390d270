"""A stub 'core' Kubernetes API for apiextensions-apiserver's delegated authn/authz.

Run as a separate process (``python _authstub.py PORT_FILE``) so kmock's process-global aiohttp
resolver patch and its event loop never mix with the tests' own kmock/kopf loops.

Answers, via kmock's KubernetesScaffold (discovery, /version, 404s for the rest):
  POST tokenreviews            -> authenticated, user "admin" in system:masters
  POST subjectaccessreviews    -> allowed
  list/watch v1 services       -> empty (the CRD server's webhook-conversion service resolver)
Anything else gets the scaffold's Kubernetes-style 404.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys


async def main(port_file: str) -> None:
    import kmock

    def token_review(request: kmock.Request) -> dict:
        data = request.data if isinstance(request.data, dict) else {}
        status: dict = {"authenticated": True,
                        "user": {"username": "admin", "uid": "admin",
                                 "groups": ["system:masters", "system:authenticated"]}}
        if (data.get("spec") or {}).get("audiences"):
            status["audiences"] = data["spec"]["audiences"]
        return {"apiVersion": data.get("apiVersion") or "authentication.k8s.io/v1",
                "kind": "TokenReview", "status": status}

    def access_review(request: kmock.Request) -> dict:
        data = request.data if isinstance(request.data, dict) else {}
        api_version = data.get("apiVersion") or "authorization.k8s.io/v1"
        return {"apiVersion": api_version, "kind": "SubjectAccessReview",
                "status": {"allowed": True, "reason": "grpo test stub allows everything"}}

    def service_list(request: kmock.Request) -> dict:
        return {"apiVersion": "v1", "kind": "ServiceList", "metadata": {"resourceVersion": "1"},
                "items": []}

    async def service_watch(request: kmock.Request) -> bytes:
        await asyncio.sleep(300)  # an idle watch; the client re-watches after it ends
        return b""

    async with kmock.KubernetesScaffold() as k, kmock.Server(k) as server:
        k[re.compile(r".*/tokenreviews")] << token_review
        k[re.compile(r".*/subjectaccessreviews")] << access_review
        k["watch v1/services"] << service_watch
        k["list v1/services"] << service_list
        with open(port_file + ".tmp", "w") as f:
            f.write(str(server.port))
        os.replace(port_file + ".tmp", port_file)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()

if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
