"""docs/install.md and docs/gitops.md stay true: every chart value documented, the Argo CD health check in the
docs is the tested one, the condition types it reads are the operator's."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from grpo_operator.api.status import ConditionType
from tests.support.helm import CHART, REPO

LUA = (REPO / "examples" / "gitops" / "argocd-health.lua").read_text()


def test_install_md_documents_every_value() -> None:
    doc = (REPO / "docs" / "install.md").read_text()
    schema = json.loads((CHART / "values.schema.json").read_text())

    def leaves(node: dict[str, Any], path: str = "") -> Any:
        for k, sub in (node.get("properties") or {}).items():
            p = f"{path}.{k}".lstrip(".")
            if k == "global":
                continue
            if sub.get("properties") and p not in ("resources", "webhook.certManager.issuerRef"):
                yield from leaves(sub, p)
            else:
                yield p

    missing = [p for p in leaves(schema) if f"| `{p}` |" not in doc]
    assert not missing, f"docs/install.md values table lacks {missing}"


def test_gitops_md_carries_the_tested_health_check() -> None:
    doc = (REPO / "docs" / "gitops.md").read_text()
    assert LUA in doc
    cm = yaml.safe_load((REPO / "examples" / "gitops" / "argocd-cm-patch.yaml").read_text())
    assert cm["data"]["resource.customizations.health.grpo.dev_GRPOJob"] == LUA
    for cond in set(ConditionType) - {ConditionType.CREATED, ConditionType.STAGED}:
        assert f'"{cond}"' in LUA and f"`{cond}`" in doc, cond
    # a job that stages (spec.cache) is Pending, Progressing with the download's message (status.message); a failed
    # download fails the job: the health check needs no branch for Staged, the docs list it
    assert f"`{ConditionType.STAGED}`" in doc
    assert "--for=condition=Succeeded" in doc and "grpojob check" in doc and "HelmRelease" in doc


def _health(obj: dict[str, Any]) -> tuple[str, str]:
    lupa = pytest.importorskip("lupa", reason="the Lua runtime (pip install lupa) runs the Argo CD health check")
    rt = lupa.LuaRuntime(unpack_returned_tuples=True)
    to_lua = rt.eval("function(f) return f end")

    def conv(v: Any) -> Any:
        if isinstance(v, dict):
            return rt.table_from({k: conv(x) for k, x in v.items()})
        if isinstance(v, list):
            return rt.table_from([conv(x) for x in v])
        return v

    fn = rt.eval("function(obj) " + LUA + " end")
    hs = to_lua(fn)(conv(obj))
    return hs["status"], hs["message"]


def _job(status: dict[str, Any] | None, generation: int = 1) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "j", "generation": generation}}
    if status is not None:
        obj["status"] = status
    return obj


def _cond(t: str, s: str = "True", msg: str = "") -> dict[str, Any]:
    return {"type": t, "status": s, "reason": t, "message": msg}


@pytest.mark.parametrize("status,expected", [
    (None, "Progressing"),
    ({"phase": "Pending", "conditions": [_cond("Created")]}, "Progressing"),
    ({"phase": "Running", "observedGeneration": 1, "progress": {"display": "10/500"},
      "conditions": [_cond("Created"), _cond("Running", msg="2 node(s) running")]}, "Progressing"),
    ({"phase": "Restarting", "conditions": [_cond("Running", "False"), _cond("Restarting")]}, "Progressing"),
    ({"phase": "Succeeded", "conditions": [_cond("Running", "False"), _cond("Succeeded", msg="all 2 node(s) succeeded")]},
     "Healthy"),
    ({"phase": "Failed", "conditions": [_cond("Failed", msg="backoff limit reached")]}, "Degraded"),
    ({"phase": "Rejected", "conditions": [_cond("Rejected", msg="spec.training.numGenerations: …")]}, "Degraded"),
    ({"phase": "Suspended", "conditions": [_cond("Suspended")]}, "Suspended"),
    ({"phase": "Pending", "conditions": [_cond("CreateFailed", msg="exceeded quota")]}, "Degraded"),
    ({"phase": "Pending", "conditions": [_cond("CreateFailed", "False"), _cond("Created")]}, "Progressing"),
    ({"phase": "Succeeded", "observedGeneration": 1, "conditions": [_cond("Succeeded")]}, "Healthy"),
])
def test_argocd_health_check(status: dict[str, Any] | None, expected: str) -> None:
    got, message = _health(_job(status))
    assert got == expected, message
    assert message


def test_argocd_health_shows_the_spec_invalid_warning_of_a_running_job() -> None:
    got, message = _health(_job({"phase": "Running", "conditions": [
        _cond("Running", msg="2 node(s) running"), _cond("SpecInvalid", msg="today's rules refuse the spec: x")]}))
    assert got == "Progressing" and message == "2 node(s) running; today's rules refuse the spec: x"


def test_argocd_health_waits_for_the_current_generation() -> None:
    got, message = _health(_job({"phase": "Succeeded", "observedGeneration": 1, "conditions": [_cond("Succeeded")]},
                                generation=2))
    assert got == "Progressing" and "generation 2" in message
    got, message = _health(_job({"phase": "Running", "progress": {"display": "10/500"},
                                 "conditions": [_cond("Running", msg="2 node(s) running")]}))
    assert message == "2 node(s) running (step 10/500)"
