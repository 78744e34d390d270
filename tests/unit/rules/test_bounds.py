"""Bounded inputs: every list/map of the spec has a maxItems/maxProperties in the CRD, a denial lists at most 20
errors, and an oversized or deeply nested spec is refused with one line (no recursion error)."""

from __future__ import annotations

from typing import Any

import yaml

from grpo_operator.api import crd
from grpo_operator.rules import validation
from grpo_operator.rules.errors import MAX_ERRORS
from tests.support.jobs import manifest
from tests.support.schema import walk as _walk


def test_every_list_and_map_of_the_spec_is_bounded_in_the_crd() -> None:
    doc = yaml.safe_load(crd.crd_yaml())
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    unbounded = [p for p, n in _walk(spec, "spec") if n.get("type") == "array" and "maxItems" not in n]
    unbounded += [p for p, n in _walk(spec, "spec") if n.get("type") == "object" and "additionalProperties" in n
                  and "maxProperties" not in n]
    unbounded += [p for p, n in _walk(spec, "spec") if n.get("type") == "string" and "enum" not in n and "maxLength" not in n]
    assert not unbounded, unbounded
    template = spec["properties"]["template"]["properties"]
    assert template["env"]["maxItems"] == 256 and template["volumes"]["maxItems"] == 64
    assert template["tolerations"]["maxItems"] == 64


def test_400_bad_env_names_give_a_short_denial() -> None:
    job = manifest("envs")
    job["spec"]["template"] = {"env": [{"name": f"{i}-bad name"} for i in range(400)]}
    res = validation.validate(job)
    assert [e.field for e in res.errors] == ["spec.template.env"] and "at most 256" in res.errors[0].message
    assert len(res.summary()) < 2_000  # was ~460 KB
    job["spec"]["template"] = {"env": [{"name": f"{i}-bad name"} for i in range(200)]}  # within the bound: 200 errors
    res = validation.validate(job)
    assert not res.valid and len(res.errors) == MAX_ERRORS + 1
    assert "more errors" in res.errors[-1].message
    assert len(res.summary()) < 20_000


def test_deep_and_huge_specs_are_refused_in_one_line() -> None:
    deep: Any = "x"
    for _ in range(5000):  # deeper than Python's recursion limit
        deep = {"a": deep}
    job = manifest("deep")
    job["spec"]["template"] = {"affinity": deep}
    res = validation.validate(job)
    assert [e.field for e in res.errors] == ["spec"] and "nested deeper" in res.errors[0].message
    big = manifest("big")
    big["spec"]["template"] = {"metadata": {"annotations": {f"a{i}": "v" * 4000 for i in range(200)}}}
    res = validation.validate(big)
    assert [e.field for e in res.errors] == ["spec"] and "too large" in res.errors[0].message
    assert validation.validate(manifest("fine")).valid


def test_reserved_volume_names_and_mount_paths_are_refused_and_match_the_renderer() -> None:
    from grpo_operator.render import manifests

    job = manifest("plain", gpus=4)
    res = validation.validate(job)
    assert res.valid and res.job is not None and res.topology is not None
    pod = next(o for o in manifests.core_objects(res.job, res.topology, "ns") if o["kind"] == "Pod")
    names = {v["name"] for v in pod["spec"]["volumes"]}
    paths = {m["mountPath"] for c in pod["spec"]["containers"] for m in c.get("volumeMounts") or []}
    assert names <= set(validation.RESERVED_VOLUMES)
    assert paths <= set(validation.RESERVED_MOUNT_PATHS) | {res.job.spec.output.path}
    job["spec"]["template"] = {"volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "mine", "emptyDir": {}}],
                               "volumeMounts": [{"name": "mine", "mountPath": "/etc/grpo/"},
                                                {"name": "mine", "mountPath": "/data"}]}
    res = validation.validate(job)
    assert [e.field for e in res.errors] == ["spec.template.volumes[0].name", "spec.template.volumeMounts[0].mountPath"]
    assert "rename it" in res.errors[0].message and "mount elsewhere" in res.errors[1].message
