"""The chart's `networkPolicy.perJob` (on by default): the operator is told to create a NetworkPolicy per job, which
admits the operator's own pods (the namespace and labels the chart passes must select the Deployment's pods), and
is granted exactly what that needs (get, create, update on networkpolicies)."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_operator.controller.settings import Settings
from grpo_operator.render import job as render_job
from grpo_operator.rules import validation
from tests.support.helm import HELMS, NAMESPACE, VALUE_SETS, objects, render, template
from tests.support.jobs import manifest

pytestmark = [pytest.mark.slow]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def operator_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    (dep,) = by_kind(docs, "Deployment")
    return {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}


def netpol_rules(docs: list[dict[str, Any]]) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    return [(d["kind"], tuple(r["resources"]), tuple(r["verbs"])) for d in docs if d["kind"] in ("Role", "ClusterRole")
            for r in d["rules"] if "networking.k8s.io" in r["apiGroups"]]


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


@pytest.mark.parametrize("mode", ["default", "namespaced"])
def test_per_job_policies_are_on_by_default_and_admit_the_charts_own_operator_pods(mode: str) -> None:
    values = VALUE_SETS.get(mode, {})
    docs = render({**values, "podLabels": {"team": "ml"}})
    env = operator_env(docs)
    assert env["GRPO_JOB_NETWORK_POLICY"] == "true" and env["GRPO_OPERATOR_NAMESPACE"] == NAMESPACE
    assert "GRPO_JOB_NETWORK_POLICY_METRICS_FROM" not in env
    # the operator, configured as the chart configures it, renders a policy that admits the Deployment's pods
    cfg = Settings.from_env({k: v for k, v in env.items() if v is not None})
    access = cfg.network_policy()
    assert access is not None
    res = validation.validate(manifest("job", nodes=2))
    [policy, *_] = render_job.render(res.job, res.topology, "team-a", uid="u", network_policy=access)
    (dep,) = by_kind(docs, "Deployment")
    peer = policy["spec"]["ingress"][1]["from"][0]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": NAMESPACE}
    assert matches(peer["podSelector"], dep["spec"]["template"]["metadata"]["labels"])
    # the selector labels, which every replica carries (not podLabels, which a user may change per pod)
    assert peer["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    # get, create and update (kept as rendered) only, in every role the operator gets: never list/watch/patch/delete
    # (owner GC removes it)
    rules = netpol_rules(docs)
    roles = by_kind(docs, "Role" if mode == "namespaced" else "ClusterRole")
    assert rules == [(roles[0]["kind"], ("networkpolicies",), ("get", "create", "update"))] * (2 if mode == "namespaced" else 1)


@pytest.mark.parametrize("helm_bin", HELMS)
def test_per_job_policies_off_remove_the_setting_and_the_permission(helm_bin: str) -> None:
    docs = objects(template(helm_bin, {"networkPolicy": {"perJob": False}}, include_crds=False))
    env = operator_env(docs)
    assert not {k for k in env if "NETWORK_POLICY" in k or k.startswith("GRPO_OPERATOR_")}
    assert not netpol_rules(docs)
    assert Settings.from_env({k: v for k, v in env.items() if v is not None}).network_policy() is None


def test_metrics_from_reaches_the_per_job_policy() -> None:
    prom = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app": "prometheus"}}}
    env = operator_env(render({"networkPolicy": {"metricsFrom": [prom]}}))
    access = Settings.from_env({k: v for k, v in env.items() if v is not None}).network_policy()
    assert access is not None and access.metrics_from == (prom,)
    res = validation.validate(manifest("job", nodes=1))
    [policy, *_] = render_job.render(res.job, res.topology, "ns", network_policy=access)
    assert policy["spec"]["ingress"][2] == {"from": [prom], "ports": [{"port": 9400, "protocol": "TCP"}]}
