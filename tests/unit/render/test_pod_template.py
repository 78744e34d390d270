"""spec.template's pod surface (securityContext, capabilities, envFrom, grace period, topology spread, DNS,
hostNetwork, init containers, native sidecars), where each lands (docs/pod-template.md's table), the restricted
defaults kept, annotations on every pod, and the image picked by the pod's hardware. The real API server's dry run
of the same pods: tests/integration/cluster/test_pod_template_dryrun.py."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from grpo_operator import api
from grpo_operator.render import job as render_job
from grpo_operator.render import manifests, pod_template
from grpo_operator.rules import validation


def job_doc(template: dict[str, Any] | None = None, *, gpus: int = 0, server: bool = False, cache: bool = True,
            image: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": {"name": "openai/gsm8k"},
                            "rewards": [{"name": "accuracy"}], "nodes": 2,
                            "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 4}}
    if gpus:
        spec["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
        spec["training"]["numGenerations"] = 4 * gpus
    spec["vllm"] = {"mode": "server", "server": {"resources": {"limits": {"nvidia.com/gpu": 1}}}} if server \
        else {"mode": "none"}
    if cache:
        spec["cache"] = {"volumeClaimName": "hf"}
    if template is not None:
        spec["template"] = template
    if image:
        spec["image"] = image
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "job"}, "spec": spec}


def pods(doc: dict[str, Any], **kw: Any) -> dict[str, dict[str, Any]]:
    """role → one pod of that role (trainer, vllm-server, initializer)."""
    res = validation.validate(doc)
    assert res.valid, res.summary()
    assert res.job is not None and res.topology is not None
    objs = render_job.render(res.job, res.topology, "ns", uid="u", **kw)
    return {o["metadata"]["labels"][manifests.LABEL_ROLE]: o for o in objs if o["kind"] == "Pod"}


def errors(doc: dict[str, Any]) -> str:
    res = validation.validate(doc)
    assert not res.valid
    return " ".join(f"{e.field}: {e.message}" for e in res.errors)


EVERYTHING = {
    "metadata": {"annotations": {"sidecar.istio.io/inject": "false"}, "labels": {"team": "rl"}},
    "securityContext": {"runAsUser": 2000, "fsGroup": 4000, "fsGroupChangePolicy": "OnRootMismatch",
                        "supplementalGroups": [5000], "seLinuxOptions": {"level": "s0:c1,c2"}},
    "capabilities": ["IPC_LOCK", "SYS_NICE"],
    "envFrom": [{"configMapRef": {"name": "nccl"}}],
    "terminationGracePeriodSeconds": 1800,
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                   "whenUnsatisfiable": "DoNotSchedule"}],
    "dnsConfig": {"options": [{"name": "ndots", "value": "1"}]},
    "hostNetwork": True,
    "initContainers": [{"name": "warm", "image": "busybox:1.36", "command": ["true"]}],
    "sidecars": [{"name": "logs", "image": "fluent/fluent-bit:3.0"}],
}


def test_each_field_lands_on_the_pods_the_docs_name() -> None:
    by_role = pods(job_doc(EVERYTHING, gpus=2, server=True))
    assert set(by_role) == {"trainer", "vllm-server", "initializer"}
    for role, pod in by_role.items():
        spec, container = pod["spec"], pod["spec"]["containers"][0]
        runs_the_job = role != "initializer"
        # every pod: metadata, the pod securityContext, envFrom, placement and DNS
        assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false", role
        assert pod["metadata"]["labels"]["team"] == "rl", role
        assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 2000, "runAsGroup": 1000,
                                           "fsGroup": 4000, "fsGroupChangePolicy": "OnRootMismatch",
                                           "supplementalGroups": [5000], "seLinuxOptions": {"level": "s0:c1,c2"},
                                           "seccompProfile": {"type": "RuntimeDefault"}}, role
        assert container["envFrom"] == [{"configMapRef": {"name": "nccl"}}], role
        assert spec["topologySpreadConstraints"][0]["maxSkew"] == 1, role
        assert spec["dnsConfig"] == {"nameservers": [], "searches": [], "options": [{"name": "ndots", "value": "1"}]}
        # the pods that run the job only: capabilities, hostNetwork, grace period, extra containers
        assert container["securityContext"]["capabilities"] == (
            {"drop": ["ALL"], "add": ["IPC_LOCK", "SYS_NICE"]} if runs_the_job else {"drop": ["ALL"]}), role
        assert spec.get("hostNetwork") is (True if runs_the_job else None), role
        assert spec.get("dnsPolicy") == ("ClusterFirstWithHostNet" if runs_the_job else None), role
        assert spec.get("terminationGracePeriodSeconds") == (1800 if runs_the_job else None), role
        inits = spec.get("initContainers", [])
        assert [(c["name"], c.get("restartPolicy")) for c in inits] == (
            [("logs", "Always"), ("warm", None)] if runs_the_job else []), role
        for c in inits:  # the restricted container defaults hold for the user's containers too
            assert c["securityContext"] == pod_template.container_security(), c
        for version in ("1.29", "1.37"):  # native sidecars (restartPolicy on an init container) are 1.29+
            kubernetes_validate.validate(pod, version, strict=True)
        assert pod_template.has_native_sidecars(pod) is runs_the_job


def test_without_a_template_the_restricted_defaults_and_the_trainer_grace_period_stay() -> None:
    by_role = pods(job_doc())
    for role, pod in by_role.items():
        spec, container = pod["spec"], pod["spec"]["containers"][0]
        assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                           "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}}, role
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                 "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}, role
        for key in ("hostNetwork", "dnsPolicy", "dnsConfig", "initContainers", "topologySpreadConstraints"):
            assert key not in spec, (role, key)
        assert "envFrom" not in container
    assert by_role["trainer"]["spec"]["terminationGracePeriodSeconds"] == manifests.TRAINER_GRACE_SECONDS


def test_an_explicit_dns_policy_wins_over_the_host_network_default() -> None:
    trainer = pods(job_doc({"hostNetwork": True, "dnsPolicy": "Default"}))["trainer"]
    assert trainer["spec"]["dnsPolicy"] == "Default" and trainer["spec"]["hostNetwork"] is True


def test_template_annotations_reach_the_download_and_server_pods() -> None:
    """Before: only the trainers had them; in an Istio namespace `sidecar.istio.io/inject: "false"` missed the
    download pod, whose injected proxy then kept it from ever completing."""
    by_role = pods(job_doc({"metadata": {"annotations": {"sidecar.istio.io/inject": "false"}}}, gpus=1, server=True))
    assert {r: p["metadata"]["annotations"].get("sidecar.istio.io/inject") for r, p in by_role.items()} == \
        {"trainer": "false", "vllm-server": "false", "initializer": "false"}
    # the operator's own annotations still win
    doc = job_doc({"metadata": {"annotations": {manifests.ANNOTATION_JOB: "other"}}})
    assert all(p["metadata"]["annotations"][manifests.ANNOTATION_JOB] == "job" for p in pods(doc).values())


@pytest.mark.parametrize("gpus, server, image, expected", [
    (0, False, None, {"trainer": "cpu:1", "initializer": "cpu:1"}),
    (2, False, None, {"trainer": "cuda:1", "initializer": "cuda:1"}),     # the download pod: the trainers' image
    (2, True, None, {"trainer": "cuda:1", "vllm-server": "cuda:1", "initializer": "cuda:1"}),
    (0, True, None, {"trainer": "cpu:1", "vllm-server": "cuda:1", "initializer": "cpu:1"}),  # a GPU server
    (2, True, "mine:2", {"trainer": "mine:2", "vllm-server": "mine:2", "initializer": "mine:2"}),  # spec.image wins
])
def test_the_image_follows_the_pods_hardware(gpus: int, server: bool, image: str | None,
                                             expected: dict[str, str]) -> None:
    by_role = pods(job_doc(gpus=gpus, server=server, image=image), image="cuda:1", cpu_image="cpu:1")
    assert {r: p["spec"]["containers"][0]["image"] for r, p in by_role.items()} == expected


def test_one_image_given_is_used_for_every_pod() -> None:
    """Callers that name one image (cpu_image None) keep the one-image behaviour."""
    by_role = pods(job_doc(gpus=0), image="one:1")
    assert {p["spec"]["containers"][0]["image"] for p in by_role.values()} == {"one:1"}


@pytest.mark.parametrize("template, words", [
    ({"capabilities": ["NET_ADMIN"]}, ["NET_ADMIN", "not allowed", "IPC_LOCK", "SYS_RESOURCE", "SYS_NICE"]),
    ({"capabilities": ["SYS_ADMIN", "IPC_LOCK"]}, ["SYS_ADMIN"]),
    ({"capabilities": ["CAP_IPC_LOCK"]}, ["write it 'IPC_LOCK'"]),
    ({"securityContext": {"runAsUser": 0}}, ["runAsUser", "0 is root", "non-zero UID"]),
    ({"securityContext": {"fsGroupChangePolicy": "Sometimes"}}, ["fsGroupChangePolicy", "OnRootMismatch"]),
    ({"securityContext": {"privileged": True}}, ["securityContext.privileged", "unknown field"]),
    ({"envFrom": [{"configMapRef": {"name": "a"}, "secretRef": {"name": "b"}}]}, ["exactly one"]),
    ({"envFrom": [{"configMapRef": {"name": "Not_A_Name"}}]}, ["envFrom", "name"]),
    ({"terminationGracePeriodSeconds": -1}, ["terminationGracePeriodSeconds"]),
    ({"dnsPolicy": "None"}, ["dnsPolicy None needs dnsConfig.nameservers"]),
    ({"dnsConfig": {"nameservers": ["1.1.1.1", "8.8.8.8", "9.9.9.9", "1.0.0.1"]}}, ["nameservers", "at most 3"]),
    ({"dnsConfig": {"nameservers": ["dns.example.com"]}}, ["not an IP address"]),
    ({"topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": "z", "whenUnsatisfiable": "DoNotSchedule"}]},
     ["maxSkew"]),
    ({"initContainers": [{"name": "trainer", "image": "busybox"}]}, ["operator adds", "rename"]),
    ({"initContainers": [{"name": "a", "image": "busybox"}], "sidecars": [{"name": "a", "image": "busybox"}]},
     ["unique"]),
    ({"initContainers": [{"name": "warm", "image": "busybox", "volumeMounts": [{"name": "data", "mountPath": "/d"}]}]},
     ["warm mounts data", "not a volume of the pod"]),
    ({"initContainers": [{"name": "warm", "image": "busybox", "volumeMounts": [{"name": "tmp"}]}]},
     ["absolute mountPath"]),
    ({"sidecars": [{"name": "logs", "image": "busybox", "securityContext": {"privileged": True}}]},
     ["sidecars[0].securityContext", "unknown field"]),
])
def test_bad_template_fields_are_refused_with_the_reason(template: dict[str, Any], words: list[str]) -> None:
    message = errors(job_doc(template))
    for word in words:
        assert word in message, message
