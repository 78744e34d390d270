"""spec.parallelism: a preset for sharded training (ZeRO-3, FSDP) that render/parallelism.py turns into the
DeepSpeed / FSDP arguments TRL's GRPOConfig takes under torchrun (docs/trainer.md, "Parallelism")."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

STRATEGIES = ("ddp", "zero3", "fsdp")
OFFLOADS = ("none", "optimizer", "parameters")


class ParallelismSpec(BaseModel):
    """How the model is spread over the training processes; absent: DDP (a full copy per process)."""

    # as api.models._Model: camelCase on the wire, no unknown fields
    model_config = ConfigDict(extra="forbid", populate_by_name=False, frozen=False, str_max_length=4096)

    strategy: Literal["ddp", "zero3", "fsdp"] = Field(
        description="ddp: a full copy of the model, gradients and optimizer state in every process (the default); "
        "zero3: DeepSpeed ZeRO stage 3 (parameters, gradients and optimizer state sharded over all processes; TRL's "
        "multi-node recipe); fsdp: PyTorch FSDP2 (full sharding, one unit per transformer layer). zero3 and fsdp need "
        "GPUs (the CUDA image); zero3 also needs DeepSpeed in the image.")
    offload: Literal["none", "optimizer", "parameters"] = Field(
        default="none",
        description="Move state to CPU memory: optimizer (zero3 only: the optimizer state), parameters (the "
        "parameters as well; with fsdp parameters, gradients and optimizer state). Saves GPU memory, costs speed.")
