"""Admission webhook latency over HTTPS: 200 concurrent AdmissionReviews against the real `grpo-operator`
webhook server (kopf + our validator), valid and invalid jobs mixed.

    .venv/bin/python -m bench.webhook_bench [--concurrency 200] [--requests 4000]

Needs a local API server only because kopf discovers the resource before serving (tests/support/cluster).
Goal: p99 ≤ 10 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
from grpo_operator.webhook import certs
from tests.support.cluster.controlplane import ControlPlane
from tests.support.cluster.util import free_port
from tests.support.jobs import manifest


def review(obj: dict) -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "grpo.dev", "version": "v1alpha1", "kind": "GRPOJob"},
        "resource": {"group": "grpo.dev", "version": "v1alpha1", "resource": "grpojobs"},
        "requestKind": {"group": "grpo.dev", "version": "v1alpha1", "kind": "GRPOJob"},
        "requestResource": {"group": "grpo.dev", "version": "v1alpha1", "resource": "grpojobs"},
        "name": obj["metadata"]["name"], "namespace": "default", "operation": "CREATE",
        "userInfo": {"username": "bench"}, "object": obj, "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}}


async def run(url: str, cafile: Path, concurrency: int, total: int) -> dict:
    ctx = ssl.create_default_context(cafile=str(cafile))
    bodies = [json.dumps(review(manifest(f"ok-{i}", nodes=2))) for i in range(50)]
    bodies += [json.dumps(review(manifest(f"bad-{i}", gpus=3, per_device=1, num_generations=8))) for i in range(50)]
    lat: list[float] = []
    denied = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=concurrency)) as s:
        async def one(i: int) -> None:
            nonlocal denied
            t = time.perf_counter()
            async with s.post(url, data=bodies[i % len(bodies)], headers={"Content-Type": "application/json"}) as r:
                data = await r.json()
            lat.append(time.perf_counter() - t)
            denied += not data["response"]["allowed"]

        # warm-up: open the connections
        await asyncio.gather(*(one(i) for i in range(concurrency)))
        lat.clear()
        denied = 0
        sem = asyncio.Semaphore(concurrency)

        async def bounded(i: int) -> None:
            async with sem:
                await one(i)

        t0 = time.perf_counter()
        await asyncio.gather(*(bounded(i) for i in range(total)))
        wall = time.perf_counter() - t0
    lat.sort()
    q = statistics.quantiles(lat, n=100)
    return {"requests": total, "concurrency": concurrency, "denied": denied, "throughput_rps": round(total / wall),
            "p50_ms": round(q[49] * 1000, 2), "p90_ms": round(q[89] * 1000, 2), "p99_ms": round(q[98] * 1000, 2),
            "max_ms": round(lat[-1] * 1000, 2)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--concurrency", type=int, default=200)
    p.add_argument("--requests", type=int, default=4000)
    a = p.parse_args()
    with ControlPlane(authorization_mode="AlwaysAllow", controller_manager=False) as cp:
        cp.kubectl("apply", "--validate=false", "-f", str(REPO / "crds" / "grpo.dev_grpojobs.yaml"))
        time.sleep(2)
        d = tempfile.mkdtemp()
        files = certs.generate(d, ["127.0.0.1"])
        port = free_port()
        op = subprocess.Popen([sys.executable, "-m", "grpo_operator.cli.grpo_operator", "--all-namespaces", "--no-controller",
                               "--webhook-listen", f"127.0.0.1:{port}", "--webhook-cert-dir", d, "--log-level", "WARNING"],
                              env=cp.env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(4)
            r = asyncio.run(run(f"https://127.0.0.1:{port}/validate", files.cafile, a.concurrency, a.requests))
            print(json.dumps(r))
        finally:
            op.terminate()
            op.wait(20)


if __name__ == "__main__":
    main()
