"""spec.peft: LoRA through TRL's GRPOTrainer(peft_config=LoraConfig(...)) (docs/trainer.md, "LoRA")."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt

MODULE_NAME = r"^[A-Za-z0-9_.\-]+$"


class PeftSpec(BaseModel):
    """LoRA (PEFT): GRPOTrainer(peft_config=LoraConfig(...)); absent: full fine-tuning."""

    # as api.models._Model: camelCase on the wire, no unknown fields
    model_config = ConfigDict(extra="forbid", populate_by_name=False, frozen=False, str_max_length=4096)

    r: Annotated[StrictInt, Field(ge=1, le=4096)] = Field(default=16, description="LoRA rank (LoraConfig.r).")
    alpha: Annotated[StrictInt, Field(ge=1, le=65536)] = Field(
        default=32, description="LoRA scaling alpha (LoraConfig.lora_alpha); the update is scaled by alpha/r.")
    dropout: Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)] = Field(
        default=0.05, description="Dropout on the LoRA input (LoraConfig.lora_dropout), 0 <= dropout < 1.")
    targetModules: Optional[Union[Literal["all-linear"],
                                  Annotated[list[Annotated[str, Field(min_length=1, max_length=256,
                                                                      pattern=MODULE_NAME)]],
                                            Field(min_length=1, max_length=256)]]] = Field(
        default=None,
        description="Modules that get adapters: a list of module names (e.g. [q_proj, v_proj]) or all-linear "
        "(every linear layer but the output head). Absent: PEFT's default for the architecture.",
    )
    modulesToSave: Optional[Annotated[list[Annotated[str, Field(min_length=1, max_length=256, pattern=MODULE_NAME)]],
                                      Field(min_length=1, max_length=256)]] = Field(
        default=None,
        description="Modules trained in full and saved with the adapter (LoraConfig.modules_to_save), e.g. [lm_head].",
    )
