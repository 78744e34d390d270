"""The chart grants what gang scheduling needs only when asked: PodGroups (rbac.podGroups) and a patch on pods for
ending Kueue groups (rbac.kueue), in the cluster-wide ClusterRole and in each namespaced Role (helm template)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.helm import CHART, helm, render

PODGROUPS = {"apiGroups": ["scheduling.x-k8s.io", "scheduling.volcano.sh"], "resources": ["podgroups"],
             "verbs": ["get", "create", "delete"]}
POD_PATCH = {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}


# the operator's own roles: not the webhook's, nor the aggregated roles for people (rbac.aggregatedRoles)
NOT_THE_OPERATORS = ("-webhook", "-grpojob-edit", "-grpojob-view")


def roles(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for o in render(values) if o["kind"] in ("ClusterRole", "Role")
            and not o["metadata"]["name"].endswith(NOT_THE_OPERATORS)]


@pytest.mark.parametrize("scope", [{}, {"watch": {"namespaces": ["a", "b"]}}])
@pytest.mark.parametrize("pod_groups, kueue", [(False, False), (True, False), (False, True), (True, True)])
def test_gang_rules_only_when_enabled(scope: dict[str, Any], pod_groups: bool, kueue: bool) -> None:
    found = roles({**scope, "rbac": {"podGroups": pod_groups, "kueue": kueue}})
    assert len(found) == (2 if scope else 1)
    for role in found:
        assert (PODGROUPS in role["rules"]) is pod_groups, role["rules"]
        assert (POD_PATCH in role["rules"]) is kueue, role["rules"]
        # nothing else about pods changes: the base rule is still there, unwidened
        assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "get", "create", "delete"]} \
            in role["rules"]


def test_the_values_schema_refuses_a_non_boolean() -> None:
    out = helm("helm3", "template", "x", str(CHART), values={"rbac": {"podGroups": "yes"}}, check=False)
    assert out.returncode != 0 and "podGroups" in out.stderr
