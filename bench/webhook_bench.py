"""Admission webhook latency over HTTPS: 200 concurrent AdmissionReviews against the real `grpo-operator`
webhook server (kopf + our validator), valid and invalid jobs mixed.

    .venv/bin/python -m bench.webhook_bench [--concurrency 200] [--requests 4000]
    .venv/bin/python -m bench.webhook_bench --worst --concurrency 200 --requests 1000

Needs a local API server only because kopf discovers the resource before serving (tests/support/cluster).
Goal: p99 ≤ 10 ms.

--worst: every review is of the costliest spec the CRD lets through (each object that keeps unknown keys filled to
its maxProperties, values nested to the validator's depth bound), and the operator runs its controller as the
elected leader: the bench also reports the longest gap between the Lease's renewals during the flood (the
renew period is 2 s, the renew deadline 10 s) and whether the same replica still holds it.
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
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
from grpo_operator.webhook import certs
from tests.support.admission import review_request, worst_spec
from tests.support.cluster.controlplane import ControlPlane
from tests.support.cluster.util import free_port, wait_until
from tests.support.jobs import manifest


async def run(url: str, cafile: Path, concurrency: int, total: int, worst: bool = False) -> dict:
    ctx = ssl.create_default_context(cafile=str(cafile))
    if worst:
        bodies = [json.dumps(review_request(worst_spec(f"worst-{i}"))) for i in range(10)]
    else:
        bodies = [json.dumps(review_request(manifest(f"ok-{i}", nodes=2))) for i in range(50)]
        bodies += [json.dumps(review_request(manifest(f"bad-{i}", gpus=3, per_device=1, num_generations=8))) for i in range(50)]
    lat: list[float] = []
    denied = failed = busy = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=concurrency)) as s:
        async def one(i: int) -> None:
            nonlocal denied, failed, busy
            t = time.perf_counter()
            try:
                async with s.post(url, data=bodies[i % len(bodies)], headers={"Content-Type": "application/json"}) as r:
                    data = await r.json()
            except (aiohttp.ClientError, ValueError):
                failed += 1  # (the API server would apply the failurePolicy)
                return
            lat.append(time.perf_counter() - t)
            denied += not data["response"]["allowed"]
            busy += (data["response"].get("status") or {}).get("code") == 429  # shed by the webhook (also denied)

        # warm-up: open the connections
        await asyncio.gather(*(one(i) for i in range(concurrency)))
        lat.clear()
        denied = failed = busy = 0
        sem = asyncio.Semaphore(concurrency)

        async def bounded(i: int) -> None:
            async with sem:
                await one(i)

        t0 = time.perf_counter()
        await asyncio.gather(*(bounded(i) for i in range(total)))
        wall = time.perf_counter() - t0
    lat.sort()
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [float("nan")] * 99
    lat = lat or [float("nan")]
    return {"requests": total, "concurrency": concurrency, "denied": denied, "busy": busy, "failed": failed,
            "body_kib": len(bodies[0]) // 1024,
            "wall_s": round(wall, 1), "throughput_rps": round(total / wall),
            "p50_ms": round(q[49] * 1000, 2), "p90_ms": round(q[89] * 1000, 2), "p99_ms": round(q[98] * 1000, 2),
            "max_ms": round(lat[-1] * 1000, 2)}


def listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def leader(cp: ControlPlane) -> dict:
    """The Lease's spec (empty before it exists or when the API server does not answer)."""
    try:
        r = cp.api("GET", "/apis/coordination.k8s.io/v1/namespaces/default/leases/grpo-operator", timeout=5)
    except OSError:
        return {}
    return ((r.body or {}).get("spec") or {}) if r.status == 200 and isinstance(r.body, dict) else {}


class LeaseWatch:
    """Reads the Lease every 0.2 s on a thread: the longest gap between two renewals seen, and the holders."""

    def __init__(self, cp: ControlPlane):
        import threading

        self.cp, self.done = cp, threading.Event()
        self.renewals: list[float] = []
        self.holders: set[str] = set()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        last = None
        while not self.done.is_set():
            spec = leader(self.cp)
            if spec.get("renewTime") and spec["renewTime"] != last:
                last = spec["renewTime"]
                self.renewals.append(time.monotonic())
                self.holders.add(spec.get("holderIdentity") or "")
            self.done.wait(0.2)

    def stop(self) -> dict:
        self.renewals.append(time.monotonic())  # the gap up to the end counts too
        self.done.set()
        self.thread.join(5)
        gaps = [b - a for a, b in zip(self.renewals, self.renewals[1:], strict=False)]
        return {"lease_renewals": len(self.renewals) - 1, "max_renew_gap_s": round(max(gaps, default=0.0), 2),
                "lease_holders": len(self.holders)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--concurrency", type=int, default=200)
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--worst", action="store_true", help="the costliest spec, with the operator leading its Lease")
    a = p.parse_args()
    with ControlPlane(authorization_mode="AlwaysAllow", controller_manager=False) as cp:
        cp.kubectl("apply", "--validate=false", "-f", str(REPO / "crds" / "grpo.dev_grpojobs.yaml"))
        time.sleep(2)
        d = tempfile.mkdtemp()
        files = certs.generate(d, ["127.0.0.1"])
        port = free_port()
        mode = ["--namespace", "default", "--leader-elect"] if a.worst else ["--all-namespaces", "--no-controller"]
        log = open(Path(d) / "operator.log", "w")
        env = {**cp.env, "GRPO_LEADER_ELECT_LEASE": "default/grpo-operator"}
        op = subprocess.Popen([sys.executable, "-m", "grpo_operator.cli.grpo_operator", *mode,
                               "--webhook-listen", f"127.0.0.1:{port}", "--webhook-cert-dir", d, "--log-level", "WARNING"],
                              env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: listening(port) and (not a.worst or leader(cp)), 90, 0.2, what="the operator serving")
            lease = LeaseWatch(cp) if a.worst else None
            r = asyncio.run(run(f"https://127.0.0.1:{port}/validate", files.cafile, a.concurrency, a.requests, a.worst))
            if lease is not None:
                r.update(lease.stop(), operator_alive=op.poll() is None)
            print(json.dumps(r))
            if a.worst:
                print("operator log:", Path(d) / "operator.log")
        finally:
            op.terminate()
            op.wait(20)


if __name__ == "__main__":
    main()
