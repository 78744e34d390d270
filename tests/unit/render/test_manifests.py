"""Rendered objects: valid for Kubernetes 1.29 and 1.37, argv = topology, no shell, deterministic, short names."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_operator import api
from grpo_operator.render import manifests
from grpo_operator.rules import validation

K8S_VERSIONS = ["1.29", "1.37"]
HOSTILE = ["$(reboot)", "`id`", "a;rm -rf /", "x' || true", "\"; exit 1", "$HOME", "a&&b", "a|b", "*", "~/x",
           "../../etc/passwd", "模型/ünï", "%s%n", "{{.Values}}", "a\\b", "'", "\""]


def job_doc(name="job", nodes=1, gpus=4, mode="colocate", tp=1, **spec_extra):
    spec = {
        "model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": {"name": "openai/gsm8k"},
        "rewards": [{"name": "accuracy"}], "nodes": nodes,
        "resources": {"limits": {"nvidia.com/gpu": gpus}} if gpus else {},
        "vllm": {"mode": mode, "tensorParallelSize": tp},
        "training": {"perDeviceTrainBatchSize": 4, "numGenerations": 4},
        **spec_extra,
    }
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": spec}


def render(doc, namespace="team-a", uid="0b4b6f6e-8c1e-4a61-9f55-2c3f4f0e9b11"):
    res = validation.validate(doc)
    assert res.valid, res.summary()
    return manifests.core_objects(res.job, res.topology, namespace, uid=uid)


names = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,120}[a-z0-9])?", fullmatch=True).filter(
    lambda n: ".." not in n and "-." not in n and ".-" not in n)
refs = st.one_of(st.sampled_from(HOSTILE),
                 st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp")), min_size=1, max_size=80)
                 .filter(lambda s: not s.startswith("-") and not any(c.isspace() for c in s)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=names, nodes=st.integers(1, 5), gpus=st.sampled_from([0, 1, 2, 4, 8]),
       mode=st.sampled_from(["colocate", "server", "none"]), model=refs, dataset=refs)
def test_every_accepted_spec_renders_valid_kubernetes_objects(name, nodes, gpus, mode, model, dataset):
    doc = job_doc(name=name, nodes=nodes, gpus=gpus, mode=mode if gpus else "none")
    doc["spec"]["model"] = model
    doc["spec"]["dataset"]["name"] = dataset
    res = validation.validate(doc)
    if not res.valid:
        # Only the batch rule, or a reference with whitespace, may refuse these generated specs.
        for e in res.errors:
            if e.field in ("spec.model", "spec.dataset.name"):
                value = model if e.field == "spec.model" else dataset
                assert any(c.isspace() for c in value), res.summary()
            else:
                assert e.field.startswith(("spec.training", "spec.vllm")), res.summary()
        return
    objs = manifests.core_objects(res.job, res.topology, "ns-1", uid="uid-1")
    for obj in objs:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    pods = [o for o in objs if o["kind"] == "Pod" and o["metadata"]["labels"][manifests.LABEL_ROLE] == "trainer"]
    assert len(pods) == nodes
    base = manifests.names(name).base
    for _rank, pod in enumerate(pods):
        argv = pod["spec"]["containers"][0]["command"] + pod["spec"]["containers"][0]["args"]
        assert argv[:3] == ["python", "-m", "grpo_trainer.launch"]  # torchrun, exiting with the trainer's code
        # no --node-rank: c10d ignores it and ranks follow host names (pod node-N is not rank N)
        assert f"--nnodes={nodes}" in argv and not any(a.startswith("--node-rank") for a in argv)
        assert f"--nproc-per-node={res.topology.nproc_per_node}" in argv
        assert f"--rdzv-endpoint={base}-node-0.{base}:{manifests.C10D_PORT}" in argv
        # User strings never reach argv: they travel only inside the config JSON.
        assert model not in argv and dataset not in argv
        assert all(len(label) <= 63 for label in pod["metadata"]["labels"].values())
        assert len(pod["spec"]["hostname"]) <= 63 and pod["spec"]["subdomain"] == base
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    config = json.loads(cm["data"]["config.json"])
    assert config["model"] == model and config["dataset"]["name"] == dataset


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_strings_are_data_not_commands(hostile):
    doc = job_doc()
    doc["spec"]["model"] = hostile
    doc["spec"]["dataset"]["name"] = hostile
    doc["spec"]["template"] = {"env": [{"name": "NOTE", "value": hostile}]}
    res = validation.validate(doc)
    if any(c.isspace() for c in hostile):
        assert {e.field for e in res.errors} == {"spec.model", "spec.dataset.name"}
        return
    objs = render(doc)
    for obj in objs:
        if obj["kind"] != "Pod":
            continue
        container = obj["spec"]["containers"][0]
        assert container["command"] == manifests.LAUNCHER
        assert "sh" not in container["command"] and "-c" not in container["args"]
        assert hostile not in container["args"]
        assert {"name": "NOTE", "value": hostile} in container["env"]


def test_vllm_server_argv_keeps_model_as_one_element():
    doc = job_doc(mode="server", tp=2, gpus=4)
    doc["spec"]["model"] = "org/model;echo-x"
    objs = render(doc)
    vllm = next(o for o in objs if o["metadata"]["name"].endswith("-vllm-0"))
    c = vllm["spec"]["containers"][0]
    assert c["command"] == ["vllm"] and c["args"][:2] == ["serve", "org/model;echo-x"]
    assert "--tensor-parallel-size" in c["args"] and c["args"][c["args"].index("--tensor-parallel-size") + 1] == "2"
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in c["env"]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "2"}  # default: tensorParallelSize GPUs
    cm = json.loads(next(o for o in objs if o["kind"] == "ConfigMap")["data"]["config.json"])
    assert cm["vllm"]["serverHost"] == "job-vllm.team-a.svc"


def test_pod_shape():
    doc = job_doc(nodes=2, gpus=8, hfTokenSecretRef={"name": "hf", "key": "tok"},
                  output={"volumeClaimName": "ckpt", "path": "/ckpt"})
    doc["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q1"}
    objs = render(doc)
    assert [o["kind"] for o in objs] == ["ConfigMap", "Service", "Pod", "Pod"]
    svc = objs[1]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    pod = objs[3]
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["hostname"] == "job-node-1" and spec["subdomain"] == "job"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = spec["containers"][0]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "tok"}}}
    assert env["PYTHONUNBUFFERED"]["value"] == "1" and env["OMP_NUM_THREADS"]["value"] == "1"
    # no HEAD to s3.amazonaws.com from datasets at each start (tests/unit/trainer/test_trainer_no_download_count.py)
    assert env["HF_UPDATE_DOWNLOAD_COUNTS"]["value"] == "0" and env["HF_HUB_DISABLE_TELEMETRY"]["value"] == "1"
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q1"
    assert pod["metadata"]["labels"][manifests.LABEL_RANK] == "1"
    owner = pod["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "GRPOJob" and owner["controller"] is True
    assert {"name": "output", "persistentVolumeClaim": {"claimName": "ckpt"}} in spec["volumes"]
    assert any(v["name"] == "dshm" and v["emptyDir"]["medium"] == "Memory" for v in spec["volumes"])
    # The same spec always renders the same bytes.
    assert json.dumps(objs, sort_keys=True) == json.dumps(render(doc), sort_keys=True)


def test_long_and_odd_names_are_shortened_deterministically():
    long = "a" * 200 + ".x"
    n1, n2 = manifests.names(long), manifests.names(long)
    assert n1 == n2 and len(n1.pod(1023)) <= 63 and len(n1.base) <= manifests.MAX_BASE
    assert manifests.names("a" * 200).base != manifests.names("a" * 201).base
    assert manifests.names("1job").base[0].isalpha()
    assert manifests.names("my.job").base != manifests.names("my-job").base
    assert manifests.names("short").base == "short"
