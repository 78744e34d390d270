"""GRPOClient's log following through its real HTTP path (kubernetes client, urllib3, chunked streams, pod watches)
against a small loopback API server that serves what a kubelet-backed one would: the job, its pods, a pod watch, and
`pods/NAME/log?follow=true&timestamps=true` streamed in chunks while the pod runs and closed when it ends. A gang
restart replaces the pod under the same name; `kubectl grpo logs -f` must carry on with the new attempt's log.
(The bare control plane has no kubelet to serve logs; the real-node tier checks the same with real processes.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

import pytest

from grpo_operator.client import GRPOClient
from grpo_operator.render import manifests

pytestmark = [pytest.mark.timeout(240)]
NS, JOB, UID = "ns", "train", "job-uid"


class World:
    """The cluster's state; every change wakes the streams and watches waiting on it."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.version = 1
        self.status: dict[str, Any] = {"phase": "Running", "restarts": 0}
        self.pods: dict[str, dict[str, Any]] = {}  # name → {"attempt", "phase", "lines", "uid"}
        self.log_requests: list[dict[str, str]] = []
        self.nodes = 1
        self.job_watches = 0
        self.pending_seen = 0  # pod lists answered with a Pending pod in them
        self.drop = False  # end the open log streams once, the pod still running (a dropped connection)

    def change(self, **kw: Any) -> None:
        with self.cv:
            for key, value in kw.items():
                setattr(self, key, value)
            self.version += 1
            self.cv.notify_all()

    def pod(self, rank: int, attempt: int, phase: str, lines: Optional[list[str]] = None) -> None:
        name = manifests.names(JOB).pod(rank)
        with self.cv:
            old = self.pods.get(name)
            same = old is not None and old["attempt"] == attempt
            self.pods[name] = {"attempt": attempt, "phase": phase, "uid": f"{name}-{attempt}",
                               "lines": (old["lines"] if same else []) + list(lines or [])}
            self.version += 1
            self.cv.notify_all()

    def log(self, rank: int, *lines: str) -> None:
        with self.cv:
            self.pods[manifests.names(JOB).pod(rank)]["lines"] += list(lines)
            self.version += 1
            self.cv.notify_all()

    def job_body(self) -> dict[str, Any]:
        return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob",
                "metadata": {"name": JOB, "namespace": NS, "uid": UID, "resourceVersion": str(self.version)},
                "spec": {"nodes": self.nodes}, "status": dict(self.status)}

    def pod_body(self, name: str) -> dict[str, Any]:
        p = self.pods[name]
        state = {"running": {}} if p["phase"] == "Running" else \
            {"terminated": {"exitCode": 0 if p["phase"] == "Succeeded" else 137}} if p["phase"] != "Pending" else {}
        return {"metadata": {"name": name, "namespace": NS, "uid": p["uid"],
                             "labels": {manifests.LABEL_JOB: JOB, manifests.LABEL_ROLE: "trainer",
                                        manifests.LABEL_RANK: name.rsplit("-", 1)[1], "grpo.dev/attempt": str(p["attempt"])},
                             "ownerReferences": [{"kind": "GRPOJob", "uid": UID, "controller": True}]},
                "spec": {"containers": [{"name": "trainer"}]},
                "status": {"phase": p["phase"], "containerStatuses": [{"name": "trainer", "state": state}]}}


def stamp(i: int) -> str:
    return f"2030-01-01T00:{i // 60:02d}:{i % 60:02d}.{i:06d}Z"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    world: World

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _json(self, code: int, doc: Any) -> None:
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunks(self, parts: Iterator[bytes]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for part in parts:
            if part:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        w = self.world
        url = urllib.parse.urlparse(self.path)
        q = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        if url.path == f"/apis/grpo.dev/v1alpha1/namespaces/{NS}/grpojobs/{JOB}":
            return self._json(200, w.job_body())
        if url.path == f"/apis/grpo.dev/v1alpha1/namespaces/{NS}/grpojobs" and q.get("watch") in ("true", "1", "True"):
            with w.cv:  # the job at its next change, then the watch ends (the client watches again)
                w.job_watches += 1
                start = w.version
                w.cv.wait_for(lambda: w.version > start, timeout=float(q.get("timeoutSeconds", 5)))
                event = {"type": "MODIFIED", "object": w.job_body()} if w.version > start else None
            return self._chunks(iter([json.dumps(event).encode() + b"\n"] if event else []))
        if url.path == f"/api/v1/namespaces/{NS}/events":
            return self._json(200, {"kind": "EventList", "metadata": {}, "items": []})
        if url.path == f"/api/v1/namespaces/{NS}/pods" and q.get("watch") in ("true", "1", "True"):
            with w.cv:  # one event at the next change (or nothing at the timeout), then the watch ends
                start = w.version
                w.cv.wait_for(lambda: w.version > start, timeout=float(q.get("timeoutSeconds", 5)))
                changed = w.version > start
            event = json.dumps({"type": "MODIFIED", "object": {"metadata": {"name": "x"}}}).encode() + b"\n"
            return self._chunks(iter([event] if changed else []))
        if url.path == f"/api/v1/namespaces/{NS}/pods":
            sel = dict(kv.split("=", 1) for kv in q.get("labelSelector", "").split(",") if kv)
            with w.cv:
                items = [w.pod_body(n) for n in w.pods
                         if all(w.pod_body(n)["metadata"]["labels"].get(k) == v for k, v in sel.items())]
                w.pending_seen += any(p["status"]["phase"] == "Pending" for p in items)
                return self._json(200, {"kind": "PodList", "metadata": {"resourceVersion": str(w.version)},
                                        "items": items})
        if len(parts) == 7 and parts[:5] == ["api", "v1", "namespaces", NS, "pods"] and parts[6] == "log":
            w.log_requests.append(q)
            return self._log(parts[5], q)
        return self._json(404, {"kind": "Status", "message": f"{url.path} not found", "reason": "NotFound",
                                "code": 404})

    def _log(self, name: str, q: dict[str, str]) -> None:
        w = self.world
        with w.cv:
            pod = w.pods.get(name)
            if pod is None or pod["phase"] == "Pending":
                return self._json(400, {"kind": "Status", "code": 400, "reason": "BadRequest",
                                        "message": f'container "trainer" in pod "{name}" is waiting to start'})
            uid, lines = pod["uid"], list(pod["lines"])
        start = len(lines) - int(q["tailLines"]) if "tailLines" in q else 0

        def body() -> Iterator[bytes]:
            sent = max(0, start)
            while True:
                with w.cv:
                    cur = w.pods.get(name)
                    alive = cur is not None and cur["uid"] == uid
                    now = cur["lines"] if alive else lines
                    new, sent = now[sent:], len(now)
                    ended = not alive or cur["phase"] != "Running"
                text = "".join(f"{stamp(i + sent - len(new))} {ln}\n" for i, ln in enumerate(new))
                yield text.encode()
                if ended or q.get("follow") != "true":
                    return
                with w.cv:
                    if w.drop:
                        w.drop = False
                        return
                with w.cv:
                    w.cv.wait(timeout=5)

        self._chunks(body())


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[World, Path]]:
    w = World()
    handler = type("H", (Handler,), {"world": w})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "k",
           "clusters": [{"name": "k", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
           "users": [{"name": "u", "user": {"token": "t"}}],
           "contexts": [{"name": "k", "context": {"cluster": "k", "user": "u", "namespace": NS}}]}
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(cfg))
    try:
        yield w, kubeconfig
    finally:
        with w.cv:
            w.version += 1
            w.cv.notify_all()
        server.shutdown()
        server.server_close()


def wait_for(pred: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def gang_restart(w: World) -> None:
    """What the operator and the kubelet do: rank 0 killed, the job restarts, the new pod starts and finishes."""
    w.pod(0, 0, "Failed")
    w.change(status={"phase": "Restarting", "restarts": 1})
    seen = w.pending_seen
    w.pod(0, 1, "Pending")
    w.change(status={"phase": "Pending", "restarts": 1})
    wait_for(lambda: w.pending_seen > seen)  # the follower saw the new pod Pending: it must wait, not fail
    w.pod(0, 1, "Running", ["a1: resumed from checkpoint-2"])
    w.change(status={"phase": "Running", "restarts": 1})
    w.log(0, "a1: step 3")
    w.pod(0, 1, "Succeeded")
    w.change(status={"phase": "Succeeded", "restarts": 1})


def test_follow_across_a_gang_restart_over_http(world: tuple[World, Path]) -> None:
    w, kubeconfig = world
    w.pod(0, 0, "Running", ["a0: step 0", "a0: step 1"])
    got: list[Any] = []
    one, two = threading.Event(), threading.Event()

    def follow() -> None:
        with GRPOClient(config_file=str(kubeconfig)) as c:
            assert c.namespace == NS  # from the context
            for line in c.follow_job_logs(JOB, 0, follow=True, tail_lines=1, poll=1):
                got.append(line)
                if line.text == "a0: step 1":
                    one.set()
                if line.text == "a0: step 2":
                    two.set()

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    assert one.wait(20), got
    w.log(0, "a0: step 2")  # arrives while the stream is open
    assert two.wait(20), got
    w.change(drop=True)  # the stream drops; the server sends everything again (it ignores sinceSeconds)
    wait_for(lambda: len(w.log_requests) == 2)
    w.log(0, "a0: step 3")
    wait_for(lambda: any(x.text == "a0: step 3" for x in got))
    gang_restart(w)
    t.join(30)
    assert not t.is_alive(), f"the follower did not end with the job: {got}"
    logs = [(x.attempt, x.text) for x in got if x.kind == "log"]
    assert logs == [(0, "a0: step 1"), (0, "a0: step 2"), (0, "a0: step 3"), (1, "a1: resumed from checkpoint-2"),
                    (1, "a1: step 3")]  # nothing twice after the drop
    assert [x.attempt for x in got if x.kind == "attach"] == [0, 1]
    assert all(x.time and x.time.startswith("2030-") for x in got if x.kind == "log")
    # --tail applied to the first pod only; the new attempt was read from its first line
    assert [r.get("tailLines") for r in w.log_requests] == ["1", None, None]
    assert "sinceSeconds" in w.log_requests[1]  # re-opened from the last line seen
    assert all(r["follow"] == "true" and r["timestamps"] == "true" and r["container"] == "trainer"
               for r in w.log_requests)


def test_kubectl_grpo_logs_follow_across_a_gang_restart(world: tuple[World, Path]) -> None:
    w, kubeconfig = world
    w.pod(0, 0, "Running", ["a0: step 0"])
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    proc = subprocess.Popen([sys.executable, "-m", "grpo_operator.cli.kubectl_grpo", "logs", JOB, "-f"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "a0: step 0\n"
        gang_restart(w)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out == "a1: resumed from checkpoint-2\na1: step 3\n"
    assert err == "kubectl-grpo: rank 0: gang restart, now following attempt 1 (pod train-node-0)\n"
    r = subprocess.run([sys.executable, "-m", "grpo_operator.cli.kubectl_grpo", "logs", JOB, "--attempt", "0"],
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "no pod of attempt 0 any more" in r.stderr and "Traceback" not in r.stderr


def test_every_rank_interleaved_and_a_rank_without_a_log(world: tuple[World, Path]) -> None:
    w, kubeconfig = world
    w.nodes = 3
    w.pod(0, 0, "Running", ["zero"])
    w.pod(1, 0, "Running", ["one", "uno"])
    w.pod(2, 0, "Pending")  # not started: no log, said in one line, the others still printed
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    r = subprocess.run([sys.executable, "-m", "grpo_operator.cli.kubectl_grpo", "logs", JOB, "--rank", "all"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert sorted(r.stdout.splitlines()) == ["[rank 0] zero", "[rank 1] one", "[rank 1] uno"]
    assert r.returncode == 1 and "train-node-2 (attempt 0) has no log yet" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1


def test_the_real_node_journey_check_runs(world: tuple[World, Path]) -> None:
    """tests/support/client_logs.py, which the real-node tier calls with real trainer processes, run here against the
    loopback server: its own logic (two followers, the restart, the transcript) is sound before it meets a kubelet."""
    from tests.support.client_logs import check_logs_follow_gang_restart

    w, kubeconfig = world
    w.pod(0, 0, "Running", ["a0: step 0"])
    transcript = check_logs_follow_gang_restart(kubeconfig, NS, JOB, restart=lambda: gang_restart(w), timeout=120)
    assert "now following attempt 1" in transcript and "a1: step 3" in transcript
    assert "$ kubectl grpo wait train --for Succeeded" in transcript and "(exit 0)" in transcript


def test_wait_ends_on_a_rejected_job(world: tuple[World, Path]) -> None:
    """Rejected (an invalid spec that got past a webhook that was off) will not run until it is edited: exit 1."""
    w, kubeconfig = world
    w.change(status={"phase": "Pending", "restarts": 0})
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    proc = subprocess.Popen([sys.executable, "-m", "grpo_operator.cli.kubectl_grpo", "wait", JOB, "--for", "Running"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: w.job_watches >= 1)  # it is watching: the change reaches it through the watch
        w.change(status={"phase": "Rejected", "message": "invalid spec: spec.nodes: must be ≥ 1"})
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and out == ""
    assert err.strip() == "kubectl-grpo: grpojob ns/train Rejected: invalid spec: spec.nodes: must be ≥ 1"


def progress(step: int, reward: float, prefix: str = "GRPO_PROGRESS ", **kw: Any) -> str:
    return prefix + json.dumps({"step": step, "reward": reward, "rewards": {"accuracy": reward / 2}, "kl": step / 100,
                                "completionLength": 20 - step, **kw})


def test_progress_history_across_a_gang_restart_over_http(world: tuple[World, Path]) -> None:
    """Attempt 0's pod (and log) is replaced at the gang restart; attempt 1 re-prints the checkpoint's steps as
    GRPO_HISTORY lines, so the history still covers both attempts; `kubectl grpo plot` draws it with the restart."""
    w, kubeconfig = world
    w.pod(0, 0, "Running", ["loading the model", progress(1, 0.1), progress(2, 0.2), progress(3, 0.3)])
    with GRPOClient(config_file=str(kubeconfig)) as c:
        live = c.get_progress_history(JOB)
        assert [(s.attempt, s.step, s.reward, s.replayed) for s in live.samples] == [
            (0, 1, 0.1, False), (0, 2, 0.2, False), (0, 3, 0.3, False)]
        assert live.sources == {0: "train-node-0"} and live.notes == []
        # the restart: checkpoint-2 is resumed; attempt 0's step 3 went with its pod
        w.pod(0, 0, "Failed")
        w.change(status={"phase": "Running", "restarts": 1})
        w.pod(0, 1, "Running", [progress(1, 0.1, "GRPO_HISTORY ", attempt=0), progress(2, 0.2, "GRPO_HISTORY ", attempt=0),
                                "resuming from checkpoint-2", progress(3, 0.35), progress(4, 0.45)])
        hist = c.get_progress_history(JOB)
        assert [(s.attempt, s.step, s.replayed) for s in hist.samples] == [
            (0, 1, True), (0, 2, True), (1, 3, False), (1, 4, False)]
        assert hist.sources == {1: "train-node-0"} and hist.attempt == 1
        assert len(hist.notes) == 1 and hist.notes[0].startswith("attempt 0: steps up to the checkpoint")
        only = c.get_progress_history(JOB, attempt=1)  # the log of attempt 1 holds attempt 0's replayed steps too
        assert {s.attempt for s in only.samples} == {0, 1}
    assert all(r["follow"] == "false" and r["container"] == "trainer" for r in w.log_requests)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    r = subprocess.run([sys.executable, "-m", "grpo_operator.cli.kubectl_grpo", "plot", JOB, "-o", "json"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["restarts"] == [{"attempt": 1, "step": 3}]
    assert [p["value"] for p in doc["series"]["reward/accuracy"]] == [0.05, 0.1, 0.175, 0.225]
    assert [p["step"] for p in doc["series"]["completion_length"]] == [1, 2, 3, 4]
    r = subprocess.run([sys.executable, "-m", "grpo_operator.cli.kubectl_grpo", "plot", JOB, "--width", "60"],
                       env={**env, "PYTHONIOENCODING": "utf-8"}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.count("↻1") == 3, r.stdout + r.stderr
    assert "reward: ns/train" in r.stdout and "● reward (0.45 at step 4)" in r.stdout
    assert r.stderr.startswith("kubectl-grpo: attempt 0: steps up to the checkpoint"), r.stderr


def test_progress_lines_on_another_node_and_a_job_without_any(world: tuple[World, Path]) -> None:
    """Global rank 0 (the one that prints progress) may run on any node: the other ranks are read when node rank 0's
    log has none. A job whose pods print nothing yet: exit 1 and why, no traceback."""
    w, kubeconfig = world
    w.nodes = 2
    w.pod(0, 0, "Running", ["rank 3 of 4"])
    w.pod(1, 0, "Running", ["rank 0 of 4", progress(5, 0.5)])
    with GRPOClient(config_file=str(kubeconfig)) as c:
        hist = c.get_progress_history(JOB)
    assert [(s.attempt, s.step) for s in hist.samples] == [(0, 5)] and hist.sources == {0: "train-node-1"}
    with w.cv:  # rank 1's log without the progress line: nothing anywhere
        w.pods[manifests.names(JOB).pod(1)]["lines"] = ["rank 0 of 4"]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    r = subprocess.run([sys.executable, "-m", "grpo_operator.cli.kubectl_grpo", "plot", JOB], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
    assert "attempt 0: train-node-0: no progress line yet; train-node-1: no progress line yet" in r.stderr
    assert "no progress lines in the logs of ns/train yet" in r.stderr
    r = subprocess.run([sys.executable, "-m", "grpo_operator.cli.kubectl_grpo", "plot", "nope"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
