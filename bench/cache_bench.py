"""spec.cache against today's per-pod download, on the real node (docs/performance.md, "The journey").

    sudo .venv/bin/python bench/cache_bench.py [--runs 1] [--out out/journey/cache-bench.json]

One node, one chart install (lifecycle.backoffBaseSeconds=1), the Hub emulator of tests/e2e/node/test_cache_journey.py
on the node's IP (org/tiny, org/data, served at full speed). Side by side in each run, the tiny 2-node CPU job
(checkpoints on a local PV, every 10 steps) as:

  * cold:    spec.cache on an empty cache volume: the download pod fetches the model and dataset, then the trainers
             load them offline from the volume;
  * warm:    spec.cache, both already in the volume: the download pod finds them and exits;
  * per-pod: no spec.cache, HF_ENDPOINT to the same emulator: each trainer pod downloads at its start (today's
             behaviour without spec.cache), again after a restart.

For each: `kubectl apply` → the first training step (the trainer's own timestamp of its first GRPO_PROGRESS line),
SIGKILL of rank 0's trainer process from the host (past a checkpoint) → the first step of the restarted gang, and the
emulator's requests in each phase. Per pod of attempt 0, when it was created, scheduled, its container started, its
workers first wrote and its first step came (bench/journey_bench.py phases()).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/ is not a package: reach tests.support like `python -m pytest` does
sys.path.insert(0, str(REPO / "bench"))

import journey_bench
import yaml

from tests.e2e.node.test_cache_journey import NS, cache_volume, cached_job
from tests.support.hub import HubEmulator
from tests.support.journey import Transcript, User, build_images, install_chart, progress_records, storage
from tests.support.node import NodeCluster, wait_for
from tests.support.trainer import TINY_DATA, TINY_MODEL

journey_bench.NS = NS  # its phases() reads the pods of this namespace
VARIANTS = ("cold", "warm", "per-pod")
MAX_STEPS, SAVE_STEPS = 80, 10


def job_for(variant: str, name: str, hub: HubEmulator) -> dict[str, Any]:
    job = cached_job(name, hub, max_steps=MAX_STEPS, save_steps=SAVE_STEPS)
    if variant == "per-pod":
        job["spec"].pop("cache")
    return job


def first_step(user: User, name: str, attempt: int) -> tuple[str, dict[str, Any]] | None:
    sel = f"grpo.dev/job-name={name},grpo.dev/role=trainer,grpo.dev/attempt={attempt}"
    for p in (user.json("get", "pods", "-n", NS, "-l", sel) or {}).get("items", []):
        recs = progress_records(user.kubectl("logs", "-n", NS, p["metadata"]["name"], "-c", "trainer", quiet=True,
                                             check=False).stdout)
        if recs:
            return p["metadata"]["name"], {"first": recs[0], "last": recs[-1]}
    return None


def no_failure(user: User, name: str) -> None:
    st = (user.json("get", "grpojob", name, "-n", NS) or {}).get("status") or {}
    if st.get("phase") in ("Failed", "Rejected") or st.get("restarts", 0) > 1:
        raise AssertionError(f"{name}: {json.dumps(st)[:3000]}")


def run_variant(user: User, hub: HubEmulator, variant: str, name: str) -> dict[str, Any]:
    tr = user.transcript
    hub.clear_log()
    tr.note(f"{variant}: kubectl apply {name}")
    t0 = time.time()
    user.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(job_for(variant, name, hub)))

    def step(attempt: int) -> Any:
        no_failure(user, name)
        return first_step(user, name, attempt)

    pod, recs = wait_for(lambda: step(0), 600, 0.3, what=f"{name}: the first step")
    out: dict[str, Any] = {"apply_to_first_step_s": round(recs["first"]["timestamp"] - t0, 2),
                           "phases": journey_bench.phases(user, name, t0), "hub_requests_to_first_step": len(hub.requests())}
    stage = (user.json("get", "pods", "-n", NS, "-l", f"grpo.dev/job-name={name},grpo.dev/role=initializer") or
             {}).get("items", [])
    if stage:
        state = (stage[0]["status"].get("containerStatuses") or [{}])[0].get("state", {}).get("terminated") or {}
        if state:
            out["download_pod_ran_s"] = round(_ts(state["finishedAt"]) - _ts(state["startedAt"]), 2)
    hub.clear_log()
    wait_for(lambda: (r := step(0)) and SAVE_STEPS < r[1]["last"]["step"] < MAX_STEPS - 2 * SAVE_STEPS and r, 600,
             0.2, what=f"{name}: a step past checkpoint-{SAVE_STEPS}")
    t_kill = time.time()
    tr.write(f"killed: {user.node.kill_container_main_process(NS, pod, 'trainer')}")
    _, recs = wait_for(lambda: step(1), 600, 0.3, what=f"{name}: the first resumed step")
    out["kill_to_resumed_step_s"] = round(recs["first"]["timestamp"] - t_kill, 2)
    out["resumed_at_step"] = recs["first"]["step"]
    out["hub_requests_kill_to_resumed"] = len(hub.requests())
    tr.note(f"{variant}: {json.dumps({k: v for k, v in out.items() if k != 'phases'})}")
    user.kubectl("delete", "grpojob", name, "-n", NS, "--wait=true", "--timeout=120s", quiet=True)
    wait_for(lambda: not user.kubectl("get", "pods", "-n", NS, "-l", f"grpo.dev/job-name={name}", "-o", "name",
                                      quiet=True).stdout.strip(), 120, 0.5, what=f"{name}: pods gone")
    return out


def _ts(text: str) -> float:
    import calendar

    return float(calendar.timegm(time.strptime(text.rstrip("Z").partition(".")[0], "%Y-%m-%dT%H:%M:%S")))


def empty(path: Path) -> None:
    for child in path.iterdir():
        shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--out", type=Path, default=REPO / "out" / "journey" / "cache-bench.json")
    a = ap.parse_args()
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    with NodeCluster.start() as node:
        user = User(node, Transcript(a.out.with_suffix(".transcript.txt")))
        archives = build_images(log=a.out.with_name("build-images.log"))
        node.import_images([archives["operator"], archives["trainer"]])
        install_chart(user)
        user.kubectl("create", "namespace", NS)
        storage(user, NS)
        cache_volume(user)  # a fresh, empty directory on the node
        cache_dir = node.state / "volumes" / "hf-cache" if node.state is not None else None
        addresses = user.json("get", "nodes")["items"][0]["status"]["addresses"]
        hub = HubEmulator(host=next(x["address"] for x in addresses if x["type"] == "InternalIP"))
        hub.add_model("org/tiny", TINY_MODEL)
        hub.add_dataset("org/data", {"data/train.jsonl": TINY_DATA.read_bytes()})
        with hub:
            for i in range(a.runs):
                if i and cache_dir is not None:
                    empty(cache_dir)  # cold again
                for v in VARIANTS:
                    got = run_variant(user, hub, v, f"{v}-{i}")
                    results[v].append(got)
                    print(f"run {i} {v}: apply → first step {got['apply_to_first_step_s']} s, SIGKILL → resumed "
                          f"step {got['resumed_at_step']} {got['kill_to_resumed_step_s']} s, Hub requests "
                          f"{got['hub_requests_to_first_step']} / {got['hub_requests_kill_to_resumed']}", flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
