"""The rules of sharded training (pure): spec.parallelism against the raw training.deepspeed / fsdp arguments, and
TRL's vLLM rule for ZeRO-3 that TRL 1.16 itself never checks (docs/trainer.md, "Parallelism")."""

from __future__ import annotations

from typing import Any, Optional

from .. import api

_RAW = ("deepspeed", "fsdp", "fsdp_config")
_CAMEL = {"deepspeed": "deepspeed", "fsdp": "fsdp", "fsdp_config": "fsdpConfig"}


def zero_stage(parallelism: Optional[api.ParallelismSpec], t: dict[str, Any]) -> Optional[int]:
    """The ZeRO stage the job runs (None: no DeepSpeed, or a config file path the operator cannot read)."""
    if parallelism is not None and parallelism.strategy == "zero3":
        return 3
    ds = t.get("deepspeed")
    stage = ds.get("zero_optimization", {}).get("stage") if isinstance(ds, dict) else None
    return stage if isinstance(stage, int) else None


def errors(spec: api.GRPOJobSpec, t: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, message) for each broken rule; `t` is the user's training arguments (snake_case)."""
    out: list[tuple[str, str]] = []
    par = spec.parallelism
    raw = [name for name in _RAW if t.get(name) not in (None, "", False)]
    if par is not None and raw:
        fields = ", ".join(f"training.{_CAMEL[n]}" for n in raw)
        out.append(("spec.parallelism", f"spec.parallelism and {fields} are both set: the preset renders "
                    f"{fields} itself; remove {fields} (or remove spec.parallelism to pass your own config)"))
    if t.get("deepspeed") not in (None, "") and any(t.get(n) not in (None, "", False) for n in ("fsdp", "fsdp_config")):
        out.append(("spec.training.deepspeed", "training.deepspeed and training.fsdp/fsdpConfig are both set: "
                    "choose one (spec.parallelism.strategy: zero3 or fsdp)"))
    if par is not None and par.offload != "none":
        if par.strategy == "ddp":
            out.append(("spec.parallelism.offload", f"offload: {par.offload} needs sharding: set strategy: zero3 "
                        "(or fsdp), or offload: none"))
        elif par.strategy == "fsdp" and par.offload == "optimizer":
            out.append(("spec.parallelism.offload", "FSDP offloads parameters, gradients and optimizer state together: "
                        "use offload: parameters with strategy: fsdp (zero3 can offload the optimizer alone)"))
    gather = t.get("ds3_gather_for_generation", True)
    if zero_stage(par, t) == 3 and spec.vllm.mode != "none" and gather is False:
        out.append(("spec.training.ds3GatherForGeneration", "ZeRO-3 with vLLM needs ds3GatherForGeneration: true "
                    "(TRL syncs the gathered weights into vLLM; false is for generation with transformers only): "
                    "remove it, or set spec.vllm.mode: none"))
    return out


def warnings(spec: api.GRPOJobSpec, world_size: int) -> list[str]:
    par = spec.parallelism
    if par is not None and par.strategy != "ddp" and world_size == 1:
        return [f"spec.parallelism.strategy {par.strategy} with one training process shards nothing (offload still "
                "applies); it pays off from 2 processes on"]
    return []
