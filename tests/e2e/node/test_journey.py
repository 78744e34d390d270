"""The user's whole journey on a real cluster, with the real helm and kubectl, as a user does it:

  helm install the chart (operator in the cluster from its image, webhook through its Service, RBAC as shipped)
  → an invalid spec refused by `kubectl apply` through that webhook
  → a 2-node CPU GRPOJob with a shared PVC: pods scheduled, run the CPU trainer image, rendezvous by c10d through
    the headless Service's DNS, train the tiny model; `kubectl get grpojobs` shows STEP and REWARD moving
  → the other pod's worker process SIGKILLed (its container stays) → both agents restart their workers in place:
    the same pods (uids) resume from the checkpoint, status.inPlaceRestarts 1, nothing recreated
  → the rank-0 container's process SIGKILLed (from the host on our node, as an OOM kill would) → gang restart →
    the new pods resume from the checkpoint on the PVC, the step continues → Succeeded → `kubectl delete` → no child
  → a job whose image does not exist: a condition with the kubelet's reason
  → server mode on CPU: the vLLM server pod alone (the job says it waits for it), Ready on /health, only then the
    trainers, which stop with the documented config error (weight sync needs CUDA): Failed/ConfigError
  → colocate mode on CPU: vLLM inside every trainer process in the pods, the 2-node job Succeeded
  → helm upgrade keeps the webhook; helm uninstall removes both webhook configurations and strands no GRPOJob.

Where: the project's real single-node cluster (scripts/node/, root + scripts/install-test-deps.sh), or, unchanged,
any cluster of GRPO_TEST_KUBECONFIG (kind, k3d, a real one) with the two images loaded (docs/real-node.md).
The transcript of every command goes to $GRPO_JOURNEY_TRANSCRIPT (default out/journey/transcript.txt).
~5-7 min with the images built (scripts/build-images.sh caches them by input hash).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from typing import Any

import pytest
import yaml

from tests.support.journey import (
    CHART,
    OP_NAMESPACE,
    RELEASE,
    User,
    model_configmaps,
    progress_records,
    storage,
    tiny_job,
    webhook_config_name,
)
from tests.support.node import REPO, TOOLS, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first test also builds and imports the images
NS = "journey"
# 0.05 s a step on a quiet machine, ~0.3 s under load: long enough to watch, kill past a checkpoint and resume
MAX_STEPS, SAVE_STEPS = 400, 25
TIMINGS: dict[str, float] = {}  # the fixtures (conftest.py) add theirs


def pods_of(user: User, job: str, attempt: int | None = None) -> list[dict[str, Any]]:
    sel = f"grpo.dev/job-name={job}" + (f",grpo.dev/attempt={attempt}" if attempt is not None else "")
    got = user.json("get", "pods", "-n", NS, "-l", sel)
    return [p for p in (got or {}).get("items", []) if p["metadata"]["labels"].get("grpo.dev/role") == "trainer"]


def logs(user: User, pod: str) -> str:
    return user.kubectl("logs", "-n", NS, pod, "-c", "trainer", quiet=True, check=False).stdout


# -------------------------------------------------------------------------------------------------- the journey
def test_journey_train_kill_resume_succeed_delete(release: User) -> None:
    user, tr = release, release.transcript
    node = user.node

    tr.note("an invalid spec is refused by kubectl apply, through the webhook's Service")
    t = time.monotonic()
    cp = user.kubectl("apply", "-n", NS, "-f", "examples/invalid-batch.yaml", check=False)
    TIMINGS["refusal_s"] = time.monotonic() - t
    assert cp.returncode != 0 and "denied the request" in cp.stderr, cp.stderr
    assert "numGenerations" in cp.stderr and "Valid numGenerations" in cp.stderr, cp.stderr
    assert user.json("get", "grpojob", "wrong-batch", "-n", NS) is None

    tr.note("model and data as ConfigMaps, a PVC for checkpoints, then the 2-node CPU job")
    model_configmaps(user, NS)
    storage(user, NS)
    manifest = REPO / "out" / "journey" / "tiny.yaml"
    manifest.write_text(yaml.safe_dump(tiny_job("tiny", max_steps=MAX_STEPS, save_steps=SAVE_STEPS), sort_keys=False))
    tr.write(manifest.read_text())
    t_apply_wall, t_apply = time.time(), time.monotonic()
    user.kubectl("apply", "-n", NS, "-f", str(manifest))

    def running_pods() -> list[dict[str, Any]] | None:
        ps = pods_of(user, "tiny", 0)
        return ps if len(ps) == 2 and all(p["status"].get("phase") == "Running" for p in ps) else None

    pods = wait_for(running_pods, 180, 0.3, what="both trainer pods Running")
    TIMINGS["apply_to_running_s"] = time.monotonic() - t_apply
    user.kubectl("get", "pods", "-n", NS, "-o", "wide")
    names = sorted(p["metadata"]["name"] for p in pods)

    # the first training step in the pods' logs (rank 0's GRPO_PROGRESS lines; c10d decides which pod that is)
    def first_step() -> tuple[str, dict[str, Any]] | None:
        for n in names:
            recs = progress_records(logs(user, n))
            if recs:
                return n, recs[0]
        return None

    rank0_pod, rec = wait_for(first_step, 300, 0.5, what="the first training step in the pods' logs")
    TIMINGS["apply_to_first_step_s"] = rec["timestamp"] - t_apply_wall
    tr.note(f"first step {rec['step']} in {rank0_pod}'s log {TIMINGS['apply_to_first_step_s']:.1f} s after apply")
    # c10d rendezvous through the headless Service's DNS: the other pod found rank 0's store by name
    other = [n for n in names if n != rank0_pod][0]
    assert "tiny-node-0.tiny" in json.dumps(pods[0]["spec"]["containers"][0]["args"])
    assert logs(user, other) is not None

    tr.note("kubectl get grpojobs: STEP and REWARD move (scraped by the in-cluster operator over the pod network)")
    seen: set[str] = set()

    def moving() -> bool:
        out = user.kubectl("get", "grpojobs", "-n", NS).stdout
        row = out.splitlines()[1].split()
        header = out.splitlines()[0].split()
        step, reward = row[header.index("STEP")], row[header.index("REWARD")]
        if step != "<none>" and reward != "<none>":
            seen.add(step)
        return len(seen) >= 2

    wait_for(moving, 240, 1.0, what="STEP to take two values with a REWARD in kubectl get grpojobs")
    user.kubectl("get", "grpojobs", "-n", NS, "-o", "wide")

    rank0_pod = restart_in_place(user, pods, rank0_pod, other)

    # a checkpoint on the PVC before the kill (a step past saveSteps is logged after that checkpoint is written),
    # and work left after it
    def past_checkpoint() -> int | None:
        recs = progress_records(logs(user, rank0_pod))
        return recs[-1]["step"] if recs and SAVE_STEPS < recs[-1]["step"] < MAX_STEPS - 2 * SAVE_STEPS else None

    killed_at = wait_for(past_checkpoint, 300, 0.3, what=f"a step past checkpoint-{SAVE_STEPS}")
    user.kubectl("logs", "-n", NS, rank0_pod, "-c", "trainer", "--tail=3")
    tr.note(f"SIGKILL of {rank0_pod}'s trainer process at step {killed_at}")
    t_kill_wall, _t_kill = time.time(), time.monotonic()
    how = node.kill_container_main_process(NS, rank0_pod, "trainer")
    tr.write(f"killed: {how}")
    ckpt_dir = None if node.external else node.state / "volumes" / "ckpt" / "tiny"
    # what attempt 0 left (it is dead: nothing is written until the new gang has started, seconds later)
    at_kill = sorted(int(p.name.split("-")[1]) for p in ckpt_dir.glob("checkpoint-*")) if ckpt_dir else []
    tr.write(f"checkpoints on the PV at the kill: {at_kill}")

    def resumed() -> tuple[str, dict[str, Any]] | None:
        s = user.job_status("tiny", NS)
        if s.get("restarts", 0) > 1 or s.get("phase") == "Failed":  # the new gang failed too: a defect, say why
            raise AssertionError(f"attempt 1 did not train: {json.dumps(s)[:3000]}")
        for p in pods_of(user, "tiny", 1):
            recs = progress_records(logs(user, p["metadata"]["name"]))
            if recs:
                return p["metadata"]["name"], recs[0]
        return None

    new_rank0, first_resumed = wait_for(resumed, 360, 0.5, what="the first step after the gang restart")
    TIMINGS["kill_to_resumed_step_s"] = first_resumed["timestamp"] - t_kill_wall
    tr.note(f"resumed: first step {first_resumed['step']} in {new_rank0} "
            f"{TIMINGS['kill_to_resumed_step_s']:.1f} s after the kill")
    st = user.job_status("tiny", NS)
    assert st.get("restarts", 0) >= 1, st
    # resumed from a checkpoint on the PVC (not from step 1): the latest one attempt 0 left, or the one before it
    # when the kill hit while the latest was being written (the trainer skips an incomplete checkpoint)
    resumed_from = first_resumed["step"] - 1
    assert resumed_from >= SAVE_STEPS and resumed_from % SAVE_STEPS == 0, (first_resumed, killed_at)
    if at_kill:
        assert resumed_from in at_kill and resumed_from >= at_kill[-1] - SAVE_STEPS, (resumed_from, at_kill)
    user.kubectl("get", "grpojobs", "-n", NS)
    user.kubectl("describe", "grpojob", "tiny", "-n", NS)

    def finished() -> dict[str, Any] | None:
        s = user.job_status("tiny", NS)
        if s.get("phase") == "Failed":
            raise AssertionError(f"the job failed: {json.dumps(s)[:3000]}\n{logs(user, new_rank0)[-3000:]}")
        return s if s.get("phase") == "Succeeded" else None

    final = wait_for(finished, 600, 1.0, what="Succeeded")
    TIMINGS["apply_to_succeeded_s"] = time.monotonic() - t_apply
    user.kubectl("get", "grpojobs", "-n", NS, "-o", "wide")
    assert (final.get("progress") or {}).get("step") == MAX_STEPS, final
    steps = [r["step"] for r in progress_records(logs(user, new_rank0))]
    assert steps and steps[-1] == MAX_STEPS, steps
    result = [line for line in logs(user, new_rank0).splitlines() if line.startswith("GRPO_RESULT ")]
    assert result and f'"resumedFrom":"/ckpt/tiny/checkpoint-{resumed_from}"' in result[-1], result
    user.kubectl("logs", "-n", NS, new_rank0, "-c", "trainer", "--tail=4")
    if not node.external:  # the checkpoints are on the node's local volume
        ckpts = sorted(p.name for p in (node.state / "volumes" / "ckpt" / "tiny").glob("checkpoint-*"))
        tr.write(f"checkpoints on the PV: {ckpts}")
        assert f"checkpoint-{MAX_STEPS}" in ckpts or f"checkpoint-{SAVE_STEPS * (MAX_STEPS // SAVE_STEPS)}" in ckpts

    tr.note("kubectl delete grpojob: every child goes (owner references, the cluster's garbage collector)")
    t = time.monotonic()
    user.kubectl("delete", "grpojob", "tiny", "-n", NS, "--wait=true", "--timeout=60s")

    def no_children() -> bool:
        out = user.kubectl("get", "pods,services,configmaps", "-n", NS, "-l", "grpo.dev/job-name=tiny", "-o", "name",
                           quiet=True).stdout
        return not out.strip()

    wait_for(no_children, 120, 0.5, what="the job's pods, Service and ConfigMap to be gone")
    TIMINGS["delete_to_no_children_s"] = time.monotonic() - t
    user.kubectl("get", "pods,services,configmaps", "-n", NS)
    tr.note("timings: " + json.dumps({k: round(v, 2) for k, v in TIMINGS.items()}))


def restart_in_place(user: User, pods: list[dict[str, Any]], rank0_pod: str, other: str) -> str:
    """SIGKILL of the other pod's worker process (not its container) after a checkpoint: both torchrun agents restart
    their workers inside the same pods (runPolicy.restartPolicy InPlace, the default), which resume from the latest
    checkpoint; the operator counts it in status.inPlaceRestarts and recreates nothing. Returns rank 0's pod now (a
    new rendezvous round may give rank 0 to the other pod)."""
    tr, node = user.transcript, user.node
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}

    def past_checkpoint() -> int | None:
        recs = progress_records(logs(user, rank0_pod))
        return recs[-1]["step"] if recs and recs[-1]["step"] > SAVE_STEPS else None

    killed_at = wait_for(past_checkpoint, 300, 0.3, what=f"a step past checkpoint-{SAVE_STEPS}")
    tr.note(f"SIGKILL of {other}'s worker process (its container and pod stay) at step {killed_at}")
    t_kill_wall = time.time()
    tr.write(f"killed: {user.node.kill_worker_processes(NS, other, 'trainer')}")

    def resumed() -> tuple[str, dict[str, Any]] | None:
        s = user.job_status("tiny", NS)
        if s.get("restarts", 0) or s.get("phase") == "Failed":
            raise AssertionError(f"not restarted in place: {json.dumps(s)[:3000]}")
        # the new workers' first step: after the kill, and back at or below a step this pod logged before (rank 0's
        # old worker may log a step or two after the kill); in a pod that logged none (rank 0 moved), its first
        for n in uids:
            top = 0
            for r in progress_records(logs(user, n)):
                if r["timestamp"] > t_kill_wall and (r["step"] <= top or top == 0):
                    return n, r
                top = max(top, r["step"])
        return None

    new_rank0, first = wait_for(resumed, 300, 0.3, what="the first step after the restart in place")
    TIMINGS["in_place_kill_to_resumed_step_s"] = first["timestamp"] - t_kill_wall
    tr.note(f"restarted in place: first step {first['step']} in {new_rank0} "
            f"{TIMINGS['in_place_kill_to_resumed_step_s']:.1f} s after the kill")
    assert (first["step"] - 1) % SAVE_STEPS == 0 and first["step"] - 1 >= SAVE_STEPS, (first, killed_at)
    st = wait_for(lambda: (lambda s: s if s.get("inPlaceRestarts") else None)(user.job_status("tiny", NS)), 120, 0.5,
                  what="status.inPlaceRestarts")
    assert st["inPlaceRestarts"] == 1 and not st.get("restarts"), st
    now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods_of(user, "tiny", 0)}
    assert now == uids, (now, uids)  # the same pods: nothing was recreated
    assert not pods_of(user, "tiny", 1)
    if not node.external:
        assert all(node.container_host_pid(NS, n, "trainer") for n in uids)  # the same containers still run
    user.kubectl("describe", "grpojob", "tiny", "-n", NS)
    return new_rank0


def test_a_missing_image_gets_the_kubelets_reason(release: User) -> None:
    user, tr = release, release.transcript
    tr.note("a job whose image does not exist")
    job = tiny_job("no-image", max_steps=2, save_steps=2, image="registry.invalid/grpo/no-such-trainer:0")
    job["spec"].pop("output")
    user.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(job))

    def condition() -> dict[str, Any] | None:
        for c in user.job_status("no-image", NS).get("conditions") or []:
            if c["type"] == "Running" and c["status"] == "False" and c["reason"] in (
                    "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"):
                return c
        return None

    c = wait_for(condition, 180, 1.0, what="a Running=False condition with the kubelet's image-pull reason")
    assert "no-image-node-" in c["message"] and c["reason"] in c["message"], c
    user.kubectl("get", "grpojob", "no-image", "-n", NS)
    user.kubectl("describe", "grpojob", "no-image", "-n", NS)
    user.kubectl("delete", "grpojob", "no-image", "-n", NS, "--wait=true", "--timeout=60s")


# ------------------------------------------------------------------------------------ vLLM server mode on CPU
# What the trainer reports on CPU in server mode (docs/trainer.md, "Server mode"; grpo_trainer/config.py)
SERVER_NEEDS_CUDA = ("vllm.mode=server needs a CUDA GPU in the trainer pods: TRL 1.16 pushes the trained weights to the "
                     "vLLM server over NCCL (VLLMClient.init_communicator) and has no CPU path; on CPU use "
                     "vllm.mode: colocate (vLLM in every training process) or none, or give the trainer pods GPUs")
WAITING_READY = re.compile(r"^waiting for the vLLM server to be Ready \(/health\): 0/1 Ready, \d+s left of "
                           r"startupTimeoutSeconds \(900s\) \(attempt 0\)")


def server_job(name: str) -> dict[str, Any]:
    """The tiny job in server mode, the server sized for a CPU node: a small KV cache (0.05 × 6Gi → vLLM's CPU
    minimum, 1 GiB), the model's own context, requests that fit next to the two trainers on a 2-core node."""
    job = tiny_job(name, max_steps=2, save_steps=2)
    job["spec"].pop("output")
    job["spec"]["vllm"] = {"mode": "server", "server": {
        "gpuMemoryUtilization": 0.05, "maxModelLen": 256, "startupTimeoutSeconds": 900,
        "resources": {"limits": {"cpu": "2", "memory": "6Gi"}, "requests": {"cpu": "500m", "memory": "2Gi"}}}}
    return job


def ready_at(pod: dict[str, Any]) -> str | None:
    return next((c.get("lastTransitionTime") for c in pod["status"].get("conditions") or []
                 if c["type"] == "Ready" and c["status"] == "True"), None)


def watch_events(text: str) -> list[dict[str, Any]]:
    """`kubectl get -w --output-watch-events -o json`'s stream (concatenated JSON documents), in the API server's
    order."""
    dec, i = json.JSONDecoder(), 0
    out: list[dict[str, Any]] = []
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        ev, i = dec.raw_decode(text, i)
        out.append(ev)


def test_server_mode_the_vllm_server_is_ready_before_the_trainers(release: User) -> None:
    """spec.vllm.mode: server on CPU: the operator creates the vLLM server pod alone, says it waits for it, creates
    the trainers only once the server is Ready (/health); the trainers then stop with the documented permanent error
    (TRL's weight sync into the server needs CUDA), and the job fails with it, the server deleted with it."""
    user, tr, name = release, release.transcript, "srv"
    tr.note("server mode on CPU: the vLLM server first, the trainers once it is Ready")
    if user.json("get", "configmap", "tiny-model", "-n", NS) is None:  # this test run alone
        model_configmaps(user, NS)
    manifest = REPO / "out" / "journey" / "srv.yaml"
    manifest.write_text(yaml.safe_dump(server_job(name), sort_keys=False))
    tr.write(manifest.read_text())
    # the API server's own order of every change to the job's pods, from before the apply
    stream = manifest.with_name("srv-pods.watch.json")
    with open(stream, "w") as out:
        watch = subprocess.Popen([str(TOOLS / "kubectl"), "get", "pods", "-n", NS, "-l", f"grpo.dev/job-name={name}",
                                  "--watch", "--output-watch-events", "-o", "json"],
                                 env=user._env(), stdout=out, stderr=subprocess.STDOUT)
    followers: dict[str, subprocess.Popen[bytes]] = {}  # `kubectl logs -f` of each server pod, from its start
    server_log = manifest.with_name("srv-server.log")
    log_out = open(server_log, "w")  # the followers write to it until the finally below
    try:
        t_apply = time.monotonic()
        cp = user.kubectl("apply", "-n", NS, "-f", str(manifest))
        assert "spec.vllm.mode is server but the trainer pods request no GPU" in cp.stderr, cp.stderr  # the warning

        waits: list[tuple[Any, ...]] = []

        def trainers_created() -> list[dict[str, Any]] | None:
            items = (user.json("get", "pods", "-n", NS, "-l", f"grpo.dev/job-name={name}") or {}).get("items", [])
            servers = [p for p in items if p["metadata"]["labels"]["grpo.dev/role"] == "vllm-server"]
            trainers = [p for p in items if p["metadata"]["labels"]["grpo.dev/role"] == "trainer"]
            if trainers:  # one list: the server must be Ready in it
                assert len(servers) == 1 and ready_at(servers[0]), f"trainers before a Ready server: {items}"
                return items
            s = user.job_status(name, NS)
            for p in servers:  # follow the server's log from its start: a failed server is deleted within seconds
                if p["status"].get("phase") in ("Running", "Succeeded", "Failed") and p["metadata"]["name"] not in followers:
                    followers[p["metadata"]["name"]] = subprocess.Popen(
                        [str(TOOLS / "kubectl"), "logs", "-f", "-n", NS, p["metadata"]["name"]], env=user._env(),
                        stdout=log_out, stderr=subprocess.STDOUT)
                # a server that died on the way: say why (the operator would restart it)
                assert p["status"].get("phase") != "Failed", server_log.read_text()[-4000:]
            assert s.get("phase") != "Failed" and not s.get("restarts"), s
            running: dict[str, Any] = next((c for c in s.get("conditions") or [] if c["type"] == "Running"), {})
            if servers and servers[0]["status"].get("phase") == "Running" and not ready_at(servers[0]):
                seen = (s.get("phase"), running.get("status"), running.get("reason"), running.get("message"),
                        s.get("message"))
                if seen not in waits:
                    waits.append(seen)
                    tr.write(f"server Running, not Ready; status: {seen}")
            return None

        items = wait_for(trainers_created, 600, 0.5, what="the trainer pods (after the vLLM server is Ready)")
        t_trainers = time.monotonic() - t_apply
        # while the server started, the job said why it waited (the status is read just after the pods: a later
        # state may show up too)
        assert any(w[:3] == ("Pending", "False", "WaitingForVllmServer") and WAITING_READY.match(w[3] or "")
                   and w[3] == w[4] for w in waits), waits
        server = next(p for p in items if p["metadata"]["labels"]["grpo.dev/role"] == "vllm-server")
        user.kubectl("get", "pods", "-n", NS, "-l", f"grpo.dev/job-name={name}", "-o",
                     "custom-columns=NAME:.metadata.name,UID:.metadata.uid,ROLE:.metadata.labels.grpo\\.dev/role,"
                     "CREATED:.metadata.creationTimestamp,"
                     "READY_AT:.status.conditions[?(@.type==\"Ready\")].lastTransitionTime")
        user.kubectl("logs", "-n", NS, server["metadata"]["name"], "--tail=4")
        ready = ready_at(server)
        assert ready and server["metadata"]["creationTimestamp"] <= ready
        for p in items:  # RFC 3339 in UTC, 1 s resolution: the watch below orders within a second
            assert p is server or p["metadata"]["creationTimestamp"] >= ready, (p["metadata"], ready)
        tr.note(f"trainers created {t_trainers:.1f} s after apply; server {server['metadata']['name']} "
                f"({server['metadata']['uid']}) created {server['metadata']['creationTimestamp']}, Ready {ready}")

        def failed() -> dict[str, Any] | None:
            s = user.job_status(name, NS)
            return s if s.get("phase") == "Failed" else None

        final = wait_for(failed, 300, 1.0, what="the documented permanent failure of server mode on CPU")
        t_failed = time.monotonic() - t_apply
        user.kubectl("get", "grpojob", name, "-n", NS, "-o", "wide")
        cond = next(c for c in final["conditions"] if c["type"] == "Failed")
        trainers = sorted(p["metadata"]["name"] for p in items if p is not server)
        pod = cond["message"].split()[1]
        assert pod in trainers, (cond, trainers)
        detail = f"grpo_trainer: config error (exit 10): {SERVER_NEEDS_CUDA}"
        assert cond["status"] == "True" and cond["reason"] == "ConfigError", cond
        assert cond["message"].rstrip() == (f"pod {pod} exited with code 10 (config error): a permanent error "
                                            f"(configuration, data, import or batch); not retried: {detail}"), cond
        assert final["lastFailureReason"] == "ConfigError" and final.get("restarts", 0) == 0, final
        assert detail in logs(user, pod).splitlines(), logs(user, pod)[-3000:]
        # everything ends with a permanent trainer failure, the server included (docs/operator.md)
        wait_for(lambda: user.json("get", "pod", server["metadata"]["name"], "-n", NS) is None, 180, 1.0,
                 what="the vLLM server pod to be deleted with the failed job")
        user.kubectl("describe", "grpojob", name, "-n", NS)
    finally:
        for proc in (watch, *followers.values()):
            proc.terminate()
            proc.wait(10)
        log_out.close()

    # the watch: the server's Ready came before any trainer was created, in the API server's own order
    order = [(e["type"], e["object"]["metadata"]["name"], e["object"]["metadata"]["uid"],
              e["object"]["metadata"]["resourceVersion"], bool(ready_at(e["object"])))
             for e in watch_events(stream.read_text())]
    tr.write("watch (type, pod, uid, resourceVersion, Ready):\n" + "\n".join(map(str, order)))
    first_ready = next(i for i, e in enumerate(order) if e[1] == server["metadata"]["name"] and e[4])
    first_trainer = next(i for i, e in enumerate(order) if e[1] in trainers)
    assert order[0][:2] == ("ADDED", server["metadata"]["name"]) and first_ready < first_trainer, order
    tr.note(f"Failed {t_failed:.1f} s after apply: {cond['reason']}: {cond['message']}")
    user.kubectl("delete", "grpojob", name, "-n", NS, "--wait=true", "--timeout=60s")


# ------------------------------------------------------------------------------------- vLLM colocate mode in pods
def test_colocate_mode_generates_with_vllm_inside_the_pods(release: User) -> None:
    """spec.vllm.mode: colocate, what docs/trainer.md tells CPU users to run: every trainer process starts its own
    vLLM engine inside the pod (read-only root, non-root, the runtime's 64 MiB /dev/shm, the KV cache sized from the
    pod's memory limit) and the 2-node job trains to Succeeded."""
    user, tr, name, steps = release, release.transcript, "colo", 3
    tr.note("colocate mode on CPU: vLLM inside each trainer process, in the pods")
    if user.json("get", "configmap", "tiny-model", "-n", NS) is None:  # this test run alone
        model_configmaps(user, NS)
    job = tiny_job(name, max_steps=steps, save_steps=steps, memory="4Gi")
    job["spec"].pop("output")
    job["spec"]["vllm"] = {"mode": "colocate", "gpuMemoryUtilization": 0.25}  # 0.25 × 4Gi → a 1 GiB KV cache
    manifest = REPO / "out" / "journey" / "colo.yaml"
    manifest.write_text(yaml.safe_dump(job, sort_keys=False))
    tr.write(manifest.read_text())
    t_apply = time.monotonic()
    user.kubectl("apply", "-n", NS, "-f", str(manifest))

    def ended() -> dict[str, Any] | None:
        s = user.job_status(name, NS)
        return s if s.get("phase") in ("Succeeded", "Failed") else None

    final = wait_for(ended, 900, 2.0, what="the colocate job to end")
    user.kubectl("get", "grpojob", name, "-n", NS, "-o", "wide")
    pods = {p["metadata"]["name"]: p for p in pods_of(user, name)}
    rank0 = next(n for n, p in pods.items() if p["metadata"]["labels"].get("grpo.dev/node-rank") == "0")
    log = logs(user, rank0)
    assert final["phase"] == "Succeeded" and not final.get("restarts"), (final, log[-4000:])
    assert "grpo_trainer: generating with vLLM, colocate mode, on CPU (VLLM_CPU_KVCACHE_SPACE=1" in log, log[-4000:]
    records = [r for r in progress_records(log) if "step" in r]
    assert records and max(r["step"] for r in records) == steps, records
    tr.note(f"colocate: Succeeded {time.monotonic() - t_apply:.1f} s after apply, {steps} steps, vLLM in each pod")
    user.kubectl("delete", "grpojob", name, "-n", NS, "--wait=true", "--timeout=60s")


def test_upgrade_keeps_the_webhook_and_uninstall_strands_nothing(release: User) -> None:
    user, tr = release, release.transcript
    vwc = webhook_config_name()

    def ca_bundle() -> str | None:
        hooks = (user.json("get", "validatingwebhookconfiguration", vwc) or {}).get("webhooks") or []
        return hooks[0]["clientConfig"].get("caBundle") if hooks else None

    before = ca_bundle()
    assert before
    kept = start_long_job(user)
    tr.note("helm upgrade to an operator whose policy refuses the running job (policy.maxNodesPerJob=1); the new "
            "operator fills in the chart's (empty) webhook configuration again")
    t_upgrade = time.monotonic()
    user.helm("upgrade", RELEASE, str(CHART), "-n", OP_NAMESPACE, "--reuse-values", "--set", "logging.level=DEBUG",
              "--set", "policy.maxNodesPerJob=1", "--wait", "--timeout", "5m", timeout=400)
    # the new operator generates a new CA: wait for its configuration, not the old one's
    wait_for(lambda: ca_bundle() not in (None, before), 120, 0.5, what="the upgraded operator's webhook configuration")
    TIMINGS["upgrade_s"] = time.monotonic() - t_upgrade
    user.kubectl("get", "pods", "-n", OP_NAMESPACE, "-o", "wide")
    cp = user.kubectl("apply", "-n", NS, "-f", "examples/invalid-batch.yaml", check=False)
    assert cp.returncode != 0 and "denied the request" in cp.stderr, cp.stderr
    tr.note("a new 2-node job is refused by the upgraded webhook: spec.nodes over the limit")
    big = tiny_job("too-big", max_steps=2, save_steps=2)
    big["spec"].pop("output")
    cp = user.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(big), check=False)
    assert cp.returncode != 0 and "denied the request" in cp.stderr, cp.stderr
    assert "spec.nodes: 2 nodes" in cp.stderr and "at most 1" in cp.stderr and "policy.maxNodesPerJob" in cp.stderr, \
        cp.stderr
    assert user.json("get", "grpojob", "too-big", "-n", NS) is None
    keeps_training(user, *kept)
    # the refusal is not logged as an operator error
    log = user.kubectl("logs", "-n", OP_NAMESPACE, f"deployment/{RELEASE}-grpo-operator", quiet=True).stdout
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    refusals = [r for r in records if " refused: " in str(r.get("message", r.get("msg", "")))]
    assert refusals and all(r.get("levelname", r.get("level", "")).upper() == "INFO" for r in refusals), records[-5:]
    assert not [r for r in records if r.get("levelname", r.get("level", "")).upper() in ("ERROR", "CRITICAL")
                and "too-big" in json.dumps(r)], records[-5:]

    tr.note("a job that outlives the operator, then helm uninstall")
    survivor = tiny_job("survivor", max_steps=2, save_steps=2)
    survivor["spec"]["runPolicy"]["suspend"] = True
    survivor["spec"].pop("output")
    survivor["spec"]["nodes"] = 1  # within today's limit (a 2-node job that never started is refused)
    survivor["spec"]["training"]["perDeviceTrainBatchSize"] = 4
    user.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(survivor))
    wait_for(lambda: user.job_status("survivor", NS).get("phase") == "Suspended", 60, 0.5, what="survivor Suspended")
    user.helm("uninstall", RELEASE, "-n", OP_NAMESPACE, "--wait", "--timeout", "3m", timeout=300)
    for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
        assert user.json("get", kind, vwc) is None, f"{kind} {vwc} left behind by helm uninstall"
    assert user.json("get", "crd", "grpojobs.grpo.dev") is not None, "the CRD must stay (your jobs live in it)"
    assert user.json("get", "grpojob", "survivor", "-n", NS) is not None
    # no stale webhook refuses new jobs, and no finalizer strands the old one
    after = tiny_job("after-uninstall", max_steps=2, save_steps=2)
    after["spec"]["runPolicy"]["suspend"] = True
    after["spec"].pop("output")
    user.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(after))
    user.kubectl("delete", "grpojob", "survivor", "after-uninstall", "-n", NS, "--wait=true", "--timeout=30s")
    user.kubectl("get", "grpojobs,pods", "-n", NS)


# ------------------------------------------------- an upgrade that tightens a rule under a running job (issue 22)
LONG_STEPS = 1500  # 150-300 s at 0.1-0.2 s a step: outlasts the operator's rollout (10-63 s seen: the old pod's exit)


def start_long_job(user: User) -> tuple[str, dict[str, str]]:
    """A 2-node job that trains long enough to outlive the operator's upgrade: Running, first step logged."""
    tr = user.transcript
    tr.note(f"a 2-node job of {LONG_STEPS} steps, admitted under today's rules (no node limit)")
    if user.json("get", "configmap", "tiny-model", "-n", NS) is None:  # the first test makes them; not when run alone
        model_configmaps(user, NS)
    job = tiny_job("kept", max_steps=LONG_STEPS, save_steps=LONG_STEPS)
    job["spec"].pop("output")  # no checkpoints: what is asserted is that its pods are never replaced
    user.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(job))

    def training() -> dict[str, str] | None:
        ps = pods_of(user, "kept", 0)
        if len(ps) != 2 or any(p["status"].get("phase") != "Running" for p in ps):
            return None
        logged = any(progress_records(logs(user, p["metadata"]["name"])) for p in ps)
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in ps} if logged else None

    uids = wait_for(training, 300, 0.5, what="kept: both pods Running and a first training step")
    tr.note(f"kept is training; pods {json.dumps(uids)}")
    return "kept", uids


def keeps_training(user: User, name: str, uids: dict[str, str]) -> None:
    """The job the new rule refuses: SpecInvalid=True naming the rule and a Warning event, while it trains on in the
    same pods to Succeeded."""
    tr = user.transcript

    def spec_invalid() -> dict[str, Any] | None:
        s = user.job_status(name, NS)
        return next((c for c in s.get("conditions") or [] if c["type"] == "SpecInvalid" and c["status"] == "True"),
                    None)

    c = wait_for(spec_invalid, 120, 0.5, what=f"{name}: condition SpecInvalid=True from the upgraded operator")
    assert "spec.nodes" in c["message"] and "at most 1" in c["message"] and "keeps going" in c["message"], c
    rank0 = next((n for n in uids if progress_records(logs(user, n))), None)
    assert rank0 is not None
    step_then = progress_records(logs(user, rank0))[-1]["step"]
    st = user.job_status(name, NS)
    tr.note(f"{name}: SpecInvalid=True at step {step_then}, phase {st.get('phase')}: {c['message']}")
    assert st.get("phase") == "Running" and step_then < LONG_STEPS, (st.get("phase"), step_then)
    events = (user.json("get", "events", "-n", NS, "--field-selector",
                        f"involvedObject.name={name},reason=SpecInvalid") or {}).get("items", [])
    assert any(e["type"] == "Warning" and "spec.nodes" in e["message"] for e in events), events
    user.kubectl("get", "events", "-n", NS, "--field-selector", f"involvedObject.name={name},reason=SpecInvalid")

    def finished() -> dict[str, Any] | None:
        s = user.job_status(name, NS)
        if s.get("phase") in ("Failed", "Rejected"):
            raise AssertionError(f"{name} did not keep training: {json.dumps(s)[:3000]}")
        return s if s.get("phase") == "Succeeded" else None

    final = wait_for(finished, 900, 1.0, what=f"{name} Succeeded")
    user.kubectl("get", "grpojob", name, "-n", NS, "-o", "wide")
    now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods_of(user, name)}
    tr.note(f"{name}: Succeeded, restarts {final.get('restarts', 0)}; pods {json.dumps(now)}")
    assert now == uids, (uids, now)  # the same two pods trained from before the upgrade to the end
    assert not final.get("restarts"), final
    steps = [r["step"] for r in progress_records(logs(user, rank0))]
    assert steps[-1] == LONG_STEPS and step_then < steps[-1], (step_then, steps[-3:])
    assert any(c["type"] == "SpecInvalid" and c["status"] == "True" for c in final.get("conditions") or []), final
    user.kubectl("delete", "grpojob", name, "-n", NS, "--wait=true", "--timeout=60s")
