"""Operator throughput against a local real API server (kube-apiserver 1.20.2 + etcd, tests/support/cluster).

    .venv/bin/python -m bench.operator_bench --jobs 1 100 1000 [--nodes 2] [--trees OTHER_CHECKOUT ...] [--rounds R]

For each N, in the same control plane:
  floor     a plain asyncio client creates the same objects (N jobs, then per job ConfigMap, Service,
            `nodes` pods) and one merge-patch of each job's status, 64 requests in flight.
  operator  the `grpo-operator` process is running; the bench creates N jobs the same way.
Both clocks stop the same way: when every job has all its children and a status (phase Pending, Created=True), as
seen by two watches opened before the clock starts (polling LISTs of 1000 jobs would load the API server the
operator shares with the bench; an earlier version polled and overstated the ratio, and a later one timed the
floor by its own requests while the operator side paid for the watches). `floor_requests_s` is the floor's own
requests alone.
ratio = operator / floor (goal ≤ 1.3). Also the operator's RSS after N jobs (goal ≤ 150 MB at 1000): 1 s after the
last job converged, and again after --settle seconds with nothing happening.
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
from typing import Optional

import aiohttp

REPO = Path(__file__).resolve().parents[1]
from grpo_operator.controller import kube
from grpo_operator.render import job as render_job
from grpo_operator.rules import validation
from tests.support.cluster.controlplane import ControlPlane
from tests.support.cluster.util import cpu_seconds, free_port, rss_bytes
from tests.support.jobs import manifest

CONCURRENCY = 64
# --profile: the operator under cProfile, timed by CPU time (wall time would count the other processes' turns on the
# shared cores); the stats are written when it exits (SIGTERM: kopf stops, run_module returns)
PROFILED = """import cProfile, runpy, sys, time
p = cProfile.Profile(time.process_time)
sys.argv = ["grpo-operator", *sys.argv[2:]]
p.enable()
try:
    runpy.run_module("grpo_operator.cli.grpo_operator", run_name="__main__")
except SystemExit:
    pass
finally:
    p.disable()
    p.dump_stats({path!r})
"""


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


def _job_done(job: dict) -> bool:
    st = job.get("status") or {}
    return st.get("phase") == "Pending" and any(
        x.get("type") == "Created" and x.get("status") == "True" for x in st.get("conditions") or [])


async def _watch(c: Client, path: str, on_event) -> None:
    """List, then watch from the list's resourceVersion, until cancelled; list again whenever the API server ends
    the watch (it closes watchers that read slowly). A watch, not polling: the bench must not load the API server
    it shares with the operator."""
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    while True:
        listed = await c.req("GET", path)
        for obj in listed["items"]:
            on_event("ADDED", obj)
        rv = listed["metadata"]["resourceVersion"]
        try:
            async with c.session.get(f"{c.cp.server}{path}?watch=1&resourceVersion={rv}", timeout=timeout) as r:
                async for line in r.content:
                    if line.strip():
                        ev = json.loads(line)
                        if ev["type"] == "ERROR":
                            break
                        on_event(ev["type"], ev["object"])
        except (aiohttp.ClientError, ValueError):
            pass


async def timed(c: Client, ns: str, n: int, nodes: int, work) -> tuple[float, float]:
    """Run `work()` (it creates the N jobs, and in the floor also their children and statuses) and stop the clock
    when every job has all its pods and a status (phase Pending, Created=True), as seen by two watches opened before
    the clock starts. Both sides are timed this same way, so both pay for the same observers. Returns (seconds
    until the watches saw everything, seconds until work() returned)."""
    pods: set[str] = set()
    done: set[str] = set()
    finished = asyncio.Event()
    t_end = 0.0

    def check() -> None:
        nonlocal t_end
        if len(done) == n and len(pods) == n * nodes and not finished.is_set():
            t_end = time.perf_counter()
            finished.set()

    def on_pod(kind: str, obj: dict) -> None:
        if kind in ("ADDED", "MODIFIED"):
            pods.add(obj["metadata"]["name"])
            check()

    def on_job(kind: str, obj: dict) -> None:
        if kind in ("ADDED", "MODIFIED") and _job_done(obj):
            done.add(obj["metadata"]["name"])
            check()

    watches = [asyncio.create_task(_watch(c, f"/api/v1/namespaces/{ns}/pods", on_pod)),
               asyncio.create_task(_watch(c, f"/apis/grpo.dev/v1alpha1/namespaces/{ns}/grpojobs", on_job))]
    await asyncio.sleep(0.5)  # both watches open before the clock starts
    t0 = time.perf_counter()
    try:
        await work()
        t_work = time.perf_counter() - t0
        await asyncio.wait_for(finished.wait(), 600)
    finally:
        for w in watches:
            w.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
    # cross-check the watches' verdict with one list of each
    jobs = (await c.req("GET", f"/apis/grpo.dev/v1alpha1/namespaces/{ns}/grpojobs"))["items"]
    listed = (await c.req("GET", f"/api/v1/namespaces/{ns}/pods"))["items"]
    assert sum(map(_job_done, jobs)) == n and len(listed) == n * nodes, (len(jobs), len(listed))
    return t_end - t0, t_work


async def floor(c: Client, ns: str, n: int, nodes: int) -> tuple[float, float]:
    async def one(i: int) -> None:
        job = await c.create_job(ns, f"j{i}", nodes)
        res = validation.validate(job)
        # the operator's own renderer (with its defaults: no download pod without spec.cache, no NetworkPolicy
        # unless GRPO_JOB_NETWORK_POLICY), so that both sides create the same objects
        objs = render_job.render(res.job, res.topology, ns, uid=job["metadata"]["uid"])
        await asyncio.gather(*(c.req("POST", kube.path_for(o["kind"], ns, api_version=o["apiVersion"]), o)
                               for o in objs))
        await c.req("PATCH", f"/apis/grpo.dev/v1alpha1/namespaces/{ns}/grpojobs/j{i}/status",
                    {"status": {"phase": "Pending", "restarts": 0,
                                "conditions": [{"type": "Created", "status": "True", "reason": "Created",
                                                "message": "floor"}]}},
                    "application/merge-patch+json")

    async def work() -> None:
        await asyncio.gather(*(one(i) for i in range(n)))

    return await timed(c, ns, n, nodes, work)


async def with_operator(c: Client, ns: str, n: int, nodes: int) -> tuple[float, float]:
    """(seconds until every job converged, seconds the bench took to create the N jobs meanwhile)."""
    async def work() -> None:
        await asyncio.gather(*(c.create_job(ns, f"j{i}", nodes) for i in range(n)))

    return await timed(c, ns, n, nodes, work)


async def _started(op: subprocess.Popen, health: str) -> None:
    """Until the operator answers on its liveness endpoint (kopf serves it once the operator runs: imports, login and
    the watch of its namespace done). An earlier version slept 3 s: on a busy machine, or on a fresh clone compiling
    its .pyc files, the operator was still starting then, and its start-up CPU counted as the jobs'."""
    async with aiohttp.ClientSession() as s:
        for _ in range(1200):
            if op.poll() is not None:
                raise RuntimeError(f"the operator exited with {op.returncode} before it started")
            try:
                async with s.get(health, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return
            except (TimeoutError, aiohttp.ClientError):
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("the operator did not start within 120 s")


COUNTED = {"passes": "grpo_operator_reconcile_duration_seconds_count",
           "status_writes": "grpo_operator_status_writes_total"}


async def _counters(url: str) -> dict[str, float]:
    """Reconcile passes and status writes so far, from the operator's /metrics: what it did per job, a figure the
    machine's load does not move (its CPU per job, it does)."""
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        text = await r.text()
    out = dict.fromkeys(COUNTED, 0.0)
    for line in text.splitlines():
        for what, name in COUNTED.items():
            if line.startswith(name) and not line.startswith("#"):
                out[what] += float(line.rsplit(" ", 1)[1])
    return out


def server_cpu(cp: ControlPlane) -> float:
    """CPU seconds kube-apiserver and etcd have used so far: the API side's cost of a run, which (unlike the wall
    time the ratio is made of) the machine's load hardly moves."""
    return sum(cpu_seconds(p.pid) for p in (cp.apiserver, cp.etcd) if p.pid is not None)


async def run_operator(cp: ControlPlane, c: Client, args: argparse.Namespace, n: int, ns: str,
                       tree: Optional[Path]) -> dict:
    """Start the operator (this checkout's, or `tree`'s operator/ package), time N jobs through it, stop it."""
    log = open(f"/tmp/grpo-operator-bench-{ns}.log", "w")
    prof = ["-c", PROFILED.format(path=args.profile.format(n=n, ns=ns))] if args.profile else ["-m"]
    env = {**cp.env, "GRPO_RESYNC_SECONDS": "300"}
    if tree is not None:  # its grpo_trainer too (the operator imports its contract), not the one installed
        env["PYTHONPATH"] = f"{tree / 'operator'}:{tree / 'trainer_image'}"
    health, metrics = f"http://127.0.0.1:{free_port()}/healthz", f"127.0.0.1:{free_port()}"
    op = subprocess.Popen([sys.executable, *prof, "grpo_operator.cli.grpo_operator", "--namespace", ns,
                           "--log-level", "WARNING", "--liveness", health, "--metrics-listen", metrics], env=env,
                          stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        await _started(op, health)
        rss0 = rss_bytes(op.pid) or 0
        cpu0, server0 = cpu_seconds(op.pid), server_cpu(cp)
        t_op, t_created = await with_operator(c, ns, n, args.nodes)
        cpu, server = cpu_seconds(op.pid) - cpu0, server_cpu(cp) - server0
        counts = await _counters(f"http://{metrics}/metrics")
        await asyncio.sleep(1)
        rss = rss_bytes(op.pid) or 0
        await asyncio.sleep(args.settle)  # kopf's per-object workers end after batching.idle_timeout
        rss_settled = rss_bytes(op.pid) or 0
    finally:
        op.terminate()
        op.wait(20)
    return {"operator_s": round(t_op, 3), "operator_jobs_created_s": round(t_created, 3),
            "operator_cpu_ms_per_job": round(cpu * 1000 / n, 2), "operator_server_cpu_ms_per_job": round(server * 1000 / n, 2),
            **{f"{what}_per_job": round(v / n, 2) for what, v in counts.items()},
            "operator_rss_mb_idle": round(rss0 / 2**20, 1), "operator_rss_mb": round(rss / 2**20, 1),
            f"operator_rss_mb_after_{args.settle:g}s": round(rss_settled / 2**20, 1)}


async def main_async(args: argparse.Namespace) -> list[dict]:
    results = []
    trees: list[Optional[Path]] = [None, *args.trees]
    with ControlPlane(authorization_mode="AlwaysAllow", controller_manager=False) as cp:
        cp.kubectl("apply", "--validate=false", "-f", str(REPO / "crds" / "grpo.dev_grpojobs.yaml"))
        time.sleep(2)
        c = Client(cp)
        try:
            for rnd in range(args.rounds):
                for n in args.jobs:
                    ns_f = f"floor-{n}-{rnd}"
                    cp.ensure_namespace(ns_f)
                    server0 = server_cpu(cp)
                    t_floor, t_floor_requests = await floor(c, ns_f, n, args.nodes)
                    floor_server = round((server_cpu(cp) - server0) * 1000 / n, 2)
                    # alternate the trees' order from round to round: the later run finds a larger etcd
                    for tree in (trees if rnd % 2 == 0 else trees[::-1]):
                        ns_o = f"op-{n}-{rnd}-{trees.index(tree)}"
                        cp.ensure_namespace(ns_o)
                        r = {"jobs": n, "round": rnd, "tree": str(tree or REPO), "nodes_per_job": args.nodes,
                             "objects_per_job": 2 + args.nodes, "floor_s": round(t_floor, 3),
                             "floor_requests_s": round(t_floor_requests, 3), "floor_server_cpu_ms_per_job": floor_server,
                             **await run_operator(cp, c, args, n, ns_o, tree)}
                        r["ratio"] = round(r["operator_s"] / t_floor, 2)
                        print(json.dumps(r), flush=True)
                        results.append(r)
        finally:
            await c.close()
    return results


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 100, 1000])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--profile", help="run the operator under cProfile, stats to this path ({n}: the N, {ns}: the "
                   "namespace)")
    p.add_argument("--trees", type=Path, nargs="*", default=[],
                   help="other checkouts (or `git archive` extracts of operator/ and trainer_image/) whose operator "
                        "also runs, side by side, after this one's on the same N (before/after comparisons in one run)")
    p.add_argument("--rounds", type=int, default=1, help="repeat the whole sequence (the trees alternate order)")
    p.add_argument("--settle", type=float, default=20, help="seconds after the run to measure RSS again")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
