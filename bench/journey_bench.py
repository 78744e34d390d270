"""The user's first run, on a real cluster vs. on this machine (docs/performance.md, "The journey").

    sudo .venv/bin/python bench/journey_bench.py [--runs 3] [--out out/journey/bench.json]

In one process, on the same machine, alternately:
  * cluster: `kubectl apply` of the tiny 2-node CPU job (tests/support/journey.py: 2 pods × 1 process, model and data
    from ConfigMaps, checkpoints on a local PV) → the first training step in the pods' logs (the trainer's own
    timestamp of its first GRPO_PROGRESS line). Includes scheduling, pod sandboxes, the image's Python start, c10d
    rendezvous through the cluster DNS, model load and the first step.
  * local: `grpojob run --local` of the same job (nodes 2 → 2 local processes, the same model, data and training
    arguments) → its first training step (model load and first step too).
  ratio = cluster / local (goal ≤ 1.3).
  The cluster side is observed without polling (one `kubectl logs -f` per pod): a poll loop beside the pods took
  ~0.5 of a core of the 2-core node and slowed the start it timed (docs/performance.md).
  * recovery, side by side in the last run's job: SIGKILL of the other pod's worker process (the pods stay: torchrun's
    agents restart the workers in place, runPolicy.restartPolicy InPlace) → the first resumed step; then SIGKILL of
    the rank-0 container's main process from the host → the first step of the recreated gang (operator backoff 1 s,
    new pods, model load, checkpoint restore). For each: where the time went (the launchers' in-place restart line,
    the new pods' scheduling and containers, and each worker's GRPO_STARTUP record: imports, data, TRL, model,
    restore, first step).

The cluster is the project's real node (scripts/node/up.sh) or GRPO_TEST_KUBECONFIG; the chart is installed once with
`lifecycle.backoffBaseSeconds=1` and `metrics.progressIntervalSeconds=2`. Needs root for the local node.
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/ is not a package: reach tests.support like `python -m pytest` does

import yaml

from grpo_trainer.contract import STARTUP_PREFIX as STARTUP
from tests.support.journey import (
    PROGRESS,
    Transcript,
    User,
    build_images,
    install_chart,
    model_configmaps,
    progress_records,
    storage,
    tiny_job,
)
from tests.support.node import TOOLS, NodeCluster, wait_for

NS = "journey-bench"


def local_first_step(max_steps: int) -> float:
    """`grpojob run --local` of the same job → seconds from start to its first step (trainer's timestamp)."""
    job = tiny_job("bench-local", max_steps=max_steps, save_steps=max_steps)
    job["spec"]["model"] = str(REPO / "examples" / "local-tiny" / "model")
    job["spec"]["dataset"]["name"] = str(REPO / "examples" / "local-tiny" / "data" / "arithmetic.jsonl")
    for key in ("template", "output", "resources"):
        job["spec"].pop(key)
    with tempfile.TemporaryDirectory(prefix="journey-bench-") as tmp:
        path = Path(tmp) / "job.yaml"
        path.write_text(yaml.safe_dump(job))
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        t0 = time.time()
        subprocess.run([str(Path(sys.executable).parent / "grpojob"), "run", "--local", str(path), "--output-dir",
                        str(Path(tmp) / "out"), "--no-progress", "--timeout", "600"], env=env, check=True,
                       capture_output=True, timeout=700)
        recs = progress_records((Path(tmp) / "out" / "train.log").read_text())
        return recs[0]["timestamp"] - t0


def _ts(text: str) -> float:
    """An RFC 3339 timestamp (kubectl logs --timestamps: nanoseconds; the API: seconds) → epoch seconds."""
    date, _, frac = text.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(date, "%Y-%m-%dT%H:%M:%S")) + float("0." + (frac or "0"))


def _timed_log(user: User, pod: str, t0: float) -> Iterator[tuple[float, str]]:
    """The trainer container's log lines, each with its seconds after t0 (kubectl logs --timestamps)."""
    lines = user.kubectl("logs", "-n", NS, pod, "-c", "trainer", "--timestamps", quiet=True, check=False).stdout
    for line in lines.splitlines():
        stamp, _, text = line.partition(" ")
        try:
            at = _ts(stamp) - t0
        except ValueError:
            continue
        yield at, text


def phases(user: User, name: str, t0: float, attempt: int = 0) -> dict[str, dict[str, float]]:
    """Per pod of `attempt`, seconds after t0 (the apply, or the kill that recreated it): created, container started,
    the launcher's wait for the c10d store (when it had to), the workers' first output (after the rendezvous), the
    first step (GRPO_PROGRESS); and rank 0's GRPO_STARTUP record (where its worker's start went)."""
    got = user.json("get", "pods", "-n", NS, "-l", f"grpo.dev/job-name={name},grpo.dev/attempt={attempt}") or {}
    out: dict[str, dict[str, float]] = {}
    for p in got.get("items", []):
        pod = p["metadata"]["name"]
        row = {"created": _ts(p["metadata"]["creationTimestamp"]) - t0}  # (the API's times: whole seconds)
        for c in p["status"].get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "True":
                row["scheduled"] = _ts(c["lastTransitionTime"]) - t0
        state = (p["status"].get("containerStatuses") or [{}])[0].get("state", {})
        started = (state.get("running") or state.get("terminated") or {}).get("startedAt")
        if started:
            row["container_started"] = _ts(started) - t0
        for at, text in _timed_log(user, pod, t0):
            if "grpo_trainer.launch: waiting for the rendezvous store" in text:
                row.setdefault("store_wait_began", at)
            elif "grpo_trainer.launch: rendezvous store" in text:
                row.setdefault("store_reached", at)
            else:  # the workers' first output (the data set loads right after the rendezvous)
                row.setdefault("workers_first_output", at)
            if text.startswith(STARTUP):
                row.update({f"startup_{k}": v for k, v in json.loads(text[len(STARTUP):]).items()
                            if isinstance(v, (int, float)) and k not in ("processStart", "inPlaceRestart")})
            if text.startswith(PROGRESS):
                row.setdefault("first_step", at)
                break
        out[pod] = {k: round(v, 2) for k, v in row.items()}
    return out


def in_place_phases(user: User, name: str, t_kill: float) -> dict[str, dict[str, float]]:
    """Per pod of attempt 0, seconds after the worker was killed: the launcher's in-place restart line (the failure
    seen, the workers stopped), the new worker's process start and first step (rank 0's GRPO_STARTUP record, with
    where its start went)."""
    got = user.json("get", "pods", "-n", NS, "-l", f"grpo.dev/job-name={name},grpo.dev/attempt=0") or {}
    out: dict[str, dict[str, float]] = {}
    for p in got.get("items", []):
        pod = p["metadata"]["name"]
        row: dict[str, float] = {}
        for at, text in _timed_log(user, pod, t_kill):
            if text.startswith("grpo_trainer.launch: in-place restart 1:"):
                row["agent_restarts_workers"] = at
            elif text.startswith(STARTUP) and "agent_restarts_workers" in row:
                rec = json.loads(text[len(STARTUP):])
                row["worker_process_started"] = rec["processStart"] - t_kill
                row.update({f"startup_{k}": v for k, v in rec.items()
                            if isinstance(v, (int, float)) and k not in ("processStart", "inPlaceRestart")})
            elif text.startswith(PROGRESS) and "agent_restarts_workers" in row:
                row["first_step"] = at
                break
        out[pod] = {k: round(v, 2) for k, v in row.items()}
    return out


class Followers:
    """`kubectl logs -f` of each trainer pod of one attempt: their GRPO_PROGRESS records as they come, without polling.
    (Until 2026-12-03 the bench polled `kubectl get pods` + `kubectl logs` of each pod every 0.3 s: ~0.5 of a core
    on the 2-core node beside the two pods, which slowed the very start it timed: docs/performance.md.)  The global
    rank 0, which logs the progress, may be on either node (c10d), so every pod is followed."""

    def __init__(self, user: User, name: str, attempt: int, nodes: int = 2) -> None:
        sel = f"grpo.dev/job-name={name},grpo.dev/attempt={attempt},grpo.dev/role=trainer"

        def started() -> list[str] | None:
            # created within ~1 s, containers started ~1 s later: a few cheap calls (`kubectl logs -f` of a container
            # still being created exits at once)
            got = user.json("get", "pods", "-n", NS, "-l", sel) or {}
            names = [p["metadata"]["name"] for p in got.get("items", [])
                     if {"running", "terminated"} & set((p["status"].get("containerStatuses") or [{}])[0]
                                                         .get("state") or {})]
            return names if len(names) >= nodes else None

        self.pods = wait_for(started, 600, 0.5, what=f"the containers of attempt {attempt}")
        self.records: queue.Queue[tuple[str, dict]] = queue.Queue()
        self.procs = [subprocess.Popen([str(TOOLS / "kubectl"), "logs", "-f", "-n", NS, pod, "-c", "trainer",
                                        "--pod-running-timeout=10m"], env=user._env(), stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True) for pod in self.pods]
        for pod, proc in zip(self.pods, self.procs, strict=True):
            threading.Thread(target=self._read, args=(pod, proc), daemon=True).start()

    def _read(self, pod: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        restarted = False  # the records after rank 0's GRPO_STARTUP of an in-place restart are the new workers'
        for line in proc.stdout:
            if line.startswith(STARTUP):
                restarted = restarted or bool(json.loads(line[len(STARTUP):]).get("inPlaceRestart"))
            for rec in progress_records(line):
                self.records.put((pod, {**rec, "in_place": restarted}))

    def until(self, accept: Callable[[dict], bool], timeout: float, what: str) -> tuple[str, dict]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                pod, rec = self.records.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"timed out waiting for {what}") from None
            if accept(rec):
                return pod, rec

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
            proc.wait(10)


def cluster_run(user: User, name: str, max_steps: int, kill: bool, cpu: str) -> dict[str, Any]:
    # the kill run trains long enough to be killed twice mid-way, each time after a checkpoint (~0.3 s a step here)
    save = 10 if kill else max_steps
    job = tiny_job(name, max_steps=max(max_steps, 150) if kill else max_steps, save_steps=save, cpu=cpu)
    t0 = time.time()
    user.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(job))
    first = Followers(user, name, 0)
    try:
        pod, rec = first.until(lambda r: True, 600, "the first step")
        out: dict[str, Any] = {"apply_to_first_step_s": rec["timestamp"] - t0, "phases": phases(user, name, t0)}
        if kill:
            out.update(_in_place(user, name, first, pod, save))
            pod, _ = first.until(lambda r: r["in_place"] and r["step"] > 4 * save, 600, "a step past the next checkpoint")
            t_kill = time.time()
            user.node.kill_container_main_process(NS, pod, "trainer")
    finally:
        first.close()
    if kill:
        resumed = Followers(user, name, 1)
        try:
            _, rec = resumed.until(lambda r: True, 600, "the first resumed step")
        finally:
            resumed.close()
        out["kill_to_resumed_step_s"] = rec["timestamp"] - t_kill
        out["resumed_at_step"] = rec["step"]
        out["recreated_phases"] = phases(user, name, t_kill, attempt=1)
    user.kubectl("delete", "grpojob", name, "-n", NS, "--wait=true", "--timeout=120s", quiet=True)
    wait_for(lambda: not user.kubectl("get", "pods", "-n", NS, "-l", f"grpo.dev/job-name={name}", "-o", "name",
                                      quiet=True).stdout.strip(), 120, 0.5, what="pods gone")
    return out


def _in_place(user: User, name: str, follow: Followers, rank0_pod: str, save: int) -> dict[str, Any]:
    """SIGKILL of the other pod's worker process once a checkpoint is written → the first step of the workers that
    torchrun's agents started again in the same pods."""
    follow.until(lambda r: save < r["step"] < 2 * save, 600, f"a step past checkpoint-{save}")
    other = next(p for p in follow.pods if p != rank0_pod)
    t_kill = time.time()
    user.node.kill_worker_processes(NS, other, "trainer")
    _, rec = follow.until(lambda r: r["in_place"], 600, "the first step after the in-place restart")
    return {"in_place_kill_to_resumed_step_s": rec["timestamp"] - t_kill, "in_place_resumed_at_step": rec["step"],
            "in_place_phases": in_place_phases(user, name, t_kill)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--out", type=Path, default=REPO / "out" / "journey" / "bench.json")
    ap.add_argument("--cpu-limit", default="1", help="each pod's CPU limit (default 1: one process per pod)")
    a = ap.parse_args()
    results: dict[str, Any] = {"cluster_first_step_s": [], "local_first_step_s": [], "ratio": [],
                                "kill_to_resumed_step_s": [], "in_place_kill_to_resumed_step_s": [],
                                "cluster_phases": [], "recovery_phases": []}
    with NodeCluster.start() as node:
        transcript = Transcript(a.out.with_suffix(".transcript.txt"))
        user = User(node, transcript)
        if not node.external:
            archives = build_images(log=a.out.with_name("build-images.log"))
            node.import_images([archives["operator"], archives["trainer"]])
        install_chart(user)
        user.kubectl("create", "namespace", NS)
        model_configmaps(user, NS)
        storage(user, NS)
        for i in range(a.runs):
            c = cluster_run(user, f"bench-{i}", a.max_steps, kill=(i == a.runs - 1), cpu=a.cpu_limit)
            local = local_first_step(a.max_steps)
            results["cluster_first_step_s"].append(round(c["apply_to_first_step_s"], 2))
            results["local_first_step_s"].append(round(local, 2))
            results["ratio"].append(round(c["apply_to_first_step_s"] / local, 3))
            results["cluster_phases"].append(c["phases"])
            if "kill_to_resumed_step_s" in c:
                results["kill_to_resumed_step_s"].append(round(c["kill_to_resumed_step_s"], 2))
                results["in_place_kill_to_resumed_step_s"].append(round(c["in_place_kill_to_resumed_step_s"], 2))
                results["recovery_phases"].append({"in_place": c["in_place_phases"], "recreated": c["recreated_phases"]})
            print(f"run {i}: cluster {c['apply_to_first_step_s']:.1f} s, local {local:.1f} s, "
                  f"ratio {c['apply_to_first_step_s'] / local:.2f}" +
                  (f", worker SIGKILL → in place, resumed step {c['in_place_resumed_at_step']} in "
                   f"{c['in_place_kill_to_resumed_step_s']:.1f} s; container SIGKILL → new pods, resumed step "
                   f"{c['resumed_at_step']} in {c['kill_to_resumed_step_s']:.1f} s"
                   if "kill_to_resumed_step_s" in c else ""), flush=True)
    results["median_ratio"] = statistics.median(results["ratio"])
    results["machine"] = {"cpus": os.cpu_count()}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
