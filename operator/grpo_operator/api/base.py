"""Shared bits of the API models: the strict base model, Kubernetes quantities and ResourceRequirements (pure).

Separate from api/models.py so that api/vllm_server.py can use them without an import cycle."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

INT32_MAX = 2**31 - 1
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._\-/:@]*$"

# A Kubernetes quantity: an int, or a string. GPUs must be whole numbers (rules/topology.py checks that).
Quantity = Union[StrictInt, Annotated[StrictStr, Field(max_length=64)]]

# Bounds on every list, map and free string of the spec (they go into the CRD's schema, so the API server refuses an
# oversized object before it is stored, and the validator refuses it with a short message): generous for real jobs,
# far from what would make a denial, a status or a pod spec huge.
MAX_STR = 4096  # a free string (the models' str_max_length)
MAX_MAP = 64  # entries of a map (labels, annotations, nodeSelector, resources)
MAX_ENV = 256
MAX_VOLUMES = 64
MAX_TOLERATIONS = 64
MAX_PULL_SECRETS = 16
MAX_LIST = 1024  # a TRL list argument


class _Model(BaseModel):
    """camelCase on the wire, no unknown fields (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False, frozen=False, str_max_length=MAX_STR)


class ResourceRequirements(_Model):
    limits: Annotated[dict[Annotated[str, Field(max_length=253)], Quantity], Field(max_length=MAX_MAP)] = Field(
        default_factory=dict,
        description="Per node (per pod) limits, e.g. {nvidia.com/gpu: 4, memory: 64Gi}. The GPU count sets "
        "nprocPerNode.",
    )
    requests: Annotated[dict[Annotated[str, Field(max_length=253)], Quantity], Field(max_length=MAX_MAP)] = Field(
        default_factory=dict,
        description="Per node requests. For a GPU resource, requests must equal limits (Kubernetes requires it).",
    )
