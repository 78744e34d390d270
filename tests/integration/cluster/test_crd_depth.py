"""Issue 27, finding 4: a tenant could stall the API server itself, with no operator running. A value nested deep
under an unknown spec key or a free-form map took kube-apiserver 1.20 time exponential in its depth (13 s at depth
20, a 504 after 34 s from about 22 levels on, both cores busy): its server-side-apply field manager walks every
create and update, and it doubled at each level it had no schema for. Two causes, both in the CRD:
  * 1.20 could not build a schema from a CRD with x-kubernetes-int-or-string (it logs "error building openapi
    models") and walked the whole object schema-less: the CRD for servers before 1.21 has none;
  * below an object that keeps unknown keys (every typed object of the spec, so that the webhook sees typos), the
    walk is schema-less too, on every server before 1.25: the spec is atomic for server-side apply, so it is one
    field and never walked.
Deep values are still stored whole (the webhook, not the API server, refuses them by name and by depth)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from grpo_operator.api import crd as crdgen
from tests.support.cluster.celserver import crd_resource_path
from tests.support.jobs import manifest

pytestmark = [pytest.mark.timeout(300)]

DEPTH = 80  # before: 2^80 steps on 1.20; 20 levels already took 4-13 s
PLACES = {  # unknown keys at three levels, and free-form maps the CRD keeps as they are
    "spec.unknownKey": ("unknownKey",),
    "training.unknownKey": ("training", "unknownKey"),
    "template.unknownKey": ("template", "unknownKey"),
    "training.modelInitKwargs": ("training", "modelInitKwargs"),
    "template.affinity": ("template", "affinity"),
}


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def _job(i: int, place: str, prefix: str = "deep") -> dict[str, Any]:
    obj = manifest(f"{prefix}-{i}", nodes=1)
    obj["metadata"]["namespace"] = "default"
    *parents, key = PLACES[place]
    node = obj["spec"]
    for p in parents:
        node = node.setdefault(p, {})
    node[key] = _deep(DEPTH)
    return obj


def _at(spec: dict[str, Any], place: str) -> Any:
    for key in PLACES[place]:
        spec = spec[key]
    return spec


def _spec_fields(body: dict[str, Any]) -> list[Any]:
    return [m["fieldsV1"]["f:spec"] for m in body["metadata"]["managedFields"] if "f:spec" in m.get("fieldsV1", {})]


def _creates_are_stored_whole(create: Callable[[dict[str, Any]], Any], atomic: bool = True,
                              prefix: str = "deep") -> None:
    for i, place in enumerate(PLACES):
        r = create(_job(i, place, prefix))
        assert r.status == 201, (place, r.status, str(r.message)[:300])
        assert _at(r.body["spec"], place) == _deep(DEPTH), place  # kept as sent: the webhook sees what was sent
        spec_fields = _spec_fields(r.body)
        if atomic:  # the field manager records the spec as one leaf ({}), i.e. it did not walk into the value
            assert spec_fields == [{}], (place, json.dumps(spec_fields)[:300])
        else:  # per-field (the chart's CRD from 1.25): the server walked the value, cheaply, and recorded its fields
            assert spec_fields and spec_fields != [{}], (place, json.dumps(spec_fields)[:300])


def test_a_deep_spec_costs_kube_apiserver_1_20_no_walk(controlplane_factory: Any, tmp_path: Path) -> None:
    cp = controlplane_factory(authorization_mode="AlwaysAllow", controller_manager=False)
    crd = crdgen.crd((1, 20))  # what the chart and `grpojob crd --kube-version 1.20` install there
    f = tmp_path / "crd.json"
    f.write_text(json.dumps(crd))
    cp.kubectl("apply", "--validate=false", "-f", str(f))
    path = crd_resource_path(crd, "default")
    deadline = time.monotonic() + 60
    while not cp.api("GET", path).ok:  # served once Established
        assert time.monotonic() < deadline, "the CRD was never served"
        time.sleep(0.2)
    # a client timeout above the server's own (34 s): before the fix each create answered 504 Timeout
    _creates_are_stored_whole(lambda obj: cp.api("POST", path, obj, timeout=60))
    assert "error building openapi models for grpojobs" not in cp.logs(lines=100_000)


@pytest.mark.parametrize("kube", [None, (1, 36)], ids=["crds-file-atomic", "chart-1.36-per-field"])
def test_a_deep_spec_is_stored_whole_by_the_cel_server(celserver: Any, kube: Any) -> None:
    """The crds/ file (atomic: never walked) and the CRD the chart installs on 1.36 (per-field: that server walks a
    deep value cheaply; before 1.25 the walk doubled at each level). Both with int-or-string and CEL rules."""
    crd = crdgen.crd(kube)
    r = celserver.apply_crd(crd)  # the server is shared: this replaces whichever CRD a test applied before
    assert r.ok, (r.status, r.message)
    prefix = "deep-atomic" if kube is None else "deep-fields"

    def serving_this_crd() -> bool:  # a replaced CRD takes effect a moment later
        probe = manifest(f"{prefix}-probe", nodes=1)
        probe["metadata"]["namespace"] = "default"
        created = celserver.create(crd, probe)
        assert created.status == 201, (created.status, str(created.message)[:300])
        celserver.request("DELETE", f"{crd_resource_path(crd, 'default')}/{prefix}-probe")
        return (_spec_fields(created.body) == [{}]) is (kube is None)

    deadline = time.monotonic() + 60
    while not serving_this_crd():
        assert time.monotonic() < deadline, "the replaced CRD was never served"
        time.sleep(0.2)
    _creates_are_stored_whole(lambda obj: celserver.create(crd, obj), atomic=kube is None, prefix=prefix)
