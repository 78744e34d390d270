"""spec.peft, rewards[].model and the model-loading options (training.modelInitKwargs, trustRemoteCode): one contract
from the API (admission) through the rendered trainer config to the trainer's GRPOConfig/LoraConfig (docs/trainer.md)."""

from __future__ import annotations

import pytest

from grpo_operator.render import manifests
from grpo_operator.rules import validation
from grpo_trainer import config as tconfig
from grpo_trainer import exitcodes as ec
from tests.support.jobs import manifest


def job(**spec_updates):
    doc = manifest("job", vllm_server=True)
    doc["spec"].update(spec_updates)
    return doc


def fields(res) -> list[str]:
    return [e.field for e in res.errors]


def test_peft_and_reward_model_reach_the_trainer_config():
    doc = job(peft={"r": 8, "alpha": 16, "targetModules": ["q_proj", "v_proj"], "modulesToSave": ["lm_head"]},
              rewards=[{"name": "accuracy"}, {"model": "my-org/rm-1.5b", "weight": 0.5}])
    res = validation.validate(doc)
    assert res.valid, res.summary()
    cfg = manifests.trainer_config(res.job, "ns")
    assert cfg["peft"] == {"r": 8, "alpha": 16, "dropout": 0.05, "targetModules": ["q_proj", "v_proj"],
                           "modulesToSave": ["lm_head"]}
    assert cfg["rewards"] == [{"name": "accuracy", "function": None, "weight": 1.0},
                              {"name": None, "function": None, "weight": 0.5, "model": "my-org/rm-1.5b"}]
    parsed = tconfig.parse(cfg)
    assert parsed.rewards[1].label == "rm-1.5b"  # TRL's metric name: rewards/rm-1.5b/mean
    lora = parsed.peft.lora_config()
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (8, 16, 0.05)
    assert set(lora.target_modules) == {"q_proj", "v_proj"} and lora.modules_to_save == ["lm_head"]
    assert "peft" not in manifests.trainer_config(validation.validate(job()).job, "ns")  # full fine-tuning


def test_all_linear_and_defaults():
    res = validation.validate(job(peft={"targetModules": "all-linear"}))
    assert res.valid, res.summary()
    lora = tconfig.parse(manifests.trainer_config(res.job, "ns")).peft.lora_config()
    assert (lora.r, lora.lora_alpha, lora.target_modules, lora.task_type) == (16, 32, "all-linear", "CAUSAL_LM")


@pytest.mark.parametrize("peft, field", [
    ({"r": 0}, "spec.peft.r"), ({"dropout": 1.0}, "spec.peft.dropout"), ({"targetModules": "all"}, "spec.peft.targetModules"),
    ({"targetModules": []}, "spec.peft.targetModules"), ({"rank": 8}, "spec.peft.rank"),
    ({"modulesToSave": ["lm head"]}, "spec.peft.modulesToSave[0]"),
])
def test_bad_peft_is_refused_naming_the_field(peft, field):
    res = validation.validate(job(peft=peft))
    assert not res.valid and any(f.startswith(field) for f in fields(res)), res.summary()


@pytest.mark.parametrize("reward", [{"name": "accuracy", "model": "x/rm"}, {"function": "m:f", "model": "x/rm"}, {},
                                    {"model": "-rm"}])
def test_a_reward_is_exactly_one_of_name_function_model(reward):
    res = validation.validate(job(rewards=[reward]))
    assert not res.valid and any(f.startswith("spec.rewards") for f in fields(res)), res.summary()


@pytest.mark.parametrize("key", ["device_map", "quantization_config", "trust_remote_code"])
def test_model_init_kwargs_that_torchrun_or_trl_decide_are_refused_with_the_reason(key):
    doc = job()
    doc["spec"]["training"]["modelInitKwargs"] = {"dtype": "bfloat16", key: "auto"}
    res = validation.validate(doc)
    assert fields(res) == [f"spec.training.modelInitKwargs.{key}"], res.summary()
    assert "not supported" in res.errors[0].message
    cfg = manifests.trainer_config(validation.validate(job()).job, "ns")
    cfg["training"]["model_init_kwargs"] = {key: "auto"}
    with pytest.raises(ec.TrainerError) as err:  # the trainer refuses it too (a config rendered by hand)
        tconfig.grpo_kwargs(tconfig.parse(cfg), cuda=False, vllm_importable=False)
    assert err.value.code == ec.CONFIG and key in err.value.message


def test_model_init_kwargs_get_an_explicit_dtype_and_the_trust_switch():
    doc = job()
    doc["spec"]["training"].update(modelInitKwargs={"revision": "abc123", "attn_implementation": "sdpa"},
                                   trustRemoteCode=True)
    res = validation.validate(doc)
    assert res.valid, res.summary()
    kw = tconfig.grpo_kwargs(tconfig.parse(manifests.trainer_config(res.job, "ns")), cuda=False,
                             vllm_importable=False)
    assert kw["model_init_kwargs"] == {"revision": "abc123", "attn_implementation": "sdpa", "dtype": "float32",
                                       "trust_remote_code": True}
    assert kw["trust_remote_code"] is True
    plain = tconfig.grpo_kwargs(tconfig.parse(manifests.trainer_config(validation.validate(job()).job, "ns")),
                                cuda=False, vllm_importable=False)
    assert plain["model_init_kwargs"] == {"dtype": "float32", "trust_remote_code": False}  # never None: no prompt


def test_vllm_server_gets_the_revision_and_trust_flags():
    doc = job()
    doc["spec"]["training"].update(modelInitKwargs={"revision": "v1.2"}, trustRemoteCode=True)
    argv = manifests.vllm_server_argv(validation.validate(doc).job, 1)
    i = argv.index("--revision")
    assert argv[i + 1] == "v1.2" and argv[argv.index("--tokenizer-revision") + 1] == "v1.2"
    assert "--trust-remote-code" in argv
    plain = manifests.vllm_server_argv(validation.validate(job()).job, 1)
    assert "--revision" not in plain and "--trust-remote-code" not in plain
