"""High availability on the real control plane (`grpo-operator --leader-elect`, controller/leader.py): two replicas
on one Lease; the leader stopped (SIGSTOP, idle or in the middle of a write burst) or killed; the standby takes over
within the lease time; a stopped leader that resumes acts on nothing and exits non-zero; a takeover whose first
re-list fails (through a proxy in front of the API server) still reconciles the jobs that existed before."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import signal
import ssl
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import pytest
from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

from tests.support.cluster.util import wait_until
from tests.support.jobs import manifest
from tests.support.operator import OperatorProcess, get_job, pod_exit, pods_of, wait_job, wait_pods

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

LEASE, RENEW, RETRY = 6.0, 4.0, 1.0  # short timings keep the test short; the rules are the default 15/10/2 s ones
LEASE_NAME = "grpo-operator"
EVENT_WRITERS = 4  # controller/events.py: EventRecorder's writers, each with at most one Event in flight
EXIT_LOST = 3  # leader.EXIT_LOST


def replica(crd: Any, logdir: Path, ns: str, kubeconfig: Optional[Path] = None, **extra: str) -> OperatorProcess:
    env = {**extra, "GRPO_LEADER_ELECT_LEASE_SECONDS": str(LEASE), "GRPO_LEADER_ELECT_RENEW_DEADLINE_SECONDS": str(RENEW),
           "GRPO_LEADER_ELECT_RETRY_SECONDS": str(RETRY), "GRPO_FORCE_DELETE_AFTER_SECONDS": "2"}
    return OperatorProcess(kubeconfig or crd.kubeconfig, logdir, "--namespace", ns, "--leader-elect",
                           "--leader-elect-lease", f"{ns}/{LEASE_NAME}", env=env)


def identity(op: OperatorProcess, timeout: float = 60) -> str:
    """The replica's Lease identity, from its log."""
    def found() -> Optional[str]:
        op.proc.check_alive()
        m = re.search(r"leader election: (\S+) contends", op.proc.log_since_start())
        return m.group(1) if m else None

    return wait_until(found, timeout, 0.1, what="the replica contending")


def holder(k: Any, ns: str) -> dict[str, Any]:
    return (k.json("get", "lease", LEASE_NAME, "-n", ns, check=False) or {}).get("spec") or {}


def wait_holder(k: Any, ns: str, who: str, timeout: float) -> float:
    wait_until(lambda: holder(k, ns).get("holderIdentity") == who, timeout, 0.1, what=f"{who} holds the lease")
    return time.monotonic()


def signal_proc(op: OperatorProcess, sig: int) -> None:
    assert op.proc.proc is not None
    os.kill(op.proc.proc.pid, sig)


def test_stopped_leader_is_replaced_and_acts_on_nothing_when_it_resumes(crd, kubectl, k8s_namespace, tmp_path):
    k, ns = kubectl, k8s_namespace
    a, b = replica(crd, tmp_path / "a", ns), replica(crd, tmp_path / "b", ns)
    timeline: dict[str, float] = {}
    try:
        t_start = time.monotonic()
        a.start(wait=False)
        ida = identity(a)
        wait_holder(k, ns, ida, 60)
        timeline["a acquired"] = time.monotonic() - t_start
        b.start(wait=False)
        idb = identity(b)
        k.apply([manifest("ha", nodes=2)], "-n", ns)
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in wait_pods(k, ns, "ha", 2, timeout=60)}
        assert "acquired" not in b.proc.log_since_start()  # the standby created nothing, holds nothing

        signal_proc(a, signal.SIGSTOP)
        t_stop = time.monotonic()
        t_over = wait_holder(k, ns, idb, LEASE + 4 * RETRY + 10)
        timeline["b took over after a stopped"] = t_over - t_stop
        assert t_over - t_stop <= LEASE + 2 * RETRY + 2, timeline  # within the lease time (+ the polls)
        assert holder(k, ns).get("leaseTransitions") == 1

        # meanwhile the job is suspended: b deletes its pods
        k("patch", "grpojob", "ha", "-n", ns, "--type=merge", "-p", json.dumps({"spec": {"runPolicy": {"suspend": True}}}))
        wait_job(k, ns, "ha", lambda s: s.get("phase") == "Suspended", 60, what="suspended by the new leader")
        wait_until(lambda: not pods_of(k, ns, "ha"), 60, 0.2, what="pods gone")
        timeline["suspended, pods gone"] = time.monotonic() - t_stop
        job = get_job(k, ns, "ha")
        rv, managed = job["metadata"]["resourceVersion"], job["metadata"].get("managedFields")

        signal_proc(a, signal.SIGCONT)  # a wakes with a cache that says "running, 2 pods": it must write nothing
        t_cont = time.monotonic()
        assert a.proc.proc is not None
        code = a.proc.proc.wait(30)
        timeline["a exited after SIGCONT"] = time.monotonic() - t_cont
        assert code == EXIT_LOST, a.log()
        assert "leader election lost" in a.proc.log_since_start()
        # settle: anything a sent in its last moment would be visible by now; b (which writes only changes) is idle
        time.sleep(2 * RETRY)
        assert not pods_of(k, ns, "ha"), "a pod was recreated"
        job = get_job(k, ns, "ha")
        assert job["metadata"]["resourceVersion"] == rv and job["metadata"].get("managedFields") == managed
        assert job["status"]["phase"] == "Suspended"
        assert holder(k, ns).get("holderIdentity") == idb
        assert set(before)  # the pods a created are gone for good (not recreated under the same names)
        b.proc.check_alive()
    finally:
        print(f"\nfailover timeline (s, lease {LEASE:g}/{RENEW:g}/{RETRY:g}): {json.dumps(timeline)}")
        for op in (a, b):
            if op.proc.proc is not None and op.proc.proc.poll() is None:
                signal_proc(op, signal.SIGCONT)
            op.stop()


def test_leader_killed_mid_creation_no_duplicates_no_orphans(crd, kubectl, k8s_namespace, tmp_path):
    k, ns = kubectl, k8s_namespace
    n_jobs, nodes = 20, 3
    # one write at a time: the leader is still creating when it is killed
    a, b = replica(crd, tmp_path / "a", ns, GRPO_MAX_CONCURRENT_WRITES="1"), replica(crd, tmp_path / "b", ns)
    timeline: dict[str, float] = {}
    try:
        a.start(wait=False)
        wait_holder(k, ns, identity(a), 60)
        b.start(wait=False)
        idb = identity(b)
        k.apply([manifest(f"k{i:02d}", nodes=nodes) for i in range(n_jobs)], "-n", ns)
        # a few jobs' pods created (each job's "Pending" event is logged after its creates); kubectl is too slow
        wait_until(lambda: a.proc.log_since_start().count(": Normal Pending") >= 3, 60, 0.01, what="creation under way")
        a.kill()  # mid-creation: some jobs have some of their pods
        t_kill = time.monotonic()
        timeline["pods when a was killed"] = len(k.json("get", "pods", "-n", ns)["items"])
        assert timeline["pods when a was killed"] < n_jobs * nodes, "not killed mid-creation"
        timeline["b took over after the kill"] = wait_holder(k, ns, idb, LEASE + 4 * RETRY + 10) - t_kill

        def converged() -> bool:
            b.proc.check_alive()
            items = k.json("get", "grpojobs", "-n", ns)["items"]
            return len(k.json("get", "pods", "-n", ns)["items"]) >= n_jobs * nodes and all(
                any(c["type"] == "Created" and c["status"] == "True" for c in (j.get("status") or {}).get("conditions") or [])
                for j in items)

        wait_until(converged, 120, 0.5, what="every job converged")
        timeline["all pods after the kill"] = time.monotonic() - t_kill
        pods = k.json("get", "pods", "-n", ns)["items"]
        assert len(pods) == n_jobs * nodes and max(Counter(p["metadata"]["name"] for p in pods).values()) == 1
        jobs = {j["metadata"]["uid"]: j for j in k.json("get", "grpojobs", "-n", ns)["items"]}
        for p in pods:  # no orphans: each pod owned by a live job, named for its gang, of the first attempt
            ref = p["metadata"]["ownerReferences"][0]
            assert ref["uid"] in jobs and p["metadata"]["name"].startswith(ref["name"] + "-node-")
            assert p["metadata"]["annotations"]["grpo.dev/attempt"] == "0"
        assert all(j["status"]["restarts"] == 0 for j in jobs.values())
    finally:
        print(f"\nkill timeline (s): {json.dumps(timeline)}")
        a.stop()
        b.stop()


def test_graceful_stop_releases_the_lease(crd, kubectl, k8s_namespace, tmp_path):
    k, ns = kubectl, k8s_namespace
    a, b = replica(crd, tmp_path / "a", ns), replica(crd, tmp_path / "b", ns)
    try:
        a.start(wait=False)
        wait_holder(k, ns, identity(a), 60)
        b.start(wait=False)
        idb = identity(b)
        t0 = time.monotonic()
        a.stop()  # SIGTERM: kopf's cleanup, then the Lease released
        took = wait_holder(k, ns, idb, LEASE + 10) - t0
        print(f"\ntakeover after a graceful stop: {took:.1f} s")
        assert took < LEASE, "the standby waited for the lease to expire: it was not released"
    finally:
        a.stop()
        b.stop()


def snapshot(k: Any, ns: str, instance: str) -> dict[str, Any]:
    """Every job's and pod's (uid, resourceVersion, managedFields), and the Events one replica posted: any write at all
    changes it."""
    out = {}
    for kind in ("grpojobs", "pods", "events"):
        for o in k.json("get", kind, "-n", ns)["items"]:
            m = o["metadata"]
            if kind != "events" or o.get("reportingInstance") == instance:
                out[f"{kind}/{m['name']}"] = (m["uid"], m["resourceVersion"], m.get("managedFields"))
    return out


def test_leader_stopped_in_the_middle_of_a_write_burst_sends_nothing_when_it_resumes(crd, kubectl, k8s_namespace,
                                                                                     tmp_path):
    """Finding (issue 27, Medium 6): fencing was check-then-act, before the connection-pool wait: writes queued when
    the leader was stopped went out when it resumed. Here the leader is stopped while it creates 20 jobs' pods one
    write at a time (its Events queued behind them); the new leader suspends every job (deletes the pods); on SIGCONT
    the old one must send nothing: no pod recreated, no job's resourceVersion or managedFields changed, no Event
    decided after the stop (an Event already past the fence when it stopped may land: nothing can guard it)."""
    k, ns = kubectl, k8s_namespace
    n_jobs = 20
    # HOSTNAME: the Events' reportingInstance, to tell a's from b's
    a = replica(crd, tmp_path / "a", ns, GRPO_MAX_CONCURRENT_WRITES="1", HOSTNAME="replica-a")
    b = replica(crd, tmp_path / "b", ns, HOSTNAME="replica-b")
    timeline: dict[str, float] = {}
    try:
        a.start(wait=False)
        wait_holder(k, ns, identity(a), 60)
        b.start(wait=False)
        idb = identity(b)
        k.apply([manifest(f"w{i:02d}", nodes=2) for i in range(n_jobs)], "-n", ns)
        wait_until(lambda: a.proc.log_since_start().count(": Normal Pending") >= 2, 60, 0.01, what="writes under way")
        signal_proc(a, signal.SIGSTOP)  # in the middle of the burst: writes in flight, queued behind the pool
        t_stop, stopped_at = time.monotonic(), dt.datetime.now(dt.UTC)
        timeline["pods when a was stopped"] = len(k.json("get", "pods", "-n", ns)["items"])
        assert timeline["pods when a was stopped"] < 2 * n_jobs, "not stopped in the middle of the burst"
        timeline["b took over"] = wait_holder(k, ns, idb, LEASE + 4 * RETRY + 10) - t_stop
        patch = json.dumps({"spec": {"runPolicy": {"suspend": True}}})
        for i in range(n_jobs):
            k("patch", "grpojob", f"w{i:02d}", "-n", ns, "--type=merge", "-p", patch)

        def settled() -> bool:
            b.proc.check_alive()
            jobs = k.json("get", "grpojobs", "-n", ns)["items"]
            suspended = all((j.get("status") or {}).get("phase") == "Suspended" for j in jobs)
            return suspended and not k.json("get", "pods", "-n", ns)["items"]

        wait_until(settled, 120, 0.5, what="every job suspended by b, no pods")
        before = snapshot(k, ns, "replica-a")
        signal_proc(a, signal.SIGCONT)
        t_cont = time.monotonic()
        assert a.proc.proc is not None
        code = a.proc.proc.wait(30)
        timeline["a exited after SIGCONT"] = time.monotonic() - t_cont
        assert code == EXIT_LOST, a.log()
        time.sleep(2 * RETRY)  # anything a sent in its last moment is visible by now; b writes only changes
        after = snapshot(k, ns, "replica-a")
        # Jobs and pods: not one write. Events: none decided after the stop; one that had passed the fence when the
        # process stopped (the synchronous step from the check to the socket: docs/operator.md, "Fencing") may land,
        # at most one per event writer, stamped before the stop. Nothing behind the check can guard an Event.
        late = {n: v for n, v in after.items() if before.get(n) != v}
        assert all(n.startswith("events/") and n not in before for n in late), (late, before)
        assert len(late) <= EVENT_WRITERS, late
        for name in late:
            ev = k.json("get", "event", name.split("/", 1)[1], "-n", ns)
            stamped = dt.datetime.fromisoformat(ev["firstTimestamp"].replace("Z", "+00:00"))
            assert stamped <= stopped_at + dt.timedelta(seconds=1), (ev, stopped_at)  # second precision
        timeline["events in flight at the stop, landed"] = len(late)
        b.proc.check_alive()
    finally:
        print(f"\nburst timeline (s): {json.dumps(timeline)}")
        for op in (a, b):
            if op.proc.proc is not None and op.proc.proc.poll() is None:
                signal_proc(op, signal.SIGCONT)
            op.stop()


class FailFirstRelist:
    """A plain-HTTP proxy in front of the API server (a thread with its own event loop, on a free loopback port) that
    answers the first GRPOJob list sent after the replica's GRPOJob watch opened with a 503: the takeover's re-list
    (kopf's own list comes before its watch). Everything else, watches included, is streamed through."""

    def __init__(self, upstream: str, ca_file: Path) -> None:
        self.upstream, self.ca_file = upstream, ca_file
        self.watching = threading.Event()
        self.failed = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> FailFirstRelist:
        self._thread.start()
        assert self._ready.wait(30)
        return self

    def __exit__(self, *_: Any) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        runner = self.loop.run_until_complete(self._start())
        self._ready.set()
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(runner.cleanup())
            self.loop.run_until_complete(self.session.close())

    async def _start(self) -> web.AppRunner:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        self.session = ClientSession(connector=TCPConnector(ssl=ctx), timeout=ClientTimeout(total=None))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        jobs = request.method == "GET" and request.path.endswith("/grpojobs")
        if jobs and request.query.get("watch") == "true":
            self.watching.set()
        elif jobs and self.watching.is_set() and not self.failed.is_set():
            self.failed.set()
            return web.json_response({"kind": "Status", "status": "Failure", "reason": "ServiceUnavailable",
                                      "message": "injected: the takeover's first list fails", "code": 503}, status=503)
        skip = ("host", "content-length", "transfer-encoding", "connection", "accept-encoding")
        headers = {h: v for h, v in request.headers.items() if h.lower() not in skip}
        body = await request.read()
        async with self.session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                        data=body or None) as up:
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers.get("Content-Type", "")})
            await resp.prepare(request)
            try:
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
            except (ClientError, ConnectionError):  # a watch cut at either end (the replica stopped)
                pass
            return resp


def through(kubeconfig: Path, proxy: FailFirstRelist, path: Path) -> Path:
    conf = json.loads(kubeconfig.read_text())
    for c in conf["clusters"]:
        c["cluster"] = {"server": f"http://127.0.0.1:{proxy.port}"}
    path.write_text(json.dumps(conf))
    return path


def test_a_takeover_whose_first_relist_fails_still_reconciles_the_jobs_that_existed_before(crd, kubectl,
                                                                                          k8s_namespace, tmp_path):
    """Finding (issue 27, High 2): a failed re-list at takeover left a leader that reconciles nothing: the error was
    swallowed, never retried, the Lease kept being renewed, and the jobs that existed before the takeover were never
    cached, so no restart fired for them. Here the new leader's first list of GRPOJobs gets a 503 from a proxy in
    front of the real API server; a pod of a job created under the old leader then fails: the new leader restarts
    the job."""
    k, ns = kubectl, k8s_namespace
    with FailFirstRelist(crd.server, crd.ca_file) as proxy:
        a = replica(crd, tmp_path / "a", ns)
        b = replica(crd, tmp_path / "b", ns, kubeconfig=through(crd.kubeconfig, proxy, tmp_path / "b.kubeconfig"))
        try:
            a.start(wait=False)
            wait_holder(k, ns, identity(a), 60)
            k.apply([manifest("pre", nodes=2)], "-n", ns)
            pods = wait_pods(k, ns, "pre", 2, timeout=60)
            wait_job(k, ns, "pre", lambda s: any(c["type"] == "Created" and c["status"] == "True"
                                                 for c in s.get("conditions") or []), 60, what="created by a")
            b.start(wait=False)
            idb = identity(b)
            wait_until(proxy.watching.is_set, 60, 0.1, what="b watching GRPOJobs through the proxy")
            a.kill()
            wait_holder(k, ns, idb, LEASE + 4 * RETRY + 10)
            wait_until(proxy.failed.is_set, 30, 0.1, what="b's first re-list refused")
            pod_exit(k, ns, pods[0]["metadata"]["name"], 143)  # retriable: a gang restart
            job = wait_job(k, ns, "pre", lambda s: int(s.get("restarts") or 0) >= 1, 60,
                           what="the job restarted by the new leader")
            assert job["status"]["restarts"] == 1
            assert holder(k, ns).get("holderIdentity") == idb
            assert "starting to lead failed" in b.proc.log_since_start()
        finally:
            a.stop()
            b.stop()


class AdminInfo:
    """What kube.Kube needs of kopf's ConnectionInfo, for the control plane's admin."""

    def __init__(self, cp: Any) -> None:
        self.server, self.cp = cp.server, cp

    def as_ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cp.ca_file))

    def as_http_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.cp.admin_token}"}


def test_the_api_server_refuses_a_status_write_decided_from_an_older_version(crd, kubectl, k8s_namespace):
    """Finding (issue 27, Medium 6): status writes were unconditional merge patches. The operator's status write
    (kube.Kube.patch_status with the resourceVersion it decided from) is refused with a 409 by the real API server
    once the job changed, and goes through on the current version."""
    from grpo_operator.controller import kube as kube_mod

    k, ns = kubectl, k8s_namespace
    k.apply([manifest("cas", nodes=1)], "-n", ns)
    old_rv = get_job(k, ns, "cas")["metadata"]["resourceVersion"]
    k("label", "grpojob", "cas", "-n", ns, "edited=yes")  # a change after the version the status was decided from

    async def write(rv: str) -> Any:
        client = kube_mod.Kube(AdminInfo(crd))
        try:
            return await client.patch_status("GRPOJob", ns, "cas", {"message": f"decided from {rv}"}, rv)
        finally:
            await client.close()

    with pytest.raises(kube_mod.Conflict):
        asyncio.run(write(old_rv))
    assert (get_job(k, ns, "cas").get("status") or {}).get("message") is None
    current = get_job(k, ns, "cas")["metadata"]["resourceVersion"]
    assert asyncio.run(write(current))["status"]["message"] == f"decided from {current}"
