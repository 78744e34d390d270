"""spec.cache on the real control plane (kube-apiserver + GC + the real operator process): the download pod first, the
trainers only after it Succeeded, no second download pod after a gang restart, a permanent Hub error fails the job,
and the download's progress in the job's status while it runs. The test plays the kubelet through pods/status
(tests/support/operator.py); a download pod it reports Running has 127.0.0.1 as its IP, where the test serves the
pod's progress endpoint with the trainer image's own code (grpo_trainer/stage.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from grpo_trainer import contract, stage
from tests.support.cluster.util import free_port, wait_until
from tests.support.jobs import manifest
from tests.support.operator import OperatorProcess, get_job, pod_exit, pod_running, pods_of, wait_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
PROGRESS_PORT = free_port()  # the operator's --trainer-metrics-port: where the download pod serves its progress


@pytest.fixture(scope="module")
def operator_process(crd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The operator as tests/support/operator.py starts it, scraping every second on a free metrics port."""
    op = OperatorProcess(crd.kubeconfig, tmp_path_factory.mktemp("operator"), "--all-namespaces", "--json-logs",
                         "--progress-interval", "1", "--trainer-metrics-port", str(PROGRESS_PORT), webhook=True,
                         env={"GRPO_FORCE_DELETE_AFTER_SECONDS": "2"})
    op.start()
    try:
        yield op
    finally:
        op.stop()

DONE = contract.STAGE_PREFIX + json.dumps({"event": "done", "staged": ["model Qwen/Qwen2.5-0.5B-Instruct@main"],
                                           "cached": [], "bytes": 2_000_000, "seconds": 4.2})


def cond(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == ctype), {})


def cached(name: str) -> dict[str, Any]:
    m = manifest(name, nodes=2)
    m["spec"]["cache"] = {"volumeClaimName": "hf-cache"}
    return m


def by_role(k: Any, ns: str, job: str) -> dict[str, list[dict[str, Any]]]:
    roles: dict[str, list[dict[str, Any]]] = {}
    for p in pods_of(k, ns, job):
        if not p["metadata"].get("deletionTimestamp"):
            roles.setdefault(p["metadata"]["labels"][contract.LABEL_ROLE], []).append(p)
    return roles


def wait_trainers(k: Any, ns: str, job: str, attempt: int) -> list[dict[str, Any]]:
    def check() -> Any:
        t = by_role(k, ns, job).get(contract.ROLE_TRAINER, [])
        ok = len(t) == 2 and all(p["metadata"]["annotations"]["grpo.dev/attempt"] == str(attempt) for p in t)
        return t if ok else None

    return wait_until(check, 30, 0.2, what=f"2 trainer pods of {job} at attempt {attempt}")


def test_download_pod_before_trainers_and_never_again_after_a_gang_restart(operator_process, kubectl,
                                                                            k8s_namespace) -> None:
    k, ns = kubectl, k8s_namespace
    k.apply(cached("stg"), "-n", ns)
    st = wait_job(k, ns, "stg", lambda s: cond(s, "Staged").get("reason") == "Staging")["status"]
    assert st["phase"] == "Pending" and cond(st, "Staged")["status"] == "False"
    assert k.exists("configmap", "stg-config", "-n", ns)  # what the download pod mounts, created first
    [stage] = wait_until(lambda: by_role(k, ns, "stg").get(contract.ROLE_INITIALIZER), 30, 0.2,
                         what="the download pod")
    assert stage["metadata"]["name"] == "stg-stage"
    pod_running(k, ns, "stg-stage")
    st = wait_job(k, ns, "stg", lambda s: "downloading" in cond(s, "Staged").get("message", ""))["status"]
    assert st["phase"] == "Pending" and st["message"] == cond(st, "Staged")["message"]
    assert "Pending" in k("get", "grpojob", "stg", "-n", ns).stdout  # what `kubectl get grpojobs` shows
    assert set(by_role(k, ns, "stg")) == {contract.ROLE_INITIALIZER}  # no trainer while it downloads

    pod_exit(k, ns, "stg-stage", 0, message=DONE)
    trainers = wait_trainers(k, ns, "stg", 0)
    st = wait_job(k, ns, "stg", lambda s: cond(s, "Staged").get("status") == "True")["status"]
    assert "2.0 MB in 4.2 s" in cond(st, "Staged")["message"]
    for p in trainers:
        pod_running(k, ns, p["metadata"]["name"])
    wait_job(k, ns, "stg", lambda s: s.get("phase") == "Running")

    # a gang restart: new trainer pods, the same (finished) download pod, no second one
    pod_exit(k, ns, "stg-node-1", 143)
    wait_trainers(k, ns, "stg", 1)
    st = wait_job(k, ns, "stg", lambda s: s.get("restarts") == 1 and s.get("phase") == "Pending")["status"]
    assert cond(st, "Staged")["status"] == "True"
    [again] = by_role(k, ns, "stg")[contract.ROLE_INITIALIZER]
    assert again["metadata"]["uid"] == stage["metadata"]["uid"] and again["status"]["phase"] == "Succeeded"

    def staged_event() -> Any:  # the download's time, posted in the background
        evs = k.json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=stg")["items"]
        return [e for e in evs if e["reason"] == "Staged"] or None

    assert "4.2 s" in wait_until(staged_event, 30, 0.5, what="the Staged event")[0]["message"]


def test_permanent_hub_error_fails_the_job(operator_process, kubectl, k8s_namespace) -> None:
    k, ns = kubectl, k8s_namespace
    k.apply(cached("gated"), "-n", ns)
    wait_until(lambda: by_role(k, ns, "gated").get(contract.ROLE_INITIALIZER), 30, 0.2, what="the download pod")
    pod_exit(k, ns, "gated-stage", contract.HUB_DENIED,
             message="401 Client Error: Access to model Qwen/Qwen2.5-0.5B-Instruct is restricted")
    st = wait_job(k, ns, "gated", lambda s: s.get("phase") == "Failed")["status"]
    assert st["lastFailureReason"] == "HubAccessDenied" and cond(st, "Failed")["reason"] == "HubAccessDenied"
    assert "is restricted" in cond(st, "Failed")["message"]
    assert cond(st, "Staged")["reason"] == "HubAccessDenied"
    # no trainer ever; the failed download pod stays for `kubectl logs`
    assert set(by_role(k, ns, "gated")) == {contract.ROLE_INITIALIZER}
    assert get_job(k, ns, "gated")["status"]["phase"] == "Failed"


def test_the_download_progress_moves_in_the_status_while_the_pod_runs(operator_process, kubectl,
                                                                      k8s_namespace) -> None:
    k, ns = kubectl, k8s_namespace
    k.apply(cached("prg"), "-n", ns)
    [pod] = wait_until(lambda: by_role(k, ns, "prg").get(contract.ROLE_INITIALIZER), 30, 0.2, what="the download pod")
    [c] = pod["spec"]["containers"]
    assert c["args"][-2:] == ["--progress-port", str(PROGRESS_PORT)] and c["ports"][0]["name"] == "metrics"
    server = stage.serve_progress(PROGRESS_PORT)
    assert server is not None
    try:
        pod_running(k, ns, "prg-stage")
        k.patch_status("pod", "prg-stage", {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}, "-n", ns)
        item = "model Qwen/Qwen2.5-0.5B-Instruct@main"
        for done, files in ((120_000_000, 2), (980_000_000, 5)):
            stage.emit({"event": "progress", "item": item, "bytes": done, "totalBytes": 988_000_000, "files": files,
                        "totalFiles": 6}, out=lambda line: None)
            want = f"downloading {item}: {done / 1e6:.1f} MB / 988.0 MB, {files}/6 files"
            st = wait_job(k, ns, "prg", lambda s, want=want: cond(s, "Staged").get("message") == want,
                          what=want)["status"]
            assert st["phase"] == "Pending" and st["message"] == want
            assert want in k("get", "grpojob", "prg", "-n", ns, "-o", "wide").stdout  # the MESSAGE column
    finally:
        server.shutdown()
        server.server_close()
    pod_exit(k, ns, "prg-stage", 0, message=DONE)
    wait_job(k, ns, "prg", lambda s: cond(s, "Staged").get("status") == "True")

    def staged_event() -> Any:
        evs = k.json("get", "events", "-n", ns, "--field-selector", "involvedObject.name=prg")["items"]
        return [e for e in evs if e["reason"] == "Staged"] or None

    assert wait_until(staged_event, 30, 0.5, what="the Staged event")[0]["message"].startswith(
        "Staged in 4.2 s (2.0 MB): staged model Qwen/Qwen2.5-0.5B-Instruct@main")


def pinned_job(name: str, revision: str | None = None, server: bool = False) -> dict[str, Any]:
    m = manifest(name, nodes=2, vllm_server=server)
    m["spec"].update(model="org/moving", cache={"volumeClaimName": "hf-cache"},
                     dataset={"name": "org/rows", "promptColumn": "question", "answerColumn": "answer"})
    if revision:
        m["spec"]["training"]["modelInitKwargs"] = {"revision": revision}
    return m


def test_jobs_staging_one_repo_while_main_moves_record_and_load_their_own_commits(operator_process, kubectl,
                                                                                   k8s_namespace, tmp_path) -> None:
    """Issue 27, item 8, on the real control plane with the Hub emulator: job A stages `main`; while its weights
    download, `main` moves; job B (vLLM server mode) then stages `main` and job C the tag `v1`, all into one cache.
    The test plays each download pod with the real stage process on the job's own ConfigMap, and reports its exit
    with the termination message it wrote. Each job's status.stagedRevisions names the commits its staging resolved,
    its trainer pods (and B's vLLM server) get exactly those, and loading with a pod's environment, offline, reads
    that commit's model and dataset, whatever `main` says by then."""
    from tests.support.hub import HubEmulator
    from tests.support.stage_runs import ROWS, StageRun, env_for, model_files

    k, ns = kubectl, k8s_namespace
    hub = HubEmulator()
    m1 = hub.add_model("org/moving", model_files("m1"))
    v1 = hub.add_model("org/moving", model_files("v1"), ref="v1")
    d1 = hub.add_dataset("org/rows", {"data/train.jsonl": b"".join(ROWS)})
    home = tmp_path / "cache"

    def start(job: str) -> StageRun:
        wait_until(lambda: by_role(k, ns, job).get(contract.ROLE_INITIALIZER), 30, 0.2, what=f"{job}'s download pod")
        pod_running(k, ns, f"{job}-stage")
        config = tmp_path / job / "config.json"
        config.parent.mkdir()
        config.write_text(k.json("get", "configmap", f"{job}-config", "-n", ns)["data"]["config.json"])
        return StageRun(config, env_for(hub, home), tmp_path / job / "termination")

    k.apply(pinned_job("pin-a"), "-n", ns)
    k.apply(pinned_job("pin-c", "v1"), "-n", ns)
    hold = hub.hold("model.safetensors")
    with hub:
        try:
            runs = {"pin-a": start("pin-a")}
            hold.arrived.wait(120)
            assert runs["pin-a"].wait_for(lambda r: r.get("event") == "start")["commit"] == m1
            m2 = hub.add_model("org/moving", model_files("m2"))  # main moves (the dataset too)
            hub.add_dataset("org/rows", {"data/train.jsonl": b"".join(ROWS[:32])})
            k.apply(pinned_job("pin-b", server=True), "-n", ns)
            runs |= {"pin-b": start("pin-b"), "pin-c": start("pin-c")}
            assert runs["pin-b"].wait_for(lambda r: r.get("event") == "start")["commit"] == m2
            assert runs["pin-c"].wait_for(lambda r: r.get("event") == "start")["commit"] == v1
        finally:
            hold.release()
        done = {job: run.finish() for job, run in runs.items()}
    assert [next(r["commit"] for r in done[j]["revisions"] if r["kind"] == "model")
            for j in ("pin-a", "pin-b", "pin-c")] == [m1, m2, v1]
    envs = {}
    for job in done:
        pod_exit(k, ns, f"{job}-stage", 0, message=(tmp_path / job / "termination").read_text().strip())
        st = wait_job(k, ns, job, lambda s: s.get("stagedRevisions"), what="status.stagedRevisions")["status"]
        assert st["stagedRevisions"] == done[job]["revisions"]
        pinned = [{"kind": r["kind"], "repo": r["repo"], "commit": r["commit"]} for r in done[job]["revisions"]]
        role = contract.ROLE_VLLM if job == "pin-b" else contract.ROLE_TRAINER
        pods = wait_until(lambda job=job, role=role: by_role(k, ns, job).get(role), 30, 0.2, what=f"{job}'s {role}")
        for p in pods:
            [c] = p["spec"]["containers"]
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert json.loads(env[contract.STAGED_REVISIONS_ENV]) == pinned and "HF_TOKEN" not in env
            if role == contract.ROLE_VLLM:
                assert c["args"][c["args"].index("--revision") + 1] == pinned[0]["commit"]
        envs[job] = env[contract.STAGED_REVISIONS_ENV]
    # what each job's pods load, offline, with their own environment's commits (the trainer's loading code)
    probe = ("import json, sys\nfrom transformers import AutoConfig\nfrom grpo_trainer import data, pins\n"
             "from grpo_trainer.config import DatasetSpec\nout = {}\n"
             "for job, value in json.loads(sys.argv[1]).items():\n"
             "    p = pins.parse(value)\n"
             "    mark = AutoConfig.from_pretrained('org/moving', revision=pins.model_revision(p, 'org/moving'))"
             ".grpo_test_mark\n"
             "    ds = data.load_dataset(DatasetSpec(name='org/rows'), pins.dataset_cache_dir(p, 'org/rows'))\n"
             "    out[job] = [mark, len(ds)]\n"
             "print(json.dumps(out))")
    env = {**os.environ, "HF_HOME": str(tmp_path / "pod-home"), "HF_HUB_CACHE": str(home / "hub"),
           "HF_DATASETS_CACHE": str(home / "datasets"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", probe, json.dumps(envs)], capture_output=True, text=True, timeout=300,
                       env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {job: 64 if next(r["commit"] for r in done[job]["revisions"] if r["kind"] == "dataset") == d1 else 32
            for job in done}
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"pin-a": ["m1", rows["pin-a"]],
                                                             "pin-b": ["m2", 32], "pin-c": ["v1", 32]}
