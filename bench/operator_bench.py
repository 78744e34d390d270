"""Operator throughput against a local real API server (kube-apiserver 1.20.2 + etcd, tests/cluster).

    .venv/bin/python bench/operator_bench.py --jobs 1 100 1000 [--nodes 2]

For each N, in the same control plane:
  floor     a plain asyncio client creates the same objects (N jobs, then per job ConfigMap, Service,
            `nodes` pods) and one merge-patch of each job's status, 64 requests in flight.
  operator  the `grpo-operator` process is running; the bench creates N jobs the same way and stops the clock
            when every job has all its children and a status (phase Pending, Created=True).
ratio = operator / floor (goal ≤ 1.3). Also the operator's RSS after N jobs (goal ≤ 150 MB at 1000).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "operator"))

from cluster._util import rss_bytes  # noqa: E402
from cluster.controlplane import ControlPlane  # noqa: E402
from gjhelpers import manifest  # noqa: E402

from grpo_operator import manifests, validation  # noqa: E402

CONCURRENCY = 64


class Client:
    def __init__(self, cp: ControlPlane):
        self.cp = cp
        ctx = ssl.create_default_context(cafile=str(cp.ca_file))
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=CONCURRENCY),
                                             headers={"Authorization": f"Bearer {cp.admin_token}"})
        self.sem = asyncio.Semaphore(CONCURRENCY)

    async def req(self, method: str, path: str, body: object = None, ctype: str = "application/json") -> dict:
        async with self.sem:
            async with self.session.request(method, self.cp.server + path, data=json.dumps(body) if body is not None else None,
                                            headers={"Content-Type": ctype}) as r:
                text = await r.text()
                if r.status >= 300:
                    raise RuntimeError(f"{method} {path}: {r.status} {text[:300]}")
                return json.loads(text)

    async def create_job(self, ns: str, name: str, nodes: int) -> dict:
        return await self.req("POST", f"/apis/grpo.dev/v1alpha1/namespaces/{ns}/grpojobs", manifest(name, nodes=nodes))

    async def close(self) -> None:
        await self.session.close()


async def floor(c: Client, ns: str, n: int, nodes: int) -> float:
    t0 = time.perf_counter()

    async def one(i: int) -> None:
        job = await c.create_job(ns, f"j{i}", nodes)
        res = validation.validate(job)
        objs = manifests.render(res.job, res.topology, ns, uid=job["metadata"]["uid"])
        await asyncio.gather(*(c.req("POST", f"/api/v1/namespaces/{ns}/{o['kind'].lower()}s", o) for o in objs))
        await c.req("PATCH", f"/apis/grpo.dev/v1alpha1/namespaces/{ns}/grpojobs/j{i}/status",
                    {"status": {"phase": "Pending", "restarts": 0}}, "application/merge-patch+json")

    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - t0


async def with_operator(c: Client, ns: str, n: int, nodes: int) -> float:
    t0 = time.perf_counter()
    await asyncio.gather(*(c.create_job(ns, f"j{i}", nodes) for i in range(n)))
    while True:
        jobs = (await c.req("GET", f"/apis/grpo.dev/v1alpha1/namespaces/{ns}/grpojobs"))["items"]
        done = sum(1 for j in jobs if (j.get("status") or {}).get("phase") == "Pending"
                   and any(x["type"] == "Created" and x["status"] == "True" for x in j["status"].get("conditions", [])))
        if done == n:
            pods = (await c.req("GET", f"/api/v1/namespaces/{ns}/pods"))["items"]
            if len(pods) == n * nodes:
                return time.perf_counter() - t0
        await asyncio.sleep(0.05 if n < 100 else 0.25)


async def main_async(args: argparse.Namespace) -> list[dict]:
    results = []
    with ControlPlane(authorization_mode="AlwaysAllow", controller_manager=False) as cp:
        cp.kubectl("apply", "--validate=false", "-f", str(REPO / "crds" / "grpo.dev_grpojobs.yaml"))
        time.sleep(2)
        c = Client(cp)
        try:
            for n in args.jobs:
                ns_f, ns_o = f"floor-{n}", f"op-{n}"
                cp.ensure_namespace(ns_f)
                cp.ensure_namespace(ns_o)
                t_floor = await floor(c, ns_f, n, args.nodes)
                log = open(f"/tmp/grpo-operator-bench-{n}.log", "w")
                op = subprocess.Popen([sys.executable, "-m", "grpo_operator.main", "--namespace", ns_o, "--log-level", "WARNING"],
                                      env={**cp.env, "GRPO_RESYNC_SECONDS": "300"}, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
                try:
                    await asyncio.sleep(3)  # operator started and watching
                    rss0 = rss_bytes(op.pid) or 0
                    t_op = await with_operator(c, ns_o, n, args.nodes)
                    await asyncio.sleep(1)
                    rss = rss_bytes(op.pid) or 0
                finally:
                    op.terminate()
                    op.wait(20)
                r = {"jobs": n, "nodes_per_job": args.nodes, "objects_per_job": 2 + args.nodes,
                     "floor_s": round(t_floor, 3), "operator_s": round(t_op, 3), "ratio": round(t_op / t_floor, 2),
                     "operator_rss_mb_idle": round(rss0 / 2**20, 1), "operator_rss_mb": round(rss / 2**20, 1)}
                print(json.dumps(r), flush=True)
                results.append(r)
        finally:
            await c.close()
    return results


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 100, 1000])
    p.add_argument("--nodes", type=int, default=2)
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
