"""The CRD is generated from the models, structural, and the checked-in file matches the generator."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from grpo_operator.api import crd
from tests.support.schema import walk as _walk

ROOT = Path(__file__).resolve().parents[3]


def test_checked_in_crd_matches_generator():
    assert (ROOT / "crds" / "grpo.dev_grpojobs.yaml").read_text() == crd.crd_yaml(), \
        "regenerate: grpojob crd > crds/grpo.dev_grpojobs.yaml"


@pytest.mark.parametrize("version", ["1.29", "1.37"])
def test_crd_is_a_valid_object(version):
    kubernetes_validate.validate(crd.crd(), version, strict=True)



def test_schema_is_structural():
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        for forbidden in ("anyOf", "oneOf", "allOf", "$ref", "default", "title"):
            assert forbidden not in node, (path, forbidden)
        if not (node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")):
            assert "type" in node, path
    spec = schema["properties"]["spec"]
    assert set(spec["required"]) == {"model", "dataset", "rewards"}
    assert spec["properties"]["resources"]["properties"]["limits"]["additionalProperties"]["x-kubernetes-int-or-string"] is True
    # every typed object of the spec keeps unknown keys, so that a typo reaches the validator and is refused by name
    # (pruned, it would vanish silently): every object with properties under spec preserves them
    typed = [(p, n) for p, n in _walk(spec, "$.spec") if n.get("type") == "object" and "properties" in n]
    assert typed and all(n.get("x-kubernetes-preserve-unknown-fields") is True for _, n in typed), \
        [p for p, n in typed if not n.get("x-kubernetes-preserve-unknown-fields")]
    # and bounded in width (issue 27, finding 3): every object that keeps unknown keys has maxProperties
    preserved = [(p, n) for p, n in _walk(spec, "$.spec") if n.get("x-kubernetes-preserve-unknown-fields")]
    assert preserved and not [p for p, n in preserved if "maxProperties" not in n]
    assert spec["maxProperties"] == len(spec["properties"]) + crd.MAX_UNKNOWN_PROPERTIES
    training = spec["properties"]["training"]["properties"]
    assert training["numGenerations"]["type"] == "integer" and training["numGenerations"]["description"]
    assert len(training) > 150

def test_the_api_servers_walk_of_a_spec_is_bounded():
    """Issue 27, finding 4: the API server's server-side-apply field manager walks every create and update, in time
    exponential in the depth of what it has no schema for. The spec is one field for it (atomic); the CRD for
    Kubernetes before 1.21 has no int-or-string (those servers build no schema at all from a CRD that has one).
    The real servers: tests/integration/cluster/test_crd_depth.py."""
    spec = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["x-kubernetes-map-type"] == "atomic"
    assert [p for p, n in _walk(spec, "$.spec") if n.get("x-kubernetes-map-type")] == ["$.spec"]
    int_or_string = [p for p, n in _walk(spec, "$.spec") if n.get("x-kubernetes-int-or-string")]
    assert "$.spec.resources.limits{}" in int_or_string and "$.spec.template.shmSize" in int_or_string
    assert crd.crd((1, 24)) == crd.crd()  # the crds/ file: every server from 1.21
    modern = crd.crd((1, 25))["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "x-kubernetes-map-type" not in json.dumps(modern)  # per-field: server-side apply owns only what it sets
    assert {**modern, "x-kubernetes-map-type": "atomic"} == spec
    old = crd.crd((1, 20))
    assert "int-or-string" not in json.dumps(old)
    old_spec = old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert old_spec["x-kubernetes-map-type"] == "atomic"
    quantity = old_spec["properties"]["resources"]["properties"]["limits"]["additionalProperties"]
    assert quantity == {"x-kubernetes-preserve-unknown-fields": True, "maxLength": 64}
    # nothing else changes: each int-or-string became a preserved value
    new = json.dumps(crd.crd())
    assert json.dumps(old).count("x-kubernetes-preserve-unknown-fields") == \
        new.count("x-kubernetes-preserve-unknown-fields") + new.count("x-kubernetes-int-or-string")


def test_crd_metadata():
    c = crd.crd()
    assert c["metadata"]["name"] == "grpojobs.grpo.dev"
    names = c["spec"]["names"]
    assert names["kind"] == "GRPOJob" and names["plural"] == "grpojobs" and names["shortNames"] == ["gj"]
    assert c["spec"]["scope"] == "Namespaced"
    v = c["spec"]["versions"][0]
    assert v["name"] == "v1alpha1" and v["subresources"] == {"status": {}}
    cols = [col["name"] for col in v["additionalPrinterColumns"]]
    assert cols[:4] == ["Phase", "Nodes×GPUs", "Step", "Reward"] and cols[-1] == "Age"


def test_crd_fits_kubectl_apply_annotation():
    assert len(yaml.safe_dump(crd.crd())) < 200_000  # kubectl apply keeps a copy in a 256 KiB annotation
