"""What create_job would send, checked with no server at all: every accepted input form, the webhook's validator run
locally (an invalid spec raises before any request), namespaces, queue labels; kube-config errors in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_operator import api
from grpo_operator.client import ConfigError, GRPOClient, InvalidJob

SPEC = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": {"name": "openai/gsm8k"}, "rewards": [{"name": "accuracy"}],
        "nodes": 2, "vllm": {"mode": "none"}, "training": {"perDeviceTrainBatchSize": 2, "numGenerations": 4}}


def manifest(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "j"}, "spec": {**SPEC, **spec}}


class NoServer:
    """Any API call is a test failure: validation must happen before the client talks to anyone."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the client called the API ({name}) for a spec it should have refused")


@pytest.fixture
def client() -> GRPOClient:
    from kubernetes import client as k8s

    c = GRPOClient(namespace="team-a", client_configuration=k8s.Configuration())
    c.custom = NoServer()  # type: ignore[assignment]
    c.core = NoServer()  # type: ignore[assignment]
    return c


def test_a_manifest_dict(client: GRPOClient) -> None:
    body = client.validate_job(manifest(), queue="q1", labels={"team": "a"})
    assert body["metadata"] == {"name": "j", "namespace": "team-a",
                                "labels": {"team": "a", "kueue.x-k8s.io/queue-name": "q1"}}
    assert body["spec"]["nodes"] == 2


def test_a_bare_spec_needs_a_name(client: GRPOClient) -> None:
    body = client.validate_job(dict(SPEC), name="bare", namespace="other")
    assert (body["kind"], body["metadata"]["name"], body["metadata"]["namespace"]) == ("GRPOJob", "bare", "other")
    with pytest.raises(InvalidJob, match="metadata.name: required"):
        client.validate_job(dict(SPEC))


def test_api_models(client: GRPOClient) -> None:
    spec = api.GRPOJobSpec.model_validate(SPEC)
    body = client.validate_job(spec, name="from-model")
    assert body["spec"]["training"] == {"perDeviceTrainBatchSize": 2, "numGenerations": 4}  # only what was set
    job = api.GRPOJob(metadata=api.ObjectMeta(name="whole"), spec=spec)
    assert client.validate_job(job)["metadata"]["name"] == "whole"


def test_a_yaml_file(client: GRPOClient, tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(manifest()))
    assert client.validate_job(str(f))["metadata"]["name"] == "j"
    assert client.validate_job(f, name="renamed")["metadata"]["name"] == "renamed"


@pytest.mark.parametrize("text,needle", [
    ("a: [1", "not valid YAML at line"),
    ("---\nkind: GRPOJob\n---\nkind: GRPOJob\n", "expected one GRPOJob document, found 2"),
    ("- 1\n- 2\n", "expected a GRPOJob mapping, got list"),
    ("", "found 0"),
])
def test_bad_files_name_the_file(client: GRPOClient, tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(InvalidJob, match=needle) as info:
        client.validate_job(str(f))
    assert str(info.value).startswith(str(f))
    with pytest.raises(InvalidJob, match="cannot read"):
        client.validate_job(str(tmp_path / "missing.yaml"))
    with pytest.raises(InvalidJob, match="is a directory"):
        client.validate_job(str(tmp_path))


def test_the_webhooks_validator_refuses_before_any_request(client: GRPOClient) -> None:
    with pytest.raises(InvalidJob) as info:
        client.create_job(manifest(training={"perDeviceTrainBatchSize": 2, "numGenerations": 3}, nodes=2))
    fields = [f for f, _ in info.value.errors]
    assert fields == ["spec.training.numGenerations"] and "numGenerations 3 →" in info.value.errors[0][1]
    assert isinstance(info.value, ValueError) and not info.value.server
    with pytest.raises(InvalidJob, match="trainig"):
        client.create_job(manifest(trainig={}))
    with pytest.raises(InvalidJob, match="not a GRPOJob"):
        client.create_job({**manifest(), "kind": "Job"})
    with pytest.raises(InvalidJob, match="create_job takes a dict"):
        client.create_job(42)


def test_namespace_conflict_is_refused(client: GRPOClient) -> None:
    m = manifest()
    m["metadata"]["namespace"] = "ns-a"
    assert client.validate_job(m)["metadata"]["namespace"] == "ns-a"
    with pytest.raises(InvalidJob, match="'ns-a' but namespace 'ns-b'"):
        client.validate_job(m, namespace="ns-b")


def test_kubeconfig_problems_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    with pytest.raises(ConfigError, match="does not exist"):
        GRPOClient()
    with pytest.raises(ConfigError, match="kube-config .*/missing does not exist"):
        GRPOClient(config_file=str(tmp_path / "missing"))
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "a",
           "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
           "users": [{"name": "u", "user": {"token": "t"}}],
           "contexts": [{"name": "a", "context": {"cluster": "c", "user": "u", "namespace": "ns-a"}},
                        {"name": "b", "context": {"cluster": "c", "user": "u"}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(cfg))
    assert GRPOClient(config_file=str(path)).namespace == "ns-a"
    assert GRPOClient(config_file=str(path), context="b").namespace == "default"
    assert GRPOClient(config_file=str(path), context="b", namespace="x").namespace == "x"
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent'}:{path}")  # set after `kubernetes` was imported
    assert GRPOClient().namespace == "ns-a"
    with pytest.raises(ConfigError) as info:
        GRPOClient(config_file=str(path), context="nope")
    assert "nope" in str(info.value) and "\n" not in str(info.value)
    path.write_text("{not yaml: [")
    with pytest.raises(ConfigError):
        GRPOClient(config_file=str(path))


def test_a_manifest_on_stdin(client: GRPOClient, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump(manifest())))
    assert client.validate_job("-")["metadata"]["name"] == "j"
    monkeypatch.setattr("sys.stdin", io.StringIO("kind: [\n"))
    with pytest.raises(InvalidJob, match="^<stdin>: not valid YAML"):
        client.validate_job("-")
