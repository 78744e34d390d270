"""spec.parallelism → the GRPOConfig (TrainingArguments) arguments that select DeepSpeed ZeRO-3 or FSDP (pure).

Under torchrun neither needs `accelerate launch` nor environment variables: TrainingArguments builds the DeepSpeed
plugin from the `deepspeed` dict and the Trainer the FSDP plugin from `fsdp` + `fsdp_config`
(checked here with the locked transformers and deepspeed). "auto" values are filled in by transformers from the
other arguments, so the batch sizes stay those the operator validated. The configs follow TRL's shipped presets
(trl/accelerate_configs)."""

from __future__ import annotations

from typing import Any, Optional

from .. import api


def zero3_config(offload: str = "none") -> dict[str, Any]:
    """TRL's zero3 preset as a DeepSpeed config dict (bf16/fp16 follow the training arguments)."""
    zero: dict[str, Any] = {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        # a full, loadable model at save time (not only the shards)
        "stage3_gather_16bit_weights_on_model_save": True,
    }
    config: dict[str, Any] = {
        "zero_optimization": zero,
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "gradient_clipping": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
    }
    if offload in ("optimizer", "parameters"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        # the Trainer's torch AdamW steps the offloaded state on the CPU; without this DeepSpeed insists on its own
        # CPUAdam (a JIT-compiled op) and raises ZeRORuntimeException (seen with the locked deepspeed)
        config["zero_force_ds_cpu_optimizer"] = False
    if offload == "parameters":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return config


def fsdp_arguments(offload: str = "none") -> dict[str, Any]:
    """FSDP2, fully sharded, one unit per transformer layer (TRL's fsdp2 preset), a full state dict at save time."""
    return {
        "fsdp": "full_shard auto_wrap" + (" offload" if offload == "parameters" else ""),
        "fsdp_config": {
            "version": 2,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "reshard_after_forward": True,
            "state_dict_type": "FULL_STATE_DICT",
        },
    }


def training_arguments(parallelism: Optional[api.ParallelismSpec]) -> dict[str, Any]:
    """The snake_case GRPOConfig arguments the preset sets ({} for none or ddp)."""
    if parallelism is None or parallelism.strategy == "ddp":
        return {}
    if parallelism.strategy == "zero3":
        return {"deepspeed": zero3_config(parallelism.offload)}
    return fsdp_arguments(parallelism.offload)
