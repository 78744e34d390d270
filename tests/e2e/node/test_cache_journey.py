"""spec.cache on the real node: one download, then everything offline (docs/cache.md), with the real helm and kubectl.

  a Hub emulator on the host (tests/support/hub.py, bound to the node's IP: the pods reach it over the pod network,
  HF_ENDPOINT in the job's template.env) serving the tiny model and dataset as `org/tiny` and `org/data`
  → a cache PVC on a local PersistentVolume → a 2-node CPU GRPOJob with `spec.cache`: the download pod fetches from
    the emulator (slowed down, so `kubectl get grpojobs -o wide` shows bytes and files done/total moving)
  → the trainers load offline from the volume and train → SIGKILL of rank 0's trainer → gang restart → resumed from
    the checkpoint with no second download pod → Succeeded
  → a second job with the same model and dataset: its download pod finds the cache full and exits at once.
The emulator's access log, read at each phase's end, proves that only the first download reached it.

Every command and its output goes to $GRPO_CACHE_TRANSCRIPT (default out/journey/cache-transcript.txt).
~4-6 min with the images built (the node, helm install, two jobs).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.hub import HubEmulator
from tests.support.journey import Transcript, User, progress_records, storage, tiny_job
from tests.support.node import REPO, wait_for
from tests.support.trainer import TINY_DATA, TINY_MODEL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first run also builds and imports the images
NS = "journey"  # the `release` fixture's namespace
MAX_STEPS, SAVE_STEPS = 160, 20
SLOW_LINK = 40_000  # bytes/s for the weights (~380 kB): a ~10 s download, long enough to watch its progress
PHASES: dict[str, int] = {}  # phase → requests the emulator got during it
MODEL_BYTES = sum(p.stat().st_size for p in TINY_MODEL.iterdir())
TRANSCRIPT_ENV, TRANSCRIPT_FILE = "GRPO_CACHE_TRANSCRIPT", "cache-transcript.txt"  # read by conftest.py


@pytest.fixture(scope="module")
def hub(release: User) -> Iterator[HubEmulator]:
    """The emulator on an address the pods reach: the node's InternalIP (our node: this machine), or
    GRPO_TEST_HUB_HOST on another cluster."""
    host = os.environ.get("GRPO_TEST_HUB_HOST")
    if not host:
        if release.node.external:
            pytest.skip("set GRPO_TEST_HUB_HOST to an address of this machine that the cluster's pods reach")
        addresses = release.json("get", "nodes")["items"][0]["status"]["addresses"]
        host = next(a["address"] for a in addresses if a["type"] == "InternalIP")
    emulator = HubEmulator(host=host)
    emulator.add_model("org/tiny", TINY_MODEL)
    emulator.add_dataset("org/data", {"data/train.jsonl": TINY_DATA.read_bytes()})
    emulator.throttle("model.safetensors", SLOW_LINK)
    with emulator:
        release.transcript.note(f"Hub emulator at {emulator.url}: org/tiny ({len(emulator.repos)} repos)")
        yield emulator


def cache_volume(user: User, size: str = "2Gi") -> None:
    """The claim `hf-cache` on a local PersistentVolume of the node, bound to it by claimRef (the checkpoint PV of
    storage() is another one of the same class)."""
    path = user.node.volume_dir("hf-cache")
    docs = [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "journey-hf-cache"},
         "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                  "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "journey-local",
                  "claimRef": {"namespace": NS, "name": "hf-cache"}, "local": {"path": str(path)},
                  "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                      {"key": "kubernetes.io/hostname", "operator": "In", "values": [user.node.node_name()]}]}]}}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "hf-cache", "namespace": NS},
         "spec": {"storageClassName": "journey-local", "accessModes": ["ReadWriteOnce"],
                  "resources": {"requests": {"storage": size}}}},
    ]
    user.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in docs))


def cached_job(name: str, hub: HubEmulator, *, max_steps: int, save_steps: int) -> dict[str, Any]:
    """The journey's tiny job, its model and dataset from the Hub (the emulator) through spec.cache."""
    job = tiny_job(name, max_steps=max_steps, save_steps=save_steps)
    spec = job["spec"]
    spec["model"] = "org/tiny"
    spec["dataset"]["name"] = "org/data"
    spec["cache"] = {"volumeClaimName": "hf-cache"}
    spec["template"] = {"env": [{"name": "HF_ENDPOINT", "value": hub.url}]}
    return job


def condition(st: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions") or [] if c["type"] == ctype), {})


def pods(user: User, job: str, role: str = "trainer", attempt: int | None = None) -> list[dict[str, Any]]:
    sel = f"grpo.dev/job-name={job},grpo.dev/role={role}" + (f",grpo.dev/attempt={attempt}" if attempt is not None
                                                               else "")
    return (user.json("get", "pods", "-n", NS, "-l", sel) or {}).get("items", [])


def logs(user: User, pod: str, container: str = "trainer") -> str:
    return user.kubectl("logs", "-n", NS, pod, "-c", container, quiet=True, check=False).stdout


def first_step(user: User, job: str, attempt: int) -> tuple[str, dict[str, Any]] | None:
    for p in pods(user, job, attempt=attempt):
        recs = progress_records(logs(user, p["metadata"]["name"]))
        if recs:
            return p["metadata"]["name"], recs[0]
    return None


def phase_end(hub: HubEmulator, phase: str, tr: Transcript) -> int:
    """The emulator's requests since the previous phase ended (then its log starts over)."""
    got = hub.requests()
    PHASES[phase] = len(got)
    shown = sorted({f"{r.method} {r.path.split('?')[0]} {r.status}" for r in got})
    tr.note(f"Hub emulator, phase '{phase}': {len(got)} request(s)" + "".join(f"\n#   {s}" for s in shown[:40]))
    hub.clear_log()
    return len(got)


def no_failure(user: User, name: str) -> dict[str, Any]:
    st = user.job_status(name, NS)
    if st.get("phase") == "Failed" or st.get("restarts", 0) > 1:
        raise AssertionError(f"{name}: {json.dumps(st)[:3000]}")
    return st


def succeeded(user: User, name: str) -> dict[str, Any] | None:
    st = no_failure(user, name)
    return st if st.get("phase") == "Succeeded" else None


def download_with_progress(user: User, hub: HubEmulator, tr: Transcript) -> None:
    """Apply the first job; while its download pod runs, -o wide shows the bytes moving; then Staged=True."""
    storage(user, NS)
    cache_volume(user)
    manifest = REPO / "out" / "journey" / "cached.yaml"
    manifest.write_text(yaml.safe_dump(cached_job("cached", hub, max_steps=MAX_STEPS, save_steps=SAVE_STEPS),
                                       sort_keys=False))
    tr.write(manifest.read_text())
    t_apply = time.monotonic()
    user.kubectl("apply", "-n", NS, "-f", str(manifest))
    seen: list[str] = []

    def downloading() -> bool:  # two different byte counts of the model in the job's status, as kubectl shows it
        msg = condition(no_failure(user, "cached"), "Staged").get("message", "")
        if msg.startswith("downloading model org/tiny@main:") and msg not in seen:
            seen.append(msg)
            user.kubectl("get", "grpojobs", "-n", NS, "-o", "wide")
        return len(seen) >= 2

    wait_for(downloading, 180, 0.5, what="the download's progress to move in the Staged condition")
    total = f"/ {MODEL_BYTES / 1000:.1f} kB, "  # what the download pod stages: every file of the tiny model
    assert all(total in m and m.endswith("/6 files") for m in seen), seen
    assert pods(user, "cached") == []  # no trainer while it downloads

    def staged() -> dict[str, Any] | None:
        s = no_failure(user, "cached")
        return s if condition(s, "Staged").get("status") == "True" else None

    st = wait_for(staged, 180, 0.5, what="Staged=True")
    tr.note(f"staged {time.monotonic() - t_apply:.1f} s after apply: {condition(st, 'Staged')['message']}")
    [stage_pod] = pods(user, "cached", "initializer")
    assert stage_pod["status"]["phase"] == "Succeeded"
    user.kubectl("logs", "-n", NS, stage_pod["metadata"]["name"])
    assert phase_end(hub, "download", tr) > 0


# -------------------------------------------------------------------------------------------------- the journey
def test_cache_download_once_train_kill_resume_offline_and_reuse(release: User, hub: HubEmulator) -> None:
    user, tr = release, release.transcript
    node = user.node
    tr.note("spec.cache: a cache PVC on a local PV, the model and dataset from the Hub emulator")
    download_with_progress(user, hub, tr)
    stage_uid = pods(user, "cached", "initializer")[0]["metadata"]["uid"]

    rank0, rec = wait_for(lambda: first_step(user, "cached", 0) if no_failure(user, "cached") else None, 300, 0.5,
                          what="the first training step")
    tr.note(f"first step {rec['step']} in {rank0}'s log: the trainers loaded org/tiny and org/data offline")

    def past_checkpoint() -> int | None:
        recs = progress_records(logs(user, rank0))
        return recs[-1]["step"] if recs and SAVE_STEPS < recs[-1]["step"] < MAX_STEPS - 2 * SAVE_STEPS else None

    killed_at = wait_for(past_checkpoint, 300, 0.3, what=f"a step past checkpoint-{SAVE_STEPS}")
    assert phase_end(hub, "train", tr) == 0
    tr.note(f"SIGKILL of {rank0}'s trainer process at step {killed_at}")
    tr.write(f"killed: {node.kill_container_main_process(NS, rank0, 'trainer')}")

    new_rank0, resumed = wait_for(lambda: first_step(user, "cached", 1) if no_failure(user, "cached") else None,
                                  360, 0.5, what="the first step after the gang restart")
    tr.note(f"resumed: first step {resumed['step']} in {new_rank0}")
    assert resumed["step"] - 1 >= SAVE_STEPS and (resumed["step"] - 1) % SAVE_STEPS == 0, (resumed, killed_at)
    [again] = pods(user, "cached", "initializer")  # the same finished download pod, no second one
    assert again["metadata"]["uid"] == stage_uid and again["status"]["phase"] == "Succeeded"
    st = user.job_status("cached", NS)
    assert st["restarts"] == 1 and condition(st, "Staged")["status"] == "True", st
    user.kubectl("get", "grpojobs", "-n", NS, "-o", "wide")
    assert phase_end(hub, "gang restart and resume", tr) == 0

    final = wait_for(lambda: succeeded(user, "cached"), 600, 1.0, what="Succeeded")
    assert (final.get("progress") or {}).get("step") == MAX_STEPS, final
    user.kubectl("describe", "grpojob", "cached", "-n", NS)
    assert phase_end(hub, "train to the end", tr) == 0

    tr.note("a second job with the same model and dataset: its download pod finds them in the cache")
    second = cached_job("reuse", hub, max_steps=4, save_steps=4)
    user.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(second))
    wait_for(lambda: succeeded(user, "reuse"), 300, 1.0, what="the second job Succeeded")
    [stage2] = pods(user, "reuse", "initializer")
    stage_log = logs(user, stage2["metadata"]["name"], "stage")
    tr.write(stage_log)
    assert '"event": "cached"' in stage_log and '"staged": []' in stage_log, stage_log
    user.kubectl("get", "grpojobs", "-n", NS, "-o", "wide")
    user.kubectl("get", "events", "-n", NS, "--field-selector", "reason=Staged", check=False)
    assert phase_end(hub, "second job", tr) == 0
    tr.note("emulator requests per phase: " + json.dumps(PHASES))
    user.kubectl("delete", "grpojob", "cached", "reuse", "-n", NS, "--wait=true", "--timeout=60s")
