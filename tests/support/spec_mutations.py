"""Plausible mutations of a realistic GRPOJob (what users get wrong, and right, in the fields the pods carry), for the
admission-equals-API-server test: a seeded generator of whole documents."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from typing import Any

Doc = dict[str, Any]
Mutation = Callable[[Doc], None]


def realistic_job() -> Doc:
    """A 2 × 8 GPU job as a platform team writes it: PVCs, a ConfigMap of rewards, a token, tolerations, selectors."""
    return {
        "apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob",
        "metadata": {"name": "qwen-gsm8k", "labels": {"team": "post-training"}},
        "spec": {
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "dataset": {"name": "openai/gsm8k", "config": "main", "promptColumn": "question", "answerColumn": "answer"},
            "rewards": [{"name": "accuracy"}, {"function": "my_rewards:score", "weight": 0.5}],
            "nodes": 2,
            "resources": {"limits": {"nvidia.com/gpu": 8, "memory": "512Gi", "cpu": "64"},
                          "requests": {"nvidia.com/gpu": 8, "memory": "480Gi", "cpu": "48"}},
            "training": {"perDeviceTrainBatchSize": 2, "gradientAccumulationSteps": 4, "numGenerations": 8,
                         "learningRate": 1e-6, "maxSteps": 500, "saveSteps": 50, "bf16": True},
            "vllm": {"mode": "colocate", "tensorParallelSize": 1, "gpuMemoryUtilization": 0.3},
            "output": {"volumeClaimName": "grpo-ckpt", "path": "/ckpt"},
            "hfTokenSecretRef": {"name": "hf-token", "key": "token"},
            "template": {
                "metadata": {"labels": {"app.example.com/cost-center": "ml-42"},
                             "annotations": {"sidecar.istio.io/inject": "false"}},
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "env": [{"name": "NCCL_DEBUG", "value": "WARN"},
                        {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}],
                "volumes": [{"name": "rewards", "configMap": {"name": "my-rewards"}},
                            {"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets"}}],
                "volumeMounts": [{"name": "rewards", "mountPath": "/rewards", "readOnly": True},
                                 {"name": "datasets", "mountPath": "/data"}],
                "shmSize": "64Gi",
            },
        },
    }


def _set(*path: Any, value: Any) -> Mutation:
    def apply(doc: Doc) -> None:
        node = doc
        for key in path[:-1]:
            node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
        node[path[-1]] = copy.deepcopy(value)
    return apply


def _append(*path: str, value: Any) -> Mutation:
    def apply(doc: Doc) -> None:
        node = doc
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node.setdefault(path[-1], []).append(copy.deepcopy(value))
    return apply


def _drop(*path: str) -> Mutation:
    def apply(doc: Doc) -> None:
        node = doc
        for key in path[:-1]:
            node = node.get(key, {})
        node.pop(path[-1], None)
    return apply


T = ("spec", "template")
RES = ("spec", "resources")


def _mutations() -> dict[str, Mutation]:
    m: dict[str, Mutation] = {}
    # resources
    m["gpu requests only"] = _set(*RES, value={"requests": {"nvidia.com/gpu": 4}})
    m["gpu limits only"] = _set(*RES, value={"limits": {"nvidia.com/gpu": 4}})
    m["gpu requests below limits"] = _set(*RES, "requests", "nvidia.com/gpu", value=4)
    m["gpu 16"] = _set(*RES, value={"limits": {"nvidia.com/gpu": 16}})
    m["gpu 17"] = _set(*RES, value={"limits": {"nvidia.com/gpu": 17}})
    m["gpu 1024"] = _set(*RES, value={"limits": {"nvidia.com/gpu": 1024}})
    m["gpu as string"] = _set(*RES, value={"limits": {"nvidia.com/gpu": "8"}})
    m["cpu request over limit"] = _set(*RES, "requests", "cpu", value="96")
    m["memory GB"] = _set(*RES, "limits", "memory", value="600G")
    m["memory lowercase unit"] = _set(*RES, "limits", "memory", value="512gi")
    m["memory negative"] = _set(*RES, "limits", "memory", value="-1Gi")
    m["cpu millis"] = _set(*RES, "requests", "cpu", value="47500m")
    m["cpu fraction"] = _set(*RES, "requests", "cpu", value="0.5")
    m["cpu exponent"] = _set(*RES, "requests", "cpu", value="4e1")
    m["rdma limits"] = _set(*RES, "limits", "rdma/hca_shared_devices_a", value=1)
    m["rdma requests only"] = _set(*RES, "requests", "rdma/hca_shared_devices_a", value=1)
    m["rdma both"] = lambda d: (_set(*RES, "limits", "rdma/ib", value=1)(d), _set(*RES, "requests", "rdma/ib", value=1)(d))
    m["extended fraction"] = _set(*RES, "limits", "example.com/fpga", value="0.5")
    m["hugepages"] = _set(*RES, "limits", "hugepages-2Mi", value="1Gi")
    m["hugepages requests differ"] = lambda d: (_set(*RES, "limits", "hugepages-2Mi", value="1Gi")(d),
                                                _set(*RES, "requests", "hugepages-2Mi", value="512Mi")(d))
    m["unknown plain resource"] = _set(*RES, "limits", "gpu", value=1)
    m["ephemeral storage"] = _set(*RES, "limits", "ephemeral-storage", value="200Gi")
    m["mig one"] = lambda d: (_set(*RES, value={"limits": {"nvidia.com/mig-3g.40gb": 1}})(d),
                              _set("spec", "nodes", value=1)(d))
    m["mig two"] = _set(*RES, value={"limits": {"nvidia.com/mig-3g.40gb": 2}})
    m["amd"] = _set(*RES, value={"limits": {"amd.com/gpu": 8}})
    m["amd own image"] = lambda d: (_set(*RES, value={"limits": {"amd.com/gpu": 8}})(d),
                                    _set("spec", "image", value="registry.example.com/ml/grpo-trainer:rocm6")(d))
    m["cpu job"] = lambda d: (_set(*RES, value={"limits": {"cpu": "8", "memory": "32Gi"}})(d),
                              _set("spec", "vllm", value={"mode": "none"})(d))
    # volumes
    for name, vol in {
        "volume uppercase name": {"name": "Data_Vol", "emptyDir": {}},
        "volume long name": {"name": "v" * 64, "emptyDir": {}},
        "volume 63 name": {"name": "v" * 63, "emptyDir": {}},
        "volume emptyDir": {"name": "scratch", "emptyDir": {}},
        "volume memory emptyDir": {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
        "volume bad sizeLimit": {"name": "scratch", "emptyDir": {"sizeLimit": "lots"}},
        "volume bad medium": {"name": "scratch", "emptyDir": {"medium": "Disk"}},
        "volume pvc no claim": {"name": "scratch", "persistentVolumeClaim": {}},
        "volume pvc bad claim": {"name": "scratch", "persistentVolumeClaim": {"claimName": "My_Claim"}},
        "volume two sources": {"name": "scratch", "emptyDir": {}, "configMap": {"name": "x"}},
        "volume no source": {"name": "scratch"},
        "volume typo source": {"name": "scratch", "persistentVolumeClam": {"claimName": "x"}},
        "volume hostPath": {"name": "lustre", "hostPath": {"path": "/mnt/lustre", "type": "Directory"}},
        "volume hostPath relative": {"name": "lustre", "hostPath": {"path": "mnt/lustre"}},
        "volume nfs": {"name": "nfs", "nfs": {"server": "10.0.0.2", "path": "/export/ml"}},
        "volume csi": {"name": "s3", "csi": {"driver": "s3.csi.aws.com", "volumeAttributes": {"bucket": "b"}}},
        "volume secret": {"name": "creds", "secret": {"secretName": "creds"}},
        "volume secret no name": {"name": "creds", "secret": {}},
        "volume reserved name": {"name": "dshm", "emptyDir": {}},
        "volume duplicate": {"name": "rewards", "emptyDir": {}},
    }.items():
        m[name] = _append(*T, "volumes", value=vol)
    # mounts
    for name, mount in {
        "mount missing volume": {"name": "missingvol", "mountPath": "/missing"},
        "mount relative path": {"name": "datasets", "mountPath": "data2"},
        "mount subPath": {"name": "datasets", "mountPath": "/data2", "subPath": "gsm8k"},
        "mount subPath up": {"name": "datasets", "mountPath": "/data2", "subPath": "../etc"},
        "mount duplicate path": {"name": "datasets", "mountPath": "/data"},
        "mount readOnly string": {"name": "datasets", "mountPath": "/data2", "readOnly": "yes"},
        "mount bidirectional": {"name": "datasets", "mountPath": "/data2", "mountPropagation": "Bidirectional"},
        "mount host-to-container": {"name": "datasets", "mountPath": "/data2", "mountPropagation": "HostToContainer"},
        "mount reserved path": {"name": "datasets", "mountPath": "/dev/shm"},
        "mount output volume": {"name": "output", "mountPath": "/ckpt-view", "readOnly": True},
        "mount no name": {"mountPath": "/data2"},
    }.items():
        m[name] = _append(*T, "volumeMounts", value=mount)
    # env
    for name, env in {
        "env dotted": {"name": "my.setting", "value": "1"},
        "env dotdot": {"name": "..x", "value": "1"},
        "env both": {"name": "X", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        "env fieldRef": {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        "env fieldRef label": {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}}},
        "env bad fieldRef": {"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.containers"}}},
        "env secret no key": {"name": "X", "valueFrom": {"secretKeyRef": {"name": "s"}}},
        "env configMap bad name": {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "Bad_CM", "key": "k"}}},
        "env configMap": {"name": "NCCL_IB_HCA", "valueFrom": {"configMapKeyRef": {"name": "nccl", "key": "hca"}}},
        "env resourceFieldRef": {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}},
        "env empty valueFrom": {"name": "X", "valueFrom": {}},
        "env two refs": {"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"},
                                                    "secretKeyRef": {"name": "s", "key": "k"}}},
    }.items():
        m[name] = _append(*T, "env", value=env)
    # labels, annotations
    for name, (key, value) in {
        "label long name": ("a" * 64, "x"), "label 63 name": ("a" * 63, "x"), "label long value": ("tier", "v" * 64),
        "label bad value": ("tier", "a b"), "label empty value": ("tier", ""), "label uppercase prefix": ("Ex.com/k", "v"),
        "label prefixed": ("example.com/owner", "alice"), "label slash value": ("path", "a/b"),
        "label two slashes": ("a/b/c", "v"), "label dash end": ("tier-", "v"),
    }.items():
        m[name] = _set(*T, "metadata", "labels", key, value=value)
    for name, key in {
        "annotation long name": "example.com/" + "a" * 64, "annotation 63 name": "example.com/" + "a" * 63,
        "annotation long prefix": "p" * 254 + "/k", "annotation 253 prefix": ("p" * 61 + ".") * 4 + "p" + "/k",
        "annotation uppercase": "Example.COM/Owner", "annotation space": "my key", "annotation plain": "owner",
    }.items():
        m[name] = _set(*T, "metadata", "annotations", key, value="v")
    m["annotation long value"] = _set(*T, "metadata", "annotations", "example.com/notes", value="n" * 4000)
    m["annotations over 256KiB"] = _set(*T, "metadata", "annotations",
                                        value={f"example.com/note-{i}": "n" * 4096 for i in range(64)})
    m["annotations near 200KiB"] = _set(*T, "metadata", "annotations",
                                        value={f"example.com/note-{i}": "n" * 4000 for i in range(50)})
    # tolerations
    for name, tol in {
        "toleration exists with value": {"key": "gpu", "operator": "Exists", "value": "true", "effect": "NoSchedule"},
        "toleration equal": {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
        "toleration no operator": {"key": "dedicated", "value": "ml"},
        "toleration empty key equal": {"key": "", "operator": "Equal", "value": "x"},
        "toleration all": {"operator": "Exists"},
        "toleration seconds": {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                               "tolerationSeconds": 300},
        "toleration seconds wrong effect": {"key": "k", "operator": "Exists", "effect": "NoSchedule",
                                            "tolerationSeconds": 300},
        "toleration operator In": {"key": "k", "operator": "In", "value": "x"},
        "toleration bad effect": {"key": "k", "operator": "Exists", "effect": "Sometimes"},
        "toleration bad key": {"key": "my key", "operator": "Exists"},
        "toleration typo": {"key": "k", "opeartor": "Exists"},
        "toleration long value": {"key": "k", "operator": "Equal", "value": "v" * 64},
    }.items():
        m[name] = _append(*T, "tolerations", value=tol)
    # nodeSelector
    for name, (key, value) in {
        "selector space key": ("gpu type", "h100"), "selector zone": ("topology.kubernetes.io/zone", "us-east-1a"),
        "selector long value": ("pool", "p" * 64), "selector slash value": ("pool", "a/b"),
        "selector bad prefix": ("-x.com/pool", "a"), "selector empty value": ("pool", ""),
    }.items():
        m[name] = _set(*T, "nodeSelector", key, value=value)
    # shm, nodes, image, name, vLLM
    for value in ("32Gi", "lots", "-1Gi", 1073741824, "0", "1.5Gi"):
        m[f"shm {value}"] = _set(*T, "shmSize", value=value)
    m["no shm"] = _drop(*T, "shmSize")
    for nodes in (1, 3, 4, 16):
        m[f"nodes {nodes}"] = _set("spec", "nodes", value=nodes)
    for image in ("registry.example.com/ml/grpo:1.2", "ghcr.io/x/y@sha256:" + "a" * 64, "Bad Image", "localhost:5000/g"):
        m[f"image {image[:20]}"] = _set("spec", "image", value=image)
    for name in ("a" * 63, "qwen.gsm8k.v2", "x" * 200, "Bad_Name", "-bad", "9lives"):
        m[f"name {name[:12]}"] = _set("metadata", "name", value=name)
    m["vllm none"] = _set("spec", "vllm", value={"mode": "none"})
    m["vllm server"] = _set("spec", "vllm", value={"mode": "server", "server": {
        "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "64Gi"}}}})
    m["vllm server requests only"] = _set("spec", "vllm", value={"mode": "server", "server": {
        "resources": {"requests": {"nvidia.com/gpu": 1}}}})
    m["vllm server tp2"] = _set("spec", "vllm", value={"mode": "server", "tensorParallelSize": 2, "server": {
        "resources": {"limits": {"nvidia.com/gpu": 2}, "requests": {"nvidia.com/gpu": 2}}}})
    m["vllm tp 2"] = _set("spec", "vllm", "tensorParallelSize", value=2)
    m["token bad key"] = _set("spec", "hfTokenSecretRef", value={"name": "hf-token", "key": "my token"})
    m["token bad name"] = _set("spec", "hfTokenSecretRef", value={"name": "HF_Token", "key": "token"})
    m["pull secret"] = _append(*T, "imagePullSecrets", value={"name": "regcred"})
    m["cache"] = _set("spec", "cache", value={"volumeClaimName": "hf-cache", "subPath": "hub"})
    return m


MUTATIONS = _mutations()


def mutated_jobs(count: int, seed: int) -> Iterator[tuple[list[str], Doc]]:
    """`count` documents: every mutation alone first, then seeded combinations of two or three."""
    rng = random.Random(seed)
    names = sorted(MUTATIONS)
    produced = 0
    for name in names:
        if produced == count:
            return
        doc = realistic_job()
        MUTATIONS[name](doc)
        produced += 1
        yield [name], doc
    while produced < count:
        picked = rng.sample(names, rng.choice((2, 3)))
        doc = realistic_job()
        for name in picked:
            MUTATIONS[name](doc)
        produced += 1
        yield picked, doc
