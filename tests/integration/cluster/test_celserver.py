"""The CEL CRD server enforces x-kubernetes-validations like a current cluster."""

from __future__ import annotations

import copy

import pytest

from tests.support.cluster.celserver import CelServer


def crd(name: str, spec_schema: dict) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{name}s.cel-test.grpo.dev"},
        "spec": {
            "group": "cel-test.grpo.dev", "scope": "Namespaced",
            "names": {"plural": f"{name}s", "singular": name, "kind": name.capitalize()},
            "versions": [{"name": "v1", "served": True, "storage": True,
                          "subresources": {"status": {}},
                          "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                              "spec": spec_schema,
                              "status": {"type": "object",
                                         "x-kubernetes-preserve-unknown-fields": True}}}}}],
        },
    }


def obj(kind_crd: dict, name: str, spec: dict) -> dict:
    s = kind_crd["spec"]
    return {"apiVersion": f"{s['group']}/v1", "kind": s["names"]["kind"],
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


RANGE = crd("range", {
    "type": "object",
    "x-kubernetes-validations": [{"rule": "self.min <= self.max", "message": "min must be <= max"}],
    "properties": {
        "min": {"type": "integer"}, "max": {"type": "integer"},
        "mode": {"type": "string", "maxLength": 16,
                 "x-kubernetes-validations": [{"rule": "self == oldSelf",
                                               "message": "mode is immutable"}]},
    },
})


@pytest.fixture(scope="module")
def range_crd(celserver: CelServer) -> dict:
    r = celserver.apply_crd(RANGE)
    assert r.ok, (r.status, r.message)
    return RANGE


def test_crd_with_rules_is_accepted(range_crd: dict, celserver: CelServer) -> None:
    got = celserver.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                   f"{range_crd['metadata']['name']}")
    assert got.ok
    rules = got.body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"]
    assert rules[0]["message"] == "min must be <= max"


def test_rule_fires_with_its_message(range_crd: dict, celserver: CelServer) -> None:
    r = celserver.create(range_crd, obj(range_crd, "bad", {"min": 3, "max": 1}))
    assert r.status == 422, r.body
    assert "min must be <= max" in r.message
    assert r.body["details"]["causes"][0]["field"] == "spec"
    ok = celserver.create(range_crd, obj(range_crd, "good", {"min": 1, "max": 3}))
    assert ok.status == 201, ok.message


def test_transition_rule_fires_on_update(range_crd: dict, celserver: CelServer) -> None:
    created = celserver.create(range_crd, obj(range_crd, "t", {"min": 1, "max": 2, "mode": "a"}))
    assert created.status == 201, created.message
    changed = copy.deepcopy(created.body)
    changed["spec"]["mode"] = "b"
    r = celserver.update(range_crd, changed)
    assert r.status == 422 and "mode is immutable" in r.message, r.body
    r = celserver.patch(range_crd, "t", {"spec": {"mode": "b"}})
    assert r.status == 422 and "mode is immutable" in r.message
    # Other fields may change; the transition rule does not fire when mode is unchanged.
    r = celserver.patch(range_crd, "t", {"spec": {"max": 5}})
    assert r.ok, r.message
    assert r.body["metadata"]["generation"] == 2
    # And the plain rule still fires on update.
    r = celserver.patch(range_crd, "t", {"spec": {"min": 9}})
    assert r.status == 422 and "min must be <= max" in r.message


def test_rule_over_cost_budget_is_rejected_at_crd_creation(celserver: CelServer) -> None:
    unbounded = crd("costly", {
        "type": "object",
        "properties": {"names": {
            "type": "array", "items": {"type": "string"},  # no maxItems / maxLength
            "x-kubernetes-validations": [{
                "rule": "self.all(a, self.all(b, a == b || !a.contains(b)))",
                "message": "no name may contain another"}],
        }},
    })
    r = celserver.create_crd(unbounded)
    assert r.status == 422, (r.status, r.body)
    assert "cost" in r.message and "budget" in r.message, r.message

    # Bounding the list and the strings brings it under budget: the same rule is accepted.
    bounded = copy.deepcopy(unbounded)
    names = bounded["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]["names"]
    names["maxItems"] = 8
    names["items"]["maxLength"] = 32
    r = celserver.create_crd(bounded)
    assert r.status == 201, r.message
    bad = celserver.create(bounded, obj(bounded, "x", {"names": ["ab", "abc"]}))
    assert bad.status == 422 and "no name may contain another" in bad.message
    assert celserver.delete_crd(bounded["metadata"]["name"]).ok


def test_uncompilable_rule_is_rejected(celserver: CelServer) -> None:
    broken = crd("broken", {
        "type": "object", "properties": {"n": {"type": "integer"}},
        "x-kubernetes-validations": [{"rule": "self.n > 'one'"}],
    })
    r = celserver.create_crd(broken)
    assert r.status == 422
    assert "compil" in r.message, r.message
