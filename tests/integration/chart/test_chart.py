"""The Helm chart: lint and render with helm 3.17 and 4.3, Kubernetes schema validation (1.29–1.37), the values
schema, and the shape of what it renders (RBAC, webhook modes, leader election, security context)."""

from __future__ import annotations

import functools
import json
from typing import Any, Optional

import kubernetes_validate
import pytest
import yaml

from grpo_operator.api import crd as crdgen
from tests.support.helm import CHART, HELMS, NAMESPACE, REPO, VALUE_SETS, helm, objects, render, template

K8S_VERSIONS = [f"1.{m}" for m in range(25, 38)]  # every minor kubernetes-validate has a schema of
# Custom resources kubernetes-validate has no schema for: skipped, with the reason.
SKIP_KINDS = {
    ("cert-manager.io/v1", "Issuer"): "cert-manager CRD: not in the Kubernetes OpenAPI schemas",
    ("cert-manager.io/v1", "Certificate"): "cert-manager CRD: not in the Kubernetes OpenAPI schemas",
    ("kopf.dev/v1", "ClusterKopfPeering"): "kopf peering CRD (charts/grpo-operator/crds/kopf-peering.yaml)",
    ("kopf.dev/v1", "KopfPeering"): "kopf peering CRD (charts/grpo-operator/crds/kopf-peering.yaml)",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "prometheus-operator CRD: not in the Kubernetes OpenAPI schemas",
    ("monitoring.coreos.com/v1", "PodMonitor"): "prometheus-operator CRD: not in the Kubernetes OpenAPI schemas",
}


# ------------------------------------------------------------------------------------------ CRD in sync
def test_chart_crd_is_the_generated_crd() -> None:
    chart_crd = (CHART / "files" / "grpo.dev_grpojobs.yaml").read_bytes()
    assert chart_crd == (REPO / "crds" / "grpo.dev_grpojobs.yaml").read_bytes(), \
        "cp crds/grpo.dev_grpojobs.yaml charts/grpo-operator/files/"
    assert chart_crd.decode() == crdgen.crd_yaml(), "regenerate: grpojob crd > crds/grpo.dev_grpojobs.yaml"
    # a template (templates/crd.yaml), not crds/: helm would install a crds/ copy as well, with the CEL rules
    assert not (CHART / "crds" / "grpo.dev_grpojobs.yaml").exists()


def _without_cel(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_cel(v) for k, v in node.items() if k != "x-kubernetes-validations"}
    if isinstance(node, list):
        return [_without_cel(v) for v in node]
    return node


@pytest.mark.parametrize("helm_bin", HELMS)
@pytest.mark.parametrize("kube_version, cel_rules, with_cel", [
    ("1.20.2", "auto", False), ("1.24.17", "auto", False), ("1.27.16", "auto", False), ("1.28.0", "auto", True),
    ("1.36.0", "auto", True),
    ("1.36.0", False, False), ("1.20.2", True, True),
])
def test_crd_template_has_cel_rules_only_where_the_server_has_cel(helm_bin: str, kube_version: str, cel_rules: Any,
                                                                   with_cel: bool) -> None:
    """Kubernetes < 1.25 drops CEL rules, < 1.28 their reason and fieldPath (kubernetes-validate's 1.25-1.27 schemas
    refuse them), and helm 4's server-side apply refuses unknown fields: the chart leaves them out (the webhook
    makes the same checks); otherwise the CRD is exactly the one generated for that version (before 1.21 without
    int-or-string, before 1.25 an atomic spec: issue 27, finding 4). Kept on uninstall, always."""
    cp = helm(helm_bin, "template", "grpo", str(CHART), "--namespace", NAMESPACE, "--kube-version", kube_version,
              values={"crds": {"celRules": cel_rules}})
    (crd,) = by_kind(objects(cp.stdout), "CustomResourceDefinition")
    kube = crdgen.parse_kube_version(kube_version)
    generated = yaml.safe_load(crdgen.crd_yaml(kube))
    expected = generated if with_cel else _without_cel(generated)
    assert ("x-kubernetes-int-or-string" in json.dumps(crd)) is (kube >= (1, 21))
    # atomic where the API server's field manager would walk a deep value slowly (before 1.25), per-field after
    assert ("x-kubernetes-map-type" in json.dumps(crd)) is (kube < (1, 25))
    assert crd["spec"] == expected["spec"]
    assert ("x-kubernetes-validations" in json.dumps(crd)) is with_cel
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert crd["metadata"]["name"] == "grpojobs.grpo.dev"


def test_crd_can_be_left_to_the_user() -> None:
    assert not by_kind(render({"crds": {"install": False}}), "CustomResourceDefinition")
    assert by_kind(render(), "CustomResourceDefinition")


def test_chart_installs_on_kubernetes_1_20() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.20.0-0"
    for helm_bin in HELMS:
        helm(helm_bin, "template", "grpo", str(CHART), "--kube-version", "1.20.2")  # no "incompatible" error


# ------------------------------------------------------------------------------------------ lint / template
@pytest.mark.parametrize("helm_bin", HELMS)
def test_lint_strict(helm_bin: str) -> None:
    for name, values in VALUE_SETS.items():
        cp = helm(helm_bin, "lint", "--strict", str(CHART), "--namespace", NAMESPACE, values=values, check=False)
        assert cp.returncode == 0, f"{helm_bin} lint --strict ({name}):\n{cp.stdout}\n{cp.stderr}"


@functools.cache
def _rendered(helm_bin: str, name: str) -> str:
    return template(helm_bin, VALUE_SETS[name])


@functools.cache
def _objects(helm_bin: str, name: str) -> list[dict[str, Any]]:
    return objects(_rendered(helm_bin, name))


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm3_and_helm4_render_the_same(name: str) -> None:
    def key(d: dict[str, Any]) -> tuple[str, str, str]:
        return (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])

    # the same objects (helm 4 orders some kinds differently)
    assert sorted(_objects("helm3", name), key=key) == sorted(_objects("helm4", name), key=key)


@functools.cache
def _validate(doc_json: str, version: str) -> None:
    kubernetes_validate.validate(json.loads(doc_json), version, strict=True)


@functools.cache
def _objects_for(name: str, version: str) -> list[dict[str, Any]]:
    return objects(helm("helm3", "template", "grpo", str(CHART), "--namespace", NAMESPACE, "--include-crds",
                        "--kube-version", f"{version}.0", values=VALUE_SETS[name]).stdout)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_objects_pass_kubernetes_validate(version: str) -> None:
    """What the chart renders for each Kubernetes minor (as `helm install` renders for the server it talks to)."""
    skipped: dict[str, str] = {}
    for name in sorted(VALUE_SETS):
        for doc in _objects_for(name, version):
            key = (doc["apiVersion"], doc["kind"])
            if key in SKIP_KINDS:
                skipped[f"{key[0]} {key[1]}"] = SKIP_KINDS[key]
                continue
            try:
                _validate(json.dumps(doc, sort_keys=True), version)
            except Exception as exc:
                raise AssertionError(f"{name}: {doc['kind']} {doc['metadata'].get('name')} invalid for "
                                     f"Kubernetes {version}: {exc}") from None
    assert set(skipped) <= {f"{a} {k}" for a, k in SKIP_KINDS}


# ------------------------------------------------------------------------------------------ values schema
def _walk_schema(node: dict[str, Any], path: str = "") -> Any:
    for key, sub in (node.get("properties") or {}).items():
        yield f"{path}.{key}".lstrip("."), sub
        yield from _walk_schema(sub, f"{path}.{key}")


def test_every_value_is_typed_and_described() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    seen = set()
    for path, node in _walk_schema(schema):
        seen.add(path)
        assert node.get("type"), f"{path}: no type"
        assert node.get("description"), f"{path}: no description"

    def keys(d: Any, prefix: str = "") -> Any:
        for k, v in d.items():
            p = f"{prefix}.{k}".lstrip(".")
            yield p
            if isinstance(v, dict) and v and p not in ("resources.requests", "resources.limits", "podSecurityContext",
                                                      "securityContext"):
                yield from keys(v, p)

    ignored = ("podSecurityContext.", "securityContext.", "resources.")
    missing = [k for k in keys(values) if k not in seen and not k.startswith(ignored)]
    assert not missing, f"values.yaml keys without a schema entry: {missing}"


BAD_VALUES = [
    # (--set, words the error must contain)
    ("replicaCount=0", ["replicaCount"]),
    ("replicaCount=two", ["replicaCount"]),
    ("webhook.certificates=vault", ["certificates"]),
    ("webhook.port=443", ["port"]),
    ("webhook.failurePolicy=Sometimes", ["failurePolicy"]),
    ("webhook.timeoutSeconds=60", ["timeoutSeconds"]),
    ("watch.namespaces={Team_A}", ["namespaces"]),
    ("image.pullPolicy=Sometimes", ["pullPolicy"]),
    ("trainerImage=not an image", ["trainerImage"]),
    ("logging.level=LOUD", ["level"]),
    ("replicas=2", ["replicas"]),  # a typo of replicaCount: unknown keys are refused
    ("webhook.certManager.issuerRef.kind=Vault", ["kind"]),
    ("metrics.port=80", ["port"]),
    ("metrics.trainerPort=70000", ["trainerPort"]),
    ("metrics.serviceMonitor.interval=soon", ["interval"]),
    ("metrics.progressIntervalSeconds=-1", ["progressIntervalSeconds"]),
    ("lifecycle.forceDeleteAfterSeconds=-5", ["forceDeleteAfterSeconds"]),
    ("lifecycle.backoffBaseSeconds=soon", ["backoffBaseSeconds"]),
]


@pytest.mark.parametrize("helm_bin", HELMS)
@pytest.mark.parametrize("setting,words", BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_bad_values_are_refused_by_the_schema(helm_bin: str, setting: str, words: list[str]) -> None:
    cp = helm(helm_bin, "template", "x", str(CHART), set_args=[setting], check=False)
    assert cp.returncode != 0, f"{setting} accepted"
    err = cp.stderr
    assert "schema" in err.lower(), err
    for w in words:
        assert w in err, f"{setting}: {w!r} not in the error:\n{err}"


@pytest.mark.parametrize("helm_bin", HELMS)
def test_ha_with_operator_certificates_is_refused_with_a_reason(helm_bin: str) -> None:
    cp = helm(helm_bin, "template", "x", str(CHART), set_args=["replicaCount=2"], check=False)
    assert cp.returncode != 0
    assert "replicaCount=2 needs webhook.certificates=cert-manager" in cp.stderr, cp.stderr


# ------------------------------------------------------------------------------------------ what it renders
def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def is_user_role(doc: dict[str, Any]) -> bool:
    """The aggregated grpojob-edit/-view ClusterRoles (rbac.aggregatedRoles): for people, bound to no one by the chart."""
    return any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in doc["metadata"].get("labels", {}))


def operator_cluster_roles(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in by_kind(docs, "ClusterRole") if not is_user_role(d)]


def rules_of(docs: list[dict[str, Any]]) -> list[tuple[str, str, tuple[str, ...], tuple[str, ...], str]]:
    """(role kind/name@ns, apiGroup, resources, verbs, resourceNames) for every rule of the operator's roles."""
    out = []
    for d in docs:
        if d["kind"] in ("Role", "ClusterRole") and not is_user_role(d):
            where = f"{d['kind']}/{d['metadata']['name']}@{d['metadata'].get('namespace', '')}"
            for r in d["rules"]:
                for g in r["apiGroups"]:
                    out.append((where, g, tuple(r["resources"]), tuple(r["verbs"]), ",".join(r.get("resourceNames", []))))
    return out


def test_no_secret_access_and_no_wildcards_in_any_mode() -> None:
    for name, values in VALUE_SETS.items():
        for where, group, resources, verbs, names in rules_of(render(values)):
            assert "secrets" not in resources, (name, where)
            assert "*" not in resources and "*" not in verbs and group != "*", (name, where)
            if ((group, resources) == ("coordination.k8s.io", ("leases",)) and names) or resources == ("grpojobs/finalizers",) \
                    or (group, resources) == ("networking.k8s.io", ("networkpolicies",)):
                # renewing the one Lease is an update (PUT); finalizers: for blockOwnerDeletion, grants nothing else;
                # a job's NetworkPolicy that differs from the rendered one is replaced in place (controller/netpols.py)
                verbs = tuple(v for v in verbs if v != "update")
            assert not {"update", "deletecollection", "escalate", "bind", "impersonate"} & set(verbs), (name, where)


def test_default_is_clusterwide_with_operator_managed_webhook() -> None:
    docs = render()
    (cr,) = operator_cluster_roles(docs)
    assert not by_kind(docs, "Role")
    groups = {(g, r) for _, g, res, _, _ in rules_of(docs) for r in res}
    assert ("apiextensions.k8s.io", "customresourcedefinitions") in groups
    assert ("admissionregistration.k8s.io", "validatingwebhookconfigurations") in groups
    assert not any(g == "kopf.dev" for g, _ in groups)  # no peering with one replica
    vwc_patch = [r for r in cr["rules"] if r["verbs"] == ["patch"] and "validatingwebhookconfigurations" in r["resources"]]
    assert vwc_patch[0]["resourceNames"] == ["grpo-grpo-operator.grpo.dev"]
    (dep,) = by_kind(docs, "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GRPO_ALL_NAMESPACES"] == "true" and env["GRPO_WEBHOOK_MANAGE"] == "true"
    assert env["GRPO_WEBHOOK_HOST"] == "grpo-grpo-operator-webhook.grpo-system.svc"
    assert env["GRPO_WEBHOOK_SERVICE"] == "grpo-system/grpo-grpo-operator-webhook:9443"
    assert env["GRPO_WEBHOOK_CONFIG_NAME"] == "grpo-grpo-operator.grpo.dev"
    assert env["GRPO_WEBHOOK_FAILURE_POLICY"] == "Fail"  # the operator writes the chart's webhook.failurePolicy
    ignore = by_kind(render({"webhook": {"failurePolicy": "Ignore"}}), "Deployment")[0]
    assert {e["name"]: e.get("value") for e in ignore["spec"]["template"]["spec"]["containers"][0]["env"]}[
        "GRPO_WEBHOOK_FAILURE_POLICY"] == "Ignore"
    assert env["GRPO_TRAINER_IMAGE"] == "ghcr.io/grpo-operator/grpo-trainer:0.1.0"
    assert "GRPO_PEERING" not in env and dep["spec"]["strategy"]["type"] == "Recreate"
    # the chart owns the configuration, empty (helm uninstall deletes it); the operator fills it in, creating nothing
    (wc,) = by_kind(docs, "ValidatingWebhookConfiguration")
    assert wc["metadata"]["name"] == env["GRPO_WEBHOOK_CONFIG_NAME"] and wc["webhooks"] == []
    assert not by_kind(docs, "MutatingWebhookConfiguration") and env["GRPO_WEBHOOK_CREATE"] == "false"
    webhook_rules = [r for r in cr["rules"] if "admissionregistration.k8s.io" in r["apiGroups"]]
    assert webhook_rules == [{"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations"],
                              "resourceNames": ["grpo-grpo-operator.grpo.dev"], "verbs": ["patch"]}]
    assert not by_kind(docs, "Certificate")


def test_namespaced_mode_has_a_role_per_namespace_and_no_clusterwide_job_access() -> None:
    docs = render(VALUE_SETS["namespaced"])
    roles = by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in by_kind(docs, "RoleBinding")) == ["team-a", "team-b"]
    (cr,) = operator_cluster_roles(docs)  # only the webhook configuration (operator-managed)
    assert {r for rule in cr["rules"] for r in rule["resources"]} == {"validatingwebhookconfigurations"}
    (dep,) = by_kind(docs, "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GRPO_NAMESPACES"] == "team-a,team-b" and env["GRPO_SCANNING"] == "0"
    assert "GRPO_ALL_NAMESPACES" not in env
    cm = render({**VALUE_SETS["namespaced"], "webhook": {"certificates": "cert-manager"}})
    assert not operator_cluster_roles(cm) and not by_kind(cm, "ClusterRoleBinding")
    (vwc,) = by_kind(cm, "ValidatingWebhookConfiguration")
    assert vwc["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["team-a", "team-b"]


def test_cert_manager_mode() -> None:
    docs = render(VALUE_SETS["cert-manager"])
    (cert,) = by_kind(docs, "Certificate")
    (issuer,) = by_kind(docs, "Issuer")
    assert cert["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"] and "selfSigned" in issuer["spec"]
    assert "grpo-grpo-operator-webhook.grpo-system.svc" in cert["spec"]["dnsNames"]
    (vwc,) = by_kind(docs, "ValidatingWebhookConfiguration")
    assert vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"grpo-system/{cert['metadata']['name']}"
    hook = vwc["webhooks"][0]
    assert hook["clientConfig"]["service"] == {"name": "grpo-grpo-operator-webhook", "namespace": "grpo-system",
                                               "port": 9443, "path": "/validate"}
    assert hook["rules"][0]["resources"] == ["grpojobs"] and hook["failurePolicy"] == "Fail"
    (svc,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-webhook")]
    assert svc["spec"]["ports"][0]["port"] == 9443
    pod = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["GRPO_WEBHOOK_CERT_DIR"] == "/etc/grpo-operator/webhook-tls" and "GRPO_WEBHOOK_MANAGE" not in env
    secret_vols = [v for v in pod["volumes"] if "secret" in v]
    assert secret_vols[0]["secret"]["secretName"] == cert["spec"]["secretName"]
    assert not any("validatingwebhookconfigurations" in r for _, _, r, _, _ in rules_of(docs))
    own = render(VALUE_SETS["cert-manager-issuer"])
    assert not by_kind(own, "Issuer")
    assert by_kind(own, "Certificate")[0]["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}


def test_ha_uses_leader_election() -> None:
    docs = render(VALUE_SETS["ha"])
    (dep,) = by_kind(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    lease = dep["metadata"]["name"]
    assert env["GRPO_LEADER_ELECT"]["value"] == "true" and "GRPO_PEERING" not in env
    assert env["GRPO_LEADER_ELECT_LEASE"]["value"] == f"{NAMESPACE}/{lease}"
    lease_rules = sorted((res, verbs, names) for _, g, res, verbs, names in rules_of(docs) if g == "coordination.k8s.io")
    assert lease_rules == [(("leases",), ("create",), ""), (("leases",), ("get", "update"), lease)]
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert not any(g == "kopf.dev" for _, g, _, _, _ in rules_of(docs))
    ns = render(VALUE_SETS["ha-namespaced"])
    assert [r["metadata"]["namespace"] for r in by_kind(ns, "Role") if r["metadata"]["name"].endswith("-leader-election")
            ] == [NAMESPACE]  # the Lease lives with the operator, not in the watched namespaces
    assert not [s for s in by_kind(ns, "Service") if s["metadata"]["name"].endswith("-webhook")]  # webhook disabled
    one = render({})
    assert not [r for r in by_kind(one, "Role") if r["metadata"]["name"].endswith("-leader-election")]


def test_restricted_security_context_probes_and_resources() -> None:
    for name, values in VALUE_SETS.items():
        pod = by_kind(render(values), "Deployment")[0]["spec"]["template"]["spec"]
        c = pod["containers"][0]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
        assert sc["readOnlyRootFilesystem"] is True
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["GRPO_LIVENESS"] == "http://0.0.0.0:8080/healthz"
        assert c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"], name


def test_custom_images() -> None:
    docs = render(VALUE_SETS["custom-image"])
    pod = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] == "registry.example.com/ml/grpo-operator:0.2.0-rc1" and c["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["GRPO_TRAINER_IMAGE"] == "registry.example.com/ml/grpo-trainer:0.2.0-cu124"
    digest = "sha256:" + "a" * 64
    c = by_kind(render({"image": {"tag": "@" + digest}}), "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == f"ghcr.io/grpo-operator/grpo-operator@{digest}"


def test_notes_tell_what_to_do_next() -> None:
    cp = helm("helm4", "install", "grpo", str(CHART), "--dry-run=client", "--namespace", NAMESPACE)
    assert "kubectl wait grpojob/<name> --for=condition=Succeeded" in cp.stdout
    assert "grpojob check" in cp.stdout and "rollout status deployment/grpo-grpo-operator" in cp.stdout


def test_examples_kustomization_builds() -> None:
    import subprocess

    from tests.support.cluster.kubectl import kubectl_path

    out = subprocess.run([str(kubectl_path()), "kustomize", str(REPO / "examples")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    docs = objects(out.stdout)
    assert {d["kind"] for d in docs} == {"GRPOJob"}
    from grpo_operator.rules import validation

    for d in docs:
        if "invalid" not in d["metadata"]["name"]:
            assert validation.validate(d).valid, (d["metadata"]["name"], validation.validate(d).summary())
    # the check examples/kustomization.yml recommends passes (a glob of examples/*.yaml would not: invalid-batch.yaml)
    import sys
    import tempfile

    assert "grpojob check /tmp/jobs.yaml" in (REPO / "examples" / "kustomization.yml").read_text()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(out.stdout)
        f.flush()
        check = subprocess.run([sys.executable, "-m", "grpo_operator.cli.grpojob", "check", f.name],
                               capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr


# ------------------------------------------------------------------------------------------ metrics
def _env(dep: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_metrics_port_service_and_no_monitors_by_default() -> None:
    docs = render()
    (dep,) = by_kind(docs, "Deployment")
    env = _env(dep)
    assert env["GRPO_METRICS_LISTEN"] == "0.0.0.0:8081" and env["GRPO_TRAINER_METRICS_PORT"] == "9400"
    assert env["GRPO_PROGRESS_INTERVAL_SECONDS"] == "15"
    ports = {p["name"]: p["containerPort"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ports["metrics"] == 8081
    (svc,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics")]
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}]
    assert not by_kind(docs, "ServiceMonitor") and not by_kind(docs, "PodMonitor")
    docs = render(VALUE_SETS["no-metrics"])
    assert "GRPO_METRICS_LISTEN" not in _env(by_kind(docs, "Deployment")[0])
    assert not [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics")]


def test_service_monitor_and_pod_monitor() -> None:
    docs = render(VALUE_SETS["monitors"])
    (sm,) = by_kind(docs, "ServiceMonitor")
    (svc,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics")]
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert all(svc["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    webhook_svc = [s for s in by_kind(docs, "Service") if s is not svc]
    assert not any(all(s["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
                   for s in webhook_svc)  # only the metrics Service
    assert sm["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    (pm,) = by_kind(docs, "PodMonitor")
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics" and pm["spec"]["podMetricsEndpoints"][0]["interval"] == "30s"
    # it selects exactly what the operator renders on trainer pods
    from grpo_operator.render import manifests
    from grpo_operator.rules import validation

    job = {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "j"},
           "spec": {"model": "m", "dataset": {"name": "d"}, "rewards": [{"name": "accuracy"}],
                    "resources": {"limits": {"nvidia.com/gpu": 1}}}}
    res = validation.validate(job)
    pod = [o for o in manifests.core_objects(res.job, res.topology, "ns") if o["kind"] == "Pod"][0]
    assert all(pod["metadata"]["labels"].get(k) == v for k, v in pm["spec"]["selector"]["matchLabels"].items())
    assert "metrics" in {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    assert _env(by_kind(docs, "Deployment")[0])["GRPO_PROGRESS_INTERVAL_SECONDS"] == "5"
    docs = render(VALUE_SETS["monitors-namespaced"])
    (pm,) = by_kind(docs, "PodMonitor")
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}
    assert _env(by_kind(docs, "Deployment")[0])["GRPO_TRAINER_METRICS_PORT"] == "0"


# ------------------------------------------------------------------------------------------ lifecycle
@pytest.mark.parametrize("values, force, base, cap", [
    ({}, "60", "10", "300"),
    ({"lifecycle": {"forceDeleteAfterSeconds": None, "backoffBaseSeconds": 2.5, "backoffCapSeconds": 60}},
     "off", "2.5", "60"),
    ({"lifecycle": {"forceDeleteAfterSeconds": 0}}, "0", "10", "300"),
])
def test_lifecycle_values_reach_the_operator(values: dict[str, Any], force: str, base: str, cap: str) -> None:
    from grpo_operator.controller.settings import Settings

    env = _env(by_kind(render(values), "Deployment")[0])
    assert (env["GRPO_FORCE_DELETE_AFTER_SECONDS"], env["GRPO_BACKOFF_BASE_SECONDS"],
            env["GRPO_BACKOFF_CAP_SECONDS"]) == (force, base, cap)
    policy = Settings.from_env(env).policy  # what the operator makes of them
    assert policy.force_delete_after == (None if force == "off" else float(force))
    assert (policy.backoff_base, policy.backoff_cap) == (float(base), float(cap))


@pytest.mark.parametrize("values, env", [({}, None), ({"policy": {"maxNodesPerJob": None}}, None),
                                         ({"policy": {"maxNodesPerJob": 4}}, "4")])
def test_the_node_limit_reaches_the_operator(values: dict[str, Any], env: Optional[str]) -> None:
    from grpo_operator.controller.settings import Settings

    got = _env(by_kind(render(values), "Deployment")[0])
    assert got.get("GRPO_MAX_NODES_PER_JOB") == env
    assert Settings.from_env(got).limits.max_nodes_per_job == (None if env is None else int(env))


def test_finalizers_update_is_granted_for_block_owner_deletion() -> None:
    for name in ("default", "namespaced"):
        rules = rules_of(render(VALUE_SETS.get(name, {})))
        assert any(g == "grpo.dev" and res == ("grpojobs/finalizers",) and verbs == ("update",)
                   for _, g, res, verbs, _ in rules), name


def test_network_policy_admits_job_pods_the_operator_and_named_scrapers() -> None:
    assert not by_kind(render(VALUE_SETS["namespaced"]), "NetworkPolicy")  # off by default
    prom = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    docs = render({**VALUE_SETS["namespaced"], "networkPolicy": {"enabled": True, "metricsFrom": [prom]}})
    pols = [p for p in by_kind(docs, "NetworkPolicy") if p["metadata"]["name"].endswith("-jobs")]
    assert sorted(p["metadata"]["namespace"] for p in pols) == ["team-a", "team-b"]
    # the operator reaches a kept vLLM server for its engine probe (any port: spec.vllm.server.port is per job)
    probes = [p for p in by_kind(docs, "NetworkPolicy") if p["metadata"]["name"].endswith("-vllm-probe")]
    assert sorted(p["metadata"]["namespace"] for p in probes) == ["team-a", "team-b"]
    probe = probes[0]["spec"]
    assert probe["podSelector"] == {"matchLabels": {"grpo.dev/role": "vllm-server"}} and "ports" not in probe["ingress"][0]
    assert probe["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": NAMESPACE}
    spec = pols[0]["spec"]
    job_pods = {"matchExpressions": [{"key": "grpo.dev/job-name", "operator": "Exists"}]}
    assert spec["podSelector"] == job_pods and spec["policyTypes"] == ["Ingress"]
    each_other, metrics = spec["ingress"]
    assert each_other == {"from": [{"podSelector": job_pods}]}  # c10d, NCCL, vLLM and its weight sync: every port
    assert metrics["ports"] == [{"port": 9400, "protocol": "TCP"}]
    assert metrics["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": NAMESPACE}
    assert metrics["from"][1] == prom
    cp = helm(HELMS[0], "template", "x", str(CHART), values={"networkPolicy": {"enabled": True}}, check=False)
    assert cp.returncode != 0 and "networkPolicy.namespaces" in cp.stderr


# ------------------------------------------------------------------------------------------ platform teams
@pytest.mark.parametrize("helm_bin", HELMS)
def test_aggregated_roles_let_namespace_editors_and_viewers_use_grpojobs(helm_bin: str) -> None:
    """rbac.aggregatedRoles (on by default, in every mode): edit gets exactly create/get/list/watch/patch/update/delete
    on grpojobs (no deletecollection, no status writes), view get/list/watch on grpojobs and their status; both are
    bound to no one by the chart (the built-in roles' bindings apply them)."""
    for name in ("default", "namespaced", "ha"):
        docs = _objects(helm_bin, name)
        roles = {r["metadata"]["name"]: r for r in by_kind(docs, "ClusterRole") if is_user_role(r)}
        assert sorted(roles) == ["grpo-grpo-operator-grpojob-edit", "grpo-grpo-operator-grpojob-view"], name
        edit, view = roles["grpo-grpo-operator-grpojob-edit"], roles["grpo-grpo-operator-grpojob-view"]
        aggregate = "rbac.authorization.k8s.io/aggregate-to-"
        assert {k[len(aggregate):] for k, v in edit["metadata"]["labels"].items()
                if k.startswith(aggregate) and v == "true"} == {"edit", "admin"}
        assert {k[len(aggregate):] for k, v in view["metadata"]["labels"].items()
                if k.startswith(aggregate) and v == "true"} == {"view", "edit", "admin"}
        assert edit["rules"] == [{"apiGroups": ["grpo.dev"], "resources": ["grpojobs"],
                                  "verbs": ["create", "get", "list", "watch", "patch", "update", "delete"]}]
        assert view["rules"] == [{"apiGroups": ["grpo.dev"], "resources": ["grpojobs", "grpojobs/status"],
                                  "verbs": ["get", "list", "watch"]}]
        bound = {b["roleRef"]["name"] for b in [*by_kind(docs, "ClusterRoleBinding"), *by_kind(docs, "RoleBinding")]}
        assert not bound & set(roles), name
    assert not [r for r in _objects(helm_bin, "no-user-roles") if r["kind"] == "ClusterRole" and is_user_role(r)]


def _pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]


@pytest.mark.parametrize("helm_bin", HELMS)
def test_replicas_get_a_disruption_budget_and_are_spread(helm_bin: str) -> None:
    """replicaCount > 1: a PDB over exactly the Deployment's pods, soft anti-affinity on the node and a soft spread
    over zones by default; `highAvailability` changes each; a single replica gets none of them."""
    docs = _objects(helm_bin, "ha")
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    (dep,) = by_kind(docs, "Deployment")
    selector = dep["spec"]["selector"]["matchLabels"]
    assert pdb["apiVersion"] == "policy/v1" and pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": selector}}
    assert pdb["metadata"]["namespace"] == NAMESPACE
    pod = _pod_spec(docs)
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term == {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                       "labelSelector": {"matchLabels": selector}}}
    assert pod["topologySpreadConstraints"] == [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                                 "whenUnsatisfiable": "ScheduleAnyway",
                                                 "labelSelector": {"matchLabels": selector}}]
    hard = _objects(helm_bin, "ha-hard")
    (pdb,) = by_kind(hard, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == "50%"
    pod = _pod_spec(hard)
    assert pod["affinity"]["podAntiAffinity"] == {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": selector}}]}
    assert pod["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "DoNotSchedule"
    # a single replica: no PDB (it would block every node drain), no spreading
    one = _objects(helm_bin, "default")
    assert not by_kind(one, "PodDisruptionBudget")
    assert "affinity" not in _pod_spec(one) and "topologySpreadConstraints" not in _pod_spec(one)
    # each can be turned off; the user's own affinity replaces the default anti-affinity
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}}
    off = objects(template(helm_bin, {**VALUE_SETS["ha"], "affinity": own, "highAvailability": {
        "podDisruptionBudget": {"enabled": False}, "topologySpread": {"enabled": False}}}, include_crds=False))
    assert not by_kind(off, "PodDisruptionBudget")
    assert _pod_spec(off)["affinity"] == own and "topologySpreadConstraints" not in _pod_spec(off)
    none = objects(template(helm_bin, {**VALUE_SETS["ha"], "highAvailability": {"podAntiAffinity": "none"}},
                            include_crds=False))
    assert "affinity" not in _pod_spec(none)


@pytest.mark.parametrize("helm_bin", HELMS)
@pytest.mark.parametrize("kube_version, api_version", [("1.20.2", "policy/v1beta1"), ("1.21.0", "policy/v1"),
                                                       ("1.36.0", "policy/v1")])
def test_disruption_budget_api_follows_the_server(helm_bin: str, kube_version: str, api_version: str) -> None:
    """policy/v1 exists from 1.21 and v1beta1 is gone from 1.25: the chart picks by the server's version."""
    cp = helm(helm_bin, "template", "grpo", str(CHART), "--namespace", NAMESPACE, "--kube-version", kube_version,
              values=VALUE_SETS["ha-hard"])
    (pdb,) = by_kind(objects(cp.stdout), "PodDisruptionBudget")
    assert pdb["apiVersion"] == api_version


@pytest.mark.parametrize("helm_bin", HELMS)
def test_production_example(helm_bin: str) -> None:
    """values-production.yaml (linted, rendered by both helms and schema-checked with every value set above) gives
    what it promises: HA with a budget and spreading, cert-manager, monitors, both images from the private registry."""
    docs = _objects(helm_bin, "production")
    (dep,) = by_kind(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2 and by_kind(docs, "PodDisruptionBudget") and by_kind(docs, "Certificate")
    assert "podAntiAffinity" in pod["affinity"] and pod["topologySpreadConstraints"]
    assert pod["containers"][0]["image"].startswith("registry.example.com/ml/grpo-operator:")
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    env = _env(dep)
    assert env["GRPO_TRAINER_IMAGE"].startswith("registry.example.com/ml/") and env["GRPO_MAX_NODES_PER_JOB"] == "8"
    assert by_kind(docs, "ServiceMonitor") and by_kind(docs, "PodMonitor")
    assert pod["priorityClassName"] == "system-cluster-critical"
