"""spec.cache in render: the initializer pod (render/initializer.py) and the cache in trainer/vLLM pods; without
spec.cache nothing changes."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from grpo_operator import api
from grpo_operator.render import cache, initializer, manifests
from grpo_operator.render import job as render_job
from grpo_operator.rules import validation
from grpo_trainer import contract

CACHE = {"volumeClaimName": "hf-cache", "subPath": "hub"}


def job_doc(cache_spec: dict | None = CACHE, *, model="org/tiny",
            dataset="org/data", mode="none") -> dict:
    spec = {"model": model, "dataset": {"name": dataset}, "rewards": [{"name": "accuracy"}],
            "vllm": {"mode": mode}, "hfTokenSecretRef": {"name": "hf", "key": "token"},
            "template": {"env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]},
            "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 2}}
    if mode == "server":
        spec["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    if cache_spec is not None:
        spec["cache"] = dict(cache_spec)
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "job"}, "spec": spec}


def validated(doc: dict):
    res = validation.validate(doc)
    assert res.valid, res.summary()
    return res


def _env(container: dict) -> dict:
    return {e["name"]: e for e in container["env"]}


def test_initializer_pod():
    res = validated(job_doc())
    [pod] = initializer.render_initializer(res.job, "ns", uid="u", image="img:1")
    for version in ("1.29", "1.37"):
        kubernetes_validate.validate(pod, version, strict=True)
    assert pod["metadata"]["name"] == "job-stage"
    assert pod["metadata"]["labels"][contract.LABEL_ROLE] == contract.ROLE_INITIALIZER == "initializer"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [c] = spec["containers"]
    assert c["image"] == "img:1" and c["command"] == ["python", "-m", "grpo_trainer.stage"]
    # its live progress on the trainers' metrics port (GET /progress), which the operator scrapes while it downloads
    assert c["args"] == ["--config", contract.CONFIG_FILE, "--progress-port", str(contract.METRICS_PORT)]
    assert c["ports"] == [{"name": contract.METRICS_PORT_NAME, "containerPort": contract.METRICS_PORT,
                           "protocol": "TCP"}]
    [off] = initializer.render_initializer(res.job, "ns", metrics_port=0)  # the operator's --trainer-metrics-port 0
    assert off["spec"]["containers"][0]["args"] == ["--config", contract.CONFIG_FILE]
    assert "ports" not in off["spec"]["containers"][0]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    env = _env(c)
    assert env["HF_HOME"]["value"] == cache.CACHE_DIR
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert env["HTTPS_PROXY"]["value"] == "http://proxy:3128"
    assert not set(cache.OFFLINE_ENV) & set(env)  # the one pod that reaches the Hub
    mount = next(m for m in c["volumeMounts"] if m["name"] == cache.CACHE_VOLUME)
    assert mount == {"name": "hf-cache", "mountPath": "/hf-cache", "subPath": "hub"}  # read-write
    vol = next(v for v in spec["volumes"] if v["name"] == cache.CACHE_VOLUME)
    assert vol["persistentVolumeClaim"] == {"claimName": "hf-cache"}
    assert next(v for v in spec["volumes"] if v["name"] == "config")["configMap"]["name"] == "job-config"


@pytest.mark.parametrize("mode", ["none", "server"])
def test_trainer_and_vllm_pods_read_the_cache_offline(mode):
    res = validated(job_doc(mode=mode))
    objs = render_job.render(res.job, res.topology, "ns", uid="u")
    # render() is the whole truth: the download pod is in it, right after the ConfigMap and the Service
    assert objs[2] == initializer.render_initializer(res.job, "ns", uid="u")[0]
    pods = [o for o in objs if o["kind"] == "Pod" and o["metadata"]["labels"][contract.LABEL_ROLE] != "initializer"]
    assert {p["metadata"]["labels"][contract.LABEL_ROLE] for p in pods} == \
        ({"trainer", "vllm-server"} if mode == "server" else {"trainer"})
    for pod in pods:
        kubernetes_validate.validate(pod, "1.37", strict=True)
        [c] = pod["spec"]["containers"]
        env = _env(c)
        assert all(env[k]["value"] == "1" for k in cache.OFFLINE_ENV)
        assert env["HF_HUB_CACHE"]["value"] == "/hf-cache/hub" and env["HF_DATASETS_CACHE"]["value"] == "/hf-datasets"
        mounts = [m for m in c["volumeMounts"] if m["name"] == cache.CACHE_VOLUME]
        assert mounts == [{"name": "hf-cache", "mountPath": "/hf-cache", "readOnly": True, "subPath": "hub"},
                          {"name": "hf-cache", "mountPath": "/hf-datasets", "subPath": "hub/datasets"}]
        assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}} in pod["spec"]["volumes"]


def test_without_subpath_the_claim_root_is_the_cache():
    res = validated(job_doc({"volumeClaimName": "c"}))
    [pod] = initializer.render_initializer(res.job, "ns")
    assert "subPath" not in next(m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "hf-cache")
    trainer = next(o for o in render_job.render(res.job, res.topology, "ns")
                   if o["kind"] == "Pod" and o["metadata"]["labels"][contract.LABEL_ROLE] == "trainer")
    mounts = [m for m in trainer["spec"]["containers"][0]["volumeMounts"] if m["name"] == "hf-cache"]
    assert [m.get("subPath") for m in mounts] == [None, "datasets"]


def test_without_cache_nothing_changes():
    with_cache = validated(job_doc())
    without = validated(job_doc(None))
    assert initializer.render_initializer(without.job, "ns") == []
    objs = manifests.core_objects(without.job, without.topology, "ns", uid="u")
    env = _env(next(o for o in objs if o["kind"] == "Pod")["spec"]["containers"][0])
    assert env["HF_HOME"]["value"] == "/tmp/hf-home" and not set(cache.OFFLINE_ENV) & set(env)
    # the same job with the cache differs only by the cache's volume, mounts and env, and the token it no longer needs
    for o in objs:
        if o["kind"] == "Pod":
            o["spec"]["containers"][0]["env"] = [e for e in o["spec"]["containers"][0]["env"] if e["name"] != "HF_TOKEN"]
    cached = render_job.render(with_cache.job, with_cache.topology, "ns", uid="u")
    assert cached.pop(2)["metadata"]["labels"][contract.LABEL_ROLE] == "initializer"
    stripped = copy.deepcopy(cached)
    for o in stripped:
        if o["kind"] == "Pod":
            o["spec"]["volumes"] = [v for v in o["spec"]["volumes"] if v["name"] != "hf-cache"]
            c = o["spec"]["containers"][0]
            c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "hf-cache"]
            c["env"] = [e for e in c["env"] if e["name"] not in {"HF_HUB_CACHE", "HF_DATASETS_CACHE", *cache.OFFLINE_ENV}]
    assert stripped == objs


@pytest.mark.parametrize("model, dataset, needed", [
    ("org/tiny", "org/data", True),
    ("/models/tiny", "org/data", True),
    ("org/tiny", "/data/train.jsonl", True),
    ("gpt2", "/data/train.jsonl", True),                       # a Hub id without a namespace
    ("/models/tiny", "/data/train.jsonl", False),              # paths in the pod: no download pod
    ("./models/tiny", "examples/local-tiny/data/a.jsonl", False),
])
def test_local_paths_need_no_initializer(model, dataset, needed):
    res = validated(job_doc(model=model, dataset=dataset))
    assert cache.needs_initializer(res.job) is needed
    assert len(initializer.render_initializer(res.job, "ns")) == int(needed)


@pytest.mark.parametrize("bad, field", [
    ({"subPath": "hub"}, "volumeClaimName"),
    ({"volumeClaimName": "Not_A_Name"}, "volumeClaimName"),
    ({"volumeClaimName": "c", "subPath": "../etc"}, "subPath"),
    ({"volumeClaimName": "c", "subPath": "/abs"}, "subPath"),
    ({"volumeClaimName": "c", "subPath": "a/../b"}, "subPath"),
    ({"volumeClaimName": "c", "size": "10Gi"}, "size"),
])
def test_cache_validation(bad, field):
    res = validation.validate(job_doc(bad))
    assert not res.valid
    assert any(field in e.field and e.field.startswith("spec.cache") for e in res.errors), res.summary()


def test_crd_has_the_cache_with_descriptions():
    from grpo_operator.api import crd

    text = crd.crd_yaml()
    assert "cache:" in text and "docs/cache.md" in text


def _pods(objs: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["labels"][contract.LABEL_ROLE]: o["spec"]["containers"][0] for o in objs if o["kind"] == "Pod"}


def test_readers_get_no_hf_token_only_the_download_pod_does():
    """Issue 27, Low: trainers received HF_TOKEN while offline. With spec.cache the trainers and the vLLM server read
    the cache offline and need no token: only the download pod gets it; a token the user sets in template.env stays."""
    res = validated(job_doc(mode="server"))
    pods = _pods(render_job.render(res.job, res.topology, "ns"))
    assert "HF_TOKEN" in _env(pods["initializer"])
    assert "HF_TOKEN" not in _env(pods["trainer"]) and "HF_TOKEN" not in _env(pods["vllm-server"])
    without = validated(job_doc(None))
    assert "HF_TOKEN" in _env(_pods(render_job.render(without.job, without.topology, "ns"))["trainer"])
    doc = job_doc()
    own = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "trackio", "key": "token"}}}
    doc["spec"]["template"]["env"].append(own)
    mine = validated(doc)
    assert _env(_pods(render_job.render(mine.job, mine.topology, "ns"))["trainer"])["HF_TOKEN"] == own


MAIN, OTHER, DATA = "a" * 40, "b" * 40, "c" * 40


def test_trainers_and_vllm_load_the_commits_staging_recorded():
    """Issue 27, item 8: trainers loaded refs/main, which another job's staging moves. The commits in
    status.stagedRevisions reach the trainer (contract.STAGED_REVISIONS_ENV) and the vLLM server (--revision and
    --tokenizer-revision, replacing the branch the spec named)."""
    import json

    doc = job_doc(mode="server")
    doc["spec"]["training"]["modelInitKwargs"] = {"revision": "main"}
    res = validated(doc)
    staged = [api.StagedRevision(kind="model", repo="org/tiny", revision="main", commit=MAIN),
              api.StagedRevision(kind="dataset", repo="org/data", revision="main", commit=DATA)]
    pods = _pods(render_job.render(res.job, res.topology, "ns", staged=staged))
    value = json.loads(_env(pods["trainer"])[contract.STAGED_REVISIONS_ENV]["value"])
    assert value == [{"kind": "model", "repo": "org/tiny", "commit": MAIN},
                     {"kind": "dataset", "repo": "org/data", "commit": DATA}]
    args = pods["vllm-server"]["args"]
    assert args[args.index("--revision") + 1] == args[args.index("--tokenizer-revision") + 1] == MAIN
    assert args.count("--revision") == 1 and "main" not in args
    assert contract.STAGED_REVISIONS_ENV not in _env(pods["initializer"])
    # staged by an older operator (nothing recorded), or no spec.cache: the spec's revision, as before
    for job, recorded in ((res, []), (validated(job_doc(None, mode="server")), staged)):
        pods = _pods(render_job.render(job.job, job.topology, "ns", staged=recorded))
        assert contract.STAGED_REVISIONS_ENV not in _env(pods["trainer"])
        assert MAIN not in pods["vllm-server"]["args"]
