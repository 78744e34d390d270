"""High availability on the real control plane (`grpo-operator --leader-elect`, controller/leader.py): two replicas
on one Lease; the leader stopped (SIGSTOP) or killed; the standby takes over within the lease time; a stopped leader
that resumes acts on nothing and exits non-zero."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.support.cluster.util import wait_until
from tests.support.jobs import manifest
from tests.support.operator import OperatorProcess, get_job, pods_of, wait_job, wait_pods

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

LEASE, RENEW, RETRY = 6.0, 4.0, 1.0  # short timings keep the test short; the rules are the default 15/10/2 s ones
LEASE_NAME = "grpo-operator"
EXIT_LOST = 3  # leader.EXIT_LOST


def replica(crd: Any, logdir: Path, ns: str, **extra: str) -> OperatorProcess:
    env = {**extra, "GRPO_LEADER_ELECT_LEASE_SECONDS": str(LEASE), "GRPO_LEADER_ELECT_RENEW_DEADLINE_SECONDS": str(RENEW),
           "GRPO_LEADER_ELECT_RETRY_SECONDS": str(RETRY), "GRPO_FORCE_DELETE_AFTER_SECONDS": "2"}
    return OperatorProcess(crd.kubeconfig, logdir, "--namespace", ns, "--leader-elect", "--leader-elect-lease",
                           f"{ns}/{LEASE_NAME}", env=env)


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
