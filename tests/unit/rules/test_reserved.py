"""The reserved volume names and mount paths (rules/validation.py `reserved`) are derived here from the pods the
operator renders, so the two cannot drift: every volume name and mount path the operator's pods use is refused in
spec.template, and nothing is refused that they do not use. A collision left to the API server refuses the pod
(duplicate name or mountPath, 422) long after admission."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_operator.render import job as render_job
from grpo_operator.rules import validation
from tests.support.jobs import manifest


def everything() -> dict[str, Any]:
    """A job whose pods carry every volume the operator adds: GPUs (/dev/shm), an output claim, the vLLM server pod,
    and spec.cache with a Hub model (the download pod and the cache mounts)."""
    job = manifest("full", nodes=2, gpus=2, num_generations=4, per_device=2, vllm_server=True)
    job["spec"]["cache"] = {"volumeClaimName": "hub-cache", "subPath": "hub"}
    job["spec"]["template"] = {"shmSize": "8Gi"}
    return job


def plain() -> dict[str, Any]:
    job = manifest("plain", cpu=True, num_generations=2)
    del job["spec"]["output"]  # the default output: an emptyDir at the default path
    return job


def rendered(job: dict[str, Any]) -> tuple[set[str], set[str]]:
    """The volume names and mount paths of every pod the operator creates for `job`."""
    res = validation.validate(job)
    assert res.valid and res.job is not None and res.topology is not None, res.summary()
    pods = [o for o in render_job.render(res.job, res.topology, "ns", uid="u") if o["kind"] == "Pod"]
    names = {v["name"] for p in pods for v in p["spec"]["volumes"]}
    paths = {m["mountPath"] for p in pods for c in p["spec"]["containers"] for m in c.get("volumeMounts") or []}
    return names, paths


def with_template(job: dict[str, Any], volume: str = "mine", path: str = "/data") -> dict[str, Any]:
    job["spec"]["template"] = {**job["spec"].get("template", {}),
                               "volumes": [{"name": volume, "emptyDir": {}}],
                               "volumeMounts": [{"name": volume, "mountPath": path}]}
    return job


def test_every_job_reserves_exactly_what_its_pods_use() -> None:
    for make in (everything, plain):
        job = make()
        names, paths = rendered(job)
        spec = validation.validate(job).job.spec
        reserved_names, reserved_paths = validation.reserved(spec)
        assert names <= set(reserved_names) and paths <= set(reserved_paths), (make.__name__, names, paths)
    names, paths = rendered(everything())
    spec = validation.validate(everything()).job.spec
    assert set(validation.reserved(spec)[0]) == names and set(validation.reserved(spec)[1]) == paths


@pytest.mark.parametrize("name", sorted(rendered(everything())[0]))
def test_each_volume_name_of_the_pods_is_refused_by_name(name: str) -> None:
    res = validation.validate(with_template(everything(), volume=name))
    [err] = [e for e in res.errors if e.field == "spec.template.volumes[0].name"]
    assert f"{name!r} is the name of a volume the operator adds" in err.message and "rename it" in err.message


@pytest.mark.parametrize("path", sorted(rendered(everything())[1]))
def test_each_mount_path_of_the_pods_is_refused(path: str) -> None:
    res = validation.validate(with_template(everything(), path=path + "/"))
    [err] = [e for e in res.errors if e.field == "spec.template.volumeMounts[0].mountPath"]
    assert err.message.startswith(f"{path} is already mounted by the operator") and "mount elsewhere" in err.message


def test_the_cache_names_are_free_without_spec_cache() -> None:
    """Without spec.cache no pod has the cache volume: a user's own Hub cache may take its name and paths."""
    job = with_template(plain(), volume="hf-cache", path="/hf-cache")
    assert validation.validate(job).valid
    names, paths = rendered(job)
    assert "hf-cache" in names and "/hf-cache" in paths  # the user's, once each


def test_an_accepted_template_renders_pods_the_api_server_accepts() -> None:
    """What the API server checks: volume names and mount paths unique within a pod and its container."""
    res = validation.validate(with_template(everything(), volume="data", path="/data"))
    assert res.valid and res.job is not None and res.topology is not None
    for pod in (o for o in render_job.render(res.job, res.topology, "ns") if o["kind"] == "Pod"):
        vols = [v["name"] for v in pod["spec"]["volumes"]]
        assert len(vols) == len(set(vols)), vols
        for c in pod["spec"]["containers"]:
            mounts = [m["mountPath"] for m in c.get("volumeMounts") or []]
            assert len(mounts) == len(set(mounts)), mounts
