"""Keys come from Secrets: a literal credential in spec.template.env is refused with the fix (the validator behind the
webhook and `grpojob check`); a secretKeyRef, an empty value and look-alike switches pass, and reach the pod as given."""

from __future__ import annotations

import pytest

from grpo_operator.rules import secrets, validation
from tests.support.jobs import manifest


def check(env: list[dict]) -> validation.ValidationResult:
    job = manifest("track")
    job["spec"]["template"] = {"env": env}
    return validation.validate(job)


@pytest.mark.parametrize("name", ["WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "MLFLOW_TRACKING_PASSWORD",
                                  "COMET_API_KEY", "NEPTUNE_API_TOKEN", "AWS_SECRET_ACCESS_KEY", "my_service_api_key",
                                  "TEAM_PASSWORD", "S3_SECRET"])
def test_a_literal_credential_is_refused_with_the_fix(name: str) -> None:
    res = check([{"name": "OMP_NUM_THREADS", "value": "4"}, {"name": name, "value": "abc123"}])
    assert [e.field for e in res.errors] == ["spec.template.env[1].value"], res.errors
    msg = res.errors[0].message
    assert msg.startswith(f"{name} holds a credential") and "abc123" not in msg
    if name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        assert "spec.hfTokenSecretRef" in msg
    else:
        assert f"{{name: {name}, valueFrom: {{secretKeyRef: {{name: <secret>, key: <key>}}}}}}" in msg


def test_a_secret_reference_an_empty_value_and_look_alikes_pass() -> None:
    env = [{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}},
           {"name": "WANDB_MODE", "value": "offline"}, {"name": "WANDB_PROJECT", "value": "grpo"},
           {"name": "HF_HUB_DISABLE_IMPLICIT_TOKEN", "value": "1"}, {"name": "TOKENIZERS_PARALLELISM", "value": "true"},
           {"name": "MLFLOW_TRACKING_URI", "value": "http://mlflow:5000"}, {"name": "HF_TOKEN", "value": ""}]
    res = check(env)
    assert res.valid, res.errors
    from grpo_operator.render import manifests

    assert res.job is not None and res.topology is not None
    pod = next(o for o in manifests.core_objects(res.job, res.topology, "ns") if o["kind"] == "Pod")
    got = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert got["WANDB_API_KEY"] == env[0]  # by reference only: the key itself is in no object the operator writes


def test_names() -> None:
    assert secrets.is_secret_name("wandb_api_key") and secrets.is_secret_name("GITHUB_TOKEN")
    assert not any(secrets.is_secret_name(n) for n in ("HF_HOME", "HF_HUB_OFFLINE", "WANDB_RUN_ID", "API_KEY_FILE",
                                                       "PASSWORD_FILE", "TRACKIO_DIR"))


@pytest.mark.parametrize("key", ["token", "use_auth_token"])
def test_a_token_in_model_init_kwargs_is_refused_with_the_fix(key: str) -> None:
    """Low finding of issue 27: modelInitKwargs.token was admitted and landed in the job's ConfigMap in clear."""
    job = manifest("tok")
    job["spec"]["training"]["modelInitKwargs"] = {key: "hf_abc123", "torch_dtype": "bfloat16"}
    res = validation.validate(job)
    assert [e.field for e in res.errors] == [f"spec.training.modelInitKwargs.{key}"], res.errors
    assert "spec.hfTokenSecretRef" in res.errors[0].message and "hf_abc123" not in res.errors[0].message
    job["spec"]["training"]["modelInitKwargs"] = {key: True}  # "use the token the pod has": no literal, admitted
    assert validation.validate(job).valid
