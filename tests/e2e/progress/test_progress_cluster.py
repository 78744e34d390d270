"""A real CPU GRPO run (torchrun, 2 processes, the tiny example) publishes progress that reaches the GRPOJob's
status on the real API server, through a gang restart, at a bounded write rate; both /metrics endpoints parse.

The test plays the kubelet: it runs the trainer pod's own command (argv, env and ConfigMap from the API server) on
this machine, and reports the pod Running with `status.podIP: 127.0.0.1`, so the operator scrapes the trainer as it
would scrape a pod. The trainer's metrics port is the operator's `--trainer-metrics-port` (a free port here), which
the operator renders into the ConfigMap and the pod's `metrics` containerPort.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support import operator as H
from tests.support.cluster.util import free_port, wait_until
from tests.support.trainer import REPO, offline_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

INTERVAL = 2.0  # --progress-interval: scrape period and the least time between progress-only writes
# ~0.13 s per step here: attempt 0 is killed at step >= KILL_AFTER (checkpoint-40 done, checkpoint-80 far away)
MAX_STEPS, SAVE_STEPS, KILL_AFTER = 120, 40, 50


@pytest.fixture(scope="module")
def crd(controlplane: Any) -> Any:
    H.install_crd(controlplane.kubectl)
    return controlplane


class JobWatch:
    """`kubectl get grpojob NAME -w -o json --output-watch-events` in the background: (receipt time, object)."""

    def __init__(self, kubectl: Any, ns: str, name: str):
        argv = kubectl.argv("get", "grpojob", name, "-n", ns, "-w", "-o", "json", "--output-watch-events")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        dec = json.JSONDecoder()
        buf = ""
        for line in self.proc.stdout:  # type: ignore[union-attr]  # one compact JSON event per line (kubectl 1.37)
            buf += line
            try:
                ev, end = dec.raw_decode(buf.strip())
            except json.JSONDecodeError:
                continue  # an object printed over several lines
            buf = ""
            self.events.append((time.monotonic(), ev["object"]))

    def stop(self) -> list[tuple[float, dict[str, Any]]]:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.thread.join(timeout=10)
        return self.events


def kubelet_running(k: Any, ns: str, pod: str) -> None:
    """The pod runs on this machine: Running, with 127.0.0.1 as its IP."""
    k.patch_status("pod", pod, {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
                                "conditions": [{"type": "PodScheduled", "status": "True"},
                                               {"type": "Ready", "status": "True"}],
                                "containerStatuses": [{"name": "trainer", "ready": True, "restartCount": 0,
                                                       "image": "grpo-trainer", "imageID": "",
                                                       "state": {"running": {"startedAt": H.NOW}}}]}, "-n", ns)


def start_pod_locally(pod: dict[str, Any], config: Path, log: Path, termination_log: str = os.devnull) -> subprocess.Popen:
    """The pod's container command with this machine's paths: rendezvous on loopback, the config file here."""
    c = pod["spec"]["containers"][0]
    argv = [*c["command"], *c["args"]]
    argv[0] = sys.executable
    argv = [f"--rdzv-endpoint=127.0.0.1:{free_port()}" if a.startswith("--rdzv-endpoint=") else a for a in argv]
    argv[argv.index("--config") + 1] = str(config)
    field = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"]}
    env = {e["name"]: e["value"] if "value" in e else field[e["valueFrom"]["fieldRef"]["fieldPath"]] for e in c["env"]}
    env.update({"OMP_NUM_THREADS": "1", "GRPO_TERMINATION_LOG": termination_log})  # 2 processes on 2 cores
    out = open(log, "w")
    return subprocess.Popen(argv, cwd=REPO, env=offline_env(**env), stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and its workers, as a node loss would (torch elastic starts the workers in sessions of
    their own, so killing the launcher's process group is not enough)."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def wait_exit(proc: subprocess.Popen, log: Path, timeout: float) -> None:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise AssertionError(f"trainer timed out after {timeout}s:\n{log.read_text()[-4000:]}") from None
    assert rc == 0, f"trainer exited {rc}:\n{log.read_text()[-4000:]}"


def scrape(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict[str, Any], family: str, sample: str | None = None, **labels: str) -> float:
    return sum(s.value for s in fams[family].samples
               if (sample is None or s.name == sample) and all(s.labels.get(k) == v for k, v in labels.items()))


def tiny_job(name: str) -> dict[str, Any]:
    job = yaml.safe_load((REPO / "examples" / "local-tiny" / "grpojob.yaml").read_text())
    job["metadata"] = {"name": name}
    job["spec"]["training"].update({"maxSteps": MAX_STEPS, "saveSteps": SAVE_STEPS, "loggingSteps": 1})
    job["spec"]["runPolicy"] = {"backoffLimit": 2}
    return job


def test_live_progress_through_a_gang_restart(crd: Any, kubectl: Any, k8s_namespace: str, tmp_path: Path) -> None:
    k, ns, name = kubectl, k8s_namespace, "tiny-progress"
    trainer_port, metrics_port = free_port(), free_port()
    op = H.OperatorProcess(crd.kubeconfig, tmp_path / "operator", "--namespace", ns,
                           "--progress-interval", str(INTERVAL), "--metrics-listen", f"127.0.0.1:{metrics_port}",
                           "--trainer-metrics-port", str(trainer_port), webhook=True)
    op.start()
    op_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    watch = None
    procs: list[subprocess.Popen] = []
    try:
        # a denial, for the webhook metrics
        bad = tiny_job("bad-batch")
        bad["spec"]["training"]["numGenerations"] = 3
        # the operator's readiness check was refused for the same rule before (tests/support/operator.py): count ours
        denied_before = value(scrape(op_metrics), "grpo_operator_webhook_denials", "grpo_operator_webhook_denials_total",
                              reason="spec.training.numGenerations") or 0
        assert k.apply(bad, "-n", ns, check=False).returncode != 0

        k.apply(tiny_job(name), "-n", ns)
        watch = JobWatch(k, ns, name)
        (pod,) = H.wait_pods(k, ns, name, 1, attempt=0)
        ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
        assert ports["metrics"] == trainer_port
        config = json.loads(k.json("get", "configmap", f"{name}-config", "-n", ns)["data"]["config.json"])
        assert config["progress"] == {"enabled": True, "metricsPort": trainer_port}
        config["outputDir"] = str(tmp_path / "out")  # the shared checkpoint volume of the pods
        config_path = tmp_path / "config.json"
        config_path.write_text(json.dumps(config))

        # ---- attempt 0: trains until step >= KILL_AFTER, then its "node" dies (SIGKILL, exit 137)
        t0 = time.monotonic()
        kubelet_running(k, ns, pod["metadata"]["name"])
        H.wait_job(k, ns, name, lambda s: s.get("phase") == "Running", timeout=30)
        log0 = tmp_path / "attempt0.log"
        procs.append(start_pod_locally(pod, config_path, log0))

        def trainer_at(step: int) -> Any:
            try:
                fams = scrape(f"http://127.0.0.1:{trainer_port}/metrics")
            except OSError:
                return None
            return fams if value(fams, "grpo_trainer_step") >= step else None

        fams = wait_until(lambda: trainer_at(1), 120, 0.1, what="the trainer's /metrics with a step")
        assert value(fams, "grpo_trainer_global_rank0") == 1 and value(fams, "grpo_trainer_max_steps") == MAX_STEPS
        assert {s.labels["reward"] for s in fams["grpo_trainer_reward_function_mean"].samples} == {"accuracy", "length"}
        wait_until(lambda: trainer_at(KILL_AFTER), 60, 0.05, what=f"trainer step {KILL_AFTER}")
        running_table = k("get", "grpojobs", "-n", ns).stdout
        kill_group(procs[0])
        t_kill, t_kill_wall = time.monotonic(), time.time()
        st = H.get_job(k, ns, name)["status"]
        p = st["progress"]
        assert p["maxSteps"] == MAX_STEPS and p["display"] == f"{p['step']}/{MAX_STEPS}" and p["step"] >= 1
        assert isinstance(p["reward"], float) and set(p["rewards"]) == {"accuracy", "length"}
        assert p["tokensPerSecond"] > 0 and p["etaSeconds"] >= 0 and p["updateTime"].endswith("Z")
        assert re.search(rf"{name}\s+Running\s+1x2cpu\s+\d+/{MAX_STEPS}\s+-?[\d.]+\s+\S+", running_table), \
            running_table
        H.pod_exit(k, ns, pod["metadata"]["name"], 137)

        # ---- the gang restart keeps the progress; attempt 1 resumes from checkpoint-40 and the step continues
        (pod1,) = H.wait_pods(k, ns, name, 1, attempt=1, timeout=30)
        kubelet_running(k, ns, pod1["metadata"]["name"])
        H.wait_job(k, ns, name, lambda s: s.get("phase") == "Running" and s.get("restarts") == 1, timeout=30)
        t_run1 = time.monotonic()
        log1 = tmp_path / "attempt1.log"
        termination_log = tmp_path / "termination-log"
        procs.append(start_pod_locally(pod1, config_path, log1, str(termination_log)))
        wait_exit(procs[1], log1, timeout=150)
        t_end1 = time.monotonic()
        assert f"resuming from {tmp_path / 'out'}/checkpoint-{SAVE_STEPS}" in log1.read_text()
        # As the kubelet does: the container's termination log becomes the terminated state's message.
        H.pod_exit(k, ns, pod1["metadata"]["name"], 0, message=termination_log.read_text())
        st = H.wait_job(k, ns, name, lambda s: s.get("phase") == "Succeeded", timeout=30)["status"]
        final_table = k("get", "grpojobs", "-n", ns, "-o", "wide").stdout
        describe = k("describe", "grpojob", name, "-n", ns).stdout
        time.sleep(0.5)
        events = watch.stop()
        watch = None

        # ---- what the user saw
        print(f"\n$ kubectl get grpojobs (attempt 0, running)\n{running_table}"
              f"$ kubectl get grpojobs -o wide (finished)\n{final_table}")
        print("$ kubectl describe grpojob (excerpts)\n" + describe[describe.find("Status:"):][:260]
              + "  ...\n" + describe[describe.find("  Progress:"):describe.find("  Restarts:")])
        # The final record (rank 0's termination message), not the last scrape: the job says where it finished.
        assert st["progress"]["step"] == MAX_STEPS and st["progress"]["display"] == f"{MAX_STEPS}/{MAX_STEPS}"
        assert st["progress"]["etaSeconds"] == 0 and st["progress"].get("reward") is not None
        assert "Progress:" in describe and "Batch:" in describe and "Rewards:" in describe

        # ---- from the watch: progress survived the restart, steps never went back past the checkpoint
        seen = [(t, o.get("status") or {}) for t, o in events]

        def of_attempt0(progress: dict[str, Any]) -> bool:
            """Logged by attempt 0's trainer: before the kill (updateTime is the trainer's own log time, seconds)."""
            logged = dt.datetime.fromisoformat(progress["updateTime"].replace("Z", "+00:00")).timestamp()
            return logged <= t_kill_wall

        last0 = max(s["progress"]["step"] for _, s in seen if s.get("restarts", 0) == 0 and s.get("progress"))
        reached0 = max(json.loads(ln.split(" ", 1)[1])["step"] for ln in log0.read_text().splitlines()
                       if ln.startswith("GRPO_PROGRESS "))
        restarting = [s["progress"] for _, s in seen if s.get("phase") == "Restarting"]
        steps_r = [p["step"] for p in restarting]
        # While Restarting the job shows attempt 0's last progress: the last written while it ran, or a newer scrape
        # the rate limit had held back (it rides along with the Restarting write) — never reset, never older, never
        # past what attempt 0 reached. Which of the two it is depends on timing; both are right.
        assert steps_r and all(of_attempt0(p) for p in restarting), restarting
        assert last0 <= steps_r[0] and steps_r == sorted(steps_r) and steps_r[-1] <= reached0, (last0, steps_r, reached0)
        # attempt 1 shows attempt 0's last progress until its own trainer reports; from then on the resumed trainer
        # redoes the steps after checkpoint-40: the step may go back to there, never below, and only goes forward
        steps1 = [s["progress"]["step"] for _, s in seen
                  if s.get("restarts") == 1 and s.get("progress") and not of_attempt0(s["progress"])]
        assert steps1 and min(steps1) >= SAVE_STEPS and steps1 == sorted(steps1), (last0, steps1)

        # ---- rate limit: while Running, every write after the one that set Running is a progress-only write
        lines = sum(1 for log in (log0, log1) for ln in log.read_text().splitlines() if ln.startswith("GRPO_PROGRESS"))
        report = []
        for attempt, (start, end) in enumerate([(t0, t_kill), (t_run1, t_end1 + INTERVAL)]):
            seg = [(t, s) for t, s in seen if start <= t <= end + 1.0 and s.get("phase") == "Running"
                   and s.get("restarts") == attempt]
            writes = [t for (t, s), (_, prev) in zip(seg[1:], seg, strict=False) if s != prev]
            bound = (end - start) / INTERVAL + 1
            report.append(f"attempt {attempt}: {len(writes)} status writes in {end - start:.1f}s Running "
                          f"(bound {bound:.1f})")
            assert len(writes) <= bound, report
        print(f"rate limit (interval {INTERVAL}s): " + "; ".join(report) + f"; {lines} trainer logging steps")
        assert lines >= MAX_STEPS  # far more logging steps than writes: the limit is what held them back

        # ---- the operator's /metrics
        om = scrape(op_metrics)
        assert value(om, "grpo_operator_jobs", namespace=ns, phase="Succeeded") == 1
        assert value(om, "grpo_operator_restarts", "grpo_operator_restarts_total", reason="ExitCode137") == 1
        assert value(om, "grpo_operator_progress_scrapes", "grpo_operator_progress_scrapes_total", result="ok") >= 3
        assert value(om, "grpo_operator_status_writes", "grpo_operator_status_writes_total", progress="true") >= 3
        assert value(om, "grpo_operator_reconcile_duration_seconds", "grpo_operator_reconcile_duration_seconds_count") > 0
        assert value(om, "grpo_operator_webhook_denials", "grpo_operator_webhook_denials_total",
                     reason="spec.training.numGenerations") == denied_before + 1
        assert value(om, "grpo_operator_webhook_requests", "grpo_operator_webhook_requests_total",
                     operation="CREATE", allowed="true") >= 1
        print(f"operator metrics: {len(om)} families; scrapes "
              + ", ".join(f"{s.labels['result']}={s.value:g}" for s in om["grpo_operator_progress_scrapes"].samples
                          if s.name.endswith("_total")))
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_group(proc)
        if watch is not None:
            watch.stop()
        op.stop()
