"""Shared bits of the API models: the strict base model, Kubernetes quantities and ResourceRequirements (pure).

Separate from api/models.py so that api/vllm_server.py can use them without an import cycle."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

INT32_MAX = 2**31 - 1
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._\-/:@]*$"

# A Kubernetes quantity: an int, or a string. GPUs must be whole numbers (rules/topology.py checks that).
Quantity = Union[StrictInt, StrictStr]


class _Model(BaseModel):
    """camelCase on the wire, no unknown fields (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False, frozen=False, str_max_length=4096)


class ResourceRequirements(_Model):
    limits: dict[Annotated[str, Field(max_length=253)], Quantity] = Field(
        default_factory=dict,
        description="Per node (per pod) limits, e.g. {nvidia.com/gpu: 4, memory: 64Gi}. The GPU count sets "
        "nprocPerNode.",
    )
    requests: dict[Annotated[str, Field(max_length=253)], Quantity] = Field(
        default_factory=dict,
        description="Per node requests. For a GPU resource, requests must equal limits (Kubernetes requires it).",
    )
