"""CPU trainer pods as a real node runs them (docs/real-node.md): OMP_NUM_THREADS from the pod's CPUs (a fixed 4
made 2-core pods 4-5x slower) and no --node-rank with c10d (ignored; ranks follow host names)."""

from __future__ import annotations

import kubernetes_validate
import pytest

from grpo_operator import api
from grpo_operator.render import manifests
from grpo_operator.rules import validation


def cpu_job(nodes: int = 2, nproc: int = 1, resources: dict | None = None) -> dict:
    spec = {"model": "m", "dataset": {"name": "d.jsonl"}, "rewards": [{"name": "accuracy"}], "nodes": nodes,
            "nprocPerNode": nproc, "vllm": {"mode": "none"},
            "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 2 * nodes * nproc}}
    if resources is not None:
        spec["resources"] = resources
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "job"}, "spec": spec}


def trainer_env(doc: dict) -> dict:
    res = validation.validate(doc)
    assert res.valid, res.summary()
    objs = manifests.core_objects(res.job, res.topology, "ns", uid="u")
    pod = next(o for o in objs if o["kind"] == "Pod")
    for version in ("1.29", "1.37"):
        kubernetes_validate.validate(pod, version, strict=True)
    return {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}, pod


@pytest.mark.parametrize("resources, nproc, expected", [
    ({"limits": {"cpu": "2"}}, 1, {"value": "2"}),
    ({"limits": {"cpu": 2}}, 1, {"value": "2"}),
    ({"limits": {"cpu": "1"}}, 1, {"value": "1"}),          # was 4: 4 threads fighting over one core
    ({"limits": {"cpu": "1500m"}}, 1, {"value": "1"}),
    ({"limits": {"cpu": "8"}}, 2, {"value": "4"}),           # shared by the local processes
    ({"limits": {"cpu": "3"}}, 2, {"value": "1"}),
    ({"limits": {"cpu": "500m"}}, 1, {"value": "1"}),        # never 0
    ({"requests": {"cpu": "6"}}, 2, {"value": "3"}),         # no limit: the request
    ({"limits": {"cpu": "4"}, "requests": {"cpu": "2"}}, 1, {"value": "4"}),
    ({}, 2, {"value": "1"}),                                 # unknown CPUs, several processes: torchrun's 1
    ({}, 1, {"valueFrom": {"resourceFieldRef": {"containerName": "trainer", "resource": "limits.cpu",
                                                "divisor": "1"}}}),  # the node's CPUs (downward API)
])
def test_omp_threads_follow_the_pods_cpus(resources: dict, nproc: int, expected: dict) -> None:
    env, _ = trainer_env(cpu_job(nodes=2, nproc=nproc, resources=resources))
    got = {k: v for k, v in env["OMP_NUM_THREADS"].items() if k != "name"}
    assert got == expected


def test_gpu_pods_keep_one_thread() -> None:
    doc = cpu_job(nodes=1, resources={"limits": {"nvidia.com/gpu": 2, "cpu": "16"}})
    del doc["spec"]["nprocPerNode"]
    env, _ = trainer_env(doc)
    assert env["OMP_NUM_THREADS"]["value"] == "1"


def test_the_users_omp_threads_win() -> None:
    doc = cpu_job(resources={"limits": {"cpu": "2"}})
    doc["spec"]["template"] = {"env": [{"name": "OMP_NUM_THREADS", "value": "7"}]}
    env, _ = trainer_env(doc)
    assert env["OMP_NUM_THREADS"] == {"name": "OMP_NUM_THREADS", "value": "7"}


def test_no_node_rank_with_c10d() -> None:
    _, pod = trainer_env(cpu_job(nodes=12))
    args = pod["spec"]["containers"][0]["args"]
    assert "--rdzv-backend=c10d" in args
    assert not any(a.startswith("--node-rank") for a in args), args
