"""spec.parallelism: the DeepSpeed / FSDP arguments it renders into the trainer's config, the admission rules around
it (raw fields, offload, ZeRO-3 with vLLM) and TRL's GRPOConfig accepting what CPU can construct (FSDP; ZeRO-3 needs
deepspeed, which only scripts/gpu-check.sh can construct)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from grpo_operator.render import manifests
from grpo_operator.render import parallelism as render
from grpo_operator.rules import validation
from tests.support.jobs import manifest


def _job(parallelism: Any = None, **training: Any) -> dict[str, Any]:
    doc = manifest("j", nodes=2, gpus=8)
    if parallelism is not None:
        doc["spec"]["parallelism"] = parallelism
    doc["spec"]["training"].update(training)
    return doc


def _errors(doc: dict[str, Any]) -> dict[str, str]:
    return {e.field: e.message for e in validation.validate(doc).errors}


def _training(doc: dict[str, Any]) -> dict[str, Any]:
    res = validation.validate(doc)
    assert res.valid, res.errors
    assert res.job is not None
    training: dict[str, Any] = manifests.trainer_config(res.job, "ns")["training"]
    return training


def test_zero3_renders_trl_preset_into_the_trainer_config() -> None:
    training = _training(_job({"strategy": "zero3"}))
    ds = training["deepspeed"]
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    # the batch sizes stay those the operator validated: DeepSpeed's are filled in by transformers
    assert ds["train_micro_batch_size_per_gpu"] == ds["gradient_accumulation_steps"] == "auto"
    assert ds["bf16"] == {"enabled": "auto"} and "offload_optimizer" not in ds["zero_optimization"]
    assert "fsdp" not in training and training["per_device_train_batch_size"] == 2


@pytest.mark.parametrize("offload, optimizer, params", [("optimizer", True, False), ("parameters", True, True)])
def test_zero3_offload(offload: str, optimizer: bool, params: bool) -> None:
    ds = render.zero3_config(offload)
    zero = ds["zero_optimization"]
    assert ("offload_optimizer" in zero) is optimizer and ("offload_param" in zero) is params
    assert zero["offload_optimizer"]["device"] == "cpu"
    assert ds["zero_force_ds_cpu_optimizer"] is False  # the Trainer's AdamW on the offloaded state (no JIT CPUAdam)


def test_fsdp_renders_fsdp2_and_ddp_renders_nothing() -> None:
    training = _training(_job({"strategy": "fsdp"}))
    assert training["fsdp"] == "full_shard auto_wrap"
    assert training["fsdp_config"]["version"] == 2
    assert training["fsdp_config"]["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert _training(_job({"strategy": "fsdp", "offload": "parameters"}))["fsdp"] == "full_shard auto_wrap offload"
    plain = _training(_job())
    assert _training(_job({"strategy": "ddp"})) == plain and "deepspeed" not in plain


@pytest.mark.parametrize("parallelism, training, field, words", [
    ({"strategy": "zero3"}, {"deepspeed": {"zero_optimization": {"stage": 2}}}, "spec.parallelism", "both set"),
    ({"strategy": "fsdp"}, {"fsdpConfig": {"version": 2}}, "spec.parallelism", "remove training.fsdpConfig"),
    (None, {"deepspeed": {"zero_optimization": {"stage": 2}}, "fsdp": "full_shard"}, "spec.training.deepspeed",
     "choose one"),
    ({"strategy": "ddp", "offload": "optimizer"}, {}, "spec.parallelism.offload", "needs sharding"),
    ({"strategy": "fsdp", "offload": "optimizer"}, {}, "spec.parallelism.offload", "use offload: parameters"),
    ({"strategy": "zero3"}, {"ds3GatherForGeneration": False}, "spec.training.ds3GatherForGeneration",
     "needs ds3GatherForGeneration: true"),
    (None, {"deepspeed": {"zero_optimization": {"stage": 3}}, "ds3GatherForGeneration": False},
     "spec.training.ds3GatherForGeneration", "ZeRO-3 with vLLM"),
    ({"strategy": "bogus"}, {}, "spec.parallelism.strategy", "zero3"),
])
def test_refused(parallelism: Any, training: dict[str, Any], field: str, words: str) -> None:
    errors = _errors(_job(parallelism, **training))
    assert field in errors and words in errors[field], errors


def test_zero3_without_vllm_may_skip_the_gather() -> None:
    doc = _job({"strategy": "zero3"}, ds3GatherForGeneration=False)
    doc["spec"]["vllm"] = {"mode": "none"}
    assert validation.validate(doc).valid


@pytest.mark.parametrize("strategy", ["zero3", "fsdp"])
def test_refused_on_cpu_with_the_reason(strategy: str) -> None:
    doc = manifest("j", cpu=True)
    doc["spec"]["parallelism"] = {"strategy": strategy}
    errors = _errors(doc)
    assert "needs a GPU" in errors["spec.parallelism.strategy"]
    assert ("zero.Init" if strategy == "zero3" else "plain DDP") in errors["spec.parallelism.strategy"]


def test_one_process_shards_nothing() -> None:
    doc = manifest("j", gpus=1, num_generations=2)
    doc["spec"]["parallelism"] = {"strategy": "fsdp"}
    res = validation.validate(doc)
    assert res.valid and any("shards nothing" in w for w in res.warnings)


@pytest.mark.parametrize("offload", ["none", "parameters"])
def test_grpoconfig_accepts_the_fsdp_arguments(tmp_path: Any, offload: str) -> None:
    from trl import GRPOConfig

    args = render.fsdp_arguments(offload)
    config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **copy.deepcopy(args))
    assert config.fsdp_config["version"] == 2
    assert config.fsdp_config["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert config.fsdp_config.get("cpu_offload", False) is (offload == "parameters")


def test_grpoconfig_needs_deepspeed_for_zero3(tmp_path: Any) -> None:
    """Only because the CPU lock has no deepspeed (the capability table says so); gpu-check.sh builds it on CUDA."""
    from trl import GRPOConfig

    with pytest.raises(Exception, match="deepspeed"):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", deepspeed=render.zero3_config())


def test_the_trainer_passes_the_rendered_fsdp_arguments_to_grpoconfig(tmp_path: Any) -> None:
    """The whole path CPU can take: spec → rendered config → the trainer's parse and grpo_kwargs (its type checks)
    → GRPOConfig. cuda=True as in a GPU pod (use_cpu stays off); GRPOConfig builds without touching a device."""
    from trl import GRPOConfig

    from grpo_trainer import config as tconfig

    res = validation.validate(_job({"strategy": "fsdp"}))
    assert res.job is not None
    cfg = manifests.trainer_config(res.job, "ns", output_dir=str(tmp_path))
    kw = tconfig.grpo_kwargs(tconfig.parse(cfg), cuda=True, vllm_importable=False, warn=lambda _: None)
    assert kw["fsdp"] == "full_shard auto_wrap" and "use_cpu" not in kw
    # no GPU here to place it on; one process here, 16 in the pods: the batch fits the world size TRL sees
    config = GRPOConfig(**{**kw, "use_cpu": True, "report_to": "none", "per_device_train_batch_size": 8})
    assert config.fsdp_config["version"] == 2
