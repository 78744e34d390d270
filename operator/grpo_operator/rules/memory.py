"""What a GRPO trainer keeps in each GPU's memory, as `grpojob check` explains it: a rule-of-thumb estimate from the
spec alone (the parameter count read from the model id when it names one, e.g. `Qwen2.5-7B`), never a refusal.

The rules (TRL 1.16, transformers 5, torch AdamW under DDP: every rank holds a full copy):
  * weights: parameters × bytes of the load dtype. TRL loads the policy in float32 when `modelInitKwargs.dtype` is not
    set (unlike `from_pretrained`, which reads the config's dtype since transformers 5);
  * full fine-tuning: gradients as the weights, and AdamW's two moments as two more copies;
  * LoRA (`spec.peft`): the base is frozen, so gradients and optimizer states exist for the adapter only (well under
    1 % of the weights at the usual ranks), and no reference copy: TRL disables the adapter to get reference log-probs;
  * `training.beta` > 0 without LoRA: TRL loads a reference model with the same dtype, a further copy;
  * ZeRO-3 / FSDP (`spec.parallelism`, or raw `training.deepspeed`/`fsdp`) shard weights, gradients, states and the
    reference copy across the world size; `offload: optimizer` moves the AdamW states to CPU memory, `offload:
    parameters` the parameters as well (with FSDP gradients too), so they leave the GPU figure; activations grow with
    perDeviceTrainBatchSize × (prompt + completion length) and are not counted; vLLM colocate reserves its share of
    each GPU (its own weight copy and KV cache) before training allocates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Optional

from .. import api
from ..api.parallelism import ParallelismSpec

GIB = float(1 << 30)
# "7B", "0.5B", "135M" as a whole token of the model id's last path segment ("Qwen2.5-7B-Instruct")
_SIZE = re.compile(r"(?:^|[-_])(\d+(?:\.\d+)?)([bBmM])(?=$|[-_])")
_DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2}


def parameters_from_id(model: str) -> Optional[float]:
    """The parameter count a model id or path names in its last segment (7B → 7e9, 135M → 1.35e8); None if none."""
    name = model.rstrip("/").rsplit("/", 1)[-1]
    found = _SIZE.findall(name)
    if not found:
        return None
    number, unit = found[-1]
    return float(number) * (1e9 if unit in "bB" else 1e6)


def load_dtype(init_kwargs: Optional[dict[str, Any]]) -> tuple[Optional[int], str]:
    """(bytes per weight or None when decided by the model's config, how the dtype was chosen)."""
    raw = (init_kwargs or {}).get("dtype", (init_kwargs or {}).get("torch_dtype"))
    if raw is None:
        return 4, "float32 (TRL's default: modelInitKwargs.dtype not set)"
    text = str(raw).removeprefix("torch.")
    if text == "auto":
        return None, "the model config's dtype (modelInitKwargs.dtype: auto)"
    return _DTYPE_BYTES.get(text), text


@dataclass(frozen=True)
class MemoryEstimate:
    parameters: Optional[float]  # from the model id; None: unknown
    bytes_per_weight: Optional[int]
    dtype: str  # how the load dtype was chosen, for the text
    lora: bool
    reference_copy: bool  # beta > 0 without LoRA
    sharded: bool  # ZeRO-3 / FSDP: divided by the world size
    world_size: int
    offloaded: frozenset[str] = frozenset()  # parts held in CPU memory (spec.parallelism.offload)

    def copies(self) -> list[tuple[str, float]]:
        """(what, copies of the weights) per GPU before sharding."""
        parts = [("weights", 1.0)]
        if not self.lora:
            parts += [("gradients", 1.0), ("AdamW states", 2.0)]
        if self.reference_copy:
            parts.append(("reference model", 1.0))
        return [(what, n) for what, n in parts if what not in self.offloaded]

    def total_gib(self, *, lora: Optional[bool] = None) -> Optional[float]:
        if self.parameters is None or self.bytes_per_weight is None:
            return None
        est = self if lora is None else replace(self, lora=lora, reference_copy=self.reference_copy and not lora)
        copies = sum(n for _, n in est.copies())
        per_gpu = copies * self.parameters * self.bytes_per_weight / GIB
        return per_gpu / self.world_size if self.sharded else per_gpu

    def lines(self, vllm_mode: str, gpu_memory_utilization: float) -> list[str]:
        return [self._head(), *self._tail(vllm_mode, gpu_memory_utilization)]

    def _head(self) -> str:
        size = (f"{_count(self.parameters)} parameters from the model id" if self.parameters
                else "parameter count not in the model id, so in copies of the weights")
        if self.parameters is None or self.bytes_per_weight is None:
            detail = " + ".join(f"{what} ×{n:g}" for what, n in self.copies())
            return f"memory per GPU ({size}; weights in {self.dtype}): {detail} + activations"
        unit = self.parameters * self.bytes_per_weight / GIB
        detail = " + ".join(f"{what} {n * unit:.1f} GiB" for what, n in self.copies())
        shard = f", ÷{self.world_size} sharded (ZeRO-3/FSDP)" if self.sharded else ""
        if self.offloaded:
            shard += f", {' and '.join(sorted(self.offloaded))} offloaded to CPU memory"
        return (f"memory per GPU ({size}; weights in {self.dtype}): {detail}{shard} "
                f"≈ {self.total_gib():.1f} GiB + activations")

    def _tail(self, vllm_mode: str, gpu_memory_utilization: float) -> list[str]:
        out = []
        if self.lora:
            full = self.total_gib(lora=False)
            out.append("LoRA: gradients and AdamW states for the adapter only, no reference copy (the adapter is "
                       "disabled for reference log-probs)" + (f"; full fine-tuning would need ≈ {full:.1f} GiB"
                                                              if full is not None else ""))
        else:
            lora = self.total_gib(lora=True)
            if lora is not None:
                out.append(f"with LoRA (spec.peft) ≈ {lora:.1f} GiB: the base frozen, no gradients or optimizer "
                           "states for it, no reference copy")
        if vllm_mode == "colocate":
            out.append(f"vLLM colocate reserves {gpu_memory_utilization:.0%} of each GPU (its weight copy and KV cache) "
                       "before training allocates")
        return out


def _count(n: Optional[float]) -> str:
    if n is None:
        return "?"
    return f"{n / 1e9:g}B" if n >= 1e9 else f"{n / 1e6:g}M"


def estimate(job: api.GRPOJob, world_size: int) -> MemoryEstimate:
    spec = job.spec
    training = api.training_kwargs(spec.training)  # TRL's snake_case names, as set
    nbytes, dtype = load_dtype(training.get("model_init_kwargs"))
    lora = spec.peft is not None
    par = spec.parallelism
    sharded = bool(training.get("deepspeed") or training.get("fsdp")) or (par is not None and par.strategy != "ddp")
    return MemoryEstimate(parameters=parameters_from_id(spec.model), bytes_per_weight=nbytes, dtype=dtype, lora=lora,
                          reference_copy=float(training.get("beta") or 0.0) > 0 and not lora, sharded=sharded,
                          world_size=max(world_size, 1), offloaded=_offloaded(par))


def _offloaded(par: Optional[ParallelismSpec]) -> frozenset[str]:
    """What spec.parallelism.offload keeps in CPU memory: ZeRO-3's offload_optimizer (+ offload_param), FSDP's
    CPUOffload (parameters, their gradients and the optimizer state together)."""
    if par is None or par.strategy == "ddp" or par.offload == "none":
        return frozenset()
    if par.offload == "optimizer":
        return frozenset({"AdamW states"})
    if par.strategy == "fsdp":
        return frozenset({"weights", "gradients", "AdamW states"})
    return frozenset({"weights", "AdamW states"})


def explain(job: api.GRPOJob, world_size: int) -> list[str]:
    """`grpojob check`'s memory lines for a valid job."""
    vllm = job.spec.vllm
    return estimate(job, world_size).lines(vllm.mode, float(vllm.gpuMemoryUtilization or 0.0))
