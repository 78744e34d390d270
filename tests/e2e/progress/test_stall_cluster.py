"""A hung rank found and recovered: real GRPO under torchrun (2 CPU processes, the tiny example) on the real API server
with the operator; one training process is SIGSTOPped mid-training. Its heartbeat freezes, the job turns Stalled, the
live rank's stacks land on the output volume (the stopped one runs no handler), the operator gang-restarts the job,
which resumes from its checkpoint and succeeds. Pods are played by local processes, as in test_progress_cluster.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.progress.test_progress_cluster import (
    kill_group,
    kubelet_running,
    scrape,
    start_pod_locally,
    tiny_job,
    value,
    wait_exit,
)
from tests.support import operator as H
from tests.support.cluster.util import free_port, wait_until
from tests.support.processes import descendants, rank_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

MAX_STEPS, SAVE_STEPS, STOP_AFTER = 60, 20, 25
STALL_ENV = {"GRPO_STALL_HEARTBEAT_SECONDS": "8", "GRPO_STALL_STACK_WAIT_SECONDS": "20",
             "GRPO_STALL_FLOOR_SECONDS": "120"}


@pytest.fixture(scope="module")
def crd(controlplane: Any) -> Any:
    H.install_crd(controlplane.kubectl)
    return controlplane


def worker(launcher: subprocess.Popen, rank: int) -> int:
    """The pid of the training process of global rank `rank` under the pod's torchrun."""
    for pid in descendants(launcher.pid):
        if rank_of(pid) == str(rank):
            return pid
    raise AssertionError(f"no worker of rank {rank}")


def start_first_attempt(k: Any, ns: str, job: dict[str, Any], tmp_path: Path, log: Path,
                        termination_log: str = os.devnull) -> tuple[dict[str, Any], Path, subprocess.Popen]:
    """Apply `job`, wait for its one pod, write the job's config here (output under tmp_path/out), play the kubelet
    (Running) and start the pod's command locally: (the pod, the config file, its process)."""
    name = job["metadata"]["name"]
    k.apply(job, "-n", ns)
    (pod,) = H.wait_pods(k, ns, name, 1, attempt=0)
    config = json.loads(k.json("get", "configmap", f"{name}-config", "-n", ns)["data"]["config.json"])
    config["outputDir"] = str(tmp_path / "out")
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(config))
    kubelet_running(k, ns, pod["metadata"]["name"])
    H.wait_job(k, ns, name, lambda s: s.get("phase") == "Running", timeout=30)
    return pod, config_path, start_pod_locally(pod, config_path, log, termination_log)


def test_a_stopped_rank_is_stalled_dumped_restarted_and_resumed(crd: Any, kubectl: Any, k8s_namespace: str,
                                                                tmp_path: Path) -> None:
    k, ns, name = kubectl, k8s_namespace, "tiny-stall"
    trainer_port = free_port()
    op = H.OperatorProcess(crd.kubeconfig, tmp_path / "operator", "--namespace", ns, "--progress-interval", "1",
                           "--trainer-metrics-port", str(trainer_port), env=STALL_ENV)
    op.start()
    procs: list[subprocess.Popen] = []
    stopped = None
    try:
        job = tiny_job(name)
        job["spec"]["training"].update({"maxSteps": MAX_STEPS, "saveSteps": SAVE_STEPS})
        _, config_path, proc = start_first_attempt(k, ns, job, tmp_path, tmp_path / "attempt0.log")
        procs.append(proc)
        out = tmp_path / "out"

        def step() -> float:
            try:
                return value(scrape(f"http://127.0.0.1:{trainer_port}/metrics"), "grpo_trainer_step")
            except (OSError, KeyError):
                return -1

        wait_until(lambda: step() >= STOP_AFTER, 240, 0.05, what=f"trainer step {STOP_AFTER}")
        fams = scrape(f"http://127.0.0.1:{trainer_port}/metrics")
        assert {s.labels["rank"] for s in fams["grpo_trainer_rank_heartbeat_timestamp_seconds"].samples} == {"0", "1"}
        stopped = worker(procs[0], 1)
        os.kill(stopped, signal.SIGSTOP)
        t_stop = time.monotonic()

        # ---- Stalled, the stacks asked for, then the gang restart (the pod deleted: we play the kubelet)
        st = H.wait_job(k, ns, name, lambda s: any(c["type"] == "Stalled" and c["status"] == "True"
                                                      for c in s.get("conditions", [])), timeout=120,
                        what="Stalled")["status"]
        t_stalled = time.monotonic()
        cond = next(c for c in st["conditions"] if c["type"] == "Stalled")
        assert "rank 1" in cond["message"] and "heartbeat frozen" in cond["message"], cond

        # the operator deletes the stalled attempt's pods and creates the next attempt's (no kubelet here: a deleted
        # pod goes at once; its processes are ours to end, as a kubelet would)
        (pod1,) = H.wait_pods(k, ns, name, 1, attempt=1, timeout=90)
        t_restart = time.monotonic()
        kill_group(procs[0])
        stacks0 = (out / "stalls" / "attempt-0" / "rank-0.txt").read_text()
        assert "most recent call first" in stacks0, stacks0[:2000]
        assert (out / "stalls" / "attempt-0" / "rank-1.txt").read_text() == ""  # stopped: no handler ran
        events = k.json("get", "events", "-n", ns, "--field-selector", "reason=Stalled")["items"]
        assert events and events[0]["type"] == "Warning" and "rank 1 dumped no stacks" in events[0]["message"] \
            and "rank 0 in " in events[0]["message"], events
        describe = k("describe", "grpojob", name, "-n", ns).stdout
        assert "Stalled" in describe

        # ---- attempt 1 resumes from the checkpoint and succeeds
        kubelet_running(k, ns, pod1["metadata"]["name"])
        log1, term = tmp_path / "attempt1.log", tmp_path / "termination-log"
        procs.append(start_pod_locally(pod1, config_path, log1, str(term)))
        wait_until(lambda: "GRPO_PROGRESS " in log1.read_text(), 240, 0.1, what="attempt 1's first step")
        t_resumed = time.monotonic()
        wait_exit(procs[1], log1, timeout=240)
        assert f"resuming from {out}/checkpoint-{SAVE_STEPS}" in log1.read_text()
        H.pod_exit(k, ns, pod1["metadata"]["name"], 0, message=term.read_text())
        st = H.wait_job(k, ns, name, lambda s: s.get("phase") == "Succeeded", timeout=60)["status"]
        assert st["restarts"] == 1 and st["lastFailureReason"] == "Stalled"
        print(f"\nhang → Stalled {t_stalled - t_stop:.1f}s; → pods deleted {t_restart - t_stop:.1f}s; "
              f"→ first resumed step {t_resumed - t_stop:.1f}s (heartbeat limit {STALL_ENV['GRPO_STALL_HEARTBEAT_SECONDS']}s)"
              f"\nEvent: {events[0]['message'][:400]}")
    finally:
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in procs:
            if proc.poll() is None:
                kill_group(proc)
        op.stop()


HANGING_REWARD = '''
import threading

CALLS = []


def score_then_hang_forever(prompts, completions, **kwargs):
    CALLS.append(1)
    if len(CALLS) > 8:  # a few steps first: the job is past its start-up allowance, the step deadline applies
        threading.Event().wait()
    return [0.0 for _ in completions]
'''


def test_a_reward_function_that_never_returns_is_stalled_in_rewards(crd: Any, kubectl: Any, k8s_namespace: str,
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """onStall: Fail (no restart to play): Stalled with reason Rewards, the function named in the stacks of every rank."""
    k, ns, name = kubectl, k8s_namespace, "tiny-hang"
    trainer_port = free_port()
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "hang_rewards.py").write_text(HANGING_REWARD)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'mods'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    op = H.OperatorProcess(crd.kubeconfig, tmp_path / "operator", "--namespace", ns, "--progress-interval", "1",
                           "--trainer-metrics-port", str(trainer_port),
                           env={**STALL_ENV, "GRPO_STALL_FLOOR_SECONDS": "20"})
    op.start()
    procs: list[subprocess.Popen] = []
    try:
        job = tiny_job(name)
        job["spec"]["training"].update({"maxSteps": MAX_STEPS, "saveSteps": SAVE_STEPS})
        job["spec"]["rewards"] = [{"function": "hang_rewards:score_then_hang_forever"}]
        job["spec"]["runPolicy"]["onStall"] = "Fail"
        procs.append(start_first_attempt(k, ns, job, tmp_path, tmp_path / "attempt0.log")[2])
        out = tmp_path / "out"
        st = H.wait_job(k, ns, name, lambda s: s.get("phase") == "Failed", timeout=240, what="Failed")["status"]
        cond = next(c for c in st["conditions"] if c["type"] == "Stalled")
        assert cond["status"] == "True" and cond["reason"] == "Rewards", cond
        assert "score_then_hang_forever" in cond["message"], cond  # the innermost frames, in `kubectl grpo describe`
        assert st["lastFailureReason"] == "Stalled"
        for rank in (0, 1):
            text = (out / "stalls" / "attempt-0" / f"rank-{rank}.txt").read_text()
            assert "score_then_hang_forever" in text and "_calculate_rewards" in text, text[:3000]
        print(f"\nStalled: {cond['message'][:500]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_group(proc)
        op.stop()


SLOW_REWARD = '''
import time


def slow_but_moving(prompts, completions, **kwargs):
    time.sleep(3.0)  # longer than the operator's floor (2 s) at every step
    return [float(len(c)) / 100 for c in completions]
'''


def test_a_slow_job_whose_steps_move_is_never_stalled(crd: Any, kubectl: Any, k8s_namespace: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step sleeps 3 s in its reward, over a 2 s floor, with checkpoint saves every 2 steps: the deadline
    follows the job's own step times (3 × the slowest here), so it runs to Succeeded with no Stalled condition."""
    k, ns, name = kubectl, k8s_namespace, "tiny-slow"
    trainer_port, steps = free_port(), 8
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "slow_rewards.py").write_text(SLOW_REWARD)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'mods'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    op = H.OperatorProcess(crd.kubeconfig, tmp_path / "operator", "--namespace", ns, "--progress-interval", "1",
                           "--trainer-metrics-port", str(trainer_port),
                           env={**STALL_ENV, "GRPO_STALL_FLOOR_SECONDS": "2", "GRPO_STALL_MULTIPLE": "3"})
    op.start()
    procs: list[subprocess.Popen] = []
    try:
        job = tiny_job(name)
        job["spec"]["training"].update({"maxSteps": steps, "saveSteps": 2})
        job["spec"]["rewards"] = [{"function": "slow_rewards:slow_but_moving"}]
        log, term = tmp_path / "attempt0.log", tmp_path / "termination-log"
        pod, _, proc = start_first_attempt(k, ns, job, tmp_path, log, str(term))
        procs.append(proc)
        wait_exit(procs[0], log, timeout=300)
        H.pod_exit(k, ns, pod["metadata"]["name"], 0, message=term.read_text())
        st = H.wait_job(k, ns, name, lambda s: s.get("phase") in ("Succeeded", "Failed"), timeout=60)["status"]
        assert st["phase"] == "Succeeded" and st.get("restarts", 0) == 0, st
        assert not [c for c in st["conditions"] if c["type"] == "Stalled"], st["conditions"]
        assert "Stalled" not in (tmp_path / "operator" / "operator.log").read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_group(proc)
        op.stop()
